"""Shared test fixtures. Area-specific helpers live in the test files that use them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("COOKMIND_SHARED_DATA", ROOT.parent / "shared" / "data"))

# Property tests draw the same examples on every run: CI must not pass or fail by luck.
settings.register_profile("cookmind", derandomize=True)
settings.load_profile("cookmind")

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The read-only real data beside the project (../shared/data); skip when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(
            f"real data folder {SHARED_DATA} is absent (a fresh clone has no ../shared): set "
            "COOKMIND_SHARED_DATA=/path/to/data (GSM8K, MMLU, TinyStories; see its README) to run this test"
        )
    return SHARED_DATA


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer (320 tokens, the default special tokens) trained on lm_fixtures.CORPUS, saved in a
    folder; tests read it and write elsewhere."""
    from lm_fixtures import CORPUS

    from cookmind.tokenizer import DEFAULT_SPECIAL_TOKENS, Tokenizer, train_bpe

    d = tmp_path_factory.mktemp("tok")
    (d / "corpus.txt").write_text(CORPUS)
    vocab, merges = train_bpe(d / "corpus.txt", 320, DEFAULT_SPECIAL_TOKENS, progress=False)
    Tokenizer(vocab, merges, DEFAULT_SPECIAL_TOKENS).save(d)
    return d


@pytest.fixture(scope="module")
def one_thread():
    """One CPU thread for a test module, restored after it; opt in with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``.

    Tiny models run fastest on one thread; two OpenMP threads on a busy 2-core machine thrash.
    """
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def keep_threads():
    """Torch's CPU thread count, restored after the test (the Trainer and `cookmind train` set their own)."""
    import torch

    n = torch.get_num_threads()
    yield n
    torch.set_num_threads(n)


@pytest.fixture
def sigterm_at_step(monkeypatch):
    """``arm(step)``: the next Trainer that launches step ``step`` (counted from 0) gets one SIGTERM first, as from
    a scheduler that stops the job; later runs in the test train undisturbed."""
    import signal

    from cookmind.train import Trainer

    launch = Trainer._launch_step

    def arm(step: int) -> None:
        fired = []

        def launch_and_kill(self):
            if self.step == step and not fired:
                fired.append(step)
                os.kill(os.getpid(), signal.SIGTERM)
            return launch(self)

        monkeypatch.setattr(Trainer, "_launch_step", launch_and_kill)

    return arm


@pytest.fixture(autouse=True)
def _seed_everything():
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _restore_matmul_precision():
    """Benches' main() turns TF32 on for their figures (bench_fp8_loss, bench_train); a GPU test that runs one in
    process would leave it on for every later test in its xdist worker, whose float32 comparisons then fail at
    TF32's precision (session 31: four such failures). Each test's precision settings end with it."""
    import torch

    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.get_float32_matmul_precision(),
    )
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
    torch.set_float32_matmul_precision(saved[2])  # last: it is the finer of the two matmul settings


@pytest.fixture(autouse=True)
def _leave_no_process_group():
    """A test that trains with parallel.fsdp in one process makes a one-rank group (FSDP2 needs one), and a
    Trainer joins a group it finds: left behind, it would change what later tests in the same worker see
    (init_distributed returned the leftover group instead of its own errors). Each test's group ends with it."""
    import torch.distributed as dist

    had_group = dist.is_available() and dist.is_initialized()
    yield
    if not had_group and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA; run on the device machine")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter runs kernel tests marked so
    for item in items:
        if "gpu" in item.keywords and not (interpret and "triton_interpretable" in item.keywords):
            item.add_marker(skip_gpu)
