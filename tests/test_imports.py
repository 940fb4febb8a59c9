"""The training and inference cores import without the server's and curation's packages.

A GPU machine (or a user's training box) may hold torch and the model's needs only: the engine once imported
jsonschema through the stop-token rule (``cookmind.infer.stop`` -> ``tool_calls``), and every GPU test stopped at
collection. The modules below are imported in a fresh interpreter that refuses those packages.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
import builtins, importlib, sys, traceback
blocked = set(sys.argv[1].split(","))
real = builtins.__import__
def guard(name, *args, **kwargs):
    if name.split(".")[0] in blocked:
        raise ImportError(f"{name} is not installed here")
    return real(name, *args, **kwargs)
builtins.__import__ = guard
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except Exception as exc:
        print(f"{module}: {type(exc).__name__}: {exc}")
"""


def test_the_core_imports_without_serving_or_curation_packages():
    """Every core module in one interpreter that refuses those packages (one interpreter, not one per module: each
    start imports torch, seconds a module; the guard refuses a blocked package whichever module imports it first),
    each module's failure named."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-c", GUARD, ",".join(SERVING_AND_CURATION), *CORE],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=180,
    )
    assert run.returncode == 0, run.stderr.strip().splitlines()[-1:]
    assert run.stdout == "", run.stdout


def test_the_guard_names_a_module_that_imports_a_blocked_package():
    """The check can fail: with fastapi refused, the server's module fails and is named; the core beside it does
    not."""
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run(
        [sys.executable, "-c", GUARD, "fastapi", "cookmind.infer.server.app", "cookmind.infer.stop"],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=180,
    )
    lines = run.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cookmind.infer.server.app: ImportError: fastapi"), run.stdout
