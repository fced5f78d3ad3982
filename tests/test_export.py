"""Export and import: the lossless JSONL round trip (Chinese text, every metadata field, atoms,
facts with validity, conversations, consolidations, tombstones), imports into files that hold data
already (uids decide), persona filters, and the Markdown notes' safe names and front matter."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import aokun

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "conversations"
CLAUDE = FIXTURES / "claude-code" / "-home-dev-aokun" / "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f.jsonl"


def lines_of(mem, **kw) -> list[str]:
    return [json.dumps(r, ensure_ascii=False) for r in mem.export_records(**kw)]


def fill(mem) -> dict:
    """A file with every kind of record and every metadata field set."""
    a = mem.memorize("Alice 住在北京，她喜欢冰美式。", {
        "summary": "Alice 的住处与咖啡", "topics": ["咖啡", "city"],
        "key_facts": ["Alice 住在北京", "Alice 喜欢冰美式"],
        "participants": ["Alice"], "tags": ["personal life"], "sentiment": "开心",
        "importance": 0.8, "session_id": "s-1", "source": "chat",
        "timestamp": "2026-03-01T08:00:00Z", "pinned": True})["id"]
    b = mem.memorize("Bob 修好了 8090 端口冲突",
                     {"session_id": "s-1", "timestamp": "2026-03-01T09:00:00Z",
                                              "participants": ["Bob"]})["id"]
    c = mem.memorize("Bob fixed the port clash on 8090",
                     {"timestamp": "2026-03-02T09:00:00Z"})["id"]
    gone = mem.memorize("一条将被删除的记忆", {"timestamp": "2026-03-03T09:00:00Z"})["id"]
    other = mem.memorize("Carol 的秘密计划",
                         {"persona_id": "work", "key_facts": ["Carol 计划去上海"]})["id"]
    mem.memory_feedback([a])
    mem.set_flag(c, "archived", True)
    mem.conn.execute("update documents set merged_into = ?, last_access_at = "
                     "'2026-03-05T00:00:00Z', access_count = 2.5 where id = ?", (b, c))
    mem.conn.execute("insert into consolidations(survivor_id, previous, members, created_at) "
                     "values (?, ?, ?, ?)",
                     (b, json.dumps({"topics": [], "key_facts": [], "participants": ["Bob"],
                                     "tags": [],
                                 "importance": 0.5, "created_at": "2026-03-01T09:00:00Z"}),
                      json.dumps([c]), "2026-03-06T00:00:00Z"))
    mem.conn.execute("update memory_atoms set state = 'dormant', reinforcement_count = 3 where "
                     "document_id = ?", (a,))
    mem.kg_add("Alice", "lives_in", "上海", valid_from="2025-01-01T00:00:00Z", source_memory_id=a)
    mem.kg_add("Alice", "lives_in", "北京", valid_from="2026-01-01T00:00:00Z")
    mem.kg_add("Carol", "works_at", "声网", persona_id="work")
    mem.ingest("claude-code", [CLAUDE])
    mem.delete(gone)
    return {"a": a, "b": b, "c": c, "other": other}


def test_export_import_export_is_identical(tmp_path, open_mem):
    src = open_mem(tmp_path / "a.db")
    fill(src)
    first = lines_of(src)
    kinds = {json.loads(x)["kind"] for x in first}
    assert kinds == \
        {"header", "memory", "atom", "entity", "triple", "session", "turn", "consolidation",
         "tombstone"}
    assert json.loads(first[0])["schema"] == aokun.schema_version_known()
    dst = open_mem(tmp_path / "b.db")
    report = dst.import_export(first)
    assert report["memory"]["added"] == 4 and report["turn"]["added"] > 0
    assert lines_of(dst) == first
    # derived data was re-made, not copied: keyword search, the graph and vectors work in the new
    # file
    hits = dst.recall("冰美式", k=3)["results"]
    assert hits and "冰美式" in hits[0]["text"]
    assert dst.value("select count(*) from graph_entries") == \
        src.value("select count(*) from graph_entries")
    assert dst.value("select count(*) from doc_vectors") == \
        src.value("select count(*) from doc_vectors")
    assert dst.conversation_search("aokun")["results"] == \
        src.conversation_search("aokun")["results"]
    # the fields themselves
    m = next(json.loads(x) for x in first if '"Alice 住在北京' in x and '"kind": "memory"' in x)
    assert m["pinned"] is True and m["tags"] == ["personal life"] and m["useful_count"] == 1
    assert m["session_id"] == "s-1" and m["sentiment"] == "开心" \
        and m["importance"] == pytest.approx(0.85)
    facts = dst.kg_timeline("Alice")["facts"]
    assert [(f["valid_from"][:4], f["valid_to"] and f["valid_to"][:4]) for f in facts] == [
        ("2025", "2026"), ("2026", None)]
    assert [f["object"] for f in facts] == [f["object"] for f in src.kg_timeline("Alice")["facts"]]
    fixed = dst.value("select id from documents where content like 'Bob 修好%'")
    assert dst.restore_memory(fixed)["restored"]


@pytest.mark.slow
def test_import_into_a_file_with_data_lets_uids_decide(tmp_path, open_mem, monkeypatch):
    src = open_mem(tmp_path / "a.db")
    ids = fill(src)
    dump = lines_of(src)
    dst = open_mem(tmp_path / "b.db")
    dst.import_export(dump)
    uid = src.get(ids["a"])["uid"]
    mine = dst.value("select id from documents where uid = ?", (uid,))
    # the edits are later than what was exported
    monkeypatch.setenv("AOKUN_NOW", "2099-01-01T00:00:00Z")
    dst.edit(mine, metadata={"summary": "newer here"})  # a later updated_at: kept over the import
    src.edit(ids["b"], metadata={"summary": "newer there"})
    again = dst.import_export(lines_of(src))
    assert dst.get(mine)["summary"] == "newer here"
    assert dst.value("select summary from documents where content like 'Bob 修好%'") == \
        "newer there"
    assert again["memory"]["updated"] == 1 and again["memory"]["kept"] == 3
    # nothing twice, the deleted one not back
    assert dst.value("select count(*) from documents") == 4
    # the same text under another uid is a duplicate, left out; a tombstone deletes what it names
    third = open_mem(tmp_path / "c.db")
    third.memorize("Alice 住在北京，她喜欢冰美式。")
    out = third.import_export(dump)
    assert out["memory"]["skipped"] == 1 and third.value("select count(*) from documents") == 4
    src.delete(ids["b"])
    out = dst.import_export(lines_of(src, since="2026-01-01T00:00:00Z"))
    assert out["deleted"] == 1 \
        and dst.value("select count(*) from documents where content like 'Bob 修好%'") == 0


def test_a_persona_export_holds_that_persona_only(tmp_path, open_mem):
    src = open_mem(tmp_path / "a.db")
    fill(src)
    work = [json.loads(x) for x in lines_of(src, persona_id="work")]
    assert work[0]["persona"] == "work" and work[0]["tombstones"] is False
    assert {r.get("persona_id") for r in work[1:]} == {"work"}
    assert {r["kind"] for r in work[1:]} == {"memory", "atom", "entity", "triple"}
    assert not any("Alice" in json.dumps(r, ensure_ascii=False) for r in work)
    default = lines_of(src, persona_id="")
    assert "Carol" not in "".join(default)


def test_a_bad_line_is_one_error_and_writes_nothing(tmp_path, open_mem):
    src = open_mem(tmp_path / "a.db")
    fill(src)
    dump = lines_of(src)
    dst = open_mem(tmp_path / "b.db")
    for bad, what in (([dump[0], "{not json"], "line 2"), (["{}"], "line 1"),
                      ([dump[0], json.dumps({"kind": "memory", "uid": "x"})], "lacks"),
                      ([dump[0], json.dumps(json.loads(dump[1]) | {"importance": 7})],
                       "importance"),
                      ([dump[0], json.dumps(json.loads(dump[1]) | {"x": 1})],
                       r"does not know \(x\)")):
        with pytest.raises(aokun.InputError, match=what):
            dst.import_export(bad)
        assert dst.value("select count(*) from documents") == 0


def test_a_record_never_moves_or_reaches_another_personas_rows(tmp_path, open_mem):
    """An import (or a sync) record that names a uid of another persona's entity, fact, session or
    memory is refused, and a reference to another persona's row is not followed: before, a later
    entity or fact record with another persona_id moved that row (and what hung on it) to its
    persona."""
    mem = open_mem(tmp_path / "a.db")
    fill(mem)
    dump = [json.loads(x) for x in lines_of(mem)]
    default = [r for r in dump if r.get("persona_id") == ""]
    before = lines_of(mem)
    for kind in ("memory", "entity", "triple", "session"):
        rec = next(r for r in default if r["kind"] == kind) | {"persona_id": "mallory",
                                                             "updated_at": "2030-01-01T00:00:00Z"}
        with pytest.raises(aokun.InputError, match="of another persona in this file"):
            mem.import_export([json.dumps(dump[0]), json.dumps(rec, ensure_ascii=False)])
    assert lines_of(mem) == before
    # new rows of persona mallory that point at the default persona's entities, session and memories
    ent = {r["uid"] for r in default if r["kind"] == "entity"}
    triple = next(r for r in default if r["kind"] == "triple") | {
        "uid": "00000000-0000-4000-8000-0000000000a1", "persona_id": "mallory"}
    turn = next(r for r in default if r["kind"] == "turn") | {
        "uid": "00000000-0000-4000-8000-0000000000a2", "persona_id": "mallory", "turn_key": "x"}
    target = next(r["uid"] for r in default if r["kind"] == "memory")
    merged = {"kind": "memory", **{k: None for k in aokun.EXPORT_FIELDS["memory"]}} | {
        "uid": "00000000-0000-4000-8000-0000000000a3", "persona_id": "mallory", "session_id": "",
        "content": "mallory's own memory", "topics": [], "key_facts": [], "participants": [],
        "tags": [], "source": "", "importance": 0.5, "pinned": False, "archived": False,
        "merged_into": target, "created_at": "2026-03-09T00:00:00Z",
        "updated_at": "2026-03-09T00:00:00Z", "access_count": 0, "useful_count": 0}
    assert triple["subject"] in ent
    r = mem.import_export([json.dumps(dump[0]),
                           *(json.dumps(x, ensure_ascii=False) for x in (triple, turn, merged))])
    assert r["triple"]["skipped"] == 1 and r["turn"]["skipped"] == 1 and r["memory"]["added"] == 1
    assert mem.value("select count(*) from kg_triples where persona_id = 'mallory'") == 0
    assert mem.value("select count(*) from conv_turns where persona_id = 'mallory'") == 0
    assert mem.value("select merged_into from documents where uid = ?", (merged["uid"],)) is None


def test_markdown_notes_have_safe_names_and_front_matter(tmp_path, open_mem):
    mem = open_mem(tmp_path / "a.db")
    fill(mem)
    mem.memorize("../../etc/passwd\nCON: evil <script>",
                 {"summary": "../../../x/y\\z:*?", "tags": ["a b"]})
    out = mem.export_markdown(tmp_path / "notes")
    files = sorted((tmp_path / "notes").iterdir())
    assert out["files"] == len(files) == 5 and all(f.suffix == ".md" for f in files)
    assert all(f.parent == tmp_path / "notes" for f in files)  # user text never leaves the folder
    evil = next(f for f in files if "x-y-z" in f.name)
    assert ".." not in evil.name and "/" not in evil.name and "\\" not in evil.name
    note = next(f for f in files if "Alice" in f.name).read_text(encoding="utf-8")
    head, body = note.split("\n---\n", 1)
    props = dict(line.split(": ", 1) for line in head.splitlines()[1:])
    props = {k: json.loads(v) for k, v in props.items()}  # JSON values: what YAML reads too
    assert props["tags"] == ["personal_life"] and props["pinned"] is True \
        and props["topics"] == ["咖啡", "city"]
    assert "Alice 住在北京，她喜欢冰美式。" in body and "## Key facts" in body


@pytest.mark.slow
def test_cli_round_trip_through_files(tmp_path):
    ini = tmp_path / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n", encoding="utf-8")

    def cli(db, *args):
        r = subprocess.run([sys.executable, str(aokun.HERE / "aokun.py"), "--db",
                            str(tmp_path / db), "--config", str(ini), *args], capture_output=True,
                           text=True, encoding="utf-8")
        assert r.returncode == 0, r.stderr
        return r.stdout

    cli("a.db", "memorize", "王五 养了一只猫", "--participant", "王五", "--tag", "宠物")
    cli("a.db", "kg", "add", "王五", "has_pet", "猫")
    cli("a.db", "export", "--out", str(tmp_path / "a.jsonl"))
    out = json.loads(cli("b.db", "import", str(tmp_path / "a.jsonl"), "--json"))
    assert out["memory"]["added"] == 1 and out["triple"]["added"] == 1
    assert cli("b.db", "export") == (tmp_path / "a.jsonl").read_text(encoding="utf-8")
    assert cli("b.db", "export", "--out", "-") == cli("b.db", "export")  # -: standard output
    assert "1 notes" in cli("b.db", "export", "--format", "markdown", "--out", str(tmp_path / "md"))
    # an existing file, the database itself above all, is never written over
    for name in ("a.jsonl", "b.db"):
        before = (tmp_path / name).read_bytes()
        r = subprocess.run([sys.executable, str(aokun.HERE / "aokun.py"), "--db",
                            str(tmp_path / "b.db"), "--config", str(ini), "export", "--out",
                            str(tmp_path / name)], capture_output=True, text=True,
                           encoding="utf-8")
        assert r.returncode == 1 and "already exists" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""
        assert (tmp_path / name).read_bytes() == before
    assert not list(tmp_path.glob("*.partial"))


STALLING_IMPORT = r"""
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from fakes import FakeEmbedder  # puts the repository on sys.path
import aokun

class Stalls(FakeEmbedder):
    def embed_documents(self, texts):
        if self.calls == 4:  # the fifth batch: the import is killed while it waits
            print("stalled", flush=True)
            time.sleep(600)
        return super().embed_documents(texts)

m = aokun.Memory(Path(sys.argv[1]), aokun.Config(None), embedder=Stalls(16))
with open(sys.argv[2], encoding="utf-8") as f:
    m.import_export(f)
"""


@pytest.mark.slow
def test_an_import_killed_midway_then_run_again_ends_with_doctor_clean(tmp_path, open_mem):
    source = open_mem(tmp_path / "source.db")
    source.memorize_many([(f"Note {i}: the heron count at the lake was {i}.", None)
                          for i in range(300)])
    export = tmp_path / "notes.jsonl"
    export.write_text("\n".join(lines_of(source)) + "\n", encoding="utf-8")
    script = tmp_path / "stall.py"
    script.write_text(STALLING_IMPORT, encoding="utf-8")
    db = tmp_path / "target.db"
    child = subprocess.Popen([sys.executable, str(script), str(db), str(export),
                              str(Path(__file__).parent)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "stalled"
    finally:
        child.kill()  # SIGKILL: no cleanup runs
        child.wait()
    target = open_mem(db)
    assert target.value("select count(*) from documents where embedding_state = 'pending'")
    target.import_export(export.read_text(encoding="utf-8").splitlines())
    assert target.doctor() == []
    assert target.value("select count(*) from documents") == 300
