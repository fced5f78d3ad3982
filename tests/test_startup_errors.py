"""What goes wrong before any work starts reaches the user as one line, never a traceback: a broken
ini file, a setting out of its range, a --db that is no database or cannot be made, numbers beyond
SQLite's range; error hints name commands that exist (`python aokun.py …`, or the MCP tool)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client

import aokun
from fakes import FakeEmbedder
from mcp_procs import AOKUN, REPO, child_env, free_port, write_ini

BIG = 2 ** 63
CREATED = "aokun: created a new database "


def run(*args, env=None) -> subprocess.CompletedProcess:
    """`python aokun.py ARGS...` as a child process, text output captured."""
    return subprocess.run([sys.executable, AOKUN, *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, encoding="utf-8", timeout=120, stdin=subprocess.DEVNULL,
                          env=env or child_env())


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert `r` failed with exactly one stderr line holding every needle, and no traceback (the
    notice that a new database file was made, before the error, is not counted)."""
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if not x.startswith(CREATED)]
    assert len(lines) == 1, r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.slow
def test_an_ini_without_a_section_header(tmp_path):
    ini = tmp_path / "headless.ini"
    ini.write_text("db = data/x.db\n[storage]\n", encoding="utf-8")
    one_line_error(run("--db", tmp_path / "a.db", "--config", ini, "stats"),
                   str(ini), "line 1", "[section]")


@pytest.mark.slow
def test_an_ini_with_a_repeated_section(tmp_path):
    ini = tmp_path / "twice.ini"
    ini.write_text("[storage]\n[storage]\n", encoding="utf-8")
    one_line_error(run("--db", tmp_path / "a.db", "--config", ini, "stats"), str(ini), "storage")


@pytest.mark.slow
def test_db_that_is_not_an_sqlite_file(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("just some notes, not a database\n" * 50, encoding="utf-8")
    one_line_error(run("--db", notes, "--config", write_ini(tmp_path), "stats"),
                   str(notes), "not an SQLite database")
    assert notes.read_text(encoding="utf-8").startswith("just some notes")


@pytest.mark.slow
def test_db_in_a_folder_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    db = blocker / "sub" / "m.db"
    one_line_error(run("--db", db, "--config", write_ini(tmp_path), "memorize", "hello"),
                   str(db), "folder")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_db_that_is_a_device(tmp_path):
    one_line_error(run("--db", "/dev/null", "--config", write_ini(tmp_path), "stats"),
                   "/dev/null", "cannot be opened")


@pytest.mark.slow
def test_backup_to_a_folder_that_cannot_be_created_or_written(tmp_path):
    db, ini = tmp_path / "r.db", write_ini(tmp_path)
    assert run("--db", db, "--config", ini, "memorize", "hello").returncode == 0
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    one_line_error(run("--db", db, "--config", ini, "backup", blocker / "sub" / "b.db"),
                   str(blocker / "sub"))
    if os.path.isdir("/proc/self"):  # a folder no one (root neither) can create files in
        one_line_error(run("--db", db, "--config", ini, "backup", "/proc/aokun-b.db"),
                       "/proc/aokun-b.db")
        one_line_error(run("--db", db, "--config", ini, "backup", "/proc/x/y.db"), "/proc/x")


@pytest.mark.slow
def test_port_out_of_range_in_the_ini(tmp_path):
    ini = write_ini(tmp_path, server={"port": 99999})
    one_line_error(run("--db", tmp_path / "a.db", "--config", ini, "serve", "--http"),
                   str(ini), "[server] port", "1..65535")


@pytest.mark.slow
@pytest.mark.parametrize(("section", "key", "value", "allowed"), [
    ("recall", "recency_days", "0", "> 0"),
    ("recall", "recency_days", "nan", "> 0"),
    ("recall", "min_relevance", "1.5", "0..1"),
    ("recall", "weight_bm25", "-0.5", ">= 0"),
    ("recall", "max_k", "0", ">= 1"),
    ("embedding", "batch_size", "-1", ">= 1"),
    ("write", "max_auto_facts", "-3", ">= 0"),
    ("context", "chat_tokens", "10", ">= 50"),
    ("forgetting", "decay_hour", "24", "0..23"),
    ("forgetting", "scheduler_interval_seconds", "inf", "> 0"),
    ("backup", "keep_days", "0", ">= 1"),
])
def test_settings_out_of_range(tmp_path, section, key, value, allowed):
    ini = write_ini(tmp_path, **{section: {key: value}})
    one_line_error(run("--db", tmp_path / "a.db", "--config", ini, "stats"),
                   str(ini), f"[{section}] {key} = {value}", f"allowed: {allowed}")


def test_every_numeric_setting_has_a_range_its_default_is_in(tmp_path):
    numeric = {(s, k) for s, kv in aokun.DEFAULTS.items() for k, v in kv.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    ranged = {(s, k) for s, kv in aokun.RANGES.items() for k in kv}
    assert numeric == ranged
    assert [sk for sk in numeric
            if not aokun.in_range(aokun.DEFAULTS[sk[0]][sk[1]], aokun.RANGES[sk[0]][sk[1]])] == []
    edges = aokun.Config(write_ini(tmp_path, recall={"min_relevance": 1, "mmr_lambda": 0},
                                   server={"port": 65535}))
    assert (edges.recall.min_relevance, edges.recall.mmr_lambda, edges.server.port) == \
        (1.0, 0.0, 65535)


@pytest.mark.slow
@pytest.mark.parametrize("args", [("show", BIG), ("delete", BIG), ("pin", BIG), ("feedback", BIG),
                                  ("edit", BIG, "--summary", "x"), ("kg", "invalidate", BIG)])
def test_ids_beyond_sqlite_rowids_on_the_cli(tmp_path, args):
    one_line_error(run("--db", tmp_path / "a.db", "--config", write_ini(tmp_path), *args), str(BIG))


@pytest.mark.slow
def test_list_offset_beyond_sqlite_integers(tmp_path):
    one_line_error(run("--db", tmp_path / "a.db", "--config", write_ini(tmp_path), "list",
                       "--offset", BIG), "offset")


@pytest.mark.slow
def test_hints_name_a_command_that_exists(tmp_path):
    line = one_line_error(run("--db", tmp_path / "a.db", "--config", write_ini(tmp_path),
                              "show", "42"),
                          "no memory with id 42", "`python aokun.py list`")
    assert "`aokun " not in line
    hints = [line for p in [aokun.__file__, *aokun.SQL_DIR.glob("*.sql")]
             for line in open(p, encoding="utf-8")
             if "`aokun " in line and not line.lstrip().startswith("--")]
    assert hints == []


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.slow
@pytest.mark.anyio
async def test_mcp_ids_and_offsets_beyond_sqlite_integers_are_tool_errors(tmp_path, segmenter):
    cfg = aokun.Config(None, overrides={("server", "exposed_tools"): "all",
                                        ("backup", "dir"): str(tmp_path / "bk"),
                                        ("backup", "daily"): False})

    def factory():
        m = aokun.Memory(tmp_path / "m.db", cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        return m

    with anyio.fail_after(60):
        async with Client(aokun.build_server(factory, cfg)) as c:
            for tool, args, needle in [("get_memory", {"id": BIG}, f"id {BIG}"),
                                       ("delete_memory", {"id": BIG}, f"id {BIG}"),
                                       ("memory_feedback", {"ids": [BIG]}, f"id {BIG}"),
                                       ("list_memories", {"offset": BIG}, "offset")]:
                r = await c.call_tool(tool, args)
                assert r.is_error is True, (tool, r)
                text = r.content[0].text
                assert needle in text and "Traceback" not in text, (tool, text)
                assert "OverflowError" not in text, (tool, text)
            # over MCP the hint names the tool, not a shell command
            text = (await c.call_tool("get_memory", {"id": 42})).content[0].text
            assert "`recall` (or `list_memories`, if exposed)" in text, text
            assert "aokun.py" not in text, text


def unwritable_folder(tmp_path):
    """A folder path nothing can be created in: a 0o555 folder, or (as root, whom chmod does not
    stop) a path below a plain file."""
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        (ro / "probe").mkdir()
    except OSError:
        return ro
    (ro / "probe").rmdir()
    ro.chmod(0o755)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder", encoding="utf-8")
    return blocker


@pytest.mark.slow
def test_no_writable_home_or_temp_dir_still_memorizes_and_recalls(tmp_path):
    nowhere = unwritable_folder(tmp_path)
    env = child_env(HOME=nowhere, TMPDIR=nowhere)
    env.pop("XDG_CACHE_HOME", None)
    db, ini = tmp_path / "w" / "m.db", write_ini(tmp_path)
    db.parent.mkdir()
    w = run("--db", db, "--config", ini, "memorize", "小李周末喜欢去滑雪", env=env)
    r = run("--db", db, "--config", ini, "recall", "滑雪", env=env)
    for out in (w, r):
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        # once (degraded: … too)
        [warning] = [line for line in out.stderr.splitlines() if " WARNING " in line]
        assert "no writable cache folder" in warning and str(nowhere) in warning, warning
    assert w.stdout.strip() == "1" and "小李周末喜欢去滑雪" in r.stdout
    assert [p.name for p in tmp_path.iterdir() if "jieba" in p.name or "aokun-" in p.name] == []


@pytest.mark.slow
@pytest.mark.parametrize("http", [False, True])
def test_serve_on_a_file_that_is_not_a_database(tmp_path, http):
    notes = tmp_path / "notes.txt"
    notes.write_text("not a database\n" * 50, encoding="utf-8")
    args = ["--http", "--port", str(free_port())] if http else []
    one_line_error(run("--db", notes, "--config", write_ini(tmp_path), "serve", *args),
                   str(notes), "not an SQLite")


@pytest.mark.slow
@pytest.mark.parametrize("by_env", [False, True])
def test_a_db_in_a_missing_folder_is_refused_and_nothing_is_made(tmp_path, by_env):
    ini, db = write_ini(tmp_path), tmp_path / "dta" / "aokun.db"  # a typo of data/
    if by_env:
        args, env = ("--config", ini), child_env(AOKUN_DB=str(db))
    else:
        args, env = ("--db", db, "--config", ini), None
    for cmd in (("recall", "alice"), ("memorize", "hello"), ("list", "--json")):
        r = run(*args, *cmd, env=env)
        assert r.stdout == ""
        one_line_error(r, str(db.parent), "does not exist", "--db")
    assert not db.parent.exists()


@pytest.mark.slow
def test_a_new_database_file_is_announced_on_stderr_only(tmp_path):
    ini, db = write_ini(tmp_path), tmp_path / "new.db"
    r = run("--db", db, "--config", ini, "list", "--json")
    assert r.returncode == 0 and r.stderr == f"{CREATED}{db}{aokun.HISTORY_OPT_IN}\n", r.stderr
    assert json.loads(r.stdout) is not None  # --json output stays JSON
    again = run("--db", db, "--config", ini, "list", "--json")
    assert again.returncode == 0 and again.stderr == "" and again.stdout == r.stdout


@pytest.mark.slow
def test_the_default_data_folder_is_still_made(tmp_path):
    (tmp_path / "conf").mkdir()
    ini = write_ini(tmp_path / "conf")  # no [storage] db: aokun.db in the user data folder
    r = run("--config", ini, "stats")
    assert r.returncode == 0, r.stderr
    db = Path(os.environ["XDG_DATA_HOME"]) / "aokun" / "aokun.db"
    assert db.is_file() and not (tmp_path / "conf" / "data").exists()
    assert r.stderr.strip() == f"{CREATED}{db}{aokun.HISTORY_OPT_IN}"


@pytest.mark.slow
def test_the_stdio_server_announces_a_new_file_on_stderr_not_its_stdout(tmp_path):
    db = tmp_path / "fresh.db"
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                        "clientInfo": {"name": "t", "version": "0"}}}
    r = subprocess.run([sys.executable, AOKUN, "--db", str(db),
                        "--config", str(write_ini(tmp_path)), "serve"],
                       cwd=REPO, input=json.dumps(hello) + "\n", capture_output=True, text=True,
                       encoding="utf-8", timeout=120, env=child_env())
    out = [json.loads(line) for line in r.stdout.splitlines()]  # every stdout line is JSON-RPC
    assert out and out[0]["id"] == 1 and "result" in out[0], r.stdout
    assert f"{CREATED}{db}{aokun.HISTORY_OPT_IN}" in r.stderr.splitlines(), r.stderr


def test_a_config_section_reads_as_attributes_and_a_missing_one_is_an_attribute_error():
    section = aokun.Config(None).recall
    assert section.rrf_k == section["rrf_k"] and getattr(section, "no_such", 7) == 7
    with pytest.raises(AttributeError, match="no_such"):
        _ = section.no_such
