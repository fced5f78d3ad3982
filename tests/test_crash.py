"""kill -9 of a writer at every journal stage, then recovery at the next open."""

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import aokun
from fakes import FakeEmbedder, count, fts_ids

FACT_ENTRIES = "node_id in (select id from graph_nodes where node_type = 'fact')"
TESTS = Path(__file__).resolve().parent
STAGES = ("pending", "docs_done", "atoms_done", "graph_done")
BACKGROUND = "Background: Alice met Bob at the Shanghai office"
TARGET = ("Target memory: Carol will present the zephyrine roadmap next Friday. "
          "She feels nervous about it.")
EDITED = ("Target memory, edited: Carol presented the quillback roadmap on Friday. "
          "The launch review went smoothly.")

CHILD = textwrap.dedent(r'''
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from fakes import aokun, open_memory

    db, op, stage, when, mode = sys.argv[1:6]
    # one transaction per stage, as a resumed write runs (a new one runs in one)
    if mode == "stagewise":
        aokun.Memory._run_in_one_tx = lambda self, todo, stages: None
    m = open_memory(db)
    m.memorize({background!r}, {{"participants": ["Alice", "Bob"], "topics": ["office"]}})
    if op == "edit":
        doc = m.memorize({target!r}, {{"participants": ["Carol"], "topics": ["roadmap"]}})["id"]

    def die():
        sys.stdout.write("KILLED AT " + stage + " " + when + "\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    # right after the journal row is committed, before any stage (or embedding)
    if when == "journal":
        def run_pipeline(self, preps):
            die()
        aokun.Memory.run_pipeline = run_pipeline
    else:
        real_advance = aokun.Memory._advance
        def _advance(self, p, status, fn, vectors):
            # `status` is the committed journal status this call moves on from
            if status == stage and when == "committed":
                die()  # the previous stage's transaction has committed; this one wrote nothing yet
            real_advance(self, p, status, fn, vectors)
            if status == stage and when == "uncommitted":
                die()  # this stage has written everything, inside a transaction that never commits
        aokun.Memory._advance = _advance

    print("ARMED", flush=True)
    if op == "edit":
        m.edit(doc, {edited!r})
    else:
        m.memorize({target!r}, {{"participants": ["Carol"], "topics": ["roadmap"]}})
    print("NOT KILLED", flush=True)
''').format(tests=str(TESTS), background=BACKGROUND, target=TARGET, edited=EDITED)


def run_child(tmp_path, db, op, stage, when, mode="stagewise"):
    script = tmp_path / "writer.py"
    script.write_text(CHILD, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script), str(db), op, stage, when, mode],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"KILLED AT {stage} {when}" in proc.stdout and "NOT KILLED" not in proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# (op, stage, when, mode): stagewise = one transaction per stage (how a resumed write runs); onetx =
# the single transaction of a new write: killed inside it, nothing of it was committed
CASES = [("insert", "pending", "journal", "onetx")] + \
        [("insert", s, w, "stagewise") for s in STAGES for w in ("committed", "uncommitted")] + \
        [("edit", "pending", "committed", "stagewise"),
         ("edit", "atoms_done", "uncommitted", "stagewise"),
         ("insert", "graph_done", "uncommitted", "onetx"),
         ("edit", "atoms_done", "uncommitted", "onetx")]


@pytest.mark.slow
@pytest.mark.parametrize("op, stage, when, mode", CASES, ids=["-".join(c) for c in CASES])
def test_kill_at_stage_then_recover(tmp_path, op, stage, when, mode):
    db = tmp_path / "crash.db"
    run_child(tmp_path, db, op, stage, when, mode)

    # the file as the killed process left it: the journal row is stuck at the expected stage (a new
    # write's single transaction commits all stages or none)
    with aokun.Memory(db, aokun.Config(None), embedder=aokun.Embedder(), recover=False) as raw:
        journal = raw.rows("select op, status from memory_write_ops order by id")
        assert journal[-1] == {"op": op, "status": stage if mode == "stagewise" else "pending"}
        if mode == "onetx" and op == "insert":
            assert count(raw, "documents", "content = ?", (TARGET,)) == 0
        assert all(j["status"] == "done" for j in journal[:-1])
        assert raw.doctor()  # unfinished write reported before recovery

    mem = aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16))  # recovery runs here
    try:
        assert mem.last_recovery["resumed"] == 1 and mem.last_recovery["failed"] == []
        assert mem.doctor() == []
        assert {j["status"] for j in mem.rows("select status from memory_write_ops")} == {"done"}

        assert count(mem, "documents", "content = ?", (BACKGROUND,)) == 1
        assert fts_ids(mem, "documents_fts", "Shanghai") == \
            [mem.value("select id from documents where content = ?", (BACKGROUND,))]
        final, gone = (EDITED, TARGET) if op == "edit" else (TARGET, None)
        assert count(mem, "documents") == 2
        assert count(mem, "documents", "content = ?", (final,)) == 1  # present exactly once
        doc_id = mem.value("select id from documents where content = ?", (final,))
        if gone:
            assert count(mem, "documents", "content = ?", (gone,)) == 0
            assert fts_ids(mem, "documents_fts", "zephyrine") == []
            assert fts_ids(mem, "memory_atoms_fts", "zephyrine") == []
            assert fts_ids(mem, "graph_entries_fts", "zephyrine") == []
            assert fts_ids(mem, "documents_fts", "quillback") == [doc_id]
        else:
            assert fts_ids(mem, "documents_fts", "zephyrine") == [doc_id]

        # every layer of the recovered memory is complete
        d = mem.get(doc_id)
        assert d["embedding_state"] == "done" \
            and count(mem, "doc_vec", "doc_id = ?", (doc_id,)) == 1
        expected_atoms = mem._auto_facts(final)  # sentences with at least two search tokens
        assert sorted(a["content"] for a in d["atoms"]) == sorted(expected_atoms)
        assert count(mem, "memory_atoms_fts") == count(mem, "memory_atoms")
        entries = mem.rows("select e.node_id, e.embedding_state, n.node_type from graph_entries e "
                           "left join graph_nodes n on n.id = e.node_id where e.document_id = ?",
                           (doc_id,))
        # nodes Carol, roadmap and 2 facts; edges 2x2 describes + 1 fact chain + 1 subject pair
        assert count(mem, "graph_edges", "document_id = ?", (doc_id,)) == 6
        # describes and co_occurs_with are edges only, the fact chain has an entry
        assert len(entries) == 4 + 1
        assert all(e["embedding_state"] == ("done" if e["node_type"] == "fact" else "skip")
                   for e in entries)
        assert count(mem, "graph_vec") == count(mem, "graph_entries", FACT_ENTRIES)
        assert count(mem, "graph_nodes", "canonical = 'carol'") == 1

        # the write is not repeated: writing it again is a duplicate
        if op == "insert":
            again = mem.memorize(TARGET, {"participants": ["Carol"], "topics": ["roadmap"]})
            assert again["deduplicated"] is True and again["id"] == doc_id
        before = {t: count(mem, t) for t in ("documents", "memory_atoms", "graph_entries",
                                             "graph_nodes")}
    finally:
        mem.close()

    # a second open finds nothing to do and changes nothing
    with aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16)) as again:
        assert again.last_recovery == {"resumed": 0, "failed": [], "fts_backfilled": 0}
        assert {t: count(again, t) for t in before} == before
        assert again.doctor() == []


def _journal_row(mem, text, retries, status="pending"):
    p = mem.prepare(text)
    with mem.tx() as c:
        c.execute("insert into memory_write_ops(op, persona_id, payload, status, retries, "
                  "created_at, updated_at) values ('insert', '', ?, ?, ?, '2026-01-01T00:00:00Z', "
                  "'2026-01-01T00:00:00Z')",
                  (p.payload(), status, retries))
        return c.last_insert_rowid()


@pytest.mark.slow
def test_journal_row_past_max_retries_is_marked_failed(db_path, open_mem):
    m = open_mem(db_path)
    m.memorize("an ordinary memory")
    limit = m.cfg.write.write_op_max_retries
    assert limit == 3
    last_chance = _journal_row(m, "retried one last time", limit - 1)
    given_up = _journal_row(m, "given up on", limit)
    m.close()

    m2 = open_mem(db_path)
    assert m2.last_recovery["failed"] == [given_up]
    assert m2.last_recovery["resumed"] == 1
    rows = {r["id"]: r for r in m2.rows("select id, status, retries from memory_write_ops")}
    assert rows[given_up]["status"] == "failed" and rows[given_up]["retries"] == limit
    assert rows[last_chance]["status"] == "done" and rows[last_chance]["retries"] == limit
    assert count(m2, "documents", "content = 'retried one last time'") == 1
    assert count(m2, "documents", "content = 'given up on'") == 0
    assert m2.doctor() == ["1 failed writes in the journal (see memory_write_ops.error)"]
    assert m2.stats()["journal"] == {"done": 2, "failed": 1}


@pytest.mark.slow
def test_poison_journal_row_does_not_block_opening(db_path, open_mem):
    """A journal row whose stage raises at recovery must not make the database unopenable, nor stop
    the other unfinished rows: the error is recorded and the row retried, then marked failed."""
    m = open_mem(db_path)
    p = m.prepare("poison: importance out of range")
    p.importance = 5  # violates the documents CHECK constraint at the docs stage
    with m.tx() as c:
        c.execute("insert into memory_write_ops(op, persona_id, payload, status, created_at, "
                  "updated_at) values ('insert', '', ?, 'pending', 'x', 'x')", (p.payload(),))
        poison = c.last_insert_rowid()
    good = _journal_row(m, "a good unfinished write", 0)
    m.close()

    limit = aokun.Config(None).write.write_op_max_retries
    for attempt in range(1, limit + 1):
        m = open_mem(db_path)  # must not raise
        row = m.rows("select status, retries, error from memory_write_ops where id = ?",
                     (poison,))[0]
        assert row["status"] == "pending" and row["retries"] == attempt
        assert "CHECK constraint failed" in row["error"]
        assert m.value("select status from memory_write_ops where id = ?", (good,)) == "done"
        m.close()
    m = open_mem(db_path)
    assert m.last_recovery["failed"] == [poison]
    assert count(m, "documents") == 1
    assert m.doctor() == ["1 failed writes in the journal (see memory_write_ops.error)"]


# the journal and this process's own writes --------------------------------------------------------

def test_recovery_leaves_this_process_running_writes_alone(db_path, open_mem, caplog):
    """A write still running in this process (a slow embedding) is not abandoned: recovery in the
    same Memory (what the server's background thread runs every minute) and in a second Memory of
    the process leave it alone, so a clean run logs no recovery and uses up no retry."""
    import threading
    entered, gate = threading.Event(), threading.Event()

    class Blocking(FakeEmbedder):
        block = False

        def embed_documents(self, texts):
            if self.block:  # the first call after arming blocks until the test lets it go
                self.block = False
                entered.set()
                gate.wait(60)
            return super().embed_documents(texts)

    emb = Blocking(16)
    m = open_mem(db_path, emb)
    m.memorize("A quick first memory about the harbour.")
    limit = m.cfg.write.write_op_max_retries
    emb.block, results = True, []
    slow = "A slow memory about the lighthouse."
    writer = threading.Thread(target=lambda: results.append(m.memorize(slow)))
    caplog.set_level("INFO", logger="aokun")
    writer.start()
    try:
        assert entered.wait(30)
        for _ in range(limit + 1):
            assert m.recover()["resumed"] == 0
            assert m.maintenance_due()["recovered"] == 0
        second = open_mem(db_path)
        assert second.last_recovery["resumed"] == 0
        assert m.value("select status from memory_write_ops order by id desc limit 1") == "pending"
    finally:
        gate.set()
        writer.join(30)
    assert results and results[0]["status"] == "done" and results[0]["embedding"] == "done"
    assert m.rows("select status, retries from memory_write_ops") == \
        [{"status": "done", "retries": 0}] * 2
    assert not [r for r in caplog.records if "recovering" in r.getMessage()]
    assert m.doctor() == []


def test_owner_of_an_earlier_process_with_this_pid_is_not_alive():
    """pid reuse: a row of this pid that is not OWNER (an earlier start, e.g. pid 1 in a container)
    and a row naming a live pid with another start token are abandoned; a live process's own is
    not."""
    import os
    import socket
    host = socket.gethostname()
    assert not aokun.owner_alive(aokun.OWNER)  # this process's rows: _RUNNING_OPS decides
    # written before start tokens, by an earlier start
    assert not aokun.owner_alive(f"{host}:{os.getpid()}")
    assert not aokun.owner_alive(f"{host}:{os.getpid()}@0.1")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        token = aokun.process_token(child.pid)
        assert token and token != aokun.process_token(os.getpid())
        assert aokun.owner_alive(f"{host}:{child.pid}@{token}")
        assert aokun.owner_alive(f"{host}:{child.pid}")  # no token to compare: the pid decides
        # the pid now runs another process
        assert not aokun.owner_alive(f"{host}:{child.pid}@{token}0")
    finally:
        child.kill()
        child.wait()
    assert not aokun.owner_alive(f"{host}:{child.pid}@{token}")


@pytest.mark.slow
def test_earlier_start_with_this_pid_is_recovered(db_path, open_mem):
    import os
    import socket
    m = open_mem(db_path)
    op = _journal_row(m, "left behind by an earlier start of this pid", 0)
    with m.tx() as c:
        c.execute("update memory_write_ops set owner = ? where id = ?",
                  (f"{socket.gethostname()}:{os.getpid()}", op))
    m.close()
    again = open_mem(db_path)
    assert again.last_recovery["resumed"] == 1
    assert again.rows("select status, retries from memory_write_ops where id = ?", (op,)) == \
        [{"status": "done", "retries": 1}]


def test_memorize_many_reports_what_is_stored(db_path, open_mem):
    """One item of a batch failing its first stage: the others are stored, the failed one is
    reported failed and its journal row marked failed, so no recovery stores it later."""
    m = open_mem(db_path)
    real = aokun.Memory._stage_docs

    def stage_docs(self, p, vectors):
        if "poison" in p.content:
            raise RuntimeError("disk on fire")
        return real(self, p, vectors)

    aokun.Memory._stage_docs = stage_docs
    try:
        res = m.memorize_many([("first good memory", None), ("a poison memory", None),
                               ("second good memory", None), ("a poison memory", None)])
        with pytest.raises(aokun.AokunError, match="disk on fire"):
            m.memorize("another poison memory")
    finally:
        aokun.Memory._stage_docs = real
    assert [r["status"] for r in res] == ["done", "failed", "done", "failed"]
    assert res[1]["id"] is None and "disk on fire" in res[1]["error"]
    assert {m.get(r["id"])["content"] for r in res if r["id"]} == \
        {"first good memory", "second good memory"}
    assert m.recover()["resumed"] == 0
    m.close()
    again = open_mem(db_path)
    assert again.last_recovery["resumed"] == 0
    assert count(again, "documents") == 2 \
        and count(again, "documents", "content like '%poison%'") == 0
    assert again.stats()["journal"] == {"done": 2, "failed": 2}
