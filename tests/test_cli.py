"""The click CLI, in-process via CliRunner, on a temp database with provider = none."""

import json
import sqlite3

import apsw
import pytest
from click.testing import CliRunner

import aokun

RULES = aokun.HERE / "rules"


@pytest.fixture
def ini(tmp_path):
    """provider = none keeps the CLI fast; the rules come from beside aokun.py."""
    p = tmp_path / "aokun.ini"
    p.write_text("[embedding]\nprovider = none\n", encoding="utf-8")
    return p


@pytest.fixture
def run(tmp_path, ini, monkeypatch, segmenter):
    """run(*args) -> click Result, with --db/--config pointing into tmp_path."""
    monkeypatch.setattr(aokun, "Segmenter", lambda *a, **k: segmenter)  # share one loaded jieba
    db = tmp_path / "cli.db"
    db.touch()  # an empty file is a new database; made here, no "created" notice mixes into output
    runner = CliRunner()

    def invoke(*args, ok=True):
        result = runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), *map(str, args)],
                               catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        return result

    invoke.db = db
    return invoke


def _db(path):
    return sqlite3.connect(path)


@pytest.mark.slow
def test_memorize_prints_an_id_and_show_list_work(run):
    r = run("memorize", "Alice 喜欢冰美式", "--participant", "Alice", "--topic", "coffee",
            "--importance", "0.8")
    assert r.output.strip() == "1"
    r = run("memorize", "Bob fixed the 8090 port clash", "--json")
    out = json.loads(r.output)
    assert out["id"] == 2 and out["status"] == "done" and out["embedding"] == "none"
    assert run("memorize", "Alice 喜欢冰美式").output.strip() == "1"  # dedup

    show = run("show", "1").output
    assert "Alice 喜欢冰美式" in show and "coffee" in show and "0.8" in show
    assert "[preference, active, x0]" in show  # its atom
    js = json.loads(run("show", "1", "--json").output)
    assert js["content"] == "Alice 喜欢冰美式" and js["participants"] == ["Alice"] \
        and js["graph_entries"]

    lines = run("list").output.strip().splitlines()
    assert len(lines) == 2 and "Bob fixed the 8090 port clash" in lines[0] + lines[1]
    rows = json.loads(run("list", "--json", "--limit", "1").output)
    assert len(rows) == 1


def test_stored_text_is_byte_identical(run):
    keep = "E = mc² ½ ① ™ ㎏，"  # NFKC would make it "E = mc2 1⁄2 1 TM kg,"
    out = json.loads(run("memorize", keep, "--summary", keep, "--topic", keep, "--participant",
                         keep, "--fact", keep, "--json").output)
    js = json.loads(run("show", str(out["id"]), "--json").output)
    assert js["content"].encode("utf-8") == keep.encode("utf-8")
    assert (js["summary"], js["topics"], js["participants"], js["key_facts"]) == \
        (keep, [keep], [keep], [keep])
    assert [a["content"] for a in js["atoms"]] == [keep]
    assert keep in run("show", str(out["id"])).output
    hits = json.loads(run("recall", "mc2 kg", "--json").output)["results"]
    assert hits[0]["id"] == out["id"] and hits[0]["text"] == keep
    with _db(run.db) as c:  # the bytes in the file
        assert c.execute("select content from documents").fetchone()[0].encode("utf-8") == \
            keep.encode("utf-8")


def test_recall_prints_relevance_and_what_replaced_a_hit(run):
    old = run("memorize", "I live in Hangzhou.").output.split()[-1]
    new = run("memorize", "I moved to Shanghai.").output.split()[-1]  # after its warning line
    lines = [x for x in run("recall", "Hangzhou Shanghai").output.splitlines()
             if x.strip()[:1].isdigit()]  # the hits, not stderr's degraded: vector
    assert lines[0].split()[:2] == [new, "–"]  # provider none: no relevance, not the score
    assert lines[1].split()[:2] == [old, "–"] and f"(replaced by {new}) I live in" in lines[1]


def test_stats_json_and_doctor(run):
    run("memorize", "one memory", "--participant", "Eve")
    run("memorize", "another memory")
    s = json.loads(run("stats", "--json").output)
    assert s["counts"]["documents"] == 2 and s["counts"]["documents_fts"] == 2
    assert s["counts"]["doc_vectors"] == 0 and s["embedding"]["provider"] == "none"
    assert s["journal"] == {"done": 2} and s["schema_version"] == aokun.schema_version_known()
    assert "documents" in run("stats").output
    assert run("doctor").output.strip().splitlines()[-1] == "ok"

    with _db(run.db) as c:  # break an index behind the engine's back: doctor repairs it
        c.execute("delete from documents_fts where rowid = 1")
    out = run("doctor").output
    assert "repaired: " in out and "'fts_backfilled': 1" in out and out.strip().endswith("ok")
    with _db(run.db) as c:  # something recovery does not repair
        c.execute("insert into memory_write_ops(op, payload, status, error, created_at, "
                  "updated_at) values ('insert', '{}', 'failed', 'boom', 'x', 'x')")
    r = run("doctor", ok=False)
    assert r.exit_code == 1
    assert "problem: 1 failed writes in the journal" in r.output and "ok" not in r.output.split()


def test_pin_unpin_archive_unarchive_delete(run):
    run("memorize", "flag me")
    flags = lambda: _db(run.db).execute(  # noqa: E731
        "select pinned, archived from documents where id = 1").fetchone()
    assert run("pin", "1").output.strip() == "pinned 1" and flags() == (1, 0)
    assert run("unpin", "1").output.strip() == "unpinned 1" and flags() == (0, 0)
    assert run("archive", "1").output.strip() == "archived 1" and flags() == (0, 1)
    assert run("list").output.strip() == ""  # archived ones are hidden
    assert "flag me" in run("list", "--include-archived").output
    assert run("unarchive", "1").output.strip() == "unarchived 1" and flags() == (0, 0)
    assert run("delete", "1").output.strip() == "deleted 1"
    with _db(run.db) as c:
        assert c.execute("select count(*) from documents").fetchone() == (0,)
        assert c.execute("select count(*) from tombstones").fetchone() == (1,)
    r = run("delete", "1", ok=False)
    assert r.exit_code != 0 and "no memory with id 1" in r.output


def test_edit(run):
    run("memorize", "old words here")
    assert run("edit", "1", "--text", "new words there", "--importance", "0.9").output.strip() == \
        "1"
    js = json.loads(run("show", "1", "--json").output)
    assert js["content"] == "new words there" and js["importance"] == 0.9
    r = run("edit", "1", ok=False)
    assert r.exit_code == 2 and "give --text" in r.output


@pytest.mark.parametrize("args, needle", [
    (("show", "999"), "no memory with id 999"),
    (("pin", "999"), "no memory with id 999"),
    (("memorize", "x", "--timestamp", "yesterday"), "metadata.timestamp"),
    (("memorize", "   "), "content: is empty"),
])
def test_errors_are_one_line_and_non_zero(run, args, needle):
    run("memorize", "something")
    r = run(*args, ok=False)
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("Error:")
    assert "Traceback" not in r.output


def test_backup_and_vacuum(run, tmp_path):
    for i in range(5):
        run("memorize", f"memory {i} for the backup")
    dest = tmp_path / "copies" / "backup.db"
    r = run("backup", dest)
    assert str(dest) in r.output and dest.exists()
    with _db(dest) as c:
        assert c.execute("select count(*) from documents").fetchone() == (5,)
        assert c.execute("pragma integrity_check").fetchone() == ("ok",)
    again = run("backup", dest, ok=False)
    assert again.exit_code == 1 and "already exists" in again.output
    r = run("vacuum")
    assert "->" in r.output and "bytes" in r.output
    assert run("doctor").output.strip().splitlines()[-1] == "ok"


def test_rebuild(run):
    run("memorize", "rebuild me please", "--participant", "Zed")
    with _db(run.db) as c:
        rows = sum(c.execute(f"select count(*) from {t}").fetchone()[0]
                   for t in ("documents", "memory_atoms", "graph_entries"))
    out = json.loads(run("rebuild", "--fts", "--graph").output)
    assert out == {"fts": rows, "graph": 1} and rows >= 1 + 1 + 2
    assert run("doctor").output.strip().splitlines()[-1] == "ok"
    r = run("rebuild", "--vectors", ok=False)
    assert r.exit_code == 1 and "provider is none" in r.output
    assert run("rebuild", ok=False).exit_code == 2


def test_every_command_has_an_example():
    runner = CliRunner()
    assert "Example" in runner.invoke(aokun.cli, ["--help"]).output
    assert len(aokun.cli.commands) >= 14
    missing = []
    for name in sorted(aokun.cli.commands):
        r = runner.invoke(aokun.cli, [name, "--help"])
        assert r.exit_code == 0, (name, r.output)
        if "Example" not in r.output:
            missing.append(name)
    assert missing == []


def test_version():
    r = CliRunner().invoke(aokun.cli, ["--version"])
    assert r.exit_code == 0 and aokun.__version__ in r.output


@pytest.mark.slow
def test_config_outside_the_repo_uses_the_bundled_rules(tmp_path):
    p = tmp_path / "only-provider.ini"
    p.write_text("[embedding]\nprovider = none\n", encoding="utf-8")
    cfg = aokun.Config(p)
    assert cfg.rule_file(cfg.write.atom_rules) == RULES / "atoms.toml"
    assert cfg.rule_file(cfg.text.stopwords) == RULES / "stopwords.txt"
    r = CliRunner().invoke(aokun.cli, ["--db", str(tmp_path / "x.db"), "--config", str(p),
                                       "memorize", "hello"])
    assert r.exit_code == 0 and r.stdout.strip() == "1"
    assert r.stderr == f"aokun: created a new database {tmp_path / 'x.db'}{aokun.HISTORY_OPT_IN}\n"


def test_a_config_saved_with_a_byte_order_mark_is_read(tmp_path):
    p = tmp_path / "notepad.ini"  # Windows Notepad's UTF-8 begins with U+FEFF
    p.write_text("\ufeff[recall]\nmin_relevance = 0.3\n", encoding="utf-8")
    assert aokun.Config(p).recall.min_relevance == 0.3


def test_feedback_marks_memories_useful_or_not(run):
    assert run("memorize", "Kim plays chess on Tuesdays").output.strip() == "1"
    out = run("feedback", "1").output
    assert "importance 0.50 -> 0.55" in out and "useful x1" in out
    js = json.loads(run("feedback", "1", "--not-useful", "--json").output)
    assert js["useful"] is False and js["results"][0]["importance"] == pytest.approx(0.5)
    assert js["results"][0]["useful_count"] == 1
    missing = run("feedback", "7", ok=False)
    assert missing.exit_code != 0 and "no memory with id 7" in missing.output
    # another persona's id
    assert run("feedback", "1", "--persona", "work", ok=False).exit_code != 0
    assert run("feedback", ok=False).exit_code != 0  # an id is required
    assert run("feedback", "0", ok=False).exit_code != 0


def test_a_database_held_busy_is_one_line(tmp_path):
    """Another process holding the write lock longer than busy_timeout_ms: one line, no trace."""
    from mcp_procs import write_ini
    ini = write_ini(tmp_path, storage={"busy_timeout_ms": 200})
    db = tmp_path / "busy.db"
    runner = CliRunner()
    assert runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), "memorize",
                                     "first"]).exit_code == 0
    holder = apsw.Connection(str(db))
    holder.execute("begin immediate")
    try:
        r = runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), "memorize", "two"])
    finally:
        holder.execute("rollback")
        holder.close()
    assert r.exit_code == 1 and "database is busy" in r.output and "Traceback" not in r.output


def test_hints_name_the_command_as_it_was_run(monkeypatch):
    monkeypatch.setattr("sys.argv", ["/home/u/.local/bin/aokun", "doctor"])
    assert aokun.command_line("restore", {"yes": True}) == "`aokun restore --yes`"
    monkeypatch.setattr("sys.argv", ["aokun.py", "doctor"])
    assert aokun.command_line("doctor") == "`python aokun.py doctor`"


def test_db_and_config_are_taken_after_the_command(tmp_path, ini, monkeypatch, segmenter):
    """`aokun memorize X --db F` (where users put it) writes to F, like `aokun --db F memorize X`;
    after `--` the words are the command's own text."""
    monkeypatch.setattr(aokun, "Segmenter", lambda *a, **k: segmenter)
    db = tmp_path / "after.db"
    db.touch()
    runner = CliRunner()
    r = runner.invoke(aokun.cli, ["memorize", "Alice likes oolong", f"--config={ini}",
                                  "--db", str(db)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = runner.invoke(aokun.cli, ["recall", "oolong", "--db", str(db), "--config", str(ini),
                                  "--json", "--limit", "1"], catch_exceptions=False)
    assert "Alice likes oolong" in r.output
    r = runner.invoke(aokun.cli, ["--db", str(db), "--config", str(ini), "memorize", "--",
                                  "--db"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert aokun.Memory(db, aokun.load_config(ini)).rows(
        "select count(*) n from documents where content = '--db'")[0]["n"] == 1
    r = runner.invoke(aokun.cli, ["list", "--db"])
    assert r.exit_code == 2 and "--db" in r.output


def test_doctor_on_a_missing_file_says_so_and_makes_none(tmp_path, ini):
    missing = tmp_path / "nowhere" / "m.db"
    result = CliRunner().invoke(aokun.cli, ["--db", str(missing), "--config", str(ini), "doctor"])
    assert result.exit_code == 1 and "there is no database at" in result.output, result.output
    assert "Traceback" not in result.output and not missing.exists()
