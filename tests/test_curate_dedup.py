"""Exact-line and MinHash dedup against naive counts, true Jaccard and datasketch."""

from __future__ import annotations

import json
import random
import warnings
from collections import Counter

import numpy as np
import pytest
import xxhash

from cookmind.curate import exact_line_dedup, minhash_dedup
from cookmind.curate.minhash import UnionFind, jaccard, permutations, shingles, signature

WORDS = (
    "salt pepper onion garlic butter flour sugar lemon thyme basil carrot celery potato tomato rice bean "
    "pan pot oven knife spoon bowl plate cup stir fold bake roast boil fry chop slice taste serve rest "
    "morning evening winter summer market garden kitchen table window friend mother father child"
).split()


def _doc(rng: random.Random, n: int = 120) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _edit(text: str, rng: random.Random, k: int) -> str:
    words = text.split()
    for _ in range(k):
        words[rng.randrange(len(words))] = "EDITED"
    return " ".join(words)


def test_exact_line_dedup_matches_naive_count(tmp_path):
    rng = random.Random(0)
    pool = [f"line {i} about {rng.choice(WORDS)}" for i in range(30)]
    docs = [
        "\n".join(rng.choice(pool) if rng.random() < 0.5 else f"unique {d}-{j} {_doc(rng, 5)}" for j in range(12))
        for d in range(8)
    ]
    paths = []
    for i, d in enumerate(docs):
        paths.append(tmp_path / "in" / f"doc{i}.txt")
        paths[-1].parent.mkdir(exist_ok=True)
        paths[-1].write_text(d)
    counts = Counter(line for d in docs for line in d.split("\n"))  # the reference: a plain in-memory count
    out = exact_line_dedup(paths, tmp_path / "out", num_partitions=3)
    assert [p.name for p in out] == [p.name for p in paths]
    for d, p in zip(docs, out):
        expected = [line for line in d.split("\n") if counts[line] == 1]
        assert p.read_text().split("\n") == expected if expected else p.read_text() == ""


def test_shingle_jaccard_is_true_jaccard():
    a, b = "the cat sat on the mat today", "the cat sat on a mat today"
    ga = {tuple(a.split()[i : i + 3]) for i in range(5)}
    gb = {tuple(b.split()[i : i + 3]) for i in range(5)}
    assert jaccard(shingles(a, 3), shingles(b, 3)) == pytest.approx(len(ga & gb) / len(ga | gb))


def test_minhash_shingles_do_not_span_a_separator():
    # the guide says MinHash's n-grams of a text file neither hold an <|endoftext|> separator nor span one; shingles()
    # read it as a space, so a story's last words and the next one's first made shingles that neither story holds
    text = "The cat sat.\n<|endoftext|>\nA dog ran far<|endoftext|>Hi!\n<|endoftext|>\n"
    # by hand, n=3: "the cat sat"; "a dog ran", "dog ran far"; "hi" (fewer words than n: one shingle of them all)
    stories = ["The cat sat.", "A dog ran far", "Hi!"]
    expected = np.unique(np.concatenate([shingles(story, 3) for story in stories]))
    assert [len(shingles(story, 3)) for story in stories] == [1, 2, 1]
    assert np.array_equal(shingles(text, 3, separated=True), expected)
    # the same stories in another order are the same shingles
    assert np.array_equal(shingles("<|endoftext|>".join(reversed(stories)), 3, separated=True), expected)


def test_minhash_estimate_tracks_true_jaccard_like_datasketch():
    from datasketch import MinHash

    rng = random.Random(1)
    a_sig, b_sig = permutations(256, seed=3)
    for k in (2, 8, 20, 40):
        x = _doc(rng, 200)
        y = _edit(x, rng, k)
        sx, sy = shingles(x, 5), shingles(y, 5)
        true = jaccard(sx, sy)
        ours = float(np.mean(signature(sx, a_sig, b_sig) == signature(sy, a_sig, b_sig)))
        mx, my = MinHash(num_perm=256, seed=3), MinHash(num_perm=256, seed=3)
        for i in range(len(x.split()) - 4):
            mx.update(" ".join(x.lower().split()[i : i + 5]).encode())
        for i in range(len(y.split()) - 4):
            my.update(" ".join(y.lower().split()[i : i + 5]).encode())
        ref = mx.jaccard(my)
        # both estimators have standard error sqrt(J(1-J)/256) <= 0.031
        assert abs(ours - true) < 0.1, (k, ours, true)
        assert abs(ref - true) < 0.1, (k, ref, true)


def _datasketch_clusters(texts, threshold, num_perm):
    """Reference: datasketch MinHashLSH candidates, verified with the exact 5-gram Jaccard, union-find."""
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=0.5, num_perm=num_perm)  # generous recall; the exact check decides
    parent = list(range(len(texts)))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    sets = []
    for i, t in enumerate(texts):
        w = t.lower().split()
        grams = {" ".join(w[j : j + 5]) for j in range(len(w) - 4)}
        sets.append(grams)
        m = MinHash(num_perm=num_perm, seed=7)
        for g in grams:
            m.update(g.encode())
        for other in map(int, lsh.query(m)):  # datasketch's candidates, verified by the exact Jaccard
            if len(sets[i] & sets[other]) / len(sets[i] | sets[other]) >= threshold:
                ri, ro = find(i), find(other)
                parent[max(ri, ro)] = min(ri, ro)
        lsh.insert(str(i), m)
    return {i for i in range(len(texts)) if find(i) == i}


def test_minhash_dedup_removes_edited_copies_and_keeps_distinct(tmp_path):
    rng = random.Random(2)
    originals = [_doc(rng, 300) for _ in range(12)]
    texts = list(originals)
    texts.append(originals[0])  # exact copy
    texts.append(_edit(originals[1], rng, 3))  # three words edited: J about 0.9
    texts.append(_edit(originals[1], rng, 2))  # a second near copy of the same page
    texts.append(_edit(originals[2], rng, 80))  # heavily edited: J well below 0.8, must stay
    paths = []
    for i, t in enumerate(texts):
        p = tmp_path / "in" / f"d{i:02d}.txt"
        p.parent.mkdir(exist_ok=True)
        p.write_text(t)
        paths.append(p)
    out = minhash_dedup(
        paths, num_hashes=128, num_bands=16, ngrams=5, jaccard_threshold=0.8, output_dir=tmp_path / "out"
    )
    kept = {int(p.stem[1:]) for p in out}
    assert kept == set(range(12)) | {15}
    assert kept == _datasketch_clusters(texts, 0.8, 128)
    again = minhash_dedup(paths, 128, 16, 5, 0.8, tmp_path / "out2")  # seeded: the same answer
    assert [p.name for p in again] == [p.name for p in out]


def test_minhash_bands_must_divide_hashes(tmp_path):
    p = tmp_path / "a.txt"
    p.write_text("x y z")
    with pytest.raises(ValueError, match="divisible"):
        minhash_dedup([p, p], 100, 16, 5, 0.8, tmp_path / "o")


def test_union_find_joins_transitively_and_keeps_smallest():
    uf = UnionFind(6)
    uf.union(4, 2)
    uf.union(2, 5)
    uf.union(0, 1)
    assert [uf.find(i) for i in range(6)] == [0, 0, 2, 3, 2, 2]


def _naive_remove(text: str, duplicated: set[str]) -> str:
    """Reference for remove_lines: drop the duplicated lines; a blank run that the removal joins to another
    blank run (or to the start or end of the document) goes with them; every other byte stays."""
    body, end = (text[:-1], "\n") if text.endswith("\n") else (text, "")
    lines = body.split("\n")
    out: list[str] = []
    gap = False  # a line was removed since the last kept line
    for line in lines:
        if line.strip() and line.rstrip() in duplicated:
            gap = True
            continue
        if not line.strip() and gap and (not out or not out[-1].strip()):
            continue
        out.append(line)
        gap = False
    if gap:  # the document ended inside a removal: drop the blank lines before it
        while out and not out[-1].strip():
            out.pop()
    return "\n".join(out) + end if out else ""


@pytest.mark.parametrize(
    "text, expected",
    [
        ("keep me\nshared line\n", "keep me\n"),  # the final newline stays
        ("keep me\nalso kept\n", "keep me\nalso kept\n"),  # nothing removed: byte-identical
        ("a para\r\nshared line\r\nend\r\n", "a para\r\nend\r\n"),  # CRLF stays CRLF
        ("  indented\nshared line\n\n\nafter\n", "  indented\n\n\nafter\n"),  # blank runs it did not join stay
        ("p1\n\nshared line\n\np2\n", "p1\n\np2\n"),  # a joined blank run becomes one
        ("shared line\n\np2", "p2"),  # a removed first paragraph takes its gap
        ("p1\n\nshared line", "p1"),  # a removed last paragraph takes its gap
        ("p1\n\nshared line\n", "p1\n"),
        ("p1\r\n\r\nshared line\r\n", "p1\r\n"),
        ("shared line\n", ""),
    ],
)
def test_remove_lines_keeps_every_byte_but_the_removed_lines(text, expected):
    from cookmind.curate.exact_lines import remove_lines

    dup = np.sort(np.array([xxhash.xxh64_intdigest(b"shared line")], dtype=np.uint64))
    got, n, emptied = remove_lines(text, dup)
    assert got == expected == _naive_remove(text, {"shared line"})
    assert n == text.count("shared line") and emptied == (expected == "")


def test_exact_line_dedup_files_keep_final_newline_crlf_and_bytes(tmp_path):
    docs = {
        "a.txt": b"Title A\r\nshared footer\r\n",
        "b.txt": b"Title B\nshared footer\n",
        "c.txt": b"Only mine \xff here\n\n",
        "d.txt": b"no final newline",
    }
    for name, body in docs.items():
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / name).write_bytes(body)
    out = exact_line_dedup(sorted((tmp_path / "in").iterdir()), tmp_path / "out", num_partitions=2)
    got = {p.name: p.read_bytes() for p in out}
    assert got == {
        "a.txt": b"Title A\r\n",
        "b.txt": b"Title B\n",
        "c.txt": b"Only mine \xff here\n\n",
        "d.txt": b"no final newline",
    }


def test_minhash_dedup_copies_kept_files_byte_for_byte(tmp_path):
    (tmp_path / "in").mkdir()
    bodies = [b"first page \xff with\r\nwindows lines and more words here\r\n", b"another page entirely different\n"]
    paths = []
    for i, body in enumerate(bodies):
        paths.append(tmp_path / "in" / f"d{i}.txt")
        paths[-1].write_bytes(body)
    with pytest.warns(UserWarning, match=r"d0\.txt:1: invalid UTF-8"):  # compared as U+FFFD, and said so
        out = minhash_dedup(paths, 64, 8, 3, 0.8, tmp_path / "out")
    assert [p.read_bytes() for p in out] == bodies


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _cli(argv, capsys):
    from cookmind.cli import main

    rc = main(argv)
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if rc == 0 else cap.err)


def _dedup_lines_of_two(tmp_path, capsys, a: str, b: str) -> dict:
    """`curate dedup --method lines` over in/a.txt and in/b.txt holding ``a`` and ``b``, into o/: its summary."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text(a, encoding="utf-8")
    (tmp_path / "in" / "b.txt").write_text(b, encoding="utf-8")
    inputs = [str(tmp_path / "in" / n) for n in ("a.txt", "b.txt")]
    rc, res = _cli(
        ["curate", "dedup", "--method", "lines", "--input", *inputs, "--output", str(tmp_path / "o"), "--quiet"],
        capsys,
    )
    assert rc == 0, res
    return res


def test_dedup_overwrite_replaces_the_earlier_output_whole_and_refuses_the_users_folder(tmp_path, capsys):
    """Run 2 with --overwrite kept only a.txt, yet run 1's c.txt stayed in the folder beside it; and a folder of
    the user's own files was written into silently."""
    rng = random.Random(5)
    text = _doc(rng, 200)
    for folder, c_text in (("in1", _doc(rng, 200)), ("in2", text)):  # in2/c.txt is a copy of in2/a.txt
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.txt").write_text(text)
        (tmp_path / folder / "c.txt").write_text(c_text)
    out = tmp_path / "o1"
    dedup = ["curate", "dedup", "--method", "minhash", "--output", str(out), "--input"]
    rc, res = _cli([*dedup, str(tmp_path / "in1" / "a.txt"), str(tmp_path / "in1" / "c.txt")], capsys)
    assert rc == 0 and res["written"] == 2
    rc, res = _cli([*dedup, str(tmp_path / "in2" / "a.txt"), str(tmp_path / "in2" / "c.txt"), "--overwrite"], capsys)
    assert rc == 0 and res["written"] == 1 and res["docs_removed"] == 1
    assert sorted(p.name for p in out.iterdir()) == [".cookmind-dedup.json", "a.txt"]
    user = tmp_path / "mine"
    user.mkdir()
    (user / "notes.txt").write_text("precious")
    for extra in ([], ["--overwrite"]):
        rc, err = _cli([*dedup[:-3], "--output", str(user), "--input", str(tmp_path / "in1" / "a.txt"), *extra], capsys)
        assert rc == 2 and "holds notes.txt, which no curate dedup wrote" in err and len(err.splitlines()) == 1
    assert _files(user) == {"notes.txt": b"precious"}


@pytest.mark.parametrize("method", ["lines", "minhash"])
def test_a_dedup_that_dies_leaves_no_partial_output_and_the_next_run_clears_its_temporary_folder(
    tmp_path, monkeypatch, method
):
    """Killed mid-way, `dedup --method lines` left 3 of 4 outputs under their final names and a .lines-XXXX scratch
    folder inside --output that even a successful --overwrite rerun kept. Now the folder is built under a temporary
    name: a failure leaves the earlier output as it was, and a dead writer's temporary folder goes on the next run."""
    import subprocess
    import sys

    import cookmind.curate.exact_lines as exact_lines
    import cookmind.curate.minhash as minhash
    from cookmind.atomic import _HOST

    paths = []
    for i in range(4):
        paths.append(tmp_path / "in" / f"d{i}.txt")
        paths[-1].parent.mkdir(exist_ok=True)
        paths[-1].write_text(f"shared line\nunique {i} {_doc(random.Random(i), 50)}\n")
    out = tmp_path / "out"

    def run(**kw):
        if method == "lines":
            return exact_line_dedup(paths, out, num_partitions=2, **kw)
        return minhash_dedup(paths, 64, 8, 3, 0.8, out, **kw)

    run()
    before = _files(out)
    calls = []
    target, name = (exact_lines, "remove_lines") if method == "lines" else (minhash, "_copy_atomic")
    real = getattr(target, name)

    def dies_on_the_third(*args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        run(overwrite=True)
    monkeypatch.undo()
    assert _files(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]
    # what SIGKILL leaves: the temporary folder of a writer that is gone, scratch and all
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out.tmp-{int(dead.stdout)}@{_HOST}"
    (stale / ".lines-abc").mkdir(parents=True)
    (stale / "d0.txt").write_text("half")
    run(overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]
    assert not [p for p in out.iterdir() if p.name.startswith(".lines-")]


def test_dedup_says_how_many_lines_and_documents_it_removed(tmp_path, capsys):
    """a.txt and b.txt identical (30 lines each): 60 of 90 lines go, and the JSON line used to say only "written": 3."""
    (tmp_path / "in").mkdir()
    same = "".join(f"line {i} of the shared text\n" for i in range(30))
    bodies = {"a.txt": same, "b.txt": same, "c.txt": "".join(f"own line {i}\n" for i in range(30))}
    for name, body in bodies.items():
        (tmp_path / "in" / name).write_text(body)
    inputs = [str(tmp_path / "in" / n) for n in bodies]
    rc, res = _cli(
        ["curate", "dedup", "--method", "lines", "--input", *inputs, "--output", str(tmp_path / "o3")], capsys
    )
    assert rc == 0
    assert res["written"] == 3 and res["lines_in"] == 90 and res["lines_removed"] == 60 and res["lines_out"] == 30
    assert res["files_emptied"] == 2
    rc, res = _cli(
        ["curate", "dedup", "--method", "minhash", "--input", *inputs, "--output", str(tmp_path / "o4")], capsys
    )
    assert rc == 0 and (res["docs_in"], res["docs_kept"], res["docs_removed"]) == (3, 2, 1)


@pytest.mark.parametrize("method", ["minhash", "lines"])
def test_curate_dedup_shows_progress_over_the_files_and_quiet_hides_it(tmp_path, capsys, method):
    """`cookmind curate dedup` printed nothing until its summary (2,030 files: 10 s of silence on a shared 2-core
    machine; minutes at 100k files). It shows a bar counting the input files, as curate run and pack do."""
    from cookmind.cli import main

    docs = [tmp_path / f"d{i}.txt" for i in range(7)]
    for i, p in enumerate(docs):
        p.write_text(f"document {i % 3} line one\nshared line\n", encoding="utf-8")
    argv = ["curate", "dedup", "--method", method, "--input", *map(str, docs)]
    assert main([*argv, "--output", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert f"dedup {method}" in err and "7/7" in err
    assert main([*argv, "--output", str(tmp_path / "quiet"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_minhash_dedup_counts_and_warns_of_bytes_that_are_not_utf8(tmp_path, capsys):
    """The files were decoded with U+FFFD for bad bytes without a word: the record and the command's JSON line count
    the files, lines and bytes (as curate run's report does), and a warning names the first file:line."""
    (tmp_path / "in").mkdir()
    bodies = {
        "a.txt": "first words, all UTF-8: caf\u00e9\n".encode(),
        # 4 bad bytes on lines 2 and 4: \xe9, \xef (a lead byte before 'v'), then \xff \xfe
        "b.txt": b"one line\ncaf\xe9 and na\xefve\nfine\n\xff\xfe end\n",
        "c.txt": b"\xe0 la carte, a different menu\n",  # 1 bad byte on line 1
    }
    for name, body in bodies.items():
        (tmp_path / "in" / name).write_bytes(body)
    inputs = [str(tmp_path / "in" / n) for n in bodies]
    argv = ["curate", "dedup", "--method", "minhash", "--input", *inputs, "--output", str(tmp_path / "o"), "--quiet"]
    with pytest.warns(
        UserWarning,
        match=r"b\.txt:2: invalid UTF-8, read as U\+FFFD \(2 input file\(s\) held such "
        r"bytes: 5 bytes on 3 lines\); re-encode",
    ) as caught:
        rc, res = _cli(argv, capsys)
    assert rc == 0 and len([w for w in caught if "UTF-8" in str(w.message)]) == 1
    assert (res["invalid_utf8_docs"], res["invalid_utf8_lines"], res["invalid_utf8_bytes"]) == (2, 3, 5)
    assert res["invalid_utf8_first"].endswith("b.txt:2") and res["docs_kept"] == 3
    assert (tmp_path / "o" / "b.txt").read_bytes() == bodies["b.txt"]  # kept files are still copied byte for byte
    # all UTF-8: nothing counted, nothing said
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc, res = _cli(argv[:5] + inputs[:1] + ["--output", str(tmp_path / "o2"), "--quiet"], capsys)
    assert rc == 0 and not any(k.startswith("invalid_utf8") for k in res)


def test_exact_line_dedup_of_gzipped_text_files_reads_and_writes_them_compressed(tmp_path):
    """`curate dedup --method lines --input a.txt.gz b.txt.gz` hashed the gzip bytes' "lines": a line both files
    share stayed in both, the counts were of binary lines (78 "lines" in 200 of text), and a removed binary line
    would have written a broken .gz. The files are read decompressed now (as curate run and pack read them), and
    each is written back gzip-compressed under its own name."""
    import gzip

    shared = "This line is in both files and goes.\n"
    texts = {"a.txt.gz": "Only in a, first.\n" + shared + "Only in a, last.\n", "b.txt.gz": shared + "Only in b.\n"}
    for name, text in texts.items():
        (tmp_path / name).write_bytes(gzip.compress(text.encode()))
    outs = exact_line_dedup([tmp_path / n for n in texts], tmp_path / "out", num_partitions=2)
    got = {p.name: gzip.decompress(p.read_bytes()).decode() for p in outs}
    assert got == {name: text.replace(shared, "") for name, text in texts.items()}
    summary = json.loads((tmp_path / "out" / ".cookmind-dedup.json").read_text())
    assert (summary["lines_in"], summary["lines_removed"]) == (5, 2)


def test_exact_line_dedup_keeps_endoftext_separator_lines(tmp_path, capsys):
    """Two TinyStories-style files, each `<story>\\n<|endoftext|>\\n<story>\\n`: `dedup --method lines` counted the
    separator line (in both files) as a duplicated line and removed it, `lines_removed: 2`, and each file's two
    stories ran together into one document. A separator line is no text line: never counted, shared nor removed."""
    (tmp_path / "in").mkdir()
    bodies = {
        "a.txt": "The cat sat in the sun.\n<|endoftext|>\nThe dog ran to the river.\n",
        "b.txt": "A bird sang on the roof.\n<|endoftext|>\r\nThe cat sat in the sun.\n  <|endoftext|> \nA fish swam.\n",
    }
    for name, body in bodies.items():
        (tmp_path / "in" / name).write_bytes(body.encode())
    inputs = [str(tmp_path / "in" / n) for n in bodies]
    rc, res = _cli(
        ["curate", "dedup", "--method", "lines", "--input", *inputs, "--output", str(tmp_path / "o")], capsys
    )
    assert rc == 0
    # text lines: 2 + 3; only "The cat sat in the sun." is in both files
    assert (res["lines_in"], res["lines_removed"], res["lines_out"], res["files_emptied"]) == (5, 2, 3, 0)
    assert {k: v for k, v in _files(tmp_path / "o").items() if not k.startswith(".")} == {  # each story of one
        "a.txt": b"The dog ran to the river.\n",  # line, the shared one, goes with the separator after it
        "b.txt": b"A bird sang on the roof.\n<|endoftext|>\r\nA fish swam.\n",
    }


def test_a_file_or_record_left_with_only_separator_lines_is_counted_empty(tmp_path, capsys):
    """Once separator lines stayed, two identical story files kept only their <|endoftext|> lines and dedup said
    `files_emptied: 0`; in curate run such a record, its stories all gone, passed min_words_after on its separators
    as words. A separator is no text: such a file is counted emptied, such a record removed as empty."""
    from cookmind.curate.config import CurateConfig
    from cookmind.curate.runner import read_outputs, run_pipeline

    (tmp_path / "in").mkdir()
    same = "The cat sat in the sun.\n<|endoftext|>\nThe dog ran to the river.\n"
    for name in ("a.txt", "b.txt"):
        (tmp_path / "in" / name).write_text(same)
    inputs = [str(tmp_path / "in" / n) for n in ("a.txt", "b.txt")]
    rc, res = _cli(
        ["curate", "dedup", "--method", "lines", "--input", *inputs, "--output", str(tmp_path / "o")], capsys
    )
    assert rc == 0 and (res["lines_in"], res["lines_removed"], res["files_emptied"]) == (4, 4, 2)
    assert (tmp_path / "o" / "a.txt").read_text() == ""  # both stories gone, and the separator between them
    src = tmp_path / "in.jsonl"
    texts = ["One cat slept.\n<|endoftext|>\nTwo dogs ran.", "One cat slept.\n<|endoftext|>\nTwo dogs ran.", "Own."]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    stages = [{"extract": {}}, {"exact_lines": {"num_partitions": 2}}]
    result = run_pipeline(CurateConfig(stages=stages), [str(src)], tmp_path / "out", progress=False)
    assert [d["text"] for d in read_outputs(result.outputs)] == ["Own."]
    assert result.stages[1].reasons == {"empty_after_line_dedup": 2}


def test_dedup_help_says_a_text_file_with_separators_holds_many_documents(capsys):
    """`curate dedup --help` said --input was "text files, one document each": a file of <|endoftext|>-separated
    stories holds one document a story, whose separator lines the lines method keeps; minhash compares files whole."""
    from cookmind.cli import main

    with pytest.raises(SystemExit):
        main(["curate", "dedup", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one document each" not in text and "one document per file" not in text
    assert "a file is one document, or, holding <|endoftext|> lines, the documents between those" in text
    assert "keeping blank and <|endoftext|> separator lines, but a story whose every line goes takes one " in text
    assert "separator with it (counted as documents_emptied)" in text
    assert "each file compared whole as one document" in text
    with pytest.raises(SystemExit):
        main(["curate", "--help"])
    assert "MinHash dedup of whole files" in " ".join(capsys.readouterr().out.split())


SEP = "<|endoftext|>"


@pytest.mark.parametrize(
    "text, expected, emptied",
    [
        (f"A\n{SEP}\nshared line\n{SEP}\nC\n", f"A\n{SEP}\nC\n", 1),  # the separator after it goes too
        (f"shared line\n{SEP}\nB\n", "B\n", 1),  # none left at the start
        (f"A\n{SEP}\nshared line\n", "A\n", 1),  # nor at the end
        (f"A\n{SEP}\nshared line\n{SEP}\n", f"A\n{SEP}\n", 1),  # a file ending each story in one keeps that
        (f"{SEP}\nshared line\n{SEP}\nB", f"{SEP}\nB", 1),  # one starting each story with one keeps that
        (f"A\n\n{SEP}\n\nshared line\nshared line\n\n{SEP}\n\nC\n", f"A\n\n{SEP}\n\nC\n", 1),
        (f"A\r\n{SEP}\r\nshared line\r\n  {SEP} \r\nC\r\n", f"A\r\n{SEP}\r\nC\r\n", 1),
        (f"A\n{SEP}\nshared line\n{SEP}\nshared line\n", "A\n", 2),
        (f"shared line\n{SEP}\nshared line\n", "", 2),
        (f"A\nshared line\n{SEP}\nB\n", f"A\n{SEP}\nB\n", 0),  # a story keeping a line keeps its separators
        (f"A\n{SEP}\n{SEP}\nshared line\n", "A\n", 1),  # the input's empty document left last goes too
        (f"shared line\n{SEP}\n\n{SEP}\nB\n", "B\n", 1),  # and left first
        (f"A\n{SEP}\n{SEP}\nshared line\n{SEP}\nC", f"A\n{SEP}\n{SEP}\nC", 1),  # between two kept: the input's
        (f"{SEP}\nshared line\n{SEP}\n", "", 1),  # a file of one story, its separators round it: empty
    ],
)
def test_a_story_whose_every_line_is_removed_goes_with_one_separator(text, expected, emptied):
    """Separator lines stayed while every line of a story between them went, leaving an empty document between two
    separators (or a separator at the start or end of the text), and nothing counted it: the story goes whole with
    one separator, and is counted."""
    from cookmind.curate.exact_lines import remove_lines

    dup = np.sort(np.array([xxhash.xxh64_intdigest(b"shared line")], dtype=np.uint64))
    assert remove_lines(text, dup, separated=True) == (expected, text.count("shared line"), emptied)


def test_dedup_lines_collapses_the_stories_it_empties_in_tinystories(tmp_path, capsys, shared_data):
    """The five-story sample beside a file holding its 2nd and 4th stories and one of its own: `dedup --method
    lines` removed those two stories' lines from both files and left their separators, an empty document between
    two of them. Each emptied story goes with one separator; documents_emptied counts the 4."""
    from cookmind.text_input import separated_documents

    sample = (shared_data / "text" / "tinystories_sample.txt").read_text(encoding="utf-8")
    lines = sample.splitlines(keepends=True)  # 0 blank, stories on 1-5, 7-9, 11-13, 15 (blank)-19, 21-23
    assert [i for i, ln in enumerate(lines) if ln.strip() == SEP] == [6, 10, 14, 20, 24] and len(lines) == 25
    stories = [doc for _, doc in separated_documents(sample)]
    assert len(stories) == 5
    own = f"{stories[1]}\n{SEP}\nA small red hen sang.\n{SEP}\n{stories[3]}\n{SEP}\n"
    res = _dedup_lines_of_two(tmp_path, capsys, sample, own)
    out = (tmp_path / "o" / "a.txt").read_text(encoding="utf-8")
    assert out == "".join(lines[0:7] + lines[11:15] + lines[21:25])  # 7-9 with 10's separator, 15-19 with 20's
    assert [doc for _, doc in separated_documents(out)] == [stories[0], stories[2], stories[4]]
    assert (tmp_path / "o" / "b.txt").read_text(encoding="utf-8") == f"A small red hen sang.\n{SEP}\n"
    shared = len(stories[1].splitlines()) + len(stories[3].splitlines())  # 3 + 4 lines, in both files
    assert shared == 7
    assert (res["lines_removed"], res["documents_emptied"], res["files_emptied"]) == (2 * shared, 4, 0)


@pytest.mark.parametrize(
    "text, expected, emptied",
    [
        (f"A\nshared line{SEP}\nB\n", f"A\n{SEP}\nB\n", 0),  # the separator stays, on its own line
        (f"A\n{SEP}shared line\nB{SEP}\nC\n", f"A\n{SEP}\nB{SEP}\nC\n", 0),
        (f"A{SEP}\nshared line{SEP}\nC{SEP}\n", f"A{SEP}\nC{SEP}\n", 1),  # a story emptied takes one separator
        (f"A{SEP}\nshared line{SEP}\n", f"A{SEP}\n", 1),
    ],
)
def test_a_separator_at_the_end_of_a_line_is_no_part_of_the_line(text, expected, emptied):
    """A separator at the end of a text line ("friends.<|endoftext|>"), where pack and curate run's reader end a
    story, was part of the line: a duplicated last line went with its separator, and two stories ran together. The
    line's text is hashed alone, and a removal leaves its separator."""
    from cookmind.curate.exact_lines import line_hashes, remove_lines

    dup = np.sort(np.array([xxhash.xxh64_intdigest(b"shared line")], dtype=np.uint64))
    assert remove_lines(text, dup, separated=True) == (expected, text.count("shared line"), emptied)
    hashes = [xxhash.xxh64_intdigest(t.encode()) for t in ("A", "shared line", "B", "C") if t in text]
    assert sorted(line_hashes(text, separated=True).tolist()) == sorted(hashes)


@pytest.mark.parametrize("text", [f"A\nshared line {SEP} B\n", f"A{SEP}shared line{SEP}C\n"])
def test_a_separator_mid_line_leaves_the_line_one_line_to_dedup(text):
    """Only a separator at a line's start or end is split off: a line holding one mid-sentence is hashed whole, so
    its "shared line" part is no duplicate of a line "shared line", and nothing is removed."""
    from cookmind.curate.exact_lines import line_hashes, remove_lines

    dup = np.sort(np.array([xxhash.xxh64_intdigest(b"shared line")], dtype=np.uint64))
    assert remove_lines(text, dup, separated=True) == (text, 0, 0)
    whole = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    want = sorted(xxhash.xxh64_intdigest(t.encode()) for t in whole)
    assert sorted(line_hashes(text, separated=True).tolist()) == want


def test_dedup_lines_keeps_the_separator_that_ends_a_duplicated_last_line(tmp_path, capsys):
    """Two TinyStories files whose stories end on the same line, the separator right after it: `dedup --method
    lines` removed "They were best friends.<|endoftext|>" whole from both, and each file's first two stories became
    one. The line goes, its separator stays, and the files hold the stories they held."""
    from cookmind.text_input import separated_documents

    a = f"Tom had a red ball.\nThey were best friends.{SEP}\nLily saw a cat.\nThe cat was soft.{SEP}\n"
    b = f"Ben found a shell.\nThey were best friends.{SEP}\nA bird sang.{SEP}\n"
    res = _dedup_lines_of_two(tmp_path, capsys, a, b)
    out_a = (tmp_path / "o" / "a.txt").read_text(encoding="utf-8")
    out_b = (tmp_path / "o" / "b.txt").read_text(encoding="utf-8")
    assert out_a == f"Tom had a red ball.\n{SEP}\nLily saw a cat.\nThe cat was soft.{SEP}\n"
    assert out_b == f"Ben found a shell.\n{SEP}\nA bird sang.{SEP}\n"
    assert [d for _, d in separated_documents(out_b)] == ["Ben found a shell.", "A bird sang."]
    assert (res["lines_in"], res["lines_removed"], res["documents_emptied"]) == (7, 2, 0)


def test_minhash_shingles_read_no_separator_as_a_word():
    """MinHash read each <|endoftext|> of a text file as the word "endoftext": the same stories, joined by
    separators in one file and not in another, shared fewer shingles than their words do. A separator is no word,
    and no shingle spans one (the guide's rule; test_minhash_shingles_do_not_span_a_separator)."""
    stories = np.union1d(shingles("the cat sat", 3), shingles("on the mat", 3))
    assert shingles(f"the cat sat\n{SEP}\non the mat{SEP}", 3, separated=True).tolist() == stories.tolist()
    assert len(stories) == 2  # the cat sat; on the mat


def test_curate_run_exact_lines_counts_a_removed_record_once(tmp_path):
    """A record whose every line was removed counted as empty_after_line_dedup, documents_emptied and docs_edited
    alike. Now a removed record counts once (empty_after_line_dedup), and docs_edited the records that stay with
    lines removed. A line "<|endoftext|>" in a record is a line of text: shared by two records, it goes."""
    from cookmind.curate.config import CurateConfig
    from cookmind.curate.runner import run_pipeline

    texts = [
        f"One cat slept on the mat.\n{SEP}\nTwo dogs ran down the road.",  # keeps its first line: 1 edited
        "Two dogs ran down the road.",  # every line gone: removed
        f"Two dogs ran down the road.\n{SEP}\nTwo dogs ran down the road.",  # all 3 lines gone: removed
        "A lone frog sang.",  # untouched
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    stages = [{"extract": {}}, {"exact_lines": {"num_partitions": 2}}]
    result = run_pipeline(CurateConfig(stages=stages), [str(src)], tmp_path / "out", progress=False)
    stats = result.stages[1]
    assert stats.reasons == {"empty_after_line_dedup": 2}
    assert (stats.counters["lines_removed"], stats.counters["documents_emptied"], stats.counters["docs_edited"]) == (
        2 + 1 + 3,
        0,
        1,
    )


def test_a_line_that_mentions_the_separator_mid_sentence_is_one_line_to_dedup(tmp_path, capsys):
    """Cutting every line at each <|endoftext|> made two different lines that merely mention the token share their
    tail (", which tells the model to stop."), and dedup removed it from both: only a separator at a line's start or
    end is split off (a story's last line, "friends.<|endoftext|>"); a line holding one mid-sentence is one line, and
    the counts count lines."""
    a = f"Docs note.\nA story ends with the special token {SEP}, which tells the model to stop.\nMore words a.\n"
    b = f"Other doc.\nGPT-2 separates documents with {SEP}, which tells the model to stop.\nMore words b.\n"
    res = _dedup_lines_of_two(tmp_path, capsys, a, b)
    assert (res["lines_in"], res["lines_removed"]) == (6, 0), res
    assert (tmp_path / "o" / "a.txt").read_text(encoding="utf-8") == a
    assert (tmp_path / "o" / "b.txt").read_text(encoding="utf-8") == b


@pytest.mark.parametrize("method", ["lines", "minhash"])
@pytest.mark.parametrize("name", ["docs.jsonl", "docs.jsonl.gz", "docs.parquet"])
def test_curate_dedup_refuses_record_files_and_names_curate_run(tmp_path, capsys, method, name):
    """curate dedup read any input as plain text: a JSONL file was deduplicated as text lines (a record's JSON line
    is no document's line) and split at an <|endoftext|> inside its records. A JSONL or Parquet input is refused in
    one line naming the file and curate run (whose dedup stages read records as documents); nothing is written."""
    import gzip

    from cookmind.cli import main

    records = tmp_path / name
    body = b'{"text": "one story<|endoftext|>two"}\n{"text": "one story<|endoftext|>two"}\n'
    records.write_bytes(gzip.compress(body) if name.endswith(".gz") else body)  # refused by its name: never read
    (tmp_path / "a.txt").write_text("plain text\n")
    out = tmp_path / "out"
    argv = ["curate", "dedup", "--method", method, "--input", str(tmp_path / "a.txt"), str(records), "--output"]
    assert main([*argv, str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(records) in err and "cookmind curate run" in err, err
    assert not out.exists()
