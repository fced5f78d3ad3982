"""Hostile requests (issue 33, items 4-6): an argument a tool does not take is refused with the
closest it takes, a 200,000-character value comes back in an error as a short prefix only, and a
request nested 500 levels deep over stdio gets a one-line error for its id."""

import json

import pytest
from mcp import Client, MCPError
from test_mcp_stdio import RawServer, assert_only_jsonrpc

import aokun
from fakes import FakeEmbedder
from mcp_procs import child_env, cli, write_ini

pytestmark = pytest.mark.anyio

BIG = "2026-01-0" + "x" * 200_000  # looks like a time, a mode, a name… for its first characters


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def server(tmp_path, segmenter):
    cfg = aokun.Config(None, overrides={("server", "exposed_tools"): "all",
                                        ("backup", "dir"): str(tmp_path / "backups"),
                                        ("backup", "daily"): False})

    def factory():
        m = aokun.Memory(tmp_path / "h.db", cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        return m
    return aokun.build_server(factory, cfg)


async def refused(c, tool, args) -> str:
    r = await c.call_tool(tool, args)
    assert r.is_error is True, (tool, list(args))
    (text,) = [x.text for x in r.content]
    assert "\n" not in text and "Traceback" not in text
    return text


# item 4: unknown arguments ----------------------------------------------------------------------

async def test_an_unknown_argument_is_refused_with_the_closest_known_one(server):
    async with Client(server) as c:
        await c.call_tool("memorize", {"content": "Alice likes green tea."})
        assert await refused(c, "recall", {"query": "tea", "persona": "p2"}) == \
            "recall: unknown argument 'persona'; did you mean 'persona_id'?"
        assert await refused(c, "recall", {"query": "tea", "k": 3}) == \
            "recall: unknown argument 'k'; did you mean 'limit'?"
        assert await refused(c, "memory_stats", {"verbose": True}) == \
            "memory_stats: unknown argument 'verbose'; it takes none"
        text = await refused(c, "get_memory", {"id": 1, "zzz": 1})
        assert text == "get_memory: unknown argument 'zzz'; it takes id, persona_id"
        # every tool, not one by one: the check is in one place
        for t in (await c.list_tools()).tools:
            text = await refused(c, t.name, {"persona_idd": "x"})
            assert text.startswith(f"{t.name}: unknown argument 'persona_idd'"), text
        # the known ones still work, and nothing was stored by the refused calls
        r = await c.call_tool("recall", {"query": "green tea", "limit": 1})
        assert r.is_error is False and len(r.structured_content["results"]) == 1


async def test_a_prompt_refuses_an_unknown_argument_in_one_line(server):
    async with Client(server) as c:
        with pytest.raises(MCPError) as e:
            await c.get_prompt("session_briefing", {"topic": "x"})
    assert str(e.value) == "session_briefing: unknown argument 'topic'; it takes persona_id"
    async with Client(server) as c:  # a missing one: the SDK logged a traceback, error code 0
        with pytest.raises(MCPError) as e:
            await c.get_prompt("remember_about", {})
    assert str(e.value) == "remember_about: topic is required" and e.value.error.code == -32602
    async with Client(server) as c:
        with pytest.raises(MCPError) as e:
            await c.get_prompt("x" * 5000, {})
    assert str(e.value) == "x" * 60 + ": no such prompt; there are session_briefing, remember_about"


# item 5: inputs echoed as a short prefix ----------------------------------------------------------

async def test_a_200000_character_value_comes_back_as_a_short_prefix(server):
    """Every argument of every tool, given a 200,000-character string, a list of one, an object
    with one and an object with a 200,000-character key: an error's text stays short."""
    base = {"query": "Alice tea", "id": 1, "content": "Alice", "entity": "Alice",
            "subject": "Alice", "predicate": "likes", "object": "tea", "conversation": "hi",
            "ids": [1], "useful": True, "importance": 0.5, "session_id": "s"}
    seen = set()
    async with Client(server) as c:
        await c.call_tool("memorize", {"content": "Alice likes green tea."})
        for t in (await c.list_tools()).tools:
            props = t.input_schema.get("properties", {})
            args0 = {k: v for k, v in base.items() if k in props}
            for name in props:
                for big in (BIG, [BIG], {"a": BIG}, {"k" * 200_000: 1}):
                    r = await c.call_tool(t.name, {**args0, name: big})
                    if r.is_error:
                        text = r.content[0].text
                        assert len(text) < 400, (t.name, name, text[:300])
                        seen.add(t.name + "." + name)
        with pytest.raises(MCPError) as e:
            await c.read_resource("memory://entities/" + "x" * 200_000)
        assert len(str(e.value)) < 200
    # the values the issue named were refused (and their echo cut), not accepted
    assert {"recall.as_of", "kg_query.as_of", "memory_context.mode",
            "conversation_search.since", "edit_memory.metadata"} <= seen


async def test_a_search_text_over_10000_characters_is_refused_at_once(server):
    """A 2,000,000-character query took minutes to rank: every search refuses it in one line."""
    async with Client(server) as c:
        for tool in ("recall", "conversation_search", "search_atoms"):
            text = await refused(c, tool, {"query": "tea " * 2_501})
            assert text.endswith("query: at most 10,000 characters, got 10,003"), text
        assert (await c.call_tool("recall", {"query": "tea " * 2_500})).is_error is False


def test_the_cli_echoes_a_short_prefix_too(tmp_path):
    from mcp_procs import cli
    ini = write_ini(tmp_path, "none")
    # one argument of a command line holds at most 128 KiB
    r = cli(tmp_path / "c.db", ini, "recall", "tea", "--as-of", BIG[:100_000])
    assert r.returncode != 0 and "as_of" in r.stderr + r.stdout
    error = [x for x in r.stderr.splitlines() if "created a new database" not in x]
    assert len("".join(error)) < 400 and "Traceback" not in r.stderr


def test_echo_cuts_what_it_shows():
    assert aokun.echo("tea") == "'tea'"
    shown = aokun.echo(BIG)
    assert len(shown) == aokun.ECHO_CHARS and shown.startswith("'2026-01-0x") and \
        shown.endswith("…")
    assert aokun.echo("a" * 500, quote=False) == "a" * (aokun.ECHO_CHARS - 1) + "…"


# item 6: deep nesting over stdio ------------------------------------------------------------------

def nested(depth: int) -> str:
    return '{"a":' * depth + '"x"' + "}" * depth


@pytest.mark.slow
def test_deeply_nested_metadata_over_stdio_gets_a_one_line_error_for_its_id(tmp_path):
    db, ini = tmp_path / "deep.db", write_ini(tmp_path, "none")
    s = RawServer(db, ini, child_env())
    try:
        s.initialize()
        for i, depth in enumerate((500, 100_000), start=1):
            s.send('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"memorize",'
                   '"arguments":{"content":"deep","metadata":{"topics":%s}}}}' % (i, nested(depth)))
            error = s.reply(i, timeout=20)["error"]
            assert error["code"] == -32600 and "\n" not in error["message"]
            assert "deeper than 64 levels" in error["message"]
        s.send("this is not JSON {")  # JSON-RPC: a parse error is answered with id null
        error = s.reply(None, timeout=20)["error"]
        assert error["code"] == -32700 and "not JSON" in error["message"]
        s.send("[" * 100 + "]" * 100)  # too deep, not even an object: Invalid Request, id null
        error = s.reply(None, timeout=20)["error"]
        assert error["code"] == -32600 and "deeper than 64" in error["message"]
        # a notification that deep is dropped; brackets inside strings do not count
        s.send('{"jsonrpc":"2.0","method":"notifications/x","params":%s}' % nested(300))
        text = "[[[{{{" * 100
        ok = s.call(3, "memorize", {"content": f"Brackets {text} stay text.",
                                    "metadata": {"topics": [nested(3)]}})
        assert ok["isError"] is False, ok
        got = s.call(4, "get_memory", {"id": ok["structuredContent"]["id"]})
        assert text in got["structuredContent"]["content"]
    finally:
        rc = s.close()
    assert rc == 0
    assert_only_jsonrpc(s.lines)


def test_json_within_cuts_below_a_depth_and_skips_strings():
    t = '{"a":"[[{{","b":[1,[2,[3]]],"c":{"d":{"e":1}}}'
    assert json.loads(aokun.json_within(t, 1)) == {"a": "[[{{", "b": None, "c": None}
    assert json.loads(aokun.json_within(t, 2)) == {"a": "[[{{", "b": [1, None],
                                                   "c": {"d": None}}
    assert aokun.json_within(t, 4) is t


def test_a_timestamp_in_the_future_is_refused(open_mem, tmp_path):
    """A memory dated 3026 would top every recent list and the briefing forever."""
    m = open_mem(tmp_path / "f.db")
    with pytest.raises(aokun.InputError, match=r"^metadata\.timestamp: .* is in the future"):
        m.memorize("x", {"timestamp": "3026-01-01T00:00:00Z"})
    assert m.stats()["counts"]["documents"] == 0
    tomorrow = (aokun.now() + aokun.dt.timedelta(hours=20)).isoformat()
    assert m.memorize("clock skew", {"timestamp": tomorrow})["status"] == "done"


def test_a_timestamp_of_year_one_is_stored_or_refused_in_one_line(open_mem, tmp_path):
    """0001-01-01 was written as "1-01-01T…" (strftime), which no read could parse: the write
    failed in its pipeline and doctor named a failed journal row from then on."""
    m = open_mem(tmp_path / "y.db")
    assert m.memorize("an old note", {"timestamp": "0001-01-01"})["status"] == "done"
    assert m.list_memories(5, 0, "", None, False)[0]["created_at"] == "0001-01-01T00:00:00Z"
    with pytest.raises(aokun.InputError, match=r"^metadata\.timestamp: expected an ISO-8601"):
        m.memorize("y", {"timestamp": "0001-01-01T00:00:00+08:00"})  # year 0 in UTC
    assert m.doctor() == []


def test_the_cli_shows_a_memorys_control_characters_not_their_effect(tmp_path):
    """A memory may come from a transcript or another device: its escape sequences (a window
    title, a hyperlink, a C1 CSI), bell and carriage return reach the terminal as U+FFFD, never as
    commands; --json and export keep the text as stored."""
    ini, db = write_ini(tmp_path), tmp_path / "a.db"
    evil = "Evil \x1b]0;PWNED\x07 t \x9b31m \x1b]8;;http://x.example/\x1b\\link\r over tea"
    assert cli(db, ini, "memorize", evil).returncode == 0
    for args in (["list"], ["show", "1"], ["recall", "evil tea"], ["context"]):
        out = cli(db, ini, *args)
        assert out.returncode == 0 and "Evil" in out.stdout, (args, out.stderr)
        assert not any(c in out.stdout for c in "\x1b\x07\r\x9b"), (args, out.stdout)
    assert json.loads(cli(db, ini, "show", "1", "--json").stdout)["content"] == evil
