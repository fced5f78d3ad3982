"""The vector store: int8 vectors in plain tables, a centred binary vec0 index searched first and
re-scored by cosine; the upgrade of files that kept float vectors inside vec0 (schema < 6)."""

import apsw
import numpy as np
import pytest
import sqlite_vec

import aokun
from fakes import FakeEmbedder, count

TEXTS = [f"{name} {verb} {thing} in {place}" for name in ("Alice", "Bob", "Carmen", "Deepak")
         for verb in ("likes", "sold", "painted") for thing in ("tea", "a bike", "the fence")
         for place in ("Oslo", "Kyoto")]  # 72 distinct memories



def drop_schema_15_and_16(c):
    """What schema 15 (superseded_by), 16 (event dates) and 20 (project) added to documents, and
    schema 19 (usage) to sync_base, dropped on `c`: an older file has none of them."""
    for index in ("documents_superseded_by", "documents_event", "documents_project"):
        c.execute(f"drop index {index}")
    for column in ("superseded_by", "event_at", "event_end", "project"):
        c.execute(f"alter table documents drop column {column}")
    c.execute("alter table sync_base drop column usage")

def _floats(mem, table="doc_vectors", key="doc_id"):
    return {r[key]: aokun.blob_vector(r["embedding"])
            for r in mem.rows(f"select {key}, embedding from {table}")}


def _bits(v: np.ndarray) -> bytes:
    """vec_quantize_binary: bit i of byte i//8 (least significant first) is v[i] > 0."""
    return np.packbits(v > 0, bitorder="little").tobytes()


def _params(mem, query: str, k: int, candidates: int) -> dict:
    vec = np.asarray(mem.embedder.embed_query(query), np.float32)
    return {"embedding": vec.tobytes(), "query_i8": aokun.vector_blob(vec), "k": k,
            "candidates": candidates,
            "persona_id": "", "max_archived": 0, "as_of": "", "max_hamming": None}


def test_index_is_centred_once_enough_vectors_exist(db_path, open_mem):
    mem = open_mem(db_path)
    mem.CENTER_AFTER = 10
    for t in TEXTS[:9]:
        mem.memorize(t)
    assert mem.meta_get("vector_center") is None
    for doc_id, v in _floats(mem).items():  # before the centre: plain sign bits
        assert mem.value("select embedding from doc_vec where doc_id = ?", (doc_id,)) == _bits(v)
    mem.memorize(TEXTS[9])
    center = np.frombuffer(bytes.fromhex(mem.meta_get("vector_center")), np.float32)
    floats = _floats(mem)
    np.testing.assert_allclose(center, np.mean(list(floats.values()), axis=0), atol=1e-6)
    for doc_id, v in floats.items():  # every row re-quantised around the centre, old and new
        assert mem.value("select embedding from doc_vec where doc_id = ?", (doc_id,)) == \
            _bits(v - center)
    for entry_id, v in _floats(mem, "graph_vectors", "entry_id").items():
        assert mem.value("select embedding from graph_vec where entry_id = ?", (entry_id,)) == \
            _bits(v - center)
    later = mem.memorize(TEXTS[10])["id"]  # later vectors use the same centre
    assert mem.value("select embedding from doc_vec where doc_id = ?", (later,)) == \
        _bits(_floats(mem)[later] - center)
    assert mem.doctor() == []


@pytest.mark.slow
def test_vector_channel_is_exact_knn_when_candidates_cover_the_file(db_path, open_mem):
    mem = open_mem(db_path)
    mem.CENTER_AFTER = 20
    for t in TEXTS:
        mem.memorize(t)
    floats = _floats(mem)
    for query in ("Who painted the fence in Kyoto?", "bike sales", "Carmen tea"):
        # the query as int8 too
        q = aokun.blob_vector(aokun.vector_blob(mem.embedder.embed_query(query)))
        rows = mem.rows(mem.queries["recall_vector"], _params(mem, query, 10, len(TEXTS)))
        # the 10 smallest cosine distances, each the distance of the memory it names (ties in any
        # order)
        nearest = sorted(1 - float(v @ q) for v in floats.values())[:10]
        np.testing.assert_allclose([r["raw"] for r in rows], nearest, atol=1e-4)
        assert all(abs(1 - float(floats[r["id"]] @ q) - r["raw"]) < 1e-4 for r in rows)
        # with fewer candidates the answer is still exact distances, best first, from the nearest
        # bits
        few = mem.rows(mem.queries["recall_vector"], _params(mem, query, 5, 12))
        assert len(few) == 5 and [r["raw"] for r in few] == sorted(r["raw"] for r in few)
        assert [r["rank"] for r in few] == list(range(5))


def _make_schema5_file(path, dim=16):
    """A file as Aokun ≤ schema 5 wrote it: float vectors inside vec0, no plain vector tables."""
    m = aokun.Memory(path, aokun.Config(None), embedder=FakeEmbedder(dim))
    ids = [m.memorize(t)["id"] for t in TEXTS[:6]]
    docs, entries = _floats(m), _floats(m, "graph_vectors", "entry_id")
    m.close()
    c = apsw.Connection(str(path))
    c.enable_load_extension(True)
    c.load_extension(sqlite_vec.loadable_path())
    c.execute("begin")
    c.execute("drop table doc_vec")
    c.execute("drop table graph_vec")
    for table, key in (("doc_vec", "doc_id"), ("graph_vec", "entry_id")):
        c.execute(f"create virtual table {table} using vec0({key} integer primary key, "
                  f"embedding float[{dim}] distance_metric=cosine, persona_id text, "
                  "session_id text, archived integer)")
    for i, v in docs.items():
        c.execute("insert into doc_vec select id, ?, persona_id, session_id, archived"
                  " from documents where id = ?", (v.tobytes(), i))
    for i, v in entries.items():
        c.execute("insert into graph_vec select id, ?, persona_id, session_id, archived"
                  " from graph_entries where id = ?", (v.tobytes(), i))
    c.execute("drop table doc_vectors")
    c.execute("drop table graph_vectors")
    c.execute("delete from meta where key in ('vector_center', 'data_version')")  # no ladder yet
    drop_schema_15_and_16(c)
    c.execute("alter table documents drop column embedding_error")  # schema 9
    c.execute("alter table graph_entries drop column embedding_error")
    c.execute("alter table documents drop column useful_count")  # schema 7
    c.execute("alter table documents drop column last_useful_at")
    for table in ("conv_turn_vectors", "conv_turns_fts", "conv_turns", "conv_sessions",
                  "conv_files"):  # schema 10
        c.execute(f"drop table {table}")
    c.execute("pragma user_version = 5")
    c.execute("commit")
    c.close()
    return ids, docs, entries


@pytest.mark.slow
def test_schema5_file_is_upgraded_without_losing_a_vector(tmp_path):
    path = tmp_path / "old.db"
    ids, docs, entries = _make_schema5_file(path)
    mem = aokun.Memory(path, aokun.Config(None), embedder=FakeEmbedder(16))
    try:
        assert mem.value("pragma user_version") == aokun.schema_version_known()
        assert "bit[16]" in mem.value("select sql from sqlite_master where name = 'doc_vec'")
        assert _floats(mem).keys() == docs.keys()
        for i, v in _floats(mem).items():
            np.testing.assert_array_equal(v, docs[i])
        for i, v in _floats(mem, "graph_vectors", "entry_id").items():
            np.testing.assert_array_equal(v, entries[i])
        assert count(mem, "doc_vec") == len(docs) and count(mem, "graph_vec") == len(entries)
        assert mem.doctor() == []
        assert list((tmp_path / "backups").glob("old-schema5-*.db"))  # the pre-upgrade file is kept
        hit = mem.recall(TEXTS[3], k=1, channels="vector")["results"]
        assert [h["id"] for h in hit] == [ids[3]]
        new = mem.memorize("Elena fixed the boiler in Lisbon")
        assert new["embedding"] == "done" and count(mem, "doc_vectors") == len(docs) + 1
    finally:
        mem.close()
    # upgrading twice is a no-op
    reopened = aokun.Memory(path, aokun.Config(None), embedder=FakeEmbedder(16))
    try:
        assert count(reopened, "doc_vectors") == len(docs) + 1 and reopened.doctor() == []
    finally:
        reopened.close()


def test_dimension_not_divisible_by_8_degrades_to_keywords_and_keeps_the_memory(db_path, open_mem):
    mem = open_mem(db_path, FakeEmbedder(12))
    assert "divisible by 8" in mem.vector_problem and not mem.has_table("doc_vec")
    r = mem.memorize("Twelve dimensions cannot be packed into bytes")
    assert mem.get(r["id"])["content"] == "Twelve dimensions cannot be packed into bytes"
    out = mem.recall("twelve dimensions")
    assert [h["id"] for h in out["results"]] == [r["id"]]
    assert {d["channel"] for d in out["degraded"]} == {"vector", "graph_vector"}
    assert all("divisible by 8" in d["reason"] for d in out["degraded"])


@pytest.mark.slow
def test_schema5_upgrade_raced_by_another_process_opens_cleanly(tmp_path):
    """Two servers started on a schema-5 file: the second may read the old layout just before the
    first one's upgrade commits; it must then find the work done, not copy the binary index rows
    into doc_vectors as if they were float vectors (the transaction failed and the open raised)."""
    path = tmp_path / "old.db"
    ids, docs, entries = _make_schema5_file(path)

    class Raced(aokun.Memory):
        raced = False

        def value(self, sql, params=()):
            v = super().value(sql, params)
            if "name = 'doc_vec'" in sql and not Raced.raced:
                Raced.raced = True  # the other process upgrades right after this one looked
                aokun.Memory(path, aokun.Config(None), embedder=FakeEmbedder(16)).close()
            return v

    mem = Raced(path, aokun.Config(None), embedder=FakeEmbedder(16))
    try:
        assert Raced.raced
        for i, v in _floats(mem).items():
            np.testing.assert_array_equal(v, docs[i])
        assert _floats(mem).keys() == docs.keys() and count(mem, "graph_vec") == len(entries)
        assert mem.doctor() == []
        assert [h["id"] for h in mem.recall(TEXTS[3], k=1, channels="vector")["results"]] == \
            [ids[3]]
    finally:
        mem.close()


def test_vectors_are_stored_as_int8(db_path, open_mem):
    """One byte per dimension, in both vector tables; the format is recorded in meta."""
    mem = open_mem(db_path)
    mem.memorize("Alice likes tea in Oslo. Bob sold a bike in Kyoto.")
    assert mem.meta_get("vector_format") == "int8"
    blobs = [r["embedding"] for r in mem.rows("select embedding from doc_vectors union all "
                                              "select embedding from graph_vectors")]
    assert len(blobs) >= 3 and all(len(b) == 16 for b in blobs)
    # scaled to the range
    assert all(max(abs(x) for x in np.frombuffer(b, np.int8)) == 127 for b in blobs)


@pytest.mark.slow
def test_float32_file_is_compacted_at_open_and_vacuum_gives_the_space_back(db_path, open_mem):
    """A file of schema < 11 (float32 vectors, every finished journal payload kept) is converted
    when it is opened: int8 vectors, the same recall answers, done payloads dropped; vacuum shrinks
    it."""
    dim = 256  # big vectors, so the float32 pages dominate the file
    mem = open_mem(db_path, FakeEmbedder(dim))
    mem.CENTER_AFTER = 10
    mem.memorize_many([(t, None) for t in TEXTS])
    top = [r["id"] for r in mem.recall("Carmen painted the fence", k=5,
                                       channels=["vector"])["results"]]
    mem.close()
    c = apsw.Connection(str(db_path))
    c.enable_load_extension(True)
    c.load_extension(sqlite_vec.loadable_path())
    with c:  # what a schema-10 file holds: float32 vectors and the payloads of finished writes
        for table, key in (("doc_vectors", "doc_id"), ("graph_vectors", "entry_id")):
            for row_id, blob in c.execute(f"select {key}, embedding from {table}").fetchall():
                c.execute(f"update {table} set embedding = ? where {key} = ?",
                          (aokun.blob_vector(blob).tobytes(), row_id))
        c.execute("update memory_write_ops set payload = json_object('content', "
                  "(select content from documents where id = document_id), "
                  "'pad', hex(randomblob(500)))")
        c.execute("delete from meta where key in ('vector_format', 'data_version')")
        drop_schema_15_and_16(c)
        c.execute("pragma user_version = 10")
    c.execute("vacuum")
    vector_bytes = "select sum(pgsize) from dbstat where name in ('doc_vectors', 'graph_vectors')"
    before = c.execute(vector_bytes).fetchone()[0]
    c.close()
    mem = open_mem(db_path, FakeEmbedder(dim))
    assert mem.meta_get("vector_format") == "int8"
    assert mem.value("select count(*) from doc_vectors where length(embedding) != ?", (dim,)) == 0
    assert mem.value("select count(*) from graph_vectors where length(embedding) != ?", (dim,)) == 0
    assert mem.value("select count(*) from memory_write_ops where payload != '{}'") == 0
    assert [r["id"] for r in mem.recall("Carmen painted the fence", k=5,
                                        channels=["vector"])["results"]] == top
    sizes = mem.vacuum()
    assert sizes["after_bytes"] < sizes["before_bytes"] - 0.5 * before
    assert mem.value(vector_bytes) <= 0.4 * before and mem.value("pragma freelist_count") == 0
    mem.memorize("A new memory after the conversion.")
    assert mem.value("select count(*) from memory_write_ops where payload != '{}'") == 0
