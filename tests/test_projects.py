"""Memory that knows its project (issue 36): project_of, the personal/project rule, recall and the
briefing per project, conversations of the project first, and the client's project learnt over MCP:
roots (in-process, changed mid-session), the launch folder of a real stdio child in two git folders,
a project named over HTTP."""

import contextlib
import json
import subprocess
import sys

import anyio
import httpx as httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ListRootsResult, Root

import aokun
from fakes import FakeEmbedder
from mcp_procs import REPO, child_env, free_port, serve_args, stop, wait_port, write_ini

DB_FACT = "This project's database is PostgreSQL 16."
TEA = "I prefer green tea over coffee."


@pytest.fixture
def anyio_backend():
    return "asyncio"


def git_folder(path):
    path.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "src").mkdir()
    return path


def test_project_of_is_the_repository_root_the_same_on_every_platform(tmp_path):
    repo = git_folder(tmp_path / "repo")
    assert aokun.project_of(str(repo / "src")) == repo.resolve().as_posix()
    assert aokun.project_of((repo / "src").as_uri()) == repo.resolve().as_posix()
    plain = tmp_path / "plain"
    plain.mkdir()
    assert aokun.project_of(str(plain) + "/") == plain.resolve().as_posix()
    assert aokun.project_of("C:\\Src\\App\\") == aokun.project_of("c:/Src/App") == "c:/Src/App"
    assert aokun.project_of("") == "" and aokun.project_of("aokun") == "aokun"
    assert aokun.within_project("C:\\Src\\App\\lib", "c:/Src/App")
    assert not aokun.within_project("/a/bc", "/a/b") and aokun.within_project("", "/a/b")


def test_personal_facts_are_global_and_work_facts_stay(open_mem, tmp_path):
    m = open_mem(tmp_path / "p.db")
    rules = m.rules
    for text in (TEA, "My sister Anna lives in Lyon.", "I live in Berlin.", "用户对花生过敏。",
                 "I feel stressed about the release.", "Zhang Wei's birthday is March 3.",
                 "Doudou needs a rabies shot next week.", "Dentist appointment on Dec 9 at 3pm.",
                 "张伟每天吃维生素D。", "Leo's swimming class moved to Sunday.",
                 "I go to pottery every Tuesday.", "Blood test results come back on Friday.",
                 "体检结果有异常，下周要复查。", "Booked a table for four at Nando's.",
                 "Train ticket to Leeds for the 21st."):  # no word of the work: every folder
        assert rules.personal_memory([text]), text
    for text in (DB_FACT, "The API server runs on port 8080.", "Deploy freeze starts Friday.",
                 "这个项目用 Rust 写。", "I prefer tabs in this repo.",
                 "The login endpoint times out under load.", "We moved the service to Go 1.22."):
        assert not rules.personal_memory([text]), text
    a = m.memorize(DB_FACT, project="/p/a")["id"]
    t = m.memorize(TEA, project="/p/a")["id"]
    named = m.memorize("Release train is weekly.", {"project": ""}, project="/p/a")["id"]
    other = m.memorize("The cache is Redis.", {"project": "/p/b/"}, project="/p/a")["id"]
    assert [m.get(i)["project"] for i in (a, t, named, other)] == ["/p/a", "", "", "/p/b"]
    m.edit(a, metadata={"project": ""})  # metadata.project overrides, also in an edit
    assert m.get(a)["project"] == ""
    with pytest.raises(aokun.InputError, match="scope"):
        m.recall("database", scope="nearby")


def test_recall_prefers_the_project_and_names_another(open_mem, tmp_path):
    m = open_mem(tmp_path / "r.db")
    pg = m.memorize(DB_FACT, project="/p/a")["id"]
    lite = m.memorize("The database is SQLite in one file.", project="/p/b")["id"]
    tea = m.memorize(TEA, project="/p/b")["id"]

    def ids(**kw):
        return [(h["id"], h.get("project")) for h in m.recall("database tea", **kw)["results"]]
    assert set(ids(project="/p/a")) == {(pg, None), (tea, None)}
    assert set(ids(project="/p/b")) == {(lite, None), (tea, None)}
    everything = ids(project="/p/b", scope="all")
    assert set(everything) == {(lite, None), (tea, None), (pg, "/p/a")}
    assert everything[-1] == (pg, "/p/a")  # another project's ranks below
    # nothing of the current project: another's answers, saying which
    hits = m.recall("database", project="/p/c", channels=["bm25"])["results"]
    assert {h["project"] for h in hits} == {"/p/a", "/p/b"}
    assert set(ids(scope="/p/a")) == set(ids(project="/p/a"))  # a folder named as the scope
    assert len(ids()) == 3  # no project known: as before


def test_briefing_and_conversations_per_project(open_mem, tmp_path):
    m = open_mem(tmp_path / "b.db")
    m.memorize(DB_FACT, {"importance": 0.9}, project="/p/a")
    m.memorize("The database is SQLite in one file.", {"importance": 0.9}, project="/p/b")
    m.memorize(TEA, project="/p/b")
    a, b = (m.memory_context(None, "project", project=p)["text"] for p in ("/p/a", "/p/b"))
    assert "PostgreSQL" in a and "SQLite" not in a and "green tea" in a
    assert "SQLite" in b and "PostgreSQL" not in b and "green tea" in b
    assert "PostgreSQL" in m.memory_context(None, "project")["text"]  # no project: all
    dynamic = m.memory_context("database", project="/p/a")["text"]
    assert "PostgreSQL" in dynamic and "SQLite" not in dynamic
    for sid, folder, text in (("s1", "/p/a/src", "the migration of the orders table failed"),
                              ("s2", "/p/b", "the migration of the users table failed")):
        path = tmp_path / f"{sid}.jsonl"
        path.write_text(json.dumps({
            "sessionId": sid, "cwd": folder, "type": "user", "uuid": sid + "-1",
            "message": {"role": "user", "content": text},
            "timestamp": "2026-03-02T11:00:00.000Z"}) + "\n", encoding="utf-8")
        assert m.ingest("claude-code", [path])["new"] == 1
    hits = m.conversation_search("migration failed", project="/p/a")["results"]
    assert [h["session_id"] for h in hits] == ["s1"]
    hits = m.conversation_search("migration failed", project="/p/a", scope="all")["results"]
    assert [h["session_id"] for h in hits] == ["s1", "s2"]


def test_export_import_and_sync_carry_the_project(open_mem, tmp_path):
    src = open_mem(tmp_path / "a.db")
    pg = src.memorize(DB_FACT, project="/p/a")["id"]
    tea = src.memorize(TEA, project="/p/a")["id"]
    records = {r["content"]: r for r in src.export_records() if r["kind"] == "memory"}
    assert records[DB_FACT]["project"] == "/p/a" and records[TEA]["project"] is None
    # a global memory hashes as on a device that knows no projects (nothing is sent again)
    older = {k: v for k, v in records[TEA].items() if k != "project"}
    assert aokun.sync_hash(records[TEA]) == aokun.sync_hash(older)
    dst = open_mem(tmp_path / "b.db")
    dst.import_export([json.dumps(r) for r in src.export_records()])
    got = {d["content"]: d["project"] for d in dst.rows("select content, project from documents")}
    assert got == {DB_FACT: "/p/a", TEA: ""}
    assert src.get(pg)["project"] == "/p/a" and src.get(tea)["project"] == ""


def make_server(tmp_path, segmenter):
    cfg = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path / "backups"),
                                        ("backup", "daily"): False,
                                        ("server", "exposed_tools"): "all"})

    def factory():
        m = aokun.Memory(tmp_path / "m.db", cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        return m
    return aokun.build_server(factory, cfg)


@pytest.mark.anyio
async def test_roots_decide_the_project_and_a_change_mid_session(tmp_path, segmenter):
    a, b = git_folder(tmp_path / "a"), git_folder(tmp_path / "b")
    roots = [a / "src"]
    asked = []

    async def list_roots(_ctx):
        asked.append(roots[0])
        return ListRootsResult(roots=[Root(uri=roots[0].as_uri())])

    async with Client(make_server(tmp_path, segmenter), mode="legacy",
                      list_roots_callback=list_roots) as c:
        pg = (await c.call_tool("memorize", {"content": DB_FACT})).structured_content["id"]
        tea = (await c.call_tool("memorize", {"content": TEA})).structured_content["id"]
        got = (await c.call_tool("get_memory", {"id": pg})).structured_content
        assert got["project"] == a.resolve().as_posix()
        assert (await c.call_tool("get_memory", {"id": tea})).structured_content["project"] == ""
        roots[0] = b
        await c.session.send_roots_list_changed()
        await anyio.sleep(0.2)
        lite = (await c.call_tool("memorize", {"content": "The database is SQLite in one file."})
                ).structured_content["id"]
        r = (await c.call_tool("recall", {"query": "database tea"})).structured_content
        assert {h["id"] for h in r["results"]} == {lite, tea}
        r = (await c.call_tool("recall", {"query": "database tea", "scope": "all"})
             ).structured_content
        assert {h["id"]: h.get("project") for h in r["results"]} == {
            lite: None, tea: None, pg: a.resolve().as_posix()}
    assert asked == [a / "src", b]  # once per session, again after the change


def stdio_params(db, ini, cwd):
    return StdioServerParameters(command=sys.executable, args=serve_args(db, ini), cwd=str(cwd),
                                 env=child_env())


@pytest.mark.slow
@pytest.mark.anyio
async def test_stdio_clients_launched_in_two_git_folders(tmp_path):
    db, ini = tmp_path / "s.db", write_ini(tmp_path, "none")
    a, b = git_folder(tmp_path / "a"), git_folder(tmp_path / "b")
    errlog = (tmp_path / "stderr.txt").open("w+", encoding="utf-8")
    briefings = {}
    with anyio.fail_after(120):
        async with Client(stdio_client(stdio_params(db, ini, a / "src"), errlog=errlog)) as c:
            await c.call_tool("memorize", {"content": DB_FACT})
            await c.call_tool("memorize", {"content": TEA})
            briefings["a"] = (await c.call_tool("memory_context", {})).structured_content["text"]
        async with Client(stdio_client(stdio_params(db, ini, b), errlog=errlog)) as c:
            r = (await c.call_tool("recall", {"query": "database"})).structured_content
            assert [h.get("project") for h in r["results"]] == [a.resolve().as_posix()]
            r = (await c.call_tool("recall", {"query": "tea"})).structured_content
            assert [h["text"] for h in r["results"]] == [TEA]  # personal: crosses
            await c.call_tool("memorize", {"content": "The database is SQLite in one file."})
            r = (await c.call_tool("recall", {"query": "database"})).structured_content
            assert [h["text"] for h in r["results"]] == ["The database is SQLite in one file."]
            r = (await c.call_tool("recall", {"query": "database tea", "scope": "all"})
                 ).structured_content
            assert len(r["results"]) == 3
            briefings["b"] = (await c.call_tool("memory_context", {})).structured_content["text"]
    assert "PostgreSQL" in briefings["a"] and "PostgreSQL" not in briefings["b"]
    assert "SQLite" in briefings["b"] and "green tea" in briefings["b"]
    errlog.seek(0)
    assert "Traceback" not in errlog.read()


@contextlib.contextmanager
def http_server(tmp_path):
    db, ini = tmp_path / "h.db", write_ini(tmp_path, "none")
    port = free_port()
    proc = subprocess.Popen([sys.executable, *serve_args(db, ini, "--http", "--port", str(port))],
                            cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.anyio
async def test_http_clients_name_their_project(tmp_path):
    async def session(url, headers=None):
        http = httpx2.AsyncClient(headers=headers or {}, timeout=30)
        return http, Client(streamable_http_client(url, http_client=http))

    with anyio.fail_after(120), http_server(tmp_path) as url:
        http, client = await session(url + "?project=/p/a")
        async with http, client as c:
            await c.call_tool("memorize", {"content": DB_FACT})
        http, client = await session(url, {"X-Aokun-Project": "/p/b"})
        async with http, client as c:
            await c.call_tool("memorize", {"content": "The database is SQLite in one file."})
            r = (await c.call_tool("recall", {"query": "database"})).structured_content
            assert [h["text"] for h in r["results"]] == ["The database is SQLite in one file."]
            r = (await c.call_tool("recall", {"query": "database", "scope": "/p/a"})
                 ).structured_content  # per call
            assert [h["text"] for h in r["results"]] == [DB_FACT]


def test_cli_recall_and_list_filter_by_project(tmp_path, monkeypatch, segmenter):
    from click.testing import CliRunner
    monkeypatch.setattr(aokun, "Segmenter", lambda *a, **k: segmenter)
    ini = write_ini(tmp_path, "none")
    db = tmp_path / "cli.db"
    a, b = git_folder(tmp_path / "a"), git_folder(tmp_path / "b")
    with aokun.Memory(db, aokun.Config(ini)) as m:
        m.memorize(DB_FACT, project=str(a))
        m.memorize("The database is SQLite in one file.", project=str(b))

    def run(*args):
        r = CliRunner().invoke(aokun.cli, ["--db", str(db), "--config", str(ini), *args],
                               catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output
    out = run("recall", "database", "--project", str(a / "src"))
    assert "PostgreSQL" in out and "SQLite" not in out
    assert "SQLite" in run("recall", "database") and "PostgreSQL" in run("recall", "database")
    monkeypatch.chdir(b)
    out = run("list", "--project", ".")
    assert "SQLite" in out and "PostgreSQL" not in out
