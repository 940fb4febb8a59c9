"""`cookmind curate --restart` deletes only a curate run's own work folder (issue #17.1, same rule as --overwrite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cookmind.curate.config import CurateConfig
from cookmind.curate.runner import WORK, run_pipeline


def test_restart_refuses_a_work_folder_curate_did_not_make(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "docs.jsonl").write_text('{"id": "a", "text": "hello world"}\n')
    mine = tmp_path / "out" / WORK
    mine.mkdir(parents=True)
    (mine / "notes.txt").write_text("precious")
    cfg = CurateConfig(stages=[{"pii": {}}])
    with pytest.raises(ValueError, match="not made by cookmind curate"):
        run_pipeline(cfg, [str(tmp_path / "in")], tmp_path / "out", restart=True, progress=False)
    assert (mine / "notes.txt").read_text() == "precious"


def _inputs(tmp_path, name, texts):
    folder = tmp_path / name
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"docs{i}.jsonl").write_text(f'{{"id": "{name}{i}", "text": "{text}"}}\n')
    return str(folder)


def _shards(out):
    return sorted(p.name for p in out.glob("shard-*"))


def test_restart_with_fewer_shards_leaves_none_of_the_old_run_behind(tmp_path):
    """A rerun that writes fewer shards (or another format) must not leave the old run's shard files for pack and
    tokenizer train to read as part of the new run."""
    from cookmind.curate.runner import read_outputs

    cfg = CurateConfig(stages=[{"pii": {}}])
    big = _inputs(tmp_path, "big", ["one text here", "two text here"])
    small = _inputs(tmp_path, "small", ["only this one"])
    out = tmp_path / "out"
    first = run_pipeline(cfg, [big], out, progress=False)
    assert len(first.outputs) == 2 and len(_shards(out)) == 2
    again = run_pipeline(cfg, [small], out, restart=True, progress=False)
    assert _shards(out) == [p.name for p in again.outputs] == ["shard-00000.jsonl.gz"]
    assert [d["text"] for d in read_outputs(sorted(out.glob("shard-*")))] == ["only this one"]
    parquet = CurateConfig(stages=[{"pii": {}}], output_format="parquet")
    run_pipeline(parquet, [small], out, restart=True, progress=False)
    assert _shards(out) == ["shard-00000.parquet"]


def test_a_new_run_refuses_an_output_holding_shards_it_did_not_write(tmp_path):
    cfg = CurateConfig(stages=[{"pii": {}}])
    src = _inputs(tmp_path, "in", ["some text"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "shard-00000.jsonl.gz").write_bytes(b"precious")
    (out / "shard-00007.parquet").write_bytes(b"also precious")
    for restart in (False, True):
        with pytest.raises(ValueError, match="2 shard files"):
            run_pipeline(cfg, [src], out, restart=restart, progress=False)
    assert (out / "shard-00000.jsonl.gz").read_bytes() == b"precious"
    assert (out / "shard-00007.parquet").read_bytes() == b"also precious"


def test_an_output_that_is_a_file_and_a_missing_config_are_one_line_each(tmp_path, capsys):
    from cookmind.cli import main as cli_main

    src = _inputs(tmp_path, "in", ["some text"])
    (tmp_path / "afile").write_text("mine")
    assert cli_main(["curate", "run", "--input", src, "--output", str(tmp_path / "afile"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "afile is a file: curate writes shard-NNNNN files" in err and "Errno" not in err  # was "[Errno 20] ..."
    assert (tmp_path / "afile").read_text() == "mine"
    argv = ["curate", "run", "--input", src, "--output", str(tmp_path / "o"), "--config", str(tmp_path / "no.yaml")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "no.yaml: no such file; `cookmind curate default-config > curate.yaml`" in err and "Errno" not in err


@pytest.mark.parametrize("restart", [False, True])
def test_a_run_refuses_an_output_holding_a_report_it_did_not_write(tmp_path, restart):
    """Only shard-* names were checked: the user's report.md / report.json in --output were replaced by the run's."""
    cfg = CurateConfig(stages=[{"pii": {}}])
    src = _inputs(tmp_path, "in", ["some text"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    (out / "report.json").write_text("{}")
    with pytest.raises(ValueError, match=r"already holds report.json, which no curate run there wrote"):
        run_pipeline(cfg, [src], out, restart=restart, progress=False)
    assert (out / "report.md").read_text() == "my notes" and (out / "report.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]  # no _work/ left either


def test_a_run_reruns_and_restarts_over_its_own_reports(tmp_path):
    cfg = CurateConfig(stages=[{"pii": {}}])
    src = _inputs(tmp_path, "in", ["some text"])
    out = tmp_path / "out"
    first = run_pipeline(cfg, [src], out, progress=False)
    assert first.report_md.is_file()
    assert run_pipeline(cfg, [src], out, progress=False).tasks_skipped == 1  # resumed over its own reports
    assert run_pipeline(cfg, [src], out, restart=True, progress=False).tasks_run == 1
    (out / WORK / "run.json").write_text(
        json.dumps({**json.loads((out / WORK / "run.json").read_text()), "outputs": []})
    )
    with pytest.raises(ValueError, match="1 shard files that no curate run there wrote"):
        run_pipeline(cfg, [src], out, progress=False)  # a resume checks the folder against run.json too


def test_a_rerun_refuses_an_input_file_changed_since_the_run_read_it(tmp_path):
    """Same paths, new content: skipping the finished shards would hand back the old text as the new run's."""
    from cookmind.curate.runner import read_outputs

    cfg = CurateConfig(stages=[{"pii": {}}])
    src = _inputs(tmp_path, "in", ["the first draft"])
    out = tmp_path / "out"
    run_pipeline(cfg, [src], out, progress=False)
    run_pipeline(cfg, [src], out, progress=False)  # unchanged: resumes
    (tmp_path / "in" / "docs0.jsonl").write_text('{"id": "in0", "text": "the corrected text"}\n')
    with pytest.raises(ValueError, match=r"docs0\.jsonl changed since .*--restart"):
        run_pipeline(cfg, [src], out, progress=False)
    run_pipeline(cfg, [src], out, restart=True, progress=False)
    assert [d["text"] for d in read_outputs(sorted(out.glob("shard-*")))] == ["the corrected text"]


def test_a_rerun_refused_says_whether_the_config_or_the_inputs_differ(tmp_path):
    cfg = CurateConfig(stages=[{"pii": {}}])
    src = _inputs(tmp_path, "in", ["one text", "two text"])
    out = tmp_path / "out"
    run_pipeline(cfg, [src], out, progress=False)
    parquet = CurateConfig(stages=[{"pii": {}}], output_format="parquet")
    said = r"another config \(its stages, their options, the output format, --removed or --text-field\)"
    with pytest.raises(ValueError, match=said):
        run_pipeline(parquet, [src], out, progress=False)
    (tmp_path / "in" / "docs2.jsonl").write_text('{"id": "in2", "text": "three"}\n')
    with pytest.raises(ValueError, match=r"other inputs \(2 files then, 3 now: .*docs2\.jsonl is new\)"):
        run_pipeline(cfg, [src], out, progress=False)


def test_a_rerun_and_restart_treat_the_removed_list_as_the_runs_own(tmp_path):
    listing = CurateConfig(stages=[{"gopher": {}}], removed=True)
    src = _inputs(tmp_path, "in", ["too short", "also short"])
    out = tmp_path / "out"
    first = run_pipeline(listing, [src], out, progress=False)
    names = ["removed/shard-00000.jsonl.gz", "removed/shard-00001.jsonl.gz"]
    assert sorted(f"removed/{p.name}" for p in first.removed.iterdir()) == names
    assert set(names) <= set(json.loads((out / WORK / "run.json").read_text())["outputs"])
    again = run_pipeline(listing, [src], out, progress=False)
    assert again.tasks_run == 0 and again.removed == first.removed
    with pytest.raises(ValueError, match="another config"):  # the list is part of what a run promises
        run_pipeline(CurateConfig(stages=[{"gopher": {}}]), [src], out, progress=False)
    run_pipeline(CurateConfig(stages=[{"gopher": {}}]), [src], out, restart=True, progress=False)
    assert not (out / "removed").exists()
    stray = tmp_path / "stray"
    (stray / "removed").mkdir(parents=True)
    (stray / "removed" / "shard-00000.jsonl.gz").write_bytes(b"")
    with pytest.raises(ValueError, match="removed/shard-00000.jsonl.gz, a list of removed documents no curate run"):
        run_pipeline(listing, [src], stray, progress=False)


def test_a_new_run_refuses_an_output_folder_that_holds_other_files(tmp_path):
    """A new run into a folder of unrelated files (notes.txt, another tool's data) wrote its shards, _work/ and
    reports in among them, where every other command writes a new, empty or its own folder. It is refused now, and
    leaves nothing there; the run's own folder still resumes."""
    cfg = CurateConfig(stages=[{"pii": {}}])
    src = _inputs(tmp_path, "in", ["some text", "more text"])
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "data").mkdir()
    with pytest.raises(ValueError, match=r"--output .*out already holds data and notes\.txt, which no curate run"):
        run_pipeline(cfg, [src], out, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["data", "notes.txt"]
    fresh = tmp_path / "fresh"
    run_pipeline(cfg, [src], fresh, progress=False)
    shards = _shards(fresh)
    run_pipeline(cfg, [src], fresh, progress=False)  # its own folder: the run resumes (nothing left to do)
    assert _shards(fresh) == shards
    (tmp_path / "empty").mkdir()
    run_pipeline(cfg, [src], tmp_path / "empty", progress=False)


def test_a_rerun_refused_for_other_inputs_names_a_file_that_differs(tmp_path):
    """Other files of the same number, or the same files in another order, were refused as 'other inputs (2 files
    then, 2 now)': the message now names a file new to the run or gone from it, or says the order changed."""
    cfg = CurateConfig(stages=[{"pii": {}}])
    src = _inputs(tmp_path, "in", ["one text", "two text", "three text"])
    a, b, c = (str(Path(src) / f"docs{i}.jsonl") for i in range(3))
    out = tmp_path / "out"
    run_pipeline(cfg, [a, b], out, progress=False)
    said = r"other inputs \(2 files then, 2 now: .*docs2\.jsonl is new, 1 more changed\)"  # docs1 is left out
    with pytest.raises(ValueError, match=said):
        run_pipeline(cfg, [a, c], out, progress=False)
    # docs1 is still there, only not named: "docs1.jsonl is gone" sent a user looking for a deleted file
    assert Path(b).is_file()
    with pytest.raises(ValueError, match=r"other inputs \(2 files then, 1 now: .*docs1\.jsonl is no longer an input\)"):
        run_pipeline(cfg, [a], out, progress=False)
    with pytest.raises(ValueError, match=r"the same 2 files in another order \(shards are numbered in it\)"):
        run_pipeline(cfg, [b, a], out, progress=False)
    assert run_pipeline(cfg, [a, b], out, progress=False).tasks_skipped == 2  # as it was: resumed


def test_restart_refuses_an_output_holding_other_files_before_it_deletes_the_runs_own(tmp_path):
    """A token store packed into a curate output folder (`pack --out curated/store`), then `curate run --restart`:
    the run deleted its shards, report and work folder, and only then refused the folder for holding `store`, which
    no curate run wrote: the user was left with neither the old output nor a new one. The refusal now comes first,
    and deletes nothing."""
    src = tmp_path / "docs.jsonl"
    src.write_text('{"id": "a", "text": "hello world"}\n')
    out = tmp_path / "out"
    cfg = CurateConfig(stages=[{"pii": {}}])
    run_pipeline(cfg, [str(src)], out, progress=False)
    before = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    (out / "store").mkdir()
    (out / "store" / "meta.json").write_text("{}")
    with pytest.raises(ValueError, match=r"already holds store, which no curate run there wrote"):
        run_pipeline(cfg, [str(src)], out, restart=True, progress=False)
    after = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if "store" not in p.parts)
    assert after == before and "shard-00000.jsonl.gz" in before


@pytest.mark.parametrize("stray", ["notes.txt", "shard-00009.jsonl.gz"])
def test_restart_refuses_a_file_in_removed_it_did_not_write_before_it_deletes_anything(tmp_path, stray):
    """`curate run --restart` over an output whose removed/ held a file the run did not write (a note, another run's
    list) deleted the run's shards, reports and lists, and only then refused removed/: the user was left with
    neither the old output nor a new one. It now refuses first and deletes nothing."""
    listing = CurateConfig(stages=[{"gopher": {}}], removed=True)
    src = _inputs(tmp_path, "in", ["too short", "also short"])
    out = tmp_path / "out"
    run_pipeline(listing, [src], out, progress=False)
    (out / "removed" / stray).write_text("mine")
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {"shard-00000.jsonl.gz", "removed/shard-00001.jsonl.gz", "report.json", f"removed/{stray}"} <= set(before)
    with pytest.raises(ValueError, match=rf"already holds removed/{stray}, .*no curate run there wrote") as err:
        run_pipeline(listing, [src], out, restart=True, progress=False)
    assert "\n" not in str(err.value)
    after = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


def test_restart_refuses_a_file_where_the_removed_folder_was_before_it_deletes_anything(tmp_path):
    """removed/ replaced by a file of that name: --restart deleted the run's shards and reports, then failed on
    removed/shard-00000.jsonl.gz (not a folder). It refuses first now and deletes nothing."""
    import shutil

    listing = CurateConfig(stages=[{"gopher": {}}], removed=True)
    src = _inputs(tmp_path, "in", ["too short"])
    out = tmp_path / "out"
    run_pipeline(listing, [src], out, progress=False)
    shutil.rmtree(out / "removed")
    (out / "removed").write_text("mine")
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"already holds removed, which no curate run there wrote"):
        run_pipeline(listing, [src], out, restart=True, progress=False)
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_resuming_a_run_that_read_its_inputs_another_way_is_refused_until_restart(tmp_path, capsys):
    """A half-finished run of an older cookmind over a TinyStories-style .txt (then one document a file; now one a
    story, split at <|endoftext|>; Parquet rows then numbered from 0, now from 1) resumed under the same config
    fingerprint, its finished shards read the old way and the rest the new way, mixed in one output. A run records
    the version of its input reading; one recorded without it, or with another, is refused until --restart."""
    from cookmind.cli import main as cli_main
    from cookmind.curate.runner import read_outputs

    src = tmp_path / "stories.txt"
    src.write_text("The cat sat on the mat all day.\n<|endoftext|>\nThe dog ran to the old red barn.\n")
    out = tmp_path / "out"
    (tmp_path / "c.yaml").write_text("stages: [extract, exact_lines]\n")
    argv = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", str(src), "--output", str(out), "--quiet"]
    assert cli_main(argv) == 0
    capsys.readouterr()
    run_json = out / WORK / "run.json"
    older = {k: v for k, v in json.loads(run_json.read_text()).items() if k != "reading"}  # as an older run wrote it
    run_json.write_text(json.dumps(older))
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert str(out / WORK) in err and "read its inputs another way" in err and "<|endoftext|>" in err, err
    assert "pass --restart" in err, err
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert cli_main([*argv, "--restart"]) == 0
    assert [d["text"] for d in read_outputs(sorted(out.glob("shard-*")))] == [
        "The cat sat on the mat all day.",
        "The dog ran to the old red barn.",
    ]
    assert cli_main(argv) == 0  # the restarted run records the reading: it resumes


def test_restart_over_an_empty_work_folder_starts_the_run(tmp_path, capsys):
    """A run killed after making _work/ but before writing its run.json left the folder empty: a rerun started, but
    `--restart` stopped with "_work/run.json: no such file or folder; check the path", a file the user never named."""
    from cookmind.cli import main as cli_main

    src = _inputs(tmp_path, "in", ["some text here"])
    out = tmp_path / "out"
    (out / WORK).mkdir(parents=True)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("stages: [extract]\n")
    argv = ["curate", "run", "--config", str(cfg), "--input", src, "--output", str(out), "--quiet", "--restart"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert _shards(out) == ["shard-00000.jsonl.gz"] and (out / WORK / "run.json").is_file()


@pytest.mark.parametrize("where", ["", "removed/"])
def test_restart_and_resume_after_a_killed_run_take_its_temporary_files_for_its_own(tmp_path, where):
    """A run killed while writing a shard (or its removed list) leaves `.shard-00000.jsonl.gz.tmp-PID@host`:
    `curate run --restart` refused the folder, saying no curate run wrote that file, and a resumed run left it
    there. A temporary of a name the run recorded is the run's own: both remove it (its writer is dead)."""
    import os
    import socket

    listing = CurateConfig(stages=[{"gopher": {}}], removed=True)
    src = _inputs(tmp_path, "in", ["too short", "also short"])
    out = tmp_path / "out"
    run_pipeline(listing, [src], out, progress=False)
    dead = 2**22 + 12345  # above Linux's largest pid: no process has it
    temp = out / f"{where}.shard-00000.jsonl.gz.tmp-{dead}@{socket.gethostname().split('.')[0]}"
    temp.write_bytes(b"partial")
    run_pipeline(listing, [src], out, restart=True, progress=False)
    assert not temp.exists() and (out / f"{where}shard-00000.jsonl.gz").is_file()
    temp.write_bytes(b"partial")
    (out / f"{where}shard-00000.jsonl.gz").unlink()  # killed before the rename
    run_pipeline(listing, [src], out, progress=False)
    assert not temp.exists() and (out / f"{where}shard-00000.jsonl.gz").is_file()
    assert not os.path.exists(out / ".notes.txt.tmp-1@host")
    (out / ".notes.txt.tmp-1@host").write_text("not of a name the run wrote")
    with pytest.raises(ValueError, match=r"already holds \.notes\.txt\.tmp-1@host, which no curate run there wrote"):
        run_pipeline(listing, [src], out, restart=True, progress=False)


def test_a_run_recorded_without_its_reading_resumes_unless_an_input_is_read_another_way_now(tmp_path, capsys):
    """A run recorded without its input reading (an older cookmind) was refused whatever its inputs, with a message
    listing .txt, Parquet and gzip changes: a JSONL-only run too, though nothing it reads changed. It resumes now;
    one over a .txt is refused naming that change alone, and one recorded by a newer cookmind's reading is refused
    saying so."""
    from cookmind.cli import main as cli_main
    from cookmind.curate.shards import READING

    src = _inputs(tmp_path, "in", ["The cat sat on the mat all day.", "The dog ran to the old red barn."])
    (tmp_path / "c.yaml").write_text("stages: [extract, exact_lines]\n")
    run_json = tmp_path / "out" / WORK / "run.json"

    def older(reading, inputs):
        argv = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", *inputs]
        argv += ["--output", str(tmp_path / "out"), "--quiet"]
        assert cli_main([*argv, "--restart"]) == 0
        recorded = {k: v for k, v in json.loads(run_json.read_text()).items() if k != "reading"}
        run_json.write_text(json.dumps({**recorded, **({"reading": reading} if reading else {})}))
        capsys.readouterr()
        return cli_main(argv), capsys.readouterr().err

    assert older(None, [src]) == (0, "")  # JSONL only: nothing it reads changed
    assert json.loads(run_json.read_text())["reading"] == READING  # and the resumed run records its reading
    (tmp_path / "stories.txt").write_text("The hen sang a song.\n<|endoftext|>\nThe fox slept.\n")
    rc, err = older(None, [src, str(tmp_path / "stories.txt")])
    assert rc == 2 and err.count("\n") == 1 and "<|endoftext|>" in err and "pass --restart" in err, err
    assert "Parquet" not in err and "gzip" not in err, err
    rc, err = older(READING + 1, [src])
    assert rc == 2 and err.count("\n") == 1, err
    assert f"input reading {READING + 1}" in err and "newer cookmind" in err and "<|endoftext|>" not in err, err


@pytest.mark.parametrize("where", ["", "removed/"])
def test_restart_keeps_the_old_run_when_a_temporary_file_of_a_live_or_remote_writer_is_there(tmp_path, where):
    """A temporary of a recorded output whose writer is alive, or on another host (a shared filesystem), is not
    removed: `--restart` deleted the old run's shards, reports and _work/ and only then refused that file as one
    'no curate run there wrote', and every later --restart failed alike. It now refuses first, naming the writer,
    and the old run is there as it was."""
    listing = CurateConfig(stages=[{"gopher": {}}], removed=True)
    src = _inputs(tmp_path, "in", ["too short", "also short"])
    out = tmp_path / "out"
    run_pipeline(listing, [src], out, progress=False)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    temp = out / f"{where}.shard-00000.jsonl.gz.tmp-12345@othernode"
    temp.write_bytes(b"partial")
    with pytest.raises(ValueError, match=r"tmp-12345@othernode.* alive or on another host"):
        run_pipeline(listing, [src], out, restart=True, progress=False)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p != temp) == before


def test_resuming_a_run_whose_stage_logic_changed_since_is_refused_until_restart(tmp_path, capsys, monkeypatch):
    """run.json recorded the inputs and options but not the stages' own logic: a run killed under one cookmind and
    resumed under a newer one, whose stage keeps other documents, mixed the two stages' results in one output. Each
    stage has a logic version, recorded per stage; a resume is refused where a stage that did work has another one
    (a newer cookmind's run too), and goes on where the changed stage has done nothing yet. A run recorded without
    versions (an older cookmind) ran every stage's first version."""
    from cookmind.cli import main as cli_main
    from cookmind.curate.stages import ExactLinesStage, ExtractStage

    monkeypatch.setattr(ExactLinesStage, "version", 1)  # a cookmind whose stages here are all at their first version
    src = _inputs(tmp_path, "in", ["The cat sat on the mat all day.", "The dog ran to the old red barn."])
    out = tmp_path / "out"
    (tmp_path / "c.yaml").write_text("stages: [extract, exact_lines]\n")
    argv = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", src, "--output", str(out), "--quiet"]
    run_json = out / WORK / "run.json"
    assert cli_main(argv) == 0
    assert json.loads(run_json.read_text())["stage_versions"] == {"0:extract": 1, "1:exact_lines": 1}
    for dedup_work in out.glob(f"{WORK}/01-exact_lines/*.done"):  # as if killed before exact_lines did anything
        dedup_work.unlink()
    capsys.readouterr()
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    monkeypatch.setattr(ExtractStage, "version", 2)  # a newer cookmind: extract's output changed
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / WORK) in err and "pass --restart" in err, err
    assert "logic version of extract 1, this cookmind's 2" in err and "exact_lines" not in err, err
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    monkeypatch.setattr(ExtractStage, "version", 1)

    monkeypatch.setattr(ExactLinesStage, "version", 2)  # changed, but it did no work in the run: it resumes
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert json.loads(run_json.read_text())["stage_versions"] == {"0:extract": 1, "1:exact_lines": 2}
    monkeypatch.setattr(ExactLinesStage, "version", 1)  # back to the older cookmind: exact_lines 2 did its work
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "newer cookmind" in err and "exact_lines 2, this cookmind's 1" in err and "pass --restart" in err, err

    assert cli_main([*argv, "--restart"]) == 0
    recorded = json.loads(run_json.read_text())
    run_json.write_text(json.dumps({k: v for k, v in recorded.items() if k != "stage_versions"}))  # an older run's
    assert cli_main(argv) == 0  # it ran the first version of every stage: this cookmind's
    assert json.loads(run_json.read_text())["stage_versions"] == {"0:extract": 1, "1:exact_lines": 1}
    run_json.write_text(json.dumps({k: v for k, v in recorded.items() if k != "stage_versions"}))
    monkeypatch.setattr(ExtractStage, "version", 2)
    assert cli_main(argv) == 2
    assert "logic version of extract 1, this cookmind's 2" in capsys.readouterr().err


def test_resuming_a_run_whose_eval_set_or_model_changed_since_is_refused_until_restart(tmp_path, capsys):
    """run.json recorded the input files' size and time but not those of the files a stage reads, its eval sets and
    models (the config names their paths only): an eval set given more items, or a quality model retrained, while a
    run was stopped, judged the rest of the shards by the new one, the finished ones by the old. A run records
    them per stage and a resume where one changed since its stage did work is refused until --restart."""
    from cookmind.cli import main as cli_main
    from cookmind.curate.classifier import ClassifierConfig, train_classifier

    src = _inputs(tmp_path, "in", ["The cat sat on the mat all day long.", "The dog ran to the old red barn."])
    evals = tmp_path / "evals.jsonl"
    evals.write_text(json.dumps({"question": "What is two and two?"}) + "\n")
    rows = [{"text": f"the cat sat {i}", "label": "good"} for i in range(6)]
    rows += [{"text": f"buy now click {i}", "label": "bad"} for i in range(6)]
    cfg_model = ClassifierConfig(bucket=256, dim=4, epoch=1)
    model = train_classifier(rows, cfg=cfg_model).save(tmp_path / "q.npz")
    (tmp_path / "c.yaml").write_text(
        f"stages: [{{decontaminate: {{eval_sets: {{qa: {evals}}}, ngram: 3}}}}, "
        f"{{quality: {{model: {model}, threshold: 0.0}}}}]\n"
    )
    out = tmp_path / "out"
    argv = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", src, "--output", str(out), "--quiet"]
    run_json = out / WORK / "run.json"
    assert cli_main(argv) == 0
    assert sorted(json.loads(run_json.read_text())["stage_files"]) == ["0:decontaminate", "1:quality"]
    assert cli_main(argv) == 0  # nothing changed: it resumes
    capsys.readouterr()
    with evals.open("a") as f:
        f.write(json.dumps({"question": "The cat sat on the mat?"}) + "\n")
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"{evals}, read by the decontaminate stage, changed since the run" in err, err
    assert "pass --restart" in err, err
    assert cli_main([*argv, "--restart"]) == 0
    train_classifier(list(reversed(rows)), cfg=cfg_model).save(tmp_path / "q.npz")  # retrained in place
    capsys.readouterr()
    assert cli_main(argv) == 2
    assert f"{model}, read by the quality stage, changed since" in capsys.readouterr().err
    recorded = json.loads(run_json.read_text())
    run_json.write_text(json.dumps({k: v for k, v in recorded.items() if k != "stage_files"}))  # an older run's
    assert cli_main(argv) == 0  # it cannot tell, and resumes (as one recorded without its input files' times)
    assert "1:quality" in json.loads(run_json.read_text())["stage_files"]


def test_two_stages_of_one_name_keep_their_own_files_and_versions_in_run_json(tmp_path, capsys):
    """run.json kept a stage's files under its name, so two decontaminate stages merged theirs: an eval set of the
    second changed while only the first had finished shards was refused as 'read by the decontaminate stage', whose
    finished shards had never read it. Each stage is recorded under its place in the config."""
    from cookmind.cli import main as cli_main

    src = _inputs(tmp_path, "in", ["The cat sat on the mat all day long.", "The dog ran to the old red barn."])
    ev_a, ev_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for ev in (ev_a, ev_b):
        ev.write_text(json.dumps({"question": "What is two and two?"}) + "\n")
    (tmp_path / "c.yaml").write_text(
        f"stages: [{{decontaminate: {{eval_sets: {{a: {ev_a}}}, ngram: 3}}}}, exact_lines, "
        f"{{decontaminate: {{eval_sets: {{b: {ev_b}}}, ngram: 3}}}}]\n"
    )
    out = tmp_path / "out"
    argv = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", src, "--output", str(out), "--quiet"]
    assert cli_main(argv) == 0
    recorded = json.loads((out / WORK / "run.json").read_text())
    assert sorted(recorded["stage_files"]) == ["0:decontaminate", "2:decontaminate"]
    assert recorded["stage_versions"] == {"0:decontaminate": 3, "1:exact_lines": 2, "2:decontaminate": 3}
    segments = sorted(p for p in (out / WORK).iterdir() if p.is_dir())
    for done in segments[-1].glob("*.done"):  # as if killed before the last segment (the second decontaminate) ran
        done.unlink()
    with ev_b.open("a") as f:
        f.write(json.dumps({"question": "Where did the dog run to?"}) + "\n")
    capsys.readouterr()
    assert cli_main(argv) == 0, capsys.readouterr().err  # b.jsonl is read only by a stage that had done nothing
    with ev_a.open("a") as f:
        f.write(json.dumps({"question": "Where did the cat sit?"}) + "\n")
    assert cli_main(argv) == 2
    assert f"{ev_a}, read by the decontaminate stage, changed since" in capsys.readouterr().err
