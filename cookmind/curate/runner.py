"""The curation runner: shards in, shards out, resumable by shard, with a per-stage report.

Consecutive document stages run together in one pass over each shard; a corpus stage (dedup)
is a barrier with a scan pass, a reduce in the driver and an apply pass. Every finished task
leaves a ``.done`` file (holding its stats) under ``OUTPUT/_work``; a rerun skips those tasks.
With ``config.removed`` each task also lists the documents it removed; the driver joins a shard's lists
into ``OUTPUT/removed/shard-NNNNN.jsonl.gz``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import time
import warnings
from pathlib import Path

from cookmind.atomic import clean_stale_temps, is_temp_name, write_json, writing
from cookmind.curate.config import CurateConfig
from cookmind.curate.executors import documents_done_bar, make_executor
from cookmind.curate.shards import (
    HTML_FILES_PER_SHARD,
    READING,
    SOURCE_KEY,
    iter_shard,
    left_out_note,
    no_text_note,
    plan_input_shards,
    reading_changes,
    shard_suffix,
    write_shard,
)
from cookmind.curate.stages import build_stage
from cookmind.curate.stats import StageStats, text_bytes, write_report
from cookmind.text_input import bad_utf8_note

WORK = "_work"
REMOVED = "removed"  # OUTPUT/removed/shard-NNNNN.jsonl.gz: what the stages removed from each shard, and why


@dataclasses.dataclass
class RunResult:
    """What a run did: per-stage stats in order, output shard paths, tasks run and skipped."""

    stages: list[StageStats]
    outputs: list[Path]
    tasks_run: int
    tasks_skipped: int
    report_json: Path
    report_md: Path
    removed: Path | None = None  # the folder listing the removed documents, when the run wrote one


# documents per batch: stages with a per-call model cost (toxicity) see them together (64 runs as fast as 256), and the
# document bar counts them when their batch is done: it advances four times over an HTML shard of 256 pages
BATCH = 64


def run_doc_shard(
    stages,
    shard,
    out_path: str,
    done_path: str,
    fmt: str,
    removed_path: str | None = None,
    final: bool = True,
    text_field: str = "text",
) -> list[dict]:
    """One shard through consecutive document stages, in batches; writes the kept documents (and, given
    ``removed_path``, the removed ones) and the done file. Listing removals, each input document carries where it
    came from (``SOURCE_KEY``) through the passes; the ``final`` pass leaves it out of the output. ``text_field``:
    the input records' text field."""
    stats = [StageStats(s.name, dropped=[] if removed_path else None) for s in stages]
    bar = documents_done_bar()  # documents are read a batch ahead: counted when the stages are done with them

    def batches():
        batch = []
        source = SOURCE_KEY if removed_path else None
        need_text = stages[0].name != "extract"
        for doc in iter_shard(shard, source, need_text, stats[0], bar=bar is None, text_field=text_field):
            batch.append(doc)
            if len(batch) == BATCH:
                yield batch
                batch = []
        if batch:
            yield batch

    def kept():
        for batch in batches():
            n_read = len(batch)
            for stage, st in zip(stages, stats):
                if not batch:
                    break
                t0 = time.process_time()
                st.docs_in += len(batch)
                st.bytes_in += sum(text_bytes(d) for d in batch)
                n_dropped = len(st.dropped or ())
                flags = stage.process_batch(batch, st)
                batch = [d for d, ok in zip(batch, flags) if ok]
                if st.dropped is not None and len(st.dropped) - n_dropped != len(flags) - len(batch):
                    raise RuntimeError(
                        f"stage {stage.name} removed {len(flags) - len(batch)} documents but named a reason for "
                        f"{len(st.dropped) - n_dropped}: a stage removes a document with stats.drop(reason, doc)"
                    )
                st.docs_out += len(batch)
                st.bytes_out += sum(text_bytes(d) for d in batch)
                st.seconds += time.process_time() - t0
            if bar is not None:
                bar.update(n_read)
            for doc in batch:
                if final:
                    doc.pop(SOURCE_KEY, None)
                yield doc

    write_shard(kept(), out_path, fmt)
    if removed_path:
        _write_removed(stats, removed_path)
    result = [s.to_dict() for s in stats]
    _write_json(Path(done_path), result)
    return result


REMOVED_KEYS = ("id", "stage", "reason", "source")  # a removed document's listing opens with these


def _write_removed(stats: list[StageStats], path: str) -> None:
    """The documents ``stats`` dropped as JSON lines: id, stage, reason, source (the input file, and the line, row or
    byte offset in it, as ``iter_located`` says), then every other field the document had when removed (its text,
    or the html of a page extract found no text in; the fields earlier stages gave it, as a kept one has them: lang,
    lang_score, quality). A field of the document named like one of the first four is kept as ``doc_<name>``."""
    rows = (
        {
            "id": doc.get("id"),
            "stage": st.name,
            "reason": reason,
            "source": doc.get(SOURCE_KEY),
            **{f"doc_{k}" if k in REMOVED_KEYS else k: v for k, v in doc.items() if k not in ("id", SOURCE_KEY)},
        }
        for st in stats
        for reason, doc in st.dropped
    )
    write_shard(rows, path, "jsonl.gz")


def run_scan(stage, shard, scratch: str, idx: int, done_path: str) -> None:
    """Pass 1 of a corpus stage on one shard."""
    t0 = time.process_time()
    stage.scan(shard, Path(scratch), idx)
    _write_json(Path(done_path), {"seconds": time.process_time() - t0})


def run_apply(
    stage,
    shard,
    out_path: str,
    scratch: str,
    idx: int,
    fmt: str,
    done_path: str,
    removed_path: str | None = None,
    final: bool = True,
) -> list[dict]:
    """Pass 2 of a corpus stage on one shard (listing what it removed in ``removed_path``, if given); the done file
    holds the shard's stats."""
    stats = stage.apply(shard, Path(out_path), Path(scratch), idx, fmt, list_removed=bool(removed_path), final=final)
    if removed_path:
        _write_removed([stats], removed_path)
    result = [stats.to_dict()]
    _write_json(Path(done_path), result)
    return result


def _segments(stages) -> list[list]:
    """Consecutive document stages grouped; each corpus stage alone."""
    segs: list[list] = []
    for s in stages:
        if s.corpus or not segs or segs[-1][0].corpus:
            segs.append([s])
        else:
            segs[-1].append(s)
    return segs


def run_pipeline(
    config: CurateConfig,
    inputs: list[str],
    output: str | os.PathLike,
    executor: str = "local",
    workers: int | None = None,
    ray_address: str | None = None,
    restart: bool = False,
    progress: bool = True,
) -> RunResult:
    """Run ``config``'s stages over ``inputs`` into ``output`` (shard-NNNNN.<format> + report.{json,md}, and
    removed/shard-NNNNN.jsonl.gz with ``config.removed``)."""
    output = Path(output)
    if output.exists() and not output.is_dir():
        raise ValueError(
            f"--output {output} is a file: curate writes shard-NNNNN files, a report and {WORK}/ into a folder; "
            "give a folder path"
        )
    work = output / WORK
    stages = [build_stage(name, opts) for name, opts in config.stage_list()]
    if not stages:
        raise ValueError("the config lists no stages")
    if config.text_field != "text" and stages[0].corpus:  # the dedups' passes read text as curate writes it
        raise ValueError(
            f"text_field {config.text_field!r}: the records are read by the first stage, {stages[0].name}, a dedup "
            "that reads 'text'; begin the stages with extract (it reads the field and writes it as text)"
        )
    _check_output_apart(inputs, output)
    left_out: dict[str, int] = {}  # the folders' files that are not documents, by suffix: warned, and reported
    plan = plan_input_shards(inputs, left_out)
    suffix = shard_suffix(config.output_format)
    removed = [f"{REMOVED}/shard-{i:05d}.jsonl.gz" for i in range(len(plan))] if config.removed else []
    segs = _segments(stages)
    seg_dirs = [work / f"{k:02d}-{'+'.join(s.name for s in seg)}" for k, seg in enumerate(segs)]
    outputs = [f"shard-{i:05d}{suffix}" for i in range(len(plan))] + removed
    _check_resume(work, config, plan, restart, outputs, [(s, d) for seg, d in zip(segs, seg_dirs) for s in seg])
    if (asked := workers or config.workers) > len(plan):  # a process curates one shard at a time
        named = f"--workers {workers}" if workers else f"the config's workers: {config.workers}"
        warnings.warn(
            f"curate: {named}, but the inputs make {len(plan)} shard{'s' if len(plan) > 1 else ''} (a shard is one "
            f"WARC, JSONL or Parquet file, or up to {HTML_FILES_PER_SHARD} HTML/text files): {len(plan)} "
            f"process{'es run' if len(plan) > 1 else ' runs'}; to use {asked}, split the input into {asked} or more "
            "files",
            stacklevel=2,
        )
    ex = make_executor(executor, workers or config.workers, ray_address, progress)
    specs: list = plan
    totals: list[StageStats] = []
    run = skipped = 0
    with _forgotten_unless_a_shard_is_done(work):
        for k, seg in enumerate(segs):
            last = k == len(segs) - 1
            seg_dir = seg_dirs[k]
            seg_dir.mkdir(parents=True, exist_ok=True)
            fmt = config.output_format if last else "jsonl.gz"
            outs = [
                str((output if last else seg_dir) / f"shard-{i:05d}{suffix if last else '.jsonl.gz'}")
                for i in range(len(specs))
            ]
            lists = [str(seg_dir / f"removed-{i:05d}.jsonl.gz") if removed else None for i in range(len(specs))]
            if not seg[0].corpus:
                dones = [seg_dir / f"shard-{i:05d}.done" for i in range(len(specs))]
                todo = [
                    (seg, specs[i], outs[i], str(dones[i]), fmt, lists[i], last, config.text_field)
                    for i in range(len(specs))
                    if not (dones[i].exists() and Path(outs[i]).exists())
                ]
                ex.map(run_doc_shard, todo, desc=f"curate {'+'.join(s.name for s in seg)}")
            else:
                stage = seg[0]
                scratch = seg_dir / "scratch"
                scratch.mkdir(exist_ok=True)
                scan_dones = [seg_dir / f"scan-{i:05d}.done" for i in range(len(specs))]
                todo_scan = [
                    (stage, specs[i], str(scratch), i, str(scan_dones[i]))
                    for i in range(len(specs))
                    if not scan_dones[i].exists()
                ]
                ex.map(run_scan, todo_scan, desc=f"curate {stage.name} scan")
                reduce_done = seg_dir / "reduce.done"
                if todo_scan or not reduce_done.exists():
                    t0 = time.process_time()
                    stage.reduce(scratch, len(specs))
                    _write_json(reduce_done, {"seconds": time.process_time() - t0})
                dones = [seg_dir / f"shard-{i:05d}.done" for i in range(len(specs))]
                todo = [
                    (stage, specs[i], outs[i], str(scratch), i, fmt, str(dones[i]), lists[i], last)
                    for i in range(len(specs))
                    if todo_scan or not (dones[i].exists() and Path(outs[i]).exists())
                ]
                ex.map(run_apply, todo, desc=f"curate {stage.name} apply")
                extra = sum(json.loads(d.read_text())["seconds"] for d in scan_dones)
                extra += json.loads(reduce_done.read_text())["seconds"]
            run += len(todo)
            skipped += len(specs) - len(todo)
            seg_stats = [StageStats(s.name) for s in seg]
            for d in dones:
                for st, rec in zip(seg_stats, json.loads(d.read_text())):
                    st.merge(StageStats.from_dict(rec))
            if seg[0].corpus:
                seg_stats[0].seconds += extra
            totals += seg_stats
            specs = outs
    removed_dir = None
    if removed:  # each shard's lists, one per segment, joined (gzip members concatenate) in pipeline order
        removed_dir = output / REMOVED
        for name in removed:
            with writing(output / name, "wb") as f:
                for seg_dir in seg_dirs:
                    with open(seg_dir / Path(name).name.replace("shard-", "removed-"), "rb") as part:
                        shutil.copyfileobj(part, f)
    notes = [n for stage, st in zip(stages, totals) if hasattr(stage, "note") and (n := stage.note(st))]
    if no_text := no_text_note(totals[0], config.text_field):
        notes.insert(0, no_text)
    if bad_utf8 := bad_utf8_note(totals[0]):  # the first pass read the inputs and counted them
        warnings.warn(f"curate: {bad_utf8}", stacklevel=2)
        notes.insert(0, bad_utf8)
    if left_out:
        notes.insert(0, left_out_note(left_out))
    report_json, report_md = write_report(totals, output, removed_dir, notes, left_out)
    return RunResult(totals, [Path(p) for p in specs], run, skipped, report_json, report_md, removed_dir)


@contextlib.contextmanager
def _forgotten_unless_a_shard_is_done(work: Path):
    """Remove the work folder if the run fails before any shard (or scan) is done: there is nothing to resume, and
    its run.json would refuse the corrected rerun the error names (`--text-field text` after `--text-field body`
    failed) as "a run with another config"."""
    try:
        yield
    except Exception:
        if not any(work.rglob("*.done")):
            shutil.rmtree(work, ignore_errors=True)
        raise


def _check_output_apart(inputs: list[str], output: Path) -> None:
    """Refuse an output folder that is, holds or lies inside an input: shard-NNNNN outputs would replace input
    files of that name, and a folder input is read whole, so a rerun would read its own output; and one in a
    training run's checkpoints folder, where training prunes and deletes."""
    from cookmind.run_layout import refuse_output_in_checkpoints

    refuse_output_in_checkpoints(output, "--output")
    out = output.resolve()
    for raw in inputs:
        p = Path(raw).resolve()
        if p.is_relative_to(out) or (p.is_dir() and out.is_relative_to(p)):
            raise ValueError(
                f"--output {output} and the input {raw} overlap (curate writes shard-NNNNN files and {WORK}/ into "
                "--output and reads an input folder whole): choose an --output outside the inputs"
            )


REPORTS = ("report.json", "report.md")  # written by every run after its shards


def _check_resume(
    work: Path, config: CurateConfig, plan: list, restart: bool, outputs: list[str], stages: list[tuple]
) -> None:
    """Refuse to mix a resumed run with another config, other inputs or another logic of a stage that did work (or
    wipe it with ``restart``). ``stages``: each stage with the folder of its segment's work.

    The run's final shard names go into ``run.json``: ``restart`` deletes the old run's shards with its work folder,
    so a rerun that writes fewer shards, or another format, leaves none of them for ``pack`` to read as its own.
    A new run refuses an output folder holding shard files or a report no curate run there recorded writing.
    """
    versions = {_stage_key(k, stage): stage.version for k, (stage, _) in enumerate(stages)}
    stamp = {"config": config.fingerprint(), "plan": plan, "reading": READING, "stage_versions": versions}
    stage_files = _stage_files(stages)
    files = {f: [(st := os.stat(f)).st_size, st.st_mtime_ns] for shard in plan for f in shard}
    path = work / "run.json"
    output = work.parent
    if work.is_dir() and any(work.iterdir()) and not path.is_file():  # --restart deletes only a curate run's
        raise ValueError(
            f"{work} was not made by cookmind curate (it has no run.json); curate keeps its own work there and "
            "--restart deletes only a curate run's work folder: move it away or choose another --output"
        )
    if restart and work.exists():
        recorded = _recorded(path) if path.is_file() else []  # killed before run.json: it wrote nothing else
        _refuse_foreign_outputs(output, recorded)
        # the run starts anew in the folder: what it would refuse there, it refuses before deleting the old run
        _refuse_other_files(output, work, recorded)
        _clean_own_temps(output, recorded)  # a dead writer's; one alive or on another host stays, and is refused
        _refuse_live_temps(output, recorded)
        for name in recorded:
            (output / name).unlink(missing_ok=True)
        if (output / REMOVED).is_dir() and not any((output / REMOVED).iterdir()):
            (output / REMOVED).rmdir()
        shutil.rmtree(work)
    if path.exists():
        old = json.loads(path.read_text())
        reading = old.get("reading") or 1  # runs before it was recorded read as 1
        if reading > READING:
            raise ValueError(
                f"{work} holds a run of a newer cookmind (input reading {reading}, this cookmind's {READING}), which "
                "reads some inputs another way: resume it with that cookmind, pass --restart to start over, or "
                "choose another --output"
            )
        # resumed, its shards read one way would mix with the rest read another
        if reading < READING and (changes := reading_changes(files)):
            raise ValueError(
                f"{work} holds a run that read its inputs another way (input reading {reading}, this cookmind's "
                f"{READING}: {'; '.join(changes)}); pass --restart to start over, or choose another --output"
            )
        same = ("config", "plan")  # the reading is checked above
        if {k: old.get(k) for k in same} != json.loads(json.dumps({k: stamp[k] for k in same})):
            what = (
                "another config (its stages, their options, the output format, --removed or --text-field)"
                if old.get("config") != stamp["config"]
                else _inputs_differ([f for shard in old.get("plan") or [] for f in shard], list(files))
            )
            raise ValueError(
                f"{work} holds a run with {what}; pass --restart to start over, or choose another --output"
            )
        _refuse_changed_stages(work, old, stages)
        _refuse_changed_stage_files(work, old.get("stage_files"), stage_files, stages)
        # same paths, new content: a shard read before would hand back the old text (one that failed may be fixed)
        seen = old.get("input_files", files)  # runs before input_files was recorded cannot tell
        changed = [
            f
            for i, shard in enumerate(plan)
            if any(work.glob(f"00-*/shard-{i:05d}.done"))
            for f in shard
            if seen.get(f) != files[f]
        ]
        if changed:
            raise ValueError(
                f"{changed[0]} changed since the run in {work} read it (size or modification time; {len(changed)} "
                "changed input file(s) in all); pass --restart to start over, or choose another --output"
            )
        if "outputs" in old:  # a run from before outputs were recorded cannot tell
            _refuse_foreign_outputs(output, _recorded(path))
        _clean_own_temps(output, _recorded(path))
        # it reads its inputs, and runs the stages still to do, as this one
        now = {"input_files": files, "stage_versions": versions, "stage_files": stage_files}
        _write_json(path, {**old, "reading": READING, **now})
        return
    _refuse_foreign_outputs(output, [])
    _refuse_other_files(output, work)
    work.mkdir(parents=True, exist_ok=True)
    _write_json(path, {**stamp, "input_files": files, "stage_files": stage_files, "outputs": outputs + list(REPORTS)})


def _refuse_changed_stages(work: Path, old: dict, stages: list[tuple]) -> None:
    """Raise if a stage whose logic version differs from the one ``old`` (the run's run.json) recorded has done work
    in the run (a ``.done`` file in its segment's folder): its finished shards would mix with this code's. A stage
    that did none yet runs wholly under this code, and resumes. A run recorded without versions (a cookmind before
    them) ran every stage's FIRST_VERSION."""
    from cookmind.curate.stages import FIRST_VERSION

    recorded = old.get("stage_versions") or {}
    changed = [
        (stage.name, then, stage.version)
        for k, (stage, seg_dir) in enumerate(stages)
        if (then := recorded.get(_stage_key(k, stage), FIRST_VERSION)) != stage.version and any(seg_dir.glob("*.done"))
    ]
    if not changed:
        return
    named = ", ".join(f"{name} {then}, this cookmind's {now}" for name, then, now in changed)
    if any(then > now for _, then, now in changed):
        raise ValueError(
            f"{work} holds a run of a newer cookmind, whose stage logic differs from this one's (logic version of "
            f"{named}): resume it with that cookmind, pass --restart to start over, or choose another --output"
        )
    raise ValueError(
        f"{work} holds a run whose stage logic has changed since it started (logic version of {named}), so its "
        "finished shards would mix with this cookmind's: pass --restart to start over, or choose another --output"
    )


def _stage_key(k: int, stage) -> str:
    """A stage's key in run.json: its place in the config and its name ("2:decontaminate"), so that two stages of
    one name keep their own versions and files."""
    return f"{k}:{stage.name}"


def _stage_files(stages: list[tuple]) -> dict[str, dict[str, list[int]]]:
    """Each stage's files (its model, its eval sets: ``files()``), with their size and modification time."""
    out: dict[str, dict[str, list[int]]] = {}
    for k, (stage, _) in enumerate(stages):
        for f in stage.files():
            st = os.stat(f)
            out.setdefault(_stage_key(k, stage), {})[f] = [st.st_size, st.st_mtime_ns]
    return out


def _refuse_changed_stage_files(work: Path, then: dict | None, now: dict, stages: list[tuple]) -> None:
    """Raise if a file a stage reads (its model, an eval set) changed, or is another, since the run recorded it,
    where that stage has done work: its finished shards were judged by the old one. A run recorded without them
    (an older cookmind) cannot tell."""
    if then is None:
        return
    for k, (stage, seg_dir) in enumerate(stages):
        old, new = then.get(_stage_key(k, stage), {}), now.get(_stage_key(k, stage), {})
        changed = [f for f in new if old.get(f) != new[f]] + [f for f in old if f not in new]
        if changed and any(seg_dir.glob("*.done")):
            raise ValueError(
                f"{changed[0]}, read by the {stage.name} stage, changed since the run in {work} started (size or "
                "modification time), and the shards that stage finished were judged by the old one: pass --restart "
                "to start over, or choose another --output"
            )


def _refuse_other_files(output: Path, work: Path, ours: list[str] = ()) -> None:
    """Raise if ``output`` holds anything but the work folder and ``ours`` (the names an earlier run there recorded,
    ``removed/`` ones too, which ``--restart`` deletes): a new run writes a new or empty folder, as every command
    does."""
    tops = {Path(name).parts[0] for name in ours}
    others = (
        sorted(p.name for p in output.iterdir() if p != work and p.name not in tops and not _own_temp(p.name, ours))
        if output.is_dir()
        else []
    )
    if REMOVED in tops and (output / REMOVED).is_dir():  # checked before --restart deletes the run's own lists
        others += sorted(
            n
            for p in (output / REMOVED).iterdir()
            if (n := f"{REMOVED}/{p.name}") not in ours and not _own_temp(n, ours)
        )
    elif REMOVED in tops and (output / REMOVED).exists():  # a file where the run wrote its lists' folder
        others.append(REMOVED)
    if others:  # its files would mix with these
        named = " and ".join(others[:2]) + (f" (and {len(others) - 2} more)" if len(others) > 2 else "")
        raise ValueError(
            f"--output {output} already holds {named}, which no curate run there wrote; curate writes a new or "
            "empty folder (or its own, to resume): choose another --output or move them away"
        )


def _own_temp(name: str, ours: list[str]) -> bool:
    """Whether ``name`` (``removed/`` ones with that prefix) is a temporary file of an output a run recorded
    (``.NAME.tmp-PID@HOST``, cookmind.atomic's): a run killed while writing that output left it."""
    folder, _, base = name.rpartition("/")
    if not is_temp_name(base):
        return False
    own = base[1:].rsplit(".", 1)[0]  # ".shard-00000.jsonl.gz.tmp-PID@HOST": the host has no dot
    return (f"{folder}/{own}" if folder else own) in ours


def _refuse_live_temps(output: Path, ours: list[str]) -> None:
    """Raise if a temporary file of an output the run recorded is still there once the dead writers' are gone: its
    writer is alive, or on another host sharing the folder; --restart would delete the run under it."""
    left = []
    for folder in {output} | ({output / REMOVED} if (output / REMOVED).is_dir() else set()):
        prefix = "" if folder == output else f"{REMOVED}/"
        left += sorted(f"{prefix}{p.name}" for p in folder.iterdir() if _own_temp(f"{prefix}{p.name}", ours))
    if left:
        raise ValueError(
            f"--output {output} holds {left[0]}, a temporary file of this run's output whose writer "
            f"({left[0].rpartition('tmp-')[2]}) is alive or on another host; stop that run (or remove the file if "
            "it is gone) before --restart"
        )


def _clean_own_temps(output: Path, ours: list[str]) -> None:
    """Remove the temporary files a killed run left of the outputs it recorded, in ``output`` and ``removed/``
    (those of a writer still alive stay)."""
    for name in ours:
        clean_stale_temps((output / name).parent, Path(name).name)


def _recorded(run_json: Path) -> list[str]:
    """The output names a curate run recorded in ``run.json`` (its reports too: runs before they were recorded
    wrote them all the same)."""
    return sorted(set(json.loads(run_json.read_text()).get("outputs", [])) | set(REPORTS))


def _inputs_differ(then: list[str], now: list[str]) -> str:
    """How this run's input files differ from the recorded run's: a file new or gone, or only their order."""
    then_set, now_set = set(then), set(now)  # once: a crawl names thousands of files
    new = [f for f in now if f not in then_set]
    gone = [f for f in then if f not in now_set]
    if not new and not gone and len(then) == len(now):
        return f"the same {len(now)} files in another order (shards are numbered in it)"
    which = f"{new[0]} is new" if new else f"{gone[0]} is no longer an input" if gone else "a file is named twice"
    more = len(new) + len(gone) - 1
    which += f", {more} more changed" if more > 0 else ""
    return f"other inputs ({len(then)} files then, {len(now)} now: {which})"


def _refuse_foreign_outputs(output: Path, ours: list[str]) -> None:
    """Raise if ``output`` holds shard-* files, a report or removed/ lists besides ``ours`` (what a curate run there
    recorded)."""
    names = sorted(p.name for p in output.iterdir()) if output.is_dir() else []
    if (output / REMOVED).is_dir():
        names += sorted(f"{REMOVED}/{p.name}" for p in (output / REMOVED).glob("shard-*"))
    foreign = [n for n in names if (n.startswith(("shard-", f"{REMOVED}/")) or n in REPORTS) and n not in ours]
    shards = [n for n in foreign if n.startswith("shard-")]
    if shards:
        raise ValueError(
            f"--output {output} already holds {len(shards)} shard files that no curate run there wrote "
            f"({', '.join(shards[:3])}{', ...' if len(shards) > 3 else ''}): pack and tokenizer train read "
            "every shard in the folder, so they would mix with this run's; choose an empty --output or move them away"
        )
    if foreign and foreign[0].startswith(REMOVED):
        raise ValueError(
            f"--output {output} already holds {foreign[0]}, a list of removed documents no curate run there wrote, "
            "which would pass for this run's; choose an empty --output or move it away"
        )
    if foreign:
        raise ValueError(
            f"--output {output} already holds {foreign[0]}, which no curate run there wrote and this run would "
            "replace with its report; choose an empty --output or move it away"
        )


def _write_json(path: Path, obj) -> None:
    write_json(path, obj, indent=None)


def read_outputs(paths: list[Path]):
    """Iterate the documents of output shards in order."""
    for p in paths:
        yield from iter_shard(str(p))


__all__ = ["RunResult", "run_pipeline", "read_outputs", "text_bytes"]
