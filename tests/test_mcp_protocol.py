"""The MCP protocol beyond tools (issue 22 part 4), through a real SDK client over the 2025-06-18
handshake (mode="legacy"): logging/setLevel and the log notifications it opts in to, progress of
consolidate, completion/complete kept to one persona, the prompts, the entity and session resource
templates, and the capabilities advertised matching what works."""

import json
import threading
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError
from mcp.types import PromptReference, ResourceTemplateReference

import aokun
from fakes import FakeEmbedder

pytestmark = [pytest.mark.anyio,
              pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "conversations"
CLAUDE = FIXTURES / "claude-code" / "-home-dev-aokun" / "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f.jsonl"
CLAUDE_SESSION = "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f"
ENTITY_T = "memory://entities/{name}{?persona_id}"
SESSION_T = "memory://sessions/{session_id}{?persona_id}"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def server(tmp_path, segmenter):
    """An MCPServer over a database holding: Alice's memory and facts in the default persona,
    Alfred's fact and the Claude Code fixture session in persona p1."""
    db = tmp_path / "m.db"
    cfg = aokun.Config(None, overrides={("server", "exposed_tools"): "all",
                                        ("backup", "daily"): False,
                                        ("backup", "dir"): str(tmp_path / "backups")})

    def factory():
        m = aokun.Memory(db, cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        return m
    m = factory()
    m.memorize("Alice loves iced americano. She drinks it every morning.")
    m.memorize("Alice loves iced americano, she drinks it every morning.")
    m.kg_add("Alice", "lives_in", "Paris")
    m.kg_add("Albert", "works_at", "CERN")
    m.kg_add("Alfred", "lives_in", "Rome", persona_id="p1")
    m.ingest("claude-code", [CLAUDE], persona_id="p1")
    m.close()
    return aokun.build_server(factory, cfg)


async def test_capabilities_advertise_what_works_and_nothing_else(server):
    async with Client(server, mode="legacy") as c:
        caps = c.server_capabilities
        assert caps.logging is not None and caps.completions is not None
        assert caps.prompts is not None and caps.prompts.list_changed is False
        assert caps.resources.subscribe is False and caps.resources.list_changed is False
        assert caps.tools.list_changed is False
        await c.set_logging_level("warning")  # each advertised one answers
        assert (await c.list_prompts()).prompts
        refs = {t.uri_template for t in (await c.list_resource_templates()).resource_templates}
        assert refs == set(aokun.MCP_TEMPLATES)
        with pytest.raises(MCPError):
            await c.subscribe_resource("memory://briefing")
    async with Client(server) as c:  # 2026-07-28: the flags follow subscriptions/listen, not served
        caps = c.server_capabilities
        assert caps.resources.subscribe is False and caps.resources.list_changed is False
        assert caps.tools.list_changed is False and caps.prompts.list_changed is False


@pytest.mark.slow
async def test_set_level_sends_aokun_records_at_or_above_it_and_none_before(server, caplog):
    caplog.set_level(10, logger="aokun")  # what `serve` does with [server] log_level = DEBUG
    got = []

    async def on_log(params):
        got.append(params)

    def from_a_thread(level, msg):  # the background thread's records come from another thread
        t = threading.Thread(target=aokun.log.log, args=(level, msg))
        t.start()
        t.join()

    async with Client(server, mode="legacy", logging_callback=on_log) as c:
        from_a_thread(40, "before any setLevel")
        await anyio.sleep(0.2)
        assert got == []
        await c.set_logging_level("error")
        from_a_thread(30, "a warning, below error")
        from_a_thread(40, "back-fill failed: test")
        with anyio.fail_after(5):
            while not got:
                await anyio.sleep(0.02)
        await anyio.sleep(0.2)
        assert [(p.level, p.logger, p.data) for p in got] == \
            [("error", "aokun", "back-fill failed: test")]
        await c.set_logging_level("debug")
        from_a_thread(20, "an info line")
        with anyio.fail_after(5):
            while len(got) < 2:
                await anyio.sleep(0.02)
        assert (got[1].level, got[1].data) == ("info", "an info line")


@pytest.mark.slow
async def test_consolidate_reports_progress_to_a_progress_token(server):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total))

    async with Client(server, mode="legacy") as c:
        r = await c.call_tool("consolidate", {"dry_run": False}, progress_callback=on_progress)
        assert r.is_error is False and len(r.structured_content["clusters"]) == 1
        assert seen and seen[-1][0] == seen[-1][1] == 3  # 2 memories compared + 1 cluster merged
        assert [p for p, _ in seen] == sorted({p for p, _ in seen})  # strictly increasing
        seen.clear()
        r = await c.call_tool("refresh_briefing", {}, progress_callback=on_progress)
        assert r.is_error is False and seen[-1] == (2, 2)
        # no token: no progress, no error
        assert (await c.call_tool("consolidate", {})).is_error is False


async def values(c, ref, name, value, persona=None):
    r = await c.complete(ref, {"name": name, "value": value},
                         context_arguments={"persona_id": persona} if persona else None)
    return r.completion.values


@pytest.mark.slow
async def test_completion_values_stay_in_the_persona_asked(server):
    about = PromptReference(type="ref/prompt", name="remember_about")
    entity = ResourceTemplateReference(type="ref/resource", uri=ENTITY_T)
    session = ResourceTemplateReference(type="ref/resource", uri=SESSION_T)
    async with Client(server, mode="legacy") as c:
        assert await values(c, about, "persona_id", "") == ["", "p1"]
        assert await values(c, about, "persona_id", "P") == ["p1"]
        assert await values(c, entity, "name", "al") == ["Albert", "Alice"]  # not p1's Alfred
        assert await values(c, entity, "name", "al", "p1") == ["Alfred"]
        assert await values(c, entity, "name", "zz") == []
        assert await values(c, session, "session_id", "5b0c", "p1") == [CLAUDE_SESSION]
        assert await values(c, session, "session_id", "5b0c") == []  # the default persona has none
        other = PromptReference(type="ref/prompt", name="test_prompt_with_arguments")
        assert await values(c, other, "arg1", "t") == []


async def test_prompts_briefing_and_remember_about(server):
    async with Client(server, mode="legacy") as c:
        brief = (await c.get_prompt("session_briefing", {})).messages[0].content.text
        assert "# Memory briefing" in brief and "Alice lives_in Paris" in brief
        about = (await c.get_prompt("remember_about", {"topic": "Alice"})).messages[0].content.text
        assert "iced americano" in about and "- Alice lives_in Paris" in about
        prompt = await c.get_prompt("remember_about", {"topic": "Alice", "persona_id": "p1"})
        p1 = prompt.messages[0].content.text
        assert "iced americano" not in p1 and "(none recorded)" in p1
        with pytest.raises(MCPError, match="topic"):
            await c.get_prompt("remember_about", {"topic": "  "})


async def test_entity_and_session_templates(server):
    async with Client(server, mode="legacy") as c:
        r = await c.read_resource("memory://entities/Alice")
        facts = json.loads(r.contents[0].text)["facts"]
        assert [(f["subject"], f["predicate"], f["object"]) for f in facts] == \
            [("Alice", "lives_in", "Paris")]
        with pytest.raises(MCPError):
            await c.read_resource("memory://entities/Alfred")  # p1's, not the default persona's
        r = await c.read_resource("memory://entities/Alfred?persona_id=p1")
        assert json.loads(r.contents[0].text)["facts"][0]["object"] == "Rome"
        r = await c.read_resource(f"memory://sessions/{CLAUDE_SESSION}?persona_id=p1")
        assert json.loads(r.contents[0].text)["session"]["session_id"] == CLAUDE_SESSION
