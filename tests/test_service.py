"""The service: the systemd unit (systemd-analyze verify where present), the launchd plist and the
Task Scheduler XML as their parsers read them, the sd_notify protocol over a real unix datagram
socket (pings while the event loop runs, none while it is blocked), and a real `serve --http`
child started as systemd would (READY=1, WATCHDOG=1, /health, `service status`)."""

import asyncio
import json
import os
import plistlib
import shutil
import socket
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

import httpx
import pytest

import aokun
from mcp_procs import REPO, child_env, cli, free_port, serve_args, stop, wait_port, write_ini

TASK_NS = {"t": "http://schemas.microsoft.com/windows/2004/02/mit/task"}
unix_only = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"),
                               reason="sd_notify is a unix socket protocol")


def dry_run(tmp_path, platform: str) -> str:
    db, ini = tmp_path / "s d%$.db", write_ini(tmp_path, "none")
    r = cli(db, ini, "service", "install", "--dry-run", "--platform", platform, "--port", "5199")
    assert r.returncode == 0, r.stderr
    return r.stdout


def file_in(out: str) -> str:
    """The content a dry run would write: the lines after `write PATH:` up to the first `run`."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("write "))
    end = next(i for i, line in enumerate(lines) if line.startswith("run "))
    return "\n".join(lines[start + 1:end]) + "\n"


@pytest.mark.slow
def test_systemd_unit_is_valid_and_supervised(tmp_path):
    out = dry_run(tmp_path, "linux")
    assert "run systemctl --user daemon-reload" in out
    assert "run systemctl --user enable --now aokun.service" in out
    unit = file_in(out)
    for line in ("Type=notify", "Restart=on-failure", f"WatchdogSec={aokun.WATCHDOG_SECONDS}",
                 "WantedBy=default.target"):
        assert line in unit.splitlines()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    # quoted, escaped
    assert '"serve" "--http" "--port" "5199"' in exec_start and "s d%%$$.db" in exec_start
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed: the unit text was checked, not verified")
    path = tmp_path / "aokun.service"
    path.write_text(unit, encoding="utf-8")
    verify = ["systemd-analyze", "verify", str(path)]
    r = subprocess.run(verify, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and str(path) not in r.stdout + r.stderr, r.stdout + r.stderr
    # it can fail
    path.write_text(unit.replace("Restart=on-failure", "Restart=sometimes"), encoding="utf-8")
    r = subprocess.run(verify, capture_output=True, text=True, timeout=120)
    assert str(path) in r.stdout + r.stderr


def test_launchd_plist_keeps_the_server_alive():
    cmd = aokun.service_command(aokun.HERE / "data" / "a.db", None, 5199)
    plist = plistlib.loads(aokun.launchd_plist(cmd, aokun.HERE / "data"))
    assert plist["Label"] == aokun.LAUNCHD_LABEL and plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False} and plist["ProgramArguments"] == cmd
    if hasattr(os, "getuid"):  # the gui/<uid> domain
        _, commands = aokun.service_plan("macos", "install", cmd, aokun.HERE / "data")
        plist_path = aokun.Path.home() / "Library" / "LaunchAgents" / "io.aokun.server.plist"
        assert commands == [["launchctl", "bootstrap", f"gui/{os.getuid()}", str(plist_path)]]


@pytest.mark.slow
def test_windows_task_starts_at_logon_and_on_wake_and_restarts(tmp_path):
    out = dry_run(tmp_path, "windows")
    assert "run schtasks /Create /TN Aokun /XML" in out
    task = ET.fromstring(file_in(out).split("\n", 1)[1])
    assert task.find("t:Triggers/t:LogonTrigger", TASK_NS) is not None
    wake = task.find("t:Triggers/t:EventTrigger/t:Subscription", TASK_NS).text
    assert "Power-Troubleshooter" in wake and "EventID=1" in wake
    ET.fromstring(wake)  # the subscription is an XML query itself
    assert task.find("t:Settings/t:RestartOnFailure/t:Count", TASK_NS).text == "999"
    assert task.find("t:Settings/t:ExecutionTimeLimit", TASK_NS).text == "PT0S"
    assert "serve --http --port 5199" in task.find("t:Actions/t:Exec/t:Arguments", TASK_NS).text


def test_watchdog_interval_is_half_of_watchdog_usec():
    assert aokun.watchdog_interval({"WATCHDOG_USEC": "60000000"}) == 30.0
    assert aokun.watchdog_interval({}) is None
    assert aokun.watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}) is None


@pytest.mark.slow
@unix_only
def test_pings_arrive_while_the_loop_runs_and_stop_while_it_is_blocked(tmp_path):
    path = str(tmp_path / "notify")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(path)
    sink.settimeout(10)
    blocked, release, done = threading.Event(), threading.Event(), threading.Event()

    async def main():
        pings = asyncio.create_task(aokun.notify_supervisor(lambda: True, 0.02, path))
        while not blocked.is_set():
            await asyncio.sleep(0.01)
        release.wait(30)  # a hung event loop: nothing on it runs
        while not done.is_set():
            await asyncio.sleep(0.01)
        pings.cancel()

    loop = threading.Thread(target=lambda: asyncio.run(main()))
    loop.start()
    try:
        assert sink.recv(64) == b"READY=1"
        assert [sink.recv(64) for _ in range(3)] == [b"WATCHDOG=1"] * 3
        blocked.set()
        sink.settimeout(0.3)
        with pytest.raises(TimeoutError):  # drain what was sent before the block, then silence
            while True:
                sink.recv(64)
        with pytest.raises(TimeoutError):
            sink.recv(64)
        release.set()
        sink.settimeout(10)
        assert sink.recv(64) == b"WATCHDOG=1"  # the loop runs again: so do the pings
    finally:
        release.set()
        done.set()
        loop.join(30)
        sink.close()


@unix_only
def test_sd_notify_never_blocks_when_the_supervisor_stops_reading(tmp_path):
    """The other cause of the flaky `service status`: the test reads READY and one WATCHDOG, then
    stops reading; ~10 pings later the socket's queue was full and the next blocking send froze
    the event loop (no /health answer at all)."""
    path = str(tmp_path / "notify")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(path)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as fill:
            fill.setblocking(False)
            with pytest.raises(BlockingIOError):
                for _ in range(100_000):
                    fill.sendto(b"WATCHDOG=1", path)
        sent: list = []
        t = threading.Thread(target=lambda: sent.append(aokun.sd_notify("WATCHDOG=1", path)),
                             daemon=True)
        t.start()
        t.join(5)
        assert sent == [False], "sd_notify blocked on a full socket"
        assert sink.recv(64) == b"WATCHDOG=1"  # read one: the next ping goes through again
        assert aokun.sd_notify("WATCHDOG=1", path) is True
    finally:
        sink.close()


def test_health_answers_while_long_background_work_holds_the_memory_lock(open_mem, tmp_path):
    """The flaky `service status` under load: /health read through the main connection and waited
    for the Memory lock, which the warm-up's version backup, the daily backup (VACUUM INTO) and
    maintenance transactions hold for seconds on a loaded machine."""
    m = open_mem(tmp_path / "h.db")
    m.memorize("A memory, so the counts have something to count.")
    with m.tx():
        m._meta_set("backup_last", "2026-03-01T00:00:00Z")
    held, release = threading.Event(), threading.Event()

    def long_work():
        with m.lock:  # what backup() holds around its VACUUM INTO
            held.set()
            release.wait(30)
    worker = threading.Thread(target=long_work)
    worker.start()
    try:
        assert held.wait(10)
        answer: list = []
        probe = threading.Thread(target=lambda: answer.append(aokun.health(m)))
        probe.start()
        probe.join(5)  # the status command's timeout
        assert answer, "/health waited for the Memory lock"
        out = answer[0]
        assert out["ok"] and out["database"]["ok"] and out["pending_vectors"] == 0, out
        assert out["last_maintenance"]["backup"] == "2026-03-01T00:00:00Z"
    finally:
        release.set()
        worker.join()
        probe.join(10)


@pytest.mark.slow
def test_serve_http_tells_systemd_it_is_ready_and_alive_and_answers_health(tmp_path):
    path = str(tmp_path / "notify")
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(path)
    sink.settimeout(60)
    db, ini = tmp_path / "h.db", write_ini(tmp_path, "none")
    port = free_port()
    err = (tmp_path / "stderr.txt").open("wb")
    proc = subprocess.Popen([sys.executable, *serve_args(db, ini, "--http", "--port", str(port))],
                            cwd=REPO,
                            env=child_env(NOTIFY_SOCKET=path, WATCHDOG_USEC="200000"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        assert sink.recv(64) == b"READY=1"
        assert sink.recv(64) == b"WATCHDOG=1"
        wait_port(port, proc)
        h = httpx.get(f"http://127.0.0.1:{port}/health", timeout=20, trust_env=False)
        out = h.json()
        assert h.status_code == 200 and out["ok"] is True, out
        assert out["database"]["path"] == str(db), out
        assert out["database"]["ok"] and out["pending_vectors"] == 0 and out["uptime_seconds"] >= 0
        assert out["embedder"]["provider"] == "none"
        assert set(out["last_maintenance"]) >= {"decay", "backup"}
        status = cli(db, ini, "service", "status", "--port", str(port))
        assert status.returncode == 0
        assert json.loads(status.stdout[status.stdout.index("{"):])["ok"] is True
    finally:
        stop(proc)
        err.close()
        sink.close()
    down = cli(db, ini, "service", "status", "--port", str(port))
    assert down.returncode == 1 and "no server answers" in down.stderr
    assert "Traceback" not in down.stderr
