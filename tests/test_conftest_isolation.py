"""The suite's own guards: what one test changes in torch's process-wide settings does not reach the next test in
the same worker (pytest-xdist runs many tests in one process; a GPU test that calls a bench's main() turned TF32 on
for every later test in its worker, and float32 comparisons there failed at TF32's precision)."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]


def test_a_test_that_turns_tf32_on_leaves_the_next_test_torchs_defaults(pytester):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_pair="""
        import torch

        def test_1_turns_tf32_on():
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("medium")

        def test_2_sees_torchs_defaults():
            assert torch.backends.cuda.matmul.allow_tf32 is False
            assert torch.backends.cudnn.allow_tf32 is True
            assert torch.get_float32_matmul_precision() == "highest"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-q", "test_pair.py")
    result.assert_outcomes(passed=2)
