"""The MCP server in-process (SDK v2 `Client(server)`): every tool's structured result, exposure,
annotations, resources, argument validation naming the field, null/omitted optionals, Unicode,
big content, cache invalidation by writes, archived memories and explainable recall."""

import json
import re
import unicodedata

import anyio
import pytest
from mcp import Client, MCPError

import aokun
from fakes import FakeEmbedder

pytestmark = pytest.mark.anyio

ALL_TOOLS = ["memorize", "recall", "search_atoms", "list_memories", "get_memory", "edit_memory",
             "delete_memory", "pin_memory", "unpin_memory", "archive_memory", "memory_stats"]
DEFAULT_TOOLS = ["memorize", "recall", "memory_feedback", "get_memory", "edit_memory",
                 "delete_memory", "memory_context", "conversation_search",
                 "conversation_get_session"]
READ_ONLY = {"recall", "search_atoms", "list_memories", "get_memory", "memory_stats"}
DESTRUCTIVE = {"edit_memory", "delete_memory"}

ALICE = "Alice loves iced americano. She drinks it every morning."
BOB = "Bob is learning the cello and practises on Sundays."
CAROL = "Carol moved to Lisbon in March to work on solar panels."


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def db(tmp_path):
    return tmp_path / "m.db"


@pytest.fixture
def cfg_for(tmp_path):
    """cfg_for(exposed="all", more={(section, key): value}) -> Config without a file. Backups go to
    tmp_path, never beside aokun.py, and the server's startup daily backup is off: it races tool
    calls (test_tool_calls_during_an_online_backup)."""
    def make(exposed="all", more=None):
        return aokun.Config(None, overrides={("server", "exposed_tools"): exposed,
                                             ("backup", "dir"): str(tmp_path / "backups"),
                                             ("backup", "daily"): False,
                                             **(more or {})})
    return make


@pytest.fixture
def make_server(db, segmenter, cfg_for):
    """make_server(cfg=None) -> MCPServer over a Memory on `db` with the fake 16-d embedder (the
    session's loaded jieba is shared so each lifespan does not reload it)."""
    def make(cfg=None):
        cfg = cfg or cfg_for()

        def factory():
            m = aokun.Memory(db, cfg, embedder=FakeEmbedder(16))
            m.seg = segmenter
            return m
        return aokun.build_server(factory, cfg)
    return make


@pytest.fixture
async def client(make_server):
    async with Client(make_server()) as c:
        yield c


def assert_lean_view(text_value, full, path="$"):
    """`text_value` (the parsed text content) shows only what `full` (the structured content) has,
    with no null or empty field and floats rounded to 3 decimals."""
    if isinstance(text_value, dict):
        assert isinstance(full, dict), path
        for key, v in text_value.items():
            assert key in full, f"{path}.{key} is not in the structured content"
            assert v is not None and v not in ("", [], {}), f"{path}.{key} = {v!r}"
            assert_lean_view(v, full[key], f"{path}.{key}")
    elif isinstance(text_value, list):
        assert isinstance(full, list) and len(text_value) == len(full), path
        for i, (a, b) in enumerate(zip(text_value, full, strict=True)):
            assert_lean_view(a, b, f"{path}[{i}]")
    elif isinstance(text_value, float):
        assert text_value == round(text_value, 3) and text_value == round(full, 3), path
    else:
        assert text_value == full, path


async def ok(client, tool, args=None) -> dict:
    r = await client.call_tool(tool, args or {})
    assert r.is_error is False, f"{tool}({args}) failed: {r.content[0].text if r.content else r}"
    assert isinstance(r.structured_content, dict)
    # the text block is compact JSON (no indentation) showing the structured content leanly
    text = r.content[0].text
    shown = json.loads(text)
    assert text == json.dumps(shown, ensure_ascii=False, separators=(",", ":"))
    assert_lean_view(shown, r.structured_content)
    return r.structured_content


async def err(client, tool, args) -> str:
    r = await client.call_tool(tool, args)
    assert r.is_error is True, f"{tool}({args}) should fail, got {r.structured_content}"
    assert r.structured_content is None
    return r.content[0].text


async def counts(client) -> tuple[int, int]:
    """(documents, journal rows) as memory_stats reports them."""
    s = await ok(client, "memory_stats")
    return s["counts"]["documents"], sum(s["journal"].values())


def keyword_ids(recall_result: dict) -> list[int]:
    """Ids of the hits the BM25 channel found (the vector channel returns nearest neighbours of
    anything, so 'not found' is a keyword question)."""
    return [h["id"] for h in recall_result["results"] if "bm25" in h["channels"]]


def names_field(message: str, field: str) -> bool:
    return re.search(rf"(?<![\w]){re.escape(field)}(?![\w])", message) is not None


# exposure, descriptions, annotations ------------------------------------------------------------

async def test_default_exposure_is_exactly_the_frequent_tools(make_server, tmp_path):
    assert aokun.DEFAULT_TOOLS == tuple(DEFAULT_TOOLS)
    cfg = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path)})
    async with Client(make_server(cfg)) as c:
        names = [t.name for t in (await c.list_tools()).tools]
    assert sorted(names) == sorted(DEFAULT_TOOLS) and len(names) == 9


def test_example_ini_names_every_tool_and_the_default_set():
    text = (aokun.HERE / "aokun.example.ini").read_text(encoding="utf-8")
    server = text[text.index("[server]"):text.index("exposed_tools =")]
    listed = re.findall(r"[a-z_]+", server.split("Available:")[1].replace(";", " "))
    assert listed == list(aokun.MCP_TOOLS)
    example = aokun.Config(aokun.HERE / "aokun.example.ini")
    assert aokun.exposed_tools(example, aokun.MCP_TOOLS) == DEFAULT_TOOLS


async def test_all_exposes_every_tool(client):
    names = [t.name for t in (await client.list_tools()).tools]
    assert set(ALL_TOOLS) <= set(names) and len(names) == len(set(names))


async def test_exposed_tools_comma_list_and_unknown_name(make_server, cfg_for):
    async with Client(make_server(cfg_for(" recall , memory_stats "))) as c:
        assert sorted(t.name for t in (await c.list_tools()).tools) == ["memory_stats", "recall"]
    with pytest.raises(aokun.AokunError, match="forget_everything"):
        make_server(cfg_for("recall, forget_everything"))


async def test_every_tool_has_description_annotations_and_schemas(client):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(ALL_TOOLS) <= set(tools)
    for name, t in tools.items():
        assert t.description and len(t.description) >= 10, name
        assert t.description.strip() == t.description, name
        a = t.annotations
        assert a is not None, name
        # only hints that differ from the spec's defaults are sent
        spec_defaults = {"read_only_hint": False, "destructive_hint": True,
                         "idempotent_hint": False, "open_world_hint": True}
        for hint, default in spec_defaults.items():
            assert getattr(a, hint) in (None, not default), (name, hint)
        hints = {h: d if getattr(a, h) is None else getattr(a, h) for h, d in spec_defaults.items()}
        if name in ALL_TOOLS:  # local tools: no outside world
            assert hints["open_world_hint"] is False, name
            assert hints["read_only_hint"] is (name in READ_ONLY), name
            if name not in READ_ONLY:
                assert hints["destructive_hint"] is (name in DESTRUCTIVE), name
        assert t.output_schema and t.output_schema.get("type") == "object", name
        assert t.input_schema.get("type") == "object", name
    assert tools["memorize"].input_schema["required"] == ["content"]
    assert tools["recall"].input_schema["required"] == ["query"]
    for name in ("get_memory", "delete_memory", "pin_memory", "unpin_memory", "archive_memory"):
        assert tools[name].input_schema["required"] == ["id"], name


async def test_server_info_and_instructions(client):
    assert client.server_info.name == "aokun"
    assert client.server_info.version == aokun.__version__
    assert "recall" in client.instructions and "memorize" in client.instructions


# what the assistant pays for: the tool list and the answers ---------------------------------------

def tools_list_chars(tools) -> int:
    """Characters of tools/list's tools as json.dumps writes them (with its default ", " and ": ",
    so a little more than the compact JSON the transports send)."""
    return len(json.dumps([t.model_dump(by_alias=True, exclude_none=True, mode="json")
                           for t in tools], ensure_ascii=False))


async def test_tools_list_fits_the_schema_budget(make_server, cfg_for, tmp_path):
    cfg = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path)})
    async with Client(make_server(cfg)) as c:
        default = (await c.list_tools()).tools
    async with Client(make_server(cfg_for("all"))) as c:
        every = (await c.list_tools()).tools
    print(f"tools/list characters: default {tools_list_chars(default)}, all "
          f"{tools_list_chars(every)}")  # the README's figure, with -s
    assert "memory_context" in {t.name for t in default}
    assert tools_list_chars(default) <= 12_000, tools_list_chars(default)
    assert tools_list_chars(every) <= 30_000, tools_list_chars(every)
    for t in every:  # one or two sentences; no pydantic titles or null defaults in the schemas
        assert len(t.description) <= 220 and "\n" not in t.description, t.name
        sent = json.dumps([t.input_schema, t.output_schema])
        assert '"title"' not in sent.replace('"title": {"type": "string"}', ""), t.name
        assert '"default": null' not in sent, t.name


def non_text_chars(hit: dict) -> int:
    return len(json.dumps({k: v for k, v in hit.items() if k not in ("text", "summary")},
                          ensure_ascii=False, separators=(",", ":")))


async def test_a_recall_hit_costs_little_beyond_its_text(client):
    meta = {"session_id": "5f0c6a8e-2b1d-4a57-9c3e-0d1e2f3a4b5c",
            "topics": ["coffee", "mornings", "cafés"],
            "participants": ["Alice", "Bob"], "source": "chat", "tags": ["food"], "importance": 0.8,
            "summary": "Alice's coffee."}
    await ok(client, "memorize", {"content": "Alice loves iced americano every morning.",
                                  "metadata": meta})
    await ok(client, "memorize", {"content": "Bob drinks his coffee black.",
                                  "metadata": {"importance": 0.3}})
    r = await client.call_tool("recall", {"query": "coffee Alice Bob", "limit": 5})
    hits = json.loads(r.content[0].text)["results"]
    assert len(hits) == 2
    for hit in hits:
        assert non_text_chars(hit) <= 150, hit
        assert "persona_id" not in hit and "channels" not in hit and "truncated" not in hit
    full = r.structured_content["results"]
    session = meta["session_id"]
    assert full[0]["session_id"] == session or full[1]["session_id"] == session
    assert all(isinstance(h["score"], float) and h["score"] == round(h["score"], 3) for h in full)
    answer = await client.call_tool("recall", {"query": "coffee", "explain": True})
    explained = json.loads(answer.content[0].text)
    assert "channels" in explained["results"][0] and "explain" in explained["results"][0]


#: one call of every tool (in order: later calls use what earlier ones stored); summarize_memory
#: needs a chat model and is called for its error
EVERY_TOOL = [
    ("memorize", {"content": "Alice moved to Lisbon in March 2026. She loves iced americano.",
                  "metadata": {"participants": ["Alice"], "key_facts": ["Alice lives in Lisbon"]}}),
    ("memorize", {"content": "Bob plays the cello on Sundays."}),
    ("recall", {"query": "Where does Alice live?", "explain": True}),
    ("memory_feedback", {"ids": [1]}),
    ("search_atoms", {"query": "Alice Lisbon"}),
    ("list_memories", {}),
    ("get_memory", {"id": 1}),
    ("edit_memory", {"id": 2, "content": "Bob plays the cello on Sundays and Mondays."}),
    ("pin_memory", {"id": 1}),
    ("unpin_memory", {"id": 1}),
    ("archive_memory", {"id": 2}),
    ("restore_memory", {"id": 2}),
    ("set_importance", {"id": 2, "importance": 0.7}),
    ("forget_preview", {"days": 400}),
    ("memory_stats", {}),
    ("memory_context", {}),
    ("memory_context", {"topic": "Alice"}),
    ("refresh_briefing", {}),
    ("consolidate", {}),
    ("kg_add", {"subject": "Alice", "predicate": "lives_in", "object": "Lisbon"}),
    ("kg_add", {"subject": "Alice", "predicate": "lives_in", "object": "Porto"}),
    ("kg_query", {"entity": "Alice"}),
    ("kg_invalidate", {"id": 2}),
    ("kg_timeline", {"entity": "Alice"}),
    ("kg_stats", {}),
    ("conversation_search", {"query": "cello"}),
    ("conversation_get_session", {"session_id": "no-such-session"}),
    ("conversation_stats", {}),
    ("kg_delete_entity", {"entity": "Alice"}),
    ("delete_memory", {"id": 2}),
]


@pytest.mark.slow
async def test_every_tool_answers_compact_text(client):
    assert {t for t, _ in EVERY_TOOL} | {"summarize_memory"} == set(aokun.MCP_TOOLS)
    for tool, args in EVERY_TOOL:
        r = await client.call_tool(tool, args)
        text = r.content[0].text
        if r.is_error:  # an expected refusal is one line
            assert tool == "conversation_get_session" and "\n" not in text, (tool, text)
            continue
        shown = json.loads(text)
        assert text == json.dumps(shown, ensure_ascii=False, separators=(",", ":")), tool
        assert_lean_view(shown, r.structured_content, tool)
        assert not re.search(r"\d\.\d{4,}", text), (tool, text)  # floats at most 3 decimals
    r = await client.call_tool("summarize_memory", {"conversation": "user: hi"})
    assert r.is_error and "\n" not in r.content[0].text and "Traceback" not in r.content[0].text


# every tool, happy path --------------------------------------------------------------------------

async def test_memorize_returns_write_result_and_deduplicates(client):
    r = await ok(client, "memorize", {"content": ALICE, "metadata": {
        "participants": ["Alice"], "topics": ["coffee"], "importance": 0.8, "session_id": "s1",
        "key_facts": ["Alice loves iced americano"], "tags": ["drink"], "source": "chat",
        "summary": "Alice's coffee",
        "sentiment": "positive", "timestamp": "2026-03-01T10:00:00+08:00", "pinned": False}})
    assert r["id"] == 1 and r["status"] == "done" and r["deduplicated"] is False
    assert r["embedding"] == "done" and r["embedding_truncated"] is False and r["warnings"] == []
    assert r["atoms"] == 1 and r["graph_entries"] >= 1 and re.fullmatch(r"[0-9a-f-]{36}", r["uid"])
    again = await ok(client, "memorize", {"content": ALICE})
    assert (again["id"], again["uid"], again["deduplicated"]) == (1, r["uid"], True)
    assert (await counts(client))[0] == 1


async def test_memorize_repeat_restores_an_archived_memory_and_merges_metadata(client):
    a = await ok(client, "memorize", {"content": ALICE, "metadata": {"topics": ["coffee"]}})
    assert a["changed"] == {}
    await ok(client, "archive_memory", {"id": a["id"]})
    r = await ok(client, "memorize", {"content": ALICE})
    assert (r["id"], r["deduplicated"], r["changed"]) == \
        (a["id"], True, {"archived": [True, False]})
    assert r["warnings"] == [f"memory {a['id']} was archived; memorizing it again restored it to "
                             f"recall (archive_memory({a['id']}) archives it again)"]
    assert keyword_ids(await ok(client, "recall", {"query": "americano"})) == [a["id"]]
    r = await ok(client, "memorize", {"content": ALICE,
                                      "metadata": {"topics": ["barista"], "importance": 0.9}})
    assert r["changed"] == {"topics": [["coffee"], ["coffee", "barista"]], "importance": [0.5, 0.9]}
    assert r["warnings"] == [f"memory {a['id']} already held this text; the repeat's metadata was "
                             "merged into it (topics, importance changed)"]
    assert keyword_ids(await ok(client, "recall", {"query": "barista"})) == [a["id"]]
    plain = await ok(client, "memorize", {"content": ALICE})
    assert (plain["deduplicated"], plain["warnings"], plain["changed"]) == (True, [], {})
    assert (await counts(client))[0] == 1


@pytest.mark.slow
async def test_recall_finds_the_right_memory(client):
    ids = {}
    for text in (ALICE, BOB, CAROL):
        w = await ok(client, "memorize", {"content": text,
                                          "metadata": {"participants": [text.split()[0]]}})
        ids[text] = w["id"]
    r = await ok(client, "recall", {"query": "cello", "limit": 3})
    assert r["results"] and r["results"][0]["id"] == ids[BOB]
    hit = r["results"][0]
    assert hit["text"] == BOB and hit["truncated"] is False
    assert hit["participants"] == ["Bob"] and hit["archived"] is False
    assert "bm25" in hit["channels"] and hit["score"] > 0 and hit["explain"] is None
    assert r["degraded"] == [] and r["cached"] is False and r["took_ms"] >= 0
    assert len(r["results"]) <= 3
    assert all(h["id"] != ids[CAROL] for h in r["results"][:1])


async def test_search_atoms_finds_a_fact(client):
    doc = await ok(client, "memorize", {"content": ALICE,
                                        "metadata": {"key_facts": ["Alice prefers oat milk"]}})
    r = await ok(client, "search_atoms", {"query": "oat milk", "limit": 5})
    assert len(r["results"]) == 1
    a = r["results"][0]
    assert a["document_id"] == doc["id"] and a["content"] == "Alice prefers oat milk"
    assert 0 < a["score"] <= 1 and 0 < a["ttl_factor"] <= 1 and a["atom_type"] in aokun.ATOM_TYPES
    assert (await ok(client, "search_atoms", {"query": "helicopter"}))["results"] == []


async def test_list_memories_newest_first_with_limit_and_offset(client):
    for i, text in enumerate((ALICE, BOB, CAROL)):
        await ok(client, "memorize", {"content": text,
                                      "metadata": {"timestamp": f"2026-01-0{i + 1}T00:00:00Z"}})
    r = await ok(client, "list_memories")
    assert [m["content"] for m in r["memories"]] == [CAROL, BOB, ALICE]
    page = await ok(client, "list_memories", {"limit": 1, "offset": 1})
    assert [m["content"] for m in page["memories"]] == [BOB]
    assert set(page["memories"][0]) >= {"id", "uid", "created_at", "pinned", "archived",
                                        "importance"}


async def test_get_memory_in_full(client):
    w = await ok(client, "memorize", {"content": ALICE, "metadata": {
        "participants": ["Alice"], "topics": ["coffee"], "tags": ["t1"], "importance": 0.9}})
    d = await ok(client, "get_memory", {"id": w["id"]})
    assert d["id"] == w["id"] and d["uid"] == w["uid"] and d["content"] == ALICE
    assert d["participants"] == ["Alice"] and d["topics"] == ["coffee"] and d["tags"] == ["t1"]
    assert d["importance"] == 0.9 and d["pinned"] is False and d["archived"] is False
    assert d["embedding_state"] == "done"
    assert len(d["atoms"]) == w["atoms"] == 2 and all("content" in a for a in d["atoms"])
    assert len(d["graph_entries"]) == w["graph_entries"]


async def test_edit_memory_replaces_what_is_searchable(client):
    w = await ok(client, "memorize", {"content": ALICE})
    found = await ok(client, "recall", {"query": "americano"})
    assert [h["id"] for h in found["results"]] == [w["id"]]
    e = await ok(client, "edit_memory", {"id": w["id"], "content": "Alice switched to green tea.",
                                         "metadata": {"importance": 0.7}})
    assert e["id"] == w["id"] and e["status"] == "done" and e["deduplicated"] is False
    assert keyword_ids(await ok(client, "recall", {"query": "americano"})) == []
    assert keyword_ids(await ok(client, "recall", {"query": "green tea"})) == [w["id"]]
    assert (await ok(client, "search_atoms", {"query": "americano"}))["results"] == []
    d = await ok(client, "get_memory", {"id": w["id"]})
    assert d["content"] == "Alice switched to green tea." and d["importance"] == 0.7
    # metadata only
    await ok(client, "edit_memory", {"id": w["id"], "metadata": {"summary": "tea now"}})
    assert (await ok(client, "get_memory", {"id": w["id"]}))["summary"] == "tea now"
    # nothing to change
    assert names_field(await err(client, "edit_memory", {"id": w["id"]}), "content")


async def test_delete_memory_forgets_everywhere(client):
    w = await ok(client, "memorize", {"content": ALICE})
    await ok(client, "memorize", {"content": BOB})
    d = await ok(client, "delete_memory", {"id": w["id"]})
    assert d == {"id": w["id"], "uid": w["uid"], "deleted": True}
    found = await ok(client, "recall", {"query": "americano"})
    assert all(h["id"] != w["id"] for h in found["results"])
    assert (await ok(client, "search_atoms", {"query": "americano"}))["results"] == []
    assert "no memory with id" in await err(client, "get_memory", {"id": w["id"]})
    assert "no memory with id" in await err(client, "delete_memory", {"id": w["id"]})
    s = await ok(client, "memory_stats")
    assert s["counts"]["documents"] == 1 and s["counts"]["tombstones"] == 1


async def test_pin_and_unpin(client):
    w = await ok(client, "memorize", {"content": ALICE})
    assert await ok(client, "pin_memory", {"id": w["id"]}) == \
        {"id": w["id"], "uid": w["uid"], "pinned": True, "archived": None}
    assert (await ok(client, "get_memory", {"id": w["id"]}))["pinned"] is True
    assert (await ok(client, "memory_stats"))["counts"]["pinned"] == 1
    assert (await ok(client, "unpin_memory", {"id": w["id"]}))["pinned"] is False
    assert (await ok(client, "get_memory", {"id": w["id"]}))["pinned"] is False
    assert "no memory with id 42" in await err(client, "pin_memory", {"id": 42})


async def test_memory_feedback_ranks_a_used_memory_above_an_equal_one(db, segmenter, cfg_for):
    """Two memories the keyword channels score alike (no embedder: min-max over two KNN
    neighbours would set them apart); feedback on the one ranked second puts it first (the write
    empties the cache)."""
    cfg = cfg_for(more={("embedding", "provider"): "none"})

    def factory():
        m = aokun.Memory(db, cfg)
        m.seg = segmenter
        return m
    async with Client(aokun.build_server(factory, cfg)) as client:
        t = {t.name: t for t in (await client.list_tools()).tools}["memory_feedback"]
        assert "ids of recalled memories you used" in t.description
        assert t.input_schema["required"] == ["ids"]
        # spec default: false
        assert not t.annotations.idempotent_hint and not t.annotations.read_only_hint
        assert t.annotations.destructive_hint is False and t.annotations.open_world_hint is False
        assert "memory_feedback" in client.instructions
        w = {(await ok(client, "memorize", {"content": text}))["id"]: text
             for text in ("Nadia grows jasmine tea in her garden",
                          "Omar grows jasmine tea in his garden")}
        first = (await ok(client, "recall", {"query": "jasmine tea garden", "limit": 2}))["results"]
        assert first[0]["score"] == pytest.approx(first[1]["score"], abs=1e-6)
        top, used = first[0]["id"], first[1]["id"]
        out = await ok(client, "memory_feedback", {"ids": [used]})
        uid = (await ok(client, "get_memory", {"id": used}))["uid"]
        assert out == {"useful": True, "results": [{
            "id": used, "uid": uid, "old_importance": 0.5, "importance": 0.55, "useful_count": 1.0,
            "last_useful_at": out["results"][0]["last_useful_at"], "atoms_reinforced": 0}]}
        again = await ok(client, "recall", {"query": "jasmine tea garden", "limit": 2,
                                            "explain": True})
        assert again["cached"] is False and [h["id"] for h in again["results"]] == [used, top]
        assert again["results"][0]["score"] > again["results"][1]["score"]
        assert again["results"][0]["explain"]["useful_count"] == 1
        assert w[used] == again["results"][0]["text"]
        d = await ok(client, "get_memory", {"id": used})
        assert d["useful_count"] == 1 and d["last_useful_at"] == out["results"][0]["last_useful_at"]
        down = await ok(client, "memory_feedback", {"ids": [top], "useful": False})
        assert down["results"][0]["importance"] == pytest.approx(0.45)
        assert down["results"][0]["useful_count"] == 0
        assert "no memory with id 42" in await err(client, "memory_feedback", {"ids": [used, 42]})
        assert "no memory with id" in await err(client, "memory_feedback",
                                                {"ids": [top], "persona_id": "x"})
        assert (await ok(client, "get_memory", {"id": used}))["useful_count"] == 1  # all or nothing


async def test_archive_excludes_from_recall_unless_include_archived(client):
    a = await ok(client, "memorize", {"content": ALICE})
    b = await ok(client, "memorize", {"content": "Alice also likes espresso."})
    found = await ok(client, "recall", {"query": "Alice"})
    assert {h["id"] for h in found["results"]} == {a["id"], b["id"]}
    assert (await ok(client, "archive_memory", {"id": a["id"]})) == \
        {"id": a["id"], "uid": a["uid"], "pinned": None, "archived": True}
    r = await ok(client, "recall", {"query": "Alice"})
    assert [h["id"] for h in r["results"]] == [b["id"]]
    # the vector and graph channels filter it too, not just BM25
    r2 = await ok(client, "recall", {"query": "iced americano every morning"})
    assert all(h["id"] != a["id"] for h in r2["results"])
    r = await ok(client, "recall", {"query": "Alice", "include_archived": True})
    hits = {h["id"]: h for h in r["results"]}
    assert set(hits) == {a["id"], b["id"]} and hits[a["id"]]["archived"] is True
    assert [m["id"] for m in (await ok(client, "list_memories"))["memories"]] == [b["id"]]
    listed = await ok(client, "list_memories", {"include_archived": True})
    assert {m["id"] for m in listed["memories"]} == {a["id"], b["id"]}
    assert (await ok(client, "memory_stats"))["counts"]["archived"] == 1


@pytest.mark.slow
async def test_memory_stats(client):
    empty = await ok(client, "memory_stats")
    assert empty["counts"]["documents"] == 0 and empty["server_version"] == aokun.__version__
    assert empty["schema_version"] == aokun.schema_version_known()
    await ok(client, "memorize", {"content": ALICE})
    s = await ok(client, "memory_stats")
    assert s["counts"]["documents"] == 1 and s["counts"]["doc_vectors"] == 1
    assert s["counts"]["atoms"] == 2
    assert s["embedding"]["provider"] == "fake" and s["embedding"]["dim"] == 16
    assert s["embedding"]["stored_dim"] == 16 and s["embedding"]["problem"] is None
    assert s["journal"] == {"done": 1} and s["size_bytes"] > 0 and s["database"].endswith("m.db")


# resources ----------------------------------------------------------------------------------------

async def test_resources_stats_and_memory(client):
    listed = {str(r.uri): r for r in (await client.list_resources()).resources}
    assert "memory://stats" in listed and listed["memory://stats"].mime_type == "application/json"
    templates = {t.uri_template
                 for t in (await client.list_resource_templates()).resource_templates}
    assert "memory://memories/{id}{?persona_id}" in templates

    w = await ok(client, "memorize", {"content": "咖啡 ☕ " + ALICE})
    res = await client.read_resource("memory://stats")
    assert res.contents[0].mime_type == "application/json"
    assert json.loads(res.contents[0].text)["counts"]["documents"] == 1
    res = await client.read_resource(f"memory://memories/{w['id']}")
    body = json.loads(res.contents[0].text)
    assert body["content"] == "咖啡 ☕ " + ALICE and body["uid"] == w["uid"] and "atoms" in body
    assert "咖啡" in res.contents[0].text  # not \u-escaped


async def test_resource_missing_memory_is_an_error(client, caplog):
    with pytest.raises(MCPError) as e:
        await client.read_resource("memory://memories/999")
    assert e.value.error.code == -32602 and "999" in e.value.error.message
    with pytest.raises(MCPError) as e:  # not a number: one line naming the id, no traceback
        await client.read_resource("memory://memories/abc")
    assert e.value.error.code == -32602 and e.value.error.message.startswith("id: ")
    assert "Traceback" not in caplog.text


# bad input ----------------------------------------------------------------------------------------

BAD = [
    ("memorize", {}, "content"),
    ("memorize", {"metadata": {"summary": "no content"}}, "content"),
    ("recall", {"query": "Alice", "limit": "abc"}, "limit"),
    ("recall", {"query": "Alice", "limit": 0}, "limit"),
    ("search_atoms", {"query": "Alice", "limit": "abc"}, "limit"),
    ("memorize", {"content": "x", "metadata": {"importance": 2}}, "importance"),
    ("memorize", {"content": "x", "metadata": {"importance": "very"}}, "importance"),
    ("memorize", {"content": "x", "metadata": {"colour": "red"}}, "metadata"),
    ("memorize", {"content": "x", "metadata": "not an object"}, "metadata"),
    ("memorize", {"content": "   \x00  "}, "content"),
    ("memorize", {"content": 42}, "content"),
    ("memorize", {"content": "x", "metadata": {"timestamp": "next blue moon"}}, "timestamp"),
    ("memorize", {"content": "x", "metadata": {"topics": "coffee"}}, "topics"),
    ("get_memory", {"id": "one"}, "id"),
    ("get_memory", {"id": 0}, "id"),
    ("edit_memory", {"id": 1, "content": "y", "metadata": {"persona_id": "other"}}, "persona_id"),
    ("edit_memory", {"id": 1, "content": "y", "metadata": {"importance": -0.5}}, "importance"),
    ("list_memories", {"limit": 5000}, "limit"),
    ("memory_feedback", {}, "ids"),
    ("memory_feedback", {"ids": []}, "ids"),
    ("memory_feedback", {"ids": [0]}, "ids"),
    ("memory_feedback", {"ids": "1"}, "ids"),
    ("memory_feedback", {"ids": [1], "useful": "maybe"}, "useful"),
]


@pytest.mark.slow
@pytest.mark.parametrize("tool,args,field", BAD,
                         ids=[f"{t}-{f}-{i}" for i, (t, _, f) in enumerate(BAD)])
async def test_bad_input_names_the_field_and_writes_nothing(client, db, tool, args, field):
    first = await ok(client, "memorize", {"content": ALICE})
    assert first["id"] == 1
    before = await counts(client)
    msg = await err(client, tool, args)
    assert names_field(msg, field), msg
    assert "Traceback" not in msg and f"{tool}: {tool}:" not in msg  # the tool named once
    # one line, also when the SDK's schema check refused the arguments (no pydantic report)
    assert "\n" not in msg.strip() and "pydantic" not in msg, msg
    assert await counts(client) == before == (1, 1)
    # the edit did not happen
    assert (await ok(client, "get_memory", {"id": 1}))["content"] == ALICE
    # a fresh connection to the file agrees
    with aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16), recover=False) as m:
        assert m.value("select count(*) from documents") == 1
        assert m.value("select count(*) from memory_write_ops") == 1


async def test_an_empty_answer_says_so_and_as_of_before_any_memory_too(client):
    """An answer with no hit and nothing else to say was {} (as_of 1900: no word that memory then
    held nothing)."""
    await ok(client, "memorize", {"content": ALICE})
    r = await ok(client, "recall", {"query": "americano", "as_of": "1900-01-01"})
    assert r["results"] == [] and r["warnings"] == ["nothing found as of 1900-01-01T00:00:00Z"]
    assert (await ok(client, "recall", {"query": "americano"}))["results"]


async def test_unknown_tool_is_an_error(client):
    assert "forget_everything" in await err(client, "forget_everything", {})


# optional arguments: omitted or null --------------------------------------------------------------

NULLS = [
    ("memorize", {"content": "null metadata", "metadata": None}),
    ("memorize", {"content": "null keys", "metadata": {k: None for k in
                                                       ("summary", "topics", "key_facts",
                                                        "participants", "sentiment", "importance",
                                                        "session_id", "persona_id", "source",
                                                        "timestamp", "tags", "pinned")}}),
    ("recall", {"query": "Alice", "limit": None, "session_id": None, "persona_id": None,
                "include_archived": None, "explain": None}),
    ("search_atoms", {"query": "Alice", "limit": None, "persona_id": None}),
    ("list_memories", {"limit": None, "offset": None, "persona_id": None, "session_id": None,
                       "include_archived": None}),
    ("edit_memory", {"id": 1, "content": None, "metadata": {"summary": "s"}}),
    ("edit_memory", {"id": 1, "content": "Alice loves tea now.", "metadata": None}),
    ("memory_feedback", {"ids": [1], "useful": None, "persona_id": None}),
]


@pytest.mark.slow
@pytest.mark.parametrize("tool,args", NULLS, ids=[f"{t}-{i}" for i, (t, _) in enumerate(NULLS)])
async def test_optional_arguments_may_be_null(frozen_now, client, tool, args):
    # frozen clock: the two answers' scores (recency, ttl_factor) depend on the time they are made
    await ok(client, "memorize", {"content": ALICE,
                                  "metadata": {"key_facts": ["Alice loves iced americano"]}})
    omitted = {k: v for k, v in args.items() if v is not None}
    r_null = await ok(client, tool, args)
    # read-only: same answer as omitting them
    if tool in ("recall", "search_atoms", "list_memories"):
        r_omit = await ok(client, tool, omitted)
        for r in (r_null, r_omit):
            r.pop("took_ms", None)
            r.pop("cached", None)
        assert r_null == r_omit
        assert r_null["results" if tool != "list_memories" else "memories"]
    if tool == "memorize":
        d = await ok(client, "get_memory", {"id": r_null["id"]})
        assert d["importance"] == 0.5 and d["persona_id"] == "" and d["pinned"] is False


async def test_omitted_optionals_use_the_defaults(client):
    for i in range(7):
        await ok(client, "memorize", {"content": f"Alice note number {i} about coffee."})
    assert len((await ok(client, "recall", {"query": "Alice coffee"}))["results"]) == 5
    assert len((await ok(client, "list_memories", {}))["memories"]) == 7


# Unicode, NUL, big content ------------------------------------------------------------------------

@pytest.mark.slow
async def test_emoji_chinese_and_nul_round_trip(client):
    text = "周末和小王去西湖划船🚣‍♀️，他说下个月要搬到杭州。\x00Emoji: 😀👍🏽 and 中文混排 OK"
    w = await ok(client, "memorize", {"content": text, "metadata": {
        "participants": ["小王"], "topics": ["旅行"], "summary": "西湖🚣 划船"}})
    d = await ok(client, "get_memory", {"id": w["id"]})
    stored = text.replace("\x00", " ")  # as given: the full-width comma stays, the NUL is a space
    assert d["content"] == stored and "，" in stored and "🚣\u200d♀" in stored
    assert unicodedata.normalize("NFKC", stored) != stored
    assert d["participants"] == ["小王"] and d["topics"] == ["旅行"]
    assert d["summary"] == "西湖🚣 划船"
    r = await ok(client, "recall", {"query": "西湖划船"})
    assert r["results"] and r["results"][0]["id"] == w["id"]
    assert r["results"][0]["text"] == d["content"]
    assert (await ok(client, "recall", {"query": "杭州"}))["results"][0]["id"] == w["id"]
    atoms = await ok(client, "search_atoms", {"query": "杭州"})
    assert any(a["document_id"] == w["id"] for a in atoms["results"])
    # the same text with the NUL is the same memory
    assert (await ok(client, "memorize", {"content": text}))["deduplicated"] is True


async def test_stored_text_is_byte_identical(client):
    keep = "E = mc² ½ ① ™ ㎏，"  # NFKC would make it "E = mc2 1⁄2 1 TM kg,"
    meta = {"summary": keep, "topics": [keep], "participants": [keep], "key_facts": [keep]}
    w = await ok(client, "memorize", {"content": keep, "metadata": meta})
    d = await ok(client, "get_memory", {"id": w["id"]})
    assert d["content"].encode("utf-8") == keep.encode("utf-8")
    assert {k: d[k] for k in meta} == meta and [a["content"] for a in d["atoms"]] == [keep]
    hit = (await ok(client, "recall", {"query": "mc2 kg"}))["results"][0]
    assert hit["id"] == w["id"] and hit["text"].encode("utf-8") == keep.encode("utf-8")
    assert hit["summary"] == keep
    assert (await ok(client, "search_atoms", {"query": "mc2"}))["results"][0]["content"] == keep
    # the half-width spelling is the same memory (deduplication compares the folded text)
    again = await ok(client, "memorize", {"content": "E = mc2 1⁄2 1 TM kg,"})
    assert again["deduplicated"] is True and again["id"] == w["id"]


@pytest.mark.slow
async def test_300_kb_content(client):
    para = ("Paragraph {i}: the quarterly report covers revenue, hiring and the roadmap. "
            "季度报告涵盖收入与招聘。\n")
    text = "".join(para.format(i=i) for i in range(3200)) + "The secret codeword is xylophonic."
    assert len(text.encode("utf-8")) > 300_000
    w = await ok(client, "memorize", {"content": text})
    assert w["status"] == "done" and w["embedding"] == "done" and w["embedding_truncated"] is True
    d = await ok(client, "get_memory", {"id": w["id"]})
    assert d["content"] == text.strip()
    r = await ok(client, "recall", {"query": "xylophonic", "limit": 1})
    [hit] = r["results"]
    # capped ([recall] max_chars_per_hit), at a line end
    assert hit["id"] == w["id"] and hit["truncated"] is True
    assert len(hit["text"]) <= 1500 and hit["text"].endswith("招聘。…")
    assert text.startswith(hit["text"][:-1])


@pytest.mark.slow
async def test_recall_caps_each_hit_and_get_memory_gives_the_whole(client):
    big = " ".join(f"Day {i}: the ferry to the island left late because of the fog."
                   for i in range(3000))
    w = await ok(client, "memorize", {"content": big})
    short = await ok(client, "memorize", {"content": "The island ferry has a new captain."})
    r = await ok(client, "recall", {"query": "island ferry fog", "limit": 2})
    hits = {h["id"]: h for h in r["results"]}
    assert hits[w["id"]]["truncated"] is True and hits[w["id"]]["text"].endswith("fog.…")
    assert big.startswith(hits[w["id"]]["text"][:-1]) and len(hits[w["id"]]["text"]) <= 1500
    assert hits[short["id"]]["truncated"] is False
    assert hits[short["id"]]["text"] == "The island ferry has a new captain."
    assert (await ok(client, "get_memory", {"id": w["id"]}))["content"] == big
    tools = {t.name: t for t in (await client.list_tools()).tools}
    hit_schema = tools["recall"].output_schema["$defs"]["Hit"]
    assert hit_schema["properties"]["truncated"]["type"] == "boolean"
    assert "truncated: get_memory gives it whole" in tools["recall"].description
    assert "get_memory" in tools["recall"].description


async def test_content_over_the_limit_is_refused(make_server, cfg_for):
    async with Client(make_server(cfg_for(more={("write", "max_content_chars"): 1000}))) as c:
        msg = await err(c, "memorize", {"content": "y" * 1001})
        assert names_field(msg, "content") and "1000" in msg
        assert (await counts(c)) == (0, 0)


# cache, explain -----------------------------------------------------------------------------------

@pytest.mark.slow
async def test_recall_sees_writes_immediately(client):
    miss = await ok(client, "recall", {"query": "zeppelin"})
    assert miss["results"] == [] and miss["cached"] is False
    assert (await until_cached(client, "zeppelin"))["results"] == []
    w = await ok(client, "memorize", {"content": "Dana flew in a zeppelin over Lake Constance."})
    hit = await ok(client, "recall", {"query": "zeppelin"})
    assert [h["id"] for h in hit["results"]] == [w["id"]] and hit["cached"] is False
    await ok(client, "edit_memory", {"id": w["id"], "content": "Dana flew in a hot-air balloon."})
    assert keyword_ids(await ok(client, "recall", {"query": "zeppelin"})) == []
    found = await ok(client, "recall", {"query": "balloon"})
    assert [h["id"] for h in found["results"]] == [w["id"]]
    await ok(client, "archive_memory", {"id": w["id"]})
    assert (await ok(client, "recall", {"query": "balloon"}))["results"] == []
    w2 = await ok(client, "memorize", {"content": "Another balloon ride is planned."})
    found = await ok(client, "recall", {"query": "balloon"})
    assert [h["id"] for h in found["results"]] == [w2["id"]]
    await ok(client, "delete_memory", {"id": w2["id"]})
    assert (await ok(client, "recall", {"query": "balloon"}))["results"] == []


async def until_cached(client, query):
    """Recall `query` until the answer comes from the cache (the server's background thread has
    finished its start-up writes); returns that answer."""
    for _ in range(100):
        r = await ok(client, "recall", {"query": query})
        if r["cached"]:
            return r
        await anyio.sleep(0.05)
    pytest.fail("an unchanged database never answered recall from the cache")


@pytest.mark.slow
async def test_recall_sees_writes_from_another_connection(client, db):
    """Another process (a second server, the CLI) writes: the next recall must not come from the
    cache. (Regression: the cache once used apsw's data_version(), which misses other connections'
    commits until this connection runs a statement.)"""
    assert (await until_cached(client, "quokka"))["results"] == []
    with aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16)) as other:
        wid = other.memorize("Erin photographed a quokka on Rottnest Island.")["id"]
    r = await ok(client, "recall", {"query": "quokka"})
    assert [h["id"] for h in r["results"]] == [wid] and r["cached"] is False


async def test_explain_gives_ranks_and_score_parts(client):
    for text in (ALICE, "Alice also likes espresso.", BOB):
        await ok(client, "memorize", {"content": text})
    r = await ok(client, "recall", {"query": "Alice americano", "explain": True})
    assert r["results"]
    bm25_ranks = []
    for hit in r["results"]:
        ex = hit["explain"]
        assert isinstance(ex, dict)
        assert set(ex["ranks"]) == {"bm25", "vector", "graph_keyword", "graph_vector"}
        assert set(hit["channels"]) == {c for c, v in ex["ranks"].items() if v is not None}
        for v in ex["ranks"].values():
            assert v is None or (isinstance(v, int) and v >= 0)
        for key in ("doc_rrf", "graph_rrf", "importance", "recency", "doc_route", "graph_route",
                    "fused", "mmr", "route_weights", "cross_route_bonus", "temporal_factor",
                    "intent"):
            assert key in ex, key
        assert hit["score"] == pytest.approx(ex["fused"], abs=1e-5)
        if ex["ranks"]["bm25"] is not None:
            bm25_ranks.append(ex["ranks"]["bm25"])
    assert r["results"][0]["text"] == ALICE and r["results"][0]["explain"]["ranks"]["bm25"] == 0
    assert len(set(bm25_ranks)) == len(bm25_ranks)  # distinct positions in the BM25 list
    plain = await ok(client, "recall", {"query": "Alice americano"})
    assert all(h["explain"] is None for h in plain["results"])


# concurrency and the legacy handshake -------------------------------------------------------------

@pytest.mark.slow
async def test_concurrent_calls_in_one_session(client):
    results = {}

    async def write(i):
        results[i] = await ok(client, "memorize",
                              {"content": f"Parallel memory {i}: Frank counted {i} sheep."})

    async def read():
        await ok(client, "recall", {"query": "sheep", "limit": 3})

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(write, i)
            if i % 4 == 0:
                tg.start_soon(read)
    assert sorted(r["id"] for r in results.values()) == list(range(1, 21))
    assert await counts(client) == (20, 20)
    assert len((await ok(client, "recall", {"query": "sheep", "limit": 50}))["results"]) == 20


@pytest.mark.slow
async def test_legacy_initialize_handshake(make_server):
    async with Client(make_server(), mode="legacy") as c:
        assert c.server_info.name == "aokun"
        w = await ok(c, "memorize", {"content": "老张 喜欢 普洱茶 🍵"})
        assert (await ok(c, "recall", {"query": "普洱茶"}))["results"][0]["id"] == w["id"]


async def test_lifespan_closes_and_reopens_the_database(make_server, db):
    server = make_server()
    async with Client(server) as c:
        await ok(c, "memorize", {"content": ALICE})
    async with Client(server) as c:  # same server object, a second lifespan
        assert (await counts(c))[0] == 1
        assert (await ok(c, "recall", {"query": "americano"}))["results"]
    with aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16)) as m:
        assert m.doctor() == []


# the background thread's online backup against tool calls ----------------------------------------

def test_online_backup_uses_the_connection_only_under_its_lock(db, segmenter, tmp_path,
                                                               monkeypatch):
    """Tool calls run in SDK worker threads while the server's background thread takes its online
    backup; APSW refuses concurrent use of one connection, so every backup call that touches the
    source connection (step and finish) must hold Memory.lock. Checked deterministically by
    recording, at each call, whether the calling thread holds the lock. (Regression: finish() ran
    outside the lock.)"""
    import apsw

    m = aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16))
    m.seg = segmenter
    m.memorize_many([(f"Seed memory {i}: Gina planted {i} tulips.", None) for i in range(100)])
    seen = []

    class Recorded:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            attr = getattr(self.inner, name)
            if name not in ("step", "finish", "close"):
                return attr

            def call(*a, **kw):
                seen.append((name, m.lock._is_owned()))
                return attr(*a, **kw)
            return call

    class Connection(apsw.Connection):
        def backup(self, *a, **kw):
            return Recorded(super().backup(*a, **kw))

    monkeypatch.setattr(apsw, "Connection", Connection)
    try:
        m.online_backup(tmp_path / "bk" / "b.db")
    finally:
        monkeypatch.undo()
        m.close()
    assert {name for name, _ in seen} >= {"step", "finish"}
    assert [name for name, locked in seen if not locked] == []


@pytest.mark.slow
def test_tool_calls_survive_backups_in_the_background(db, segmenter, tmp_path):
    """The same race end to end: while another thread takes backups in a loop, what the
    recall/memory_stats tool calls run must not fail."""
    import threading

    with aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16)) as m:
        m.seg = segmenter
        m.memorize_many([(f"Seed memory {i}: Gina planted {i} tulips.", None) for i in range(60)])
        failures, stop = [], threading.Event()

        def tool_calls():
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    assert m.recall(f"tulips {i}", 2)["results"]  # distinct queries: never cached
                    assert m.stats()["counts"]["documents"] == 60
                except Exception as e:
                    failures.append(repr(e))

        t = threading.Thread(target=tool_calls)
        t.start()
        try:
            for i in range(10):
                m.online_backup(tmp_path / "bk" / f"b{i}.db")
        finally:
            stop.set()
            t.join()
        assert failures == []
        assert len(list((tmp_path / "bk").glob("b*.db"))) == 10


# every use of the connection from a tool call holds Memory.lock -----------------------------------

class LockCheckedConnection:
    """Stands in for Memory.conn: records every method call made without Memory.lock held (with
    the calling function), which is what APSW punishes with ThreadingViolationError ('Connection
    is busy in another thread') once tool calls and the background thread overlap."""

    def __init__(self, conn, lock, unlocked: list):
        self._conn, self._lock, self._unlocked = conn, lock, unlocked

    def __getattr__(self, name):
        attr = getattr(self._conn, name)
        if not callable(attr):
            return attr

        def call(*a, **kw):
            if not self._lock._is_owned():
                import sys
                f = sys._getframe(1)
                self._unlocked.append(f"{name}() from {f.f_code.co_name}")
            return attr(*a, **kw)
        return call


@pytest.fixture
def checked_server(db, segmenter, cfg_for):
    """(server, unlocked): an in-process server whose Memory's connection records unlocked use
    (the Memory is fully opened, migrated and recovered first)."""
    unlocked: list[str] = []

    def factory():
        m = aokun.Memory(db, cfg_for(), embedder=FakeEmbedder(16))
        m.seg = segmenter
        m.conn = LockCheckedConnection(m.conn, m.lock, unlocked)
        return m
    return aokun.build_server(factory, cfg_for()), unlocked


async def test_tool_calls_use_the_connection_only_under_the_lock(checked_server):
    server, unlocked = checked_server
    async with Client(server) as c:
        w = await ok(c, "memorize", {"content": ALICE,
                                     "metadata": {"key_facts": ["Alice loves iced americano"],
                                                  "participants": ["Alice"]}})
        await ok(c, "memorize", {"content": BOB})
        await ok(c, "recall", {"query": "Alice americano", "explain": True})
        await ok(c, "recall", {"query": "Alice americano", "explain": True})  # cached
        await ok(c, "search_atoms", {"query": "americano"})
        await ok(c, "list_memories", {"include_archived": True})
        await ok(c, "get_memory", {"id": w["id"]})
        await ok(c, "edit_memory", {"id": w["id"], "content": "Alice now drinks green tea.",
                                    "metadata": {"importance": 0.9}})
        await ok(c, "pin_memory", {"id": w["id"]})
        await ok(c, "unpin_memory", {"id": w["id"]})
        await ok(c, "archive_memory", {"id": w["id"]})
        await ok(c, "delete_memory", {"id": w["id"]})
        json.loads((await c.read_resource("memory://memories/2")).contents[0].text)
        await err(c, "get_memory", {"id": w["id"]})
    assert unlocked == []


async def test_memory_stats_uses_the_connection_only_under_the_lock(checked_server):
    server, unlocked = checked_server
    async with Client(server) as c:
        await ok(c, "memorize", {"content": ALICE})
        await ok(c, "memory_stats")
        json.loads((await c.read_resource("memory://stats")).contents[0].text)
    assert unlocked == []
