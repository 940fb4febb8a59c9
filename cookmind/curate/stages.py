"""Pipeline stages: each wraps one plain function of the package.

A document stage decides on one document at a time (``process(doc, stats) -> keep?``) and may
edit its text. A corpus stage (the two dedups) needs every shard: it ``scan``s each shard,
``reduce``s what the scans wrote, then ``apply``s the decision shard by shard.
"""

from __future__ import annotations

import difflib
import inspect
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from cookmind.atomic import write_json, writing
from cookmind.curate import exact_lines, minhash
from cookmind.curate.extract import extract_text
from cookmind.curate.gopher import CODE_LINES_SHARE, GopherConfig, gopher_reasons, looks_like_code
from cookmind.curate.shards import SOURCE_KEY, iter_shard, write_shard
from cookmind.curate.stats import StageStats, text_bytes

# A stage's logic version: bump it (in the stage's class) whenever its output changes for the same input and options:
# which documents it keeps, their text or fields, its removal reasons (a change in a function it calls, too). A run
# records each stage's version in run.json, and a resume refuses a run whose stage did work under another version:
# its finished shards would mix with this code's.
FIRST_VERSION = 1  # every stage's logic before versions were recorded (a run.json without them ran these)


class DocStage:
    """A per-document stage; subclasses set ``name`` (and ``version``, see above) and implement ``process``."""

    name = "stage"
    version = FIRST_VERSION
    corpus = False

    def process(self, doc: dict, stats: StageStats) -> bool:  # pragma: no cover - interface
        raise NotImplementedError

    def process_batch(self, docs: list[dict], stats: StageStats) -> list[bool]:
        """Keep-flags for a batch; stages whose model has a per-call cost override this."""
        return [self.process(doc, stats) for doc in docs]

    def files(self) -> list[str]:
        """The files the stage's output depends on beside its input (a model, an eval set): a run records their size
        and modification time, and a resume refuses one changed since the stage did work."""
        return [self.model] if getattr(self, "model", None) else []


class ExtractStage(DocStage):
    """HTML -> main-content text (documents that arrive as text pass through)."""

    name = "extract"
    version = 1  # its logic version: bump it when its output changes (see FIRST_VERSION)

    def __init__(self, main_content: bool = True):
        self.main_content = main_content

    def process(self, doc, stats):
        if "html" not in doc:
            return bool(doc.get("text")) or stats.drop("no_text", doc)
        text = extract_text(doc["html"], main_content=self.main_content)
        if text is None:
            return stats.drop("no_text", doc)  # its html stays, for the list of removed documents
        del doc["html"]
        doc["text"] = text
        return True


class GopherStage(DocStage):
    """The Gopher rules; the first failed rule is the removal reason, every failed rule is counted.

    The rules were written for prose: code repeats lines ("}") and word n-grams and has words without letters, so
    documentation pages with code blocks fail them. ``code_like_removed`` counts the documents removed (for a rule
    other than their length) that look like code, and the report says so when they are a notable share.
    """

    name = "gopher"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: no n-gram spans a separator; 3:
    # a record's <|endoftext|> is text, as pack reads it (a word, in n-grams, in lines)
    version = 3
    CODE_NOTE_SHARE = 0.1  # of the removals, and at least CODE_NOTE_MIN documents, for the report to say so
    CODE_NOTE_MIN = 3

    def __init__(self, **options):
        self.cfg = GopherConfig.from_dict(options)

    def process(self, doc, stats):
        reasons = gopher_reasons(doc["text"], self.cfg)
        for r in reasons:
            stats.counters[f"failed:{r}"] += 1
        if reasons and reasons[0] not in ("too_few_words", "too_many_words") and looks_like_code(doc["text"]):
            stats.counters["code_like_removed"] += 1
        return not reasons or stats.drop(reasons[0], doc)

    def note(self, stats: StageStats) -> str | None:
        """A line for the report when a notable share of the removed documents look like code, naming the options
        that keep them."""
        n = stats.counters.get("code_like_removed", 0)
        if n < max(self.CODE_NOTE_MIN, self.CODE_NOTE_SHARE * stats.removed):
            return None
        return (
            f"gopher removed {n} documents that look like code ({n / stats.removed:.0%} of its removals; at least "
            f"{CODE_LINES_SHARE:.0%} of their lines indented or ending in a bracket, `;` or `,`): source, or "
            "documentation with code blocks. Its rules measure prose, and code repeats lines and word n-grams and "
            "has words without letters. To keep such pages, relax the rules that removed them (the `failed:` counts "
            "above) in the stage's options, e.g. `gopher: {max_dup_line_ratio: 0.6, max_dup_line_char_ratio: 0.5, "
            "max_dup_ngram_char_ratio: {5: 0.4, 6: 0.4, 7: 0.4, 8: 0.4, 9: 0.4, 10: 0.4}, min_alpha_words_ratio: "
            "0.6}`; `--removed` lists them."
        )


class LangIdStage(DocStage):
    """Keep documents in ``languages`` identified with at least ``threshold`` confidence."""

    name = "langid"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: a record's <|endoftext|> is text, as
    # pack reads it
    version = 2

    def __init__(self, languages=("en",), threshold: float = 0.65):
        self.languages = set(languages)
        self.threshold = float(threshold)

    def process(self, doc, stats):
        from cookmind.curate.langid import identify_language

        lang, score = identify_language(doc["text"])
        doc["lang"], doc["lang_score"] = lang, round(score, 4)
        if lang not in self.languages:
            return stats.drop(f"lang:{lang}", doc)
        if score < self.threshold:
            return stats.drop("low_confidence", doc)
        return True


class PiiStage(DocStage):
    """Mask e-mails, IPs and phone numbers; counts what was masked; removes nothing."""

    name = "pii"
    version = 1  # its logic version: bump it when its output changes (see FIRST_VERSION)

    def __init__(self, emails: bool = True, phones: bool = True, ips: bool = True):
        self.emails, self.phones, self.ips = emails, phones, ips

    def process(self, doc, stats):
        from cookmind.curate.pii import mask_emails, mask_ips, mask_phone_numbers

        text = doc["text"]
        for enabled, fn, key in (
            (self.emails, mask_emails, "emails"),
            (self.ips, mask_ips, "ips"),
            (self.phones, mask_phone_numbers, "phones"),
        ):
            if enabled:
                text, n = fn(text)
                stats.counters[f"{key}_masked"] += n
                stats.counters[f"docs_with_{key}"] += int(n > 0)
        doc["text"] = text
        return True


def _check_model_label(stage: str, model: str, label: str) -> None:
    """Refuse a classifier ``model`` without the ``label`` the stage scores: it stopped the run at the first document
    ("'nsfw' is not in list"), or (a fastText model) scored every document 0 for it without a word."""
    from cookmind.curate.harmful import _cached_classifier

    try:
        labels = list(_cached_classifier(str(model)).labels)
    except FileNotFoundError as exc:
        raise ValueError(f"stage {stage}: {exc}") from None
    if label not in labels:
        leave_out = "" if stage == "quality" else ", or leave model out for the built-in check"
        raise ValueError(
            f"stage {stage}: model {model} has no {label!r} label (its labels: {', '.join(labels)}); train one on "
            f"examples labelled {label!r} with `cookmind curate train-classifier`{leave_out}"
        )


class NsfwStage(DocStage):
    """Remove documents the NSFW check (learned model + lexicon, or a trained classifier ``model``) flags."""

    name = "nsfw"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: a record's <|endoftext|> is text, as
    # pack reads it
    version = 2

    def __init__(self, min_hits: int = 3, min_ratio: float = 0.01, model: str | None = None, threshold: float = 0.5):
        self.min_hits, self.min_ratio = int(min_hits), float(min_ratio)
        self.model, self.threshold = model, float(threshold)
        if model:
            _check_model_label("nsfw", model, "nsfw")

    def process(self, doc, stats):
        from cookmind.curate.harmful import classify_nsfw

        label, _ = classify_nsfw(doc["text"], self.min_hits, self.min_ratio, self.model, self.threshold)
        if label == "nsfw":
            return stats.drop("nsfw", doc)
        return True


class ToxicStage(DocStage):
    """Remove toxic documents: whole-document probability, or the share of clearly toxic lines.

    Lines need a higher bar (``line_threshold``) than documents: short lines such as a title
    "My favourite roast chicken" score around 0.6 with alt-profanity-check, real abuse near 1.0.
    """

    name = "toxic"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: a record's <|endoftext|> is text, as
    # pack reads it
    version = 2

    def __init__(
        self,
        threshold: float = 0.5,
        line_threshold: float = 0.9,
        max_toxic_line_share: float = 0.1,
        model: str | None = None,
    ):
        self.threshold = float(threshold)
        self.line_threshold = float(line_threshold)
        self.max_share = float(max_toxic_line_share)
        self.model = model
        if model:
            _check_model_label("toxic", model, "toxic")

    def process(self, doc, stats):
        from cookmind.curate.harmful import classify_toxic_speech, toxic_line_share

        label, _ = classify_toxic_speech(doc["text"], self.threshold, self.model)
        if label == "toxic":
            return stats.drop("toxic", doc)
        if self.model is None and toxic_line_share(doc["text"], self.line_threshold) > self.max_share:
            return stats.drop("toxic_lines", doc)
        return True

    def process_batch(self, docs, stats):
        """One call of the linear model for every document and line of the batch (its per-call cost dominates)."""
        if self.model is not None:
            return [self.process(doc, stats) for doc in docs]
        from cookmind.curate.harmful import _profanity, plain_text, text_lines

        texts = [plain_text(d["text"]) for d in docs]
        lines = [text_lines(t) for t in texts]
        flat = texts + [line for ls in lines for line in ls]
        probs = _profanity().predict_prob(flat) if flat else []
        keep, k = [], len(docs)
        for i, ls in enumerate(lines):
            line_probs = probs[k : k + len(ls)]
            k += len(ls)
            if probs[i] >= self.threshold:
                keep.append(stats.drop("toxic", docs[i]))
            elif ls and float((line_probs >= self.line_threshold).mean()) > self.max_share:
                keep.append(stats.drop("toxic_lines", docs[i]))
            else:
                keep.append(True)
        return keep


class QualityStage(DocStage):
    """Keep documents the quality classifier scores at least ``threshold`` for ``good_label``."""

    name = "quality"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: a record's <|endoftext|> is text, as
    # pack reads it
    version = 2

    def __init__(self, model: str | None = None, threshold: float = 0.5, good_label: str = "good"):
        if not model:
            raise ValueError("stage quality: needs `model:` (train one with `cookmind curate train-classifier`)")
        if not os.path.isfile(model):
            raise FileNotFoundError(
                f"stage quality: model {model} does not exist; train one with "
                "`cookmind curate train-classifier --input labelled.jsonl --output MODEL`"
            )
        self.model, self.threshold, self.good_label = str(model), float(threshold), good_label
        _check_model_label("quality", model, good_label)

    def process(self, doc, stats):
        from cookmind.curate.harmful import classify_quality

        _, p = classify_quality(doc["text"], self.model, self.good_label)
        doc["quality"] = round(p, 4)
        if p < self.threshold:
            return stats.drop("low_quality", doc)
        return True


class DecontaminateStage(DocStage):
    """Remove documents that share a long word n-gram with an evaluation set (see decontaminate.py).

    ``eval_sets``: {name: path} (or a list of paths, each named by its last two path parts); ``ngram``: the
    n-gram length in normalised words; ``min_matches``: distinct shared n-grams that make a document
    contaminated. The removal reason names the first eval set matched; ``docs_matching:NAME`` counts every
    set a removed document matched.
    """

    name = "decontaminate"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: no n-gram holds or spans a separator;
    # 3: a record's <|endoftext|> is text, as pack reads it
    version = 3

    def __init__(self, eval_sets: dict | list | None = None, ngram: int = 13, min_matches: int = 1):
        import sys

        from cookmind.curate.decontaminate import load_eval_set
        from cookmind.terminal import show

        if isinstance(eval_sets, (str, os.PathLike)):
            eval_sets = [eval_sets]
        if isinstance(eval_sets, (list, tuple)):
            eval_sets = {"/".join(Path(p).with_suffix("").parts[-2:]): p for p in eval_sets}
        if not eval_sets:
            raise ValueError(
                "stage decontaminate: names no eval sets; give eval_sets: {gsm8k: "
                "path/to/gsm8k/test.jsonl, mmlu: path/to/mmlu/test}"
            )
        if int(ngram) < 1 or int(min_matches) < 1:
            raise ValueError(f"stage decontaminate: ngram ({ngram}) and min_matches ({min_matches}) must be >= 1")
        self.ngram, self.min_matches = int(ngram), int(min_matches)
        self.sets = []
        self.eval_paths = [str(path) for path in eval_sets.values()]
        for set_name, path in eval_sets.items():
            try:
                es = load_eval_set(str(set_name), path, self.ngram)
            except (FileNotFoundError, ValueError) as exc:
                raise type(exc)(f"stage decontaminate: eval set {set_name}: {exc}") from None
            self.sets.append(es)
            if es.bad_utf8:
                warnings.warn(f"curate: {es.bad_utf8}", stacklevel=2)
            note = f"; {es.short} shorter than {self.ngram} words cannot match" if es.short else ""
            show(  # the set's name and path come from the user's config
                f"decontaminate: {set_name} ({path}): {es.items} items, {len(es.hashes)} distinct "
                f"{self.ngram}-grams{note}",
                file=sys.stderr,
            )

    def files(self) -> list[str]:
        from cookmind.curate.decontaminate import eval_files

        return [str(f) for path in self.eval_paths for f in eval_files(path)]

    def note(self, stats: StageStats) -> str | None:
        """The eval sets' text files' bytes that were not UTF-8 (read as U+FFFD), for the report."""
        return "; ".join(es.bad_utf8 for es in self.sets if es.bad_utf8) or None

    def process(self, doc, stats):
        from cookmind.curate.decontaminate import ngram_hashes

        hashes = ngram_hashes(doc["text"], self.ngram)
        hit = [es.name for es in self.sets if es.matches(hashes) >= self.min_matches]
        for set_name in hit:
            stats.counters[f"docs_matching:{set_name}"] += 1
        if hit:
            return stats.drop(f"eval:{hit[0]}", doc)
        return True

    def process_batch(self, docs, stats):
        """As process; every eval set gets its line in the report, 0 included."""
        for es in self.sets:
            stats.reasons.setdefault(f"eval:{es.name}", 0)
        return super().process_batch(docs, stats)


class CorpusStage:
    """A stage that must see the whole corpus: scan every shard, reduce, apply to every shard."""

    name = "corpus"
    version = FIRST_VERSION
    corpus = True

    def scan(self, shard: str | list[str], scratch: Path, idx: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def reduce(self, scratch: Path, num_shards: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def keep(self, doc: dict, local_idx: int, state: Any, stats: StageStats) -> bool:  # pragma: no cover
        raise NotImplementedError

    def load_state(self, scratch: Path, idx: int) -> Any:  # pragma: no cover
        raise NotImplementedError

    def files(self) -> list[str]:
        """As ``DocStage.files``: none for the dedups."""
        return []

    def apply(
        self, shard, out_path: Path, scratch: Path, idx: int, fmt: str, list_removed: bool = False, final: bool = True
    ) -> StageStats:
        """Pass 2: write the shard's kept (and edited) documents; return this shard's stats (with the removed
        documents in ``dropped`` if ``list_removed``, each noting its input ``SOURCE_KEY``, which a ``final`` pass
        leaves out of the output)."""
        stats = StageStats(self.name, dropped=[] if list_removed else None)
        state = self.load_state(scratch, idx)
        t0 = time.process_time()

        def kept():
            for i, doc in enumerate(
                iter_shard(shard, SOURCE_KEY if list_removed else None, need_text=True, stats=stats)
            ):
                stats.docs_in += 1
                stats.bytes_in += text_bytes(doc)
                if self.keep(doc, i, state, stats):
                    stats.docs_out += 1
                    stats.bytes_out += text_bytes(doc)
                    if final:
                        doc.pop(SOURCE_KEY, None)
                    yield doc

        write_shard(kept(), out_path, fmt)
        stats.seconds += time.process_time() - t0
        return stats


class MinHashStage(CorpusStage):
    """Near- and exact-duplicate documents: one kept per MinHash/LSH cluster (see minhash.py)."""

    name = "minhash"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: no shingle spans a separator; 3:
    # a record's <|endoftext|> is text, as pack reads it
    version = 3

    def __init__(
        self, num_hashes: int = 128, num_bands: int = 16, ngrams: int = 5, jaccard_threshold: float = 0.8, seed: int = 0
    ):
        if num_hashes % num_bands:
            raise ValueError(f"stage minhash: num_hashes {num_hashes} is not divisible by num_bands {num_bands}")
        self.num_hashes, self.num_bands, self.ngrams = int(num_hashes), int(num_bands), int(ngrams)
        self.threshold, self.seed = float(jaccard_threshold), int(seed)

    def scan(self, shard, scratch, idx):
        a, b = minhash.permutations(self.num_hashes, self.seed)
        sets, sigs, text_ids = [], [], []
        for doc in iter_shard(shard, need_text=True):
            s = minhash.shingles(doc["text"], self.ngrams)
            sets.append(s)
            sigs.append(minhash.signature(s, a, b))
            text_ids.append(xxhash.xxh64_intdigest(doc["text"].encode()))
        lengths = np.array([len(s) for s in sets], dtype=np.int64)
        _savez(
            scratch / f"scan-{idx:05d}.npz",
            sigs=np.stack(sigs) if sigs else np.zeros((0, self.num_hashes), np.uint64),
            shingles=np.concatenate(sets) if sets else np.zeros(0, np.uint64),
            lengths=lengths,
            text_ids=np.array(text_ids, dtype=np.uint64),
        )

    def reduce(self, scratch, num_shards):
        sigs, sets, text_ids, owner = [], [], [], []
        for idx in range(num_shards):
            with np.load(scratch / f"scan-{idx:05d}.npz") as z:
                sigs.append(z["sigs"])
                text_ids.append(z["text_ids"])
                ends = np.cumsum(z["lengths"])
                sh = z["shingles"]
                sets += [sh[e - n : e] for e, n in zip(ends, z["lengths"])]
                owner += [(idx, i) for i in range(len(z["lengths"]))]
        all_sigs = np.concatenate(sigs) if sigs else np.zeros((0, self.num_hashes), np.uint64)
        all_text = np.concatenate(text_ids) if text_ids else np.zeros(0, np.uint64)
        keep = minhash.duplicate_clusters(sets, all_sigs, self.num_bands, self.threshold)
        removed: dict[int, dict[str, str]] = {idx: {} for idx in range(num_shards)}
        for g, root in enumerate(keep):
            if root != g:
                shard_idx, local = owner[g]
                removed[shard_idx][str(local)] = (
                    "exact_duplicate" if all_text[g] == all_text[root] else "near_duplicate"
                )
        for idx, rem in removed.items():
            _write_json(scratch / f"remove-{idx:05d}.json", rem)

    def load_state(self, scratch, idx):
        return json.loads((scratch / f"remove-{idx:05d}.json").read_text())

    def keep(self, doc, local_idx, state, stats):
        reason = state.get(str(local_idx))
        return not reason or stats.drop(reason, doc)


class ExactLinesStage(CorpusStage):
    """Lines seen more than once in the corpus are removed (see exact_lines.py).

    A record left with fewer than ``min_words_after`` words is removed (reason ``empty_after_line_dedup``); of the
    records that stay, ``docs_edited`` counts those that lost lines and ``documents_emptied`` those that lost every
    line (with ``min_words_after: 0``). ``lines_removed`` counts every line removed, a removed record's too. A
    record is one document: a line holding ``<|endoftext|>`` is a line of text.
    """

    name = "exact_lines"
    # its logic version: bump it when its output changes (see FIRST_VERSION); 2: a record's <|endoftext|> is text, as
    # pack reads it
    version = 2

    def __init__(self, num_partitions: int = 16, min_words_after: int = 1):
        self.num_partitions, self.min_words_after = int(num_partitions), int(min_words_after)

    def scan(self, shard, scratch, idx):
        hashes = [exact_lines.line_hashes(doc["text"]) for doc in iter_shard(shard, need_text=True)]
        flat = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        exact_lines.write_partitions(flat, scratch / f"scan-{idx:05d}", self.num_partitions)

    def reduce(self, scratch, num_shards):
        dirs = [scratch / f"scan-{idx:05d}" for idx in range(num_shards)]
        dup = np.sort(np.concatenate([exact_lines.count_partition(dirs, p) for p in range(self.num_partitions)]))
        exact_lines._save_npy(scratch / "duplicated.npy", dup)

    def load_state(self, scratch, idx):
        return np.load(scratch / "duplicated.npy")

    def keep(self, doc, local_idx, state, stats):
        text, n, emptied = exact_lines.remove_lines(doc["text"], state)
        stats.counters["lines_removed"] += n
        if exact_lines.text_words(text) < self.min_words_after:
            return stats.drop("empty_after_line_dedup", doc)  # listed with its text before the lines went
        stats.counters["documents_emptied"] += emptied  # a kept record that lost every line
        stats.counters["docs_edited"] += int(n > 0)
        doc["text"] = text
        return True


STAGES: dict[str, type] = {
    cls.name: cls
    for cls in (
        ExtractStage,
        GopherStage,
        LangIdStage,
        PiiStage,
        NsfwStage,
        ToxicStage,
        QualityStage,
        DecontaminateStage,
        MinHashStage,
        ExactLinesStage,
    )
}


# What each stage option takes (build_stage checks a value given before the stage is made): "bool" true or false;
# "share" a number from 0 to 1 (a probability, a share, a bound of a ratio); "count0" / "count1" a whole number, 0 /
# 1 or more; "number0" a number, 0 or more; "languages" a list of lid.176's codes; "ngram_shares" {n: share}; "path"
# a file path (or null). A value taken as given did harm: `languages: en` became the letters {e, n} (every English
# document removed as lang:en), `threshold: 1.65` removed every document, `emails: "no"` masked, `num_bands: 0`
# stopped the run with a ZeroDivisionError traceback.
OPTION_KINDS: dict[str, dict[str, str]] = {
    "extract": {"main_content": "bool"},
    "langid": {"languages": "languages", "threshold": "share"},
    "pii": {"emails": "bool", "phones": "bool", "ips": "bool"},
    "nsfw": {"min_hits": "count0", "min_ratio": "share", "model": "path", "threshold": "share"},
    "toxic": {"threshold": "share", "line_threshold": "share", "max_toxic_line_share": "share", "model": "path"},
    "quality": {"model": "path", "threshold": "share", "good_label": "text"},
    "decontaminate": {"ngram": "count1", "min_matches": "count1"},
    "minhash": {
        "num_hashes": "count1",
        "num_bands": "count1",
        "ngrams": "count1",
        "jaccard_threshold": "share",
        "seed": "count0",
    },
    "exact_lines": {"num_partitions": "count1", "min_words_after": "count0"},
    "gopher": {
        "max_symbol_word_ratio": "number0",  # ("#" + ellipses) per word: "#### a" is 2
        **{f: "share" for f in ("max_bullet_lines_ratio", "max_ellipsis_lines_ratio")},
        **{f: "share" for f in ("min_alpha_words_ratio", "max_dup_line_ratio", "max_dup_para_ratio")},
        **{f: "share" for f in ("max_dup_line_char_ratio", "max_dup_para_char_ratio")},
        **{f: "count0" for f in ("min_words", "max_words", "min_stop_words")},
        **{f: "number0" for f in ("min_mean_word_length", "max_mean_word_length")},
        **{f: "ngram_shares" for f in ("max_top_ngram_char_ratio", "max_dup_ngram_char_ratio")},
    },
}


def _is_whole(value) -> bool:
    """A whole number: an int, or a float with nothing after the point (YAML reads 1.0e+5 and 50.0 as floats)."""
    return _is_number(value) and (isinstance(value, int) or value.is_integer())


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value  # NaN is none


def _option_problem(kind: str, value) -> str | None:
    """What is wrong with ``value`` for an option of ``kind`` (OPTION_KINDS), or None."""
    if kind == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if kind == "share":
        return None if _is_number(value) and 0 <= value <= 1 else "must be a number from 0 to 1"
    if kind in ("count0", "count1"):
        least = int(kind[-1])
        ok = _is_whole(value) and value >= least
        return None if ok else f"must be a whole number, {least} or more"
    if kind == "number0":
        return None if _is_number(value) and value >= 0 else "must be a number, 0 or more"
    if kind in ("path", "text"):
        return (
            None
            if value is None or isinstance(value, str)
            else f"must be a {'file path' if kind == 'path' else 'text'}"
        )
    if kind == "ngram_shares":
        if not isinstance(value, dict):
            return "must be a mapping of n-gram length to a number from 0 to 1, e.g. {5: 0.4}"
        for n, share in value.items():
            n_ok = isinstance(n, (int, str)) and not isinstance(n, bool) and str(n).isdigit() and int(n) >= 1
            if not n_ok or not (_is_number(share) and 0 <= share <= 1):
                return "must map n-gram lengths (whole numbers, 1 or more) to numbers from 0 to 1, e.g. {5: 0.4}"
        return None
    if kind == "languages":
        if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) for v in value):
            return "must be a list of ISO 639 language codes, e.g. [en] or [en, de]"
        from cookmind.curate.langid import known_languages

        unknown = [v for v in value if v not in known_languages() and v != "unknown"]  # unknown: what it cannot tell
        if unknown:
            return f"names {unknown[0]!r}, not one of the 176 codes language id tells apart (ISO 639: en, de, zh, ...)"
        return None
    raise AssertionError(f"unknown option kind {kind!r}")


def _check_option_values(name: str, options: dict) -> None:
    """Refuse, in one line naming the stage, the option and the value, an option value its stage cannot take."""
    kinds = OPTION_KINDS.get(name, {})
    for option, value in options.items():
        if option in kinds and (problem := _option_problem(kinds[option], value)):
            raise ValueError(f"stage {name}: {option} {problem}; got {value!r}")
    if name == "gopher":
        for low, high in (("min_words", "max_words"), ("min_mean_word_length", "max_mean_word_length")):
            lo, hi = options.get(low, getattr(GopherConfig, low)), options.get(high, getattr(GopherConfig, high))
            if lo > hi:
                raise ValueError(f"stage gopher: {low} {lo} is more than {high} {hi}: no document could pass; lower it")
    if name == "minhash":
        hashes, bands = options.get("num_hashes", 128), options.get("num_bands", 16)
        if hashes % bands:
            raise ValueError(
                f"stage minhash: num_bands {bands} does not divide num_hashes {hashes}; choose one that does"
            )


def build_stage(name: str, options: dict | None):
    """A stage object from its name and options; unknown names/options, and values the option cannot take
    (OPTION_KINDS), are errors naming them."""
    if name not in STAGES:
        raise ValueError(f"unknown curate stage {name!r}; known stages: {sorted(STAGES)}")
    options = options or {}
    params = inspect.signature(STAGES[name]).parameters.values()
    valid = [p.name for p in params if p.kind is not p.VAR_KEYWORD]
    open_ended = any(p.kind is p.VAR_KEYWORD for p in params)  # gopher: its config checks the keys itself
    unknown = [] if open_ended else [k for k in options if k not in valid]
    if unknown:
        close = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"stage {name}: unknown option {unknown[0]!r}{hint}; valid: {', '.join(valid)}")
    if not open_ended or not set(options) - set(OPTION_KINDS[name]):  # gopher's unknown keys: its config says
        _check_option_values(name, options)
        kinds = OPTION_KINDS.get(name, {})
        options = {  # a whole float where a count goes (YAML's 1.0e+5) is that count
            k: int(v) if kinds.get(k) in ("count0", "count1") and isinstance(v, float) else v
            for k, v in options.items()
        }
    try:
        return STAGES[name](**options)
    except (TypeError, ValueError) as exc:  # a value of the wrong type, e.g. threshold: high
        if str(exc).startswith(f"stage {name}:"):
            raise
        raise ValueError(f"stage {name}: bad option value in {options}: {exc}") from None


def _savez(path: Path, **arrays) -> None:
    with writing(path, "wb") as f:  # a file object: np.savez would add ".npz" to a temporary name
        np.savez(f, **arrays)


def _write_json(path: Path, obj) -> None:
    write_json(path, obj, indent=None)
