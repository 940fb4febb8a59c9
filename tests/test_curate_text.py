"""HTML extraction, language id, Gopher rules, PII masking, harmful-content scorers (hand-made cases)."""

from __future__ import annotations

import numpy as np
import pytest

from cookmind.curate import (
    classify_nsfw,
    classify_toxic_speech,
    extract_text,
    gopher_quality_filter,
    gopher_reasons,
    identify_language,
    mask_emails,
    mask_ips,
    mask_phone_numbers,
)
from cookmind.curate.gopher import GopherConfig

PROSE = (
    "The cook put the pot on the stove and waited for the water to boil. She had spent the morning "
    "at the market with her brother, and they came home with onions, carrots and a bag of fresh herbs. "
    "Now the kitchen smelled of butter and thyme, and the children sat at the table to watch."
)  # 56 words


def test_extract_moby(shared_data):
    text = extract_text((shared_data / "web" / "moby.html").read_bytes())
    assert text.startswith("Herman Melville - Moby-Dick")
    assert "Perth, the begrimed, blistered old blacksmith" in text
    assert "<p>" not in text and "test.jpg" not in text


def test_extract_drops_boilerplate_and_detects_encoding():
    html = (
        "<html><head><meta charset='windows-1252'><title>t</title><script>var x = 1;</script></head><body>"
        "<nav><ul><li><a href='/'>Home</a></li><li><a href='/a'>About us</a></li></ul></nav>"
        "<main><article><h1>Caf\xe9 cr\xe8me</h1><p>" + PROSE + "</p></article></main>"
        "<footer>Copyright 2026. All rights reserved. Privacy policy.</footer></body></html>"
    ).encode("cp1252")
    text = extract_text(html)
    assert "Café crème" in text  # cp1252 bytes decoded, not mojibake
    assert PROSE in text
    assert "var x" not in text and "All rights reserved" not in text and "About us" not in text
    assert extract_text(b"<html><body><script>only()</script></body></html>") is None


@pytest.mark.parametrize("meta", ["<meta charset='utf-8'>", ""])
def test_extract_reads_utf8_pages_with_few_accents_as_utf8(meta):
    # A real page (Rust book's compiler-plugins.html): declared UTF-8, one curly quote; uchardet alone calls it cp1252.
    html = (
        f"<html><head>{meta}<title>Compiler Plugins</title></head><body><main><h1>Compiler Plugins</h1>"
        "<p>Compiler plugins were user-provided libraries that extended the compiler’s behavior in certain "
        "ways. Support for them has been removed.</p></main></body></html>"
    ).encode()
    assert "the compiler’s behavior" in extract_text(html)


@pytest.mark.parametrize(
    "text,lang",
    [
        (PROSE, "en"),
        ("Le cuisinier a mis la casserole sur le feu et a attendu que l'eau commence à bouillir doucement.", "fr"),
        ("Der Koch stellte den Topf auf den Herd und wartete, bis das Wasser zu kochen begann.", "de"),
        ("厨师把锅放在炉子上，等着水烧开。", "zh"),
    ],
)
def test_identify_language(text, lang):
    got, score = identify_language(text)
    assert got == lang
    assert 0.5 < score <= 1.0


def test_identify_language_empty():
    assert identify_language("  \n ") == ("unknown", 0.0)


def test_gopher_passes_prose_and_names_each_rule():
    assert gopher_quality_filter(PROSE)
    words = PROSE.split()
    assert gopher_reasons(" ".join(words[:49])) == ["too_few_words"]
    assert "mean_word_length" in gopher_reasons(" ".join(["a"] * 60 + ["the", "and"]))
    assert "mean_word_length" in gopher_reasons(" ".join(["incomprehensibilities"] * 30 + ["the", "and"] * 10))
    hashy = PROSE + " " + " ".join(["#tag"] * 8)  # 8 / 64 words > 0.1
    assert "symbol_word_ratio" in gopher_reasons(hashy)
    ellipsis = "\n".join(f"{PROSE.split('.')[0]} number {i}..." for i in range(4)) + "\n" + PROSE
    assert "ellipsis_lines_ratio" in gopher_reasons(ellipsis)  # 4 of 5 lines end in "..."
    bullets = "\n".join("• " + s for s in PROSE.split(". "))
    assert "bullet_lines_ratio" in gopher_reasons(bullets)
    numbers = PROSE + " " + " ".join(str(i) for i in range(20))  # 56 alpha of 76 words < 0.8
    assert "alpha_words_ratio" in gopher_reasons(numbers)
    no_stop = (
        " ".join(
            w for w in words if w.lower().strip(".,") not in ("the", "be", "to", "of", "and", "that", "have", "with")
        )
        + " cooks bake bread daily" * 10
    )
    assert "stop_words" in gopher_reasons(no_stop)
    dup_lines = "\n".join([PROSE] + ["Click here to subscribe now today."] * 3)
    reasons = gopher_reasons(dup_lines)
    assert "dup_line_ratio" in reasons  # 2 of 4 lines repeat an earlier line
    assert gopher_quality_filter(
        dup_lines,
        GopherConfig(
            max_dup_line_ratio=1, max_dup_line_char_ratio=1, max_dup_ngram_char_ratio={}, max_top_ngram_char_ratio={}
        ),
    )


def _naive_dup_ngram_share(words: list[str], n: int) -> float:
    counts: dict[tuple, int] = {}
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    for g in grams:
        counts[g] = counts.get(g, 0) + 1
    covered = set()
    for i, g in enumerate(grams):
        if counts[g] > 1:
            covered.update(range(i, i + n))
    return sum(len(words[i]) for i in covered) / sum(len(w) for w in words)


def test_gopher_duplicate_ngram_rule_matches_naive_count():
    rng = np.random.default_rng(0)
    vocab = "the of and to a in is it you that".split()
    for trial in range(20):
        words = list(rng.choice(vocab[: 2 + trial % 3], size=150))
        share = _naive_dup_ngram_share(words, 5)
        assert share > 0
        bound = share - 1e-9 if trial % 2 else share + 1e-9  # just below / just above the true share
        cfg = GopherConfig(
            min_mean_word_length=0,
            max_dup_ngram_char_ratio={5: bound},
            max_top_ngram_char_ratio={},
            max_dup_line_ratio=1,
            max_dup_line_char_ratio=1,
            max_dup_para_ratio=1,
            max_dup_para_char_ratio=1,
        )
        failed = "dup_5gram_char_ratio" in gopher_reasons(" ".join(words), cfg)
        assert failed == (share > bound), (trial, share)


def test_gopher_config_rejects_unknown_option():
    with pytest.raises(ValueError, match="min_wordz"):
        GopherConfig.from_dict({"min_wordz": 3})


def test_gopher_ngram_bound_given_for_one_n_keeps_the_other_ns():
    """`max_dup_ngram_char_ratio: {5: 0.4}` in a config, to relax the 5-gram rule for code-heavy pages, replaced the
    whole table and so switched off the 6- to 10-gram rules; it now overrides the 5-gram bound alone."""
    cfg = GopherConfig.from_dict({"max_dup_ngram_char_ratio": {5: 0.4}, "max_top_ngram_char_ratio": {"2": 0.3}})
    assert cfg.max_dup_ngram_char_ratio == {**GopherConfig().max_dup_ngram_char_ratio, 5: 0.4}
    assert cfg.max_top_ngram_char_ratio == {2: 0.3, 3: 0.18, 4: 0.16}


@pytest.mark.parametrize(
    "text,count",
    [
        ("Mail chef.anna+recipes@kitchen-mail.co.uk today.", 1),
        ("Two: a@b.io, x_y.z@sub.example.org.", 2),
        ("No address: user at example dot com, @handle, a@b, name@localhost", 0),
    ],
)
def test_mask_emails(text, count):
    out, n = mask_emails(text)
    assert n == count
    assert out.count("|||EMAIL_ADDRESS|||") == count
    assert "@" not in out if count and "@handle" not in text else True


@pytest.mark.parametrize(
    "text",
    [
        "Call 2831823829 now",
        "Call (283)-182-3829 now",
        "Call (283) 182 3829 now",
        "Call 283-182-3829 now",
        "Call 283.182.3829 now",
        "Call +1 283 182 3829 now",
        "Call 1-283-182-3829 now",
        "Call +44 20 7946 0958 now",
        "Call +33 1 23 45 67 89 now",
        "Call +49 30 1234567 now",
    ],
)
def test_mask_phone_numbers_positives(text):
    out, n = mask_phone_numbers(text)
    assert (out, n) == ("Call |||PHONE_NUMBER||| now", 1)


@pytest.mark.parametrize(
    "text",
    [
        "Released on 2024-01-15 as version 1.2.3.",
        "It costs $1,234,567.89 or €1.299,00.",
        "Meet at 12:30:45 on 12/25/2023.",
        "Order #1234567, zip 94103-1234.",
        "ISBN 978-3-16-148410-0.",
        "pi is 3.14159265358979",
        "id 123456789012345678",
        "In 1999-2004 sales grew 12.5%.",
        "192.168.0.1",
    ],
)
def test_mask_phone_numbers_negatives(text):
    assert mask_phone_numbers(text) == (text, 0)


@pytest.mark.parametrize(
    "text,count",
    [
        ("Server 192.168.0.1 and 8.8.8.8.", 2),
        ("IPv6 2001:db8::1 and fe80::1ff:fe23:4567:890a.", 2),
        ("Full 2001:0db8:85a3:0000:0000:8a2e:0370:7334 here", 1),
        ("Loopback ::1 works", 1),
    ],
)
def test_mask_ips_positives(text, count):
    out, n = mask_ips(text)
    assert n == count and out.count("|||IP_ADDRESS|||") == count


@pytest.mark.parametrize(
    "text",
    [
        "Version 1.2.3 and 1.2.3.4.5",
        "Not an IP: 256.1.1.1 or 10.0.0.999",
        "Time 12:30:45 and ratio 3:2",
        "C++ std::vector<int> and a::b",
        "Dates 2024.01.15",
    ],
)
def test_mask_ips_negatives(text):
    assert mask_ips(text) == (text, 0)


def test_classify_nsfw_lexicon_score():
    label, score = classify_nsfw(PROSE)
    assert (label, score) == ("non_nsfw", 0.0)
    text = PROSE + " porn xxx nude"  # 3 hits in 59 words: ratio 0.0508
    label, score = classify_nsfw(text)
    assert label == "nsfw" and score == pytest.approx(min(1.0, (3 / 59) / 0.02))
    assert classify_nsfw(PROSE + " nude")[0] == "non_nsfw"  # one hit is not enough


@pytest.mark.parametrize(
    "text",
    [
        "This is F*CKING great",
        "what a C*CK",
        "you piece of $h1t",
        "f u c k you all",
        "fuuuuck this place",
        "Shut up you stupid b1tch!",
        "F.U.C.K this",
        "hot p0rn and s*x chat with horny singles, pu$$y pics",
    ],
)
def test_classify_nsfw_catches_disguised_words(text):
    assert classify_nsfw(text)[0] == "nsfw", text


@pytest.mark.parametrize(
    "text",
    [
        PROSE,
        "Scunthorpe United won the cup at home.",
        "Order a cocktail at the bar before dinner.",
        "The assessment is due on Friday, so the class will revise.",
        "Peacock feathers and a cockpit photo.",
        "Call me Ishmael. Moby-Dick is a novel by Herman Melville.",
        "The sex of the chick is hard to tell at birth.",
        "Sussex and Essex are counties; Middlesex was one.",
        "Grade: A+, 100% on the quiz, C++ and mp3 files, $5 off.",
        "The cock crowed at dawn on the farm.",
        "Great tits and blue tits are small birds that visit feeders.",
        "Our bitch had six puppies this spring.",
        "She graduated magna cum laude.",
        "Dick Smith reviewed Moby Dick.",
    ],
)
def test_classify_nsfw_leaves_clean_text(text):
    assert classify_nsfw(text)[0] == "non_nsfw", text


@pytest.mark.parametrize(
    "text, plain",
    [
        ("This is F*CKING great", "This is fucking great"),
        ("C*CK", "cock"),
        ("$h1t!", "shit!"),
        ("sh!t", "shit"),
        ("f u c k you", "fuck you"),
        ("f-u-c-k", "fuck"),
        ("fuuuuck", "fuck"),
        ("P0RN", "porn"),
        ("xxxx", "xxx"),
        ("f**k", "fuck"),
    ],
)
def test_deobfuscate_writes_disguised_words_plainly(text, plain):
    from cookmind.curate.harmful import NSFW_LEXICON
    from cookmind.curate.obfuscation import deobfuscate

    assert deobfuscate(text, NSFW_LEXICON) == (plain, 1)


@pytest.mark.parametrize(
    "text",
    [
        "Scunthorpe cocktail assessment",
        "100 mp3 files at $5 and 3*4=12",
        "a b c d and x.y.z",
        "C++ and e-mail",
        "Sooo good, brrr cold",
        "***",
        "b00ks and h3ll0",
        "I said: wow!!!",
        "2*x + y*z",
        "US$ 40",
    ],
)
def test_deobfuscate_leaves_clean_text(text):
    from cookmind.curate.harmful import NSFW_LEXICON
    from cookmind.curate.obfuscation import deobfuscate

    assert deobfuscate(text, NSFW_LEXICON) == (text, 0)


def test_toxic_check_sees_disguised_words():
    assert classify_toxic_speech("you piece of $h1t")[0] == "toxic"


def test_classify_toxic_speech():
    label, p = classify_toxic_speech("You are a stupid idiot and nobody cares about your crap opinion.")
    assert label == "toxic" and p > 0.9
    label, p = classify_toxic_speech(PROSE)
    assert label == "non_toxic" and p < 0.5


def test_toxic_stage_batch_equals_one_by_one():
    from cookmind.curate.stages import ToxicStage
    from cookmind.curate.stats import StageStats

    thread = PROSE + "\nYou are a stupid idiot.\nShut up, moron, this is garbage.\nWhat a damn pathetic loser."
    docs = [
        {"text": t}
        for t in (PROSE, thread, "You are a stupid idiot and a moron.", PROSE + "\nMy favourite roast chicken")
    ]
    stage = ToxicStage()
    one, batch = StageStats("toxic"), StageStats("toxic")
    flags = [stage.process(dict(d), one) for d in docs]
    assert flags == [True, False, False, True]
    assert stage.process_batch([dict(d) for d in docs], batch) == flags
    assert one.reasons == batch.reasons and sum(one.reasons.values()) == 2


def test_a_separator_at_the_end_of_a_line_of_a_plain_text_ends_the_line(tmp_path):
    """In a plain text file a separator where TinyStories often puts it, at the end of a story's last line
    ("fire...<|endoftext|>"), ends the line as one on its own line does: a .txt eval set's items are the text
    between them. (A record's text is one document: tests/test_curate_record_separator.py.)"""
    from cookmind.curate.decontaminate import iter_eval_items
    from cookmind.curate.shards import text_lines

    sep = "<|endoftext|>"
    assert text_lines(f"A{sep}B\n {sep} \nC {sep}", separated=True) == ["A", "B", "C"]
    assert text_lines(f"A{sep}B\n {sep} \nC {sep}", separated=False) == [f"A{sep}B", f" {sep} ", f"C {sep}"]
    (tmp_path / "ev.txt").write_text(f"What is two and two?{sep}\n{sep}Four.\n", encoding="utf-8")
    assert list(iter_eval_items(tmp_path / "ev.txt")) == ["What is two and two?", "Four."]
