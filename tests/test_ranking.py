"""The pure ranking functions (the "Ranking" section of aokun.py, README "How recall ranks") fed
plain dicts, no database: every expected number is worked out by hand in the test from the
default [recall] settings (bm25 1.0, vector 1.0, graph kw 0.5, graph vec 0.3; α .5 β .25 γ .25
δ .10; graph .55/.20/.15/.10; floor .5; routes .65/.35; bonus .08; neighbour .3; λ .7; 30 days)."""

import datetime as dt
import math

import pytest

import aokun
from aokun import (
    RECALL_HIT_MIN_TOKENS,
    Weights,
    bound_hits,
    calibrated_relevance,
    candidate_score,
    channel_evidence,
    chars_within,
    cut_text,
    estimate_tokens,
    explain_parts,
    fuse_scores,
    mmr_pool,
    normalized_scores,
    recall_hit,
    route_relevance,
    rrf,
    scale_routes,
    select_hits,
    shortlist,
    token_cover,
    ttl_factor,
)

ALL = ("bm25", "vector", "graph_keyword", "graph_vector")
REF = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
LN11 = math.log(11)


def ago(days: float) -> str:
    """The stored ISO text of REF minus `days`."""
    return aokun.iso(REF - dt.timedelta(days=days))


def recall_cfg(**overrides):
    return aokun.Config(None, overrides={("recall", k): v for k, v in overrides.items()}).recall


def weights(channels=ALL, spec=None, **overrides) -> Weights:
    return Weights.of(recall_cfg(**overrides), spec or {}, channels)


def row(i, rank, raw, confidence=None):
    """One channel row, as the recall_* queries return it."""
    return {"id": i, "rank": rank, "raw": raw, "confidence": confidence}


def candidate(i, importance=0.5, created=0.0, useful=None, count=0, factor=1.0):
    """A sql recall_candidates row; `created`/`useful` (last marked useful) in days before REF."""
    return {"id": i, "importance": importance, "created_at": ago(created),
            "last_useful_at": None if useful is None else ago(useful), "useful_count": count,
            "temporal_factor": factor}


# rrf, normalized_scores, ttl_factor ##############################################################

def test_rrf_is_weighted_and_normalised_to_its_maximum():
    # two channels of weight 1, ranks 0 and 2, k = 60: (1/61 + 1/63) / (2/61)
    assert rrf({"bm25": 0, "vector": 2}, ("bm25", "vector"), 60) == \
        pytest.approx((1 / 61 + 1 / 63) / (2 / 61))
    # rank 0 everywhere is the maximum, 1.0; a channel that did not find it contributes nothing
    assert rrf({"bm25": 0, "vector": 0}, ("bm25", "vector"), 60) == pytest.approx(1.0)
    assert rrf({"bm25": 0}, ("bm25", "vector"), 60) == pytest.approx(0.5)
    # weighted: graph kw 0.5 at rank 0, graph vec 0.3 at rank 1 → (0.5/61 + 0.3/62) / (0.8/61)
    w = {"graph_keyword": 0.5, "graph_vector": 0.3}
    assert rrf({"graph_keyword": 0, "graph_vector": 1}, ("graph_keyword", "graph_vector"), 60, w) \
        == pytest.approx((0.5 / 61 + 0.3 / 62) / (0.8 / 61))
    assert rrf({}, (), 60) == 0.0


def test_normalized_scores_keyword_divides_by_max_knn_is_min_max():
    # bm25 raw is bm25() (more negative = better): −4, −2, 0 → 4/4, 2/4, 0/4
    assert normalized_scores("bm25", [row(1, 0, -4.0), row(2, 1, -2.0), row(3, 2, 0.0)]) \
        == pytest.approx({1: 1.0, 2: 0.5, 3: 0.0})
    # graph keyword raw is a positive aggregate: 3, 1.5 → 1, 0.5
    assert normalized_scores("graph_keyword", [row(1, 0, 3.0), row(2, 1, 1.5)]) \
        == pytest.approx({1: 1.0, 2: 0.5})
    # KNN raw is a cosine distance: similarities 0.8, 0.5, 0.4 → min-max (s − 0.4) / 0.4
    assert normalized_scores("vector", [row(1, 0, 0.2), row(2, 1, 0.5), row(3, 2, 0.6)]) \
        == pytest.approx({1: 1.0, 2: 0.25, 3: 0.0})
    # one neighbour: 1, not 0/0
    assert normalized_scores("graph_vector", [row(7, 0, 0.3)]) == {7: 1.0}
    assert normalized_scores("bm25", []) == {}


def test_ttl_factor_exponential_step_expired_and_historical():
    atom = {"last_reinforced_at": ago(10), "expires_at": aokun.iso(REF + dt.timedelta(days=20)),
            "state": "active", "created_at": ago(10), "state_changed_at": None}
    # ttl = expires − reinforced = 30 days, age 10 days → exp(−10/30)
    assert ttl_factor(atom, "exponential", REF) == pytest.approx(math.exp(-1 / 3))
    assert ttl_factor(atom, "step", REF) == 1.0
    # at expires_at: gone
    assert ttl_factor(atom, "exponential", REF + dt.timedelta(days=20)) == 0.0
    assert ttl_factor(atom | {"state": "forgotten"}, "exponential", REF) == 0.0
    # historical (as_of): superseded 5 days ago counts before that, not after; not before it existed
    sup = atom | {"state": "superseded", "state_changed_at": ago(5)}
    assert ttl_factor(sup, "step", REF - dt.timedelta(days=6), historical=True) == 1.0
    assert ttl_factor(sup, "step", REF, historical=True) == 0.0
    assert ttl_factor(sup, "step", REF - dt.timedelta(days=11), historical=True) == 0.0


# Weights.of ######################################################################################

def test_weights_of_defaults():
    w = weights()
    assert (w.doc_channels, w.graph_channels) == (("bm25", "vector"),
                                                  ("graph_keyword", "graph_vector"))
    assert w.channel == {"bm25": 1.0, "vector": 1.0, "graph_keyword": 0.5, "graph_vector": 0.3}
    assert (w.doc_route, w.graph_route) == (0.65, 0.35)
    assert (w.alpha, w.beta, w.gamma, w.delta) == (0.5, 0.25, 0.25, 0.10)
    assert (w.graph_relevance, w.graph_importance, w.graph_recency, w.graph_confidence) \
        == (0.55, 0.20, 0.15, 0.10)
    assert (w.fusion, w.rrf_k, w.temporal_floor, w.cross_route_bonus, w.neighbour, w.mmr_lambda) \
        == ("score", 60, 0.5, 0.08, 0.3, 0.7)


def test_weights_of_intent_spec_overrides_route_weights_and_adds_recency_boost():
    w = weights(spec={"doc_weight": 0.70, "graph_weight": 0.30, "recency_boost": 0.10})
    assert (w.doc_route, w.graph_route) == (0.70, 0.30)
    assert w.gamma == pytest.approx(0.25 + 0.10)


@pytest.mark.parametrize("channels, routes", [
    (("bm25",), (1.0, 0.0)),
    (("bm25", "vector"), (1.0, 0.0)),
    (("graph_vector",), (0.0, 1.0)),
    (("graph_keyword", "graph_vector"), (0.0, 1.0)),
])
def test_weights_of_route_without_channels_gets_zero(channels, routes):
    # the spec cannot revive a dead route
    w = weights(channels, spec={"doc_weight": 0.45, "graph_weight": 0.55})
    assert (w.doc_route, w.graph_route) == routes
    assert w.doc_channels + w.graph_channels == channels


# channel_evidence and route_relevance ###########################################################

def test_channel_evidence_ranks_scores_and_best_graph_confidence():
    ranked = {"bm25": [row(1, 0, -2.0, confidence=1.0), row(2, 1, -1.0, confidence=1.0)],
              "graph_keyword": [row(2, 0, 4.0, confidence=0.9), row(3, 1, 2.0, confidence=None)],
              "graph_vector": [row(2, 0, 0.1, confidence=0.6), row(1, 1, 0.4, confidence=0.3)]}
    ranks, scores, confidence = channel_evidence(ranked, ("graph_keyword", "graph_vector"))
    assert ranks == {1: {"bm25": 0, "graph_vector": 1},
                     2: {"bm25": 1, "graph_keyword": 0, "graph_vector": 0},
                     3: {"graph_keyword": 1}}
    assert scores["bm25"] == pytest.approx({1: 1.0, 2: 0.5})
    assert scores["graph_keyword"] == pytest.approx({2: 1.0, 3: 0.5})
    assert scores["graph_vector"] == pytest.approx({2: 1.0, 1: 0.0})
    # 2: max(0.9, then 0.6); 1: only its graph row counts (its bm25 "confidence" 1.0 is not graph
    # evidence);
    # 3: None → 0
    assert confidence == pytest.approx({1: 0.3, 2: 0.9, 3: 0.0})


def test_shortlist_keeps_the_best_by_evidence_and_every_pin_and_window_memory():
    """Fusion scores in full only the best n by channel evidence; pinned and time-window
    candidates stay whatever their evidence, and a set no larger than n is kept whole."""
    w = weights()
    ranked = {"bm25": [row(i, i - 1, -float(100 - i), confidence=1.0) for i in range(1, 51)],
              "graph_keyword": [row(i, i - 41, float(100 - i)) for i in range(41, 61)],
              "time_window": [row(59, 0, 0.0, confidence=1.0)]}
    ranks, scores, _ = channel_evidence(ranked, w.graph_channels)
    picked = shortlist(ranks, scores, {60: 0.9}, w, 10)
    # 41..50: found by both routes (cross-route bonus) outrank 1..40, found by BM25 alone
    assert picked == set(range(41, 51)) | {59, 60}
    assert shortlist(ranks, scores, {}, w, len(ranks)) == set(ranks)


def test_route_relevance_score_fusion_is_weighted_mean_of_normalised_scores():
    w = weights()
    scores = {"bm25": {1: 1.0, 2: 0.5}, "vector": {1: 0.25}, "graph_keyword": {1: 1.0},
              "graph_vector": {1: 0.5}}
    # doc route, weights 1 and 1: id 1 (1.0 + 0.25)/2; id 2 (0.5 + nothing)/2 — a missing channel
    # counts as 0
    assert route_relevance(1, {}, scores, w.doc_channels, w) == pytest.approx((1.0 + 0.25) / 2)
    assert route_relevance(2, {}, scores, w.doc_channels, w) == pytest.approx(0.5 / 2)
    # graph route, weights 0.5 and 0.3: (0.5·1.0 + 0.3·0.5) / 0.8
    assert route_relevance(1, {}, scores, w.graph_channels, w) == \
        pytest.approx((0.5 * 1.0 + 0.3 * 0.5) / 0.8)
    assert route_relevance(1, {}, scores, (), w) == 0.0


def test_route_relevance_rrf_fusion_uses_ranks():
    w = weights(fusion="rrf")
    assert w.fusion == "rrf"
    ranks = {"bm25": 0, "vector": 1, "graph_keyword": 2}
    scores = {"bm25": {1: 0.1}, "vector": {1: 0.1}}  # ignored under rrf
    assert route_relevance(1, ranks, scores, w.doc_channels, w) == \
        pytest.approx((1 / 61 + 1 / 62) / (2 / 61))
    # graph kw (0.5) at rank 2, graph vec absent: (0.5/63) / (0.8/61)
    assert route_relevance(1, ranks, scores, w.graph_channels, w) == \
        pytest.approx((0.5 / 63) / (0.8 / 61))


# candidate_score ################################################################################

def test_candidate_score_doc_route_and_graph_route_with_temporal_floor():
    w = weights()
    d = candidate(1, importance=0.6, created=40, useful=10, count=4, factor=0.5)
    ranks = {"bm25": 0, "graph_keyword": 0}
    scores = {"bm25": {1: 1.0}, "vector": {}, "graph_keyword": {1: 0.8}, "graph_vector": {}}
    p = candidate_score(d, ranks, scores, 0.9, w, REF, False, 1.1, None)

    # from created_at (40 d): being used 10 days ago does not make it recent
    recency = math.exp(-40 / 30)
    frequency = math.log1p(4 * math.exp(-10 / 30)) / LN11  # 4 useful marks, the last 10 days ago
    rel_doc = (1.0 * 1.0 + 1.0 * 0.0) / 2.0  # vector did not find it
    rel_graph = (0.5 * 0.8 + 0.3 * 0.0) / 0.8
    assert p["recency"] == pytest.approx(recency)
    assert p["frequency"] == pytest.approx(frequency) and p["useful_count"] == 4
    assert (p["doc_relevance"], p["graph_relevance"]) == pytest.approx((0.5, 0.5))
    assert p["doc_route"] == \
        pytest.approx(0.5 * rel_doc + 0.25 * 0.6 + 0.25 * recency * rel_doc + 0.10 * frequency)
    # graph route × (floor + (1 − floor)·factor) = × (0.5 + 0.5·0.5)
    assert p["graph_route"] == pytest.approx(
        (0.55 * rel_graph + 0.20 * 0.6 + 0.15 * recency * rel_graph + 0.10 * 0.9)
        * (0.5 + 0.5 * 0.5))
    assert p["in_doc"] and p["in_graph"]
    assert (p["source_boost"], p["pin_similarity"], p["temporal_factor"], p["confidence"]) == \
        (1.1, None, 0.5, 0.9)
    assert p["ranks"] is ranks


def test_candidate_score_historical_uses_created_at_and_no_frequency():
    w = weights(spec={"recency_boost": 0.10})  # γ = 0.25 + 0.10, so γ ≠ β here
    d = candidate(1, importance=0.6, created=40, useful=10, count=4, factor=1.0)
    scores = {"bm25": {1: 1.0}}
    p = candidate_score(d, {"bm25": 0}, scores, None, w, REF, True, 1.0, None)
    assert p["recency"] == pytest.approx(math.exp(-40 / 30))
    assert p["frequency"] == 0.0  # the feedback (after as_of) is ignored
    assert p["doc_route"] == pytest.approx(0.5 * 0.5 + 0.25 * 0.6
                                           + 0.35 * math.exp(-40 / 30) * 0.5)
    # no confidence, factor 1, no graph relevance: graph route is importance only
    assert p["graph_route"] == pytest.approx(0.20 * 0.6)
    assert p["in_doc"] and not p["in_graph"]


def test_candidate_score_frequency_zero_when_never_useful_and_capped_at_one():
    w = weights()
    never = candidate_score(candidate(1, created=15), {}, {}, None, w, REF, False, 1.0, None)
    assert never["frequency"] == 0.0
    assert never["recency"] == pytest.approx(math.exp(-15 / 30))
    assert not never["in_doc"] and not never["in_graph"]
    # 50 useful marks today: ln(1 + 50)/ln(11) ≈ 1.64 → capped at 1; recency stays that of
    # created_at
    busy = candidate_score(candidate(1, created=15, useful=0, count=50), {}, {}, None, w, REF,
                           False, 1.0, None)
    assert busy["frequency"] == 1.0
    assert busy["recency"] == pytest.approx(math.exp(-15 / 30))
    # 2 useful marks, the last 30 days ago, created 60 days ago: ln(1 + 2·e^−1)/ln(11), recency e^−2
    old = candidate_score(candidate(1, created=60, useful=30, count=2), {}, {}, None, w, REF, False,
                          1.0, None)
    assert old["frequency"] == pytest.approx(math.log1p(2 * math.exp(-1)) / LN11)
    assert old["recency"] == pytest.approx(math.exp(-2))


def test_candidate_score_ignores_recall_access_bookkeeping():
    """A recall's touches (last_access_at, access_count) are in the row but move nothing: ranking
    recency is from created_at and frequency from memory_feedback."""
    w = weights()
    plain = candidate(1, created=20)
    touched = plain | {"last_access_at": ago(0), "access_count": 25.0}
    a = candidate_score(plain, {"bm25": 0}, {"bm25": {1: 1.0}}, None, w, REF, False, 1.0, None)
    b = candidate_score(touched, {"bm25": 0}, {"bm25": {1: 1.0}}, None, w, REF, False, 1.0, None)
    assert (b["recency"], b["frequency"]) == (pytest.approx(math.exp(-20 / 30)), 0.0)
    assert (b["doc_route"], b["graph_route"]) == (a["doc_route"], a["graph_route"])


def test_candidate_score_ignores_temporal_factor_without_graph_channels():
    w = weights(("bm25", "vector"))
    p = candidate_score(candidate(1, importance=0.4, factor=0.0), {"bm25": 0}, {"bm25": {1: 1.0}},
                        None, w,
                        REF, False, 1.0, None)
    assert p["temporal_factor"] == 1.0
    assert p["graph_route"] == pytest.approx(0.20 * 0.4)  # no graph relevance: no recency


# scale_routes and fuse_scores ###################################################################

def test_scale_routes_divides_by_maxima_and_adds_bonus_only_for_both_routes():
    w = weights()
    parts = {1: {"doc_route": 0.8, "graph_route": 0.0, "in_doc": True, "in_graph": False},
             2: {"doc_route": 0.4, "graph_route": 0.6, "in_doc": True, "in_graph": True},
             3: {"doc_route": 0.2, "graph_route": 0.3, "in_doc": False, "in_graph": True}}
    scale_routes(parts, w)
    assert parts[1]["routes"] == pytest.approx(0.65 * 0.8 / 0.8 + 0.35 * 0.0 / 0.6)
    assert parts[2]["routes"] == pytest.approx(0.65 * 0.4 / 0.8 + 0.35 * 0.6 / 0.6 + 0.08)
    assert parts[3]["routes"] == pytest.approx(0.65 * 0.2 / 0.8 + 0.35 * 0.3 / 0.6)
    assert [parts[i]["cross_route_bonus"] for i in (1, 2, 3)] == [0.0, 0.08, 0.0]


def test_scale_routes_with_an_empty_route_does_not_divide_by_zero():
    w = weights(("bm25",))  # routes 1.0 / 0.0
    parts = {1: {"doc_route": 0.5, "graph_route": 0.0, "in_doc": True, "in_graph": False},
             2: {"doc_route": 0.25, "graph_route": 0.0, "in_doc": True, "in_graph": False}}
    scale_routes(parts, w)
    assert (parts[1]["routes"], parts[2]["routes"]) == pytest.approx((1.0, 0.5))


def test_stale_graph_evidence_keeps_the_floor_share_of_a_fresh_one():
    """The atoms' temporal factor multiplies the graph route before scale_routes divides by the best
    graph route: a memory whose atoms all expired keeps temporal_floor (0.5) of the graph share a
    fresh memory with the same evidence gets."""
    w = weights()
    fresh = candidate_score(candidate(1, importance=0.5, factor=1.0), {"graph_keyword": 0},
                            {"graph_keyword": {1: 1.0, 2: 1.0}}, 1.0, w, REF, False, 1.0, None)
    stale = candidate_score(candidate(2, importance=0.5, factor=0.0), {"graph_keyword": 0},
                            {"graph_keyword": {1: 1.0, 2: 1.0}}, 1.0, w, REF, False, 1.0, None)
    parts = {1: fresh, 2: stale}
    scale_routes(parts, w)
    graph_share = {i: p["routes"] - 0.65 * p["doc_route"] / max(fresh["doc_route"],
                                                                stale["doc_route"])
                   for i, p in parts.items()}
    assert graph_share[1] == pytest.approx(0.35)
    assert graph_share[2] == pytest.approx(0.35 * 0.5)


def test_fuse_scores_neighbour_term_source_boost_and_order():
    w = weights()
    parts = {1: {"routes": 0.9, "source_boost": 1.0}, 2: {"routes": 0.5, "source_boost": 1.1},
             3: {"routes": 0.2, "source_boost": 0.9}, 4: {"routes": 0.5, "source_boost": 1.0}}
    neighbours = {1: {2}, 2: {1, 3, 99}, 3: {2}}  # 99 is no candidate: ignored
    order = fuse_scores(parts, neighbours, w)
    assert parts[1]["neighbour"] == pytest.approx(0.3 * 0.5)
    assert parts[1]["fused"] == pytest.approx((0.9 + 0.15) * 1.0)  # 1.05
    assert parts[2]["fused"] == pytest.approx((0.5 + 0.3 * max(0.9, 0.2)) * 1.1)  # 0.847
    assert parts[3]["fused"] == pytest.approx((0.2 + 0.3 * 0.5) * 0.9)  # 0.315
    assert parts[4]["neighbour"] == 0.0 and parts[4]["fused"] == pytest.approx(0.5)
    assert order == [1, 2, 4, 3]


def test_fuse_scores_ties_go_to_the_lower_id():
    parts = {5: {"routes": 0.5, "source_boost": 1.0}, 2: {"routes": 0.5, "source_boost": 1.0},
             9: {"routes": 0.7, "source_boost": 1.0}}
    assert fuse_scores(parts, {}, weights()) == [9, 2, 5]


# mmr_pool and select_hits #######################################################################

def fused(**by_id):
    return {int(k[1:]): {"fused": v} for k, v in by_id.items()}


def test_mmr_pool_is_the_best_plus_matched_pins():
    parts = {i: {} for i in (1, 3, 4, 5, 7)}
    # 3 is in the pool already, 8 was not scored (deleted or filtered out): neither added
    assert mmr_pool([5, 3, 1, 4], parts, {7: 0.5, 3: 0.6, 8: 0.9}, 2) == [5, 3, 7]


def test_select_hits_mmr_prefers_a_distinct_hit_over_a_near_duplicate():
    parts = fused(i1=1.0, i2=0.95, i3=0.8)
    tokens = {1: {"a", "b", "c", "d"}, 2: {"a", "b", "c", "d"}, 3: {"x", "y"}}
    # pick 1 (0.7·1.0); then 2: 0.7·0.95 − 0.3·Jaccard 1.0 = 0.365 < 3: 0.7·0.8 − 0 = 0.56
    assert select_hits([1, 2, 3], parts, tokens, {}, 2, 0.7) == [(1, pytest.approx(0.7)),
                                                                 (3, pytest.approx(0.56))]
    # λ = 1 is pure relevance: the duplicate comes second
    assert [i for i, _ in select_hits([1, 2, 3], parts, tokens, {}, 2, 1.0)] == [1, 2]


def test_select_hits_pins_replace_the_weakest_unpinned_hits_when_k_is_full():
    parts = fused(i1=0.9, i2=0.8, i3=0.7, i7=0.1, i9=0.05)
    tokens = {1: {"a"}, 2: {"b"}, 3: {"c"}, 7: {"g"}, 9: {"h"}}
    # MMR picks 1, 2, 3; pins go in best similarity first: 9 (0.8) replaces 3, then 7 (0.45)
    # replaces 2
    hits = select_hits([1, 2, 3], parts, tokens, {7: 0.45, 9: 0.8}, 3, 0.7)
    assert [i for i, _ in hits] == [1, 7, 9]
    assert hits[1][1] is None and hits[2][1] is None
    # a pin MMR picked itself stays, and is never replaced by another pin
    hits = select_hits([1, 2], parts, tokens, {1: 0.9, 9: 0.5}, 2, 0.7)
    assert [(i, s is None) for i, s in hits] == [(1, False), (9, True)]
    assert [i for i, _ in select_hits([1], parts, tokens, {1: 0.9, 9: 0.5}, 1, 0.7)] == [1]


def test_select_hits_appends_pins_when_there_is_room_and_never_returns_deleted_ids():
    parts = fused(i1=0.9, i2=0.8, i3=0.7, i8=0.1, i9=0.1)
    tokens = {1: {"a"}, 3: {"c"}, 9: {"h"}}  # 2 and 8 were deleted meanwhile: no document
    hits = select_hits([1, 2, 3], parts, tokens, {8: 0.9, 9: 0.5}, 5, 0.7)
    assert [i for i, _ in hits] == [1, 3, 9]
    assert hits[0][1] == pytest.approx(0.7 * 0.9) and hits[2][1] is None


# recall_hit and explain_parts ###################################################################

def test_recall_hit_from_document_row_and_parts():
    d = {"id": 4, "content": "text", "summary": "s", "importance": 0.5, "created_at": ago(1),
         "session_id": "s1", "persona_id": "p", "participants": '["Ann"]', "topics": '["tea"]',
         "source": "chat", "pinned": 1,
         "archived": 0, "segmented": "text"}
    hit = recall_hit(d, {"fused": 0.12345678, "ranks": {"vector": 1, "bm25": 0}})
    assert hit == {"id": 4, "score": 0.123457, "text": "text", "truncated": False, "summary": "s",
                   "importance": 0.5, "created_at": ago(1), "session_id": "s1", "persona_id": "p",
                   "participants": ["Ann"],
                   "topics": ["tea"], "source": "chat", "pinned": True, "archived": False,
                   "channels": ["bm25", "vector"], "relevance": None}
    assert recall_hit(d, {"fused": 0.1, "ranks": {}, "relevance": 0.876543})["relevance"] == 0.8765


# bounded answers: cut_text, bound_hits ------------------------------------------------------------

@pytest.mark.parametrize("text, limit, want", [
    ("One. Two three. Four five six.", 100, "One. Two three. Four five six."),  # short: untouched
    # last sentence end
    ("The cat sat. The dog ran. The bird flew away.", 30, "The cat sat. The dog ran.…"),
    # the end at the room's edge
    ("The cat sat! The dog ran? The bird flew away.", 26, "The cat sat! The dog ran?…"),
    ("first line\nsecond line\nthird line", 25, "first line\nsecond line…"),  # a line break
    # no sentence end: a word boundary
    ("Pi is 3.14159 and e is 2.71828 and more", 20, "Pi is 3.14159 and e…"),
    # an end in the first half is too early
    ("Hi. " + "word " * 20, 40, "Hi. word word word word word word word…"),
    ("x" * 50, 10, "x" * 9 + "…"),  # no boundary at all: the hard cap
    # a CJK full stop
    ("我们讨论了迁移。决定下个季度上线，保留旧系统三个月。", 14, "我们讨论了迁移。…"),
    # CJK, no end: hard cap
    ("我们讨论了迁移，决定下个季度上线，保留旧系统三个月。", 12, "我们讨论了迁移，决定下…"),
])
def test_cut_text_cuts_at_a_sentence_end_then_a_word_then_hard(text, limit, want):
    got, cut = cut_text(text, limit)
    assert (got, cut) == (want, text != want)
    assert len(got) <= limit and text.startswith(got.removesuffix("…"))


def test_cut_text_keeps_a_prefix_within_the_limit_for_any_limit():
    text = "Alpha beta. Gamma delta epsilon!\n 中文句子。Zeta eta theta; iota kappa lambda mu. " * 5
    for limit in range(1, len(text) + 2):
        got, cut = cut_text(text, limit)
        assert len(got) <= limit and cut is (len(text) > limit)
        assert got == text if not cut else (got.endswith("…") and text.startswith(got[:-1]))


def test_chars_within_is_the_longest_start_within_the_tokens():
    text = "abcd" * 10 + "中文" * 5 + "efgh" * 10
    for tokens in range(0, estimate_tokens(text) + 2):
        n = chars_within(text, tokens)
        assert estimate_tokens(text[:n]) <= tokens
        assert n == len(text) or estimate_tokens(text[: n + 1]) > tokens


def long_hit(i: int, sentences: int = 100) -> dict:
    return {"id": i, "text": " ".join(f"Memory {i} sentence {n} is here."
                                      for n in range(sentences)),
            "truncated": False}


def test_bound_hits_caps_every_text_and_keeps_short_ones():
    hits = [long_hit(1), {"id": 2, "text": "Short.", "truncated": False}]
    kept, left_out = bound_hits(hits, 200, 0)
    assert left_out == [] and [h["id"] for h in kept] == [1, 2]
    assert kept[0]["truncated"] is True and len(kept[0]["text"]) <= 200
    assert kept[0]["text"].endswith("here.…")
    assert kept[1] == hits[1] and hits[0]["truncated"] is False  # the input is not changed
    assert bound_hits(hits, 0, 0) == (hits, [])  # 0 = no limits


def test_bound_hits_fits_the_answer_budget_in_rank_order():
    short = {"id": 9, "text": "A short memory that fits.", "truncated": False}
    hits = [long_hit(1), long_hit(2), long_hit(3), long_hit(4), short]
    kept, left_out = bound_hits(hits, 1500, 700)  # each capped text is ~375 tokens
    tokens = [estimate_tokens(h["text"]) for h in kept]
    assert left_out == [] and [h["id"] for h in kept] == [1, 2, 3, 4, 9] and sum(tokens) <= 700
    assert kept[0]["text"] == cut_text(hits[0]["text"], 1500)[0]  # the first keeps its capped text
    # the second gets what is left less a share for each later hit (50, 50 and the short one whole)
    assert kept[1]["truncated"] and 700 - tokens[0] - 107 - 60 <= tokens[1] <= 700 - tokens[0] - 107
    assert all(RECALL_HIT_MIN_TOKENS // 2 <= n <= RECALL_HIT_MIN_TOKENS + 5 for n in tokens[2:4])
    assert kept[4] == short
    for h, whole in zip(kept[1:4], hits[1:4], strict=True):
        assert h["text"].endswith(".…") and whole["text"].startswith(h["text"][:-1])


@pytest.mark.parametrize("budget, count", [(4000, 10), (2000, 10), (1400, 5), (1000, 1)])
def test_bound_hits_stays_within_the_budget_and_leaves_out_the_tail(budget, count):
    chinese = [{"id": i, "text": "".join(f"第{i}条记录第{n}句话。" for n in range(300)),
                "truncated": False}
               for i in range(10)]
    # 1 token a character: each capped text ~1,500 tokens
    kept, left_out = bound_hits(chinese, 1500, budget)
    tokens = [estimate_tokens(h["text"]) for h in kept]
    assert [h["id"] for h in kept] == list(range(count)) and left_out == list(range(count, 10))
    assert sum(tokens) <= max(budget, tokens[0]) and all(h["truncated"] for h in kept)
    assert all(n >= RECALL_HIT_MIN_TOKENS // 2 for n in tokens)


def test_bound_hits_first_hit_alone_may_pass_the_budget():
    kept, left_out = bound_hits([long_hit(1), long_hit(2)], 1500, 100)
    assert [h["id"] for h in kept] == [1] and left_out == [2] and len(kept[0]["text"]) > 1000


def test_explain_parts_keys_values_and_route_weights():
    w = weights(spec={"doc_weight": 0.70, "graph_weight": 0.30})
    ranks, scores, confidence = channel_evidence(
        {"bm25": [row(1, 0, -2.0)], "graph_keyword": [row(1, 3, 1.0, confidence=0.7)]},
        w.graph_channels)
    parts = {1: candidate_score(candidate(1), ranks[1], scores, confidence[1], w, REF, False, 1.0,
                                0.42)}
    scale_routes(parts, w)
    fuse_scores(parts, {}, w)
    e = explain_parts(1, parts[1], scores, ALL, w, "factual", 0.61)
    assert list(e) == ["ranks", "scores", "fusion", "doc_rrf", "graph_rrf", "doc_relevance",
                       "graph_relevance", "neighbour", "importance", "recency", "confidence",
                       "temporal_factor", "frequency", "useful_count", "source_boost",
                       "pin_similarity", "doc_route", "graph_route", "route_weights", "doc_share",
                       "graph_share", "cross_route_bonus", "intent", "fused", "mmr", "cosine",
                       "margin", "cover", "evidence", "relevance"]
    assert e["ranks"] == {"bm25": 0, "vector": None, "graph_keyword": 3, "graph_vector": None}
    assert e["scores"] == {"bm25": 1.0, "graph_keyword": 1.0}
    assert e["route_weights"] == [0.70, 0.30]
    assert e["doc_rrf"] == pytest.approx((1 / 61) / (2 / 61))
    assert e["graph_rrf"] == pytest.approx((0.5 / 64) / (0.8 / 61))
    # one candidate, found by both routes: 0.7·1 + 0.3·1 + 0.08
    assert e["fused"] == pytest.approx(0.70 + 0.30 + 0.08) and e["cross_route_bonus"] == 0.08
    assert (e["doc_share"], e["graph_share"]) == pytest.approx((0.70, 0.30))  # what each route adds
    assert (e["fusion"], e["intent"], e["mmr"], e["pin_similarity"], e["confidence"]) \
        == ("score", "factual", 0.61, 0.42, 0.7)


# calibrated relevance ############################################################################

def test_token_cover_counts_query_tokens_of_a_script_the_memory_has():
    assert token_cover({"alice", "tea", "drink"}, {"alice", "likes", "tea"}) == pytest.approx(2 / 3)
    # an English question about a Chinese memory: no comparable word, no cover
    assert token_cover({"business", "trip"}, {"杭州", "出差"}) is None
    # a mixed memory: only the query's Chinese tokens are compared with a Chinese-only memory
    assert token_cover({"杭州", "trip"}, {"杭州", "出差"}) == 1.0
    # a Chinese question with Latin words about an English memory: 1 of its 5 words found, not
    # "half the question" because one of its 2 Latin words matched
    assert token_cover({"bart", "assistant", "环境", "味道", "丰富"},
                       {"assistant", "manager"}) == 0.2
    # single-character Chinese words are left out beside longer ones
    assert token_cover({"有", "安排"}, {"我", "有", "猫"}) == 0.0
    assert token_cover({"小明", "kyoto", "trip"}, {"小明", "kyoto", "visit"}) == \
        pytest.approx(2 / 3)
    assert token_cover(set(), {"a"}) is None
    # weighted: a shared everyday word covers less of the question than a telling one
    weight = {"妹妹": 4.0, "工作": 1.0}.get
    assert token_cover({"妹妹", "工作"}, {"预算", "工作"}, weight) == pytest.approx(0.2)
    assert token_cover({"妹妹", "工作"}, {"妹妹", "银行"}, weight) == pytest.approx(0.8)


def test_cross_cover_counts_a_questions_words_met_in_the_other_language():
    across = {"allergic": ("过敏",), "campus": ("学校", "校园"), "过敏": ("allergic", "allergy"),
              "国庆": ("national day",)}
    # an English question of a Chinese memory: allergic met (as a token), "cats" not
    assert aokun.cross_cover({"allergic", "cats"}, across, {"我", "对", "花生", "过敏"},
                             "我对花生过敏。") == pytest.approx(1 / 2)
    # a Chinese word met inside the text, though jieba cut it otherwise
    assert aokun.cross_cover({"campus"}, across, {"去", "学校门口"}, "去学校门口") == 1.0
    # an English phrase is met in the text; a single Chinese character is no word of the question
    assert aokun.cross_cover({"国庆", "去"}, across, {"the", "national", "day", "trip"},
                             "the national day trip") == 1.0
    # weighted like token_cover; none met is None, not 0: the memory proves nothing
    weight = {"过敏": 3.0, "什么": 1.0}.get
    assert aokun.cross_cover({"过敏", "什么"}, across, {"allergy"}, "allergy", weight) == 0.75
    assert aokun.cross_cover({"campus"}, across, {"我", "骑车"}, "我骑车") is None


def test_a_memory_without_words_has_none():
    assert not aokun.has_words(["👍"]) and not aokun.has_words(["42", "……"])
    assert not aokun.has_words([])
    assert aokun.has_words(["ok"]) and aokun.has_words(["好"])


def test_calibrated_relevance_is_the_fitted_logistic_and_none_when_uncalibrated():
    coef = {"w_margin": 100.0, "w_cover": 10.0, "bias": -85.0, "margin_only_w": 110.0,
            "margin_only_bias": -90.0}
    # z = 100·0.8 + 10·0.5 − 85 = 0: exactly one half
    assert calibrated_relevance(0.8, 0.5, coef) == pytest.approx(0.5)
    assert calibrated_relevance(0.85, 0.5, coef) == pytest.approx(1 / (1 + math.exp(-5.0)))
    # no comparable words: the margin-only weights, z = 110·0.8 − 90 = −2
    assert calibrated_relevance(0.8, None, coef) == pytest.approx(1 / (1 + math.exp(2.0)))
    assert calibrated_relevance(0.8, 0.5, None) is None  # the embedding model is not calibrated
    assert calibrated_relevance(None, 0.5, coef) is None  # the memory has no vector yet


# the whole chain, as Recall._fuse runs it #######################################################

def test_chain_two_channels_to_hits():
    chosen = ("bm25", "vector")
    w = Weights.of(recall_cfg(), {}, chosen)  # no graph channel: routes 1.0 / 0.0
    ranked = {"bm25": [row(1, 0, -6.0), row(2, 1, -4.5)],  # → 1: 1.0, 2: 0.75
              # sims .9 .7 .5 → 3: 1, 2: .5, 1: 0
              "vector": [row(3, 0, 0.1), row(2, 1, 0.3), row(1, 2, 0.5)]}
    ranks, scores, confidence = channel_evidence(ranked, w.graph_channels)
    rows = {1: candidate(1, importance=0.5), 2: candidate(2, importance=0.5),
            3: candidate(3, importance=0.9)}
    boost = {1: 1.0, 2: 0.9, 3: 1.0}  # 2 is an import
    parts = {i: candidate_score(d, ranks.setdefault(i, {}), scores, confidence.get(i), w, REF,
                                False, boost[i], None)
             for i, d in rows.items()}
    scale_routes(parts, w)
    order = fuse_scores(parts, {}, w)

    # relevance = mean of the two normalised scores; created now, never marked useful: recency 1
    # (× relevance), frequency 0
    doc = {1: 0.5 * 0.5 + 0.25 * 0.5 + 0.25 * 0.5,  # 0.5
           2: 0.5 * 0.625 + 0.25 * 0.5 + 0.25 * 0.625,  # 0.59375
           3: 0.5 * 0.5 + 0.25 * 0.9 + 0.25 * 0.5}  # 0.6
    for i in rows:
        assert parts[i]["doc_route"] == pytest.approx(doc[i])
        # 1: 0.833, 2: 0.891 (0.990 before the import discount), 3: 1.0
        assert parts[i]["fused"] == pytest.approx(doc[i] / 0.6 * boost[i])
    assert order == [3, 2, 1]

    pool = mmr_pool(order, parts, {}, max(3 * 2, aokun.MMR_POOL_MIN))
    tokens = {1: {"tea", "garden"}, 2: {"coffee"}, 3: {"tea", "cup"}}
    hits = select_hits(order, parts, tokens, {}, 2, w.mmr_lambda)
    assert pool == [3, 2, 1]
    # 3 first; then 1: 0.7·0.833 − 0.3·Jaccard(1,3)=1/3 → 0.483 vs 2: 0.7·0.891 − 0 = 0.623: 2 wins
    assert [i for i, _ in hits] == [3, 2]
    assert hits[1][1] == pytest.approx(0.7 * 0.59375 / 0.6 * 0.9)


def test_newer_first_puts_a_replaced_row_right_after_the_newer_at_the_first_place():
    rows = [{"id": i} for i in (1, 2, 3, 4)]
    order = lambda by: [d["id"] for d in aokun.newer_first(rows, by)]  # noqa: E731
    assert order({}) == [1, 2, 3, 4]
    assert order({1: 3}) == [3, 1, 2, 4]  # the older ranked higher: the pair takes its place
    assert order({3: 1}) == [1, 3, 2, 4]
    assert order({1: 4, 2: 4}) == [4, 1, 2, 3]  # two replaced by one, in their order
    assert order({1: 9}) == [1, 2, 3, 4]  # the newer is not among them


def test_a_lexicon_edited_empty_or_wrong_is_no_match_or_one_line(tmp_path):
    """rules/lexicon.toml is the user's to edit: an empty [words] finds no concept (the regex of no
    words matched the empty string everywhere), a word that is not a list is a one-line error."""
    (tmp_path / "rules").mkdir()
    ini = tmp_path / "aokun.ini"
    ini.write_text("[recall]\nlexicon = rules/lexicon.toml\n", encoding="utf-8")
    (tmp_path / "rules" / "lexicon.toml").write_text("[words]\n", encoding="utf-8")
    rules = aokun.Rules(aokun.load_config(str(ini)))
    assert rules.concepts("the National Day trip, 国庆") == set() and not rules.across("campus")
    (tmp_path / "rules" / "lexicon.toml").write_text('[words]\ntea = "tea"\n', encoding="utf-8")
    with pytest.raises(aokun.AokunError, match=r"^rules/lexicon.toml: \[words\] 'tea' is not"):
        aokun.Rules(aokun.load_config(str(ini)))
    (tmp_path / "rules" / "lexicon.toml").write_text('[words]\ntea = ["tea"', encoding="utf-8")
    with pytest.raises(aokun.AokunError, match=r"^rules/lexicon.toml is not valid TOML: Unclosed"):
        aokun.Rules(aokun.load_config(str(ini)))  # it was tomllib's traceback, naming no file
    shipped = aokun.Rules(aokun.Config(None))
    assert shipped.concepts("The National Day trip, 国庆去西安") == {
        "national_day", "travel", "alias:Xi'an"}  # rules/aliases.toml's names join
