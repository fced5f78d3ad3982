#!/usr/bin/env python3
"""Fit the calibrated relevance of rules/relevance.toml for the configured embedding model.

relevance = 1 / (1 + exp(-(w_cos·cos + w_cover·cover + bias))), and a cos-only variant for a query
and memory without a word of the same script (aokun.calibrated_relevance). Fitted by logistic
regression with balanced classes on LoCoMo dev (../shared/data): positives are the gold evidence
turns among a question's hits, negatives every hit of the same question asked against another
conversation's persona, where nothing can be relevant. Then, for a range of thresholds, what
[recall] min_relevance would cost in-persona (fractional R@10) and buy (answers asked of another
persona that come back empty). Prints the TOML section to paste into rules/relevance.toml.

Example:

    python scripts/calibrate_relevance.py --db-dir /tmp/aokun-eval   # reuses eval_recall's database
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import eval_recall as ev  # noqa: E402  (after the path is set)

POOL_K = 30  #: hits looked at per question (min_relevance off)
THRESHOLDS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def features(sut: ev.EngineSUT, ds: ev.Dataset, id_map: dict) -> list[dict]:
    """One row per hit: question index, in/other persona, rank, gold, cosine, cover."""
    personas = list(dict.fromkeys(q.persona_id for q in ds.questions))
    other = {p: personas[(i + 1) % len(personas)] for i, p in enumerate(personas)}
    rows = []
    for n, q in enumerate(ds.questions):
        for kind, persona in (("in", q.persona_id), ("other", other[q.persona_id])):
            ans = sut.mem.recall(q.query, k=POOL_K, persona_id=persona, explain=True)
            for rank, h in enumerate(ans["results"]):
                e = h["explain"]
                gold = kind == "in" and bool(id_map.get(h["id"], set()) & q.gold)
                rows.append({"q": n, "kind": kind, "rank": rank, "gold": gold, "cos": e["cosine"], "cover": e["cover"]})
        print(f"\r  {n + 1}/{len(ds.questions)} questions", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def logistic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Weights (last one the bias) of a logistic regression with balanced classes (Newton's method)."""
    x = np.c_[x, np.ones(len(x))]
    w = np.where(y == 1, 0.5 / max(1, y.sum()), 0.5 / max(1, (1 - y).sum()))
    beta = np.zeros(x.shape[1])
    for _ in range(100):
        p = 1 / (1 + np.exp(-x @ beta))
        step = np.linalg.solve((x * (w * p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(len(beta)), x.T @ (w * (y - p)))
        beta += step
        if np.abs(step).max() < 1e-9:
            break
    return beta


def threshold_table(rows: list[dict], ds: ev.Dataset, relevance) -> list[list]:
    """[threshold, in-persona R@10 kept, its drop, other-persona empty rate] for each threshold."""
    by_q: dict[tuple, list] = {}
    for r in rows:
        by_q.setdefault((r["kind"], r["q"]), []).append(r)
    table = []
    for t in (0.0,) + THRESHOLDS:
        recall, empty = [], 0
        for (kind, n), hits in by_q.items():
            kept = [h for h in hits if relevance(h) >= t][:ev.RECALL_K]
            if kind == "in":
                recall.append(sum(h["gold"] for h in kept) / len(ds.questions[n].gold))
            else:
                empty += not kept
        table.append([t, float(np.mean(recall)), empty / len(ds.questions)])
    return [[t, r, table[0][1] - r, e] for t, r, e in table]


@click.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=ev.DEFAULT_DATA,
              show_default=True, help="Folder with locomo-dev.json.")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where eval_recall keeps its locomo.db (reused; default: a temporary folder).")
def main(data_dir, db_dir):
    """Fit rules/relevance.toml's weights for the configured embedding model on LoCoMo dev."""
    import aokun

    ds = ev.load_locomo(data_dir)
    tmp = tempfile.TemporaryDirectory(prefix="aokun-calibrate-") if db_dir is None else None
    folder = Path(tmp.name) if tmp else db_dir
    folder.mkdir(parents=True, exist_ok=True)
    sut = ev.EngineSUT(folder / "locomo.db", touch=False)
    sut.mem.cfg.recall["min_relevance"] = 0.0  # see every hit
    try:
        id_map, _ = ev.ingest(sut, ds)
        rows = features(sut, ds, id_map)
        model = sut.mem.embedder.model
    finally:
        sut.close()
    train = [r for r in rows if r["cos"] is not None and (r["gold"] or r["kind"] == "other")]
    y = np.array([1.0 if r["gold"] else 0.0 for r in train])
    both = logistic(np.array([[r["cos"], r["cover"] or 0.0] for r in train]), y)
    cos_only = logistic(np.array([[r["cos"]] for r in train]), y)
    coef = dict(zip(aokun.RELEVANCE_WEIGHTS, [*both, *cos_only], strict=True))
    print(f'\n["{model}"]')
    for k, v in coef.items():
        print(f"{k} = {v:.2f}")
    print(f"\n{len(train)} hits ({int(y.sum())} relevant); what [recall] min_relevance costs and buys:")
    print(ev.table(["min_relevance", "in-persona R@10", "drop", "other persona empty"],
                   threshold_table(rows, ds, lambda h: aokun.calibrated_relevance(h["cos"], h["cover"], coef) or 0.0)))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
