"""parallel.fsdp (FSDP2) on two gloo processes: the same weights as one process with the same global batch, for
pretrain (with activation checkpointing and gradient accumulation), SFT, DPO (its reference sharded too) and LoRA;
GRPO's rollouts see the current weights and its KL reference (grpo.reference=copy) is a sharded copy; evaluation
runs through the sharded model (a block gathered at a time) and equals one process's; and the combinations that
cannot work are refused.

Tolerance: not bit for bit. Each rank computes its half of the batch's gradient and FSDP sums the halves in its
reduce-scatter, where one process sums over the whole batch inside its matmuls: the fp32 sums run in another
order (the same reason DDP is not bit for bit; gradients differ by ~3e-8). AdamW divides by sqrt(v), which
magnifies that noise where a gradient element is near zero, so ATOL is 5e-5 (a few such elements in thousands
differ by 1-2e-5), rtol 1e-4, against weights that move by ~1e-2 per step here. On one rank, where nothing is
summed in another order, FSDP equals the plain model bit for bit (the last test).
"""

import json
import os

import numpy as np
import pytest
import torch
from gloo_fixtures import run_on_gloo_ranks
from lm_fixtures import MICRO, TINY, tiny_config, tiny_lm
from torch.distributed.tensor import DTensor

from cookmind.store import write_store
from cookmind.train import TrainConfig, Trainer

STEPS = 2
ATOL, RTOL = 5e-5, 1e-4  # see the module docstring
CLIP = 0.03  # below the gradient norms here: clipping by the norm over all shards is part of what is compared
# scenario -> (objective, train store, config sections beside the common ones)
SCENARIOS = {
    "pretrain": (
        "pretrain",
        "seq",
        {"train": {"activation_checkpointing": True, "grad_accum_steps": 2}, "parallel": {"fsdp_prefetch": True}},
    ),
    "sft": ("sft", "sft", {"parallel": {"reshard_after_forward": False}}),
    "dpo": ("dpo", "dpo", {"parallel": {"fsdp_unit_blocks": 2}}),  # the two blocks one unit
    "lora": ("sft", "sft", {"lora": {"enabled": True, "r": 4, "alpha": 8, "targets": ["q_proj", "v_proj"]}}),
}


OBJECTIVE_METRICS = {  # per scenario: metrics its objective logs besides the loss
    "sft": ("supervised_tokens",),
    "dpo": ("reward_chosen", "reward_margin", "reward_accuracy"),
}


def _write_data(root: str) -> None:
    """Stores whose records all have the same length. SFT's records train different numbers of tokens (3 to 12):
    its loss is the mean over the global batch's supervised tokens on every rank's split (a mean of the ranks'
    means weighed them unequally, and two processes trained another model than one). DPO's pairs train the same
    number: its loss is a mean over pairs, and its NLL term a mean over each micro-batch's tokens."""
    rng = np.random.default_rng(0)
    write_store(f"{root}/seq", "seq", [{"sequence": rng.integers(1, 64, size=70)} for _ in range(8)], vocab_size=64)
    # 4 validation windows: one batch of 4 in one process, two batches of 2 (micro_batch_size) under FSDP
    write_store(f"{root}/val", "seq", [{"sequence": rng.integers(1, 64, size=33)} for _ in range(2)], vocab_size=64)
    # 6 windows: 3 batches of 2 on 2 ranks, so rank 1 runs a padding forward in the second round
    write_store(f"{root}/val3", "seq", [{"sequence": rng.integers(1, 64, size=33)} for _ in range(3)], vocab_size=64)
    mask = np.array([0] * 6 + [1] * 10)
    sft = [
        {"sequence": rng.integers(1, 64, size=16), "loss_mask": np.array([0] * (16 - n) + [1] * n)}
        for n in (3, 12, 5, 9, 4, 11, 6, 8) * 2
    ]
    write_store(f"{root}/sft", "sft", sft, vocab_size=64)
    dpo = [
        {
            "chosen": c,
            "chosen_mask": mask,
            "rejected": np.concatenate([c[:6], rng.integers(1, 64, 10)]),
            "rejected_mask": mask,
        }
        for c in (rng.integers(1, 64, size=16) for _ in range(16))
    ]
    write_store(f"{root}/dpo", "dpo", dpo, vocab_size=64)
    torch.manual_seed(5)
    from cookmind.model.model_io import save_model

    save_model(f"{root}/init", tiny_lm())


def _cfg(root: str, name: str, fsdp: bool, world: int) -> TrainConfig:
    objective, store, extra = SCENARIOS[name]
    accum = extra.get("train", {}).get("grad_accum_steps", 1)
    d = {
        "data": {"train_path": f"{root}/{store}", "window_size": 16},
        "train": {
            "objective": objective,
            "max_steps": STEPS,
            "micro_batch_size": 4 // world,
            "device": "cpu",
            "seed": 3,
            "threads": 1,
            "init_from": f"{root}/init",
            **extra.get("train", {}),
            "grad_accum_steps": accum,
        },
        "optim": {"lr": 1e-2, "warmup_steps": 1, "grad_clip": CLIP},
        "parallel": {"fsdp": fsdp, "backend": "gloo", **extra.get("parallel", {})},
        "checkpoint": {"every": 0},
        "eval": {"every": 0},
        "logging": {
            "run_dir": f"{root}/{name}-{'fsdp' if fsdp else 'one'}",
            "progress": False,
            "report": False,
            "log_every": 1,
        },
    }
    if "lora" in extra:
        d["lora"] = extra["lora"]
    if name == "pretrain":  # evaluation under FSDP: each rank its share of the batches through the sharded model
        d["data"]["val_path"] = f"{root}/val"
        d["eval"] = {"every": 2, "max_batches": 4}
    if name == "dpo":  # the sharded reference runs in evaluation too: on every rank (rank 0 alone would hang)
        d["data"]["val_path"] = f"{root}/dpo"
        d["eval"] = {"every": 2, "max_batches": world}  # the same 4 pairs: 1 batch of 4, or 2 of 2
    return TrainConfig.from_dict(d)


def _full_state(model) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered on every rank, kept on rank 0
    return get_model_state_dict(model, options=opts)


def _fsdp_ranks(rank: int) -> dict:
    from cookmind.parallel import find_blocks

    root = os.environ["FSDP_TEST_ROOT"]
    out = {}
    for name in SCENARIOS:
        trainer = Trainer(_cfg(root, name, fsdp=True, world=2))
        assert all(isinstance(p, DTensor) for p in trainer.bare_model.parameters()), "not sharded"
        units = {id(b._get_fsdp_state()) for b in find_blocks(trainer.bare_model)}
        assert len(units) == (1 if name == "dpo" else 2), (name, units)
        trainer.fit()
        out[name] = {"state": _full_state(trainer.bare_model), "eval": trainer.last_eval}
    out["evaluation"] = _eval_checks(rank)
    out["grpo"] = _grpo_checks(rank)
    return out


def _eval_cfg(root: str, fsdp: bool) -> TrainConfig:
    cfg = _cfg(root, "pretrain", fsdp=fsdp, world=2)  # micro-batches of 2 in both: the same 3 validation batches
    cfg.data.val_path, cfg.eval.max_batches = f"{root}/val3", 10
    cfg.logging.run_dir = f"{root}/eval-{'fsdp' if fsdp else 'one'}"
    return cfg


def _eval_checks(rank: int) -> dict:
    """Evaluation before any step (every rank holds the starting weights): the validation loss over 3 batches,
    how many blocks held their gathered weights at once, the block forwards run, and the calls to
    ``gathered_weights`` (the whole model on every rank) made meanwhile."""
    import cookmind.train.trainer as trainer_module
    from cookmind.parallel import find_blocks

    trainer = Trainer(_eval_cfg(os.environ["FSDP_TEST_ROOT"], fsdp=True))
    blocks = find_blocks(trainer.bare_model)
    gathered = []  # at each block's forward (after FSDP's own pre-forward gathered it): blocks holding full weights

    def count(module, args):
        gathered.append(sum(not isinstance(next(b.parameters()), DTensor) for b in blocks))

    hooks = [b.register_forward_pre_hook(count) for b in blocks]
    gathers = []
    real = trainer_module.gathered_weights

    def counting(model):
        gathers.append(model)
        return real(model)

    trainer_module.gathered_weights = counting
    try:
        result = trainer.evaluate(0)
    finally:
        trainer_module.gathered_weights = real
        for h in hooks:
            h.remove()
    after = [isinstance(p, DTensor) for p in trainer.bare_model.parameters()]
    return {"eval": result, "gathered": gathered, "gathers": len(gathers), "resharded": all(after)}


def test_fsdp_on_two_ranks_equals_one_process(tmp_path, keep_threads):
    root = str(tmp_path)
    _write_data(root)
    os.environ["FSDP_TEST_ROOT"] = root  # the spawned ranks inherit it
    try:
        ranks = run_on_gloo_ranks(_fsdp_ranks, 2, tmp_path)
    finally:
        del os.environ["FSDP_TEST_ROOT"]
    torch.set_num_threads(1)
    from cookmind.model import load_model

    init = load_model(f"{root}/init").state_dict()
    for name in SCENARIOS:
        one = Trainer(_cfg(root, name, fsdp=False, world=1))
        one.fit()
        want = one.bare_model.state_dict()
        got = ranks[0][name]["state"]
        assert set(got) == set(want), name
        start = {**init, **{k: torch.zeros_like(v) for k, v in want.items() if ".lora_B." in k}}  # B starts at 0
        moved = max((want[k] - start[k]).abs().max().item() for k in start if k in want)
        assert moved > 1e-3, f"{name}: training must have changed the weights"
        for k in want:
            torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=RTOL, msg=f"{name} {k}")
        norms = [_logged(f"{root}/{name}-{kind}") for kind in ("fsdp", "one")]
        assert norms[0] == pytest.approx(norms[1], rel=1e-4) and max(norms[1]) > CLIP, name
        # the objective's own metrics are the global batch's, as the loss is: they were rank 0's half alone
        # (reward_accuracy 0.25 against 0.5, supervised_tokens halved)
        for key in OBJECTIVE_METRICS.get(name, ()):
            got_m, want_m = (_logged(f"{root}/{name}-{kind}", key) for kind in ("fsdp", "one"))
            assert got_m == pytest.approx(want_m, rel=1e-4, abs=1e-6), (name, key, got_m, want_m)
        if name == "lora":  # the frozen base stayed where it was, sharded or not
            assert all(torch.equal(got[k], init[k]) for k in init)
        if name in ("pretrain", "dpo"):  # the ranks evaluated a batch each; rank 0 has the result (one of 4 here)
            assert ranks[1][name]["eval"] == {}
            assert ranks[0][name]["eval"]["val_loss"] == pytest.approx(one.last_eval["val_loss"], rel=1e-5), name
    _check_evaluation(ranks, root)
    _check_grpo(ranks)


def _check_evaluation(ranks, root: str) -> None:
    # The same batches through the same weights: the forwards equal one process's, only the sum of the three
    # batch losses runs in another order (rank 0's two, then rank 1's), hence rel 1e-6.
    one = Trainer(_eval_cfg(root, fsdp=False)).evaluate(0)
    got = ranks[0]["evaluation"]
    assert set(got["eval"]) == set(one) and one["val_loss"] > 0
    for k in one:
        assert got["eval"][k] == pytest.approx(one[k], rel=1e-6), k
    assert ranks[1]["evaluation"]["eval"] == {}  # the results are rank 0's
    for r in ranks:
        e = r["evaluation"]
        assert e["gathers"] == 0, "evaluation gathered the whole model"
        assert len(e["gathered"]) == 2 * 2  # 2 blocks x 2 rounds on each rank: rank 1 padded its second
        assert max(e["gathered"]) == 1, f"blocks gathered at once: {e['gathered']}"
        assert e["resharded"], "evaluation left weights gathered"


def _logged(run_dir: str, key: str = "grad_norm") -> list[float]:
    """What a run logged for ``key`` (default the gradient norm before clipping), one per step."""
    with open(f"{run_dir}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [r[key] for r in rows if r["split"] == "train"]


# -- GRPO -------------------------------------------------------------------------------------------------------


def _grpo_trainer(rank: int, fsdp: bool, run_dir: str, **grpo):
    from test_align_fixtures import XYZ, x_fraction

    from cookmind.align.objective import GRPOConfig, GRPOObjective
    from cookmind.model import CookMindLM

    torch.manual_seed(0)  # the same start on every rank and in both runs
    model = CookMindLM(tiny_config(**MICRO, vocab_size=5, max_position_embeddings=32))
    problems = [{"question": "?" * k, "answer": ""} for k in range(1, 9)]
    objective = GRPOObjective(
        GRPOConfig(group_size=4, max_new_tokens=4, template="{question}", stop_strings=(), **grpo),
        reward_fn=x_fraction,
        problems=problems,
    )
    cfg = TrainConfig.from_dict(
        {
            "train": {"objective": "grpo", "max_steps": 2, "micro_batch_size": 2, "device": "cpu", "seed": 0},
            "optim": {"lr": 1e-2, "schedule": "constant"},
            "parallel": {"backend": "gloo", "fsdp": fsdp},
            "checkpoint": {"every": 0},
            "logging": {
                "run_dir": f"{run_dir}/grpo-{fsdp}-0",  # rank 0's on every rank (ranks must agree)
                "progress": False,
                "report": False,
                "log_every": 1,
            },
        }
    )
    return Trainer(cfg, model=model, objective=objective, tokenizer=XYZ())


KL = {"kl_coef": 0.5, "reference": "copy"}  # a frozen copy of the start: under FSDP a sharded one


def _grpo_checks(rank: int) -> dict:
    """On each rank, from the same start: the sharded model's rollouts equal the plain model's (the sampler draws
    alike, so any difference is in the weights the rollouts saw); then two GRPO steps with a KL term to a copied
    reference under FSDP and under DDP, whose later rollouts come from the updated weights; the sharded
    reference; the rollout back end; and the refused setting."""
    root = os.environ["FSDP_TEST_ROOT"]
    fsdp_run, ddp_run = _grpo_trainer(rank, True, root, **KL), _grpo_trainer(rank, False, root, **KL)
    start = {k: v.clone() for k, v in ddp_run.bare_model.state_dict().items()}
    rollouts = []
    for run in (fsdp_run, ddp_run):
        batch = run.objective.next_batch(run)
        rollouts.append(run.objective.prepare(run.model, batch))
    keys = ("input_ids", "response_mask", "raw_rewards")
    out = {"rollouts_equal": all(torch.equal(rollouts[0][k], rollouts[1][k]) for k in keys)}
    out["responses"] = rollouts[0]["input_ids"]
    fsdp_run.fit()
    ddp_run.fit()
    out["fsdp"] = _full_state(fsdp_run.bare_model)
    out["ddp"] = {k: v.clone() for k, v in ddp_run.bare_model.state_dict().items()}
    ref = fsdp_run.objective.reference.model
    out["ref_sharded"] = all(isinstance(p, DTensor) for p in ref.parameters())
    out["ref_frozen"] = all(torch.equal(v, start[k]) for k, v in _full_state(ref).items())
    out["kl"] = [_logged(f"{root}/grpo-{fsdp}-{rank}", "kl") for fsdp in (True, False)] if rank == 0 else None
    from cookmind.align.objective import rollout_options

    out["engine"] = rollout_options(fsdp_run.objective.cfg, fsdp_run.model)["engine"]
    try:
        _grpo_trainer(rank, True, f"{root}/serving", engine="serving")
        out["serving"] = None
    except ValueError as exc:
        out["serving"] = str(exc)
    return out


def _check_grpo(ranks) -> None:
    for r in ranks:
        g = r["grpo"]
        assert g["rollouts_equal"], "rollouts of the sharded model differ from the plain model's"
        assert g["ref_sharded"] and g["ref_frozen"], "the reference is not a frozen sharded copy of the start"
        assert "grpo.engine=serving keeps an engine over weights that parallel.fsdp gathers" in g["serving"]
        assert g["engine"] == "builtin"  # "auto" under FSDP: the plain loop
    assert not torch.equal(ranks[0]["grpo"]["responses"], ranks[1]["grpo"]["responses"])  # ranks roll out apart
    kl_fsdp, kl_ddp = ranks[0]["grpo"]["kl"]  # the KL to the reference as logged, a value per step
    assert kl_fsdp == pytest.approx(kl_ddp, rel=1e-4) and kl_fsdp[0] < 1e-9 and kl_fsdp[-1] > 1e-6, (kl_fsdp, kl_ddp)
    got, want = ranks[0]["grpo"]["fsdp"], ranks[0]["grpo"]["ddp"]
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=ATOL, rtol=RTOL, msg=f"grpo {k}")


# -- refused combinations and one rank ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"parallel": {"ddp": "ours"}}, "cannot go inside parallel.ddp=ours"),
        ({"parallel": {"zero1": True}}, "shards the optimizer state already; set parallel.zero1=false"),
        ({"train": {"cuda_graph": "true"}}, "train.cuda_graph=true cannot capture FSDP's collectives"),
    ],
)
def test_fsdp_refuses_what_cannot_work(setting, message):
    d = {"parallel": {"fsdp": True}}
    for section, values in setting.items():
        d.setdefault(section, {}).update(values)
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_dict(d)


def test_fsdp_in_one_process_is_a_one_rank_group_and_trains_like_the_plain_model(tmp_path, keep_threads):
    import torch.distributed as dist

    _write_data(str(tmp_path))
    assert not dist.is_initialized()
    try:
        sharded = Trainer(_cfg(str(tmp_path), "sft", fsdp=True, world=1))
        assert dist.get_world_size() == 1
        sharded.fit()
        got = _full_state(sharded.bare_model)
    finally:
        dist.destroy_process_group()
    plain = Trainer(_cfg(str(tmp_path), "sft", fsdp=False, world=1))
    plain.fit()
    for k, v in plain.bare_model.state_dict().items():  # one rank: nothing is summed in another order
        torch.testing.assert_close(got[k], v, rtol=0, atol=0, msg=k)
    assert sharded.step == STEPS


def test_a_sharded_reference_copy_of_a_wrapped_lora_model_gives_the_plain_models_log_probs(keep_threads):
    # One rank: the copy is rebuilt from the class and config (LoRA re-applied), sharded, and filled from a policy
    # whose blocks are checkpoint-wrapped (other parameter names); a deep copy of the plain model is the reference.
    import copy
    import functools

    import torch.distributed as dist

    from cookmind.align.losses import get_response_log_probs
    from cookmind.align.reference import Reference
    from cookmind.model.lora import apply_lora
    from cookmind.parallel import apply_activation_checkpointing, init_distributed, shard_frozen, shard_model

    init_distributed("cpu", "gloo", group_of_one=True)
    try:
        torch.manual_seed(0)
        model = tiny_lm()
        apply_lora(model, 4, 8, 0.0, ["q_proj", "v_proj"])
        with torch.no_grad():  # adapters that change the output, so a copy without them would differ
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_()
        plain = copy.deepcopy(model)
        apply_activation_checkpointing(model)
        shard_model(model)
        with pytest.raises(ValueError, match="needs shard="):
            Reference(model, "copy")
        cfg = TrainConfig.from_dict({"parallel": {"fsdp": True}})
        ref = Reference(model, "copy", shard=functools.partial(shard_frozen, cfg=cfg))
        ids = torch.randint(0, 64, (2, 9))
        got = ref.log_probs(ids, ids)
        params = list(ref.model.parameters())
    finally:
        dist.destroy_process_group()
    want = get_response_log_probs(plain, ids, ids)["log_probs"]
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # one rank: the same weights, the same arithmetic
    assert all(isinstance(p, DTensor) and not p.requires_grad for p in params)


assert TINY["vocab_size"] == 64  # the stores above draw tokens below it


# -- on GPUs (the lead's device runs) ----------------------------------------------------------------------------


def _gpu_cfg(root: str, tag: str, fsdp: bool) -> TrainConfig:
    cfg = _cfg(root, "pretrain", fsdp=fsdp, world=1)
    cfg.train.device, cfg.train.precision, cfg.train.compile = "cuda", "bf16", True
    cfg.train.max_steps, cfg.parallel.backend = 6, "auto"
    cfg.logging.run_dir = f"{root}/gpu-{tag}"
    return cfg


@pytest.mark.gpu
def test_fsdp_bf16_compiled_checkpointed_on_one_gpu_tracks_the_plain_run(tmp_path):
    # One GPU, a one-rank NCCL group: FSDP with bf16 gathers, per-block compile, activation checkpointing, our
    # fused AdamW (device-side skip, DTensor parameters) and evaluation on the gathered weights. FSDP casts every
    # weight (the norms' too) to bf16 where autocast keeps the norms in fp32: close, not equal (1% per step).
    import torch.distributed as dist

    root = str(tmp_path)
    _write_data(root)
    try:
        sharded = Trainer(_gpu_cfg(root, "fsdp", True))
        sharded.fit()
    finally:
        dist.destroy_process_group()
    plain = Trainer(_gpu_cfg(root, "plain", False))
    plain.fit()
    for key in ("loss", "grad_norm"):
        assert _logged(f"{root}/gpu-fsdp", key) == pytest.approx(_logged(f"{root}/gpu-plain", key), rel=1e-2), key
    assert sharded.last_eval["val_loss"] == pytest.approx(plain.last_eval["val_loss"], rel=1e-2)


@pytest.mark.gpu
def test_fsdp_builds_the_model_on_the_host_and_sharding_puts_every_weight_and_buffer_on_the_gpu(tmp_path):
    # Under FSDP the Trainer leaves the fresh model on the CPU and fully_shard moves each block's weights to the
    # GPU as it shards them (so the whole model never sits on one GPU): nothing may stay behind on the CPU
    import torch.distributed as dist

    root = str(tmp_path)
    _write_data(root)
    cfg = _gpu_cfg(root, "placed", True)
    cfg.train.compile, cfg.train.max_steps = False, 2
    try:
        trainer = Trainer(cfg)
        left = [
            n
            for n, t in [*trainer.bare_model.named_parameters(), *trainer.bare_model.named_buffers()]
            if t.device.type != "cuda"
        ]
        assert not left, f"left on the host: {left}"
        assert all(isinstance(p, DTensor) for p in trainer.bare_model.parameters())
        trainer.fit()
    finally:
        dist.destroy_process_group()
    assert trainer.step == 2


@pytest.mark.gpu
def test_a_sharded_reference_copy_on_one_gpu_gives_the_policys_log_probs():
    # A one-rank NCCL group, bf16 gathers: the copy (meta-built, to_empty on the GPU, filled shard by shard) runs
    # the same weights in the same dtype through the same kernels as the sharded policy itself, so it is exact.
    import functools

    import torch.distributed as dist

    from cookmind.align.losses import get_response_log_probs
    from cookmind.align.reference import Reference
    from cookmind.parallel import init_distributed, shard_frozen, shard_model

    info = init_distributed("cuda", "nccl", group_of_one=True)
    try:
        torch.manual_seed(0)
        model = tiny_lm().to(info.device)
        shard_model(model, param_dtype=torch.bfloat16)
        cfg = TrainConfig.from_dict({"train": {"precision": "bf16"}, "parallel": {"fsdp": True}})
        ref = Reference(model, "copy", shard=functools.partial(shard_frozen, cfg=cfg))
        ids = torch.randint(0, 64, (2, 9), device=info.device)
        with torch.no_grad():
            want = get_response_log_probs(model, ids, ids)["log_probs"]
        got = ref.log_probs(ids, ids)
        assert all(p.device.type == "cuda" for p in ref.model.parameters())
    finally:
        dist.destroy_process_group()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fsdp_over_a_run_of_our_ddp_names_a_way_out_that_loads():
    """Resuming a parallel.ddp=ours run with parallel.fsdp=true said "drop parallel.ddp": the run's config.yaml keeps
    `ddp: ours`, and parallel.ddp=null is no value. The message names parallel.ddp=torch, and that setting loads."""
    with pytest.raises(ValueError) as exc:
        TrainConfig.from_dict({"parallel": {"fsdp": True, "ddp": "ours"}})
    assert "set parallel.ddp=torch" in str(exc.value), exc.value
    assert TrainConfig.from_dict({"parallel": {"fsdp": True, "ddp": "torch"}}).parallel.fsdp
