"""Forgetting and lifecycle: daily importance decay (formula, schedule, catch-up, decay time,
pins), the atom state machine (expired → forgotten → purged, planned atoms, supersession),
auto-archival, dry runs that change nothing, online/daily/version backups, restore, forget_preview
and the CLI. The clock is stepped through $AOKUN_NOW; everything runs in UTC."""

import datetime as dt
import hashlib
import json
import math
import shutil
import threading
import time
from pathlib import Path

import apsw
import pytest
from click.testing import CliRunner

import aokun
from fakes import count, table_counts

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.timezone.utc)
MUSEUM = "Yesterday I visited the science museum with Tom."  # an episodic fact (base TTL 7 days)
DENTIST = "I will call the dentist tomorrow."  # a planned fact (step decay) with an event: March 2


# fixtures and helpers ----------------------------------------------------------------------------

class Clock:
    """Sets $AOKUN_NOW, the one clock aokun.now() reads."""

    def __init__(self, monkeypatch):
        self.mp, self.t = monkeypatch, None

    def set(self, t: dt.datetime) -> dt.datetime:
        self.t = t
        self.mp.setenv("AOKUN_NOW", aokun.iso(t))
        return t

    def advance(self, **delta) -> dt.datetime:
        return self.set(self.t + dt.timedelta(**delta))


@pytest.fixture
def clock(monkeypatch):
    c = Clock(monkeypatch)
    c.set(T0)
    return c


@pytest.fixture
def cfg_of(tmp_path):
    """cfg_of(**{"section.key": value}) -> Config: UTC decay times, backups into tmp_path/bk."""
    def make(**more):
        overrides = {("forgetting", "timezone"): "UTC", ("backup", "dir"): str(tmp_path / "bk")}
        overrides.update({tuple(k.split(".")): v for k, v in more.items()})
        return aokun.Config(None, overrides=overrides)
    return make


@pytest.fixture
def make(tmp_path, cfg_of, open_mem):
    """make(path=None, cfg=None, **settings) -> Memory with the fake 16-d embedder and the session's
    jieba; every Memory opened is closed after the test."""
    return lambda path=None, cfg=None, **more: open_mem(path or tmp_path / "f.db",
                                                        cfg=cfg or cfg_of(**more))


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def dump(path: Path) -> dict:
    """Every row of the tables forgetting touches, read with a plain read-only connection."""
    c = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {t: list(c.execute(f"select * from {t} order by {order}")) for t, order in (
            ("documents", "id"), ("memory_atoms", "id"), ("memory_atoms_fts", "rowid"),
            ("atom_sources", "atom_id, document_id"), ("meta", "key"))}
    finally:
        c.close()


def atom(m, atom_id):
    rows = m.rows("select * from memory_atoms where id = ?", (atom_id,))
    return rows[0] if rows else None


def atom_ids(m, doc_id):
    return [r["atom_id"]
            for r in m.rows("select atom_id from atom_sources where document_id = ? order by "
                            "atom_id",
                                         (doc_id,))]


def found(m, query, atom_id) -> bool:
    return atom_id in [r["id"] for r in m.search_atoms(query, k=20)["results"]]


class DecayModel:
    """The seed's decay formula, in Python, one memory at a time."""

    def __init__(self, importance, access_count=0.0, last_access_at=None, pinned=False):
        self.importance, self.access_count = importance, access_count
        self.last, self.pinned = last_access_at, pinned

    def day(self, day: dt.date, rate=0.01, window_days=30, multiplier=0.5, hour=0, minute=5):
        at = dt.datetime.combine(day, dt.time(hour, minute), dt.timezone.utc)
        since = at - dt.timedelta(days=window_days)
        recent = self.access_count if self.last and aokun.parse_time(self.last) >= since else 0
        effective = rate * max(0.3, 1 - 0.1 * min(recent, 10))
        if not self.pinned and self.importance > 0.05:
            self.importance = max(0.05, self.importance * (1 - effective))
        self.access_count *= multiplier


# decay -------------------------------------------------------------------------------------------

def test_decay_follows_the_formula_for_accessed_and_unaccessed_memories(make, clock):
    m = make()
    spec = {  # content: (importance, access_count, last_access_at)
        "Never accessed, about green tea.": (0.8, 0, None),
        "Accessed six times yesterday, about coffee.": (0.6, 6, "2026-02-28T10:00:00Z"),
        # outside the 30-day window
        "Accessed long ago, about orange juice.": (0.7, 6, "2026-01-01T00:00:00Z"),
        # in for 3 days
        "Accessed until the window passes it, about cocoa.": (0.7, 4, "2026-02-03T00:00:00Z"),
        # min(.,10) -> 0.3 floor
        "Accessed very often, about water.": (0.9, 25, "2026-03-01T09:00:00Z"),
        "Nearly forgotten, about lemonade.": (0.0502, 0, None),  # hits the 0.05 floor
        # below the floor: untouched
        "At the floor already, about milk.": (0.04, 3, "2026-03-01T09:00:00Z"),
    }
    ids, model = {}, {}
    for text, (importance, _, _) in spec.items():
        ids[text] = m.memorize(text, {"importance": importance})["id"]
    # starts the schedule
    assert m.decay() == {"days": [], "importance": [], "archived": [], "dry_run": False}
    assert m.meta_get("decay_last_run") == "2026-03-01"
    with m.tx() as c:
        for text, (importance, n, last) in spec.items():
            c.execute("update documents set access_count = ?, last_access_at = ? where id = ?",
                      (n, last, ids[text]))
            model[text] = DecayModel(importance, n, last)
    for day in range(2, 9):
        clock.set(dt.datetime(2026, 3, day, 12, 0, tzinfo=dt.timezone.utc))
        before = {r["id"]: r["importance"] for r in m.rows("select id, importance from documents")}
        out = m.decay()
        assert out["days"] == [f"2026-03-{day:02d}"]
        for text, mdl in model.items():
            mdl.day(dt.date(2026, 3, day))
            row = m.rows("select importance, access_count from documents where id = ?",
                         (ids[text],))[0]
            assert row["importance"] == pytest.approx(mdl.importance, abs=1e-9), (day, text)
            assert row["access_count"] == pytest.approx(mdl.access_count, abs=1e-9), (day, text)
        changed = {c["id"]: (c["old"], c["new"]) for c in out["importance"]}
        assert changed == {i: (before[i], v) for i, v in ((r["id"], r["importance"]) for r in
                           m.rows("select id, importance from documents")) if v != before[i]}
    # the access signal really mattered: the accessed memory decayed less than the unaccessed one
    first = spec["Accessed six times yesterday, about coffee."][0]
    assert model["Accessed six times yesterday, about coffee."].importance / first > \
        model["Never accessed, about green tea."].importance / 0.8
    assert model["Nearly forgotten, about lemonade."].importance == 0.05
    assert m.value("select importance from documents where id = ?",
                   (ids["At the floor already, about milk."],)) == 0.04


def test_first_decay_on_a_new_file_runs_no_day_and_a_dry_run_does_not_start_the_schedule(make,
                                                                                         clock):
    m = make()
    i = m.memorize("A memory about sailing boats.", {"importance": 0.5})["id"]
    assert m.decay(dry_run=True)["days"] == []
    assert m.meta_get("decay_last_run") is None
    clock.advance(days=3)
    out = m.decay()
    assert out["days"] == [] and out["importance"] == []
    assert m.value("select importance from documents where id = ?", (i,)) == 0.5
    assert m.meta_get("decay_last_run") == "2026-03-04"
    clock.advance(days=1)
    assert m.decay()["days"] == ["2026-03-05"]
    assert m.value("select importance from documents where id = ?", (i,)) == \
        pytest.approx(0.5 * 0.99, abs=1e-12)
    assert m.decay()["days"] == []  # the same day again: nothing left to do


def test_catching_up_five_missed_days_equals_five_daily_runs(make, clock, tmp_path):
    daily, late = make(tmp_path / "daily.db"), make(tmp_path / "late.db")
    items = [("Daily runner memory about kites.", 0.9, 8, "2026-02-27T08:00:00Z"),
             ("Daily runner memory about chess.", 0.4, 0, None),
             ("Daily runner memory about rain.", 0.2, 3, "2026-02-01T06:00:00Z")]
    for m in (daily, late):
        for text, importance, n, last in items:
            i = m.memorize(text, {"importance": importance})["id"]
            with m.tx() as c:
                c.execute("update documents set access_count = ?, last_access_at = ? where id = ?",
                          (n, last, i))
        assert m.decay()["days"] == []
    for _ in range(5):
        clock.advance(days=1)
        assert len(daily.decay()["days"]) == 1
    out = late.decay()
    assert out["days"] == ["2026-03-02", "2026-03-03", "2026-03-04", "2026-03-05", "2026-03-06"]
    sql = "select content, importance, access_count from documents order by content"
    a, b = daily.rows(sql), late.rows(sql)
    assert [r["content"] for r in a] == [r["content"] for r in b]
    for x, y in zip(a, b, strict=True):
        assert y["importance"] == pytest.approx(x["importance"], abs=1e-12)
        assert y["access_count"] == pytest.approx(x["access_count"], abs=1e-12)
    assert a[0]["importance"] < 0.9  # something decayed
    assert late.meta_get("decay_last_run") == daily.meta_get("decay_last_run") == "2026-03-06"


def test_pinned_memories_do_not_decay(make, clock):
    m = make()
    pinned = m.memorize("Pinned: my passport number is in the blue folder.",
                        {"importance": 0.7, "pinned": True})["id"]
    other = m.memorize("Unpinned memory about the blue folder.", {"importance": 0.7})["id"]
    m.decay()
    with m.tx() as c:
        c.execute("update documents set access_count = 8, last_access_at = ? where id = ?",
                  (aokun.iso(T0), pinned))
    clock.advance(days=10)
    out = m.decay()
    assert len(out["days"]) == 10
    assert m.value("select importance from documents where id = ?", (pinned,)) == 0.7
    assert pinned not in [c["id"] for c in out["importance"]]
    assert m.value("select importance from documents where id = ?", (other,)) == \
        pytest.approx(0.7 * 0.99 ** 10)
    assert m.value("select access_count from documents where id = ?", (pinned,)) == \
        pytest.approx(8 / 2 ** 10)


def test_decay_waits_for_decay_hour_and_minute(make, clock):
    m = make(**{"forgetting.decay_hour": 3, "forgetting.decay_minute": 30})
    i = m.memorize("A memory about the night train.", {"importance": 0.5})["id"]
    m.decay()
    assert m.meta_get("decay_last_run") == "2026-03-01"
    clock.set(dt.datetime(2026, 3, 2, 3, 29, 59, tzinfo=dt.timezone.utc))
    assert m.decay(dry_run=True)["days"] == []
    assert m.decay()["days"] == []
    assert m.value("select importance from documents where id = ?", (i,)) == 0.5
    clock.set(dt.datetime(2026, 3, 2, 3, 30, tzinfo=dt.timezone.utc))
    assert m.decay()["days"] == ["2026-03-02"]
    assert m.value("select importance from documents where id = ?", (i,)) == pytest.approx(0.495)


def test_decay_time_is_local_to_the_configured_timezone(make, clock):
    # UTC+8: 00:05 local = 16:05 UTC the day before
    m = make(**{"forgetting.timezone": "Asia/Shanghai"})
    m.memorize("A memory about dumplings.", {"importance": 0.5})
    m.decay()
    assert m.meta_get("decay_last_run") == "2026-03-01"  # 20:00 local on 1 March
    clock.set(dt.datetime(2026, 3, 1, 16, 4, tzinfo=dt.timezone.utc))
    assert m.decay()["days"] == []
    clock.set(dt.datetime(2026, 3, 1, 16, 5, tzinfo=dt.timezone.utc))
    assert m.decay()["days"] == ["2026-03-02"]


# the atom lifecycle ------------------------------------------------------------------------------

def test_effective_ttl_formula():
    assert aokun.effective_ttl_days(7, 0.5, 0) == 7
    assert aokun.effective_ttl_days(7, 0.9, 1) == pytest.approx(14.7)
    assert aokun.effective_ttl_days(180, 0.2, 2) == pytest.approx(180 * 0.7 * 2)


def test_atom_walks_active_expired_forgotten_purged(make, clock):
    m = make()
    first = m.memorize("Museum day with Tom.", {"importance": 0.9, "key_facts": [MUSEUM]})["id"]
    [aid] = atom_ids(m, first)
    a = atom(m, aid)
    assert a["atom_type"] == "episodic" and a["importance"] == 0.9
    # base × (0.5 + importance)
    assert a["expires_at"] == aokun.iso(T0 + dt.timedelta(days=7 * 1.4))
    t1 = clock.advance(days=1)
    second = m.memorize("Museum recap.", {"importance": 0.3, "key_facts": [MUSEUM]})["id"]
    assert atom_ids(m, second) == [aid]  # reinforced, not a new atom
    a = atom(m, aid)
    assert a["reinforcement_count"] == 1 and a["last_reinforced_at"] == aokun.iso(t1)
    # effective TTL = 7 × (0.5 + 0.9) × (1 + 0.5 × 1) = 14.7 days from the reinforcement
    expires = t1 + dt.timedelta(days=14.7)
    assert a["expires_at"] == aokun.iso(expires) == "2026-03-17T04:48:00Z"

    clock.set(expires - dt.timedelta(seconds=1))
    assert found(m, "science museum", aid)
    assert m.lifecycle()["atoms"] == []
    assert atom(m, aid)["state"] == "active"

    clock.set(expires)
    assert not found(m, "science museum", aid)  # the TTL factor is 0 at expiry, before any sweep
    assert m.lifecycle()["atoms"] == [{"id": aid, "old": "active", "new": "expired"}]
    assert atom(m, aid)["state"] == "expired"
    assert not found(m, "science museum", aid)
    assert count(m, "memory_atoms_fts", "rowid = ?", (aid,)) == 1

    forget_at = expires + dt.timedelta(days=7)
    clock.set(forget_at - dt.timedelta(seconds=1))
    assert m.lifecycle()["atoms"] == []
    clock.set(forget_at)
    assert m.lifecycle()["atoms"] == [{"id": aid, "old": "expired", "new": "forgotten"}]
    assert atom(m, aid)["state"] == "forgotten"
    assert count(m, "memory_atoms_fts", "rowid = ?", (aid,)) == 0
    assert not found(m, "science museum", aid)

    purge_at = forget_at + dt.timedelta(days=30)
    clock.set(purge_at - dt.timedelta(seconds=1))
    assert m.lifecycle()["atoms"] == []
    clock.set(purge_at)
    assert m.lifecycle()["atoms"] == [{"id": aid, "old": "forgotten", "new": "purged"}]
    assert atom(m, aid) is None
    assert count(m, "atom_sources", "atom_id = ?", (aid,)) == 0
    # memories stay
    assert m.get(first)["atoms"] == [] and m.get(second)["content"] == "Museum recap."
    assert m.doctor() == []


def test_planned_atom_is_a_step_until_its_deadline(make, clock):
    m = make()
    doc = m.memorize(DENTIST, {"importance": 0.5})["id"]
    [aid] = atom_ids(m, doc)
    a = atom(m, aid)
    assert a["atom_type"] == "planned"
    # tomorrow (March 2, UTC) ends at midnight; rules/dates.toml's grace_days = 1 keeps it a day
    # longer
    deadline = dt.datetime(2026, 3, 4, tzinfo=dt.timezone.utc)
    assert a["expires_at"] == aokun.iso(deadline)
    clock.set(deadline - dt.timedelta(seconds=1))
    assert aokun.ttl_factor(a, "step", aokun.now()) == 1.0
    hits = {r["id"]: r for r in m.search_atoms("dentist")["results"]}
    assert aid in hits and hits[aid]["ttl_factor"] == 1.0
    clock.set(deadline + dt.timedelta(seconds=1))
    assert aokun.ttl_factor(a, "step", aokun.now()) == 0.0
    assert aid not in [r["id"] for r in m.search_atoms("dentist")["results"]]
    # contrast: an exponential atom is already below 1 long before its expiry
    e = dict(a, expires_at=aokun.iso(T0 + dt.timedelta(days=10)))
    assert aokun.ttl_factor(e, "exponential", T0 + dt.timedelta(days=1)) == \
        pytest.approx(math.exp(-0.1))


def test_supersession_and_undo_by_deleting_the_newer_memory(make, clock):
    m = make()
    paris = m.memorize("Bob lives in Paris.", {"participants": ["Bob"]})["id"]
    [old] = atom_ids(m, paris)
    assert atom(m, old)["slot"] == "lives_in" and atom(m, old)["slot_value"] == "paris"
    clock.advance(hours=2)
    berlin = m.memorize("Bob moved to Berlin.", {"participants": ["Bob"]})["id"]
    [new] = atom_ids(m, berlin)
    assert atom(m, old)["state"] == "superseded" and atom(m, old)["superseded_by"] == new
    assert atom(m, new)["state"] == "active" and atom(m, new)["slot_value"] == "berlin"
    assert not found(m, "Bob Paris", old) and found(m, "Bob Berlin", new)
    # a superseded atom stays superseded: it is what marks the older memory replaced
    later = aokun.parse_time(atom(m, old)["state_changed_at"]) + dt.timedelta(days=60)
    assert m.lifecycle(ref=later)["atoms"] == [] and atom(m, old)["state"] == "superseded"

    m.delete(berlin)
    a = atom(m, old)
    assert a["state"] == "active" and a["superseded_by"] is None
    assert atom(m, new) is None
    assert found(m, "Bob Paris", old)


def test_a_fact_holding_a_slot_stays_current_until_a_newer_value(make, clock):
    """Where one lives does not stop mattering with age: the atom of a slot (rules/predicates.toml)
    outlives its TTL (still found, in the briefing) until a newer value supersedes it; deleting
    the newer memory makes it current again. A fact without a slot expires as before."""
    m = make()
    leeds = m.memorize("I live in Leeds with my wife Anna.")["id"]
    museum = m.memorize(MUSEUM)["id"]
    veg = m.memorize("我吃素。")["id"]  # one search token: a fact for its slot alone
    [home], [trip] = atom_ids(m, leeds), atom_ids(m, museum)
    assert [atom(m, a)["slot"] for a in atom_ids(m, veg)] == ["diet"]
    assert atom(m, home)["slot"] == "lives_in" and atom(m, trip)["slot"] == ""
    clock.set(aokun.parse_time(atom(m, home)["expires_at"]) + dt.timedelta(days=400))
    m.lifecycle()
    assert atom(m, home)["state"] == "active" and found(m, "Leeds", home)
    leeds_hit = {r["id"]: r for r in m.search_atoms("Leeds")["results"]}[home]  # scored, not 0
    assert leeds_hit["ttl_factor"] == pytest.approx(math.exp(-1)) and leeds_hit["score"] > 0
    assert atom(m, trip)["state"] == "expired" and not found(m, "science museum", trip)
    assert "I live in Leeds with my wife Anna." in m.memory_context()["text"]
    assert "我吃素。" in m.memory_context()["text"]
    york = m.memorize("I moved to York last week.")["id"]
    assert atom(m, home)["state"] == "superseded" and not found(m, "Leeds", home)
    text = m.memory_context()["text"]
    assert "I moved to York" in text and "Leeds" not in text
    m.delete(york)
    assert atom(m, home)["state"] == "active" and found(m, "Leeds", home)


def test_a_replaced_fact_stays_replaced_through_months_of_maintenance(make, clock):
    """The server's sweeps (maintenance_due) once forgot a superseded atom after 7 days, and with
    it the link: recall then served the old city first, unmarked, and deleting the newer memory
    brought nothing back. EN and ZH, and across them."""
    m = make()
    leeds = m.memorize("I live in Leeds.")["id"]
    clock.advance(days=30)
    manchester = m.memorize("I moved to Manchester last week.")["id"]
    clock.advance(days=30)
    shenzhen = m.memorize("我现在住在深圳。")["id"]
    for _ in range(3):
        m.maintenance_due(clock.advance(days=40))
    found = [(h["id"], h.get("replaced_by")) for h in m.recall("Leeds Manchester 深圳")["results"]]
    assert found == [(shenzhen, None), (manchester, shenzhen), (leeds, manchester)]
    m.delete(shenzhen)
    found = [(h["id"], h.get("replaced_by")) for h in m.recall("Leeds Manchester")["results"]]
    assert found == [(manchester, None), (leeds, manchester)]
    assert "I moved to Manchester" in m.memory_context()["text"]


def test_an_older_fact_arriving_late_is_itself_superseded(make, clock):
    m = make()
    berlin = m.memorize("Bob moved to Berlin.", {"participants": ["Bob"]})["id"]
    paris = m.memorize("Bob lives in Paris.",
                       {"participants": ["Bob"], "timestamp": "2025-01-01T00:00:00Z"})["id"]
    [new], [old] = atom_ids(m, berlin), atom_ids(m, paris)
    assert atom(m, new)["state"] == "active"
    assert atom(m, old)["state"] == "superseded" and atom(m, old)["superseded_by"] == new


def test_auto_archive_old_unimportant_memories(make, clock):
    m = make(**{"forgetting.auto_cleanup_enabled": True})
    old_low = m.memorize("Lighthouse keeper chat from long ago.",
                         {"importance": 0.05, "timestamp": "2025-06-01T00:00:00Z"})["id"]
    old_high = m.memorize("Lighthouse restoration plan, very important.",
                          {"importance": 0.9, "timestamp": "2025-06-01T00:00:00Z"})["id"]
    new_low = m.memorize("Lighthouse postcard bought last week.", {"importance": 0.05})["id"]
    old_pinned = m.memorize("Lighthouse address, pinned.",
                            {"importance": 0.05, "pinned": True,
                             "timestamp": "2025-06-01T00:00:00Z"})["id"]
    everything = {old_low, old_high, new_low, old_pinned}
    hits = {h["id"] for h in m.recall("lighthouse", k=10)["results"]}
    assert hits == everything
    preview = m.decay(dry_run=True)
    assert preview["archived"] == [old_low]
    assert m.value("select archived from documents where id = ?", (old_low,)) == 0
    out = m.decay()
    assert out["archived"] == [old_low]
    assert {r["id"] for r in m.rows("select id from documents where archived = 1")} == {old_low}
    assert {h["id"] for h in m.recall("lighthouse", k=10)["results"]} == everything - {old_low}
    assert {h["id"] for h in m.recall("lighthouse", k=10, include_archived=True)["results"]} == \
        everything
    assert m.decay()["archived"] == []  # already archived: not listed again
    m.restore_memory(old_low)
    assert {h["id"] for h in m.recall("lighthouse", k=10)["results"]} == everything


def test_repeat_of_an_auto_archived_memory_restores_it_for_good(make, clock):
    m = make(**{"forgetting.auto_cleanup_enabled": True})
    text = "Lighthouse keeper chat from long ago."
    old_low = m.memorize(text, {"importance": 0.05, "timestamp": "2025-06-01T00:00:00Z"})["id"]
    assert m.decay()["archived"] == [old_low]
    r = m.memorize(text)
    assert (r["id"], r["deduplicated"]) == (old_low, True)
    # restored, and at the default importance: the next auto-archival does not take it straight back
    assert r["changed"] == {"archived": [True, False], "importance": [0.05, 0.5]}
    assert r["warnings"][0].startswith(f"memory {old_low} was archived; memorizing it again "
                                       "restored it")
    assert [h["id"] for h in m.recall("lighthouse")["results"]] == [old_low]
    clock.advance(days=1)
    assert m.decay()["archived"] == []
    assert m._doc(old_low)["created_at"] == "2025-06-01T00:00:00Z"  # still in its place in time


def test_auto_archive_is_off_by_default(make, clock):
    m = make()
    old_low = m.memorize("Lighthouse keeper chat from long ago.",
                         {"importance": 0.05, "timestamp": "2025-06-01T00:00:00Z"})["id"]
    assert m.decay()["archived"] == []
    assert m.value("select archived from documents where id = ?", (old_low,)) == 0


# dry runs and previews ---------------------------------------------------------------------------

def _setup_for_dry_runs(make, clock, path):
    m = make(path)
    ids = {
        "museum": m.memorize("Museum day with Tom.",
                             {"importance": 0.5, "key_facts": [MUSEUM]})["id"],
        "dentist": m.memorize(DENTIST, {"importance": 0.5})["id"],
        "tea": m.memorize("Alice prefers green tea in the afternoon.", {"importance": 0.6})["id"],
        "old": m.memorize("An old unimportant note about parking.",
                          {"importance": 0.06, "timestamp": "2025-01-01T00:00:00Z"})["id"],
        "pinned": m.memorize("Pinned rule: always answer in English.", {"pinned": True})["id"],
    }
    m.decay()
    with m.tx() as c:
        c.execute("update documents set access_count = 5, last_access_at = ? where id = ?",
                  (aokun.iso(T0), ids["tea"]))
    m.close()
    return ids


def test_dry_runs_change_nothing_and_list_exactly_what_the_real_run_does(make, clock, tmp_path):
    path = tmp_path / "dry.db"
    ids = _setup_for_dry_runs(make, clock, path)
    clock.advance(days=10)  # 10 decay days due, the museum and dentist atoms past expiry
    make(path, **{"forgetting.auto_cleanup_enabled": True}).close()
    assert not Path(str(path) + "-wal").exists()  # closed cleanly: everything is in the main file
    h0, d0 = sha256(path), dump(path)

    m = make(path, **{"forgetting.auto_cleanup_enabled": True})
    before = table_counts(m)
    dry_decay = m.decay(dry_run=True)
    dry_life = m.lifecycle(dry_run=True)
    preview = m.forget_preview(30)
    assert table_counts(m) == before
    m.close()
    assert sha256(path) == h0
    assert dump(path) == d0

    # what the dry runs listed
    assert len(dry_decay["days"]) == 10 and dry_decay["dry_run"] is True
    assert {c["id"] for c in dry_decay["importance"]} == \
        {ids["museum"], ids["dentist"], ids["tea"], ids["old"]}
    assert dry_decay["archived"] == [ids["old"]]
    museum_atom, dentist_atom, old_atom = (atom_ids_from_dump(d0, ids[k])
                                           for k in ("museum", "dentist", "old"))
    # the old note's atom expired in 2025 (180 × 0.56 days after 2025-01-01); the others did by now
    assert {c["id"]: (c["old"], c["new"]) for c in dry_life["atoms"]} == {
        museum_atom: ("active", "expired"), dentist_atom: ("active", "expired"),
        old_atom: ("active", "expired")}
    assert len(preview["days"]) == 40 and preview["as_of"] == aokun.iso(T0 + dt.timedelta(days=40))
    assert {"id": museum_atom, "old": "active", "new": "expired"} in preview["atoms"]

    # the real runs do exactly that
    m = make(path, **{"forgetting.auto_cleanup_enabled": True})
    real_decay = m.decay()
    assert real_decay == dict(dry_decay, dry_run=False)
    real_life = m.lifecycle()
    assert real_life == dict(dry_life, dry_run=False)
    for c in real_decay["importance"]:
        assert m.value("select importance from documents where id = ?", (c["id"],)) == c["new"]


def atom_ids_from_dump(d, doc_id):
    [aid] = [r[0] for r in d["atom_sources"] if r[1] == doc_id]
    return aid


def test_forget_preview_is_read_only_and_shows_expiries(make, clock):
    m = make()
    museum = m.memorize("Museum day with Tom.", {"importance": 0.5, "key_facts": [MUSEUM]})["id"]
    [aid] = atom_ids(m, museum)  # expires at T0 + 7 days
    m.decay()
    state = dump(m.path)
    p6 = m.forget_preview(6)
    assert p6["as_of"] == aokun.iso(T0 + dt.timedelta(days=6)) and len(p6["days"]) == 6
    assert aid not in [c["id"] for c in p6["atoms"]]
    assert [c["id"] for c in p6["importance"]] == [museum]
    assert p6["importance"][0]["new"] == pytest.approx(0.5 * 0.99 ** 6)
    p8 = m.forget_preview(8)
    assert {"id": aid, "old": "active", "new": "expired"} in p8["atoms"]
    assert m.forget_preview(0)["days"] == []
    with pytest.raises(aokun.InputError):
        m.forget_preview(-1)
    assert dump(m.path) == state
    assert atom(m, aid)["state"] == "active"
    assert m.value("select importance from documents where id = ?", (museum,)) == 0.5



def test_forget_preview_shows_only_the_asking_persona(make, clock):
    m = make()
    mine = m.memorize("Museum day with Tom.",
                      {"importance": 0.5, "key_facts": [MUSEUM], "persona_id": "home"})["id"]
    theirs = m.memorize("Museum day with Ann.",
                        {"importance": 0.5, "key_facts": [MUSEUM], "persona_id": "work"})["id"]
    m.decay()
    p = m.forget_preview(8, "home")
    assert [c["id"] for c in p["importance"]] == [mine]
    assert set(c["id"] for c in p["atoms"]) == set(atom_ids(m, mine)) != set()
    assert [c["id"] for c in m.forget_preview(8, "work")["importance"]] == [theirs]
    assert m.forget_preview(8)["importance"] == [] and m.forget_preview(8)["atoms"] == []

# backups -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_online_backup_under_concurrent_writes(make, tmp_path, monkeypatch):
    path = tmp_path / "busy.db"
    steps, real_sleep, mark = [], time.sleep, {}

    def counting_sleep(seconds):  # online_backup sleeps once between two 256-page steps
        if threading.current_thread() is threading.main_thread() and "started" in mark:
            steps.append(seconds)
            if len(steps) == 1:  # make sure writes land while the copy is in progress
                deadline = time.monotonic() + 30
                while len(acked) < mark["started"] + 2 and time.monotonic() < deadline:
                    real_sleep(0.002)
        real_sleep(seconds)

    monkeypatch.setattr(aokun.time, "sleep", counting_sleep)
    m = make(path)
    m.memorize_many([(f"Preloaded memory {i} about the harbour and its boats.", None)
                     for i in range(30)])
    # ~3 MB of pages, so the copy takes many 256-page steps while the writer commits
    with m.tx() as c:
        c.execute("create table test_padding(b blob)")
        c.execute("with recursive n(i) as (select 1 union all select i + 1 from n where i < 30) "
                  "insert into test_padding select zeroblob(100000) from n")
    quiet = m.online_backup(tmp_path / "bk" / "quiet.db")  # without concurrent writes first
    assert Path(quiet["backup"]).exists()
    writer = make(path)  # a second Memory object (own connection) on the same file
    acked: list[tuple[str, int]] = []
    stop, errors = threading.Event(), []

    def write_loop():
        i = 0
        try:
            while not stop.is_set():
                text = f"Concurrent write number {i} about kites"
                acked.append((text, writer.memorize(text)["id"]))
                i += 1
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=write_loop)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while len(acked) < 5 and time.monotonic() < deadline:
            time.sleep(0.005)
        before = list(acked)  # every write acknowledged before the backup starts
        dest = tmp_path / "bk" / "busy-copy.db"
        mark["started"] = len(before)
        out = m.online_backup(dest)
        during = len(acked) - len(before)
    finally:
        stop.set()
        t.join()
    assert not errors
    assert len(before) >= 5 and during >= 2, "the writer must keep writing while the backup runs"
    b = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        pages = b.pragma("page_count")
    finally:
        b.close()
    # each pass is ceil(pages/256) steps; at most 20 restarts, then the rest in one step
    assert len(steps) <= 21 * math.ceil(pages / 256) + 1, \
        f"{len(steps)} backup steps for {pages} pages"
    assert out["backup"] == str(dest) and dest.exists() \
        and not dest.with_name(dest.name + ".part").exists()
    b = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert [r[0] for r in b.execute("pragma integrity_check")] == ["ok"]
        stored = dict(b.execute("select id, content from documents"))
        assert len(stored) >= 30 + len(before)
        for text, i in before:
            assert stored.get(i) == text
    finally:
        b.close()
    copy = tmp_path / "check.db"
    shutil.copy(dest, copy)
    assert make(copy).doctor() == []  # every layer of the snapshot is consistent
    assert m.meta_get("backup_last_file") == str(dest)


def test_online_backup_finishes_after_twenty_restarts(make, tmp_path, monkeypatch):
    """Another connection commits between every two steps, so every step restarts the copy: it must
    be finished in one step after 20 restarts (the loop used to retry for 20000 steps, ~60 s)."""
    path = tmp_path / "restarts.db"
    m = make(path)
    m.memorize("A memory to copy while another connection writes.")
    with m.tx() as c:  # ~500 pages: two 256-page steps per pass
        c.execute("create table test_padding(b blob)")
        c.execute("with recursive n(i) as (select 1 union all select i + 1 from n where i < 20) "
                  "insert into test_padding select zeroblob(100000) from n")
    other = apsw.Connection(str(path))
    other.set_busy_timeout(5000)
    calls, real_sleep = [], time.sleep

    def write_between_steps(seconds):
        if threading.current_thread() is threading.main_thread():
            calls.append(seconds)
            if len(calls) > 300:
                raise AssertionError("online_backup keeps restarting while another connection "
                                     "writes")
            other.execute("insert into meta(key, value) values ('test_tick', ?) "
                          "on conflict(key) do update set value = excluded.value",
                          (str(len(calls)),))
        real_sleep(seconds)

    monkeypatch.setattr(aokun.time, "sleep", write_between_steps)
    try:
        dest = tmp_path / "bk" / "restarts-copy.db"
        m.online_backup(dest)
    finally:
        other.close()
    assert 20 <= len(calls) <= 22  # one step, then 20 restarted ones, then the rest in one go
    b = apsw.Connection(str(dest), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert [r[0] for r in b.execute("pragma integrity_check")] == ["ok"]
        assert b.execute("select value from meta where key = 'test_tick'").fetchone() == \
            (str(len(calls)),)  # last
        assert b.execute("select count(*) from documents").fetchone() == (1,)
    finally:
        b.close()


def test_restore_from_refuses_newer_and_corrupt_files_and_restores_a_good_one(make, clock,
                                                                              tmp_path):
    m = make(tmp_path / "main.db")
    for i in range(3):
        m.memorize(f"Restorable memory number {i} about violins.")
    good = tmp_path / "good.db"
    m.online_backup(good)
    clock.advance(minutes=1)
    m.memorize("Written after the backup, about drums.")
    m.memorize("Also after the backup, about flutes.")
    assert count(m, "documents") == 5

    newer = tmp_path / "newer.db"
    shutil.copy(good, newer)
    c = apsw.Connection(str(newer))
    c.pragma("user_version", aokun.schema_version_known() + 1)
    c.close()
    with pytest.raises(aokun.SchemaError):
        m.restore_from(newer)

    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not an SQLite database at all " * 200)
    with pytest.raises(aokun.AokunError) as e:
        m.restore_from(garbage)
    assert not isinstance(e.value, aokun.SchemaError)

    damaged = tmp_path / "damaged.db"
    raw = bytearray(good.read_bytes())
    page = 4096
    # wreck every page after the first two (schema stays readable)
    for p in range(2, len(raw) // page):
        raw[p * page: p * page + 64] = b"\xff" * 64
    damaged.write_bytes(bytes(raw))
    with pytest.raises(aokun.AokunError):
        m.restore_from(damaged)
    with pytest.raises(aokun.AokunError):
        m.restore_from(tmp_path / "missing.db")
    assert count(m, "documents") == 5  # every refusal left the database as it was

    clock.advance(minutes=1)
    out = m.restore_from(good)
    assert count(m, "documents") == 3
    assert {r["content"] for r in m.rows("select content from documents")} == {
        f"Restorable memory number {i} about violins." for i in range(3)}
    saved = Path(out["saved_previous"])
    assert saved.exists() and saved.parent == m.path.parent
    s = apsw.Connection(str(saved), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert s.execute("select count(*) from documents").fetchone()[0] == 5
    finally:
        s.close()
    # the restored database is fully usable, also from another connection
    assert m.doctor() == []
    assert [h["text"] for h in m.recall("violins", k=5)["results"]]
    m.memorize("After the restore, about cellos.")
    other = make(tmp_path / "main.db")
    assert count(other, "documents") == 4


def test_daily_backup_once_a_day_and_keeps_only_keep_days(make, clock, tmp_path):
    m = make(**{"backup.keep_days": 3})
    m.memorize("A memory worth backing up.")
    folder = tmp_path / "bk"
    for day in range(1, 7):
        clock.set(dt.datetime(2026, 3, day, 12, 0, tzinfo=dt.timezone.utc))
        made = m.daily_backup()
        assert made == str(folder / f"f-daily-2026-03-{day:02d}.db")
        assert m.daily_backup() is None  # once per day
    names = sorted(p.name for p in folder.glob("f-daily-*.db"))
    assert names == ["f-daily-2026-03-04.db", "f-daily-2026-03-05.db", "f-daily-2026-03-06.db"]


def test_version_backup_on_a_version_change(make, clock, tmp_path):
    m = make()
    assert m.version_backup() is None  # a new file: nothing to save, the version is recorded
    assert m.meta_get("server_version") == aokun.__version__
    m.memorize("A memory from the old version.")
    with m.tx():
        m._meta_set("server_version", "0.0.1")
    made = m.version_backup()
    assert made is not None and Path(made).exists()
    assert Path(made).parent == tmp_path / "bk" and "-v0.0.1-" in Path(made).name
    assert m.meta_get("server_version") == aokun.__version__
    b = apsw.Connection(made, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        assert b.execute("select content from documents").fetchall() == \
            [("A memory from the old version.",)]
        assert b.execute("select value from meta where key = 'server_version'").fetchone() == \
            ("0.0.1",)
    finally:
        b.close()
    assert m.version_backup() is None  # same version now


# CLI ---------------------------------------------------------------------------------------------

@pytest.fixture
def cli(tmp_path, monkeypatch, segmenter):
    """cli(*args, ok=True, input=None) -> click Result against tmp_path/cli.db, provider = none."""
    monkeypatch.setattr(aokun, "Segmenter", lambda *a, **k: segmenter)
    ini = tmp_path / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n\n[forgetting]\ntimezone = UTC\n\n"
                   f"[backup]\ndir = {tmp_path / 'bk'}\n", encoding="utf-8")
    (tmp_path / "cli.db").touch()  # an empty file is a new database, without the "created" notice
    runner = CliRunner()

    def invoke(*args, ok=True, input=None):
        r = runner.invoke(aokun.cli, ["--db", str(tmp_path / "cli.db"), "--config", str(ini),
                                      *map(str, args)],
                          input=input, catch_exceptions=False)
        if ok:
            assert r.exit_code == 0, r.output
        return r

    return invoke


def _importance(cli):
    return {d["content"]: d["importance"]
            for d in json.loads(cli("list", "--json", "--include-archived").output)}


def test_cli_decay_lifecycle_backup_restore(cli, clock, tmp_path):
    cli("memorize", "Museum day with Tom.", "--fact", MUSEUM, "--importance", "0.5")
    assert "0 day(s)" in cli("decay").output
    clock.advance(days=3)
    dry = json.loads(cli("decay", "--dry-run", "--json").output)
    assert dry["days"] == ["2026-03-02", "2026-03-03", "2026-03-04"] and dry["dry_run"] is True
    assert dry["importance"][0]["new"] == pytest.approx(0.5 * 0.99 ** 3)
    assert _importance(cli) == {"Museum day with Tom.": 0.5}
    text = cli("decay", "--dry-run").output
    assert "would decay 3 day(s)" in text and "0.5000 -> 0.4851" in text
    real = json.loads(cli("decay", "--json").output)
    assert real == dict(dry, dry_run=False)
    assert _importance(cli) == {"Museum day with Tom.": pytest.approx(0.5 * 0.99 ** 3)}

    clock.advance(days=5)  # past the museum atom's 7-day TTL
    life = json.loads(cli("lifecycle", "--dry-run", "--json").output)
    assert [(c["old"], c["new"]) for c in life["atoms"]] == [("active", "expired")]
    assert "(dry run)" in cli("lifecycle", "--dry-run").output
    # still nothing changed
    assert json.loads(cli("lifecycle", "--dry-run", "--json").output) == life
    assert json.loads(cli("lifecycle", "--json").output) == dict(life, dry_run=False)
    assert json.loads(cli("lifecycle", "--json").output)["atoms"] == []

    dest = tmp_path / "manual.db"
    out = cli("backup", dest).output
    assert str(dest) in out and dest.exists()
    cli("backup")  # default destination: [backup] dir
    assert len(list((tmp_path / "bk").glob("cli-manual-*.db"))) == 1
    cli("memorize", "Written after the backup.")
    assert len(_importance(cli)) == 2
    refused = cli("restore", dest, input="n\n", ok=False)
    assert refused.exit_code != 0 and len(_importance(cli)) == 2
    out = cli("restore", dest, "--yes").output
    assert "restored" in out and "before-restore" in out
    assert list(_importance(cli)) == ["Museum day with Tom."]
