#!/usr/bin/env python3
"""Fit the calibrated relevance of rules/relevance.toml for the configured embedding model.

relevance = 1 / (1 + exp(-(w_margin·margin + w_cover·cover + bias))) for a hit with evidence
(aokun.hit_relevance), with weights per question script (latin: the model's table, cjk:
its [model.cjk] table) and margin-only weights for a question and memory of different scripts.
Written as z = slope·(margin + c·cover − t) + logit(min_relevance): `t` is where a hit meets
[recall] min_relevance. The slope comes from a logistic regression with balanced classes; the
boundaries t, c from a grid search that maximises recall@3 less answerable-empty on the project's
people sets while off-topic questions stay ≥ 90% empty and LoCoMo's other-persona questions ≥ 70%,
and LoCoMo R@10 and MADial R@5 stay within 0.01 of no threshold (fit's docstring). Data: every set
eval_recall knows (the people sets, LoCoMo dev and MADial dev in ../shared/data). Positives are
the gold memories among a question's hits; negatives every hit of the same question asked of a
persona where nothing can be relevant (another person, or the half of a split persona without its
gold) and every hit of an off-topic question. Prints the TOML to paste into rules/relevance.toml
and, per dataset, what no threshold and the fitted one give.

Example:

    python scripts/calibrate_relevance.py --db-dir /tmp/aokun-calibrate
"""

from __future__ import annotations

import json
import math
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
            e = h.get("explain")
            if e is None or "margin" not in e or "replaces" in e:  # not ranked by itself
                continue
            rows.append({"ds": ds.name, "q": [kind, n, persona], "kind": kind, "rank": rank,
                         "gold": bool(id_map.get(h["id"], set()) & gold_keys), "script": script,
                         "margin": e["margin"], "cover": e["cover"], "cos": e["cosine"],
                         "evidence": e["evidence"]})
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


def group(r: dict) -> str:
    """Which weights judge a hit: 'cross' (question and memory of different scripts: margin
    alone), else the question's script."""
    return "cross" if r["cover"] is None else r["script"]


def relevance_of(params: dict, slope: float, min_relevance: float):
    """The relevance function of boundaries `params` ({group: (t, c)}): 1/(1 + exp(−z)) with
    z = slope·(margin + c·cover − t) + logit(min_relevance), so a hit sits exactly at [recall]
    min_relevance where margin + c·cover = t; 0 without evidence (hit_relevance)."""
    logit = math.log(min_relevance / (1 - min_relevance))

    def relevance(h: dict) -> float:
        if not h["evidence"]:
            return 0.0
        t, c = params[group(h)]
        return 1 / (1 + math.exp(-(slope * (h["margin"] + c * (h["cover"] or 0) - t) + logit)))
    return relevance


def outcome(rows: list[dict], ds: ev.Dataset, relevance, min_relevance: float) -> dict:
    """What `relevance` gives on dataset `ds` at min_relevance: in-persona recall@3/5/10 and
    answerable questions left empty, other-persona and off-topic questions left empty."""
    by_q: dict[tuple, list] = {}
    for r in rows:
        if r["ds"] == ds.name:
            by_q.setdefault(tuple(r["q"]), []).append(r)
    answered = {"in": 0, "other": 0, "off": 0}
    found = {3: 0.0, 5: 0.0, 10: 0.0}
    for (kind, n, _), hits in by_q.items():
        kept = [h for h in hits if relevance(h) >= min_relevance][:ev.RECALL_K]
        answered[kind] += bool(kept)
        if kind == "in":
            for k in found:
                found[k] += sum(h["gold"] for h in kept[:k]) / len(ds.questions[n].gold)
    asked = {"in": len(ds.questions), "other": len(ev.other_personas(ds)),
             "off": len(ds.offtopic) * len({q.persona_id for q in ds.questions})}
    out = {f"R@{k}": v / asked["in"] for k, v in found.items()}
    out |= {f"{kind} empty": 1 - answered[kind] / asked[kind] if asked[kind] else None
            for kind in asked}
    return out


#: what the boundaries must keep (dataset, figure, lowest) and what they then maximise
CONSTRAINTS = (("people", "off empty", 0.90), ("locomo", "other empty", 0.70))
KEEP_OF_NO_THRESHOLD = (("madial", "R@5", 0.01), ("locomo", "R@10", 0.01))
#: the grid; c starts at 0.06: a memory holding every telling word of a question is evidence in
#: any language, however plain the question's meaning: a keyword search ("杭州", "KNN k 4096")
#: has a small margin, and the sets hold too few such questions to show it
GRID = {"t": [x / 1000 for x in range(30, 101, 5)], "c": [0.06, 0.1]}


def fit(rows: list[dict], loaded: list, min_relevance: float) -> tuple[float, dict]:
    """(slope, {group: (t, c)}). The slope is the margin weight of a logistic regression with
    balanced classes over the hits with evidence (positives: gold hits; negatives: hits of
    questions asked where nothing is relevant). The boundaries t, c per group (latin, cjk, cross)
    are then chosen on a grid, one group at a time for two rounds, to maximise the people set's
    recall@3 less its answerable-empty share, less ten times every shortfall from CONSTRAINTS and
    from KEEP_OF_NO_THRESHOLD (within its margin of what no threshold gives)."""
    train = [r for r in rows if r["evidence"] and r["margin"] is not None
             and (r["gold"] or r["kind"] != "in")]
    y = np.array([1.0 if r["gold"] else 0.0 for r in train])
    slope = float(logistic(np.array([[r["margin"]] for r in train]), y)[0])
    by_name = {ds.name: ds for ds in loaded}
    floor = {(name, fig): outcome(rows, by_name[name], lambda h: 1.0, min_relevance)[fig] - d
             for name, fig, d in KEEP_OF_NO_THRESHOLD if name in by_name}

    def score(params: dict) -> float:
        rel = relevance_of(params, slope, min_relevance)
        got = {name: outcome(rows, ds, rel, min_relevance) for name, ds in by_name.items()}
        short = sum(max(0.0, lo - got[n][f]) for n, f, lo in CONSTRAINTS if n in got) + \
            sum(max(0.0, lo - got[n][f]) for (n, f), lo in floor.items())
        people = got.get("people") or next(iter(got.values()))
        return people["R@3"] - people["in empty"] - 10 * short  # a shortfall outweighs all

    params = {g: (0.06, 0.03) for g in ("latin", "cjk", "cross")}
    for _ in range(2):
        for g in params:
            options = [(t, c) for t in GRID["t"] for c in (GRID["c"] if g != "cross" else [0.0])]
            params[g] = max(options, key=lambda tc: (score(params | {g: tc}), -abs(tc[0] - 0.06)))
    return slope, params


def toml_weights(slope: float, params: dict, min_relevance: float) -> dict:
    """rules/relevance.toml's weights of fit()'s slope and boundaries."""
    logit = math.log(min_relevance / (1 - min_relevance))
    out = {}
    for g, (t, c) in params.items():
        out[g] = {"w_margin": slope, "w_cover": slope * c, "bias": logit - slope * t}
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

    min_relevance = aokun.DEFAULTS["recall"]["min_relevance"]
    slope, params = fit(rows, loaded, min_relevance)
    w = toml_weights(slope, params, min_relevance)
    print(f'\n["{model}"]')
    for k, v in w["latin"].items():
        print(f"{k} = {v:.2f}")
    print(f"margin_only_w = {w['cross']['w_margin']:.2f}\nmargin_only_bias = "
          f"{w['cross']['bias']:.2f}")
    print(f'\n["{model}".cjk]')
    for k, v in w["cjk"].items():
        print(f"{k} = {v:.2f}")
    rel = relevance_of(params, slope, min_relevance)
    print(f"\nboundaries (margin + c·cover = t at relevance {min_relevance}): {params}")
    figures = ["R@3", "R@5", "R@10", "in empty", "other empty", "off empty"]
    print(ev.table(["data", "relevance"] + figures,
                   [[ds.name, label] + [("" if o[f] is None else o[f]) for f in figures]
                    for ds in loaded
                    for label, o in (("none", outcome(rows, ds, lambda h: 1.0, min_relevance)),
                                     ("fitted", outcome(rows, ds, rel, min_relevance)))]))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
