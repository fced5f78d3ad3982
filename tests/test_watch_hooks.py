"""Issue 13, items 3 and 5: `watch` and the server's watch thread pick up turns the clients append
(real child processes on a temp database, HOME pointing at a temp folder holding the clients'
folders), and the clients' hooks: `hooks CLIENT --install` merging into settings files with other
content, and the real `hook` subprocess fed the events' JSON."""

import json
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

import aokun
from mcp_procs import AOKUN, REPO, child_env, cli, serve_args, stop, write_ini

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "conversations"
CLAUDE_SID = "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f"
CODEX_SID = "0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b"
COPILOT_SID = "3f6c9d2a-1b4e-4f7a-8c5d-6e7f8a9b0c1d"
DEADLINE = 5.0  #: seconds within which an appended turn must be searchable (the issue's bar)


def claude_line(uuid: str, text: str, sid: str = CLAUDE_SID,
                ts: str = "2026-03-02T11:00:00.000Z") -> str:
    return json.dumps({"parentUuid": None, "isSidechain": False, "sessionId": sid,
                       "cwd": "/home/dev/aokun",
                       "type": "user", "message": {"role": "user", "content": text}, "uuid": uuid,
                       "timestamp": ts}, ensure_ascii=False) + "\n"


def home_with_clients(tmp_path: Path) -> Path:
    """A home folder holding the fixtures where the clients keep them."""
    home = tmp_path / "home"
    shutil.copytree(FIXTURES / "claude-code", home / ".claude" / "projects")
    shutil.copytree(FIXTURES / "codex" / "sessions", home / ".codex" / "sessions")
    shutil.copytree(FIXTURES / "copilot" / "session-state", home / ".copilot" / "session-state")
    return home


def transcript(home: Path) -> Path:
    return home / ".claude" / "projects" / "-home-dev-aokun" / f"{CLAUDE_SID}.jsonl"


def wait_for(check, timeout: float, proc=None, what="the condition"):
    """Poll `check()` until it is truthy or `timeout` seconds pass; fail early if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the child exited with {proc.returncode} while waiting for "
                                 f"{what}")
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout} s")


def found(mem, phrase: str) -> list:
    return [h["text"] for h in mem.conversation_search(phrase, 5)["results"] if phrase in h["text"]]


def append(path: Path, text: str) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def follow_a_transcript(db, ini, home, proc):
    """Shared by the watch and serve tests: wait for the history, append a turn and a half-written
    line, complete it, then rotate the file and add a session, each picked up within DEADLINE."""
    with aokun.Memory(db, aokun.Config(ini)) as mem:
        wait_for(lambda: mem.value("select count(*) from conv_turns") >= 15, 60, proc,
                 "the first ingestion")
        path = transcript(home)
        append(path, claude_line("u-new-1", "记得 quokka 在罗特尼斯岛"))
        wait_for(lambda: found(mem, "quokka"), DEADLINE, proc, "the appended turn")
        half = claude_line("u-new-2", "the wombat line arrives in two writes")
        append(path, half[:25])  # the client is still writing this line
        time.sleep(3)  # a few polls see the half line; it must wait, not be skipped as malformed
        assert not found(mem, "wombat")
        append(path, half[25:])
        wait_for(lambda: found(mem, "wombat"), DEADLINE, proc, "the completed line")
        path.unlink()  # rotated: the client starts the file anew
        path.write_text(claude_line("u-new-3", "the platypus came after the rotation"),
                        encoding="utf-8")
        wait_for(lambda: found(mem, "platypus"), DEADLINE, proc, "the rotated file's turn")
        other = path.parent / "9e9e9e9e-0000-4000-8000-000000000001.jsonl"
        today = aokun.now_iso()  # a session of today: the briefing's "Recent sessions" lists it
        other.write_text(claude_line("u-other", "a new session about the echidna", other.stem,
                                     today), encoding="utf-8")
        wait_for(lambda: found(mem, "echidna"), 3 * DEADLINE, proc, "the new session's turn")
        # no duplicates
        assert mem.value("select count(*) from conv_turns where text like '%quokka%'") == 1
        assert mem.doctor() == []
        sessions = {s["session_id"] for s in mem.list_sessions(limit=20)}
        assert {CLAUDE_SID, CODEX_SID, COPILOT_SID, other.stem} <= sessions
        # the watcher rebuilt the stored briefing itself (stale = 0), with the new session in its
        # digests
        wait_for(lambda: mem.rows("select 1 from briefings"
                                  " where persona_id = '' and stale = 0 and text like ?",
                                  (f"%{other.stem}%",)), DEADLINE, proc, "the rebuilt briefing")


@pytest.mark.slow
def test_watch_follows_appended_turns_half_lines_and_rotation(tmp_path):
    home, db, ini = home_with_clients(tmp_path), tmp_path / "w.db", write_ini(tmp_path, "none")
    err = (tmp_path / "watch-stderr.txt").open("w+", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, AOKUN, "--db", str(db), "--config", str(ini), "watch"],
                            cwd=REPO, env=child_env(HOME=home), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        follow_a_transcript(db, ini, home, proc)
        assert proc.poll() is None  # survived the deletion and the half-written line
    finally:
        stop(proc)
    out = proc.stdout.read()
    assert "claude-code:" in out and "new turns" in out
    err.seek(0)
    assert "Traceback" not in err.read()


@pytest.mark.slow
def test_serve_stdio_watches_the_clients_in_the_background(tmp_path):
    home, db = home_with_clients(tmp_path), tmp_path / "s.db"
    # write_ini turns it off by default
    ini = write_ini(tmp_path, "none", conversations={"watch": "true"})
    err = (tmp_path / "serve-stderr.txt").open("w+", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, *serve_args(db, ini)], cwd=REPO,
                            env=child_env(HOME=home),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    try:
        follow_a_transcript(db, ini, home, proc)
        proc.stdin.close()  # how a client stops a stdio server
        assert proc.wait(30) == 0
        assert proc.stdout.read() == b""  # nothing but JSON-RPC on stdout, and no request was sent
    finally:
        stop(proc)
    err.seek(0)
    assert "Traceback" not in err.read()


# hooks: install ---------------------------------------------------------------------------------

OTHER_SETTINGS = {
    "permissions": {"allow": ["Bash(npm run lint)", "Read(~/.zshrc)"], "deny": ["Read(./.env)"]},
    "env": {"CLAUDE_CODE_ENABLE_TELEMETRY": "0", "FOO": "bar"},
    "model": "opus",
    "hooks": {
        "SessionStart": [{"matcher": "startup",
                          "hooks": [{"type": "command", "command": "echo hi"}]}],
        "PostToolUse": [{"matcher": "Write|Edit",
                         "hooks": [{"type": "command", "command": "prettier --write"}]}],
        "Stop": [{"hooks": [{"type": "command", "command": "notify-send done", "timeout": 5}]}],
    },
}


def aokun_commands(settings: dict, event: str) -> list[str]:
    return [h["command"] for g in settings["hooks"].get(event, []) for h in g["hooks"]
            if "import aokun" in h["command"]]


@pytest.mark.slow
def test_hooks_claude_code_install_keeps_other_settings_and_is_idempotent(tmp_path):
    home = tmp_path / "home"
    settings = home / ".claude" / "settings.json"
    settings.parent.mkdir(parents=True)
    original = json.dumps(OTHER_SETTINGS, indent=4)
    settings.write_text(original, encoding="utf-8")
    db, ini, env = tmp_path / "h.db", write_ini(tmp_path, "none"), child_env(HOME=tmp_path / "home")

    printed = cli(db, ini, "hooks", "claude-code", env=env)
    assert printed.returncode == 0, printed.stderr
    entry = json.loads(printed.stdout)["hooks"]
    assert set(entry) == {"SessionStart", "Stop", "SessionEnd"}
    assert settings.read_text(encoding="utf-8") == original

    r = cli(db, ini, "hooks", "claude-code", "--install", env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(settings.read_text(encoding="utf-8"))
    for key in ("permissions", "env", "model"):
        assert got[key] == OTHER_SETTINGS[key]
    for event, groups in OTHER_SETTINGS["hooks"].items():
        assert got["hooks"][event][: len(groups)] == groups  # the user's hooks first, untouched
    start = aokun_commands(got, "SessionStart")
    assert len(start) == 1 and start[0].endswith("hook claude-code session-start")
    assert f"--db {db}" in start[0]
    assert len(aokun_commands(got, "Stop")) == 1 and len(aokun_commands(got, "SessionEnd")) == 1
    backups = list(settings.parent.glob("settings.json.aokun-backup-*"))
    assert len(backups) == 1 and backups[0].read_text(encoding="utf-8") == original

    before = settings.read_bytes()
    again = cli(db, ini, "hooks", "claude-code", "--install", env=env)
    assert again.returncode == 0 and "nothing changed" in again.stdout
    assert settings.read_bytes() == before
    assert len(list(settings.parent.glob("settings.json.aokun-backup-*"))) == 1


@pytest.mark.slow
def test_hooks_install_replaces_an_older_aokun_py_hook_in_place(tmp_path):
    """Hooks installed by an older Aokun ran `python …/aokun.py … hook …`: installing again turns
    each into the HOOK_LAUNCHER command in the same place, adding none beside it."""
    settings = tmp_path / "settings.json"
    old = f"{sys.executable} /old/place/aokun.py --db /old/x.db hook claude-code stop"
    settings.write_text(json.dumps({"hooks": {"Stop": [
        {"hooks": [{"type": "command", "command": "notify-send done"}]},
        {"hooks": [{"type": "command", "command": old, "timeout": 30}]}]}}), encoding="utf-8")
    db, ini = tmp_path / "h.db", write_ini(tmp_path, "none")
    r = cli(db, ini, "hooks", "claude-code", "--install", "--file", str(settings))
    assert r.returncode == 0, r.stderr
    stop_hooks = [h["command"]
                  for g in json.loads(settings.read_text(encoding="utf-8"))["hooks"]["Stop"]
                  for h in g["hooks"]]
    assert stop_hooks == ["notify-send done",
                          aokun.hook_command("claude-code", "stop", str(db), str(ini))]


@pytest.mark.slow
def test_hooks_install_refuses_a_broken_settings_file(tmp_path):
    settings = tmp_path / "settings.json"
    settings.write_text("{ not json", encoding="utf-8")
    r = cli(tmp_path / "x.db", write_ini(tmp_path, "none"), "hooks", "claude-code", "--install",
            "--file", str(settings))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "nothing was changed" in r.stderr
    assert settings.read_text(encoding="utf-8") == "{ not json"


CODEX_CONFIG = 'model = "gpt-5-codex"\napproval_policy = "on-request"\n\n' \
               '[mcp_servers.aokun]\ncommand = "python"\n' \
               'args = ["aokun.py", "serve"]\n\n[tui]\nnotifications = true\n'


@pytest.mark.slow
def test_hooks_codex_install_sets_notify_once_and_keeps_the_rest(tmp_path):
    home = tmp_path / "home"
    config = home / ".codex" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(CODEX_CONFIG, encoding="utf-8")
    db, ini, env = tmp_path / "c.db", write_ini(tmp_path, "none"), child_env(HOME=home)
    r = cli(db, ini, "hooks", "codex", "--install", env=env)
    assert r.returncode == 0, r.stderr
    got = tomllib.loads(config.read_text(encoding="utf-8"))
    assert got["notify"][-3:] == ["hook", "codex", "notify"] and got["notify"][1] == "-c"
    assert got["notify"][2:4] == [aokun.HOOK_LAUNCHER, str(REPO)]
    assert got["model"] == "gpt-5-codex"
    assert got["mcp_servers"]["aokun"]["args"] == ["aokun.py", "serve"]
    assert got["tui"] == {"notifications": True}
    assert config.read_text(encoding="utf-8").endswith(CODEX_CONFIG)
    before = config.read_bytes()
    again = cli(db, ini, "hooks", "codex", "--install", env=env)
    assert again.returncode == 0 and "nothing changed" in again.stdout
    assert config.read_bytes() == before


def test_hooks_codex_install_leaves_another_notify_alone(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('notify = ["notify-send", "codex"]\n' + CODEX_CONFIG, encoding="utf-8")
    before = config.read_bytes()
    r = cli(tmp_path / "c.db", write_ini(tmp_path, "none"), "hooks", "codex", "--install",
            "--file", str(config))
    assert r.returncode == 1 and "already has notify" in r.stderr and "watch" in r.stderr
    assert config.read_bytes() == before


@pytest.mark.slow
def test_hooks_copilot_install_writes_its_own_hook_file(tmp_path):
    home = tmp_path / "home"
    db, ini, env = tmp_path / "p.db", write_ini(tmp_path, "none"), child_env(HOME=home)
    assert cli(db, ini, "hooks", "copilot", "--install", env=env).returncode == 0
    path = home / ".copilot" / "hooks" / "aokun.json"
    got = json.loads(path.read_text(encoding="utf-8"))
    assert got["version"] == 1 and set(got["hooks"]) == {"sessionEnd", "agentStop"}
    assert got["hooks"]["sessionEnd"][0]["bash"].endswith("hook copilot session-end")
    again = cli(db, ini, "hooks", "copilot", "--install", env=env)
    assert "nothing changed" in again.stdout and not list(path.parent.glob("*.aokun-backup-*"))


# hooks: the events ------------------------------------------------------------------------------

def run_hook(db, ini, home, client, event, *extra,
             stdin: str = "") -> tuple[subprocess.CompletedProcess, float]:
    """Run a hook as its client does: the very command `hooks --install` writes (a POSIX shell line;
    Codex's notify argv, the event's JSON appended), from another folder than Aokun's."""
    if client == "codex":
        argv = aokun.codex_notify_value(str(db), str(ini)) + list(extra)
    else:
        command = aokun.hook_command(client, event, str(db), str(ini))
        argv = ["sh", "-c", command + "".join(f" {a}" for a in extra)]
    started = time.perf_counter()
    r = subprocess.run(argv, cwd=home if Path(home).is_dir() else REPO.parent, input=stdin,
                       capture_output=True, text=True, encoding="utf-8", timeout=60,
                       env=child_env(HOME=home))
    return r, time.perf_counter() - started


@pytest.mark.slow
def test_claude_stop_hook_ingests_the_transcript_it_names(tmp_path):
    # the local model
    home, db, ini = home_with_clients(tmp_path), tmp_path / "k.db", write_ini(tmp_path, None)
    path = transcript(home)
    stop_event = {"session_id": CLAUDE_SID, "transcript_path": str(path), "cwd": "/home/dev/aokun",
                  "permission_mode": "default", "hook_event_name": "Stop",
                  "stop_hook_active": False}
    r, _ = run_hook(db, ini, home, "claude-code", "stop", stdin=json.dumps(stop_event))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    with aokun.Memory(db, aokun.Config(ini)) as mem:
        assert mem.list_sessions()[0]["session_id"] == CLAUDE_SID
        assert mem.value("select count(*) from conv_turns") == 6
        assert mem.value("select count(*) from conv_turns where embedding_state = 'done'") == 6
        # only that one
        assert mem.value("select count(*) from conv_sessions where source != 'claude-code'") == 0
    append(path, claude_line("u-hook", "the Stop hook brought the kookaburra in"))
    end_event = dict(stop_event, hook_event_name="SessionEnd", reason="prompt_input_exit")
    r, _ = run_hook(db, ini, home, "claude-code", "stop", stdin=json.dumps(end_event))
    assert r.returncode == 0 and r.stdout == ""
    with aokun.Memory(db, aokun.Config(ini)) as mem:
        assert mem.value("select count(*) from conv_turns") == 7 and found(mem, "kookaburra")


@pytest.mark.slow
def test_claude_session_start_hook_prints_the_briefing_as_additional_context(tmp_path):
    home, db, ini = tmp_path / "home", tmp_path / "b.db", write_ini(tmp_path, None)
    w = cli(db, ini, "memorize", "Alice prefers tabs over spaces in every project",
            "--importance", "0.9")
    assert w.returncode == 0, w.stderr
    start = {"session_id": "abc", "transcript_path": str(tmp_path / "abc.jsonl"),
             "cwd": str(tmp_path),
             "hook_event_name": "SessionStart", "source": "startup"}
    r, seconds = run_hook(db, ini, home, "claude-code", "session-start", stdin=json.dumps(start))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)  # the whole of stdout is the one JSON object
    assert out["hookSpecificOutput"]["hookEventName"] == "SessionStart"
    context = out["hookSpecificOutput"]["additionalContext"]
    assert context.startswith("# Memory briefing") and "Alice prefers tabs" in context
    print(f"session-start hook: {seconds:.2f} s")


@pytest.mark.slow
@pytest.mark.parametrize("stdin", ["{ not json", "[1, 2]"])
def test_a_hook_never_fails_the_client(tmp_path, stdin):
    r, _ = run_hook(tmp_path / "e.db", write_ini(tmp_path, "none"), tmp_path, "claude-code", "stop",
                    stdin=stdin)
    assert r.returncode == 0 and r.stdout == "" and "aokun hook claude-code stop" in r.stderr
    assert "Traceback" not in r.stderr
    bad_config = tmp_path / "bad.ini"
    bad_config.write_text("[nope]\nx = 1\n", encoding="utf-8")
    r, _ = run_hook(tmp_path / "e.db", bad_config, tmp_path, "claude-code", "session-start",
                    stdin="{}")
    assert r.returncode == 0 and r.stdout == "" and "unknown section" in r.stderr


@pytest.mark.slow
def test_codex_notify_hook_ingests_the_threads_rollout(tmp_path):
    home, db, ini = home_with_clients(tmp_path), tmp_path / "n.db", write_ini(tmp_path, "none")
    payload = {"type": "agent-turn-complete", "thread-id": CODEX_SID, "turn-id": "12345",
               "cwd": "/home/dev/aokun", "input-messages": ["把 channel_k 改成 200"],
               "last-assistant-message": "会稍微慢一点"}
    r, _ = run_hook(db, ini, home, "codex", "notify", json.dumps(payload, ensure_ascii=False))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    with aokun.Memory(db, aokun.Config(ini)) as mem:
        assert [s["session_id"] for s in mem.list_sessions()] == [CODEX_SID]


@pytest.mark.slow
def test_copilot_session_end_hook_ingests_that_session(tmp_path):
    home, db, ini = home_with_clients(tmp_path), tmp_path / "p.db", write_ini(tmp_path, "none")
    payload = {"sessionId": COPILOT_SID, "timestamp": 1772632800000, "cwd": "/home/dev/aokun",
               "reason": "complete"}
    r, _ = run_hook(db, ini, home, "copilot", "session-end", stdin=json.dumps(payload))
    assert r.returncode == 0 and r.stdout == "", r.stderr
    with aokun.Memory(db, aokun.Config(ini)) as mem:
        assert [s["session_id"] for s in mem.list_sessions()] == [COPILOT_SID]
        assert mem.value("select count(*) from conv_turns") == 4


@pytest.mark.slow
def test_a_hook_reads_only_what_it_names_and_the_watch_limits_let_in(tmp_path):
    """Issue 26: a hook event that names no transcript reads nothing (not the client's whole
    history, past the client's hook timeout), and a named transcript of a project the watch
    leaves out is not read."""
    home = home_with_clients(tmp_path)
    plain = write_ini(tmp_path, "none")
    r, _ = run_hook(tmp_path / "a.db", plain, home, "claude-code", "stop",
                    stdin=json.dumps({"session_id": "gone", "hook_event_name": "Stop"}))
    assert r.returncode == 0 and r.stdout == "" and "names no transcript" in r.stderr, r.stderr
    with aokun.Memory(tmp_path / "a.db", aokun.Config(plain)) as mem:
        assert mem.value("select count(*) from conv_turns") == 0
    stop_event = {"session_id": CLAUDE_SID, "transcript_path": str(transcript(home)),
                  "hook_event_name": "Stop"}
    for excluded, turns in (("*/aokun", 0), ("*/elsewhere", 6)):
        ini = write_ini(tmp_path, "none", f"{turns}.ini",
                        conversations={"watch_exclude_projects": excluded})
        db = tmp_path / f"{turns}.db"
        r, _ = run_hook(db, ini, home, "claude-code", "stop", stdin=json.dumps(stop_event))
        assert r.returncode == 0 and r.stdout == "", r.stderr
        with aokun.Memory(db, aokun.Config(ini)) as mem:
            assert mem.value("select count(*) from conv_turns") == turns, excluded


def test_a_long_first_line_does_not_hide_the_project_from_the_limits(tmp_path):
    """A first message past the 64 KB peek still names the transcript's project (an excluded
    project must stay unread)."""
    path = tmp_path / "long.jsonl"
    first = json.loads(claude_line("u-1", "x" * (200 << 10)))
    path.write_text(json.dumps(dict(first, cwd="/home/dev/secret")) + "\n"
                    + claude_line("u-2", "short"), encoding="utf-8")
    with aokun.Memory(tmp_path / "p.db", aokun.Config(write_ini(tmp_path, "none"))) as mem:
        rules = mem.ingest_rules("claude-code")
        assert aokun.transcript_project(path, rules) == "/home/dev/secret"
        path.write_text(claude_line("u-3", "y" * 100) * 1000, encoding="utf-8")  # past the peek
        assert aokun.transcript_project(path, rules) == "/home/dev/aokun"


# hooks: uninstall (issue 35, item 4) ------------------------------------------------------------

def hooks_cli(tmp_path, client: str, action: str, path: Path):
    """`hooks CLIENT --install|--uninstall --file PATH` in-process (it opens no database)."""
    from click.testing import CliRunner
    return CliRunner().invoke(aokun.cli, ["--db", str(tmp_path / "u.db"), "hooks", client,
                                          f"--{action}", "--file", str(path)])


@pytest.mark.parametrize("original", [OTHER_SETTINGS, {"model": "opus"}, None])
def test_hooks_claude_code_uninstall_removes_exactly_what_install_added(tmp_path, original):
    settings = tmp_path / "settings.json"
    if original is not None:
        settings.write_text(json.dumps(original, indent=4), encoding="utf-8")
    assert hooks_cli(tmp_path, "claude-code", "install", settings).exit_code == 0
    assert aokun_commands(json.loads(settings.read_text(encoding="utf-8")), "Stop")
    r = hooks_cli(tmp_path, "claude-code", "uninstall", settings)
    assert r.exit_code == 0 and "removed SessionStart" in r.output, r.output
    if original is None:  # install made the file: nothing is left of it
        assert not settings.exists()
    else:
        assert json.loads(settings.read_text(encoding="utf-8")) == original
        # install's backup (the original, byte for byte) is kept beside uninstall's
        backups = [b.read_text(encoding="utf-8")
                   for b in tmp_path.glob("settings.json.aokun-backup-*")]
        assert json.dumps(original, indent=4) in backups and len(backups) == 2
    again = hooks_cli(tmp_path, "claude-code", "uninstall", settings)
    assert again.exit_code == 0 and "nothing changed" in again.output


@pytest.mark.parametrize("original", [CODEX_CONFIG, None])
def test_hooks_codex_uninstall_removes_exactly_what_install_added(tmp_path, original):
    config = tmp_path / "config.toml"
    if original is not None:
        config.write_text(original, encoding="utf-8")
    assert hooks_cli(tmp_path, "codex", "install", config).exit_code == 0
    assert "notify" in tomllib.loads(config.read_text(encoding="utf-8"))
    r = hooks_cli(tmp_path, "codex", "uninstall", config)
    assert r.exit_code == 0 and "removed notify" in r.output, r.output
    if original is None:
        assert not config.exists()
    else:
        assert config.read_text(encoding="utf-8") == original
    assert "nothing changed" in hooks_cli(tmp_path, "codex", "uninstall", config).output


def test_hooks_codex_uninstall_leaves_another_notify_alone(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('notify = ["notify-send", "codex"]\n' + CODEX_CONFIG, encoding="utf-8")
    before = config.read_bytes()
    r = hooks_cli(tmp_path, "codex", "uninstall", config)
    assert r.exit_code == 1 and "another program" in r.output and config.read_bytes() == before


def test_hooks_copilot_uninstall_removes_its_hook_file_only(tmp_path):
    path = tmp_path / "hooks" / "aokun.json"
    assert hooks_cli(tmp_path, "copilot", "install", path).exit_code == 0 and path.exists()
    r = hooks_cli(tmp_path, "copilot", "uninstall", path)
    assert r.exit_code == 0 and "removed the hook file" in r.output and not path.exists()
    assert "nothing changed" in hooks_cli(tmp_path, "copilot", "uninstall", path).output
    other = {"version": 1, "hooks": {"sessionEnd": [{"type": "command", "bash": "echo bye"}]}}
    path.write_text(json.dumps(other), encoding="utf-8")
    r = hooks_cli(tmp_path, "copilot", "uninstall", path)
    assert r.exit_code == 1 and "another program" in r.output and path.exists()
