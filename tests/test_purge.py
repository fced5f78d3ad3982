"""Deleted text does not linger: secure_delete zeroes freed bytes (on every connection), and
`delete --purge` (the real CLI) also rebuilds the briefing, merges the FTS indexes, VACUUMs and
empties the WAL, so the raw bytes of the database file and its WAL hold no trace of the deleted
memory."""

import apsw
import pytest

import aokun
from fakes import FakeEmbedder
from mcp_procs import cli, write_ini

MARKER = "Zorblatquux"  # a word no other memory, rule file or schema holds


def _raw(db) -> bytes:
    """The bytes of the database file and of its WAL (when there is one)."""
    wal = db.with_name(db.name + "-wal")
    return db.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


def _traces(raw: bytes) -> list[str]:
    """Which spellings of MARKER `raw` holds: as stored, folded/lower-cased (FTS terms), or
    UTF-16."""
    forms = {"stored": MARKER.encode(), "lower": MARKER.lower().encode(),
             "utf16": MARKER.encode("utf-16-le")}
    return [name for name, form in forms.items() if form in raw]


@pytest.mark.slow
def test_delete_purge_leaves_no_trace_in_the_file_or_the_wal(tmp_path):
    db, ini = tmp_path / "p.db", write_ini(tmp_path, "none")
    m = aokun.Memory(db, aokun.load_config(str(ini)))
    m.memorize_many([(f"Note {i}: Ines watered the ferns on day {i}.",
                      {"participants": ["Ines"], "topics": ["plants"]})
                     for i in range(30)])  # other memories around it, sharing its person and topic
    secret = m.memorize(f"The vault code word is {MARKER}, Ines said. {MARKER} opens the safe.",
                        {"participants": ["Ines"], "topics": ["plants"],
                         "key_facts": [f"The code word is {MARKER}."],
                         "summary": f"code word {MARKER}", "tags": [MARKER], "pinned": True})["id"]
    assert MARKER in m.memory_context()["text"]  # the stored briefing quotes it
    m.close()
    assert _traces(_raw(db))
    # another connection keeps the WAL file from being removed at close
    keep = apsw.Connection(str(db))
    try:
        r = cli(db, ini, "delete", str(secret), "--purge")
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"deleted {secret}\npurged: ") and "WAL keeps" not in r.stdout
        assert _traces(_raw(db)) == []
        assert keep.execute("select count(*) from documents").fetchone() == (30,)
    finally:
        keep.close()
    assert cli(db, ini, "doctor").stdout.strip() == "ok"


@pytest.mark.slow
def test_secure_delete_zeroes_freed_text_and_vectors_without_a_vacuum(tmp_path, open_mem):
    """Without VACUUM: once the FTS segments holding its words are merged away, neither its text
    (documents, FTS5 shadow tables, atoms, graph entries) nor its float vector (doc_vectors) nor its
    bit vector (vec0 chunks) is left in the file's free space."""
    m = open_mem(tmp_path / "s.db", FakeEmbedder(384))
    assert m.conn.pragma("secure_delete") == 1
    m.memorize_many([(f"Note {i}: Ines watered the ferns on day {i}.", {"participants": ["Ines"]})
                     for i in range(30)])
    filler = "It opens the old safe downstairs. " * 200
    secret = m.memorize(f"The vault code word is {MARKER}. " + filler,
                        {"participants": ["Ines"],
                         "key_facts": [f"The code word is {MARKER}."]})["id"]
    vectors = [m.value("select embedding from doc_vectors where doc_id = ?", (secret,)),
               m.value("select embedding from doc_vec where doc_id = ?", (secret,))]
    keep = apsw.Connection(str(m.path))
    try:
        m.delete(secret)
        with m.lock:
            for t in ("documents_fts", "memory_atoms_fts", "graph_entries_fts"):
                m.conn.execute(f"insert into {t}({t}) values ('optimize')")
            m.conn.execute("pragma wal_checkpoint(TRUNCATE)")
        assert m.value("pragma freelist_count") > 0  # freed pages are still in the file, zeroed
        raw = _raw(m.path)
        assert _traces(raw) == [] and [v in raw for v in vectors] == [False, False]
    finally:
        keep.close()


def test_secure_delete_is_on_for_reader_connections(tmp_path, open_mem):
    open_mem(tmp_path / "r.db")
    c = aokun.connect(tmp_path / "r.db", reader=True)
    try:
        assert c.pragma("secure_delete") == 1
    finally:
        c.close()
