"""Issue 37, every recall fast: the keyword channels prune their scan (MaxScore) and find exactly
the rows of the full ranking, on both ranking paths (aokun_bm25 and bm25() itself); a new server
warms recall up in the background."""

import random
import time

import anyio
import pytest
from mcp import Client

import aokun
from fakes import FakeEmbedder

CHANNELS = {"bm25": "recall_bm25", "graph_keyword": "recall_graph_keyword"}
#: (word, share of memories holding it): common words beside rare ones (w0x … w39x)
COMMON = [("alpha", 0.7), ("bravo", 0.4), ("charlie", 0.2), ("喜欢", 0.6), ("咖啡", 0.1)]
RARE = [f"w{i}x" for i in range(40)]
NAMES = ["Alice", "Bob", "小明", "王芳"]


def random_corpus(rng: random.Random, n: int) -> list:
    def text():
        words = [w for w, share in COMMON if rng.random() < share] + rng.sample(RARE, 3)
        rng.shuffle(words)
        return (f"{rng.choice(NAMES)} said " + " ".join(words + ["note"] * rng.randint(0, 6))
                + f" on day {rng.randint(1, 99)}.")
    return [(text(), {"participants": [rng.choice(NAMES)]}) for _ in range(n)]


def random_queries(rng: random.Random, n: int) -> list[str]:
    """`n` queries of 2-4 words, then questions whose only words are common, or held by no row."""
    words = [w for w, _ in COMMON] + RARE
    return [" ".join(rng.sample(words, rng.randint(2, 4))) for _ in range(n)] + [
        "她喜欢什么", "alpha", "What about bravo?", "zzz alpha bravo", "zzz charlie w1x alpha"]


def test_maxscore_split_leaves_out_only_common_terms_whose_bound_is_small():
    hits = {"alpha": 700, "bravo": 400, "w1x": 30, "w2x": 300}
    ub = {t: 2.2 * aokun.bm25_idf(h, 1000) for t, h in hits.items()}
    out = aokun.maxscore_split(["alpha", "w1x", "bravo"], hits, 1000, 20)
    # alpha, not bravo: without bravo the rarer terms would hold under 2 × pool rows
    assert out["match"] == '"w1x" OR "bravo" OR (("w1x" OR "bravo") AND ("alpha"))'
    assert out["rest"] == '("alpha") NOT ("w1x" OR "bravo")'
    assert out["rest_bound"] == pytest.approx(1.05 * ub["alpha"])
    # the whole query in its order, each term by its phrase's index in the match
    assert out["phrases"] == "4 alpha\n0 w1x\n1 bravo\n"
    # bravo's bound is not small beside w2x's: the whole query
    assert ub["bravo"] >= aokun.MAXSCORE_SHARE * ub["w2x"]
    assert aokun.maxscore_split(["bravo", "w2x"], hits, 1000, 20) == {
        "match": '"bravo" OR "w2x"', "rest": None, "rest_bound": None,
        "phrases": "0 bravo\n1 w2x\n"}
    # a term no row holds scores nothing: its bound is no reason to leave bravo out
    # (the scan of bravo's rows alone would follow, the pool's worst below bravo's bound)
    out = aokun.maxscore_split(["bravo", "w2x", "zzz"], hits | {"zzz": 0}, 1000, 20)
    assert out["rest"] is None and out["match"] == '"bravo" OR "w2x" OR "zzz"'


@pytest.mark.slow
def test_pruned_keyword_ranking_equals_the_full_ranking_on_random_corpora(tmp_path, open_mem,
                                                                         monkeypatch):
    """On random corpora with common and rare words, each keyword channel's rows with the pruned
    scan (aokun_bm25, maxscore_split) are exactly those of the full ranking (the unbounded query:
    ids, ranks, scores), and those of bm25() itself, the path without a compiler; many scans
    skip the rows of the common terms altogether."""
    if aokun.rank_extension()[0] is None:
        pytest.skip(f"no aokun_bm25 here: {aokun.rank_extension()[1]}")
    cfg = aokun.Config(None, overrides={("recall", "channel_k"): 5})
    skipped = 0
    for seed in (1, 2):
        rng = random.Random(seed)
        path = tmp_path / f"c{seed}.db"
        fast = open_mem(path, cfg=cfg)
        fast.memorize_many(random_corpus(rng, 160))
        with monkeypatch.context() as mp:
            mp.setattr(aokun, "rank_extension", lambda: (None, "bm25() (no C compiler)"))
            slow = open_mem(path, cfg=cfg)
        assert fast.conn.aokun_rank and slow.conn.aokun_rank is None
        for q in random_queries(rng, 40):
            params = fast._channel_params(fast.seg.tokens(q), None, 2, "", "", False, "")
            pool = aokun.FTS_POOL_FACTOR * params["k"]
            for ch, name in CHANNELS.items():
                full = fast.rows(fast.queries[name], dict(params, pool=0, max_hamming=None))
                pruned = fast._channel_query(ch, fast.queries[name], params, fast.rows)
                assert pruned == full, (seed, q, ch)
                plain = slow._channel_query(ch, slow.queries[name], params, slow.rows)
                assert [r["id"] for r in plain] == [r["id"] for r in full], (seed, q, ch)
                assert all(abs(a["raw"] - b["raw"]) <= 1e-9
                           for a, b in zip(plain, full, strict=True)), (seed, q, ch)
                split = fast._pruning(ch, params, pool, fast.rows)
                if split["rest"]:
                    table = "documents_fts" if ch == "bm25" else "graph_entries_fts"
                    worst = fast.rows(
                        f"select aokun_bm25({table}, '{table}', ?) raw from {table} "
                        f"where {table} match ? order by raw, rowid limit ?",
                        (split["phrases"], split["match"], pool))
                    skipped += len(worst) == pool and -worst[-1]["raw"] > split["rest_bound"]
    assert skipped >= 10


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_new_server_warms_recall_up_in_the_background(tmp_path, segmenter):
    """After `initialize` and before any tool call, the server's background thread opens each
    channel worker's reader, counts the newest memory's words there and embeds the relevance
    anchors (Memory.warm_recall); a recall sent right after `initialize` is answered meanwhile."""
    db = tmp_path / "w.db"
    seed = aokun.Memory(db, aokun.Config(None), embedder=FakeEmbedder(16))
    seed.seg = segmenter
    seed.memorize_many(random_corpus(random.Random(3), 20))
    seed.close()
    cfg = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path / "backups"),
                                        ("backup", "daily"): False})
    opened = []

    def factory():
        m = aokun.Memory(db, cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        opened.append(m)
        return m
    workers = min(cfg.recall.parallel_channels, aokun.os.cpu_count() or 1)
    async with Client(aokun.build_server(factory, cfg)):
        m = opened[-1]
        deadline = time.monotonic() + 20
        while not (m._anchor_vectors and (m._term_hits or not m.conn.aokun_rank)) \
                and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        assert m._anchor_vectors and (m._term_hits or not m.conn.aokun_rank)
        # each channel worker's, and the background thread's own (quick_check)
        assert len(m._readers) == (workers if workers > 1 else 0) + 1
    async with Client(aokun.build_server(factory, cfg)) as client:
        r = await client.call_tool("recall", {"query": "alpha bravo w3x", "limit": 3})
        assert not r.is_error and r.structured_content["results"]


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_warm_up_on_a_newest_memory_without_words(mem):
    """The newest memory is an emoji: warm_recall searches a word of its own (it raised 'fts5:
    syntax error near ""', and the first recall paid the warm-up)."""
    mem.memorize("User lives in Lyon.", {"persona_id": "p"})
    mem.memorize("🎈🎈", {"persona_id": "p"})
    mem.conn.execute("analyze")  # as maintenance does: the planner then reads MATCH '' first
    mem.warm_recall()
    assert mem.recall("Where do I live?", k=3, persona_id="p")["results"]
