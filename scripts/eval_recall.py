#!/usr/bin/env python3
"""Retrieval quality of Aokun's recall on real conversational-memory data (LoCoMo, MADial-Bench zh).

Follows the protocol in scripts/README.md, which says how to get the data; it is read from --data
and never copied into the repository. Runs with the shipped defaults (recall records access, as it
does for a user) and asks every question twice (the answer cache emptied), because what a user gets
after months is the second pass, not the first. Prints recall@k per channel setting and pass, the
hybrid per question category, LoCoMo's session-level recall_any@k, how often a question asked
against another conversation's persona comes back empty, and ingest/query timings.

Example:

    python scripts/eval_recall.py --dataset locomo --limit-questions 50
    python scripts/eval_recall.py --db-dir /tmp/aokun-eval --json   # second run skips ingest

The system under test is a small object with `memorize_many(items)` and
`recall(query, k, persona_id, channels)` (see `EngineSUT`), so an MCP-backed client can replace the
in-process engine without touching the evaluation code.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: ../shared/data beside the repo
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PEOPLE = REPO / "tests" / "fixtures" / "evalsets"  #: the project's own sets (load_people)
DEFAULT_CHANNELS = "bm25,vector,graph_keyword,graph_vector,all"  #: single channels, then the hybrid
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                     5: "adversarial"}
#: the protocol; 5 (adversarial) has no answer in the conversation
LOCOMO_DEFAULT_CATEGORIES = (1, 2, 3, 4)
LOCOMO_KS = (1, 5, 10)
MADIAL_KS = (1, 3, 5, 10)
RECALL_K = 10  #: one recall per question and channel setting; every smaller k is cut from it
SESSION_KS = (5, 10)  #: LoCoMo session-level recall_any@k
PASSES = 2  #: every question is asked this many times, in order
BATCH = 64  #: memorize_many batch size


# Datasets ########################################################################################

@dataclass
class Question:
    qid: str
    persona_id: str
    query: str
    gold: set  #: local gold keys (LoCoMo dia_ids, MADial memory ids)
    category: str = ""
    answer: str = ""
    #: LoCoMo: the session ids of the evidence turns
    gold_sessions: set = field(default_factory=set)
    lang: str = ""  #: people: the question's language, "→" the gold's when it differs ("en→zh")
    generic: bool = False  #: people: could be asked of anyone ("Where do I live?")


@dataclass
class Dataset:
    name: str
    ks: tuple
    #: (persona_id, local key, content, metadata) per memory, in ingest order
    items: list = field(default_factory=list)
    questions: list = field(default_factory=list)
    categories: list = field(default_factory=list)  #: category names in report order
    notes: list = field(default_factory=list)
    #: other-persona negatives when the data has one persona: (persona, key, content, metadata) of a
    #: copy of the memories split into two personas, and per question the half without its gold
    split_items: list = field(default_factory=list)
    split_other: dict = field(default_factory=dict)  #: qid → the split persona that lacks its gold
    offtopic: list = field(default_factory=list)  #: (query, lang) no memory answers
    updates: dict = field(default_factory=dict)  #: people: (persona, key) → older keys it updates


def locomo_time(text: str) -> str:
    """'1:47 pm on 8 May, 2023' → '2023-05-08T13:47:00Z' (the data has no zone; read as UTC)."""
    t = dt.datetime.strptime(" ".join(text.split()), "%I:%M %p on %d %B, %Y")
    return t.replace(tzinfo=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def gold_ids(evidence) -> list[str]:
    """Evidence entries split on ';', ',' and whitespace; 'D:11:26' read as 'D11:26'."""
    out = []
    for entry in evidence or []:
        for piece in re.split(r"[;,\s]+", str(entry)):
            piece = piece.strip()
            if piece:
                out.append(re.sub(r"^D:(\d)", r"D\1", piece))
    return out


def load_locomo(data_dir: Path, categories=LOCOMO_DEFAULT_CATEGORIES) -> Dataset:
    """One memory per turn, one persona per conversation; questions of `categories` (1-4)."""
    ds = Dataset("locomo", LOCOMO_KS, categories=[f"{c} {LOCOMO_CATEGORIES[c]}"
                                                  for c in sorted(categories)])
    conversations = json.loads((data_dir / "locomo-dev.json").read_text(encoding="utf-8"))
    dropped_gold = skipped = total = in_categories = 0
    for conv in conversations:
        sid, c = conv["sample_id"], conv["conversation"]
        sessions = sorted((int(m.group(1)) for key in c
                           if (m := re.fullmatch(r"session_(\d+)", key))))
        known, session_of = set(), {}
        for n in sessions:
            stamp = locomo_time(c[f"session_{n}_date_time"])
            for turn in c[f"session_{n}"]:
                content = f"{turn['speaker']}: {turn['text']}"
                if turn.get("blip_caption"):
                    content += f" [shares a photo: {turn['blip_caption']}]"
                meta = {"participants": [turn["speaker"]], "session_id": f"{sid}:session_{n}",
                        "timestamp": stamp, "source": "import", "persona_id": sid}
                ds.items.append((sid, turn["dia_id"], content, meta))
                known.add(turn["dia_id"])
                session_of[turn["dia_id"]] = meta["session_id"]
        for i, qa in enumerate(conv["qa"]):
            total += 1
            if qa.get("category") not in categories:
                continue
            in_categories += 1
            ids = gold_ids(qa.get("evidence"))
            gold = {g for g in ids if g in known}
            dropped_gold += len(set(ids) - gold)
            if not gold:
                skipped += 1
                continue
            ds.questions.append(Question(f"{sid}#{i}", sid, qa["question"], gold,
                                         f"{qa['category']} {LOCOMO_CATEGORIES[qa['category']]}",
                                         str(qa.get("answer", "")), {session_of[g] for g in gold}))
    cats = ",".join(map(str, sorted(categories)))
    ds.notes.append(f"{len(conversations)} conversations, {len(ds.items)} turns; {total} QA pairs "
                    f"in the file, {in_categories} in categories {cats}, {skipped} skipped with no "
                    f"gold in the conversation ({dropped_gold} gold ids not in the conversation "
                    f"dropped) -> {len(ds.questions)} questions")
    return ds


def madial_time(value) -> str | None:
    """An ISO date/time string when `value` parses as one, else None."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        t = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def load_madial(data_dir: Path) -> Dataset:
    """memory.jsonl: one `{"<id>": {time, scene, emotion, event, user-id, id}}` per line;
    dialogue.jsonl: `dialogue` lines (first `<BOD>`), `test-turn` (indexes into `dialogue`, counting
    the `<BOD>` line), `relevant-id`, `user-id`. The query is every line before the first test
    turn."""
    folder = data_dir / "madial-zh-dev"
    ds = Dataset("madial", MADIAL_KS)
    unparseable = 0
    for line in (folder / "memory.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        for key, m in json.loads(line).items():
            persona = f"madial-{m['user-id']}"
            meta = {"topics": [m["scene"]] if m.get("scene") else [], "persona_id": persona}
            if m.get("emotion"):
                meta["sentiment"] = m["emotion"]
            stamp = madial_time(m.get("time"))
            if stamp:
                meta["timestamp"] = stamp
            else:
                unparseable += 1
            ds.items.append((persona, str(m.get("id", key)), m["event"], meta))
    known = {(p, key) for p, key, _, _ in ds.items}
    missing = skipped = 0
    for line in (folder / "dialogue.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        persona = f"madial-{d['user-id']}"
        cut = min(d["test-turn"])
        lines = [x.strip() for x in d["dialogue"][:cut]]
        query = "\n".join(x for x in lines if x and x not in ("<BOD>", "<EOD>"))
        ids = {str(x) for x in d["relevant-id"]}
        gold = {x for x in ids if (persona, x) in known}
        missing += len(ids - gold)
        if not gold or not query:
            skipped += 1
            continue
        ds.questions.append(Question(f"dialogue {d['id']}", persona, query, gold))
    ds.notes.append(f"{len(ds.items)} memories ({unparseable} with an unparseable time, stored "
                    f"without a timestamp), {len(ds.questions)} dialogues ({skipped} skipped, "
                    f"{missing} gold ids not in the pool)")
    split_personas(ds)
    return ds


def text_lang(text: str) -> str:
    """'zh' when at least a third of the letters are CJK, else 'en'."""
    letters = [c for c in text if c.isalpha()]
    cjk = sum("\u4e00" <= c <= "\u9fff" for c in letters)
    return "zh" if letters and 3 * cjk >= len(letters) else "en"


def load_people(folder: Path) -> Dataset:
    """The project's own small bilingual memories of made-up people (tests/fixtures/evalsets,
    written for this by someone who had not read the code): people.json, a list of {persona,
    memories: [{id, text, created_at, participants, topics}], questions: [{q, lang, gold, kind,
    generic}]}, and offtopic.json, [{q, lang}] that no memory answers. A question's language group
    is its own, "→" its gold's when that differs ("en→zh")."""
    ds = Dataset("people", MADIAL_KS, categories=["fact", "person", "update", "cross"])
    people = json.loads((folder / "people.json").read_text(encoding="utf-8"))
    for person in people:
        persona = f"people-{person['persona']}"
        texts = {}
        for m in person["memories"]:
            meta = {"participants": m.get("participants", []), "topics": m.get("topics", []),
                    "timestamp": m["created_at"], "persona_id": persona}
            ds.items.append((persona, m["id"], m["text"], meta))
            texts[m["id"]] = m["text"]
            if m.get("updates"):
                u = m["updates"]
                ds.updates[(persona, m["id"])] = set(u if isinstance(u, list) else [u])
        for n, q in enumerate(person["questions"]):
            gold = {g for g in q["gold"] if g in texts}
            if not gold:
                continue
            langs = {text_lang(texts[g]) for g in gold}
            lang = q["lang"] if langs == {q["lang"]} else f"{q['lang']}→{'+'.join(sorted(langs))}"
            ds.questions.append(Question(f"{persona}#{n}", persona, q["q"], gold, q["kind"],
                                         lang=lang, generic=bool(q.get("generic"))))
    ds.offtopic = [(q["q"], q["lang"]) for q in
                   json.loads((folder / "offtopic.json").read_text(encoding="utf-8"))]
    ds.notes.append(f"{len(people)} people, {len(ds.items)} memories, {len(ds.questions)} "
                    f"questions, {len(ds.offtopic)} off-topic questions")
    return ds


def split_personas(ds: Dataset) -> None:
    """Negatives for a dataset with one persona (MADial dev holds user 1 only): a copy of its
    memories split into two personas by memory order (even and odd positions, so both halves span
    the same time), and for every question the half that holds none of its gold memories: asked
    there, nothing is the answer. Questions whose gold falls in both halves get no negative."""
    personas = {q.persona_id for q in ds.questions}
    if len(personas) != 1:
        return
    halves = {}
    for n, (persona, key, content, meta) in enumerate(ds.items):
        half = f"{persona}-split{n % 2}"
        halves[key] = half
        ds.split_items.append((half, key, content, dict(meta, persona_id=half)))
    both = {h for _, _, _, m in ds.split_items for h in [m["persona_id"]]}
    for q in ds.questions:
        held = {halves[g] for g in q.gold if g in halves}
        if len(held) == 1:
            ds.split_other[q.qid] = next(iter(both - held))




# System under test ###############################################################################

class EngineSUT:
    """Aokun's engine in-process. The evaluation calls only `memorize_many`, `recall` and `close`.

    With `touch` (the default) it runs the shipped settings: recall records access to what it
    returns ([recall] reinforce_on_recall), as it does for a user. touch=False turns that off and
    clears earlier access bookkeeping, for comparison."""

    name = "engine"

    def __init__(self, db_path: Path, provider: str = "local", touch: bool = True,
                 config: Path | None = None):
        import aokun

        overrides = {("recall", "cache_ttl_seconds"): 0.0}
        if provider != "local":
            overrides[("embedding", "provider")] = provider
        if not touch and "reinforce_on_recall" in aokun.DEFAULTS["recall"]:
            overrides[("recall", "reinforce_on_recall")] = False
        self.mem = aokun.Memory(db_path, aokun.Config(config, overrides=overrides))
        if not touch:
            if "reinforce_on_recall" not in aokun.DEFAULTS["recall"]:
                self.mem._touch = lambda ids: None
            with self.mem.tx() as c:
                c.execute("update documents set last_access_at = null, access_count = 0 "
                          "where last_access_at is not null or access_count != 0")

    def memorize_many(self, items: list[tuple[str, dict]]) -> list[dict]:
        """[(content, metadata)] → [{"id", "deduplicated", ...}] in order."""
        return self.mem.memorize_many(items)

    def recall(self, query: str, k: int, persona_id: str, channels) -> dict:
        """→ {"results": [{"id", "text", ...}], "degraded": [...], "took_ms"}; channels None =
        all."""
        return self.mem.recall(query, k=k, persona_id=persona_id, channels=channels)

    def close(self) -> None:
        self.mem.close()


class MCPSUT:
    """Aokun as an MCP client sees it: `python aokun.py serve` spawned over stdio with the SDK's
    client; every turn is one `memorize` tool call and every question one `recall` tool call, so
    the figures come through the same code path as a real assistant's. Only the full hybrid can be
    evaluated this way (the tool has no channel switch)."""

    name = "mcp-stdio"

    def __init__(self, db_path: Path, provider: str = "local", touch: bool = True):
        from anyio.from_thread import start_blocking_portal
        from mcp import Client, StdioServerParameters

        self._dir = tempfile.TemporaryDirectory(prefix="aokun-eval-mcp-")
        ini = Path(self._dir.name) / "aokun.ini"
        # cache_ttl_seconds = 0: a repeated question is answered afresh (the second pass measures
        # what the first pass's access bookkeeping did, not the cache); reinforcement stays at its
        # default
        ini.write_text("[embedding]\nprovider = %s\n[recall]\ncache_ttl_seconds = 0\n%s"
                       "[server]\nexposed_tools = memorize, recall\nlog_level = WARNING\n[backup]\n"
                       "daily = false\n"
                       % (provider, "" if touch else "reinforce_on_recall = false\n"),
                       encoding="utf-8")
        params = StdioServerParameters(command=sys.executable, cwd=str(REPO),
                                       args=[str(REPO / "aokun.py"), "--db", str(db_path),
                                             "--config", str(ini), "serve"])
        self._portal_cm = start_blocking_portal()
        self._portal = self._portal_cm.__enter__()
        self._client_cm = self._portal.wrap_async_context_manager(Client(params))
        self._client = self._client_cm.__enter__()

    def _call(self, tool: str, args: dict) -> dict:
        r = self._portal.call(self._client.call_tool, tool, args)
        if r.is_error:
            raise RuntimeError(f"{tool} failed: {r.content[0].text if r.content else r}")
        return r.structured_content

    def memorize_many(self, items: list[tuple[str, dict]]) -> list[dict]:
        """One memorize tool call per item (what an assistant does), in order."""
        return [self._call("memorize", {"content": c, "metadata": m}) for c, m in items]

    def recall(self, query: str, k: int, persona_id: str, channels) -> dict:
        if channels is not None:
            raise click.ClickException("--via-mcp evaluates the full hybrid only (--channels all)")
        return self._call("recall", {"query": query, "limit": k, "persona_id": persona_id})

    def close(self) -> None:
        self._client_cm.__exit__(None, None, None)
        self._portal_cm.__exit__(None, None, None)
        self._dir.cleanup()


# Evaluation ######################################################################################

def channel_spec(setting: str):
    """'all' → None (every channel); 'bm25+vector' → 'bm25,vector'; else the channel name."""
    return None if setting == "all" else setting.replace("+", ",")


def ingest(sut, ds: Dataset) -> tuple[dict, dict]:
    """Store every memory in batches; returns ({memory id: {local keys}}, timing info).

    Identical texts within a persona become one memory: its id maps to every key that produced
    it."""
    id_map: dict[int, set] = {}
    started, new = time.perf_counter(), 0
    for i in range(0, len(ds.items), BATCH):
        chunk = ds.items[i:i + BATCH]
        results = sut.memorize_many([(content, meta) for _, _, content, meta in chunk])
        for (_, key, _, _), r in zip(chunk, results, strict=True):
            id_map.setdefault(r["id"], set()).add(key)
            new += not r.get("deduplicated")
        done = min(i + BATCH, len(ds.items))
        rate = done / max(1e-9, time.perf_counter() - started)
        print(f"\r  [{ds.name}] ingested {done}/{len(ds.items)} ({rate:.1f}/s)", end="",
              file=sys.stderr, flush=True)
    print(file=sys.stderr)
    seconds = time.perf_counter() - started
    return id_map, {"seconds": round(seconds, 2), "memories": len(ds.items), "new": new,
                    "distinct_ids": len(id_map),
                    "per_second": round(len(ds.items) / max(seconds, 1e-9), 1)}


def fractional_recall(gold: set, retrieved_keys: list[set], k: int) -> float:
    found = set().union(*retrieved_keys[:k]) if retrieved_keys[:k] else set()
    return len(gold & found) / len(gold)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def session_recall_any(q: Question, hits: list[dict], k: int) -> float | None:
    """LoCoMo's session-level recall_any@k: 1 when a session of an evidence turn is among the first
    k distinct sessions of the ranking, else 0; None for a question without sessions (MADial)."""
    if not q.gold_sessions:
        return None
    sessions = list(dict.fromkeys(h.get("session_id") for h in hits))[:k]
    return float(bool(q.gold_sessions & set(sessions)))


def evaluate(sut, ds: Dataset, id_map: dict, settings: list[str], passes: int = 2) -> dict:
    """Recall k=10 once per question per setting and pass (every pass asks all questions again, in
    order; what a pass's recalls recorded is in the database for the next); fractional recall@k for
    every k in ds.ks. Returns {setting: [one result per pass]}."""
    out = {}
    for setting in settings:
        # untimed warm-up: loads the embedding model and jieba before the clock runs
        if ds.questions:
            q = ds.questions[0]
            sut.recall(q.query + " warm-up", RECALL_K, q.persona_id, channel_spec(setting))
        out[setting] = [one_pass(sut, ds, id_map, setting, n) for n in range(1, passes + 1)]
    return out


def one_pass(sut, ds: Dataset, id_map: dict, setting: str, number: int) -> dict:
    """Every question once with channel setting `setting`: recall@k, session recall_any, timings."""
    per_q, took, wall, degraded, empty = [], [], [], {}, 0
    started = time.perf_counter()
    for n, q in enumerate(ds.questions, 1):
        t0 = time.perf_counter()
        ans = sut.recall(q.query, RECALL_K, q.persona_id, channel_spec(setting))
        wall.append((time.perf_counter() - t0) * 1000)
        took.append(float(ans.get("took_ms") or 0.0))
        for d in ans.get("degraded") or []:
            degraded[d["channel"]] = d.get("reason", "")
        hits = ans.get("results") or []
        empty += not hits
        keys = [id_map.get(h["id"], set()) for h in hits]
        per_q.append({"q": q, "recall": {k: fractional_recall(q.gold, keys, k) for k in ds.ks},
                      "sessions": {k: session_recall_any(q, hits, k) for k in SESSION_KS},
                      "hits": hits})
        if n % 25 == 0 or n == len(ds.questions):
            print(f"\r  [{ds.name}] {setting} pass {number}: {n}/{len(ds.questions)} questions",
                  end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    result = {"n": len(per_q), "recall": mean_recall(per_q, ds.ks), "by_category": {},
              "session_recall_any": {k: mean_of([r["sessions"][k] for r in per_q])
                                     for k in SESSION_KS},
              "empty_results": empty, "degraded": degraded,
              "query_seconds": round(time.perf_counter() - started, 2),
              "took_ms_p50": round(pct(took, 0.5), 2), "took_ms_p95": round(pct(took, 0.95), 2),
              "wall_ms_mean": round(statistics.fmean(wall), 2) if wall else 0.0}
    for cat in ds.categories:
        rows = [r for r in per_q if r["q"].category == cat]
        result["by_category"][cat] = {"n": len(rows), "recall": mean_recall(rows, ds.ks)}
    result["_rows"] = per_q
    return result


def other_personas(ds: Dataset) -> list[tuple[Question, str]]:
    """(question, a persona where its answer is not) pairs: the next conversation's persona, or with
    one persona the half of split_personas that lacks the question's gold."""
    personas = list(dict.fromkeys(q.persona_id for q in ds.questions))
    if len(personas) >= 2:
        other = {p: personas[(i + 1) % len(personas)] for i, p in enumerate(personas)}
        return [(q, other[q.persona_id]) for q in ds.questions if not q.generic]
    return [(q, ds.split_other[q.qid]) for q in ds.questions if q.qid in ds.split_other]


def other_persona(sut, ds: Dataset) -> dict | None:
    """Every question asked against a persona where its answer is not (other_personas: another
    conversation, or the other half of a split): how often the answer is empty, overall and per
    question language (`by_lang`). With off-topic questions (people), each is asked of every
    persona too (`offtopic`). None without any."""
    pairs = other_personas(ds)
    if not pairs:
        return None
    empty, by_lang = 0, {}
    for n, (q, persona) in enumerate(pairs, 1):
        none = not (sut.recall(q.query, RECALL_K, persona, None).get("results") or [])
        empty += none
        by_lang.setdefault(q.lang.split("→")[0], []).append(none)
        if n % 25 == 0 or n == len(pairs):
            print(f"\r  [{ds.name}] other persona: {n}/{len(pairs)} questions", end="",
                  file=sys.stderr, flush=True)
    print(file=sys.stderr)
    split = (" (one persona: its memories split in two, each question asked of the half without "
             "its gold)") if ds.split_other else ""
    offtopic = {}
    for query, lang in ds.offtopic:
        for persona in dict.fromkeys(q.persona_id for q in ds.questions):
            hits = sut.recall(query, RECALL_K, persona, None).get("results") or []
            offtopic.setdefault(lang, []).append(not hits)
            if hits and len(offtopic[lang]) % 7 == 1:  # a sample of what came back
                print(f"  off-topic {query[:40]!r} in {persona}: {hits[0]['text'][:50]!r} "
                      f"({hits[0].get('relevance')})", file=sys.stderr)
    return {"n": len(pairs), "empty": empty, "empty_rate": empty / max(1, len(pairs)), "how": split,
            "by_lang": {k: sum(v) / len(v) for k, v in by_lang.items()},
            "offtopic": {k: sum(v) / len(v) for k, v in offtopic.items()}}


def by_language(ds: Dataset, result: dict, others: dict | None) -> None:
    """Per question language group (people): n, R@k, answerable empty, and the other-persona and
    off-topic empty rates of the question language."""
    groups: dict[str, list] = {}
    for r in result["_rows"]:
        groups.setdefault(r["q"].lang, []).append(r)
    rows = []
    for lang, rs in sorted(groups.items()):
        base = lang.split("→")[0]
        other = (others or {}).get("by_lang", {}).get(base) if "→" not in lang else None
        off = (others or {}).get("offtopic", {}).get(base) if "→" not in lang else None
        rows.append([lang, len(rs)] + [mean_recall(rs, ds.ks)[k] for k in ds.ks]
                    + [sum(not x["hits"] for x in rs) / len(rs),
                       "" if other is None else other, "" if off is None else off])
    print("\nper language (hybrid, last pass; other persona: non-generic questions asked of the "
          "next person; off-topic: each asked of every person):")
    print(table(["lang", "n"] + [f"R@{k}" for k in ds.ks]
                + ["answerable empty", "other persona empty", "off-topic empty"], rows))


def cross_language(db_dir: Path, data_dir: Path, provider: str, config) -> dict:
    """Other persona across languages: on a copy of the LoCoMo database with MADial's memories
    added, every MADial (Chinese) question asked of a LoCoMo persona (English memories) and every
    LoCoMo question of the MADial persona. Another person's memories in another language: how often
    each comes back empty ({"zh_of_en": {n, empty, empty_rate}, "en_of_zh": …})."""
    import shutil

    copy = db_dir / "cross-language.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{copy}{suffix}").unlink(missing_ok=True)
        if Path(f"{db_dir / 'locomo.db'}{suffix}").exists():
            shutil.copyfile(f"{db_dir / 'locomo.db'}{suffix}", f"{copy}{suffix}")
    locomo, madial = load_locomo(data_dir), load_madial(data_dir)
    sut = EngineSUT(copy, provider=provider, touch=False, config=config)
    try:
        ingest(sut, madial)
        out = {}
        for key, questions, personas in (
                ("zh_of_en", madial.questions, sorted({q.persona_id for q in locomo.questions})),
                ("en_of_zh", locomo.questions, sorted({q.persona_id for q in madial.questions}))):
            empty = sum(not (sut.recall(q.query, RECALL_K, personas[n % len(personas)], None)
                             .get("results") or []) for n, q in enumerate(questions))
            out[key] = {"n": len(questions), "empty": empty,
                        "empty_rate": empty / max(1, len(questions))}
    finally:
        sut.close()
    print("asked of another persona in the other language (hybrid): Chinese questions of an "
          f"English persona {out['zh_of_en']['empty']} of {out['zh_of_en']['n']} empty "
          f"({out['zh_of_en']['empty_rate']:.1%}), English questions of the Chinese persona "
          f"{out['en_of_zh']['empty']} of {out['en_of_zh']['n']} "
          f"({out['en_of_zh']['empty_rate']:.1%})")
    return out


def mean_of(values: list) -> float | None:
    """Mean of the values that are not None (None when there are none)."""
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def mean_recall(rows: list[dict], ks) -> dict:
    return {k: (statistics.fmean(r["recall"][k] for r in rows) if rows else 0.0) for k in ks}


# Report ##########################################################################################

def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(c) for c in headers]] + [[f"{c:.3f}" if isinstance(c, float) else str(c)
                                            for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths, strict=True)))

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths)]
                     + [line(r) for r in cells[1:]])


def report(ds: Dataset, ingest_info: dict, results: dict, misses: int, texts: dict,
           others: dict | None, show_updates: bool = False) -> None:
    """Print the tables for one dataset: every setting and pass, the hybrid per category and pass,
    session recall_any, the other-persona empty rate, the marks of updates (people; print_marks)
    and (with `misses`) questions found nothing for."""
    print(f"\n== {ds.name} ==")
    for note in ds.notes:
        print(note)
    print(f"questions evaluated: {len(ds.questions)}")
    info = ingest_info
    print(f"ingest: {info['memories']} memories in {info['seconds']:.1f} s "
          f"({info['per_second']:.1f}/s; {info['new']} newly stored, {info['distinct_ids']} "
          "distinct ids)")
    ks = ds.ks
    rows = [(f"{s} pass {n}", r) for s, passes in results.items() for n, r in enumerate(passes, 1)]
    print()
    print(table(["channels"] + [f"R@{k}" for k in ks] + ["empty", "p50 ms", "p95 ms", "total s"],
                [[label] + [r["recall"][k] for k in ks]
                 + [r["empty_results"], r["took_ms_p50"], r["took_ms_p95"],
                                                           r["query_seconds"]]
                 for label, r in rows]))
    for s, passes in results.items():
        for ch, reason in passes[0]["degraded"].items():
            print(f"  degraded in {s!r}: {ch}: {reason}")
    hybrid = "all" if "all" in results else list(results)[-1]
    if ds.categories:
        print(f"\nper category ({hybrid}, each pass):")
        print(table(["category", "pass", "n"] + [f"R@{k}" for k in ks],
                    [[c, n, v["n"]] + [v["recall"][k] for k in ks]
                     for n, r in enumerate(results[hybrid], 1)
                     for c, v in r["by_category"].items() if v["n"]]))
        kmax = ks[-1]
        print(f"\nR@{kmax} per category and channel setting:")
        print(table(["channels"] + ds.categories,
                    [[label] + [r["by_category"][c]["recall"][kmax] for c in ds.categories]
                     for label, r in rows]))
    if any(r["session_recall_any"][k] is not None for _, r in rows for k in SESSION_KS):
        print("\nsession-level recall_any@k (an evidence turn's session among the first k distinct "
              "sessions):")
        print(table(["channels"] + [f"any@{k}" for k in SESSION_KS],
                    [[label] + [r["session_recall_any"][k] for k in SESSION_KS]
                     for label, r in rows]))
    last = results[hybrid][-1]
    rk = "  ".join(f"R@{k} {last['recall'][k]:.3f}" for k in ks)
    print(f"\nsummary ({hybrid}, last pass): {rk}  |  answerable empty "
          f"{last['empty_results'] / max(1, last['n']):.1%}"
          + (f"  |  other persona empty {others['empty_rate']:.1%}" if others is not None else ""))
    print(f"answerable questions answered empty ({hybrid}, last pass): {last['empty_results']} of "
          f"{last['n']}")
    if others is not None:
        print(f"asked against another persona ({hybrid}){others.get('how', '')}: {others['empty']} "
              f"of {others['n']} answers empty ({others['empty_rate']:.1%})")
    if any(q.lang for q in ds.questions):
        by_language(ds, last, others)
    if ds.updates:
        print_marks(ds, last, texts, show_updates)
    if misses:
        print_misses(ds, results[hybrid][-1], misses, texts)


def print_marks(ds: Dataset, result: dict, texts: dict, show: bool) -> None:
    """people: the (older, newer) pairs recall marked replaced_by / may_be_replaced_by among the
    hits of `result`, and how many people.json labels an update (`updates`); with `show`, every
    update question's top 3 (id, key, created_at, relevance, marks)."""
    keys = {(p, c): k for (p, k), c in texts.items()}
    for mark in ("replaced_by", "may_be_replaced_by"):
        pairs = set()
        for row in result["_rows"]:
            ids = {h["id"]: keys.get((row["q"].persona_id, h["text"])) for h in row["hits"]}
            pairs |= {(row["q"].persona_id, ids[h["id"]], ids[h[mark]]) for h in row["hits"]
                      if h.get(mark) in ids}
        right = sum(old in ds.updates.get((p, new), ()) for p, old, new in pairs)
        print(f"{mark}: {len(pairs)} pairs marked, {right} of them a labelled update")
    for row in result["_rows"] if show else []:
        if row["q"].category == "update":
            q = row["q"]
            print(f"- [{q.qid}] {q.query!r} gold {sorted(q.gold)} R@1 {row['recall'][1]:.0f}")
            for h in row["hits"][:3]:
                marks = "".join(f" {m} {h[m]}" for m in ("replaced_by", "may_be_replaced_by")
                                if h.get(m))
                print(f"    #{h['id']} {keys.get((q.persona_id, h['text']))} "
                      f"{h['created_at'][:10]} rel {h.get('relevance')}{marks}: "
                      f"{h['text'][:70]!r}")


def print_misses(ds: Dataset, result: dict, misses: int, texts: dict) -> None:
    """The first `misses` questions of `result` with nothing relevant in the top k, with gold and
    hits."""
    kmax = ds.ks[-1]
    print(f"\nfirst {misses} questions with R@{kmax} = 0 (last pass):")
    shown = 0
    for row in result["_rows"]:
        if row["recall"][kmax] > 0:
            continue
        q = row["q"]
        label = " ".join(x for x in (q.qid, q.category) if x)
        print(f"- [{label}] {q.query!r}" + (f"  answer={q.answer!r}" if q.answer else ""))
        for g in sorted(q.gold):
            print(f"    gold {g}: {texts.get((q.persona_id, g), '?')[:160]!r}")
        for h in row["hits"][:3]:
            print(f"    got  #{h['id']} {h.get('channels', '')}: {h['text'][:160]!r}")
        shown += 1
        if shown >= misses:
            break


def summary_json(ds: Dataset, ingest_info: dict, results: dict, others: dict | None) -> dict:
    """The figures of one dataset as JSON-ready data (no per-question rows)."""
    return {"dataset": ds.name, "questions": len(ds.questions), "ingest": ingest_info,
            "other_persona": others,
            "settings": {s: [{k: v for k, v in r.items() if k != "_rows"} for r in passes]
                         for s, passes in results.items()}}


# CLI #############################################################################################

@click.command()
@click.option("--dataset", type=click.Choice(["people", "locomo", "madial", "all"]), default="all",
              show_default=True)
@click.option("--channels", default=DEFAULT_CHANNELS, show_default=True,
              help="Comma-separated channel settings to evaluate: bm25, vector, graph_keyword, "
                   "graph_vector, graph, all (full hybrid); join channels with '+' for a "
                   "combination, e.g. bm25+vector.")
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path),
              default=DEFAULT_DATA, show_default=True,
              help="Folder with locomo-dev.json and madial-zh-dev/.")
@click.option("--people", "people_dir", type=click.Path(file_okay=False, path_type=Path),
              default=PEOPLE, show_default=True,
              help="Folder with people.json and offtopic.json (e.g. a held-out set).")
@click.option("--db-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep one database per dataset here and reuse it (ingest then only re-checks; "
                   "identical content is deduplicated). Default: a temporary folder, deleted "
                   "afterwards.")
@click.option("--limit-questions", type=int, default=None,
              help="Evaluate only the first N questions per dataset.")
@click.option("--provider", type=click.Choice(["local", "none"]), default="local",
              show_default=True,
              help="Embedding provider for the engine (none disables the vector channels).")
@click.option("--now", "now_iso", default=None,
              help="Fix the engine's clock (sets AOKUN_NOW), e.g. 2023-11-01T00:00:00Z.")
@click.option("--touch/--no-touch", default=True, show_default=True,
              help="Recall records access to what it returns, as shipped ([recall] "
                   "reinforce_on_recall); --no-touch turns it off, for comparison.")
@click.option("--passes", type=click.IntRange(1, 5), default=PASSES, show_default=True,
              help="Ask every question this many times (the cache emptied): pass 2 shows what use "
                   "did to recall.")
@click.option("--updates", "show_updates", is_flag=True,
              help="people: print every update question's top 3 with its marks.")
@click.option("--misses", type=int, default=0,
              help="Print N hybrid questions with nothing found in the top 10.")
@click.option("--categories", default="1,2,3,4", show_default=True,
              help="LoCoMo question categories (1 multi-hop, 2 temporal, 3 open-domain, 4 "
                   "single-hop, 5 adversarial).")
@click.option("--config", "config", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="An aokun.ini whose [recall] etc. settings the engine uses "
                   "(to compare settings; not with --via-mcp).")
@click.option("--json", "as_json", is_flag=True,
              help="Also print a machine-readable summary at the end.")
@click.option("--via-mcp", is_flag=True,
              help="Go through a real stdio MCP session (memorize every turn, recall every "
                   "question); hybrid only.")
def main(dataset, channels, data_dir, people_dir, db_dir, limit_questions, provider, now_iso,
         touch, passes, misses, categories, config, as_json, via_mcp, show_updates):
    """Recall@k of Aokun on LoCoMo and MADial-Bench zh (data and protocol: scripts/README.md).

    Example: python scripts/eval_recall.py --dataset locomo --limit-questions 50
    """
    if config and via_mcp:
        raise click.UsageError("--config applies to the in-process engine; "
                               "drop --via-mcp to use it")
    if now_iso:
        import aokun
        aokun.parse_time(now_iso, "--now")
        os.environ["AOKUN_NOW"] = now_iso
    names = ["people", "locomo", "madial"] if dataset == "all" else [dataset]
    if names != ["people"] and (not (data_dir / "locomo-dev.json").exists()
                                or not (data_dir / "madial-zh-dev").is_dir()):
        if dataset != "all":
            raise click.ClickException(f"no LoCoMo/MADial data in {data_dir}; pass --data "
                                       "pointing at a folder with locomo-dev.json and "
                                       "madial-zh-dev/")
        print(f"no LoCoMo/MADial data in {data_dir} (--data): the project's own sets only",
              file=sys.stderr)
        names = ["people"]
    settings = [s.strip() for s in channels.split(",") if s.strip()]
    if via_mcp:
        settings = ["all"]
    known = {"bm25", "vector", "graph_keyword", "graph_vector", "graph", "keyword"}
    for s in settings:
        if s != "all" and not set(s.split("+")) <= known:
            raise click.ClickException(f"--channels: unknown setting {s!r}; use "
                                       f"{', '.join(sorted(known))}, all, or channels joined with "
                                       "'+'")
    try:
        cats = tuple(sorted({int(c) for c in categories.split(",") if c.strip()}))
    except ValueError:
        cats = ()
    if not cats or not set(cats) <= set(LOCOMO_CATEGORIES):
        raise click.ClickException(f"--categories {categories!r}: give numbers from 1 to 5, e.g. "
                                   "1,2,3,4")
    tmp = None
    if db_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="aokun-eval-")
        db_dir = Path(tmp.name)
    db_dir.mkdir(parents=True, exist_ok=True)
    summaries = []
    try:
        for name in names:
            ds = load_people(people_dir) if name == "people" else \
                load_locomo(data_dir, cats) if name == "locomo" else load_madial(data_dir)
            if limit_questions is not None:
                ds.questions = ds.questions[:limit_questions]
            db_path = db_dir / f"{name}.db"
            print(f"[{name}] database {db_path}{' (reused)' if db_path.exists() else ''}",
                  file=sys.stderr)
            sut = MCPSUT(db_path, provider=provider, touch=touch) if via_mcp else \
                EngineSUT(db_path, provider=provider, touch=touch, config=config)
            try:
                id_map, info = ingest(sut, ds)
                # the split personas' copy, for other_persona
                if ds.split_items and "all" in settings:
                    ingest(sut, Dataset(f"{ds.name} split", ds.ks, items=ds.split_items))
                results = evaluate(sut, ds, id_map, settings, passes)
                others = other_persona(sut, ds) if "all" in settings else None
            finally:
                sut.close()
            texts = {(p, key): content for p, key, content, _ in ds.items}
            report(ds, info, results, misses, texts, others, show_updates)
            summaries.append(summary_json(ds, info, results, others))
        cross = cross_language(db_dir, data_dir, provider, config) \
            if names[-2:] == ["locomo", "madial"] and "all" in settings and not via_mcp \
            and limit_questions is None else None
    finally:
        if tmp is not None:
            tmp.cleanup()
    if as_json:
        print(json.dumps({"system": MCPSUT.name if via_mcp else EngineSUT.name,
                          "provider": provider, "now": now_iso, "touch": touch, "passes": passes,
                          "datasets": summaries, "cross_language": cross},
                         ensure_ascii=False, indent=2, default=str))


if __name__ == "__main__":
    main()
