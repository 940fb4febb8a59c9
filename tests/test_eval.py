"""Evaluations: pass@k, GSM8K, MMLU, perplexity / bits per byte, and `cookmind eval`."""

import itertools
import json
import math

import pytest
import torch
from lm_fixtures import tiny_lm
from test_align_fixtures import CharTok, OracleLM, gsm8k_gold, tiny_hf_model, tiny_hf_tokenizer

from cookmind.evals import evaluate_gsm8k, evaluate_mmlu, evaluate_text, load_gsm8k, load_mmlu, pass_at_k, sequence_nll
from cookmind.evals.mmlu import mmlu_prompt

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


@pytest.mark.parametrize("n, c, k", [(5, 2, 1), (5, 2, 2), (6, 1, 3), (4, 0, 2), (4, 4, 3), (5, 3, 3)])
def test_pass_at_k_matches_enumeration(n, c, k):
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expect = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(expect)


def test_gsm8k_eval_grades_real_problems_and_writes_jsonl(shared_data, tmp_path):
    problems = load_gsm8k(shared_data / "gsm8k" / "test.jsonl", limit=4)
    gold = {p["question"].strip(): gsm8k_gold(p["answer"]) for p in problems}
    wrong_on = {problems[1]["question"].strip(), problems[3]["question"].strip()}

    def respond(prompt):
        q = prompt.split("User: ")[1].split("\nAssistant:")[0]
        value = int(gold[q]) + (1 if q in wrong_on else 0)
        return f" I add things up. </think> <answer> {value:,} </answer>"

    out = tmp_path / "gsm8k.jsonl"
    metrics = evaluate_gsm8k(OracleLM(respond), CharTok(), problems, out, max_new_tokens=60, progress=False)
    assert metrics["accuracy"] == 0.5 and metrics["pass@1"] == 0.5 and metrics["format_rate"] == 1.0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["grades"] for r in records] == [[1.0], [0.0], [1.0], [0.0]]
    assert records[0]["prompt"].endswith("<think>") and records[0]["outputs"][0].endswith("</answer>")  # stopped there


def test_gsm8k_samples_of_other_problems_chunks_and_seeds_are_not_one_another_shifted(tmp_path):
    """Each chunk of problems sampled from seed + its first problem's index while its rows counted samples: with 4
    samples a problem, problem 1's samples 0..2 were problem 0's 1..3 (the same random streams), and --seed 1 gave
    --seed 0's samples shifted by one. Every chunk and seed now draws streams of its own: the samples of two identical
    problems, and of two seeds, share none (six uniform digits: a chance repeat is one in a million)."""

    class Digits(torch.nn.Module):  # after the prompt: a uniform digit, every step (no end before the limit)
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids):
            logits = torch.full((ids.shape[0], ids.shape[1], 256), -30.0)
            logits[:, :, ord("0") : ord("9") + 1] = 0.0
            return logits

    problems = [{"question": "What is 2+2?", "answer": "#### 4"}] * 2
    kw = dict(template="Q {question} A>", num_samples=4, temperature=1.0, max_new_tokens=6, batch_size=4)
    outputs = {}
    for seed in (0, 1):
        out = tmp_path / f"s{seed}.jsonl"
        evaluate_gsm8k(Digits(), CharTok(), problems, out, seed=seed, progress=False, **kw)
        outputs[seed] = [json.loads(line)["outputs"] for line in out.read_text().splitlines()]
    first, second = outputs[0]
    assert len(set(first)) == 4 and not set(first) & set(second), (first, second)
    assert not set(first) & set(outputs[1][0]), (first, outputs[1][0])
    again = tmp_path / "again.jsonl"  # the same seed is the same samples
    evaluate_gsm8k(Digits(), CharTok(), problems, again, seed=0, progress=False, **kw)
    assert [json.loads(line)["outputs"] for line in again.read_text().splitlines()] == outputs[0]


def test_gsm8k_sampled_pass_at_k(tmp_path):
    problems = [{"question": "What is 2+2?", "answer": "#### 4"}]

    # a two-token coin: after the prompt, "4" or "5" with equal probability, then EOS
    class Coin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, ids):
            logits = torch.full((ids.shape[0], ids.shape[1], 256), -30.0)
            last = ids[:, -1]
            logits[:, -1, CharTok.eos_id] = torch.where(last == ord(">"), -30.0, 30.0)
            logits[:, -1, ord("4")] = torch.where(last == ord(">"), 0.0, -30.0)
            logits[:, -1, ord("5")] = torch.where(last == ord(">"), 0.0, -30.0)
            return logits

    m = evaluate_gsm8k(
        Coin(),
        CharTok(),
        problems,
        template="Q {question} A>",
        num_samples=8,
        ks=(1, 8),
        temperature=1.0,
        max_new_tokens=3,
        seed=1,
        progress=False,
    )
    c = round(m["accuracy"] * 8)
    assert 0 < c < 8  # both outcomes appear in 8 fair draws with this seed
    assert m["pass@1"] == pytest.approx(c / 8) and m["pass@8"] == 1.0
    # the errors name the flags a user set, not the function's name (they read "evaluate_gsm8k: ...")
    with pytest.raises(ValueError, match=r"^--num-samples 2 with greedy decoding \(--temperature 0\)"):
        evaluate_gsm8k(Coin(), CharTok(), problems, num_samples=2, temperature=0.0)
    # pass@8 of one sample a problem is undefined: refused (it was left out of the metrics without a word)
    with pytest.raises(ValueError, match=r"^--k 8: pass@8 needs 1..1 samples a problem \(--num-samples\).* drop 8"):
        evaluate_gsm8k(Coin(), CharTok(), problems, ks=(1, 8))


class Bigram(torch.nn.Module):
    """logits[t] = table[ids[t]]: a model whose choices a test can set by hand."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(256, 256))

    def forward(self, ids):
        return self.table[ids]


def test_mmlu_letter_scoring_per_subject_and_macro(shared_data):
    rows = load_mmlu(shared_data / "mmlu", "dev", ["astronomy", "virology"], limit_per_subject=5)
    assert len(rows) == 10 and {r["subject"] for r in rows} == {"astronomy", "virology"}
    model = Bigram()
    with torch.no_grad():
        model.table[ord(" "), ord("B")] = 10.0  # after a space, "B" is by far the likeliest
    m = evaluate_mmlu(model, CharTok(), rows, scoring="letter", progress=False)
    per = {s: sum(r["answer"] == "B" for r in rows if r["subject"] == s) / 5 for s in ("astronomy", "virology")}
    assert m["per_subject"] == pytest.approx(per)
    assert m["macro_accuracy"] == pytest.approx(sum(per.values()) / 2)


def test_mmlu_option_and_generate_scoring():
    rows = [{"subject": "toy", "question": "Pick.", "options": ["xx", "zz", "qq", "ww"], "answer": "B"}]
    model = Bigram()
    with torch.no_grad():
        model.table[ord(" "), ord("z")] = 5.0
        model.table[ord("z"), ord("z")] = 5.0
    assert evaluate_mmlu(model, CharTok(), rows, scoring="option", progress=False)["micro_accuracy"] == 1.0
    oracle = OracleLM(lambda p: " The answer is B", marker="Answer:")
    assert evaluate_mmlu(oracle, CharTok(), rows, scoring="generate", progress=False)["micro_accuracy"] == 1.0


def test_mmlu_letter_scores_match_hf_log_softmax(tmp_path):
    tok, model = tiny_hf_tokenizer(tmp_path), tiny_hf_model()
    rows = [{"subject": "toy", "question": "2+2?", "options": ["3", "4", "5", "6"], "answer": "B"}]
    m = evaluate_mmlu(model, tok, rows, scoring="letter", out_path=tmp_path / "m.jsonl", progress=False)
    rec = json.loads((tmp_path / "m.jsonl").read_text())
    from cookmind.evals.mmlu import mmlu_prompt

    prompt_ids = tok.encode(mmlu_prompt(rows[0]), add_special_tokens=False)
    for i, letter in enumerate("ABCD"):
        cont = tok.encode(" " + letter, add_special_tokens=False)
        ids = torch.tensor([prompt_ids + cont])
        lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        expect = sum(lp[len(prompt_ids) - 1 + j, cont[j]].item() for j in range(len(cont)))
        assert rec["scores"][i] == pytest.approx(expect, abs=1e-4)
    assert m["num_questions"] == 1


@pytest.mark.parametrize("scoring", ["letter", "option"])
@pytest.mark.parametrize("through", ["transformers", "adapter"])
def test_mmlu_scores_the_ids_a_sentencepiece_tokenizer_gives_the_whole_prompt_and_answer(tmp_path, scoring, through):
    """A SentencePiece-style tokenizer (Llama 2's and Mistral's tokenizer.json: a "▁" for each space and one before
    every text) encodes " A" alone as "▁▁A", but "Answer: A" as "Answer:" then "▁A": the letter's ids were scored
    with a "▁" too many. The answer's ids are now those transformers gives the prompt and answer written together,
    after the prompt's own (lm-evaluation-harness's rule)."""
    from tokenizer_fixtures import sentencepiece_style_tokenizer
    from transformers import AutoTokenizer

    from cookmind.tokenizer.hf_adapter import load_tokenizer

    folder = sentencepiece_style_tokenizer(tmp_path / "sp")
    hf = AutoTokenizer.from_pretrained(folder)
    tok = hf if through == "transformers" else load_tokenizer(folder)
    model = tiny_hf_model(vocab_size=len(hf))
    rows = [{"subject": "toy", "question": "Which is red?", "options": ["sky", "blood", "grass", "ice"], "answer": "B"}]
    evaluate_mmlu(model, tok, rows, scoring=scoring, out_path=tmp_path / "m.jsonl", progress=False)
    rec = json.loads((tmp_path / "m.jsonl").read_text())
    prompt = mmlu_prompt(rows[0])
    context = hf.encode(prompt)  # <s> first, as transformers encodes a text
    for i, answer in enumerate("ABCD" if scoring == "letter" else rows[0]["options"]):
        whole = hf.encode(prompt + " " + answer)
        assert whole[: len(context)] == context
        cont = whole[len(context) :]
        assert hf.convert_ids_to_tokens(cont)[0] == "▁"  # one "▁" for the space, not two
        lp = torch.log_softmax(model(torch.tensor([whole])).logits[0, :-1].float(), -1)
        expect = sum(lp[len(context) - 1 + j, cont[j]].item() for j in range(len(cont)))
        expect = expect if scoring == "letter" else expect / len(cont)
        assert rec["scores"][i] == pytest.approx(expect, abs=1e-4)


def test_a_typed_special_token_is_text_in_eval_with_a_hugging_face_tokenizer(tmp_path):
    """With a Hugging Face model folder the eval holds transformers' own tokenizer, and its prompts and documents
    were encoded with `encode(text, add_special_tokens=False)`, which reads a typed special token as the token: an
    MMLU question or GSM8K prompt spelling "<eos>" put the end-of-text id in the prompt, and eval ppl scored the
    documents' own text "<eos>" as one end token (pack stores it as its bytes). It is now text there, as in pack,
    generate and the guide: the ids of its bytes, by GPT-2's byte map."""
    from cookmind.tokenizer.bytes_unicode import bytes_to_unicode
    from cookmind.tokenizer.documents import encode_text, prompt_ids

    tok = tiny_hf_tokenizer(tmp_path)
    text = "Q: a<eos>b?"
    by_hand = [tok.convert_tokens_to_ids(bytes_to_unicode()[b]) for b in text.encode()]
    assert tok.eos_token_id not in by_hand
    assert encode_text(tok, text) == by_hand and prompt_ids(tok, text) == by_hand
    rows = [{"subject": "toy", "question": "a<eos>b?", "options": ["3", "4", "5", "6"], "answer": "B"}]
    from cookmind.align.losses import tokenize_prompt_and_output

    batch = tokenize_prompt_and_output([mmlu_prompt(rows[0])], [" B"], tok)
    assert tok.eos_token_id not in batch["input_ids"][0].tolist()


def test_ppl_on_a_store_packed_with_another_tokenizer_than_a_hugging_face_models_is_refused(tmp_path, tok_dir, capsys):
    """With a Hugging Face model folder the eval holds transformers' tokenizer, which has no fingerprint: a store
    packed with another tokenizer of the same size and end id was scored without a word, its ids read as the
    model's tokens (and its bytes as the model's tokenizer decodes them: 3,821 where the text has 3,693). The
    store's fingerprint is now checked against the folder's tokenizer as pack reads it, as for cookmind's models."""
    from lm_fixtures import CORPUS

    from cookmind.cli import main
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    ours = Tokenizer.load(tok_dir)
    (tmp_path / "c.txt").write_text(CORPUS)
    vocab, merges = train_bpe(tmp_path / "c.txt", ours.vocab_size, DEFAULT_SPECIAL_TOKENS, pattern="gpt4", workers=1)
    other = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS, "gpt4")
    assert other.fingerprint() != ours.fingerprint() and other.eos_id == ours.eos_id
    argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(tmp_path / "c.txt")]
    assert main([*argv, "--out", str(tmp_path / "store"), "--quiet"]) == 0
    for name, tok in (("same", ours), ("other", other)):
        tok.save(tmp_path / name)
        (tmp_path / name / "cookmind_tokenizer.json").unlink()  # a Hugging Face folder: tokenizer.json and config
        tiny_hf_model(tmp_path / name, vocab_size=tok.vocab_size)
    capsys.readouterr()
    argv = ["eval", "ppl", "--data", str(tmp_path / "store"), "--window", "64", "--quiet"]
    assert main([*argv, "--model", str(tmp_path / "same")]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0
    assert main([*argv, "--model", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert "was packed with tokenizer" in err and other.fingerprint()[:16] in err, err


def test_bits_per_byte_of_a_store_window_cut_inside_a_character_counts_its_bytes_with_a_hugging_face_tokenizer(
    tmp_path,
):
    """A store's windows are cut at any token, so inside a character where its UTF-8 bytes are tokens apart. With
    a Hugging Face model the bytes were counted by decoding the window's ids to text, and each cut character's
    piece decoded to U+FFFD, three bytes: on a store of CJK text and emoji GPT-2's tokenizer counted 11,933 bytes
    where the windows hold 11,821 (ours, by its byte table), so bits per byte read 1% low. A byte-level tokenizer's
    bytes are now counted as its tokens' bytes; here one token a byte, so the count is the bytes by hand."""
    from cookmind.evals.perplexity import text_bytes

    tok = tiny_hf_tokenizer(tmp_path)
    text = "家族 😀 é, テキスト"
    raw = text.encode()
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == len(raw)  # one token a byte
    for cut in range(len(raw) + 1):
        assert text_bytes(tok, ids[cut:]) == len(raw) - cut, cut
        assert text_bytes(tok, ids[:cut]) == cut, cut
    assert text_bytes(tok, [*ids, tok.eos_token_id]) == len(raw)  # a special token is no text


def test_perplexity_matches_hf_loss_and_bits_per_byte(shared_data, tmp_path):
    tok, model = tiny_hf_tokenizer(tmp_path), tiny_hf_model()
    text = (shared_data / "text" / "tinystories_sample.txt").read_text()[:300].strip()  # as pack reads a document
    ids = tok.encode(text, add_special_tokens=False)
    hf_loss = model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.item()  # mean NLL, shifted inside
    r = evaluate_text(model, tok, text, window=len(ids))
    assert r["nll_per_token"] == pytest.approx(hf_loss, rel=1e-5)
    assert r["perplexity"] == pytest.approx(math.exp(hf_loss), rel=1e-5)
    n_bytes = len(text.encode()) - len(tok.decode(ids[:1]).encode())
    assert r["bytes"] == n_bytes and r["bits_per_byte"] == pytest.approx(
        hf_loss * r["tokens"] / math.log(2) / n_bytes, rel=1e-5
    )
    # windows: stride == window scores chunk k's targets ids[kw+1 .. kw+w] with only that chunk as context
    w = 64
    nll, count = sequence_nll(model, ids, window=w)
    naive = 0.0
    for start in range(0, len(ids) - 1, w):
        chunk = torch.tensor([ids[start : start + w + 1]])
        naive += model(chunk, labels=chunk).loss.item() * (chunk.shape[1] - 1)
    assert count == len(ids) - 1 and nll == pytest.approx(naive, rel=1e-5)
    nll_s, count_s = sequence_nll(model, ids, window=w, stride=16)  # overlapping: each token still once
    assert count_s == len(ids) - 1


def test_cookmind_eval_cli_on_hf_folder(shared_data, tmp_path, capsys):
    from cookmind.cli import main

    tiny_hf_tokenizer(tmp_path / "hf")
    tiny_hf_model(tmp_path / "hf")
    out = tmp_path / "g.jsonl"
    rc = main(
        [
            "eval",
            "gsm8k",
            "--model",
            str(tmp_path / "hf"),
            "--data",
            str(shared_data / "gsm8k" / "test.jsonl"),
            "--limit",
            "2",
            "--template",
            "compact",
            "--max-new-tokens",
            "4",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert metrics["num_problems"] == 2 and 0.0 <= metrics["accuracy"] <= 1.0
    assert len(out.read_text().splitlines()) == 2 and out.with_suffix(".metrics.json").is_file()
    rc = main(
        [
            "eval",
            "mmlu",
            "--model",
            str(tmp_path / "hf"),
            "--data",
            str(shared_data / "mmlu"),
            "--split",
            "dev",
            "--subjects",
            "virology",
            "--limit-per-subject",
            "2",
            "--quiet",
        ]
    )
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and metrics["num_questions"] == 2 and set(metrics["per_subject"]) == {"virology"}
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello tiny model")
    rc = main(["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--window", "8", "--quiet"])
    metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # a byte a token, then the end of the document pack puts after it (the tokenizer's EOS); the first is context
    assert rc == 0 and metrics["tokens"] == len("hello world, hello tiny model") + 1 - 1


def test_perplexity_on_a_token_store_matches_bigram_by_hand(shared_data, tmp_path):
    pytest.importorskip("cookmind.store")
    from cookmind.evals import evaluate_store
    from cookmind.store import TokenStore
    from cookmind.store.packer import pack
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    src = shared_data / "text" / "tinystories_sample.txt"
    vocab, merges = train_bpe(src, 300, DEFAULT_SPECIAL_TOKENS)
    tok = Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS)
    tok.save(tmp_path / "tok")
    (tmp_path / "t.jsonl").write_text(json.dumps({"text": src.read_text()[:1500]}) + "\n")
    pack([tmp_path / "t.jsonl"], tmp_path / "s.bin", str(tmp_path / "tok"), "seq", overwrite=True, progress=False)
    torch.manual_seed(0)
    table = torch.randn(tok.vocab_size, tok.vocab_size)

    class TableLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.t = torch.nn.Parameter(table.clone())

        def forward(self, ids):
            return self.t[ids]

    store = TokenStore(tmp_path / "s.bin")
    stream = store.stream("sequence", 0, store.stream_length("sequence")).tolist()
    assert len(stream) % 32 > 1  # a tail shorter than a window, which must be scored too
    for window in (32, len(stream) + 10):  # the second: a whole store shorter than one window
        r = evaluate_store(TableLM(), tok, tmp_path / "s.bin", window=window, progress=False)
        nll, n, n_bytes = 0.0, 0, 0
        for start in range(0, len(stream), window):  # consecutive windows; each one's first token is context
            ids = stream[start : start + window]
            for prev, nxt in zip(ids[:-1], ids[1:]):
                nll -= torch.log_softmax(table[prev], -1)[nxt].item()
            n += len(ids) - 1
            n_bytes += len(tok.decode([i for i in ids[1:] if i not in tok.special_tokens.values()]).encode())
        assert r["tokens"] == n == len(stream) - math.ceil(len(stream) / window) and r["bytes"] == n_bytes
        assert r["nll_per_token"] == pytest.approx(nll / n, rel=1e-5)
        assert r["bits_per_byte"] == pytest.approx(nll / math.log(2) / n_bytes, rel=1e-5)
    other = Tokenizer(*train_bpe(src, 280, DEFAULT_SPECIAL_TOKENS), DEFAULT_SPECIAL_TOKENS)
    with pytest.raises(ValueError, match=r"s\.bin was packed with tokenizer .*tok .*not the model's"):
        evaluate_store(TableLM(), other, tmp_path / "s.bin", window=32, progress=False)  # it scored them as its ids
    # the model's tokenizer, but documents framed otherwise (a store whose meta.json says they opened with id 1): the
    # refusal read "the model's's documents"
    meta_path = tmp_path / "s.bin" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["tokenizer"]["bos_ids"] = [1]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"documents open with ids \[1\]; the model's tokenizer's documents open") as e:
        evaluate_store(TableLM(), tok, tmp_path / "s.bin", window=32, progress=False)
    assert "'s's" not in str(e.value)


def _tiny_cookmind(context, vocab=256):
    torch.manual_seed(0)
    return tiny_lm(vocab_size=vocab, max_position_embeddings=context).eval()


def test_gsm8k_skips_and_counts_prompts_longer_than_the_context(tmp_path):
    """A question that fills the context is skipped, counted and recorded; the rest are still graded (#17.13)."""
    short = {"question": "1+1?", "answer": "#### 2"}
    long = {"question": "Tom has many apples. " * 6, "answer": "#### 3"}  # 126 characters = tokens with CharTok
    out = tmp_path / "g.jsonl"
    m = evaluate_gsm8k(
        _tiny_cookmind(64), CharTok(), [short, long, short], out, template="plain", max_new_tokens=4, progress=False
    )
    assert m["num_problems"] == 2 and m["num_skipped_too_long"] == 1 and m["context"] == 64
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["index"] for r in records] == [0, 1, 2]
    assert "outputs" not in records[1] and "fills the model's context of 64" in records[1]["skipped"]
    assert all(len(r["outputs"]) == 1 for r in (records[0], records[2]))


def test_mmlu_skips_and_counts_questions_longer_than_the_context():
    rows = [
        {"subject": "virology", "question": q, "options": ["a", "b", "c", "d"], "answer": "A"}
        for q in ("Short?", "Very long question. " * 10)
    ]
    n_short = len(CharTok().encode(mmlu_prompt(rows[0]) + " A")) - 1  # the model's input: prompt + letter - 1
    for scoring in ("letter", "generate"):
        m = evaluate_mmlu(_tiny_cookmind(n_short + 1), CharTok(), rows, scoring=scoring, progress=False)
        assert m["num_questions"] == 1 and m["num_skipped_too_long"] == 1, scoring
        assert m["skipped_per_subject"] == {"virology": 1} and m["subjects_not_scored"] == []


def test_mmlu_says_which_subjects_left_the_macro_average_and_writes_their_records(tmp_path, capsys):
    """A subject whose every question was too long vanished from per_subject and the macro average, unsaid, and its
    questions were missing from --out (GSM8K writes each skipped problem with its reason)."""
    rows = [
        {"subject": "virology", "question": "Short?", "options": ["a", "b", "c", "d"], "answer": "A"},
        {"subject": "law", "question": "Very long question. " * 10, "options": ["a", "b", "c", "d"], "answer": "B"},
    ]
    n_short = len(CharTok().encode(mmlu_prompt(rows[0]) + " A")) - 1
    out = tmp_path / "mmlu.jsonl"
    m = evaluate_mmlu(_tiny_cookmind(n_short + 1), CharTok(), rows, scoring="letter", out_path=out, progress=False)
    assert list(m["per_subject"]) == ["virology"] and m["num_subjects"] == 1
    assert m["subjects_not_scored"] == ["law"] and m["skipped_per_subject"] == {"law": 1}
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["subject"] for r in written] == ["virology", "law"]
    assert "exceed the model's context" in written[1]["skipped"] and "skipped" not in written[0]


def test_perplexity_window_beyond_the_context_is_an_error():
    with pytest.raises(ValueError, match="exceeds the model's context of 16 tokens"):
        sequence_nll(_tiny_cookmind(16), list(range(40)), window=32)
    _, n = sequence_nll(_tiny_cookmind(16), list(range(40)), window=16)
    assert n == 39


def test_gsm8k_missing_file_says_which_flag_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass --data PATH"):
        load_gsm8k(tmp_path / "absent.jsonl")


def test_perplexity_of_a_file_refuses_bad_utf8_but_not_a_character_cut_by_max_bytes(tmp_path):
    from cookmind.evals.perplexity import evaluate_text_file

    model, path = _tiny_cookmind(64), tmp_path / "latin1.txt"
    path.write_bytes("café au lait".encode("latin-1"))  # its bytes were dropped silently and the rest scored
    with pytest.raises(ValueError, match=r"latin1.txt:1: invalid UTF-8 at byte 3 of the line; fix or re-encode"):
        evaluate_text_file(model, CharTok(), path, window=16, progress=False)
    path.write_bytes("ab café".encode())
    r = evaluate_text_file(model, CharTok(), path, window=16, max_bytes=7, progress=False)  # cuts é's 2 bytes
    assert r["tokens"] == 5 and r["bytes"] == 5  # "ab caf": 6 characters, the first not predicted
    path.write_bytes("ab café".encode()[:-1])  # the file itself ends inside a character: no cut to blame
    with pytest.raises(ValueError, match=r"latin1.txt:1: invalid UTF-8 at byte 6 of the line"):
        evaluate_text_file(model, CharTok(), path, window=16, max_bytes=100, progress=False)


def test_a_gsm8k_record_without_its_fields_is_named_by_line(tmp_path):
    """It said 'record 2', which is not the line when the file has blank lines, and a line holding a list passed
    the field check ('question' in a list)."""
    path = tmp_path / "g.jsonl"
    path.write_text('{"question": "1+1?", "answer": "#### 2"}\n\n{"question": "2+2?"}\n')
    with pytest.raises(ValueError, match=r"g\.jsonl:3: a GSM8K record needs a question .* got "):
        load_gsm8k(path)
    path.write_text('{"question": "1+1?", "answer": "#### 2"}\n["question", "answer"]\n')
    with pytest.raises(ValueError, match=r"g\.jsonl:2: .* got list"):
        load_gsm8k(path)
    assert load_gsm8k(path, limit=1) == [{"question": "1+1?", "answer": "#### 2"}]


def test_gsm8k_counts_answers_cut_by_max_new_tokens(tmp_path):
    """Answers that ran out of --max-new-tokens were graded with no count: a low accuracy could be the limit's."""
    problems = [{"question": "What is 2+2?", "answer": "#### 4"}, {"question": "What is 3+3?", "answer": "#### 6"}]

    def respond(prompt):
        if "2+2" in prompt:
            return " 4 </think> <answer> 4 </answer>"  # ends at the stop string
        return " let me think about this for a long long long long long while"  # going on when the limit comes

    out = tmp_path / "g.jsonl"
    m = evaluate_gsm8k(OracleLM(respond), CharTok(), problems, out, max_new_tokens=45, progress=False)
    assert m["num_cut_short"] == 1 and m["accuracy"] == 0.5
    assert [r["cut_short"] for r in map(json.loads, out.read_text().splitlines())] == [[False], [True]]


def test_gsm8k_answers_cut_by_the_context_are_not_sent_to_raise_max_new_tokens(tmp_path, monkeypatch, capsys):
    """A 256-token model's answers to GSM8K ran into its context, and `eval gsm8k` said "raise --max-new-tokens to
    let them end"; at --max-new-tokens 1000 it said the same again. An answer cut where the context ends is counted
    apart (num_cut_by_context) and the line names the context, which no --max-new-tokens extends."""
    import types

    import cookmind.infer.loading
    from cookmind.cli import main
    from cookmind.evals.gsm8k import format_prompt

    question = "What is 2+2?"
    prompt_len = len(format_prompt(question, "r1_zero", CharTok()))
    model = OracleLM(lambda prompt: " ever on" * 100)  # never closes its answer
    model.config = types.SimpleNamespace(max_position_embeddings=prompt_len + 30)  # room for 30 new tokens
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    data = tmp_path / "test.jsonl"
    data.write_text(json.dumps({"question": question, "answer": "#### 4"}) + "\n")
    argv = ["eval", "gsm8k", "--model", "m", "--data", str(data), "--quiet"]

    assert main([*argv, "--max-new-tokens", "1000"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert (metrics["num_cut_short"], metrics["num_cut_by_context"]) == (1, 1)
    assert "raise --max-new-tokens" not in captured.err
    assert captured.err == (
        f"cookmind eval gsm8k: 1 answer(s) ran into the end of the model's context of {prompt_len + 30} tokens "
        "(num_cut_by_context) and were graded as cut; no --max-new-tokens lets them end: use a model with a longer "
        "context, or a shorter --template (compact, plain)\n"
    )

    assert main([*argv, "--max-new-tokens", "30"]) == 0  # both end at once: a larger limit would not help either
    metrics = json.loads(capsys.readouterr().out)
    assert (metrics["num_cut_short"], metrics["num_cut_by_context"]) == (1, 1)

    assert main([*argv, "--max-new-tokens", "10"]) == 0  # 10 of the 30 tokens of room: the limit cut it
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert (metrics["num_cut_short"], metrics["num_cut_by_context"]) == (1, 0)
    assert captured.err == (
        "cookmind eval gsm8k: 1 answer(s) ran into --max-new-tokens 10 before they ended (num_cut_short) and were "
        "graded as cut; raise --max-new-tokens to let them end\n"
    )


def test_ppl_out_writes_one_row_a_window_and_says_how_much_max_bytes_left_out(tmp_path, capsys):
    """`eval ppl --out p.jsonl` wrote only p.metrics.json, though its help promised the per-item JSONL; and
    --max-bytes 500 reported the 499 bytes it scored, not what it left out of how many."""
    from cookmind.cli import main

    tiny_hf_tokenizer(tmp_path / "hf")
    tiny_hf_model(tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello tiny model. " * 10)  # 310 bytes
    out = tmp_path / "p.jsonl"
    argv = ["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--window", "8", "--quiet"]
    assert main([*argv, "--max-bytes", "100", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)  # stdout is the one JSON object: the notice went before it and broke `| jq`
    assert metrics["file_bytes"] == 310 and metrics["bytes_not_evaluated"] == 210
    assert "--max-bytes 100: evaluated the first 100 of 310 bytes; 210 bytes (68%) left out" in captured.err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["window"] for r in rows] == list(range(len(rows))) and len(rows) == math.ceil(99 / 8)
    assert sum(r["tokens"] for r in rows) == metrics["tokens"] == 99
    assert sum(r["nll"] for r in rows) == pytest.approx(metrics["nll_per_token"] * 99, rel=1e-5)
    assert json.loads(out.with_suffix(".metrics.json").read_text()) == metrics
    assert main([*argv, "--out", str(out)]) == 2  # p.jsonl is an output now: kept without --overwrite
    assert "already exists" in capsys.readouterr().err


def test_ppl_on_a_store_says_how_many_windows_max_windows_left_out(tmp_path, tok_dir):
    from lm_fixtures import CORPUS

    from cookmind.evals import evaluate_store
    from cookmind.store import TokenStore
    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    (tmp_path / "c.txt").write_text(CORPUS)
    pack([tmp_path / "c.txt"], tmp_path / "s", tok_dir, "seq", progress=False)
    length = TokenStore(tmp_path / "s").stream_length("sequence")
    torch.manual_seed(0)
    model = torch.nn.Embedding(tok.vocab_size, tok.vocab_size)  # a bigram table: logits of the next token
    rows = []
    r = evaluate_store(model, tok, tmp_path / "s", window=16, max_windows=3, progress=False, rows=rows)
    assert length > 4 * 16 and r["windows"] == 3 and r["windows_total"] == math.ceil(length / 16)
    assert r["store_tokens"] == length and r["tokens_not_evaluated"] == length - 3 * 16
    assert [(w["start"], w["stop"], w["tokens"]) for w in rows] == [(0, 16, 15), (16, 32, 15), (32, 48, 15)]
    assert sum(w["bytes"] for w in rows) == r["bytes"] and sum(w["tokens"] for w in rows) == r["tokens"]
    whole = evaluate_store(model, tok, tmp_path / "s", window=16, progress=False)
    assert whole["windows"] == whole["windows_total"] and whole["tokens_not_evaluated"] == 0


@pytest.mark.parametrize("stride", [None, 4])
def test_the_perplexity_bar_counts_the_windows_it_runs(monkeypatch, stride):
    """With a stride below the window the last starts were never run, and the bar ended at 5/6: its total is now
    the windows the loop scores (each target once: the counts add up to every token but the first)."""
    import cookmind.evals.perplexity as ppl

    seen = []

    def recording_tqdm(iterable, **kwargs):
        items = list(iterable)
        seen.append({"total": len(items), "run": 0})
        for item in items:
            seen[-1]["run"] += 1
            yield item

    monkeypatch.setattr(ppl, "progress_bar", recording_tqdm)
    model = tiny_lm().eval()
    rows = []
    with torch.no_grad():
        _, count = sequence_nll(model, list(range(1, 41)), window=16, stride=stride, progress=True, windows=rows)
    assert count == 39 and sum(r["tokens"] for r in rows) == 39
    assert seen == [{"total": len(rows), "run": len(rows)}]


def _bigram_cli(monkeypatch, tok):
    """`cookmind eval` with its model loading replaced by a seeded bigram table (logits of the next token) and
    ``tok``: the scores can be computed by hand."""
    import cookmind.infer.loading

    torch.manual_seed(0)
    model = torch.nn.Embedding(tok.vocab_size, tok.vocab_size)
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, tok))
    return model.weight.detach()


def test_ppl_reads_json_lines_curate_shards_and_folders_as_their_documents_text(tmp_path, tok_dir, monkeypatch, capsys):
    """`eval ppl --data h.jsonl` scored the raw JSON (braces, keys, escapes): ppl 471 against 426 for the same
    documents as plain text; a curate shard (.jsonl.gz) was 'invalid UTF-8 at byte 1' and a curate output folder
    'no meta.json'. Each is read as `pack` reads it: the records' text, each document ended by <|endoftext|>, so
    they score as the plain text file of those documents (<|endoftext|> after each) does."""
    import gzip

    from cookmind.cli import main
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    table = _bigram_cli(monkeypatch, tok)
    docs = ['The cook said "stir it".', "Tom has 3 apples.\nHe eats one.", "Crème brûlée, à la carte"]
    eot = tok.special_tokens["<|endoftext|>"]
    ids = [i for d in docs for i in tok.encode(d) + [eot]]  # by hand: as pack joins the records
    log_p = torch.log_softmax(table, -1)
    nll = -sum(log_p[a, b].item() for a, b in zip(ids[:-1], ids[1:]))
    n_bytes = sum(len(d.encode()) for d in docs) - len(tok.decode(ids[:1]).encode())  # an end token is no text

    lines = "".join(json.dumps({"id": i, "text": d}) + "\n" for i, d in enumerate(docs))  # é as \u00e9
    (tmp_path / "h.jsonl").write_text(lines)
    (tmp_path / "h.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    (tmp_path / "clean").mkdir()  # curate's output: shard-*.jsonl.gz beside its side files
    for k, part in enumerate((docs[:2], docs[2:])):
        shard = "".join(json.dumps({"text": d, "lang": "en"}) + "\n" for d in part)
        (tmp_path / "clean" / f"shard-{k:05d}.jsonl.gz").write_bytes(gzip.compress(shard.encode()))
    (tmp_path / "clean" / "stats.json").write_text("{}")
    (tmp_path / "h.txt").write_text("".join(d + "<|endoftext|>" for d in docs))
    for data in ("h.jsonl", "h.jsonl.gz", "clean", "clean/shard-00001.jsonl.gz", "h.txt"):
        argv = ["eval", "ppl", "--model", "m", "--data", str(tmp_path / data), "--window", str(len(ids)), "--quiet"]
        assert main(argv) == 0, capsys.readouterr().err
        m = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        if data == "clean/shard-00001.jsonl.gz":  # the last document alone
            assert m["tokens"] == len(tok.encode(docs[2])), data
            continue
        assert (m["tokens"], m["bytes"]) == (len(ids) - 1, n_bytes), data
        assert m["nll_per_token"] == pytest.approx(nll / (len(ids) - 1), rel=1e-5), data
        assert m["perplexity"] == pytest.approx(math.exp(nll / (len(ids) - 1)), rel=1e-5), data
    # --max-bytes keeps the first bytes: here the first document, its <|endoftext|>, 5 bytes of the next; of a text
    # file those are its bytes (the separator spelled out), of documents their text (an end token is none)
    head = tok.encode(docs[0]) + [eot] + tok.encode(docs[1][:5])
    for data, size, eot_bytes in (("h.jsonl", "text_bytes", 0), ("h.txt", "file_bytes", len("<|endoftext|>"))):
        cut = len(docs[0].encode()) + eot_bytes + 5
        total = sum(len(d.encode()) + eot_bytes for d in docs)
        argv = ["eval", "ppl", "--model", "m", "--data", str(tmp_path / data), "--window", "64", "--quiet"]
        assert main([*argv, "--max-bytes", str(cut)]) == 0
        printed = capsys.readouterr()
        m = json.loads(printed.out)
        assert (m["tokens"], m[size], m["bytes_not_evaluated"]) == (len(head) - 1, total, total - cut), data
        assert m["nll_per_token"] == pytest.approx(
            -sum(log_p[a, b].item() for a, b in zip(head[:-1], head[1:])) / (len(head) - 1), rel=1e-5
        )
        assert f"evaluated the first {cut} of {total} bytes" in printed.err
    # a token store made by pack stays scored as the store
    from cookmind.store.packer import pack

    pack([tmp_path / "h.jsonl"], tmp_path / "store", tok_dir, "seq", progress=False)
    assert main(["eval", "ppl", "--model", "m", "--data", str(tmp_path / "store"), "--window", "16", "--quiet"]) == 0
    m = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert m["store_tokens"] == len(ids) and m["windows_total"] == math.ceil(len(ids) / 16)


def test_eval_data_of_the_wrong_kind_says_file_or_folder_and_what_to_pass(tmp_path, monkeypatch, capsys):
    """`eval gsm8k --data /work/shared/data/mmlu` (a folder that exists) said 'GSM8K file ... not found'; `eval mmlu
    --data test.jsonl` said 'MMLU split folder test.jsonl/test not found'."""
    from cookmind.cli import main

    _bigram_cli(monkeypatch, CharTok())
    mmlu = tmp_path / "mmlu"
    (mmlu / "test").mkdir(parents=True)
    (mmlu / "test" / "virology_test.csv").write_text("q,a,b,c,d,A\n")
    assert main(["eval", "gsm8k", "--model", "m", "--data", str(mmlu), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval gsm8k: error: GSM8K --data {mmlu} is a folder, not a file; pass --data ")
    assert "not found" not in err and f"an MMLU root: `cookmind eval mmlu --data {mmlu}`" in err
    gsm8k = tmp_path / "gsm8k"
    gsm8k.mkdir()
    (gsm8k / "test.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    assert main(["eval", "gsm8k", "--model", "m", "--data", str(gsm8k), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{gsm8k} is a folder, not a file" in err and f"e.g. {gsm8k / 'test.jsonl'}" in err
    assert main(["eval", "mmlu", "--model", "m", "--data", str(gsm8k / "test.jsonl"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval mmlu: error: MMLU --data {gsm8k / 'test.jsonl'} is a file, not a folder;")
    assert "not found" not in err and "`cookmind eval gsm8k --data" in err


def test_eval_mmlu_given_a_split_folder_names_its_parent(tmp_path, monkeypatch, capsys):
    """`eval mmlu --data /work/shared/data/mmlu/test` (the split folder, its CSVs inside) said 'MMLU split folder
    .../test/test not found' and what a root holds, not that the folder given was one level too deep."""
    from cookmind.cli import main

    _bigram_cli(monkeypatch, CharTok())
    mmlu = tmp_path / "mmlu"
    (mmlu / "test").mkdir(parents=True)
    (mmlu / "test" / "virology_test.csv").write_text("q,a,b,c,d,A\n")
    assert main(["eval", "mmlu", "--model", "m", "--data", str(mmlu / "test"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval mmlu: error: MMLU split folder {mmlu / 'test' / 'test'} not found;")
    assert f"{mmlu / 'test'} holds the split's CSV files itself: pass its parent, --data {mmlu}" in err
    assert err.count("\n") == 1


def test_eval_checks_its_data_before_loading_the_model(tmp_path, capsys):
    """A wrong --data was said only after the model had loaded (minutes for a large one): with a model folder that
    does not exist either, the error named the model. Each task now reads or checks its data first."""
    from cookmind.cli import main

    missing_model, missing = tmp_path / "no-model", tmp_path / "no-data.jsonl"
    for task in ("gsm8k", "mmlu", "ppl"):
        assert main(["eval", task, "--model", str(missing_model), "--data", str(missing), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"cookmind eval {task}: error: ") and str(missing) in err, err
        assert str(missing_model) not in err, err


def test_ppl_refuses_limits_that_do_not_apply_to_its_data_before_loading_the_model(tmp_path, tok_dir, capsys):
    """--max-bytes and --stride on a token store, and --max-windows on text, were accepted and did nothing; a
    folder that is neither a store nor curate output was read as a store after the model had loaded. Each is now
    one line before the model loads (the model folder here does not exist: its error would name it)."""
    from lm_fixtures import CORPUS

    from cookmind.cli import main
    from cookmind.store.packer import pack

    (tmp_path / "c.txt").write_text(CORPUS)
    pack([tmp_path / "c.txt"], tmp_path / "s", tok_dir, "seq", progress=False)
    (tmp_path / "empty").mkdir()
    model = tmp_path / "no-model"
    cases = [
        (tmp_path / "s", ["--max-bytes", "100"], "--max-bytes applies to text and documents, and --data"),
        (tmp_path / "s", ["--stride", "4"], "--stride applies to text and documents, and --data"),
        (tmp_path / "c.txt", ["--max-windows", "2"], "--max-windows applies to a token store, and --data"),
        (tmp_path / "empty", [], "is a folder with neither a token store's meta.json nor a curate output's"),
    ]
    for data, extra, says in cases:
        assert main(["eval", "ppl", "--model", str(model), "--data", str(data), "--quiet", *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("cookmind eval ppl: error: ") and says in err and str(model) not in err, err


def test_gsm8k_and_mmlu_metrics_name_what_was_measured_and_how_much_limit_left_out(tmp_path, monkeypatch, capsys):
    """The metrics JSON of gsm8k and mmlu (printed and saved beside --out) named neither the data, the template or
    split, nor the flags that chose the items: a metrics file said "accuracy": 0.5 of something. And --limit cut
    GSM8K's 5 problems to 2, MMLU's 3 questions a subject to 1, without a word of how many the data held (ppl's
    --max-bytes says it). Each now names its task, model, data and settings, and a --limit that left items out is
    said on stderr and recorded (num_problems_in_data, num_questions_in_data), counted here from the files."""
    import cookmind.infer.loading
    from cookmind.cli import main

    answers = {f"Q{i}?": f" {i}</think> <answer>{i}</answer>" for i in range(5)}
    model = OracleLM(lambda prompt: next(a for q, a in answers.items() if q in prompt))
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    data = tmp_path / "g.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": f"#### {q[1]}"}) + "\n\n" for q in answers))
    out = tmp_path / "g_out.jsonl"
    argv = ["eval", "gsm8k", "m", "--data", str(data), "--quiet", "--limit", "2", "--out", str(out)]
    assert main([*argv, "--max-new-tokens", "40"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert metrics["accuracy"] == 1.0 and metrics["num_problems"] == 2
    expected = {"task": "gsm8k", "model": "m", "data": str(data), "template": "r1_zero", "temperature": 0.0}
    assert {k: metrics[k] for k in expected} == expected
    assert (metrics["max_new_tokens"], metrics["limit"], metrics["num_problems_in_data"]) == (40, 2, 5)
    assert json.loads(out.with_suffix(".metrics.json").read_text()) == metrics
    assert "--limit 2: took the first 2 of 5 problems" in captured.err, captured.err
    assert main([*argv[:-2], "--limit", "5"]) == 0  # nothing left out: nothing said
    captured = capsys.readouterr()
    assert "--limit" not in captured.err and json.loads(captured.out)["num_problems_in_data"] == 5
    # gzipped data is counted as read (its compressed bytes' newlines were counted: 200 problems read as 12 or so)
    import gzip

    gz = tmp_path / "g.jsonl.gz"
    gz.write_bytes(gzip.compress(data.read_bytes()))
    assert main(["eval", "gsm8k", "m", "--data", str(gz), "--quiet", "--limit", "2", "--max-new-tokens", "40"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["num_problems_in_data"] == 5, captured.out

    model.respond = lambda prompt: " B"
    model.marker = "Answer:"
    root = tmp_path / "mmlu"
    (root / "val").mkdir(parents=True)
    for subject in ("law", "art"):
        (root / "val" / f"{subject}_val.csv").write_text("".join(f"Q{i}?,a,b,c,d,{'AB'[i % 2]}\n" for i in range(3)))
    argv = ["eval", "mmlu", "m", "--data", str(root), "--split", "val", "--quiet", "--scoring", "generate"]
    assert main([*argv, "--limit", "2"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert (metrics["num_questions"], metrics["micro_accuracy"]) == (4, 0.5)  # B right on Q1 of each subject
    expected = {"task": "mmlu", "model": "m", "data": str(root), "split": "val", "subjects": ["art", "law"]}
    assert {k: metrics[k] for k in expected} == expected
    assert (metrics["limit_per_subject"], metrics["num_questions_in_data"]) == (2, 6)
    assert "--limit-per-subject 2: took 4 of the 6 questions" in captured.err, captured.err


def test_the_limit_line_does_not_count_a_question_too_long_for_the_context_as_evaluated(tmp_path, monkeypatch, capsys):
    """`eval mmlu --limit 2` on a 256-token model said "evaluated 114 of the 14,042 questions", then "skipped 17 of 114
    items whose prompt does not fit": 97 were evaluated (num_questions). gsm8k's line said the same. The --limit line
    now says how many --limit took and how many of them were evaluated, the counts of the metrics."""
    from types import SimpleNamespace

    import cookmind.infer.loading
    from cookmind.cli import main

    answers = {f"Q{i}?": f" {i}</think> <answer>{i}</answer>" for i in range(5)}
    model = OracleLM(lambda prompt: next((a for q, a in answers.items() if q in prompt), " 0"))
    model.config = SimpleNamespace(max_position_embeddings=600)  # CharTok: a token a character
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    data = tmp_path / "g.jsonl"
    questions = ["Q0?", "Q1? " + "long " * 200, "Q2?", "Q3?", "Q4?"]
    data.write_text("".join(json.dumps({"question": q, "answer": f"#### {q[1]}"}) + "\n" for q in questions))
    argv = ["eval", "gsm8k", "m", "--data", str(data), "--quiet", "--limit", "3", "--max-new-tokens", "40"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert (metrics["num_problems"], metrics["num_skipped_too_long"], metrics["num_problems_in_data"]) == (2, 1, 5)
    assert "--limit 3: took the first 3 of 5 problems in --data (2 evaluated" in captured.err, captured.err
    assert "evaluated the first 3" not in captured.err

    model.respond = lambda prompt: " B"
    model.marker = "Answer:"
    root = tmp_path / "mmlu"
    (root / "val").mkdir(parents=True)
    rows = ["Q0?,a,b,c,d,A\n", f"Q1? {'long ' * 200},a,b,c,d,B\n", "Q2?,a,b,c,d,A\n"]
    (root / "val" / "art_val.csv").write_text("".join(rows))
    argv = ["eval", "mmlu", "m", "--data", str(root), "--split", "val", "--quiet", "--scoring", "generate"]
    assert main([*argv, "--limit", "2"]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    assert (metrics["num_questions"], metrics["num_skipped_too_long"], metrics["num_questions_in_data"]) == (1, 1, 3)
    assert "--limit-per-subject 2: took 2 of the 3 questions" in captured.err, captured.err
    assert "(1 evaluated" in captured.err and "evaluated 2 of" not in captured.err, captured.err


def test_gsm8k_out_with_a_lone_surrogate_in_a_question_is_written(tmp_path, monkeypatch, capsys):
    """A question whose JSON spells a lone surrogate ("\\ud800", no character; the encoder reads it as U+FFFD) was
    answered and graded, and then writing --out failed on it ("'utf-8' codec can't encode character '\\ud800'"):
    the whole run's answers lost, exit 2. The question is now read as the model is given it, with U+FFFD there, and
    --out is written."""
    import cookmind.infer.loading
    from cookmind.cli import main

    model = OracleLM(lambda prompt: " 4</think> <answer>4</answer>")
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "What is 2+2? \\ud800", "answer": "#### 4"}\n')
    out = tmp_path / "g_out.jsonl"
    assert main(["eval", "gsm8k", "m", "--data", str(data), "--quiet", "--out", str(out)]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["accuracy"] == 1.0
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["question"] == "What is 2+2? \ufffd" and record["grades"] == [1.0]


def test_eval_refusing_an_existing_out_names_the_file_the_user_passed(tmp_path, monkeypatch, capsys):
    """Re-running with an existing `--out ev/gsm8k.jsonl` complained about ev/gsm8k.metrics.json, a file the user
    never named; the --out itself comes first, and the metrics file is named as the one beside it."""
    from cookmind.cli import main

    _bigram_cli(monkeypatch, CharTok())
    data = tmp_path / "test.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    (tmp_path / "ev").mkdir()
    out, metrics = tmp_path / "ev" / "gsm8k.jsonl", tmp_path / "ev" / "gsm8k.metrics.json"
    out.write_text("{}\n")
    metrics.write_text("{}")
    argv = ["eval", "gsm8k", "--model", "m", "--data", str(data), "--quiet", "--out", str(out)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"cookmind eval gsm8k: error: --out {out} already exists; choose another output path or pass --overwrite\n"
    )
    out.unlink()  # the metrics file alone is still refused, as the one beside --out
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"cookmind eval gsm8k: error: --out {out}: the metrics file beside it, {metrics}, already exists; "
        "choose another --out or pass --overwrite\n"
    )
    assert metrics.read_text() == "{}"


def test_eval_refusing_the_metrics_file_beside_out_names_it_as_that(tmp_path, monkeypatch, capsys):
    """Only an existing metrics file was named as the one beside --out: one that is a folder, or the --data itself,
    was refused as '--out ev/gsm8k.metrics.json ...', a path the user never passed as --out."""
    from cookmind.cli import main

    _bigram_cli(monkeypatch, CharTok())
    (tmp_path / "ev").mkdir()
    data, out = tmp_path / "ev" / "test.metrics.json", tmp_path / "ev" / "test.jsonl"
    data.write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    argv = ["eval", "gsm8k", "--model", "m", "--quiet", "--out", str(out)]
    assert main([*argv, "--data", str(data), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval gsm8k: error: --out {out}: the metrics file beside it, {data}, "), err
    assert "is also the input" in err and data.read_text().startswith('{"question"')
    folder = tmp_path / "ev" / "other.metrics.json"
    folder.mkdir()
    other = tmp_path / "ev" / "other.jsonl"
    assert main([*argv[:-1], str(other), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval gsm8k: error: --out {other}: the metrics file beside it, {folder}, "), err
    assert "is a directory" in err


def test_eval_of_an_empty_data_file_or_folder_is_an_error_not_an_accuracy_of_zero(tmp_path, capsys):
    """`eval gsm8k --data empty.jsonl` printed {"num_problems": 0, "accuracy": 0.0}, and an MMLU split of empty
    CSVs {"num_questions": 0, "macro_accuracy": 0.0}: a score of nothing, read as a model that got all wrong. Each
    is now one line naming the data, before the model loads (the model folder here does not exist)."""
    from cookmind.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")  # blank lines only
    with pytest.raises(ValueError, match=r"empty\.jsonl: no GSM8K problems in the file"):
        load_gsm8k(empty)
    mmlu = tmp_path / "mmlu"
    (mmlu / "test").mkdir(parents=True)
    (mmlu / "test" / "virology_test.csv").write_text("")
    with pytest.raises(ValueError, match=r"no MMLU questions in .*test \(1 CSV file, every one empty\)"):
        load_mmlu(mmlu)
    (mmlu / "val").mkdir()
    with pytest.raises(ValueError, match=r"no MMLU questions in .*val \(no <subject>_val\.csv files\)"):
        load_mmlu(mmlu, "val")
    model = tmp_path / "no-model"
    for task, data in (("gsm8k", empty), ("mmlu", mmlu)):
        assert main(["eval", task, "--model", str(model), "--data", str(data), "--quiet"]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith(f"cookmind eval {task}: error: ") and "no-model" not in captured.err
        assert "accuracy" not in captured.out


def test_eval_where_every_prompt_is_too_long_is_an_error_not_an_accuracy_of_zero(tmp_path):
    """When every question was skipped for the context, GSM8K said accuracy 0.0 and MMLU macro_accuracy 0.0 over
    no graded item. Now an error says so and what to change; one item that fits is scored as before."""
    long = "Tom has many apples. " * 6  # 126 CharTok tokens, past a 64-token context
    problems = [{"question": long, "answer": "#### 3"}] * 2
    with pytest.raises(ValueError, match=r"every one of the 2 GSM8K prompts fills the model's context of 64 tokens"):
        evaluate_gsm8k(_tiny_cookmind(64), CharTok(), problems, template="plain", max_new_tokens=2, progress=False)
    rows = [{"subject": "law", "question": long, "options": ["a", "b", "c", "d"], "answer": "B"}]
    for scoring in ("letter", "generate"):
        with pytest.raises(
            ValueError, match=r"every one of the 1 MMLU questions is too long for the model.s context of 64 tokens"
        ):
            evaluate_mmlu(_tiny_cookmind(64), CharTok(), rows, scoring=scoring, progress=False)
    short = {"question": "1+1?", "answer": "#### 2"}
    m = evaluate_gsm8k(
        _tiny_cookmind(64), CharTok(), [*problems, short], template="plain", max_new_tokens=2, progress=False
    )
    assert m["num_problems"] == 1 and m["num_skipped_too_long"] == 2


def test_a_gsm8k_answer_given_as_a_number_is_graded_not_a_crash(tmp_path):
    """{"answer": 4} passed the field check and raised a TypeError traceback in extract_gold after every problem
    had been generated. A number answer is now read as its text; another type is named by line before the model
    runs. Reference: the oracle answers each question's true sum, so every one is right."""
    path = tmp_path / "g.jsonl"
    path.write_text('{"question": "2+2?", "answer": 4}\n{"question": "1.5+1?", "answer": 2.5}\n')
    problems = load_gsm8k(path)
    assert problems == [{"question": "2+2?", "answer": "4"}, {"question": "1.5+1?", "answer": "2.5"}]
    sums = {"2+2?": "4", "1.5+1?": "2.5"}
    oracle = OracleLM(lambda p: f" {sums[p.split('Q: ')[1].split(chr(10))[0]]}", marker="A:")
    m = evaluate_gsm8k(oracle, CharTok(), problems, template="Q: {question}\nA:", max_new_tokens=8, progress=False)
    assert m["accuracy"] == 1.0 and m["num_problems"] == 2
    path.write_text('{"question": "2+2?", "answer": 4}\n{"question": "2+2?", "answer": [4]}\n')
    with pytest.raises(
        ValueError, match=r"g\.jsonl:2: 'answer' must be text \('\.\.\. #### N'\) or a finite number, got list"
    ):
        load_gsm8k(path)


@pytest.mark.parametrize(
    "record, reason",
    [
        ('{"prompt": 5, "answer": "#### 3"}', "'prompt' must be text, got int"),
        ('{"question": ["2+2?"], "answer": "4"}', "'question' must be text, got list"),
        ('{"prompt": "2+2?", "reference_answer": [4]}', "'reference_answer' must be text ('... #### N') or a finite"),
        ('{"question": "2+2?", "ground_truth": true}', "'ground_truth' must be text ('... #### N') or a finite"),
        ('{"prompt": "  ", "answer": "4"}', "empty text in 'prompt'; fix or remove the record"),
        ('{"question": "2+2?", "reference_answer": " "}', "empty text in 'reference_answer'; fix or remove the record"),
    ],
)
def test_a_bad_gsm8k_field_is_named_as_the_record_spells_it(tmp_path, record, reason):
    """A problem file in pack's grpo fields ({"prompt", "reference_answer"}) whose prompt was not text said "'question'
    must be text" (its answer: "'answer' must be ..."), fields the record did not have: the error names the field the
    record holds, and its line."""
    path = tmp_path / "g.jsonl"
    path.write_text('{"question": "1+1?", "answer": "#### 2"}\n' + record + "\n")
    with pytest.raises(ValueError) as err:
        load_gsm8k(path)
    assert str(err.value).startswith(f"{path}:2: {reason}"), str(err.value)


def test_a_bad_mmlu_row_says_what_it_found_and_a_header_row_is_named_as_one(tmp_path):
    """Every bad row read "expected question,A,B,C,D,answer with answer in A-D", whatever was wrong: a CSV saved
    with a header (as spreadsheet and Hugging Face exports are) failed at line 1 with no word of the header, a row
    of 5 fields or an answer 'E' the same. The line now says what it found."""
    root = tmp_path / "mmlu"
    (root / "test").mkdir(parents=True)
    csv = root / "test" / "virology_test.csv"
    good = "What?,a,b,c,d,A\n"
    for text, line, found in (
        ("question,A,B,C,D,answer\n" + good, 1, r"looks like a header row; MMLU's CSVs have none: remove it"),
        (good + "What?,a,b,c,A\n", 2, r"got 5 fields"),
        (good + good + "What?,a,b,c,d,E\n", 3, r"got answer 'E'"),
    ):
        csv.write_text(text)
        with pytest.raises(ValueError, match=rf"virology_test\.csv:{line}: expected question,A,B,C,D,answer .*{found}"):
            load_mmlu(root)


def test_an_mmlu_row_without_one_answer_letter_is_refused_not_graded_wrong(tmp_path):
    """The answer check was `answer in "ABCD"`, a substring test: an empty answer field (a row whose letter was
    lost), "AB" or "ABCD" passed it, and the question was scored against an answer no prediction could equal:
    counted wrong without a word. Each now stops at its line, as an 'E' does."""
    root = tmp_path / "mmlu"
    (root / "test").mkdir(parents=True)
    csv = root / "test" / "virology_test.csv"
    good = "What?,a,b,c,d,A\n"
    for answer in ("", " ", "AB", "BC", "ABCD"):
        csv.write_text(good + f"What?,a,b,c,d,{answer}\n")
        with pytest.raises(ValueError, match=r"virology_test\.csv:2: expected question,A,B,C,D,answer .*got answer"):
            load_mmlu(root)
    csv.write_text(good + "Why?,a,b,c,d, D\n")  # a letter with spaces around it is read, as before
    assert [r["answer"] for r in load_mmlu(root)] == ["A", "D"]


def test_ppl_says_how_many_documents_it_left_out_for_empty_text(tmp_path, tok_dir, monkeypatch, capsys):
    """Records with empty text were left out without a word: three records gave "documents": 2 and nothing said why
    the count fell short (tokenizer train counts them as empty_records). Now "empty_documents" says how many."""
    from cookmind.cli import main
    from cookmind.tokenizer import Tokenizer

    _bigram_cli(monkeypatch, Tokenizer.load(tok_dir))
    records = [{"text": "The cook stirs."}, {"text": ""}, {"text": "  \n"}, {"text": "Tom has 3 apples."}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["eval", "ppl", "--model", "m", "--data", str(tmp_path / "d.jsonl"), "--window", "64", "--quiet"]) == 0
    m = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (m["documents"], m["empty_documents"]) == (2, 2)


def test_ppl_scores_a_lone_surrogate_in_json_text_as_the_u_fffd_pack_stores(tmp_path, tok_dir, monkeypatch, capsys):
    """JSON text may spell a lone surrogate ("\\ud800"), which pack stores as U+FFFD's ids; `eval ppl` on the same
    file stopped with "'utf-8' codec can't encode character '\\ud800' ... surrogates not allowed", naming no file
    or line. It now scores the text as pack stores it: the same figures as the file with U+FFFD written in, and
    says how many it read so (lone_surrogates)."""
    from cookmind.cli import main
    from cookmind.tokenizer import Tokenizer

    _bigram_cli(monkeypatch, Tokenizer.load(tok_dir))
    docs = ["The cook \ud800 stirs.", "Tom has \udfff\ud800 3 apples."]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    (tmp_path / "f.jsonl").write_text(
        "".join(json.dumps({"text": d.replace("\ud800", "\ufffd").replace("\udfff", "\ufffd")}) + "\n" for d in docs)
    )
    figures = []
    for name in ("s.jsonl", "f.jsonl"):
        assert main(["eval", "ppl", "m", "--data", str(tmp_path / name), "--window", "64", "--quiet"]) == 0
        figures.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert figures[0].pop("lone_surrogates") == 3 and "lone_surrogates" not in figures[1]
    for m in figures:
        m.pop("data")
    assert figures[0] == figures[1]


def test_bits_per_byte_counts_the_documents_bytes_not_the_separator_spelled_out(tmp_path):
    """Bits per byte divided by the text's bytes with each <|endoftext|> counted as its 13 characters: two 5-byte
    documents scored over 35 bytes instead of 9. A document separator is not text; its prediction stays in the NLL
    (where a document ends is information about the text), its spelling not in the bytes. By hand: a byte tokenizer
    (one token a byte) and a uniform model (every token costs log2 V bits)."""
    from cookmind.evals import evaluate_data
    from cookmind.store.packer import pack
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    tok.save(tmp_path / "tok")
    model = torch.nn.Embedding(tok.vocab_size, tok.vocab_size)
    torch.nn.init.zeros_(model.weight)  # uniform: -log p = ln V for every token
    # h e l l o EOT w o r l d EOT: 12 tokens, 11 predicted; bytes: 10 of text less the unpredicted first "h"
    expected = 11 * math.log2(tok.vocab_size) / 9
    (tmp_path / "d.txt").write_text("hello<|endoftext|>world<|endoftext|>")
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n{"text": "world"}\n')
    pack([tmp_path / "d.jsonl"], tmp_path / "store", tmp_path / "tok", "seq", progress=False)
    for data in ("d.txt", "d.jsonl", "store"):
        r = evaluate_data(model, tok, tmp_path / data, window=16, progress=False)
        assert (r["tokens"], r["bytes"]) == (11, 9), data
        assert r["bits_per_byte"] == pytest.approx(expected, rel=1e-6), data
    # a separator first opens no document (pack counts none): "hello" then its end token, 5 predicted over 4 bytes
    # (the first "h" is context)
    (tmp_path / "e.txt").write_text("<|endoftext|>hello<|endoftext|>")
    r = evaluate_data(model, tok, tmp_path / "e.txt", window=16, progress=False)
    assert (r["tokens"], r["bytes"], r["empty_documents"]) == (5, 4, 0)
    # --max-bytes on documents counts their text: 7 bytes are "hello" (then its end token) and "wo"
    r = evaluate_data(model, tok, tmp_path / "d.jsonl", window=16, max_bytes=7, progress=False)
    assert (r["tokens"], r["bytes"], r["context_bytes"], r["text_bytes"], r["bytes_not_evaluated"]) == (7, 6, 1, 10, 3)


def test_ppl_bytes_add_up_to_the_data_and_the_report_names_the_data_given(tmp_path):
    """On a curate folder of one shard the report named the shard, on one of two the folder; and `bytes` was the
    text's bytes less the first token's (never predicted: it is context) while bytes_not_evaluated said 0, so the
    figures did not add up to text_bytes. Now the first token's are context_bytes: bytes + context_bytes +
    bytes_not_evaluated == text_bytes, and of a text file, with the bytes that are no document text (a byte-order
    mark, each <|endoftext|> spelled out, the whitespace around documents: not_text_bytes), == file_bytes. By hand:
    a byte tokenizer (one token a byte), so every figure is a count of characters."""
    import gzip

    from cookmind.evals import evaluate_data
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

    tok = Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS)
    model = torch.nn.Embedding(tok.vocab_size, tok.vocab_size)
    lines = b'{"text": "hello"}\n{"text": "world"}\n'
    for n_shards in (1, 2):
        folder = tmp_path / f"curated{n_shards}"
        folder.mkdir()
        for k in range(n_shards):
            (folder / f"shard-{k:05d}.jsonl.gz").write_bytes(gzip.compress(lines))
        r = evaluate_data(model, tok, folder, window=64, progress=False)
        assert r["path"] == str(folder)
        text = 10 * n_shards  # "hello" and "world" a shard
        assert (r["text_bytes"], r["bytes"], r["context_bytes"], r["bytes_not_evaluated"]) == (text, text - 1, 1, 0)
    r = evaluate_data(model, tok, folder, window=64, max_bytes=7, progress=False)  # "hello" and "wo"
    assert (r["text_bytes"], r["bytes"], r["context_bytes"], r["bytes_not_evaluated"]) == (20, 6, 1, 13)
    assert r["bytes"] + r["context_bytes"] + r["bytes_not_evaluated"] == r["text_bytes"]

    data = "\ufeff hello <|endoftext|>\nworld\n<|endoftext|>cook"  # 3 + 1 + 5 + 1 + 13 + 1 + 5 + 1 + 13 + 4 bytes
    (tmp_path / "t.txt").write_text(data, encoding="utf-8")
    r = evaluate_data(model, tok, tmp_path / "t.txt", window=64, progress=False)
    assert (r["path"], r["file_bytes"], r["bytes"], r["context_bytes"]) == (str(tmp_path / "t.txt"), 47, 13, 1)
    assert (r["not_text_bytes"], r["bytes_not_evaluated"]) == (3 + 1 + 1 + 13 + 1 + 1 + 13, 0)
    r = evaluate_data(model, tok, tmp_path / "t.txt", window=64, max_bytes=23, progress=False)  # to the first end
    assert (r["bytes"], r["context_bytes"], r["not_text_bytes"], r["bytes_not_evaluated"]) == (4, 1, 3 + 1 + 1 + 13, 24)
    assert r["bytes"] + r["context_bytes"] + r["not_text_bytes"] + r["bytes_not_evaluated"] == r["file_bytes"]


def test_a_gsm8k_record_with_an_empty_question_or_answer_is_named_by_line(tmp_path):
    """An empty question was sent to the model and an empty answer graded every response wrong, with nothing said; as
    pack reads such a record, an empty required field is a bad record."""
    path = tmp_path / "g.jsonl"
    for bad, field in (
        ('{"question": "", "answer": "#### 4"}', "question"),
        ('{"question": "2+2?", "answer": " "}', "answer"),
    ):
        path.write_text('{"question": "1+1?", "answer": "#### 2"}\n' + bad + "\n")
        with pytest.raises(ValueError, match=rf"g\.jsonl:2: empty text in '{field}'"):
            load_gsm8k(path)


def test_ppl_on_text_scores_the_ids_pack_stores_for_it(tmp_path, monkeypatch, capsys):
    """Plain text with two separators in a row scored two end tokens ("hello E E world"), and a blank piece between two
    its whitespace, where pack leaves such an empty document out; and with a tokenizer whose end is its EOS (Llama's
    </s>) the separator was scored as its 13 characters, where pack puts that end token. Text and its packed store now
    score the same ids, and the report counts the empty documents left out."""
    from tokenizer_fixtures import llama_style_tokenizer

    from cookmind.evals import evaluate_data
    from cookmind.store import TokenStore
    from cookmind.store.packer import pack
    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer

    Tokenizer({i: bytes([i]) for i in range(256)}, [], DEFAULT_SPECIAL_TOKENS).save(tmp_path / "ours")
    llama_style_tokenizer(tmp_path / "llama", bos=False)
    (tmp_path / "d.txt").write_text("<|endoftext|>".join(["hello", "", "world", " \n", "cook", ""]))
    for name in ("ours", "llama"):
        tok = Tokenizer.load(tmp_path / name)
        pack([tmp_path / "d.txt"], tmp_path / f"{name}.store", tmp_path / name, "seq", progress=False)
        store = TokenStore(tmp_path / f"{name}.store")
        end = tok.eos_id
        by_hand = [*tok.encode("hello"), end, *tok.encode("world"), end, *tok.encode("cook"), end]
        assert store.stream("sequence", 0, store.stream_length("sequence")).tolist() == by_hand, name
        torch.manual_seed(0)
        model = torch.nn.Embedding(tok.vocab_size, tok.vocab_size)  # a bigram table
        text = evaluate_data(model, tok, tmp_path / "d.txt", window=64, progress=False)
        packed = evaluate_data(model, tok, tmp_path / f"{name}.store", window=64, progress=False)
        assert (text["tokens"], text["bytes"]) == (packed["tokens"], packed["bytes"]) == (len(by_hand) - 1, 13), name
        assert text["nll_per_token"] == pytest.approx(packed["nll_per_token"], rel=1e-6), name
        assert text["empty_documents"] == 2, name
    from cookmind.cli import main

    _bigram_cli(monkeypatch, tok)
    assert main(["eval", "ppl", "--model", "m", "--data", str(tmp_path / "d.txt"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "left out 2 empty document(s)" in captured.err and json.loads(captured.out)["empty_documents"] == 2


def test_ppl_on_text_ends_its_last_document_as_pack_does(tmp_path, tok_dir):
    """A text file whose last document has no <|endoftext|> after it ("hello<|endoftext|>world", corpus.en, any file
    of one document) is packed with an end token after that document too, as after every other; eval ppl scored it
    without one, a token fewer than the store holds, so the model's guess of where the text ends was never scored.
    Text and its packed store now score the same ids: by hand, each document's ids and then the end token."""
    from cookmind.evals import evaluate_data
    from cookmind.store import TokenStore
    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    eot = tok.special_tokens["<|endoftext|>"]
    torch.manual_seed(0)
    model = torch.nn.Embedding(tok.vocab_size, tok.vocab_size)  # a bigram table
    for name, text, docs in (
        ("two", "hello<|endoftext|>world\n", ["hello", "world"]),
        ("one", "The cook said stir it.\nTom has 3 apples.", ["The cook said stir it.\nTom has 3 apples."]),
    ):
        (tmp_path / f"{name}.txt").write_text(text)
        by_hand = [i for d in docs for i in [*tok.encode(d), eot]]
        pack([tmp_path / f"{name}.txt"], tmp_path / name, tok_dir, "seq", progress=False)
        store = TokenStore(tmp_path / name)
        assert store.stream("sequence", 0, store.stream_length("sequence")).tolist() == by_hand, name
        scored = evaluate_data(model, tok, tmp_path / f"{name}.txt", window=64, progress=False)
        packed = evaluate_data(model, tok, tmp_path / name, window=64, progress=False)
        logp = torch.log_softmax(model.weight.detach()[by_hand[:-1]], -1)
        nll = -logp[torch.arange(len(by_hand) - 1), by_hand[1:]].sum().item()
        assert scored["tokens"] == packed["tokens"] == len(by_hand) - 1, name
        assert scored["nll_per_token"] == pytest.approx(nll / (len(by_hand) - 1), rel=1e-5), name
        assert scored["bytes"] == packed["bytes"], name


def test_ppl_reads_a_text_file_with_packs_one_per_line_and_separator(tmp_path, tok_dir, monkeypatch, capsys):
    """A corpus of one sentence a line (corpus.en) is packed with --one-per-line, each line a document ended by the
    end token; eval ppl took no --one-per-line (nor pack's --separator) and scored the file as one document, its
    newlines as text. Both flags now read the text as pack does: the same ids as the store, by hand each document's
    ids and then the end token; they are refused where --data is no plain text, and together."""
    from cookmind.cli import main
    from cookmind.evals import evaluate_data
    from cookmind.store import TokenStore
    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    eot = tok.special_tokens["<|endoftext|>"]
    table = _bigram_cli(monkeypatch, tok)
    lines = (
        tmp_path / "lines.txt",
        "The cook said stir it.\r\n  \n Tom has 3 apples.\nHe eats one.\n",
        {"one_per_line": True},
    )
    seps = (
        tmp_path / "seps.txt",
        "The cook said stir it.\n---\nTom has 3 apples.---\n---He eats one.",
        {"separator": "---"},
    )
    docs = ["The cook said stir it.", " Tom has 3 apples.", "He eats one."]  # pack keeps a line's other whitespace
    for path, text, how in (lines, seps):
        path.write_bytes(text.encode())
        pack([path], tmp_path / f"{path.stem}.store", tok_dir, "seq", progress=False, **how)
        store = TokenStore(tmp_path / f"{path.stem}.store")
        ids = store.stream("sequence", 0, store.stream_length("sequence")).tolist()
        wanted = docs if "one_per_line" in how else [d.strip() for d in docs]
        by_hand = [i for d in wanted for i in [*tok.encode(d), eot]]
        assert ids == by_hand, path.name
        flags = ["--one-per-line"] if "one_per_line" in how else ["--separator", "---"]
        assert main(["eval", "ppl", "--model", "m", "--data", str(path), "--quiet", *flags]) == 0, path.name
        out = capsys.readouterr()
        scored = json.loads(out.out)
        logp = torch.log_softmax(table[by_hand[:-1]], -1)
        nll = -logp[torch.arange(len(by_hand) - 1), by_hand[1:]].sum().item()
        assert scored["tokens"] == len(by_hand) - 1, path.name
        assert scored["nll_per_token"] == pytest.approx(nll / (len(by_hand) - 1), rel=1e-5), path.name
        assert scored["empty_documents"] == 1 and "left out 1 empty document(s)" in out.err, path.name
        packed = evaluate_data(
            torch.nn.Embedding.from_pretrained(table),
            tok,
            tmp_path / f"{path.stem}.store",
            window=64,
            progress=False,
        )
        assert scored["bytes"] == packed["bytes"], path.name
    (tmp_path / "d.jsonl").write_text('{"text": "hello"}\n')
    for data, flags in (
        (tmp_path / "d.jsonl", ["--one-per-line"]),
        (tmp_path / "lines.store", ["--separator", "---"]),
        (lines[0], ["--one-per-line", "--separator", "---"]),
    ):
        assert main(["eval", "ppl", "--model", "m", "--data", str(data), "--quiet", *flags]) == 2, flags
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("cookmind eval ppl: error: --") and "drop" in err[0], err


def test_ppl_on_chat_records_says_to_name_a_text_field_not_to_pack_them_as_sft(tmp_path, tok_dir, monkeypatch, capsys):
    """`eval ppl --data gsm8k/test.jsonl` said "it looks like sft data, which `cookmind pack --train-type sft` reads
    ... or pass --skip-bad": pack's advice, a dead end here (ppl refuses an sft store; --skip-bad skips every record).
    It now says that ppl scores a field of text and names --text-field; with it, that field's text is scored."""
    from cookmind.cli import main
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    table = _bigram_cli(monkeypatch, tok)
    data = tmp_path / "g.jsonl"
    rows = [{"question": "Tom has 3 apples.", "answer": "He eats one.\n#### 2"}, {"question": "Q?", "answer": "#### 4"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "ppl", "--model", "m", "--data", str(data), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cookmind eval ppl: error: {data}:1: "), err
    assert "--text-field" in err[0] and "pack --train-type sft" not in err[0] and "--skip-bad" not in err[0], err
    assert main(["eval", "ppl", "--model", "m", "--data", str(data), "--text-field", "answer", "--quiet"]) == 0
    eot = tok.special_tokens["<|endoftext|>"]
    ids = [i for r in rows for i in [*tok.encode(r["answer"]), eot]]  # by hand: each answer, then the end token
    logp = torch.log_softmax(table[ids[:-1]], -1)
    nll = -logp[torch.arange(len(ids) - 1), ids[1:]].sum().item()
    scored = json.loads(capsys.readouterr().out)
    assert scored["tokens"] == len(ids) - 1 and scored["nll_per_token"] == pytest.approx(nll / (len(ids) - 1), rel=1e-5)


def test_ppl_counts_the_empty_documents_of_a_text_file_that_pack_counts(tmp_path, tok_dir, monkeypatch, capsys):
    """A text file opening with <|endoftext|> made eval ppl say "left out 1 empty document(s) ... as pack leaves them
    out", where pack's meta.json said empty_records 0: blank text before the first separator is no document to pack
    (nor after the last). The count is now pack's: by hand, the blank pieces between two separators (and blank lines
    under --one-per-line, each a document)."""
    from cookmind.cli import main
    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer

    _bigram_cli(monkeypatch, Tokenizer.load(tok_dir))
    for k, (text, how, by_hand) in enumerate(
        (
            ("<|endoftext|>hello there<|endoftext|>", {}, 0),
            (" \n<|endoftext|>hello<|endoftext|> <|endoftext|>there\n<|endoftext|>\n", {}, 1),
            ("\nhello\n \nthere\n\n", {"one_per_line": True}, 3),
        )
    ):
        path = tmp_path / f"t{k}.txt"
        path.write_text(text)
        pack([path], tmp_path / f"s{k}", tok_dir, "seq", progress=False, **how)
        assert json.loads((tmp_path / f"s{k}" / "meta.json").read_text())["empty_records"] == by_hand, text
        flags = ["--one-per-line"] if how else []
        assert main(["eval", "ppl", "--model", "m", "--data", str(path), "--quiet", *flags]) == 0
        assert json.loads(capsys.readouterr().out)["empty_documents"] == by_hand, text


def test_ppl_on_text_strips_each_document_as_pack_does(shared_data, tmp_path, tok_dir):
    """eval ppl on tinystories_sample.txt scored 10 tokens more than the store pack made of it holds: the newlines
    around each <|endoftext|>, which pack strips off each document, were scored as text. Each document of a text file
    is now stripped as pack strips it, so the text and its store score the same ids over the same bytes."""
    from cookmind.evals import evaluate_data
    from cookmind.store import TokenStore
    from cookmind.store.packer import pack
    from cookmind.tokenizer import Tokenizer

    src = shared_data / "text" / "tinystories_sample.txt"
    assert "\n<|endoftext|>\n" in src.read_text()
    tok = Tokenizer.load(tok_dir)
    pack([src], tmp_path / "s", tok_dir, "seq", progress=False)
    length = TokenStore(tmp_path / "s").stream_length("sequence")
    torch.manual_seed(0)
    model = torch.nn.Embedding(tok.vocab_size, tok.vocab_size)  # a bigram table
    text, packed = (evaluate_data(model, tok, data, window=length, progress=False) for data in (src, tmp_path / "s"))
    assert (text["tokens"], text["bytes"]) == (packed["tokens"], packed["bytes"]) and text["tokens"] == length - 1
    assert text["nll_per_token"] == pytest.approx(packed["nll_per_token"], rel=1e-6)


def test_eval_mmlu_takes_limit_as_gsm8k_does_meaning_each_subjects_first_n():
    """A user who learned `eval gsm8k --limit N` types it for mmlu too: there it is --limit-per-subject (as
    lm-evaluation-harness's --limit counts per task, a subject each), not an unknown option."""
    import argparse

    from cookmind.evals.cli import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for flag in ("--limit", "--limit-per-subject"):
        args = parser.parse_args(["mmlu", "--model", "m", "--data", "d", flag, "3"])
        assert args.limit_per_subject == 3
    assert parser.parse_args(["gsm8k", "--model", "m", "--data", "d", "--limit", "3"]).limit == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["mmlu", "--model", "m", "--data", "d", "--limit", "0"])


def test_an_mmlu_error_names_the_file_line_a_record_starts_on(tmp_path):
    # it counted CSV records: after a question quoted over three lines, the bad record on line 4 was "line 2"
    (tmp_path / "dev").mkdir()
    csv_file = tmp_path / "dev" / "law_dev.csv"
    csv_file.write_text('"A question\nover three\nlines?",a,b,c,d,A\nWhich?,a,b,c,d,E\n')
    with pytest.raises(ValueError, match=r"law_dev\.csv:4: expected question,A,B,C,D,answer .* got answer 'E'"):
        load_mmlu(tmp_path, "dev")
    csv_file.write_text("Which?,a,b,c,d,B\n" + "W" * 200_000 + ",a,b,c,d,A\n")  # past csv's field size limit
    with pytest.raises(ValueError, match=r"law_dev\.csv:2: not a CSV record \(field larger than field limit"):
        load_mmlu(tmp_path, "dev")


def test_invalid_utf8_in_eval_data_names_the_file_and_line(tmp_path):
    # a bare UnicodeDecodeError ("can't decode byte 0xe9 in position 55"), with no file or line
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "law_dev.csv").write_bytes("Which?,a,b,c,d,B\nCaf\u00e9?,a,b,c,d,A\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"law_dev\.csv:2: invalid UTF-8 at byte 3 of the line"):
        load_mmlu(tmp_path, "dev")
    g = tmp_path / "g.jsonl"
    g.write_bytes(b'{"question": "1+1?", "answer": "#### 2"}\n\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    with pytest.raises(ValueError, match=r"g\.jsonl:3: invalid UTF-8 at byte 17 of the line"):
        load_gsm8k(g)


def test_a_plain_template_answer_ends_where_the_model_makes_up_the_next_question(tmp_path):
    """A base model asked "Question: ...\\nAnswer:" answers, then writes a question of its own: generation went on
    to --max-new-tokens and the made-up question's last number was graded (0 for a right answer). It stops at
    "\\nQuestion:" now, as lm-eval-harness stops GSM8K; a custom template at its own question marker."""
    problems = [{"question": "Tom has 1 apple and buys 2 more. How many?", "answer": "#### 3"}]

    def respond(prompt):
        return " 3\nQuestion: Ann has 7 pens and loses 3. How many?\nAnswer: 4"

    oracle = OracleLM(respond, marker="Answer:")
    m = evaluate_gsm8k(oracle, CharTok(), problems, template="plain", max_new_tokens=80, progress=False)
    assert m["accuracy"] == 1.0
    from cookmind.align.prompts import next_question_stops

    assert next_question_stops("plain") == ("\nQuestion:",) and next_question_stops("Q: {question}\nA:") == ("\nQ:",)
    assert next_question_stops("r1_zero") == next_question_stops("chat") == next_question_stops("{question}") == ()


def test_a_bad_prompt_template_names_every_template_there_is():
    """The error listed ['compact', 'plain', 'r1_zero'] and left out 'chat', which --help, the GUIDE and the
    README's eval example use."""
    from cookmind.align.prompts import PROMPTS, format_prompt

    with pytest.raises(ValueError) as caught:
        format_prompt("1+1?", "Q: no placeholder")
    assert all(repr(name) in str(caught.value) for name in ["chat", *PROMPTS]), str(caught.value)


def _custom_code_folder(folder, where):
    """A tiny Hugging Face folder whose config.json (``where="model"``) or tokenizer_config.json (``"tokenizer"``)
    names classes in Python files of the folder (auto_map), as a model that needs trust_remote_code does."""
    tiny_hf_tokenizer(folder)
    tiny_hf_model(folder)
    if where == "model":
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(
            model_type="tinycustom",
            architectures=["TinyCustomForCausalLM"],
            auto_map={"AutoConfig": "configuration_tiny.TinyConfig", "AutoModelForCausalLM": "modeling_tiny.TinyLM"},
        )
        (folder / "config.json").write_text(json.dumps(cfg))
    else:
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        code = {"AutoTokenizer": [None, "tokenization_tiny.TinyTokenizer"]}
        cfg.update(tokenizer_class="TinyTokenizer", auto_map=code)
        (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    for name in ("configuration_tiny.py", "modeling_tiny.py", "tokenization_tiny.py"):
        (folder / name).write_text("raise SystemExit('this code must never run')\n")


@pytest.mark.parametrize("where", ["model", "tokenizer"])
def test_eval_of_a_folder_that_needs_its_own_code_refuses_in_one_line_without_asking(
    tmp_path, monkeypatch, capsys, where
):
    from cookmind.cli import main

    _custom_code_folder(tmp_path / "hf", where)
    asked = []  # transformers asked "Do you wish to run the custom code? [y/N]" on a terminal; 'y' ran the code
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "n")
    text = tmp_path / "t.txt"
    text.write_text("hello world")
    capsys.readouterr()  # the fixtures' progress bars
    rc = main(["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--window", "8", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and asked == []
    line = err.splitlines()[-1]  # the whole error (transformers' was three lines, and asked to pass an argument)
    assert line.startswith("cookmind eval ppl: error: ") and str(tmp_path / "hf") in line and "code" in line, err


def test_eval_of_a_hugging_face_folder_without_a_tokenizer_asks_for_one_in_one_line(tmp_path, capsys):
    from cookmind.cli import main

    tiny_hf_model(tmp_path / "hf")  # the weights and config.json alone
    text = tmp_path / "t.txt"
    text.write_text("hello world")
    capsys.readouterr()  # the fixtures' progress bars
    rc = main(["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--window", "8", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err  # before the model loads: transformers' error took 6 lines
    assert err.startswith("cookmind eval ppl: error: ") and str(tmp_path / "hf") in err and "--tokenizer" in err
    tiny_hf_tokenizer(tmp_path / "tok")  # the way out it names works
    given = ["--model", str(tmp_path / "hf"), "--tokenizer", str(tmp_path / "tok"), "--data", str(text)]
    rc = main(["eval", "ppl", *given, "--window", "8", "--quiet"])
    assert rc == 0


def test_generate_on_a_folder_whose_tokenizer_names_its_own_code_never_asks_to_run_it(tmp_path, monkeypatch, capsys):
    from cookmind.cli import main

    _custom_code_folder(tmp_path / "hf", "tokenizer")  # cookmind reads its tokenizer.json; transformers is asked too
    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "n")
    main(["generate", "--model", str(tmp_path / "hf"), "--prompt", "hi", "--max-new-tokens", "2", "--device", "cpu"])
    assert asked == []


def test_eval_quiet_shows_no_progress_bar_for_a_hugging_face_folder_either(tmp_path, capsys):
    from cookmind.cli import main

    tiny_hf_tokenizer(tmp_path / "hf")
    tiny_hf_model(tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello tiny model")
    capsys.readouterr()  # the fixtures' own bars
    rc = main(["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--window", "8", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0 and "it/s" not in err and "\r" not in err, err  # transformers' "Loading weights" bar was there


def test_gsm8k_chat_template_without_a_chat_template_names_the_templates_that_work(shared_data, tmp_path, capsys):
    from cookmind.cli import main

    tiny_hf_tokenizer(tmp_path / "hf")  # a base model's tokenizer: no chat_template
    tiny_hf_model(tmp_path / "hf")
    capsys.readouterr()
    data = str(shared_data / "gsm8k" / "test.jsonl")
    rc = main(["eval", "gsm8k", str(tmp_path / "hf"), "--data", data, "--limit", "1", "--template", "chat", "--quiet"])
    err = capsys.readouterr().err.strip()
    # was transformers' "Cannot use chat template functions because tokenizer.chat_template is not set and no
    # template argument was passed! For information about writing templates ... see the documentation at ..."
    assert rc == 2 and len(err.splitlines()) == 1 and "no chat template" in err, err
    assert all(name in err for name in ("r1_zero", "compact", "plain")), err


def test_ppl_skip_bad_leaves_bad_records_out_and_counts_them_as_pack_does(tmp_path, tok_dir, monkeypatch, capsys):
    """`eval ppl` had no --skip-bad (pack and tokenizer train have it): a bad record always stopped it, with no
    way on. Without it the first bad record is an error naming file:line and the flag; with it the bad records are
    left out, counted by reason in the metrics' "skipped" (as pack's meta.json) and said in one line."""
    from cookmind.cli import main
    from cookmind.tokenizer import Tokenizer

    tok = Tokenizer.load(tok_dir)
    table = _bigram_cli(monkeypatch, tok)
    docs = ["The cook stirs.", "Tom has 3 apples."]
    bad = ['{"text": "cut off', json.dumps({"body": "x"})]  # invalid JSON, no text field
    lines = [json.dumps({"text": docs[0]}), *bad, json.dumps({"text": docs[1]})]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(line + "\n" for line in lines))
    argv = ["eval", "ppl", "--model", "m", "--data", str(data), "--window", "64", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cookmind eval ppl: error: {data}:2: invalid JSON") and err.count("\n") == 1, err
    assert err.rstrip().endswith("; fix the record, or pass --skip-bad to skip bad records and count them")

    assert main([*argv, "--skip-bad"]) == 0
    out, err = capsys.readouterr()
    m = json.loads(out.strip().splitlines()[-1])
    eot = tok.special_tokens["<|endoftext|>"]
    ids = [i for d in docs for i in tok.encode(d) + [eot]]  # the two good documents, as pack joins them
    log_p = torch.log_softmax(table, -1)
    nll = -sum(log_p[a, b].item() for a, b in zip(ids[:-1], ids[1:]))
    assert (m["documents"], m["tokens"]) == (2, len(ids) - 1)
    assert m["nll_per_token"] == pytest.approx(nll / (len(ids) - 1), rel=1e-5)
    assert m["skipped"]["count"] == 2
    assert m["skipped"]["by_reason"] == {"invalid JSON": 1, "missing field": 1}
    assert [e.split(": ")[0] for e in m["skipped"]["examples"]] == [f"{data}:2", f"{data}:3"]
    assert f"cookmind eval ppl: skipped 2 bad record(s) (invalid JSON 1, missing field 1); the first: {data}:2: " in err

    # every record bad: said as such; --skip-bad on a store or plain text (nothing it could skip) is refused
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n')
    assert main(["eval", "ppl", "--model", "m", "--data", str(tmp_path / "bad.jsonl"), "--skip-bad", "--quiet"]) == 2
    assert "holds no document to score: every record was bad; skipped 1 bad record(s)" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text(docs[0])
    assert main(["eval", "ppl", "--model", "m", "--data", str(tmp_path / "t.txt"), "--skip-bad", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--skip-bad skips bad JSON or Parquet records, and --data" in err and "plain text" in err


def test_ppl_reports_the_window_it_scored_with(tmp_path, capsys):
    """Train's validation reads windows of data.window_size, eval ppl (without --window) windows of the model's whole
    context: a model trained on 128-token windows of a 512-token context read val_ppl 2.14 in train and 3.50 in eval
    ppl, and neither report said which window it used. The metrics now name it (window_size, and the stride)."""
    from cookmind.cli import main

    tiny_hf_tokenizer(tmp_path / "hf")
    tiny_hf_model(tmp_path / "hf")  # max_position_embeddings=1024
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello tiny model. " * 10)
    argv = ["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--quiet"]
    assert main(argv) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert (metrics["window_size"], metrics["stride"]) == (1024, 1024)  # the context, windows side by side
    assert main([*argv, "--window", "8", "--stride", "4"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert (metrics["window_size"], metrics["stride"]) == (8, 4)


def test_gsm8k_reads_the_problem_files_grpo_reads(tmp_path):
    # a GRPO prompt file ({"prompt", "ground_truth"}, as pack and grpo.eval_problems read it) was refused by `eval
    # gsm8k`: "a GSM8K record needs 'question' and 'answer' fields, got ['ground_truth', 'prompt']"
    path = tmp_path / "rl.jsonl"
    path.write_text('{"prompt": "1+1?", "ground_truth": "2"}\n{"question": "2+2?", "reference_answer": 4}\n')
    assert [(p["question"], p["answer"]) for p in load_gsm8k(path)] == [("1+1?", "2"), ("2+2?", "4")]
    path.write_text('{"prompt": "1+1?", "chosen": "2", "rejected": "3"}\n')
    with pytest.raises(ValueError) as err:
        load_gsm8k(path)
    assert str(err.value) == (
        f"{path}:1: a GSM8K record needs a question ('question' or 'prompt') and its answer ('answer', "
        "'reference_answer' or 'ground_truth'), got ['chosen', 'prompt', 'rejected']; fix the record or pass "
        "another --data"
    )


def test_a_reference_answer_of_several_numbers_without_a_final_line_is_refused_everywhere_it_is_read(tmp_path, tok_dir):
    """A problem whose answer is a worked solution without GSM8K's '#### N' line was graded against its first number
    (to_number of '48/2 = 24 clips in May ... 72 clips' is 24): every right answer scored wrong, without a word. Eval
    gsm8k, grpo.problems and pack --train-type grpo read such a record as a bad one naming its line; '#### N', a bare
    value and words ('yes') still read."""
    from cookmind.align.objective import load_problems
    from cookmind.align.rewards import grade_gsm8k
    from cookmind.store.packer import PackError, pack

    worked = "She sold 48/2 = 24 clips in May, so 48+24 = 72 clips in all."
    assert not grade_gsm8k("The answer is 72.", worked)  # what happened: the first number was the reference
    good = [
        {"question": "How many clips?", "answer": f"{worked}\n#### 72"},
        {"question": "How many?", "answer": "72"},
        {"question": "Is it even?", "answer": "yes"},
        {"question": "Half of 3?", "answer": "\\frac{3}{2}"},
    ]
    src = tmp_path / "p.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in [*good, {"question": "How many clips?", "answer": worked}]))
    said = f"{src}:5: 'answer' holds 5 numbers and no '#### N' line"
    with pytest.raises(ValueError, match=said):
        load_gsm8k(src)
    with pytest.raises(ValueError, match=said):
        load_problems(src)
    with pytest.raises(PackError, match=said):
        pack([src], tmp_path / "g", tok_dir, "grpo", progress=False)
    (tmp_path / "ok.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    assert [p["answer"] for p in load_gsm8k(tmp_path / "ok.jsonl")] == [r["answer"] for r in good]
    assert len(load_problems(tmp_path / "ok.jsonl")) == 4


def test_the_eval_bars_write_plain_lines_into_a_pipe(tmp_path, capsys):
    """eval ppl drew its tqdm bar into a pipe or a log as on a terminal: carriage returns and the bar redrawn. It
    writes plain lines there now (cookmind.progress), the last one the windows it ran."""
    from cookmind.cli import main

    tiny_hf_tokenizer(tmp_path / "hf")
    tiny_hf_model(tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello tiny model. " * 10)
    capsys.readouterr()
    assert main(["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--window", "8"]) == 0
    err = capsys.readouterr().err  # transformers' "Loading weights" bar too: on a terminal only
    assert "\r" not in err and "\x1b" not in err, err
    assert any(line.startswith("perplexity: 100%") for line in err.splitlines()), err


def test_gsm8k_says_when_no_answer_was_in_the_templates_format(tmp_path, monkeypatch, capsys):
    """A chat model (the demo's SFT run) scored with the default --template r1_zero answers `#### N`, never in
    <answer> tags: every answer graded 0, "format_rate": 0.0, and not a word on stderr; a user read 0% as the
    model's skill. A run where no answer was in the template's format now says so, naming format_rate and the
    templates; one where some were stays quiet."""
    import cookmind.infer.loading
    from cookmind.cli import main

    respond = {"text": " 2 + 2 = 4\n#### 4"}  # a chat model's answer, after the r1_zero prompt's <think>
    model = OracleLM(lambda prompt: respond["text"])
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    data = tmp_path / "g.jsonl"
    data.write_text('{"question": "What is 2+2?", "answer": "#### 4"}\n' * 2)
    argv = ["eval", "gsm8k", "m", "--data", str(data), "--quiet", "--max-new-tokens", "40"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["format_rate"] == 0.0
    assert "none of the 2 answers was in --template r1_zero's format (format_rate 0)" in captured.err, captured.err
    assert "--template chat" in captured.err
    respond["text"] = " 2 + 2 = 4 </think> <answer> 4 </answer>"
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["format_rate"] == 1.0 and "format_rate" not in captured.err, captured.err


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["gsm8k", "m", "--data", "d.jsonl", "--k"], "--k"),
        (["mmlu", "m", "--data", "mmlu", "--subjects"], "--subjects"),
    ],
)
def test_a_list_option_given_no_values_is_a_usage_error(argv, flag, capsys):
    """`eval gsm8k --k` (the values forgotten) reported no pass@ at all, saying nothing; `eval mmlu --subjects` alone
    asked for no subject. Each is a usage error naming the option."""
    from cookmind.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}: expected at least one argument" in err, err


def test_every_evals_metrics_name_its_data_as_data_and_record_the_settings_its_score_depends_on(
    tmp_path, monkeypatch, capsys
):
    """gsm8k's and mmlu's metrics named the evaluated file "data", ppl's "path" (and none of its --max-bytes, --text-
    field, --skip-bad); mmlu --scoring generate recorded neither the answer length cap (16 tokens) nor that it is
    greedy, which gsm8k's records (max_new_tokens, temperature). Every eval now names its data "data" (as given) and
    records the settings its score depends on."""
    import cookmind.infer.loading
    from cookmind.cli import main

    tiny_hf_tokenizer(tmp_path / "hf")
    tiny_hf_model(tmp_path / "hf")
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello tiny model. " * 10)
    out = tmp_path / "p.jsonl"
    argv = ["eval", "ppl", "--model", str(tmp_path / "hf"), "--data", str(text), "--window", "8", "--quiet"]
    assert main([*argv, "--max-bytes", "100", "--out", str(out)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert json.loads(out.with_suffix(".metrics.json").read_text()) == metrics
    assert "path" not in metrics and (metrics["task"], metrics["data"]) == ("ppl", str(text))
    assert (metrics["window_size"], metrics["stride"], metrics["max_bytes"]) == (8, 8, 100)

    model = OracleLM(lambda prompt: " B")
    model.marker = "Answer:"
    monkeypatch.setattr(cookmind.infer.loading, "load_for_inference", lambda *a, **k: (model, CharTok()))
    root = tmp_path / "mmlu"
    (root / "val").mkdir(parents=True)
    (root / "val" / "law_val.csv").write_text("".join(f"Q{i}?,a,b,c,d,{'AB'[i % 2]}\n" for i in range(2)))
    argv = ["eval", "mmlu", "m", "--data", str(root), "--split", "val", "--quiet"]
    assert main([*argv, "--scoring", "generate"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert (metrics["data"], metrics["scoring"], metrics["max_new_tokens"], metrics["temperature"]) == (
        str(root),
        "generate",
        16,
        0.0,
    )


def test_evaluate_gsm8ks_own_metrics_name_the_settings_its_answers_were_generated_under():
    """Only `cookmind eval gsm8k` added template, temperature, max_new_tokens, seed and batch_size to the metrics: a
    library caller's result did not say how its answers were generated. evaluate_gsm8k's result holds them now."""
    problems = [{"question": "1 + 1?", "answer": "#### 2"}]
    said = " </think> <answer> 2 </answer>"
    metrics = evaluate_gsm8k(
        OracleLM(lambda p: said),
        CharTok(),
        problems,
        template="plain",
        max_new_tokens=40,
        seed=3,
        batch_size=5,
        progress=False,
    )
    assert metrics["accuracy"] == 1.0
    settings = {k: metrics.get(k) for k in ("template", "temperature", "max_new_tokens", "seed", "batch_size")}
    assert settings == {"template": "plain", "temperature": 0.0, "max_new_tokens": 40, "seed": 3, "batch_size": 5}
