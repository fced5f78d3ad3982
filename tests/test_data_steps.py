"""The migration ladder's second half: the data upgrades (aokun.DATA_STEPS) run once per file, in
order, recorded in meta data_version; a file upgraded before the ladder (its steps' own meta flags
set) is not upgraded again."""

import aokun


def _counting(monkeypatch):
    """DATA_STEPS with each step counted: {number: calls}."""
    calls = {n: 0 for n, _, _ in aokun.DATA_STEPS}

    def counted(n, step):
        def run(mem):
            calls[n] += 1
            return step(mem)
        return run
    monkeypatch.setattr(aokun, "DATA_STEPS",
                        tuple((n, counted(n, step), what) for n, step, what in aokun.DATA_STEPS))
    return calls


def test_steps_are_numbered_in_order():
    numbers = [n for n, _, _ in aokun.DATA_STEPS]
    assert numbers == list(range(1, len(numbers) + 1))


def test_a_new_file_records_every_step_and_runs_none_again(db_path, open_mem, monkeypatch):
    open_mem(db_path).close()
    calls = _counting(monkeypatch)
    mem = open_mem(db_path)
    assert mem.meta_get("data_version") == str(len(aokun.DATA_STEPS))
    assert set(calls.values()) == {0}


def test_a_file_from_before_a_step_gets_it_once(db_path, open_mem, monkeypatch):
    mem = open_mem(db_path)
    mem.memorize("Alice likes green tea.", {"participants": ["Alice"], "topics": ["tea"]})
    with mem.tx() as c:  # a file upgraded through step 2 only: the graph layout is the old one
        c.execute("delete from meta where key = 'graph_layout'")
        c.execute("update meta set value = '2' where key = 'data_version'")
    mem.close()
    calls = _counting(monkeypatch)
    rewritten = []
    upgrade_of = aokun.Layers._upgrade_graph_entries_of
    monkeypatch.setattr(aokun.Layers, "_upgrade_graph_entries_of",
                        lambda self, docs: rewritten.append(docs) or upgrade_of(self, docs))
    mem = open_mem(db_path)
    assert calls == {1: 0, 2: 0, 3: 1, 4: 1} and len(rewritten) == 1
    assert mem.meta_get("graph_layout") == aokun.GRAPH_LAYOUT
    assert mem.meta_get("data_version") == "4"
    mem.close()
    mem = open_mem(db_path)  # a second open: no step runs again
    assert calls == {1: 0, 2: 0, 3: 1, 4: 1} and len(rewritten) == 1
    assert mem.doctor() == []


def test_a_file_upgraded_before_the_ladder_is_not_upgraded_again(db_path, open_mem, monkeypatch):
    mem = open_mem(db_path)
    mem.memorize("Bob drinks coffee.", {"participants": ["Bob"]})
    with mem.tx() as c:  # what such a file holds: the steps' own meta flags, no data_version
        c.execute("delete from meta where key = 'data_version'")
    assert {mem.meta_get(k) for k in ("vector_format", "graph_layout", "refused_context")} == {
        "int8", aokun.GRAPH_LAYOUT, "1"}
    mem.close()
    work = []
    for name in ("_compact_vectors_in_tx", "_upgrade_graph_entries_of", "_refresh_graph_context"):
        monkeypatch.setattr(aokun.Memory, name, lambda self, *a, name=name: work.append(name))
    mem = open_mem(db_path)
    assert work == [] and mem.meta_get("data_version") == "4"


def test_a_step_that_cannot_run_yet_waits_with_the_later_ones(db_path, open_mem, monkeypatch):
    mem = open_mem(db_path, embedder=aokun.Embedder())  # provider none: step 4 has nothing to mark
    assert mem.meta_get("data_version") == "3" and mem.meta_get("refused_context") is None
    mem.close()
    calls = _counting(monkeypatch)
    mem = open_mem(db_path)  # with a provider: step 4 runs now, once
    assert calls == {1: 0, 2: 0, 3: 0, 4: 1}
    assert mem.meta_get("data_version") == "4" and mem.meta_get("refused_context") == "1"
