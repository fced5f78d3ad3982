#!/usr/bin/env python3
"""Fit the calibrated relevance of rules/relevance.toml for the configured embedding model.

relevance = 1 / (1 + exp(-(w_margin·margin + w_cover·cover + bias))), and a margin-only variant
for a query and memory without a word of the same script (aokun.calibrated_relevance). Fitted by
logistic regression with balanced classes, per question script (latin: the model's table, cjk: its
[model.cjk] table; the margin-only weights on every script's pairs without cover), on every
dataset eval_recall knows: the project's own people sets, LoCoMo dev and MADial dev
(../shared/data). Positives are the gold memories among a question's hits; negatives every hit of
the same question asked of a persona where nothing can be relevant (another person, or the half of
a split persona without its gold) and every hit of an off-topic question. Then, for a range of
thresholds, what [recall] min_relevance costs in-persona (R@10, answerable questions left empty)
and buys (other-persona and off-topic answers that come back empty), per dataset. Prints the TOML
to paste into rules/relevance.toml.

Example:

    python scripts/calibrate_relevance.py --db-dir /tmp/aokun-calibrate
"""

from __future__ import annotations

import json
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
    """One row per hit: dataset, question key, kind (in / other / off), rank, gold, the question's
    script, margin, cover."""
    import aokun

    other = {q.qid: persona for q, persona in ev.other_personas(ds)}
    asks = []
    for n, q in enumerate(ds.questions):
        asks.append((("in", n), q.query, q.persona_id, q.gold))
        if q.qid in other:
            asks.append((("other", n), q.query, other[q.qid], set()))
    personas = list(dict.fromkeys(q.persona_id for q in ds.questions))
    for n, (query, _) in enumerate(ds.offtopic):
        asks += [(("off", n), query, persona, set()) for persona in personas]
    rows = []
    for m, ((kind, n), query, persona, gold_keys) in enumerate(asks, 1):
        script = aokun.query_script(sut.mem.seg.tokens(query))
        ans = sut.mem.recall(query, k=POOL_K, persona_id=persona, explain=True)
        for rank, h in enumerate(ans["results"]):
            e = h["explain"]
            rows.append({"ds": ds.name, "q": [kind, n, persona], "kind": kind, "rank": rank,
                         "gold": bool(id_map.get(h["id"], set()) & gold_keys), "script": script,
                         "margin": e["margin"], "cover": e["cover"], "cos": e["cosine"]})
        if m % 50 == 0 or m == len(asks):
            print(f"\r  [{ds.name}] {m}/{len(asks)} questions", end="", file=sys.stderr,
                  flush=True)
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
    """[threshold, in-persona R@10, answerable questions left empty, other-persona empty rate,
    off-topic empty rate] of dataset `ds` for each threshold."""
    by_q: dict[tuple, list] = {}
    for r in rows:
        if r["ds"] == ds.name:
            by_q.setdefault(tuple(r["q"]), []).append(r)
    asked = {"other": len(ev.other_personas(ds)),
             "off": len(ds.offtopic) * len({q.persona_id for q in ds.questions})}
    table = []
    for t in (0.0,) + THRESHOLDS:
        r10, answered = [], {"in": 0, "other": 0, "off": 0}
        for (kind, n, _), hits in by_q.items():
            kept = [h for h in hits if relevance(h) >= t][:ev.RECALL_K]
            answered[kind] += bool(kept)
            if kind == "in":
                r10.append(sum(h["gold"] for h in kept) / len(ds.questions[n].gold))
        table.append([t, float(np.sum(r10) / len(ds.questions)),
                      1 - answered["in"] / len(ds.questions)]
                     + [1 - answered[k] / asked[k] if asked[k] else "" for k in ("other", "off")])
    return table


def fit(rows: list[dict]) -> dict:
    """{script: weights} for the model (latin) and its cjk table."""
    import aokun

    train = [r for r in rows if r["margin"] is not None and (r["gold"] or r["kind"] != "in")]
    out = {}
    for script in ("latin", "cjk"):
        part = [r for r in train if r["script"] == script and r["cover"] is not None]
        y = np.array([1.0 if r["gold"] else 0.0 for r in part])
        both = logistic(np.array([[r["margin"], r["cover"]] for r in part]), y)
        out[script] = dict(zip(aokun.RELEVANCE_WEIGHTS[:3], both, strict=True))
    part = [r for r in train if r["cover"] is None]
    y = np.array([1.0 if r["gold"] else 0.0 for r in part])
    alone = logistic(np.array([[r["margin"]] for r in part]), y)
    out["latin"].update(zip(aokun.RELEVANCE_WEIGHTS[3:], alone, strict=True))
    return out


@click.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              default=ev.DEFAULT_DATA, show_default=True,
              help="Folder with locomo-dev.json and madial-zh-dev/.")
@click.option("--dataset", "datasets", multiple=True, default=("people", "locomo", "madial"),
              type=click.Choice(["people", "locomo", "madial"]), show_default=True,
              help="Datasets to fit on (repeat the option).")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where to keep one database per dataset (reused; default: a temporary "
                   "folder).")
def main(data_dir, db_dir, datasets):
    """Fit rules/relevance.toml's weights for the configured embedding model on the datasets."""
    import aokun

    tmp = tempfile.TemporaryDirectory(prefix="aokun-calibrate-") if db_dir is None else None
    folder = Path(tmp.name) if tmp else db_dir
    folder.mkdir(parents=True, exist_ok=True)
    rows, loaded = [], []
    for name in datasets:
        ds = ev.load_people(ev.PEOPLE) if name == "people" else \
            ev.load_locomo(data_dir) if name == "locomo" else ev.load_madial(data_dir)
        sut = ev.EngineSUT(folder / f"{name}.db", touch=False)
        sut.mem.cfg.recall["min_relevance"] = 0.0  # see every hit
        cached = folder / f"{name}.rows.json"
        try:
            if db_dir is not None and cached.exists():  # --db-dir: features kept from a last run
                rows += json.loads(cached.read_text(encoding="utf-8"))
            else:
                id_map, _ = ev.ingest(sut, ds)
                if ds.split_items:
                    ev.ingest(sut, ev.Dataset(f"{ds.name} split", ds.ks, items=ds.split_items))
                found = features(sut, ds, id_map)
                cached.write_text(json.dumps(found), encoding="utf-8")
                rows += found
            model = sut.mem.embedder.model
        finally:
            sut.close()
        loaded.append(ds)
    weights = fit(rows)
    print(f'\n["{model}"]')
    for k, v in weights["latin"].items():
        print(f"{k} = {v:.2f}")
    print(f'\n["{model}".cjk]')
    for k, v in weights["cjk"].items():
        print(f"{k} = {v:.2f}")
    coef = {"latin": weights["latin"], "cjk": weights["latin"] | weights["cjk"]}
    for ds in loaded:
        print(f"\n{ds.name}: what [recall] min_relevance costs and buys")
        print(ev.table(["min_relevance", "in-persona R@10", "answerable empty",
                        "other persona empty", "off-topic empty"],
                       threshold_table(rows, ds, lambda h: aokun.calibrated_relevance(
                           h["margin"], h["cover"], coef[h["script"]]) or 0.0)))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
