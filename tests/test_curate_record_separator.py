"""A JSONL/Parquet/WARC record's text is one document whatever it holds: ``<|endoftext|>`` typed inside it is text,
as pack reads it (encoded as the characters it is, never the token). Only a plain text file is cut there (its
documents are read apart before any check sees them; ``curate dedup`` and a .txt eval set read their files so)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xxhash

SEP = "<|endoftext|>"
STORY = "Tom and the dog went to the park with a red ball\nThen the dog slept by the warm fire..."  # 23 words


def test_gopher_reads_a_record_holding_the_separator_as_one_document():
    """A record of 48 words and two "<|endoftext|>" words has 50 words (min_words 50): it was too_few_words; and its
    n-grams span the token as they span any other word: judged as the same record with another word there."""
    from cookmind.curate.gopher import gopher_reasons, looks_like_code

    words = " ".join(["the cat and the dog sat with a hat"] * 6).split()[:48]
    text = "\n".join([" ".join(words[:16]), SEP, " ".join(words[16:32]), SEP, " ".join(words[32:])])
    assert gopher_reasons(text) == gopher_reasons(text.replace(SEP, "<|endofpage|>"))
    assert "too_few_words" not in gopher_reasons(text)
    record = f"{STORY}{SEP}\n{STORY}{SEP}\n{STORY}{SEP}"
    assert gopher_reasons(record) == gopher_reasons(record.replace(SEP, "<|endofpage|>"))
    code = "\n".join(["Tom ran home.", SEP, "Ann said hello,", SEP, "They ate lunch.", "The sun set."])
    assert not looks_like_code(code)  # 1 line of 6 ends in ',': under the 0.25 share


def test_nsfw_and_toxic_lines_count_the_separator_as_the_text_it_is():
    """3 explicit words in 300 words and one "<|endoftext|>" (a word, "endoftext") is 3 in 301: under the 0.01
    bound; and the toxic line share counts a separator line as a line, as alt-profanity-check reads it."""
    import profanity_check

    from cookmind.curate.harmful import classify_nsfw, nsfw_score, toxic_line_share

    filler = "the girl walked to the shop and back home again".split()
    text = " ".join(["she", "saw", "porn", "a", "nude", "man", "he", "was", "naked", *(filler * 30)[:291]])
    record = f"{text}\n{SEP}"
    assert nsfw_score(record) == (3, 3 / 301)
    assert classify_nsfw(record)[0] == "non_nsfw"
    lines = ["Tom had a red ball.", "you are stupid", SEP, "They played all day.", SEP, "Tom said thank you."]
    want = float((profanity_check.predict_prob(lines) >= 0.9).mean())  # the lines as the library scores them
    assert toxic_line_share("\n".join(lines), 0.9) == pytest.approx(want) == pytest.approx(1 / 6)


def test_language_id_reads_the_record_as_it_is():
    """fastText's lid.176 reads the record's words on one line, the token among them."""
    from cookmind.curate.langid import _model, identify_language

    record = f"Der Hund lief.\n{SEP}\nDie Katze schlief.\n{SEP}\n"
    labels, probs = _model().predict(" ".join(record.split()), k=1)
    assert identify_language(record) == (labels[0].removeprefix("__label__"), float(min(1.0, probs[0])))


def test_minhash_and_decontaminate_ngrams_of_a_record_span_the_token_as_a_word():
    """A record's n-grams run through "<|endoftext|>" read as the word "endoftext" (normalised, as any other text):
    the same n-grams as the record with that word in its place."""
    from cookmind.curate.decontaminate import ngram_hashes
    from cookmind.curate.minhash import shingles

    record = f"{STORY}{SEP}\nThe cat sat on the mat and purred{SEP}"
    spelled = record.replace(SEP, " endoftext ")
    assert np.array_equal(shingles(record, 5), shingles(spelled, 5))
    assert np.array_equal(ngram_hashes(record, 5), ngram_hashes(spelled, 5))


def test_line_dedup_of_records_hashes_and_removes_a_separator_line_as_any_line():
    """In records, a line "<|endoftext|>" is a line of text, and "friends.<|endoftext|>" one line: hashed whole."""
    from cookmind.curate.exact_lines import line_hashes, remove_lines

    record = f"Tom ran.\n{SEP}\nThey were best friends.{SEP}\n\nThe end."
    want = [xxhash.xxh64_intdigest(x.encode()) for x in record.split("\n") if x.strip()]
    assert line_hashes(record).tolist() == want
    dup = np.sort(np.array([xxhash.xxh64_intdigest(x.encode()) for x in (SEP, f"They were best friends.{SEP}")]))
    assert remove_lines(record, dup) == ("Tom ran.\n\nThe end.", 2, 0)


def test_curate_run_removes_a_record_whose_ngram_through_the_token_is_an_eval_items(tmp_path):
    """End to end: decontaminate reads a JSONL record's text whole, so an eval item that holds its words through the
    token (as text) matches it; a record passes gopher on the token's word."""
    from cookmind.cli import main

    record = "the sky was very blue that day " + SEP + " and all the birds sang in the tall green trees"
    (tmp_path / "in.jsonl").write_text(json.dumps({"id": "r", "text": record}) + "\n")
    (tmp_path / "eval.jsonl").write_text(json.dumps({"q": "blue that day endoftext and all the"}) + "\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"stages:\n  - decontaminate: {{eval_sets: {{e: {tmp_path / 'eval.jsonl'}}}, ngram: 6}}\n")
    assert main(["curate", "run", "--config", str(config), "--input", str(tmp_path / "in.jsonl"), "--output",
                 str(tmp_path / "out")]) == 0  # fmt: skip
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stages"][0]["reasons"] == {"eval:e": 1}, report


def test_quality_model_trains_on_and_scores_a_record_as_it_is(tmp_path):
    """train-classifier learns a record's text as given and the quality stage scores it so: the same model as one
    fitted on the texts directly, and the same probability as that model gives the record."""
    from cookmind.curate.classifier import ClassifierConfig, FastTextClassifier, load_classifier, train_classifier
    from cookmind.curate.harmful import classify_quality

    rows = [{"text": f"the cat sat {i}{SEP}the dog ran {SEP}", "label": "good"} for i in range(10)]
    rows += [{"text": f"buy now {i}\n{SEP}\nclick here", "label": "spam"} for i in range(10)]
    cfg = ClassifierConfig(bucket=1024, dim=8, epoch=2, seed=0)
    model = train_classifier(rows, cfg=cfg)
    direct = FastTextClassifier(["good", "spam"], cfg)
    direct.fit([r["text"] for r in rows], [r["label"] for r in rows])
    np.testing.assert_array_equal(model.E, direct.E)
    path = str(model.save(tmp_path / "q.npz"))
    record = f"the cat sat{SEP}\nbuy now"
    assert classify_quality(record, model=path)[1] == load_classifier(path).prob(record, "good")
