"""A curate stage option of the wrong type or out of its range is refused in one line naming the stage, the option,
the value and what it takes. It was taken as given: `langid: {languages: en}` became the letters {e, n} and removed
every English document as `lang:en`; `threshold: 1.65` removed every document; `pii: {emails: "no"}` still masked;
`minhash: {num_bands: 0}` stopped the run with a ZeroDivisionError traceback."""

from __future__ import annotations

import pytest

from cookmind.cli import main as cli_main
from cookmind.curate.config import DEFAULT_STAGES
from cookmind.curate.stages import build_stage

BAD = [
    ("langid", {"languages": "en"}, "languages", "list"),
    ("langid", {"languages": ["english"]}, "languages", "'english'"),
    ("langid", {"languages": []}, "languages", "list"),
    ("langid", {"threshold": 1.65}, "threshold", "from 0 to 1"),
    ("langid", {"threshold": "high"}, "threshold", "from 0 to 1"),
    ("extract", {"main_content": "no"}, "main_content", "true or false"),
    ("pii", {"emails": "no"}, "emails", "true or false"),
    ("nsfw", {"min_ratio": 5}, "min_ratio", "from 0 to 1"),
    ("nsfw", {"min_hits": -1}, "min_hits", "0 or more"),
    ("toxic", {"line_threshold": -0.1}, "line_threshold", "from 0 to 1"),
    ("toxic", {"max_toxic_line_share": True}, "max_toxic_line_share", "from 0 to 1"),
    ("minhash", {"num_bands": 0}, "num_bands", "1 or more"),
    ("minhash", {"num_hashes": 2.5}, "num_hashes", "1 or more"),
    ("minhash", {"jaccard_threshold": 80}, "jaccard_threshold", "from 0 to 1"),
    ("exact_lines", {"num_partitions": 0}, "num_partitions", "1 or more"),
    ("exact_lines", {"min_words_after": -2}, "min_words_after", "0 or more"),
    ("decontaminate", {"eval_sets": ["x.jsonl"], "ngram": "13"}, "ngram", "1 or more"),
    ("gopher", {"max_dup_line_ratio": 30}, "max_dup_line_ratio", "from 0 to 1"),
    ("gopher", {"min_alpha_words_ratio": -0.5}, "min_alpha_words_ratio", "from 0 to 1"),
    ("gopher", {"min_words": -5}, "min_words", "0 or more"),
    ("gopher", {"max_dup_ngram_char_ratio": {5: 40}}, "max_dup_ngram_char_ratio", "from 0 to 1"),
    ("gopher", {"max_dup_ngram_char_ratio": 0.4}, "max_dup_ngram_char_ratio", "mapping"),
    ("gopher", {"min_words": 500, "max_words": 100}, "min_words", "max_words"),
]


@pytest.mark.parametrize(("stage", "options", "option", "says"), BAD, ids=[f"{s}-{next(iter(o))}" for s, o, *_ in BAD])
def test_a_bad_option_value_is_refused_naming_stage_option_and_value(stage, options, option, says):
    with pytest.raises(ValueError) as err:
        build_stage(stage, options)
    msg = str(err.value)
    assert msg.startswith(f"stage {stage}: {option} "), msg
    assert says in msg and "\n" not in msg, msg


def test_the_defaults_and_the_bounds_themselves_are_accepted():
    for entry in DEFAULT_STAGES:
        ((name, opts),) = entry.items()
        build_stage(name, opts)
    assert build_stage("langid", {"languages": ["en", "de", "fr"], "threshold": 0}).languages == {"en", "de", "fr"}
    assert build_stage("langid", {"threshold": 1}).threshold == 1.0
    assert build_stage("gopher", {"max_dup_line_ratio": 1, "min_words": 0}).cfg.max_dup_line_ratio == 1
    assert build_stage("gopher", {"max_dup_ngram_char_ratio": {5: 0.4}}).cfg.max_dup_ngram_char_ratio[5] == 0.4
    assert build_stage("minhash", {"num_hashes": 64, "num_bands": 8, "jaccard_threshold": 0.5}).num_bands == 8
    assert build_stage("pii", {"emails": False}).emails is False


def test_the_cli_refuses_it_in_one_line_before_writing_anything(tmp_path, capsys):
    (tmp_path / "a.jsonl").write_text('{"text": "one cat"}\n')
    (tmp_path / "c.yaml").write_text("stages:\n- extract: {}\n- minhash: {num_bands: 0}\n")
    argv = ["curate", "run", "--config", str(tmp_path / "c.yaml"), "--input", str(tmp_path / "a.jsonl")]
    assert cli_main([*argv, "--output", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == "cookmind curate run: error: stage minhash: num_bands must be a whole number, 1 or more; got 0\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("yaml_text", "says"),
    [
        ("workers: two\n", "workers must be a whole number, 1 or more; got 'two'"),  # was int()'s "invalid literal"
        ("workers: 0\n", "workers must be a whole number, 1 or more; got 0"),
        ("removed: 'no'\n", "removed must be true or false; got 'no'"),  # wrote removed/ all the same
        (
            "stages: extract\n",
            "stages must be a list of stages, e.g. [extract, langid]; got 'extract' (`cookmind "
            "curate default-config` prints one)",
        ),
    ],
)
def test_the_configs_own_keys_are_checked_too(tmp_path, yaml_text, says):
    from cookmind.curate.config import CurateConfig

    (tmp_path / "c.yaml").write_text(yaml_text)
    with pytest.raises(ValueError) as err:
        CurateConfig.from_yaml(tmp_path / "c.yaml")
    assert str(err.value) == f"{tmp_path / 'c.yaml'}: {says}", str(err.value)


def test_values_that_were_valid_before_the_checks_stay_valid(tmp_path):
    """Review findings: YAML writes 1.0e+5 and 50.0 as floats, and int() took them; gopher's symbol-to-word ratio
    counts '#' and ellipses per word, so it can pass 1 ('#### a' is 2) and a loosened bound may too; language id
    says 'unknown' for a text it cannot tell, which a user may keep."""
    from cookmind.curate.config import CurateConfig
    from cookmind.curate.gopher import GopherConfig, gopher_reasons

    stage = build_stage("gopher", {"min_words": 50.0, "max_words": 1.0e5, "max_symbol_word_ratio": 1.5})
    assert (stage.cfg.min_words, stage.cfg.max_words, stage.cfg.max_symbol_word_ratio) == (50, 100000, 1.5)
    # a bound above 1 matters: '#### a' has 4 symbols to 2 words (a ratio of 2)
    loose = {"min_words": 0}
    assert "symbol_word_ratio" in gopher_reasons(
        "#### a", GopherConfig.from_dict({**loose, "max_symbol_word_ratio": 1.5})
    )
    assert "symbol_word_ratio" not in gopher_reasons(
        "#### a", GopherConfig.from_dict({**loose, "max_symbol_word_ratio": 2})
    )
    assert build_stage("nsfw", {"min_hits": 3.0}).min_hits == 3
    assert build_stage("minhash", {"num_bands": 8.0, "num_hashes": 64}).num_bands == 8
    assert build_stage("langid", {"languages": ["en", "unknown"]}).languages == {"en", "unknown"}
    (tmp_path / "c.yaml").write_text("workers: 4.0\n")
    assert CurateConfig.from_yaml(tmp_path / "c.yaml").workers == 4
    with pytest.raises(ValueError, match="num_bands must be a whole number, 1 or more; got 2.5"):
        build_stage("minhash", {"num_bands": 2.5})
