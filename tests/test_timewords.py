"""Time words in a recall question (rules/timewords.toml): the pure window function with the clock
fixed, and end to end on a real temp file: a window boosts the memories from then (a boost, not a
filter), time words alone are answered from the window, as_of moves the reference."""

import datetime as dt
import math

import pytest

import aokun

NOW = "2026-11-30T08:00:00Z"  # a Monday; 16:00 in Shanghai
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def words():
    cfg = aokun.Config(None)
    return aokun.load_time_words(cfg.rule_file(cfg.recall.time_words))


def _days(start: str, end: str) -> tuple[str, str]:
    return f"{start}T00:00:00Z", f"{end}T00:00:00Z"


@pytest.mark.parametrize("query, start, end", [
    ("what happened yesterday?", "2026-11-29", "2026-11-30"),
    ("昨天我们聊了什么", "2026-11-29", "2026-11-30"),
    ("what did we say the day before yesterday", "2026-11-28", "2026-11-29"),
    ("前天", "2026-11-28", "2026-11-29"),
    ("anything new today", "2026-11-30", "2026-12-01"),
    ("今天", "2026-11-30", "2026-12-01"),
    ("what did I do 3 days ago", "2026-11-27", "2026-11-28"),
    ("three days ago", "2026-11-27", "2026-11-28"),
    ("三天前发生了什么", "2026-11-27", "2026-11-28"),
    ("3天前", "2026-11-27", "2026-11-28"),
    ("two weeks ago", "2026-11-13", "2026-11-20"),  # the day 14 days before ± 3 days
    ("两周前", "2026-11-13", "2026-11-20"),
    ("五个月前", "2026-06-23", "2026-07-14"),  # 150 days before ± 10
    ("last week", "2026-11-23", "2026-11-30"),
    ("上周", "2026-11-23", "2026-11-30"),
    ("上个星期", "2026-11-23", "2026-11-30"),
    ("this week", "2026-11-30", "2026-12-07"),
    ("本周", "2026-11-30", "2026-12-07"),
    ("last month", "2026-10-01", "2026-11-01"),
    ("上个月", "2026-10-01", "2026-11-01"),
    ("this month", "2026-11-01", "2026-12-01"),
    ("这个月", "2026-11-01", "2026-12-01"),
    ("last year", "2025-01-01", "2026-01-01"),
    ("去年", "2025-01-01", "2026-01-01"),
    ("this year", "2026-01-01", "2027-01-01"),
    ("今年", "2026-01-01", "2027-01-01"),
    ("what did we do in May", "2026-05-01", "2026-06-01"),
    ("五月", "2026-05-01", "2026-06-01"),
    ("in December", "2025-12-01", "2026-01-01"),  # the most recent December: last year's
    ("十二月", "2025-12-01", "2026-01-01"),
    ("in November", "2026-11-01", "2026-12-01"),  # this month counts as the most recent
    ("last November", "2025-11-01", "2025-12-01"),  # ... but "last" means before this one
    ("May last year", "2025-05-01", "2025-06-01"),
    ("去年五月", "2025-05-01", "2025-06-01"),
])
def test_time_window_of_each_phrase(monkeypatch, words, query, start, end):
    monkeypatch.setenv("AOKUN_NOW", NOW)
    got = aokun.time_window(query, aokun.now(), words, UTC)
    assert got is not None and got[:2] == _days(start, end), got


@pytest.mark.parametrize("query, start, end", [
    ("What are my plans in February?", "2027-02-01", "2027-03-01"),  # plans: the coming one
    ("二月份有什么计划？", "2027-02-01", "2027-03-01"),
    ("What were my plans in March?", "2026-03-01", "2026-04-01"),  # ... unless they were
    ("What did I do in February?", "2026-02-01", "2026-03-01"),
])
def test_a_month_of_plans_is_the_coming_one(monkeypatch, mem, query, start, end):
    monkeypatch.setenv("AOKUN_NOW", NOW)  # the tense of a question, as recall reads it
    got = aokun.time_window(query, aokun.now(), mem.rules.time_words, UTC)
    assert got is not None and got[:2] == _days(start, end), got


def test_last_night_is_the_evening_before(monkeypatch, words):
    monkeypatch.setenv("AOKUN_NOW", NOW)
    for q in ("what did we talk about last night", "昨晚"):
        assert aokun.time_window(q, aokun.now(), words, UTC)[:2] == ("2026-11-29T18:00:00Z",
                                                                     "2026-11-30T06:00:00Z")


def test_windows_are_local_days_of_the_timezone(monkeypatch, words):
    monkeypatch.setenv("AOKUN_NOW", NOW)
    # 16:00 there: its yesterday starts at 16:00Z two days back
    shanghai = aokun.local_tz("Asia/Shanghai")
    assert aokun.time_window("yesterday", aokun.now(), words, shanghai) == (
        "2026-11-28T16:00:00Z", "2026-11-29T16:00:00Z", "yesterday")


def test_the_phrase_is_returned_and_the_longest_rule_wins(words):
    ref = aokun.parse_time(NOW)
    assert aokun.time_window("what did Caroline do the day before yesterday?", ref, words, UTC)[2] \
        == "the day before yesterday"
    assert aokun.time_window("去年五月去了哪里", ref, words, UTC)[2] == "去年五月"
    assert aokun.time_window("in May", ref, words, UTC).keep_words
    assert not aokun.time_window("3 days ago", ref, words, UTC).keep_words


@pytest.mark.parametrize("query", ["when did we meet", "may I ask about painting",
                                   "what happened in May 2025", "几月去的", "a day at the lake",
                                   "2025年五月", "last time we spoke"])
def test_no_window_without_relative_time_words(words, query):
    assert aokun.time_window(query, aokun.parse_time(NOW), words, UTC) is None


def test_as_of_is_the_reference(words):
    as_of = aokun.parse_time("2023-07-01T12:00:00Z")
    assert aokun.time_window("yesterday", as_of, words, UTC)[:2] == \
        _days("2023-06-30", "2023-07-01")


# end to end ------------------------------------------------------------------------------------

def _at(day: str) -> str:
    return f"{day}T12:00:00Z"


@pytest.fixture
def dated(open_mem, tmp_path, monkeypatch):
    """Memories on several dates (UTC days), the clock at NOW: {day or key: id}."""
    monkeypatch.setenv("AOKUN_NOW", NOW)
    cfg = aokun.Config(None, overrides={("forgetting", "timezone"): "UTC"})
    m = open_mem(tmp_path / "tw.db", cfg=cfg)
    ids = {}
    for key, day, text in [
            ("fence", "2026-11-29", "We repaired the garden fence and planted tulips."),
            ("anna", "2026-11-27",
             "Dinner with Anna at the noodle bar, she talked about her trip to Kyoto."),
            ("ben", "2026-11-28",
             "Dinner with Ben at the pizza place, he talked about his new job."),
            ("安娜", "2026-11-27", "和安娜一起吃晚饭，她聊了京都的旅行。"),
            ("本", "2026-11-28", "和本一起吃晚饭，他聊了新工作。"),
            ("novel", "2026-10-20", "Read a novel about the sea; the garden needs watering."),
            ("budget", "2026-11-30", "Meeting about the quarterly budget with the finance team."),
            ("hike", "2026-05-12", "Hiked the garden trail near the lake with Anna."),
            ("piano", "2025-05-03", "Moved the piano into the new flat.")]:
        ids[key] = m.memorize(text, {"timestamp": _at(day)})["id"]
    return m, ids


@pytest.mark.parametrize("query, phrase", [("what happened yesterday?", "yesterday"),
                                           ("anything from yesterday", "yesterday"),
                                           ("昨天发生了什么", "昨天")])
def test_time_words_alone_answer_from_the_window(dated, query, phrase):
    m, ids = dated
    r = m.recall(query, explain=True)
    assert r["results"], r["warnings"]
    top = r["results"][0]
    assert top["id"] == ids["fence"]
    assert "time_window" in top["channels"]
    assert top["explain"]["time_window"] == {"start": "2026-11-29T00:00:00Z",
                                             "end": "2026-11-30T00:00:00Z",
                                             "phrase": phrase}
    assert top["explain"]["time_boost"] == m.cfg.recall.time_window_boost


@pytest.mark.slow
def test_memories_of_the_window_pass_the_relevance_gate(dated):
    m, ids = dated
    m.rules.relevance[m.embedder.model] = {"w_margin": 0.0, "w_cover": 0.0,
                                           "bias": -50.0,  # nothing passes
                                           "margin_only_w": 0.0, "margin_only_bias": -50.0}
    assert [h["id"] for h in m.recall("yesterday")["results"]] == [ids["fence"]]
    assert [h["id"] for h in m.recall("what happened yesterday")["results"]] == [ids["fence"]]
    assert [h["id"] for h in m.recall("garden yesterday")["results"]] == [ids["fence"]]
    # a general question is not about every memory of its day
    assert m.recall("what was the weather like yesterday?")["results"] == []
    assert m.recall("garden")["results"] == []  # without time words the gate holds


def test_the_window_channel_keeps_to_persona_session_and_archive(dated):
    m, ids = dated
    other = m.memorize("Yesterday in another persona.",
                       {"timestamp": _at("2026-11-29"), "persona_id": "work"})["id"]
    in_session = m.memorize("A chat in session s1.",
                            {"timestamp": _at("2026-11-29"), "session_id": "s1"})["id"]
    m.set_flag(ids["fence"], "archived", True)
    assert {h["id"] for h in m.recall("yesterday")["results"]} == {in_session}
    assert {h["id"] for h in m.recall("yesterday", include_archived=True)["results"]} == \
        {in_session, ids["fence"]}
    assert {h["id"] for h in m.recall("yesterday", session_id="s1")["results"]} == {in_session}
    assert {h["id"] for h in m.recall("yesterday", persona_id="work")["results"]} == {other}


def test_no_searchable_words_and_no_time_words_is_unchanged(dated):
    m, _ = dated
    r = m.recall("what did we do")
    assert r["results"] == [] and r["warnings"] == ["the query has no searchable words"]


@pytest.mark.parametrize("query, key", [("who did I have dinner with 3 days ago", "anna"),
                                        ("三天前和谁吃晚饭", "安娜")])
def test_n_days_ago_boosts_the_memory_from_then(dated, query, key):
    m, ids = dated
    r = m.recall(query, explain=True)
    # that day's dinner, in either language (晚饭 is dinner: rules/lexicon.toml)
    assert r["results"][0]["id"] in {ids["anna"], ids["安娜"]}
    # the same words, the day after: newer, but not when asked
    rival = ids["ben" if key == "anna" else "本"]
    assert rival in {h["id"] for h in r["results"]}
    boosted = {h["id"] for h in r["results"] if h["explain"]["time_boost"] > 0}
    assert boosted <= {ids["anna"], ids["安娜"]} and ids[key] in boosted


def test_a_boost_not_a_filter(dated):
    m, ids = dated
    r = m.recall("garden last month", k=5, explain=True)
    got = [h["id"] for h in r["results"]]
    assert got[0] == ids["novel"]  # the garden memory of last month first
    assert ids["fence"] in got and ids["hike"] in got  # other garden memories still answered
    assert r["results"][0]["explain"]["time_boost"] > 0
    assert all(h["explain"]["time_boost"] == 0 for h in r["results"] if h["id"] != ids["novel"])


def test_named_month_keeps_its_words_and_last_year(dated):
    m, ids = dated
    assert m.recall("where did we hike in May", explain=True)["results"][0]["id"] == ids["hike"]
    r = m.recall("去年五月", explain=True)
    assert r["results"][0]["id"] == ids["piano"]
    assert r["results"][0]["explain"]["time_window"]["start"] == "2025-05-01T00:00:00Z"


def test_as_of_moves_the_reference(dated):
    m, ids = dated
    r = m.recall("what happened yesterday", as_of="2026-11-28T09:00:00Z", explain=True)
    assert r["results"][0]["id"] in (ids["anna"], ids["安娜"])  # the 27th: yesterday as of the 28th
    assert r["results"][0]["explain"]["time_window"]["start"] == "2026-11-27T00:00:00Z"
    # as_of still holds: the memories of the 28th on did not exist yet
    assert not {ids["fence"], ids["ben"], ids["budget"]} & {h["id"] for h in r["results"]}


def test_query_without_time_words_is_unchanged(dated):
    m, ids = dated
    r = m.recall("garden", k=5, explain=True)
    assert all("time_window" not in h["channels"] and "time_window" not in h["explain"]
               for h in r["results"])
    # the same answer as with the boost switched off: without time words nothing changes
    off = aokun.Config(None, overrides={("forgetting", "timezone"): "UTC",
                                        ("recall", "time_window_boost"): 0.0})
    m.cfg = off
    m._recall_cache.clear()
    assert [h["id"] for h in m.recall("garden", k=5)["results"]] == [h["id"] for h in r["results"]]


def test_window_distance_is_zero_inside_and_days_outside():
    window = ("2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z", "yesterday")
    for at, days in (("2026-11-29T23:00:00Z", 0.0), ("2026-11-27T00:00:00Z", 2.0),
                     ("2026-11-30T12:00:00Z", 0.5)):
        assert aokun.window_distance_days(at, at, window) == days
    assert aokun.window_distance_days("2026-11-20T00:00:00Z", "2026-11-29T12:00:00Z", window) == 0


def test_candidate_score_and_fuse_add_the_time_boost():
    w0 = aokun.Weights.of(aokun.Config(None).recall, {}, aokun.Recall.CHANNELS)
    w = aokun.Weights.of(aokun.Config(None).recall, {}, aokun.Recall.CHANNELS,
                         ("2026-11-29T00:00:00Z", "2026-11-30T00:00:00Z", "yesterday"))
    assert w0.time_boost == 0.0 and w.time_boost == 0.25
    ref = aokun.parse_time(NOW)
    row = {"id": 1, "importance": 0.5, "created_at": "2026-11-29T12:00:00Z", "useful_count": 0,
           "last_useful_at": None, "temporal_factor": 1.0, "source": "chat"}
    inside = aokun.candidate_score(row, {}, {}, None, w, ref, False, 1.0, None)
    outside = aokun.candidate_score(dict(row, id=2, created_at="2026-11-30T00:00:00Z"), {}, {},
                                    None, w, ref, False, 1.0, None)
    # the end is exclusive
    assert inside["time_boost"] == 0.25 and outside["time_boost"] == 0.0
    # days from the window, not from now
    assert inside["recency"] == 1.0 and outside["recency"] == 1.0
    far = aokun.candidate_score(dict(row, id=3, created_at="2026-10-30T00:00:00Z"), {}, {}, None,
                                w, ref, False, 1.0, None)
    assert far["recency"] == pytest.approx(math.exp(-30 / w.recency_days))
    parts = {1: inside, 2: outside}
    aokun.scale_routes(parts, w)
    aokun.fuse_scores(parts, {}, w)
    assert parts[1]["fused"] == pytest.approx(parts[1]["routes"] + 0.25)
    assert parts[2]["fused"] == pytest.approx(parts[2]["routes"])


@pytest.mark.slow
def test_with_the_real_model_time_words_answer_despite_the_relevance_gate(open_mem, tmp_path,
                                                                          monkeypatch):
    """With a calibrated embedding model a question like 'what happened yesterday' is relevant to
    nothing by its words; yesterday's memories still answer it, and only they."""
    monkeypatch.setenv("AOKUN_NOW", NOW)
    m = open_mem(tmp_path / "real.db", embedder=aokun.LocalEmbedder(),
                 cfg=aokun.Config(None, overrides={("forgetting", "timezone"): "UTC"}))
    assert m.embedder.model in m.rules.relevance  # the gate is on
    fence = m.memorize("We repaired the garden fence and planted tulips.",
                       {"timestamp": _at("2026-11-29")})["id"]
    m.memorize("Budget meeting with the finance team.", {"timestamp": _at("2026-11-20")})
    for q in ("what happened yesterday", "昨天发生了什么"):
        assert [h["id"] for h in m.recall(q)["results"]] == [fence], q
    assert m.recall("what happened")["results"] == []  # no time words: nothing relevant, as before


@pytest.mark.slow
def test_a_day_asked_gets_that_days_events_not_another_days(open_mem, tmp_path, monkeypatch):
    """A question naming a date is asked of that day (the new-user trial): a memory of another day
    is no answer however alike its words ("Dec 10", ending as Dec 11 starts, is not Dec 11); a plan
    moved is on its new day; a memory of no date may still come after the day's."""
    monkeypatch.setenv("AOKUN_NOW", "2026-12-07T10:00:00Z")  # a Monday
    m = open_mem(tmp_path / "real.db", embedder=aokun.LocalEmbedder(),
                 cfg=aokun.Config(None, overrides={("forgetting", "timezone"): "UTC"}))
    ids = [m.memorize(text, {"timestamp": at})["id"] for text, at in (
        ("Sophie's school play is next Friday.", "2026-12-02T18:00:00Z"),  # Dec 11
        ("The knee check-up has been moved to Thursday Dec 10.", "2026-12-06T13:00:00Z"),
        ("Dinner with Lin Mei's parents on Dec 20 at 7pm.", "2026-12-05T16:00:00Z"),
        ("下周三要交房租。", "2026-12-06T10:00:00Z"),  # Wednesday Dec 9
        ("My passport expires on 05/06/2028.", "2026-12-07T09:00:00Z"),
        ("Book club on Dec 28 is moved to the 30th.", "2026-12-07T09:30:00Z"))]  # its day: 30th
    dated = set(ids[:4])
    for query, day in (("What is happening on December 11?", ids[0]),
                       ("12月11日有什么安排？", ids[0]), ("What's on Dec 20?", ids[2]),
                       ("12月20日有什么事？", ids[2]), ("What's on Wednesday the 16th?", None),
                       ("12月16日有什么安排？", None), ("What's on Dec 30?", ids[5]),
                       ("12月30日有什么安排？", ids[5])):
        got = [h["id"] for h in m.recall(query)["results"]]
        assert got[:1] == [day] if day else True, (query, got)
        assert not set(got) & (dated - {day}), (query, got)
