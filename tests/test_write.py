"""The write pipeline: every stage's output, dedup, normalisation, big inputs, atoms, entities,
validation."""

import datetime as dt
import json
import unicodedata

import numpy as np
import pytest

import aokun
from fakes import FakeEmbedder, count, doc_vector, fts_ids, table_counts

ALICE = "Alice loves iced americano. She will visit Tokyo next week."


def test_memorize_fills_every_layer(mem, fake_embedder):
    r = mem.memorize(ALICE, {"participants": ["Alice"], "topics": ["coffee"], "importance": 0.7,
                             "session_id": "s1", "timestamp": "2026-03-01T10:00:00+08:00"})
    doc_id = r["id"]
    assert isinstance(doc_id, int)
    assert (r["status"], r["deduplicated"], r["embedding"], r["warnings"]) == \
        ("done", False, "done", [])
    assert r["atoms"] == 2

    # layer 1: the document, its FTS row and its vector
    d = mem.rows("select * from documents where id = ?", (doc_id,))[0]
    assert d["content"] == ALICE
    assert json.loads(d["participants"]) == ["Alice"] and json.loads(d["topics"]) == ["coffee"]
    assert (d["importance"], d["session_id"], d["persona_id"]) == (0.7, "s1", "")
    assert d["created_at"] == "2026-03-01T02:00:00Z"  # converted to UTC
    assert d["embedding_state"] == "done" and d["uid"] == r["uid"]
    seg = mem.value("select segmented from documents_fts where rowid = ?", (doc_id,))
    assert "americano" in seg.split() and "tokyo" in seg.split() and "coffee" in seg.split()
    assert fts_ids(mem, "documents_fts", "americano") == [doc_id]
    # the vector text is the memory followed by its labels (topics, tags, sentiment)
    np.testing.assert_allclose(doc_vector(mem, doc_id), fake_embedder.vector(ALICE + "\ncoffee"),
                               atol=0.01)
    assert mem.rows("select persona_id, session_id, archived from doc_vec where doc_id = ?",
                    (doc_id,)) == \
        [{"persona_id": "", "session_id": "s1", "archived": 0}]

    # layer 2: one atom per sentence, each with its source and FTS row
    atoms = mem.rows("select * from memory_atoms order by id")
    assert [a["content"] for a in atoms] == ["Alice loves iced americano.",
                                             "She will visit Tokyo next week."]
    assert [a["atom_type"] for a in atoms] == ["preference", "planned"]
    assert all(a["document_id"] == doc_id and a["state"] == "active" and a["subject"] == "alice"
               for a in atoms)
    assert mem.rows("select atom_id, document_id from atom_sources order by atom_id") == \
        [{"atom_id": a["id"], "document_id": doc_id} for a in atoms]
    assert [r["rowid"] for r in mem.rows("select rowid from memory_atoms_fts order by rowid")] == \
        [a["id"] for a in atoms]
    assert fts_ids(mem, "memory_atoms_fts", "americano") == [atoms[0]["id"]]

    # layer 3: nodes, edges, entries (+FTS; vectors for fact entries: the fact sentence embedded)
    nodes = {(n["node_type"], n["canonical"]) for n in mem.rows("select * from graph_nodes")}
    assert nodes == {("person", "alice"), ("topic", "coffee"),
                     ("fact", "alice loves iced americano."),
                     ("fact", "she will visit tokyo next week.")}
    edges = mem.rows("select relation, count(*) n from graph_edges where document_id = ?"
                     " group by relation order by relation", (doc_id,))
    # 2 subjects x 2 facts describe, 1 fact chain, 1 subject pair
    assert edges == [{"relation": "co_occurs_with", "n": 1}, {"relation": "describes", "n": 4},
                     {"relation": "mentioned_in", "n": 1}]
    entries = mem.rows("select * from graph_entries where document_id = ? order by id", (doc_id,))
    # one entry per node and one for the fact chain; describes and co_occurs_with are edges only
    assert len(entries) == 4 + 1 == r["graph_entries"]
    node_entries = [e for e in entries if e["node_id"] is not None]
    fact_entries = [e for e in node_entries if e["text"].startswith("Fact: ")]
    assert len(node_entries) == 4 and len(fact_entries) == 2
    assert all(e["embedding_state"] == "done" for e in fact_entries)
    # person/topic entries and edge entries are keyword entry points only
    assert all(e["embedding_state"] == "skip" for e in entries if e not in fact_entries)
    assert [e["text"] for e in node_entries if e not in fact_entries] == \
        ["Person: Alice. Summary: " + ALICE, "Topic: coffee. Summary: " + ALICE]
    # a fact entry names the memory's subjects (what its describes edges say)
    assert [e["text"] for e in fact_entries] == [
        "Fact: Alice loves iced americano.\nAbout: Alice, coffee",
        "Fact: She will visit Tokyo next week.\nAbout: Alice, coffee"]
    assert [e["text"] for e in entries if e["edge_id"] is not None] == \
        ["Alice loves iced americano. mentioned in She will visit Tokyo next week."]
    assert [r["rowid"] for r in mem.rows("select rowid from graph_entries_fts order by rowid")] == \
        [e["id"] for e in entries]
    assert [r["entry_id"]
            for r in mem.rows("select entry_id from graph_vec order by entry_id")] == \
        [e["id"] for e in fact_entries]
    for e, fact in zip(fact_entries,
                       ["Alice loves iced americano.", "She will visit Tokyo next week."],
                       strict=True):
        blob = mem.value("select embedding from graph_vectors where entry_id = ?", (e["id"],))
        np.testing.assert_allclose(aokun.blob_vector(blob), fake_embedder.vector(fact), atol=0.01)

    # the journal
    assert mem.rows("select op, status, document_id, retries, error from memory_write_ops") == \
        [{"op": "insert", "status": "done", "document_id": doc_id, "retries": 0, "error": ""}]
    assert mem.meta_get("embedding_dim") == "16" and mem.meta_get("embedding_model") == "fake-16"
    assert mem.doctor() == []


def test_dedup_returns_same_id_without_new_work(mem, fake_embedder):
    first = mem.memorize("Carol's flight lands at 9pm")
    calls = fake_embedder.calls
    before = table_counts(mem)
    again = mem.memorize("  Carol's flight lands at 9pm \n")  # same after normalisation
    assert again["id"] == first["id"] and again["uid"] == first["uid"]
    assert again["deduplicated"] is True and first["deduplicated"] is False
    assert fake_embedder.calls == calls  # nothing re-embedded
    assert table_counts(mem) == before  # not even a journal row
    assert count(mem, "documents") == 1


def test_dedup_is_per_persona(mem):
    a = mem.memorize("the wifi password is hunter2", {"persona_id": "work"})
    b = mem.memorize("the wifi password is hunter2", {"persona_id": "home"})
    c = mem.memorize("the wifi password is hunter2")
    assert len({a["id"], b["id"], c["id"]}) == 3
    assert mem.memorize("the wifi password is hunter2", {"persona_id": "work"})["id"] == a["id"]
    assert mem.memorize("the wifi password is hunter2", {"persona_id": "home"})["id"] == b["id"]
    assert count(mem, "documents") == 3
    # atoms never reinforce across personas
    assert [r["persona_id"]
            for r in mem.rows("select persona_id from memory_atoms order by id")] == \
        ["work", "home", ""]
    assert mem.value("select max(reinforcement_count) from memory_atoms") == 0


def test_memorize_many_dedups_within_the_batch(mem):
    res = mem.memorize_many([("batch one", None), ("batch two", None), ("batch one", None)])
    assert res[0]["id"] == res[2]["id"] != res[1]["id"]
    assert [r["deduplicated"] for r in res] == [False, False, True]
    assert count(mem, "documents") == 2 and mem.doctor() == []


# repeats: the text of a stored memory again -------------------------------------------------------

def keyword_hits(mem, query: str, **kw) -> list[int]:
    return [h["id"] for h in mem.recall(query, k=10, **kw)["results"] if "bm25" in h["channels"]]


def test_plain_repeat_changes_nothing_and_embeds_nothing(mem, fake_embedder):
    first = mem.memorize(ALICE, {"topics": ["coffee", "travel"], "tags": ["drink"],
                                 "importance": 0.7,
                                 "summary": "Alice's coffee", "session_id": "s1"})
    calls, before = fake_embedder.calls, table_counts(mem)
    # the same metadata (in another order), a lower importance, another summary/session/time: all
    # kept
    again = mem.memorize(ALICE, {"topics": ["travel", "coffee"], "tags": ["drink"],
                                 "importance": 0.2,
                                 "summary": "something else", "session_id": "s2",
                                 "timestamp": "2020-01-01T00:00:00Z"})
    assert (again["id"], again["deduplicated"], again["warnings"], again["changed"]) == \
        (first["id"], True, [], {})
    assert fake_embedder.calls == calls and table_counts(mem) == before
    d = mem._doc(first["id"])
    assert (d["summary"], d["session_id"], d["importance"]) == ("Alice's coffee", "s1", 0.7)
    assert first["changed"] == {}


def test_repeat_of_an_archived_memory_restores_it(mem):
    kept = mem.memorize(ALICE, {"importance": 0.8})["id"]
    mem.memorize("Bob plays the cello on Sundays.")
    mem.set_flag(kept, "archived", True)
    assert keyword_hits(mem, "americano") == []
    r = mem.memorize(ALICE)
    assert (r["id"], r["deduplicated"], r["changed"]) == (kept, True, {"archived": [True, False]})
    assert r["warnings"] == [f"memory {kept} was archived; memorizing it again restored it to "
                             f"recall (archive_memory({kept}) archives it again)"]
    assert keyword_hits(mem, "americano") == [kept]
    # the higher stays
    assert mem._doc(kept)["archived"] is False and mem._doc(kept)["importance"] == 0.8
    # the flag path: its vector and graph entries are live again for KNN and the graph channel
    assert mem.value("select archived from doc_vec where doc_id = ?", (kept,)) == 0
    assert mem.value("select max(archived) from graph_entries where document_id = ?", (kept,)) == 0
    assert count(mem, "documents") == 2 and mem.doctor() == []
    assert mem.memorize(ALICE)["warnings"] == []  # restored once: a further repeat is a plain one


def test_repeat_of_an_archived_memory_with_low_importance_raises_it(mem):
    low = mem.memorize(ALICE, {"importance": 0.05})["id"]
    mem.set_flag(low, "archived", True)
    r = mem.memorize(ALICE)  # no importance given: the default (0.5) counts for a restore
    assert r["changed"] == {"archived": [True, False], "importance": [0.05, 0.5]}
    assert mem._doc(low)["importance"] == 0.5 and mem.doctor() == []


def test_repeat_with_new_metadata_is_merged(mem, fake_embedder):
    first = mem.memorize(ALICE, {"topics": ["coffee"], "tags": ["drink"], "participants": ["Alice"],
                                 "importance": 0.4, "session_id": "s1"})
    assert keyword_hits(mem, "barista") == []
    calls = fake_embedder.calls
    r = mem.memorize(ALICE, {"topics": ["barista", "coffee"], "tags": ["morning"],
                             "participants": ["Bob"],
                             "importance": 0.9, "summary": "Alice's coffee habit", "source": "chat",
                             "session_id": "s2", "key_facts": ["Alice loves iced americano."]})
    assert (r["id"], r["deduplicated"]) == (first["id"], True)
    assert r["changed"] == {"topics": [["coffee"], ["coffee", "barista"]],
                            "tags": [["drink"], ["drink", "morning"]],
                            "participants": [["Alice"], ["Alice", "Bob"]],
                            "key_facts": [[], ["Alice loves iced americano."]],
                            "summary": ["", "Alice's coffee habit"], "source": ["", "chat"],
                            "importance": [0.4, 0.9]}
    assert r["warnings"] == [f"memory {first['id']} already held this text; the repeat's metadata "
                             "was merged into it (topics, tags, participants, key_facts, summary, "
                             "source, importance changed)"]
    d = mem._doc(first["id"])
    assert d["topics"] == ["coffee", "barista"] and d["session_id"] == "s1"
    assert d["importance"] == 0.9
    assert fake_embedder.calls > calls  # re-derived through edit(): the vector sees the new labels
    assert keyword_hits(mem, "barista") == [first["id"]]
    assert [a["content"] for a in mem.rows("select content from memory_atoms")] == \
        ["Alice loves iced americano."]
    assert count(mem, "documents") == 1 and mem.doctor() == []


def test_repeat_fills_an_empty_session_and_pins(mem):
    doc = mem.memorize(ALICE)["id"]
    r = mem.memorize(ALICE, {"session_id": "s9", "pinned": True, "sentiment": "positive"})
    assert r["changed"] == {"sentiment": ["", "positive"], "session_id": ["", "s9"],
                            "pinned": [False, True]}
    d = mem._doc(doc)
    assert (d["session_id"], d["pinned"], d["sentiment"]) == ("s9", True, "positive")
    assert mem.memorize(ALICE, {"pinned": False})["changed"] == {}  # a repeat never unpins


def test_copies_in_one_batch_store_one_memory_with_their_metadata_united(mem):
    res = mem.memorize_many([("batch one", {"topics": ["a"]}), ("batch one", {"topics": ["b"]}),
                             ("batch one", {"topics": ["a"]})])
    assert res[0]["id"] == res[1]["id"] == res[2]["id"]
    assert [r["deduplicated"] for r in res] == [False, True, True]
    assert res[1]["changed"] == {"topics": [["a"], ["a", "b"]]} and res[2]["changed"] == {}
    assert mem._doc(res[0]["id"])["topics"] == ["a", "b"]
    assert count(mem, "documents") == 1 and mem.doctor() == []


def test_repeat_in_another_persona_is_another_memory(mem):
    work = mem.memorize(ALICE, {"persona_id": "work", "topics": ["coffee"]})["id"]
    mem.set_flag(work, "archived", True, "work")
    home = mem.memorize(ALICE, {"persona_id": "home", "topics": ["home"]})
    assert home["id"] != work and home["deduplicated"] is False and home["changed"] == {}
    w = mem._doc(work)
    assert w["archived"] is True and w["topics"] == ["coffee"]
    assert keyword_hits(mem, "americano", persona_id="work") == []


KEEP = "E = mc² ½ ① ™ ㎏，"  #: NFKC changes each of its non-ASCII characters (issue 11, item 7)
FULL_WIDTH = "服务跑在端口８０９０上，ＡＰＩ　ｋｅｙ 在 vault 里"


def test_stored_text_is_byte_identical(mem):
    assert all(unicodedata.normalize("NFKC", c) != c for c in KEEP if not c.isascii())
    meta = {"summary": KEEP, "topics": [KEEP], "participants": [KEEP], "key_facts": [KEEP],
            "tags": [KEEP]}
    r = mem.memorize(KEEP, meta)
    d = mem.get(r["id"])
    assert d["content"].encode("utf-8") == KEEP.encode("utf-8")
    assert {k: d[k] for k in meta} == meta
    assert [a["content"].encode("utf-8") for a in d["atoms"]] == [KEEP.encode("utf-8")]
    hit = mem.recall("mc2 kg")["results"][0]  # found through the folded index
    assert hit["id"] == r["id"] and hit["text"].encode("utf-8") == KEEP.encode("utf-8")
    assert (hit["summary"], hit["topics"], hit["participants"]) == (KEEP, [KEEP], [KEEP])
    assert mem.search_atoms("MC2")["results"][0]["content"] == KEEP
    assert mem.list_memories()[0]["content"] == KEEP
    # re-deriving the FTS rows and the atoms and graph (a journal replay of the memory) keeps them
    mem.rebuild(fts=True, graph=True)
    assert mem.get(r["id"])["content"].encode("utf-8") == KEEP.encode("utf-8")
    assert [a["content"] for a in mem.get(r["id"])["atoms"]] == [KEEP]
    assert mem.recall("mc2 kg")["results"][0]["id"] == r["id"]


def test_full_width_is_stored_as_given_and_indexed_folded(mem, fake_embedder):
    r = mem.memorize(FULL_WIDTH)
    assert mem.value("select content from documents where id = ?", (r["id"],)) == FULL_WIDTH
    # the vector is of the folded text: what earlier versions embedded (they stored it folded)
    folded = unicodedata.normalize("NFKC", FULL_WIDTH)
    np.testing.assert_allclose(doc_vector(mem, r["id"]), fake_embedder.vector(folded), atol=0.01)
    assert [h["id"] for h in mem.recall("端口８０９０", channels="vector")["results"]] == [r["id"]]
    hits = mem.rows("select rowid from documents_fts where documents_fts match ?", ('"8090"',))
    assert [h["rowid"] for h in hits] == [r["id"]]  # the FTS text is folded
    assert fts_ids(mem, "documents_fts", "８０９０") == fts_ids(mem, "documents_fts", "api key") \
        == [r["id"]]
    # the full-width and half-width spellings are the same memory (the hash is of the folded text)
    again = mem.memorize("服务跑在端口8090上,API key 在 vault 里")
    assert again["deduplicated"] is True and again["id"] == r["id"]
    assert mem.get(r["id"])["content"] == FULL_WIDTH  # the first spelling stays
    # what an earlier version stored of it: the same hash
    assert mem.memorize(folded)["id"] == r["id"]
    with pytest.raises(aokun.InputError, match="already has exactly this content"):
        mem.edit(mem.memorize("another memory")["id"], "服务跑在端口8090上，API key 在 vault 里")


def test_full_and_half_width_match_both_ways(mem):
    full = mem.memorize("端口８０９０给ＡＰＩ网关用",
                        {"key_facts": ["ＡＰＩ网关用端口８０９０"]})["id"]
    half = mem.memorize("port 7070 serves the admin UI",
                        {"key_facts": ["the admin UI is on port 7070"]})["id"]
    for query, doc in (("8090", full), ("api", full), ("７０７０", half), ("ＵＩ", half)):
        assert [h["id"] for h in mem.recall(query)["results"]][:1] == [doc], query
        atoms = mem.search_atoms(query)["results"]
        assert atoms and atoms[0]["document_id"] == doc, query
    assert mem.search_atoms("8090")["results"][0]["content"] == "ＡＰＩ网关用端口８０９０"


def test_superscripts_and_compatibility_forms_match_folded(mem):
    r = mem.memorize("Einstein wrote E = mc² in 1905; the parcel weighs 3 ㎏")
    assert mem.get(r["id"])["content"] == "Einstein wrote E = mc² in 1905; the parcel weighs 3 ㎏"
    assert [h["id"] for h in mem.recall("mc2")["results"]] == [r["id"]]
    assert [h["id"] for h in mem.recall("kg")["results"]] == [r["id"]]
    assert [h["id"] for h in mem.recall("mc²")["results"]] == [r["id"]]


def test_chinese_punctuation_kept_and_found_without_it(mem):
    text = "今天和老王去西湖划船，风景很美。下次还要带上小李一起去！"
    r = mem.memorize(text, {"participants": ["老王"]})
    d = mem.get(r["id"])
    assert d["content"] == text and all(c in d["content"] for c in "，。！")
    # the sentences (atoms, fact nodes) keep the punctuation too
    assert [a["content"] for a in d["atoms"]] == ["今天和老王去西湖划船，风景很美。",
                                                  "下次还要带上小李一起去！"]
    for query in ("西湖划船 风景很美", "小李一起去", "和老王去西湖划船,风景很美"):
        assert [h["id"] for h in mem.recall(query)["results"]][:1] == [r["id"]], query
        assert mem.search_atoms(query)["results"], query


def test_sentences_end_where_the_folded_text_ends_them(mem):
    text = "The first thing to remember．Then a second one… and a third one ﹒ last"
    assert aokun.split_sentences(text, 8) == ["The first thing to remember．Then a second one…",
                                              "and a third one ﹒", "last"]
    assert aokun.split_sentences("甲乙丙丁｡戊己庚辛？壬癸子丑", 8) == \
        ["甲乙丙丁｡", "戊己庚辛？", "壬癸子丑"]


def test_metadata_keeps_its_characters(mem):
    meta = {"summary": "Ｅ = mc²，概要", "topics": ["物理，相对论", "ＡＩ"],
            "participants": ["Ｅｉｎｓｔｅｉｎ"],
            "key_facts": ["E = mc² ½"], "tags": ["①"], "sentiment": "好！"}
    r = mem.memorize("Einstein and the famous formula", meta)
    d = mem.get(r["id"])
    assert {k: d[k] for k in meta} == meta
    assert [a["content"] for a in d["atoms"]] == ["E = mc² ½"]
    # the person node shows the given name; its key is folded, so the half-width spelling is the
    # same node
    assert mem.rows("select value, canonical from graph_nodes where node_type = 'person'") == \
        [{"value": "Ｅｉｎｓｔｅｉｎ", "canonical": "einstein"}]
    mem.memorize("Einstein again", {"participants": ["einstein"]})
    assert mem.value("select count(*) from graph_nodes where node_type = 'person'") == 1
    assert fts_ids(mem, "documents_fts", "AI") == [r["id"]]  # labels are indexed folded
    # items equal once folded are one item, the first spelling
    doc = mem.memorize("x y z w", {"topics": ["ＡＩ", "AI", "ai"]})["id"]
    assert mem.get(doc)["topics"] == ["ＡＩ", "ai"]


def test_atom_slots_match_the_folded_fact(mem):
    mem.memorize("我现在住在ＮＹＣ。", {"timestamp": "2026-01-01T00:00:00Z"})
    mem.memorize("我现在住在上海！", {"timestamp": "2026-02-01T00:00:00Z"})
    atoms = mem.rows("select content, slot_value, state from memory_atoms"
                     " where slot = 'lives_in' order by id")
    assert atoms == [{"content": "我现在住在ＮＹＣ。", "slot_value": "new york",
                      "state": "superseded"},
                     {"content": "我现在住在上海！", "slot_value": "shanghai", "state": "active"}]


def test_identifiers_are_folded(mem):
    a = mem.memorize("persona note one",
                     {"persona_id": "ａｌｉｃｅ", "session_id": "ｓ１", "source": "ＣＨＡＴ"})
    d = mem.get(a["id"], "ａｌｉｃｅ")  # the persona is matched folded, as recall's is
    assert (d["persona_id"], d["session_id"], d["source"]) == ("alice", "s1", "chat")
    assert [h["id"] for h in mem.recall("persona note", persona_id="alice")["results"]] == [a["id"]]
    hits = mem.recall("persona note", persona_id="ａｌｉｃｅ", session_id="s1")["results"]
    assert [h["id"] for h in hits] == [a["id"]]


def test_nul_bytes_become_spaces(mem):
    r = mem.memorize("null\x00byte in the\x00 middle",
                     {"summary": "sum\x00mary", "topics": ["to\x00pic"]})
    d = mem.get(r["id"])
    assert d["content"] == "null byte in the  middle"
    assert d["summary"] == "sum mary" and d["topics"] == ["to pic"]
    assert "\x00" not in mem.value("select segmented from documents_fts where rowid = ?",
                                   (r["id"],))
    assert fts_ids(mem, "documents_fts", "byte") == [r["id"]]
    assert mem.memorize("null byte in the  middle")["deduplicated"] is True


def test_lone_surrogates_are_stored_as_replacement_characters(mem, fake_embedder):
    r = mem.memorize("bad \ud800 surrogate",
                     {"summary": "bad \udfff", "topics": ["ok", "bad \ud800"]})
    d = mem.get(r["id"])
    assert d["content"] == "bad \ufffd surrogate" and d["summary"] == "bad \ufffd"
    assert d["topics"] == ["ok", "bad \ufffd"]
    assert [h["id"] for h in mem.recall("bad \udfff surrogate")["results"]] == [r["id"]]


def _big_chinese() -> str:
    base = "我们今天讨论了项目的进度和下一步的安排。大家都觉得需要更多的测试。"
    tail = "最后提到了鹦鹉螺号潜艇。"
    text = (base * 2000)[: 40_000 - len(tail)] + tail
    assert len(text) == 40_000 and unicodedata.normalize("NFKC", text) == text
    return text


def _big_english() -> str:
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
    rnd = np.random.default_rng(7)
    body = " ".join(words[i] for i in rnd.integers(0, len(words), 40_000)) + ". "
    tail = "The final word is zanzibarquokka."
    text = (body * 2)[: 200_000 - len(tail)] + tail
    assert len(text.encode("utf-8")) == 200_000 and unicodedata.normalize("NFKC", text) == text
    return text


@pytest.mark.slow
@pytest.mark.parametrize("make, end_word",
                         [(_big_chinese, "潜艇"), (_big_english, "zanzibarquokka")],
                         ids=["40k-chinese", "200KB-english"])
def test_big_text_stored_fully(mem, fake_embedder, make, end_word):
    text = make()
    other = mem.memorize("a small unrelated memory")
    r = mem.memorize(text)
    assert r["status"] == "done" and r["embedding_truncated"] is True and r["embedding"] == "done"
    row = mem.rows("select content, length(content) n, embedding_truncated from documents"
                   " where id = ?", (r["id"],))[0]
    assert row["n"] == len(text) and row["content"] == text
    assert row["embedding_truncated"] == 1
    assert fts_ids(mem, "documents_fts", end_word) == [r["id"]]  # indexed to the very end
    assert other["id"] not in fts_ids(mem, "documents_fts", end_word)
    # the vector sees only what the embedder takes (the first max_chars)
    np.testing.assert_allclose(doc_vector(mem, r["id"]), fake_embedder.vector(text[:8000]),
                               atol=0.01)
    assert mem.doctor() == []


@pytest.mark.slow
def test_content_over_the_limit_is_refused(mem):
    text = "x" * (mem.cfg.write.max_content_chars + 1)
    with pytest.raises(aokun.InputError) as e:
        mem.memorize(text)
    assert e.value.field == "content" and "max_content_chars" in str(e.value)
    assert count(mem, "documents") == 0


@pytest.mark.slow
def test_mixed_chinese_english_token_found_by_each_part(mem):
    target = mem.memorize("重跑gen-itgc后 报表数据恢复正常")
    mem.memorize("今天的 gen 报告还没出来")
    mem.memorize("跑步之后去吃饭")
    for q in ("itgc", "gen-itgc", "重跑", "重跑gen-itgc"):
        hits = fts_ids(mem, "documents_fts", q)
        assert target["id"] in hits, q
    assert fts_ids(mem, "documents_fts", "itgc") == [target["id"]]
    assert fts_ids(mem, "documents_fts", "重跑") == [target["id"]]


@pytest.mark.slow
def test_atom_reinforcement_recomputes_ttl(mem):
    fact1 = "Bob lives in the Pudong district of Shanghai near the river"
    fact2 = "Bob lives in the Pudong district of Shanghai near the big river"
    s1, s2 = set(mem.seg.tokens(fact1)), set(mem.seg.tokens(fact2))
    assert 0.6 <= aokun.jaccard(s1, s2) < 1.0, \
        "precondition: the facts are near-identical, not equal"
    a = mem.memorize("first note about Bob", {"key_facts": [fact1], "importance": 0.8,
                                              "timestamp": "2026-01-01T00:00:00Z"})
    atom0 = mem.rows("select * from memory_atoms")[0]
    assert atom0["atom_type"] == "factual" and atom0["base_ttl_days"] == 180
    assert atom0["expires_at"] == aokun.iso(dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
                                            + dt.timedelta(days=180 * (0.5 + 0.8) * 1))
    b = mem.memorize("second note about Bob", {"key_facts": [fact2], "importance": 0.3,
                                               "timestamp": "2026-01-10T00:00:00Z"})
    atoms = mem.rows("select * from memory_atoms")
    assert len(atoms) == 1, "a near-identical fact must reinforce, not add an atom"
    atom = atoms[0]
    assert atom["id"] == atom0["id"] and atom["content"] == fact1 and atom["document_id"] == a["id"]
    assert atom["reinforcement_count"] == 1
    assert atom["last_reinforced_at"] == "2026-01-10T00:00:00Z"
    ttl = 180 * (0.5 + 0.8) * (1 + 0.5 * 1)  # the atom keeps its own importance
    assert ttl == aokun.effective_ttl_days(180, 0.8, 1)
    written = dt.datetime(2026, 1, 10, tzinfo=dt.timezone.utc)
    assert atom["expires_at"] == aokun.iso(written + dt.timedelta(days=ttl))
    assert b["atoms"] == 1
    assert {r["document_id"]
            for r in mem.rows("select document_id from atom_sources where atom_id = ?",
                              (atom["id"],))} == {a["id"], b["id"]}
    # a different fact about Bob is a new atom
    mem.memorize("third note", {"key_facts": ["Bob bought a red bicycle yesterday"]})
    assert count(mem, "memory_atoms") == 2
    assert mem.doctor() == []


def test_reinforcement_is_by_type_and_threshold(mem):
    mem.memorize("n1", {"key_facts": ["Dana works at the Hangzhou office of Acme"]})
    # low overlap
    mem.memorize("n2", {"key_facts": ["Dana visited the Hangzhou zoo with friends on Sunday"]})
    assert count(mem, "memory_atoms") == 2
    assert mem.value("select max(reinforcement_count) from memory_atoms") == 0


@pytest.mark.slow
def test_small_talk_never_reinforces(mem):
    """Short repeated phrases are separate atoms that expire on their own; a real fact said again
    (enough tokens) still reinforces."""
    for i, text in enumerate(["Thanks, Melanie!", "thanks melanie :)", "Thanks Melanie.",
                              "THANKS, MELANIE"]):
        mem.memorize(text, {"session_id": f"s{i}"})
    assert mem.value("select max(reinforcement_count) from memory_atoms") == 0
    assert count(mem, "memory_atoms") == 4
    mem.memorize("Melanie paints sunsets over the lake", {"session_id": "a"})
    mem.memorize("Melanie paints sunsets over the lake again", {"session_id": "b"})
    assert mem.value("select max(reinforcement_count) from memory_atoms") == 1


def test_a_fact_stated_again_after_its_atom_outlived_the_edit_keeps_one_atom(mem, monkeypatch):
    """An atom's uid is its memory's (atom_uid): when another memory's reinforcement kept it past
    an edit that dropped the fact, stating the fact again reinforces it while it is active, and
    takes over its uid once it expired; the write never fails on the uid."""
    fact = "Bob likes green tea every single morning"
    monkeypatch.setenv("AOKUN_NOW", "2026-05-01T08:00:00Z")
    first = mem.memorize("First: " + fact, {"key_facts": [fact]})["id"]
    mem.memorize("Second: " + fact, {"key_facts": [fact]})
    uid = mem.value("select uid from memory_atoms")
    mem.edit(first, "First, changed", {"key_facts": ["Bob owns a red bicycle"]})
    assert mem.value("select reinforcement_count from memory_atoms where uid = ?", (uid,)) == 0
    r = mem.edit(first, "First again: " + fact, {"key_facts": [fact]})
    assert r["status"] == "done" and r["warnings"] == []
    assert mem.rows("select reinforcement_count, state from memory_atoms where uid = ?",
                    (uid,)) == [
        {"reinforcement_count": 1, "state": "active"}]
    mem.edit(first, "First, changed", {"key_facts": ["Bob owns a red bicycle"]})
    monkeypatch.setenv("AOKUN_NOW", "2027-05-01T08:00:00Z")
    mem.lifecycle()
    assert mem.value("select state from memory_atoms where uid = ?", (uid,)) == "expired"
    r = mem.edit(first, "First once more: " + fact, {"key_facts": [fact]})
    assert r["status"] == "done" and r["warnings"] == []
    assert mem.rows("select state, document_id, reinforcement_count from memory_atoms"
                    " where uid = ?",
                    (uid,)) == [{"state": "active", "document_id": first, "reinforcement_count": 0}]
    assert mem.doctor() == []


@pytest.mark.slow
@pytest.mark.parametrize("fact, atom_type", [
    ("I will fly to Tokyo next week", "planned"),
    ("明天下午三点和客户开会", "planned"),
    ("Alice loves iced americano", "preference"),
    ("我特别喜欢喝冰美式", "preference"),
    ("I feel really anxious about the exam results", "emotional"),
    ("最近压力很大，心情很差", "emotional"),
    ("My sister married a dentist", "relational"),
    ("The office printer model is HP 4200", "factual"),
])
def test_atom_types_classify(mem, fact, atom_type):
    mem.memorize(f"note: {fact}", {"key_facts": [fact], "importance": 0.5,
                                   "timestamp": "2026-05-01T00:00:00Z"})
    atom = mem.rows("select * from memory_atoms")[0]
    assert atom["content"] == fact and atom["atom_type"] == atom_type
    base = mem.rules.types[atom_type]["base_ttl_days"]
    assert atom["base_ttl_days"] == base
    by_ttl = aokun.iso(dt.datetime(2026, 5, 1, tzinfo=dt.timezone.utc) + dt.timedelta(days=base))
    # both plans name their day: they last until after it, beyond the TTL
    if atom_type == "planned":
        assert atom["expires_at"] > by_ttl
    else:
        assert atom["expires_at"] == by_ttl


def test_entity_resolution_one_node(mem):
    # rules/aliases.toml
    assert mem.rules.canonical("NYC") == mem.rules.canonical("纽约") == "new york"
    m1 = mem.memorize("lunch with Alice in NYC",
                      {"participants": ["Alice", " alice "], "topics": ["NYC"]})
    m2 = mem.memorize("Alice flew back to New York",
                      {"participants": ["ALICE"], "topics": ["New  York", "纽约"]})
    persons = mem.rows("select * from graph_nodes where node_type = 'person'")
    assert [(p["canonical"], p["value"]) for p in persons] == [("alice", "Alice")]
    topics = mem.rows("select * from graph_nodes where node_type = 'topic'")
    assert [(t["canonical"], t["value"]) for t in topics] == [("new york", "New York")]
    for doc in (m1["id"], m2["id"]):
        used = {r["n"] for r in mem.rows("select node_id n from graph_entries"
                                         " where document_id = ? and node_id is not null",
                                         (doc,))}
        assert persons[0]["id"] in used and topics[0]["id"] in used
    # two spellings of one entity in one memory are one subject: no self-loop edge, one entry per
    # node
    assert count(mem, "graph_edges", "source_id = target_id") == 0
    per_node = mem.rows("select document_id, node_id, count(*) n from graph_entries"
                        " where node_id is not null group by document_id, node_id having n > 1")
    assert per_node == []
    assert mem.doctor() == []


def test_personas_do_not_share_nodes(mem):
    mem.memorize("met Alice", {"participants": ["Alice"], "persona_id": "a"})
    mem.memorize("met Alice too", {"participants": ["Alice"], "persona_id": "b"})
    assert count(mem, "graph_nodes", "node_type = 'person'") == 2


@pytest.mark.parametrize("metadata, field", [
    ({"importance": 2}, "metadata.importance"),
    ({"importance": "x"}, "metadata.importance"),
    ({"importance": float("nan")}, "metadata.importance"),
    ({"importance": True}, "metadata.importance"),
    ({"topics": 5}, "metadata.topics"),
    ({"participants": [1]}, "metadata.participants[0]"),
    ({"colour": "red"}, "metadata"),
    ({"timestamp": "yesterday"}, "metadata.timestamp"),
    ({"pinned": "yes"}, "metadata.pinned"),
    ("not a dict", "metadata"),
])
def test_bad_metadata_names_the_field_and_writes_nothing(mem, fake_embedder, metadata, field):
    with pytest.raises(aokun.InputError) as e:
        mem.memorize("a perfectly fine memory", metadata)
    assert e.value.field == field
    assert str(e.value).startswith(field + ":")
    assert set(table_counts(mem).values()) == {0}
    assert fake_embedder.calls == 0


def test_bad_item_in_a_batch_writes_nothing(mem):
    with pytest.raises(aokun.InputError) as e:
        mem.memorize_many([("good one", None), ("bad one", {"importance": 7})])
    assert e.value.field == "items[1].metadata.importance"
    assert count(mem, "documents") == 0 and count(mem, "memory_write_ops") == 0


@pytest.mark.slow
@pytest.mark.parametrize("content", ["", "   \n\t", "\x00\x00", None, 42])
def test_empty_or_non_text_content_rejected(mem, content):
    with pytest.raises(aokun.InputError) as e:
        mem.memorize(content)
    assert e.value.field == "content"
    assert count(mem, "documents") == 0


@pytest.mark.slow
def test_provider_none_stores_without_vectors(db_path, open_mem):
    m = open_mem(db_path, aokun.Embedder())
    r = m.memorize("no vectors here", {"participants": ["Eve"]})
    assert r["embedding"] == "none" and r["status"] == "done"
    assert not m.has_table("doc_vec")
    fact_states = m.rows("select embedding_state from graph_entries where node_id in "
                         "(select id from graph_nodes where node_type = 'fact')")
    assert {e["embedding_state"] for e in fact_states} == {"none"}
    assert fts_ids(m, "documents_fts", "vectors") == [r["id"]]
    assert m.doctor() == []


def test_facts_equal_up_to_case_are_one_fact(mem):
    r = mem.memorize("dup facts", {"key_facts": ["Frank owns a boat.", "frank owns a  BOAT."]})
    assert count(mem, "graph_nodes", "node_type = 'fact'") == 1
    assert count(mem, "graph_edges", "source_id = target_id") == 0
    assert count(mem, "memory_atoms") == 1 and r["atoms"] == 1
    assert mem.doctor() == []


@pytest.mark.slow
def test_finished_writes_keep_no_payload(db_path, open_mem):
    """The journal keeps a finished write's row, not a copy of the memory: the payload lives in
    memory_write_payloads only until the write is done, so the journal stays a few pages."""
    mem = open_mem(db_path)
    long = "A long memory about the zephyr project and its many details, repeated. " * 20
    mem.memorize_many([(f"{i}: {long}", {"session_id": "s"}) for i in range(60)])
    mem.memorize(f"one more: {long}")
    assert mem.value("select count(*) from memory_write_payloads") == 0
    assert mem.value("select count(*) from memory_write_ops"
                     " where status = 'done' and payload = '{}'") == 61
    journal_bytes = mem.value("select sum(pgsize) from dbstat where name = 'memory_write_ops'")
    assert journal_bytes <= 4 * 4096, journal_bytes  # 61 payloads of 1.4 KB would take 20+ pages


@pytest.mark.slow
def test_a_fact_text_is_embedded_once(db_path, open_mem):
    """One embedding per distinct text: a fact sentence already stored for the persona takes the
    stored vector, and copies within a batch are embedded once."""
    fake = FakeEmbedder(16)
    seen: list[str] = []
    real = fake.embed_documents
    fake.embed_documents = lambda texts: seen.extend(texts) or real(texts)
    mem = open_mem(db_path, fake)
    mem.memorize("Alice likes green tea. Bob sold his old bike.", {"session_id": "s1"})
    seen.clear()
    mem.memorize("Alice likes green tea. Carol painted the fence.", {"session_id": "s2"})
    assert "Alice likes green tea." not in seen and "Carol painted the fence." in seen
    vectors = {r["entry_id"]: bytes(r["embedding"]) for r in mem.rows(
        "select v.entry_id, v.embedding from graph_vectors v"
        " join graph_entries e on e.id = v.entry_id join graph_nodes n on n.id = e.node_id"
        " where n.value = 'Alice likes green tea.'")}
    assert len(vectors) == 2 and len(set(vectors.values())) == 1
    seen.clear()
    mem.memorize_many([("Dan flew to Oslo today. Erin baked fresh bread.", {"session_id": "s3"}),
                       ("Dan flew to Oslo today. Finn fixed the old roof.", {"session_id": "s4"})])
    assert seen.count("Dan flew to Oslo today.") == 1


def test_session_context_is_indexed_once_per_memory_on_its_anchor(mem):
    """The context (the memory before it in its session) goes on the memory's first subject entry
    only, not on every fact entry: indexed once, and a reply is still found by what it answers."""
    meta = {"session_id": "trip", "participants": ["Bob"]}
    mem.memorize("Where did you go hiking last May?", meta | {"timestamp": "2025-06-01T10:00:00Z"})
    b = mem.memorize("We hiked the Dolomites. It rained every day.",
                     meta | {"timestamp": "2025-06-01T10:01:00Z"})["id"]
    texts = [r["text"] for r in mem.rows("select text from graph_entries"
                                         " where document_id = ? and edge_id is null order by id",
                                         (b,))]
    assert texts == ["Person: Bob. Summary: We hiked the Dolomites. It rained every day.\n"
                     "Context: Where did you go hiking last May?",
                     "Fact: We hiked the Dolomites.\nAbout: Bob",
                     "Fact: It rained every day.\nAbout: Bob"]
    hits = mem.recall("hiking May", k=5, channels="graph_keyword")["results"]
    assert b in [h["id"] for h in hits]


@pytest.mark.slow
def test_a_refreshed_anchor_keeps_its_own_spelling_as_a_fresh_write_and_rebuild_do(db_path,
                                                                                   open_mem):
    """A node shared by two memories keeps the first one's spelling; refreshing a later memory's
    anchor after an edit before it (and upgrading an old layout) used to write that spelling
    ("Fact: Alice likes tea" for the memory that said "ALICE   likes tea"), unlike its own write and
    `rebuild --graph`."""
    mem = open_mem(db_path)
    s = {"session_id": "s"}
    x = mem.memorize("Alice likes tea, she said.",
                     s | {"timestamp": "2025-01-01T10:00:00Z", "participants": ["carol"],
                                                     "key_facts": ["Alice likes tea"]})["id"]
    mem.memorize("Indeed.",
                 s | {"timestamp": "2025-01-01T10:01:00Z", "key_facts": ["ALICE   likes tea"]})
    mem.memorize("Later.", s | {"timestamp": "2025-01-01T10:02:00Z", "participants": ["Carol"]})
    mem.edit(x, content="Alice likes green tea, she said.")

    def texts() -> list:
        return [r["text"] for r in mem.rows("select text from graph_entries where edge_id is null "
                                            "order by document_id, id")]
    live = texts()
    assert "Fact: ALICE   likes tea\nContext: Alice likes green tea, she said." in live
    assert "Person: Carol. Summary: Later.\nContext: Indeed." in live
    mem.rebuild(graph=True)
    assert texts() == live
    with mem.tx() as c:
        c.execute("delete from meta where key = 'graph_layout'")
    mem._upgrade_graph_entries()
    assert texts() == live


@pytest.mark.slow
def test_an_old_graph_layout_is_rewritten_when_the_file_is_opened(db_path, open_mem, monkeypatch):
    """Files before graph layout 2 indexed every describes/co_occurs_with edge as a sentence and
    the context on every fact: opening one rewrites its entries as a new write makes them (vectors
    kept)."""
    mem = open_mem(db_path)
    meta = {"session_id": "s", "participants": ["Alice"], "topics": ["coffee"]}
    mem.memorize("We met at the cafe.", meta | {"timestamp": "2025-01-01T10:00:00Z"})
    b = mem.memorize(ALICE, meta | {"timestamp": "2025-01-01T10:05:00Z"})["id"]
    fresh = mem.rows("select id, text from graph_entries order by id")
    vectors = mem.rows("select entry_id, embedding from graph_vectors order by entry_id")
    with mem.tx() as c:  # what the old layout wrote for memory b
        for e in mem.rows("select e.id, n.value from graph_entries e"
                          " join graph_nodes n on n.id = e.node_id"
                          " where e.document_id = ? and n.node_type = 'fact'", (b,)):
            mem._put_entry_text(e["id"], f"Fact: {e['value']}\nContext: We met at the cafe.")
        first_id = min(r["id"] for r in fresh
                       if r["text"].startswith("Person: Alice. Summary: Alice"))
        mem._put_entry_text(fresh[[r["id"] for r in fresh].index(first_id)]["id"],
                            "Person: Alice. Summary: " + ALICE)
        edge = mem.value("select id from graph_edges"
                         " where document_id = ? and relation = 'describes'", (b,))
        c.execute("insert into graph_entries(id, persona_id, session_id, document_id, edge_id,"
                  " text, confidence, archived, embedding_state)"
                  " values (999, '', 's', ?, ?, 'Alice describes Alice loves iced americano.',"
                  " 0.9, 0, 'skip')", (b, edge))
        c.execute("insert into graph_entries_fts(rowid, segmented)"
                  " values (999, 'alice describes alice')")
        c.execute("delete from meta where key in ('graph_layout', 'data_version')")
    mem.close()
    # one memory a transaction: the lock is let go between
    monkeypatch.setattr(aokun, "GRAPH_UPGRADE_BATCH", 1)
    mem = open_mem(db_path)
    assert mem.meta_get("graph_layout") == aokun.GRAPH_LAYOUT
    assert mem.rows("select id, text from graph_entries order by id") == fresh
    assert mem.rows("select entry_id, embedding from graph_vectors order by entry_id") == vectors
    assert mem.value("select count(*) from graph_entries_fts") == len(fresh)
    assert fts_ids(mem, "graph_entries_fts", "describes") == []
    assert mem.doctor() == []


def test_a_long_run_of_chinese_is_cut_in_pieces_for_jieba(segmenter, monkeypatch):
    """jieba's HMM is quadratic in a run of unknown characters: one memory of 300,000 我 held its
    server for 566 s. The segmenter hands jieba at most 256 characters of a run at a time."""
    seen = []
    cut = segmenter._cut_run
    monkeypatch.setattr(segmenter, "_cut_run", lambda run, keep: seen.append(len(run)) or cut(
        run, keep))
    assert segmenter.tokens("我" * 1000 + "喜欢杭州")
    assert seen and max(seen) <= 256 and sum(seen) == 1004
