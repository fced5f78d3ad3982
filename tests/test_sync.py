"""Sync between devices through a shared folder (issue 16 item 2): three copies of a file diverge
and converge whatever the order of their syncs, the conflict's losing version is kept and listed, a
truncated or foreign changeset is skipped until it is whole, a kill -9 in the middle of a sync
leaves both files consistent, and serve syncs on its timer."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import aokun
from fakes import FakeEmbedder

TESTS = Path(__file__).resolve().parent
#: what each device keeps for itself and does not send on its own (usage bookkeeping)
LOCAL_FIELDS = ("access_count", "last_access_at")


def content(mem) -> dict:
    """Everything that syncs, by (kind, key): the export records without the local-only fields."""
    out = {}
    for r in mem.export_records(kinds=aokun.SYNC_KINDS):
        if r["kind"] != "header":
            out[(r["kind"], r[aokun.SYNC_KINDS[r["kind"]][0]])] = {
                k: v for k, v in r.items() if k not in LOCAL_FIELDS}
    return out


def memories(mem) -> dict:
    """{uid: content} of the memories."""
    return {r["uid"]: r["content"] for r in mem.export_records(kinds=("memory",))
            if r["kind"] == "memory"}


def at(monkeypatch, t: str) -> None:
    monkeypatch.setenv("AOKUN_NOW", t)


def sync_until_fixpoint(devices: list, share: Path, rng: random.Random, rounds: int = 8) -> int:
    """Sync the devices in a random order each round until a whole round writes and applies nothing.
    Returns the rounds it took."""
    for n in range(1, rounds + 1):
        order = rng.sample(devices, len(devices))
        moved = [m.sync(share) for m in order]
        for r in moved:
            assert not r["skipped"] and not r["waiting"], r
        if not any(r["written"] or r["applied"] for r in moved):
            return n
    raise AssertionError(f"no fixpoint after {rounds} rounds")


@pytest.fixture
def three(tmp_path, open_mem, monkeypatch):
    """Three copies of one file (the original synced once, so the copies start with its sync state
    and device id) and the shared folder; a dict of the uids the scenario works on."""
    share = tmp_path / "share"
    share.mkdir()
    at(monkeypatch, "2026-05-01T08:00:00Z")
    a = open_mem(tmp_path / "a.db")
    ids = {"edited": a.memorize("Alice 住在北京", {"tags": ["home"]})["id"],
           "deleted": a.memorize("A memory device C deletes", {})["id"],
           "pinned": a.memorize("Bob prefers tea over coffee", {})["id"]}
    fact = a.kg_add("Alice", "lives_in", "北京", valid_from="2026-01-01T00:00:00Z")["id"]
    first = a.sync(share)
    assert first["new_device"] and first["written"] and first["sent"] >= 3
    a.close()
    for name in ("b", "c"):
        shutil.copy(tmp_path / "a.db", tmp_path / f"{name}.db")
    a, b, c = (open_mem(tmp_path / f"{n}.db") for n in "abc")
    uids = {k: a.get(v)["uid"] for k, v in ids.items()}
    ids["fact"] = fact
    return a, b, c, share, ids, uids


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_three_copies_converge_in_any_order(three, monkeypatch, seed):
    a, b, c, share, ids, uids = three
    at(monkeypatch, "2026-05-02T08:00:00Z")
    a.edit(ids["edited"], "Alice 住在上海 (A's version)")
    a_new = a.memorize("Only device A knows this", {})["uid"]
    a.kg_add("Alice", "works_at", "声网")
    a.set_flag(ids["pinned"], "pinned", True)
    at(monkeypatch, "2026-05-02T09:00:00Z")  # later: B's edit of the same memory wins
    b.edit(ids["edited"], "Alice 住在东京 (B's version)")
    b_new = b.memorize("Only device B knows this", {"persona_id": "work"})["uid"]
    b.kg_invalidate(ids["fact"])
    at(monkeypatch, "2026-05-02T10:00:00Z")
    c.delete(ids["deleted"])
    c_new = c.memorize("Only device C knows this", {"pinned": True})["uid"]
    monkeypatch.delenv("AOKUN_NOW")

    devices = [a, b, c]
    assert len({m.sync(share)["device"] for m in devices}) == 3  # the copies got ids of their own
    sync_until_fixpoint(devices, share, random.Random(seed))

    first = content(a)
    assert content(b) == first and content(c) == first
    mems = memories(a)
    assert mems[uids["edited"]] == "Alice 住在东京 (B's version)"
    assert {a_new, b_new, c_new} <= set(mems) and uids["deleted"] not in mems
    pins = {r["uid"] for r in a.export_records(kinds=("memory",))
            if r["kind"] == "memory" and r["pinned"]}
    assert pins == {uids["pinned"], c_new}
    facts = {(r["predicate"], r["valid_to"] is None) for r in a.export_records(kinds=("triple",))
             if r["kind"] == "triple"}
    assert facts == {("lives_in", False), ("works_at", True)}
    for m in devices:  # derived data rebuilt for what came in: FTS finds B's text everywhere
        assert [h["id"] for h in m.recall("东京")["results"]][:1] == [m.value(
            "select id from documents where uid = ?", (uids["edited"],))]
        lost = [x for x in m.sync_conflicts() if x["uid"] == uids["edited"]]
        assert len(lost) == 1, lost
        assert lost[0]["loser"]["content"] == "Alice 住在上海 (A's version)", lost
        assert m.value("pragma integrity_check") == "ok"
        assert not [x for x in m.sync_conflicts() if x["uid"] != uids["edited"]]


@pytest.mark.slow
def test_same_second_edits_are_decided_alike(three, monkeypatch):
    a, b, _c, share, ids, uids = three
    at(monkeypatch, "2026-05-03T08:00:00Z")
    a.edit(ids["edited"], "Edited on A in the same second")
    b.edit(ids["edited"], "Edited on B in the same second")
    sync_until_fixpoint([a, b], share, random.Random(0))
    assert memories(a)[uids["edited"]] == memories(b)[uids["edited"]]
    kept = {x["loser"]["content"] for m in (a, b) for x in m.sync_conflicts()}
    assert len(kept) == 1
    assert kept < {"Edited on A in the same second", "Edited on B in the same second"}


@pytest.mark.slow
def test_edit_after_delete_survives(three, monkeypatch):
    a, b, _c, share, ids, uids = three
    at(monkeypatch, "2026-05-03T08:00:00Z")
    a.delete(ids["deleted"])
    at(monkeypatch, "2026-05-03T09:00:00Z")
    b.edit(ids["deleted"], "Edited on B after A deleted it")
    sync_until_fixpoint([a, b], share, random.Random(0))
    assert memories(a)[uids["deleted"]] == memories(b)[uids["deleted"]] \
        == "Edited on B after A deleted it"
    for m in (a, b):  # the deletion that lost is kept on both sides
        assert [x["kind"] for x in m.sync_conflicts()] == ["tombstone"]


@pytest.mark.slow
def test_truncated_changeset_waits_until_complete(three, monkeypatch):
    a, b, _c, share, _ids, _uids = three
    first = a.memorize("Written on A before the cut", {})["uid"]
    one = a.sync(share)["written"]
    second = a.memorize("Written on A after it", {})["uid"]
    two = a.sync(share)["written"]
    whole = (share / one).read_bytes()
    (share / one).write_bytes(whole[: len(whole) // 2])  # still being copied by the sync tool
    r = b.sync(share)
    assert r["skipped"] == [{"file": one, "reason": r["skipped"][0]["reason"]}]
    assert "truncated" in r["skipped"][0]["reason"]
    assert one not in r["applied"] and two not in r["applied"]  # A's later file waits behind it
    assert first not in memories(b) and second not in memories(b)
    (share / one).write_bytes(whole)
    r = b.sync(share)
    assert r["applied"][:2] == [one, two] and not r["skipped"]
    assert {first, second} <= set(memories(b))


@pytest.mark.slow
def test_foreign_files_are_skipped_and_own_sync_goes_on(three):
    a, b, _c, share, _ids, _uids = three
    (share / "notes.txt").write_text("not ours", encoding="utf-8")  # other files are left alone
    (share / "holiday.changeset").write_bytes(b"x")
    stranger = "0b6f9c1e-0000-4000-8000-000000000000"
    (share / f"{stranger}-00000001.changeset").write_bytes(b"SQLite format 3\x00" + os.urandom(200))
    other = aokun.apsw.Connection(":memory:")
    other.execute("create table t(a primary key, b)")
    session = aokun.apsw.Session(other, "main")
    session.attach("t")
    other.execute("insert into t values (1, 2)")
    payload = aokun.zlib.compress(session.changeset())
    header = {"format": aokun.SYNC_FORMAT, "version": 1, "export_version": 1, "device": stranger,
              "seq": 2, "length": len(payload),
              "sha256": aokun.hashlib.sha256(payload).hexdigest()}
    (share / f"{stranger}-00000002.changeset").write_bytes(
        json.dumps(header).encode() + b"\n" + payload)
    mine = a.memorize("Still synced next to strangers", {})["uid"]
    assert a.sync(share)["written"]
    r = b.sync(share)
    reasons = {x["file"]: x["reason"] for x in r["skipped"]}
    assert set(reasons) == {"holiday.changeset", f"{stranger}-00000001.changeset"}
    assert "not an Aokun changeset" in reasons[f"{stranger}-00000001.changeset"]
    assert mine in memories(b)
    (share / f"{stranger}-00000001.changeset").unlink()  # (a gap would make its number 2 wait)
    header["seq"] = 1
    (share / f"{stranger}-00000001.changeset").write_bytes(
        json.dumps(header).encode() + b"\n" + payload)
    r = b.sync(share)
    reasons = {x["file"]: x["reason"] for x in r["skipped"]}
    assert "foreign changeset" in reasons[f"{stranger}-00000001.changeset"]
    assert (share / "notes.txt").read_text(encoding="utf-8") == "not ours"


def _changeset_file(share: Path, device: str, seq: int, payload: bytes) -> Path:
    """Write a changeset file with a header that matches `payload` (length, checksum)."""
    header = {"format": aokun.SYNC_FORMAT, "version": 1, "export_version": 1, "device": device,
              "seq": seq, "length": len(payload),
              "sha256": aokun.hashlib.sha256(payload).hexdigest()}
    path = share / f"{device}-{seq:08d}.changeset"
    path.write_bytes(json.dumps(header).encode() + b"\n" + payload)
    return path


@pytest.mark.slow
def test_a_zip_bomb_a_pipe_and_dev_zero_are_skipped_in_bounded_memory(tmp_path, open_mem):
    """A changeset's payload inflates to a bounded size, and only regular files are read: a FIFO
    under a changeset's name used to block the sync for good, /dev/zero (or a zip bomb: 2 MB of zlib
    that inflate to 2 GB) to fill the memory."""
    import resource
    share = tmp_path / "share"
    share.mkdir()
    a = open_mem(tmp_path / "a.db")
    mine = a.memorize("Synced beside a zip bomb", {})["uid"]
    z = aokun.zlib.compressobj(9)
    # 1 GiB of zeros in ~1 MB
    bomb = b"".join(z.compress(bytes(1 << 20)) for _ in range(1024)) + z.flush()
    _changeset_file(share, "0b6f9c1e-0000-4000-8000-000000000001", 1, bomb)
    os.mkfifo(share / "0b6f9c1e-0000-4000-8000-000000000002-00000001.changeset")
    os.symlink("/dev/zero", share / "0b6f9c1e-0000-4000-8000-000000000003-00000001.changeset")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    done = []
    t = threading.Thread(target=lambda: done.append(a.sync(share)), daemon=True)
    t.start()
    t.join(60)
    assert done, "the sync blocked on the pipe"
    reasons = {x["file"][:36]: x["reason"] for x in done[0]["skipped"]}
    assert "zip bomb" in reasons["0b6f9c1e-0000-4000-8000-000000000001"]
    assert reasons["0b6f9c1e-0000-4000-8000-000000000002"] == "not a regular file"
    assert reasons["0b6f9c1e-0000-4000-8000-000000000003"] == "not a regular file"
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 512 << 20
    assert done[0]["written"]
    b = open_mem(tmp_path / "b.db")
    assert done[0]["written"] in b.sync(share)["applied"] and mine in memories(b)


@pytest.mark.slow
def test_a_changeset_that_compresses_too_well_is_written_stored(three, monkeypatch):
    """What the reader's zip-bomb bound would refuse is never written: a changeset that compresses
    past the bound is written with zlib level 0, and applies on the other device."""
    a, b, _c, share, _ids, _uids = three
    monkeypatch.setattr(aokun, "SYNC_INFLATE_FLOOR", 1024)
    uid = a.memorize("重复 " * 20000, {})["uid"]
    name = a.sync(share)["written"]
    assert len((share / name).read_bytes()) > 40000  # stored, not deflated
    r = b.sync(share)
    assert name in r["applied"] and not r["skipped"] and uid in memories(b)


@pytest.mark.slow
def test_a_folder_gone_mid_sync_is_one_line_and_the_next_sync_finishes(three, tmp_path,
                                                                       monkeypatch):
    """The shared folder vanishing after this device's file was written (a USB stick pulled) used to
    end the sync with a FileNotFoundError traceback; now one line, and the next sync goes on."""
    a, b, _c, share, _ids, _uids = three
    uid = a.memorize("Written just before the stick was pulled", {})["uid"]
    real = aokun.Sync._sync_write

    def write_then_pull(self, folder, device, s, found):
        out = real(self, folder, device, s, found)
        shutil.move(share, tmp_path / "stick")
        return out
    b.memorize("On B, so A has a file to read", {})
    b.sync(share)
    monkeypatch.setattr(aokun.Sync, "_sync_write", write_then_pull)
    r = a.sync(share)  # the folder was listed before: what it cannot read now is skipped
    assert r["written"] and r["skipped"] and not r["applied"]
    assert {x["reason"][:14] for x in r["skipped"]} == {"cannot be read"}, r["skipped"]
    monkeypatch.setattr(aokun.Sync, "_sync_write", real)
    shutil.move(tmp_path / "stick", share)
    assert not a.sync(share)["written"]  # its file was recorded as sent
    b.sync(share)
    assert uid in memories(b)


@pytest.mark.slow
def test_a_changeset_stamp_not_in_the_column_format_is_refused(three):
    """Versions are ordered by their stamps as text, so a stamp with an offset ("…T10:00:00+08:00",
    02:00 UTC) sorted after a later UTC one and won; such a file is skipped now, and an import
    stores its times in the column format."""
    a, b, _c, share, _ids, uids = three
    rec = next(r for r in a.export_records(kinds=("memory",)) if r.get("uid") == uids["edited"])
    rec |= {"content": "an older version in disguise", "updated_at": "2026-05-01T10:00:00+08:00"}
    scratch = aokun.apsw.Connection(":memory:")
    scratch.execute(aokun._SYNC_TABLES)
    session = aokun.apsw.Session(scratch, "main")
    session.attach("records")
    scratch.execute("insert into records values ('memory', ?, ?, ?, ?)",
                    (rec["uid"], rec["updated_at"], aokun.sync_hash(rec),
                     json.dumps(rec, ensure_ascii=False)))
    name = _changeset_file(share, "0b6f9c1e-0000-4000-8000-000000000009", 1,
                           aokun.zlib.compress(session.changeset())).name
    r = b.sync(share)
    assert name not in r["applied"]
    assert "is not a time like" in {x["file"]: x["reason"] for x in r["skipped"]}[name]
    assert memories(b)[uids["edited"]] == "Alice 住在北京"
    header = {"kind": "header", "format": aokun.EXPORT_FORMAT, "version": 1}
    rec |= {"updated_at": "2026-05-02T10:00:00+08:00"}
    b.import_export([json.dumps(header), json.dumps(rec, ensure_ascii=False)])
    assert b.value("select updated_at from documents where uid = ?",
                   (uids["edited"],)) == "2026-05-02T02:00:00Z"


@pytest.mark.slow
def test_a_newer_changeset_version_is_skipped(three):
    a, b, _c, share, _ids, _uids = three
    a.memorize("From a future Aokun", {})
    name = a.sync(share)["written"]
    head, _, payload = (share / name).read_bytes().partition(b"\n")
    h = json.loads(head) | {"version": aokun.SYNC_VERSION + 1}
    (share / name).write_bytes(json.dumps(h).encode() + b"\n" + payload)
    r = b.sync(share)
    assert "newer" in r["skipped"][0]["reason"] and name not in r["applied"]


@pytest.mark.slow
def test_a_restored_backup_gets_its_own_later_changes_back(three, tmp_path):
    a, _b, _c, share, _ids, _uids = three
    shutil.copy(tmp_path / "a.db", tmp_path / "a-backup.db")  # a backup of A, taken now
    later = a.memorize("Written on A after the backup", {})["uid"]
    lost = a.sync(share)["written"]
    sent = (share / lost).read_bytes()
    a.close()
    shutil.copy(tmp_path / "a-backup.db", tmp_path / "a.db")
    for side in ("-wal", "-shm"):
        (tmp_path / f"a.db{side}").unlink(missing_ok=True)
    restored = aokun.Memory(tmp_path / "a.db", aokun.Config(None), embedder=FakeEmbedder(16))
    try:
        had = len(content(restored))
        r = restored.sync(share)
        assert later in memories(restored)
        assert r["applied"] == [lost]  # its own file, which the backup had not seen
        # a file under its id it did not write: it cannot tell a restore from a copy that synced, so
        # it takes a new id (a copy and the original would write the same numbers) and sends it all
        old = lost.split("-00000002.")[0]
        assert r["new_device"] and r["device"] != old
        assert r["written"] == f"{r['device']}-00000001.changeset"
        assert r["sent"] == had
        restored.memorize("After the restore", {})
        assert restored.sync(share)["written"] == f"{r['device']}-00000002.changeset"
        assert (share / lost).read_bytes() == sent
    finally:
        restored.close()


CHILD = textwrap.dedent(r'''
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from fakes import aokun, open_memory

    db, share, point = sys.argv[1:4]

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "written":  # the file is in the folder, the base not yet updated
        replace = os.replace
        def killing_replace(src, dst):
            replace(src, dst)
            if str(dst).endswith(".changeset"):
                die()
        aokun.os.replace = killing_replace
    elif point in ("imported", "pipeline"):  # the merge (or its rows only) committed, not applied
        name = "import_export" if point == "imported" else "run_pipeline"
        original = getattr(aokun.Memory, name)
        def killing(self, *a, **k):
            out = original(self, *a, **k)
            die()
        setattr(aokun.Memory, name, killing)
    m = open_memory(db)
    m.sync(share)
    print("SYNCED", flush=True)
    n = 0
    while point == "timed":  # writes and syncs until the kill, however fast this machine is
        n += 1
        m.memorize(f"Written on B after the first sync, {{n}}", {{}})
        m.sync(share)
''')


@pytest.mark.slow
@pytest.mark.parametrize("point", ["written", "imported", "pipeline", "timed"])
def test_kill_9_during_sync_leaves_both_files_consistent(three, tmp_path, point):
    a, b, _c, share, ids, _uids = three
    for i in range(40):
        a.memorize(f"Memory {i} written on A: Alice met Bob in room {i}",
                   {"participants": ["Alice", "Bob"]})
    a.edit(ids["edited"], "Edited on A before the crash")
    b.memorize("Written on B before the crash", {})
    b.close()
    a.sync(share)  # A's changes are in the folder
    child = tmp_path / "child.py"
    child.write_text(CHILD.format(tests=str(TESTS)), encoding="utf-8")
    cmd = [sys.executable, str(child), str(tmp_path / "b.db"), str(share), point]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if point == "timed":
        time.sleep(random.Random(7).uniform(0.6, 1.2))  # somewhere inside open + sync
        proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (out, err)
    b = aokun.Memory(tmp_path / "b.db", aokun.Config(None), embedder=FakeEmbedder(16))
    try:
        assert b.value("pragma integrity_check") == "ok"
        assert not [f for f in os.listdir(share) if f.endswith(".changeset")
                    and not (share / f).read_bytes().startswith(b'{"format": "aokun-changeset"')]
        sync_until_fixpoint([a, b], share, random.Random(1))
        assert content(a) == content(b)
        assert "Written on B before the crash" in memories(a).values()
        assert b.doctor() == [] and a.doctor() == []
    finally:
        b.close()


@pytest.mark.slow
def test_one_sync_at_a_time(three):
    a, _b, _c, share, _ids, _uids = three
    with a._sync_claim():
        with pytest.raises(aokun.AokunError, match="running"):
            a.sync(share)
    assert a.sync(share)["device"]


@pytest.mark.slow
def test_serve_syncs_on_its_timer(tmp_path, open_mem):
    share = tmp_path / "share"
    share.mkdir()
    cfg = aokun.Config(None, {("sync", "dir"): str(share), ("sync", "interval"): 1.0,
                              ("conversations", "watch"): False})
    mem = open_mem(tmp_path / "s.db", cfg=cfg)
    mem.memorize("Synced by the server's timer", {})
    stop = threading.Event()
    worker = threading.Thread(target=aokun._background, args=(mem, stop), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 20
        while not list(share.glob("*.changeset")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(share.glob("*.changeset"))) == 1
        mem.memorize("A second one, for the next interval", {})
        while len(list(share.glob("*.changeset"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(share.glob("*.changeset"))) == 2
        assert aokun.health(mem)["last_maintenance"]["sync"]
    finally:
        stop.set()
        worker.join(10)


def test_sync_settings_are_checked(tmp_path):
    ini = tmp_path / "aokun.ini"
    ini.write_text("[sync]\ninterval = 0\n", encoding="utf-8")
    with pytest.raises(aokun.AokunError, match=r"\[sync\] interval"):
        aokun.Config(ini)


@pytest.mark.slow
def test_cli_sync_and_conflicts(three, tmp_path, monkeypatch, segmenter):
    a, b, _c, share, ids, _uids = three
    at(monkeypatch, "2026-05-04T08:00:00Z")
    a.edit(ids["edited"], "The CLI's losing version")
    a.sync(share)
    at(monkeypatch, "2026-05-04T09:00:00Z")
    b.edit(ids["edited"], "The CLI's winning version")
    b.close()
    monkeypatch.delenv("AOKUN_NOW")
    monkeypatch.setattr(aokun, "Segmenter", lambda *a, **k: segmenter)
    monkeypatch.setattr(aokun, "make_embedder", lambda cfg: FakeEmbedder(16))
    runner = CliRunner()

    def run(*args):
        r = runner.invoke(aokun.cli, ["--db", str(tmp_path / "b.db"), *args],
                          catch_exceptions=False)
        assert r.exit_code == 0, r.output
        return r.output

    out = run("sync", str(share))
    assert "wrote " in out and "applied 1 file(s)" in out and "1 new conflict(s)" in out
    listed = run("sync", "--conflicts")
    assert "The CLI's losing version" in listed and "1 conflict(s)" in listed
    assert "0 conflict(s)" in run("sync", "--conflicts", "--persona", "work")
    r = runner.invoke(aokun.cli, ["--db", str(tmp_path / "b.db"), "sync",
                                  str(tmp_path / "nowhere")])
    assert r.exit_code != 0 and "is not a folder" in r.output and "Traceback" not in r.output



@pytest.mark.slow
def test_a_disk_full_while_writing_leaves_no_half_file_and_the_next_sync_sends_it(
        three, monkeypatch):
    a, b, _c, share, _ids, _uids = three
    uid = a.memorize("Written while the shared disk was full", {})["uid"]
    real_fsync = os.fsync

    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(aokun.AokunError, match="cannot write the changeset"):
        a.sync(share)
    assert not list(share.glob("*.tmp"))  # no half-written file for the other devices to trip on
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert a.sync(share)["written"]  # nothing was recorded as sent: the change goes out now
    b.sync(share)
    assert uid in memories(b)


def _cli(cwd: Path, *args, env=None) -> subprocess.CompletedProcess:
    """`python aokun.py ARGS` as a child process run in `cwd`, without the test's AOKUN_ variables
    (with `env`'s on top)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOKUN_")} | (env or {})
    return subprocess.run([sys.executable, str(TESTS.parent / "aokun.py"), *map(str, args)],
                          cwd=cwd, env=env, capture_output=True, text=True, encoding="utf-8",
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_a_relative_sync_dir_is_the_current_folders_and_the_settings_the_config_files(tmp_path):
    here, conf = tmp_path / "here", tmp_path / "conf"
    for d in (here / "share", conf / "shared"):
        d.mkdir(parents=True)
    ini = conf / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n[backup]\ndaily = false\n[sync]\ndir = shared\n"
                   "[conversations]\nwatch = false\n", encoding="utf-8")
    db = tmp_path / "a.db"
    assert _cli(here, "--db", db, "--config", ini, "memorize",
                "Alice likes green tea").returncode == 0
    r = _cli(here, "--db", db, "--config", ini, "sync", "share", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["folder"] == str(here / "share")
    assert [p.suffix for p in (here / "share").iterdir()] == [".changeset"]
    assert not (TESTS.parent / "share").exists()
    r = _cli(here, "--db", db, "--config", ini, "sync", "--json")  # [sync] dir: beside the config
    assert r.returncode == 0 and json.loads(r.stdout)["folder"] == str(conf / "shared"), r.stderr
    missing = _cli(here, "--db", db, "--config", ini, "sync", "nowhere")
    assert missing.returncode == 1 and str(here / "nowhere") in missing.stderr, missing.stderr


def _record_changeset(share: Path, device: str, rec: dict) -> str:
    """A changeset file of `device` (number 1) inserting export record `rec`; its name."""
    scratch = aokun.apsw.Connection(":memory:")
    scratch.execute(aokun._SYNC_TABLES)
    session = aokun.apsw.Session(scratch, "main")
    session.attach("records")
    scratch.execute("insert into records values (?, ?, ?, ?, ?)",
                    (rec["kind"], rec["uid"], rec["updated_at"], aokun.sync_hash(rec),
                     json.dumps(rec)))
    return _changeset_file(share, device, 1, aokun.zlib.compress(session.changeset())).name


@pytest.mark.slow
def test_a_changeset_of_a_newer_schema_or_with_unknown_fields_applies_nothing(three):
    a, b, _c, share, _ids, uids = three
    uid = a.memorize("From an Aokun with a newer schema", {})["uid"]
    name = a.sync(share)["written"]
    head, _, payload = (share / name).read_bytes().partition(b"\n")
    h = json.loads(head)
    assert h["schema"] == aokun.schema_version_known()
    (share / name).write_bytes(
        json.dumps(h | {"schema": h["schema"] + 1}).encode() + b"\n" + payload)
    r = b.sync(share)
    reason = {x["file"]: x["reason"] for x in r["skipped"]}[name]
    assert f"schema {h['schema'] + 1}, newer than this one" in reason and "upgrade Aokun" in reason
    assert name not in r["applied"] and uid not in memories(b)
    rec = next(r for r in a.export_records(kinds=("memory",)) if r.get("uid") == uids["edited"])
    rec |= {"content": "with a field from the future", "updated_at": "2026-06-01T00:00:00Z",
            "mood": "sunny"}
    odd = _record_changeset(share, "0b6f9c1e-0000-4000-8000-00000000000a", rec)
    r = b.sync(share)
    reason = {x["file"]: x["reason"] for x in r["skipped"]}[odd]
    assert "does not know (mood)" in reason, reason
    assert memories(b)[uids["edited"]] == "Alice 住在北京"
    (share / odd).unlink()
    # the newer Aokun's file, readable now
    (share / name).write_bytes(json.dumps(h).encode() + b"\n" + payload)
    assert name in b.sync(share)["applied"] and uid in memories(b)


@pytest.mark.slow
@pytest.mark.parametrize("change", ["schema", "field"])
def test_an_export_of_a_newer_schema_or_with_unknown_fields_imports_nothing(tmp_path, change):
    ini = tmp_path / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n[backup]\ndaily = false\n"
                   "[conversations]\nwatch = false\n", encoding="utf-8")
    src, dst, out = tmp_path / "src.db", tmp_path / "dst.db", tmp_path / "x.jsonl"
    for text in ("First exported memory", "Second exported memory"):
        assert _cli(tmp_path, "--db", src, "--config", ini, "memorize", text).returncode == 0
    assert _cli(tmp_path, "--db", src, "--config", ini, "export", "--out", out).returncode == 0
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    if change == "schema":
        lines[0]["schema"] += 1
    else:
        lines[-1]["mood"] = "sunny"  # the last record; every one before it is fine
    out.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                   encoding="utf-8")
    r = _cli(tmp_path, "--db", dst, "--config", ini, "import", out)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [line] = [x for x in r.stderr.splitlines() if not x.startswith("aokun: created")]
    assert ("newer than this one" if change == "schema" else "does not know (mood)") in line, line
    assert "nothing was imported" in line
    listed = _cli(tmp_path, "--db", dst, "--config", ini, "list", "--json")
    assert json.loads(listed.stdout) == []


CLAUDE = TESTS / "fixtures" / "conversations" / "claude-code" / "-home-dev-aokun" / \
    "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f.jsonl"


def _tombstones(mem) -> dict:
    return {r["uid"]: r["deleted_at"] for r in mem.export_records(kinds=("tombstone",))
            if r["kind"] == "tombstone"}


@pytest.mark.slow
def test_a_synced_deletion_keeps_the_time_it_happened(three, monkeypatch):
    a, b, _c, share, ids, uids = three
    at(monkeypatch, "2026-05-02T08:00:00Z")
    a.ingest("claude-code", [CLAUDE])
    a.sync(share)
    b.sync(share)
    [session] = [r["uid"] for r in b.export_records(kinds=("session",)) if r["kind"] == "session"]
    at(monkeypatch, "2026-05-03T08:00:00Z")  # deleted on A
    a.delete(ids["deleted"])
    a.delete_session(next(r["session_id"] for r in a.export_records(kinds=("session",))
                          if r["kind"] == "session"))
    a.sync(share)
    at(monkeypatch, "2026-05-09T08:00:00Z")  # merged on B days later
    b.sync(share)
    assert uids["deleted"] not in memories(b)
    mine, theirs = _tombstones(a), _tombstones(b)
    assert theirs[uids["deleted"]] == theirs[session] == "2026-05-03T08:00:00Z"
    assert theirs == mine and content(a) == content(b)


@pytest.mark.slow
def test_an_imported_tombstone_keeps_its_time(tmp_path):
    ini = tmp_path / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n[backup]\ndaily = false\n"
                   "[conversations]\nwatch = false\n", encoding="utf-8")
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    full, dump = tmp_path / "full.jsonl", tmp_path / "gone.jsonl"
    env = {"AOKUN_NOW": "2026-05-01T08:00:00Z"}
    assert _cli(tmp_path, "--db", a, "--config", ini, "memorize", "Soon deleted",
                env=env).returncode == 0
    assert _cli(tmp_path, "--db", a, "--config", ini, "export", "--out", full,
                env=env).returncode == 0
    assert _cli(tmp_path, "--db", b, "--config", ini, "import", full, env=env).returncode == 0
    env["AOKUN_NOW"] = "2026-05-03T08:00:00Z"
    assert _cli(tmp_path, "--db", a, "--config", ini, "delete", "1", env=env).returncode == 0
    assert _cli(tmp_path, "--db", a, "--config", ini, "export", "--out", dump,
                env=env).returncode == 0
    env["AOKUN_NOW"] = "2026-05-09T08:00:00Z"
    r = _cli(tmp_path, "--db", b, "--config", ini, "import", dump, env=env)
    assert r.returncode == 0 and "1 memories deleted by tombstones" in r.stdout, r.stdout + r.stderr
    [stone] = [x for x in map(json.loads, dump.read_text(encoding="utf-8").splitlines())
               if x["kind"] == "tombstone"]
    assert stone["deleted_at"] == "2026-05-03T08:00:00Z"
    c = aokun.apsw.Connection(str(b))
    assert c.execute("select deleted_at from tombstones").fetchall() == [("2026-05-03T08:00:00Z",)]


@pytest.mark.slow
def test_what_an_apply_creates_goes_out_in_the_same_sync(three):
    """Issue 33 item 9: twins written apart (either uid the smaller) and a fact reinforced on both
    sides: what applying makes (a twin's tombstone, a merged atom) is sent in the same sync, so
    after A, B, A, B the two files hold the same records."""
    a, b, _c, share, _ids, _uids = three
    texts = [f"Written on both devices, text {n}" for n in range(6)]
    for name, m in (("A", a), ("B", b)):
        for t in texts:
            m.memorize(t, {})
        m.memorize(f"On {name} Bob said it again.", {"key_facts": ["Bob prefers green tea"]})
    for m in (a, b, a, b):
        m.sync(share)
    assert content(a) == content(b)
    assert sorted(memories(a).values()).count(texts[0]) == 1
    assert len([k for k in content(a) if k[0] == "tombstone"]) == len(texts)  # one twin each
    assert all(not r["written"] and not r["applied"] for r in (a.sync(share), b.sync(share)))


@pytest.mark.slow
@pytest.mark.parametrize("change", ["primary key", "header"])
def test_a_changeset_of_another_table_layout_applies_nothing(three, change):
    """Issue 33 item 10: a changeset whose table `records` has our name and column count but
    another primary key, or whose header names another layout (a column's type), is skipped in
    one line naming the difference, and nothing of it is applied."""
    a, b, _c, share, _ids, uids = three
    rec = next(r for r in a.export_records(kinds=("memory",)) if r.get("uid") == uids["edited"])
    rec |= {"content": "From a changeset of another layout", "updated_at": "2026-06-01T00:00:00Z"}
    layout = aokun._SYNC_TABLES
    if change == "primary key":
        layout = layout.replace("body text, primary key(kind, uid));",
                                "body text, primary key(uid));")
    scratch = aokun.apsw.Connection(":memory:")
    scratch.execute(layout)
    session = aokun.apsw.Session(scratch, "main")
    session.attach("records")
    scratch.execute("insert into records values (?, ?, ?, ?, ?)",
                    (rec["kind"], rec["uid"], rec["updated_at"], aokun.sync_hash(rec),
                     json.dumps(rec)))
    path = _changeset_file(share, "0b6f9c1e-0000-4000-8000-00000000000b", 1,
                           aokun.zlib.compress(session.changeset()))
    if change == "header":
        head, _, payload = path.read_bytes().partition(b"\n")
        theirs = aokun.sync_layout()
        theirs["records"][2] = ["stamp", "integer", 0]
        path.write_bytes(json.dumps(json.loads(head) | {"layout": theirs}).encode() + b"\n"
                         + payload)
    r = b.sync(share)
    reason = {x["file"]: x["reason"] for x in r["skipped"]}[path.name]
    assert "table layout" in reason and "\n" not in reason, reason
    assert ("primary key" if change == "primary key" else "stamp") in reason, reason
    assert path.name not in r["applied"] and memories(b)[uids["edited"]] == "Alice 住在北京"
