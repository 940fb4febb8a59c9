"""Alignment building blocks against hand-computed values and naive references."""

import math

import pytest
import torch

from cookmind.align import (
    compute_entropy,
    compute_group_normalized_rewards,
    compute_policy_gradient_loss,
    get_response_log_probs,
    grpo_microbatch_train_step,
    masked_mean,
    masked_normalize,
    sft_microbatch_train_step,
    tokenize_prompt_and_output,
)


def close(actual, expected, rtol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual).double(), torch.tensor(expected).double(), rtol=rtol, atol=1e-6)


class CharTok:
    """Each character is its code point; pad id 0."""

    pad_id = 0

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_tokenize_prompt_and_output_hand_computed():
    out = tokenize_prompt_and_output(["ab", "c"], ["xy", "z"], CharTok())
    a, b, c, x, y, z = (ord(ch) for ch in "abcxyz")
    # joins: [a b x y] and [c z] padded to [c z 0 0]; inputs drop the last, labels the first
    assert out["input_ids"].tolist() == [[a, b, x], [c, z, 0]]
    assert out["labels"].tolist() == [[b, x, y], [z, 0, 0]]
    assert out["response_mask"].tolist() == [[False, True, True], [True, False, False]]


def test_tokenize_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 prompts but 1 outputs"):
        tokenize_prompt_and_output(["a", "b"], ["c"], CharTok())


def test_compute_entropy_hand_computed_and_stable():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1000.0, 0.0, 0.0, 0.0], [math.log(3.0), 0.0, -1e9, -1e9]])
    h = compute_entropy(logits)
    assert h[0].item() == pytest.approx(math.log(4))  # uniform over 4
    assert h[1].item() == pytest.approx(0.0, abs=1e-6)  # one-hot, no overflow
    # p = (3/4, 1/4): H = -(3/4 ln 3/4 + 1/4 ln 1/4)
    assert h[2].item() == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)), rel=1e-5)


def test_get_response_log_probs_matches_log_softmax_gather():
    torch.manual_seed(0)
    table = torch.randn(7, 5)

    def model(ids):  # a callable returning logits: the small policy interface
        return table[ids]

    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    labels = torch.tensor([[2, 3, 4], [0, 1, 2]])
    out = get_response_log_probs(model, ids, labels, return_token_entropy=True)
    for b in range(2):
        for t in range(3):
            row = table[ids[b, t]]
            expect = row[labels[b, t]].item() - math.log(sum(math.exp(v) for v in row.tolist()))
            assert out["log_probs"][b, t].item() == pytest.approx(expect, rel=1e-5)
    p = torch.softmax(table[ids], -1)
    assert torch.allclose(out["token_entropy"], -(p * p.log()).sum(-1), atol=1e-5)


def test_masked_mean_and_normalize_hand_computed():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("inf"), 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    assert masked_mean(x, m).item() == pytest.approx((1 + 2 + 4 + 6) / 4)
    assert masked_mean(x, m, dim=1).tolist() == pytest.approx([1.5, 5.0])
    assert masked_mean(x, m, dim=0).tolist()[:1] == pytest.approx([2.5])
    assert masked_normalize(x, m, normalize_constant=2.0).item() == pytest.approx(13 / 2)
    assert masked_normalize(x, m, dim=1, normalize_constant=4.0).tolist() == pytest.approx([0.75, 2.5])


def test_group_normalized_rewards_hand_computed():
    def reward_fn(resp, gt):
        r = 1.0 if resp == gt else 0.0
        return {"reward": r, "format_reward": 1.0, "answer_reward": r}

    responses = ["1", "0", "1", "1", "2", "2", "2", "2"]
    truths = ["1"] * 4 + ["2"] * 4
    adv, raw, meta = compute_group_normalized_rewards(reward_fn, responses, truths, 4, 1e-6, True)
    assert raw.tolist() == [1, 0, 1, 1, 1, 1, 1, 1]
    # group 1: mean 0.75, unbiased std sqrt(((.25^2)*3 + .75^2)/3) = 0.5
    assert adv[:4].tolist() == pytest.approx([0.25 / 0.5, -0.75 / 0.5, 0.5, 0.5], rel=1e-5)
    assert adv[4:].tolist() == pytest.approx([0, 0, 0, 0])  # all equal: nothing to learn
    assert meta["frac_zero_std_groups"] == 0.5
    adv2, _, _ = compute_group_normalized_rewards(reward_fn, responses, truths, 4, 1e-6, False)
    assert adv2[:4].tolist() == pytest.approx([0.25, -0.75, 0.25, 0.25])
    with pytest.raises(ValueError, match="groups of 3"):
        compute_group_normalized_rewards(reward_fn, responses, truths, 3, 1e-6, True)


def test_policy_gradient_losses_hand_computed():
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    rewards = torch.tensor([[2.0], [0.0]])
    loss, _ = compute_policy_gradient_loss(lp, "no_baseline", raw_rewards=rewards)
    close(loss, [[2.0, 4.0], [0.0, 0.0]])  # -r * lp
    adv = torch.tensor([1.0, -1.0])
    loss, _ = compute_policy_gradient_loss(lp, "reinforce_with_baseline", advantages=adv)
    close(loss, [[1.0, 2.0], [-0.5, -0.1]])
    # grpo_clip, eps 0.2: ratios e^{0.5}=1.65 (A=+1 -> clipped at 1.2), e^{-0.5}=0.61 (A=+1 -> unclipped 0.61)
    # row 2 A=-1: ratio e^{0.3}=1.35 -> -min(-1.35, -1.2) = 1.35 (unclipped);
    #             ratio e^{-0.3}=0.74 -> -min(-.74,-.8)=0.8 (clipped)
    old = torch.tensor([[-1.5, -1.5], [-0.8, 0.2]])
    loss, meta = compute_policy_gradient_loss(lp, "grpo_clip", advantages=adv, old_log_probs=old, cliprange=0.2)
    close(loss, [[-1.2, -math.exp(-0.5)], [math.exp(0.3), 0.8]])
    assert meta["clipped"].tolist() == [[True, False], [False, True]]
    with pytest.raises(ValueError, match="unknown loss_type"):
        compute_policy_gradient_loss(lp, "ppo", advantages=adv)


def test_k3_kl_penalty_hand_computed():
    lp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.0, -1.0]])
    loss, meta = compute_policy_gradient_loss(
        lp, "reinforce_with_baseline", advantages=torch.zeros(1), ref_log_probs=ref, kl_coef=0.5
    )
    # k3 = e^{ref-lp} - (ref-lp) - 1: token 1 -> 0, token 2 -> e - 2
    close(meta["kl"], [[0.0, math.e - 2]])
    close(loss, [[0.0, 0.5 * (math.e - 2)]])


def test_sft_microbatch_train_step_loss_and_gradient():
    lp = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    loss, meta = sft_microbatch_train_step(lp, mask, gradient_accumulation_steps=2, normalize_constant=2.0)
    # per sequence: (1+2)/2 = 1.5 and (5+6)/2 = 5.5; batch mean 3.5; /2 accumulation
    assert loss.item() == pytest.approx(1.75)
    assert meta["loss_unscaled"].item() == pytest.approx(3.5)
    # d loss / d lp = -mask / (normalize_constant * batch * accumulation)
    close(lp.grad, (-mask / 8.0).tolist())


@pytest.mark.parametrize(
    "norm, expected",
    [
        ("sequence", ((1 + 2) / 2 + (-3) / 1) / 2),  # per-sequence means, then batch mean
        ("token", (1 + 2 - 3) / 3),  # all response tokens equally
        ("constant", ((1 + 2) / 4 + (-3) / 4) / 2),  # Dr. GRPO: divide by a constant 4
    ],
)
def test_grpo_microbatch_train_step_normalisations(norm, expected):
    lp = torch.tensor([[-1.0, -2.0, -9.0], [-3.0, -9.0, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0])
    # reinforce_with_baseline: per-token loss = -A * lp -> [[1, 2, .], [-3, ., .]]
    loss, meta = grpo_microbatch_train_step(
        lp, mask, 1, "reinforce_with_baseline", advantages=adv, length_normalization=norm, normalize_constant=4.0
    )
    assert loss.item() == pytest.approx(expected)
    assert lp.grad[0, 2].item() == 0 and lp.grad[1, 1].item() == 0  # no gradient outside the response


def test_grpo_clip_train_step_reports_clip_fraction_and_scales():
    lp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.0, 0.0]])  # ratio e, 1
    loss, meta = grpo_microbatch_train_step(
        lp, torch.ones(1, 2), 4, "grpo_clip", advantages=torch.tensor([1.0]), old_log_probs=old, cliprange=0.2
    )
    assert meta["clip_fraction"].item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx(-(1.2 + 1.0) / 2 / 4)
    # clipped token has no gradient; the other has d/dlp (-ratio*A)/(2*4) = -1/8
    close(lp.grad, [[0.0, -0.125]])


def test_the_base_reference_of_a_cookmind_lora_model_is_the_model_before_its_adapters():
    # `train --objective grpo lora.enabled=true grpo.kl_coef=0.1 grpo.reference=base` stopped with "reference 'base'
    # needs a LoRA model (peft, or one with disable_adapters()); use 'copy'": cookmind's own LoRA was not seen
    import copy

    from lm_fixtures import tiny_lm

    from cookmind.align.losses import get_response_log_probs
    from cookmind.align.reference import Reference
    from cookmind.model.lora import apply_lora, lora_modules

    torch.manual_seed(0)
    model = tiny_lm()
    base = copy.deepcopy(model)
    apply_lora(model, r=2, alpha=4)
    for _, m in lora_modules(model):  # trained adapters: the policy now differs from its base
        for p in m.parameters():
            if p.requires_grad:
                p.data.normal_()
    ids = torch.randint(0, 32, (2, 6))
    labels = torch.randint(0, 32, (2, 6))
    expected = get_response_log_probs(base, ids, labels)["log_probs"]
    policy = get_response_log_probs(model, ids, labels)["log_probs"]
    assert not torch.allclose(policy, expected)
    torch.testing.assert_close(Reference(model, "base").log_probs(ids, labels), expected)
    torch.testing.assert_close(get_response_log_probs(model, ids, labels)["log_probs"], policy)  # adapters back on
