"""Harmful-content and quality classifiers, each ``(text) -> (label, score)``.

- toxicity: alt-profanity-check's linear SVM (its model ships inside the wheel: offline), or a
  classifier trained by ``cookmind curate train-classifier``;
- NSFW: the same learned model, confirmed by a lexicon of sexual and obscene words, with the lexicon
  alone as a backstop for explicit pages the model scores low; or a trained classifier;
- quality: a classifier trained by ``cookmind curate train-classifier`` (label "good" vs others).

Both harmful-content checks first undo disguised lexicon words ("F*CKING", "$h1t", "f u c k"; see
obfuscation.py), so the model and the lexicon see the plain word.
"""

from __future__ import annotations

import functools
import re

from cookmind.curate.classifier import load_classifier
from cookmind.curate.obfuscation import deobfuscate

# Explicit sexual-content terms; a page is NSFW when they are a noticeable share of its words.
SEXUAL_TERMS = frozenset(
    """
porn porno pornography pornographic xxx nsfw nude nudes naked hardcore erotic erotica sex sexy
hentai camgirl camgirls webcam escort escorts milf fetish orgasm horny stripper strippers
blowjob blowjobs handjob dildo vibrator threesome orgy hookup hookups onlyfans playboy lingerie explicit
""".split()
)
# Obscene words, each form listed (no prefix matching: "cocktail", "Scunthorpe" and "assessment" are clean).
# Words that are also names ("dick") or everyday words ("ass", "butt") are left to the learned model.
OBSCENE_TERMS = frozenset(
    """
fuck fucks fucked fucker fuckers fucking fuckin motherfucker motherfuckers motherfucking
shit shits shitty shitting bullshit cunt cunts slut sluts slutty whore whores titties boobs cumshot
""".split()
)
# Obscene in one sense, clean in another (a rooster, a bird, a female dog, a cat, "magna cum laude"):
# they count as obscene only when disguised ("C*CK"; nobody stars out a rooster), and always for the backstop.
DOUBLE_SENSE_TERMS = frozenset("cock cocks tits bitch bitches pussy pussies cum boobies".split())
NSFW_LEXICON = SEXUAL_TERMS | OBSCENE_TERMS | DOUBLE_SENSE_TERMS

_WORD = re.compile(r"[a-z]+")


def nsfw_score(text: str) -> tuple[int, float]:
    """(lexicon hits, hits / words), on the text as given."""
    words = _WORD.findall(text.lower())
    hits = sum(w in NSFW_LEXICON for w in words)
    return hits, hits / max(1, len(words))


def plain_text(text: str) -> str:
    """``text`` with disguised lexicon words written plainly, as both harmful-content checks see it."""
    return deobfuscate(text, NSFW_LEXICON)[0]


def text_lines(text: str) -> list[str]:
    """``text``'s non-blank lines, the ones the per-line check scores (a line holding ``<|endoftext|>`` too: in a
    record it is text, and the documents of a plain text file are read apart before any check)."""
    return [line for line in text.splitlines() if line.strip()]


def classify_nsfw(
    text: str, min_hits: int = 3, min_ratio: float = 0.01, model: str | None = None, threshold: float = 0.5
) -> tuple[str, float]:
    """("nsfw" | "non_nsfw", score), judged on the text with disguised words undone.

    Default: NSFW when alt-profanity-check scores the text at least ``threshold`` and it holds an obscene
    word or a disguised lexicon word (the model alone also flags plain insults, which the toxicity check
    owns, and a lone "sex" or "naked" in a clean sentence), or, as a backstop, when at least ``min_hits``
    lexicon words make up at least ``min_ratio`` of its words. score = the larger of the model's
    probability (0 without such a word) and min(1, (hits / words) / (2 * min_ratio)).
    ``model``: a classifier of ours (or a fastText .bin) with an "nsfw" label; score = P(nsfw).
    """
    text, disguised = deobfuscate(text, NSFW_LEXICON)
    if model:
        p = _cached_classifier(str(model)).prob(text, "nsfw")
        return ("nsfw" if p >= threshold else "non_nsfw"), p
    hits, ratio = nsfw_score(text)
    backstop = min(1.0, ratio / (2 * min_ratio))
    obscene = disguised > 0 or any(w in OBSCENE_TERMS for w in _WORD.findall(text.lower()))
    p = float(_profanity().predict_prob([text])[0]) if obscene else 0.0
    label = "nsfw" if p >= threshold or (hits >= min_hits and ratio >= min_ratio) else "non_nsfw"
    return label, max(p, backstop)


@functools.lru_cache(maxsize=1)
def _profanity():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn version chatter on unpickling
        import profanity_check
    return profanity_check


@functools.lru_cache(maxsize=8)
def _cached_classifier(path: str):
    return load_classifier(path)


def classify_toxic_speech(text: str, threshold: float = 0.5, model: str | None = None) -> tuple[str, float]:
    """("toxic" | "non_toxic", probability of toxic), judged on the text with disguised words undone (``plain_text``).

    Default model: alt-profanity-check (offline). ``model``: a classifier of ours with a "toxic" label.
    """
    text = plain_text(text)
    if model:
        p = _cached_classifier(str(model)).prob(text, "toxic")
    else:
        p = float(_profanity().predict_prob([text])[0])
    return ("toxic" if p >= threshold else "non_toxic"), p


def toxic_line_share(text: str, threshold: float = 0.5) -> float:
    """Share of non-blank lines (``text_lines``) alt-profanity-check calls toxic (one long clean page can hide a
    rant)."""
    lines = text_lines(plain_text(text))
    if not lines:
        return 0.0
    probs = _profanity().predict_prob(lines)
    return float((probs >= threshold).mean())


def classify_quality(text: str, model: str | None = None, good_label: str = "good") -> tuple[str, float]:
    """(label, probability of ``good_label``) from a classifier trained by `cookmind curate train-classifier`.

    Without a model there is nothing to judge by: raise, naming the command that makes one.
    """
    if not model:
        raise ValueError(
            "classify_quality needs a model: train one with `cookmind curate train-classifier "
            "--input labelled.jsonl --output quality.npz` and pass model=..."
        )
    clf = _cached_classifier(str(model))
    p = clf.prob(text, good_label)
    label = good_label if p >= 0.5 else next((x for x in clf.labels if x != good_label), "bad")
    return label, p
