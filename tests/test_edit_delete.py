"""Edit, delete, pin/archive: nothing stale stays searchable, nothing is orphaned."""

import datetime as dt

import numpy as np
import pytest

import aokun
from fakes import ALL_TABLES, count, doc_vector, fts_ids, table_counts

OLD = "Alice drinks oolong tea every morning. She keeps a jar of tieguanyin at her desk."
NEW = "Alice drinks espresso every morning now. She keeps a moka pot at her desk."


def _entry_ids(mem, doc_id):
    return [r["id"]
            for r in mem.rows("select id from graph_entries where document_id = ? order by id",
                              (doc_id,))]


def _atom_ids(mem, doc_id):
    return [r["atom_id"]
            for r in mem.rows("select atom_id from atom_sources where document_id = ? order by "
                              "atom_id",
                                           (doc_id,))]


def _in(ids):
    return "(" + ",".join(str(int(i)) for i in ids) + ")" if ids else "(null)"


def test_edit_replaces_fts_vector_atoms_and_graph(mem, fake_embedder):
    other = mem.memorize("Bob prefers green tea", {"participants": ["Bob"], "topics": ["tea"]})
    r = mem.memorize(OLD, {"participants": ["Alice"], "topics": ["tea", "oolong"],
                           "timestamp": "2026-02-01T00:00:00Z"})
    doc_id, uid = r["id"], r["uid"]
    old_entries = mem.rows("select id from graph_entries where document_id = ?", (doc_id,))
    assert fts_ids(mem, "documents_fts", "oolong") == [doc_id]
    assert len(_atom_ids(mem, doc_id)) == 2

    res = mem.edit(doc_id, NEW, {"topics": ["coffee"]})
    assert res["id"] == doc_id and res["uid"] == uid and res["status"] == "done" \
        and res["embedding"] == "done"

    d = mem.get(doc_id)
    assert d["content"] == NEW and d["topics"] == ["coffee"] and d["participants"] == ["Alice"]
    assert d["created_at"] == "2026-02-01T00:00:00Z"  # when it happened does not change
    # FTS: the old words are gone everywhere, the new ones are found
    for table in ("documents_fts", "memory_atoms_fts", "graph_entries_fts"):
        assert fts_ids(mem, table, "oolong") == [], table
        assert fts_ids(mem, table, "tieguanyin") == [], table
    assert fts_ids(mem, "documents_fts", "espresso") == [doc_id]
    assert fts_ids(mem, "documents_fts", "coffee") == [doc_id]
    assert fts_ids(mem, "documents_fts", "tea") == [other["id"]]
    # vector
    # (the vector text is the memory followed by its labels: topics, tags, sentiment)
    np.testing.assert_allclose(doc_vector(mem, doc_id), fake_embedder.vector(NEW + "\ncoffee"),
                               atol=0.01)
    assert not np.allclose(doc_vector(mem, doc_id), fake_embedder.vector(OLD), atol=1e-3)
    # atoms: re-derived from the new sentences, the old ones deleted
    atoms = mem.rows("select id, content from memory_atoms where id in "
                     f"{_in(_atom_ids(mem, doc_id))} order by id")
    assert [a["content"] for a in atoms] == ["Alice drinks espresso every morning now.",
                                             "She keeps a moka pot at her desk."]
    assert count(mem, "memory_atoms", "content like '%oolong%' or content like '%tieguanyin%'") == 0
    assert count(mem, "memory_atoms") == 1 + 2 and count(mem, "memory_atoms_fts") == 1 + 2
    # graph: new entries, old ones (and their FTS rows and vectors) gone, orphaned topic node
    # removed
    new_entries = mem.rows("select id, text from graph_entries where document_id = ?", (doc_id,))
    assert {e["id"] for e in new_entries}.isdisjoint(e["id"] for e in old_entries)
    assert count(mem, "graph_entries_fts") == count(mem, "graph_entries")
    assert count(mem, "graph_vec") == count(mem, "graph_entries",
                                            "node_id in (select id from graph_nodes where "
                                            "node_type = 'fact')")
    # every FTS row belongs to the new text (the index keeps no copy: ask it per word)
    for e in new_entries:
        for word in set(mem.seg.segmented(e["text"]).split()):
            assert e["id"] in fts_ids(mem, "graph_entries_fts", word), (word, e["text"])
    assert not fts_ids(mem, "graph_entries_fts", "oolong")
    texts = [r["text"] for r in mem.rows("select text from graph_entries where document_id = ?",
                                         (doc_id,))]
    assert any(t.startswith("Topic: coffee.") for t in texts) \
        and not any("oolong" in t for t in texts)
    topics = {r["canonical"]
              for r in mem.rows("select canonical from graph_nodes where node_type = 'topic'")}
    # 'tea' still used by the other memory, 'oolong' orphaned and gone
    assert topics == {"tea", "coffee"}
    # journal: insert + edit, both done
    journal = mem.rows("select op, status from memory_write_ops where document_id = ? order by id",
                       (doc_id,))
    assert [(j["op"], j["status"]) for j in journal] == [("insert", "done"), ("edit", "done")]
    assert mem.doctor() == []


def test_edit_metadata_only_keeps_content_and_reindexes(mem):
    r = mem.memorize("Gina runs on Tuesdays", {"importance": 0.2, "tags": ["sport"]})
    mem.edit(r["id"], None, {"importance": 0.9, "tags": ["health"], "summary": "weekly run"})
    d = mem.get(r["id"])
    assert d["content"] == "Gina runs on Tuesdays" and d["importance"] == 0.9 \
        and d["tags"] == ["health"]
    assert fts_ids(mem, "documents_fts", "health") == [r["id"]]  # tags and summary are indexed
    assert fts_ids(mem, "documents_fts", "sport") == []
    assert mem.value("select importance from memory_atoms") == 0.9
    assert mem.doctor() == []


def test_edit_refusals(mem):
    a = mem.memorize("first text", {"persona_id": "p"})
    b = mem.memorize("second text", {"persona_id": "p"})
    with pytest.raises(aokun.InputError) as e:
        mem.edit(b["id"], "first text", persona_id="p")
    assert e.value.field == "content"
    with pytest.raises(aokun.InputError) as e:
        mem.edit(a["id"], None, {"persona_id": "q"}, "p")
    assert e.value.field == "metadata.persona_id"
    with pytest.raises(aokun.InputError) as e:
        mem.edit(a["id"], None, {"importance": 5}, "p")
    assert e.value.field == "metadata.importance"
    assert mem.get(b["id"], "p")["content"] == "second text" \
        and mem.get(a["id"], "p")["importance"] == 0.5
    assert count(mem, "memory_write_ops") == 2


def test_edit_keeps_archived_state_in_every_index(mem):
    r = mem.memorize("Hana archived memory", {"participants": ["Hana"]})
    mem.set_flag(r["id"], "archived", True)
    mem.edit(r["id"], "Hana archived memory, edited")
    assert mem.get(r["id"])["archived"] is True
    assert mem.value("select archived from doc_vec where doc_id = ?", (r["id"],)) == 1
    assert {e["archived"]
            for e in mem.rows("select archived from graph_entries where document_id = ?",
                              (r["id"],))} == {1}
    assert {v["archived"] for v in mem.rows("select archived from graph_vec")} == {1}


def test_delete_leaves_no_orphans_in_any_table(mem):
    a = mem.memorize(OLD, {"participants": ["Alice", "Bob"], "topics": ["tea"], "tags": ["drinks"]})
    b = mem.memorize("Alice went hiking in the hills on Saturday", {"participants": ["Alice"]})
    mem.edit(a["id"], OLD + " Sometimes she adds milk.")  # a second journal row for a
    a_entries, a_atoms = _entry_ids(mem, a["id"]), _atom_ids(mem, a["id"])
    alice = mem.value("select id from graph_nodes where canonical = 'alice'")
    assert a_entries and a_atoms and alice

    out = mem.delete(a["id"])
    assert out == {"id": a["id"], "uid": a["uid"], "deleted": True}
    d = a["id"]
    checks = {
        "documents": count(mem, "documents", "id = ?", (d,)),
        "documents_fts": count(mem, "documents_fts", "rowid = ?", (d,)),
        "doc_vec": count(mem, "doc_vec", "doc_id = ?", (d,)),
        "doc_vectors": count(mem, "doc_vectors", "doc_id = ?", (d,)),
        "memory_atoms": count(mem, "memory_atoms", f"id in {_in(a_atoms)} or document_id = ?",
                              (d,)),
        "atom_sources": count(mem, "atom_sources", "document_id = ?", (d,)),
        "memory_atoms_fts": count(mem, "memory_atoms_fts", f"rowid in {_in(a_atoms)}"),
        "graph_nodes": count(mem, "graph_nodes", "canonical in ('bob', 'tea')"),
        "graph_edges": count(mem, "graph_edges", "document_id = ?", (d,)),
        "graph_entries": count(mem, "graph_entries", "document_id = ?", (d,)),
        "graph_entries_fts": count(mem, "graph_entries_fts", f"rowid in {_in(a_entries)}"),
        "graph_vec": count(mem, "graph_vec", f"entry_id in {_in(a_entries)}"),
        "graph_vectors": count(mem, "graph_vectors", f"entry_id in {_in(a_entries)}"),
        "memory_write_ops": count(mem, "memory_write_ops", "document_id = ?", (d,)),
    }
    assert set(checks) == set(ALL_TABLES)
    assert checks == {t: 0 for t in ALL_TABLES}
    # global orphan checks: every derived row points at something that exists
    assert count(mem, "documents_fts", "rowid not in (select id from documents)") == 0
    assert count(mem, "doc_vec", "doc_id not in (select id from documents)") == 0
    assert count(mem, "doc_vectors", "doc_id not in (select id from documents)") == 0
    assert count(mem, "memory_atoms_fts", "rowid not in (select id from memory_atoms)") == 0
    assert count(mem, "atom_sources", "document_id not in (select id from documents)") == 0
    assert count(mem, "graph_entries_fts", "rowid not in (select id from graph_entries)") == 0
    assert count(mem, "graph_vec", "entry_id not in (select id from graph_entries)") == 0
    assert count(mem, "graph_vectors", "entry_id not in (select id from graph_entries)") == 0
    assert count(mem, "graph_edges", "source_id not in (select id from graph_nodes) "
                                     "or target_id not in (select id from graph_nodes)") == 0
    assert count(mem, "graph_nodes",
                 "id not in (select node_id from graph_entries where node_id is not null) "
                                     "and id not in (select source_id from graph_edges) "
                                     "and id not in (select target_id from graph_edges)") == 0
    # what b uses survives
    assert mem.value("select id from graph_nodes where canonical = 'alice'") == alice
    assert fts_ids(mem, "documents_fts", "hiking") == [b["id"]]
    assert fts_ids(mem, "documents_fts", "oolong") == []
    assert fts_ids(mem, "graph_entries_fts", "oolong") == []
    assert fts_ids(mem, "memory_atoms_fts", "oolong") == []
    assert mem.rows("select uid, table_name from tombstones") == \
        [{"uid": a["uid"], "table_name": "documents"}]
    assert mem.doctor() == []

    mem.delete(b["id"])
    assert table_counts(mem) == {t: 0 for t in ALL_TABLES}
    # and any table added later: with no memories left, only these may hold rows
    survivors = {"meta", "tombstones", "briefings", "kg_entities", "kg_triples", "consolidations"}
    virtual = [r["name"]
               for r in mem.rows("select name from sqlite_master where type = 'table' and sql like "
                                           "'create virtual table%'")]
    tables = [r["name"]
              for r in mem.rows("select name from sqlite_master where type = 'table' and name not "
                                "like "
                                          "'sqlite%'")
              if not any(r["name"].startswith(v + "_") for v in virtual)]
    assert set(ALL_TABLES) <= set(tables)
    assert {t for t in tables if count(mem, t)} <= survivors
    assert {r["uid"] for r in mem.rows("select uid from tombstones")} == {a["uid"], b["uid"]}
    assert mem.doctor() == []
    with pytest.raises(aokun.NotFound):
        mem.delete(a["id"])


def test_delete_then_memorize_same_text_is_new(mem):
    a = mem.memorize("ephemeral note")
    mem.delete(a["id"])
    b = mem.memorize("ephemeral note")
    assert b["deduplicated"] is False and b["uid"] != a["uid"]
    assert mem.doctor() == []


def _flags(mem, doc_id):
    entries = _entry_ids(mem, doc_id)
    return {
        "pinned": mem.value("select pinned from documents where id = ?", (doc_id,)),
        "archived": mem.value("select archived from documents where id = ?", (doc_id,)),
        "doc_vec": mem.value("select archived from doc_vec where doc_id = ?", (doc_id,)),
        "graph_entries": {r["archived"]
                          for r in mem.rows("select archived from graph_entries where id in "
                                            f"{_in(entries)}")},
        "graph_vec": {r["archived"]
                      for r in mem.rows("select archived from graph_vec where entry_id in "
                                        f"{_in(entries)}")},
    }


def test_pin_and_archive_flip_every_copy_of_the_flag(mem):
    r = mem.memorize("Ivan's birthday is on 3 March",
                     {"participants": ["Ivan"], "topics": ["birthday"]})
    other = mem.memorize("Judy's birthday is in May", {"participants": ["Judy"]})
    d = r["id"]
    assert _flags(mem, d) == \
        {"pinned": 0, "archived": 0, "doc_vec": 0, "graph_entries": {0}, "graph_vec": {0}}

    assert mem.set_flag(d, "pinned", True) == {"id": d, "uid": r["uid"], "pinned": True}
    assert _flags(mem, d) == \
        {"pinned": 1, "archived": 0, "doc_vec": 0, "graph_entries": {0}, "graph_vec": {0}}
    assert mem.get(d)["pinned"] is True
    mem.set_flag(d, "pinned", False)
    assert _flags(mem, d)["pinned"] == 0

    assert mem.set_flag(d, "archived", True)["archived"] is True
    assert _flags(mem, d) == \
        {"pinned": 0, "archived": 1, "doc_vec": 1, "graph_entries": {1}, "graph_vec": {1}}
    # vec0 filters on the metadata column inside SQL
    q = np.asarray(mem.embedder.embed_query("Ivan's birthday is on 3 March"), np.float32).tobytes()
    live = [x["doc_id"]
            for x in mem.rows("select doc_id from doc_vec where embedding match "
                              "vec_quantize_binary(?) "
                                          "and k = 10 and archived = 0", (q,))]
    assert live == [other["id"]]
    assert d not in [x["id"] for x in mem.list_memories()]
    assert d in [x["id"] for x in mem.list_memories(include_archived=True)]
    assert _flags(mem, other["id"])["archived"] == 0  # the other memory is untouched

    mem.set_flag(d, "archived", False)
    assert _flags(mem, d) == \
        {"pinned": 0, "archived": 0, "doc_vec": 0, "graph_entries": {0}, "graph_vec": {0}}
    assert mem.doctor() == []


@pytest.mark.parametrize("call", [
    lambda m: m.get(999),
    lambda m: m.edit(999, "x"),
    lambda m: m.delete(999),
    lambda m: m.set_flag(999, "pinned", True),
    lambda m: m.set_flag(999, "archived", True),
], ids=["get", "edit", "delete", "pin", "archive"])
def test_missing_id_is_not_found(mem, call):
    mem.memorize("something that exists")
    with pytest.raises(aokun.NotFound) as e:
        call(mem)
    assert "999" in str(e.value)
    assert count(mem, "tombstones") == 0 and count(mem, "memory_write_ops") == 1


def test_non_integer_id_is_input_error(mem):
    with pytest.raises(aokun.InputError) as e:
        mem.get("1")
    assert e.value.field == "id"


FACT1 = "Kim lives in the Pudong district of Shanghai near the river"
FACT2 = "Kim lives in the Pudong district of Shanghai near the big river"


@pytest.mark.parametrize("delete_first", [False, True],
                         ids=["delete-reinforcer", "delete-original"])
def test_delete_reinforcing_memory_decrements_and_keeps_atom(mem, delete_first):
    a = mem.memorize("note one", {"key_facts": [FACT1]})
    b = mem.memorize("note two", {"key_facts": [FACT2]})
    atom = mem.rows("select * from memory_atoms")
    assert len(atom) == 1 and atom[0]["reinforcement_count"] == 1
    gone, kept = (a, b) if delete_first else (b, a)
    mem.delete(gone["id"])
    after = mem.rows("select * from memory_atoms")
    assert len(after) == 1 and after[0]["id"] == atom[0]["id"]
    assert after[0]["reinforcement_count"] == 0
    # the TTL the reinforcement added is taken back: base × (0.5 + importance) from the last
    # reinforcement
    ttl = aokun.effective_ttl_days(after[0]["base_ttl_days"], after[0]["importance"], 0)
    assert after[0]["expires_at"] < atom[0]["expires_at"]
    assert after[0]["expires_at"] == aokun.iso(aokun.parse_time(after[0]["last_reinforced_at"])
                                               + dt.timedelta(days=ttl))
    assert after[0]["document_id"] == kept["id"]  # the first source moves to a living document
    assert after[0]["content"] == FACT1
    assert mem.rows("select document_id from atom_sources") == [{"document_id": kept["id"]}]
    assert fts_ids(mem, "memory_atoms_fts", "Pudong") == [atom[0]["id"]]
    assert mem.get(kept["id"])["atoms"][0]["id"] == atom[0]["id"]
    assert mem.doctor() == []
    mem.delete(kept["id"])
    assert count(mem, "memory_atoms") == 0 and count(mem, "memory_atoms_fts") == 0
    assert mem.doctor() == []


def test_edit_of_reinforcer_moves_its_reinforcement(mem):
    mem.memorize("note one", {"key_facts": [FACT1]})
    b = mem.memorize("note two", {"key_facts": [FACT2]})
    mem.edit(b["id"], None, {"key_facts": ["Kim adopted a grey cat named Mochi"]})
    atoms = mem.rows("select content, reinforcement_count from memory_atoms order by id")
    assert atoms == [{"content": FACT1, "reinforcement_count": 0},
                     {"content": "Kim adopted a grey cat named Mochi", "reinforcement_count": 0}]
    assert mem.doctor() == []


def test_deleted_memory_id_is_never_reused(mem):
    mem.memorize("one")
    b = mem.memorize("two")
    mem.delete(b["id"])
    c = mem.memorize("three")
    assert c["id"] != b["id"]


def test_edit_timestamp_moves_the_memory_and_its_context_follows(db_path, open_mem):
    """edit(metadata.timestamp) was accepted and reported done, but documents.created_at kept the
    old time while the atoms, the fact entries' "Context:" and the document vector were computed at
    the new one: the vector differed from what `rebuild --vectors` makes."""
    import numpy as np
    mem = open_mem(db_path)
    a = mem.memorize("We planned the trip to Lisbon",
                     {"session_id": "t", "timestamp": "2025-05-01T10:00:00Z"})["id"]
    b = mem.memorize("Yes, last May we booked the hotel",
                     {"session_id": "t", "timestamp": "2025-05-01T10:05:00Z"})["id"]
    mem.edit(b, metadata={"timestamp": "2025-04-01T09:00:00Z"})  # now before a: a's context is b
    mem.wait_refresh()  # a's vector is re-embedded in the background
    assert mem.get(b)["created_at"] == "2025-04-01T09:00:00Z"
    assert mem.value("select created_at from memory_atoms where document_id = ?", (b,)) == \
        "2025-04-01T09:00:00Z"
    assert "Context: Yes, last May we booked the hotel" in mem.value(
        "select text from graph_entries where document_id = ? and text like 'Fact:%'", (a,))
    vec = {r["doc_id"]: bytes(r["embedding"])
           for r in mem.rows("select doc_id, embedding from doc_vectors")}
    mem.rebuild(vectors=True)
    again = {r["doc_id"]: bytes(r["embedding"])
             for r in mem.rows("select doc_id, embedding from doc_vectors")}
    assert all(np.allclose(aokun.blob_vector(vec[i]), aokun.blob_vector(again[i])) for i in (a, b))
    assert mem.doctor() == []
