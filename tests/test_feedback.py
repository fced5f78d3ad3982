"""Reinforcement rewards use, not retrieval (issue 11): a recall's own touches do not move ranking,
so asking the same questions again gives the same or better answers; memory_feedback (what the
assistant says it used) does; schema 7 adds its columns to files made before."""

import datetime as dt
import math

import pytest

import aokun
from fakes import FakeEmbedder, default_graph_columns_of_schema12, open_at_schema

# A small life story, told a year ago and more (like an imported chat history, or the LoCoMo and
# MADial conversations): one memory answers each question, two or three near the same topic do
# not, and a few are about nothing asked. (text, days ago)
CORPUS = [
    ("Alice switched from iced americano to oat-milk lattes after her stomach trouble in spring.",
     345),
    ("Alice's colleague Ben drinks black coffee and hates milk in it.", 315),
    ("The café near Alice's office sells an americano for three euros.", 330),
    ("Alice spent two weeks hiking in Patagonia last November with her sister Mia.", 340),
    ("Alice wants to visit Iceland some day to see the northern lights.", 310),
    ("Mia, Alice's sister, went to Lisbon for a conference on hiking trails.", 340),
    ("Alice adopted a grey cat named Pixel from the shelter.", 330),
    ("Alice's neighbour has a loud dog called Rocky.", 312),
    ("Alice is allergic to horses and cats' fur makes her sneeze a little.", 350),
    ("Alice started a new job as a data engineer at Northwind in January.", 300),
    ("Alice interviewed at Contoso but turned down the offer.", 325),
    ("Ben works at Contoso as a designer.", 308),
    ("Alice has been learning the cello for two years and practises on Sunday mornings.", 320),
    ("Alice went to a piano concert with Ben in the old town.", 320),
    ("Mia plays guitar in a rock band.", 335),
    ("Alice broke her left wrist while skiing in February.", 340),
    ("Alice goes to the gym three times a week to keep her wrist strong.", 318),
    ("Ben sprained his ankle playing football.", 306),
    ("Alice is vegetarian and her favourite dish is mushroom risotto.", 310),
    ("Ben cooked a lamb stew for the dinner party.", 314),
    ("Alice tried a new sushi place but found the food too expensive.", 309),
    ("Alice moved into a flat in Rotterdam near the harbour in March.", 325),
    ("Mia still lives in their parents' house in Utrecht.", 322),
    ("Alice is thinking about buying a bigger flat next year.", 311),
    ("Alice's book club is reading 'The Left Hand of Darkness' this month.", 330),
    ("Ben lent Alice a thriller she never finished.", 316),
    ("Alice prefers audiobooks when she commutes.", 328),
    ("Alice's birthday is on 14 August; she wants a quiet dinner this year.", 350),
    ("Mia's birthday party last year was at a karaoke bar.", 345),
    ("Alice bought Ben a watch for his birthday.", 307),
    ("Alice fixed the leaking kitchen tap herself.", 300),
    ("Alice and Ben watched a documentary about octopuses.", 333),
    ("Alice renewed her passport in the spring.", 315),
    ("Alice's car needed new tyres before winter.", 355),
    ("Alice volunteers at the food bank once a month.", 305),
    ("Alice is planning a trip to Japan with Ben next spring.", 305),
]
QUESTIONS = [  # (question, index in CORPUS of the memory that answers it)
    ("What coffee does Alice drink now?", 0),
    ("Where did Alice go hiking with her sister?", 3),
    ("What is the name of Alice's cat?", 6),
    ("Where does Alice work?", 9),
    ("Which instrument is Alice learning?", 12),
    ("How did Alice hurt her wrist?", 15),
    ("What food does Alice like?", 18),
    ("Where does Alice live?", 21),
    ("What is Alice's book club reading?", 24),
    ("When is Alice's birthday?", 27),
]


def _story(m) -> list[int]:
    ref = aokun.now()
    items = [(text, {"timestamp": aokun.iso(ref - dt.timedelta(days=days))})
             for text, days in CORPUS]
    return [r["id"] for r in m.memorize_many(items)]


def _ranks(m, ids, k=5) -> list[int]:
    """The rank (0 = first) of each question's answer among its k hits, k when it is not among them;
    every recall touches its hits (the shipped reinforce_on_recall = true)."""
    out = []
    for question, answer in QUESTIONS:
        m._recall_cache.clear()
        hits = [h["id"] for h in m.recall(question, k=k)["results"]]
        out.append(hits.index(ids[answer]) if ids[answer] in hits else k)
        m.wait_background()
    return out


# asking again ####################################################################################

@pytest.mark.slow
def test_asking_the_same_questions_again_ranks_every_answer_no_lower(tmp_path, open_mem, local_mem):
    """Before the fix every recall's hits gained recency (age from the touch) and frequency (access
    count), so memories that were merely returned, relevant or not, outranked the answers: already
    within the first round (two answers fell out of the top 5 against an untouched file) and again
    in the second (the food answer fell from first to second)."""
    path = tmp_path / "again.db"
    m = open_mem(path, local_mem.embedder)
    assert m.cfg.recall.reinforce_on_recall is True
    ids = _story(m)
    untouched = _ranks(open_mem(path, local_mem.embedder, aokun.Config(
        None, overrides={("recall", "reinforce_on_recall"): False})), ids)
    assert m.value("select count(*) from documents where access_count > 0") == 0
    assert sum(r < 5 for r in untouched) >= 9, untouched  # the story answers its questions
    first = _ranks(m, ids)
    assert all(f <= u for u, f in zip(untouched, first, strict=True)), (untouched, first)
    for _ in range(2):
        again = _ranks(m, ids)
        assert all(b <= a for a, b in zip(first, again, strict=True)), (first, again)
    # the touches were recorded
    assert m.value("select count(*) from documents where access_count >= 3") >= 10
    assert m.value("select sum(useful_count) from documents") == 0


def test_touches_still_slow_the_daily_decay(mem):
    """Retrieval bookkeeping stays: an accessed memory loses importance slower (sql decay_day)."""
    a = mem.memorize("The blue kite flew over the harbour", {"importance": 0.5})["id"]
    b = mem.memorize("A red bicycle leaned on the fence", {"importance": 0.5})["id"]
    mem.recall("blue kite harbour", k=1, channels="bm25")
    mem.wait_background()
    assert mem.value("select access_count from documents where id = ?", (a,)) == 1
    mem.decay(days=1)
    imp = {i: mem.value("select importance from documents where id = ?", (i,)) for i in (a, b)}
    assert imp[b] < imp[a] < 0.5


# memory_feedback ################################################################################

def _twins(m) -> tuple[int, int]:
    """Two memories BM25 scores equally for 'jasmine tea garden' (as many words, same age and
    importance)."""
    ts = aokun.iso(aokun.now() - dt.timedelta(days=3))
    a = m.memorize("Nadia grows jasmine tea in her garden", {"timestamp": ts})["id"]
    b = m.memorize("Omar grows jasmine tea in his garden", {"timestamp": ts})["id"]
    return a, b


def test_feedback_raises_a_used_memory_above_an_equal_competitor(mem):
    a, b = _twins(mem)
    before = mem.recall("jasmine tea garden", k=2, explain=True, channels="bm25")["results"]
    assert [h["id"] for h in before] == [a, b]  # a tie goes to the lower id
    assert before[0]["score"] == pytest.approx(before[1]["score"])
    out = mem.memory_feedback([b])
    assert out["useful"] is True
    [r] = out["results"]
    assert (r["id"], r["old_importance"], r["importance"], r["useful_count"]) == (b, 0.5, 0.55, 1)
    # the sentence, as an atom
    assert r["last_useful_at"] <= aokun.now_iso() and r["atoms_reinforced"] == 1
    # cache emptied
    after = mem.recall("jasmine tea garden", k=2, explain=True, channels="bm25")["results"]
    assert [h["id"] for h in after] == [b, a]
    e = after[0]["explain"]
    assert e["useful_count"] == 1 and e["frequency"] == pytest.approx(math.log(2) / math.log(11))
    assert e["importance"] == pytest.approx(0.55) and after[1]["explain"]["frequency"] == 0.0
    row = mem.get(b)
    assert (row["useful_count"], row["importance"]) == (1, pytest.approx(0.55))


def test_feedback_importance_is_bounded_and_not_useful_lowers_it(mem):
    a, b = _twins(mem)
    with mem.tx() as c:
        c.execute("update documents set importance = 0.98 where id = ?", (a,))
        c.execute("update documents set importance = 0.03 where id = ?", (b,))
    assert mem.memory_feedback([a])["results"][0]["importance"] == 1.0
    assert mem.memory_feedback([a])["results"][0]["useful_count"] == 2
    down = mem.memory_feedback([a, b], useful=False)
    assert down["useful"] is False
    assert [(r["id"], r["old_importance"], r["importance"]) for r in down["results"]] \
        == [(a, 1.0, pytest.approx(0.95)), (b, 0.03, 0.0)]
    assert [r["useful_count"] for r in down["results"]] == [2, 0]  # not useful: nothing counted
    assert mem.get(b)["last_useful_at"] is None and mem.get(b)["importance"] == 0.0
    cfg = aokun.Config(None, overrides={("recall", "feedback_importance_step"): 0.2})
    step = cfg.recall.feedback_importance_step
    assert step == 0.2


def test_feedback_reinforces_the_memory_atoms_like_a_repeat_once_a_day(mem, monkeypatch):
    ts = aokun.iso(aokun.now() - dt.timedelta(days=10))
    d = mem.memorize("Priya keeps her bonsai collection on the balcony",
                     {"timestamp": ts, "key_facts": ["Priya collects bonsai trees"]})
    def atom():
        [a] = mem.rows("select * from memory_atoms where document_id = ?", (d["id"],))
        return a
    before = atom()
    assert before["reinforcement_count"] == 0 and before["last_reinforced_at"] == ts
    out = mem.memory_feedback([d["id"]])["results"][0]
    assert out["atoms_reinforced"] == 1
    after = atom()
    ttl = aokun.effective_ttl_days(before["base_ttl_days"], before["importance"], 1)  # × 1.5
    assert after["reinforcement_count"] == 1 \
        and after["last_reinforced_at"] == out["last_useful_at"]
    assert after["expires_at"] == \
        aokun.iso(aokun.parse_time(out["last_useful_at"]) + dt.timedelta(days=ttl))
    assert after["confidence"] == before["confidence"] and after["state"] == "active"
    # again the same day: counted and importance raised, the shelf life not stretched again
    again = mem.memory_feedback([d["id"]])["results"][0]
    assert (again["useful_count"], again["atoms_reinforced"]) == (2, 0)
    assert atom() == after
    monkeypatch.setenv("AOKUN_NOW", aokun.iso(aokun.now() + dt.timedelta(days=2)))
    assert mem.memory_feedback([d["id"]])["results"][0]["atoms_reinforced"] == 1
    assert atom()["reinforcement_count"] == 2
    assert mem.memory_feedback([d["id"]], useful=False)["results"][0]["atoms_reinforced"] == 0
    assert atom()["reinforcement_count"] == 2


def test_feedback_checks_the_persona_and_changes_nothing_when_an_id_is_missing(mem):
    mine = mem.memorize("Lena's favourite mountain is the Matterhorn", {"persona_id": "work"})["id"]
    other = mem.memorize("Lena's favourite lake is Como", {"persona_id": "home"})["id"]
    with pytest.raises(aokun.NotFound) as missing:
        mem.memory_feedback([9999], persona_id="work")
    with pytest.raises(aokun.NotFound) as foreign:
        mem.memory_feedback([other], persona_id="work")
    assert str(foreign.value) == str(missing.value).replace("9999", str(other))
    with pytest.raises(aokun.NotFound):
        mem.memory_feedback([other])  # the default persona is '' , not 'home'
    with pytest.raises(aokun.NotFound):
        mem.memory_feedback([mine, other], persona_id="work")  # all or nothing
    assert mem.get(mine, "work")["useful_count"] == 0 and mem.get(mine, "work")["importance"] == 0.5
    # once
    assert mem.memory_feedback([mine, mine], persona_id="work")["results"][0]["useful_count"] == 1
    assert mem.memory_feedback([other], persona_id="home")["results"][0]["id"] == other


@pytest.mark.parametrize("ids", [[], None, 3, "3", [0], [-1], [1.5], [True], ["1"], [1, None]])
def test_feedback_bad_ids_are_an_input_error_naming_the_field(mem, ids):
    mem.memorize("Something to point at")
    with pytest.raises(aokun.InputError) as e:
        mem.memory_feedback(ids)
    assert e.value.field == "ids"


def test_feedback_useful_must_be_a_boolean_and_ids_are_capped(mem):
    i = mem.memorize("Something to point at")["id"]
    with pytest.raises(aokun.InputError) as e:
        mem.memory_feedback([i], useful="yes")
    assert e.value.field == "useful"
    with pytest.raises(aokun.InputError) as e:
        mem.memory_feedback(list(range(1, mem.cfg.recall.max_k + 2)))
    assert e.value.field == "ids" and f"at most {mem.cfg.recall.max_k}" in str(e.value)


# schema 7 ########################################################################################

@pytest.mark.slow
def test_schema6_file_gains_the_feedback_columns_and_keeps_every_row(tmp_path, monkeypatch,
                                                                     segmenter):
    """A file made by migrations 1-6 (this code up to 0006) opens with 0007 applied: every row
    kept, the new columns at their defaults, the old file saved, and feedback works on it."""
    m = open_at_schema(tmp_path, monkeypatch, segmenter, 6, "six.db")
    path = m.path
    assert "useful_count" not in {r["name"] for r in m.rows("pragma table_info(documents)")}
    # schema 9, which this code writes
    later = [("documents", "embedding_error"), ("graph_entries", "embedding_error"),
             # 15, 16
             ("documents", "superseded_by"), ("documents", "event_at"), ("documents", "event_end"),
             ("documents", "project")]  # 20
    with m.tx() as c:
        for table, column in later:
            c.execute(f"alter table {table} add column {column} text")
        c.execute("create index documents_superseded_by on documents(superseded_by) where "
                  "superseded_by is not null")
        # schema 11
        c.execute("create table memory_write_payloads(op_id integer primary key, payload text)")
        default_graph_columns_of_schema12(m)
    ids = [r["id"] for r in m.memorize_many([(text, None) for text, _ in CORPUS[:8]])]
    with m.tx() as c:
        c.execute("update documents set access_count = 3, last_access_at = ? where id = ?",
                  (aokun.now_iso(), ids[0]))
        for table, column in later:
            if column == "superseded_by":
                c.execute("drop index documents_superseded_by")
            c.execute(f"alter table {table} drop column {column}")
        c.execute("drop table memory_write_payloads")
    tables = ("documents", "memory_atoms", "atom_sources", "graph_nodes", "graph_entries",
              "doc_vectors", "memory_write_ops")
    before = {t: m.rows(f"select * from {t} order by 1, 2") for t in tables}
    m.close()

    monkeypatch.setattr(aokun, "SCHEMA_DIR", aokun.HERE / "schema")
    m = aokun.Memory(path, aokun.Config(None, overrides={("backup", "dir"): str(tmp_path / "bk")}),
                     embedder=FakeEmbedder(16))
    try:
        assert m.value("pragma user_version") == aokun.schema_version_known() >= 7
        assert list((tmp_path / "bk").glob("six-schema6-*.db"))
        after = {t: m.rows(f"select * from {t} order by 1, 2") for t in tables}
        for t in tables:
            if t != "documents":
                dropped = {"uid", "created_at", "updated_at"} if t.startswith("graph_") else set()
                assert [{k: v for k, v in r.items() if (t, k) not in later} for r in after[t]] == \
                    [{k: v for k, v in r.items() if k not in dropped} for r in before[t]], t
        assert len(after["documents"]) == len(before["documents"]) == 8
        for old, new in zip(before["documents"], after["documents"], strict=True):
            assert new == old | {"useful_count": 0, "last_useful_at": None, "embedding_error": None,
                                 "event_at": None, "event_end": None, "superseded_by": None,
                                 "project": ""}
        assert m.doctor() == []
        assert m.recall(CORPUS[0][0], k=1, channels="bm25")["results"][0]["id"] == ids[0]
        assert m.memory_feedback([ids[1]])["results"][0]["useful_count"] == 1
    finally:
        m.close()


def test_feedback_persona_is_matched_like_recall_folds_it(mem):
    doc = mem.memorize("Dave plays tennis on Sundays.", {"persona_id": "Dave"})["id"]
    assert mem.recall("tennis", persona_id="Ｄave")["results"][0]["id"] == doc
    assert mem.memory_feedback([doc], persona_id="Ｄave")["results"][0]["useful_count"] == 1


@pytest.mark.parametrize("big", [2 ** 63, 2 ** 64, 2 ** 70])
def test_ids_beyond_sqlite_rowids_are_not_found_not_a_crash(mem, big):
    mem.memorize("something to find")
    for call in (lambda: mem.get(big), lambda: mem.delete(big), lambda: mem.memory_feedback([big]),
                 lambda: mem.kg_invalidate(big)):
        with pytest.raises(aokun.NotFound):
            call()
    assert mem.doctor() == []
