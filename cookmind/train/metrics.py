"""Training metrics: ``metrics.jsonl`` (one JSON object per line) and model FLOP utilisation.

MFU = achieved FLOP/s / peak FLOP/s, with achieved = tokens/s x FLOPs per token
(6 N + 12 L H D T for forward + backward, from ``CookMindLM.flops_per_token``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

# what the Trainer logs of every step besides the loss and the objective's own metrics (metrics.jsonl's train rows)
STEP_BOOKKEEPING = ("lr", "grad_norm", "tokens", "tokens_per_s", "step_time_s", "skipped_steps", "mfu")


def training_metric_names(rows) -> list[str]:
    """The loss and the objective's own metrics (GRPO's reward, DPO's reward margin, ...) named in train rows, in
    the order first logged: every key but the step, the split and ``STEP_BOOKKEEPING``."""
    skip = ("step", "split", *STEP_BOOKKEEPING)
    return [k for k in dict.fromkeys(k for r in rows for k in r) if k not in skip]


def is_number(value) -> bool:
    """A logged number (not a bool, which Python counts as an int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Dense bf16 tensor-core peaks (no sparsity), FLOP/s.
_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "4090": 165e12}


def peak_flops(device: torch.device) -> float | None:
    """The device's bf16 peak FLOP/s, or None when unknown (CPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in _PEAK_BF16.items():
        if key in name:
            return value
    return None


def to_float(v: Any) -> Any:
    """A JSON-friendly scalar from a tensor/number (non-finite floats stay, as NaN/Infinity)."""
    if torch.is_tensor(v):
        return float(v.detach().float().item()) if v.numel() == 1 else v.detach().float().mean().item()
    return v


class MetricsWriter:
    """Append JSON lines to ``<run_dir>/metrics.jsonl`` (rank 0 only)."""

    def __init__(self, path: str | Path, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled  # the folder is made by the first write: a run that never starts leaves none

    def write(self, record: dict[str, Any]) -> None:
        """One line; floats rounded to 6 significant digits to keep the file readable."""
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        clean = {k: _round(to_float(v)) for k, v in record.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")

    def rewind(self, step: int) -> list[int]:
        """Drop the rows logged after ``step``: a resume from the checkpoint at ``step`` trains those steps again, and
        an attempt killed between checkpoints logged them once already (the plots and report would read both). A
        line a kill cut short (after the last end of line) goes too, as -1. Returns the steps of the rows dropped
        (rewritten atomically). Any other line that is not JSON is damage, not a cut write: among the rows dropped
        (after one logged past ``step``: rows are logged in step order; or every step dropped, ``step`` below 0) it
        goes with them, -1 too, a warning naming its file:line; before them its step is unknown and dropping it may
        lose a row the resume keeps, so a ValueError names its file:line, the file left as it was (``read_metrics``
        refuses it too, at the run's report)."""
        if not self.enabled or not self.path.is_file():
            return []
        keep, dropped = [], []
        lines = self.path.read_text().split("\n")  # the last item: what follows the last newline ("" in a whole file)
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                if n < len(lines) and step >= 0 and not any(s >= 0 for s in dropped):
                    raise ValueError(
                        f"{self.path}:{n}: not a JSON row ({exc}), among the rows a resume from step {step} keeps; "
                        "fix or remove the line, then resume"
                    ) from None
                if n < len(lines):
                    import warnings

                    warnings.warn(
                        f"{self.path}:{n}: not a JSON row ({exc}); dropped with the rows logged after step {step}",
                        stacklevel=2,
                    )
                dropped.append(-1)  # the last line of a killed write, or a damaged one among those dropped
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step:
                dropped.append(record["step"])
            else:
                keep.append(line)
        if dropped:
            from cookmind.atomic import write_text

            write_text(self.path, "".join(line + "\n" for line in keep))
        return dropped


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl (missing file -> []). A last line without its newline that does not parse (the
    trainer still writing it, or a kill that cut it) is left out with a warning; any other bad line is a ValueError
    naming its file:line."""
    p = Path(path)
    if not p.is_file():
        return []
    text = p.read_text()
    lines = text.split("\n")  # the last item: what follows the last newline ("" in a whole file)
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as exc:
            if n == len(lines):
                import warnings

                warnings.warn(
                    f"{p}:{n}: the last line is cut short ({len(line.encode())} bytes with no end of line: a row the "
                    "run is still writing, or one a kill cut); read without it",
                    stacklevel=2,
                )
                break
            raise ValueError(f"{p}:{n}: not a JSON row ({exc}); fix or remove the line") from None
    return rows


def _round(v: Any) -> Any:
    if isinstance(v, float) and math.isfinite(v) and v != 0:
        return float(f"{v:.6g}")
    return v
