"""Devices converge to identical exports (issue 24 item 9), against the real program: one file
copied to a second device (shutil.copy2), each then writing apart through `python aokun.py --db …`
child processes, both syncing through a real shared folder that a sync tool replicates. After they
converge the two exports are identical (but for PER_DEVICE, the read counters each device keeps)
and nothing either side wrote is lost: every memory is there, or deleted when a later delete won
(the edit it overwrote listed by `sync --conflicts`), and the atoms keep the reinforcements and
state changes of both sides."""

import datetime as dt
import json
import shutil
from pathlib import Path

import apsw
import pytest
from test_sync_devices import Machine, converge, exported, memory_texts, replicate, run, sync

pytestmark = pytest.mark.slow  # every test here takes 10 s or more


def memorize(tmp: Path, db: Path, text: str, *args) -> dict:
    """`memorize TEXT ARGS --json` into file `db`: its report ({id, uid, …})."""
    return json.loads(run(tmp, db, "memorize", text, "--json", *args).stdout)


def two_devices(tmp: Path, *memories: tuple) -> tuple[Machine, Machine, list[dict]]:
    """Machine one with `memories` ((text, *memorize args)) and decay 3 days behind (asleep over a
    weekend), synced once, then its file copied to machine two: (one, two, the memorize reports)."""
    one, two = (Machine(tmp, name, tmp / name / "live.db") for name in ("one", "two"))
    docs = [memorize(tmp, one.disk, *m) for m in memories]
    con = apsw.Connection(str(one.disk))
    con.execute("insert or replace into meta(key, value) values ('decay_last_run', ?)",
                ((dt.date.today() - dt.timedelta(days=3)).isoformat(),))
    con.close()
    sync(tmp, one.disk, one.share)
    shutil.copy2(one.disk, two.disk)
    replicate(one.share, two.share)
    return one, two, docs


def converged(tmp: Path, one: Machine, two: Machine) -> tuple[list[dict], list[dict]]:
    """Sync both until nothing moves; (the export, the conflicts' losers) of each must be those of
    the other. Returns machine one's."""
    converge(tmp, [one, two])
    out = []
    for m in (one, two):
        with m as db:
            conflicts = json.loads(run(tmp, db, "sync", "--conflicts", "--json").stdout)
            out.append((exported(tmp, db), sorted(json.dumps(c["loser"], sort_keys=True)
                                                  for c in conflicts)))
    assert out[0][0] == out[1][0]  # whole records: atoms' times and states too
    return out[0][0], [json.loads(c) for c in sorted(set(out[0][1]) | set(out[1][1]))]


def atoms(export: list[dict]) -> dict[str, dict]:
    return {r["content"]: r for r in export if r["kind"] == "atom"}


def test_edits_deletes_and_new_values_written_apart_converge(tmp_path):
    one, two, docs = two_devices(
        tmp_path, ("Alice lives in Beijing. Alice works at Agora.", "--participant", "Alice"),
        ("小王住在上海。小王喜欢喝冰美式。", "--participant", "小王"),
        ("Bob prefers green tea in the morning.",),
        ("The team offsite is in Hangzhou next spring.",), ("周末和小李去西湖骑自行车。",))
    with two as db:  # edited here first, deleted on one later: the delete wins
        run(tmp_path, db, "edit", docs[3]["id"], "--text", "The team offsite moved to Suzhou.")
    with one as db:
        memorize(tmp_path, db, "Alice moved to Shanghai.", "--participant", "Alice")
        run(tmp_path, db, "edit", docs[2]["id"], "--text", "Bob prefers jasmine tea now.")
        run(tmp_path, db, "delete", docs[3]["id"])
        assert json.loads(run(tmp_path, db, "decay", "--json").stdout)["days"]  # one side only
        sync(tmp_path, db, one.share)
    with two as db:  # edited here last: this edit wins
        run(tmp_path, db, "edit", docs[2]["id"], "--text", "Bob 现在喜欢乌龙茶。")
        run(tmp_path, db, "edit", docs[4]["id"], "--text", "周末和小李去西湖划船。")
        memorize(tmp_path, db, "小王搬到了深圳。", "--participant", "小王")
        run(tmp_path, db, "lifecycle")
        sync(tmp_path, db, two.share)
    export, losers = converged(tmp_path, one, two)
    assert memory_texts(export) == {
        "Alice lives in Beijing. Alice works at Agora.", "小王住在上海。小王喜欢喝冰美式。",
        "Bob 现在喜欢乌龙茶。", "周末和小李去西湖划船。", "Alice moved to Shanghai.",
        "小王搬到了深圳。"}
    assert docs[3]["uid"] in {r["uid"] for r in export if r["kind"] == "tombstone"}
    assert {"Bob prefers jasmine tea now.", "The team offsite moved to Suzhou."} <= {
        r.get("content") for r in losers}
    a = atoms(export)
    assert a["Alice lives in Beijing."]["superseded_by"] == a["Alice moved to Shanghai."]["uid"]
    assert a["小王住在上海。"]["superseded_by"] == a["小王搬到了深圳。"]["uid"]
    assert a["Alice works at Agora."]["state"] == "active"


def test_a_fact_restated_on_both_devices_keeps_both_reinforcements(tmp_path):
    one, two, _ = two_devices(
        tmp_path, ("Bob prefers green tea in the morning.", "--fact", "Bob prefers green tea"),
        ("小王喜欢喝冰美式。", "--fact", "小王喜欢喝冰美式"),
        ("Alice lives in Beijing.", "--participant", "Alice"))
    with one as db:
        memorize(tmp_path, db, "At lunch Bob said it again.", "--fact", "Bob prefers green tea")
        memorize(tmp_path, db, "午饭时小王又点了冰美式。", "--fact", "小王喜欢喝冰美式")
        memorize(tmp_path, db, "Alice moved to Shanghai.", "--participant", "Alice")
        sync(tmp_path, db, one.share)
    with two as db:  # reinforces the atom one superseded
        memorize(tmp_path, db, "On the phone Bob said it again.", "--fact", "Bob prefers green tea")
        memorize(tmp_path, db, "开会前小王又买了冰美式。", "--fact", "小王喜欢喝冰美式")
        memorize(tmp_path, db, "Alice still lives in Beijing.", "--fact", "Alice lives in Beijing.",
                 "--participant", "Alice")
    export, losers = converged(tmp_path, one, two)
    a = atoms(export)
    for fact in ("Bob prefers green tea", "小王喜欢喝冰美式"):
        assert (a[fact]["reinforcement_count"], len(a[fact]["sources"])) == (2, 3), a[fact]
    beijing = a["Alice lives in Beijing."]
    assert (beijing["state"], beijing["reinforcement_count"]) == ("superseded", 1), beijing
    assert losers == []  # atoms merge: no conflict


def test_one_text_written_on_both_devices_is_one_memory_everywhere(tmp_path):
    one, two, _ = two_devices(tmp_path, ("Carol owns a red bicycle.",))
    texts = ("咖啡馆里 Alice 说她最喜欢冰美式。", "Dana's flight to Osaka leaves on Friday.")
    with one as db:
        mine = [memorize(tmp_path, db, t)["uid"] for t in texts]
        sync(tmp_path, db, one.share)
    with two as db:
        theirs = [memorize(tmp_path, db, texts[0])["uid"],
                  memorize(tmp_path, db, texts[1], "--tag", "travel")["uid"]]
    export, losers = converged(tmp_path, one, two)
    kept = {r["content"]: r["uid"] for r in export if r["kind"] == "memory"}
    assert [kept[t] for t in texts] == [min(u) for u in zip(mine, theirs, strict=True)]
    gone = {r["uid"] for r in export if r["kind"] == "tombstone"}
    assert gone == {max(u) for u in zip(mine, theirs, strict=True)}
    assert {r["document"] for r in export if r["kind"] == "atom"} <= set(kept.values())
    assert [(r["uid"], r["tags"]) for r in losers] == [  # the tagged one differs: kept as a loser
        (max(mine[1], theirs[1]), ["travel"] if theirs[1] > mine[1] else [])]


def test_memories_edited_apart_into_one_text_are_one_memory_everywhere(tmp_path):
    """Two memories edited into one text on two devices, and a memory edited on one into the text
    of a memory new on the other (four pairs: either uid may be the smaller): one memory of each
    text everywhere, under the smaller uid; nothing edited comes back, no version is lost
    unlisted."""
    bases = [f"Base {n} original" for n in range(10)]
    one, two, docs = two_devices(tmp_path, *((b,) for b in bases))
    with one as db:
        run(tmp_path, db, "edit", docs[1]["id"], "--text", "Cross text", "--tag", "one")
        new = [memorize(tmp_path, db, f"新的 text {n}", "--tag", "one")["uid"] for n in range(4)]
        sync(tmp_path, db, one.share)
    with two as db:
        run(tmp_path, db, "edit", docs[0]["id"], "--text", "Cross text", "--tag", "two")
        for n in range(4):
            run(tmp_path, db, "edit", docs[2 + n]["id"], "--text", f"新的 text {n}", "--tag", "two")
    export, losers = converged(tmp_path, one, two)
    kept = {r["content"]: r["uid"] for r in export if r["kind"] == "memory"}
    assert set(kept) == {"Cross text", *(f"新的 text {n}" for n in range(4)), *bases[6:]}
    assert kept["Cross text"] == min(docs[0]["uid"], docs[1]["uid"])
    assert [kept[f"新的 text {n}"] for n in range(4)] == [
        min(u, docs[2 + n]["uid"]) for n, u in enumerate(new)]
    gone = {r["uid"] for r in export if r["kind"] == "tombstone"}
    assert gone == {max(docs[0]["uid"], docs[1]["uid"]),
                    *(max(u, docs[2 + n]["uid"]) for n, u in enumerate(new))}
    assert len(losers) == 5  # each pair's other version (its tag differs) is listed
