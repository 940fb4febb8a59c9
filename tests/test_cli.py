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


def test_resolve_model_dir_picks_the_newest_checkpoint_of_a_run(tmp_path):
    import torch
    from safetensors.torch import save_file

    from cookmind.model import resolve_model_dir

    run = tmp_path / "run"
    for step in (9, 10, 2):  # numeric order, not string order: step_10 is newest
        d = run / "checkpoints" / f"step_{step}"
        d.mkdir(parents=True)
        save_file({"w": torch.zeros(2)}, str(d / "model.safetensors"))
        (d / "config.json").write_text("{}")
    (run / "checkpoints" / "step_11").mkdir()  # no weights: not a model
    assert resolve_model_dir(run) == run / "checkpoints" / "step_10"
    assert resolve_model_dir(run / "checkpoints" / "step_2") == run / "checkpoints" / "step_2"
    assert resolve_model_dir(tmp_path / "absent") == tmp_path / "absent"


def test_bad_input_is_one_clear_line_not_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cookmind", "generate", "--checkpoint", str(tmp_path / "nope"),
                           "--prompt", "hi"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert str(tmp_path / "nope") in proc.stderr
