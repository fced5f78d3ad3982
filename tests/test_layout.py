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
MAX_MODULE_LINES = 15_000  #: issue 35: growing past it is a decision made in review
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
    code = ("import aokun, sys; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"`import aokun` loaded: {out.stdout.strip()}"


def test_stats_loads_no_numpy(tmp_path):
    """The start path stays lean: opening a file and printing its stats (what `aokun stats` does,
    and what the MCP server does before it answers `initialize`) imports neither numpy nor the
    sqlite_vec package (only its extension is loaded); the first vector work imports numpy."""
    code = ("import aokun, sys, pathlib; "
            "m = aokun.Memory(pathlib.Path(sys.argv[1]), aokun.Config(None)); "
            "m.stats(); "
            "print(sorted(x for x in sys.modules if x.split('.')[0] in ('numpy', 'sqlite_vec'))); "
            "print(m.value('select vec_version()')[:1], type(aokun._l2([3.0, 4.0])).__module__)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.db")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "v numpy"], out.stdout


def test_module_stays_within_its_ceiling():
    n = len(SOURCE.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_MODULE_LINES, f"aokun.py has {n} lines, the ceiling is {MAX_MODULE_LINES}"


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
                    if isinstance(s, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef,
                                      ast.Assign, ast.AnnAssign)))
    empty = []
    for at, end in zip(banners, banners[1:] + [len(lines) + 1], strict=True):
        if not any(at < s < end for s in starts):
            empty.append(f"line {at}: {lines[at - 1].strip('# ')}")
    assert not empty, f"banners with no definition under them: {empty}"


# layering: foundation, engine sections in composition order, faces on the public engine ##########

def _bound_names(fn) -> set[str]:
    """The names a function binds itself: its arguments, what it assigns, imports, defines."""
    bound = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and node is not fn:
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound


def _free_names(node, bound=frozenset()):
    """(name, line) of every name `node` reads that no function around it binds: a module name."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        bound = bound | _bound_names(node)
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
        yield node.id, node.lineno
    for child in ast.iter_child_nodes(node):
        yield from _free_names(child, bound)


def _methods(cls: ast.ClassDef) -> set[str]:
    return {f.name for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


def layering_problems(source: str) -> list[str]:
    """What breaks the layering of `source` (aokun.py, or a snippet shaped like it): the engine is
    the classes `Memory` composes, from the banner of the first one to the end of `Memory`; before
    it the foundation, after it the faces. Each top-level definition belongs to the banner it
    stands under; code may use only definitions under its own banner or one above it. A section's
    `self.name` is the class that defines `name` first in Memory's MRO: a section calls only itself
    and the sections composed before it (composition order is file order). A face touches no
    private (`_`-prefixed) method or attribute of the engine."""
    tree = ast.parse(source)
    lines = source.splitlines()
    banners = [n for n, text in enumerate(lines, 1) if BANNER.match(text)]
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    memory = classes["Memory"]
    sections = [b.id for b in memory.bases]
    problems = []
    if sorted(sections, key=lambda name: classes[name].lineno) != sections:
        problems.append(f"Memory composes {sections} but the file defines them in another order")
    mro = ["Memory", *sections]
    order = {name: i for i, name in enumerate(mro[1:])} | {"Memory": len(sections)}

    def banner_of(line: int) -> int:
        return sum(1 for b in banners if b <= line)

    def owner(name: str) -> str | None:
        return next((c for c in mro if name in _methods(classes[c])), None)

    defined = {}
    for s in tree.body:
        names = [s.name] if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
            else [t.id for t in getattr(s, "targets", [getattr(s, "target", None)])
                  if isinstance(t, ast.Name)]
        for name in names:
            defined[name] = s.lineno
    engine_end = memory.end_lineno
    for s in tree.body:
        where = getattr(s, "name", f"line {s.lineno}")
        if s.lineno > engine_end:
            continue
        for name, line in _free_names(s):
            if name in defined and banner_of(defined[name]) > banner_of(s.lineno):
                problems.append(f"{where} (line {line}) uses {name}, defined further down "
                                f"(line {defined[name]})")
        if s.name in order if isinstance(s, ast.ClassDef) else False:
            for node in ast.walk(s):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "self":
                    target = owner(node.attr)
                    if target is not None and order[target] > order[s.name]:
                        problems.append(f"{s.name} (line {node.lineno}) calls self.{node.attr} of "
                                        f"{target}, a section composed after it")
    private = set()
    for name in mro:
        private |= {m for m in _methods(classes[name])
                    if m.startswith("_") and not m.startswith("__")}
        private |= {n.attr for n in ast.walk(classes[name]) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name) and n.value.id == "self"
                    and n.attr.startswith("_") and not n.attr.startswith("__")}
    for s in tree.body:
        if s.lineno <= engine_end:
            continue
        for node in ast.walk(s):
            if isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                problems.append(f"{getattr(s, 'name', s.lineno)} (line {node.lineno}), a face, "
                                f"touches the engine's private {ast.unparse(node)}")
    return problems


def test_layers_call_only_what_is_above_them():
    problems = layering_problems(SOURCE.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


BAD_LAYOUT = '''
# Text ####
def clean(text):
    return later(text)
# Store: one ####
class Store:
    def close(self):
        self.wait_background()
    def _doc(self, i):
        return i
# Recall: two ####
def later(text):
    return text
class Recall:
    def wait_background(self):
        return self._doc(1)
# The engine ####
class Memory(Store, Recall):
    def close(self):
        self.wait_background()
# CLI ####
def show(mem, i):
    return mem._doc(i), mem.wait_background()
'''


def test_the_layering_check_fails_on_a_bad_layout():
    problems = layering_problems(BAD_LAYOUT)
    assert len(problems) == 3, problems
    assert "clean (line 4) uses later, defined further down" in problems[0]
    assert "Store (line 8) calls self.wait_background of Recall" in problems[1]
    assert "show (line 23), a face, touches the engine's private mem._doc" in problems[2]
    reordered = BAD_LAYOUT.replace("class Memory(Store, Recall)", "class Memory(Recall, Store)")
    assert layering_problems(reordered)[0] \
        == "Memory composes ['Recall', 'Store'] but the file defines them in another order"


def test_memory_declares_every_attribute_and_no_section_shares_state():
    """Every attribute a section sets on `self` is declared in Memory.__init__ (with its comment),
    and no section class holds mutable state shared by every Memory (a lock, a dict at class level):
    class-level names are constants (immutable values, or the frozen Hooks)."""
    tree = _tree()
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    names = [b.id for b in classes["Memory"].bases] + ["Memory"]
    init = next(f for f in classes["Memory"].body
                if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    declared = {n.attr for n in ast.walk(init)
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                and isinstance(n.value, ast.Name) and n.value.id == "self"}
    undeclared, shared = [], []
    for name in names:
        for node in ast.walk(classes[name]):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(
                    node.value, ast.Name) and node.value.id == "self" and node.attr not in declared:
                undeclared.append(f"{name}: self.{node.attr} (line {node.lineno})")
        for stmt in classes[name].body:
            value = getattr(stmt, "value", None)
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and value is not None and not (
                    isinstance(value, (ast.Constant, ast.Tuple))
                    or (isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Hooks")):
                shared.append(f"{name}: {ast.unparse(stmt)[:60]} (line {stmt.lineno})")
    assert not undeclared and not shared, (undeclared, shared)
