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
    """One row per hit: question index, in/other persona, rank, gold, cosine, cover. The other
    persona is eval_recall's (ev.other_personas: another conversation, or the half of a split
    persona without the question's gold); a question without one gives positives only."""
    other = {q.qid: persona for q, persona in ev.other_personas(ds)}
    rows = []
    for n, q in enumerate(ds.questions):
        for kind, persona in (("in", q.persona_id), ("other", other.get(q.qid))):
            if persona is None:
                continue
            ans = sut.mem.recall(q.query, k=POOL_K, persona_id=persona, explain=True)
            for rank, h in enumerate(ans["results"]):
                e = h["explain"]
                gold = kind == "in" and bool(id_map.get(h["id"], set()) & q.gold)
                rows.append({"q": n, "kind": kind, "rank": rank, "gold": gold, "cos": e["cosine"],
                             "cover": e["cover"]})
        print(f"\r  {n + 1}/{len(ds.questions)} questions", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def logistic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Weights (last one the bias) of a logistic regression with balanced classes (Newton's
    method)."""
    x = np.c_[x, np.ones(len(x))]
    w = np.where(y == 1, 0.5 / max(1, y.sum()), 0.5 / max(1, (1 - y).sum()))
    beta = np.zeros(x.shape[1])
    for _ in range(100):
        p = 1 / (1 + np.exp(-x @ beta))
        step = np.linalg.solve((x * (w * p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(len(beta)),
                               x.T @ (w * (y - p)))
        beta += step
        if np.abs(step).max() < 1e-9:
            break
    return beta


def threshold_table(rows: list[dict], ds: ev.Dataset, relevance) -> list[list]:
    """[threshold, in-persona R@5, R@10, the R@10 drop, answerable questions left empty,
    other-persona empty rate] for each threshold."""
    by_q: dict[tuple, list] = {}
    for r in rows:
        by_q.setdefault((r["kind"], r["q"]), []).append(r)
    n_other = len(ev.other_personas(ds))
    table = []
    for t in (0.0,) + THRESHOLDS:
        r5, r10, answered, answered_other = [], [], 0, 0
        for (kind, n), hits in by_q.items():
            kept = [h for h in hits if relevance(h) >= t][:ev.RECALL_K]
            if kind == "in":
                gold = len(ds.questions[n].gold)
                r5.append(sum(h["gold"] for h in kept[:5]) / gold)
                r10.append(sum(h["gold"] for h in kept) / gold)
                answered += bool(kept)
            else:
                answered_other += bool(kept)
        table.append([t, float(np.sum(r5) / len(ds.questions)),
                      float(np.sum(r10) / len(ds.questions)), 1 - answered / len(ds.questions),
                      1 - answered_other / max(1, n_other)])
    return [[t, r5, r10, table[0][2] - r10, e, o] for t, r5, r10, e, o in table]


@click.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              default=ev.DEFAULT_DATA, show_default=True,
              help="Folder with locomo-dev.json and madial-zh-dev/.")
@click.option("--dataset", type=click.Choice(["locomo", "madial"]), default="locomo",
              show_default=True,
              help="locomo fits the model's weights (English); madial its [model.cjk] weights "
                   "(Chinese questions, negatives from the memories split into two personas).")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where eval_recall keeps its locomo.db (reused; default: a temporary folder).")
def main(data_dir, db_dir, dataset):
    """Fit rules/relevance.toml's weights for the configured embedding model on LoCoMo dev (English)
    or MADial dev (Chinese: the [model.cjk] table)."""
    import aokun

    ds = ev.load_locomo(data_dir) if dataset == "locomo" else ev.load_madial(data_dir)
    tmp = tempfile.TemporaryDirectory(prefix="aokun-calibrate-") if db_dir is None else None
    folder = Path(tmp.name) if tmp else db_dir
    folder.mkdir(parents=True, exist_ok=True)
    sut = ev.EngineSUT(folder / f"{dataset}.db", touch=False)
    sut.mem.cfg.recall["min_relevance"] = 0.0  # see every hit
    try:
        id_map, _ = ev.ingest(sut, ds)
        if ds.split_items:
            ev.ingest(sut, ev.Dataset(f"{ds.name} split", ds.ks, items=ds.split_items))
        rows = features(sut, ds, id_map)
        model = sut.mem.embedder.model
    finally:
        sut.close()
    train = [r for r in rows if r["cos"] is not None and (r["gold"] or r["kind"] == "other")]
    y = np.array([1.0 if r["gold"] else 0.0 for r in train])
    both = logistic(np.array([[r["cos"], r["cover"] or 0.0] for r in train]), y)
    cos_only = logistic(np.array([[r["cos"]] for r in train]), y)
    coef = dict(zip(aokun.RELEVANCE_WEIGHTS, [*both, *cos_only], strict=True))
    print(f'\n["{model}"]' if dataset == "locomo" else f'\n["{model}".cjk]')
    for k, v in coef.items():
        print(f"{k} = {v:.2f}")
    print(f"\n{len(train)} hits ({int(y.sum())} relevant); what [recall] min_relevance costs and "
          "buys:")
    print(ev.table(["min_relevance", "in-persona R@5", "R@10", "R@10 drop", "answerable empty",
                    "other persona empty"],
                   threshold_table(rows, ds,
                                   lambda h: aokun.calibrated_relevance(h["cos"], h["cover"], coef)
                                   or 0.0)))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
