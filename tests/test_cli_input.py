"""Long memory texts through the real CLI: `memorize -` and `edit --text -` read standard input,
`--file PATH` reads a UTF-8 file (far beyond the ~128 KB an argument may hold), and a missing,
unreadable, non-UTF-8 or empty input is one clear error line."""

import json
import subprocess
import sys

import pytest

from mcp_procs import AOKUN, REPO, child_env, write_ini

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more


@pytest.fixture
def aokun_cli(tmp_path):
    """aokun_cli(*args, input=bytes|None) -> CompletedProcess (bytes output) of the real CLI on a
    temp database with provider none."""
    db, ini = tmp_path / "in.db", write_ini(tmp_path, "none")

    def run(*args, input=b""):
        return subprocess.run([sys.executable, AOKUN, "--db", str(db), "--config", str(ini),
                               *map(str, args)],
                              cwd=REPO, input=input, capture_output=True, env=child_env(),
                              timeout=120)
    return run


def _content(aokun_cli, memory_id) -> str:
    r = aokun_cli("show", memory_id, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.decode("utf-8"))["content"]


def test_memorize_reads_standard_input_and_a_large_file(aokun_cli, tmp_path):
    text = "Notes from the long meeting with Aiko.\n第二段：我们讨论了预算。\n" \
        + "Budget line item, 预算. " * 12000
    assert len(text.encode("utf-8")) > 300_000  # far beyond what one argument may hold (~128 KB)
    big = tmp_path / "meeting.md"
    big.write_bytes(text.encode("utf-8"))
    r = aokun_cli("memorize", "--file", big, "--topic", "work")
    assert r.returncode == 0, r.stderr
    assert _content(aokun_cli, int(r.stdout)) == text.strip()

    piped = "Piped in: Aiko prefers green tea, 绿茶.\n"
    r = aokun_cli("memorize", "-", input=piped.encode("utf-8"))
    assert r.returncode == 0, r.stderr
    piped_id = int(r.stdout)
    assert _content(aokun_cli, piped_id) == piped.strip()

    r = aokun_cli("memorize", "-", input=b"-\n")  # a lone "-" is stored by piping it
    assert r.returncode == 0, r.stderr
    assert _content(aokun_cli, int(r.stdout)) == "-"

    r = aokun_cli("edit", piped_id, "--text", "-",
                  input="Aiko now prefers oolong, 乌龙茶.".encode("utf-8"))
    assert r.returncode == 0, r.stderr
    assert _content(aokun_cli, piped_id) == "Aiko now prefers oolong, 乌龙茶."
    edited = tmp_path / "edit.txt"
    edited.write_bytes("\ufeffAiko drinks jasmine tea now.".encode("utf-8"))  # a BOM is not content
    assert aokun_cli("edit", piped_id, "--file", edited).returncode == 0
    assert _content(aokun_cli, piped_id) == "Aiko drinks jasmine tea now."


@pytest.mark.parametrize("args, given, needle", [
    (("memorize", "--file", "{tmp}/missing.txt"), b"",
     "--file: cannot read {tmp}/missing.txt: No such file"),
    (("memorize", "--file", "{tmp}"), b"", "--file: cannot read {tmp}: Is a directory"),
    (("memorize", "--file", "{tmp}/latin1.txt"), b"", "--file: {tmp}/latin1.txt is not UTF-8 text"),
    (("memorize", "--file", "{tmp}/blank.txt"), b"", "--file: {tmp}/blank.txt is empty"),
    (("memorize", "-"), b"  \n", "TEXT: standard input is empty"),
    (("memorize", "-"), b"caf\xe9",
     "TEXT: standard input is not UTF-8 text (invalid byte at offset 3)"),
    (("edit", "1", "--text", "-"), b"", "--text: standard input is empty"),
])
def test_bad_input_is_one_error_line(aokun_cli, tmp_path, args, given, needle):
    (tmp_path / "latin1.txt").write_bytes("Café crème".encode("latin-1"))
    (tmp_path / "blank.txt").write_bytes(b"\n\n  \n")
    r = aokun_cli(*[a.format(tmp=tmp_path) for a in args], input=given)
    err = r.stderr.decode("utf-8")
    assert r.returncode == 1, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"Error: {needle.format(tmp=tmp_path)}") and "Traceback" not in err
