"""Test doubles shared by the test process and the child processes the crash and concurrency
tests start. Importable on its own: it puts the repository folder on sys.path first."""

import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import aokun  # noqa: E402


class FakeEmbedder(aokun.Embedder):
    """Deterministic, dependency-free embedder: each character trigram of the lower-cased text adds
    ±1 to one of `dim` buckets chosen by a hash; rows are L2-normalised float32. Texts sharing
    trigrams get similar vectors. Like the real providers it cuts input to `max_chars` and says so
    (`prepare`). `calls` counts embed_* calls, `texts` counts embedded texts."""

    provider = "fake"

    def __init__(self, dim: int = 16, model: str | None = None, max_chars: int = 8000):
        self.dim = dim
        self.model = model or f"fake-{dim}"
        self.max_chars = max_chars
        self.calls = 0
        self.texts = 0

    def prepare(self, text: str) -> tuple[str, bool]:
        return text[: self.max_chars], len(text) > self.max_chars

    def vector(self, text: str) -> np.ndarray:
        v = np.zeros(self.dim, np.float32)
        s = f"  {self.prepare(text)[0].lower()}  "
        for i in range(len(s) - 2):
            h = int.from_bytes(hashlib.blake2b(s[i:i + 3].encode("utf-8"), digest_size=8).digest(),
                               "little")
            v[h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        if not v.any():
            v[0] = 1.0
        return (v / np.linalg.norm(v)).astype(np.float32)

    def embed_documents(self, texts):
        self.calls += 1
        self.texts += len(texts)
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self.vector(t) for t in texts]).astype(np.float32)

    def embed_query(self, text):
        self.calls += 1
        self.texts += 1
        return self.vector(text)


class RefusingEmbedder(FakeEmbedder):
    """A FakeEmbedder that refuses for good any text containing `marker` (aokun.EmbeddingRejected,
    as an OpenAI-compatible server answers 400 for an input), the whole call failing as one request
    does; `refused` lists the texts it refused."""

    def __init__(self, marker: str = "REFUSE-ME", **kw):
        super().__init__(**kw)
        self.marker, self.refused = marker, []

    def embed_documents(self, texts):
        bad = [t for t in texts if self.marker.lower() in t.lower()]
        if bad:
            self.refused += bad
            raise aokun.EmbeddingRejected(f"400 Bad Request: input rejected ({len(bad)} of "
                                          f"{len(texts)})")
        return super().embed_documents(texts)


def open_memory(path, dim: int = 16, **kw) -> "aokun.Memory":
    """A Memory on `path` with default settings and a FakeEmbedder (what child processes use)."""
    return aokun.Memory(Path(path), aokun.Config(None), embedder=FakeEmbedder(dim), **kw)


# helpers shared by the test files --------------------------------------------------------------

#: Every table a memory leaves rows in (the two vec0 tables included).
ALL_TABLES = ("documents", "documents_fts", "doc_vec", "doc_vectors", "memory_atoms",
              "atom_sources", "memory_atoms_fts", "graph_nodes", "graph_edges", "graph_entries",
              "graph_entries_fts", "graph_vec", "graph_vectors", "memory_write_ops")


def count(mem, table: str, where: str = "", params=()) -> int:
    return mem.value(f"select count(*) from {table}" + (f" where {where}" if where else ""), params)


def table_counts(mem) -> dict:
    return {t: (count(mem, t) if mem.has_table(t) else 0) for t in ALL_TABLES}


def fts_ids(mem, table: str, query: str) -> list[int]:
    """Rowids of `table` (an FTS5 table) matching the user query segmented the way recall does."""
    match = aokun.fts_query(mem.seg.tokens(query))
    assert match, f"query {query!r} has no tokens"
    return [r["rowid"]
            for r in mem.rows(f"select rowid from {table} where {table} match ? order by rowid",
                              (match,))]


def doc_vector(mem, doc_id: int):
    blob = mem.value("select embedding from doc_vectors where doc_id = ?", (doc_id,))
    return None if blob is None else aokun.blob_vector(blob)



def open_at_schema(tmp_path, monkeypatch, segmenter, upto: int, name: str) -> "aokun.Memory":
    """A Memory on a new file `tmp_path/name` made by migrations 1..`upto` only (SCHEMA_DIR points
    at a copy of them until the test sets it back), with a fake 16-d embedder and no recovery."""
    import shutil
    old = tmp_path / f"schema{upto}"
    old.mkdir()
    for n, path in aokun.migrations():
        if n <= upto:
            shutil.copy(path, old / path.name)
    monkeypatch.setattr(aokun, "SCHEMA_DIR", old)
    m = aokun.Memory(tmp_path / name, aokun.Config(None), embedder=FakeEmbedder(16), recover=False)
    m.seg = segmenter
    assert m.value("pragma user_version") == upto
    return m


#: documents columns of schema 16 that this code writes: a test writing into an older file adds them
#: (event_columns) and drops them again before the file is migrated (migration 16 adds them)
EVENT_COLUMNS = ("event_at", "event_end", "project")  # and schema 20's project


def event_columns(mem, add: bool = True) -> None:
    """Add (or with add=False drop) schema 16's documents.event_at/event_end in an older file. In
    tx."""
    for column in EVENT_COLUMNS:
        mem.conn.execute(f"alter table documents add column {column} text" if add
                         else f"alter table documents drop column {column}")


def default_graph_columns_of_schema12(mem) -> None:
    """This code no longer writes graph_nodes/edges/entries' uid, created_at and updated_at (schema
    13 drops them): give them defaults in an older file so it can write there. In tx."""
    import re
    for table in ("graph_entries", "graph_edges", "graph_nodes"):
        sql = mem.value("select sql from sqlite_master where name = ?", (table,))
        mem.conn.execute(f"drop table {table}")
        mem.conn.execute(re.sub(r"(uid|created_at|updated_at)(\s+text not null)",
                                r"\1\2 default (hex(randomblob(16)))", sql))


def is_anchors(texts) -> bool:
    """Whether `texts` are rules/relevance.toml's anchors (Vectors.background embeds them once per
    process, the warm-up among the first): a test counting what a write embedded leaves them out."""
    global _ANCHORS
    if _ANCHORS is None:
        _ANCHORS = [list(t) for t in aokun.Rules(aokun.Config(None)).anchors.values()]
    return list(texts) in _ANCHORS


_ANCHORS = None

