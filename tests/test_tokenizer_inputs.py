"""`tokenizer train` reads what `pack` reads: curate's output (gzip JSON lines, its folder), JSON lines with a
--text-field, gzip text (issue #17.12); the documents' text is learned, not the JSON around it."""

from __future__ import annotations

import gzip
import itertools
import json
import re

import pytest

from cookmind.cli import main as cli_main
from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, GPT2_PATTERN, Tokenizer, train_bpe


def _reference(tmp_path, docs, vocab_size=300):
    """The tokenizer trained on the documents written as a plain text file, one <|endoftext|> between them."""
    ref = tmp_path / "reference.txt"
    ref.write_text("<|endoftext|>".join(docs), encoding="utf-8")
    vocab, merges = train_bpe(ref, vocab_size, DEFAULT_SPECIAL_TOKENS, workers=1, progress=False)
    return Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).fingerprint()


def _train(tmp_path, out, *inputs, extra=()):
    return cli_main(
        [
            "tokenizer",
            "train",
            "--input",
            *map(str, inputs),
            "--vocab-size",
            "300",
            "--out",
            str(out),
            "--workers",
            "1",
            "--quiet",  # its bars go into a pipe too: these tests read stderr for the error and summary lines
            *extra,
        ]
    )


def test_trains_on_a_curate_run_output_folder_and_its_shards(tmp_path, capsys):
    assert cli_main(["curate", "crawl", "--output", str(tmp_path / "crawl"), "--num-pages", "40", "--shards", "2"]) == 0
    assert (
        cli_main(
            [
                "curate",
                "run",
                "--input",
                str(tmp_path / "crawl"),
                "--output",
                str(tmp_path / "cur"),
                "--workers",
                "1",
                "--quiet",
            ]
        )
        == 0
    )
    shards = sorted((tmp_path / "cur").glob("shard-*.jsonl.gz"))
    docs = [json.loads(line)["text"] for s in shards for line in gzip.decompress(s.read_bytes()).decode().splitlines()]
    assert len(docs) > 3
    expect = _reference(tmp_path, docs)
    capsys.readouterr()
    assert _train(tmp_path, tmp_path / "tok_folder", tmp_path / "cur") == 0, capsys.readouterr().err
    assert Tokenizer.load(tmp_path / "tok_folder").fingerprint() == expect
    assert _train(tmp_path, tmp_path / "tok_shards", *shards) == 0, capsys.readouterr().err
    assert Tokenizer.load(tmp_path / "tok_shards").fingerprint() == expect


def test_jsonl_text_field_and_gzip_text(tmp_path, capsys):
    docs = [
        "The cook stirs the soup\nand tastes it.",
        "Tom has 3 apples; he eats 1. How many are left?",
        "Soup, bread and tea: the cook's supper.",
    ] * 5
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"id": i, "content": d}) + "\n" for i, d in enumerate(docs)))
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress("<|endoftext|>".join(docs).encode()))
    expect = _reference(tmp_path, docs * 2)
    assert (
        _train(
            tmp_path, tmp_path / "tok", tmp_path / "a.jsonl", tmp_path / "b.txt.gz", extra=["--text-field", "content"]
        )
        == 0
    ), capsys.readouterr().err
    assert Tokenizer.load(tmp_path / "tok").fingerprint() == expect
    # without --text-field the default "text" is missing: a one-line error naming file:line and the option
    capsys.readouterr()
    assert _train(tmp_path, tmp_path / "tok2", tmp_path / "a.jsonl") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{tmp_path / 'a.jsonl'}:1:" in err and "--text-field" in err
    assert not (tmp_path / "tok2").exists()


@pytest.mark.parametrize("policy", ["strict", "replace"])
def test_bad_utf8_in_a_json_line(tmp_path, capsys, policy):
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "good soup"}\n{"text": "bad \xff soup"}\n')
    rc = _train(tmp_path, tmp_path / "tok", tmp_path / "a.jsonl", extra=["--utf8-errors", policy])
    if policy == "strict":
        assert rc == 2 and f"{tmp_path / 'a.jsonl'}:2: invalid UTF-8" in capsys.readouterr().err
    else:
        assert rc == 0
        assert Tokenizer.load(tmp_path / "tok").fingerprint() == _reference(tmp_path, ["good soup", "bad \ufffd soup"])


def test_skip_bad_leaves_bad_records_out_and_says_how_many(tmp_path, capsys):
    """Bad JSON lines (broken JSON, no text field, a number for text, bad UTF-8) stop the run with a one-line error
    at the first (file:line, and --skip-bad named); with --skip-bad the tokenizer equals the one trained on the good
    records alone, and the JSON line and a stderr line say how many were skipped, by reason, and where the first
    was. When every record is bad the run fails saying so, not that the corpus is empty."""
    good = [f"The cook adds {i} cups of soup to the pot." for i in range(30)]
    lines = [json.dumps({"text": d}).encode() for d in good]
    lines[3:3] = [b"{broken", json.dumps({"title": "no text"}).encode(), json.dumps({"text": 5}).encode()]
    lines.append(b'{"text": "bad \xff soup"}')
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    src = str(tmp_path / "a.jsonl")
    assert _train(tmp_path, tmp_path / "tok0", tmp_path / "a.jsonl") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{src}:4: invalid JSON" in err and "--skip-bad" in err
    assert not (tmp_path / "tok0").exists()
    assert _train(tmp_path, tmp_path / "tok", tmp_path / "a.jsonl", extra=["--skip-bad"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["skipped"] == 4
    assert Tokenizer.load(tmp_path / "tok").fingerprint() == _reference(tmp_path, good)
    line = err.strip().splitlines()[-1]
    assert "skipped 4 bad record(s)" in line and "invalid JSON 1" in line and "missing field 1" in line
    assert "invalid UTF-8 1" in line and f"the first: {src}:4: invalid JSON" in line
    (tmp_path / "bad.jsonl").write_text('{broken\n{"title": "x"}\n')
    assert _train(tmp_path, tmp_path / "tok2", tmp_path / "bad.jsonl", extra=["--skip-bad"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no record of" in err and "skipped 2 bad record(s)" in err
    assert "['" not in err  # the inputs named as paths, not as a Python list


def test_record_batches_spread_over_workers_count_the_same(tmp_path):
    docs = [f"Batch {i}: the cook adds {i} cups of soup to the pot." for i in range(40)]
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps({"text": d}) + "\n" for d in docs).encode()))
    vocab, merges = train_bpe(
        tmp_path / "a.jsonl.gz", 300, DEFAULT_SPECIAL_TOKENS, workers=2, chunk_bytes=200, progress=False
    )  # about 10 batches in waves of 4
    assert Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).fingerprint() == _reference(tmp_path, docs)


def test_the_data_stages_do_not_import_torch(tmp_path):
    """`curate`, `tokenizer train` and `pack` (both formats) never need torch, and importing it takes 2.5 s of a
    2-core machine (the BPE benchmark's 12 MB corpus trains in about as long): reading inputs through
    cookmind.store.sources imported the whole store package, and the store factory imported the ``.h5`` reader,
    torch with both. The user's path, in a fresh interpreter where nothing else has imported torch yet: a crawl,
    curated, a tokenizer trained on the curated folder, stores packed from it."""
    import subprocess
    import sys

    crawl, curated, tok = (str(tmp_path / name) for name in ("crawl", "curated", "tok"))
    code = (
        "import sys\n"
        "from cookmind.cli import main\n"
        "def check(stage, status):\n"
        "    assert status in (0, None), (stage, status)\n"
        "    print(f'after {stage}, torch imported:', 'torch' in sys.modules)\n"
        f"check('curate crawl', main(['curate', 'crawl', '--output', {crawl!r}, '--num-pages', '60', "
        "'--shards', '1']))\n"
        f"check('curate run', main(['curate', 'run', '--input', {crawl!r}, '--output', {curated!r}, '--quiet', "
        "'--workers', '1']))\n"
        f"check('tokenizer train', main(['tokenizer', 'train', '--input', {curated!r}, '--vocab-size', '300', "
        f"'--out', {tok!r}, '--workers', '1']))\n"
        "for fmt in ('bin', 'h5'):\n"
        f"    check('pack ' + fmt, main(['pack', '--tokenizer', {tok!r}, '--train-type', 'seq', "
        f"'--input', {curated!r}, '--out', {str(tmp_path)!r} + '/store-' + fmt, '--format', fmt, '--quiet', "
        "'--workers', '1']))\n"
        # a grpo pack too: its prompt templates and its check of reference answers are read without torch
        f'open({str(tmp_path / "p.jsonl")!r}, \'w\').write(\'{{"question": "2+3?", "answer": "#### 5"}}\\n\')\n'
        f"check('pack grpo', main(['pack', '--tokenizer', {tok!r}, '--train-type', 'grpo', '--input', "
        f"{str(tmp_path / 'p.jsonl')!r}, '--out', {str(tmp_path / 'store-grpo')!r}, '--prompt-template', 'plain', "
        "'--quiet']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for stage in ("curate crawl", "curate run", "tokenizer train", "pack bin", "pack h5", "pack grpo"):
        assert f"after {stage}, torch imported: False" in out.stdout, out.stdout + out.stderr
    assert (tmp_path / "tok" / "tokenizer.json").exists()
    assert any((tmp_path / "store-h5").glob("*.h5")), sorted(p.name for p in (tmp_path / "store-h5").iterdir())


def test_train_summary_says_how_many_files_records_and_bytes_it_read(tmp_path, capsys):
    """The JSON line says what training read, so a user can tell a partial read from a whole one: the files (a
    folder counts its shard-* files only), the records with text (JSON lines, gzip text documents; an empty text is
    counted apart), and the bytes of text; all checked against counts made here from the files written."""
    docs = [f"Record {i}: the cook adds {i} cups of soupe \u00e0 l'oignon." for i in range(7)]
    folder = tmp_path / "in"
    folder.mkdir()
    jsonl = [json.dumps({"text": d}, ensure_ascii=i % 2 == 0) for i, d in enumerate(docs)]
    jsonl[2:2] = ["", json.dumps({"text": ""})]  # a blank line (no record) and a record with empty text
    (folder / "shard-00000.jsonl").write_text("\n".join(jsonl) + "\n", encoding="utf-8")
    gz_docs = ["Bread and tea.", "The soup is hot \u2014 wait."]
    (folder / "shard-00001.txt.gz").write_bytes(gzip.compress("<|endoftext|>".join(gz_docs).encode()))
    (folder / "notes.jsonl").write_text(json.dumps({"text": "not a shard: not read"}) + "\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("A plain text file.\nIt is read whole.<|endoftext|>Second document.\n", encoding="utf-8")
    assert _train(tmp_path, tmp_path / "tok", folder, plain) == 0, capsys.readouterr().err
    read = json.loads(capsys.readouterr().out)["read"]
    text_bytes = sum(len(d.encode()) for d in docs + gz_docs) + len(plain.read_bytes())
    assert read == {
        "files": 3,
        "records": len(docs) + len(gz_docs),
        "empty_records": 1,
        "text_files": 1,
        "text_lines": 2,
        "text_bytes": text_bytes,
    }


def test_lone_surrogates_in_json_text_train_as_u_fffd_and_are_counted(tmp_path, capsys):
    """JSON text may spell a lone surrogate ("\\ud800"), which no UTF-8 can hold: pack encodes it as U+FFFD (as
    tiktoken does), but tokenizer train ended, after reading every file, in "'utf-8' codec can't encode character
    '\\ud800' ... surrogates not allowed", naming no file. It now learns U+FFFD there (the tokenizer trained on the
    same text with U+FFFD written in) and says how many it read so."""
    docs = ["The cook \ud800 adds salt \ud800.", "Stir \udfff twice, then \ud800\ud800 serve."]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    assert _train(tmp_path, tmp_path / "tok", tmp_path / "d.jsonl") == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert json.loads(out)["read"]["lone_surrogates"] == 5
    assert "5 lone surrogate" in err and "U+FFFD" in err, err
    written = [re.sub("[\ud800-\udfff]", "\ufffd", d) for d in docs]
    assert Tokenizer.load(tmp_path / "tok").fingerprint() == _reference(tmp_path, written)


@pytest.mark.parametrize("workers", [1, 3])
def test_a_plain_text_input_is_reported_by_its_lines_not_as_no_records(tmp_path, capsys, workers):
    """`tokenizer train` on a plain text file said "records": 0: it reads such a file whole, as text, and counted
    nothing. Now the read counts name what it read: text_files and their text_lines (a last line without its newline
    counted too), in every byte range the file is cut into; records appear only where JSON or Parquet records (or
    gzip text documents) were read."""
    from cookmind.tokenizer.pretokenize import ReadCounts, count_pretokens

    lines = [f"Line {i}: the cook adds {i} cups of soup." for i in range(40)]
    a = tmp_path / "a.txt"
    a.write_text("\n".join(lines) + "\n")
    b = tmp_path / "b.txt"
    b.write_text("One more line\nand a last one without its newline")
    read = ReadCounts()
    count_pretokens([a, b], GPT2_PATTERN, workers=workers, chunk_bytes=100, read=read)
    assert (read.text_files, read.text_lines) == (2, len(lines) + 2)
    assert _train(tmp_path, tmp_path / "tok", a) == 0, capsys.readouterr().err
    said = json.loads(capsys.readouterr().out)["read"]
    assert said == {"files": 1, "text_files": 1, "text_lines": len(lines), "text_bytes": len(a.read_bytes())}


def test_utf8_errors_replace_counts_and_warns_of_what_it_replaced(tmp_path, capsys):
    """`tokenizer train --utf8-errors replace` learned from bad bytes read as U+FFFD without saying how many. It now
    counts the files, lines and bytes replaced, warns with the first file:line, and its summary's "read" records
    them, whether a plain text file's byte ranges were read in worker processes, beside this one, or here, and a
    JSON line's in this process."""
    plain = tmp_path / "plain.txt"  # lines 31 (0xe9, 0xe8) and 52 (0xff 0xff): 4 bytes on 2 lines
    good = [b"the soup is hot and good\n"] * 30
    plain.write_bytes(b"".join([*good, b"caf\xe9 cr\xe8me\n", *good[:20], b"\xff\xff end\n", *good[:10]]))
    lines = tmp_path / "b.jsonl"  # line 2: 0xff, 1 byte
    lines.write_bytes(b'{"text": "ok soup"}\n{"text": "bad \xff soup"}\n')
    runs = [  # --chunk-mb 0.0002: ranges of about 210 bytes, so the bad bytes lie in later ones
        ([plain, lines], "2", {"files": 2, "lines": 3, "bytes": 5, "first": f"{plain}:31"}),  # a pool of workers
        ([plain], "2", {"files": 1, "lines": 2, "bytes": 4, "first": f"{plain}:31"}),  # one worker beside this
        ([lines, plain], "1", {"files": 2, "lines": 3, "bytes": 5, "first": f"{lines}:2"}),  # here
    ]
    for i, (inputs, workers, want) in enumerate(runs):
        extra = ["--utf8-errors", "replace", "--workers", workers, "--chunk-mb", "0.0002"]
        n = f"{want['files']} input file(s) held such bytes: {want['bytes']} bytes on {want['lines']} lines"
        with pytest.warns(UserWarning, match=re.escape(f"{want['first']}: invalid UTF-8, read as U+FFFD ({n})")):
            assert _train(tmp_path, tmp_path / f"tok{i}", *inputs, extra=extra) == 0
        assert json.loads(capsys.readouterr().out)["read"]["invalid_utf8"] == want


def _bad_utf8_by_line(data: bytes) -> tuple[int, int, int]:
    """(lines holding bytes that are not UTF-8, those bytes, the first such line), found line by line with the
    strict decoder: the whole-file reference a count over byte ranges must equal."""
    lines = n_bytes = first = 0
    for n, raw in enumerate(data.split(b"\n"), 1):
        bad, pos = 0, 0
        while True:  # each error's span is what "replace" reads as one U+FFFD
            try:
                raw[pos:].decode("utf-8")
                break
            except UnicodeDecodeError as exc:
                bad, pos = bad + exc.end - exc.start, pos + exc.end
        if bad:
            lines, n_bytes, first = lines + 1, n_bytes + bad, first or n
    return lines, n_bytes, first


def test_utf8_errors_replace_counts_a_line_at_a_range_cut_once(tmp_path):
    """A plain text file is counted in byte ranges (by worker processes and this one), each range's bad lines
    added up: a line cut in two, with bad bytes on both sides of the cut, would be counted twice, and a UTF-8
    sequence cut in two would count its bytes as bad. It is neither: a cut falls only before a newline (or CRLF)
    that follows a safe ASCII byte (chunk_file), so a bad line's bytes lie in one range, and the lines, bytes and
    first line equal the file's own, read line by line. Ranges of 2 bytes put a cut at the end of every bad line,
    the nearest a cut comes to one."""
    from cookmind.tokenizer.pretokenize import ReadCounts, chunk_file, count_pretokens

    good = b"the soup is hot.\n"
    bad_lines = [
        b"caf\xe9 cr\xe8me.\n",  # bad bytes inside the line, a safe byte before its newline
        b"\xff\xfe x\r\n",  # a CRLF line: cut before its "\r"
        b"na\xefve \xe2\x82\xac \xe2\x82!\n",  # a valid euro sign, and a cut-off one by the cut
        b"\x80 starts the range.\n",  # a bad byte right after the range's opening newline
        b"\xc3\xa9t\xc3\xa9 \xe9\xc3\xa9.\n",  # valid two-byte characters on both sides of a bad byte
    ]
    path = tmp_path / "bad.txt"
    path.write_bytes(b"".join(itertools.chain.from_iterable((good, line) for line in bad_lines)) + good)
    data = path.read_bytes()
    ends = {data.index(line) + len(line.rstrip(b"\r\n")) for line in bad_lines}
    cuts = {end for _, end in chunk_file(str(path), 2, DEFAULT_SPECIAL_TOKENS, GPT2_PATTERN)}
    assert ends <= cuts  # every bad line ends at a cut
    lines, n_bytes, first = _bad_utf8_by_line(data)
    assert (lines, n_bytes, first) == (5, 9, 2)  # the reference itself, counted by hand: 2 + 2 + 3 + 1 + 1 bytes
    says = f"{path}:{first}: invalid UTF-8, read as U+FFFD (1 input file(s) held such bytes: {n_bytes} bytes on "
    replace = {"utf8_errors": "replace", "progress": False}
    # counted here only; then by the pool path (on a file this small this process may count every range before
    # its worker starts: the ranges are counted by the same function either way)
    for workers in (1, 2):
        read = ReadCounts()
        with pytest.warns(UserWarning, match=re.escape(f"{says}{lines} lines)")):
            count_pretokens(path, GPT2_PATTERN, workers=workers, chunk_bytes=2, **replace, read=read)
        assert read.invalid_utf8.as_meta() == {"files": 1, "lines": lines, "bytes": n_bytes, "first": f"{path}:{first}"}


def test_an_error_while_counting_beside_a_pool_stops_the_pool_at_once(tmp_path):
    """The counting loop's own error (here, on its first count; a Ctrl-C lands there too) stopped the pool only
    once the traceback was freed: with COOKMIND_DEBUG=1, which keeps it, only at exit, by the Pool's own terminate,
    which can hang. Its workers are gone while the error is still held."""
    import multiprocessing
    import threading

    from cookmind.tokenizer.pretokenize import ReadCounts, count_pretokens

    class FailsOnFirstCount(ReadCounts):
        @property
        def text_bytes(self):
            return 0

        @text_bytes.setter
        def text_bytes(self, n):
            if n:
                raise RuntimeError("the loop's own error")

    path = tmp_path / "in.txt"
    path.write_text("the soup is hot and the bread is fresh.\n" * 20_000)  # 800 KB: 8 ranges of 100 KB
    with pytest.raises(RuntimeError, match="the loop's own error") as held:
        count_pretokens(
            path,
            GPT2_PATTERN,
            workers=2,
            chunk_bytes=100_000,
            read=FailsOnFirstCount(),
            progress=False,
        )
    assert held.value.__traceback__ is not None  # held, as COOKMIND_DEBUG=1 holds it
    # the pool was starting (in a thread) or had started: neither is left
    assert [t.name for t in threading.enumerate() if t.name == "count-pool-start"] == []
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("how", ["separator", "one_per_line"])
def test_train_splits_a_text_file_where_pack_does_with_separator_or_one_per_line(tmp_path, capsys, how):
    # pack --separator S or --one-per-line cut a text file's documents there; tokenizer train had neither flag and
    # learned the separator's text (or the newlines) as text: merges pack's documents never hold
    docs = ["The cook stirs the soup.", "Tom has 3 apples.", "Soup, bread and tea: supper."] * 4
    sep = "\n<doc>\n" if how == "separator" else "\n"
    (tmp_path / "a.txt").write_text(sep.join(docs), encoding="utf-8")
    extra = ["--separator", "<doc>"] if how == "separator" else ["--one-per-line"]
    assert _train(tmp_path, tmp_path / "tok", tmp_path / "a.txt", extra=extra) == 0, capsys.readouterr().err
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    assert _train(tmp_path, tmp_path / "ref", tmp_path / "docs.jsonl") == 0, capsys.readouterr().err
    assert Tokenizer.load(tmp_path / "tok").fingerprint() == Tokenizer.load(tmp_path / "ref").fingerprint()
    # as pack, a flag for plain text files given with none is refused, in one line naming it
    capsys.readouterr()
    assert _train(tmp_path, tmp_path / "tok2", tmp_path / "docs.jsonl", extra=extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and extra[0] in err and "no input is plain text" in err


def test_chat_pair_and_problem_records_train_on_their_texts_each_a_document(tmp_path, capsys):
    """`tokenizer train --input gsm8k/train.jsonl` stopped at line 1 ("missing field 'text' ... it looks like sft
    data"), with no way to learn the text of the chats the user then packs with the same tokenizer. Now a record
    without the text field that holds a chat, a pair or a problem is learned from each of its texts as its own
    document (a reply's leading <think> block as its reasoning, the tags being chat tokens), and counted: the
    tokenizer equals the one trained on those texts, written by hand here, as a plain text file's documents."""
    records = [
        {"question": "Tom has 5 apples. He buys 3 more.", "answer": "5 + 3 = 8\n#### 8"},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a soup."},
                {"role": "assistant", "content": "<think>\nonions are cheap\n</think>\n\nOnion soup."},
            ]
        },
        {"prompt": "Say hi", "chosen": "Hi there!", "rejected": "Go away."},
        {"prompt": "What is 2+3?", "response": "It is 5.", "reward": 1.0},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Parts of a message."}]}]},
        {"text": "A plain document beside them."},
    ]
    expected = [
        "Tom has 5 apples. He buys 3 more.",
        "5 + 3 = 8\n#### 8",
        "Be brief.",
        "Name a soup.",
        "onions are cheap",
        "Onion soup.",
        "Say hi",
        "Hi there!",
        "Go away.",
        "What is 2+3?",
        "It is 5.",
        "Parts of a message.",
        "A plain document beside them.",
    ]
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    assert _train(tmp_path, tmp_path / "tok", data) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    read = json.loads(captured.out)["read"]
    assert (read["records"], read["chat_records"]) == (6, 5)
    assert read["text_bytes"] == sum(len(t.encode()) for t in expected)
    assert "5 record(s) held a chat, a preference pair or an RL problem" in captured.err
    assert Tokenizer.load(tmp_path / "tok").fingerprint() == _reference(tmp_path, expected)


def test_a_chat_record_with_a_field_of_another_type_is_an_error_naming_it(tmp_path, capsys):
    data = tmp_path / "chats.jsonl"
    data.write_text(json.dumps({"question": "Hi?", "answer": 7}) + "\n", encoding="utf-8")
    assert _train(tmp_path, tmp_path / "tok", data) == 2
    err = capsys.readouterr().err
    assert "chats.jsonl:1: field 'answer': expected text or a list of messages, got int" in err, err
