"""Terminal chat (ChatSession + the REPL) and `cookmind generate`, on a saved tiny checkpoint."""

from __future__ import annotations

import io
import shutil

import pytest
import torch
from test_server import make_model, make_tokenizer

from cookmind.cli import main as cli_main
from cookmind.infer import SamplingParams, generate
from cookmind.infer.chat_session import ChatSession
from cookmind.infer.cli_chat import run
from cookmind.infer.reasoning import split_reasoning
from cookmind.model import save_model

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory)
    model = make_model(tok.vocab_size, max_pos=256)
    d = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_model(d, model)
    tok.save(d)
    return d, model, tok


def control(tok):
    """The default special tokens but the reasoning markers, by hand: a chat reply ends at any of them, and plain
    output leaves them out."""
    return (tok.eos_id, tok.im_start_id, tok.im_end_id)


def without_control(tok, ids):
    return tok.decode([t for t in ids if t not in control(tok)])


def reference_reply(model, tok, messages, n):
    ids = tok.render(messages, add_generation_prompt=True)[0]
    params = SamplingParams(temperature=0, max_new_tokens=n, stop_token_ids=control(tok))
    out = generate(model, [ids], params)[0]
    return split_reasoning(tok.decode(out))


def test_session_keeps_history_and_system(ckpt):
    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=6), system="You are a cook.")
    first = "".join(p for k, p in s.send("Hi there") if k == "content")
    msgs = [{"role": "system", "content": "You are a cook."}, {"role": "user", "content": "Hi there"}]
    assert first == reference_reply(model, tok, msgs, 6)[1]
    second = "".join(p for k, p in s.send("And the soup?") if k == "content")
    msgs += [s.history[1], {"role": "user", "content": "And the soup?"}]
    assert second == reference_reply(model, tok, msgs, 6)[1]
    assert [m["role"] for m in s.messages()] == ["system", "user", "assistant", "user", "assistant"]
    s.reset()
    assert s.messages() == [{"role": "system", "content": "You are a cook."}]


def test_repl_commands(ckpt):
    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=4))
    out = io.StringIO()
    run(s, io.StringIO("/system Be brief.\nhello\n/history\n/reset\n/history\n/quit\n"), out)
    text = out.getvalue()
    assert "(system prompt set; conversation cleared)" in text
    assert "[system] Be brief.\n[user] hello\n[assistant]" in text
    assert "(conversation cleared)" in text
    # after /reset only the system prompt remains in /history
    assert text.rsplit("(conversation cleared)", 1)[1].count("[user]") == 0
    reply = reference_reply(
        model, tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}], 4
    )[1]
    assert "bot> " + reply in text


def test_repl_an_unknown_command_says_so_and_a_double_slash_sends_the_message(ckpt):
    # "/rest" (a typo) or "/etc/hosts is what?" printed the help alone: nothing said it was not sent, nor how to send it
    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=4))
    out = io.StringIO()
    run(s, io.StringIO("/rest\n//etc/hosts is what?\n/quit\n"), out)
    text = out.getvalue()
    assert "(unknown command /rest: nothing was sent; start a message with // to send one that begins with /)" in text
    assert s.messages()[0] == {"role": "user", "content": "/etc/hosts is what?"}


def test_cookmind_generate_cli(ckpt, capsys):
    d, model, tok = ckpt
    assert cli_main(["generate", "--checkpoint", str(d), "--prompt", "The cook", "--max-new-tokens", "7"]) == 0
    out = generate(
        model,
        [tok.encode("The cook")],
        SamplingParams(temperature=0, max_new_tokens=7, stop_token_ids=(tok.eos_id, tok.im_end_id)),
    )[0]
    assert capsys.readouterr().out == without_control(tok, out) + "\n"


def test_cookmind_generate_cli_batch_cuts_each_completion_before_its_stop_string(ckpt, capsys):
    d, model, tok = ckpt
    prompts = ["The cook", "Soup"]
    greedy = SamplingParams(temperature=0, max_new_tokens=12, stop_token_ids=(tok.eos_id, tok.im_end_id))
    free = [without_control(tok, o) for o in generate(model, [tok.encode(p) for p in prompts], greedy)]
    stop = free[0][len(free[0]) // 2 :][:2]  # two characters from the middle of the first completion
    if not stop.strip():
        pytest.skip("the tiny model's completion has no usable stop string")
    args = ["generate", "--checkpoint", str(d), "--max-new-tokens", "12", "--stop", stop]
    assert cli_main(args + [a for p in prompts for a in ("--prompt", p)]) == 0
    want = "".join(f"=== {p}\n{f.split(stop, 1)[0]}\n" for p, f in zip(prompts, free))  # str.split as reference
    assert capsys.readouterr().out == want


def _chat_cli(argv, lines, monkeypatch) -> str:
    """What `cookmind chat ARGV` prints when the user types ``lines``."""
    from cookmind.infer import cli_chat

    out = io.StringIO()
    monkeypatch.setattr(cli_chat, "run", lambda session, color: run(session, io.StringIO(lines), out))
    assert cli_main(["chat", *argv]) == 0
    return out.getvalue()


def test_cookmind_chat_takes_generates_stop_and_min_p(ckpt, monkeypatch):
    # `cookmind chat --stop ... --min-p ...` was a usage error: generate had them, chat did not
    d, model, tok = ckpt
    n = 12
    ids = tok.render([{"role": "user", "content": "hello"}], add_generation_prompt=True)[0]
    greedy = generate(model, [ids], SamplingParams(temperature=0, max_new_tokens=n, stop_token_ids=control(tok)))[0]
    reply = tok.decode(greedy)
    stop = reply[len(reply) // 2 :][:2]  # two characters from the middle of the reply
    if not stop.strip() or "<think>" in reply:
        pytest.skip("the tiny model's reply has no usable stop string")
    base = ["--checkpoint", str(d), "--max-new-tokens", str(n)]
    text = _chat_cli([*base, "--temperature", "0", "--stop", stop], "hello\n/quit\n", monkeypatch)
    assert f"bot> {reply.split(stop, 1)[0]}\nyou> " in text  # str.split as reference; the stop string not shown
    # min-p 1 keeps only the most likely token: sampling hot is greedy then (and without it, for this seed, is not)
    hot = [*base, "--temperature", "1.5", "--seed", "3"]
    ran_out = len(greedy) == n and greedy[-1] not in control(tok)  # to --max-new-tokens: the chat says so
    note = f" (stopped at --max-new-tokens {n}; raise it for longer replies)" if ran_out else ""
    assert f"bot> {reply}{note}\nyou> " in _chat_cli([*hot, "--min-p", "1"], "hello\n/quit\n", monkeypatch)
    assert f"bot> {reply}{note}\nyou> " not in _chat_cli(hot, "hello\n/quit\n", monkeypatch)


def test_serve_loader_reads_checkpoint_and_hf_export(ckpt, tmp_path):
    from cookmind.infer.loading import load_for_inference
    from cookmind.model.hf import export_hf

    d, model, tok = ckpt
    hf_dir = export_hf(d, tmp_path / "hf")
    ids = torch.tensor([tok.encode("The cook stirs the soup.")])
    with torch.no_grad():
        ref = model(ids).logits
    run = tmp_path / "run" / "checkpoints"
    shutil.copytree(d, run / "step_3")
    for path in (d, hf_dir, tmp_path / "run"):  # a training run: its newest checkpoint
        loaded, loaded_tok = load_for_inference(path)
        with torch.no_grad():
            torch.testing.assert_close(loaded(ids).logits, ref, atol=1e-5, rtol=1e-5)
        assert loaded_tok.encode("soup and bread") == tok.encode("soup and bread")
    native, native_tok = load_for_inference(hf_dir, hf_native=True)  # evals: transformers as it is
    assert type(native).__module__.startswith("transformers")
    with torch.no_grad():
        torch.testing.assert_close(native(ids).logits, ref, atol=1e-5, rtol=1e-5)
    assert native_tok.encode("soup and bread", add_special_tokens=False) == tok.encode("soup and bread")
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        load_for_inference(tmp_path / "absent")


def test_hf_tokenizer_adapter_matches_ours(ckpt, tmp_path):
    from cookmind.model.hf import export_hf
    from cookmind.tokenizer.hf_adapter import HFTokenizerAdapter

    d, _, tok = ckpt
    hf = HFTokenizerAdapter(export_hf(d, tmp_path / "hf"))  # transformers reading tokenizer.json
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is in the soup?"}]
    assert hf.render(msgs, add_generation_prompt=True)[0] == tok.render(msgs, add_generation_prompt=True)[0]
    assert (hf.eos_id, hf.im_end_id) == (tok.eos_id, tok.im_end_id)
    ids = tok.encode("soup <think>x</think> bread")
    assert hf.decode(ids) == tok.decode(ids)


def test_a_reply_cut_by_the_context_says_so(ckpt):
    """The context's end cut a reply mid-way without a word (generate warns about it up front); the REPL now says
    so after the reply. Whether the tiny model stops by itself first is read off the reference generation."""
    _, model, tok = ckpt
    context = model.config.max_position_embeddings

    def room_after(text):
        return context - len(tok.render([{"role": "user", "content": text}], add_generation_prompt=True)[0])

    long = "hello"
    while room_after(long + " the soup needs salt") > 20:  # a prompt that leaves fewer than 40 - 20 new tokens
        long += " the soup needs salt"
    for text in ("hello", long):
        prompt = tok.render([{"role": "user", "content": text}], add_generation_prompt=True)[0]
        n = min(40, context - len(prompt))
        params = SamplingParams(temperature=0, max_new_tokens=n, stop_token_ids=control(tok))
        ref = generate(model, [prompt], params, keep_stop_token=True)[0]
        stopped = bool(ref) and ref[-1] in control(tok)
        s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=40))
        out = io.StringIO()
        run(s, io.StringIO(text + "\n/quit\n"), out)
        cut = n < 40 and not stopped and len(ref) == n
        assert s.cut == cut and ("(cut: the conversation filled the model's context" in out.getvalue()) == cut
        assert cut == (text == long), "the tiny model stopped by itself: pick another prompt"


def test_a_conversation_past_the_context_leaves_its_oldest_exchanges_out_and_says_so(ckpt):
    """Once the history filled the context every later turn was refused ("fills the model's context; /reset").
    Now the oldest exchanges are left out until the conversation fits, the system prompt kept, the REPL says how
    many messages went, and the reply is the one the model gives to the shortened conversation."""
    _, model, tok = ckpt
    context = model.config.max_position_embeddings
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=4), system="Cook.")
    turn = "the soup needs salt and " * 6
    sent = 0
    while len(tok.render(s.messages() + [{"role": "user", "content": turn}], add_generation_prompt=True)[0]) <= (
        context - 4
    ):
        list(s.send(turn))  # fits with room for the reply's 4 tokens: nothing left out
        assert s.dropped == 0
        sent += 1
    assert sent >= 2
    kept = s.history[2:]  # what should remain once the oldest exchange goes
    out = io.StringIO()
    run(s, io.StringIO(turn + "\n/quit\n"), out)
    assert (
        s.dropped == 2 and f"(the {s.dropped} oldest messages are left out to fit the model's context" in out.getvalue()
    )
    assert s.messages()[0] == {"role": "system", "content": "Cook."} and s.history[: len(kept)] == kept
    msgs = [{"role": "system", "content": "Cook."}, *kept, {"role": "user", "content": turn}]
    assert s.history[-1]["content"] == reference_reply(model, tok, msgs, 4)[1]
    # one message longer than the whole context is still refused, and leaves the history as it was
    before = list(s.history)
    with pytest.raises(ValueError, match="fills the model's context"):
        list(s.send("salt " * context))
    assert s.history == before


def test_a_conversation_that_leaves_the_reply_less_than_its_budget_leaves_its_oldest_exchanges_out(ckpt):
    """The oldest exchanges were left out only when the next prompt left no room at all, so first a reply was cut
    short by the context ("cut: ... /reset"). Now they go while the prompt leaves less than --max-new-tokens, the
    REPL says so, and the reply is the whole one the model gives to the shortened conversation."""
    _, model, tok = ckpt
    context, n = model.config.max_position_embeddings, 16

    def room(msgs):
        return context - len(tok.render(msgs, add_generation_prompt=True)[0])

    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=n))
    turn = "the soup needs salt and " * 3
    while room(s.messages() + [{"role": "user", "content": turn}]) >= n + 40:
        list(s.send(turn))
        assert s.dropped == 0
    last = "pepper"  # a last message that leaves the reply between 1 and n - 1 tokens of room
    while room(s.messages() + [{"role": "user", "content": last + " pepper"}]) >= 1:
        last += " pepper"
    assert 1 <= room(s.messages() + [{"role": "user", "content": last}]) < n
    kept = list(s.history)  # the reference: the oldest exchanges out, by hand, until the reply's n tokens fit
    while room(kept + [{"role": "user", "content": last}]) < n:
        kept = kept[2:]
    assert len(kept) < len(s.history)
    dropped = len(s.history) - len(kept)
    out = io.StringIO()
    run(s, io.StringIO(last + "\n/quit\n"), out)
    assert s.dropped == dropped and f"(the {dropped} oldest messages are left out" in out.getvalue()
    assert not s.cut and "(cut:" not in out.getvalue()
    assert s.history[:-2] == kept
    assert s.history[-1]["content"] == reference_reply(model, tok, [*kept, {"role": "user", "content": last}], n)[1]


def test_the_room_kept_for_a_reply_grows_with_max_new_tokens_up_to_half_the_context(ckpt, capsys):
    """The room a chat keeps for the reply was --max-new-tokens up to the context minus one, then a quarter of the
    context from the whole context on: one token more asked for kept far less room (an exchange left out at
    context - 1 was kept at context). It is now --max-new-tokens up to half the context and half past it, so the
    two leave out the same exchanges, and `chat --help` says so."""
    from cookmind.infer.chat_session import reply_budget

    _, model, tok = ckpt
    context = model.config.max_position_embeddings
    assert [reply_budget(m, context) for m in range(1, 2 * context)] == [
        min(m, context // 2) for m in range(1, 2 * context)
    ]

    def room(first):
        msgs = [{"role": "user", "content": first}, {"role": "assistant", "content": "ok"}]
        return context - len(tok.render([*msgs, {"role": "user", "content": "more?"}], add_generation_prompt=True)[0])

    first = "salt"
    while room(first) >= context // 2:
        first += " salt"
    assert context // 4 <= room(first) < context // 2  # less room than half the context, more than a quarter
    for n in (context // 2, context - 1, context, 2 * context):  # all leave the exchange out
        s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=n))
        s.history = [{"role": "user", "content": first}, {"role": "assistant", "content": "ok"}]
        list(s.send("more?"))
        assert s.dropped == 2 and s.history[0] == {"role": "user", "content": "more?"}, n
    shorter = first.removesuffix(" salt")
    assert room(shorter) >= context // 2
    for n in (context - 1, context):  # a room of half the context or more keeps it
        s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=n))
        s.history = [{"role": "user", "content": shorter}, {"role": "assistant", "content": "ok"}]
        list(s.send("more?"))
        assert s.dropped == 0, n
    with pytest.raises(SystemExit):
        cli_main(["chat", "--help"])
    assert "at most half of it" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_an_empty_stop_string_is_a_usage_error_before_the_model_loads(ckpt, monkeypatch, capsys, command):
    """`--stop ""` was refused only once the model had loaded (by SamplingParams or the stop matcher); it is now
    checked with the other sampling options, before anything loads."""
    from cookmind.infer import loading

    def load(*a, **k):
        raise AssertionError("the model was loaded before --stop was checked")

    monkeypatch.setattr(loading, "load_for_inference", load)
    extra = ["--prompt", "hi"] if command == "generate" else []
    with pytest.raises(SystemExit) as exc:
        cli_main([command, "--checkpoint", str(ckpt[0]), *extra, "--stop", "x", "--stop", ""])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and "--stop" in err and "empty" in err


def test_generate_and_chat_say_when_the_model_ended_its_reply_at_once(ckpt, capsys, monkeypatch):
    """An undertrained model often ends with <|endoftext|> (or <|im_end|>) as its first token, which is never shown:
    generate printed an empty line and chat an empty "bot> ", with no word of why."""
    import sys

    gen = sys.modules["cookmind.infer.generate"]  # the module (the package's `generate` is its function)
    d, model, tok = ckpt
    monkeypatch.setattr(gen, "stream", lambda *a, **k: iter(()))  # the first token sampled is an end token
    assert cli_main(["generate", "--model", str(d), "--prompt", "The cook"]) == 0
    out = capsys.readouterr()
    assert out.out == "\n" and "cookmind generate: no text: the model ended the completion at once" in out.err
    monkeypatch.setattr(gen, "generate", lambda model, prompts, *a, **k: [[] for _ in prompts])
    assert cli_main(["generate", "--model", str(d), "--prompt", "The cook", "--prompt", "Soup"]) == 0
    assert capsys.readouterr().err.count("the model ended the completion at once") == 2
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=4))
    monkeypatch.setattr(s, "send", lambda line: iter(()))
    out = io.StringIO()
    run(s, io.StringIO("hello\n/quit\n"), out)
    assert "bot> (no reply: the model ended its turn at once)" in out.getvalue()


def test_piped_chat_whose_message_got_an_error_exits_non_zero_and_says_what_to_do(ckpt, monkeypatch, capsys):
    # `... | cookmind chat M` printed "(error: ... fills the model's context)" among the replies and exited 0: a
    # script could not tell, nor the user what to do
    import sys

    d, _, tok = ckpt
    monkeypatch.setattr(sys, "stdin", io.StringIO("salt " * 400 + "\nhello\n"))  # not a terminal
    assert cli_main(["chat", str(d), "--max-new-tokens", "4", "--temperature", "0"]) == 1
    captured = capsys.readouterr()
    # how long it is and how much fits (it named the message's tokens, not the context's): as generate says it
    n = len(tok.render([{"role": "user", "content": "salt " * 400}], add_generation_prompt=True)[0])
    assert (
        f"the message ({n} tokens with the chat template) fills the model's context of 256 tokens: nothing was "
        "sent; send a shorter one" in captured.out
    )
    assert captured.out.count("bot> ") == 2  # the next message still got its reply
    assert "cookmind chat: 1 message(s) got an error instead of a reply" in captured.err


def test_a_system_prompt_that_fills_the_context_is_refused_before_the_chat_starts(ckpt, monkeypatch, capsys):
    """`cookmind chat M --system LONG` opened the chat and answered every message with "(error: the message ... fills
    the model's context ...; send a shorter one (or a shorter /system prompt))": the message was not the problem."""
    import sys

    d, _, tok = ckpt
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert cli_main(["chat", str(d), "--system", "salt " * 400, "--max-new-tokens", "4"]) == 2
    captured = capsys.readouterr()
    n = len(tok.render([{"role": "system", "content": "salt " * 400}], add_generation_prompt=True)[0])
    assert captured.err == (
        f"cookmind chat: error: --system ({n} tokens with the chat template) fills the model's context of 256 "
        "tokens, leaving no room for a message; shorten it\n"
    ), captured.err
    assert "bot>" not in captured.out


def test_generate_says_a_stop_string_matched_before_any_text(ckpt, capsys, monkeypatch):
    # `generate --stop i` where the model's first token was "i" said "the model's 1 tokens were control tokens"
    import sys

    gen = sys.modules["cookmind.infer.generate"]  # the module (the package's `generate` is its function)
    d, _, tok = ckpt
    said = tok.encode("ice in the soup")
    monkeypatch.setattr(gen, "stream", lambda *a, **k: iter(said))
    monkeypatch.setattr(gen, "generate", lambda model, prompts, *a, **k: [list(said) for _ in prompts])
    argv = ["generate", "--model", str(d), "--prompt", "The cook", "--stop", "i"]
    for extra in ([], ["--prompt", "Soup"]):  # streamed, and a batch
        assert cli_main([*argv, *extra]) == 0
        err = capsys.readouterr().err
        assert "the output began with a --stop string" in err and "control tokens" not in err


def test_generate_refuses_an_empty_prompt_in_one_line_before_any_warning(ckpt, capsys):
    """`generate --prompt ""` printed the warning that the context leaves less room than --max-new-tokens, then
    "cookmind generate: error: generate: every prompt needs at least one token (got an empty prompt or no prompts)"
    (its stage named twice, a batch's empty prompt not named). Now one line naming the prompt, and nothing else."""
    d, _, _ = ckpt
    for extra, named in (([], "the prompt"), (["--prompt", "Soup"], "--prompt 1 of 2")):
        argv = ["generate", "--model", str(d), "--prompt", "", *extra, "--max-new-tokens", "300"]  # > the context
        assert cli_main(argv) == 2
        out, err = capsys.readouterr()
        assert (out, err) == ("", f"cookmind generate: error: {named} is empty: give some text to continue\n")


def test_a_stop_string_the_last_tokens_complete_at_the_end_counts_as_one(ckpt, capsys, monkeypatch):
    """A stop string whose end was a character the last token left unfinished (shown as U+FFFD) was found only when
    the output was flushed at the end, and then not counted: generate and chat said the model's tokens "were control
    tokens", where it had written the --stop string (as the server, whose finish_reason is now "stop")."""
    import sys

    from cookmind.infer import chat_session

    gen = sys.modules["cookmind.infer.generate"]
    d, model, tok = ckpt
    lead = next(i for i in range(tok.vocab_size) if tok.decode_bytes([i]) == "é".encode()[:1])
    said = [*tok.encode("i"), lead]  # "i", then the first byte of a character the output ends in
    assert tok.decode(said) == "i\ufffd"
    monkeypatch.setattr(gen, "stream", lambda *a, **k: iter(said))
    assert cli_main(["generate", "--model", str(d), "--prompt", "The cook", "--stop", "i\ufffd"]) == 0
    out, err = capsys.readouterr()
    assert out == "\n" and "the output began with a --stop string" in err and "control tokens" not in err
    monkeypatch.setattr(chat_session, "stream", lambda *a, **k: iter(said))
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=8, stop_strings=("i\ufffd",)))
    buf = io.StringIO()
    run(s, io.StringIO("hello\n/quit\n"), buf)
    assert s.stopped and "(no reply: the output began with a --stop string" in buf.getvalue()


def test_sampling_options_that_greedy_leaves_unused_are_named_in_a_warning(ckpt, capsys, monkeypatch):
    """generate is greedy by default: --seed 3 or --top-p 0.5 changed nothing (the same text for every seed) and
    nothing said so. A warning names them; with a --temperature above 0 there is none, and chat does the same."""
    d, _, _ = ckpt
    argv = ["generate", "--model", str(d), "--prompt", "The cook", "--max-new-tokens", "4"]
    assert cli_main(argv) == 0
    plain = capsys.readouterr()
    assert plain.err == ""
    assert cli_main([*argv, "--seed", "3", "--top-p", "0.5", "--top-k", "5"]) == 0
    out, err = capsys.readouterr()
    assert out == plain.out  # greedy: the same text
    assert err == (
        "cookmind generate: warning: --top-k, --top-p, --seed change nothing with --temperature 0 (greedy: the "
        "likeliest token each step); give a --temperature above 0 to sample\n"
    )
    assert cli_main([*argv, "--seed", "3", "--temperature", "0.8"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli_main(["chat", str(d), "--temperature", "0", "--min-p", "0.1"]) == 0
    assert capsys.readouterr().err == (
        "cookmind chat: warning: --min-p changes nothing with --temperature 0 (greedy: the likeliest token each "
        "step); give a --temperature above 0 to sample\n"
    )


# ESC starts an OSC sequence (set the title) ended by BEL, \r returns to the line's start, U+009B is a one-character
# CSI, DEL; the newline and the tab stay as they are
CONTROLS = "a\x1b]0;pwned\x07b\rc\x9b2Jd\n\te\x7f"
CONTROLS_SHOWN = "a\\x1b]0;pwned\\x07b\\rc\\x9b2Jd\n\te\\x7f"  # by hand


def test_generate_shows_the_models_control_characters_escaped_and_raw_prints_them(ckpt, capsys, monkeypatch):
    """generate wrote the model's text to the terminal as it was: a sampled ESC could clear the screen, set the title
    or write the clipboard (OSC 52), a \\r overwrite the line. They are shown escaped, streamed, in a batch and with
    --chat, on a pipe as on a terminal; --raw prints the text as generated."""
    import sys

    gen = sys.modules["cookmind.infer.generate"]  # the module (the package's `generate` is its function)
    d, _, tok = ckpt
    said = tok.encode(CONTROLS)
    assert tok.decode(said) == CONTROLS
    monkeypatch.setattr(gen, "stream", lambda *a, **k: iter(said))
    monkeypatch.setattr(gen, "generate", lambda model, prompts, *a, **k: [list(said) for _ in prompts])
    argv = ["generate", "--model", str(d), "--prompt", "The cook"]
    for extra, shown in (
        ([], CONTROLS_SHOWN + "\n"),
        (["--chat"], CONTROLS_SHOWN + "\n"),
        (["--prompt", "Soup"], f"=== The cook\n{CONTROLS_SHOWN}\n=== Soup\n{CONTROLS_SHOWN}\n"),
        (["--raw"], CONTROLS + "\n"),
        (["--raw", "--prompt", "Soup"], f"=== The cook\n{CONTROLS}\n=== Soup\n{CONTROLS}\n"),
    ):
        assert cli_main([*argv, *extra]) == 0
        assert capsys.readouterr().out == shown, extra


def test_chat_shows_the_models_control_characters_escaped_and_keeps_them_in_the_history(ckpt, monkeypatch):
    """The chat printed each piece of a reply as it came, control characters included (and /history too); they are
    shown escaped, reasoning and answer, while the conversation keeps the text as the model said it."""
    from cookmind.infer import chat_session

    _, model, tok = ckpt
    said = tok.encode("<think>" + CONTROLS + "</think>" + CONTROLS)
    monkeypatch.setattr(chat_session, "stream", lambda *a, **k: iter(said))
    # room for every token said (the stub ignores the limit), so no "(stopped at --max-new-tokens)" note follows
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=len(said) + 1))
    out = io.StringIO()
    run(s, io.StringIO("hello\x1b[2J\n/history\n/quit\n"), out)
    text = out.getvalue()
    assert f"bot> [thinking] {CONTROLS_SHOWN}\n{CONTROLS_SHOWN}\n" in text
    assert f"[user] hello\\x1b[2J\n[assistant] {CONTROLS_SHOWN}\n" in text
    assert "\x1b" not in text and "\r" not in text
    assert s.history == [
        {"role": "user", "content": "hello\x1b[2J"},
        {"role": "assistant", "content": CONTROLS, "reasoning_content": CONTROLS},
    ]


def test_the_demos_sample_chats_show_control_characters_escaped(ckpt, tmp_path, capsys, monkeypatch):
    """The demo printed its sample chats' replies as the model wrote them; results.json and the report keep them."""
    import cookmind.infer
    from cookmind.demo.pipeline import DemoContext, stage_chat

    d, _, tok = ckpt
    said = tok.encode(CONTROLS)
    monkeypatch.setattr(cookmind.infer, "generate", lambda model, prompts, *a, **k: [list(said) for _ in prompts])
    ctx = DemoContext(workdir=tmp_path, paths={"tokenizer": d}, checkpoints={"sft": d})
    chats = stage_chat(ctx)["chats"]
    assert chats and all(c["assistant"] == CONTROLS for c in chats)
    out = capsys.readouterr().out
    assert out.count(f"assistant: {CONTROLS_SHOWN}\n") == len(chats) and "\x1b" not in out


# Trojan Source: a right-to-left override shows "# ok" before the command it follows; an isolate, the marks, and a
# line separator (a line break to some terminals and pagers, blank to others)
BIDI = "ls \u202e# ok\u202c \u2067x\u2069\u200e\u200f\u061c\u202a\u202b\u202d\u2066\u2068 a\u2028b\u2029c é 👩\u200d🍳"
BIDI_SHOWN = (  # by hand: Python's literal escapes; é and the emoji joined by U+200D stay
    "ls \\u202e# ok\\u202c \\u2067x\\u2069\\u200e\\u200f\\u061c\\u202a\\u202b\\u202d\\u2066\\u2068 "
    "a\\u2028b\\u2029c é 👩\u200d🍳"
)


def test_bidi_controls_and_line_separators_are_shown_escaped(ckpt, tmp_path, capsys, monkeypatch):
    """The Unicode bidirectional controls reached the terminal as they were: a model's U+202E (right-to-left
    override) shows the rest of its line reversed, so what the user read was not what the reply said (Trojan Source);
    U+2028/U+2029 break a line on some terminals. generate (streamed, a batch, --chat), chat (/history too) and the
    demo show them escaped; --raw, the history and the demo's results keep them."""
    import sys

    import cookmind.infer
    from cookmind.demo.pipeline import DemoContext, stage_chat

    gen = sys.modules["cookmind.infer.generate"]
    d, model, tok = ckpt
    said = tok.encode(BIDI)
    assert tok.decode(said) == BIDI
    monkeypatch.setattr(gen, "stream", lambda *a, **k: iter(said))
    monkeypatch.setattr(gen, "generate", lambda model, prompts, *a, **k: [list(said) for _ in prompts])
    argv = ["generate", "--model", str(d), "--prompt", "The cook"]
    for extra, shown in (
        ([], BIDI_SHOWN + "\n"),
        (["--chat"], BIDI_SHOWN + "\n"),
        (["--prompt", "Soup"], f"=== The cook\n{BIDI_SHOWN}\n=== Soup\n{BIDI_SHOWN}\n"),
        (["--raw"], BIDI + "\n"),
        # a batch's header shows each prompt: escaped too (a prompt read from a file may hold them)
        (["--prompt", BIDI], f"=== The cook\n{BIDI_SHOWN}\n=== {BIDI_SHOWN}\n{BIDI_SHOWN}\n"),
        (["--raw", "--prompt", BIDI], f"=== The cook\n{BIDI}\n=== {BIDI}\n{BIDI}\n"),
    ):
        assert cli_main([*argv, *extra]) == 0
        assert capsys.readouterr().out == shown, extra

    from cookmind.infer import chat_session

    monkeypatch.setattr(chat_session, "stream", lambda *a, **k: iter(said))
    # room for every token said (the stub ignores the limit), so no "(stopped at --max-new-tokens)" note follows
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=len(said) + 1))
    out = io.StringIO()
    run(s, io.StringIO("hi \u202eevil\n/history\n/x\u202e\x1b[2J\n/quit\n"), out)
    assert "(unknown command /x\\u202e\\x1b[2J: nothing was sent" in out.getvalue()  # a piped line's too
    assert f"bot> {BIDI_SHOWN}\n" in out.getvalue()
    assert f"[user] hi \\u202eevil\n[assistant] {BIDI_SHOWN}\n" in out.getvalue()
    assert s.history == [{"role": "user", "content": "hi \u202eevil"}, {"role": "assistant", "content": BIDI}]

    monkeypatch.setattr(cookmind.infer, "generate", lambda model, prompts, *a, **k: [list(said) for _ in prompts])
    chats = stage_chat(DemoContext(workdir=tmp_path, paths={"tokenizer": d}, checkpoints={"sft": d}))["chats"]
    assert chats and all(c["assistant"] == BIDI for c in chats)
    assert capsys.readouterr().out.count(f"assistant: {BIDI_SHOWN}\n") == len(chats)


def test_generate_and_chat_say_why_a_reply_of_hidden_markup_or_whitespace_shows_no_text(ckpt, capsys, monkeypatch):
    """A model that wrote only a stray </think> (which closes no reasoning and is not shown) got one empty line from
    `generate --chat`, with nothing on stderr, and `chat` said "the model ended its turn at once", which it had not.
    Both now say what the tokens were: markup, or whitespace; and chat names a --stop string that matched first."""
    import sys

    from cookmind.infer import chat_session

    gen = sys.modules["cookmind.infer.generate"]  # the module (the package's `generate` is its function)
    d, model, tok = ckpt
    close = tok.special_tokens["</think>"]
    markup = "the model's 3 tokens were only <think>/</think> markup, which is not printed: '</think></think></think>'"
    monkeypatch.setattr(gen, "stream", lambda *a, **k: iter([close] * 3))
    monkeypatch.setattr(gen, "generate", lambda model, prompts, *a, **k: [[close] * 3 for _ in prompts])
    argv = ["generate", "--model", str(d), "--prompt", "What is 2+3?", "--chat"]
    assert cli_main(argv) == 0
    assert capsys.readouterr() == ("\n", f"cookmind generate: no text: {markup}\n")
    assert cli_main([*argv, "--prompt", "Soup"]) == 0
    assert capsys.readouterr().err == (
        f"cookmind generate: no text for --prompt 'What is 2+3?': {markup}\n"
        f"cookmind generate: no text for --prompt 'Soup': {markup}\n"
    )
    blank = [tok.encode("\n")[0]] * 2  # two tokens of one newline each
    monkeypatch.setattr(gen, "stream", lambda *a, **k: iter(blank))
    assert cli_main(argv[:-1]) == 0
    assert capsys.readouterr() == (
        "\n\n\n",
        "cookmind generate: no text: the model's 2 tokens were only whitespace: '\\n\\n'\n",
    )

    def chat(said, **cfg):
        monkeypatch.setattr(chat_session, "stream", lambda *a, **k: iter(said))
        out = io.StringIO()
        run(ChatSession(model, tok, SamplingParams(max_new_tokens=4, **cfg)), io.StringIO("hello\n/quit\n"), out)
        return out.getvalue()

    assert f"bot> (no reply: {markup})\nyou> " in chat([close] * 3)
    assert "bot> \n\n(no reply: the model's 2 tokens were only whitespace: '\\n\\n')\nyou> " in chat(blank)
    stopped = (
        "bot> (no reply: the output began with a --stop string, and a stop string and what follows are not printed)"
    )
    assert stopped in chat(tok.encode("ice in the soup"), stop_strings=("i",))
    assert "bot> (no reply: the model ended its turn at once)\nyou> " in chat([])


def test_ctrl_c_mid_reply_keeps_the_reply_so_far_and_the_next_message_answers_a_whole_conversation(ckpt, monkeypatch):
    """Ctrl-C mid-reply left the user's message in the history with no answer, so the next message made two user
    turns in a row (/history showed them) and the reply printed so far was lost; the web page keeps a stopped reply.
    Now the reply so far is the assistant's turn, and the chat says so."""
    import cookmind.infer.chat_session as chat_session

    _, model, tok = ckpt
    real_stream, calls = chat_session.stream, []

    def stream(*a, **kw):  # the first reply: Ctrl-C while the model computes its 9th token
        calls.append(1)
        for n, token in enumerate(real_stream(*a, **kw)):
            if len(calls) == 1 and n == 8:
                raise KeyboardInterrupt
            yield token

    monkeypatch.setattr(chat_session, "stream", stream)
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=30, stop_token_ids=control(tok)))
    out = io.StringIO()
    run(s, io.StringIO("hello\nsecond\n/quit\n"), out)
    text = out.getvalue()
    shown = text.split("bot> ", 1)[1].split(" (interrupted", 1)[0]
    assert "(interrupted: the reply so far is kept in the conversation)" in text
    assert [m["role"] for m in s.messages()] == ["user", "assistant", "user", "assistant"]
    assert s.history[1] == {"role": "assistant", "content": shown} and shown.strip()


def test_a_piped_file_with_crlf_line_ends_is_read_as_its_lines(ckpt):
    """A script of messages saved on Windows (CRLF) kept each line's \\r: "/quit\\r" and "/history\\r" were unknown
    commands (the help printed, the chat went on) and every message ended in a carriage return the model saw."""
    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=2))
    out = io.StringIO()
    run(s, io.StringIO("hello\r\n/history\r\n/quit\r\nnever sent\r\n"), out)
    assert "unknown command" not in out.getvalue() and "[user] hello\n" in out.getvalue()
    assert [m["content"] for m in s.messages() if m["role"] == "user"] == ["hello"]


def test_ctrl_c_ends_the_output_line_before_the_interrupted_line(ckpt, capsys, monkeypatch):
    """Ctrl-C mid-output (generate streaming, chat at its you> prompt) left the line open, so 'cookmind generate:
    interrupted' was printed after the model's last word on the same line ('... the dough^Ccookmind generate:
    interrupted'), and the shell's prompt after it. The output's line is ended first."""
    import importlib

    gen_module = importlib.import_module("cookmind.infer.generate")  # the module, not the package's function
    d, _, _ = ckpt
    real = gen_module.stream

    def stream(*a, **kw):  # Ctrl-C while the model computes its 11th token
        for n, token in enumerate(real(*a, **kw)):
            if n == 10:
                raise KeyboardInterrupt
            yield token

    monkeypatch.setattr(gen_module, "stream", stream)
    assert cli_main(["generate", str(d), "--prompt", "The cook", "--max-new-tokens", "20", "--raw"]) == 130
    out, err = capsys.readouterr()
    assert out.endswith("\n") and out.strip() and err == "cookmind generate: interrupted\n", (out, err)

    class CtrlCAfterOneLine(io.StringIO):
        def readline(self, *a):
            line = super().readline(*a)
            if not line:
                raise KeyboardInterrupt
            return line

    monkeypatch.setattr("sys.stdin", CtrlCAfterOneLine("/history\n"))
    assert cli_main(["chat", str(d)]) == 130
    out, err = capsys.readouterr()
    assert out.endswith("you> \n") and err == "cookmind chat: interrupted\n", (out, err)


def test_a_reply_stopped_at_max_new_tokens_says_so(ckpt):
    """A reply that ran to --max-new-tokens ended mid-sentence without a word in `cookmind chat`, where the web page
    shows "length" under it and a reply cut by the context's end says "(cut: ...)". It now says where it stopped and
    what to raise; a reply the model ended itself says nothing."""
    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=6, stop_token_ids=control(tok)))
    out = io.StringIO()
    run(s, io.StringIO("hello\n/quit\n"), out)
    prompt = tok.render([{"role": "user", "content": "hello"}], add_generation_prompt=True)[0]
    ref = generate(model, [prompt], SamplingParams(temperature=0, max_new_tokens=6, stop_token_ids=control(tok)))[0]
    assert len(ref) == 6 and ref[-1] not in control(tok), "the tiny model ended its reply itself: pick another prompt"
    assert "(stopped at --max-new-tokens 6; raise it for longer replies)" in out.getvalue()
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=6, stop_token_ids=(ref[2],)))
    out = io.StringIO()
    run(s, io.StringIO("hello\n/quit\n"), out)  # the reply ends at its 3rd token, the stop token asked for
    assert "--max-new-tokens" not in out.getvalue()


def test_a_seeded_chat_draws_each_reply_from_its_own_seed(ckpt):
    """chat --seed N seeded every reply with N: each reply drew the same noise, so two prompts to a small model got
    the same reply, and a reply asked again (after /reset) could not differ. Reply k of a session draws from seed
    N + k: the session as a whole is reproducible, its replies distinct draws (reference: one sampled generate call
    per reply, at that seed)."""
    _, model, tok = ckpt
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)

    def three(session):  # the same message sent afresh three times; each reply's text as generated (think tags in)
        out = []
        for _ in range(3):
            session.reset()
            list(session.send("Hi there"))
            out.append(session.reply_text)
        return out

    replies = three(ChatSession(model, tok, params))
    expected = []
    for k in range(3):
        ids = tok.render([{"role": "user", "content": "Hi there"}], add_generation_prompt=True)[0]
        ref = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7 + k, stop_token_ids=control(tok))
        expected.append(without_control(tok, generate(model, [ids], ref)[0]))
    assert replies == expected
    assert len(set(replies)) > 1  # the same message sent afresh three times: not one draw three times
    assert three(ChatSession(model, tok, params)) == replies


def test_generate_reads_a_prompt_from_a_file_or_standard_input(ckpt, tmp_path, capsys, monkeypatch):
    """generate took its prompt from --prompt only: `echo hi | cookmind generate MODEL` was a usage error and a file
    needed the shell's "$(cat FILE)" (which drops its final newlines). --prompt-file FILE reads the file's text as it
    is, '-' standard input; it is repeatable and joins the --prompt ones in a batch."""
    d, model, tok = ckpt
    text = "The cook\nsaid"
    (tmp_path / "p.txt").write_bytes(("\ufeff" + text).encode())  # a byte-order mark is no text
    ref = SamplingParams(temperature=0, max_new_tokens=7, stop_token_ids=(tok.eos_id, tok.im_end_id))
    want = without_control(tok, generate(model, [tok.encode(text)], ref)[0]) + "\n"
    base = ["generate", "--checkpoint", str(d), "--max-new-tokens", "7", "--raw"]
    assert cli_main([*base, "--prompt-file", str(tmp_path / "p.txt")]) == 0
    assert capsys.readouterr().out == want
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert cli_main([*base, "--prompt-file", "-"]) == 0
    assert capsys.readouterr().out == want
    assert cli_main([*base, "--prompt", "The cook", "--prompt-file", str(tmp_path / "p.txt")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("=== The cook\n") and f"=== {text}\n" in out
    assert cli_main(base) == 2
    assert "give a prompt: --prompt TEXT or --prompt-file FILE" in capsys.readouterr().err
    assert cli_main([*base, "--prompt-file", str(tmp_path / "gone.txt")]) == 2
    assert "gone.txt" in capsys.readouterr().err


def test_a_reply_that_fails_leaves_the_conversation_as_it_was(ckpt, monkeypatch):
    """A message whose reply failed (an error in generation, before any token) was kept with an empty assistant turn
    after it, as a reply stopped by Ctrl-C is: the next message then answered a conversation holding a question nobody
    answered. A failed reply leaves the history as it was before the message; a stopped one keeps what it said."""
    import cookmind.infer.chat_session as cs

    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=4))
    list(s.send("Hi there"))
    before = list(s.history)

    def failing(*a, **k):
        raise RuntimeError("out of memory in the test")
        yield  # a generator, as stream is

    monkeypatch.setattr(cs, "stream", failing)
    with pytest.raises(RuntimeError):
        list(s.send("And the soup?"))
    assert s.history == before


def test_a_message_of_several_lines_is_piped_between_triple_quote_lines(ckpt):
    """Each line was a message of its own, so a poem or a piece of code could not be sent whole: its lines went one
    by one, each answered. A line of three double quotes alone opens a message of several lines and another closes
    it; the lines between are the message, sent as they are (a line that starts with / too), CRLF line ends read as
    their lines. Through the CLI, with the message piped in."""
    import subprocess
    import sys

    d, _, _ = ckpt
    code = 'def soup():\n    """Hot."""\n\n/not a command\n    return 1'
    text = '"""\n' + code + '\n"""\n/history\n'
    for piped in (text, text.replace("\n", "\r\n")):
        done = subprocess.run(
            [sys.executable, "-m", "cookmind", "chat", str(d), "--max-new-tokens", "2"],
            input=piped.encode(),
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr.decode()
        out = done.stdout.decode()
        assert f"[user] {code}\n[assistant]" in out, out
        assert out.count("bot> ") == 1 and "unknown command" not in out, out  # one message, one reply


def test_a_triple_quote_block_left_open_at_the_end_of_input_is_sent_and_said(ckpt):
    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=2))
    out = io.StringIO()
    run(s, io.StringIO('"""\nfirst line\nsecond line\n'), out)
    assert [m["content"] for m in s.messages() if m["role"] == "user"] == ["first line\nsecond line"]
    assert '(the input ended inside a """ block: its 2 line(s) are sent as the message)' in out.getvalue()


def test_chat_help_says_how_to_send_several_lines(capsys):
    with pytest.raises(SystemExit):
        cli_main(["chat", "--help"])
    assert '"""' in capsys.readouterr().out


def test_generate_names_a_prompt_from_a_file_by_its_file(ckpt, tmp_path, capsys, monkeypatch):
    """A prompt from --prompt-file was named "--prompt 2 of 2" in generate's errors, warnings and notes, a flag the
    user never gave; `--prompt-file -` twice read standard input twice, the second time nothing ("--prompt 2 of 2 is
    empty"); and an empty chat message (`--chat --prompt ""`, an empty file) was sent without a word."""
    import sys

    gen = sys.modules["cookmind.infer.generate"]
    d, _, tok = ckpt
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "long.txt").write_text("the cook stirs the soup " * 60)
    n = len(tok.encode((tmp_path / "long.txt").read_text()))
    assert n >= 256  # the tiny model's context
    base = ["generate", "--model", str(d), "--max-new-tokens", "2"]
    assert cli_main([*base, "--prompt", "Soup", "--prompt-file", str(tmp_path / "empty.txt")]) == 2
    err = capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    assert err == f"cookmind generate: error: --prompt-file {empty} is empty: give some text to continue\n", err
    assert cli_main([*base, "--prompt", "Soup", "--prompt-file", str(tmp_path / "long.txt")]) == 2
    err = capsys.readouterr().err
    assert f"--prompt-file {tmp_path / 'long.txt'} ({n} tokens) fills the model's context of 256 tokens" in err, err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"Soup")))
    assert cli_main([*base, "--prompt-file", "-", "--prompt-file", "-"]) == 2
    err = capsys.readouterr().err
    assert err == "cookmind generate: error: --prompt-file - is given twice: standard input is read once\n", err
    for argv in (["--prompt", ""], ["--prompt-file", str(tmp_path / "empty.txt")]):
        assert cli_main([*base, "--chat", *argv]) == 2
        assert "is empty: give some text to continue" in capsys.readouterr().err
    monkeypatch.setattr(gen, "generate", lambda model, prompts, *a, **k: [[] for _ in prompts])  # ends at once
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"Soup")))
    assert cli_main([*base, "--prompt", "The cook", "--prompt-file", "-"]) == 0
    err = capsys.readouterr().err
    assert "no text for --prompt 'The cook': " in err and "no text for --prompt-file - (standard input): " in err, err


def test_an_empty_block_and_an_empty_history_say_so(ckpt):
    """A \"\"\" block of nothing or blank lines (a paste that lost its text) went unsent without a word, the prompt back
    as if it had been; /history of an empty conversation printed nothing, as if the command were not read."""
    _, model, tok = ckpt
    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=2))
    out = io.StringIO()
    run(s, io.StringIO('/history\n"""\n"""\n"""\n  \n\n"""\n\n'), out)
    assert s.messages() == []
    lines = out.getvalue().splitlines()
    assert lines[1] == "you> (the conversation is empty)", lines
    assert out.getvalue().count('(the """ block holds no text: nothing was sent)') == 2, lines
    assert "bot> " not in out.getvalue()


def test_generate_draws_several_samples_of_a_prompt_as_the_servers_n_does(ckpt, capsys, monkeypatch):
    """Several samples of one prompt took the prompt given again and again (--prompt X --prompt X), which a piped
    prompt cannot be (standard input is read once). --num-samples N draws N of each prompt; with --seed, sample k draws
    from SEED + k, the server's n choices for that prompt and seed (a request of its own), checked against a server."""
    import json

    import openai
    from test_server import LiveServer

    from cookmind.infer.engine import Engine
    from cookmind.infer.server import create_app

    d, model, tok = ckpt
    first, second = "The cook said", "Soup"
    server = LiveServer(create_app(Engine(model, num_slots=4, max_seq_len=256), tok, "tiny"))
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
        want = {
            text: [
                c.text
                for c in client.completions.create(
                    model="tiny", prompt=text, n=3, seed=11, temperature=1.0, max_tokens=6
                ).choices
            ]
            for text in (first, second)
        }
    finally:
        server.close()
    assert len(set(want[first])) > 1  # three draws, not one three times
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(second.encode())))
    argv = ["generate", str(d), "--prompt", first, "--prompt-file", "-", "--num-samples", "3", "--seed", "11"]
    assert cli_main([*argv, "--temperature", "1", "--max-new-tokens", "6", "--raw"]) == 0
    out = capsys.readouterr().out
    got = {}
    for block in out.split("=== ")[1:]:
        head, _, reply = block.partition("\n")
        which, _, text = head.partition(": ")
        got.setdefault(text, []).append((which, reply.removesuffix("\n")))
    assert got == {t: [(f"sample {k + 1} of 3", w) for k, w in enumerate(want[t])] for t in want}, json.dumps(got)


def test_ctrl_c_inside_a_triple_quote_block_discards_it_and_the_chat_goes_on(ckpt):
    """Ctrl-C while typing a \"\"\" block left the chat (exit 130), the conversation lost with the half-typed message;
    as in a shell, it now drops the block, says so, and the you> prompt comes back."""
    _, model, tok = ckpt

    class CtrlCOnTheThirdLine(io.StringIO):
        def __init__(self, text):
            super().__init__(text)
            self.lines = 0

        def readline(self, *a):
            self.lines += 1
            if self.lines == 3:
                raise KeyboardInterrupt
            return super().readline(*a)

    s = ChatSession(model, tok, SamplingParams(temperature=0, max_new_tokens=2))
    out = io.StringIO()
    assert run(s, CtrlCOnTheThirdLine('"""\nhalf a poem\nhello\n/history\n/quit\n'), out) == 0
    assert [m["content"] for m in s.messages() if m["role"] == "user"] == ["hello"]
    assert '...> \n(the """ block is discarded: its 1 line(s) were not sent)\nyou> ' in out.getvalue(), out.getvalue()
