"""aokun_bm25 (sql/fts5_rank.c, built on first use): the scores of FTS5's bm25() with the row
sizes held in memory; without a compiler Aokun ranks with bm25() itself, the same results."""

import json
import re

import pytest

import aokun

TABLES = ("documents_fts", "graph_entries_fts")
QUERIES = ["Alice coffee", "Bob Lisbon trip", "咖啡 小明", "budget deadline", "chess"]


def corpus(n: int, start: int = 0) -> list:
    names = ["Alice", "Bob", "Carmen", "小明", "王芳"]
    things = ["coffee", "chess", "咖啡", "the budget", "Lisbon"]
    return [(f"{names[i % 5]} talked about {things[(i // 5) % 5]} " + "and more " * (i % 4)
             + f"on trip {i}; the deadline moved {i % 3} times",
             {"participants": [names[(i + 1) % 5]]}) for i in range(start, start + n)]


def top(conn, table: str, match: str, fn: str) -> list[tuple[int, float]]:
    call = f"bm25({table})" if fn == "bm25" else f"aokun_bm25({table}, '{table}')"
    sql = f"select rowid, {call} as s from {table} where {table} match ? order by s, rowid limit 20"
    return [(r[0], r[1]) for r in conn.execute(sql, (match,))]


def assert_same(mem):
    """aokun_bm25 = bm25() on both tables: the first searches after a write size their rows
    through FTS5 and, once those add up to a quarter of the rows, from a new copy."""
    for q in QUERIES * 3:
        match = aokun.fts_query(mem.seg.tokens(q))
        for table in TABLES:
            want = top(mem.conn, table, match, "bm25")
            got = top(mem.conn, table, match, "aokun")
            assert want and [i for i, _ in got] == [i for i, _ in want], (q, table)
            assert all(abs(a - b) <= 1e-9 for (_, a), (_, b) in zip(got, want, strict=True)), q


@pytest.fixture
def ranked(tmp_path, open_mem):
    if aokun.rank_extension()[0] is None:
        pytest.skip(f"no aokun_bm25 here: {aokun.rank_extension()[1]}")
    mem = open_mem(tmp_path / "r.db")
    mem.memorize_many(corpus(60))
    return mem


@pytest.mark.slow
def test_aokun_bm25_scores_what_bm25_scores_before_and_after_writes(ranked):
    m = ranked
    assert m.conn.aokun_rank and "aokun_bm25(" in m.queries["recall_graph_keyword"]
    assert m.stats()["keyword_ranking"].startswith("aokun_bm25")
    assert_same(m)
    m.memorize_many(corpus(25, start=60))  # new rows: the sizes are read again
    assert_same(m)
    first = m.list_memories(limit=1)[0]["id"]  # its entries are indexed again: other sizes
    m.edit(first, content="Alice now drinks coffee coffee coffee every morning in Lisbon")
    assert_same(m)
    with m.tx():  # inside a transaction the sizes come from FTS5 itself
        m.conn.execute("insert into documents_fts(rowid, segmented) values (9999, 'alice coffee')")
        assert_same(m)
        m.conn.execute("delete from documents_fts where rowid = 9999")


@pytest.mark.slow
def test_the_fallback_ranks_the_same_as_the_extension(ranked, tmp_path, open_mem, monkeypatch):
    """The same file through both paths: identical recall ids and scores (1e-9)."""
    ranked.close()
    monkeypatch.setenv("AOKUN_NOW", aokun.now_iso())  # recency moves between the two recalls
    cfg = aokun.Config(None, overrides={("recall", "cache_ttl_seconds"): 0.0})
    fast = open_mem(tmp_path / "r.db", cfg=cfg)
    monkeypatch.setattr(aokun, "rank_extension", lambda: (None, "bm25() (no C compiler)"))
    slow = open_mem(tmp_path / "r.db", cfg=cfg)
    assert fast.conn.aokun_rank and slow.conn.aokun_rank is None
    assert "aokun_bm25" not in json.dumps(slow.queries)
    assert slow.stats()["keyword_ranking"] == "bm25() (no C compiler)"
    for q in QUERIES:
        for channels in (None, ["bm25"], ["graph"]):
            a = fast.recall(q, k=8, channels=channels)["results"]
            b = slow.recall(q, k=8, channels=channels)["results"]
            assert [h["id"] for h in a] == [h["id"] for h in b], (q, channels)
            assert all(abs(x["score"] - y["score"]) <= 1e-9
                       for x, y in zip(a, b, strict=True)), q


def test_a_question_of_more_than_64_words_keeps_its_keyword_channels(ranked):
    """A long question (a conversation asked as one, as MADial does) is ranked, not degraded."""
    query = "Alice coffee " + " ".join(f"word{i}" for i in range(80))
    for channels in (["bm25"], ["graph_keyword"]):
        out = ranked.recall(query, k=5, channels=channels)
        assert out["degraded"] == [] and out["results"], (channels, out["degraded"])
        # 王芳's coffee memories name Alice as a participant: they tie with Alice's own (and
        # coffee is 咖啡: rules/lexicon.toml); "the deadline moved" in a later memory of Alice's
        # may change one: it joins before it (may_be_replaced_by), whatever its words
        changers = {h.get("may_be_replaced_by") for h in out["results"]}
        assert all(re.search("coffee|咖啡", h["text"]) for h in out["results"]
                   if h["id"] not in changers)
        assert any(h["text"].startswith("Alice talked about") for h in out["results"])


def test_no_compiler_or_a_failed_build_means_bm25(tmp_path, monkeypatch, open_mem):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    path, why = aokun.rank_extension.__wrapped__()
    assert path is None and why.startswith("bm25()") and "could not build" in why
    cfg = aokun.Config(None, overrides={("storage", "rank_extension"): False})
    m = open_mem(tmp_path / "off.db", cfg=cfg)
    assert m.conn.aokun_rank is None
    assert m.stats()["keyword_ranking"].endswith("rank_extension = false)")
    m.memorize_many(corpus(10))
    assert m.recall("Alice coffee", k=3)["results"]
