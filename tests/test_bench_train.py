"""bench/bench_train.py's timing window, on the CPU."""

import pytest


def _capture_step() -> int:
    """The step (1-based) at which the Trainer's CUDA graph is captured: the first that GraphedStep.wants_step()
    sends to the graph (it counts its eager warm-up steps itself; no GPU is needed to ask it)."""
    from cookmind.train.cuda_graph import GraphedStep

    graphed = GraphedStep(trainer=None)
    step = 1
    while not graphed.wants_step():
        step += 1
    return step


@pytest.mark.parametrize("warmup", [0, 1, 3, 4, 10])
def test_with_the_cuda_graph_the_timed_steps_start_after_the_capture(warmup):
    from bench.bench_train import timed_warmup

    # the timed window runs from the end of step timed_warmup(...) on: the capture's step must lie before it
    assert timed_warmup(warmup, cuda_graph=True) >= _capture_step()
    assert timed_warmup(warmup, cuda_graph=True) >= warmup


@pytest.mark.parametrize("warmup", [0, 1, 3, 10])
def test_without_the_graph_the_warmup_asked_for_is_the_warmup_run(warmup):
    from bench.bench_train import timed_warmup

    assert timed_warmup(warmup, cuda_graph=False) == warmup


def test_the_profiles_idle_gaps_add_up_by_size_with_overlaps_counted_once():
    from bench.profile_train import idle_gaps

    # kernels (start, end) in µs: b overlaps a (no gap), then gaps of 1, 50 and 2000 µs
    kernels = [(0.0, 10.0, "a"), (5.0, 12.0, "b"), (13.0, 20.0, "c"), (70.0, 80.0, "d"), (2080.0, 2090.0, "e")]
    g = idle_gaps(kernels, top=2)
    assert g["idle_us"] == {"<= 2 us": 1.0, "<= 10 us": 0.0, "<= 100 us": 50.0, "<= 1000 us": 0.0, "> 1000 us": 2000.0}
    assert g["gaps"] == {"<= 2 us": 1, "<= 10 us": 0, "<= 100 us": 1, "<= 1000 us": 0, "> 1000 us": 1}
    assert g["longest"] == [{"us": 2000.0, "after": "d", "before": "e"}, {"us": 50.0, "after": "c", "before": "d"}]
