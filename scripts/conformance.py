"""Run the official MCP conformance suite (@modelcontextprotocol/conformance, Node 22) against
`aokun.py serve --http` on a free port with a temp database, and print scenario -> pass / fail /
needs-fixtures. Scenarios that call the suite's own test_* tools, prompts or resources are
needs-fixtures: Aokun does not ship them. Exit code 1 when another scenario fails, 2 when the suite
cannot run.

    cd /tmp/conf && npm i node@22 @modelcontextprotocol/conformance
    python scripts/conformance.py --suite-dir /tmp/conf
"""

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parent.parent
#: scenarios that need the suite's fixture tools (test_*), prompts (test_prompt_*) or resources
#: (test://)
NEEDS_FIXTURES = {
    "tools-call-image", "tools-call-audio", "tools-call-embedded-resource",
    "tools-call-mixed-content", "tools-call-with-logging", "tools-call-with-progress",
    "tools-call-sampling", "tools-call-elicitation", "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums", "resources-read-text", "resources-read-binary",
    "resources-templates-read", "resources-subscribe", "resources-unsubscribe",
    "prompts-get-simple", "prompts-get-with-args", "prompts-get-embedded-resource",
    "prompts-get-with-image", "tools-call-simple-text", "tools-call-error", "json-schema-2020-12"}
SUMMARY = re.compile(r"^[✓✗] (\S+): (\d+) passed, (\d+) failed", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_suite(suite_dir: Path, timeout: float = 600) -> dict[str, str]:
    """{scenario: pass|fail|needs-fixtures} of one suite run against a fresh server. Raises
    click.ClickException when the suite or the server cannot run."""
    bin_dir = suite_dir / "node_modules" / ".bin"
    if not (bin_dir / "conformance").exists() or not (bin_dir / "node").exists():
        raise click.ClickException(f"no suite in {suite_dir}: npm i node@22 "
                                   "@modelcontextprotocol/conformance")
    with tempfile.TemporaryDirectory() as tmp:
        ini = Path(tmp) / "aokun.ini"
        ini.write_text("[embedding]\nprovider = none\n[backup]\ndaily = false\n"
                       f"dir = {tmp}/backups\n[conversations]\nwatch = false\n", encoding="utf-8")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("AOKUN_")}
        server = subprocess.Popen([sys.executable, str(REPO / "aokun.py"), "--db", f"{tmp}/m.db",
                                   "--config", str(ini), "serve", "--http", "--port", str(port)],
                                  cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                if server.poll() is not None:
                    raise click.ClickException("the server exited: "
                                               + server.stderr.read().decode()[-500:])
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise click.ClickException(f"nothing listens on {port}") from None
                    time.sleep(0.2)
            out = subprocess.run([str(bin_dir / "node"), str(bin_dir / "conformance"), "server",
                                  "--url",
                                  f"http://127.0.0.1:{port}/mcp"], capture_output=True, text=True,
                                 timeout=timeout,
                                 env={**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"})
        finally:
            server.terminate()
            server.wait(30)
    results = {}
    for name, _, failed in SUMMARY.findall(out.stdout):
        results[name] = "pass" if failed == "0" \
            else "needs-fixtures" if name in NEEDS_FIXTURES else "fail"
    if not results:
        raise click.ClickException("the suite printed no summary:\n"
                                   + (out.stdout + out.stderr)[-1000:])
    return results


@click.command()
@click.option("--suite-dir", type=click.Path(file_okay=False, path_type=Path),
              default=lambda: os.environ.get("AOKUN_CONFORMANCE_DIR", "/tmp/conf"),
              show_default="/tmp/conf",
              help="Folder where `npm i node@22 @modelcontextprotocol/conformance` ran "
                   "($AOKUN_CONFORMANCE_DIR).")
def main(suite_dir: Path) -> None:
    """Run the MCP conformance suite against aokun.py serve --http and print the table."""
    try:
        results = run_suite(suite_dir)
    except click.ClickException as e:
        click.echo(f"error: {e.message}", err=True)
        sys.exit(2)
    click.echo("| scenario | result |\n|---|---|")
    for name, result in results.items():
        click.echo(f"| {name} | {result} |")
    sys.exit(1 if "fail" in results.values() else 0)


if __name__ == "__main__":
    main()
