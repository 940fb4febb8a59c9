"""Turn one input item into one store record for a train type, or say why it is bad.

Every check raises ``BadRecord(reason)``; the packer adds ``file:line`` and either stops or
(with ``--skip-bad``) counts the reason in ``meta.json``.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from cookmind import json_input
from cookmind.store.sources import Item
from cookmind.tokenizer.documents import continuation_ids, document_ids, prompt_ids

ROLES = ("system", "user", "assistant", "tool")

# The seed's light SFT augmentation: a system prompt for conversations without one.
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a friendly and knowledgeable assistant.",
    "You are a careful assistant. Answer clearly and correctly.",
    "You are CookMind, a small and helpful language model.",
    "You are a concise assistant; answer the question directly.",
)
# A reply written as "<think>reasoning</think>answer" (a common dataset form); see reasoning_from_content.
LEADING_THINK = re.compile(r"\s*<think>(.*?)</think>\s*", re.DOTALL)


class BadRecord(ValueError):
    """An input item that cannot become a record; the message is the reason."""


class EmptyDocument(BadRecord):
    """A pretraining document with no text. It carries nothing, so every reader (pack, tokenizer train, eval ppl)
    leaves it out and counts it; an SFT/DPO/GRPO record whose required text is empty is a plain ``BadRecord``."""


REASON_KINDS = (
    "invalid UTF-8",
    "invalid JSON",
    "missing field",
    "roles out of order",
    "empty text",
    "minority grpo kind",
)


def reason_kind(reason: str) -> str:
    """The category a bad-line reason is counted under in ``meta.json``."""
    return next((k for k in REASON_KINDS if reason.startswith(k)), "invalid record")


@dataclass
class SkippedRecords:
    """Bad records ``--skip-bad`` left out (``pack``, ``tokenizer train``): how many by reason (``reason_kind``),
    and where the first ones were (``file:line: reason``)."""

    MAX_EXAMPLES = 20
    by_reason: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(self.by_reason.values())

    def add(self, kind: str, where: str) -> None:
        self.by_reason[kind] += 1
        if len(self.examples) < self.MAX_EXAMPLES:
            self.examples.append(where)

    def summary(self) -> str:
        """One line: the count, by reason, and the first bad record."""
        reasons = ", ".join(f"{kind} {n}" for kind, n in self.by_reason.most_common())
        return f"skipped {self.count} bad record(s) ({reasons}); the first: {self.examples[0]}"

    def as_meta(self) -> dict:
        """What a store's ``meta.json`` keeps under "skipped"."""
        return {"count": self.count, "by_reason": dict(self.by_reason), "examples": list(self.examples)}


@dataclass
class RecordOptions:
    """How items become records (everything except the tokenizer)."""

    train_type: str
    text_field: str = "text"
    prompt_template: str = "chat"  # "chat": the chat template with a generation prompt; else a str with {question}
    add_system_ratio: float = 0.0
    drop_empty_think_ratio: float = 0.0
    seed: int = 0
    split_turns: bool = False  # sft: each assistant turn its own record, in the context it is generated in


def parse(item: Item) -> object:
    """The item's payload as a Python object (JSON lines are parsed here, in the worker)."""
    if item.kind == "bad":
        raise BadRecord(item.payload)
    if item.kind != "json":
        return item.payload
    try:  # without its newline: a line cut off mid-object was "line 2, column 1" to json, reported as column 1
        return json_input.loads(item.payload.rstrip("\r\n"))
    except json.JSONDecodeError as exc:
        raise BadRecord(f"invalid JSON ({json_input.line_problem(item.payload, exc)})") from None


def _field(obj: dict, *names: str):
    for name in names:
        if name in obj:
            return obj[name]
    raise BadRecord(f"missing field: expected one of {list(names)}, found {sorted(obj)}")


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise BadRecord(f"{what} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise BadRecord(f"empty text in {what}")
    return value


def check_messages(messages, need_assistant: bool = True, end_with_assistant: bool = False) -> list[dict]:
    """Validate a chat: known roles, system only first, user opens, turns alternate sensibly."""
    if not isinstance(messages, list) or not messages:
        raise BadRecord("conversation must be a non-empty list of messages")
    prev = None
    for k, m in enumerate(messages, 1):
        if not isinstance(m, dict) or "role" not in m:
            raise BadRecord(f"message {k} is not an object with a 'role'")
        role = m["role"]
        if role not in ROLES:
            raise BadRecord(f"message {k} has unknown role {role!r}; expected one of {list(ROLES)}")
        content = m.get("content")
        if role == "assistant" and m.get("tool_calls") and content in (None, ""):
            pass  # a pure tool call has no text
        elif content is not None and not isinstance(content, str):  # it was reported as "empty text"
            raise BadRecord(f"message {k} ({role}): content must be a string, got {type(content).__name__}")
        elif content is None or not content.strip():
            raise BadRecord(f"empty text in message {k} ({role})")
        allowed = {
            "system": (None,),
            "user": (None, "system", "assistant", "tool"),
            "assistant": ("user", "tool"),
            "tool": ("assistant", "tool"),
        }[role]
        if prev not in allowed:
            after = "at the start" if prev is None else f"after {prev}"
            raise BadRecord(f"roles out of order: message {k} is {role} {after}")
        prev = role
    if need_assistant and not any(m["role"] == "assistant" for m in messages):
        raise BadRecord("no assistant message to learn from")
    if end_with_assistant and messages[-1]["role"] != "assistant":
        raise BadRecord(f"roles out of order: the last message must be the assistant's, not {messages[-1]['role']}")
    return messages


def _messages(obj) -> list[dict]:
    """A chat from conversations/messages, question/answer (GSM8K) or prompt/response fields."""
    if not isinstance(obj, dict):
        raise BadRecord(f"expected a JSON object, got {type(obj).__name__}")
    for key in ("conversations", "messages"):
        if key in obj:
            return obj[key]
    # one exchange: a bad field is named as the record spells it, not as the chat's "message 2 (assistant)" it becomes
    if "question" in obj:
        answer = _field(obj, "answer")
        return [
            {"role": "user", "content": _text(obj["question"], "question")},
            {"role": "assistant", "content": _text(answer, "answer")},
        ]
    if "prompt" in obj:
        answer = _field(obj, "response", "completion")
        return [
            {"role": "user", "content": _text(obj["prompt"], "prompt")},
            {"role": "assistant", "content": _text(answer, "response" if "response" in obj else "completion")},
        ]
    raise BadRecord(
        f"missing field: expected 'conversations', 'messages', question/answer or prompt/response, found {sorted(obj)}"
    )


def restates_prompt(value, chat: list[dict]) -> bool:
    """Whether ``value``, a ``prompt`` or ``question`` field beside a whole chat, says what the chat asks: none
    (absent or null: a column missing from some rows, as pandas writes it), the text of one of its user messages or
    within one (UltraChat's rows give the first user message; a template may wrap a question), or the chat's first
    messages themselves."""
    if value is None:
        return True
    if isinstance(value, str):
        users = [m.get("content") for m in chat if isinstance(m, dict) and m.get("role") == "user"]
        return any(isinstance(u, str) and value.strip() in u for u in users) and bool(value.strip())
    return isinstance(value, list) and bool(value) and value == chat[: len(value)]


def _shown(value) -> str:
    return repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."


def _check_beside_chat(obj: dict, key: str, chat: list[dict]) -> None:
    """A chat's record is read as its chat alone (``chat``: as checked): a ``prompt`` or ``question`` beside it must
    restate what it asks (``restates_prompt``), and ``messages`` beside ``conversations`` must be the same chat;
    otherwise which did the record mean? A bad record, not a field left out without a word. (An answer field is not
    checked: a reference such as GSM8K's '... #### 5' may rightly differ from the reply.)"""
    other = "messages" if key == "conversations" else "conversations"
    if other in obj and obj[other] != obj[key]:
        raise BadRecord("'messages' and 'conversations' hold different chats: keep one of them")
    for name in ("prompt", "question"):
        if not restates_prompt(obj.get(name), chat):
            raise BadRecord(
                f"{name} {_shown(obj[name])} is not a user message of the chat in {key!r}: leave {name} out, or give "
                f"the record as {'question/answer' if name == 'question' else 'prompt/response'} without {key!r}"
            )


def reasoning_from_content(messages: list[dict], tok) -> list[dict]:
    """Assistant replies that open with <think>...</think> get it as reasoning_content, the rest as content, where
    ``tok``'s chat template renders reasoning_content (ours does; a Hugging Face one says by ``renders_reasoning``).

    The chat template then writes the think tokens itself; `<think>` typed anywhere else (a user message,
    the middle of a reply) stays text, like every other special token in data. A template that reads no
    reasoning_content (Llama 2's) would drop it from the training text: the reply stays whole there (and a message's
    own reasoning_content is a bad record, as ``_render`` refuses any part of a chat the template leaves out).
    """
    renders = getattr(tok, "renders_reasoning", True)
    out = []
    for m in messages:
        content = m.get("content")
        if renders and m.get("role") == "assistant" and m.get("reasoning_content") is None and isinstance(content, str):
            hit = LEADING_THINK.match(content)
            if hit:
                m = {**m, "reasoning_content": hit.group(1).strip("\n"), "content": content[hit.end() :]}
        out.append(m)
    return out


def _augment(messages: list[dict], opts: RecordOptions, rng: random.Random) -> list[dict]:
    """Seeded: maybe add a system prompt, maybe drop empty think blocks (empty reasoning_content)."""
    messages = [dict(m) for m in messages]
    if opts.add_system_ratio > 0 and messages[0]["role"] != "system" and rng.random() < opts.add_system_ratio:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    if opts.drop_empty_think_ratio > 0:
        for m in messages:
            empty_reasoning = "reasoning_content" in m and not str(m["reasoning_content"]).strip()
            if m["role"] == "assistant" and empty_reasoning and rng.random() < opts.drop_empty_think_ratio:
                m.pop("reasoning_content")
    return messages


def _render(tok, messages, tools=None, add_generation_prompt=False, last_turn=False) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) of a chat as a record; ``last_turn``: the mask on its last message alone (an assistant turn), the
    chat before it rendered as the prompt it answers at inference (``render_last_turn``)."""
    try:
        if last_turn:
            ids, mask = tok.render_last_turn(messages, tools=tools)
        else:
            ids, mask = tok.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    except BadRecord:
        raise
    except ValueError as exc:  # the chat template refused the messages (e.g. a malformed tool call)
        raise BadRecord(f"invalid record: {exc}") from None
    # a Hugging Face template may render only some parts of a chat (ours renders every one): none is dropped unsaid
    left_out = getattr(tok, "left_out", None)
    if last_turn:  # earlier turns' reasoning is the template's to drop (Qwen3's does): the model never sees it then
        messages = [_without_reasoning(m) for m in messages[:-1]] + [messages[-1]]
    if left_out is not None and (what := left_out(messages, tools=tools)):
        raise BadRecord(what)
    return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=np.uint8)


def _without_reasoning(message: dict) -> dict:
    return {k: v for k, v in message.items() if k != "reasoning_content"}


def _render_prompt(tok, messages, tools=None) -> np.ndarray:
    """The ids of a prompt for the assistant's next turn (``render_prompt``: no training mask to compute)."""
    try:
        ids = tok.render_prompt(messages, tools=tools)
    except BadRecord:
        raise
    except ValueError as exc:
        raise BadRecord(f"invalid record: {exc}") from None  # a system message the template leaves out, too
    return np.asarray(ids, dtype=np.int64)


def reference_text(value, field: str = "answer") -> str:
    """A reference answer as graders read it: a string as it is, a finite number as its text (``{"answer": 4}`` ->
    "4"); anything else (a bool, NaN, Infinity: Python's json reads the last two) is a BadRecord naming ``field``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return str(value)
    got = repr(value) if isinstance(value, float) else type(value).__name__
    raise BadRecord(f"{field!r} must be text ('... #### N') or a finite number, got {got}")


def check_gradable(answer: str, field: str = "answer") -> None:
    """A reference answer a grader reads one answer from: GSM8K's '... #### N', or a bare value (a number, or words:
    'yes'). A worked solution of several numbers and no '#### N' line names none as its answer (graders took its first
    number): a BadRecord naming ``field``."""
    from cookmind.answer_numbers import numbers_in

    if "####" not in answer and (n := len(numbers_in(answer))) > 1:
        raise BadRecord(
            f"{field!r} holds {n} numbers and no '#### N' line: which is the answer? End it with '#### N' (GSM8K's "
            "form), or give the answer alone"
        )


def reference_answer(answer, field: str = "answer") -> str:
    """GSM8K style: the text after ``####`` when present, else the whole answer (``check_gradable``), stripped;
    errors name ``field``, the record's field that held it (``reference_answer``, ``ground_truth``)."""
    answer = _text(reference_text(answer, field), field)
    check_gradable(answer, field)
    return answer.split("####")[-1].strip() if "####" in answer else answer.strip()


def make_seq(obj, tok, opts: RecordOptions) -> str:
    """The text of one pretraining document (tokenized in batches by the caller)."""
    if isinstance(obj, str):  # a plain text file's document
        if not obj.strip():
            raise EmptyDocument("empty document between two separators")
        return obj
    if not isinstance(obj, dict):
        raise BadRecord(f"expected a JSON object with a {opts.text_field!r} field, got {type(obj).__name__}")
    if opts.text_field not in obj:
        missing = f"missing field {opts.text_field!r} (found {sorted(obj)})"
        if (kind := train_type_of(obj)) and kind != "seq":  # a chat or a pair: no field of it holds a document's text
            raise BadRecord(f"{missing}: {_read_by(kind)}, not a text document")
        raise BadRecord(f"{missing}; choose it with --text-field")
    text = obj[opts.text_field]
    if isinstance(text, str) and not text.strip():
        raise EmptyDocument(f"empty text in field {opts.text_field!r}")
    return _text(text, f"field {opts.text_field!r}")


def _tools(obj, messages: list[dict]):
    """Tool schemas: a top-level ``tools`` field, else ``tools`` on the first (system) message."""
    tools = obj.get("tools") if isinstance(obj, dict) else None
    if tools is None and messages and isinstance(messages[0], dict):
        tools = messages[0].get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRecord(f"tools must be a list of function schemas, got {type(tools).__name__}")
    return tools or None


def make_sft(obj, tok, opts: RecordOptions, rng: random.Random) -> dict[str, np.ndarray]:
    messages = check_messages(_messages(obj))
    if key := next((k for k in ("conversations", "messages") if k in obj), None):
        _check_beside_chat(obj, key, messages)  # after the chat's own check: a bad chat is said as such
    messages = reasoning_from_content(messages, tok)
    messages = _augment(messages, opts, rng)
    tools = _tools(obj, messages)
    if opts.split_turns:  # each assistant turn after the chat before it, as the model sees it when it writes the turn
        records = []
        for i in (i for i, m in enumerate(messages) if m["role"] == "assistant"):
            ids, mask = _render(tok, messages[: i + 1], tools=tools, last_turn=True)
            if not mask.any():
                raise BadRecord(f"the chat template marked no token of message {i + 1} (assistant)")
            records.append({"sequence": ids, "loss_mask": mask})
        return records
    ids, mask = _render(tok, messages, tools=tools)
    if not mask.any():
        raise BadRecord("the chat template marked no assistant token")
    return {"sequence": ids, "loss_mask": mask}


def _preference_side(obj: dict, side: str) -> tuple[list[dict], bool]:
    """One side of a pair as a whole chat: a chat as given, or the ``prompt`` and then the answer (a string, or
    assistant messages as TRL's conversational rows keep them apart from their prompt); and whether it was given
    whole (a ``prompt`` beside it then only restates the chat's own, ``_check_restated_prompt``)."""
    value = _field(obj, side)
    first = value[0] if isinstance(value, list) and value else None
    answer_only = isinstance(first, dict) and first.get("role") == "assistant"
    if isinstance(value, list) and not (answer_only and "prompt" in obj):
        return value, True
    prompt = _field(obj, "prompt")
    # text fields named as the record spells them (they were "message 2 (assistant)" of the chat they become)
    head = prompt if isinstance(prompt, list) else [{"role": "user", "content": _text(prompt, "prompt")}]
    return head + (value if answer_only else [{"role": "assistant", "content": _text(value, side)}]), False


def _check_restated_prompt(prompt, asked: list[dict], side: str) -> None:
    """A ``prompt`` beside whole chats (UltraFeedback's rows: the user's text, then each side as the chat) is not
    read: the chat holds the prompt. It must restate what the chat asks (``restates_prompt`` of its messages before
    the last answer); another prompt is a bad record, not one left out without a word (which did the pair answer?)."""
    if not restates_prompt(prompt, asked):
        raise BadRecord(
            f"prompt {_shown(prompt)} is not the prompt of the whole chat in {side!r} (one of its user messages, or "
            "its first messages): give chosen/rejected as answers to the prompt, or leave prompt out"
        )


def make_dpo(obj, tok, opts: RecordOptions) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict):
        raise BadRecord(f"expected a JSON object, got {type(obj).__name__}")
    record, asked = {}, {}
    for side in ("chosen", "rejected"):
        chat, whole = _preference_side(obj, side)
        try:
            messages = reasoning_from_content(check_messages(chat, end_with_assistant=True), tok)
        except BadRecord as exc:  # a pair holds two chats: say which (after the reason, whose start is its kind)
            raise BadRecord(f"{exc} (in {side!r})") from None
        asked[side] = messages[:-1]
        if whole and "prompt" in obj:
            _check_restated_prompt(obj["prompt"], chat[:-1], side)
        # the answer's tokens past its prompt with the generation prompt, as at inference
        record[side], record[f"{side}_mask"] = _render(tok, messages, tools=obj.get("tools"), last_turn=True)
        if not record[f"{side}_mask"].any():
            raise BadRecord(f"{side}: the chat template marked no response token")
    if asked["chosen"] != asked["rejected"]:  # DPO compares two answers to one prompt
        k = next((i for i, (a, b) in enumerate(zip(asked["chosen"], asked["rejected"])) if a != b), None)
        k = min(len(asked["chosen"]), len(asked["rejected"])) if k is None else k
        raise BadRecord(
            f"chosen and rejected differ before their last answer (message {k + 1} of each): a pair is two answers"
            " to one prompt; fix the pair or leave it out"
        )
    if np.array_equal(record["chosen"], record["rejected"]):  # DPO's loss is log 2 with no gradient, whatever the model
        raise BadRecord("chosen and rejected are the same chat: the pair teaches nothing; leave it out or fix one side")
    return record


def _prompt_ids(question, tok, opts: RecordOptions, field: str = "prompt") -> np.ndarray:
    if isinstance(question, list):
        messages = check_messages(question, need_assistant=False)
        return _render_prompt(tok, messages)
    question = _text(question, field)
    if opts.prompt_template == "chat":
        return _render_prompt(tok, [{"role": "user", "content": question}])
    return np.asarray(prompt_ids(tok, _prompt_text(question, opts)), dtype=np.int64)  # a document's start first


def _prompt_text(question: str, opts: RecordOptions) -> str:
    """A text prompt template filled (a name: plain, r1_zero, compact: grpo.template's, is its text, as train and eval
    prompt)."""
    from cookmind.prompt_templates import PROMPTS

    return PROMPTS.get(opts.prompt_template, opts.prompt_template).replace("{question}", question.strip())


def make_grpo(obj, tok, opts: RecordOptions) -> dict[str, np.ndarray]:
    if not isinstance(obj, dict):
        raise BadRecord(f"expected a JSON object, got {type(obj).__name__}")
    question = _field(obj, "question", "prompt")
    asked = "question" if "question" in obj else "prompt"  # the field that held it: errors name what the user wrote
    prompt = _prompt_ids(question, tok, opts, asked)
    if "response" not in obj:  # online: prompt + reference answer
        answer = _field(obj, "answer", "reference_answer", "ground_truth")
        answer = reference_answer(answer, next(f for f in ("answer", "reference_answer", "ground_truth") if f in obj))
        return {"prompts": prompt, "answers": np.frombuffer(answer.encode("utf-8"), dtype=np.uint8)}
    response = _text(obj["response"], "response")
    reward = _field(obj, "reward")
    if not isinstance(reward, (int, float)) or isinstance(reward, bool) or not math.isfinite(reward):
        raise BadRecord(f"reward must be a finite number, got {reward!r}")
    if isinstance(question, list) or opts.prompt_template == "chat":  # the response is the chat's assistant turn
        asked = question if isinstance(question, list) else [{"role": "user", "content": question}]
        chat = [*check_messages(asked, need_assistant=False), {"role": "assistant", "content": response}]
        ids, mask = _render(tok, reasoning_from_content(chat, tok), last_turn=True)
        n = len(prompt)
        if not np.array_equal(ids[:n], prompt):
            raise BadRecord(
                "the chat template renders the prompt otherwise when the response follows it: its render of the "
                "prompt is not the start of its render of prompt and response; give a --prompt-template with "
                "{question}, or a template that renders each turn the same whatever follows"
            )
        resp, resp_mask = ids[n:], mask[n:]
        if not resp_mask.any():
            raise BadRecord("the chat template marked no response token")
    else:  # a text prompt: the response's ids as written after it (no SentencePiece dummy "▁" between)
        ids = continuation_ids(tok, _prompt_text(question, opts), response, prompt.tolist())[1]
        resp = np.asarray(ids + [tok.eos_id], dtype=np.int64)
        resp_mask = np.ones(len(resp), dtype=np.uint8)
    return {"prompts": prompt, "responses": resp, "masks": resp_mask, "rewards": np.array([reward], dtype=np.float32)}


def item_rng(opts: RecordOptions, item: Item) -> random.Random:
    """One RNG per item, so augmentation does not depend on worker count or order."""
    return random.Random(f"{opts.seed}:{item.source}:{item.line}")


def train_type_of(obj) -> str | None:
    """The ``--train-type`` whose records ``obj`` looks like, by its fields (None: no telling), for an error to name
    when a record lacks what its pack's type reads: chats and pairs given to a seq pack, text to an sft one."""
    keys = set(obj) if isinstance(obj, dict) else set()
    if {"chosen", "rejected"} <= keys:
        return "dpo"
    if "reward" in keys and keys & {"question", "prompt"}:
        return "grpo"
    if keys & {"messages", "conversations"} or {"question", "answer"} <= keys:
        return "sft"
    if "prompt" in keys and keys & {"response", "completion"}:
        return "sft"
    if "text" in keys:
        return "seq"
    return None


# the fields of chat, pair and problem records that hold text a model reads or writes (what train_type_of tells apart)
CHAT_TEXT_FIELDS = (
    "conversations", "messages", "prompt", "question", "chosen", "rejected", "answer", "response", "completion",
    "reference_answer", "ground_truth",
)  # fmt: skip


def chat_texts(obj: dict) -> list[str]:
    """The texts of a chat, preference pair or RL problem record (``train_type_of`` says sft, dpo or grpo), each
    one a document for tokenizer training, as pack's chat tokens separate them: every message's content and
    reasoning (a reply's leading <think> block as its reasoning, as pack renders it), the prompt, question and
    answers, in ``CHAT_TEXT_FIELDS`` order; blank ones left out. A field of another type is a BadRecord."""
    out: list[str] = []

    def add(value, where: str) -> None:
        if value is None:
            return
        if isinstance(value, str):
            if value.strip():
                out.append(value)
            return
        if isinstance(value, dict) and isinstance(value.get("text"), str):  # a content part {"type": "text", ...}
            add(value["text"], where)
            return
        if isinstance(value, list) and where.count(".") == 0:  # a field's list of messages
            messages = [m for m in value if isinstance(m, dict)]
            if len(messages) != len(value):
                raise BadRecord(f"field {where!r}: expected a list of messages (objects), got another item")
            for i, m in enumerate(reasoning_from_content(messages, None)):
                add(m.get("reasoning_content"), f"{where}.{i}.reasoning_content")
                add(m.get("content"), f"{where}.{i}.content")
            return
        if isinstance(value, list) and where.endswith(".content"):  # a message's list of content parts
            for part in value:
                add(part, where + ".part")
            return
        raise BadRecord(f"field {where!r}: expected text or a list of messages, got {type(value).__name__}")

    for name in CHAT_TEXT_FIELDS:
        if name in obj:
            add(obj[name], name)
    return out


def _read_by(kind: str) -> str:
    return f"it looks like {kind} data, which `cookmind pack --train-type {kind}` reads"


def make_record(item: Item, tok, opts: RecordOptions) -> dict[str, np.ndarray] | list[dict[str, np.ndarray]]:
    """The store record for one item (seq: the document's ids, framed by ``document_ids``); sft with
    ``split_turns``: a list of them, one an assistant turn."""
    obj = parse(item)
    if opts.train_type == "seq":
        return {"sequence": np.asarray(document_ids(tok, tok.encode(make_seq(obj, tok, opts))), dtype=np.int64)}
    try:
        if opts.train_type == "sft":
            return make_sft(obj, tok, opts, item_rng(opts, item))
        if opts.train_type == "dpo":
            return make_dpo(obj, tok, opts)
        if opts.train_type == "grpo":
            return make_grpo(obj, tok, opts)
    except BadRecord as exc:
        kind = train_type_of(obj)
        if str(exc).startswith("missing field") and kind not in (None, opts.train_type):
            raise BadRecord(f"{exc}; {_read_by(kind)}") from None
        raise
    raise ValueError(f"unknown train type {opts.train_type!r}")
