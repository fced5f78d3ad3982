"""Personas through ids: every MCP tool, the memory resource and every CLI command that takes a
memory id, a fact id or an entity answers for another persona's one exactly as for one that does
not exist (the same error text, nothing changed), and acts on it for its own persona."""

import json

import anyio
import apsw
import pytest
from click.testing import CliRunner
from mcp import Client, MCPError

import aokun
from fakes import FakeEmbedder
from mcp_procs import cli, write_ini

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # slow: every test here takes 0.5 s or more

MISSING = 987654  #: an id no row has
WORK_TEXT = "Lena climbs the Matterhorn every August with her brother Jonas."
HOME_TEXT = "Lena keeps a sourdough starter called Bruno in the fridge."

#: (tool, arguments, the argument that names the thing): each is called on the work persona's
#: memory/fact/entity under another persona, and on MISSING (or a name nobody has) under it.
ID_CASES = [
    ("get_memory", {}, "id"),
    ("edit_memory", {"content": "Lena gave up climbing."}, "id"),
    ("edit_memory", {"metadata": {"summary": "changed"}}, "id"),
    ("delete_memory", {}, "id"),
    ("pin_memory", {}, "id"),
    ("unpin_memory", {}, "id"),
    ("archive_memory", {}, "id"),
    ("restore_memory", {}, "id"),
    ("set_importance", {"importance": 0.95}, "id"),
    ("memory_feedback", {}, "ids"),
    ("kg_add", {"subject": "Lena", "predicate": "likes", "object": "granite"}, "source_memory_id"),
    ("kg_invalidate", {}, "fact"),
    ("kg_invalidate", {"valid_to": "2030-01-01"}, "fact"),
    ("kg_query", {}, "entity"),
    ("kg_query", {"as_of": "2020-01-01"}, "entity"),
    ("kg_timeline", {}, "entity"),
    ("kg_delete_entity", {}, "entity"),
]
#: Input-schema properties that name a stored thing: a tool with one of them must be in ID_CASES.
ID_PROPERTIES = {"id", "ids", "source_memory_id", "entity"}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def db(tmp_path):
    return tmp_path / "p.db"


@pytest.fixture
def server(db, tmp_path, segmenter):
    cfg = aokun.Config(None, overrides={("server", "exposed_tools"): "all",
                                        ("backup", "dir"): str(tmp_path / "bk"),
                                        ("backup", "daily"): False})

    def factory():
        m = aokun.Memory(db, cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        return m
    return aokun.build_server(factory, cfg)


def snapshot(db) -> dict:
    """Every row of the tables an id-taking tool could change, read on a connection of its own
    (APSW's SQLite: a second SQLite library in one process, the stdlib's, does not see the other's
    WAL)."""
    con = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        tables = ("documents", "memory_atoms", "graph_entries", "graph_nodes", "doc_vectors",
                  "kg_entities", "kg_triples", "tombstones", "consolidations", "memory_write_ops")
        return {t: con.execute(f"select * from {t} order by rowid").fetchall() for t in tables}
    finally:
        con.close()


async def call(client, tool, args) -> tuple[bool, str]:
    r = await client.call_tool(tool, args)
    return r.is_error, r.content[0].text if r.content else ""


def with_target(tool, extra, kind, target, persona) -> dict:
    args = dict(extra)
    args[{"fact": "id"}.get(kind, kind)] = [target] if kind == "ids" else target
    if persona is not None:
        args["persona_id"] = persona
    return args


async def setup(client) -> dict:
    async def ok(tool, args):
        r = await client.call_tool(tool, args)
        assert r.is_error is False, r.content[0].text
        return r.structured_content
    work = (await ok("memorize", {"content": WORK_TEXT,
                                  "metadata": {"persona_id": "work", "participants": ["Lena"],
                                               "key_facts": ["Lena climbs the Matterhorn."]}}))
    home = await ok("memorize", {"content": HOME_TEXT, "metadata": {"persona_id": "home"}})
    fact = await ok("kg_add", {"subject": "Lena", "predicate": "climbs", "object": "Matterhorn",
                               "valid_from": "2021-01-01", "source_memory_id": work["id"],
                               "persona_id": "work"})
    return {"work": work["id"], "home": home["id"], "fact": fact["id"]}


@pytest.mark.parametrize("tool,extra,kind", ID_CASES,
                         ids=[f"{t}-{i}" for i, (t, _, _) in enumerate(ID_CASES)])
async def test_another_personas_id_is_not_found_and_unchanged(server, db, tool, extra, kind):
    """Under another persona, the default one (no persona_id) and `WORK` (persona ids are folded,
    NFKC, but not case-folded: another persona than `work`)."""
    async with Client(server) as client:
        ids = await setup(client)
        own = {"id": ids["work"], "ids": ids["work"], "source_memory_id": ids["work"],
               "fact": ids["fact"], "entity": "Lena"}[kind]
        missing = "Nobody Known" if kind == "entity" else MISSING
        before = snapshot(db)
        for persona in ("home", None, "WORK"):
            foreign_error, foreign = await call(client, tool,
                                                with_target(tool, extra, kind, own, persona))
            missing_error, absent = await call(client, tool,
                                               with_target(tool, extra, kind, missing, persona))
            assert foreign_error and missing_error, (persona, foreign, absent)
            assert f"{tool}: no " in foreign and "Traceback" not in foreign, foreign
            assert foreign == absent.replace(str(missing), str(own)), (persona, foreign, absent)
            assert snapshot(db) == before, persona
        # the owner's persona still reaches it (the refusals above are the persona's, not the
        # tool's)
        if tool in ("get_memory", "kg_query", "kg_timeline"):
            mine, text = await call(client, tool, with_target(tool, extra, kind, own, "work"))
            assert mine is False, text


async def test_own_persona_acts_on_its_ids(server, db):
    async with Client(server) as client:
        ids = await setup(client)
        w = {"id": ids["work"], "persona_id": "work"}
        for tool, extra in (("pin_memory", {}), ("archive_memory", {}), ("restore_memory", {}),
                            ("set_importance", {"importance": 0.9}),
                            ("edit_memory", {"metadata": {"summary": "S"}}),
                            ("memory_feedback", None)):
            args = {"ids": [ids["work"]], "persona_id": "work"} if extra is None \
                else dict(w, **extra)
            failed, text = await call(client, tool, args)
            assert failed is False, (tool, text)
        got = (await client.call_tool("get_memory", w)).structured_content
        assert (got["pinned"], got["archived"], got["summary"]) == (True, False, "S")
        assert got["importance"] > 0.9  # 0.9, then + the feedback step
        fact = {"id": ids["fact"], "persona_id": "work"}
        first = await client.call_tool("kg_invalidate", fact)
        again = await client.call_tool("kg_invalidate", fact)
        assert first.structured_content["already_ended"] is False
        assert again.structured_content["already_ended"] is True
        assert again.structured_content["valid_to"] == first.structured_content["valid_to"]
        assert again.structured_content["note"].startswith("already ended on ")
        gone = (await client.call_tool("kg_delete_entity",
                                       {"entity": "lena", "persona_id": "work"})).structured_content
        assert gone["deleted"] is True and gone["facts"] == [ids["fact"]]
        failed, text = await call(client, "kg_query", {"entity": "Lena", "persona_id": "work"})
        assert failed and "no entity 'Lena'" in text
        assert snapshot(db)["kg_triples"] == []
        failed, text = await call(client, "delete_memory", w)
        assert failed is False, text
        assert [r[0] for r in snapshot(db)["documents"]] == [ids["home"]], snapshot(db)["documents"]


async def test_every_tool_naming_a_stored_thing_is_covered_and_takes_a_persona(server):
    async with Client(server) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == set(aokun.MCP_TOOLS)
    naming = {n for n, t in tools.items()
              if ID_PROPERTIES & set(t.input_schema.get("properties", {}))}
    assert naming == {t for t, _, _ in ID_CASES}
    for name in naming:
        assert "persona_id" in tools[name].input_schema["properties"], name


async def test_the_memory_resource_is_per_persona(server, db):
    async with Client(server) as client:
        ids = await setup(client)
        errors = []
        for uri in (f"memory://memories/{ids['work']}",
                    f"memory://memories/{ids['work']}?persona_id=home",
                    f"memory://memories/{MISSING}", f"memory://memories/{MISSING}?persona_id=home"):
            with pytest.raises(MCPError) as e:
                await client.read_resource(uri)
            errors.append((e.value.error.code,
                           e.value.error.message.replace(str(MISSING), str(ids["work"]))))
        assert errors[0] == errors[1] == errors[2] == errors[3]
        res = await client.read_resource(f"memory://memories/{ids['work']}?persona_id=work")
        assert json.loads(res.contents[0].text)["content"] == WORK_TEXT
        res = await client.read_resource(f"memory://memories/{ids['home']}?persona_id=home")
        assert json.loads(res.contents[0].text)["content"] == HOME_TEXT


# the CLI ----------------------------------------------------------------------------------------

CLI_CASES = [
    ("show", "{id}"),
    ("show", "{id}", "--json"),
    ("edit", "{id}", "--text", "Lena gave up climbing."),
    ("edit", "{id}", "--importance", "0.9"),
    ("pin", "{id}"),
    ("unpin", "{id}"),
    ("archive", "{id}"),
    ("unarchive", "{id}"),
    ("restore-memory", "{id}"),
    ("delete", "{id}"),
    ("feedback", "{id}"),
    ("kg", "add", "Lena", "likes", "granite", "--source-memory", "{id}"),
    ("kg", "invalidate", "{fact}"),
    ("kg", "query", "{entity}"),
    ("kg", "timeline", "{entity}"),
    ("kg", "delete", "{entity}"),
]


@pytest.fixture
def cli_db(tmp_path, segmenter):
    """(db, ini, work memory id, work fact id): a work and a home memory and a work fact, provider
    none."""
    db, ini = tmp_path / "cli.db", write_ini(tmp_path)
    with aokun.Memory(db, aokun.Config(ini)) as m:
        m.seg = segmenter
        work = m.memorize(WORK_TEXT, {"persona_id": "work", "participants": ["Lena"]})["id"]
        m.memorize(HOME_TEXT, {"persona_id": "home"})
        fact = m.kg_add("Lena", "climbs", "Matterhorn", persona_id="work")["id"]
    return db, ini, work, fact


def _args(case, own, entity) -> list[str]:
    return [a.format(id=own, fact=own, entity=entity) for a in case]


@pytest.mark.parametrize("persona", [["--persona", "home"], []],
                         ids=["other-persona", "default-persona"])
def test_cli_commands_treat_another_personas_id_as_missing(cli_db, persona):
    db, ini, work, fact = cli_db
    before = snapshot(db)
    runner = CliRunner()
    for case in CLI_CASES:
        own = fact if "{fact}" in case else work

        def run(*args):
            return runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), *args],
                                 catch_exceptions=False)
        foreign = run(*_args(case, own, "Lena"), *persona)
        absent = run(*_args(case, MISSING, "Nobody Known"), *persona)
        assert foreign.exit_code == absent.exit_code == 1, (case, foreign.output, absent.output)
        assert foreign.output.startswith("Error: no "), foreign.output
        assert foreign.output == \
            absent.output.replace(str(MISSING), str(own)).replace("Nobody Known", "Lena"), case
        assert snapshot(db) == before, case


def test_cli_child_process_refuses_another_persona_and_serves_its_own(cli_db):
    db, ini, work, fact = cli_db
    foreign = cli(db, ini, "show", str(work), "--persona", "home")
    absent = cli(db, ini, "show", str(MISSING))
    assert foreign.returncode == absent.returncode == 1 and "Traceback" not in foreign.stderr
    assert foreign.stderr == absent.stderr.replace(str(MISSING), str(work))
    shown = cli(db, ini, "show", str(work), "--persona", "work", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["content"] == WORK_TEXT
    ended = cli(db, ini, "kg", "invalidate", str(fact), "--persona", "work")
    assert ended.returncode == 0 and "ended on" in ended.stderr
    gone = cli(db, ini, "kg", "delete", "Lena", "--persona", "work")
    assert gone.returncode == 0 and gone.stdout.strip() == "deleted Lena and 1 facts"
    assert cli(db, ini, "kg", "query", "Lena", "--persona", "work").stderr.startswith(
        "Error: no entity 'Lena'")
    assert cli(db, ini, "delete", str(work), "--persona", "work").returncode == 0
    assert [r[0] for r in snapshot(db)["documents"]] == [work + 1]


def test_cli_list_shows_the_default_persona_unless_all_personas_is_asked(cli_db):
    db, ini, work, _ = cli_db
    runner = CliRunner()

    def run(*args):
        return runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), "list", *args],
                             catch_exceptions=False)
    with aokun.Memory(db, aokun.Config(ini)) as m:
        mine = m.memorize("Our default persona keeps its own notes.")["id"]
    plain = run()
    assert plain.exit_code == 0 and plain.output.split()[0] == str(mine)
    assert len(plain.output.splitlines()) == 1
    assert run("--json").exit_code == 0
    assert [r["id"] for r in json.loads(run("--json").output)] == [mine]
    assert [line.split()[0] for line in run("--persona", "work").output.splitlines()] == [str(work)]
    every = run("--all-personas").output.splitlines()
    assert sorted(line.split()[2] for line in every) == ["['']", "[home]", "[work]"], every
    both = run("--all-personas", "--persona", "work")
    assert both.exit_code == 2 and "not both" in both.output
    assert "--all-personas" in run("--help").output


def test_cli_kg_hints_name_cli_commands_and_mcp_hints_name_tools_a_client_has(cli_db, server):
    db, ini, work, fact = cli_db
    runner = CliRunner()
    for args, hint in [(["kg", "query", "Nobody Known"], "`python aokun.py kg add`"),
                       (["kg", "invalidate", str(MISSING)], "`python aokun.py kg query ENTITY`")]:
        out = runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), *args],
                            catch_exceptions=False).output
        assert hint in out and "kg_" not in out, out

    async def run():
        async with Client(server) as c:
            for tool, args, hint in [("kg_query", {"entity": "Nobody Known"}, "`kg_add` records"),
                                     ("kg_invalidate", {"id": MISSING},
                                      "`kg_query` or `kg_timeline` shows"),
                                     ("get_memory", {"id": MISSING},
                                      "`recall` (or `list_memories`, if exposed)"),
                                     ("conversation_get_session", {"session_id": "nope"},
                                      "`conversation_search`")]:
                is_error, text = await call(c, tool, args)
                assert is_error and hint in text and "aokun.py" not in text, (tool, text)
    anyio.run(run)
