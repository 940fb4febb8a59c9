"""The training and inference cores import without the server's and curation's packages.

A GPU machine (or a user's training box) may hold torch and the model's needs only: the engine once imported
jsonschema through the stop-token rule (``cookmind.infer.stop`` -> ``tool_calls``), and every GPU test stopped at
collection. Each module below is imported in a fresh interpreter that refuses those packages.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CORE = [
    "cookmind.infer",
    "cookmind.infer.engine",
    "cookmind.infer.stop",
    "cookmind.train.trainer",
    "cookmind.align.objective",
    "cookmind.model",
]
SERVING_AND_CURATION = ["jsonschema", "fastapi", "uvicorn", "openai", "ray", "resiliparse", "datasketch"]

GUARD = """
import builtins, importlib, sys
blocked = set(sys.argv[1].split(","))
real = builtins.__import__
def guard(name, *args, **kwargs):
    if name.split(".")[0] in blocked:
        raise ImportError(f"{name} is not installed here")
    return real(name, *args, **kwargs)
builtins.__import__ = guard
importlib.import_module(sys.argv[2])
"""


@pytest.mark.parametrize("module", CORE)
def test_the_core_imports_without_serving_or_curation_packages(module):
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-c", GUARD, ",".join(SERVING_AND_CURATION), module],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr.strip().splitlines()[-1:]
