"""aokun.py stays light and navigable: importing it loads no server stack, no class or function
grows past a screenful or so, and every section banner heads at least one definition."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "aokun.py"
MAX_CLASS_LINES = 700
MAX_FUNCTION_LINES = 80
BANNER = re.compile(r"^# \S.*#{4,}\s*$")  #: a top-level section banner, `# Title ####…`
HEAVY = ("mcp", "pydantic", "starlette", "uvicorn", "jinja2")


def _tree() -> ast.Module:
    return ast.parse(SOURCE.read_text(encoding="utf-8"), filename=str(SOURCE))


def _defs(node, prefix=""):
    """(qualified name, kind, def line, length in lines) of every class and function, nested too.
    The length runs from the `def`/`class` line (decorators excluded) to the last line, docstring
    included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + child.name
            kind = "class" if isinstance(child, ast.ClassDef) else "function"
            yield name, kind, child.lineno, child.end_lineno - child.lineno + 1
            yield from _defs(child, name + ".")
        else:
            yield from _defs(child, prefix)


def _largest(kind):
    return max((d for d in _defs(_tree()) if d[1] == kind), key=lambda d: d[3])


def test_import_loads_no_server_stack():
    code = f"import aokun, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"`import aokun` loaded: {out.stdout.strip()}"


def test_stats_loads_no_numpy(tmp_path):
    """The start path stays lean: opening a file and printing its stats (what `aokun stats` does,
    and what the MCP server does before it answers `initialize`) imports neither numpy nor the
    sqlite_vec package (only its extension is loaded); the first vector work imports numpy."""
    code = ("import aokun, sys, pathlib; m = aokun.Memory(pathlib.Path(sys.argv[1]), aokun.Config(None)); "
            "m.stats(); print(sorted(x for x in sys.modules if x.split('.')[0] in ('numpy', 'sqlite_vec'))); "
            "print(m.value('select vec_version()')[:1], type(aokun._l2([3.0, 4.0])).__module__)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.db")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "v numpy"], out.stdout


@pytest.mark.parametrize("kind, plural, limit", [("class", "classes", MAX_CLASS_LINES),
                                                  ("function", "functions", MAX_FUNCTION_LINES)])
def test_no_definition_longer_than_limit(kind, plural, limit):
    too_long = [d for d in _defs(_tree()) if d[1] == kind and d[3] > limit]
    name, _, line, n = _largest(kind)
    assert not too_long, (f"{plural} over {limit} lines: "
                          + ", ".join(f"{d[0]} (line {d[2]}, {d[3]} lines)" for d in too_long)
                          + f"; largest: {name} (line {line}, {n} lines)")


def test_every_banner_heads_a_definition():
    lines = SOURCE.read_text(encoding="utf-8").splitlines()
    banners = [n for n, text in enumerate(lines, 1) if BANNER.match(text)]
    assert len(banners) >= 10, f"expected the section banners, found {len(banners)}"
    # top-level definitions: classes, functions (from their first decorator) and assignments
    starts = sorted(min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", [])])
                    for s in _tree().body
                    if isinstance(s, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Assign,
                                      ast.AnnAssign)))
    empty = []
    for at, end in zip(banners, banners[1:] + [len(lines) + 1], strict=True):
        if not any(at < s < end for s in starts):
            empty.append(f"line {at}: {lines[at - 1].strip('# ')}")
    assert not empty, f"banners with no definition under them: {empty}"
