"""The runner on the synthetic crawl: per-stage removals match the crawl's manifest, resume, Ray == local."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

from cookmind.curate.config import CurateConfig
from cookmind.curate.runner import read_outputs, run_pipeline
from cookmind.synthetic.crawl import write_crawl

# stage -> the crawl kinds it alone should remove
EXPECTED = {
    "langid": ["foreign"],
    "gopher": ["spam"],
    "minhash": ["exact_dup", "near_dup"],
    "nsfw": ["nsfw"],
    "toxic": ["toxic"],
    "quality": ["seo_spam"],
    "extract": [],
    "exact_lines": [],
    "pii": [],
}

LIGHT = [
    {"extract": {}},
    {"langid": {}},
    {"gopher": {}},
    {"minhash": {"num_hashes": 64, "num_bands": 8}},
    {"exact_lines": {"num_partitions": 4}},
    {"pii": {}},
]


def test_demo_stage_removes_what_the_crawl_planted(tmp_path):
    from cookmind.demo.curate import demo_stage

    out = demo_stage(tmp_path, seed=3, num_pages=160, progress=False)
    manifest = out["manifest"]
    stats = {s["name"]: s for s in out["stages"]}
    assert list(stats) == ["extract", "langid", "gopher", "minhash", "exact_lines", "pii", "nsfw", "toxic", "quality"]
    for name, kinds in EXPECTED.items():
        assert stats[name]["removed"] == sum(manifest["kinds"].get(k, 0) for k in kinds), name
    assert stats["minhash"]["reasons"] == {
        "exact_duplicate": manifest["kinds"]["exact_dup"],
        "near_duplicate": manifest["kinds"]["near_dup"],
    }
    for kind in ("emails", "phones", "ips"):
        assert stats["pii"]["counters"][f"{kind}_masked"] == manifest["pii"].get(kind, 0)
    assert stats["exact_lines"]["counters"]["lines_removed"] > 0  # the repeated newsletter line and titles
    # what is left is exactly the good pages, masked
    kept = list(read_outputs(sorted((tmp_path / "curated").glob("shard-*.jsonl.gz"))))
    assert len(kept) == out["docs_out"] == manifest["kinds"]["good"]
    # one page per duplicate cluster survives: the first in corpus order, sometimes the copy
    assert {d["kind"] for d in kept} <= {"good", "exact_dup", "near_dup"}
    lines = Path(out["text_path"]).read_text().splitlines()
    assert len(lines) == len(kept)
    text = " ".join(json.loads(x)["text"] for x in lines)
    assert "@" not in text and not re.search(r"\(\d{3}\) \d{3}-\d{4}", text)
    assert "Subscribe to our newsletter" not in text
    report = json.loads(Path(out["report_json"]).read_text())
    assert report["output_docs"] == len(kept)
    assert "| minhash |" in Path(out["report_md"]).read_text()


def _read_all(out: Path) -> list[dict]:
    return list(read_outputs(sorted(out.glob("shard-*"))))


def test_resume_skips_finished_shards_and_matches_a_clean_run(tmp_path):
    write_crawl(tmp_path / "in", num_pages=90, seed=5, num_shards=3)
    cfg = CurateConfig(stages=LIGHT)
    bad = tmp_path / "in" / "crawl-00002.jsonl.gz"
    good_bytes = bad.read_bytes()
    with gzip.open(bad, "ab") as f:
        f.write(b"{not json\n")
    with pytest.raises(ValueError, match=r"crawl-00002.jsonl.gz:\d+: not valid JSON"):
        run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "out", progress=False)
    first = tmp_path / "out" / "_work" / "00-extract+langid+gopher"
    done = {p.name: p.stat().st_mtime_ns for p in first.glob("*.done")}
    assert sorted(done) == ["shard-00000.done", "shard-00001.done"]
    bad.write_bytes(good_bytes)
    result = run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "out", progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in first.glob("*.done") if p.name in done} == done  # not redone
    assert result.tasks_skipped == 2
    again = run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "out", progress=False)
    assert again.tasks_run == 0
    fresh = run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "fresh", progress=False)
    assert _read_all(tmp_path / "out") == _read_all(tmp_path / "fresh")
    assert [s.to_dict()["removed"] for s in result.stages] == [s.to_dict()["removed"] for s in fresh.stages]
    with pytest.raises(ValueError, match="another config .*--text-field"):
        run_pipeline(CurateConfig(stages=LIGHT[:2]), [str(tmp_path / "in")], tmp_path / "out", progress=False)


def test_removed_lists_exactly_the_documents_missing_from_the_output_with_the_reported_reasons(tmp_path):
    from collections import Counter

    from cookmind.curate.shards import iter_shard, read_jsonl

    write_crawl(tmp_path / "in", num_pages=90, seed=5, num_shards=3)
    inputs = sorted((tmp_path / "in").glob("crawl-*.jsonl.gz"))
    plain = run_pipeline(CurateConfig(stages=LIGHT), [str(tmp_path / "in")], tmp_path / "plain", progress=False)
    assert plain.removed is None and not (tmp_path / "plain" / "removed").exists()
    assert "removed" not in json.loads(plain.report_json.read_text())
    result = run_pipeline(
        CurateConfig(stages=LIGHT, removed=True), [str(tmp_path / "in")], tmp_path / "out", progress=False
    )
    assert _read_all(tmp_path / "out") == _read_all(tmp_path / "plain")  # the option changes no output
    assert result.removed == tmp_path / "out" / "removed"
    assert "removed/shard-*.jsonl.gz" in result.report_md.read_text()
    kept = {d["id"] for d in _read_all(tmp_path / "out")}
    listed = []
    for i, src in enumerate(inputs):  # shard i lists what input shard i lost, each document once
        rows = list(read_jsonl(result.removed / f"shard-{i:05d}.jsonl.gz"))
        assert sorted(r["id"] for r in rows) == sorted(d["id"] for d in iter_shard([str(src)]) if d["id"] not in kept)
        listed += rows
    assert sorted(p.name for p in result.removed.iterdir()) == [f"shard-{i:05d}.jsonl.gz" for i in range(3)]
    reported = Counter({(s.name, r): n for s in result.stages for r, n in s.reasons.items() if n})
    assert Counter((r["stage"], r["reason"]) for r in listed) == reported
    assert {"gopher", "minhash"} <= {stage for stage, _ in reported}
    assert all(r["text"] for r in listed if r["stage"] != "extract")


def test_removed_documents_name_their_input_file_and_line_row_or_offset(tmp_path):
    """A removed document was named by its id and url alone: a JSONL record without an id, or a page of a WARC,
    could not be found in the inputs. Each listed document now names its input file and, within it, the 1-based
    line (JSONL), the row (Parquet, from 1 as pack numbers it) or the record's byte offset (WARC; in the .gz file,
    its member's), also when a later pass (MinHash, after the intermediate shards) removed it; the output shards
    stay as they were."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cookmind.curate.shards import read_jsonl

    good = (
        "Simmer the chicken stock with onions, carrots and a bay leaf for two hours, then strain it through a fine "
        "sieve. Skim the fat from the surface once it has cooled, and season the broth with salt and pepper to taste. "
        "A good stock is the base of many soups and sauces, so it is worth making a large batch at the weekend and "
        "freezing it in small portions that thaw quickly when a weeknight recipe calls for them."
    )
    short = "<html><body><main><p>Too short a page to keep.</p></main></body></html>"
    (tmp_path / "in").mkdir()
    lines = [json.dumps({"text": good}), "", json.dumps({"text": "too short"}), json.dumps({"text": good})]
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(lines) + "\n")
    pq.write_table(
        pa.Table.from_pylist([{"text": good + " Parquet."}, {"text": "short"}]), tmp_path / "in" / "b.parquet"
    )
    records = [
        _warc_record("response", f"https://{i}.example/", _http_response(html, "text/html"), "application/http")
        for i, html in enumerate(
            [f"<html><body><main><p>{good} WARC.</p></main></body></html>".encode(), short.encode()]
        )
    ]
    (tmp_path / "in" / "c.warc.gz").write_bytes(b"".join(gzip.compress(r) for r in records))
    (tmp_path / "in" / "d.html").write_text(short)
    stages = [
        {"extract": {}},
        {"gopher": {}},
        {"minhash": {"num_hashes": 64, "num_bands": 8, "jaccard_threshold": 0.99}},
    ]
    result = run_pipeline(
        CurateConfig(stages=stages, removed=True), [str(tmp_path / "in")], tmp_path / "out", progress=False
    )
    rows = [r for p in sorted(result.removed.glob("shard-*")) for r in read_jsonl(p)]
    src = str(tmp_path / "in")
    assert sorted((r["stage"], r["reason"], json.dumps(r["source"], sort_keys=True)) for r in rows) == sorted(
        (stage, reason, json.dumps(where, sort_keys=True))
        for stage, reason, where in [
            ("gopher", "too_few_words", {"file": f"{src}/a.jsonl", "line": 3}),
            ("minhash", "exact_duplicate", {"file": f"{src}/a.jsonl", "line": 4}),
            ("gopher", "too_few_words", {"file": f"{src}/b.parquet", "row": 2}),
            ("gopher", "too_few_words", {"file": f"{src}/c.warc.gz", "offset": len(gzip.compress(records[0]))}),
            ("gopher", "too_few_words", {"file": f"{src}/d.html"}),
        ]
    )
    kept = _read_all(tmp_path / "out")
    assert len(kept) == 3 and all(set(d) <= {"id", "text", "url"} for d in kept)  # outputs carry no source


def _code_page(i: int) -> str:
    """A documentation page with a code block: the Gopher rules fail it for repeated lines and n-grams."""
    prose = (
        f"Listing {i} defines a function that reads the recipe file and returns the number of steps. Each "
        "arm of the match handles one kind of line, and the compiler checks that every case is covered."
    )
    body = ["    match line.trim() {", '        "" => 0,', "        _ => 1,", "    }", "}"]
    code = "\n".join(line for k in range(4) for line in [f"fn step_{i}_{k}(line: &str) -> usize {{", *body])
    return f"{prose}\n\n{code}\n\nThe same pattern works for the ingredients list, as the next section shows."


def test_the_report_says_when_gopher_removed_code_and_names_the_options_that_keep_it(tmp_path):
    """Gopher's rules, written for prose, dropped code-heavy documentation pages (28 of 548 mdBook pages) and the
    report only counted repetition failures. It now notes how many removed documents look like code and gives stage
    options that keep them; those options, taken from the note as they are, do; a run whose removals are short or
    repetitive prose gets no note."""
    import yaml

    prose = (
        "Simmer the chicken stock with onions, carrots and a bay leaf for two hours, then strain it through a fine "
        "sieve. Skim the fat from the surface once it has cooled, and season the broth with salt and pepper to taste. "
        "A good stock is the base of many soups and sauces, so it is worth making a large batch at the weekend and "
        "freezing it in small portions that thaw quickly when a weeknight recipe calls for them."
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.jsonl").write_text(
        "".join(
            json.dumps({"text": t}) + "\n" for t in [prose] * 6 + ["too short"] * 6 + [_code_page(i) for i in range(4)]
        )
    )
    (tmp_path / "prose").mkdir()
    (tmp_path / "prose" / "a.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in [prose] * 6 + ["too short"] * 6 + [f"{prose}\n{prose}"] * 4)
    )
    result = run_pipeline(
        CurateConfig(stages=[{"gopher": {}}]), [str(tmp_path / "docs")], tmp_path / "out", progress=False
    )
    assert result.stages[0].removed == 10 and result.stages[0].counters["code_like_removed"] == 4
    (note,) = json.loads(result.report_json.read_text())["notes"]
    assert note.startswith("gopher removed 4 documents that look like code (40% of its removals")
    assert "## Notes" in result.report_md.read_text() and note in result.report_md.read_text()
    options = yaml.safe_load(re.search(r"`(gopher: \{.*\})`", note).group(1))
    relaxed = run_pipeline(
        CurateConfig(stages=[options]), [str(tmp_path / "docs")], tmp_path / "relaxed", progress=False
    )
    assert relaxed.stages[0].removed == 6 and "notes" not in json.loads(relaxed.report_json.read_text())
    plain = run_pipeline(
        CurateConfig(stages=[{"gopher": {}}]), [str(tmp_path / "prose")], tmp_path / "plain", progress=False
    )
    assert plain.stages[0].removed == 10 and "notes" not in json.loads(plain.report_json.read_text())
    assert "## Notes" not in plain.report_md.read_text()


def test_parquet_output_and_config_errors(tmp_path):
    write_crawl(tmp_path / "in", num_pages=40, seed=6, num_shards=2)
    cfg = CurateConfig(stages=LIGHT[:3], output_format="parquet")
    result = run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "out", progress=False)
    assert [p.suffix for p in result.outputs] == [".parquet", ".parquet"]
    assert len(_read_all(tmp_path / "out")) == result.stages[-1].docs_out > 0
    with pytest.raises(ValueError, match="unknown curate stage 'dedupe'"):
        run_pipeline(CurateConfig(stages=[{"dedupe": {}}]), [str(tmp_path / "in")], tmp_path / "o2", progress=False)
    with pytest.raises(ValueError, match="unknown key"):
        CurateConfig.from_dict({"stagez": []})


def test_ray_executor_equals_local(tmp_path):
    ray = pytest.importorskip("ray")
    write_crawl(tmp_path / "in", num_pages=40, seed=7, num_shards=2)
    cfg = CurateConfig(stages=LIGHT, removed=True)
    local = run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "local", progress=False)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    repo = str(Path(__file__).resolve().parents[1])
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": repo, "RAY_AUTH_MODE": "disabled"}},
    )
    try:
        remote = run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "ray", executor="ray", progress=False)
    finally:
        ray.shutdown()
    assert _read_all(tmp_path / "ray") == _read_all(tmp_path / "local")
    assert _read_all(tmp_path / "ray" / "removed") == _read_all(tmp_path / "local" / "removed")
    strip = [{k: v for k, v in s.to_dict().items() if k != "seconds"} for s in local.stages]
    assert [{k: v for k, v in s.to_dict().items() if k != "seconds"} for s in remote.stages] == strip


def _warc_record(rtype: str, url: str, payload: bytes, content_type: str) -> bytes:
    head = (
        f"WARC/1.0\r\nWARC-Type: {rtype}\r\nWARC-Target-URI: {url}\r\nWARC-Record-ID: <urn:uuid:{abs(hash(url))}>\r\n"
        f"WARC-Date: 2026-01-01T00:00:00Z\r\nContent-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload + b"\r\n\r\n"


def _http_response(html: bytes, content_type: str) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(html)}\r\n\r\n"
    return head.encode() + html


def test_warc_html_is_decoded_by_the_http_charset(tmp_path):
    """A crawled page's charset is said by its HTTP Content-Type, which the WARC record keeps: a short cp1251 page
    the byte statistics call cp1252 ('Ùè äà êàøà') and an ISO-2022-JP page (7-bit bytes, so valid UTF-8, read as
    escape codes) come out right only by the header; a UTF-8 BOM still overrules it, and an unknown charset label
    falls back to the page itself (valid UTF-8 here)."""
    from cookmind.curate.shards import iter_shard

    ru, ja = "Щи да каша — пища наша.", "味噌汁の作り方"
    pages = [
        (f"<html><body><p>{ru}</p></body></html>".encode("cp1251"), "text/html; charset=windows-1251"),
        (f"<html><body><p>{ja}</p></body></html>".encode("iso-2022-jp"), 'text/html; Charset="ISO-2022-JP"'),
        (b"\xef\xbb\xbf" + f"<html><body><p>{ru}</p></body></html>".encode(), "text/html; charset=iso-8859-1"),
        (f"<html><body><p>{ru}</p></body></html>".encode(), "text/html; charset=no-such-charset"),
    ]
    warc = b"".join(
        _warc_record("response", f"https://{i}.example/", _http_response(html, ctype), "application/http")
        for i, (html, ctype) in enumerate(pages)
    )
    (tmp_path / "x.warc").write_bytes(warc)
    docs = list(iter_shard(str(tmp_path / "x.warc")))
    assert [d["html"] for d in docs] == [
        f"<html><body><p>{ru}</p></body></html>",
        f"<html><body><p>{ja}</p></body></html>",
        f"<html><body><p>{ru}</p></body></html>",
        f"<html><body><p>{ru}</p></body></html>",
    ]


def test_warc_and_html_inputs(tmp_path):
    from cookmind.curate.shards import iter_shard, plan_input_shards

    html = b"<html><body><main><p>Hello from a WARC response, a page about soup.</p></main></body></html>"
    http = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: "
        + str(len(html)).encode()
        + b"\r\n\r\n"
        + html
    )
    warc = _warc_record("response", "https://a.example/", http, "application/http; msgtype=response")
    warc += _warc_record("conversion", "https://b.example/", b"Plain text from a WET record.", "text/plain")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x.warc").write_bytes(warc)
    (tmp_path / "in" / "page.html").write_bytes(html)
    (tmp_path / "in" / "manifest.json").write_text("{}")  # a side file, not a document
    plan = plan_input_shards([tmp_path / "in"])
    docs = [d for shard in plan for d in iter_shard(shard)]
    assert [d.get("url") for d in docs] == ["https://a.example/", "https://b.example/", None]
    assert "WARC response" in docs[0]["html"] and docs[1]["text"] == "Plain text from a WET record."
    result = run_pipeline(
        CurateConfig(stages=[{"extract": {}}]), [str(tmp_path / "in")], tmp_path / "out", progress=False
    )
    texts = sorted(d["text"] for d in _read_all(tmp_path / "out"))
    assert texts == [
        "Hello from a WARC response, a page about soup.",
        "Hello from a WARC response, a page about soup.",
        "Plain text from a WET record.",
    ]
    assert result.stages[0].docs_in == 3


def test_a_folder_gives_its_documents_and_counts_the_files_it_leaves_out(tmp_path):
    """A saved site or docs build holds fonts, images, styles and scripts beside its pages: each was read as a text
    document, and a font's licence text went into the clean shards. A folder now gives its documents (HTML, WARC,
    JSONL, Parquet, .txt) and says how many files of each other kind it left out; a file named alone is still read."""
    from cookmind.curate.shards import plan_input_shards

    site = tmp_path / "site"
    (site / "fonts").mkdir(parents=True)
    (site / "page.html").write_text("<html><body><p>A page about soup.</p></body></html>")
    (site / "notes.txt").write_text("Notes about soup.")
    for name in ("fonts/a.woff2", "fonts/b.woff2", "style.css", "logo.png", "app.js", "LICENSE"):
        (site / name).write_bytes(b"\x00not a document")
    with pytest.warns(UserWarning) as caught:
        plan = plan_input_shards([site])
    assert sorted(Path(f).name for shard in plan for f in shard) == ["notes.txt", "page.html"]
    said = [str(w.message) for w in caught]
    assert said == [
        "curate: 6 files in the input folders are not documents and are left out (2 .woff2, 1 (no suffix), 1 .css, "
        "1 .js, 1 .png); a folder gives its HTML, WARC, JSONL, Parquet and .txt/.text files (name a file on its own "
        "to read it: a .json file as JSON records, any other as text)"
    ]
    assert plan_input_shards([site / "LICENSE"]) == [[str(site / "LICENSE")]]  # named alone: read as text


def test_the_report_records_the_files_a_folder_left_out_by_suffix(tmp_path):
    """`curate run` warned that N files in the input folders are not documents and were left out, but report.json and
    report.md, what a user reads later, did not say so. report.json counts them by suffix (input_files_left_out) and
    report.md has the warning's note."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "page.html").write_text("<html><body><p>A page about soup and its making.</p></body></html>")
    for name in ("a.js", "b.js", "style.css", "logo.png"):
        (site / name).write_bytes(b"\x00not a document")
    with pytest.warns(UserWarning, match="4 files in the input folders are not documents"):
        result = run_pipeline(CurateConfig(stages=[{"extract": {}}]), [str(site)], tmp_path / "out", progress=False)
    report = json.loads(result.report_json.read_text())
    assert report["input_files_left_out"] == {".js": 2, ".css": 1, ".png": 1}
    md = result.report_md.read_text()
    assert "4 files in the input folders are not documents and are left out (2 .js, 1 .css, 1 .png)" in md, md


def test_a_folders_markdown_json_and_yaml_files_are_counted_where_they_are_left_out(tmp_path):
    """A folder's .md, .json, .yaml (and .npz, .npy, .done) files were left out without a word: beside HTML pages
    they were missing from the warning's count, and a folder of Markdown pages gave "no input files found". They are
    counted now; only what a cookmind command wrote there goes unsaid (a curate output's report, a crawl's
    manifest)."""
    import warnings

    from cookmind.curate.shards import plan_input_shards

    site = tmp_path / "site"
    site.mkdir()
    (site / "page.html").write_text("<html><body><p>A page about soup.</p></body></html>")
    for name in ("guide.md", "intro.md", "data.json", "PACKAGE.JSON", "mkdocs.yml", ".hidden.md"):  # any case
        (site / name).write_text("# Soup\n\nHow to make soup.\n")
    with pytest.warns(UserWarning) as caught:
        plan = plan_input_shards([site])
    assert [Path(f).name for shard in plan for f in shard] == ["page.html"]
    assert [str(w.message) for w in caught] == [
        "curate: 5 files in the input folders are not documents and are left out (2 .json, 2 .md, 1 .yml); a folder "
        "gives its HTML, WARC, JSONL, Parquet and .txt/.text files (name a file on its own to read it: a .json file "
        "as JSON records, any other as text)"
    ]
    md = tmp_path / "md"
    md.mkdir()
    (md / "a.md").write_text("# Soup\n")
    with pytest.warns(UserWarning, match=r"1 files .* left out \(1 \.md\)"):
        with pytest.raises(ValueError, match=r"^no documents to read in \['.*md'\]: a folder gives its HTML, WARC"):
            plan_input_shards([md])
    # what cookmind wrote beside the documents is no document and goes unsaid
    write_crawl(tmp_path / "crawl", num_pages=8, num_shards=1)
    assert (tmp_path / "crawl" / "manifest.json").is_file()
    (tmp_path / "c.yaml").write_text("stages: [extract]\n")
    run_pipeline(
        CurateConfig.from_yaml(tmp_path / "c.yaml"), [str(tmp_path / "crawl")], tmp_path / "out", progress=False
    )
    assert (tmp_path / "out" / "report.md").is_file() and (tmp_path / "out" / "report.json").is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(plan_input_shards([tmp_path / "crawl"])) == 1
        assert len(plan_input_shards([tmp_path / "out"])) == 1


def test_a_warning_that_names_its_stage_is_printed_with_the_stage_once(tmp_path):
    # the CLI printed "cookmind curate: warning: curate: 1 files in the input folders are not documents ..."
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "page.html").write_text("<html><body><p>A page about soup and bread and tea.</p></body></html>")
    (site / "logo.png").write_bytes(b"\x00not a document")
    cmd = [sys.executable, "-m", "cookmind", "curate", "run", "--input", str(site), "--output", str(tmp_path / "o")]
    done = subprocess.run([*cmd, "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "warning:" in line]
    assert said and said[0].startswith("cookmind curate: warning: 1 files in the input folders are not documents")


def test_cli_crawl_run_and_bad_config(tmp_path, capsys):
    from cookmind.cli import main

    assert main(["curate", "crawl", "--output", str(tmp_path / "in"), "--num-pages", "40", "--shards", "2"]) == 0
    (tmp_path / "c.yaml").write_text("stages:\n  - extract\n  - gopher: {min_words: 40}\noutput_format: jsonl\n")
    assert (
        main(
            [
                "curate",
                "run",
                "--config",
                str(tmp_path / "c.yaml"),
                "--input",
                str(tmp_path / "in"),
                "--output",
                str(tmp_path / "out"),
                "--quiet",
            ]
        )
        == 0
    )
    assert (tmp_path / "out" / "report.md").exists() and (tmp_path / "out" / "shard-00001.jsonl").exists()
    (tmp_path / "bad.yaml").write_text("stages:\n  - gopher: {min_wordz: 3}\n")
    assert (
        main(
            [
                "curate",
                "run",
                "--config",
                str(tmp_path / "bad.yaml"),
                "--input",
                str(tmp_path / "in"),
                "--output",
                str(tmp_path / "out2"),
                "--quiet",
            ]
        )
        == 2
    )
    assert "min_wordz" in capsys.readouterr().err


def test_text_documents_pass_through_byte_for_byte(tmp_path):
    """A plain-text input keeps its CRLF line ends and final newline through reading and the no-op stages."""
    (tmp_path / "in").mkdir()
    body = "First line of a note\r\nsecond line, with a Windows ending\r\n\r\nlast paragraph\r\n"
    (tmp_path / "in" / "note.txt").write_bytes(body.encode())
    result = run_pipeline(
        CurateConfig(stages=[{"extract": {}}, {"exact_lines": {"num_partitions": 2}}], output_format="jsonl"),
        [str(tmp_path / "in")],
        tmp_path / "out",
        progress=False,
    )
    assert [d["text"] for d in read_outputs(result.outputs)] == [body]


def _fails_on_the_second(i):
    if i == 1:
        raise ValueError("shard-00001.jsonl:6: not valid JSON")
    return i


def test_a_failing_shard_closes_the_progress_bar_before_the_error_is_printed(capsys):
    from cookmind.curate.executors import LocalExecutor

    try:
        LocalExecutor(progress=True).map(_fails_on_the_second, [(0,), (1,), (2,)], "curate")
    except ValueError:  # where `cookmind curate` prints the error: the bar must be closed by now
        err = capsys.readouterr().err
    # the open bar's line took the error message, and its redraw at exit wrote over it in a terminal
    assert err.endswith("\n") and "1/3" in err


def test_an_output_folder_that_overlaps_an_input_is_refused_before_any_work(tmp_path):
    write_crawl(tmp_path / "crawl", num_pages=8, seed=0)
    before = sorted(p.name for p in (tmp_path / "crawl").iterdir())
    # --output the input folder: its shards were written beside the crawl (shard-NNNNN would replace a curate
    # output's own inputs), and the next run read them as input
    for inputs, output in [([tmp_path / "crawl"], tmp_path / "crawl"), ([tmp_path], tmp_path / "clean")]:
        with pytest.raises(ValueError, match="overlap .* choose an --output outside the inputs"):
            run_pipeline(CurateConfig(), [str(p) for p in inputs], output, progress=False)
    assert sorted(p.name for p in (tmp_path / "crawl").iterdir()) == before
    assert not (tmp_path / "clean").exists()


def test_config_mistakes_are_one_line_naming_the_stage_option_or_yaml_line(tmp_path):
    from cookmind.curate.stages import build_stage

    with pytest.raises(ValueError, match=r"stage minhash: unknown option 'num_hashs' \(did you mean 'num_hashes'\?\)"):
        build_stage("minhash", {"num_hashs": 64})
    with pytest.raises(ValueError, match="stage langid: threshold must be a number from 0 to 1; got 'high'"):
        build_stage("langid", {"threshold": "high"})  # was "could not convert string to float: 'high'", no stage
    with pytest.raises(ValueError, match="unknown"):
        build_stage("gopher", {"min_wordz": 3})  # its own config names the key
    (tmp_path / "c.yaml").write_text("stages: [extract\n")
    with pytest.raises(ValueError, match=r"c.yaml: not valid YAML at line 2, column 1: expected ',' or '\]'"):
        CurateConfig.from_yaml(tmp_path / "c.yaml")  # was a yaml traceback


def _jsonl(path: Path, records: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.mark.parametrize("bad", [{"text": 5}, {"text": ["a", "b"]}, {"html": {"body": "x"}}])
def test_a_record_whose_text_or_html_is_not_a_string_is_named_by_file_and_line(tmp_path, bad):
    # an int text was an AttributeError traceback from the stats, a dict html one from extract
    src = _jsonl(tmp_path / "in.jsonl", [{"text": "A fine first record of words."}, bad])
    key = next(iter(bad))
    with pytest.raises(
        ValueError, match=rf"in\.jsonl:2: field '{key}' must be a string, got {type(bad[key]).__name__}"
    ):
        run_pipeline(CurateConfig(stages=LIGHT), [src], tmp_path / "out", progress=False)


def test_a_parquet_row_whose_text_is_not_a_string_is_named_by_its_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": [3, 4]}), tmp_path / "in.parquet")
    with pytest.raises(ValueError, match=r"in\.parquet: row 1: field 'text' must be a string, got int"):
        run_pipeline(CurateConfig(stages=LIGHT), [str(tmp_path / "in.parquet")], tmp_path / "out", progress=False)


def test_null_text_and_html_are_a_record_without_text_counted_as_removed(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", [{"text": "Kept words here."}, {"text": None, "html": None}])
    result = run_pipeline(CurateConfig(stages=[{"extract": {}}]), [src], tmp_path / "out", progress=False)
    assert [d["text"] for d in read_outputs(result.outputs)] == ["Kept words here."]
    extract = json.loads((tmp_path / "out" / "report.json").read_text())["stages"][0]
    assert extract["name"] == "extract" and extract["removed"] == 1 and extract["reasons"] == {"no_text": 1}


@pytest.mark.parametrize("first", [{"gopher": {}}, {"minhash": {}}])
def test_a_run_whose_stages_do_not_begin_with_extract_names_the_first_document_without_text(tmp_path, first):
    # every stage after extract reads doc["text"]: an HTML page was a KeyError traceback, whichever stage came first
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "page.html").write_text("<html><body><p>Soup of the day.</p></body></html>")
    with pytest.raises(ValueError, match=r"page\.html: an HTML document, but the config's stages do not begin with"):
        run_pipeline(CurateConfig(stages=[first]), [str(tmp_path / "site")], tmp_path / "out", progress=False)
    src = _jsonl(tmp_path / "in.jsonl", [{"text": "Words enough."}, {"html": "<p>x</p>"}, {"url": "u"}])
    with pytest.raises(ValueError, match=r"in\.jsonl:2: an HTML document"):
        run_pipeline(CurateConfig(stages=[first]), [src], tmp_path / "out2", progress=False)
    text_only = _jsonl(tmp_path / "t.jsonl", [{"text": "Words enough to stay in the output."}])
    result = run_pipeline(CurateConfig(stages=[first]), [text_only], tmp_path / "out3", progress=False)
    assert result.outputs  # text documents need no extract


def test_invalid_utf8_in_a_jsonl_input_names_the_file_and_line(tmp_path):
    # a bare UnicodeDecodeError ("can't decode byte 0xe9 in position 41"): no file, no line
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "Fine words here."}\n{"text": "caf\xe9"}\n')
    with pytest.raises(ValueError, match=r"in\.jsonl:2: invalid UTF-8 at byte 13 of the line"):
        run_pipeline(CurateConfig(stages=LIGHT), [str(src)], tmp_path / "out", progress=False)


def test_a_file_named_twice_is_refused_before_any_work(tmp_path, capsys):
    """A file named twice (directly, by another spelling, or through its folder) was curated twice: every count in
    the report doubled and MinHash 'removed' the second copies as duplicates; pack and tokenizer train refuse it."""
    from cookmind.cli import main

    folder = tmp_path / "in"
    folder.mkdir()
    part = folder / "part0.jsonl"
    part.write_text(json.dumps({"text": "the cook stirs the soup " * 20}) + "\n")
    (folder / "page.html").write_text("<html><body><p>" + "a garden with a cat in it. " * 20 + "</p></body></html>")
    spellings = [
        [str(part), str(part)],
        [str(part), str(folder / ".." / "in" / "part0.jsonl")],
        [str(folder), str(part)],
        [str(folder / "page.html"), str(folder)],
    ]
    for inputs in spellings:
        out = tmp_path / "out"
        assert main(["curate", "run", "--input", *inputs, "--output", str(out), "--quiet"]) == 2, inputs
        err = capsys.readouterr().err
        assert err.startswith("cookmind curate run: error: input ") and err.count("\n") == 1, err
        assert "read twice" in err, err
        assert not out.exists()
    assert main(["curate", "run", "--input", str(folder), "--output", str(tmp_path / "ok"), "--quiet"]) == 0


def test_a_curate_output_folder_as_input_gives_its_shards_not_its_work_or_removed_lists(tmp_path):
    """Curating an earlier run's output (to add a quality or decontaminate stage) read its _work/ intermediates and
    removed/ lists as documents too: 2 kept documents came in as 8, and MinHash removed the copies as duplicates."""
    from cookmind.curate.shards import plan_input_shards

    src = tmp_path / "in"
    src.mkdir()
    texts = ["the cook stirs the soup slowly " * 12, "a cat sleeps in the warm garden " * 12]
    texts.append(texts[0])  # MinHash removes one of the two copies
    for i, text in enumerate(texts):
        (src / f"part{i}.jsonl").write_text(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    first = tmp_path / "first"
    cfg = CurateConfig(stages=[{"minhash": {"num_hashes": 64, "num_bands": 8}}, {"pii": {}}], removed=True)
    result = run_pipeline(cfg, [str(src)], first, progress=False)
    assert sorted(d["text"] for d in read_outputs(result.outputs)) == sorted(texts[:2])
    assert list((first / "_work").rglob("shard-*.jsonl.gz")) and list((first / "removed").glob("shard-*"))
    said = r"left out \(\d+ in a curate output's _work/ or removed/\)"
    with pytest.warns(UserWarning, match=said):
        plan = plan_input_shards([first])
    assert sorted(f for shard in plan for f in shard) == sorted(str(p) for p in result.outputs)
    with pytest.warns(UserWarning, match=said):
        again = run_pipeline(CurateConfig(stages=[{"pii": {}}]), [str(first)], tmp_path / "second", progress=False)
    assert sorted(d["text"] for d in read_outputs(again.outputs)) == sorted(texts[:2])
    assert again.stages[0].docs_in == 2


def test_text_inputs_with_bytes_that_are_not_utf8_are_counted_in_the_report_and_warned_of(tmp_path):
    """A Latin-1 .txt input was read with U+FFFD for its bad bytes without a word: the report counts the documents,
    lines and bytes, and a warning names the first file and line."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes("fine words, all UTF-8: caf\u00e9\n".encode())
    # 3 bad bytes on 2 lines (\xe9, then \xe8 and the lone continuation byte \xa0), lines 2 and 4
    (tmp_path / "in" / "b.txt").write_bytes(b"first line\ncaf\xe9 ok\nthird\ntr\xe8s\xa0bien\n")
    with pytest.warns(UserWarning, match=r"b\.txt:2: invalid UTF-8, read as U\+FFFD") as caught:
        run_pipeline(CurateConfig(stages=[{"extract": {}}]), [str(tmp_path / "in")], tmp_path / "out", progress=False)
    assert len([w for w in caught if "UTF-8" in str(w.message)]) == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    counters = report["stages"][0]["counters"]
    assert (counters["invalid_utf8_docs"], counters["invalid_utf8_lines"], counters["invalid_utf8_bytes"]) == (1, 2, 3)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "invalid_utf8_docs: 1" in md and "b.txt:2" in md
    # a WET record's text likewise, named by its byte offset; its documents do not carry the count into the output
    ok = _warc_record("conversion", "https://a.example/", b"Plain text.", "text/plain")
    (tmp_path / "x.wet").write_bytes(
        ok + _warc_record("conversion", "https://c.example/", b"na\xefve\n\xff", "text/plain")
    )
    with pytest.warns(UserWarning, match=rf"x\.wet at byte {len(ok)}: invalid UTF-8"):
        result = run_pipeline(
            CurateConfig(stages=[{"extract": {}}]), [str(tmp_path / "x.wet")], tmp_path / "o2", progress=False
        )
    assert result.stages[0].counters == {"invalid_utf8_docs": 1, "invalid_utf8_lines": 2, "invalid_utf8_bytes": 2}
    assert [d["text"] for d in read_outputs(result.outputs)] == ["Plain text.", "na\ufffdve\n\ufffd"]


def test_an_html_page_a_utf8_bom_marks_but_holding_other_bytes_is_counted_and_warned_of(tmp_path):
    """A page opening with a UTF-8 byte-order mark is UTF-8 (as browsers read it), and its bytes that are not were
    read as U+FFFD without a word; now counted and warned of as a .txt input's are (an HTML file by file:line, a
    WARC record by its byte offset)."""
    page = b"\xef\xbb\xbf<html><body>\n<p>Un caf\xe9 tr\xe8s bon, dit le chef de cuisine.</p>\n</body></html>\n"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "page.html").write_bytes(page)
    with pytest.warns(UserWarning, match=r"page\.html:2: invalid UTF-8, read as U\+FFFD \(1 input document"):
        result = run_pipeline(
            CurateConfig(stages=[{"extract": {}}]), [str(tmp_path / "in")], tmp_path / "o1", progress=False
        )
    counters = result.stages[0].counters
    assert (counters["invalid_utf8_docs"], counters["invalid_utf8_lines"], counters["invalid_utf8_bytes"]) == (1, 1, 2)
    assert [d["text"] for d in read_outputs(result.outputs)] == ["Un caf\ufffd tr\ufffds bon, dit le chef de cuisine."]
    ok = _warc_record(
        "response", "https://a.example/", _http_response(b"<p>Fine.</p>", "text/html"), "application/http"
    )
    bad = _warc_record("response", "https://b.example/", _http_response(page, "text/html"), "application/http")
    (tmp_path / "x.warc").write_bytes(ok + bad)
    with pytest.warns(UserWarning, match=rf"x\.warc at byte {len(ok)}: invalid UTF-8"):
        result = run_pipeline(
            CurateConfig(stages=[{"extract": {}}]), [str(tmp_path / "x.warc")], tmp_path / "o2", progress=False
        )
    assert result.stages[0].counters == {"invalid_utf8_docs": 1, "invalid_utf8_lines": 1, "invalid_utf8_bytes": 2}


def test_curate_reads_every_records_file_suffix_pack_reads_as_records(tmp_path, tok_dir):
    """A `.json` file (JSON lines, or one JSON array, as pack, tokenizer train and eval ppl read it), an `.ndjson.gz`
    and a `.pq` Parquet file were read by curate run as ONE plain-text document each: the JSON syntax (or the Parquet
    bytes) became the document's text. Each record is a document now, as pack reads the same files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cookmind.cli import main as cli_main

    texts = ["The cook stirs the soup.", "Bread is baked at dawn.", "Tea is served at five."]
    files = {
        "lines.json": "".join(json.dumps({"text": t}) + "\n" for t in texts),
        "array.json": json.dumps([{"text": t} for t in texts], indent=1),
        "lines.ndjson.gz": gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode()),
    }
    for name, body in files.items():
        (tmp_path / name).write_bytes(body if isinstance(body, bytes) else body.encode())
    pq.write_table(pa.table({"text": texts}), tmp_path / "rows.pq")
    (tmp_path / "c.yaml").write_text("stages: [extract]\n")
    config = CurateConfig.from_yaml(tmp_path / "c.yaml")
    for name in [*files, "rows.pq"]:
        out = tmp_path / f"out-{name}"
        result = run_pipeline(config, [str(tmp_path / name)], out, progress=False)
        assert [d["text"] for d in _read_all(out)] == texts, name
        assert result.stages[0].docs_in == 3, name
        store = tmp_path / f"store-{name}"  # pack reads the same three records
        argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(tmp_path / name)]
        assert cli_main([*argv, "--out", str(store), "--quiet"]) == 0
        assert json.loads((store / "meta.json").read_text())["num_records"] == 3, name
    bad = tmp_path / "bad.json"
    bad.write_text('[{"text": "one"},\n {"text": 2}]')
    with pytest.raises(ValueError, match=r"bad\.json: record 2: field 'text' must be a string"):
        run_pipeline(config, [str(bad)], tmp_path / "out-bad", progress=False)


def test_a_removed_document_keeps_the_fields_the_stages_gave_it_as_a_kept_one_does(tmp_path):
    """A document langid removed as low_confidence (or as another language) was listed without the lang and
    lang_score a kept one carries, nor the record's own fields: its listing is the document as it was when removed,
    with its stage, reason and source; a field of the record named like one of those is kept under doc_<name>."""
    from cookmind.curate.langid import identify_language
    from cookmind.curate.shards import read_jsonl

    docs = {
        "short": "ok",  # too short to tell: low_confidence
        "german": "Der Hund läuft schnell nach Hause und isst sein Abendessen in der Küche.",
        "english": "The cook stirs the soup slowly and tastes it before adding a pinch of salt to the pot.",
    }
    rows = [{"id": k, "text": t, "topic": "food", "reason": "theirs"} for k, t in docs.items()]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stages = [{"langid": {"languages": ["en"], "threshold": 0.65}}]
    result = run_pipeline(
        CurateConfig(stages=stages, removed=True), [str(tmp_path / "in.jsonl")], tmp_path / "out", progress=False
    )
    (kept,) = list(read_outputs(result.outputs))
    listed = {r["id"]: r for r in read_jsonl(result.removed / "shard-00000.jsonl.gz")}
    assert kept["id"] == "english" and sorted(listed) == ["german", "short"]
    for name, row in listed.items():
        lang, score = identify_language(docs[name])
        assert (row["lang"], row["lang_score"]) == (lang, round(score, 4)), name
        assert (row["stage"], row["topic"], row["doc_reason"], row["text"]) == ("langid", "food", "theirs", docs[name])
        assert row["source"]["line"] == list(docs).index(name) + 1
    assert listed["short"]["reason"] == "low_confidence" and listed["german"]["reason"] == "lang:de"
    assert set(kept) - {"id"} <= set(listed["short"])  # every field a kept document has


def test_more_workers_than_shards_says_how_many_processes_run(tmp_path):
    """--workers 4 over inputs that make one shard ran one process without a word (the help says a process curates
    one shard at a time, but the run did not); now a one-line warning says so and how to get more. Workers that the
    shards can all use say nothing."""
    import warnings

    src = tmp_path / "one.jsonl"
    src.write_text("".join(json.dumps({"text": f"Soup number {i} of the day."}) + "\n" for i in range(5)))
    stages = [{"extract": {}}]
    with pytest.warns(UserWarning) as said:
        run_pipeline(CurateConfig(stages=stages), [str(src)], tmp_path / "a", workers=4, progress=False)
    (line,) = [str(w.message) for w in said]
    assert "\n" not in line
    assert line.startswith("curate: --workers 4, but the inputs make 1 shard") and "1 process runs" in line
    assert "split" in line  # what to do
    with pytest.warns(UserWarning, match=r"the config's workers: 3, but the inputs make 1 shard.*1 process runs"):
        run_pipeline(CurateConfig(stages=stages, workers=3), [str(src)], tmp_path / "b", progress=False)
    (tmp_path / "two").mkdir()
    for k in range(2):
        (tmp_path / "two" / f"{k}.jsonl").write_text(src.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_pipeline(CurateConfig(stages=stages), [str(tmp_path / "two")], tmp_path / "c", workers=2, progress=False)


def test_a_folder_with_pretty_printed_json_gz_reads_as_pack_reads_it_and_an_unreadable_one_is_told(
    tmp_path, tok_dir, capsys
):
    """A pretty-printed `.json.gz` in an input folder: a JSON array of objects or of strings (pack reads a string as
    a document's text; curate stopped at it, 'expected a JSON object, got str') is read by curate run as pack reads
    it, the same documents. One JSON object spread over lines is neither JSON lines nor an array: curate run and pack
    both say so in one line naming the file, what it holds and the ways out, not only 'not valid JSON' at line 1."""
    from cookmind.cli import main as cli_main

    texts = ["The cook stirs the soup.", "Bread is baked at dawn.", "Tea is served at five."]
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "objects.json.gz").write_bytes(gzip.compress(json.dumps([{"text": t} for t in texts], indent=2).encode()))
    (folder / "strings.json.gz").write_bytes(gzip.compress(json.dumps(texts[::-1], indent=2).encode()))
    (folder / "lines.jsonl").write_text(json.dumps("A JSON line that is a string.") + "\n")
    pack = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--quiet", "--out"]
    run = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--quiet", "--output"]
    (tmp_path / "c.yaml").write_text("stages: [extract]\n")
    assert cli_main([*run, str(tmp_path / "out"), "--input", str(folder)]) == 0, capsys.readouterr().err
    got = sorted(d["text"] for d in _read_all(tmp_path / "out"))
    assert got == sorted([*texts, *texts, "A JSON line that is a string."])
    files = sorted(str(p) for p in folder.iterdir())
    assert cli_main([*pack, str(tmp_path / "store"), "--input", *files]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "store" / "meta.json").read_text())["num_records"] == len(got)
    capsys.readouterr()

    obj = folder / "config.json.gz"
    obj.write_bytes(gzip.compress(json.dumps({"text": texts[0], "id": 1}, indent=2).encode()))
    assert cli_main([*run, str(tmp_path / "out2"), "--input", str(folder)]) == 2
    curate_err = capsys.readouterr().err
    assert cli_main([*pack, str(tmp_path / "store2"), "--input", str(obj)]) == 2
    pack_err = capsys.readouterr().err
    for err in (curate_err, pack_err):
        assert err.count("\n") == 1, err
        assert f"{obj}:1: " in err and "one JSON object spread over lines" in err, err
    assert "leave it out of --input" in curate_err and "--skip-bad" in pack_err


def test_a_text_file_of_documents_separated_by_endoftext_is_read_as_pack_reads_it(tmp_path, tok_dir):
    """A TinyStories-style .txt file (stories separated by <|endoftext|> lines) was ONE document to curate run, where
    pack reads it as one document a story: exact-line dedup then removed the repeated separator lines as duplicates,
    and the output shard held the stories run together, so `pack` of the curated folder stored one document where
    `pack` of the file stored one a story (and a real TinyStories file, one document of millions of words, was
    removed whole by gopher's too_many_words). Curate now splits a text file at <|endoftext|> as pack does."""
    from cookmind.cli import main as cli_main
    from cookmind.curate.shards import read_jsonl

    stories = [
        "Once upon a time a cat found a hat.\nShe wore it to the park and all the birds laughed.",
        "Tom had a red ball.\nHe threw it over the fence, and a kind old dog brought it back.",
        "The sun went down over the hill.\nA little owl woke up and flew to find its friends.",
    ]
    src = tmp_path / "stories.txt"
    # a separator line after every story; a blank document between two separators is counted as removed
    src.write_text("\n<|endoftext|>\n".join([stories[0], stories[1], "  ", stories[2]]) + "\n<|endoftext|>\n")
    stages = [{"extract": {}}, {"exact_lines": {"num_partitions": 2}}]
    result = run_pipeline(CurateConfig(stages=stages, removed=True), [str(src)], tmp_path / "out", progress=False)
    assert [d["text"] for d in _read_all(tmp_path / "out")] == stories
    extract = json.loads((tmp_path / "out" / "report.json").read_text())["stages"][0]
    assert extract["docs_in"] == 4 and extract["reasons"] == {"no_text": 1}
    removed = [r for p in sorted(result.removed.glob("shard-*")) for r in read_jsonl(p)]
    # a document is named by the line its text starts at; a blank one by the line of the separator that ends it
    assert [r["source"] for r in removed] == [{"file": str(src), "line": 8}]
    counts = []
    for name, given in [("file", src), ("curated", tmp_path / "out")]:
        store = tmp_path / f"store-{name}"
        argv = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(given), "--quiet"]
        assert cli_main([*argv, "--out", str(store)]) == 0
        counts.append(json.loads((store / "meta.json").read_text())["num_documents"])
    assert counts == [3, 3]


def test_records_whose_text_is_in_another_field_are_read_with_text_field_as_pack_reads_them(tmp_path, tok_dir):
    """JSON lines with their text under "body" (pack and tokenizer train read them with --text-field body): curate
    run had no such option and removed every record as no_text, with no word of the field it looked for. Curate run
    now takes --text-field (config key text_field), writes that text as "text" (what pack reads by default), and a
    run that finds records with neither text nor html says which fields they had and how to name the text's."""
    from cookmind.cli import main as cli_main

    texts = ["The cook stirs the soup slowly.", "Bread is baked at dawn by the baker.", "Tea is served at five."]
    src = _jsonl(tmp_path / "in.jsonl", [{"id": i, "body": t, "lang": "en"} for i, t in enumerate(texts)])
    assert cli_main(["curate", "run", "--input", src, "--output", str(tmp_path / "plain"), "--quiet"]) == 0
    report = json.loads((tmp_path / "plain" / "report.json").read_text())
    note = " ".join(report["notes"])
    assert "3 records" in note and "body" in note and "--text-field" in note  # what it found, and the way out
    (tmp_path / "c.yaml").write_text("stages: [extract, exact_lines]\n")
    argv = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", src, "--quiet"]
    assert cli_main([*argv, "--output", str(tmp_path / "out"), "--text-field", "body"]) == 0
    kept = _read_all(tmp_path / "out")
    assert [d["text"] for d in kept] == texts and all("body" not in d and d["lang"] == "en" for d in kept)
    store = tmp_path / "store"
    pack = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(tmp_path / "out"), "--quiet"]
    assert cli_main([*pack, "--out", str(store)]) == 0
    assert json.loads((store / "meta.json").read_text())["num_records"] == 3
    # the field is part of the run: another one is a changed config, refused until --restart
    with pytest.raises(ValueError, match="another config .*--text-field"):
        plain = CurateConfig(stages=[{"extract": {}}, {"exact_lines": {}}])
        run_pipeline(plain, [src], tmp_path / "out", progress=False)
    both = _jsonl(tmp_path / "both.jsonl", [{"text": "a title", "body": "The body of it."}])
    with pytest.raises(ValueError, match=r"both\.jsonl:1: .*'text'.*'body'"):
        run_pipeline(CurateConfig(text_field="body"), [both], tmp_path / "out-both", progress=False)
    strings = tmp_path / "strings.json"  # a string record is a document's text whatever the field, as pack reads it
    strings.write_text(json.dumps(texts))
    result = run_pipeline(CurateConfig(text_field="body"), [str(strings)], tmp_path / "out-str", progress=False)
    assert result.stages[0].docs_in == 3 and result.stages[0].reasons.get("no_text", 0) == 0
    with pytest.raises(ValueError, match="html.*extract.*drop --text-field"):  # taken as text, its tags were kept
        CurateConfig.from_dict({"text_field": "html"})
    num = _jsonl(tmp_path / "num.jsonl", [{"body": 7}])
    with pytest.raises(ValueError, match=r"num\.jsonl:1: field 'body' must be a string, got int"):
        run_pipeline(CurateConfig(text_field="body"), [num], tmp_path / "out-num", progress=False)


def test_gzipped_text_and_html_files_are_read_decompressed_as_pack_reads_them(tmp_path):
    """A `stories.txt.gz` (pack reads it decompressed) was read by curate run as its gzip bytes: one document of
    U+FFFD that langid removed, with a note to re-encode the file as UTF-8; a `page.html.gz` was no HTML to it but
    text, the same bytes. Both are read decompressed now, named on their own or in a folder."""
    stories = ["The little cat slept in the warm sun all day long.", "A boy and his dog walked to the river."]
    page = "<html><body><main><p>" + " ".join(["The soup simmered on the stove."] * 8) + "</p></main></body></html>"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "stories.txt.gz").write_bytes(gzip.compress("\n<|endoftext|>\n".join(stories).encode()))
    (tmp_path / "in" / "page.html.gz").write_bytes(gzip.compress(page.encode()))
    (tmp_path / "page.html").write_text(page)
    stages = [{"extract": {}}]
    named = [str(tmp_path / "in" / n) for n in ("stories.txt.gz", "page.html.gz")]
    run_pipeline(CurateConfig(stages=stages), named, tmp_path / "named", progress=False)
    run_pipeline(CurateConfig(stages=stages), [str(tmp_path / "in")], tmp_path / "folder", progress=False)
    run_pipeline(CurateConfig(stages=stages), [str(tmp_path / "page.html")], tmp_path / "plain", progress=False)
    (plain,) = [d["text"] for d in _read_all(tmp_path / "plain")]
    assert plain.startswith("The soup simmered")
    for out in ("named", "folder"):
        texts = sorted(d["text"] for d in _read_all(tmp_path / out))
        assert texts == sorted([*stories, plain]), out
        report = json.loads((tmp_path / out / "report.json").read_text())
        assert "invalid_utf8_docs" not in report["stages"][0]["counters"], out


def test_a_parquet_row_is_numbered_as_pack_tokenizer_train_and_eval_ppl_number_it(tmp_path, tok_dir, capsys):
    """The same bad Parquet row was "in.parquet: row 1" to pack, tokenizer train and eval ppl (rows numbered from 1,
    as lines and a JSON array's records are) and "in.parquet row 0" to curate run (from 0): after curate's error a
    user fixed the row before the bad one. Curate numbers rows from 1 too, in its errors and in the removed
    documents' source."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from cookmind.cli import main as cli_main
    from cookmind.curate.shards import read_jsonl

    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": [3, 4]}), bad)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: row 1: field 'text' must be a string, got int"):
        run_pipeline(CurateConfig(stages=LIGHT), [str(bad)], tmp_path / "out-bad", progress=False)
    pack = ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(bad), "--quiet"]
    assert cli_main([*pack, "--out", str(tmp_path / "store")]) == 2
    assert f"{bad}: row 1: field 'text' must be a string, got int" in capsys.readouterr().err
    good = "Simmer the stock with onions, carrots and a bay leaf for two hours, then strain it and season it well."
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [good, "too short", good + " Again, with more."]}), src)
    stages = [{"extract": {}}, {"gopher": {"min_words": 5}}]
    result = run_pipeline(CurateConfig(stages=stages, removed=True), [str(src)], tmp_path / "out", progress=False)
    removed = [r for p in sorted(result.removed.glob("shard-*")) for r in read_jsonl(p)]
    assert [r["source"] for r in removed] == [{"file": str(src), "row": 2}]  # "too short", the second row


def test_text_field_a_record_lacks_is_named_missing_with_the_fields_it_has(tmp_path, capsys):
    """`curate run --text-field body` over records holding only "text" said the record held a 'text' field "beside"
    'body', which it did not hold: the message now says 'body' is missing, names the fields the record has and the
    flag that reads its text."""
    from cookmind.cli import main as cli_main

    src = _jsonl(tmp_path / "in.jsonl", [{"text": "The soup is hot.", "lang": "en"}])
    argv = ["curate", "run", "--input", src, "--output", str(tmp_path / "out"), "--text-field", "body", "--quiet"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{src}:1: " in err and "no 'body' field" in err and "beside" not in err, err
    assert "'text', 'lang'" in err and "--text-field text" in err, err


def test_curate_crawl_takes_quiet_as_the_other_curate_commands(tmp_path, capsys):
    """`curate run`, `dedup`, `demo` and `train-classifier` take --quiet; `curate crawl --quiet` was refused as an
    unrecognized argument. It silences what theirs does, progress bars: the manifest still prints."""
    from cookmind.cli import main

    argv = ["curate", "crawl", "--num-pages", "12", "--shards", "2", "--seed", "3"]
    assert main([*argv, "--output", str(tmp_path / "a")]) == 0
    loud = capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "b"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "crawl: write shards: 100% 12/12" in loud.err
    assert out == loud.out and sum(json.loads(out)["kinds"].values()) == 12
    for name in ("crawl-00000.jsonl.gz", "crawl-00001.jsonl.gz"):  # the same crawl: pages 0, 2, .. and 1, 3, ..
        rows = gzip.decompress((tmp_path / "b" / name).read_bytes()).decode().splitlines()
        assert rows == gzip.decompress((tmp_path / "a" / name).read_bytes()).decode().splitlines() and len(rows) == 6


def test_the_flag_a_failed_first_shard_names_runs_in_the_same_output(tmp_path, capsys):
    """`curate run --text-field body` failed on a record without 'body' and said to use --text-field text, but that
    rerun was refused: the failed run's _work/run.json held text_field body ("holds a run with another config"). A
    run that fails before any shard is done keeps no work folder, so the rerun the message names runs."""
    from cookmind.cli import main as cli_main

    src = _jsonl(tmp_path / "in.jsonl", [{"text": "The soup is hot.", "lang": "en"}])
    out = tmp_path / "out"
    argv = ["curate", "run", "--input", src, "--output", str(out), "--quiet"]
    assert cli_main([*argv, "--text-field", "body"]) == 2
    assert "--text-field text" in capsys.readouterr().err
    assert not (out / "_work").exists()
    assert cli_main([*argv, "--text-field", "text"]) == 0, capsys.readouterr().err
    assert (out / "shard-00000.jsonl.gz").is_file()
