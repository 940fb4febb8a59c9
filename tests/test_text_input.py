"""cookmind.text_input: a UTF-8 file's lines as Python reads them, bad bytes an error naming file:line:byte."""

from __future__ import annotations

import bz2
import gzip
import lzma

import pytest

from cookmind import text_input

TEXT = "\ufefffirst line\r\nsecond, caf\u00e9\n\nlast without newline"


@pytest.mark.parametrize("gz", [False, True])
def test_lines_are_what_python_reads_with_utf8_sig(tmp_path, gz):
    path = tmp_path / ("t.txt.gz" if gz else "t.txt")
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(TEXT.encode())
    with open(tmp_path / "ref.txt", "wb") as f:
        f.write(TEXT.encode())
    with open(tmp_path / "ref.txt", encoding="utf-8-sig", newline="") as f:
        reference = list(enumerate(f, 1))  # newline="": line ends kept as they are, as bytes split them
    assert list(text_input.utf8_lines(path)) == reference


def test_invalid_utf8_names_the_line_and_byte(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"fine\nalso fine\nca\xe9 au lait\n")
    with pytest.raises(ValueError, match=r"t\.txt:3: invalid UTF-8 at byte 2 of the line"):
        list(text_input.utf8_lines(path))
    assert text_input.first_bad_utf8(path).endswith(
        "t.txt:3: invalid UTF-8 at byte 2 of the line; fix or re-encode the file as UTF-8"
    )


def test_a_whole_file_reads_as_python_decodes_it_and_names_a_bad_byte_by_line(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(TEXT.encode())
    assert text_input.read_utf8(path) == TEXT.encode().decode("utf-8-sig")
    path.write_bytes(b"one\r\ntwo\nthree \xff\n")
    with pytest.raises(ValueError, match=r"t\.txt:3: invalid UTF-8 at byte 6 of the line"):
        text_input.read_utf8(path)


def test_configs_and_eval_sets_with_invalid_utf8_name_the_file_and_line(tmp_path, capsys):
    # each was a bare "'utf-8' codec can't decode byte 0xe9 in position 6" with no file
    from cookmind.cli import main
    from cookmind.curate.decontaminate import iter_eval_items

    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"# a config\nname: caf\xe9\n")
    for argv in (
        ["train", "--config", str(bad)],
        ["curate", "run", "--config", str(bad), "--input", str(bad), "--output", str(tmp_path / "o")],
    ):
        assert main(argv) == 2
        assert "bad.yaml:2: invalid UTF-8 at byte 9 of the line" in capsys.readouterr().err
    for name, body in (("e.json", b'[{"q": "caf\xe9"}]'), ("e.csv", b"q,caf\xe9\n")):
        (tmp_path / name).write_bytes(body)
        with pytest.raises(ValueError, match=rf"{name}:1: invalid UTF-8"):
            list(iter_eval_items(tmp_path / name))
    (tmp_path / "e.json").write_text('[{"q": "a"},\n {"q": ')
    with pytest.raises(ValueError, match=r"e\.json:2: not valid JSON"):
        list(iter_eval_items(tmp_path / "e.json"))


def _cut_gzip(tmp_path):
    """A JSON-lines .gz file cut short (a download that stopped), and a .gz file that holds no gzip data."""
    import json

    whole = gzip.compress("".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(400)).encode())
    cut, fake = tmp_path / "cut.jsonl.gz", tmp_path / "fake.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    fake.write_bytes(b"not gzip at all\n")
    return cut, fake


def test_a_gzip_file_cut_short_or_not_gzip_is_a_value_error_naming_it(tmp_path):
    """Reading a .gz cut short raised EOFError ("Compressed file ended before the end-of-stream marker was reached"),
    which no command's one-line error caught: a traceback from pack, tokenizer train, eval ppl and curate run. A
    .gz that is no gzip said "Not a gzipped file (b'no')" without the file."""
    from cookmind.store.sources import iter_items

    cut, fake = _cut_gzip(tmp_path)
    for path, says in ((cut, "cut.jsonl.gz: the gzip data ends early"), (fake, "fake.jsonl.gz: not gzip data")):
        with pytest.raises(ValueError, match=says):
            list(text_input.utf8_lines(path))
        with pytest.raises(ValueError, match=says):
            list(iter_items(path))


def test_every_command_that_reads_a_cut_gzip_says_so_in_one_line(tmp_path, tok_dir, capsys):
    from cookmind.cli import main

    cut, fake = _cut_gzip(tmp_path)
    for path, says in ((cut, "cut.jsonl.gz: the gzip data ends early"), (fake, "fake.jsonl.gz: not gzip data")):
        for argv in (
            ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--input", str(path), "--out", "s"],
            ["tokenizer", "train", "--input", str(path), "--vocab-size", "300", "--out", "t"],
            ["curate", "run", "--input", str(path), "--output", "c"],
        ):
            argv[-1] = str(tmp_path / f"{argv[0]}-{path.name}")
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            said = [line for line in err.split("\n") if "error" in line]  # progress bars share stderr
            assert "Traceback" not in err and len(said) == 1 and says in said[0], err


@pytest.mark.parametrize(
    "name,data,tool",
    [
        ("held.txt.bz2", bz2.compress(b"Some held-out text, compressed.\n" * 20), "bunzip2"),
        ("held.txt.xz", lzma.compress(b"Some held-out text, compressed.\n" * 20), "unxz"),
        ("held.txt.zst", b"\x28\xb5\x2f\xfd" + bytes(range(40)), "unzstd"),
        ("held.zip", b"PK\x03\x04" + bytes(range(40)), "unzip"),
    ],
)
def test_a_file_compressed_otherwise_than_gzip_is_told_as_compressed_not_as_bad_utf8(
    tmp_path, tok_dir, name, data, tool, capsys
):
    """A held.txt.bz2 was read as text: pack, tokenizer train and eval ppl said "invalid UTF-8 ... re-encode the file
    as UTF-8 (iconv)", and curate run read it as one document of U+FFFD (langid removed it) with the same note. Only
    gzip is read decompressed; another compression is now an error naming it, and how to read the file."""
    from cookmind.cli import main

    src = tmp_path / name
    src.write_bytes(data)
    for argv in (
        ["pack", "--tokenizer", str(tok_dir), "--train-type", "seq", "--out", str(tmp_path / "s"), "--input"],
        ["tokenizer", "train", "--vocab-size", "300", "--out", str(tmp_path / "t"), "--input"],
        ["curate", "run", "--output", str(tmp_path / "c"), "--input"],
    ):
        assert main([*argv, str(src), "--quiet"]) == 2, argv
        err = capsys.readouterr().err
        assert f"{src}: " in err and "compressed" in err and tool in err and "gzip" in err, err
        assert "iconv" not in err and "UTF-8" not in err, err
