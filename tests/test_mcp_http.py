"""`python aokun.py serve --http` as a real uvicorn child process: the SDK's streamable-HTTP client,
the bearer token ([server] token and token_env), and DNS-rebinding protection (Host, Origin)."""

import contextlib
import subprocess
import sys

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import aokun
from mcp_procs import REPO, child_env, free_port, serve_args, stop, wait_port, write_ini

pytestmark = pytest.mark.anyio

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "t", "version": "0"}}}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@contextlib.contextmanager
def http_server(tmp_path, env=None, **server):
    """Run `serve --http --port <free>` with [server] settings `server`; yields (url, port, db,
    ini). The child is always terminated."""
    db, ini = tmp_path / "h.db", write_ini(tmp_path, "none", server=server)
    port = free_port()
    out, err = (tmp_path / "http-stdout.txt").open("wb"), (tmp_path / "http-stderr.txt").open("wb")
    proc = subprocess.Popen([sys.executable, *serve_args(db, ini, "--http", "--port", str(port))],
                            cwd=REPO, env=child_env(**(env or {})), stdin=subprocess.DEVNULL,
                            stdout=out, stderr=err)
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp", port, db, ini
        assert proc.poll() is None, "the server died during the test"
    finally:
        stop(proc)
        out.close()
        err.close()
    log = (tmp_path / "http-stderr.txt").read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log, log[-3000:]


async def post_initialize(url: str, headers: dict) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=20) as h:
        return await h.post(url, json=INIT, headers={**MCP_HEADERS, **headers})


async def memorize_and_recall(url: str, headers: dict | None = None,
                              text: str = "HTTP 记忆: 小李喜欢滑雪 ⛷️") -> int:
    async with httpx2.AsyncClient(headers=headers or {}, timeout=30) as http:
        async with Client(streamable_http_client(url, http_client=http)) as c:
            assert c.server_info.name == "aokun"
            w = await c.call_tool("memorize", {"content": text})
            assert w.is_error is False, w.content[0].text
            r = await c.call_tool("recall", {"query": "滑雪"})
            assert r.is_error is False, r.content[0].text
            hits = r.structured_content["results"]
            assert hits and hits[0]["id"] == w.structured_content["id"] and hits[0]["text"] == text
            return w.structured_content["id"]


@pytest.mark.slow
async def test_http_client_memorize_and_recall(tmp_path):
    with anyio.fail_after(90), http_server(tmp_path) as (url, port, db, ini):
        doc_id = await memorize_and_recall(url)
        # a second client session talks to the same database
        async with Client(url) as c:
            r = await c.call_tool("recall", {"query": "小李"})
            assert [h["id"] for h in r.structured_content["results"]] == [doc_id]
            assert {t.name for t in (await c.list_tools()).tools} == set(aokun.DEFAULT_TOOLS)
        # no token configured: plain requests are served
        ok = await post_initialize(url, {})
        assert ok.status_code == 200 and '"serverInfo"' in ok.text
        assert (await post_initialize(url, {"Host": f"localhost:{port}"})).status_code == 200
        # DNS rebinding: a foreign Host or Origin is refused
        evil = await post_initialize(url, {"Host": "evil.example"})
        assert evil.status_code == 421, evil.text
        assert (await post_initialize(url, {"Host": f"evil.example:{port}"})).status_code == 421
        assert (await post_initialize(url, {"Origin": "http://evil.example"})).status_code == 403
    with aokun.Memory(db, aokun.Config(ini)) as m:
        assert m.value("select count(*) from documents") == 1
        assert m.doctor() == []


@pytest.mark.slow
async def test_http_bearer_token(tmp_path):
    with anyio.fail_after(90), http_server(tmp_path, token="s3cret") as (url, port, db, ini):
        none = await post_initialize(url, {})
        assert none.status_code == 401
        assert none.headers.get("www-authenticate", "").startswith("Bearer")
        assert (await post_initialize(url, {"Authorization": "Bearer wrong"})).status_code == 401
        # no scheme
        assert (await post_initialize(url, {"Authorization": "s3cret"})).status_code == 401
        assert (await post_initialize(url, {"Authorization": "Bearer s3cretX"})).status_code == 401
        assert (await post_initialize(url, {"Authorization": "Bearer s3cre"})).status_code == 401
        good = await post_initialize(url, {"Authorization": "Bearer s3cret"})
        assert good.status_code == 200 and '"serverInfo"' in good.text
        # the token does not switch off DNS-rebinding protection
        evil = await post_initialize(url, {"Authorization": "Bearer s3cret",
                                           "Host": "evil.example"})
        assert evil.status_code == 421
        # the MCP client: with the token it works, without it it cannot even connect
        await memorize_and_recall(url, {"Authorization": "Bearer s3cret"})
        with pytest.raises(Exception):  # noqa: B017 (an ExceptionGroup around the SDK's error)
            with anyio.fail_after(20):
                async with httpx2.AsyncClient(headers={"Authorization": "Bearer wrong"}) as http:
                    async with Client(streamable_http_client(url, http_client=http)) as c:
                        await c.call_tool("memorize", {"content": "must not be stored"})
    with aokun.Memory(db, aokun.Config(ini)) as m:
        assert [r["content"] for r in m.rows("select content from documents")] == \
            ["HTTP 记忆: 小李喜欢滑雪 ⛷️"]


@pytest.mark.slow
async def test_http_token_from_environment(tmp_path):
    with anyio.fail_after(60), http_server(tmp_path, env={"MY_MEMORY_TOKEN": "from-env"},
                                           token_env="MY_MEMORY_TOKEN") as (url, port, db, ini):
        assert (await post_initialize(url, {})).status_code == 401
        assert (await post_initialize(url, {"Authorization": "Bearer from-env"})).status_code == 200


@pytest.mark.slow
async def test_http_allowed_hosts(tmp_path):
    hosts = "memory.lan:*, box.local:*"
    with anyio.fail_after(60), http_server(tmp_path, allowed_hosts=hosts) as (url, port, db, ini):
        assert (await post_initialize(url, {"Host": f"memory.lan:{port}"})).status_code == 200
        same_origin = await post_initialize(url, {"Host": f"box.local:{port}",
                                                  "Origin": f"http://box.local:{port}"})
        assert same_origin.status_code == 200
        assert (await post_initialize(url, {"Host": f"evil.example:{port}"})).status_code == 421


@pytest.mark.slow
async def test_http_origin_must_be_the_servers_own(tmp_path):
    """A browser page on another local port (or scheme) must not drive the server: only the server's
    own origin passes; requests without Origin (non-browser clients) still work."""
    with anyio.fail_after(60), http_server(tmp_path) as (url, port, db, ini):
        other = free_port()
        for origin in (f"http://127.0.0.1:{other}", f"http://localhost:{other}",
                       f"http://[::1]:{other}", f"https://127.0.0.1:{port}", "http://127.0.0.1",
                       "null", f"http://127.0.0.1:{port}.evil.example"):
            r = await post_initialize(url, {"Origin": origin})
            assert r.status_code == 403, (origin, r.status_code, r.text)
        for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
            assert (await post_initialize(url, {"Origin": origin})).status_code == 200, origin
        assert (await post_initialize(url, {})).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7", "myhost.example"])
def test_http_refuses_a_non_loopback_bind_without_a_token(tmp_path, host):
    ini = write_ini(tmp_path, "none")
    r = subprocess.run([sys.executable, *serve_args(tmp_path / "h.db", ini, "--http",
                                                    "--host", host, "--port", str(free_port()))],
                       cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert host in lines[0] and "[server] token" in lines[0], lines[0]
    assert "$AOKUN_TOKEN" in lines[0], lines[0]
    assert not (tmp_path / "h.db").exists()


def test_http_app_non_loopback_needs_a_token_and_loopback_does_not(tmp_path):
    assert [h for h in ("127.0.0.1", "127.8.9.10", "localhost", "LOCALHOST", "::1", "[::1]")
            if not aokun.is_loopback(h)] == []
    assert [h for h in ("0.0.0.0", "::", "", "10.0.0.1", "192.168.1.5", "fe80::1",
                        "localhost.evil.example", "127.0.0.1.evil.example")
            if aokun.is_loopback(h)] == []
    plain = aokun.Config(write_ini(tmp_path, "none"))
    server = aokun.build_server(lambda: None, plain)
    aokun.http_app(server, plain, "127.0.0.1", 5123)
    with pytest.raises(aokun.AokunError, match=r"\[server\] token"):
        aokun.http_app(server, plain, "0.0.0.0", 5123)
    tokened = aokun.Config(write_ini(tmp_path, "none", server={"token": "s3cret"}))
    app = aokun.http_app(aokun.build_server(lambda: None, tokened), tokened, "0.0.0.0", 5123)
    assert isinstance(app, aokun.BearerToken)
