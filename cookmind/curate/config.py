"""The curation config: which stages run, in which order, with which options, and the output format."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import yaml

from cookmind import text_input

# Cheap and certain first, heavy judgements last. Language id runs before the Gopher rules
# because those are English rules (stop words); dedup runs before the classifiers to save
# their work, and MinHash before exact-line dedup so an exact copy of a page does not erase
# both copies' lines.
DEFAULT_STAGES: list[dict] = [
    {"extract": {"main_content": True}},
    {"langid": {"languages": ["en"], "threshold": 0.65}},
    {"gopher": {}},
    {"minhash": {"num_hashes": 128, "num_bands": 16, "ngrams": 5, "jaccard_threshold": 0.8, "seed": 0}},
    {"exact_lines": {"num_partitions": 16, "min_words_after": 1}},
    {"pii": {"emails": True, "phones": True, "ips": True}},
    {"nsfw": {"min_hits": 3, "min_ratio": 0.01}},
    {"toxic": {"threshold": 0.5, "line_threshold": 0.9, "max_toxic_line_share": 0.1}},
]


@dataclasses.dataclass
class CurateConfig:
    """``stages``: a list of one-key mappings ``{stage_name: {options}}`` in run order; ``removed``: also write
    each shard's removed documents, with stage and reason, to ``OUTPUT/removed/``; ``text_field``: the JSON/Parquet
    field holding a record's text (as pack's --text-field), written as ``text``."""

    stages: list = dataclasses.field(default_factory=lambda: [dict(s) for s in DEFAULT_STAGES])
    output_format: str = "jsonl.gz"
    workers: int = 1
    removed: bool = False
    text_field: str = "text"

    @classmethod
    def from_dict(cls, d: dict, source: str = "config") -> CurateConfig:
        """Validate and build; unknown keys and malformed stage entries are errors naming ``source``."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {unknown}; known: {sorted(known)}")
        # taken as given, `workers: two` failed deep in the run with int()'s message, `removed: "no"` wrote removed/
        workers = d.get("workers", 1)
        whole = isinstance(workers, int) or (isinstance(workers, float) and workers.is_integer())  # YAML's 4.0
        if isinstance(workers, bool) or not whole or workers < 1:
            raise ValueError(f"{source}: workers must be a whole number, 1 or more; got {workers!r}")
        if "workers" in d:
            d = {**d, "workers": int(workers)}
        if "removed" in d and not isinstance(d["removed"], bool):
            raise ValueError(f"{source}: removed must be true or false; got {d['removed']!r}")
        if "text_field" in d and not (isinstance(d["text_field"], str) and d["text_field"].strip()):
            raise ValueError(f"{source}: text_field must name a field, e.g. body; got {d['text_field']!r}")
        if d.get("text_field") == "html":  # taken as a record's text, the page's tags and scripts were kept
            raise ValueError(
                f"{source}: text_field html: a record's html field is read as HTML already, by the extract stage, "
                "which keeps its text: drop --text-field (text_field)"
            )
        if "stages" in d and not isinstance(d["stages"], list):
            raise ValueError(
                f"{source}: stages must be a list of stages, e.g. [extract, langid]; got {d['stages']!r} "
                "(`cookmind curate default-config` prints one)"
            )
        cfg = cls(**d)
        cfg.stages = [_stage_entry(s, source, i) for i, s in enumerate(cfg.stages)]
        from cookmind.curate.shards import shard_suffix

        shard_suffix(cfg.output_format)
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path) -> CurateConfig:
        """Read a YAML file (the keys of this dataclass)."""
        if Path(path).is_dir():
            raise ValueError(f"--config {path}: is a folder, not a file; name the YAML file")
        if not text_input.readable_as_file(path):  # a pipe (--config <(...)) is read like a file
            raise ValueError(
                f"--config {path}: no such file; `cookmind curate default-config > curate.yaml` writes the built-in "
                "config to start from"
            )
        try:
            data = yaml.safe_load(text_input.read_utf8(path)) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise ValueError(f"{path}: not valid YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        return cls.from_dict(data, source=str(path))

    def stage_list(self) -> list[tuple[str, dict]]:
        return [next(iter(s.items())) for s in self.stages]

    def fingerprint(self) -> str:
        """Stable hash of the stages, format, ``removed`` and ``text_field`` (a resumed run must use the same ones)."""
        listed = {"removed": True} if self.removed else {}  # runs from before the options keep their hash
        if self.text_field != "text":
            listed["text_field"] = self.text_field
        body = json.dumps({"stages": self.stages, "output_format": self.output_format, **listed}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def _stage_entry(entry, source: str, i: int) -> dict:
    if isinstance(entry, str):
        return {entry: {}}
    if isinstance(entry, dict) and "name" in entry:
        opts = {k: v for k, v in entry.items() if k != "name"}
        return {entry["name"]: opts}
    if isinstance(entry, dict) and len(entry) == 1:
        name, opts = next(iter(entry.items()))
        if opts is not None and not isinstance(opts, dict):
            raise ValueError(f"{source}: stages[{i}] ({name}): options must be a mapping, got {opts!r}")
        return {name: dict(opts or {})}
    raise ValueError(
        f"{source}: stages[{i}] must be a stage name or a one-key mapping {{name: {{options}}}}, got {entry!r}"
    )
