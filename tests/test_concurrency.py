"""Two writer processes on one file at the same time."""

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import aokun
from fakes import FakeEmbedder, count

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more

TESTS = Path(__file__).resolve().parent
N = 200

WRITER = textwrap.dedent(r'''
    import json, os, sys, time
    sys.path.insert(0, {tests!r})
    from fakes import open_memory

    db, name, n, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    other = {{"a": "b", "b": "a"}}[name]
    m = open_memory(db)
    m.seg.tokens("warm up")          # load jieba before the start line
    open(go + "." + name, "w").close()   # ready
    while not os.path.exists(go):    # start together
        time.sleep(0.005)
    stamps, ids = [], []
    for i in range(n):
        r = m.memorize(f"writer {{name}} memory {{i}}: note about project {{i % 17}} "
                       f"and person P{{i % 5}}",
                       {{"participants": [f"P{{i % 5}}"], "topics": [f"project-{{i % 17}}"],
                         "persona_id": "shared"}})
        assert r["status"] == "done" and not r["deduplicated"], r
        ids.append(r["id"])
        stamps.append(time.time())
        # after the first write, wait for the other writer's first (a loaded machine may start it
        # late): the writes then overlap
        deadline = time.time() + 60
        while i == 0 and time.time() < deadline and not m.value(
                "select 1 from documents where content like ? limit 1",
                ("writer " + other + " %",)):
            time.sleep(0.005)
    m.close()
    print(json.dumps({{"first": stamps[0], "last": stamps[-1], "ids": ids}}))
''').format(tests=str(TESTS))


def test_two_processes_write_at_once(tmp_path):
    db = tmp_path / "shared.db"
    script = tmp_path / "writer.py"
    script.write_text(WRITER, encoding="utf-8")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, str(script), str(db), name, str(N), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("a", "b")]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"go.{n}").exists() for n in ("a", "b")):
        assert time.monotonic() < deadline, "writers did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert "database is locked" not in err and "Traceback" not in err, err
    a, b = (json.loads(out) for out, _ in outs)
    assert a["first"] < b["last"] and b["first"] < a["last"], "the writers did not overlap"
    assert len(set(a["ids"]) | set(b["ids"])) == 2 * N  # every memory got its own id

    with aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16)) as mem:
        assert mem.last_recovery == {"resumed": 0, "failed": [], "fts_backfilled": 0}
        assert count(mem, "documents") == 2 * N
        assert count(mem, "documents_fts") == 2 * N and count(mem, "doc_vec") == 2 * N
        assert count(mem, "memory_write_ops", "status = 'done'") == 2 * N
        # shared entities were resolved to one node across both processes
        assert count(mem, "graph_nodes", "node_type = 'person'") == 5
        assert count(mem, "graph_nodes", "node_type = 'topic'") == 17
        assert count(mem, "documents", "embedding_state != 'done'") == 0
        assert mem.doctor() == []
