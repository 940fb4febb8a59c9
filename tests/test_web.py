"""The web chat page in headless Chromium (Debian's chromium driven by Playwright's Python API).

Against a live server with a tiny model: send a message, see tokens stream in, press Stop
(the server cancels the generation), keep a screenshot in test-artifacts/. A second test
feeds the page a fixed SSE stream to check the collapsible reasoning block.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from pathlib import Path

import pytest
from test_server import LiveServer, make_model, make_tokenizer

from cookmind.infer.engine import Engine
from cookmind.infer.server import create_app
from cookmind.infer.stop import control_token_ids

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS = Path("test-artifacts")

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent (apt-get install chromium)"),
]


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory)
    # never ends early: a chat reply ends at any control token, so each is made rare (<|im_start|> too)
    model = make_model(tok.vocab_size, max_pos=4096, rare_ids=sorted(control_token_ids(tok)))
    engine = Engine(model, num_slots=4, max_seq_len=4096)
    server = LiveServer(create_app(engine, tok, "tiny-cook"))
    yield server, engine
    server.close()


def _record_chat_requests(page) -> list:
    """The bodies the page posts to /v1/chat/completions, as they are sent."""
    posted = []
    page.on("request", lambda r: posted.append(r.post_data) if r.url.endswith("/chat/completions") else None)
    return posted


def _open_fresh(page, server) -> None:
    """The page of ``server`` with nothing saved by an earlier test (history, settings, the picked model)."""
    page.goto(server.url + "/")
    page.evaluate("localStorage.clear()")
    page.reload()


def test_send_stream_stop_screenshot(browser, live):
    server, engine = live
    page = browser.new_page()
    posted = _record_chat_requests(page)
    page.goto(server.url + "/")
    page.wait_for_function("document.getElementById('model-name').textContent.includes('tiny-cook')")
    page.fill("#system", "You are a cook.")
    page.fill("#max-tokens", "4000")
    page.locator("#temperature").fill("0.1")  # sharp: a random end token is unlikely
    page.fill("#input", "What is in the soup?")
    cancelled_before = engine.finished_by_reason.get("cancelled", 0)
    page.click("#send")
    content = page.locator(".msg.assistant .content").last
    page.wait_for_function("document.querySelector('.msg.assistant .content').textContent.length > 0")
    first = len(content.text_content())
    page.wait_for_function(f"document.querySelector('.msg.assistant .content').textContent.length > {first}")
    assert page.is_enabled("#stop") and not page.is_enabled("#send")  # still streaming: tokens arrive in pieces
    page.click("#stop")
    # whatever ends the reply, the failure says which (CI once timed out here, on a machine loaded twice over)
    page.wait_for_function("document.getElementById('status').textContent !== 'generating…'", timeout=90_000)
    assert page.text_content("#status") == "stopped", (page.text_content("#status"), content.text_content()[-200:])
    deadline = time.time() + 20
    while engine.finished_by_reason.get("cancelled", 0) == cancelled_before and time.time() < deadline:
        time.sleep(0.05)
    assert engine.finished_by_reason.get("cancelled", 0) == cancelled_before + 1  # Stop cancelled the generation
    stopped_len = len(content.text_content())
    time.sleep(0.3)
    assert len(content.text_content()) == stopped_len  # nothing arrives after Stop
    body = json.loads(posted[0])
    assert body["messages"][0] == {"role": "system", "content": "You are a cook."}
    assert body["messages"][1] == {"role": "user", "content": "What is in the soup?"}
    assert body["temperature"] == 0.1 and body["stream"] is True and body["max_tokens"] == 4000
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web_chat.png"), full_page=True)
    # history survives a reload (localStorage)
    page.reload()
    page.wait_for_selector(".msg.user")
    assert page.locator(".msg.user .content").first.text_content() == "What is in the soup?"
    page.close()


def _chunk(delta, finish=None) -> str:
    """One SSE event of a chat completion stream, as the server sends it."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    body = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}
    return "data: " + json.dumps(body) + "\n\n"


def _serve_stream(page, sse: str) -> None:
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=200, body=sse, headers={"Content-Type": "text/event-stream"}),
    )


def test_reasoning_is_collapsible(browser, live):
    server, _ = live
    page = browser.new_page()
    chunk = _chunk
    sse = (
        chunk({"role": "assistant", "content": ""})
        + chunk({"reasoning_content": "Soup needs "})
        + chunk({"reasoning_content": "salt."})
        + chunk({"content": "Add salt."})
        + chunk({}, "stop")
        + "data: [DONE]\n\n"
    )
    _serve_stream(page, sse)
    page.goto(server.url + "/")
    page.evaluate("localStorage.clear()")
    page.click("#new-chat")
    page.fill("#input", "How do I fix bland soup?")
    page.click("#send")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
    msg = page.locator(".msg.assistant").last
    assert msg.locator(".content").text_content() == "Add salt."
    details = msg.locator("details.reasoning")
    assert details.is_visible() and details.get_attribute("open") is None  # shown, collapsed
    assert not msg.locator(".reasoning-text").is_visible()
    details.locator("summary").click()
    assert msg.locator(".reasoning-text").text_content() == "Soup needs salt."
    assert msg.locator(".reasoning-text").is_visible()
    page.close()


def test_a_reply_that_ends_at_once_says_so_and_stays_empty_in_the_history(browser, live):
    # an undertrained model's first token is often an end token: the page showed an empty bubble and "done (stop)",
    # as `cookmind chat` showed a bare "bot> " (it now says "(no reply: ...)"); the page says the same, and the
    # history keeps the reply empty (the note is no text the model said)
    server, _ = live
    page = browser.new_page()
    posted = _record_chat_requests(page)
    _serve_stream(page, _chunk({"role": "assistant", "content": ""}) + _chunk({}, "stop") + "data: [DONE]\n\n")
    _open_fresh(page, server)
    page.fill("#input", "Hello?")
    page.click("#send")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
    said = "(no reply: the model ended its turn at once)"
    assert page.locator(".msg.assistant .content").last.text_content() == said
    page.reload()  # drawn again from the saved history
    assert page.locator(".msg.assistant .content").last.text_content() == said
    page.fill("#input", "Anyone?")
    page.click("#send")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
    sent = json.loads(posted[-1])["messages"]
    assert sent[-3:] == [
        {"role": "user", "content": "Hello?"},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Anyone?"},
    ]
    page.close()


def test_a_reply_of_tokens_that_show_no_text_says_how_many_not_that_it_ended_at_once(browser, live):
    """A reply whose 12 tokens were all markup the chat does not show (a stray </think>) read "(no reply: the model
    ended its turn at once)", as a reply of no token does; `cookmind chat` says how many tokens there were."""
    server, _ = live
    page = browser.new_page()
    usage = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": []}
    usage["usage"] = {"prompt_tokens": 5, "completion_tokens": 12, "total_tokens": 17}
    sse = _chunk({"role": "assistant", "content": ""}) + _chunk({}, "stop") + "data: " + json.dumps(usage) + "\n\n"
    _serve_stream(page, sse + "data: [DONE]\n\n")
    _open_fresh(page, server)
    page.fill("#input", "Hello?")
    page.click("#send")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
    said = "(no reply: the model's 12 tokens showed no text)"
    assert page.locator(".msg.assistant .content").last.text_content() == said
    page.reload()  # drawn again from the saved history
    assert page.locator(".msg.assistant .content").last.text_content() == said
    page.close()


def test_small_context_first_message_and_server_errors(browser, tmp_path_factory):
    tok = make_tokenizer(tmp_path_factory)
    engine = Engine(make_model(tok.vocab_size, max_pos=64), num_slots=2, max_seq_len=64)
    server = LiveServer(create_app(engine, tok, "small-cook"))
    page = browser.new_page()
    try:
        page.goto(server.url + "/")
        # a max-tokens value saved while a bigger model was served (the old default 512) cannot fit 64 tokens
        page.evaluate("localStorage.setItem('cookmind-chat', JSON.stringify({history: [], max_tokens: '512'}))")
        page.reload()
        page.wait_for_function("document.getElementById('model-name').textContent.includes('small-cook')")
        assert page.input_value("#max-tokens") == ""
        assert "64" in page.get_attribute("#max-tokens", "placeholder")
        page.fill("#input", "What is in the soup?")
        page.click("#send")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
        # a request the server refuses: its message is shown in the reply bubble, nothing of it is kept
        page.fill("#max-tokens", "500")
        page.fill("#input", "And the bread?")
        page.click("#send")
        page.wait_for_function("document.getElementById('status').textContent === 'error'")
        failed = page.locator(".msg.assistant").last
        assert "maximum context length is 64 tokens" in failed.locator(".content").text_content()
        assert "failed" in failed.get_attribute("class")
        assert page.input_value("#input") == "And the bread?"  # back in the box to send again
        stored = page.evaluate("JSON.parse(localStorage.getItem('cookmind-chat')).history")
        assert [m["role"] for m in stored] == ["user", "assistant"]
        assert stored[0]["content"] == "What is in the soup?"
        page.reload()
        page.wait_for_selector(".msg.user")
        assert page.locator(".msg.user").count() == 1 and page.locator(".msg.assistant").count() == 1
    finally:
        page.close()
        server.close()


def test_a_server_with_a_key_tells_the_page_user_where_the_key_goes(browser, tmp_path_factory):
    """On a server with an API key the page said "401: Incorrect or missing API key: send 'Authorization: Bearer
    KEY'", the words for an API client: nothing pointed at the page's own API key box. Now the error names it, and
    the key typed there is used."""
    tok = make_tokenizer(tmp_path_factory)
    engine = Engine(make_model(tok.vocab_size, max_pos=64), num_slots=2, max_seq_len=64)
    server = LiveServer(create_app(engine, tok, "keyed-cook", api_key="sekrit"))
    page = browser.new_page()
    try:
        _open_fresh(page, server)
        page.wait_for_function("document.getElementById('model-name').textContent.includes('unavailable')")
        assert "enter the server's key in the API key box" in page.text_content("#model-name")
        page.fill("#input", "What is in the soup?")
        page.click("#send")
        page.wait_for_function("document.getElementById('status').textContent === 'error'")
        failed = page.locator(".msg.assistant").last.locator(".content").text_content()
        assert "401" in failed and "enter the server's key in the API key box" in failed
        page.fill("#api-key", "sekrit")
        page.dispatch_event("#api-key", "change")
        page.wait_for_function("document.getElementById('model-name').textContent.includes('keyed-cook')")
        page.fill("#max-tokens", "2")
        page.click("#send")  # the message went back into the box
        page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
    finally:
        page.close()
        server.close()


def test_a_served_lora_adapter_can_be_picked_and_the_pick_is_kept(browser, live, tmp_path_factory):
    """A server with LoRA adapters lists the base and each adapter in /v1/models; the page used the first entry
    only, so an adapter could not be chatted with. Now it offers a picker (hidden when the base is all there is),
    sends the picked name as the request's model, and keeps the pick over a reload."""
    import copy

    from cookmind.infer.loading import load_adapters
    from cookmind.model.lora import apply_lora, save_adapter

    tok = make_tokenizer(tmp_path_factory)
    base = make_model(tok.vocab_size, max_pos=256)
    lora = copy.deepcopy(base)
    apply_lora(lora, r=2, alpha=4.0, targets=["q_proj"])
    folder = tmp_path_factory.mktemp("adapter") / "chef"
    save_adapter(folder, lora)
    engine = Engine(base, num_slots=2, max_seq_len=256, adapters=load_adapters(base, {"chef": folder}))
    server = LiveServer(create_app(engine, tok, "tiny-cook"))
    page = browser.new_page()
    posted = _record_chat_requests(page)
    try:
        _open_fresh(page, server)
        page.wait_for_function("document.getElementById('model-select').options.length === 2")
        assert page.is_visible("#model-select") and page.input_value("#model-select") == "tiny-cook"
        options = page.eval_on_selector_all("#model-select option", "os => os.map(o => [o.value, o.textContent])")
        assert options == [["tiny-cook", "tiny-cook"], ["chef", "chef (LoRA on tiny-cook)"]]
        page.select_option("#model-select", "chef")
        page.fill("#max-tokens", "4")
        page.fill("#input", "What is in the soup?")
        page.click("#send")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
        assert json.loads(posted[-1])["model"] == "chef"
        page.reload()
        page.wait_for_function("document.getElementById('model-select').options.length === 2")
        assert page.input_value("#model-select") == "chef"
    finally:
        page.close()
        server.close()
    # the base alone: no picker
    page = browser.new_page()
    try:
        page.goto(live[0].url + "/")
        page.wait_for_function("document.getElementById('model-name').textContent.includes('tiny-cook')")
        assert not page.is_visible("#model-select") and page.locator("#model-select option").count() == 1
        # its label too: "Model (the base or a LoRA adapter it serves)" showed above nothing (the sidebar's
        # `label {display: block}` overrode the hidden attribute)
        assert not page.is_visible("#model-select-label")
    finally:
        page.close()


def test_a_conversation_that_outgrows_the_context_leaves_its_oldest_exchanges_out(browser, tmp_path_factory):
    """A reply without max_tokens takes the rest of the context, so with a small model the next message's prompt no
    longer fit: every later turn was refused ("Reduce the prompt or max_tokens") until New chat. Now the page leaves
    the oldest exchanges out, as `cookmind chat` does, says so, and answers."""
    tok = make_tokenizer(tmp_path_factory)
    # never ends early: the first reply fills the context
    engine = Engine(
        make_model(tok.vocab_size, max_pos=64, rare_ids=sorted(control_token_ids(tok))), num_slots=2, max_seq_len=64
    )
    server = LiveServer(create_app(engine, tok, "small-cook"))
    page = browser.new_page()
    posted = _record_chat_requests(page)
    try:
        _open_fresh(page, server)
        page.wait_for_function("document.getElementById('model-name').textContent.includes('small-cook')")
        page.fill("#input", "What is in the soup?")
        page.click("#send")
        page.wait_for_function("document.getElementById('status').textContent === 'done (length)'")
        page.fill("#input", "And the bread?")
        page.click("#send")
        page.wait_for_function("/^(done|error)/.test(document.getElementById('status').textContent)")
        last = page.locator(".msg.assistant").last
        assert page.text_content("#status").startswith("done"), last.text_content()
        assert "failed" not in last.get_attribute("class")
        assert "2 oldest messages left out" in last.locator(".meta").text_content()
        assert json.loads(posted[-1])["messages"] == [{"role": "user", "content": "And the bread?"}]
        stored = page.evaluate("JSON.parse(localStorage.getItem('cookmind-chat')).history")
        assert [(m["role"], m["content"] if m["role"] == "user" else "") for m in stored] == [
            ("user", "And the bread?"),
            ("assistant", ""),
        ]
    finally:
        page.close()
        server.close()


def _marker(c: str) -> str:
    """How the page shows a character that reorders or breaks the text around it."""
    return f"⟨U+{ord(c):04X}⟩"


def test_bidi_controls_are_shown_as_markers_and_sent_back_as_they_are(browser, live):
    """The page drew a reply as it was: a right-to-left override (U+202E) showed "pay \\u202e001$" as "pay $100" and
    an isolate or a line separator moved or broke the text after it ("Trojan Source"), where `cookmind chat` shows
    them escaped. Each character of the set cookmind.terminal escapes (SPOOFING) is now drawn as a visible marker
    (⟨U+202E⟩) in the user's message, the reply and its reasoning, in the bubbles the stream filled and once drawn again
    from the saved history; the history sent back and saved keeps the characters, so the model sees what it wrote."""
    from cookmind.terminal import SPOOFING

    server, _ = live
    every = "".join(map(chr, SPOOFING))
    reply = "pay \u202e001$\u202c now; all:" + every + "."
    reasoning = "say \u2067it\u2069\u2028twice"
    asked = "Is \u200fthis fine?"
    page = browser.new_page()
    posted = _record_chat_requests(page)
    sse = (
        _chunk({"role": "assistant", "content": ""})
        + _chunk({"reasoning_content": reasoning})
        + _chunk({"content": reply[:5]})  # a piece that ends with the override: what follows comes in the next
        + _chunk({"content": reply[5:]})
        + _chunk({}, "stop")
        + "data: [DONE]\n\n"
    )
    _serve_stream(page, sse)
    _open_fresh(page, server)
    page.fill("#input", asked)
    page.click("#send")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")

    def shown() -> list[str]:
        msgs = page.locator(".msg")
        user, assistant = msgs.nth(msgs.count() - 2), msgs.nth(msgs.count() - 1)
        assistant.locator("summary").click()  # the reasoning, opened: innerText is what is drawn
        return [
            user.locator(".content").inner_text(),
            assistant.locator(".content").inner_text(),
            assistant.locator(".reasoning-text").inner_text(),
        ]

    want = [
        "Is " + _marker("\u200f") + "this fine?",
        "pay " + _marker("\u202e") + "001$" + _marker("\u202c") + " now; all:" + "".join(map(_marker, every)) + ".",
        "say " + _marker("\u2067") + "it" + _marker("\u2069") + _marker("\u2028") + "twice",
    ]
    assert shown() == want
    page_text = page.locator("#messages").text_content()
    assert [c for c in page_text if ord(c) in SPOOFING] == []  # none drawn raw, anywhere among the messages
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web_chat_bidi.png"), full_page=True)
    page.reload()  # drawn again from the saved history
    page.wait_for_selector(".msg.assistant")
    assert shown() == want
    stored = page.evaluate("JSON.parse(localStorage.getItem('cookmind-chat')).history")
    assert [(m["role"], m["content"]) for m in stored] == [("user", asked), ("assistant", reply)]
    assert stored[1]["reasoning_content"] == reasoning
    page.fill("#input", "And now?")
    page.click("#send")
    page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
    sent = json.loads(posted[-1])["messages"]
    assert sent[-3:] == [
        {"role": "user", "content": asked},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "And now?"},
    ]
    page.close()


def test_a_reply_of_many_bidi_controls_is_drawn(browser, live):
    """Each marker was one argument of a single replaceChildren call: a reply (or a saved history) of 70,000 such
    characters passed more arguments than the browser takes ("Maximum call stack size exceeded"), and the page
    stayed at "generating…" (drawing the error failed the same way), and failed on every reload after. Each marker
    was also isolated from the text around it, which Chrome laid out in time growing with the square of their
    number (10,000: 17 s)."""
    server, _ = live
    n = 70_000  # 140,001 parts: Chrome's limit on a call's arguments is below that
    page = browser.new_page()
    _serve_stream(
        page,
        _chunk({"role": "assistant", "content": ""})
        + _chunk({"content": "x\u202e" * n})
        + _chunk({}, "stop")
        + "data: [DONE]\n\n",
    )
    _open_fresh(page, server)
    page.fill("#input", "Many?")
    page.click("#send")
    page.wait_for_function("document.getElementById('status').textContent !== 'generating…'", timeout=90_000)
    assert page.text_content("#status").startswith("done"), page.text_content("#status")
    markers = "document.querySelectorAll('.msg.assistant .content .control').length"
    assert page.evaluate(markers) == n
    page.reload()  # drawn again from the saved history
    page.wait_for_selector(".msg.assistant")
    assert page.evaluate(markers) == n
    page.close()


def test_the_page_behind_a_proxy_on_a_sub_path_calls_the_api_under_that_path(browser, live):
    """The page fetched /v1/models and /v1/chat/completions from the host's root, so served by a reverse proxy at
    https://host/llm/ it asked the host's own /v1/... (someone else's, or nothing) and never reached the model. Its
    API calls now lie beside the page: under /llm/, whether the page's address ends in a slash or not (the page is the
    app's root)."""
    server, _ = live
    outside = []  # the requests that left the proxy's sub-path

    def proxy(route):
        path = urllib.parse.urlsplit(route.request.url).path
        if path != "/llm" and not path.startswith("/llm/"):
            outside.append(path)
            return route.fulfill(status=404, body="not this app")
        rest = path[len("/llm") :] or "/"  # the proxy strips its prefix, as nginx's proxy_pass .../ does
        response = route.fetch(url=server.url + rest)
        route.fulfill(response=response)

    for address in ("http://proxy.test/llm/", "http://proxy.test/llm"):
        page = browser.new_page()
        posted = _record_chat_requests(page)
        page.route("http://proxy.test/**", proxy)
        try:
            _chat_once_through_the_proxy(page, address, outside)
            assert len(posted) == 1, (address, posted)
        finally:
            page.close()


def test_two_servers_behind_one_host_keep_their_own_chats_and_keys(browser, live):
    """The page kept its chat (localStorage) and its API key (sessionStorage) under one name per host, so two servers
    a proxy serves under /a/ and /b/ of one host shared them: the chat with one showed on the other's page, and the
    key typed for one went to the other. Each page's now keeps its own, named by the path it serves under."""
    server, _ = live

    def proxy(route):
        path = urllib.parse.urlsplit(route.request.url).path
        prefix = path[:2]
        if prefix not in ("/a", "/b"):
            return route.fulfill(status=404, body="not this app")
        route.fulfill(response=route.fetch(url=server.url + (path[2:] or "/")))

    context = browser.new_context()  # one browser profile: the storage the two pages would share
    page = context.new_page()
    page.route("http://proxy.test/**", proxy)
    try:
        page.goto("http://proxy.test/a/")
        page.wait_for_function("document.getElementById('model-name').textContent.includes('tiny-cook')")
        page.fill("#api-key", "key-of-a")
        page.dispatch_event("#api-key", "change")
        page.fill("#max-tokens", "2")
        page.fill("#input", "What is in the soup?")
        page.click("#send")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('done')")
        page.goto("http://proxy.test/b/")
        page.wait_for_function("document.getElementById('model-name').textContent.includes('tiny-cook')")
        assert page.locator(".msg").count() == 0 and page.input_value("#api-key") == ""
        page.goto("http://proxy.test/a/")  # its own are still there
        page.wait_for_selector(".msg.user")
        assert page.locator(".msg.user .content").first.text_content() == "What is in the soup?"
        assert page.input_value("#api-key") == "key-of-a"
    finally:
        context.close()


@pytest.mark.parametrize("strips", [False, True], ids=["proxy-keeps-the-prefix", "proxy-strips-it"])
def test_the_page_of_a_server_with_a_root_path_works_behind_either_proxy(browser, tmp_path_factory, strips):
    """A proxy that passes /llm/... as it came (nginx's proxy_pass without a path, Traefik without StripPrefix) got a
    404 for the page and every API call: the server had no --root-path. With root_path="/llm" both proxies serve
    the page, its model list and a reply, at the address with its slash and without."""
    tok = make_tokenizer(tmp_path_factory)
    engine = Engine(make_model(tok.vocab_size, max_pos=256), num_slots=2, max_seq_len=256)
    server = LiveServer(create_app(engine, tok, "tiny-cook", root_path="/llm"))
    outside = []

    def proxy(route):
        path = urllib.parse.urlsplit(route.request.url).path
        if path != "/llm" and not path.startswith("/llm/"):
            outside.append(path)
            return route.fulfill(status=404, body="not this app")
        upstream = (path[len("/llm") :] or "/") if strips else path
        route.fulfill(response=route.fetch(url=server.url + upstream, max_redirects=0))

    try:
        for address in ("http://proxy.test/llm/", "http://proxy.test/llm"):
            page = browser.new_page()
            page.route("http://proxy.test/**", proxy)
            try:
                _chat_once_through_the_proxy(page, address, outside)
            finally:
                page.close()
    finally:
        server.close()


def _chat_once_through_the_proxy(page, address: str, outside: list) -> None:
    """Open the page at ``address`` (a fresh localStorage), check it names the model, send one message and check the
    reply came, with no request gone past the proxy's prefix (``outside``)."""
    page.goto(address)
    page.evaluate("localStorage.clear()")
    page.reload()
    page.wait_for_function("document.getElementById('model-name').textContent !== 'model: …'")
    assert page.text_content("#model-name") == "model: tiny-cook", (address, outside)
    page.fill("#max-tokens", "2")
    page.fill("#input", "What is in the soup?")
    page.click("#send")
    page.wait_for_function("/^(done|error)/.test(document.getElementById('status').textContent)")
    assert page.text_content("#status").startswith("done"), (address, page.text_content("#status"))
    assert outside == [], (address, outside)
