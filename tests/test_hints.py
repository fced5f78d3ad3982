"""Engine errors carry what the user can do as structured hints, which each face spells its own
way: the CLI a command line, MCP the tool; no face rewrites another's message."""

import pytest

import aokun


def test_a_not_found_memory_names_the_list_action(db_path, open_mem):
    m = open_mem(db_path)
    with pytest.raises(aokun.NotFound) as caught:
        m.get(42)
    e = caught.value
    assert e.hints == (("list", {}),)
    assert str(e) == "no memory with id 42; `python aokun.py list` shows the ids"
    assert aokun.for_mcp(e) == \
        "no memory with id 42; `recall` (or `list_memories`, if exposed) shows the ids"


def test_each_face_spells_a_hint_its_own_way():
    e = aokun.AokunError("vectors differ; run {hint0}, or see {hint1}",
                         hints=[("rebuild", {"vectors": True}), ("kg query ENTITY", {})])
    assert str(e) == "vectors differ; run `python aokun.py rebuild --vectors`, or see " \
                     "`python aokun.py kg query ENTITY`"
    assert aokun.for_mcp(e) == \
        "vectors differ; run `python aokun.py rebuild --vectors`, or see `kg_query`"
    assert e.render(lambda command, options: f"<{command} {sorted(options)}>") == \
        "vectors differ; run <rebuild ['vectors']>, or see <kg query ENTITY []>"
    assert str(aokun.AokunError("plain")) == aokun.for_mcp(aokun.AokunError("plain")) == "plain"


def test_engine_errors_spell_no_command_line_themselves():
    """An engine error that names a command says it as a hint: no raise from Store to Memory
    spells `python aokun.py …` itself (install_codex_notify, the hooks command's helper, aside)."""
    import ast
    src = aokun.Path(aokun.__file__).read_text(encoding="utf-8")
    tree = ast.parse(src)
    top = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    codex = top["install_codex_notify"]
    skip = set(range(codex.lineno, codex.end_lineno + 1))
    spelled = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Raise) and n.exc is not None
               and top["Store"].lineno <= n.lineno <= top["Memory"].end_lineno
               and n.lineno not in skip
               and "aokun.py" in (ast.get_source_segment(src, n.exc) or "")]
    assert spelled == []
