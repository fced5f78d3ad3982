"""Which file is which device (issue 24 items 6 and 9), against the real program: `python aokun.py
--db … sync DIR` child processes on real files and shared folders. A file copied to another machine
with the same host name and path takes a new device id (one line on stderr) and the two converge;
a changeset a sync tool renamed is applied once; two files that wrote under one id (a disk image
the copy check cannot tell) both take new ids and lose nothing; atoms get the same uids and state
everywhere, so the devices' exports are identical."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more

TESTS = Path(__file__).resolve().parent
#: per device by nature: each device counts its own reads (usage bookkeeping; they travel with the
#: record's next real change, so two devices may hold different counts of the same version)
PER_DEVICE = ("access_count", "last_access_at")
INI = "[embedding]\nprovider = none\n[backup]\ndaily = false\n[conversations]\nwatch = false\n"


def run(tmp: Path, db: Path, *args) -> subprocess.CompletedProcess:
    """`python aokun.py --db DB --config INI ARGS`, a child process; fails the test when it
    fails."""
    ini = tmp / "aokun.ini"
    if not ini.exists():
        ini.write_text(INI, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOKUN_")}
    r = subprocess.run([sys.executable, str(TESTS.parent / "aokun.py"), "--db", str(db),
                        "--config", str(ini), *map(str, args)], env=env, capture_output=True,
                       text=True, encoding="utf-8", timeout=180, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def sync(tmp: Path, db: Path, share: Path) -> tuple[dict, list[str]]:
    """One `sync SHARE --json`: (its report, the lines it wrote on stderr)."""
    r = run(tmp, db, "sync", share, "--json")
    return json.loads(r.stdout), [x for x in r.stderr.splitlines() if x.strip()]


def exported(tmp: Path, db: Path) -> list[dict]:
    """The file's JSONL export (`export --out`), without the PER_DEVICE fields, in a stable
    order."""
    out = tmp / "export.jsonl"
    out.unlink(missing_ok=True)  # export never writes over a file
    run(tmp, db, "export", "--out", out)
    recs = [{k: v for k, v in json.loads(line).items() if k not in PER_DEVICE}
            for line in out.read_text(encoding="utf-8").splitlines()]
    return sorted(recs, key=lambda r: json.dumps(r, sort_keys=True, ensure_ascii=False))


def replicate(one: Path, two: Path) -> None:
    """What a sync tool (Syncthing) does to two replicas of the shared folder: each gets the other's
    files; two different files of one name keep the name on `one`'s side and the other is kept as
    `<name>.sync-conflict-<time>-MACHINEB.changeset`, in both replicas."""
    for f in sorted(two.iterdir()):
        mine = one / f.name
        if mine.exists() and mine.read_bytes() != f.read_bytes():
            renamed = f.name.replace(".changeset",
                                     ".sync-conflict-20261201-120000-MACHINEB.changeset")
            shutil.copy(f, one / renamed)
            shutil.copy(mine, f)
            shutil.copy(one / renamed, two / renamed)
        elif not mine.exists():
            shutil.copy(f, mine)
    for f in sorted(one.iterdir()):
        if not (two / f.name).exists():
            shutil.copy(f, two / f.name)


class Machine:
    """A machine whose file lives at the same path as every other machine's (`live`): while it
    runs its file is renamed into place (a rename keeps the inode, as the file on that machine's
    disk does), and parked on `disk` afterwards; `share` is its replica of the shared folder."""

    def __init__(self, tmp: Path, name: str, live: Path):
        self.tmp, self.live, self.disk = tmp, live, tmp / name / "aokun.db"
        self.share = tmp / name / "share"
        self.share.mkdir(parents=True)

    def __enter__(self) -> Path:
        os.replace(self.disk, self.live)
        return self.live

    def __exit__(self, *exc) -> None:
        for side in ("-wal", "-shm"):  # the children closed the file: nothing of it is beside it
            assert not Path(f"{self.live}{side}").exists()
        os.replace(self.live, self.disk)


def converge(tmp: Path, machines: list[Machine], rounds: int = 6) -> list[dict]:
    """Sync each machine in turn and replicate the folders until a round writes and applies nothing
    and skips no file. Returns the reports of the last round."""
    for _ in range(rounds):
        reports = []
        for m in machines:
            for other in machines[1:]:  # the sync tool has brought every replica up to date
                replicate(machines[0].share, other.share)
            with m as db:
                reports.append(sync(tmp, db, m.share)[0])
        assert not any(r["skipped"] or r["waiting"] for r in reports), reports
        if not any(r["written"] or r["applied"] for r in reports):
            return reports
    raise AssertionError(f"no fixpoint after {rounds} rounds")


def memory_texts(export: list[dict]) -> set[str]:
    return {r["content"] for r in export if r["kind"] == "memory"}


def test_a_copy_with_the_same_host_and_path_takes_a_new_id_and_both_converge(tmp_path):
    live = tmp_path / "live" / "aokun.db"
    live.parent.mkdir()
    one, two = Machine(tmp_path, "one", live), Machine(tmp_path, "two", live)
    run(tmp_path, one.disk, "memorize", "Alice lives in Beijing. Alice works at Agora.")
    first, err = sync(tmp_path, one.disk, one.share)
    assert first["new_device"] and first["written"] and err == []  # a first id is no news
    shutil.copy2(one.disk, two.disk)  # the file copied to machine two, to the same path there
    replicate(one.share, two.share)
    with two as db:
        run(tmp_path, db, "memorize", "Bob prefers tea. Bob lives in Tokyo.")
        r, err = sync(tmp_path, db, two.share)
    assert r["new_device"] and r["device"] != first["device"]
    assert len(err) == 1 and first["device"] in err[0] and r["device"] in err[0], err
    assert "copy" in err[0], err
    with one as db:  # the original keeps its id, silently
        run(tmp_path, db, "memorize", "Carol owns a red bicycle. Carol lives in Paris.")
        r, err = sync(tmp_path, db, one.share)
    assert r["device"] == first["device"] and not r["new_device"] and err == []
    converge(tmp_path, [one, two])
    with one as db:
        a = exported(tmp_path, db)
    with two as db:
        b = exported(tmp_path, db)
    assert memory_texts(a) == {"Alice lives in Beijing. Alice works at Agora.",
                               "Bob prefers tea. Bob lives in Tokyo.",
                               "Carol owns a red bicycle. Carol lives in Paris."}
    assert [r for r in a if r["kind"] == "atom"], "the memories' key facts made atoms"
    assert a == b


def test_a_changeset_renamed_by_a_sync_tool_is_applied_once(tmp_path):
    share = tmp_path / "share"
    share.mkdir()
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    run(tmp_path, a, "memorize", "First on A")
    one = sync(tmp_path, a, share)[0]["written"]
    run(tmp_path, a, "memorize", "Second on A")
    two = sync(tmp_path, a, share)[0]["written"]
    renamed = two.replace(".changeset", ".sync-conflict-20261201-120000-MACHINEA.changeset")
    os.replace(share / two, share / renamed)
    r = sync(tmp_path, b, share)[0]
    assert r["applied"] == [one, renamed] and not r["skipped"] and not r["waiting"], r
    shutil.copy(share / one,
                share / one.replace(".changeset", " (conflicted copy 2026-12-01).changeset"))
    shutil.copy(share / renamed, share / "copy of it.changeset")
    r = sync(tmp_path, b, share)[0]
    assert r["applied"] == [] and r["skipped"] == [] and r["merged"]["added"] == 0, r
    assert memory_texts(exported(tmp_path, b)) == {"First on A", "Second on A"}
    assert sync(tmp_path, a, share)[0]["applied"] == []  # A wrote them: its own, under any name


def test_two_files_that_wrote_under_one_id_both_take_new_ids_and_lose_nothing(tmp_path):
    """A disk image of the machine: the copy has the same inode too, so only the folder tells."""
    live = tmp_path / "live" / "aokun.db"
    live.parent.mkdir()
    one, two = Machine(tmp_path, "one", live), Machine(tmp_path, "two", live)
    run(tmp_path, one.disk, "memorize", "Before the image was taken")
    device = sync(tmp_path, one.disk, one.share)[0]["device"]
    shutil.copy2(one.disk, two.disk)
    replicate(one.share, two.share)
    witness = str(os.stat(two.disk).st_ino)
    con = apsw.Connection(str(two.disk))
    con.execute("update meta set value = ? where key = 'sync_device_witness'", (witness,))
    con.close()
    for m, text in ((one, "Written on one after the image"),
                    (two, "Written on two after the image")):
        with m as db:
            run(tmp_path, db, "memorize", text)
            r, err = sync(tmp_path, db, m.share)
        assert r["device"] == device and r["written"].endswith("-00000002.changeset") and err == []
    replicate(one.share, two.share)  # two files named <device>-00000002: one is renamed
    assert len([f for f in one.share.iterdir() if "sync-conflict" in f.name]) == 1
    ids = set()
    for m in (one, two):
        with m as db:
            r, err = sync(tmp_path, db, m.share)
        assert r["new_device"] and len(err) == 1 and "did not write" in err[0], err
        ids.add(r["device"])
        replicate(one.share, two.share)
    assert len(ids | {device}) == 3
    converge(tmp_path, [one, two])
    with one as db:
        a = exported(tmp_path, db)
        conflicts = run(tmp_path, db, "sync", "--conflicts", "--json").stdout
    with two as db:
        b = exported(tmp_path, db)
    assert memory_texts(a) == {"Before the image was taken", "Written on one after the image",
                               "Written on two after the image"}
    assert a == b
    assert json.loads(conflicts) == []  # sending everything again is no conflict
