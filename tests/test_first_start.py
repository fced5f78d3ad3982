"""Issue 26, item 2: the first start. The server's real watch thread (ServerState, Watcher.run)
on a home folder of a few hundred Claude Code and Codex transcripts whose modification times
spread over most of a year: the newest sessions are stored and searchable first, the progress is
reported (Memory.watch_state, /health, `stats`) and adds up, the limits leave out what they
should, and a server killed with SIGKILL mid-way goes on where it stopped at its next start,
opening no finished file again and storing every turn once. Embedding is the deterministic
FakeEmbedder; an embedder that stops at a gate freezes the watcher at a known point, so nothing
depends on timing."""

import datetime as dt
import json
import os
import random
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import aokun
from fakes import FakeEmbedder, is_anchors, open_memory
from mcp_procs import REPO, child_env, cli, free_port, stop, wait_port, write_ini

TURNS = 4  #: the turns kept of each small session (two questions, two answers)
DAY = 86400


def word(n: int) -> str:
    """A word only session `n` has (jieba keeps it whole), to find that session by."""
    return f"okapi{n:04d}"


def claude_records(sid: str, n: int, cwd: str, turns: int) -> list[tuple[dict, bool]]:
    """(record, kept as a turn) of a Claude Code session: a title, then questions and answers,
    each answer after a tool call and its result (which ingest drops)."""
    out = [({"type": "summary", "summary": f"session {n}", "leafUuid": f"{sid}-0"}, False)]
    for i in range(turns):
        base = {"sessionId": sid, "cwd": cwd, "isSidechain": False,
                "timestamp": f"2026-03-01T10:{i % 60:02d}:00Z"}
        if i % 2 == 0:
            question = f"Question {i} of session {n}: how does {word(n)} parse dates?"
            out.append((dict(base, type="user", uuid=f"{sid}-{i}",
                             message={"role": "user", "content": question}), True))
            continue
        tool = {"type": "tool_use", "id": f"toolu_{n}_{i}", "name": "Bash",
                "input": {"command": "pytest -q"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}_{i}", "content": "3 passed"}
        text = {"type": "text", "text": f"The tests pass; {word(n)} answer {i} about the parser."}
        out += [(dict(base, type="assistant", uuid=f"{sid}-{i}-tool",
                      message={"role": "assistant", "content": [tool]}), False),
                (dict(base, type="user", uuid=f"{sid}-{i}-result",
                      message={"role": "user", "content": [result]}), False),
                (dict(base, type="assistant", uuid=f"{sid}-{i}",
                      message={"role": "assistant", "content": [text]}), True)]
    return out


def claude_session(path: Path, sid: str, n: int, cwd: str, turns: int = TURNS) -> list[int]:
    """Write a Claude Code transcript (claude_records). Returns each kept turn's line offset."""
    offsets, data = [], b""
    for rec, kept in claude_records(sid, n, cwd, turns):
        if kept:
            offsets.append(len(data))
        data += (json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return offsets


def codex_session(path: Path, sid: str, n: int, cwd: str) -> None:
    """A Codex rollout: session facts, injected context (dropped), two questions, two answers."""
    context = {"type": "input_text", "text": "<environment_context>x</environment_context>"}
    recs = [{"type": "session_meta", "payload": {"id": sid, "cwd": cwd}},
            {"type": "response_item",
             "payload": {"type": "message", "role": "user", "content": [context]}}]
    for i in range(TURNS):
        role, kind = ("user", "input_text") if i % 2 == 0 else ("assistant", "output_text")
        text = {"type": kind, "text": f"{role} {i}: {word(n)} in codex"}
        recs.append({"type": "response_item",
                     "payload": {"type": "message", "role": role, "content": [text]}})
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(dict(r, timestamp=f"2026-03-01T09:0{i}:00Z")) for i, r in enumerate(recs)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_history(home: Path, claude: int, codex: int, seed: int = 5, cwd=None) -> list[dict]:
    """`claude` Claude Code and `codex` Codex sessions under `home`, written in a random order,
    each modified a random number of days (and part of a day) ago, the two sources interleaved;
    `cwd(n)` names session n's project folder. Returns [{source, session_id, path, n, cwd,
    mtime_ns}], newest first."""
    rng = random.Random(seed)
    total = claude + codex
    days = rng.sample(range(1, 3 * total), total)
    out = []
    for n in rng.sample(range(total), total):
        folder = cwd(n) if cwd else f"/home/dev/project{n % 9}"
        if n < claude:
            source, sid = "claude-code", f"{n:08d}-1111-4000-8000-{seed:012d}"
            path = home / ".claude" / "projects" / folder.replace("/", "-") / f"{sid}.jsonl"
            claude_session(path, sid, n, folder)
        else:
            source, sid = "codex", f"{n:08d}-2222-7000-8000-{seed:012d}"
            path = home / ".codex" / "sessions" / "2026" / "03" / "01" / \
                f"rollout-2026-03-01T09-00-00-{sid}.jsonl"
            codex_session(path, sid, n, folder)
        t = aokun.now().timestamp() - days[n] * DAY - rng.random() * DAY / 2
        os.utime(path, (t, t))
        out.append({"source": source, "session_id": sid, "path": path, "n": n, "cwd": folder,
                    "mtime_ns": path.stat().st_mtime_ns})
    return sorted(out, key=lambda s: s["mtime_ns"], reverse=True)


def stamp(mtime_ns: int) -> str:
    return aokun.iso(dt.datetime.fromtimestamp(mtime_ns / 1e9, dt.timezone.utc))


def stored_sessions(mem) -> list[tuple[str, str]]:
    """(source, session id) of the stored sessions in the order they were first stored."""
    rows = mem.rows("select source, session_id from conv_sessions order by id")
    return [(r["source"], r["session_id"]) for r in rows]


def found(mem, phrase: str) -> list[str]:
    return [h["text"] for h in mem.conversation_search(phrase, 5)["results"] if phrase in h["text"]]


def keys(sessions) -> list[tuple[str, str]]:
    return [(s["source"], s["session_id"]) for s in sessions]


class GateEmbedder(FakeEmbedder):
    """A FakeEmbedder whose passage call on the back-log thread after `after` texts of that thread
    waits for `go` (and sets `paused`); `passages` counts the texts it embedded on any thread."""

    def __init__(self, after: int):
        super().__init__(16)
        self.after, self.passages, self.backlog = after, 0, 0
        self.paused, self.go = threading.Event(), threading.Event()
        self.count = threading.Lock()  # two watch threads embed at once: += alone loses counts

    def embed_documents(self, texts):
        if threading.current_thread().name == "aokun-watch-backlog":
            if self.backlog >= self.after and not self.go.is_set():
                self.paused.set()
                assert self.go.wait(120), "the test never opened the gate"
            self.backlog += len(texts)
        with self.count:
            self.passages += 0 if is_anchors(texts) else len(texts)
        return super().embed_documents(texts)


def wait_until(check, what: str, timeout: float = 120.0):
    """check()'s first truthy answer, asked every 50 ms; fails after `timeout` seconds."""
    pause = threading.Event()
    for _ in range(int(timeout * 20)):
        got = check()
        if got:
            return got
        pause.wait(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def freshen(s: dict, seconds_ago: float) -> dict:
    """Session `s` last written `seconds_ago` (a session of today)."""
    t = aokun.now().timestamp() - seconds_ago
    os.utime(s["path"], (t, t))
    s["mtime_ns"] = s["path"].stat().st_mtime_ns
    return s


def without_times(p: dict) -> dict:
    return {k: v for k, v in p.items() if k not in ("updated_at", "running")}


def server_config(tmp_path: Path, **conversations) -> aokun.Config:
    overrides = {("backup", "dir"): str(tmp_path / "backups"), ("backup", "daily"): False,
                 ("conversations", "watch"): True,
                 ("conversations", "watch_interval_seconds"): 0.05}
    overrides.update({("conversations", k): v for k, v in conversations.items()})
    return aokun.Config(None, overrides=overrides)


def watched_to_the_end(mem) -> aokun.Watcher:
    """A Watcher of `mem` polled until its queue is empty."""
    watcher = aokun.Watcher(mem)
    watcher.poll()
    while watcher.queue:
        watcher.poll()
    return watcher


@pytest.mark.slow
def test_first_start_stores_the_newest_sessions_first_and_reports_progress(tmp_path, monkeypatch,
                                                                          open_mem):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    sessions = write_history(home, claude=220, codex=40)
    today = [freshen(sessions[100], 1800), freshen(sessions[200], 3600)]  # read at normal priority
    sessions.sort(key=lambda s: s["mtime_ns"], reverse=True)
    assert sessions[:2] == today
    old, total, first = sessions[2:], len(sessions), 30
    gate = GateEmbedder(after=first * TURNS)  # the back-log waits in its 31st file, unwritten
    mem = open_mem(tmp_path / "f.db", gate, server_config(tmp_path))
    state = aokun.ServerState.start(mem)  # the server's threads: background and watch
    try:
        assert gate.paused.wait(120), "the back-log never reached the gate"
        p = wait_until(lambda: (w := mem.watch_state) and w["files_done"] == 2 + first and w, "32")
        assert set(stored_sessions(mem)) == set(keys(sessions[:2 + first]))  # both sources, newest
        hits = mem.conversation_search(word(old[0]["n"]), 3)
        assert hits["results"] and word(old[0]["n"]) in hits["results"][0]["text"]
        assert any("still being read" in w for w in hits["warnings"])
        assert not found(mem, word(old[-1]["n"]))  # the oldest: not yet
        assert (p["files_left"], p["files_skipped"]) == (total - 2 - first, 0)
        stored = mem.value("select count(*) from conv_turns")
        assert p["turns_done"] == (2 + first) * TURNS == stored
        assert isinstance(p["turns_left"], int) and p["turns_left"] > 0
        assert p["turns_per_second"] > 0 and p["seconds_left"] is not None
        assert p["searchable_after"] == stamp(old[first]["mtime_ns"])  # the one being read
        assert p["finished_at"] is None
        assert without_times(aokun.health(mem)["watch"]) == without_times(p)
        assert without_times(mem.stats()["watch"]) == without_times(p)
        assert mem.stats()["watch"]["running"] is True
        assert mem.conversation_stats()["watch"]["files_left"] == total - 2 - first
        late = {"type": "user", "sessionId": old[-1]["session_id"], "cwd": old[-1]["cwd"],
                "uuid": "late-1", "message": {"role": "user", "content": "the late gnu turn"},
                "timestamp": aokun.now_iso()}
        with old[-1]["path"].open("a", encoding="utf-8") as f:  # the client goes on in an old one
            f.write(json.dumps(late) + "\n")
        wait_until(lambda: found(mem, "gnu"), "the appended turn")
        assert not gate.go.is_set()  # read while the back-log still waits
    finally:
        gate.go.set()
    try:
        p = wait_until(lambda: mem.watch_state["files_left"] == 0 and mem.watch_state, "all read")
        assert stored_sessions(mem) == keys(sessions[:2 + first] + old[-1:] + old[first:-1])
        assert mem.value("select count(*) from conv_turns") == total * TURNS + 1 == p["turns_done"]
        assert (p["files_done"], p["files_skipped"], p["turns_left"], p["seconds_left"]) == \
            (total, 0, 0, 0)
        assert p["searchable_after"] is None and p["finished_at"]
        assert gate.passages == total * TURNS + 1  # every turn embedded once
        assert mem.doctor() == []
    finally:
        state.close()


def test_the_first_start_reads_no_history_until_the_user_opts_in(tmp_path, monkeypatch, open_mem,
                                                                 capsys):
    """Issue 35, item 3: by default the server starts no watch, so a throw-away database holds
    none of the transcripts under $HOME; its first line on stderr says how to opt in."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    for s in write_history(home, claude=3, codex=1):
        freshen(s, 60)  # today's: a watch would read them at once
    cfg = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path),
                                        ("backup", "daily"): False})
    mem = open_mem(tmp_path / "o.db", cfg=cfg)
    line = capsys.readouterr().err.strip()
    assert line.startswith("aokun: created a new database") and aokun.HISTORY_OPT_IN in line
    assert "aokun.py hooks CLIENT --install`" in line and "aokun.py ingest CLIENT`" in line
    state = aokun.ServerState.start(mem)
    try:
        assert state.watcher is None
    finally:
        state.close()
    assert stored_sessions(open_mem(tmp_path / "o.db", cfg=cfg)) == []


@pytest.mark.slow
def test_the_limits_leave_out_old_sessions_and_other_projects(tmp_path, monkeypatch, open_mem):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    folders = [str(home / "work" / "alpha"), str(home / "work" / "beta"),
               str(home / "work" / "beta" / "sub"), "/srv/elsewhere"]
    sessions = write_history(home, claude=60, codex=20, seed=8, cwd=lambda n: folders[n % 4])
    horizon = aokun.now().timestamp() - 100 * DAY
    wanted = [s for s in sessions if s["mtime_ns"] / 1e9 >= horizon and s["cwd"] == folders[0]]
    assert 5 < len(wanted) < len(sessions) - 5
    cfg = server_config(tmp_path, watch_since_days=100, watch_include_projects="~/work/*",
                        watch_exclude_projects="~/work/beta")  # beta and the folders inside it
    mem = open_mem(tmp_path / "l.db", cfg=cfg)
    watcher = watched_to_the_end(mem)
    assert set(stored_sessions(mem)) == set(keys(wanted))
    p = watcher.progress()
    assert (p["files_done"], p["files_left"]) == (len(wanted), 0)
    assert p["files_skipped"] == len(sessions) - len(wanted)
    assert mem.value("select count(*) from conv_turns") == len(wanted) * TURNS == p["turns_done"]
    old = next(s for s in sessions if s["mtime_ns"] / 1e9 < horizon and s["cwd"] == folders[0])
    os.utime(old["path"])  # the client wrote to an old session: it is inside the horizon now
    watcher.poll()
    assert (old["source"], old["session_id"]) in stored_sessions(mem)


@pytest.mark.slow
@pytest.mark.parametrize("since, keep", [(0, 30), (60, 30), (30, 60)])
def test_what_keep_days_would_forget_is_not_read(tmp_path, monkeypatch, open_mem, since, keep):
    """The horizon is the sooner of watch_since_days and keep_days (a session past keep_days
    would be forgotten by the next maintenance once read)."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    sessions = write_history(home, claude=30, codex=0, seed=9)
    horizon = aokun.now().timestamp() - 30 * DAY
    wanted = [s for s in sessions if s["mtime_ns"] / 1e9 >= horizon]
    assert 3 < len(wanted) < len(sessions) - 3
    cfg = server_config(tmp_path, watch_since_days=since, keep_days=keep)
    mem = open_mem(tmp_path / "k.db", cfg=cfg)
    watched_to_the_end(mem)
    assert set(stored_sessions(mem)) == set(keys(wanted))


@pytest.mark.slow
@pytest.mark.parametrize("key, value", [("watch_exclude_projects", "~/work/x, myproject"),
                                        ("watch_include_projects", "work/*")])
def test_a_project_pattern_that_cannot_match_is_refused_naming_the_setting(tmp_path, key, value):
    cfg = aokun.Config(None, overrides={("conversations", key): value})
    with pytest.raises(aokun.AokunError, match=rf"\[conversations\] {key}: .* never matches"):
        aokun.check_settings(cfg)
    ini = write_ini(tmp_path, "none", conversations={key: value})
    for args in (["watch"], ["serve"]):
        r = cli(tmp_path / "v.db", ini, *args, env=child_env(HOME=tmp_path))
        assert r.returncode != 0 and f"[conversations] {key}" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_negative_horizon_is_refused_naming_the_setting(tmp_path):
    ini = write_ini(tmp_path, "none", conversations={"watch_since_days": "-1"})
    with pytest.raises(aokun.AokunError, match=r"\[conversations\] watch_since_days = -1 is out"):
        aokun.Config(ini)


# a server killed mid-way ------------------------------------------------------------------------

CHILD = str(REPO / "tests" / "watch_child.py")
BATCH = 16  #: [conversations] batch_size of the killed server: the big session takes several


def start_child(tmp_path: Path, home: Path, ini: Path, port: int, log: Path, gate: str,
                after: int, name: str) -> subprocess.Popen:
    """`serve --http` on `port` through tests/watch_child.py (log, gate, gate after `after`)."""
    err = (tmp_path / f"{name}-stderr.txt").open("w", encoding="utf-8")
    args = [sys.executable, CHILD, str(log), gate, str(after), "--db", str(tmp_path / "k.db"),
            "--config", str(ini), "serve", "--http", "--port", str(port)]
    return subprocess.Popen(args, cwd=REPO, env=child_env(HOME=home), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=err)


def watch_of(port: int) -> dict | None:
    """The watch's progress the server at `port` answers on /health."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as r:
            return json.loads(r.read())["watch"]
    except urllib.error.HTTPError as e:  # 503: not ok, the body says why
        return json.loads(e.read()).get("watch")


def log_lines(log: Path, kind: str) -> list[str]:
    text = log.read_text(encoding="utf-8") if log.exists() else ""
    return [ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith(kind + " ")]


def long_session(home: Path, s: dict, turns: int) -> list[int]:
    """Make session `s` (keeping its time) a Claude Code session of `turns` turns; returns the
    offsets of its turns' lines."""
    path = home / ".claude" / "projects" / "-home-dev-big" / f"{s['session_id']}.jsonl"
    s["path"].unlink()
    offsets = claude_session(path, s["session_id"], s["n"], "/home/dev/big", turns=turns)
    os.utime(path, ns=(s["mtime_ns"], s["mtime_ns"]))
    s.update(path=path, source="claude-code", cwd="/home/dev/big")
    return offsets


@pytest.mark.slow
def test_a_server_killed_mid_way_goes_on_where_it_stopped(tmp_path):
    home = tmp_path / "home"
    sessions = write_history(home, claude=140, codex=20, seed=11)
    big, big_turns = sessions[4], 7 * BATCH + 5  # the fifth newest: several batches
    offsets = long_session(home, big, big_turns)
    total_turns = (len(sessions) - 1) * TURNS + big_turns
    ini = write_ini(tmp_path, "none", conversations={"watch": "true", "batch_size": BATCH,
                                                       "watch_interval_seconds": 0.05})
    db, gate, port, log1 = tmp_path / "k.db", tmp_path / "gate", free_port(), tmp_path / "run1.log"
    after = 4 * TURNS + 3 * BATCH  # the four newer sessions, then three batches of the big one
    proc = start_child(tmp_path, home, ini, port, log1, str(gate), after, "run1")
    try:
        wait_until(lambda: gate.exists() or proc.poll() is not None, "the gate")
        assert proc.poll() is None, "the first server exited"
        wait_port(port, proc)
        # counted batch by batch: three of the big session are stored, the fourth waits at the gate
        p = wait_until(lambda: (w := watch_of(port)) and w["turns_done"] == after and w, "64")
        assert (p["files_done"], p["files_left"], p["files_skipped"]) == (4, len(sessions) - 4, 0)
        assert p["turns_left"] > 0 and p["turns_per_second"] > 0
        assert p["seconds_left"] is not None and p["searchable_after"] == stamp(big["mtime_ns"])
        r = cli(db, ini, "stats", "--json")  # another process: it reads what the server stored
        assert r.returncode == 0, r.stderr
        assert without_times(json.loads(r.stdout)["watch"]) == without_times(p)
        assert json.loads(r.stdout)["watch"]["running"] is True
        assert "4 files read" in cli(db, ini, "stats").stdout
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        stop(proc)
    real = str(big["path"].resolve())
    with open_memory(db) as mem:
        assert mem.value("select count(*) from conv_turns") == after
        row = mem.conv_file_offsets("claude-code", [real])[real]
        assert row["offset"] == offsets[3 * BATCH]  # the line of the first turn not stored
    finished = {str(s["path"].resolve()) for s in sessions[:4]}
    assert finished <= set(log_lines(log1, "read"))

    log2 = tmp_path / "run2.log"
    proc = start_child(tmp_path, home, ini, port, log2, "-", 0, "run2")
    try:
        wait_port(port, proc)
        p = wait_until(lambda: (w := watch_of(port)) and w["files_left"] == 0 and w, "the rest")
        assert (p["files_done"], p["turns_done"], p["turns_left"]) == \
            (len(sessions), total_turns, 0)
    finally:
        stop(proc)
    read_again = set(log_lines(log2, "read"))
    assert not finished & read_again  # the files read to their end before the kill: not opened
    assert real in read_again
    assert sum(int(n) for n in log_lines(log2, "embed")) == total_turns - after  # none twice
    with open_memory(db) as mem:
        assert mem.value("select count(*) from conv_turns") == total_turns
        rows = mem.rows("select session_id, turn_count from conv_sessions")
        assert {r["session_id"]: r["turn_count"] for r in rows} == \
            {s["session_id"]: big_turns if s is big else TURNS for s in sessions}
        assert mem.doctor() == []
    assert "Traceback" not in (tmp_path / "run2-stderr.txt").read_text(encoding="utf-8")


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_the_files_holding_memories_are_the_users_alone(tmp_path):
    """The database, a backup and an export hold health and family facts: 0600, not readable by
    the other users of the machine (the usual umask 022 made them 0644)."""
    ini = write_ini(tmp_path)
    db, export = tmp_path / "a.db", tmp_path / "out.jsonl"
    assert cli(db, ini, "memorize", "I am allergic to penicillin.").returncode == 0
    backup = cli(db, ini, "backup")
    assert backup.returncode == 0, backup.stderr
    assert cli(db, ini, "export", "--out", str(export)).returncode == 0
    made = [db, export, *(tmp_path / "backups").glob("*.db")]
    assert len(made) == 3 and {oct(p.stat().st_mode & 0o777) for p in made} == {"0o600"}
