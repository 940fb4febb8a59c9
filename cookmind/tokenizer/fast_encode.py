"""The fast encode path: a tiktoken.Encoding built from our ranks, pattern and special tokens.

tiktoken merges, inside a pre-token, the adjacent pair whose concatenation has the lowest rank,
and uses the rank as the id. That equals our merge replay when every merge creates a new id
and ids grow in merge order (true for our trainer unless a merge re-creates an existing byte
string, and for GPT-2); tests check the equality on random and real text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cookmind.tokenizer.tokenizer import Tokenizer


def fast_path_blocker(tok: Tokenizer) -> str | None:
    """Why tiktoken cannot stand in for this tokenizer, or None when it can."""
    last = -1
    for r, (a, b) in enumerate(tok.merges):
        new_id = tok._by_bytes[a + b]
        if new_id <= last:
            return f"merge #{r} makes id {new_id}, not above the previous merge's id {last}"
        last = new_id
    specials = list(tok.special_tokens)
    for s in specials:
        if any(t != s and t.startswith(s) for t in specials):
            return f"special token {s!r} is a prefix of another (tiktoken does not pick the longest)"
    return None


def build_tiktoken(tok: Tokenizer):
    """A tiktoken.Encoding giving the same ids as tok.encode_reference, or None (see fast_path_blocker)."""
    if fast_path_blocker(tok) is not None:
        return None
    import tiktoken

    return tiktoken.Encoding(
        name=f"cookmind-{tok.fingerprint()[:12]}",
        pat_str=tok.pattern,
        mergeable_ranks=dict(tok._by_bytes),
        special_tokens=dict(tok.special_tokens),
    )


def tiktoken_file_text(tok: Tokenizer) -> str:
    """The `.tiktoken` rank file (base64 token, space, rank per line) that tiktoken's load_tiktoken_bpe reads."""
    import base64

    return "".join(
        f"{base64.b64encode(b).decode()} {i}\n" for b, i in sorted(tok._by_bytes.items(), key=lambda x: x[1])
    )
