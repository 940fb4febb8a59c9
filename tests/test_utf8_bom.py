"""A UTF-8 byte-order mark at the start of an input file (Windows Notepad's "UTF-8", Excel's "CSV UTF-8") is a
signature, not text: every reader of user files takes it off. Before, JSON lines files were refused at line 1 with
json's "Unexpected UTF-8 BOM (decode using utf-8-sig)", a JSON array was read as JSON lines and refused, and text,
CSV and curate documents kept an invisible U+FEFF at the start of their first record. The same held later for
decontamination's eval sets, exact-line dedup's inputs, `tokenizer encode --input` and tokenizer files (tokenizer.json,
vocab.json, merges.txt). Reference: the same file without the mark reads the same."""

import json

import pytest

BOM = b"\xef\xbb\xbf"


def _both(tmp_path, name, data: bytes):
    """The file with and without a BOM."""
    plain, marked = tmp_path / f"plain_{name}", tmp_path / f"bom_{name}"
    plain.write_bytes(data)
    marked.write_bytes(BOM + data)
    return plain, marked


def _lines(*records) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


@pytest.mark.parametrize(
    "name, data, one_per_line",
    [
        ("a.jsonl", _lines({"text": "héllo"}, {"text": "two"}), False),
        ("a.json", json.dumps([{"text": "héllo"}, {"text": "two"}]).encode(), False),
        ("a.txt", "héllo<|endoftext|>two".encode(), False),
        ("b.txt", "héllo\ntwo\n".encode(), True),
    ],
)
def test_pack_sources_read_a_bom_file_as_the_same_file_without_it(tmp_path, name, data, one_per_line):
    from cookmind.store.sources import iter_items

    plain, marked = _both(tmp_path, name, data)
    want = [(i.line, i.kind, i.payload) for i in iter_items(plain, one_per_line=one_per_line)]
    got = [(i.line, i.kind, i.payload) for i in iter_items(marked, one_per_line=one_per_line)]
    assert got == want and len(want) == 2


def test_eval_and_grpo_problem_files_read_a_bom_jsonl(tmp_path):
    from cookmind.align.objective import load_problems
    from cookmind.evals.atomic_io import read_jsonl

    plain, marked = _both(tmp_path, "p.jsonl", _lines({"question": "1+1?", "answer": "#### 2"}))
    assert read_jsonl(marked) == read_jsonl(plain) == [{"question": "1+1?", "answer": "#### 2"}]
    assert load_problems(marked) == load_problems(plain)


def test_mmlu_csv_with_a_bom_has_no_mark_in_its_first_question(tmp_path):
    from cookmind.evals import load_mmlu

    for root, bom in (("plain", b""), ("bom", BOM)):
        (tmp_path / root / "test").mkdir(parents=True)
        (tmp_path / root / "test" / "maths_test.csv").write_bytes(bom + b"What is 1+1?,1,2,3,4,B\n")
    assert load_mmlu(tmp_path / "bom", "test") == load_mmlu(tmp_path / "plain", "test")
    assert load_mmlu(tmp_path / "bom", "test")[0]["question"] == "What is 1+1?"


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz", "d.txt"])
def test_curate_inputs_read_a_bom_file_as_without_it(tmp_path, name):
    import gzip

    from cookmind.curate.shards import iter_located

    data = _lines({"id": "x", "text": "héllo"}) if ".jsonl" in name else "héllo there\n".encode()
    plain, marked = _both(tmp_path, name, gzip.compress(data) if name.endswith(".gz") else data)
    if name.endswith(".gz"):
        marked.write_bytes(gzip.compress(BOM + data))
    docs = [d["text"] for d, _ in iter_located(str(marked))]
    assert docs == [d["text"] for d, _ in iter_located(str(plain))] and docs[0].startswith("héllo")


def test_eval_ppl_of_a_bom_text_file_scores_the_text_alone(tmp_path):
    """The perplexity of a text file with a BOM is that of the file without it, and the mark is not counted as
    bytes left out."""
    import torch
    from lm_fixtures import tiny_lm
    from test_align_fixtures import CharTok

    from cookmind.evals.perplexity import evaluate_text_file

    torch.manual_seed(0)
    model = tiny_lm(vocab_size=256).eval()
    plain, marked = _both(tmp_path, "t.txt", b"hello there, a small text to score.\n")
    want, got = (evaluate_text_file(model, CharTok(), p, window=16, progress=False) for p in (plain, marked))
    assert got["bytes_not_evaluated"] == want["bytes_not_evaluated"] == 0
    assert got["file_bytes"] == want["file_bytes"] + 3
    assert got["tokens"] == want["tokens"] and got["perplexity"] == want["perplexity"]


def test_tokenizer_train_learns_from_a_bom_text_file_what_it_learns_without_the_mark(tmp_path):
    """pack drops the mark, so the tokenizer must not learn merges of its three bytes either: training on the file
    with a BOM gives the tokenizer trained on it without (here every pair is merged, the mark's too before)."""
    from cookmind.tokenizer.bpe_train import train_bpe

    plain, marked = _both(tmp_path, "t.txt", "héllo wörld, hello world\n".encode() * 3)
    assert train_bpe(marked, 400, workers=1, progress=False) == train_bpe(plain, 400, workers=1, progress=False)


@pytest.mark.parametrize("name", ["e.jsonl", "e.json", "e.csv", "e.txt"])
def test_decontaminate_eval_files_read_a_bom_file_as_without_it(tmp_path, name):
    """A .json eval set with a BOM was refused (json's "Unexpected UTF-8 BOM"); a CSV's or text file's first item
    began with U+FEFF, so its first n-grams matched no training text."""
    from cookmind.curate.decontaminate import iter_eval_items

    rows = [{"question": "What is 1+1?", "answer": "2"}, {"question": "Name a soup.", "answer": "leek"}]
    data = {
        ".jsonl": _lines(*rows),
        ".json": json.dumps(rows).encode(),
        ".csv": b"What is 1+1?,2\nName a soup.,leek\n",
        ".txt": b"What is 1+1? 2\nName a soup. leek\n",
    }[name[1:]]
    plain, marked = _both(tmp_path, name, data)
    items = list(iter_eval_items(marked))
    assert items == list(iter_eval_items(plain)) and items[0].startswith("What")


def test_exact_line_dedup_of_a_bom_file_is_that_of_the_file_without_it(tmp_path):
    """The first line of a file with a BOM kept the mark: it matched no copy of itself elsewhere (so stayed), and the
    mark went on into the output."""
    from cookmind.curate import exact_line_dedup

    outputs = []
    for bom in (b"", BOM):
        d = tmp_path / ("bom" if bom else "plain")
        d.mkdir()
        (d / "a.txt").write_bytes(bom + b"Subscribe to our newsletter\nThe soup simmered.\n")
        (d / "b.txt").write_bytes(b"Subscribe to our newsletter\nThe bread rose.\n")
        out = exact_line_dedup([d / "a.txt", d / "b.txt"], d / "out", num_partitions=2)
        outputs.append([p.read_bytes() for p in out])
    assert outputs[1] == outputs[0] == [b"The soup simmered.\n", b"The bread rose.\n"]


def test_tokenizer_encode_of_a_bom_file_gives_the_ids_of_the_text_alone(tmp_path, tok_dir):
    """`tokenizer encode --input` encoded the mark's three bytes as tokens before the text."""
    from cookmind.cli import main

    ids = []
    for path in _both(tmp_path, "t.txt", b"the soup simmered\n"):
        out = tmp_path / f"{path.stem}.ids"
        assert (
            main(["tokenizer", "encode", "--tokenizer", str(tok_dir), "--input", str(path), "--output", str(out)]) == 0
        )
        ids.append(out.read_text())
    assert ids[1] == ids[0]


@pytest.mark.parametrize("kind", ["cookmind", "hf", "gpt2"])
def test_tokenizer_files_with_a_bom_load_as_without_it(tmp_path, tok_dir, kind):
    """A tokenizer.json, vocab.json or merges.txt re-saved by a Windows editor was refused: json's "Unexpected UTF-8
    BOM", and a merges.txt's "#version" header, no longer first, read as a merge."""
    from cookmind.cli import main
    from cookmind.tokenizer import Tokenizer
    from cookmind.tokenizer.tokenizer import FILE_NAME

    want = Tokenizer.load(tok_dir).fingerprint()
    if kind == "cookmind":
        folder = tmp_path / "tok"
        folder.mkdir()
        for f in tok_dir.iterdir():
            (folder / f.name).write_bytes(f.read_bytes())
        marked = [folder / FILE_NAME]
    else:
        assert (
            main(["tokenizer", "export", "--tokenizer", str(tok_dir), "--out", str(tmp_path / "x"), "--format", kind])
            == 0
        )
        names = ["tokenizer.json"] if kind == "hf" else ["vocab.json", "merges.txt"]
        marked = [tmp_path / "x" / n for n in names]
    for f in marked:
        f.write_bytes(BOM + f.read_bytes())
    if kind == "cookmind":
        assert Tokenizer.load(folder).fingerprint() == want
        return
    files = (
        ["--tokenizer-json", str(marked[0])]
        if kind == "hf"
        else ["--vocab", str(marked[0]), "--merges", str(marked[1])]
    )
    assert main(["tokenizer", "import", *files, "--out", str(tmp_path / "imported")]) == 0
    assert Tokenizer.load(tmp_path / "imported").fingerprint() == want


@pytest.mark.parametrize("kind", ["train", "curate"])
def test_yaml_configs_with_a_bom_read_as_without_it(tmp_path, kind):
    """YAML itself takes a leading BOM as no text (PyYAML drops it): the train and curate configs read the same."""
    from cookmind.curate.config import CurateConfig
    from cookmind.train.config import TrainConfig

    text = b"train:\n  max_steps: 7\n" if kind == "train" else b"stages:\n  - extract\n"
    plain, marked = _both(tmp_path, "c.yaml", text)
    if kind == "train":
        assert TrainConfig.load(marked).to_dict() == TrainConfig.load(plain).to_dict()
    else:
        assert CurateConfig.from_yaml(marked) == CurateConfig.from_yaml(plain)


def test_a_hugging_face_tokenizer_config_with_a_bom_still_names_its_eos(tmp_path):
    """tokenizer_config.json names a Llama-style folder's EOS (</s>), which ends each packed document; a BOM made it
    'not a JSON object' and the folder unreadable, though its tokenizer.json beside it reads with one."""
    from tokenizer_fixtures import llama_style_tokenizer

    from cookmind.tokenizer import Tokenizer

    folder = llama_style_tokenizer(tmp_path / "llama")
    want = Tokenizer.load(folder).eos_id
    config = folder / "tokenizer_config.json"
    config.write_bytes(BOM + config.read_bytes())
    assert want is not None and Tokenizer.load(folder).eos_id == want
