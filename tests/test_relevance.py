"""Calibrated relevance with the real local model: an unrelated query comes back empty and says so,
pinned memories join only when relevant, related queries keep their hits (issue 11, items 2-3)."""

import aokun

PERSONA = "relevance-test"  #: local_mem is shared by the session: these memories stay in their persona
MEMORIES = [
    ("Alice drinks an iced americano every morning before work.", {"participants": ["Alice"]}),
    ("Alice is allergic to peanuts.", {"participants": ["Alice"], "pinned": True}),
    ("Bob and Alice are planning a hiking trip to the Alps in July.", {"participants": ["Bob", "Alice"]}),
    ("The team moved the weekly standup to Tuesdays at 10.", {"topics": ["work"]}),
    ("老王下周三去杭州出差，记得订高铁票。", {"participants": ["老王"]}),
]


def _store(mem):
    for text, meta in MEMORIES:
        mem.memorize(text, dict(meta, persona_id=PERSONA))


def test_an_unrelated_query_returns_nothing_and_says_so(local_mem):
    _store(local_mem)
    out = local_mem.recall("lattice quantum chromodynamics gluon propagator", k=5, persona_id=PERSONA)
    assert out["results"] == []
    assert any(w.startswith("nothing relevant") and "min_relevance" in w for w in out["warnings"]), out["warnings"]


def test_pinned_memory_joins_only_when_relevant(local_mem):
    _store(local_mem)
    unrelated = local_mem.recall("what time is the weekly standup", k=5, persona_id=PERSONA, explain=True)
    texts = [h["text"] for h in unrelated["results"]]
    assert "The team moved the weekly standup to Tuesdays at 10." in texts
    assert "Alice is allergic to peanuts." not in texts  # pinned, but not about the standup
    related = local_mem.recall("what is Alice allergic to", k=5, persona_id=PERSONA)
    assert related["results"][0]["text"] == "Alice is allergic to peanuts."


def test_related_queries_keep_hits_with_a_relevance_on_one_scale(local_mem):
    _store(local_mem)
    cfg = local_mem.cfg.recall
    for query, expected in (("what does Alice drink in the morning", MEMORIES[0][0]),
                            ("where are Bob and Alice going hiking", MEMORIES[2][0]),
                            ("Wang's trip to Hangzhou", MEMORIES[4][0])):  # English about Chinese
        hits = local_mem.recall(query, k=3, persona_id=PERSONA, explain=True)["results"]
        assert hits and hits[0]["text"] == expected, (query, [h["text"] for h in hits])
        for h in hits:
            assert cfg.min_relevance <= h["relevance"] <= 1.0
            assert h["explain"]["relevance"] == h["relevance"] or abs(h["explain"]["relevance"] - h["relevance"]) < 1e-4


def test_min_relevance_zero_keeps_every_hit(local_mem, segmenter):
    _store(local_mem)
    cfg = aokun.Config(None, overrides={("recall", "min_relevance"): 0.0})
    m = aokun.Memory(local_mem.path, cfg, embedder=local_mem.embedder)
    m.seg = segmenter
    try:
        out = m.recall("lattice quantum chromodynamics gluon propagator", k=3, persona_id=PERSONA)
        assert len(out["results"]) == 3 and all(h["relevance"] < 0.4 for h in out["results"])
    finally:
        m.close()
