"""Event dates in a memory's text (rules/dates.toml): the pure resolver for every date form, then on
real temp files with $AOKUN_NOW: a planned atom expires after its event (not after its type's
short TTL), forget_preview and search_atoms follow, a past event is dated in the past, the event
time survives export/import, and a time question finds a memory by its event time."""

import datetime as dt
import json

import pytest

import aokun

UTC = dt.timezone.utc
TUESDAY = "2026-12-01T10:00:00Z"  # a Tuesday


@pytest.fixture(scope="module")
def words():
    cfg = aokun.Config(None)
    return aokun.load_event_dates(cfg.rule_file(cfg.write.event_dates))


def _utc(cfg_text: str, tmp_path):
    """A Config whose [forgetting] timezone is UTC (calendar days as the tests write them)."""
    ini = tmp_path / "aokun.ini"
    ini.write_text("[forgetting]\ntimezone = UTC\n" + cfg_text, encoding="utf-8")
    return aokun.Config(ini)


@pytest.mark.parametrize("text, written, day, end", [
    ("The Falcon launch deadline is 2027-01-15.", "2026-12-02T10:00:00Z", "2027-01-15",
     "2027-01-16"),
    ("Deadline: Jan 15 2027", TUESDAY, "2027-01-15", "2027-01-16"),
    ("due January 15th, 2027", TUESDAY, "2027-01-15", "2027-01-16"),
    ("due 15 January 2027", TUESDAY, "2027-01-15", "2027-01-16"),
    ("due 15/01/2027", TUESDAY, "2027-01-15", "2027-01-16"),  # day first: 15 is no month
    ("due 01/15/2027", TUESDAY, "2027-01-15", "2027-01-16"),  # month first: 15 is no month
    ("截止日期是2027年1月15日", TUESDAY, "2027-01-15", "2027-01-16"),
    ("2027年一月十五日交稿", TUESDAY, "2027-01-15", "2027-01-16"),
    ("1月15日交报告", TUESDAY, "2027-01-15", "2027-01-16"),  # no year: the nearest January 15
    ("11月20日我们见过", TUESDAY, "2026-11-20", "2026-11-21"),  # ... which may be behind
    ("see you tomorrow", TUESDAY, "2026-12-02", "2026-12-03"),
    ("我明天去北京", TUESDAY, "2026-12-02", "2026-12-03"),
    ("后天开会", TUESDAY, "2026-12-03", "2026-12-04"),
    ("let's meet next Wednesday", TUESDAY, "2026-12-09", "2026-12-10"),  # next week's Wednesday
    ("我下周三去上海出差", TUESDAY, "2026-12-09", "2026-12-10"),
    ("we fly in 3 days", TUESDAY, "2026-12-04", "2026-12-05"),
    ("三天后去杭州", TUESDAY, "2026-12-04", "2026-12-05"),
    ("月底交房租", TUESDAY, "2026-12-31", "2027-01-01"),
    ("the report is due at the end of the month", TUESDAY, "2026-12-31", "2027-01-01"),
    ("下个月去日本", TUESDAY, "2027-01-01", "2027-02-01"),
    ("we moved last May", TUESDAY, "2026-05-01", "2026-06-01"),
    ("我们去年五月搬家了", TUESDAY, "2025-05-01", "2025-06-01"),
    ("I saw her 2 weeks ago", TUESDAY, "2026-11-17", "2026-11-18"),
    ("next week I start", TUESDAY, "2026-12-07", "2026-12-14"),
])
def test_every_date_form_resolves_against_the_memory_time(words, text, written, day, end):
    spans = aokun.event_spans(text, written, words, UTC)
    assert spans and spans[0][:2] == (f"{day}T00:00:00Z", f"{end}T00:00:00Z"), spans


@pytest.mark.parametrize("text", ["due 03/04/2027", "I may come", "she said the 5 was late",
                                  "你好"])
def test_ambiguous_or_no_dates_give_nothing(words, text):
    assert aokun.event_spans(text, TUESDAY, words, UTC) == []


def test_a_full_date_is_one_mention(words):
    assert [p for *_, p in aokun.event_spans("截止2027年1月15日", TUESDAY, words, UTC)] == \
        ["2027年1月15日"]


def test_the_local_calendar_decides_the_day(words):
    # 23:30 UTC on Tuesday is Wednesday in Shanghai: "tomorrow" is Thursday there
    spans = aokun.event_spans("tomorrow", "2026-12-01T23:30:00Z", words,
                              aokun.local_tz("Asia/Shanghai"))
    assert spans[0][:2] == ("2026-12-02T16:00:00Z", "2026-12-03T16:00:00Z")


def test_zh_number():
    numbers = ("15", "十", "十五", "二十", "三十一", "两", "百")
    assert [aokun.zh_number(x) for x in numbers] == [15, 10, 15, 20, 31, 2, None]


def _atom(mem, doc_id):
    return mem.rows("select atom_type, expires_at from memory_atoms where document_id = ?",
                    (doc_id,))[0]


@pytest.mark.parametrize("text, written, expires", [
    ("The Falcon launch deadline is 2027-01-15.", "2026-12-02T10:00:00Z", "2027-01-17T00:00:00Z"),
    ("我下周三去上海出差", TUESDAY, "2026-12-11T00:00:00Z"),  # the trip is Wednesday the 9th
    ("Remind me: dentist appointment 15/01/2027", TUESDAY, "2027-01-17T00:00:00Z"),
    ("打算1月15日交报告", TUESDAY, "2027-01-17T00:00:00Z"),
    ("we will fly in 3 days", TUESDAY, "2026-12-06T00:00:00Z"),
    ("我打算三天后去杭州", TUESDAY, "2026-12-06T00:00:00Z"),
    ("月底前我要去交房租", TUESDAY, "2027-01-02T00:00:00Z"),
    ("I'll call mum tomorrow", TUESDAY, "2026-12-04T00:00:00Z"),
])
def test_a_planned_atom_expires_after_its_event(open_mem, tmp_path, monkeypatch, text, written,
                                                expires):
    monkeypatch.setenv("AOKUN_NOW", written)
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize(text, {"timestamp": written})["id"]
    atom = _atom(mem, doc)
    assert atom == {"atom_type": "planned", "expires_at": expires}
    # the day before the event ends it is still there; the grace after it, it is gone
    day_before = aokun.iso(aokun.parse_time(expires) - dt.timedelta(days=2, hours=1))
    monkeypatch.setenv("AOKUN_NOW", day_before)
    assert mem.search_atoms(text, k=3)["results"], "the plan is found before its event"
    monkeypatch.setenv("AOKUN_NOW", aokun.iso(aokun.parse_time(expires) + dt.timedelta(hours=1)))
    assert not mem.search_atoms(text, k=3)["results"], "and not after it"


def test_a_title_or_an_initial_ends_no_fact():
    said = "I work as a nurse at St. Mary's Hospital. Dr. Li met J. K. Rowling. 我在利兹。"
    assert aokun.split_sentences(said, 9) == [
        "I work as a nurse at St. Mary's Hospital.", "Dr. Li met J. K. Rowling.", "我在利兹。"]


def test_forget_preview_waits_for_the_event(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", "2026-12-02T10:00:00Z")
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize("The Falcon launch deadline is 2027-01-15.",
                       {"timestamp": "2026-12-02T10:00:00Z"})["id"]
    zh = mem.memorize("我下周三去上海出差", {"timestamp": TUESDAY})["id"]
    atoms = {d: mem.value("select id from memory_atoms where document_id = ?", (d,))
             for d in (doc, zh)}

    def offered(days):
        return {a["id"] for a in mem.forget_preview(days)["atoms"]}

    assert not offered(7) & set(atoms.values())  # the old TTL of 2 days would have offered both
    # Friday the 11th: the trip is over
    assert atoms[zh] in offered(9) and atoms[doc] not in offered(9)
    assert atoms[doc] in offered(46)  # 2027-01-17


def test_without_a_date_a_plan_keeps_its_ttl(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize("I plan to repaint the fence",
                       {"timestamp": TUESDAY, "importance": 0.5})["id"]
    # 2 d × (0.5 + 0.5)
    assert _atom(mem, doc) == {"atom_type": "planned", "expires_at": "2026-12-03T10:00:00Z"}


@pytest.mark.parametrize("text, day", [("we moved last May", "2026-05-01"),
                                       ("我们去年五月搬家了", "2025-05-01")])
def test_a_past_event_is_dated_in_the_past(open_mem, tmp_path, monkeypatch, text, day):
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize(text, {"timestamp": TUESDAY})["id"]
    row = mem.rows("select event_at from documents where id = ?", (doc,))[0]
    assert row["event_at"] == f"{day}T00:00:00Z" < TUESDAY
    assert _atom(mem, doc)["atom_type"] != "planned"


def test_a_repeat_does_not_move_the_deadline_earlier(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", "2026-12-05T10:00:00Z")
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    first = mem.memorize("The Falcon launch deadline is 2027-01-15.",
                         {"timestamp": "2026-12-02T10:00:00Z"})["id"]
    mem.memorize("Reminder: the Falcon launch deadline is 2027-01-15!",
                 {"timestamp": "2026-12-05T10:00:00Z"})
    rows = mem.rows("select reinforcement_count, expires_at from memory_atoms "
                    "where document_id = ?", (first,))
    assert rows == [{"reinforcement_count": 1, "expires_at": "2027-01-17T00:00:00Z"}]


def test_export_and_import_carry_the_event(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    cfg = _utc("", tmp_path)
    src = open_mem(tmp_path / "a.db", cfg=cfg)
    src.memorize("我下周三去上海出差", {"timestamp": TUESDAY})
    lines = [json.dumps(r, ensure_ascii=False) for r in src.export_records()]
    dst = open_mem(tmp_path / "b.db", cfg=cfg)
    dst.import_export(lines)
    assert dst.rows("select event_at, event_end from documents") == [
        {"event_at": "2026-12-09T00:00:00Z", "event_end": "2026-12-10T00:00:00Z"}]
    assert dst.rows("select expires_at from memory_atoms") == \
        [{"expires_at": "2026-12-11T00:00:00Z"}]


@pytest.mark.parametrize("query", ["What's on next week?", "下周有什么安排"])
def test_a_time_question_finds_the_plan_by_its_event(open_mem, tmp_path, monkeypatch, query):
    monkeypatch.setenv("AOKUN_NOW", "2026-12-04T09:00:00Z")  # Friday: next week is the trip's week
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    trip = mem.memorize("我下周三去上海出差", {"timestamp": TUESDAY})["id"]
    mem.memorize("我喜欢喝拿铁咖啡", {"timestamp": "2026-12-03T09:00:00Z"})
    mem.memorize("Lunch with Ana was nice", {"timestamp": "2026-12-03T12:00:00Z"})
    out = mem.recall(query, k=3, explain=True)
    hit = next(h for h in out["results"] if h["id"] == trip)
    assert out["results"][0]["id"] == trip
    assert "time_window" in hit["channels"]
    assert hit["explain"]["time_match"] == "event"
    assert hit["explain"]["time_window"]["start"] == "2026-12-07T00:00:00Z"


def test_explain_says_written_when_made_in_the_window(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", "2026-12-02T09:00:00Z")
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize("I baked bread", {"timestamp": TUESDAY})["id"]
    hit = next(h for h in mem.recall("what did I do yesterday", k=3, explain=True)["results"]
               if h["id"] == doc)
    assert hit["explain"]["time_match"] == "written"


def test_rebuild_graph_dates_memories_stored_before_schema_16(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    mem.memorize("我下周三去上海出差", {"timestamp": TUESDAY})
    with mem.tx() as c:  # what a file migrated from schema 15 holds
        c.execute("update documents set event_at = null, event_end = null")
    mem.rebuild(graph=True)
    assert mem.rows("select event_at from documents") == [{"event_at": "2026-12-09T00:00:00Z"}]


def test_sync_carries_the_event(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    cfg = _utc("", tmp_path)
    a, b = open_mem(tmp_path / "a.db", cfg=cfg), open_mem(tmp_path / "b.db", cfg=cfg)
    a.memorize("The Falcon launch deadline is 2027-01-15.", {"timestamp": TUESDAY})
    share = tmp_path / "share"
    share.mkdir()
    a.sync(share)
    b.sync(share)
    assert b.rows("select event_at from documents") == [{"event_at": "2027-01-15T00:00:00Z"}]
    assert b.rows("select atom_type, expires_at from memory_atoms") == [
        {"atom_type": "planned", "expires_at": "2027-01-17T00:00:00Z"}]


def test_a_past_dated_deadline_stays_searchable(open_mem, tmp_path, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize("The Falcon deadline was 2025-01-15", {"timestamp": TUESDAY})["id"]
    atom = _atom(mem, doc)
    assert atom["atom_type"] != "planned" and atom["expires_at"] > TUESDAY
    monkeypatch.setenv("AOKUN_NOW", "2026-12-02T10:00:00Z")
    assert mem.search_atoms("Falcon deadline", k=3)["results"]


@pytest.mark.parametrize("text, atom_type, event", [
    ("上个月15号已经交了", "not planned", "2026-11-15"),  # a past event
    ("三天后交季度报告", "planned", "2026-12-04"),  # no plan word: a future day and a thing to do
    ("下下周三去上海出差", "planned", "2026-12-16"),
])
def test_tense_decides_the_role(open_mem, tmp_path, monkeypatch, text, atom_type, event):
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize(text, {"timestamp": TUESDAY})["id"]
    got = _atom(mem, doc)
    assert (got["atom_type"] == "planned") == (atom_type == "planned"), got
    assert got["expires_at"] > TUESDAY  # never before the memory was written
    assert mem.rows("select event_at from documents")[0]["event_at"] == f"{event}T00:00:00Z"


def test_a_lunar_birthday_plan_expires_after_its_solar_day_next_year(open_mem, tmp_path,
                                                                      monkeypatch):
    written = "2026-10-01T10:00:00Z"  # after this year's 中秋 (2026-09-25)
    monkeypatch.setenv("AOKUN_NOW", written)
    mem = open_mem(tmp_path / "t.db", cfg=_utc("", tmp_path))
    doc = mem.memorize("农历八月十五要给妈妈过生日", {"timestamp": written})["id"]
    # lunar 8/15 of 2027 is 2027-09-15 (lunar-python): + 1 day + 1 day of grace
    assert _atom(mem, doc) == {"atom_type": "planned", "expires_at": "2027-09-17T00:00:00Z"}
    monkeypatch.setenv("AOKUN_NOW", "2027-09-16T12:00:00Z")
    assert mem.search_atoms("给妈妈过生日", k=3)["results"]
    monkeypatch.setenv("AOKUN_NOW", "2027-09-17T01:00:00Z")
    assert not mem.search_atoms("给妈妈过生日", k=3)["results"]


def test_show_and_explain_say_an_ambiguous_date_was_skipped(open_mem, tmp_path, monkeypatch):
    from click.testing import CliRunner
    monkeypatch.setenv("AOKUN_NOW", TUESDAY)
    db, cfg = tmp_path / "t.db", _utc("", tmp_path)
    mem = open_mem(db, cfg=cfg)
    doc = mem.memorize("Meet the Falcon auditors on 03/04/2027", {"timestamp": TUESDAY})["id"]
    assert mem.rows("select event_at from documents") == [{"event_at": None}]  # not guessed
    why = ["03/04/2027: ambiguous: day and month could be either"]
    assert mem.get(doc)["dates_skipped"] == why
    hit = mem.recall("Falcon auditors", k=3, explain=True)["results"][0]
    assert hit["explain"]["dates_skipped"] == why
    mem.close()
    out = CliRunner().invoke(aokun.cli, ["--db", str(db), "--config", str(tmp_path / "aokun.ini"),
                                         "show", str(doc)])
    assert out.exit_code == 0 and "dates_skipped" in out.output and "ambiguous" in out.output
