"""A fastText-style text classifier (Joulin et al. 2016, "Bag of Tricks"), trained in numpy.

The model is fastText's supervised one: hashed word uni- and bi-grams look up rows of an
embedding table E, their mean h is the document vector, and a linear layer W gives label
logits; softmax + cross-entropy, SGD with a learning rate decaying linearly to zero.

Why our own trainer: the `fasttext` module installed here (fasttext-numpy2 0.10.4) predicts
fine but trains from an uninitialised input matrix on this platform (values ~1e34, then
"Encountered NaN" for most settings), and fasttext-predict cannot train at all. Models saved
by a real fastText (``.bin``/``.ftz``) load through :func:`load_classifier` all the same.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import xxhash

from cookmind.atomic import writing

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclasses.dataclass
class ClassifierConfig:
    """Hyperparameters; the names follow fastText's where they mean the same thing."""

    dim: int = 16
    bucket: int = 1 << 16  # rows of the hashed feature table (keeps the model small)
    word_ngrams: int = 2  # 1 = unigrams, 2 = uni + bigrams
    epoch: int = 10
    lr: float = 1.0
    batch_size: int = 16
    max_tokens: int = 1024  # only the first tokens of a long document are read
    seed: int = 0


def tokenize(text: str, max_tokens: int = 1024) -> list[str]:
    """Lower-cased word tokens, as fastText's users usually preprocess."""
    return _WORD.findall(text.lower())[:max_tokens]


def feature_ids(text: str, cfg: ClassifierConfig) -> np.ndarray:
    """Row ids of the hashed n-gram features of ``text``: id = xxh64(n-gram) mod bucket."""
    words = tokenize(text, cfg.max_tokens)
    grams = list(words)
    for n in range(2, cfg.word_ngrams + 1):
        grams += [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        grams = ["</s>"]
    return np.fromiter(
        (xxhash.xxh64_intdigest(g.encode()) % cfg.bucket for g in grams), dtype=np.int64, count=len(grams)
    )


class FastTextClassifier:
    """Embedding-bag + linear softmax classifier. ``predict(text) -> (label, probability)``."""

    def __init__(
        self, labels: Sequence[str], cfg: ClassifierConfig, E: np.ndarray | None = None, W: np.ndarray | None = None
    ):
        self.labels = list(labels)
        self.cfg = cfg
        rng = np.random.default_rng(cfg.seed)
        # fastText's init: E ~ U(-1/dim, 1/dim), W = 0
        self.E = (
            E if E is not None else rng.uniform(-1 / cfg.dim, 1 / cfg.dim, (cfg.bucket, cfg.dim)).astype(np.float32)
        )
        self.W = W if W is not None else np.zeros((len(self.labels), cfg.dim), dtype=np.float32)

    def _hidden(self, ids_list: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lengths = np.array([len(x) for x in ids_list])
        flat = np.concatenate(ids_list)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        H = np.add.reduceat(self.E[flat], offsets, axis=0) / lengths[:, None]  # h = mean_i E[id_i]
        return H, flat, lengths

    def predict_proba_ids(self, ids_list: list[np.ndarray]) -> np.ndarray:
        """Label probabilities (N, L) for documents given as feature ids."""
        H, _, _ = self._hidden(ids_list)
        return _softmax(H @ self.W.T)

    def predict_proba(self, texts: Sequence[str]) -> np.ndarray:
        """Label probabilities (N, L) of ``texts``."""
        return self.predict_proba_ids([feature_ids(t, self.cfg) for t in texts])

    def predict(self, text: str) -> tuple[str, float]:
        """(most probable label, its probability)."""
        p = self.predict_proba([text])[0]
        k = int(np.argmax(p))
        return self.labels[k], float(p[k])

    def prob(self, text: str, label: str) -> float:
        """The probability of one ``label`` for ``text``."""
        return float(self.predict_proba([text])[0][self.labels.index(label)])

    def fit(self, texts: Sequence[str], labels: Sequence[str], progress: bool = False) -> list[float]:
        """SGD over shuffled mini-batches; returns the mean loss of each epoch."""
        cfg = self.cfg
        y = np.array([self.labels.index(lab) for lab in labels])
        ids_list = [feature_ids(t, cfg) for t in texts]
        rng = np.random.default_rng(cfg.seed)
        total_steps = cfg.epoch * ((len(texts) + cfg.batch_size - 1) // cfg.batch_size)
        step = 0
        losses = []
        bar = _bar(total_steps, "train-classifier") if progress else None
        for _ in range(cfg.epoch):
            order = rng.permutation(len(texts))
            epoch_loss = 0.0
            for start in range(0, len(order), cfg.batch_size):
                batch = order[start : start + cfg.batch_size]
                lr = cfg.lr * (1 - step / total_steps)  # fastText's linear decay to zero
                epoch_loss += self.sgd_step([ids_list[i] for i in batch], y[batch], lr)
                step += 1
                if bar is not None:
                    bar.update(1)
            losses.append(epoch_loss / len(texts))
        if bar is not None:
            bar.close()
        return losses

    def sgd_step(self, ids_list: list[np.ndarray], y: np.ndarray, lr: float) -> float:
        """One SGD step on the summed cross-entropy of a batch; returns that sum (before the step)."""
        H, flat, lengths = self._hidden(ids_list)
        P = _softmax(H @ self.W.T)
        rows = np.arange(len(ids_list))
        loss = float(-np.log(P[rows, y] + 1e-12).sum())
        G = P
        G[rows, y] -= 1.0  # dLoss/dlogits = p - onehot(y)
        dH = G @ self.W  # (B, dim), taken before W moves
        self.W -= (lr * (G.T @ H)).astype(np.float32)
        # each feature row of document b receives dH_b / n_b (the gradient of the mean)
        np.add.at(self.E, flat, (-lr * np.repeat(dH / lengths[:, None], lengths, axis=0)).astype(np.float32))
        return loss

    def save(self, path: str | os.PathLike) -> Path:
        """Write an ``.npz`` (tables + labels + config) atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = json.dumps(
            {"format": "cookmind-fasttext-v1", "labels": self.labels, "config": dataclasses.asdict(self.cfg)}
        )
        with writing(path, "wb") as f:  # a file object: np.savez would add ".npz" to a temporary name
            np.savez(f, E=self.E.astype(np.float16), W=self.W, meta=np.array(meta))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> FastTextClassifier:
        """Read a model written by :meth:`save`."""
        with np.load(path) as z:
            meta = json.loads(str(z["meta"]))
            if meta.get("format") != "cookmind-fasttext-v1":
                raise ValueError(f"{path}: not a cookmind classifier (format {meta.get('format')!r})")
            return cls(meta["labels"], ClassifierConfig(**meta["config"]), E=z["E"].astype(np.float32), W=z["W"])


def fasttext_labels(model) -> list[str]:
    """Every label of a loaded fastText model, without the ``__label__`` prefix. fasttext-predict (the build
    installed) has no get_labels(): a prediction of k=-1 at threshold -1 gives every label with its probability."""
    labels = model.get_labels() if hasattr(model, "get_labels") else None
    if labels is None:
        labels, _ = model.predict("", k=-1, threshold=-1.0)
    return [lab.removeprefix("__label__") for lab in labels]


class _FastTextBinary:
    """A model trained by fastText itself (.bin / .ftz), with the same predict interface."""

    def __init__(self, path: str):
        import fasttext

        self.model = fasttext.load_model(path)
        self.labels = fasttext_labels(self.model)

    def predict(self, text: str) -> tuple[str, float]:
        labels, probs = self.model.predict(" ".join(text.split()), k=1)
        return labels[0].removeprefix("__label__"), float(probs[0])

    def prob(self, text: str, label: str) -> float:
        labels, probs = self.model.predict(" ".join(text.split()), k=-1)
        return dict(zip((x.removeprefix("__label__") for x in labels), map(float, probs))).get(label, 0.0)


def load_classifier(path: str | os.PathLike):
    """A classifier from ``path``: our ``.npz`` or a fastText ``.bin``/``.ftz``."""
    path = str(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"classifier model {path} does not exist; train one with "
            "`cookmind curate train-classifier --input labelled.jsonl --output model.npz`"
        )
    if path.endswith(".npz"):
        return FastTextClassifier.load(path)
    return _FastTextBinary(path)


def train_classifier(
    records: Iterable[dict],
    text_field: str = "text",
    label_field: str = "label",
    cfg: ClassifierConfig | None = None,
    progress: bool = False,
) -> FastTextClassifier:
    """Train on labelled records ({text_field: str, label_field: str}); labels sorted for stability. A text is read
    as it is, as the stages score one."""
    texts, labels = [], []
    for i, rec in enumerate(records):
        if text_field not in rec or label_field not in rec:
            raise ValueError(f"record {i} lacks {text_field!r} or {label_field!r}: keys {sorted(rec)}")
        texts.append(rec[text_field])
        labels.append(str(rec[label_field]))
    if len(set(labels)) < 2:
        raise ValueError(f"need at least two labels to train a classifier, got {sorted(set(labels))}")
    model = FastTextClassifier(sorted(set(labels)), cfg or ClassifierConfig())
    model.fit(texts, labels, progress=progress)
    return model


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)  # p_k = exp(z_k) / sum_j exp(z_j), shifted for stability
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def _bar(total: int, desc: str):
    from cookmind.progress import progress_bar

    return progress_bar(total=total, desc=desc, unit="batch")
