import subprocess
import sys

from cookmind.cli import COMMANDS


def test_help_lists_every_stage():
    out = subprocess.run([sys.executable, "-m", "cookmind", "--help"], capture_output=True, text=True, check=True).stdout
    for name in COMMANDS:
        assert name in out, f"`cookmind --help` does not list {name}"


def test_unknown_stage_is_an_error():
    proc = subprocess.run([sys.executable, "-m", "cookmind", "no-such-stage"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "invalid choice" in proc.stderr
