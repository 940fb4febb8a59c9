"""The typed config: presets load, dotted overrides convert types, unknown keys are errors."""

import pytest
import yaml

from cookmind.train.config import CONFIG_DIR, TrainConfig


def test_every_preset_loads_and_validates():
    names = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
    assert {"tiny-cpu", "demo", "gpt2-small", "minimind"} <= set(names)
    for name in names:
        cfg = TrainConfig.load(name)
        assert cfg.train.max_steps >= 1


def test_dotted_overrides_are_typed():
    cfg = TrainConfig.load(
        "tiny-cpu",
        [
            "optim.lr=3e-4",
            "train.max_steps=7",
            "train.compile=true",
            "lora.targets=[q_proj, v_proj]",
            "model.hidden_size=48",
        ],
    )
    assert cfg.optim.lr == pytest.approx(3e-4) and isinstance(cfg.optim.lr, float)
    assert cfg.train.max_steps == 7 and cfg.train.compile is True
    assert cfg.lora.targets == ["q_proj", "v_proj"]
    assert cfg.model["hidden_size"] == 48


@pytest.mark.parametrize(
    "override, match",
    [
        ("optim.lrr=1", "unknown key in section 'optim' 'lrr'.*did you mean 'lr'"),
        ("optimizer.lr=1", "unknown section 'optimizer'"),
        ("model.lm_head_fb8=true", "unknown key in section 'model' 'lm_head_fb8'.*did you mean 'lm_head_fp8'"),
        ("train.max_steps=abc", "expected an integer"),
        ("train.precision=fp8", "train.precision must be one of"),
        ("train.max_steps", "expected section.key=value"),
        ("optim.lr=[1", r"override 'optim.lr=\[1': not valid YAML at line 1, column 3"),  # was a yaml traceback
    ],
)
def test_bad_overrides_are_clear_errors(override, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig.load("tiny-cpu", [override])


def test_unknown_key_in_a_yaml_file_names_the_file(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("train:\n  max_step: 3\n")
    with pytest.raises(ValueError, match=r"bad.yaml.*max_step.*did you mean 'max_steps'"):
        TrainConfig.load(str(f))


def test_saved_config_round_trips(tmp_path):
    cfg = TrainConfig.load("tiny-cpu", ["optim.lr=0.01"])
    cfg.save(tmp_path / "config.yaml")
    again = TrainConfig.from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text()))
    assert again.to_dict() == cfg.to_dict()


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path):
    (tmp_path / "c.yaml").write_text("train:\n  max_steps: [1\n")  # was a yaml traceback
    with pytest.raises(ValueError, match=r"c.yaml: not valid YAML at line 3, column 1: expected ',' or '\]'"):
        TrainConfig.load(tmp_path / "c.yaml")


def test_a_window_longer_than_the_presets_context_is_left_to_the_init_from_models_own():
    """`train --init-from RUN data.window_size=300` from a model of context 512 was refused: 'longer than the
    model's context (model.max_position_embeddings=256)', the tiny-cpu preset's, which the loaded model replaces.
    The trainer checks the window against the loaded model's context; a context the user set is still checked here."""
    assert TrainConfig.load("tiny-cpu", ["train.init_from=runs/sft", "data.window_size=300"]).data.window_size == 300
    with pytest.raises(ValueError, match=r"data.window_size=300 is longer than the model's context"):
        TrainConfig.load("tiny-cpu", ["data.window_size=300"])  # a fresh model of the preset's context
    with pytest.raises(ValueError, match=r"\(model.max_position_embeddings=128\)"):
        TrainConfig.load(
            "tiny-cpu", ["train.init_from=runs/sft", "model.max_position_embeddings=128", "data.window_size=300"]
        )


@pytest.mark.parametrize(
    "where", [["train.device=cpu"], ["parallel.backend=gloo"], ["train.device=cpu", "parallel.backend=auto"]]
)
def test_bf16_gradient_reduction_through_torchs_ddp_on_gloo_is_refused_at_load(where):
    # torch's bf16 hook needs NCCL: the run was refused only once its model was built (wrap_data_parallel)
    with pytest.raises(ValueError) as e:
        TrainConfig.load(None, ["parallel.reduce_dtype=bf16", *where])
    line = str(e.value)
    assert line.startswith("parallel.reduce_dtype=bf16 with parallel.ddp=torch needs the NCCL backend"), line
    assert "parallel.ddp=ours" in line and "parallel.reduce_dtype=fp32" in line and "\n" not in line
    # ours reduces in bf16 on any backend; on CUDA the backend is NCCL
    TrainConfig.load(None, ["parallel.reduce_dtype=bf16", "parallel.ddp=ours", *where])
    TrainConfig.load(None, ["parallel.reduce_dtype=bf16", "train.device=cuda", "parallel.backend=nccl"])
