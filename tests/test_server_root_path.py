"""The server under a sub-path (`cookmind serve --root-path /llm`), through real clients on a loopback socket.

A reverse proxy serving it at https://host/llm/ either strips the prefix (nginx's ``proxy_pass http://up/;``) or
passes the path as it came (``proxy_pass http://up;``, Traefik without StripPrefix, most ingresses). With a root path
the server answers both: every path, the web page's open paths included, and its 404s name the paths as the client
sees them. Without one, an app that embeds the server under a Starlette Mount keeps its page and /health open too."""

from __future__ import annotations

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient
from test_server import LiveServer, make_model, make_tokenizer

from cookmind.infer.engine import Engine
from cookmind.infer.server import create_app
from cookmind.infer.server.app import check_root_path

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run fastest on one thread

KEY = "s3cret"
MODEL = "tiny-cook"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory)


@pytest.fixture(scope="module")
def server(tok):
    engine = Engine(make_model(tok.vocab_size, max_pos=256), num_slots=2, max_seq_len=256)
    live = LiveServer(create_app(engine, tok, MODEL, api_key=KEY, root_path="/llm"))
    yield live
    live.close()


@pytest.mark.parametrize("prefix", ["/llm", ""], ids=["proxy-keeps-the-prefix", "proxy-strips-it"])
def test_a_root_path_serves_a_proxy_that_keeps_the_prefix_and_one_that_strips_it(server, prefix):
    url = server.url + prefix
    page = httpx.get(url + "/")  # the page and /health need no key, under the prefix too
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), page.text
    assert httpx.get(url + "/health").json() == {"status": "ok", "model": MODEL}
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/metrics", headers=AUTH).status_code == 200
    assert [m["id"] for m in httpx.get(url + "/v1/models", headers=AUTH).json()["data"]] == [MODEL]
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0
    )
    assert reply.usage.completion_tokens >= 1
    # the OpenAPI document tells its readers where the API lies
    assert httpx.get(url + "/openapi.json", headers=AUTH).json()["servers"] == [{"url": "/llm"}]


def test_the_root_path_without_its_slash_is_the_page_and_404s_name_the_paths_under_it(server):
    # the page itself, not a redirect: its Location would name the Host the proxy sent upstream
    r = httpx.get(server.url + "/llm")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    missing = httpx.get(server.url + "/llm/models", headers=AUTH)
    assert missing.status_code == 404
    message = missing.json()["error"]["message"]
    assert message.startswith("GET /llm/models: no such path; the API is at /llm/v1/chat/completions"), message
    assert "did you mean /llm/v1/models?" in message, message


@pytest.mark.parametrize("prefix", ["/llm", ""], ids=["proxy-keeps-the-prefix", "proxy-strips-it"])
def test_a_trailing_slash_redirect_stays_under_the_proxys_path(server, tok, prefix):
    """/metrics/ was redirected to an absolute URL built from what reached the server (http://127.0.0.1:PORT/...,
    or the proxy's upstream Host), which a browser or client behind the proxy cannot reach; the Location is now
    relative, and resolves (RFC 3986, as urljoin does) against the address the client asked to the path under the
    proxy's prefix. Without --root-path too: a stripping proxy's prefix is kept. Two trailing slashes get the 404
    naming the paths, not a redirect that clients resolve differently."""
    from urllib.parse import urljoin

    asked = "http://proxy.test/llm/metrics/?limit=1"  # the address the client used
    r = httpx.get(f"{server.url}{prefix}/metrics/?limit=1", headers=AUTH, follow_redirects=False)
    assert r.status_code == 307, r.text
    assert urljoin(asked, r.headers["location"]) == "http://proxy.test/llm/metrics?limit=1", r.headers["location"]
    follow = httpx.get(f"{server.url}{prefix}/metrics/", headers=AUTH, follow_redirects=True)
    assert follow.status_code == 200 and "cookmind_requests_total" in follow.text
    twice = httpx.get(f"{server.url}{prefix}/metrics//", headers=AUTH, follow_redirects=False)
    assert twice.status_code == 404 and "no such path" in twice.json()["error"]["message"]
    engine = Engine(make_model(tok.vocab_size, max_pos=256), num_slots=1, max_seq_len=256)
    app = create_app(engine, tok, MODEL, api_key=KEY, manage_engine=False)
    r = TestClient(app, base_url="http://localhost", follow_redirects=False).get("/metrics/", headers=AUTH)
    assert r.status_code == 307  # no root path: the proxy strips /llm, which the client's address keeps
    assert urljoin(asked, r.headers["location"]) == "http://proxy.test/llm/metrics", r.headers["location"]


def test_an_app_that_mounts_the_server_keeps_its_page_and_health_open(tok):
    """The guard compared the whole path with "/" and "/health": mounted at /llm, the page and /health asked for the
    key (401), and a 404 offered /v1 paths the client could not reach."""
    engine = Engine(make_model(tok.vocab_size, max_pos=256), num_slots=1, max_seq_len=256)
    inner = create_app(engine, tok, MODEL, api_key=KEY, manage_engine=False)
    client = TestClient(Starlette(routes=[Mount("/llm", app=inner)]), base_url="http://localhost")
    assert client.get("/llm/").status_code == 200
    assert client.get("/llm/health").status_code == 200
    assert client.get("/llm/v1/models").status_code == 401
    assert client.get("/llm/v1/models", headers=AUTH).status_code == 200
    assert "did you mean /llm/v1/models?" in client.get("/llm/models", headers=AUTH).json()["error"]["message"]


@pytest.mark.parametrize(
    ("given", "root"), [("/llm", "/llm"), ("/llm/", "/llm"), ("/a/b-c_1.x", "/a/b-c_1.x"), ("/", "")]
)
def test_a_root_path_is_kept_without_its_trailing_slash(given, root):
    assert check_root_path(given) == root


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("llm", "must start with /"),
        ("/llm?x=1", "may hold only"),
        ("/l lm", "may hold only"),
        ("/caf%C3%A9", "may hold only"),
        ("//llm", "empty segment"),
        ("/v1", "the server's own /v1"),
        ("/health/x", "the server's own /health"),
    ],
)
def test_a_root_path_that_cannot_work_is_refused_saying_why(given, says):
    with pytest.raises(ValueError, match="root path") as e:
        check_root_path(given)
    assert says in str(e.value), str(e.value)
