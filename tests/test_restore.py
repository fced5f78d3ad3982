"""Restore keeps ids unique and loses no acknowledged write: every id counter of the restored file
is raised to what the live file handed out, and the safety copy and the overwrite happen under one
write lock, so a write acknowledged before the restore is in the restored file or in the safety
copy. With a real second process writing through the whole restore, and the real CLI."""

import re
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

import aokun
from mcp_procs import AOKUN, REPO, child_env, cli, stop, write_ini

WRITER = r"""
import sys
from pathlib import Path
import aokun
db, ini, stop = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
m = aokun.Memory(db, aokun.load_config(str(ini)))
i = 0
while not stop.exists():
    text = f"Writer memory {i}: Mika counted {i} herons by the lake."
    try:
        r = m.memorize(text, {"key_facts": [f"Mika counted {i} herons."]})
    except aokun.AokunError as e:  # a write caught mid-way by the restore: not acknowledged
        print("error", e, file=sys.stderr, flush=True)
    else:
        print(r["id"], text, flush=True)  # acknowledged
    i += 1
m.close()
"""


TABLES = ("documents", "memory_atoms", "graph_nodes", "graph_edges", "graph_entries", "kg_entities",
          "kg_triples", "memory_write_ops")  #: every table whose ids users or other rows hold


def _ids(path: Path) -> dict:
    """{table: every id} of each of TABLES, and the documents {id: content}, of file `path`."""
    c = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        out = {t: {r[0] for r in c.execute(f"select id from {t}")} for t in TABLES}
        out["content"] = dict(c.execute("select id, content from documents"))
        return out
    finally:
        c.close()


@pytest.mark.slow
def test_no_id_is_handed_out_twice_across_a_restore(open_mem, tmp_path):
    m = open_mem(tmp_path / "ids.db")
    birthday = m.memorize("My sister's birthday is on 3 May.",
                          {"participants": ["Sister"], "topics": ["family"]})["id"]
    m.kg_add("Sister", "lives_in", "Lyon")
    backup = tmp_path / "before.db"
    m.online_backup(backup)
    later = [m.memorize(t, {"participants": ["Ren"], "topics": ["travel"]})["id"]
             for t in ("My passport number is X1234567.", "The flight to Osaka leaves at 9.")]
    m.kg_add("Ren", "works_at", "Kyoto University")
    m.kg_add("Sister", "lives_in", "Paris")  # closes the Lyon fact: a second triple
    m.delete(later[1])  # the newest memory deleted before the restore: its id is spent too
    handed = {t: max(ids) for t, ids in _ids(m.path).items() if t != "content"}
    handed["documents"] = later[1]

    out = m.restore_from(backup)
    assert [r["id"] for r in m.rows("select id from documents")] == [birthday]
    new = m.memorize("Bought a new umbrella.",
                     {"participants": ["Ren"], "topics": ["shopping"]})["id"]
    m.kg_add("Ren", "likes", "umbrellas")
    m.edit(birthday, "My sister's birthday is on 4 May.")  # new atoms, graph entries, a journal row
    after = _ids(m.path)
    assert new > later[1]
    for table, high in handed.items():
        fresh = after[table] - _ids(backup)[table]
        assert fresh and min(fresh) > high, (table, sorted(fresh), high)
    # a client still holding the passport memory's id cannot delete the umbrella by it
    assert later[0] not in after["documents"] and later[1] not in after["documents"]
    assert out["only_in_previous"] == [later[0]] and out["previous_added"] == 1
    assert set(aokun.ID_COUNTERS) == set(TABLES)


def test_ids_stay_unique_after_deleting_the_newest_rows(open_mem, tmp_path):
    m = open_mem(tmp_path / "del.db")
    a = m.memorize("Kofi repairs bicycles on Saturdays.", {"participants": ["Kofi"]})["id"]
    before = {t: max(ids) for t, ids in _ids(m.path).items() if t != "content" and ids}
    m.delete(a)  # atoms, graph rows and the journal row go with it
    m.memorize("Kofi repairs bicycles on Sundays now.", {"participants": ["Kofi"]})
    after = _ids(m.path)
    for table, high in before.items():
        assert min(after[table]) > high, table


@pytest.mark.slow
def test_restore_under_a_live_writer_loses_no_acknowledged_write(tmp_path):
    db, ini, stop_file = tmp_path / "live.db", write_ini(tmp_path, "none"), tmp_path / "stop"
    for i in range(3):
        assert cli(db, ini, "memorize",
                   f"Before the backup {i}: a note about owls.").returncode == 0
    backup = tmp_path / "backup.db"
    assert cli(db, ini, "backup", str(backup)).returncode == 0
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(ini), str(stop_file)],
                              cwd=REPO, env=child_env(PYTHONPATH=str(REPO)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, encoding="utf-8")
    acked = []
    try:
        while len(acked) < 5:  # the writer is writing after the backup
            acked.append(writer.stdout.readline())
        restore = subprocess.Popen([sys.executable, AOKUN, "--db", str(db), "--config", str(ini),
                                    "restore", str(backup), "--yes"],
                                   cwd=REPO, env=child_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, encoding="utf-8")
        while restore.poll() is None:  # the writer keeps writing while the restore runs
            acked.append(writer.stdout.readline())
        for _ in range(5):  # and after it
            acked.append(writer.stdout.readline())
        stop_file.touch()
        rest, errors = writer.communicate(timeout=60)
        acked += rest.splitlines()
        out, err = restore.communicate()
    finally:
        stop_file.touch()
        stop(writer)
    assert restore.returncode == 0, err
    assert writer.returncode == 0, errors
    saved = Path(re.search(r"the previous content is in (\S+)", out).group(1))

    writes = [line.rstrip("\n").split(" ", 1) for line in acked if line.strip()]
    ids = [int(i) for i, _ in writes]
    assert len(ids) == len(set(ids)), "an id was handed out twice"
    restored, previous = _ids(db)["content"], _ids(saved)["content"]
    for i, text in writes:
        assert restored.get(int(i)) == text or previous.get(int(i)) == text, (i, text)
    only_saved = sorted(int(i) for i, text in writes if restored.get(int(i)) != text)
    lost = re.search(r"(\d+) memories written or changed after the backup .* ids ([\d, ]+)", out)
    assert lost, out
    assert only_saved and set(only_saved) <= {int(x) for x in lost.group(2).split(", ")}
    # writes after the restore are in it
    assert any(restored.get(int(i)) == text for i, text in writes)
    assert cli(db, ini, "doctor").stdout.strip() == "ok"


def _documents(path: Path) -> dict:
    return _ids(path)["content"]


@pytest.mark.slow
def test_restore_without_a_terminal_says_yes_is_needed_and_changes_nothing(tmp_path):
    db, ini = tmp_path / "m.db", write_ini(tmp_path)
    assert cli(db, ini, "memorize", "Before the backup").returncode == 0
    assert cli(db, ini, "backup", str(tmp_path / "b.db")).returncode == 0
    assert cli(db, ini, "memorize", "After the backup").returncode == 0
    before = _documents(db)
    r = cli(db, ini, "restore", str(tmp_path / "b.db"))  # stdin is /dev/null
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert "Aborted" not in r.stderr and "Traceback" not in r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "--yes" in line and "nothing was changed" in line, line
    assert _documents(db) == before


@pytest.mark.slow
def test_restore_answered_no_on_a_terminal_changes_nothing(tmp_path):
    import os
    import pty
    db, ini = tmp_path / "m.db", write_ini(tmp_path)
    assert cli(db, ini, "memorize", "Kept").returncode == 0
    assert cli(db, ini, "backup", str(tmp_path / "b.db")).returncode == 0
    assert cli(db, ini, "memorize", "Also kept").returncode == 0
    before = _documents(db)
    master, slave = pty.openpty()
    try:
        os.write(master, b"n\n")
        r = subprocess.run([sys.executable, AOKUN, "--db", str(db), "--config", str(ini), "restore",
                            str(tmp_path / "b.db")], cwd=REPO, stdin=slave, capture_output=True,
                           text=True, encoding="utf-8", timeout=60, env=child_env())
    finally:
        os.close(slave)
        os.close(master)
    assert r.returncode == 1 and "Replace every memory" in r.stdout, (r.stdout, r.stderr)
    assert r.stderr.strip() == \
        "Error: restore not confirmed, nothing was changed; answer y, or give --yes"
    assert _documents(db) == before
