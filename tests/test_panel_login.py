"""The panel's lasting login against the real program: a `panel` process (and `serve --http`), its
one-time link, the 30-day cookie and its flags, a forged cookie, a login surviving a restart,
`panel --link` minting a new one-time link for another browser, and failing in one line when no
panel answers; plus the /link endpoint's refusals in-process."""

import os
import re
import stat
import subprocess
import sys
import time

import httpx
import pytest
from starlette.testclient import TestClient

import aokun
from mcp_procs import REPO, child_env, cli, free_port, serve_args, stop, wait_port, write_ini

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more

LINK = re.compile(r"http://127\.0\.0\.1:\d+(/panel)?/\?token=[\w-]+")


def start_panel(db, ini, port):
    """A `panel --no-browser` process on `port` and the link it printed."""
    cmd = [sys.executable, aokun.__file__, "--db", str(db), "--config", str(ini), "panel",
           "--port", str(port), "--no-browser"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=child_env(PYTHONUNBUFFERED=1),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    wait_port(port, proc)
    return proc, LINK.search(proc.stdout.readline()).group(0)


def wait_announced(state, timeout: float = 20) -> None:
    """Until the server has written its link secret to `state` (right after it starts listening)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if state.exists() and aokun.read_private_json(state).get("link_secret"):
            return
        time.sleep(0.1)
    raise AssertionError(f"{state} got no link secret")


def log_in(link: str) -> tuple[httpx.Client, httpx.Response]:
    """A new cookie jar (a new browser) that opened `link` (not following the redirect)."""
    client = httpx.Client(timeout=30)
    return client, client.get(link, follow_redirects=False)


def new_link(db, ini, *more) -> str:
    out = cli(db, ini, "panel", "--link", *more)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    [line] = out.stdout.splitlines()
    assert LINK.fullmatch(line), line
    return line


def one_line_failure(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.strip().splitlines()
    return line


def test_a_login_lasts_survives_a_restart_and_a_new_browser_gets_a_minted_link(tmp_path):
    db, ini, port = tmp_path / "p.db", write_ini(tmp_path), free_port()
    base = f"http://127.0.0.1:{port}"
    proc, link = start_panel(db, ini, port)
    try:
        first, r = log_in(link)
        assert r.status_code == 303 and r.headers["location"] == "/"
        flags = [f.strip().lower() for f in r.headers["set-cookie"].split(";")]
        assert f"max-age={30 * 86400}" in flags and "httponly" in flags
        assert "samesite=strict" in flags
        assert "path=/" in flags
        assert first.get(base + "/health").status_code == 200
        assert log_in(link)[1].status_code == 401  # the link works once
        session = first.cookies[f"aokun_panel_{port}"]
        state = aokun.panel_state_path(db, port)
        assert stat.S_IMODE(state.stat().st_mode) == 0o600 and session not in state.read_text()
        tampered = session[:-2] + ("AA" if session[-2:] != "AA" else "BB")
        for forged in (tampered, "x" * len(session), ""):
            with httpx.Client(cookies={f"aokun_panel_{port}": forged}) as other:
                assert other.get(base + "/health").status_code == 401, forged
        minted = new_link(db, ini)  # another browser, while the server runs
        second, r = log_in(minted)
        assert r.status_code == 303 and second.get(base + "/settings").status_code == 200
        assert log_in(minted)[1].status_code == 401  # a minted link works once too
        assert new_link(db, ini, "--port", str(port)) != minted
    finally:
        stop(proc)
    # its file stays, nobody listens
    assert "no panel answers" in one_line_failure(cli(db, ini, "panel", "--link"))

    proc, _ = start_panel(db, ini, port)  # a restart: the first browser is still logged in
    try:
        assert first.get(base + "/health").status_code == 200
        assert log_in(link)[1].status_code == 401
    finally:
        stop(proc)


def test_panel_link_with_no_server_is_one_line(tmp_path):
    db, ini = tmp_path / "n.db", write_ini(tmp_path)
    line = one_line_failure(cli(db, ini, "panel", "--link"))
    assert "no panel answers" in line and "python aokun.py panel" in line, line
    assert "on port 9" in one_line_failure(cli(db, ini, "panel", "--link", "--port", "9"))


@pytest.mark.skipif(os.name == "nt", reason="POSIX file modes")
def test_a_state_file_others_can_read_is_not_trusted(tmp_path):
    db, ini = tmp_path / "m.db", write_ini(tmp_path)
    state = aokun.panel_state_path(db, 8765)
    aokun.write_private(state, '{"host": "127.0.0.1", "port": 8765, "root": "", '
                               '"link_secret": "x", "sessions": {"%s": 9e99}}'
                        % aokun._sha256("planted"))
    os.chmod(state, 0o644)
    assert "not private" in one_line_failure(cli(db, ini, "panel", "--link"))
    assert not aokun.PanelState(state).live("planted")
    os.chmod(state, 0o600)
    assert aokun.PanelState(state).live("planted")


def test_serve_http_mints_a_panel_link(tmp_path):
    db, ini = tmp_path / "h.db", write_ini(tmp_path, "none", server={"token": "s3cret"})
    port = free_port()
    proc = subprocess.Popen([sys.executable, *serve_args(db, ini, "--http", "--port", str(port))],
                            cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        wait_announced(aokun.panel_state_path(db, port))
        link = new_link(db, ini)
        assert f"127.0.0.1:{port}/panel/?token=" in link
        client, r = log_in(link)
        assert r.status_code == 303 and r.headers["location"] == "/panel/"
        assert "path=/panel" in r.headers["set-cookie"].lower()
        assert client.get(f"http://127.0.0.1:{port}/panel/health").status_code == 200
        mcp = client.post(f"http://127.0.0.1:{port}/mcp", json={})
        assert mcp.status_code == 401  # the MCP endpoint keeps its bearer token
    finally:
        stop(proc)


def test_the_link_endpoint_needs_the_secret_and_no_origin(mem, tmp_path):
    state = tmp_path / "s.db.panel-8765"
    web, app = aokun.panel_app(lambda: mem, aokun.Config(None), tmp_path / "aokun.ini", "127.0.0.1",
                               8765, state)
    client = TestClient(app, base_url="http://127.0.0.1:8765")

    def mint(**headers):
        return client.post("/link", headers=headers)
    assert mint(**{"X-Aokun-Link": ""}).status_code == 403  # not announced yet
    web.state.announce("127.0.0.1", 8765, "")
    secret = web.state.link_secret
    assert mint().status_code == 403
    assert mint(**{"X-Aokun-Link": secret + "x"}).status_code == 403
    assert mint(**{"X-Aokun-Link": secret, "Origin": "http://127.0.0.1:8765"}).status_code == 403
    assert mint(**{"X-Aokun-Link": secret, "Host": "evil.example"}).status_code == 421
    r = mint(**{"X-Aokun-Link": secret})
    assert r.status_code == 200 and r.text.startswith("http://127.0.0.1:8765/?token=")
    token = r.text.split("token=")[1]
    web.links[aokun._sha256(token)] = time.time() - 1  # expired
    assert client.get(f"/?token={token}", follow_redirects=False).status_code == 401


CSRF = re.compile(r'name="csrf" value="(\w+)"')


def csrf_of(client: httpx.Client, url: str) -> str:
    r = client.get(url)
    assert r.status_code == 200, r.text
    return CSRF.search(r.text).group(1)


def test_log_out_and_revoke_another_browser(tmp_path):
    """Issue 33 item 11: POST /logout ends that browser's session only (CSRF and Origin checked
    like every change), /sessions lists each login (browser, created, last seen) with a revoke
    that logs that browser out; both hold across a restart."""
    db, ini, port = tmp_path / "l.db", write_ini(tmp_path), free_port()
    base = f"http://127.0.0.1:{port}"
    proc, link = start_panel(db, ini, port)
    try:
        first, _ = log_in(link)
        second, _ = log_in(new_link(db, ini))
        third = httpx.Client(timeout=30, headers={"User-Agent": "Mozilla/5.0 (Phone) Third/1.0"})
        assert third.get(new_link(db, ini), follow_redirects=False).status_code == 303
        listing = second.get(base + "/sessions")
        assert listing.status_code == 200 and listing.text.count(">Revoke<") == 2
        assert "Third/1.0" in listing.text and "this browser" in listing.text
        token = csrf_of(first, base + "/memories")
        origin = {"Origin": base}
        assert first.post(base + "/logout", data={"csrf": "x"}, headers=origin).status_code == 403
        assert first.post(base + "/logout", data={"csrf": token}).status_code == 403  # no Origin
        session = first.cookies[f"aokun_panel_{port}"]
        r = first.post(base + "/logout", data={"csrf": token}, headers=origin)
        assert r.status_code == 200 and "logged out" in r.text
        assert f'aokun_panel_{port}=""' in r.headers["set-cookie"]
        with httpx.Client(cookies={f"aokun_panel_{port}": session}) as replay:  # a copied cookie
            assert replay.get(base + "/health").status_code == 401
        assert first.get(base + "/health").status_code == 401
        assert second.get(base + "/health").status_code == 200
        listing = second.get(base + "/sessions").text
        assert listing.count(">Revoke<") == 1  # the one logged out is gone
        other = re.search(r'/sessions/(\w+)/revoke">\s*<input type="hidden" name="csrf" '
                          r'value="\w+"><input type="hidden" name="persona" value="">\s*'
                          r'<button type="submit" class="danger">Revoke', listing).group(1)
        r = second.post(f"{base}/sessions/{other}/revoke", headers=origin,
                        data={"csrf": CSRF.search(listing).group(1)}, follow_redirects=False)
        assert r.status_code == 303
        assert third.get(base + "/health").status_code == 401
        assert second.get(base + "/health").status_code == 200
    finally:
        stop(proc)
    proc, _ = start_panel(db, ini, port)  # a restart: what was ended stays ended
    try:
        assert third.get(base + "/health").status_code == 401
        assert second.get(base + "/health").status_code == 200
        assert ">Revoke<" not in second.get(base + "/sessions").text  # only this browser's left
    finally:
        stop(proc)
