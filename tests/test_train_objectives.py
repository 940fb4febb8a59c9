"""DPO / SFT / pretrain objectives against hand-computed values and naive references."""

import math

import pytest
import torch
import torch.nn.functional as F
from lm_fixtures import tiny_lm

from cookmind.train.objectives import DPOObjective, PretrainObjective, SFTObjective, dpo_loss, sequence_log_probs


def _log1pexp(x):
    return math.log(1 + math.exp(x))


def test_dpo_loss_sigmoid_ipo_and_label_smoothing_hand_computed():
    pc, pr, rc, rr = (torch.tensor([v]) for v in (-1.0, -3.0, -2.0, -2.5))
    # h = (-1 - -3) - (-2 - -2.5) = 2 - 0.5 = 1.5; beta h = 0.75
    assert dpo_loss(pc, pr, rc, rr, beta=0.5).item() == pytest.approx(_log1pexp(-0.75), abs=1e-6)
    # IPO: (h - 1/(2 beta))^2 = (1.5 - 1)^2
    assert dpo_loss(pc, pr, rc, rr, beta=0.5, loss_type="ipo").item() == pytest.approx(0.25, abs=1e-6)
    # cDPO: 0.9 * -log sigma(0.75) + 0.1 * -log sigma(-0.75)
    want = 0.9 * _log1pexp(-0.75) + 0.1 * _log1pexp(0.75)
    got = dpo_loss(pc, pr, rc, rr, beta=0.5, label_smoothing=0.1).item()
    assert got == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="sigmoid"):
        dpo_loss(pc, pr, rc, rr, beta=0.5, loss_type="hinge")


def test_sequence_log_probs_matches_a_naive_loop():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 7)
    labels = torch.tensor([[-100, -100, 3, 4, 1], [-100, 2, 6, -100, -100]])
    want_sum, want_mean = [], []
    for b in range(2):
        lp = []
        for t in range(1, 5):  # logits at t-1 predict label t
            if labels[b, t] != -100:
                lp.append(F.log_softmax(logits[b, t - 1], -1)[labels[b, t]].item())
        want_sum.append(sum(lp))
        want_mean.append(sum(lp) / len(lp))
    assert torch.allclose(sequence_log_probs(logits, labels, "sum"), torch.tensor(want_sum), atol=1e-5)
    assert torch.allclose(sequence_log_probs(logits, labels, "mean"), torch.tensor(want_mean), atol=1e-5)


def _tiny():
    return tiny_lm(vocab_size=32, max_position_embeddings=32)


def test_dpo_objective_on_a_model_equals_the_formula_and_reference_has_no_grad():
    torch.manual_seed(0)
    policy, ref = _tiny(), _tiny()
    chosen = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    rejected = torch.tensor([[1, 2, 3, 11, 12], [6, 7, 8, 13, 14]])
    labels_c = chosen.clone()
    labels_c[:, :3] = -100
    labels_r = rejected.clone()
    labels_r[:, :3] = -100
    batch = {
        "chosen_input_ids": chosen,
        "chosen_labels": labels_c,
        "rejected_input_ids": rejected,
        "rejected_labels": labels_r,
    }
    obj = DPOObjective(beta=0.2, reduction="sum", reference=ref)
    loss, m = obj(policy, batch)

    def logp(model, ids, labels):  # naive: sum of log-softmax at response positions
        lg = model(ids).logits
        return torch.stack(
            [
                sum(
                    F.log_softmax(lg[b, t - 1], -1)[labels[b, t]]
                    for t in range(1, ids.shape[1])
                    if labels[b, t] != -100
                )
                for b in range(ids.shape[0])
            ]
        )

    with torch.no_grad():
        h = (logp(policy, chosen, labels_c) - logp(policy, rejected, labels_r)) - (
            logp(ref, chosen, labels_c) - logp(ref, rejected, labels_r)
        )
        want = -F.logsigmoid(0.2 * h).mean()
    assert loss.item() == pytest.approx(want.item(), abs=1e-5)
    loss.backward()
    assert all(p.grad is None for p in ref.parameters()), "the reference must not receive gradients"
    assert any(p.grad is not None for p in policy.parameters())
    assert 0.0 <= float(m["reward_accuracy"]) <= 1.0


def test_pretrain_and_sft_losses_equal_cross_entropy_on_shifted_targets():
    torch.manual_seed(0)
    model = _tiny()
    ids = torch.randint(0, 32, (2, 8))
    loss, _ = PretrainObjective()(model, {"input_ids": ids, "labels": ids})
    logits = model(ids).logits
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 32), ids[:, 1:].reshape(-1))
    assert loss.item() == pytest.approx(want.item(), abs=1e-5)
    labels = ids.clone()
    labels[:, :5] = -100
    sft, m = SFTObjective()(model, {"input_ids": ids, "labels": labels})
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 32), labels[:, 1:].reshape(-1), ignore_index=-100)
    assert sft.item() == pytest.approx(want.item(), abs=1e-5)
    assert int(m["supervised_tokens"]) == 2 * 3


def test_dpo_nll_weight_adds_each_chosen_responses_token_cross_entropy_averaged_over_pairs():
    # RPO's length-normalised NLL (Pang et al. 2024): a mean over pairs, as the DPO term is (responses of 2 and 1
    # tokens here: a token mean over the batch would be another number)
    torch.manual_seed(0)
    policy, ref = _tiny(), _tiny()
    chosen = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 0]])
    rejected = torch.tensor([[1, 2, 3, 11, 12], [6, 7, 8, 13, 0]])
    lc, lr = chosen.clone(), rejected.clone()
    lc[:, :3], lr[:, :3] = -100, -100
    lc[1, 4], lr[1, 4] = -100, -100  # padding
    batch = {"chosen_input_ids": chosen, "chosen_labels": lc, "rejected_input_ids": rejected, "rejected_labels": lr}
    plain, _ = DPOObjective(beta=0.3, reference=ref)(policy, batch)
    with_nll, m = DPOObjective(beta=0.3, reference=ref, nll_weight=0.5)(policy, batch)
    logits = policy(chosen).logits
    ce = torch.stack([F.cross_entropy(logits[b, :-1], lc[b, 1:], ignore_index=-100) for b in range(2)]).mean()
    token_mean = F.cross_entropy(logits[:, :-1].reshape(-1, 32), lc[:, 1:].reshape(-1), ignore_index=-100)
    assert ce.item() != pytest.approx(token_mean.item(), abs=1e-3)
    assert with_nll.item() == pytest.approx(plain.item() + 0.5 * ce.item(), abs=1e-5)
    assert float(m["chosen_nll"]) == pytest.approx(ce.item(), abs=1e-5)
    mean, m = DPOObjective(beta=0.3, reference=ref, nll_weight=0.5, reduction="mean")(policy, batch)
    assert float(m["chosen_nll"]) == pytest.approx(ce.item(), abs=1e-5)  # the same term whatever the reduction


@pytest.mark.parametrize("word", ["copy", "base", "none"])
def test_a_grpo_reference_word_as_dpo_reference_says_what_dpo_reference_takes(tmp_path, monkeypatch, word):
    # `dpo.reference=copy` (grpo.reference's word for a frozen copy) said "copy: no such model folder"
    from cookmind.train import TrainConfig
    from cookmind.train.build import build_objective

    monkeypatch.chdir(tmp_path)
    cfg = TrainConfig.from_dict({"train": {"objective": "dpo", "init_from": "runs/sft"}, "dpo": {"reference": word}})
    with pytest.raises(ValueError) as err:
        build_objective(cfg, trainer=None)
    assert str(err.value) == (
        f"dpo.reference={word}: no such model folder; dpo.reference names a model (a checkpoint, a run or a Hugging "
        "Face folder), not grpo.reference's none/copy/base: leave it out for a frozen copy of the train.init_from "
        "model (under lora.enabled=true, that model with its adapters off)"
    )


def test_label_smoothing_with_the_ipo_loss_is_refused_not_ignored(tmp_path, capsys):
    # dpo.loss=ipo dpo.label_smoothing=0.1 trained plain IPO: the smoothing, conservative DPO's, was accepted and never
    # read (IPO's loss (h - 1/(2 beta))^2 has no labels to smooth)
    ref = tiny_lm()
    with pytest.raises(ValueError) as err:
        DPOObjective(beta=0.1, loss_type="ipo", label_smoothing=0.1, reference=ref)
    assert str(err.value) == (
        "dpo.label_smoothing=0.1 smooths the labels of the sigmoid loss (conservative DPO); dpo.loss=ipo has no labels "
        "to smooth and would ignore it: leave dpo.label_smoothing out, or set dpo.loss=sigmoid"
    )
    for loss, smoothing in (("ipo", 0.0), ("sigmoid", 0.1)):  # both still work
        DPOObjective(beta=0.1, loss_type=loss, label_smoothing=smoothing, reference=ref)
