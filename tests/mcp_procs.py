"""Helpers for the tests that run `python aokun.py ... serve` (stdio, HTTP) and the CLI as real
child processes: an ini file in the test's temp folder, a free port, a child environment."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
AOKUN = str(REPO / "aokun.py")


def write_ini(folder: Path, provider: str | None = "none", name: str = "aokun.ini",
              **sections) -> Path:
    """An ini in `folder`: the given embedding provider (None: the default, local), backups inside
    `folder` with the start-up daily backup off, the server's watch of the clients' history off (it
    would read the real home folder), then `sections` ({"server": {"token": "x"}})."""
    values: dict[str, dict[str, str]] = {"backup": {"dir": str(folder / "backups"),
                                                    "daily": "false"},
                                         "conversations": {"watch": "false"}}
    if provider is not None:
        values["embedding"] = {"provider": provider}
    for section, kv in sections.items():
        values.setdefault(section, {}).update({k: str(v) for k, v in kv.items()})
    text = "".join(f"[{s}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) + "\n"
                   for s, kv in values.items())
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def child_env(**extra) -> dict:
    """The test process's environment without Aokun's own variables (a child must use only the
    --db/--config it is given), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AOKUN_")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def serve_args(db: Path, ini: Path, *more: str) -> list[str]:
    return [AOKUN, "--db", str(db), "--config", str(ini), "serve", *more]


def cli(db: Path, ini: Path, *args: str, timeout: float = 60,
        env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python aokun.py --db DB --config INI ARGS...`, capturing text output."""
    return subprocess.run([sys.executable, AOKUN, "--db", str(db), "--config", str(ini), *args],
                          cwd=REPO, capture_output=True, text=True, encoding="utf-8",
                          timeout=timeout, stdin=subprocess.DEVNULL, env=env or child_env())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 40.0) -> None:
    """Block until 127.0.0.1:port accepts connections; fail early if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> int:
    """Terminate `proc` (SIGTERM, then SIGKILL after `timeout`); returns its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    return proc.returncode
