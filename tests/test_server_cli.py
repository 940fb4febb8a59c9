"""`cookmind serve` argument handling: the model by --model or position, the API key from the environment,
and a KV pool sized from the model (a tiny model must not take a gigabyte)."""

from __future__ import annotations

import argparse

import httpx
import pytest
from test_server import LiveServer, free_port, make_model, make_tokenizer

from cookmind.cli import finish_model_argument
from cookmind.infer import cli_serve
from cookmind.model import save_model

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory)
    d = tmp_path_factory.mktemp("serve") / "tiny-cook"
    save_model(d, make_model(tok.vocab_size, max_pos=256))  # 2 layers, 2 KV heads of 8, fp32
    tok.save(d)
    return d


def parse(*argv):
    parser = argparse.ArgumentParser()
    cli_serve.add_arguments(parser)
    args = parser.parse_args([str(a) for a in argv])
    finish_model_argument(parser, args)  # what `cookmind serve` does after parsing
    return args


def test_default_kv_pool_is_sized_from_the_model(model_dir):
    _, engine = cli_serve.build_app(parse("--model", model_dir, "--device", "cpu"))
    # 32 sequences x 256 positions = 32 x 16 blocks of 16; one more is the scratch block
    assert engine.num_slots == 32 and engine.kv_blocks()["kv_blocks_total"] == 32 * 16  # 2.1 MB, not 1 GiB
    per_block = 2 * 2 * 2 * 16 * 8 * 4  # K and V x layers x kv heads x block x head dim x fp32 bytes
    # --kv-cache-mb still decides; --max-batch alone sizes the pool for that many whole contexts
    app, engine = cli_serve.build_app(parse(model_dir, "--device", "cpu", "--kv-cache-mb", "1"))
    assert engine.kv_blocks()["kv_blocks_total"] == 2**20 // per_block - 1 == 255
    # the batch stays the default 32: it was raised to 255 without a word, one block per sequence
    assert engine.num_slots == 32
    assert app.state.kv_note == (
        "KV cache 1.0 MiB (--kv-cache-mb 1): 255 blocks of 16 = 4,080 tokens, 15 sequence(s) of the whole "
        "256-token context; batch 32 (all at once when each fills 112 tokens or fewer)"
    )
    _, engine = cli_serve.build_app(parse(model_dir, "--device", "cpu", "--max-batch", "3"))
    assert engine.num_slots == 3 and engine.kv_blocks()["kv_blocks_total"] == 3 * 16


def test_model_by_flag_or_position(model_dir, capsys):
    assert parse(model_dir).model == str(model_dir)
    assert parse("--model", model_dir).model == str(model_dir)
    assert parse("--checkpoint", model_dir).model == str(model_dir)  # the old spelling
    with pytest.raises(SystemExit):
        parse()
    assert "the model is missing" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse("a", "--model", "b")
    assert "two models given" in capsys.readouterr().err


def test_api_key_from_the_environment(monkeypatch, model_dir):
    monkeypatch.setenv("COOKMIND_API_KEY", "from-env")
    app, _ = cli_serve.build_app(parse("--model", model_dir, "--device", "cpu", "--max-batch", "1"))
    server = LiveServer(app)
    try:
        assert httpx.get(server.url + "/v1/models").status_code == 401
        assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer from-env"}).status_code == 200
        assert app.state.model_name == "tiny-cook"
    finally:
        server.close()


@pytest.mark.parametrize(
    ("flag", "env", "says"),
    [
        (" ", None, "--api-key is empty"),
        ("", "from-env", "--api-key is empty"),  # it fell back to the environment (or to no key at all)
        (" k", None, "--api-key starts or ends with whitespace"),
        (None, " \t", "COOKMIND_API_KEY is empty"),
        (None, "", "COOKMIND_API_KEY is empty"),
        # a header carries ASCII: the server read it as latin-1 and compared UTF-8 bytes, so no client ever matched
        ("clé-secret", None, "--api-key holds 'é', which an HTTP header cannot carry"),
        (None, "key\u200bhidden", "COOKMIND_API_KEY holds '\\u200b', which an HTTP header cannot carry"),
    ],
)
def test_an_empty_api_key_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, flag, env, says):
    # --api-key " " was taken as the key (no client can send it: every request got 401) and --api-key "" served
    # without one
    from cookmind.cli import main

    monkeypatch.delenv("COOKMIND_API_KEY", raising=False)
    if env is not None:
        monkeypatch.setenv("COOKMIND_API_KEY", env)
    argv = ["serve", str(tmp_path / "no-model"), "--port", "1"]  # neither the model nor the port is reached
    assert main(argv + ([] if flag is None else ["--api-key", flag])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "no-model" not in err, err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--speculative-sampled"], "--speculative-sampled is used only with --speculative"),
        (["--num-speculative-tokens", "6"], "--num-speculative-tokens is used only with --speculative"),
        (["--kv-layout", "slots", "--block-size", "32"], "--block-size is for --kv-layout paged"),
        # these two were the engine's words, after the model had loaded: "prefix_cache=True needs kv_cache='paged'"
        (["--kv-layout", "slots", "--prefix-cache"], "--prefix-cache is for --kv-layout paged"),
        (["--kv-layout", "slots", "--decode-attention", "kernel"], "--decode-attention kernel is for --kv-layout"),
        (["--model-name", ""], "--model-name is empty"),
        (["--model-name", " "], "--model-name is empty"),
    ],
)
def test_a_flag_the_server_would_not_use_is_refused_before_the_model_loads(tmp_path, capsys, flags, says):
    """Each of these started the server as if it were not given (the banner showed no speculation, a slots cache, the
    directory's name), where --draft-model without --speculative draft is refused."""
    from cookmind.cli import main

    assert main(["serve", str(tmp_path / "no-model"), "--port", "1", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "no-model" not in err, err


def test_a_port_in_use_is_refused_before_the_model_loads(tmp_path, capsys):
    import socket

    from cookmind.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # the model path does not exist: the port is checked first (loading, compiling and graphs take minutes)
        assert main(["serve", str(tmp_path / "no-model"), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err


def test_a_host_that_is_not_this_machines_names_the_host(tmp_path, capsys):
    # "error: Name or service not known" named neither the host nor the option; an address of another machine said
    # "choose another --port"
    from cookmind.cli import main

    for host, says in (("nohost.invalid", "cannot be resolved"), ("192.0.2.1", "not an address of this machine")):
        assert main(["serve", str(tmp_path / "no-model"), "--host", host, "--api-key", "k", "--port", "8123"]) == 2
        err = capsys.readouterr().err
        assert f"--host {host}: " in err and says in err and "--port" not in err, err


def test_listening_beyond_this_machine_without_a_key_is_warned_about():
    from cookmind.infer.cli_serve import exposure_warning

    # 0.0.0.0 with no key served anyone on the network without a word
    for host in ("0.0.0.0", "::", "192.168.1.20", "myhost.example"):
        warning = exposure_warning(host, None)
        assert warning is not None and f"listening on {host} without an API key" in warning
        assert "COOKMIND_API_KEY" in warning
    for host, key in (("127.0.0.1", None), ("::1", None), ("localhost", None), ("0.0.0.0", "secret")):
        assert exposure_warning(host, key) is None


def test_out_of_range_numbers_are_usage_errors_and_the_context_is_not_exceeded(model_dir, capsys):
    parser = argparse.ArgumentParser()
    cli_serve.add_arguments(parser)
    # --port 99999 was an OverflowError traceback; --max-batch 0 served 32 sequences without a word
    for flag, value, says in [
        ("--port", "99999", "must be from 1 to 65535"),
        ("--max-batch", "0", "must be 1 or more"),
    ]:
        with pytest.raises(SystemExit):
            parser.parse_args([str(model_dir), flag, value])
        assert says in capsys.readouterr().err
    args = parser.parse_args([str(model_dir), "--max-seq-len", "100000", "--device", "cpu"])
    finish_model_argument(parser, args)
    with pytest.raises(ValueError, match="--max-seq-len 100000 exceeds the model's context of"):
        cli_serve.build_app(args)  # it served 100000-token sequences (positions the model never saw)


class _BigModel:
    """What kv_sizing reads of a model: 24 layers, 8 KV heads of 128, bf16 (96 KiB of K and V per token), 2048
    positions; a block of 16 is 1.5 MiB, a whole context 192 MiB."""

    config = argparse.Namespace(
        num_hidden_layers=24, num_key_value_heads=8, resolved_head_dim=128, max_position_embeddings=2048
    )

    def parameters(self):
        import torch

        return iter([torch.zeros((), dtype=torch.bfloat16)])


@pytest.mark.parametrize(
    "flags, slots, mib, note",
    [
        (  # the default: 32 whole contexts (6 GiB) capped at 1 GiB, 1024 / 1.5 - 1 (scratch) = 681 blocks
            [],
            32,
            682 * 1.5,
            "KV cache 1023.0 MiB (default, capped at 1024 MiB; --kv-cache-mb sets it): 681 blocks of 16 = 10,896 "
            "tokens, 5 sequence(s) of the whole 2,048-token context; batch 32 (all at once when each fills 336 "
            "tokens or fewer)",
        ),
        (  # 194 MiB: 129 blocks, one scratch: exactly one whole context (128 blocks)
            ["--kv-cache-mb", "194"],
            32,
            129 * 1.5,
            "KV cache 193.5 MiB (--kv-cache-mb 194): 128 blocks of 16 = 2,048 tokens, 1 sequence(s) of the whole "
            "2,048-token context; batch 32 (all at once when each fills 64 tokens or fewer)",
        ),
        (  # blocks of 128 (12 MiB): 300 MiB holds 25, 24 past the scratch; a sequence needs one at the least
            ["--kv-cache-mb", "300", "--block-size", "128", "--max-batch", "32"],
            24,
            300,
            "KV cache 300.0 MiB (--kv-cache-mb 300): 24 blocks of 128 = 3,072 tokens, 1 sequence(s) of the whole "
            "2,048-token context; --max-batch 32 lowered to 24 (a running sequence holds a block at the least); "
            "raise --kv-cache-mb to run more",
        ),
        (  # slots: a whole context and the scratch column, 2049 x 96 KiB = 192.09 MiB; 1000 MiB holds 5
            ["--kv-layout", "slots", "--kv-cache-mb", "1000"],
            5,
            5 * 2049 * 96 / 1024,
            "KV cache 960.5 MiB (--kv-cache-mb 1000): 5 slots = 10,240 tokens, 5 sequence(s) of the whole "
            "2,048-token context; batch 5, the whole contexts it holds",
        ),
        (  # slots with --max-batch: the budget was ignored (32 whole contexts, 6 GiB, for --kv-cache-mb 1000)
            ["--kv-layout", "slots", "--kv-cache-mb", "1000", "--max-batch", "32"],
            5,
            5 * 2049 * 96 / 1024,
            "KV cache 960.5 MiB (--kv-cache-mb 1000): 5 slots = 10,240 tokens, 5 sequence(s) of the whole "
            "2,048-token context; --max-batch 32 lowered to 5 (each sequence holds a whole context); raise "
            "--kv-cache-mb to run more",
        ),
    ],
)
def test_the_kv_cache_says_what_it_holds_and_what_was_changed(flags, slots, mib, note):
    got_slots, got_bytes, got_note = cli_serve.kv_sizing(_BigModel(), parse("m", *flags))
    assert (got_slots, got_bytes / 2**20, got_note) == (slots, pytest.approx(mib), note)


def test_a_kv_cache_smaller_than_one_sequence_is_refused_naming_the_flag(model_dir):
    # a 1.5 MiB block does not fit in 1 MiB: the engine said "KV cache budget of 1.00 MiB holds 0 blocks ... raise
    # the budget or lower block_size", naming no flag; a pool short of one whole context refused requests later
    with pytest.raises(ValueError) as exc:
        cli_serve.kv_sizing(_BigModel(), parse("m", "--kv-cache-mb", "1"))
    assert str(exc.value) == (
        "--kv-cache-mb 1 holds 0 tokens of KV cache, less than one sequence of the 2,048-token context; give "
        "--kv-cache-mb 194 or more, or a lower --max-seq-len"
    )
    # slots: a whole context and the scratch column, 192.09 MiB, or none
    with pytest.raises(ValueError, match="--kv-cache-mb 100 holds 0 tokens .* give --kv-cache-mb 193 or more"):
        cli_serve.kv_sizing(_BigModel(), parse("m", "--kv-cache-mb", "100", "--kv-layout", "slots"))


class _NoServer:
    """uvicorn's Server that serves nothing: main prints its start-up lines and returns."""

    started = True

    def __init__(self, config):
        pass

    def run(self):
        pass


def test_serve_prints_what_the_kv_cache_holds_at_start_up(model_dir, monkeypatch, capsys):
    import uvicorn

    monkeypatch.setattr(uvicorn, "Server", _NoServer)
    args = parse(model_dir, "--device", "cpu", "--kv-cache-mb", "1", "--port", str(free_port()))
    assert cli_serve.main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (
        "cookmind serve: KV cache 1.0 MiB (--kv-cache-mb 1): 255 blocks of 16 = 4,080 tokens, 15 sequence(s) of the "
        "whole 256-token context; batch 32 (all at once when each fills 112 tokens or fewer)"
    )


def test_a_default_kv_cache_past_the_cap_says_so_rather_than_capped():
    """A context whose one sequence outgrows the default's 1 GiB cap (an imported Qwen3-0.6B serves 40,960 tokens)
    got a cache of one whole context, 4.4 GiB, under a line saying "capped at 1024 MiB". Here 16,384 tokens of 96 KiB
    are 1,024 blocks of 1.5 MiB, 1,536 MiB, and the scratch block: the line says the cap was passed, and why."""
    got_slots, got_bytes, note = cli_serve.kv_sizing(_BigModel(), parse("m", "--max-seq-len", "16384"))
    assert (got_slots, got_bytes / 2**20) == (32, pytest.approx(1025 * 1.5))
    assert note == (
        "KV cache 1537.5 MiB (default: one whole 16,384-token context, past the 1024 MiB the default otherwise keeps "
        "to; --kv-cache-mb or a lower --max-seq-len sets it): 1,024 blocks of 16 = 16,384 tokens, 1 sequence(s) of "
        "the whole 16,384-token context; batch 32 (all at once when each fills 512 tokens or fewer)"
    )


def test_a_stop_signal_while_requests_run_says_what_the_server_waits_for(capfd):
    """Ctrl-C (or SIGTERM) with generations running left the server silent until the last one finished (uvicorn waits
    for them, its own note hidden at log level warning): a long answer looked like a hung server. The first signal now
    says how many requests it waits for and that a second Ctrl-C stops at once; an idle server stops quietly."""
    import signal
    from collections import deque
    from types import SimpleNamespace

    import uvicorn

    cut = []

    def server(running, waiting):
        engine = SimpleNamespace(
            slots=[object()] * running + [None],
            waiting=deque([object()] * waiting),
            cancel_all=lambda reason: cut.append(reason) or running + waiting,
            close_to_new=lambda reason: cut.append(f"closed: {reason}"),
        )
        return cli_serve.make_server(uvicorn.Config(lambda *a: None), engine)

    busy = server(running=2, waiting=1)
    busy.handle_exit(signal.SIGINT, None)
    assert capfd.readouterr().err == (
        "cookmind serve: stopping: waiting for 3 request(s) to finish; Ctrl-C again stops at once (cutting them)\n"
    )
    busy.handle_exit(signal.SIGINT, None)  # the second cuts them (the next test has it end to end)
    assert cut == ["closed: shutdown", "shutdown"] and not busy.force_exit  # nothing new starts, what runs is cut
    assert "cutting 3 request(s)" in capfd.readouterr().err
    busy.handle_exit(signal.SIGINT, None)  # the third: uvicorn's force exit, said nothing more
    assert busy.force_exit and capfd.readouterr().err == ""
    idle = server(running=0, waiting=0)
    idle.handle_exit(signal.SIGTERM, None)
    assert idle.should_exit and capfd.readouterr().err == ""


def _serve_in_a_thread(engine, tok):
    """make_server's Server over ``engine`` on a free port, running in a thread: (server, thread, port) once started."""
    import threading
    import time

    import uvicorn

    from cookmind.infer.server import create_app

    port = free_port()
    server = cli_serve.make_server(
        uvicorn.Config(create_app(engine, tok, "cook"), host="127.0.0.1", port=port, log_level="warning"), engine
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return server, thread, port


def test_a_second_stop_signal_cuts_the_running_requests_and_tells_each_client(tmp_path_factory, capfd):
    """A second Ctrl-C was uvicorn's force exit: a traceback per request in flight on the console ("Exception in ASGI
    application ... CancelledError"), a plain-text 500 "Internal Server Error" for a request not streamed and a
    stream cut without a word. Now it cuts the generations in the engine: a request not streamed gets a 503 saying
    the server stopped it (and after how many tokens), a stream its last chunk with finish_reason "error" and
    [DONE]; then the server stops as after the first signal."""
    import json
    import signal
    import threading
    import time

    from cookmind.infer.engine import Engine
    from cookmind.infer.stop import control_token_ids

    tok = make_tokenizer(tmp_path_factory)
    model = make_model(tok.vocab_size, max_pos=2048, rare_ids=sorted(control_token_ids(tok)))  # it never ends early
    engine = Engine(model, num_slots=4, max_seq_len=2048)
    server, thread, port = _serve_in_a_thread(engine, tok)
    url, body = f"http://127.0.0.1:{port}/v1/completions", {"model": "cook", "prompt": "The cook", "max_tokens": 2000}
    got = {}

    def whole():
        got["whole"] = httpx.post(url, json=body, timeout=60)

    def streamed():
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
            got["stream"] = [line for line in r.iter_lines() if line.startswith("data: ")]

    clients = [threading.Thread(target=whole), threading.Thread(target=streamed)]
    for c in clients:
        c.start()
    try:
        deadline = time.time() + 30
        while sum(r is not None for r in engine.slots) < 2 or engine.tokens_generated < 20:
            assert time.time() < deadline, "the two requests never ran"
            time.sleep(0.01)
        server.handle_exit(signal.SIGINT, None)
        server.handle_exit(signal.SIGINT, None)
        for c in clients:
            c.join(timeout=30)
        thread.join(timeout=30)
        assert not thread.is_alive() and not server.force_exit
    finally:
        server.should_exit = server.force_exit = True
    err = capfd.readouterr().err
    assert "cookmind serve: stopping now: cutting 2 request(s)" in err and "Traceback" not in err, err
    whole = got["whole"]
    assert whole.status_code == 503, whole.text
    message = whole.json()["error"]["message"]
    assert message.startswith("the server is stopping and cut this generation after ") and "token(s)" in message
    assert got["stream"][-1] == "data: [DONE]"
    assert json.loads(got["stream"][-3].removeprefix("data: "))["choices"][0]["finish_reason"] == "error"
    cut = json.loads(got["stream"][-2].removeprefix("data: "))["error"]  # why, as a stream can still say it
    assert cut["code"] == "server_shutting_down" and cut["message"].startswith("the server is stopping")


def test_the_start_up_line_writes_an_ipv6_address_as_a_url_can_hold_it(model_dir, monkeypatch, capsys):
    # `serve --host ::1` printed "on http://::1:8000", which no browser or client opens: a URL writes [::1]:8000
    import socket

    import uvicorn

    assert cli_serve.server_url("127.0.0.1", 8000) == "http://127.0.0.1:8000"
    assert cli_serve.server_url("::1", 8000) == "http://[::1]:8000"
    assert cli_serve.server_url("localhost", 80) == "http://localhost:80"
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here: the start-up line itself is not tried")

    monkeypatch.setattr(uvicorn, "Server", _NoServer)
    port = free_port()
    try:
        args = parse(model_dir, "--device", "cpu", "--host", "::1", "--port", str(port), "--api-key", "k")
        assert cli_serve.main(args) == 0
    except OSError as exc:  # ::1 cannot be bound here
        pytest.skip(f"::1 cannot be bound here: {exc}")
    assert f"on http://[::1]:{port} " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["serve", "--max-body-mb", "inf"], "--max-body-mb"),
        (["generate", "--prompt", "hi", "--temperature", "inf"], "--temperature"),
        (["chat", "--temperature", "Infinity"], "--temperature"),
    ],
)
def test_an_infinite_number_is_a_usage_error(model_dir, capsys, argv, flag):
    # `serve --max-body-mb inf` died in a traceback (OverflowError: cannot convert float infinity to integer) and
    # `generate --temperature inf` sampled every token uniformly: "must be 0 or more" let infinity through
    from cookmind.cli import main as cli_main

    with pytest.raises(SystemExit) as e:
        cli_main([argv[0], str(model_dir), *argv[1:]])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"error: argument {flag}: must be a finite number" in err and "Traceback" not in err, err


def test_a_kv_cache_larger_than_the_machines_memory_is_one_line(monkeypatch, capsys):
    # `serve --kv-cache-mb 100000000` on a CPU died in a traceback ending "RuntimeError: [enforce fail at
    # alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 26214400000000
    # bytes": the README's one line for running out of memory, what it tried and the option to lower, was CUDA's only
    from cookmind.cli import main as cli_main

    def too_big(args):  # what torch raises for the pool of --kv-cache-mb 100000000 (not allocated here)
        raise RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to "
            "allocate 26214400000000 bytes. Error code 12 (Cannot allocate memory)"
        )

    monkeypatch.setattr(cli_serve, "main", too_big)
    assert cli_main(["serve", "m", "--kv-cache-mb", "100000000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cookmind serve: error: out of memory on the CPU (tried to allocate 23.8 TiB); lower "), err
    assert "--kv-cache-mb" in err and err.count("\n") == 1 and "GPU" not in err, err


def test_the_stop_signals_work_with_a_uvicorn_that_keeps_no_record_of_them(monkeypatch, capfd):
    # uvicorn's record of the signals it caught (Server._captured_signals) is private and absent from older ones, as
    # main's getattr allows: the second signal's cut appended to it and would raise inside the signal handler
    import signal
    from collections import deque
    from types import SimpleNamespace

    import uvicorn

    class OlderServer:  # uvicorn's Server before the record
        def __init__(self, config):
            self.should_exit = self.force_exit = False

        def handle_exit(self, sig, frame):
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            else:
                self.should_exit = True

    monkeypatch.setattr(uvicorn, "Server", OlderServer)
    cut = []
    engine = SimpleNamespace(
        slots=[object()],
        waiting=deque(),
        cancel_all=lambda reason: cut.append(reason) or 1,
        close_to_new=lambda reason: None,
    )
    server = cli_serve.make_server(None, engine)
    server.handle_exit(signal.SIGINT, None)
    server.handle_exit(signal.SIGINT, None)
    assert cut == ["shutdown"] and "cutting 1 request(s)" in capfd.readouterr().err


def test_the_default_model_id_of_a_run_or_its_checkpoints_folder_names_the_run(tmp_path):
    """`serve runs/x/checkpoints` served the model as 'checkpoints' (and a step folder as 'step_00000020'): the id a
    client sends named no model. A run's checkpoints/ folder is served as the run, a step in it as RUN-STEP."""
    run = tmp_path / "runs" / "sft"
    step = run / "checkpoints" / "step_00000020"
    step.mkdir(parents=True)
    assert cli_serve.default_model_id(run) == "sft"
    assert cli_serve.default_model_id(run / "checkpoints") == "sft"
    assert cli_serve.default_model_id(f"{run}/checkpoints/") == "sft"
    assert cli_serve.default_model_id(step) == "sft-step_00000020"
    assert cli_serve.default_model_id(tmp_path / "Qwen3-0.6B") == "Qwen3-0.6B"


def test_a_request_not_yet_handed_to_the_engine_is_counted_and_refused_when_the_server_stops(
    tmp_path_factory, capfd, monkeypatch
):
    """The stop signals counted only the engine's requests: one that uvicorn had accepted but whose handler had not
    yet submitted it (a fresh server, a long prompt to tokenize) was not 'waited for', and a second Ctrl-C fell
    through to uvicorn's force exit, a plain-text 500 for it. Requests in flight count from their arrival now, and
    once the server is stopping at once, one that reaches the engine afterwards is a 503 server_shutting_down."""
    import signal
    import threading

    from cookmind.infer.engine import Engine

    tok = make_tokenizer(tmp_path_factory)
    engine = Engine(make_model(tok.vocab_size, max_pos=256), num_slots=2, max_seq_len=256)
    entered, release = threading.Event(), threading.Event()
    real = engine.submit

    def held_submit(*a, **k):  # the handler, between accepting the request and handing it to the engine
        entered.set()
        release.wait(30)
        return real(*a, **k)

    monkeypatch.setattr(engine, "submit", held_submit)
    server, thread, port = _serve_in_a_thread(engine, tok)
    got = {}
    body = {"model": "cook", "prompt": "The cook", "max_tokens": 4}
    client = threading.Thread(
        target=lambda: got.update(r=httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60))
    )
    client.start()
    try:
        assert entered.wait(30), "the request never reached its handler"
        server.handle_exit(signal.SIGINT, None)
        server.handle_exit(signal.SIGINT, None)
        release.set()
        client.join(timeout=30)
        thread.join(timeout=30)
        assert not thread.is_alive() and not server.force_exit
    finally:
        release.set()
        server.should_exit = server.force_exit = True
    err = capfd.readouterr().err
    assert "waiting for 1 request(s)" in err and "Traceback" not in err, err
    r = got["r"]
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down", r.text


def test_the_stop_notes_are_written_safely_from_the_signal_handler(monkeypatch, capfd):
    """The stop notes were print()s inside the signal handler: a signal that came while the main thread was writing to
    stderr ran the handler inside that write, and its print into the same buffer raised "RuntimeError: reentrant
    call" (the note lost, the stop signal's handling cut short, the interrupted write failing). The notes now go to
    fd 2 with os.write, touching neither sys.stderr nor sys.stdout."""
    import io
    import signal
    import sys
    from collections import deque
    from types import SimpleNamespace

    import uvicorn

    cut = []
    engine = SimpleNamespace(
        slots=[object(), None],
        waiting=deque([object()]),
        cancel_all=lambda reason: cut.append(reason) or 2,
        close_to_new=lambda reason: None,
    )
    server = cli_serve.make_server(uvicorn.Config(lambda *a: None), engine)
    signals_due = [signal.SIGINT, signal.SIGINT]

    class Raw(io.RawIOBase):
        """A stderr whose writes each take a signal: the handler runs inside the write, as Python runs one."""

        def writable(self):
            return True

        def write(self, b):
            if signals_due:
                server.handle_exit(signals_due.pop(0), None)
            return len(b)

    monkeypatch.setattr(sys, "stderr", io.TextIOWrapper(io.BufferedWriter(Raw()), write_through=True))
    for _ in range(2):  # the first signal's note, then the second's
        print("a line of the server's own", file=sys.stderr, flush=True)
    assert signals_due == [] and cut == ["shutdown"]
    err = capfd.readouterr().err
    assert "cookmind serve: stopping: waiting for 2 request(s) to finish" in err
    assert "cookmind serve: stopping now: cutting 2 request(s)" in err


def test_root_path_serves_under_a_prefix_and_a_bad_one_is_a_usage_error(model_dir, monkeypatch, capsys):
    """`cookmind serve` had no --root-path: behind a proxy that passes /llm/... as it came every path was a 404."""
    import uvicorn

    from cookmind.cli import main as cli_main

    app, _ = cli_serve.build_app(parse(model_dir, "--device", "cpu", "--max-batch", "1", "--root-path", "/llm/"))
    server = LiveServer(app)
    try:
        for prefix in ("/llm", ""):  # the proxy kept the prefix, or stripped it
            assert httpx.get(server.url + prefix + "/v1/models").json()["data"][0]["id"] == "tiny-cook"
    finally:
        server.close()
    monkeypatch.setattr(uvicorn, "Server", _NoServer)
    port = free_port()
    assert cli_serve.main(parse(model_dir, "--device", "cpu", "--port", str(port), "--root-path", "/llm")) == 0
    assert f"on http://127.0.0.1:{port}/llm/ " in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli_main(["serve", str(model_dir), "--root-path", "llm"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --root-path: root path 'llm' must start with /" in err and "Traceback" not in err, err


def test_serving_a_lora_run_says_it_serves_the_merged_weights_and_how_to_serve_the_adapter(
    model_dir, tmp_path, monkeypatch, capsys
):
    """`cookmind serve runs/dpo` (the demo's DPO is a LoRA run) served the weights with the adapter merged in and said
    nothing of it: whether the adapter was applied, and how to serve it beside its base (one server, both models), was
    left to guess. A LoRA checkpoint (its adapter_config.json beside the merged weights) now says both."""
    import json
    import shutil

    import uvicorn

    run = tmp_path / "dpo" / "checkpoints" / "step_00000100"
    shutil.copytree(model_dir, run)
    (run / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "base_model_name_or_path": "runs/sft"}))
    monkeypatch.setattr(uvicorn, "Server", _NoServer)
    assert cli_serve.main(parse(tmp_path / "dpo", "--device", "cpu", "--port", str(free_port()))) == 0
    out = capsys.readouterr().out
    assert (
        f"cookmind serve: {run} is a LoRA checkpoint: served with its adapter merged into its base's weights; to "
        f"serve the adapter beside the base instead: cookmind serve runs/sft --lora NAME={tmp_path / 'dpo'}\n"
    ) in out, out
    assert cli_serve.main(parse(model_dir, "--device", "cpu", "--port", str(free_port()))) == 0
    assert "LoRA" not in capsys.readouterr().out


@pytest.mark.parametrize("other", ["draft", "lora"])
def test_serving_runs_checks_their_newest_checkpoints_sha256s_under_a_bar_each(
    tmp_path, tmp_path_factory, capsys, monkeypatch, other
):
    """`cookmind serve RUN --speculative draft --draft-model RUN2` (or `--lora chef=LORA_RUN`) hashed the other run's
    newest checkpoint (its weights: minutes for a large model) with no bar, after the model's under one: each check
    is shown, to its last byte."""
    from tqdm import tqdm

    from cookmind.model import model_io
    from cookmind.model.lora import apply_lora
    from cookmind.train.checkpoint import save_checkpoint

    monkeypatch.setattr(model_io, "PROGRESS_BYTES", 0)  # a tiny model's file is big enough here
    hashed = []  # the sizes of the checks that read the weights (config.json and the tokenizer's alone are quick)
    real = model_io._sha256_all

    def spy(files, *args, **kwargs):
        if any(f.name == "model.safetensors" for f in files):
            hashed.append(sum(f.stat().st_size for f in files))
        return real(files, *args, **kwargs)

    monkeypatch.setattr(model_io, "_sha256_all", spy)
    tok, tok_dir = make_tokenizer(tmp_path_factory), tmp_path / "tok"
    tok.save(tok_dir)
    base = make_model(tok.vocab_size, 256)
    save_checkpoint(tmp_path / "run" / "checkpoints", 1, base, None, {}, tok_dir)
    if other == "lora":
        apply_lora(base, r=2, alpha=4.0, targets=["q_proj"])  # its checkpoint: the merged weights and the adapter
    save_checkpoint(tmp_path / other / "checkpoints", 1, base, None, {}, tok_dir)

    class Server:
        started = True

        def run(self):
            pass

    monkeypatch.setattr(cli_serve, "make_server", lambda config, engine: Server())
    monkeypatch.setattr(cli_serve, "check_port_free", lambda host, port: None)
    hashed.clear()  # the save's own (it records them)
    capsys.readouterr()
    flags = ("--speculative", "draft", "--draft-model", tmp_path / "draft")
    if other == "lora":
        flags = ("--lora", f"chef={tmp_path / 'lora'}")
    assert cli_serve.main(parse(tmp_path / "run", *flags, "--device", "cpu", "--max-batch", "1", "--no-compile")) == 0
    err = capsys.readouterr().err
    for n in hashed:  # each check of the weights ended its own bar at its last byte
        assert f"checking SHA-256: 100% {tqdm.format_sizeof(n)}/{tqdm.format_sizeof(n)}" in err, err
    done = [line for line in err.splitlines() if "checking" in line and "100%" in line]
    assert len(hashed) == 2 and len(done) >= len(hashed), err  # the model's and the other run's
