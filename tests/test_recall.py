"""Recall end to end on real temp databases: hostile keyword queries, the channels' shared columns,
MMR, persona/session/archive filters, the k cap, degradation when embeddings are unavailable, the
answer cache, explain, session neighbours, RRF fusion, search_atoms, the recall CLI and the example
config. The fake embedder or provider = none keeps it fast."""

import configparser
import datetime as dt
import json
import math
import re
import socket
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import aokun
from fakes import FakeEmbedder

KEYWORD = ("bm25", "graph_keyword")  #: the channels that run without an embedder
CHANNEL_QUERY = {"bm25": "recall_bm25", "vector": "recall_vector",
                 "graph_keyword": "recall_graph_keyword",
                 "graph_vector": "recall_graph_vector"}
COLUMNS = ["id", "channel", "rank", "raw", "confidence", "complete", "reach"]
T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
FROM_CONFIG = object()  #: make(embedder=FROM_CONFIG): let Memory build the embedder from the config


@pytest.fixture
def make(tmp_path, open_mem):
    """make(path=None, embedder=None, **{"section.key": value}) -> Memory with those config
    overrides; a FakeEmbedder(16) unless `embedder` is given (aokun.Embedder() = provider none,
    FROM_CONFIG = whatever [embedding] says). Shares the session's loaded jieba; closed after."""
    def factory(path=None, embedder=None, **overrides):
        cfg = aokun.Config(None, overrides={tuple(k.split(".")): v for k, v in overrides.items()})
        chosen = aokun.make_embedder(cfg) if embedder is FROM_CONFIG else embedder
        return open_mem(path or tmp_path / "r.db", chosen, cfg=cfg)
    return factory


def ids(out) -> list[int]:
    return [h["id"] for h in out["results"]]


def channel_params(m, query: str, k: int = 5, persona: str = "", session: str = "",
                   archived: bool = False) -> dict:
    """The parameters recall() binds to the channel queries, built independently here."""
    r = m.cfg.recall
    emb = m.embedder.embed_query(m.embedder.prepare(query)[0]).astype("float32").tobytes() \
        if m.embedder.provider != "none" else None
    return {"match": aokun.fts_query(m.seg.tokens(query)), "persona_id": persona,
            "terms": list(dict.fromkeys(m.seg.tokens(query))),
            "session_id": session,
            "max_archived": int(archived), "as_of": "", "k": min(4096, max(r.channel_k, 2 * k)),
            "expansion": r.graph_expansion_limit, "extra": r.graph_extra_entry_boost, "hop": 0.5,
            "embedding": emb, "candidates": r.vector_candidates, "hub_limit": r.graph_hub_limit,
            "pool": 0, "max_hamming": None, "rest": None, "rest_bound": None, "phrases": None,
            "query_i8": None if emb is None else aokun.vector_blob(np.frombuffer(emb, np.float32))}


# 1. hostile keyword queries ----------------------------------------------------------------------

CORPUS = {
    "order": "Ticket ORDER-7731 was refunded",
    "agent": "We built a multi-agent planner",
    "secret": "the 口令 is 闪电阻尼器",
    "mail": "mail ops@example.org for access",
    "temp": r"the files in C:\temp are logs",
    "sale": "50% off the winter coats",
    "rain": "it's raining in Hamburg",
    "not": "Do NOT reboot the router",
}
WORD_QUERIES = [("ORDER-7731", "order"), ("multi-agent", "agent"), ("order:7731", "order"),
                ("NOT", "not"), ("50%", "sale"), (r"C:\temp", "temp"), ("ops@example.org", "mail"),
                ("口令", "secret"),
                ("闪电阻尼器", "secret")]
NO_WORD_QUERIES = ["(", "*", '"', "...", "!!!",
                   "AND", "it's"]  # stop words only: not indexed either, so nothing can match them


@pytest.fixture(scope="module")
def keyword_mem(tmp_path_factory, segmenter):
    """The CORPUS under provider none (keyword channels only), no access bookkeeping."""
    cfg = aokun.Config(None, overrides={("recall", "reinforce_on_recall"): False})
    m = aokun.Memory(tmp_path_factory.mktemp("kw") / "kw.db", cfg, embedder=aokun.Embedder())
    m.seg = segmenter
    m.doc = {name: m.memorize(text)["id"] for name, text in CORPUS.items()}
    yield m
    m.close()


@pytest.mark.parametrize("query,expected", WORD_QUERIES + [(q, None) for q in NO_WORD_QUERIES],
                         ids=[q for q, _ in WORD_QUERIES] + NO_WORD_QUERIES)
def test_hostile_queries_never_raise_and_find_their_memory(keyword_mem, query, expected):
    m = keyword_mem
    out = m.recall(query, k=5, channels=list(KEYWORD))
    assert isinstance(out["results"], list)
    assert out["degraded"] == [], out["degraded"]  # no SQL error passed off as "no results"
    if expected is None:
        assert out["results"] == []
        assert any("no searchable words" in w for w in out["warnings"]), out["warnings"]
    else:
        assert out["results"], f"{query!r} found nothing"
        assert out["results"][0]["id"] == m.doc[expected], [h["text"] for h in out["results"]]
        assert out["warnings"] == []
    # all four channels: only the two vector channels may degrade, and only for the missing provider
    full = m.recall(query, k=5)
    assert ids(full) == ids(out)
    if expected is not None:
        assert {d["channel"] for d in full["degraded"]} == {"vector", "graph_vector"}
        assert all("provider" in d["reason"] and "SQL" not in d["reason"] for d in full["degraded"])


# 2. every channel returns the same columns -------------------------------------------------------

def test_channels_return_the_same_columns(make):
    m = make()
    for i, text in enumerate(["Alice reviewed the Falcon deploy checklist.",
                              "The Falcon deploy failed on Friday.",
                              "Bob fixed the Falcon deploy script."]):
        m.memorize(text, {"session_id": "s1", "participants": ["Alice"],
                          "topics": ["Falcon deploy"],
                          "timestamp": aokun.iso(T0 + dt.timedelta(minutes=i))})
    params = channel_params(m, "Falcon deploy", session="s1")
    names = dict(CHANNEL_QUERY, vector_session="recall_vector_session")
    for label, name in names.items():
        for p in (params, dict(params, session_id="")):
            if name == "recall_vector_session" and not p["session_id"]:
                continue
            rows = m.rows(m.queries[name], p)
            assert rows, f"{name} found nothing"
            channel = "vector" if label == "vector_session" else label
            for row in rows:
                assert list(row) == COLUMNS, (name, list(row))
                assert row["channel"] == channel
                assert 0.0 <= row["confidence"] <= 1.0
                assert m.value("select 1 from documents where id = ?", (row["id"],)) == 1
            assert [r["rank"] for r in rows] == list(range(len(rows))), name
            # rank 0 = best: bm25/distance ascending, graph keyword descending
            raws = [r["raw"] for r in rows]
            assert raws == sorted(raws, reverse=(channel == "graph_keyword")), (name, raws)
            assert len({r["id"] for r in rows}) == len(rows), f"{name} repeats a memory"


# 3. MMR ------------------------------------------------------------------------------------------

DUPS = [f"The Falcon deploy pipeline failed at the lint step on {d}"
        for d in ("Monday", "Tuesday", "Wednesday", "Thursday")]
DISTINCT = ["Falcon deploy rollback uses a blue green switch",
            "Ask Priya before any Falcon deploy to production"]


@pytest.mark.parametrize("lam", [0.7, 1.0])
def test_mmr_removes_near_duplicates(make, lam, monkeypatch):
    # equal ages: relevance alone orders the duplicates
    monkeypatch.setenv("AOKUN_NOW", aokun.iso(T0))
    m = make(**{"recall.mmr_lambda": lam, "recall.reinforce_on_recall": False})
    dup_ids = {m.memorize(t)["id"] for t in DUPS}
    distinct_ids = {m.memorize(t)["id"] for t in DISTINCT}
    out = m.recall("Falcon deploy pipeline lint", k=3, explain=True)
    top = ids(out)
    assert len(top) == 3
    fused = {h["id"]: h["explain"]["fused"]
             for h in m.recall("Falcon deploy pipeline lint", k=6, explain=True)["results"]}
    assert set(fused) == dup_ids | distinct_ids
    # the near-duplicates are the most relevant, so only diversity can push one out of the top 3
    assert min(fused[i] for i in dup_ids) > max(fused[i] for i in distinct_ids), fused
    if lam == 1.0:
        assert set(top) <= dup_ids
        assert top == sorted(dup_ids, key=lambda i: -fused[i])[:3]  # pure relevance order
        assert [h["explain"]["mmr"] for h in out["results"]] == \
            [h["explain"]["fused"] for h in out["results"]]
    else:
        assert len(set(top) & dup_ids) <= 2, [h["text"] for h in out["results"]]
        assert set(top) & distinct_ids
        assert top[0] in dup_ids and fused[top[0]] == max(fused.values())
        mmrs = [h["explain"]["mmr"] for h in out["results"]]
        assert mmrs == sorted(mmrs, reverse=True)
        assert mmrs[0] == pytest.approx(lam * fused[top[0]])


# 4. filters --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_persona_filter_never_leaks_even_for_small_k(make):
    m = make(**{"recall.reinforce_on_recall": False})
    m.memorize_many([(f"Falcon deploy status note {i}: the pipeline is green again",
                      {"persona_id": "A"})
                     for i in range(60)])
    b_ids = {r["id"] for r in m.memorize_many([
        ("Falcon deploy status note: the pipeline is green", {"persona_id": "B"}),
        ("Falcon deploy status: pipeline green", {"persona_id": "B"})])}
    for k in range(1, 6):
        out = m.recall("Falcon deploy status pipeline green", k=k, persona_id="B", explain=True)
        got = set(ids(out))
        assert got <= b_ids, f"k={k}: persona A leaked into B: {got - b_ids}"
        assert got == (b_ids if k >= 2 else got) and len(got) == min(k, 2), (k, got)
        assert all(h["persona_id"] == "B" for h in out["results"])
        for ch in aokun.Memory.CHANNELS:  # each channel on its own, the vector ones included
            only = m.recall("Falcon deploy status pipeline green", k=k, persona_id="B",
                            channels=[ch])
            assert set(ids(only)) <= b_ids, (ch, k)
        a = m.recall("Falcon deploy status pipeline green", k=k, persona_id="A")
        assert len(a["results"]) == k and not set(ids(a)) & b_ids
    everyone = m.recall("Falcon deploy status pipeline green", k=100, persona_id="A")
    assert not set(ids(everyone)) & b_ids
    # the default persona has none
    assert m.recall("Falcon deploy status pipeline green", k=5)["results"] == []


@pytest.mark.slow
def test_speed_bounds_never_change_a_channel_answer(make):
    """The keyword channels rank only the best FTS_POOL_FACTOR × k matches before filtering, the
    vector channels take candidates within a learnt Hamming bound (sql/recall.sql :pool,
    :max_hamming).
    Whatever the bound, each channel gives the rows of its unbounded query: here persona A's
    strong matches fill the pool, and a bound of 0 leaves the binary KNN nearly empty."""
    m = make(**{"recall.reinforce_on_recall": False, "recall.channel_k": 2,
                "recall.vector_candidates": 4})
    m.memorize_many([(f"Falcon deploy Falcon deploy pipeline note {i}",
                      {"persona_id": "A", "participants": ["Ann"]})
                     for i in range(30)])
    b_ids = {r["id"] for r in m.memorize_many([
        ("the Falcon deploy went out after lunch, then a long talk about other things entirely",
         {"persona_id": "B"}),
        ("notes from a meeting in which someone once mentioned a Falcon deploy",
         {"persona_id": "B"})])}
    names = {"bm25": "recall_bm25", "graph_keyword": "recall_graph_keyword",
             "vector": "recall_vector",
             "graph_vector": "recall_graph_vector"}
    for persona in ("A", "B"):
        p = dict(channel_params(m, "Falcon deploy", k=1, persona=persona), candidates=4)
        for ch, name in names.items():
            unbounded = m.rows(m.queries[name], p)
            assert unbounded, (ch, persona)
            # the pool alone: A's matches crowd B's out of it, and the rows say so
            if ch in KEYWORD:
                pooled = m.rows(m.queries[name], dict(p, pool=aokun.FTS_POOL_FACTOR * p["k"]))
                assert persona == "A" or not (pooled and pooled[0]["complete"]), (ch, pooled)
            else:
                m._hamming_reach[(ch, persona, "", 0, 4)] = (0.0,) * 8  # far too tight
                assert m._hamming_bound((ch, persona, "", 0, 4)) == 0.0
            assert m._channel_query(ch, m.queries[name], p, m.rows) == unbounded, (ch, persona)
    for ch in aokun.Memory.CHANNELS:
        assert set(ids(m.recall("Falcon deploy", k=2, persona_id="B", channels=[ch]))) == b_ids, ch


def bound_runs(m, query: str, param: str) -> list:
    """The value of `param` in each run of the named channel query from now on (m.rows spied on)."""
    runs, rows = [], m.rows

    def spy(sql, params):
        if sql == m.queries[query]:
            runs.append(params[param])
        return rows(sql, params)
    m.rows = spy
    return runs


@pytest.mark.slow
def test_a_hamming_bound_is_dropped_when_fewer_vectors_than_candidates_are_left(make):
    """A persona learns a Hamming bound, then most of its memories are archived: fewer live vectors
    than `candidates` are left, so no bound can be complete. The first recall after that runs its
    KNN twice and forgets the bound; the next ones run it once (not twice on every recall)."""
    m = make(**{"recall.reinforce_on_recall": False, "recall.cache_size": 0, "recall.channel_k": 4,
                "recall.vector_candidates": 8})
    docs = m.memorize_many([(f"note {i}: {w} on day {i}", {}) for i, w in enumerate(
        ["coffee with Ann", "a bike ride", "tea at noon", "the Falcon deploy", "a long walk"] * 8)])
    key = ("vector", "", "", 0, 8)
    for q in ["coffee", "bike ride", "tea", "deploy", "walk", "note 3", "day 12", "Ann", "noon"]:
        m.recall(q, k=2, channels=["vector"])
    bound = m._hamming_bound(key)
    assert bound is not None
    for d in docs[5:]:
        m.set_flag(d["id"], "archived", True)
    looser = max(m._hamming_reach[key]) + aokun.HAMMING_SLACK
    runs = bound_runs(m, "recall_vector", "max_hamming")
    for q in ["coffee", "tea", "walk"]:
        p = dict(channel_params(m, q, k=2), candidates=8)
        assert ids(m.recall(q, k=2, channels=["vector"]))
        assert len(m.rows(m.queries["recall_vector"], p)) == 4
    # the first recall tries its bound, a looser one, then none; each after it once, unbounded
    assert runs == [bound, looser] + [None] * 6  # (and the direct query beside each recall)
    assert m._hamming_bound(key) is None


@pytest.mark.slow
def test_a_short_fts_pool_is_not_tried_again_for_the_next_recalls(make):
    """A small session (or persona) behind many matches of others: the FTS pool falls short and the
    keyword channel runs twice. After such a miss the next FTS_POOL_SKIP recalls with those filters
    run the unbounded query alone (one run each, the same rows), then the pool is tried again; a
    query that matches nothing there counts as no miss."""
    m = make(**{"recall.reinforce_on_recall": False, "recall.cache_size": 0, "recall.channel_k": 2})
    m.memorize_many([(f"Falcon deploy pipeline note {i}", {"session_id": "big"})
                     for i in range(60)])
    mine = {m.memorize("a long note that says Falcon deploy once, in session s",
                       {"session_id": "s"})["id"]}
    runs = bound_runs(m, "recall_bm25", "pool")
    for _ in range(3):
        assert m.recall("zebra", k=1, session_id="s", channels=["bm25"])["results"] == []
    assert runs == [4 * 2, 0] * 3  # nothing matches: the empty pool runs again, but that is no miss
    runs.clear()
    for _ in range(aokun.FTS_POOL_SKIP + 2):
        assert set(ids(m.recall("Falcon deploy", k=1, session_id="s", channels=["bm25"]))) == mine
    assert runs == [4 * 2, 0] + [0] * aokun.FTS_POOL_SKIP + [4 * 2, 0]
    runs.clear()
    # other filters: the pool
    assert ids(m.recall("Falcon deploy", k=1, session_id="big", channels=["bm25"]))
    assert runs == [4 * 2]


@pytest.mark.slow
def test_hamming_bound_is_learnt_from_recent_recalls(make):
    """After 8 recalls a vector channel's bound is the 0.9 quantile of their reach (the Hamming
    distance of the farthest candidate taken), and the bounded answers equal the unbounded ones."""
    m = make(**{"recall.reinforce_on_recall": False, "recall.vector_candidates": 6,
                "recall.channel_k": 6})
    notes = ["coffee with Ann", "a bike ride", "tea at noon", "the Falcon deploy", "a long walk",
             "piano lessons"] * 5
    m.memorize_many([(f"note {i}: {w} on day {i}", {"session_id": f"s{i % 3}"})
                     for i, w in enumerate(notes)])
    key = ("vector", "", "", 0, 6)
    assert m._hamming_bound(key) is None
    queries = ["coffee", "bike ride", "tea", "deploy", "walk", "piano", "note 3", "day 12", "Ann"]
    for q in queries:
        m.recall(q, k=3, channels=["vector"])
    reach = sorted(m._hamming_reach[key])
    assert len(reach) == len(queries)
    assert m._hamming_bound(key) == reach[int(0.9 * (len(reach) - 1))]
    assert m.recall("coffee", k=3, channels=["graph_vector"], session_id="s1")["results"]
    # graph_vector filters sessions after its KNN: its history is the one of every session
    assert ("graph_vector", "", "", 0, 6) in m._hamming_reach
    assert not [k for k in m._hamming_reach if "s1" in k]
    for q in queries + ["something else entirely"]:
        p = dict(channel_params(m, q, k=3), candidates=6)
        assert m._channel_query("vector", m.queries["recall_vector"], p, m.rows) == \
            m.rows(m.queries["recall_vector"], p), q


def test_a_missed_hamming_bound_tries_the_largest_reach_plus_slack_before_none(make,
                                                                              monkeypatch):
    """A bound that cuts the candidates short is tried again at the history's largest reach +
    HAMMING_SLACK (a few more bits cost little; no bound costs n × k), and only then without one;
    the rows are the unbounded ones either way."""
    m = make(**{"recall.reinforce_on_recall": False, "recall.vector_candidates": 6,
                "recall.channel_k": 6})
    m.memorize_many([(f"note {i}: {w}", {}) for i, w in enumerate(
        ["coffee with Ann", "a bike ride", "tea at noon", "the Falcon deploy"] * 6)])
    p = dict(channel_params(m, "coffee", k=3), candidates=6)
    sql = m.queries["recall_vector"]
    unbounded = m.rows(sql, p)
    reach = unbounded[0]["reach"]
    key = ("vector", "", "", 0, 6)
    assert reach >= 2
    for slack, history, expected in [(8, (0.0,) * 8 + (reach,), [0.0, reach + 8]),
                                     (1, (0.0,) * 8 + (reach - 2,), [0.0, reach - 1, None])]:
        monkeypatch.setattr(aokun, "HAMMING_SLACK", slack)
        m._hamming_reach[key] = history
        runs = bound_runs(m, "recall_vector", "max_hamming")
        assert m._channel_query("vector", sql, p, m.rows) == unbounded
        assert runs == expected
        assert m._hamming_reach[key] == history + (reach,)
        del m.rows  # bound_runs' spy


def test_hamming_histories_are_kept_in_the_file_for_the_next_process(make, tmp_path, caplog):
    """Once HAMMING_SAVE_EVERY reaches were learnt (reinforce_on_recall off: no touch to ride on),
    meta hamming_reach holds the histories; the next Memory on the file starts with the same
    bounds. Histories of another embedding model, or a meta value that is not one, are ignored."""
    path = tmp_path / "h.db"
    over = {"recall.reinforce_on_recall": False, "recall.vector_candidates": 6,
            "recall.channel_k": 6, "recall.cache_size": 0}
    m = make(path, **over)
    m.memorize_many([(f"note {i}: {w}", {}) for i, w in enumerate(
        ["coffee with Ann", "a bike ride", "tea at noon", "the Falcon deploy"] * 6)])
    key = ("vector", "", "", 0, 6)
    for q in ["coffee", "bike", "tea", "deploy", "Ann", "noon", "ride", "note 3", "note 4"]:
        m.recall(q, k=3, channels=["vector"])
    m.wait_background()
    bound = m._hamming_bound(key)
    assert bound is not None and m.meta_get("hamming_reach")
    m.close()
    again = make(path, **over)
    assert again._hamming_bound(key) == bound
    again.close()
    other = make(path, embedder=FakeEmbedder(16, model="another-model"), **over)
    assert other._hamming_bound(key) is None
    other.close()
    m3 = make(path, **over)
    with m3.tx():
        m3._meta_set("hamming_reach", '{"model": "fake-16", "dim": 16, "reach": 7}')
    m3.close()
    with caplog.at_level("WARNING", logger="aokun"):
        m4 = make(path, **over)
    assert m4._hamming_bound(key) is None and "hamming_reach ignored" in caplog.text
    assert ids(m4.recall("coffee", k=3, channels=["vector"]))


@pytest.mark.slow
def test_session_filter_and_neighbours_stay_in_persona_and_session(make):
    m = make(**{"recall.reinforce_on_recall": False})
    s1 = [m.memorize(f"Heron survey {i} at the quarry lake",
                     {"session_id": "s1",
                      "timestamp": aokun.iso(T0 + dt.timedelta(minutes=i))})["id"]
          for i in range(3)]
    s2 = [m.memorize(f"Heron count {i} by the quarry",
                     {"session_id": "s2",
                      "timestamp": aokun.iso(T0 + dt.timedelta(minutes=10 + i))})["id"]
          for i in range(30)]
    # another persona's turn in the same session id, right after a hit: no neighbour across personas
    other = m.memorize("Thanks, noted.", {
        "session_id": "s1", "persona_id": "X",
        "timestamp": aokun.iso(T0 + dt.timedelta(minutes=1, seconds=30))})["id"]
    for k in (1, 2, 3, 5):
        out = m.recall("heron quarry", k=k, session_id="s1", explain=True)
        assert set(ids(out)) <= set(s1) and len(out["results"]) == min(k, 3), (k, ids(out))
        assert all(h["session_id"] == "s1" for h in out["results"])
        for ch in aokun.Memory.CHANNELS:
            found = m.recall("heron quarry", k=k, session_id="s1", channels=[ch])
            assert set(ids(found)) <= set(s1), ch
    assert set(ids(m.recall("heron quarry", k=40, session_id="s2"))) == set(s2)
    assert other not in ids(m.recall("heron quarry noted thanks", k=40))


def test_graph_expansion_respects_session_and_archive_filters(make):
    """The graph keyword channel reaches memories one hop from a hit node (a shared person): that
    hop must not carry a memory of another session, or an archived one, into the answer."""
    m = make(embedder=aokun.Embedder(), **{"recall.reinforce_on_recall": False})
    hit = m.memorize("Marta keeps the spare quokka keys",
                     {"participants": ["Marta"], "session_id": "s1"})["id"]
    other_session = m.memorize("Lunch was pasta again",
                               {"participants": ["Marta"], "session_id": "s2"})["id"]
    archived = m.memorize("The weather turned cold",
                          {"participants": ["Marta"], "session_id": "s1"})["id"]
    query, gk = "spare quokka keys", ["graph_keyword"]
    # the hop works
    assert set(ids(m.recall(query, k=10, channels=gk))) == {hit, other_session, archived}
    assert set(ids(m.recall(query, k=10, channels=gk, session_id="s1"))) == {hit, archived}
    m.set_flag(archived, "archived", True)
    assert set(ids(m.recall(query, k=10, channels=gk))) == {hit, other_session}
    assert set(ids(m.recall(query, k=10, channels=gk, session_id="s1"))) == {hit}
    assert set(ids(m.recall(query, k=10, channels=gk, include_archived=True))) == \
        {hit, other_session, archived}


def test_graph_hop_skips_hub_nodes(make):
    """A node in more than graph_hub_limit entries (a speaker of every turn) is no hop start: it
    would pull in arbitrary memories of that person."""
    m = make(embedder=aokun.Embedder(), **{"recall.reinforce_on_recall": False,
                                           "recall.graph_hub_limit": 3})
    hit = m.memorize("Marta keeps the spare quokka keys",
                     {"participants": ["Marta"], "topics": ["keys"]})["id"]
    same_topic = m.memorize("Lost and found opens at nine", {"topics": ["keys"]})["id"]
    chatter = [m.memorize(t, {"participants": ["Marta"]})["id"]
               for t in ("Lunch was pasta again", "It rained")]
    gk = ["graph_keyword"]
    # Marta is in 3 person entries (not above the limit): both hops work
    assert set(ids(m.recall("spare quokka keys", k=10, channels=gk))) == {hit, same_topic, *chatter}
    chatter.append(m.memorize("The bus was late", {"participants": ["Marta"]})["id"])
    # now Marta is a hub: her other memories are not reached (the topic entry matches by its own
    # words)
    assert set(ids(m.recall("spare quokka keys", k=10, channels=gk))) == {hit, same_topic}


@pytest.mark.slow
def test_archived_excluded_unless_include_archived_in_every_channel(make):
    m = make(**{"recall.reinforce_on_recall": False})
    target = m.memorize("Marta keeps the spare quokka keys in the blue drawer",
                        {"participants": ["Marta"], "topics": ["keys"]})["id"]
    m.memorize("The quokka enclosure opens at nine")
    query = "Marta spare quokka keys blue drawer"
    for ch in aokun.Memory.CHANNELS:
        assert target in ids(m.recall(query, k=5, channels=[ch])), \
            f"{ch} does not find it before archiving"
    m.set_flag(target, "pinned", True)  # pinned memories join by similarity: not when archived
    m.set_flag(target, "archived", True)
    for ch in aokun.Memory.CHANNELS:
        assert target not in ids(m.recall(query, k=5, channels=[ch])), \
            f"{ch} returned an archived memory"
        back = m.recall(query, k=5, channels=[ch], include_archived=True)
        assert target in ids(back), f"{ch} ignores include_archived"
        assert next(h for h in back["results"] if h["id"] == target)["archived"] is True
    assert target not in ids(m.recall(query, k=5))


# 5. k ---------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_k_above_the_cap_is_capped_with_a_warning(make):
    m = make(**{"recall.max_k": 3})
    for i in range(6):
        m.memorize(f"Osprey sighting number {i} over the marsh")
    assert m.recall("osprey marsh", k=3)["warnings"] == []
    # the capped answer is cached under the k asked for: each says what it was asked
    for _ in range(2):
        out = m.recall("osprey marsh", k=5000)
        assert len(out["results"]) == 3
        assert any("5000" in w and "max_k" in w and "3" in w for w in out["warnings"]), \
            out["warnings"]
        assert m.recall("osprey marsh", k=3)["warnings"] == []


def test_k_default_cap_is_named(mem):
    mem.memorize("Osprey sighting over the marsh")
    out = mem.recall("osprey", k=5000)
    assert len(out["results"]) <= aokun.DEFAULTS["recall"]["max_k"]
    assert any("5000" in w and "max_k" in w and "100" in w for w in out["warnings"]), \
        out["warnings"]


@pytest.mark.parametrize("k", [0, -1, "3", True, 2.5, None])
def test_bad_k_is_an_input_error_naming_k(mem, k):
    with pytest.raises(aokun.InputError) as e:
        mem.recall("osprey", k=k)
    assert e.value.field == "k" and "k" in str(e.value)
    with pytest.raises(aokun.InputError) as e:
        mem.search_atoms("osprey", k=k)
    assert e.value.field == "k"


# 6. degradation -----------------------------------------------------------------------------------

def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.slow
def test_embedding_endpoint_down_degrades_to_keyword_channels(make):
    m = make(embedder=FROM_CONFIG, **{"embedding.provider": "openai", "embedding.model": "x",
                                      "embedding.base_url": f"http://127.0.0.1:{closed_port()}/v1",
                                      "embedding.max_retries": 0, "embedding.timeout_seconds": 2.0})
    assert m.embedder.provider == "openai"
    w = m.memorize("The lighthouse keeper logs the storm at midnight", {"participants": ["Ines"]})
    assert w["id"] and w["status"] == "done"
    assert any("embedding failed" in x for x in w["warnings"]), w["warnings"]
    assert m.get(w["id"])["content"].startswith("The lighthouse")
    out = m.recall("lighthouse storm", k=5)
    assert ids(out)[0] == w["id"]
    assert {d["channel"] for d in out["degraded"]} == {"vector", "graph_vector"}
    for d in out["degraded"]:
        assert "embedding failed" in d["reason"] and "unreachable" in d["reason"], d["reason"]
    assert set(out["results"][0]["channels"]) <= set(KEYWORD)


def test_dimension_mismatch_degrades_with_the_vector_problem(make, tmp_path):
    path = tmp_path / "dim.db"
    first = make(path, FakeEmbedder(16))
    wid = first.memorize("The lighthouse keeper logs the storm at midnight")["id"]
    first.close()
    m = make(path, FakeEmbedder(8))
    assert m.vector_problem and "16-d" in m.vector_problem
    out = m.recall("lighthouse storm", k=5)
    assert ids(out) == [wid]
    assert out["degraded"] == [{"channel": "vector", "reason": m.vector_problem},
                               {"channel": "graph_vector", "reason": m.vector_problem}]
    assert m.memorize("A second storm reached the lighthouse")["id"]  # writes still work
    assert len(m.recall("lighthouse storm", k=5)["results"]) == 2


# 7. cache -----------------------------------------------------------------------------------------

def test_cache_hit_and_invalidation_by_every_write(mem):
    q = "zeppelin"
    first = mem.memorize("Dana flew in a zeppelin over Lake Constance")["id"]
    assert mem.recall(q)["cached"] is False
    assert mem.recall(q)["cached"] is True
    mem.wait_background()  # the access bookkeeping of a recall does not empty the cache
    assert mem.recall(q)["cached"] is True

    new = mem.memorize("A second zeppelin ride is booked")["id"]
    out = mem.recall(q)
    assert out["cached"] is False and new in ids(out)
    assert mem.recall(q)["cached"] is True

    mem.edit(new, "A second airship ride is booked")
    out = mem.recall(q)
    hits = {h["id"]: h for h in out["results"]}
    assert out["cached"] is False and ids(out)[0] == first
    assert hits[new]["text"] == "A second airship ride is booked"
    assert "bm25" not in hits[new]["channels"]
    assert mem.recall(q)["cached"] is True

    mem.set_flag(first, "pinned", True)
    out = mem.recall(q)
    assert out["cached"] is False and out["results"][0]["pinned"] is True
    assert mem.recall(q)["cached"] is True

    mem.delete(first)
    out = mem.recall(q)
    assert out["cached"] is False and first not in ids(out)


def test_cache_sees_a_write_by_another_memory_object(make, tmp_path):
    path = tmp_path / "shared.db"
    a, b = make(path), make(path)
    a.memorize("The heron nests by the quarry lake")
    assert a.recall("heron")["cached"] is False
    assert a.recall("heron")["cached"] is True
    wid = b.memorize("A second heron was seen at the quarry")["id"]
    out = a.recall("heron")
    assert out["cached"] is False and wid in ids(out)


@pytest.mark.slow
def test_cache_sees_a_write_that_lands_before_the_access_bookkeeping(make, tmp_path):
    """The other writer commits after a recall answered but before that recall's background
    access update ran (e.g. the update waited for the other writer's lock): the cached answer is
    stale and must not be served."""
    path = tmp_path / "shared.db"
    a, b = make(path), make(path)
    a.memorize("The heron nests by the quarry lake")
    with a.lock:  # holds the background touch back until b has committed
        assert a.recall("quarry lake")["cached"] is False
        wid = b.memorize("A second heron was seen at the quarry lake")["id"]
    a.wait_background()
    out = a.recall("quarry lake")
    assert out["cached"] is False and wid in ids(out), \
        "a stale cached answer hid another connection's write"


@pytest.mark.slow
def test_cache_ttl_expires(make):
    m = make(**{"recall.cache_ttl_seconds": 0.0})
    m.memorize("Dana flew in a zeppelin")
    assert m.recall("zeppelin")["cached"] is False
    assert m.recall("zeppelin")["cached"] is False
    other = make(Path(m.path).with_name("ttl2.db"))  # the same steps with the default TTL do hit
    other.memorize("Dana flew in a zeppelin")
    other.recall("zeppelin")
    assert other.recall("zeppelin")["cached"] is True


# bounded answers: each hit capped, the whole answer within a token budget -------------------------

def sentences(word: str, chars: int) -> str:
    """About `chars` characters of numbered English sentences mentioning `word`."""
    out, n = [], 0
    while sum(map(len, out)) + len(out) < chars:
        out.append(f"Entry {n} of the {word} log notes the weather, the tides and the supplies.")
        n += 1
    return " ".join(out)


@pytest.mark.slow
def test_huge_memory_comes_back_capped_at_a_sentence_end_and_get_returns_it_whole(mem):
    big = sentences("lighthouse", 200_000)
    doc = mem.memorize(big)["id"]
    short = mem.memorize("The lighthouse keeper waves at every ferry.")["id"]
    out = mem.recall("lighthouse log tides supplies", k=1)
    [hit] = out["results"]
    cap = mem.cfg.recall.max_chars_per_hit
    assert hit["id"] == doc and hit["truncated"] is True and out["warnings"] == []
    assert cap - 100 < len(hit["text"]) <= cap == 1500
    assert hit["text"].endswith("supplies.…") and big.startswith(hit["text"][:-1])
    assert mem.get(doc)["content"] == big  # stored and read whole
    hits = {h["id"]: h for h in mem.recall("lighthouse", k=2)["results"]}
    assert hits[short]["truncated"] is False
    assert hits[short]["text"] == "The lighthouse keeper waves at every ferry."


@pytest.mark.slow
def test_answer_budget_cuts_later_hits_and_leaves_out_what_does_not_fit(make, frozen_now):
    # frozen clock: the scores compared below are of two recalls, and recency depends on the time
    m = make(**{"recall.max_answer_tokens": 1000, "recall.reinforce_on_recall": False})
    docs = [m.memorize(sentences(f"harbour{i} harbour", 4000 + 500 * i))["id"] for i in range(6)]
    full = m.recall("harbour", k=6, explain=True, max_chars_per_hit=0, max_answer_tokens=0)
    assert [h["truncated"] for h in full["results"]] == [False] * 6 and set(ids(full)) == set(docs)
    out = m.recall("harbour", k=6, explain=True)
    kept = out["results"]
    tokens = [aokun.estimate_tokens(h["text"]) for h in kept]
    assert ids(out) == ids(full) and out["warnings"] == []  # all six, in rank order
    assert all(h["truncated"] for h in kept) and sum(tokens) <= 1000
    # the first two fit with their capped texts
    for h, whole in zip(kept[:2], full["results"], strict=False):
        assert h["text"] == aokun.cut_text(whole["text"], 1500)[0] and len(h["text"]) > 1400
    # later ones cut further
    assert tokens[2] < tokens[1] and min(tokens) >= aokun.RECALL_HIT_MIN_TOKENS // 2
    for h, whole in zip(kept, full["results"], strict=True):
        assert whole["text"].startswith(h["text"][:-1]) and h["text"].endswith(".…")
        # ranking and explain unchanged
        assert (h["score"], h["explain"]) == (whole["score"], whole["explain"])
    tight = m.recall("harbour", k=6, max_answer_tokens=400)  # the first alone takes ~375 tokens
    assert ids(tight) == ids(full)[:1] and tight["results"][0]["text"] == kept[0]["text"]
    [warning] = tight["warnings"]
    assert "max_answer_tokens" in warning and "get_memory" in warning
    assert all(str(i) in warning for i in ids(full)[1:])


def test_cache_never_mixes_capped_and_uncapped_answers(make):
    m = make()
    doc = m.memorize(sentences("glacier", 5000))["id"]
    capped = m.recall("glacier")
    assert capped["cached"] is False and capped["results"][0]["truncated"] is True
    whole = m.recall("glacier", max_chars_per_hit=0)
    assert whole["cached"] is False and whole["results"][0]["text"] == m.get(doc)["content"]
    assert m.recall("glacier")["cached"] is True
    assert m.recall("glacier")["results"] == capped["results"]
    assert m.recall("glacier", max_chars_per_hit=0)["results"] == whole["results"]
    m.cfg.recall["max_chars_per_hit"] = 300  # a changed setting is a different answer too
    again = m.recall("glacier")
    assert again["cached"] is False and len(again["results"][0]["text"]) <= 300


@pytest.mark.parametrize("name, value", [("max_chars_per_hit", -1), ("max_answer_tokens", 1.5),
                                         ("max_chars_per_hit", True)])
def test_bad_bounds_are_input_errors_naming_them(mem, name, value):
    with pytest.raises(aokun.InputError) as e:
        mem.recall("anything", **{name: value})
    assert e.value.field == name


# 8. explain ---------------------------------------------------------------------------------------

EXPLAIN_CORPUS = [
    ("Alice loves iced americano and drinks it every morning",
     {"participants": ["Alice"], "topics": ["coffee"]}),
    ("Alice also likes espresso after lunch", {"participants": ["Alice"], "topics": ["coffee"]}),
    ("Bob is learning the cello and practises on Sundays", {"participants": ["Bob"]}),
    ("The coffee machine in the office is broken", {"topics": ["office"]}),
    ("Alice and Bob met at a coffee shop in Lisbon", {"participants": ["Alice", "Bob"]}),
    ("Iced tea is Carol's favourite drink", {"participants": ["Carol"]}),
    ("Alice drinks americano, Alice drinks americano daily", {}),
]


@pytest.mark.parametrize("fusion", ["score", "rrf"])
def test_explain_is_consistent_with_the_ranking(make, fusion, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", aokun.iso(T0))
    m = make(**{"recall.reinforce_on_recall": False, "recall.fusion": fusion})
    for text, meta in EXPLAIN_CORPUS:
        m.memorize(text, meta)
    query, k = "Alice iced americano coffee", 5
    out = m.recall(query, k=k, explain=True)
    hits = out["results"]
    assert len(hits) == k
    r = m.cfg.recall
    weights = {"bm25": r.weight_bm25, "vector": r.weight_vector,
               "graph_keyword": r.weight_graph_keyword,
               "graph_vector": r.weight_graph_vector}
    params = channel_params(m, query, k=k)
    direct = {ch: {row["id"]: row["rank"] for row in m.rows(m.queries[name], params)}
              for ch, name in CHANNEL_QUERY.items()}
    for h in hits:
        ex = h["explain"]
        assert ex["fusion"] == fusion
        assert list(ex["ranks"]) == list(aokun.Memory.CHANNELS)
        for ch in aokun.Memory.CHANNELS:  # the rank explain shows is the channel query's own rank
            assert ex["ranks"][ch] == direct[ch].get(h["id"]), (h["id"], ch)
        assert h["channels"] == sorted(c for c, v in ex["ranks"].items() if v is not None)
        assert h["score"] == round(ex["fused"], 6)
        ranks = {c: v for c, v in ex["ranks"].items() if v is not None}
        assert ex["doc_rrf"] == pytest.approx(aokun.rrf(ranks, ["bm25", "vector"], r.rrf_k,
                                                        weights))
        assert ex["graph_rrf"] == pytest.approx(aokun.rrf(ranks, ["graph_keyword", "graph_vector"],
                                                          r.rrf_k, weights))
        if fusion == "rrf":
            assert ex["doc_relevance"] == pytest.approx(ex["doc_rrf"])
        else:
            doc = ("bm25", "vector")
            expect = sum(weights[c] * ex["scores"].get(c, 0.0) for c in doc) \
                / sum(weights[c] for c in doc)
            assert ex["doc_relevance"] == pytest.approx(expect)
        assert set(ex["scores"]) == set(ranks)
    # MMR order: each hit is the best λ·fused − (1−λ)·max Jaccard to the hits before it
    seg = {row["rowid"]: set(row["segmented"].split()) for row in m.rows(
        "select rowid, segmented from documents_fts"
        " where rowid in (select value from json_each(?))",
        (json.dumps(ids(out)),))}
    lam = r.mmr_lambda
    for i, h in enumerate(hits):
        def mmr_at(j, i=i):
            sim = max((aokun.jaccard(seg[hits[j]["id"]], seg[hits[p]["id"]]) for p in range(i)),
                      default=0.0)
            return lam * hits[j]["explain"]["fused"] - (1 - lam) * sim
        assert h["explain"]["mmr"] == pytest.approx(mmr_at(i))
        for j in range(i + 1, len(hits)):
            assert mmr_at(j) <= h["explain"]["mmr"] + 1e-12, \
                f"hit {j} should have been picked before hit {i}"
    # the answer without explain ranks the same
    assert ids(m.recall(query, k=k)) == ids(out)


# 9. session neighbours ----------------------------------------------------------------------------

def _conversation(m):
    turns = ["Let us plan the Falcon release checklist for Dana",
             "Sounds good, I will book the room",  # no query word; right after the strong hit
             "Lunch was pasta again",
             "The weather turned cold"]
    return [m.memorize(t, {"session_id": "chat-1",
                           "timestamp": aokun.iso(T0 + dt.timedelta(minutes=i))})["id"]
            for i, t in enumerate(turns)]


@pytest.mark.parametrize("weight", [0.3, 0.0])
def test_session_neighbour_joins_with_a_share_of_the_hit(make, weight):
    # without turn context in the index, so `b` can only join through the neighbour step
    m = make(embedder=aokun.Embedder(), **{"recall.session_neighbour_weight": weight,
                                           "recall.reinforce_on_recall": False,
                                           "embedding.context_turns": 0})
    a, b, c, d = _conversation(m)
    out = m.recall("Falcon release checklist", k=5, explain=True)
    got = {h["id"]: h for h in out["results"]}
    assert a in got and c not in got and d not in got
    if weight:
        assert b in got, [h["text"] for h in out["results"]]
        nb, ha = got[b]["explain"], got[a]["explain"]
        assert got[b]["channels"] == [] and all(v is None for v in nb["ranks"].values())
        assert nb["neighbour"] > 0
        routes_a = ha["fused"] / ha["source_boost"] - ha["neighbour"]
        assert nb["neighbour"] == pytest.approx(weight * routes_a)
        assert ids(out).index(a) < ids(out).index(b)
    else:
        assert b not in got
        assert all(h["explain"]["neighbour"] == 0 for h in out["results"])


# 10. fusion and its helpers -----------------------------------------------------------------------

@pytest.mark.slow
def test_rrf_fusion_gives_results(make):
    m = make(**{"recall.fusion": "rrf"})
    wid = m.memorize("Alice loves iced americano", {"participants": ["Alice"]})["id"]
    m.memorize("Bob plays the cello")
    out = m.recall("Alice americano", k=3, explain=True)
    assert ids(out)[0] == wid and out["results"][0]["explain"]["fusion"] == "rrf"
    with pytest.raises(aokun.AokunError, match="fusion"):
        make(Path(m.path).with_name("bad.db"), **{"recall.fusion": "borda"})


def test_rrf_unit():
    chans = ["bm25", "vector"]
    assert aokun.rrf({"bm25": 0, "vector": 0}, chans, 60) == pytest.approx(1.0)
    assert aokun.rrf({"bm25": 0, "vector": 0}, chans, 60, {"bm25": 1.0, "vector": 0.5}) == \
        pytest.approx(1.0)
    assert aokun.rrf({"bm25": 0}, chans, 60) == pytest.approx(0.5)
    assert aokun.rrf({"bm25": 0}, chans, 60, {"bm25": 1.0, "vector": 0.5}) == pytest.approx(1 / 1.5)
    assert aokun.rrf({"bm25": 9}, ["bm25"], 60) == pytest.approx(61 / 70)
    assert aokun.rrf({}, chans, 60) == 0.0
    assert aokun.rrf({"bm25": 0}, chans, 60, {"bm25": 0.0, "vector": 0.0}) == 0.0
    assert aokun.rrf({"bm25": 0, "vector": 3}, chans, 60) > \
        aokun.rrf({"bm25": 1, "vector": 3}, chans, 60)


def test_normalized_scores_unit():
    bm25 = [{"id": 1, "raw": -4.0}, {"id": 2, "raw": -2.0}, {"id": 3, "raw": -1.0}]
    # ÷ max, not min-max
    assert aokun.normalized_scores("bm25", bm25) == pytest.approx({1: 1.0, 2: 0.5, 3: 0.25})
    gk = [{"id": 5, "raw": 8.0}, {"id": 6, "raw": 2.0}]
    assert aokun.normalized_scores("graph_keyword", gk) == pytest.approx({5: 1.0, 6: 0.25})
    vec = [{"id": 1, "raw": 0.1}, {"id": 2, "raw": 0.3}, {"id": 3, "raw": 0.5}]  # cosine distances
    for ch in ("vector", "graph_vector"):
        assert aokun.normalized_scores(ch, vec) == pytest.approx({1: 1.0, 2: 0.5, 3: 0.0})
        assert aokun.normalized_scores(ch, [{"id": 7, "raw": 0.4}]) == {7: 1.0}
    assert aokun.normalized_scores("bm25", []) == {}
    assert aokun.normalized_scores("bm25", [{"id": 1, "raw": -3.0}]) == {1: 1.0}


def test_mmr_unit():
    tokens = {1: {"a", "b"}, 2: {"a", "b"}, 3: {"c"}}
    rel = {1: 1.0, 2: 0.95, 3: 0.5}
    assert [i for i, _ in aokun.mmr([1, 2, 3], rel, tokens, 3, 1.0)] == [1, 2, 3]
    picked = aokun.mmr([1, 2, 3], rel, tokens, 2, 0.5)
    assert [i for i, _ in picked] == [1, 3] and picked[0][1] == pytest.approx(0.5)


# 11. search_atoms ---------------------------------------------------------------------------------

def test_search_atoms_bm25_times_ttl_and_planned_deadline(make, monkeypatch):
    def at(t):
        monkeypatch.setenv("AOKUN_NOW", aokun.iso(t))
    at(T0)
    m = make()
    plan = m.memorize("I will call the dentist tomorrow.")["id"]
    fact = m.memorize("The dentist office is on Harbour Street.")["id"]
    atoms = {r["document_id"]: r for r in m.rows("select * from memory_atoms")}
    assert atoms[plan]["atom_type"] == "planned" and atoms[fact]["atom_type"] != "planned"
    deadline = aokun.parse_time(atoms[plan]["expires_at"])
    assert T0 < deadline

    at(T0 + dt.timedelta(hours=12))
    res = {a["document_id"]: a for a in m.search_atoms("dentist")["results"]}
    assert set(res) == {plan, fact}
    assert res[plan]["ttl_factor"] == 1.0  # step decay: full weight until the deadline
    f = atoms[fact]
    ttl = (aokun.parse_time(f["expires_at"])
           - aokun.parse_time(f["last_reinforced_at"])).total_seconds()
    assert res[fact]["ttl_factor"] == pytest.approx(math.exp(-12 * 3600 / ttl))
    assert res[fact]["ttl_factor"] < 1.0
    for a in res.values():
        assert a["bm25"] < 0
        assert a["score"] == pytest.approx(a["ttl_factor"] / (1 + math.exp(a["bm25"] / 8)),
                                           abs=1e-6)
    scores = [a["score"] for a in m.search_atoms("dentist")["results"]]
    assert scores == sorted(scores, reverse=True)

    at(deadline + dt.timedelta(minutes=1))  # past the deadline, still 'active' (no sweep ran)
    assert m.value("select state from memory_atoms where id = ?", (atoms[plan]["id"],)) == "active"
    assert [a["document_id"] for a in m.search_atoms("dentist")["results"]] == [fact]

    at(T0 + dt.timedelta(hours=12))
    with m.tx() as c:  # only active atoms
        c.execute("update memory_atoms set state = 'forgotten' where id = ?", (f["id"],))
    assert [a["document_id"] for a in m.search_atoms("dentist")["results"]] == [plan]
    assert m.search_atoms("!!!")["results"] == []
    assert m.search_atoms("dentist", persona_id="other")["results"] == []


# 12. CLI ------------------------------------------------------------------------------------------

@pytest.fixture
def cli(tmp_path, monkeypatch, segmenter):
    monkeypatch.setattr(aokun, "Segmenter", lambda *a, **k: segmenter)
    ini = tmp_path / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n", encoding="utf-8")
    db = tmp_path / "cli.db"
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), *map(str, args)],
                             catch_exceptions=False)
    return invoke


def test_recall_cli_json_explain_and_channel_errors(cli):
    assert cli("memorize", "Ticket ORDER-7731 was refunded").exit_code == 0
    assert cli("memorize", "Bob plays the cello").exit_code == 0
    r = cli("recall", "ORDER-7731", "--channels", "bm25", "--explain", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [h["text"] for h in out["results"]] == ["Ticket ORDER-7731 was refunded"]
    assert out["results"][0]["explain"]["ranks"] == {"bm25": 0}
    assert out["results"][0]["channels"] == ["bm25"]
    assert out["degraded"] == []
    bad = cli("recall", "ORDER-7731", "--channels", "bm25,telepathy")
    assert bad.exit_code != 0
    lines = bad.output.strip().splitlines()
    assert len(lines) == 1 and "channels" in lines[0] and "telepathy" in lines[0], bad.output
    assert "Traceback" not in bad.output


@pytest.mark.slow
def test_recall_cli_marks_cut_texts(cli):
    big = sentences("lantern", 3000)
    assert cli("memorize", big).exit_code == 0
    assert cli("memorize", "A short lantern note").exit_code == 0
    out = json.loads(cli("recall", "lantern", "--json").stdout)
    flags = {h["text"][:20]: h["truncated"] for h in out["results"]}
    assert flags == {big[:20]: True, "A short lantern note": False}
    r = cli("recall", "lantern")
    lines = r.stdout.splitlines()
    # the big one cut for the screen
    assert len(lines) == 2 and {line[-1] for line in lines} == {"…", "e"}
    assert "truncated" in r.stderr and "python aokun.py show" in r.stderr


def test_context_cli_says_the_briefing_age(cli):
    assert cli("memorize", "Alice prefers green tea", "--importance", "0.9").exit_code == 0
    r = cli("context")
    assert "Alice prefers green tea" in r.stdout, r.stderr
    assert re.search(r"briefing, built \d+ s ago\)", r.stderr), r.stderr


# 13. the example config ---------------------------------------------------------------------------

EXAMPLE = aokun.HERE / "aokun.example.ini"


def test_example_config_documents_every_setting_with_its_default():
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(EXAMPLE, encoding="utf-8")
    assert set(parser.sections()) == set(aokun.DEFAULTS)
    for section, kv in aokun.DEFAULTS.items():
        assert set(parser[section]) == set(kv), (section, set(kv) ^ set(parser[section]))
    cfg = aokun.Config(Path(EXAMPLE))
    for section, kv in aokun.DEFAULTS.items():
        for key, default in kv.items():
            value = getattr(cfg, section)[key]
            assert value == default and type(value) is type(default), \
                f"[{section}] {key} = {value!r}, default {default!r}"


def test_defaults_and_ranges_come_from_the_example_ini(tmp_path):
    ini = tmp_path / "x.ini"
    ini.write_text("[a]\n; help\n; range: 0..1\nshare = 0.20\nn = 300\n; range: > 0\nt = 300.0\n"
                   "on = false\nhost = 127.0.0.1\nnone =\n", encoding="utf-8")
    assert aokun.ini_defaults(ini) == ({"a": {"share": 0.2, "n": 300, "t": 300.0, "on": False,
                                              "host": "127.0.0.1", "none": ""}},
                                       {"a": {"share": "0..1", "t": "> 0"}})
    assert type(aokun.DEFAULTS["sync"]["interval"]) is float
    assert (aokun.DEFAULTS["server"]["port"], aokun.RANGES["server"]["port"]) == (5123, "1..65535")


@pytest.mark.parametrize("text,key", [("[recall]\nrrf_kk = 60\n", "rrf_kk"),
                                      ("[recall]\nrrf_k = abc\n", "rrf_k"),
                                      ("[recall]\nmax_k = 1.5\n", "max_k"),
                                      ("[recall]\nreinforce_on_recall = maybe\n",
                                       "reinforce_on_recall"),
                                      ("[recal]\nrrf_k = 60\n", "recal")])
def test_config_rejects_unknown_keys_and_wrong_types(tmp_path, text, key):
    p = tmp_path / "bad.ini"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(aokun.AokunError) as e:
        aokun.Config(p)
    assert key in str(e.value)


@pytest.mark.parametrize("historical", [False, True])
def test_temporal_factor_in_sql_matches_ttl_factor(make, historical):
    """recall_candidates computes the graph route's temporal factor in SQL; it must equal the best
    aokun.ttl_factor of the memory's atoms (planned = step, others exponential; expired,
    superseded, not-yet-existing atoms count 0), and the default-type ageing without atoms."""
    m = make(embedder=aokun.Embedder(), **{"recall.reinforce_on_recall": False})
    base = aokun.now()
    at = lambda days: aokun.iso(base + dt.timedelta(days=days))  # noqa: E731
    texts = {
        "old": ("Marta fixed the quokka gate", -400, {}),
        "recent": ("Marta painted the quokka gate blue", -20, {}),
        "plan": ("Marta will paint the quokka fence tomorrow", -1, {}),
        "pref": ("Marta loves the quokka enclosure", -50, {"importance": 0.9}),
        "recent2": ("Marta counted the quokka family", -30, {}),
        "later": ("Marta opened the quokka café", -5, {}),
    }
    got = {name: m.memorize(t, {"timestamp": at(days), **extra})["id"]
           for name, (t, days, extra) in texts.items()}
    with m.tx() as c:  # one atom superseded, one forgotten, one memory without atoms
        c.execute("update memory_atoms set state = 'superseded', state_changed_at = ?"
                  " where document_id = ?",
                  (at(-12), got["pref"]))
        c.execute("update memory_atoms set state = 'forgotten' where document_id = ?",
                  (got["recent2"],))
        c.execute("delete from atom_sources where document_id = ?", (got["recent"],))
    as_of = at(-10) if historical else None
    out = m.recall("quokka", k=20, explain=True, as_of=as_of)
    ref = aokun.parse_time(as_of) if as_of else aokun.now()
    seen = set()
    for h in out["results"]:
        atoms = m.rows("select a.* from atom_sources s join memory_atoms a on a.id = s.atom_id"
                       " where s.document_id = ?",
                       (h["id"],))
        if atoms:
            want = max(aokun.ttl_factor(a, m.rules.types[a["atom_type"]]["decay"], ref, historical)
                       for a in atoms)
        else:
            d = m.get(h["id"])
            default = m.rules.types[m.rules.default_type]
            ttl = aokun.effective_ttl_days(default["base_ttl_days"], d["importance"], 0)
            age = (ref - aokun.parse_time(d["created_at"])).total_seconds() / 86400
            want = 0.0 if age >= ttl or (historical and age < 0) else math.exp(-max(0.0, age) / ttl)
        assert h["explain"]["temporal_factor"] == pytest.approx(want, abs=1e-6), h["text"]
        seen.add(round(want, 6))
    # gone (expired/forgotten/superseded), fresh and decayed all occur
    assert len(seen) >= 3 and 0.0 in seen


@pytest.mark.slow
def test_parallel_channels_answer_as_serial_ones_and_a_failing_channel_degrades(make, tmp_path,
                                                                                monkeypatch):
    """Channels on worker connections (parallel_channels > 1) give exactly the serial answer; a
    channel whose SQL fails is named in `degraded` while the others still answer."""
    # one clock for both files: memories stamped a second apart would differ in recency
    monkeypatch.setenv("AOKUN_NOW", "2026-11-30T08:00:00Z")
    serial = make(tmp_path / "s.db", **{"recall.parallel_channels": 1,
                                        "recall.reinforce_on_recall": False})
    parallel = make(tmp_path / "p.db", **{"recall.parallel_channels": 4,
                                          "recall.reinforce_on_recall": False})
    for m in (serial, parallel):
        for text, meta in EXPLAIN_CORPUS:
            m.memorize(text, meta)
    for q in ("Alice coffee", "who likes espresso after lunch", "Bob"):
        a, b = serial.recall(q, k=5, explain=True), parallel.recall(q, k=5, explain=True)
        assert [(h["id"], h["score"], h["explain"]["ranks"]) for h in a["results"]] == \
               [(h["id"], h["score"], h["explain"]["ranks"]) for h in b["results"]]
    assert parallel._readers  # the parallel answer really came from worker connections
    for m in (serial, parallel):
        m.queries = dict(m.queries, recall_graph_vector="select * from no_such_table")
        out = m.recall("Alice espresso", k=3)
        assert [d["channel"] for d in out["degraded"]] == ["graph_vector"]
        assert "no_such_table" in out["degraded"][0]["reason"] and out["results"]


@pytest.mark.slow
def test_query_embedding_runs_while_the_keyword_channels_do(make, tmp_path):
    """The keyword channels start before the query is embedded, on the reader pool: an embedder
    that waits for the BM25 channel to have run gets to see it (it waited in vain when the query
    was embedded before any channel). explain's stats give every channel's time and rows, and how
    many candidates fusion saw, scored in full and pooled."""
    import threading
    started = threading.Event()
    m = make(tmp_path / "c.db", **{"recall.parallel_channels": 4,
                                   "recall.reinforce_on_recall": False})
    for text, meta in EXPLAIN_CORPUS:
        m.memorize(text, meta)
    reader_rows = m.reader_rows

    def spy(sql, params):
        out = reader_rows(sql, params)
        if sql == m.queries["recall_bm25"]:
            started.set()
        return out
    m.reader_rows = spy
    seen = []
    embed_query = m.embedder.embed_query

    def waiting(text):
        seen.append(started.wait(timeout=10))
        return embed_query(text)
    m.embedder.embed_query = waiting
    out = m.recall("Alice espresso", k=3, explain=True)
    assert seen == [True] and out["results"] and not out["degraded"]
    st = out["stats"]
    assert set(st["channel_ms"]) == set(st["channel_rows"]) == set(aokun.Recall.CHANNELS)
    assert all(ms >= 0 for ms in st["channel_ms"].values()) and st["channel_rows"]["bm25"] >= 1
    assert st["candidates"] >= st["scored"] >= st["pool"] >= len(out["results"])
    assert "stats" not in m.recall("Alice espresso", k=3)


def test_multi_line_query_vector_weights_its_last_line(mem, fake_embedder):
    """A conversation as the query: embedded whole plus its last line (query_last_line_weight)."""
    v = mem._query_vector("we talked about the trip\nwhere did we go skiing?")
    want = aokun._l2(fake_embedder.vector("we talked about the trip\nwhere did we go skiing?")
                     + fake_embedder.vector("where did we go skiing?"))
    assert np.allclose(v, want)
    assert np.allclose(mem._query_vector("one line only"), fake_embedder.vector("one line only"))
    mem.cfg.recall["query_last_line_weight"] = 0.0
    assert np.allclose(mem._query_vector("a\nb"), fake_embedder.vector("a\nb"))


def test_idf_of_counts_read_while_another_process_writes():
    """Two servers writing one file: a term's rows were counted after the table's, so hits > rows
    and recall raised "math domain error" (bm25_idf's log of a negative number)."""
    assert aokun.bm25_idf(7, 5) == 1e-6
    assert aokun.maxscore_split(["a", "b"], {"a": 9, "b": 1}, 5, 3)["match"]
