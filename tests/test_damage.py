"""A damaged file and a full disk, made for real: flipped bytes in a table's pages, a truncated
copy, a small tmpfs in a mount namespace. Damage is found at open when SQLite can tell (a file cut
short) and on the first corrupt read anywhere; from then on every process refuses writes with one
line naming `restore` and the newest backup; doctor names it, restore puts a backup over it (the
damaged file kept aside, never read) and recover salvages what SQLite can read into a new file. A
full disk is one line, "the disk is full; nothing was stored", and loses nothing acknowledged."""

import json
import os
import random
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import apsw
import pytest
from click.testing import CliRunner

import aokun
from fakes import FakeEmbedder
from mcp_procs import AOKUN, REPO, child_env, cli, write_ini

TEXTS = [f"Memory {i}: Mika counted {i} herons by the lake in Lyon; the weather was fine."
         for i in range(200)]


def _made(path: Path, cfg: aokun.Config, segmenter) -> Path:
    """A file at `path` holding TEXTS, with one backup in [backup] dir; returns the backup."""
    m = aokun.Memory(path, cfg, embedder=FakeEmbedder(16))
    m.seg = segmenter
    m.memorize_many([(t, None) for t in TEXTS])
    backup = m.online_backup(m.manual_backup_path())["backup"]
    m.close()
    return Path(backup)


def _flip_table_pages(path: Path, table: str) -> None:
    """Overwrite part of every page of `table` (its b-tree, found through dbstat) with junk."""
    c = apsw.Connection(str(path))
    c.pragma("wal_checkpoint(TRUNCATE)")
    pages = [r[0] for r in c.execute("select pageno from dbstat where name = ?", (table,))]
    size = c.pragma("page_size")
    c.close()
    with open(path, "r+b") as f:
        for page in pages[1:]:
            f.seek((page - 1) * size + 8)
            f.write(random.Random(page).randbytes(size // 2))  # the same junk every run


@pytest.fixture
def cfg(tmp_path):
    return aokun.Config(None, overrides={("backup", "dir"): str(tmp_path / "backups"),
                                         ("backup", "daily"): False})


def test_the_first_corrupt_read_refuses_writes_in_every_process(tmp_path, cfg, segmenter,
                                                                 open_mem):
    db = tmp_path / "a.db"
    backup = _made(db, cfg, segmenter)
    _flip_table_pages(db, "documents")
    m = open_mem(db, cfg=cfg)
    assert m.damage is None  # not found at open: only a full check would read every page
    with pytest.raises(aokun.DamagedFile) as read:
        m.rows("select content from documents")
    with pytest.raises(aokun.DamagedFile) as write:
        m.memorize("Bought a new umbrella.")
    for e in (read.value, write.value):
        assert "damaged" in str(e) and f"restore {backup} --yes" in str(e)
        assert "recover NEW.db" in str(e) and "\n" not in str(e)
    other = open_mem(db, cfg=cfg)  # another process: the marker tells it
    with pytest.raises(aokun.DamagedFile):
        other.memorize("Bought a new umbrella.")
    assert other.doctor() and "damaged" in other.doctor()[0]


def test_recover_salvages_what_is_readable_into_a_new_file(tmp_path, cfg, segmenter, open_mem):
    db = tmp_path / "a.db"
    _made(db, cfg, segmenter)
    _flip_table_pages(db, "graph_entries")
    out = open_mem(db, cfg=cfg).salvage(tmp_path / "saved.db")
    assert out["rows"]["documents"] == len(TEXTS) and "graph_entries" in out["damaged"]
    saved = open_mem(tmp_path / "saved.db", cfg=cfg)
    saved.recover(fts=True)
    saved.backfill_vectors()
    assert saved.recall("how many herons did Mika count, memory 7")["results"]
    assert saved.value("select count(*) from documents") == len(TEXTS)
    with pytest.raises(aokun.AokunError, match="already exists"):
        open_mem(db, cfg=cfg).salvage(tmp_path / "saved.db")


def test_recover_skips_a_text_whose_bytes_are_no_longer_utf8(tmp_path, cfg, segmenter, open_mem):
    """A flipped byte in a memory's text (no page damage SQLite sees): that row is lost, the others
    are saved; it raised UnicodeDecodeError, a traceback to the user, before."""
    db = tmp_path / "a.db"
    _made(db, cfg, segmenter)
    c = apsw.Connection(str(db))
    c.pragma("wal_checkpoint(TRUNCATE)")
    c.close()
    data = bytearray(db.read_bytes())
    at = data.index(TEXTS[100].encode())
    data[at] = 0x9E  # no UTF-8 text starts with it
    db.write_bytes(bytes(data))
    out = open_mem(db, cfg=cfg).salvage(tmp_path / "saved.db")
    assert len(TEXTS) - 10 <= out["rows"]["documents"] < len(TEXTS), out["rows"]
    assert "documents" in out["damaged"]


def test_a_text_no_longer_utf8_is_damage_recall_and_doctor_name(tmp_path, cfg, segmenter,
                                                               open_mem):
    """integrity_check passes over a flipped byte in a memory's text, so doctor said "ok" while
    every recall meeting it failed with a UnicodeDecodeError traceback (found by the trial): both
    now name the damage and the way out, and writes are refused."""
    db = tmp_path / "a.db"
    _made(db, cfg, segmenter)
    c = apsw.Connection(str(db))
    c.execute("update documents set content = cast(x'e4bda08a' || cast(content as blob) as text) "
              "where id = (select min(id) from documents)")
    c.close()
    m = open_mem(db, cfg=cfg)
    with pytest.raises(aokun.DamagedFile, match="is damaged .a stored text is not UTF-8"):
        with m.sqlite_errors():  # as every MCP tool and CLI command reads
            m.recall("the", k=50)
    with pytest.raises(aokun.DamagedFile, match="recover NEW.db"):
        m.memorize("a new memory")
    m.damage_marker.unlink()
    m._damage = None
    said = m.doctor()
    assert len(said) == 1 and "is not UTF-8" in said[0] and "recover NEW.db" in said[0], said
    assert m.damage_marker.exists()  # a sound integrity_check no longer clears it


@pytest.mark.slow
def test_the_cli_names_the_damage_restores_over_it_and_recovers(tmp_path, segmenter):
    ini = write_ini(tmp_path)
    db = tmp_path / "a.db"
    backup = _made(db, aokun.load_config(str(ini)), segmenter)
    _flip_table_pages(db, "documents")
    doctor = cli(db, ini, "doctor")
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
    assert "problem: database" in doctor.stdout and f"restore {backup} --yes" in doctor.stdout
    write = cli(db, ini, "memorize", "Bought a new umbrella.")
    assert write.returncode == 1 and write.stderr.count("\n") == 1 and "damaged" in write.stderr
    salvaged = cli(db, ini, "recover", str(tmp_path / "saved.db"))
    assert salvaged.returncode == 0 and "memories" in salvaged.stdout, salvaged.stderr
    restored = cli(db, ini, "restore", str(backup), "--yes")
    assert restored.returncode == 0, restored.stderr
    assert "the damaged file is kept as" in restored.stdout
    assert [p.suffix for p in tmp_path.glob("a.damaged-*")] == [".db"]  # kept, never read
    assert not list(tmp_path.glob("*.part")) and not (tmp_path / "a.db-damaged").exists()
    assert cli(db, ini, "doctor").stdout.strip().endswith("ok")
    assert cli(db, ini, "list", "--json").stdout.count("herons") >= 20


def test_recover_skips_a_row_the_damage_left_without_a_required_value(tmp_path, segmenter):
    """Damage that leaves a row readable but a NOT NULL value gone (made here through the schema
    text): recover copies the other rows, names the table, and prints no traceback."""
    ini = write_ini(tmp_path)
    db = tmp_path / "a.db"
    _made(db, aokun.load_config(str(ini)), segmenter)
    c = apsw.Connection(str(db))
    c.pragma("writable_schema", True)
    c.execute("update sqlite_schema set sql = replace(sql, 'uid             text not null', "
              "'uid text') where name = 'documents'")
    c.close()
    c = apsw.Connection(str(db))
    c.execute("update documents set uid = null where id = (select min(id) from documents)")
    c.close()
    out = cli(db, ini, "recover", str(tmp_path / "saved.db"))
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"{len(TEXTS) - 1} memories" in out.stdout and "unreadable in: documents" in out.stdout


def test_restore_needs_no_doctor_first_and_only_this_files_backups_are_named(tmp_path, segmenter):
    ini = write_ini(tmp_path)
    db = tmp_path / "a.db"
    backup = _made(db, aokun.load_config(str(ini)), segmenter)
    other = backup.with_name("b-manual-29990101T000000Z.db")  # another file's, and newer
    shutil.copy(backup, other)
    os.utime(other, (4e9, 4e9))
    _flip_table_pages(db, "documents")
    restored = cli(db, ini, "restore", str(backup), "--yes")  # the damage not yet flagged
    assert restored.returncode == 0 and "Traceback" not in restored.stderr, restored.stderr
    _flip_table_pages(db, "documents")
    doctor = cli(db, ini, "doctor")
    assert f"restore {backup} --yes" in doctor.stdout and str(other) not in doctor.stdout


def test_a_backup_of_a_damaged_index_names_the_file_damaged(tmp_path, cfg, segmenter, open_mem):
    """An index page damaged (no read of the rows touches it): the backup's integrity_check fails
    on the exact copy, so the file is damaged, said in one line, and every process is told."""
    db = tmp_path / "a.db"
    _made(db, cfg, segmenter)
    _flip_table_pages(db, "documents_created")
    m = open_mem(db, cfg=cfg)
    with pytest.raises(aokun.DamagedFile) as e:
        m.online_backup(tmp_path / "backups" / "again.db")
    assert "is damaged (integrity_check:" in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).isprintable() and (tmp_path / "a.db-damaged").exists()
    assert not (tmp_path / "backups" / "again.db").exists()


def test_a_read_of_a_file_found_damaged_says_so(tmp_path, cfg, segmenter, open_mem, monkeypatch):
    """Damage found by one process (the marker) on pages a read does not touch: recall and the
    CLI's reads answer what is readable and say the file is damaged; doctor clears a false one."""
    db = tmp_path / "a.db"
    _made(db, cfg, segmenter)
    (tmp_path / "a.db-damaged").write_text("database disk image is malformed", encoding="utf-8")
    m = open_mem(db, cfg=cfg)
    out = m.recall("How many herons did Mika count?", k=3)
    assert out["results"] and any("damaged" in w for w in out["warnings"]), out["warnings"]
    ini = tmp_path / "aokun.ini"
    ini.write_text(f"[embedding]\nprovider = none\n[backup]\ndir = {tmp_path / 'backups'}\n",
                   encoding="utf-8")
    monkeypatch.setattr(aokun, "Segmenter", lambda *a, **k: segmenter)
    for args in (["list"], ["stats"]):
        r = CliRunner().invoke(aokun.cli, ["--db", str(db), "--config", str(ini), *args],
                               catch_exceptions=False)
        assert r.exit_code == 0 and "herons" in r.stdout or args == ["stats"], r.output
        said = r.stderr.strip().splitlines()
        assert len(said) == 1 and said[0].startswith("Warning: database") \
            and "damaged" in said[0] and "restore" in said[0], said
    assert m.doctor() == [] or "damaged" not in " ".join(m.doctor())  # sound: the marker goes
    assert not (tmp_path / "a.db-damaged").exists()


@pytest.mark.slow
@pytest.mark.parametrize("args", [["serve"], ["stats"], ["doctor"], ["backup"]])
def test_a_truncated_file_is_one_line(tmp_path, segmenter, args):
    ini = write_ini(tmp_path)
    good = tmp_path / "good.db"
    backup = _made(good, aokun.load_config(str(ini)), segmenter)
    shutil.copy(backup, backup.with_name("cut-manual-20260101T000000Z.db"))  # cut.db's own
    db = tmp_path / "cut.db"
    db.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    r = cli(db, ini, *args)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    said = (r.stdout + r.stderr).strip().splitlines()
    assert len(said) == 1 and "is damaged" in said[0] and "restore" in said[0], said


FULL_DISK = r"""
import json, os, subprocess, sys
from pathlib import Path
import anyio
from mcp import Client
sys.path.insert(0, sys.argv[3])
from fakes import FakeEmbedder  # puts the repository on sys.path
import aokun

mnt, out = Path(sys.argv[1]), Path(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
cfg = aokun.Config(None, overrides={("backup", "dir"): str(mnt / "backups"),
                                    ("backup", "daily"): False})
server = aokun.build_server(lambda: aokun.Memory(mnt / "a.db", cfg, embedder=FakeEmbedder(16)),
                            cfg)
said, stored = [], []

async def main():
    async with Client(server) as c:
        for i in range(400):
            r = await c.call_tool("memorize", {"content": f"note {i} " + os.urandom(3000).hex()})
            if r.is_error:
                said.append((i, r.content[0].text))
                if len(said) == 3:
                    break
            else:
                stored.append(r.structured_content["id"])
anyio.run(main)
doctor = subprocess.run([sys.executable, sys.argv[4], "--db", str(mnt / "a.db"), "--config",
                         sys.argv[5], "doctor"], capture_output=True, text=True)
m = aokun.Memory(mnt / "a.db", cfg, embedder=FakeEmbedder(16))
kept = [r["id"] for r in m.rows("select id from documents order by id")]
try:
    backup = str(m.online_backup(mnt / "backups" / "full.db"))
except aokun.AokunError as e:
    backup = "refused: " + str(e)
m.close()
subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)  # space again
m = aokun.Memory(mnt / "a.db", cfg, embedder=FakeEmbedder(16))
m.recover()  # what a write left in the journal is finished now
notes = {int(r["content"].split()[1]) for r in m.rows("select content from documents")}
m.close()
out.write_text(json.dumps({"said": said, "stored": stored, "kept": kept, "backup": backup,
                           "notes": sorted(notes),
                           "parts": [p.name for p in mnt.rglob("*.part")],
                           "doctor": [doctor.returncode, doctor.stdout, doctor.stderr]}))
"""


def _namespaces() -> str | None:
    """Why a tmpfs cannot be mounted in a new mount namespace here, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("unshare"):
        return "needs root and unshare(1) to mount a small tmpfs in a mount namespace"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m cannot mount here: {probe.stderr}"


@pytest.mark.slow
@pytest.mark.skipif(_namespaces() is not None, reason=str(_namespaces()))
def test_a_full_disk_is_one_line_and_loses_nothing_acknowledged(tmp_path):
    (tmp_path / "mnt").mkdir()
    script = tmp_path / "full.py"
    script.write_text(FULL_DISK, encoding="utf-8")
    ini = write_ini(tmp_path)
    r = subprocess.run(["unshare", "-m", sys.executable, str(script), str(tmp_path / "mnt"),
                        str(tmp_path / "out.json"), str(Path(__file__).parent), AOKUN, str(ini)],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=child_env())
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["stored"] and out["said"], out
    for i, line in out["said"]:
        assert "the disk holding" in line and "is full" in line and "\n" not in line, line
        # said so, not stored later by recovery; else said it waits to be stored
        assert ("nothing was stored" in line) == (i not in out["notes"]), (i, line)
    assert set(out["stored"]) <= set(out["kept"])  # every acknowledged write stayed
    assert out["backup"].startswith("refused: ") and "\n" not in out["backup"], out["backup"]
    assert out["parts"] == []  # the failed backup's copy is gone (it was left, 0 bytes)
    code, stdout, stderr = out["doctor"]
    assert "Traceback" not in stderr and code == 1, (stdout, stderr)
    assert "is full" in stdout or "is full" in stderr, (stdout, stderr)
    said = (stdout + stderr).strip().splitlines()  # the disk, unfinished and failed writes
    assert len(said) <= 3 and all(x.startswith("problem: ") for x in said), (stdout, stderr)



def test_a_server_checks_its_file_when_it_starts(tmp_path, cfg, segmenter, open_mem):
    """A damaged index page that no read touches went unnoticed: the server started, and recall and
    memorize worked, writing into the damaged file; only doctor said so. The server's background
    thread runs quick_check first: writes are refused from then on, in every process."""
    db = tmp_path / "a.db"
    _made(db, cfg, segmenter)
    _flip_table_pages(db, "documents_created")
    m = open_mem(db, cfg=cfg)
    assert m.damage is None  # not found at open
    stop = threading.Event()
    stop.set()  # the warm-up, then return
    aokun._background(m, stop)
    assert "quick_check" in (m.damage or "") and (tmp_path / "a.db-damaged").exists()
    with pytest.raises(aokun.DamagedFile):
        open_mem(db, cfg=cfg).memorize("Bought a second umbrella.")  # another process
