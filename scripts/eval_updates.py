#!/usr/bin/env python3
"""Precision and recall of memorize's `may_update` on labelled pairs of memories.

Each pair of tests/fixtures/evalsets/updates.json ({old, new, label: update|none, lang: en, zh,
en-zh or zh-en, why}) is stored through the engine's public API with the shipped defaults, in a
persona of its own: the old memory, then the new one. The pair is predicted an update when the new
memory's may_update names the old one. Prints precision and recall per language (en, zh, across:
en-zh and zh-en) and overall, for the pairs of even index (the half the slot rules were developed
on), of odd index (held out) and all. The provider is the shipped `local` model (slot, event and
meaning signals, Journal._near_rival); --provider none leaves the slot and event signals alone.

Example:

    python scripts/eval_updates.py
    python scripts/eval_updates.py --half odd --show-errors
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_PAIRS = REPO / "tests" / "fixtures" / "evalsets" / "updates.json"
GROUPS = {"en": ("en",), "zh": ("zh",), "across": ("en-zh", "zh-en")}
HALVES = {"even": 0, "odd": 1}


def predict(pairs: list[dict], provider: str) -> list[bool]:
    """For each pair, whether the new memory's may_update names the old one."""
    import aokun

    with tempfile.TemporaryDirectory() as tmp:
        cfg = aokun.Config(None, overrides={("embedding", "provider"): provider,
                                            ("backup", "daily"): False})
        mem = aokun.Memory(Path(tmp) / "updates.db", cfg)
        try:
            out = []
            for i, pair in enumerate(pairs):
                persona = {"persona_id": f"pair{i}"}
                old = mem.memorize(pair["old"], persona)["id"]
                new = mem.memorize(pair["new"], persona)
                out.append(any(m["id"] == old for m in new["may_update"]))
            return out
        finally:
            mem.close()


def among_people(provider: str) -> dict:
    """may_update where memories live among others: every memory of the people sets
    (tests/fixtures/evalsets/people.json) stored in order, one persona per person; the memories
    marked `updates` name the older one they change. Returns {hints, right, updates, found,
    precision, recall}: of the hints given, how many name the marked older memory, and of the
    marked updates, how many get that hint."""
    import aokun

    people = json.loads((DEFAULT_PAIRS.parent / "people.json").read_text(encoding="utf-8"))
    hints = right = updates = found = 0
    with tempfile.TemporaryDirectory() as tmp:
        cfg = aokun.Config(None, overrides={("embedding", "provider"): provider,
                                            ("backup", "daily"): False})
        mem = aokun.Memory(Path(tmp) / "people.db", cfg)
        try:
            for person in people:
                ids = {}
                for m in person["memories"]:
                    got = mem.memorize(m["text"], {"persona_id": person["persona"],
                                                   "timestamp": m["created_at"]})
                    ids[m["id"]] = got["id"]
                    named = {h["id"] for h in got["may_update"]}
                    older = ids.get(m.get("updates"))
                    hints += len(named)
                    right += older in named
                    updates += older is not None
                    found += older is not None and older in named
        finally:
            mem.close()
    return {"hints": hints, "right": right, "updates": updates, "found": found,
            "precision": round(right / hints, 3) if hints else None,
            "recall": round(found / updates, 3) if updates else None}


def scores(rows: list[tuple[dict, bool]]) -> dict:
    """{n, tp, fp, fn, precision, recall} of predictions `rows` [(pair, predicted)]."""
    tp = sum(1 for p, y in rows if y and p["label"] == "update")
    fp = sum(1 for p, y in rows if y and p["label"] != "update")
    fn = sum(1 for p, y in rows if not y and p["label"] == "update")
    return {"n": len(rows), "tp": tp, "fp": fp, "fn": fn,
            "precision": round(tp / (tp + fp), 3) if tp + fp else None,
            "recall": round(tp / (tp + fn), 3) if tp + fn else None}


def report(pairs: list[dict], predicted: list[bool], halves: list[str]) -> dict:
    """{half: {group: scores}} for the halves asked (even, odd, all)."""
    out = {}
    for half in halves:
        rows = [(p, y) for i, (p, y) in enumerate(zip(pairs, predicted, strict=True))
                if half == "all" or i % 2 == HALVES[half]]
        out[half] = {g: scores([(p, y) for p, y in rows if p["lang"] in langs])
                     for g, langs in GROUPS.items()}
        out[half]["overall"] = scores(rows)
    return out


@click.command()
@click.option("--pairs", "path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=DEFAULT_PAIRS, show_default=True, help="The labelled pairs (JSON list).")
@click.option("--half", type=click.Choice(["even", "odd", "all", "both"]), default="both",
              show_default=True, help="Which pairs to score; both: even, odd and all.")
@click.option("--provider", type=click.Choice(["local", "none"]), default="local",
              show_default=True, help="Embedding provider of the temporary database (local: the "
              "shipped default; none: the slot and event signals alone).")
@click.option("--show-errors", is_flag=True, help="List the pairs predicted wrong.")
@click.option("--people", is_flag=True,
              help="Also score the hints among the people sets' memories (among_people).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def main(path: Path, half: str, provider: str, show_errors: bool, people: bool,
         as_json: bool) -> None:
    """Score may_update on labelled update / non-update pairs (EN, ZH and across)."""
    pairs = json.loads(path.read_text(encoding="utf-8"))
    predicted = predict(pairs, provider)
    halves = ["even", "odd", "all"] if half == "both" else [half]
    figures = report(pairs, predicted, halves)
    if people:
        figures["people"] = {"overall": among_people(provider)}
    if as_json:
        click.echo(json.dumps(figures, ensure_ascii=False))
    else:
        for h, groups in figures.items():
            for g, s in groups.items():
                if h == "people":
                    click.echo(f"among people: {s['hints']} hints, {s['right']} naming the "
                               f"memory it changes; {s['found']} of {s['updates']} updates "
                               f"hinted: precision={s['precision']} recall={s['recall']}")
                    continue
                click.echo(f"{h:5} {g:8} n={s['n']:3} tp={s['tp']:3} fp={s['fp']:3} "
                           f"fn={s['fn']:3} precision={s['precision']} recall={s['recall']}")
    if show_errors:
        for i, (p, y) in enumerate(zip(pairs, predicted, strict=True)):
            if y != (p["label"] == "update") and (half in ("both", "all")
                                                   or i % 2 == HALVES[half]):
                kind = "FP" if y else "FN"
                click.echo(f"{kind} {i} {p['lang']}: {p['old']} → {p['new']} ({p['why']})")


if __name__ == "__main__":
    main()
