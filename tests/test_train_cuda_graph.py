"""train.cuda_graph: the whole step captured once and replayed gives the eager run's training.

The reference is the same Trainer without the graph (its kernels launched one by one from Python), on the same
data and seed: weights, per-step losses and grad norms, skipped-step counts, with gradient accumulation and
with torch.compile. The refusals are tested on CPU.
"""

import json

import pytest
import torch
from test_train_loop import _cfg, _weights, store  # noqa: F401

from cookmind.train import PretrainObjective, Trainer


def _run(tmp_path, store, name, graph, objective=None, **train):
    t = Trainer(
        _cfg(
            tmp_path,
            store,
            name,
            train={"device": "cuda", "max_steps": 9, "precision": "bf16", "cuda_graph": graph, **train},
        ),
        objective=objective,
    )
    t.fit()
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return t, [(r["step"], r["loss"], r["grad_norm"]) for r in rows if r.get("split") == "train"]


class NaNOnSomeBatches(PretrainObjective):
    """A non-finite loss decided by the batch's content, so a replayed graph sees it too (not a Python counter)."""

    def __call__(self, model, batch):
        loss, m = super().__call__(model, batch)
        bad = batch["input_ids"].sum() % 3 == 0
        nan = torch.full(
            (), float("nan"), device=loss.device
        )  # made on the device: a capture cannot copy from the host
        loss = loss * torch.where(bad, nan, torch.ones((), device=loss.device))
        return loss, {**m, "loss": loss.detach()}


def deterministic(request) -> None:
    """torch.use_deterministic_algorithms for the rest of the test (warn only where an op has no such kernel)."""
    was = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    request.addfinalizer(lambda: torch.use_deterministic_algorithms(was[0], warn_only=was[1]))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "accum,compile_,master", [(1, False, False), (2, False, False), (1, True, False), (1, False, True), (2, True, True)]
)
def test_graph_replays_train_like_the_eager_loop(tmp_path, store, accum, compile_, master, request):
    """master: train.master_weights (bf16 weights; with accumulation, the fp32 buffers' hooks run in the capture).

    Under master weights the backward runs in bf16, so a one-ulp difference anywhere (2^-8 relative) weighs far
    more than in fp32: on the H200 the compiled, accumulating pair's grad norms differed by 3.6e-5 relative at
    step 2 (1.11275 against 1.11271) with equal losses. Step 2 runs eagerly in both runs (the graph is captured
    after ``WARMUP`` = 3 eager steps), so that gap is the eager backward's own run-to-run nondeterminism, which
    bf16 gradients make visible, not the graph's. A weight one bf16 rounding apart then moves the next losses too
    (4.16686 against 4.16673 at step 4, 3e-5, in a later H200 run), and with compile and accumulation the grad
    norms drifted further: 2.0e-4 relative at step 8 (1.04986 against 1.05007) and, in another call, 3.7e-4 at
    step 4 (1.24307 against 1.24261), and 2.3e-3 at step 9 in a third (2026-12-01, H200; two of those calls ran
    main's code, one an unlanded branch that stacked the projections). That pair now runs under
    torch.use_deterministic_algorithms (scatter kernels, eager and compiled, then avoid atomic adds: a likely
    source; cuDNN's attention backward stays nondeterministic, with a warning) and passed at 1e-4 in one H200 call
    (with CUBLAS_WORKSPACE_CONFIG=:4096:8, as bench/gpu_session.sh sets it). A replay of stale weights or a
    missed micro-batch moves a loss by far more. The weights compared are the fp32 masters (a bf16 weight one
    rounding apart differs by its ulp, ~1e-4 here, not by the update's difference)."""
    kw = dict(grad_accum_steps=accum, micro_batch_size=2, compile=compile_, master_weights=master)
    if compile_ and master:
        deterministic(request)
    eager, rows_e = _run(tmp_path, store, "eager", False, **kw)
    graph, rows_g = _run(tmp_path, store, "graph", True, **kw)
    assert graph._graph.replays == 9 - graph._graph.WARMUP  # the captured step and every later one replayed
    assert [r[0] for r in rows_g] == list(range(1, 10))
    rel = 1e-4 if master else 1e-5
    for (s, le, ne), (_, lg, ng) in zip(rows_e, rows_g):
        assert lg == pytest.approx(le, rel=rel, abs=1e-6), s  # metrics.jsonl: 6 digits
        assert ng == pytest.approx(ne, rel=rel, abs=1e-6), s
    with eager._fp32_weights_in_place(), graph._fp32_weights_in_place():  # the masters (a no-op without them)
        we, wg = _weights(eager), _weights(graph)
    assert all(v.dtype == torch.float32 for v in we.values())
    for k in we:  # the same kernels on the same data; a tolerance only for non-deterministic backward kernels
        torch.testing.assert_close(wg[k], we[k], atol=1e-5, rtol=0, msg=k)


@pytest.mark.gpu
def test_graph_skips_non_finite_steps_on_the_device(tmp_path, store):
    eager, _ = _run(tmp_path, store, "eager", False, objective=NaNOnSomeBatches())
    graph, _ = _run(tmp_path, store, "graph", True, objective=NaNOnSomeBatches())
    assert graph._graph.replays == 9 - graph._graph.WARMUP
    assert eager.skipped_steps > 0 and graph.skipped_steps == eager.skipped_steps
    we, wg = _weights(eager), _weights(graph)
    for k in we:
        assert torch.isfinite(wg[k]).all(), k
        torch.testing.assert_close(wg[k], we[k], atol=1e-5, rtol=0, msg=k)


@pytest.mark.gpu
def test_a_batch_of_another_shape_runs_eagerly(tmp_path, store):
    t = Trainer(
        _cfg(
            tmp_path, store, "mixed", train={"device": "cuda", "max_steps": 6, "precision": "bf16", "cuda_graph": True}
        )
    )
    summary = t.fit()  # 3 eager warm-up steps, then 3 replays
    assert t._graph.replays == 3
    assert summary["cuda_graph"] is True and summary["master_weights"] is False  # what ran, in the run's summary
    before = _weights(t)
    short = {"input_ids": torch.randint(1, 64, (4, 8), device="cuda")}
    short["labels"] = short["input_ids"].clone()
    t._prefetched = [short]  # the next step takes this batch (T=8, not the captured 16)
    t.cfg.train.max_steps = 7
    t._read_step(t._launch_step())
    assert t._graph.replays == 3  # ran eagerly, then the graph stays usable
    assert any(not torch.equal(before[k], v) for k, v in _weights(t).items())
    t.cfg.train.max_steps = 8
    t._read_step(t._launch_step())
    assert t._graph.replays == 4


def test_cuda_graph_is_refused_with_a_reason_on_cpu_and_auto_stays_off(tmp_path, store):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Trainer(_cfg(tmp_path, store, "cpu", train={"cuda_graph": True}))
    t = Trainer(_cfg(tmp_path, store, "auto", train={"cuda_graph": "auto"}))  # CPU: off, no error
    assert t._graph is None and t.cfg.train.cuda_graph == "auto"
    with pytest.raises(ValueError, match="train.cuda_graph"):
        _cfg(tmp_path, store, "bad", train={"cuda_graph": "sometimes"})
    assert _cfg(tmp_path, store, "yaml-bool", train={"cuda_graph": False}).train.cuda_graph == "false"


def test_graph_takes_only_batches_of_the_captured_layout():
    """A replay reads the captured buffers, so only batches of the same keys, shapes, dtypes and plain values fit."""
    from cookmind.train.cuda_graph import GraphedStep

    g = GraphedStep(trainer=None)
    ids = torch.zeros(2, 8, dtype=torch.long)
    g.static = [{"input_ids": ids, "labels": ids, "tag": "a"}]
    same = [{"input_ids": torch.ones(2, 8, dtype=torch.long), "labels": ids.clone(), "tag": "a"}]
    assert g._fits(same)
    assert not g._fits([dict(same[0], input_ids=torch.zeros(2, 9, dtype=torch.long))])  # another length
    assert not g._fits([dict(same[0], labels=ids.int())])  # another dtype
    assert not g._fits([dict(same[0], tag="b")])  # another plain value
    assert not g._fits([dict(same[0], extra=ids)])  # another key
    assert not g._fits(same + same)  # another number of micro-batches


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["sft", "dpo", "dpo-lora"])
def test_graph_trains_sft_and_dpo_like_the_eager_loop(tmp_path, case):
    """The presets turn the graph on (auto) for every objective but GRPO: SFT's masked loss, DPO's frozen
    reference forward and LoRA's adapters replay to the eager run's weights too (accumulation 2, as in the
    resume tests' configs)."""
    from test_train_resume import _config, _stores

    _stores(tmp_path)
    runs = {}
    for graph in (False, True):
        cfg = _config(tmp_path, case, tmp_path / f"{case}-{graph}")
        cfg.train.device, cfg.train.precision, cfg.train.cuda_graph = "cuda", "bf16", str(graph).lower()
        cfg.lora.dropout = 0.0  # a graph draws its own dropout masks (module docstring): compare without
        trainer = Trainer(cfg)
        assert trainer.fit()["status"] == "completed"
        runs[graph] = trainer
    graphed = runs[True]._graph
    assert graphed is not None and graphed.replays >= 1, "no step went through the graph"
    we, wg = _weights(runs[False]), _weights(runs[True])
    for k in we:
        torch.testing.assert_close(wg[k], we[k], atol=1e-5, rtol=0, msg=k)
