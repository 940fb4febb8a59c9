"""A chat conversation with a model: history, system prompt, streamed replies split into reasoning and content."""

from __future__ import annotations

from collections.abc import Iterator

from cookmind.infer.detokenize import IncrementalDetokenizer
from cookmind.infer.generate import stream
from cookmind.infer.reasoning import ReasoningSplitter
from cookmind.infer.sampling import SamplingParams
from cookmind.infer.stop import StopStringMatcher, chat_stop_ids, control_token_ids


class ChatSession:
    """Keeps the messages; ``send(text)`` streams ("reasoning" | "content", piece) and records the reply.
    A reply ends at the first control token (``cookmind.infer.stop.chat_stop_ids``) unless cfg names its stop tokens."""

    def __init__(self, model, tokenizer, cfg: SamplingParams, system: str | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.cfg = cfg if cfg.stop_token_ids else cfg.replace(stop_token_ids=chat_stop_ids(tokenizer))
        self.control_ids = control_token_ids(tokenizer)  # never shown, whatever the stop tokens
        self.system = system
        self.history: list[dict] = []
        self.cut = False  # the last reply stopped because the conversation filled the model's context
        self.limited = False  # the last reply ran to --max-new-tokens (max_new_tokens), not to an end of its own
        self.dropped = 0  # the oldest messages the last send left out so the conversation fits the context
        # the last reply as generated, to say why one shows no text (``cli_generate.why_no_text``): its text up to a
        # stop string (think tags in), how many tokens (not the end token), whether it ended at a stop string
        self.reply_text, self.tokens, self.stopped = "", 0, False
        self.replies = 0  # replies sampled so far: reply k draws from cfg.seed + k (a seeded session, not one draw)

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.history = []

    def set_system(self, text: str | None) -> None:
        self.system = text or None

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def send(self, text: str) -> Iterator[tuple[str, str]]:
        """Stream the reply to ``text`` as ("reasoning" | "content", piece). A conversation that leaves the reply
        less than its budget in the model's context (``reply_budget``) leaves its oldest exchanges out (``dropped``
        counts the messages; the system prompt stays): every later turn was refused until a /reset, and before that
        the replies were cut short by the context's end."""
        before = list(self.history)
        message = {"role": "user", "content": text}
        self.history.append(message)
        reasoning, content = [], []
        try:
            yield from self._reply(before, reasoning, content)
        except (KeyboardInterrupt, GeneratorExit):
            # stopped mid-way (Ctrl-C, or the caller closed the stream): the reply so far is the assistant's turn, as
            # the web page keeps a stopped reply; the message left unanswered made two user turns in a row
            if self.history and self.history[-1] is message:
                self.history.append(_reply_message(reasoning, content))
            raise
        except BaseException:
            # failed (an error in generation): the conversation as it was, not a question with an empty answer
            if self.history and self.history[-1] is message:
                self.history = before
            raise

    def _reply(self, before: list[dict], reasoning: list[str], content: list[str]) -> Iterator[tuple[str, str]]:
        """``send``'s body: stream the reply, gathering its pieces into ``reasoning`` and ``content``, and record it."""
        context = self.model.config.max_position_embeddings
        budget = reply_budget(self.cfg.max_new_tokens, context)
        self.dropped = 0
        while True:
            prompt = self.tokenizer.render_prompt(self.messages())
            room = context - len(prompt)
            if room >= budget or len(self.history) == 1:  # the newest message alone: kept while it leaves any room
                break
            cut = next((i for i in range(1, len(self.history)) if self.history[i]["role"] == "user"), None)
            cut = len(self.history) - 1 if cut is None else cut  # the oldest exchange, up to the next user turn
            self.dropped += cut
            self.history = self.history[cut:]
        if room < 1:  # the message alone: refused, and nothing of the conversation is left out for it
            self.history, self.dropped = before, 0
            raise ValueError(
                f"the message ({len(prompt)} tokens with the chat template) fills the model's context of {context} "
                "tokens: nothing was sent; send a shorter one (or a shorter /system prompt)"
            )
        # stop strings are matched on the streamed text (never shown), not by the token loop
        # a seed seeds the session: reply k draws from seed + k (each reply with the seed itself drew the same noise,
        # so two messages to a small model got one reply, and a message asked again could not differ)
        seed = None if self.cfg.seed is None else (self.cfg.seed + self.replies + 2**63) % 2**64 - 2**63  # 64-bit
        self.replies += 1
        cfg = self.cfg.replace(
            max_new_tokens=min(self.cfg.max_new_tokens, room),
            min_new_tokens=min(self.cfg.min_new_tokens, room),
            stop_strings=(),
            seed=seed,
        )
        detok = IncrementalDetokenizer(self.tokenizer, skip_ids=self.control_ids)
        stopper = StopStringMatcher(list(self.cfg.stop_strings))
        splitter = ReasoningSplitter()
        self.reply_text, self.tokens, self.stopped = "", 0, False

        def route(piece: str):
            self.reply_text += piece
            r, c = splitter.feed(piece)
            reasoning.append(r)
            content.append(c)
            return r, c

        self.cut = self.limited = False
        for tok in stream(self.model, prompt, cfg):
            self.tokens += 1
            piece, self.stopped = stopper.feed(detok.add(tok))
            for kind, s in zip(("reasoning", "content"), route(piece)):
                if s:
                    yield kind, s
            if self.stopped:
                break
        else:
            # no stop string: a stop token, the max_new_tokens asked for, or the context's end (fewer than asked)
            piece, self.stopped = stopper.feed(detok.flush())  # a stop string the held end of a character completes
            self.cut = (
                not self.stopped and self.tokens >= cfg.max_new_tokens and cfg.max_new_tokens < self.cfg.max_new_tokens
            )
            self.limited = not self.stopped and self.tokens >= self.cfg.max_new_tokens
            for kind, s in zip(("reasoning", "content"), route(piece + stopper.flush())):
                if s:
                    yield kind, s
        r, c = splitter.flush()
        reasoning.append(r)
        content.append(c)
        for kind, s in (("reasoning", r), ("content", c)):
            if s:
                yield kind, s
        self.history.append(_reply_message(reasoning, content))


def _reply_message(reasoning: list[str], content: list[str]) -> dict:
    """The assistant's turn of a reply's pieces: its content, and its reasoning where it has any."""
    reply = {"role": "assistant", "content": "".join(content)}
    if "".join(reasoning).strip():
        reply["reasoning_content"] = "".join(reasoning).strip("\n")
    return reply


def reply_budget(max_new_tokens: int, context: int) -> int:
    """The room a chat keeps for the next reply in the model's context: ``max_new_tokens``, at most half the context
    (a reply needs room; the conversation too). It grows with ``max_new_tokens`` and stays at half past it: a reply
    that may be longer still gets whatever room the conversation leaves."""
    return min(max_new_tokens, max(1, context // 2))
