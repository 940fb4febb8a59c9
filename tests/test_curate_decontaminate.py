"""Decontamination against a naive reference: word-tuple n-gram sets, on synthetic and real eval sets."""

from __future__ import annotations

import csv
import json
import re

import pytest

from cookmind.curate.decontaminate import ngram_hashes
from cookmind.curate.stages import build_stage
from cookmind.curate.stats import StageStats

QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
ANSWER = "Natalia sold 48/2 = <<48/2=24>>24 clips in May. Natalia sold 48+24 = <<48+24=72>>72 clips. #### 72"
PROSE = (
    "The cook put the pot on the stove and waited for the water to boil. She had spent the morning "
    "at the market with her brother, and they came home with onions, carrots and a bag of fresh herbs."
)


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.lower())


def _grams(text: str, n: int) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i : i + n]) for i in range(len(w) - n + 1)}


def _naive_contaminated(docs: list[str], items: list[str], n: int, min_matches: int = 1) -> list[bool]:
    """Reference: a document is contaminated when it shares >= min_matches distinct word n-grams with the items."""
    doc_grams = [_grams(d, n) for d in docs]
    shared: list[set] = [set() for _ in docs]
    for item in items:
        g = _grams(item, n)
        for k, dg in enumerate(doc_grams):
            shared[k] |= dg & g
    return [len(s) >= min_matches for s in shared]


def _write_gsm8k(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_ngram_hashes_agree_with_word_tuples():
    a = PROSE + " " + QUESTION
    b = QUESTION.upper().replace(",", " ;") + " and then some more words " + PROSE[:80]
    for n in (1, 3, 13):
        ha, hb = ngram_hashes(a, n), ngram_hashes(b, n)
        assert len(ha) == len(_words(a)) - n + 1
        assert len(set(ha.tolist())) == len(_grams(a, n))  # distinct n-grams, distinct hashes
        assert len(set(ha.tolist()) & set(hb.tolist())) == len(_grams(a, n) & _grams(b, n))
    assert len(ngram_hashes("too short", 13)) == 0


def test_stage_removes_exactly_the_docs_that_share_a_13_gram(tmp_path):
    evals = _write_gsm8k(
        tmp_path / "test.jsonl",
        [{"question": QUESTION, "answer": ANSWER}, {"question": "What is 2 + 2?", "answer": "#### 4"}],
    )
    q = _words(QUESTION)
    docs = [
        PROSE,  # clean
        PROSE + "\n\nHomework help: " + QUESTION.upper().replace(",", ""),  # case and punctuation changed
        "Q: " + " ".join(q[:12]) + ". Something else entirely, " + PROSE,  # only 12 words shared: kept
        "answer key: " + ANSWER,  # the answer alone
        " ".join(q[-13:]),  # exactly the last 13 words
    ]
    stage = build_stage("decontaminate", {"eval_sets": {"gsm8k": str(evals)}, "ngram": 13})
    stats = StageStats("decontaminate")
    flags = [stage.process({"text": d}, stats) for d in docs]
    expected = _naive_contaminated(docs, [QUESTION + " " + ANSWER, "What is 2 + 2? #### 4"], 13)
    assert [not f for f in flags] == expected == [False, True, False, True, True]
    assert stats.reasons == {"eval:gsm8k": 3} and stats.counters == {"docs_matching:gsm8k": 3}
    assert stage.sets[0].items == 2 and stage.sets[0].short == 1  # "What is 2 + 2?" cannot match


def test_min_matches_ngram_and_several_sets(tmp_path):
    evals = _write_gsm8k(tmp_path / "a.jsonl", [{"question": QUESTION, "answer": ANSWER}])
    with open(tmp_path / "b.csv", "w", newline="") as f:
        csv.writer(f).writerow([PROSE[:90], "first choice", "second", "third", "fourth", "B"])
    docs = [" ".join(_words(QUESTION)[:8]), QUESTION, PROSE[:90] + " " + QUESTION]
    for n, m in ((8, 1), (8, 3), (13, 1)):
        stage = build_stage(
            "decontaminate", {"eval_sets": [str(evals), str(tmp_path / "b.csv")], "ngram": n, "min_matches": m}
        )
        assert [es.name for es in stage.sets] == [f"{tmp_path.name}/a", f"{tmp_path.name}/b"]
        stats = StageStats("decontaminate")
        got = [not stage.process({"text": d}, stats) for d in docs]
        ref_a = _naive_contaminated(docs, [QUESTION + " " + ANSWER], n, m)
        ref_b = _naive_contaminated(docs, [PROSE[:90] + " first choice second third fourth B"], n, m)
        assert got == [x or y for x, y in zip(ref_a, ref_b)], (n, m)
        assert stats.counters[f"docs_matching:{tmp_path.name}/b"] == sum(ref_b)
    assert got == [False, True, True]


@pytest.mark.parametrize(
    "options, match",
    [
        ({}, "names no eval sets"),
        ({"eval_sets": {"x": "/nonexistent/test.jsonl"}}, "eval set x: .*does not exist"),
        ({"eval_sets": ["/tmp"], "ngram": 0}, "ngram must be a whole number, 1 or more; got 0"),
    ],
)
def test_bad_options_are_clear_errors(options, match):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
        build_stage("decontaminate", options)


def test_pipeline_reports_removals_per_eval_set(tmp_path):
    import yaml

    from cookmind.curate.config import CurateConfig
    from cookmind.curate.runner import read_outputs, run_pipeline

    evals = _write_gsm8k(tmp_path / "test.jsonl", [{"question": QUESTION, "answer": ANSWER}])
    inp = tmp_path / "in.jsonl"
    docs = [{"id": str(i), "text": t} for i, t in enumerate([PROSE, "Copied: " + QUESTION, PROSE + " more"])]
    inp.write_text("".join(json.dumps(d) + "\n" for d in docs))
    cfg_path = tmp_path / "curate.yaml"
    (tmp_path / "none.csv").write_text("a question that no document of this corpus shares with it at all,A,B,C,D,A\n")
    eval_sets = {"gsm8k": str(evals), "none": str(tmp_path / "none.csv")}
    cfg_path.write_text(
        yaml.safe_dump({"stages": [{"decontaminate": {"eval_sets": eval_sets}}], "output_format": "jsonl"})
    )
    result = run_pipeline(CurateConfig.from_yaml(cfg_path), [str(inp)], tmp_path / "out", progress=False)
    assert [d["id"] for d in read_outputs(result.outputs)] == ["0", "2"]
    report = json.loads(result.report_json.read_text())
    assert report["stages"][0]["reasons"] == {"eval:gsm8k": 1, "eval:none": 0}
    assert "eval:gsm8k: 1, eval:none: 0" in result.report_md.read_text()


def test_real_gsm8k_and_mmlu_test_sets(shared_data):
    gsm_test = [json.loads(x) for x in (shared_data / "gsm8k" / "test.jsonl").read_text().splitlines() if x.strip()]
    gsm_train = [json.loads(x) for x in (shared_data / "gsm8k" / "train.jsonl").read_text().splitlines()[:40]]
    mmlu_rows = []
    for f in sorted((shared_data / "mmlu" / "test").glob("*.csv")):
        with open(f, newline="", encoding="utf-8") as fh:
            mmlu_rows += list(csv.reader(fh))
    row = next(r for r in mmlu_rows[100:] if len(_words(r[0])) >= 20)  # a question long enough to match alone
    docs = [
        PROSE,
        "Worked example. " + gsm_test[5]["question"].lower() + "\n\nSolution: " + gsm_test[5]["answer"],
        "<p>" + gsm_test[700]["question"].replace(" ", "  ") + "</p>",
        f"Quiz time! {row[0]}\nA) {row[1]}\nB) {row[2]}\nC) {row[3]}\nD) {row[4]}\nAnswer: {row[5]}",
    ]
    docs += [r["question"] + " " + r["answer"] for r in gsm_train]
    stage = build_stage(
        "decontaminate",
        {"eval_sets": {"gsm8k": str(shared_data / "gsm8k" / "test.jsonl"), "mmlu": str(shared_data / "mmlu" / "test")}},
    )
    assert stage.sets[0].items == len(gsm_test) == 1319 and stage.sets[1].items == len(mmlu_rows)
    stats = StageStats("decontaminate")
    got = [not stage.process({"text": d}, stats) for d in docs]
    ref_gsm = _naive_contaminated(docs, [r["question"] + " " + r["answer"] for r in gsm_test], 13)
    ref_mmlu = _naive_contaminated(docs, [" ".join(r) for r in mmlu_rows], 13)
    assert got == [x or y for x, y in zip(ref_gsm, ref_mmlu)]
    assert got[:4] == [False, True, True, True] and ref_mmlu[3]
    assert stats.counters["docs_matching:gsm8k"] == sum(ref_gsm)
    assert stats.counters["docs_matching:mmlu"] == sum(ref_mmlu)


def test_default_config_shows_a_working_decontaminate_entry(tmp_path, capsys):
    import argparse

    import yaml

    from cookmind.curate.cli import main
    from cookmind.curate.config import CurateConfig

    assert main(argparse.Namespace(curate_command="default-config")) == 0
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out)
    block = out[out.index("# - decontaminate:") :].split("\n# - ", 2)[0]  # the commented example, uncommented
    entry = yaml.safe_load("\n".join(line[2:] for line in block.splitlines()))[0]
    assert entry["decontaminate"]["ngram"] == 13 and set(entry["decontaminate"]["eval_sets"]) == {"gsm8k", "mmlu"}
    _write_gsm8k(tmp_path / "test.jsonl", [{"question": QUESTION, "answer": ANSWER}])
    (tmp_path / "mmlu").mkdir()
    (tmp_path / "mmlu" / "x_test.csv").write_text(f'"{PROSE}",a,b,c,d,A\n')
    entry["decontaminate"]["eval_sets"] = {"gsm8k": str(tmp_path / "test.jsonl"), "mmlu": str(tmp_path / "mmlu")}
    cfg["stages"].append(entry)
    built = CurateConfig.from_dict(cfg)
    assert build_stage(*built.stage_list()[-1]).sets[1].items == 1


def test_a_text_eval_file_with_bytes_that_are_not_utf8_is_counted_warned_of_and_noted_in_the_report(tmp_path):
    """A Latin-1 .txt eval set was read with U+FFFD for its bad bytes without a word (its words then never match):
    a warning names the first file:line with the count, and the run's report notes it."""
    from cookmind.curate.config import CurateConfig
    from cookmind.curate.runner import run_pipeline

    ev = tmp_path / "ev.txt"
    ev.write_bytes(QUESTION.encode() + b"\n\n" + b"l'\xe9t\xe9 \xe0 Paris, a second question of some words\n")
    stages = [{"decontaminate": {"eval_sets": {"ev": str(ev)}, "ngram": 13}}]
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"text": PROSE}) + "\n" + json.dumps({"text": "Copied: " + QUESTION}) + "\n")
    shape = r"ev\.txt:3: invalid UTF-8, read as U\+FFFD \(1 eval file\(s\) held such bytes: 3 bytes on 1 lines\)"
    with pytest.warns(UserWarning, match=shape):
        result = run_pipeline(CurateConfig(stages=stages), [str(inp)], tmp_path / "out", progress=False)
    report = json.loads(result.report_json.read_text())
    assert report["stages"][0]["reasons"] == {"eval:ev": 1}
    assert [n for n in report["notes"] if re.search(shape, n)], report["notes"]
    assert "ev.txt:3: invalid UTF-8" in result.report_md.read_text()


def test_an_eval_set_is_read_by_every_records_suffix_curate_and_pack_read(tmp_path):
    """An eval set saved as JSON lines in a `.json` file failed ("not valid JSON"); one in `.json.gz`, `.ndjson` or
    `.pq` (Parquet) was read as lines of text: its gzip or Parquet bytes, or its JSON syntax, made the n-grams, and a
    document copying a test question was kept without a word. Each is read as records now."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    lines = "".join(json.dumps(r) + "\n" for r in [{"question": QUESTION, "answer": ANSWER}, {"question": "Q2?"}])
    sets = tmp_path / "sets"
    sets.mkdir()
    (sets / "lines.json").write_text(lines)
    (sets / "test.json.gz").write_bytes(gzip.compress(lines.encode()))
    (sets / "test.ndjson").write_text(lines)
    pq.write_table(pa.table({"question": [QUESTION, "Q2?"], "answer": [ANSWER, ""]}), sets / "test.pq")
    docs = [{"id": "copy", "text": "Homework: " + QUESTION + " " + PROSE}, {"id": "prose", "text": PROSE}]
    expected = _naive_contaminated([d["text"] for d in docs], [QUESTION + " " + ANSWER], 13)
    assert expected == [True, False]
    for name in ("lines.json", "test.json.gz", "test.ndjson", "test.pq"):
        stage = build_stage("decontaminate", {"eval_sets": {"t": str(sets / name)}})
        assert stage.sets[0].items == 2, name
        assert [stage.process(dict(d), StageStats("decontaminate")) for d in docs] == [False, True], name
    stage = build_stage("decontaminate", {"eval_sets": {"t": str(sets)}})  # the folder: each file once
    assert stage.sets[0].items == 8


def test_a_text_eval_set_of_separated_stories_counts_no_separator_as_an_item(tmp_path, capsys, shared_data):
    """A text eval set of TinyStories-style stories: its <|endoftext|> lines were read as items, and the stage said
    "23 items, ...; 6 shorter than 13 words cannot match" for the sample's 18 story lines (one of 11 words)."""
    sample = (shared_data / "text" / "tinystories_sample.txt").read_text(encoding="utf-8")
    lines = [ln for ln in sample.splitlines() if ln.strip()]
    assert len(lines) == 23 and sum(ln.strip() == "<|endoftext|>" for ln in lines) == 5  # 18 story lines
    (tmp_path / "stories.txt").write_text(sample, encoding="utf-8")
    stage = build_stage("decontaminate", {"eval_sets": {"stories": str(tmp_path / "stories.txt")}})
    assert (stage.sets[0].items, stage.sets[0].short) == (18, 1)  # "And that's how Ben found an amazing vase ..."
    assert f"stories ({tmp_path / 'stories.txt'}): 18 items, " in capsys.readouterr().err
    doc = {"text": "A tale. " + lines[1]}  # a story's line (line 3 of the file) copied into a document
    assert stage.process(doc, StageStats("decontaminate")) is False
