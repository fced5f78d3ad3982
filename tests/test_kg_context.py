"""The temporal knowledge graph (point-in-time queries, single-valued predicates, aliases,
history), as_of recall, source-aware ranking, pinned memories, memory_context and the session
briefing, consolidation and its undo, summarize_memory against a real local HTTP endpoint, and
the same features through the in-process MCP server."""

import datetime as dt
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from mcp import Client

import aokun
from fakes import FakeEmbedder, count, table_counts

NOW = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.timezone.utc)


# fixtures and helpers ----------------------------------------------------------------------------

@pytest.fixture
def clock(monkeypatch):
    """clock(t) sets $AOKUN_NOW (aokun.now()); starts at NOW."""
    def set_(t: dt.datetime) -> dt.datetime:
        monkeypatch.setenv("AOKUN_NOW", aokun.iso(t))
        return t
    set_(NOW)
    return set_


@pytest.fixture
def cfg_of(tmp_path):
    """cfg_of(**{"section.key": value}) -> Config: UTC, backups in tmp_path, no recall reinforcement
    (so a recall cannot change the signals of the next one)."""
    def make(**more):
        overrides = {("forgetting", "timezone"): "UTC", ("backup", "dir"): str(tmp_path / "bk"),
                     ("backup", "daily"): False, ("recall", "reinforce_on_recall"): False}
        overrides.update({tuple(k.split(".")): v for k, v in more.items()})
        return aokun.Config(None, overrides=overrides)
    return make


@pytest.fixture
def make(tmp_path, cfg_of, open_mem):
    """make(path=None, embedder=None, **settings) -> Memory (fake 16-d embedder, shared jieba);
    closed after the test."""
    return lambda path=None, embedder=None, **more: open_mem(path or tmp_path / "k.db", embedder,
                                                             cfg=cfg_of(**more))


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def objects(facts) -> list[str]:
    return [f["object"] for f in facts]


def ids(result) -> list[int]:
    return [h["id"] for h in result["results"]]


# temporal knowledge graph ------------------------------------------------------------------------

def test_point_in_time_queries_across_a_fact_that_changed_twice(make, clock):
    m = make()
    paris = m.kg_add("Alice", "lives_in", "Paris", valid_from="2020-01-01")
    london = m.kg_add("Alice", "lives_in", "London", valid_from="2022-01-01")
    tokyo = m.kg_add("Alice", "lives_in", "Tokyo", valid_from="2024-01-01")
    assert paris["closed"] == [] and london["closed"] == [paris["id"]]
    assert tokyo["closed"] == [london["id"]]
    for when, city in (("2021-06-01", "Paris"), ("2023-06-01", "London"), ("2025-06-01", "Tokyo"),
                       ("2022-01-01T00:00:00Z", "London"), (None, "Tokyo")):
        facts = m.kg_query("Alice", as_of=when)["facts"]
        assert [(f["subject"], f["predicate"], f["object"]) for f in facts] == \
            [("Alice", "lives_in", city)], when
    assert m.kg_query("Alice", as_of="2019-12-31")["facts"] == []
    assert objects(m.kg_query("Alice", as_of="2023-06-01", predicate="住在")["facts"]) == ["London"]
    assert m.kg_query("Alice", as_of="2023-06-01", predicate="likes")["facts"] == []
    # as object
    assert [f["subject"] for f in m.kg_query("London", as_of="2023-06-01")["facts"]] == ["Alice"]
    assert m.kg_query("London", as_of="2025-06-01")["facts"] == []
    timeline = m.kg_timeline("Alice")["facts"]
    assert [(f["object"], f["valid_from"], f["valid_to"]) for f in timeline] == [
        ("Paris", "2020-01-01T00:00:00Z", "2022-01-01T00:00:00Z"),
        ("London", "2022-01-01T00:00:00Z", "2024-01-01T00:00:00Z"),
        ("Tokyo", "2024-01-01T00:00:00Z", None)]
    assert m.kg_stats() == {"entities": 4, "triples": 3, "active": 1, "expired": 2, "predicates": 1}


def test_an_older_fact_recorded_late_ends_where_the_newer_one_starts(make, clock):
    m = make()
    tokyo = m.kg_add("Carol", "lives_in", "Tokyo", valid_from="2024-01-01")
    paris = m.kg_add("Carol", "lives_in", "Paris", valid_from="2020-01-01")
    assert paris["valid_to"] == "2024-01-01T00:00:00Z" and paris["closed"] == []
    assert m._triple(tokyo["id"])["valid_to"] is None
    assert objects(m.kg_query("Carol", as_of="2021-01-01")["facts"]) == ["Paris"]
    assert objects(m.kg_query("Carol")["facts"]) == ["Tokyo"]


def test_single_valued_predicate_closes_via_chinese_alias_and_entity_alias(make, clock):
    m = make()
    first = m.kg_add("小明", "住在", "北京", valid_from="2020-01-01")
    # alias → canonical display
    assert first["predicate"] == "lives_in" and first["object"] == "Beijing"
    # same fact, other spellings
    again = m.kg_add("小明", "lives in", "Beijing", valid_from="2021-01-01")
    assert again["existing"] is True and again["id"] == first["id"]
    assert m.kg_add("xiaoming's twin", "lives_in", "Peking")["object"] == "Beijing"
    assert count(m, "kg_entities", "canonical = 'beijing'") == 1
    moved = m.kg_add("小明", "居住在", "上海", valid_from="2023-01-01")
    assert moved["closed"] == [first["id"]] and moved["object"] == "Shanghai"
    assert objects(m.kg_query("小明", as_of="2022-01-01")["facts"]) == ["Beijing"]
    assert objects(m.kg_query("小明")["facts"]) == ["Shanghai"]
    assert [f["subject"] for f in m.kg_query("北京", as_of="2022-01-01")["facts"]] == ["小明"]
    assert [f["subject"] for f in m.kg_query("Peking")["facts"]] == ["xiaoming's twin"]  # since now
    assert [f["valid_to"] for f in m.kg_timeline("小明")["facts"]] == ["2023-01-01T00:00:00Z", None]


def test_multi_valued_predicate_does_not_close_and_same_open_fact_is_existing(make, clock):
    m = make()
    tea = m.kg_add("Alice", "likes", "green tea", valid_from="2020-01-01")
    coffee = m.kg_add("Alice", "likes", "coffee", valid_from="2021-01-01")
    assert coffee["closed"] == [] and m._triple(tea["id"])["valid_to"] is None
    assert sorted(objects(m.kg_query("Alice")["facts"])) == ["coffee", "green tea"]
    triples = count(m, "kg_triples")
    # case and whitespace resolve to the same entities
    same = m.kg_add("alice", "likes", "Green  Tea")
    assert same["existing"] is True and same["id"] == tea["id"] and same["closed"] == []
    assert count(m, "kg_triples") == triples
    assert m.kg_add("Alice", "lives_in", "Paris")["existing"] is False
    assert m.kg_add("Alice", "lives_in", "Paris")["existing"] is True


def test_entity_names_keep_their_characters_and_match_folded(make, clock):
    m = make()
    first = m.kg_add("Ｅｉｎｓｔｅｉｎ", "住在", "柏林①区", valid_from="2020-01-01")
    assert (first["subject"], first["predicate"], first["object"]) == \
        ("Ｅｉｎｓｔｅｉｎ", "lives_in", "柏林①区")
    assert m.kg_add("einstein", "lives in", "柏林1区", valid_from="2021-01-01")["id"] == first["id"]
    assert count(m, "kg_entities") == 2
    assert m.kg_query("EINSTEIN")["entity"] == "EINSTEIN"
    assert objects(m.kg_query("EINSTEIN")["facts"]) == ["柏林①区"]
    assert objects(m.kg_query("Ｅｉｎｓｔｅｉｎ")["facts"]) == ["柏林①区"]
    assert [f["object"] for f in m.recall("where does einstein live")["facts"]] == ["柏林①区"]


def test_no_dangling_relations_and_deleting_the_source_memory_keeps_the_fact(make, clock):
    m = make()
    doc = m.memorize("Dave started working at Initech.", {"participants": ["Dave"]})["id"]
    fact = m.kg_add("Dave", "works_at", "Initech", valid_from="2025-01-01", source_memory_id=doc)
    m.kg_add("Dave", "works_at", "Globex", valid_from="2026-01-01")
    m.kg_add("Dave", "likes", "Erin")
    with pytest.raises(aokun.NotFound):
        m.kg_add("Dave", "likes", "Frank", source_memory_id=doc + 100)
    assert m._triple(fact["id"])["source_memory_id"] == doc
    m.delete(doc)
    kept = m._triple(fact["id"])
    assert kept["source_memory_id"] is None and kept["object"] == "Initech"
    assert kept["valid_to"] == "2026-01-01T00:00:00Z"
    dangling = m.value("select count(*) from kg_triples"
                       " where subject_id not in (select id from kg_entities)"
                       " or object_id not in (select id from kg_entities)")
    assert dangling == 0
    assert list(m.conn.execute("pragma foreign_key_check")) == []
    assert count(m, "kg_triples") == 3


def test_kg_invalidate_keeps_history(make, clock):
    m = make()
    job = m.kg_add("Erin", "works_at", "Hooli", valid_from="2021-01-01")
    ended = m.kg_invalidate(job["id"], valid_to="2025-01-01")
    assert ended["valid_to"] == "2025-01-01T00:00:00Z"
    assert m.kg_query("Erin")["facts"] == []
    assert objects(m.kg_query("Erin", as_of="2024-06-01")["facts"]) == ["Hooli"]
    assert [(f["id"], f["valid_to"]) for f in m.kg_timeline("Erin")["facts"]] == \
        [(job["id"], "2025-01-01T00:00:00Z")]
    with pytest.raises(aokun.InputError):
        m.kg_invalidate(job["id"], valid_to="2020-01-01")
    with pytest.raises(aokun.NotFound):
        m.kg_invalidate(job["id"] + 99)
    # after invalidation the same fact can be recorded again, as a new fact
    again = m.kg_add("Erin", "works_at", "Hooli", valid_from="2026-01-01")
    assert again["existing"] is False and again["id"] != job["id"]
    assert len(m.kg_timeline("Erin")["facts"]) == 2


def test_invalidating_an_ended_fact_keeps_its_end(make, clock):
    m = make()
    job = m.kg_add("Erin", "works_at", "Initech", valid_from="2019-01-01", valid_to="2021-03-01")
    ended = m.kg_invalidate(job["id"])  # now is 2026: the fact ended five years ago
    assert ended["already_ended"] is True and ended["valid_to"] == "2021-03-01T00:00:00Z"
    assert ended["note"] == "already ended on 2021-03-01T00:00:00Z; its end is kept"
    assert m.kg_query("Erin", as_of="2023-01-01")["facts"] == []
    assert objects(m.kg_query("Erin", as_of="2020-06-01")["facts"]) == ["Initech"]
    # never moved
    assert m.kg_invalidate(job["id"], valid_to="2020-01-01")["valid_to"] == "2021-03-01T00:00:00Z"
    # an end still ahead is brought forward to the given time, never pushed later
    lease = m.kg_add("Erin", "rents", "Flat 4", valid_from="2025-01-01", valid_to="2027-01-01")
    assert m.kg_invalidate(lease["id"], valid_to="2028-01-01")["note"] == \
        "already ends on 2027-01-01T00:00:00Z; its end is kept"
    now = m.kg_invalidate(lease["id"])
    assert (now["already_ended"], now["valid_to"], now["note"]) == \
        (False, aokun.iso(NOW), f"ended on {aokun.iso(NOW)}")


def test_deleting_an_entity_deletes_its_facts_and_leaves_tombstones(make, clock):
    m = make()
    fact_uids = [m.kg_add("Mallory", "lives_in", "Leeds", valid_from="2020-01-01")["uid"],
                 m.kg_add("Trent", "knows", "Mallory")["uid"],
                 m.kg_add("Mallory", "likes", "chess")["uid"]]
    kept = m.kg_add("Trent", "likes", "Leeds")
    theirs = m.kg_add("Mallory", "likes", "chess", persona_id="work")
    eid = m.value("select id from kg_entities where persona_id = '' and canonical = 'mallory'")
    uid = m.value("select uid from kg_entities where id = ?", (eid,))
    out = m.kg_delete_entity("MALLORY")  # resolved like a query: case and aliases
    assert out["deleted"] is True and out["entity"] == "Mallory" and out["uid"] == uid
    assert len(out["facts"]) == 3
    assert m.value("select count(*) from kg_triples where subject_id = ? or object_id = ?",
                   (eid, eid)) == 0
    assert m.value("select count(*) from kg_entities where id = ?", (eid,)) == 0
    assert list(m.conn.execute("pragma foreign_key_check")) == []
    tomb = {r["uid"]: r["table_name"] for r in m.rows("select uid, table_name from tombstones")}
    assert tomb == {uid: "kg_entities", **{u: "kg_triples" for u in fact_uids}}
    with pytest.raises(aokun.NotFound, match="no entity 'Mallory'"):
        m.kg_query("Mallory")
    with pytest.raises(aokun.NotFound, match="no entity 'Mallory'"):
        m.kg_timeline("Mallory")
    with pytest.raises(aokun.NotFound):
        m.kg_delete_entity("Mallory")
    # the other ends of its facts, other facts and the other persona's Mallory stay
    assert [f["id"] for f in m.kg_query("Trent")["facts"]] == [kept["id"]]
    assert [f["id"] for f in m.kg_query("Mallory", persona_id="work")["facts"]] == [theirs["id"]]
    assert m.kg_stats()["triples"] == 1 and m.kg_stats()["entities"] == 3  # Leeds, Trent and chess


# recall: as_of, source boost, pins ---------------------------------------------------------------

def test_as_of_recall_excludes_later_documents(make, clock):
    m = make()
    early = m.memorize("Garden tomatoes ripened early in the greenhouse.",
                       {"timestamp": "2024-07-01T09:00:00Z"})["id"]
    late = m.memorize("Garden tomatoes were eaten by slugs in the greenhouse.",
                      {"timestamp": "2026-05-01T09:00:00Z"})["id"]
    assert sorted(ids(m.recall("garden tomatoes greenhouse", k=5))) == sorted([early, late])
    past = m.recall("garden tomatoes greenhouse", k=5, as_of="2025-01-01")
    assert ids(past) == [early]
    assert ids(m.recall("garden tomatoes greenhouse", k=5, as_of="2024-06-30")) == []
    at_late = m.recall("garden tomatoes greenhouse", k=5, as_of="2026-05-01T09:00:00Z")
    assert sorted(ids(at_late)) == sorted([early, late])


def test_source_boost_orders_otherwise_equal_memories(make, clock):
    m = make()
    # same words and (the fake embedder lower-cases) the same vector; only the case differs
    a = m.memorize("Zed flies blue kites on windy beaches.", {"source": "chat"})["id"]
    b = m.memorize("zed flies blue kites on windy beaches.", {"source": "import"})["id"]

    def ranked():
        hits = m.recall("blue kites", k=5, explain=True)["results"]
        return [h["id"] for h in hits], {h["id"]: h["explain"] for h in hits}

    order, ex = ranked()
    assert order == [a, b]
    assert ex[a]["source_boost"] == pytest.approx(1.10)
    assert ex[b]["source_boost"] == pytest.approx(0.90)
    unboosted = {i: ex[i]["fused"] / ex[i]["source_boost"] for i in (a, b)}
    assert unboosted[a] == pytest.approx(unboosted[b], rel=0.02)  # equal but for the boost
    with m.tx() as c:  # swap the sources and nothing else
        c.execute("update documents set source = case id when ? then 'import' else 'chat' end"
                  " where id in (?, ?)",
                  (a, a, b))
    order, ex = ranked()
    assert order == [b, a]
    assert ex[b]["source_boost"] == pytest.approx(1.10)
    assert ex[a]["source_boost"] == pytest.approx(0.90)
    with m.tx() as c:
        c.execute("update documents set source = 'note' where id in (?, ?)", (a, b))
    assert {i: e["source_boost"] for i, e in ranked()[1].items()} == {a: 1.0, b: 1.0}


KITES = ["Blue kites fly high over the dunes.", "Kites in blue and white for the festival.",
         "We repaired two blue kites after the storm.", "Blue kites tangled in the old oak tree.",
         "The kite shop sells blue kites in spring."]
# no shared word with the query; cosine 0.78 (fake 16-d)
PIN_NEAR = "Never schedule meetings before ten."
PIN_FAR = "The user is allergic to peanuts."  # cosine −0.40


@pytest.mark.parametrize("threshold, joins", [(None, True), (0.999, False)])
def test_a_pinned_memory_joins_when_similar_enough(make, clock, threshold, joins):
    fake = FakeEmbedder(16)
    cosine = float(fake.vector("blue kites") @ fake.vector(PIN_NEAR))
    assert 0.4 <= cosine < 0.999 and float(fake.vector("blue kites") @ fake.vector(PIN_FAR)) < 0.4
    rule = {} if threshold is None else {"recall.pin_similarity_threshold": threshold}
    m = make(embedder=fake, **rule)
    kite_ids = [m.memorize(t)["id"] for t in KITES]
    near = m.memorize(PIN_NEAR, {"pinned": True})["id"]
    far = m.memorize(PIN_FAR, {"pinned": True})["id"]
    hits = m.recall("blue kites", k=3, explain=True)["results"]
    got = [h["id"] for h in hits]
    assert len(got) == 3 and far not in got
    assert (near in got) is joins
    assert set(got) - {near} <= set(kite_ids)
    if joins:
        pinned = next(h for h in hits if h["id"] == near)
        assert pinned["pinned"] is True
        assert pinned["explain"]["pin_similarity"] == pytest.approx(cosine, abs=3e-3)
    # without the pin rule it would not be there: unpin it
    m.set_flag(near, "pinned", False)
    assert near not in ids(m.recall("blue kites", k=3))


# memory_context and the briefing -----------------------------------------------------------------

ZH = ("我们在杭州的项目里讨论了数据库迁移、缓存策略和发布流程，决定下个季度把所有服务迁到新的集群，"
      "同时保留旧系统三个月作为回退方案。")
EN = ("In the project review we discussed the database migration, the cache strategy and the "
      "release process, and decided to move every service to the new cluster next quarter while "
      "keeping the old system for three months as a fallback. ")


@pytest.mark.slow
def test_memory_context_stays_within_budget_for_long_chinese_and_english(make, clock):
    m = make()
    for i in range(6):
        m.memorize(f"项目记录{i}：" + ZH * 25, {"importance": 0.9, "topics": ["项目"]})
        m.memorize(f"Project log {i}: " + EN * 25,
                   {"importance": 0.9, "topics": ["project"], "pinned": i == 0})
    m.kg_add("Project Atlas", "uses", "PostgreSQL")
    for topic in (None, "项目 数据库迁移", "project database migration"):
        for mode, budget in (("quick", 400), ("chat", 1500), ("coding", 2000), ("project", 3000)):
            for max_tokens in (None, 60):
                out = m.memory_context(topic, mode=mode, max_tokens=max_tokens)
                want = max_tokens or budget
                assert out["budget"] == want
                assert aokun.estimate_tokens(out["text"]) <= want, (topic, mode, max_tokens)
                assert out["tokens"] == aokun.estimate_tokens(out["text"])
                assert out["text"].strip(), (topic, mode, max_tokens)
                assert out["source"] == ("briefing" if topic is None else "dynamic")
                if max_tokens is None and mode != "quick":
                    assert out["tokens"] > want * 0.5  # the budget is used, not wasted
    with pytest.raises(aokun.InputError):
        m.memory_context(None, mode="novel")
    with pytest.raises(aokun.InputError):
        m.memory_context(None, max_tokens=10)


def test_estimate_tokens_and_fit_tokens():
    assert aokun.estimate_tokens("你好世界") == 4
    assert aokun.estimate_tokens("abcdefgh") == 2
    assert aokun.estimate_tokens("abcdefghi") == 3
    lines = ["# header", "你" * 500, "tail"]
    for budget in (5, 50, 60, 400):
        assert aokun.estimate_tokens(aokun.fit_tokens(lines, budget)) <= budget
    assert aokun.fit_tokens(["a", "b"], 100) == "a\nb"


def test_briefing_does_no_embedding_work(make, clock):
    fake = FakeEmbedder(16)
    m = make(embedder=fake)
    m.memorize("Alice prefers green tea.", {"importance": 0.9})
    m.kg_add("Alice", "likes", "green tea")
    calls = fake.calls
    first = m.memory_context()  # built on first use
    again = m.memory_context(mode="quick")
    assert fake.calls == calls
    assert first["source"] == again["source"] == "briefing"
    assert "Alice prefers green tea." in first["text"] and "Alice likes green tea" in first["text"]
    m.memory_context("green tea")  # the dynamic path does embed the topic (the counter works)
    assert fake.calls > calls


def _briefing(m):
    return m.rows("select * from briefings where persona_id = ''")[0]


def test_briefing_goes_stale_and_is_regenerated_after_the_interval(make, clock):
    m = make()
    first = m.memorize("Alice prefers green tea.", {"importance": 0.9})["id"]
    m.build_briefing()
    assert _briefing(m)["stale"] == 0 and m.refresh_stale_briefings() == 0
    t = NOW

    def step(change, expect_in_text):
        nonlocal t
        change()
        assert _briefing(m)["stale"] == 1
        t = clock(t + dt.timedelta(minutes=4))
        assert m.refresh_stale_briefings() == 0  # younger than briefing_regen_interval_minutes (5)
        assert _briefing(m)["stale"] == 1
        t = clock(t + dt.timedelta(minutes=2))
        assert m.refresh_stale_briefings() == 1
        b = _briefing(m)
        assert b["stale"] == 0 and b["generated_at"] == aokun.iso(t) and expect_in_text in b["text"]
        assert m.refresh_stale_briefings() == 0  # once
        assert m.memory_context()["generated_at"] == aokun.iso(t)  # fresh: served as it is

    step(lambda: m.memorize("Bob moved to Berlin last spring.", {"importance": 0.9}),
         "Bob moved to Berlin")
    step(lambda: m.kg_add("Bob", "lives_in", "Berlin"), "Bob lives_in Berlin")
    other = m.memorize("A minor note about umbrellas.",
                       {"importance": 0.1, "timestamp": "2025-01-01T00:00:00Z"})["id"]
    t = clock(t + dt.timedelta(minutes=6))
    m.refresh_stale_briefings()
    assert "umbrellas" not in _briefing(m)["text"]  # neither important nor recent
    step(lambda: m.set_flag(other, "pinned", True), f"[{other}] A minor note about umbrellas.")
    step(lambda: m.set_importance(first, 0.2), "Alice prefers green tea.")  # still recent
    # another persona's write leaves this briefing alone
    m.memorize("Work persona note.", {"persona_id": "work"})
    assert _briefing(m)["stale"] == 0


def test_memory_context_rebuilds_a_stale_briefing_before_serving_it_and_says_its_age(make, clock,
                                                                                     monkeypatch):
    m = make()
    builds = []
    build = m.build_briefing
    monkeypatch.setattr(m, "build_briefing",
                        lambda persona_id=None: builds.append(persona_id) or build(persona_id))
    m.memorize("Alice prefers green tea.", {"importance": 0.9})
    first = m.memory_context()  # built on first use
    assert builds == [""] and first["age_seconds"] == 0 and first["generated_at"] == aokun.iso(NOW)
    # younger than briefing_regen_interval_minutes: no matter
    t = clock(NOW + dt.timedelta(minutes=1))
    new = m.memorize("Bob moved to Berlin last spring.", {"importance": 0.9})["id"]
    out = m.memory_context()
    assert f"[{new}] Bob moved to Berlin last spring." in out["text"] and len(builds) == 2
    assert out["stale"] is False and out["age_seconds"] == 0 and out["generated_at"] == aokun.iso(t)
    clock(t + dt.timedelta(minutes=7, seconds=3))  # nothing written since: the stored one, older
    for mode in ("quick", "project"):
        again = m.memory_context(mode=mode)
        assert again["generated_at"] == aokun.iso(t) and again["age_seconds"] == 423
        assert again["stale"] is False
    assert len(builds) == 2 and _briefing(m)["stale"] == 0
    assert m.memory_context("tea")["age_seconds"] == 0  # a dynamic context is built now


def test_memory_context_sees_every_kind_of_change_at_once(make, clock, tmp_path):
    m = make()
    other = make(path=m.path)  # another connection (another process in real use) writes too
    tea = m.memorize("Alice prefers green tea.", {"importance": 0.9})["id"]
    note = m.memorize("A minor note about umbrellas.",
                      {"importance": 0.1, "timestamp": "2025-01-01T00:00:00Z"})["id"]
    m.memory_context()
    changes = [
        (lambda: m.memorize("Carol bought a kayak.", {"importance": 0.9}),
         "Carol bought a kayak.", True),
        (lambda: other.memorize("Dan learned the oboe.", {"importance": 0.9}),
         "Dan learned the oboe.", True),
        (lambda: m.edit(tea, "Alice prefers jasmine tea."), "Alice prefers jasmine tea.", True),
        (lambda: m.set_flag(note, "pinned", True), "umbrellas", True),
        (lambda: m.set_flag(note, "archived", True), "umbrellas", False),
        (lambda: m.restore_memory(note), "umbrellas", True),
        (lambda: m.kg_add("Carol", "lives_in", "Oslo"), "Carol lives_in Oslo", True),
        (lambda: other.delete(tea), "jasmine", False),
    ]
    for change, needle, present in changes:
        change()
        out = m.memory_context(mode="project")
        assert (needle in out["text"]) is present, needle
        assert out["stale"] is False and out["age_seconds"] == 0


def test_a_decay_day_marks_briefings_stale_and_a_dry_run_does_not(make, clock):
    m = make()
    m.memorize("Alice prefers green tea.", {"importance": 0.9})
    m.memorize("Work persona note.", {"persona_id": "work", "importance": 0.9})
    m.build_briefing()
    m.build_briefing("work")
    m.decay(dry_run=True, days=3)
    assert [r["stale"] for r in m.rows("select stale from briefings order by persona_id")] == [0, 0]
    m.decay(days=1)
    assert [r["stale"] for r in m.rows("select stale from briefings order by persona_id")] == [1, 1]


def test_a_failed_rebuild_serves_the_stale_briefing_marked_stale(make, clock, monkeypatch, caplog):
    m = make()
    m.memorize("Alice prefers green tea.", {"importance": 0.9})
    m.memory_context()
    m.memorize("Bob moved to Berlin.", {"importance": 0.9})
    clock(NOW + dt.timedelta(seconds=90))

    def busy(persona_id=None):
        raise aokun.apsw.BusyError("database is locked")
    monkeypatch.setattr(m, "build_briefing", busy)
    out = m.memory_context()
    assert out["stale"] is True and out["age_seconds"] == 90 and "Bob" not in out["text"]
    assert "green tea" in out["text"] and "stale briefing" in caplog.text


# consolidation -----------------------------------------------------------------------------------

SHORT = "Alice drinks iced americano every morning at the office."
LONG = "Alice drinks iced americano every morning at the office downtown."


def _near_duplicates(m):
    a = m.memorize(SHORT, {"topics": ["coffee"], "participants": ["Alice"],
                           "key_facts": ["Alice drinks iced americano."], "importance": 0.9,
                           "timestamp": "2026-01-01T08:00:00Z"})["id"]
    b = m.memorize(LONG, {"topics": ["office", "coffee"], "participants": ["Bob"],
                          "key_facts": ["The office is downtown."], "importance": 0.3,
                          "timestamp": "2026-03-01T08:00:00Z"})["id"]
    c = m.memorize("Carol repairs vintage bicycles in her garage on weekends.",
                   {"importance": 0.5})["id"]
    return a, b, c


def test_consolidate_dry_run_changes_nothing(make, clock, tmp_path):
    path = tmp_path / "cons.db"
    m = make(path)
    a, b, c = _near_duplicates(m)
    m.close()
    h0 = sha256(path)
    m = make(path)
    counts = table_counts(m)
    out = m.consolidate(dry_run=True)
    assert out["dry_run"] is True
    assert [(cl["survivor"], cl["members"]) for cl in out["clusters"]] == [(b, [a])]
    assert set(out["clusters"][0]["texts"]) == {a, b}
    assert table_counts(m) == counts
    m.close()
    assert sha256(path) == h0


def test_consolidate_merges_and_restore_memory_undoes_it(make, clock):
    m = make()
    a, b, c = _near_duplicates(m)
    before = m._doc(b)
    own_atoms = ("select content, state, created_at, last_reinforced_at, expires_at"
                 " from memory_atoms where document_id = ?")
    atoms_before = m.rows(own_atoms, (b,))
    assert atoms_before[0]["expires_at"] == "2026-07-23T08:00:00Z"  # 180 × 0.8 days after 1 March
    out = m.consolidate(dry_run=False)
    assert [(cl["survivor"], cl["members"]) for cl in out["clusters"]] == [(b, [a])]
    assert out["dry_run"] is False
    s = m._doc(b)
    assert s["content"] == LONG
    assert s["topics"] == ["office", "coffee"]
    assert s["participants"] == ["Bob", "Alice"]
    assert s["key_facts"] == ["The office is downtown.", "Alice drinks iced americano."]
    assert s["importance"] == 0.9 and s["created_at"] == "2026-01-01T08:00:00Z"
    assert s["archived"] is False
    member = m._doc(a)
    assert member["archived"] is True and member["merged_into"] == b
    assert m._doc(c)["archived"] is False and m._doc(c)["merged_into"] is None
    assert a not in ids(m.recall("iced americano", k=5))
    assert a in ids(m.recall("iced americano", k=5, include_archived=True))
    assert m.consolidate(dry_run=True)["clusters"] == []  # nothing left to merge
    assert m.doctor() == []

    r = m.restore_memory(b)
    assert r["restored"] == [a] and r["id"] == b
    s = m._doc(b)
    for k in ("content", "topics", "participants", "key_facts", "importance", "created_at",
              "archived"):
        assert s[k] == before[k], k
    member = m._doc(a)
    assert member["archived"] is False and member["merged_into"] is None
    assert count(m, "consolidations") == 0
    # the survivor's own atoms are dated as before the merge (they were re-derived at the merged,
    # earlier created_at, which made "The office is downtown." expire on 25 May, in the past)
    assert m.rows(own_atoms, (b,)) == atoms_before
    assert set(ids(m.recall("iced americano", k=5))) >= {a, b}
    assert m.doctor() == []


def test_repeat_of_a_merged_memory_answers_with_the_survivor(make, clock):
    m = make()
    a, b, c = _near_duplicates(m)
    m.consolidate(dry_run=False)
    r = m.memorize(SHORT, {"topics": ["espresso"]})
    # the duplicate stays merged: the survivor holds the fact and gets the new topic
    assert (r["id"], r["deduplicated"]) == (b, True)
    assert r["changed"] == {"topics": [["office", "coffee"], ["office", "coffee", "espresso"]]}
    assert r["warnings"][0] == (f"this text is memory {a}, which consolidation merged into memory "
                                f"{b}: memory {b} holds the fact now (its id is returned); "
                                f"restore_memory({a}) makes memory {a} a memory of its own again, "
                                f"restore_memory({b}) undoes its merge")
    assert r["warnings"][1] == (f"memory {b} already held this text; the repeat's metadata was "
                                "merged into it (topics changed)")
    member = m._doc(a)
    assert member["archived"] is True and member["merged_into"] == b
    assert m._doc(b)["topics"] == ["office", "coffee", "espresso"]
    assert ids(m.recall("espresso", k=5, channels="bm25")) == [b]
    plain = m.memorize(SHORT)  # a plain repeat: the pointer, nothing changed
    assert (plain["id"], plain["changed"], len(plain["warnings"])) == (b, {}, 1)
    # the undo the warning names
    m.restore_memory(a)
    assert m._doc(a)["archived"] is False
    assert m.memorize(SHORT)["id"] == a and m.memorize(SHORT)["warnings"] == []
    assert m.doctor() == []


def test_repeat_of_a_merged_memory_follows_the_chain_and_restores_an_archived_survivor(make, clock):
    m = make()
    a, b, c = _near_duplicates(m)
    m.consolidate(dry_run=False)
    # b itself merged into c later (a second consolidation), and c archived since
    with m.tx() as conn:
        m._set_flag_in_tx(b, "archived", True)
        conn.execute("update documents set merged_into = ? where id = ?", (c, b))
        m._set_flag_in_tx(c, "archived", True)
    r = m.memorize(SHORT)
    assert r["id"] == c and r["changed"]["archived"] == [True, False]
    assert f"merged into memory {c}" in r["warnings"][0]
    assert f"memory {c} was archived" in r["warnings"][1]
    assert m._doc(c)["archived"] is False and m._doc(a)["merged_into"] == b


def test_repeat_of_a_merged_memory_whose_survivor_was_deleted_restores_it(make, clock):
    m = make()
    a, b, c = _near_duplicates(m)
    m.consolidate(dry_run=False)
    m.delete(b)  # the foreign key clears merged_into: `a` is the only copy of its text now
    assert m._doc(a)["merged_into"] is None and m._doc(a)["archived"] is True
    r = m.memorize(SHORT)
    assert (r["id"], r["changed"]) == (a, {"archived": [True, False]})
    assert r["warnings"] == [f"memory {a} was archived; memorizing it again restored it to recall "
                             f"(archive_memory({a}) archives it again)"]
    assert a in ids(m.recall("iced americano", k=5)) and m.doctor() == []


# summarize_memory against a real HTTP endpoint ---------------------------------------------------

class _ChatHandler(BaseHTTPRequestHandler):
    replies: list = []
    requests: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                    "body": body})
        content = type(self).replies.pop(0)
        message = {"role": "assistant", "content": content}
        data = json.dumps({"id": "chatcmpl-1", "object": "chat.completion",
                           "model": body.get("model"),
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": message}]}).encode()
        status = 200 if self.path == "/v1/chat/completions" else 404
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def chat_server():
    handler = type("Handler", (_ChatHandler,), {"replies": [], "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()
    t.join()


@pytest.mark.slow
def test_summarize_memory_through_an_openai_compatible_endpoint(make, clock, chat_server,
                                                                monkeypatch):
    handler, base_url = chat_server
    monkeypatch.setenv("TEST_LLM_KEY", "sk-local-test")
    summary = {"summary": "Alice 决定下个月搬到上海，并开始学习粤语。", "topics": ["搬家", "语言"],
               "key_facts": ["Alice 下个月搬到上海。", "Alice 开始学习粤语。"],
               "participants": ["Alice"],
               "sentiment": "positive", "importance": 0.8}
    handler.replies.append("```json\n" + json.dumps(summary, ensure_ascii=False) + "\n```")
    m = make(**{"llm.base_url": base_url, "llm.model": "test-chat",
                "llm.api_key_env": "TEST_LLM_KEY"})
    out = m.summarize_memory([{"role": "user", "content": "我下个月要搬去上海了"},
                              {"role": "assistant", "content": "太好了！需要学粤语吗？"}],
                             {"session_id": "s1"})
    [req] = handler.requests
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-local-test"
    assert req["body"]["model"] == "test-chat"
    # as given
    assert req["body"]["messages"][1]["content"] == ("user: 我下个月要搬去上海了\n"
                                                     "assistant: 太好了！需要学粤语吗？")
    assert out["summary"] == summary
    doc = m.get(out["memory"]["id"])
    # "，" kept
    assert doc["content"] == summary["summary"] == "Alice 决定下个月搬到上海，并开始学习粤语。"
    assert doc["key_facts"] == summary["key_facts"] and doc["topics"] == summary["topics"]
    assert doc["participants"] == ["Alice"] and doc["importance"] == 0.8
    assert doc["source"] == "chat" and doc["session_id"] == "s1" and doc["sentiment"] == "positive"
    assert sorted(a["content"] for a in doc["atoms"]) == sorted(doc["key_facts"])

    handler.replies.append("Sorry, I cannot do that.")
    with pytest.raises(aokun.AokunError, match="JSON"):
        m.summarize_memory("user: hello")
    assert count(m, "documents") == 1


def test_summarize_memory_without_an_endpoint_says_to_set_llm(make, clock):
    m = make()
    with pytest.raises(aokun.AokunError, match=r"\[llm\]") as e:
        m.summarize_memory("user: remember that I like tea")
    assert "base_url" in str(e.value)
    assert count(m, "documents") == 0


# MCP ---------------------------------------------------------------------------------------------

@pytest.fixture
def anyio_backend():
    return "asyncio"


async def _ok(client, tool, args=None) -> dict:
    r = await client.call_tool(tool, args or {})
    assert r.is_error is False, f"{tool}({args}) failed: {r.content[0].text if r.content else r}"
    return r.structured_content


@pytest.mark.slow
@pytest.mark.anyio
async def test_mcp_kg_context_preview_consolidation_and_briefing(tmp_path, segmenter, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", aokun.iso(NOW))
    # no project (the tests run in a git checkout): the stored briefing, not one per project
    monkeypatch.setattr(aokun, "_client_project", lambda ctx: "")
    db = tmp_path / "mcp.db"
    cfg = aokun.Config(None, overrides={("server", "exposed_tools"): "all",
                                        ("backup", "dir"): str(tmp_path / "bk"),
                                        ("backup", "daily"): False,
                                        ("forgetting", "timezone"): "UTC",
                                        ("forgetting", "scheduler_interval_seconds"): 3600.0})
    fake = FakeEmbedder(16)

    def factory():
        m = aokun.Memory(db, cfg, embedder=fake)
        m.seg = segmenter
        return m

    async with Client(aokun.build_server(factory, cfg)) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"kg_add", "kg_query", "memory_context", "forget_preview", "consolidate",
                "restore_memory", "set_importance"} <= names
        paris = await _ok(client, "kg_add", {"subject": "Alice", "predicate": "住在",
                                             "object": "Paris", "valid_from": "2020-01-01"})
        tokyo = await _ok(client, "kg_add", {"subject": "Alice", "predicate": "lives_in",
                                             "object": "Tokyo", "valid_from": "2024-01-01"})
        assert tokyo["closed"] == [paris["id"]] and tokyo["existing"] is False
        same = await _ok(client, "kg_add", {"subject": "alice", "predicate": "lives_in",
                                            "object": "tokyo"})
        assert same["existing"] is True and same["id"] == tokyo["id"]
        q = await _ok(client, "kg_query", {"entity": "Alice", "as_of": "2021-06-01"})
        assert [f["object"] for f in q["facts"]] == ["Paris"]
        current = await _ok(client, "kg_query", {"entity": "Alice"})
        assert [f["object"] for f in current["facts"]] == ["Tokyo"]

        a = (await _ok(client, "memorize", {"content": SHORT, "metadata": {
            "importance": 0.9, "timestamp": "2026-05-01T08:00:00Z"}}))["id"]
        b = (await _ok(client, "memorize", {"content": LONG,
                                            "metadata": {"importance": 0.3}}))["id"]
        museum = (await _ok(client, "memorize", {"content": "Museum day.", "metadata": {
            "key_facts": ["Yesterday I visited the science museum with Tom."]}}))["id"]

        calls = fake.calls
        ctx = await _ok(client, "memory_context", {"max_tokens": 200})
        assert ctx["source"] == "briefing" and ctx["tokens"] <= 200
        assert "Alice lives_in Tokyo" in ctx["text"]
        assert ctx["stale"] is False and ctx["age_seconds"] == 0
        assert ctx["generated_at"] == aokun.iso(NOW)
        assert fake.calls == calls
        later = NOW + dt.timedelta(minutes=2)
        monkeypatch.setenv("AOKUN_NOW", aokun.iso(later))
        # nothing changed
        assert (await _ok(client, "memory_context", {"max_tokens": 200}))["age_seconds"] == 120
        kayak = (await _ok(client, "memorize", {"content": "Tom bought a red kayak.",
                                                "metadata": {"importance": 0.9}}))["id"]
        ctx = await _ok(client, "memory_context", {})
        assert f"[{kayak}] Tom bought a red kayak." in ctx["text"] and ctx["age_seconds"] == 0
        briefing = (await client.read_resource("memory://briefing")).contents[0].text
        assert f"[{kayak}] Tom bought a red kayak." in briefing
        tools = {t.name: t for t in (await client.list_tools()).tools}
        blob = tools["memory_context"].output_schema["properties"]
        assert "age_seconds" in blob and blob["age_seconds"]["type"] == "integer"
        monkeypatch.setenv("AOKUN_NOW", aokun.iso(NOW))
        dyn = await _ok(client, "memory_context", {"topic": "iced americano", "mode": "quick"})
        assert dyn["source"] == "dynamic" and "iced americano" in dyn["text"]
        assert dyn["tokens"] <= 400

        preview = await _ok(client, "forget_preview", {"days": 8})
        assert len(preview["days"]) == 8
        assert preview["as_of"] == aokun.iso(NOW + dt.timedelta(days=8))
        atom_changes = {(c["old"], c["new"]) for c in preview["atoms"]}
        assert ("active", "expired") in atom_changes  # the museum atom (7-day TTL)
        # read-only
        assert (await _ok(client, "forget_preview", {"days": 8}))["atoms"] == preview["atoms"]

        s = await _ok(client, "set_importance", {"id": b, "importance": 0.6})
        assert s == {"id": b, "uid": s["uid"], "old": 0.3, "new": 0.6}
        assert (await client.call_tool("set_importance", {"id": b, "importance": 1.5})).is_error

        dry = await _ok(client, "consolidate", {})
        assert dry["dry_run"] is True
        assert [(c["survivor"], c["members"]) for c in dry["clusters"]] == [(b, [a])]
        done = await _ok(client, "consolidate", {"dry_run": False})
        assert done["dry_run"] is False and done["clusters"] == dry["clusters"]
        merged = await _ok(client, "get_memory", {"id": a})
        assert merged["archived"] is True
        survivor = await _ok(client, "get_memory", {"id": b})
        assert survivor["importance"] == 0.9 and survivor["created_at"] == "2026-05-01T08:00:00Z"
        r = await _ok(client, "restore_memory", {"id": b})
        assert r["restored"] == [a] and r["archived"] is False
        assert (await _ok(client, "get_memory", {"id": a}))["archived"] is False
        assert (await _ok(client, "get_memory", {"id": b}))["importance"] == 0.6

        res = await client.read_resource("memory://briefing")
        text = res.contents[0].text
        assert text.startswith("# Memory briefing") and "Alice lives_in Tokyo" in text
        assert f"[{museum}] Museum day." in text
        assert aokun.estimate_tokens(text) <= 3000


def test_restore_memory_never_unarchives_another_personas_memory(make, clock):
    """A consolidation row naming another persona's memory among its members (a damaged or crafted
    row: the engine never merges across personas) restores only the survivor's persona's."""
    m = make()
    a, b, _c = _near_duplicates(m)
    m.consolidate(dry_run=False)
    other = m.memorize("Mallory's archived note", {"persona_id": "mallory"})["id"]
    m.set_flag(other, "archived", True, persona_id="mallory")
    with m.tx() as c:
        c.execute("update consolidations set members = ? where survivor_id = ?",
                  (json.dumps([a, other]), b))
    assert m.restore_memory(b)["restored"] == [a]
    assert m._doc(other, "mallory")["archived"] is True
