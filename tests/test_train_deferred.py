"""Deferred step reads (train.defer_metrics): the host queues step k+1 before it reads step k's loss and norm.

Every test runs the device-side skip path on CPU (fused AdamW reading found_inf, as on CUDA) twice, with
deferral on and off, and asserts the same weights, metrics rows (but for timing), checkpoints and counts; and
that deferral really happened (``trainer.deferred_steps``) where it should, and not where it must not.
"""

import json
import time

import pytest
import torch
from test_train_loop import FailAt, NaNAt, _cfg, _weights, store  # noqa: F401

from cookmind.train import Callback, PretrainObjective, TrainConfig, Trainer, TrainingDiverged
from cookmind.train.checkpoint import find_latest_checkpoint, list_checkpoints

pytestmark = pytest.mark.usefixtures("one_thread", "keep_threads")  # each test starts on one thread

TIMING = ("tokens_per_s", "step_time_s", "mfu")


def _trainer(tmp_path, store, name, defer, objective=None, callbacks=None, **sections):
    """A Trainer on the device-side skip path (as on CUDA), with deferral on or off."""
    sections.setdefault("train", {})
    sections["train"] = {"defer_metrics": defer, **sections["train"]}
    t = Trainer(_cfg(tmp_path, store, name, **sections), objective=objective, callbacks=callbacks)
    for g in t.optimizer.param_groups:
        g["fused"] = True
    t._skip_on_device = True
    return t


def _rows(tmp_path, name):
    """metrics.jsonl without the timing fields, each row as JSON text (so NaN losses compare equal)."""
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [json.dumps({k: v for k, v in json.loads(x).items() if k not in TIMING}, sort_keys=True) for x in lines]


class Record(Callback):
    """The metrics each on_step_end gets, at full precision (metrics.jsonl rounds to 6 digits); log-only."""

    def __init__(self):
        self.rows = []

    def needs_state_at(self, trainer, step):
        return False

    def on_step_end(self, trainer, step, metrics):
        self.rows.append(json.dumps({"step": step, **{k: v for k, v in metrics.items() if k not in TIMING}}))


def _assert_same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


class WithMetrics(PretrainObjective):
    """Tensor metrics (a scalar and a vector, read through the step's readout) and a host number beside the loss."""

    def __call__(self, model, batch):
        loss, m = super().__call__(model, batch)
        return loss, {
            **m,
            "twice_loss": 2 * loss.detach(),
            "vec": torch.stack([loss.detach(), 3 * loss.detach()]),
            "host": 1.5,
        }


def test_deferred_run_equals_synchronous_run(tmp_path, store):
    runs = {}
    for defer in (False, True):
        name = f"defer{defer}"
        rec = Record()
        t = _trainer(
            tmp_path,
            store,
            name,
            defer,
            objective=WithMetrics(),
            callbacks=[rec],
            train={"max_steps": 6, "micro_batch_size": 2, "grad_accum_steps": 2},
            logging={"report": False},
        )
        t0 = time.perf_counter()
        runs[defer] = (t, t.fit(), rec.rows)
        wall = time.perf_counter() - t0
        times = [json.loads(x)["step_time_s"] for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert 0 < sum(times) <= wall  # each step's time is its own slice of the run: none overlap
    (sync, s_sum, s_rows), (deferred, d_sum, d_rows) = runs[False], runs[True]
    assert sync.deferred_steps == 0 and deferred.deferred_steps == 5  # all but the last step
    _assert_same_weights(sync, deferred)
    assert s_rows == d_rows and len(d_rows) == 6
    assert _rows(tmp_path, "deferFalse") == _rows(tmp_path, "deferTrue")
    assert {k: v for k, v in s_sum.items() if k != "seconds"} == {k: v for k, v in d_sum.items() if k != "seconds"}
    rows = [json.loads(x) for x in (tmp_path / "deferTrue" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["tokens"] for r in rows] == [16 * 4 * i for i in range(1, 7)]  # micro 2 x accum 2 x 16 tokens
    for r in rows:  # the readout carries the objective's metrics: each the mean over the micro-batches
        assert r["twice_loss"] == pytest.approx(2 * r["loss"], rel=1e-5)
        assert r["vec"] == pytest.approx(2 * r["loss"], rel=1e-5)  # mean of (loss, 3 loss)
        assert r["host"] == 1.5 and r["step_time_s"] > 0 and r["tokens_per_s"] > 0


def _checkpoint_contents(path):
    meta = json.loads((path / "meta.json").read_text())
    meta = {k: v for k, v in meta.items() if k not in ("saved_at", "config", "run_id")}
    opt = torch.load(path / "optimizer.pt", weights_only=True)
    from safetensors.torch import load_file

    return meta, load_file(path / "model.safetensors"), opt


def _assert_same_tree(a, b, where):
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same_tree(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_checkpoint_and_eval_steps_are_read_before_the_next_step(tmp_path, store):
    runs = {}
    for defer in (False, True):
        name = f"defer{defer}"
        runs[defer] = _trainer(
            tmp_path,
            store,
            name,
            defer,
            train={"max_steps": 7},
            data={"val_path": str(store)},
            checkpoint={"every": 2, "keep_last": 0},
            eval={"every": 3},
        )
        runs[defer].fit()
    # checkpoints at 2, 4, 6, evaluations at 3, 6, and the last step 7 are read at once: only 1 and 5 wait
    assert runs[False].deferred_steps == 0 and runs[True].deferred_steps == 2
    _assert_same_weights(runs[False], runs[True])
    assert _rows(tmp_path, "deferFalse") == _rows(tmp_path, "deferTrue")
    val = [json.loads(r) for r in _rows(tmp_path, "deferTrue") if '"split": "val"' in r]
    assert [r["step"] for r in val] == [3, 6, 7]
    a = list_checkpoints(tmp_path / "deferFalse" / "checkpoints")
    b = list_checkpoints(tmp_path / "deferTrue" / "checkpoints")
    assert [p.name for p in a] == [p.name for p in b] == [f"step_{s:08d}" for s in (2, 4, 6, 7)]
    for pa, pb in zip(a, b):
        _assert_same_tree(_checkpoint_contents(pa), _checkpoint_contents(pb), pa.name)


def test_non_finite_steps_are_skipped_and_counted_the_same(tmp_path, store):
    out = {}
    for defer in (False, True):
        name = f"defer{defer}"
        rec = Record()
        t = _trainer(tmp_path, store, name, defer, objective=NaNAt({2, 5, 6}), callbacks=[rec], train={"max_steps": 8})
        summary = t.fit()
        out[defer] = t, rec.rows
        assert summary["skipped_steps"] == 3 and t.consecutive_bad == 0
    (sync, s_rows), (deferred, d_rows) = out[False], out[True]
    assert sync.deferred_steps == 0 and deferred.deferred_steps == 7
    _assert_same_weights(sync, deferred)
    assert s_rows == d_rows
    rows = _rows(tmp_path, "deferTrue")
    assert rows == _rows(tmp_path, "deferFalse")
    assert [json.loads(r)["skipped_steps"] for r in rows] == [0, 1, 1, 1, 2, 3, 3, 3]


@pytest.mark.parametrize(
    "bad, diverged_at, deferred", [(range(3, 100), 5, 4), (range(1, 100), 3, 2), ({1, 2, *range(4, 100)}, 6, 4)]
)
def test_divergence_stops_at_the_same_step_with_a_checkpoint(tmp_path, store, bad, diverged_at, deferred):
    # max_bad_steps=2: the third bad step in a row ends the run. A step that could be that third one (two bad
    # before it) is read before the next is queued, so the run stops exactly where the synchronous one does.
    ckpts = {}
    for defer in (False, True):
        name = f"defer{defer}"
        t = _trainer(tmp_path, store, name, defer, objective=NaNAt(bad), train={"max_steps": 10, "max_bad_steps": 2})
        with pytest.raises(TrainingDiverged, match=f"stopped at step {diverged_at} "):
            t.fit()
        assert t.step == diverged_at and t.consecutive_bad == 3
        assert t.deferred_steps == (deferred if defer else 0)
        ckpts[defer] = list_checkpoints(tmp_path / name / "checkpoints")[-1]  # marked diverged
        assert ckpts[defer].name == f"step_{diverged_at:08d}"
    assert _rows(tmp_path, "deferFalse") == _rows(tmp_path, "deferTrue")
    _assert_same_tree(_checkpoint_contents(ckpts[False]), _checkpoint_contents(ckpts[True]), "divergence checkpoint")
    assert json.loads((ckpts[True] / "meta.json").read_text())["consecutive_bad"] == 3


class Observe(Callback):
    """Records trainer.step as on_step_end(step) sees it; says nothing about needing the state (the default)."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, trainer, step, metrics):
        self.seen.append((step, trainer.step))


class ObserveLogOnly(Observe):
    def needs_state_at(self, trainer, step):
        return False


def test_a_callback_that_does_not_opt_in_sees_every_step_as_it_ends(tmp_path, store):
    obs = Observe()
    t = _trainer(tmp_path, store, "user", True, callbacks=[obs], train={"max_steps": 5})
    t.fit()
    assert t.deferred_steps == 0
    assert obs.seen == [(s, s) for s in range(1, 6)]
    # A callback that opts in sees the next step already queued (the last step is never deferred).
    log_only = ObserveLogOnly()
    t = _trainer(tmp_path, store, "log_only", True, callbacks=[log_only], train={"max_steps": 5})
    t.fit()
    assert t.deferred_steps == 4
    assert log_only.seen == [(1, 2), (2, 3), (3, 4), (4, 5), (5, 5)]


class StopAt(Callback):
    """request_stop in on_step_end(step); needs the state only at that step, so the other steps may wait."""

    def __init__(self, step):
        self.step = step

    def needs_state_at(self, trainer, step):
        return step == self.step

    def on_step_end(self, trainer, step, metrics):
        if step == self.step:
            trainer.request_stop("test interruption")


def test_resume_from_a_deferred_run_equals_an_uninterrupted_run(tmp_path, store):
    sections = dict(
        train={"max_steps": 8, "grad_accum_steps": 2, "micro_batch_size": 2}, checkpoint={"every": 5, "keep_last": 0}
    )
    full_sync = _trainer(tmp_path, store, "full_sync", False, **sections)
    full_sync.fit()
    full = _trainer(tmp_path, store, "full", True, **sections)
    full.fit()
    assert full.deferred_steps == 6  # all but the checkpoint step 5 and the last
    _assert_same_weights(full_sync, full)

    cut = _trainer(tmp_path, store, "cut", True, callbacks=[StopAt(3)], **sections)
    summary = cut.fit()
    assert summary["status"] == "stopped" and summary["steps"] == 3 and cut.deferred_steps == 2
    resumed = _trainer(
        tmp_path, store, "cut", True, **{**sections, "checkpoint": {**sections["checkpoint"], "resume": "auto"}}
    )
    assert resumed.step == 3
    resumed.fit()
    assert resumed.deferred_steps == 3  # steps 4, 6, 7
    _assert_same_weights(full, resumed)
    # the resumed run's rows continue the interrupted one's: together they are the uninterrupted run's rows
    assert _rows(tmp_path, "cut") == _rows(tmp_path, "full")


class StopWhileQueuing(ObserveLogOnly):
    """A stop that arrives while step ``at`` is being queued (as a signal may), from a callback that opts in."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_step_begin(self, trainer, step):
        if step == self.at:
            trainer.request_stop("signal")


def test_a_stop_while_a_step_is_queued_ends_after_that_step_as_without_deferral(tmp_path, store):
    for defer in (False, True):
        name = f"defer{defer}"
        t = _trainer(tmp_path, store, name, defer, callbacks=[StopWhileQueuing(3)], train={"max_steps": 8})
        summary = t.fit()
        assert summary["status"] == "stopped" and summary["steps"] == 3
        assert t.deferred_steps == (3 if defer else 0)  # 1, 2 and the stopped step 3, read before the checkpoint
        assert find_latest_checkpoint(tmp_path / name / "checkpoints").name == "step_00000003"
    assert _rows(tmp_path, "deferFalse") == _rows(tmp_path, "deferTrue")


def test_a_stop_from_an_opted_in_callback_takes_effect_one_step_later(tmp_path, store):
    # Documented: on_step_end(2) of a callback that needs no state runs after step 3 was queued.
    class LateStop(ObserveLogOnly):
        def on_step_end(self, trainer, step, metrics):
            super().on_step_end(trainer, step, metrics)
            if step == 2:
                trainer.request_stop("from a log-only callback")

    steps = {}
    for defer in (False, True):
        t = _trainer(tmp_path, store, f"defer{defer}", defer, callbacks=[LateStop()], train={"max_steps": 8})
        steps[defer] = t.fit()["steps"]
    assert steps == {False: 2, True: 3}


def test_an_error_while_queuing_still_records_the_step_before(tmp_path, store):
    t = _trainer(tmp_path, store, "fail", True, objective=FailAt(4), train={"max_steps": 8})
    with pytest.raises(RuntimeError, match="the objective failed"):
        t.fit()
    assert t.deferred_steps == 3  # step 3 was still unread when step 4 failed
    assert [json.loads(r)["step"] for r in _rows(tmp_path, "fail")] == [1, 2, 3]


def test_defer_metrics_is_a_typed_config_switch(tmp_path, store):
    from cookmind.train import TrainConfig

    assert TrainConfig().train.defer_metrics is True
    with pytest.raises(ValueError, match="expected true/false"):
        _cfg(tmp_path, store, "x", train={"defer_metrics": "yes"})


def test_the_cpu_default_path_reads_every_step_at_once(tmp_path, store):
    t = Trainer(_cfg(tmp_path, store, "cpu"))
    assert not t._skip_on_device
    t.fit()
    assert t.deferred_steps == 0


@pytest.mark.gpu
def test_on_cuda_the_deferred_run_matches_the_synchronous_one(tmp_path, store):
    runs = {}
    for defer in (False, True):
        t = Trainer(
            _cfg(tmp_path, store, f"cuda{defer}", train={"device": "cuda", "max_steps": 6, "defer_metrics": defer})
        )
        assert t._skip_on_device  # fused AdamW on CUDA: the real path
        t.fit()
        runs[defer] = t
    assert runs[False].deferred_steps == 0 and runs[True].deferred_steps == 5
    # Same kernels in the same order; a tolerance only for any non-deterministic CUDA backward kernels.
    wa, wb = _weights(runs[False]), _weights(runs[True])
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6, rtol=0), k
    ra, rb = _rows(tmp_path, "cudaFalse"), _rows(tmp_path, "cudaTrue")
    assert [json.loads(r)["step"] for r in ra] == [json.loads(r)["step"] for r in rb] == list(range(1, 7))
    assert json.loads(ra[0])["loss"] == json.loads(rb[0])["loss"]


class _StopOnRankZero(Callback):
    """A stop that only rank 0 sees, while step 3 is being queued (as a signal to one process may)."""

    def needs_state_at(self, trainer, step):
        return False

    def on_step_begin(self, trainer, step):
        if step == 3 and trainer.dist.rank == 0:
            trainer.request_stop("rank 0 only")


def _defer_on_rank(rank: int, base: dict, out: str) -> dict:
    """On each of two gloo ranks: the four runs (metrics deferred or not, rank 0 stopping at step 3 or not) with
    fused AdamW's device-side skip; each run's status, steps, deferred steps and a digest of its weights."""
    import hashlib

    res = {}
    for defer in (False, True):
        for stop in (False, True):
            d = json.loads(json.dumps(base))
            d["train"]["defer_metrics"] = defer
            d["logging"]["run_dir"] = f"{out}/run_{defer}_{stop}"
            t = Trainer(TrainConfig.from_dict(d), callbacks=[_StopOnRankZero()] if stop else [])
            for g in t.optimizer.param_groups:
                g["fused"] = True
            t._skip_on_device = True
            summary = t.fit()
            digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in t.bare_model.state_dict().values()))
            res[f"defer={defer} stop={stop}"] = {
                "status": summary["status"],
                "steps": t.step,
                "deferred": t.deferred_steps,
                "weights": digest.hexdigest(),
            }
            t.close()  # DDP's wrapper goes before the group the ranks leave at the end
    return res


def test_two_gloo_ranks_defer_alike_and_match_the_synchronous_run(tmp_path, store):
    import functools

    from gloo_fixtures import run_on_gloo_ranks

    base = _cfg(
        tmp_path,
        store,
        "unused",
        train={"max_steps": 6, "micro_batch_size": 2, "device": "cpu"},
        checkpoint={"every": 2},
        logging={"report": False},
    ).to_dict()
    ranks = run_on_gloo_ranks(functools.partial(_defer_on_rank, base=base, out=str(tmp_path)), 2, tmp_path)
    for res in ranks:
        for stop in (False, True):
            sync, deferred = res[f"defer=False stop={stop}"], res[f"defer=True stop={stop}"]
            assert sync["weights"] == deferred["weights"] and sync["steps"] == deferred["steps"]
            assert sync["deferred"] == 0
        assert res["defer=True stop=False"] == {**res["defer=False stop=False"], "deferred": 3}  # steps 1, 3, 5
        # one rank's stop ends both ranks' runs after the same step, with the same weights
        assert res["defer=True stop=True"]["status"] == "stopped" and res["defer=True stop=True"]["steps"] == 3
        assert res["defer=True stop=True"]["deferred"] == 2  # 1 and 3 (2 is a checkpoint step)
    assert ranks[0] == ranks[1]
