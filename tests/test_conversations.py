"""The conversation layer (issue 13, items 1, 2 and 4): each client's transcripts ingested from
fixtures written after the clients' public format descriptions (never real user data), incremental
and idempotent ingestion, the per-source rules, secret redaction everywhere it could leak, the
conversation tools (in-process and over the real CLI), personas, briefing digests, deletion and
forgetting."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import anyio
import pytest
from mcp import Client

import aokun
from fakes import FakeEmbedder

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "conversations"
CLAUDE = FIXTURES / "claude-code" / "-home-dev-aokun" / "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f.jsonl"
CODEX = FIXTURES / "codex" / "sessions" / "2026" / "03" / "03" / \
    "rollout-2026-03-03T08-15-02-0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b.jsonl"
COPILOT = FIXTURES / "copilot" / "session-state" / "3f6c9d2a-1b4e-4f7a-8c5d-6e7f8a9b0c1d" \
    / "events.jsonl"
CHATGPT = FIXTURES / "chatgpt" / "conversations.json"

#: source -> (fixture folder or file, {session id: [(role, start of text)] in order})
EXPECTED = {
    "claude-code": (FIXTURES / "claude-code", {"5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f": [
        ("user", "How do I add a jieba user dictionary"),
        ("assistant", "Add the word to rules/userdict.txt"),
        ("assistant", "The file already has 老王"),
        ("user", "顺便问一下，我们下周三去杭州出差的高铁票订好了吗？"),
        ("user", "[earlier conversation compacted]"), ("assistant", "还没有订")]}),
    "codex": (FIXTURES / "codex", {"0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b": [
        ("user", "Why does the vec0 KNN query refuse k above 4096?"),
        ("assistant", "sqlite-vec 0.1.9 rejects"), ("user", "把 channel_k 改成 200"),
        ("assistant", "会稍微慢一点"), ("assistant", "[earlier conversation compacted]")]}),
    "copilot": (FIXTURES / "copilot", {"3f6c9d2a-1b4e-4f7a-8c5d-6e7f8a9b0c1d": [
        ("user", "Write a pytest for the backup restore path"),
        ("assistant", "I added tests/test_restore.py"),
        ("user", "谢谢，再加一个中文记忆的恢复测试"), ("assistant", "好的，已经加上")]}),
    "chatgpt": (CHATGPT, {
        "67c1a2b3-0000-8000-9000-00000000a001": [
            ("user", "Plan a two-day trip to Hangzhou in April"), ("assistant", "Day 1: West Lake"),
            ("user", "我想去西湖和灵隐寺"), ("assistant", "第一天上午游西湖")],
        "67c1a2b3-0000-8000-9000-00000000a002": [
            ("user", "Read a CSV with pandas"),
            ("assistant", "Use `pd.read_csv(path)['amount'].sum()`")]}),
}
#: what each source's rules must leave out: tool calls and outputs, injected instructions, other
#: branches
NOISE = ["toolu_01", "tool_result", "# jieba user dictionary", "<system-reminder>", "CLAUDE.md",
         "Caveat:", "<command-name>", "Searching the repository", "This session is being continued",
         "<environment_context>", "AGENTS.md", "function_call", "CHANNEL_MAX_K = 4096\\n",
         "Checking sqlite-vec limits", "Summary of the "
         "conversation so far", "<current_datetime>", "conftest.py", "What about Shanghai",
         "Shanghai works too", "import pandas", "1234.5\n", "Python developer",
         "image_asset_pointer"]


def all_turns(mem, persona=None):
    out = {}
    for s in mem.list_sessions(limit=100, persona_id=persona):
        turns = mem.conversation_get_session(s["session_id"], limit=200, persona_id=persona,
                                             source=s["source"])
        out[s["session_id"]] = [(t["role"], t["text"]) for t in turns["turns"]]
    return out


def copy_fixture(src: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "t" / src.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dest)
    return dest


def claude_record(uuid: str, text: str, role: str = "user",
                  ts: str = "2026-03-02T11:00:00.000Z") -> str:
    return json.dumps({"parentUuid": None, "isSidechain": False,
                       "sessionId": "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f",
                       "cwd": "/home/dev/aokun", "type": role,
                       "message": {"role": role, "content": text}, "uuid": uuid, "timestamp": ts},
                      ensure_ascii=False)


# each source ------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", list(EXPECTED))
def test_each_source_ingests_its_fixture_keeping_only_what_was_said(mem, source):
    path, sessions = EXPECTED[source]
    out = mem.ingest(source, [path])
    n = sum(len(t) for t in sessions.values())
    assert {k: out[k] for k in ("files", "sessions", "turns", "new", "skipped")} == \
        {"files": 1, "sessions": len(sessions), "turns": n, "new": n, "skipped": 0}
    stored = all_turns(mem)
    assert set(stored) == set(sessions)
    for sid, expected in sessions.items():
        got = stored[sid]
        assert [r for r, _ in got] == [r for r, _ in expected], (sid, got)
        for (_, text), (_, start) in zip(got, expected, strict=True):
            assert text.startswith(start), (text, start)
    everything = "\n".join(t for turns in stored.values() for _, t in turns)
    assert not [x for x in NOISE if x in everything]
    again = mem.ingest(source, [path])
    assert (again["new"], again["turns"], again["skipped"]) == (0, 0, 0)
    assert mem.value("select count(*) from conv_turns") == n == \
        mem.value("select count(*) from conv_turns_fts")
    assert mem.value("select count(*) from conv_turn_vectors") == n  # one vector per turn
    assert mem.doctor() == []


def test_session_rows_carry_title_project_times_and_first_message(mem):
    mem.ingest("claude-code", [CLAUDE])
    mem.ingest("codex", [CODEX])
    claude = mem.conversation_get_session("5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f")["session"]
    assert claude == {"source": "claude-code", "session_id": "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f",
                      "project": "/home/dev/aokun",
                      "title": "jieba user dictionary for coffee words",
                      "first_user_message": "How do I add a jieba user dictionary so that 冰美式 "
                                            "is segmented as one word?",
                      "started_at": "2026-03-02T09:00:00Z", "ended_at": "2026-03-02T10:30:05Z",
                      "turn_count": 6}
    codex = mem.conversation_get_session("0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b")["session"]
    # no title: the first message
    assert codex["title"] == "Why does the vec0 KNN query refuse k above 4096?"
    assert codex["project"] == "/home/dev/aokun" and codex["turn_count"] == 5


def test_chatgpt_zip_and_plain_json_give_the_same_turns(tmp_path, open_mem):
    z = tmp_path / "export.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.write(CHATGPT, "conversations.json")
        f.writestr("chat.html", "<html></html>")
    plain, zipped = open_mem(tmp_path / "a.db"), open_mem(tmp_path / "b.db")
    assert plain.ingest("chatgpt", [CHATGPT])["new"] == 6
    assert zipped.ingest("chatgpt", [z])["new"] == 6
    assert all_turns(plain) == all_turns(zipped)
    assert zipped.ingest("chatgpt", [z])["new"] == 0
    bad = tmp_path / "other.zip"
    with zipfile.ZipFile(bad, "w") as f:
        f.writestr("notes.txt", "x")
    with pytest.raises(aokun.InputError, match="without a conversations.json"):
        zipped.ingest("chatgpt", [bad])


# incremental and idempotent ----------------------------------------------------------------------

def test_appended_lines_are_the_only_ones_added(mem, tmp_path):
    path = copy_fixture(CLAUDE, tmp_path)
    assert mem.ingest("claude-code", [path])["new"] == 6
    with path.open("a", encoding="utf-8") as f:
        f.write(claude_record("bbbbbbbb-0000-4000-8000-000000000001",
                              "Please also add 手冲咖啡 to the dictionary")
                + "\n")
        f.write(claude_record("bbbbbbbb-0000-4000-8000-000000000002",
                              "Done: 手冲咖啡 is in rules/userdict.txt.", role="assistant",
                              ts="2026-03-02T11:00:05.000Z") + "\n")
    out = mem.ingest("claude-code", [path])
    assert (out["turns"], out["new"], out["sessions"]) == (2, 2, 1)
    turns = all_turns(mem)["5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f"]
    assert len(turns) == 8 \
        and turns[-1] == ("assistant", "Done: 手冲咖啡 is in rules/userdict.txt.")
    session = mem.conversation_get_session("5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f")["session"]
    assert session["turn_count"] == 8


def test_a_half_written_last_line_waits_for_the_next_run(mem, tmp_path):
    path = copy_fixture(CODEX, tmp_path)
    mem.ingest("codex", [path])
    line = json.dumps({"timestamp": "2026-03-03T10:00:00.000Z", "type": "response_item",
                       "payload": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "一个写到一半的问题"}]}},
        ensure_ascii=False)
    with path.open("a", encoding="utf-8") as f:
        f.write(line[:40])  # the client is still writing it
    out = mem.ingest("codex", [path])
    assert (out["new"], out["skipped"]) == (0, 0)
    with path.open("a", encoding="utf-8") as f:
        f.write(line[40:] + "\n")
    out = mem.ingest("codex", [path])
    assert (out["new"], out["skipped"]) == (1, 0)
    turns = all_turns(mem)["0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b"]
    # the session carried over from the first run's session_meta
    assert turns[-1] == ("user", "一个写到一半的问题")


def test_a_malformed_line_in_the_middle_is_skipped_and_counted(mem, tmp_path):
    lines = COPILOT.read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path / "session-state" / "3f6c9d2a-1b4e-4f7a-8c5d-6e7f8a9b0c1d" / "events.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(lines[:4]) + '{"type": "user.message", "data": {"content": "broken\n'
                    + "[1, 2]\n" + "".join(lines[4:]), encoding="utf-8")
    out = mem.ingest("copilot", [tmp_path / "session-state"])  # a folder: its events.jsonl files
    assert (out["files"], out["turns"], out["new"], out["skipped"]) == (1, 4, 4, 2)


def test_a_replaced_file_is_read_from_the_start_without_duplicates(mem, tmp_path):
    path = copy_fixture(CLAUDE, tmp_path)
    mem.ingest("claude-code", [path])
    path.write_text(claude_record("cccccccc-0000-4000-8000-000000000001",
                                  "A new file at the same path") + "\n"
                    + CLAUDE.read_text(encoding="utf-8"), encoding="utf-8")
    out = mem.ingest("claude-code", [path])
    # every turn read again, the known ones not stored twice
    assert (out["turns"], out["new"]) == (7, 1)


def test_ingest_without_a_path_reads_the_clients_standard_location(mem, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    target = tmp_path / ".copilot" / "session-state" / COPILOT.parent.name / "events.jsonl"
    target.parent.mkdir(parents=True)
    shutil.copy(COPILOT, target)
    assert mem.ingest("copilot")["new"] == 4
    with pytest.raises(aokun.InputError, match="source"):
        mem.ingest("gemini")


# search, sessions, personas --------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_conversations(tmp_path_factory, segmenter):
    """A Memory with the real local embedder holding every fixture, under its own persona."""
    m = aokun.Memory(tmp_path_factory.mktemp("conv") / "c.db", aokun.Config(None),
                     embedder=aokun.LocalEmbedder())
    m.seg = segmenter
    for source, (path, _) in EXPECTED.items():
        m.ingest(source, [path], persona_id="conv")
    yield m
    m.close()


@pytest.mark.slow
@pytest.mark.parametrize("query, expected", [
    ("高铁票订好了吗", "顺便问一下，我们下周三去杭州出差的高铁票订好了吗？"),
    ("why is the KNN k limited to 4096", "Why does the vec0 KNN query refuse k above 4096?"),
    # English → Chinese
    ("how should I plan my visit to the temples near West Lake",
     "我想去西湖和灵隐寺，怎么安排比较好？"),
])
def test_conversation_search_finds_a_turn_by_a_chinese_and_an_english_phrase(local_conversations,
                                                                             query, expected):
    out = local_conversations.conversation_search(query, k=3, persona_id="conv")
    texts = [h["text"] for h in out["results"]]
    assert expected in texts[:2], (query, texts)
    hit = out["results"][texts.index(expected)]
    assert "vector" in hit["channels"] and hit["relevance"] is not None and out["degraded"] == []


def test_conversation_search_filters_by_source_session_and_time(local_conversations):
    m = local_conversations
    only = m.conversation_search("KNN k 4096", k=5, source="copilot", persona_id="conv")["results"]
    assert all(h["source"] == "copilot" for h in only)
    session = m.conversation_search("西湖", k=5, session_id="67c1a2b3-0000-8000-9000-00000000a001",
                                    persona_id="conv")["results"]
    assert session \
        and {h["session_id"] for h in session} == {"67c1a2b3-0000-8000-9000-00000000a001"}
    late = m.conversation_search("高铁票订好了吗", k=5, since="2026-03-03T00:00:00Z",
                                 persona_id="conv")["results"]
    assert all(h["created_at"] >= "2026-03-03T00:00:00Z" for h in late)
    assert "顺便问一下，我们下周三去杭州出差的高铁票订好了吗？" not in [h["text"] for h in late]
    cut = m.conversation_search("sqlite-vec rejects KNN", k=1, persona_id="conv",
                                max_chars_per_hit=30)["results"]
    assert cut[0]["truncated"] and len(cut[0]["text"]) <= 30
    with pytest.raises(aokun.InputError, match="since"):
        m.conversation_search("x", since="yesterday-ish", persona_id="conv")


def test_get_session_returns_turns_in_order_a_page_at_a_time(mem):
    mem.ingest("claude-code", [CLAUDE])
    sid = "5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f"
    whole = [t["text"] for t in mem.conversation_get_session(sid, limit=50)["turns"]]
    first = mem.conversation_get_session(sid, offset=0, limit=4)
    rest = mem.conversation_get_session(sid, offset=first["next_offset"], limit=4)
    assert [t["text"] for t in first["turns"] + rest["turns"]] == whole and len(whole) == 6
    assert first["next_offset"] == 4 and rest["next_offset"] is None
    assert [t["seq"] for t in first["turns"]] == sorted(t["seq"] for t in first["turns"])
    with pytest.raises(aokun.InputError, match="limit"):
        mem.conversation_get_session(sid, limit=0)
    with pytest.raises(aokun.NotFound):
        mem.conversation_get_session("no-such-session")


def test_personas_never_see_each_others_conversations(mem):
    mem.ingest("codex", [CODEX], persona_id="work")
    assert mem.conversation_search("KNN 4096", persona_id="work")["results"]
    assert mem.conversation_search("KNN 4096")["results"] == []
    assert mem.conversation_search("KNN 4096", persona_id="home")["results"] == []
    with pytest.raises(aokun.NotFound):
        mem.conversation_get_session("0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b", persona_id="home")
    assert mem.conversation_stats("home")["turns"] == 0 \
        and mem.conversation_stats("work")["turns"] == 5
    # the same file for another persona is its own copy
    assert mem.ingest("codex", [CODEX], persona_id="home")["new"] == 5


def test_recall_includes_conversation_hits_only_when_asked_and_boosted_down(mem):
    mem.ingest("codex", [CODEX])
    mem.memorize("The KNN k limit of sqlite-vec 0.1.9 is 4096.")
    plain = mem.recall("KNN k limit 4096")
    assert plain["conversations"] == [] and plain["results"]
    both = mem.recall("KNN k limit 4096", include_conversations=True)
    assert [h["id"] for h in both["results"]] == [h["id"] for h in plain["results"]]
    turns = mem.conversation_search("KNN k limit 4096")["results"]
    assert [h["turn_id"] for h in both["conversations"]] == [h["turn_id"] for h in turns]
    boost = mem.cfg.recall.source_boost_import
    assert both["conversations"][0]["score"] == pytest.approx(turns[0]["score"] * boost, abs=1e-5)


def test_briefing_lists_recent_sessions_with_their_ids(mem, monkeypatch):
    monkeypatch.setenv("AOKUN_NOW", "2026-03-05T12:00:00Z")
    mem.ingest("copilot", [COPILOT])
    mem.ingest("chatgpt", [CHATGPT])  # February: older than briefing_recent_days
    text = mem.memory_context()["text"]
    assert "## Recent sessions" in text
    assert "2026-03-04 copilot · 4 turns · Write a pytest for the backup restore path " \
           "(session 3f6c9d2a-1b4e-4f7a-8c5d-6e7f8a9b0c1d)" in text
    assert "Hangzhou trip plan" not in text


# deleting and forgetting ----------------------------------------------------------------------

def test_deleting_a_session_removes_it_everywhere_and_leaves_tombstones(mem):
    mem.ingest("copilot", [COPILOT])
    mem.ingest("codex", [CODEX])
    out = mem.delete_session("3f6c9d2a-1b4e-4f7a-8c5d-6e7f8a9b0c1d")
    assert out == \
        {"session_id": "3f6c9d2a-1b4e-4f7a-8c5d-6e7f8a9b0c1d", "source": "copilot", "turns": 4}
    assert mem.value("select count(*) from conv_turns") == 5 == \
        mem.value("select count(*) from conv_turns_fts")
    assert mem.value("select count(*) from conv_turn_vectors") == 5 == \
        mem.value("select count(*) from conv_turn_vec")
    assert mem.value("select count(*) from tombstones where table_name = 'conv_turns'") == 4
    assert mem.value("select count(*) from tombstones where table_name = 'conv_sessions'") == 1
    assert mem.conversation_search("backup restore pytest", source="copilot")["results"] == []
    # its file's offset stays: not ingested back
    assert mem.ingest("copilot", [COPILOT])["new"] == 0
    assert mem.doctor() == []


def test_keep_days_forgets_old_sessions_in_maintenance(tmp_path, open_mem, monkeypatch):
    cfg = aokun.Config(None, overrides={("conversations", "keep_days"): 30,
                                        ("backup", "daily"): False})
    m = open_mem(tmp_path / "k.db", cfg=cfg)
    m.ingest("chatgpt", [CHATGPT])  # late February
    m.ingest("copilot", [COPILOT])  # 4 March
    ref = aokun.parse_time("2026-04-01T00:00:00Z")
    assert m.prune_conversations(ref, dry_run=True) == {"sessions": 2, "turns": 6, "dry_run": True}
    assert m.value("select count(*) from conv_sessions") == 3
    assert m.maintenance_due(ref)["conversations_pruned"] == 2
    assert [s["source"] for s in m.list_sessions()] == ["copilot"]
    assert m.value("select count(*) from conv_turns_fts") == 4 and m.doctor() == []
    keep = open_mem(tmp_path / "f.db")  # keep_days = 0: forever
    keep.ingest("chatgpt", [CHATGPT])
    assert keep.prune_conversations(aokun.parse_time("2036-01-01T00:00:00Z"))["sessions"] == 0


def test_stats_and_doctor_cover_the_conversation_layer(mem):
    mem.ingest("codex", [CODEX])
    counts = mem.stats()["counts"]
    assert {k: counts[k] for k in ("conversation_sessions", "conversation_turns",
                                   "conversation_turns_fts", "conversation_turn_vectors",
                                   "conversation_index_rows", "conversation_turns_awaiting_vectors",
                                   "conversation_files")} == {
        "conversation_sessions": 1, "conversation_turns": 5, "conversation_turns_fts": 5,
        "conversation_turn_vectors": 5, "conversation_index_rows": 5,
        "conversation_turns_awaiting_vectors": 0, "conversation_files": 1}
    with mem.tx() as c:
        c.execute("delete from conv_turns_fts where rowid = (select min(id) from conv_turns)")
    assert "1 conversation turns without an FTS row" in mem.doctor()


def test_turn_vectors_are_back_filled_when_embedding_failed(tmp_path, open_mem):
    class Failing(FakeEmbedder):
        fail = True

        def embed_documents(self, texts):
            if self.fail:
                raise aokun.EmbeddingError("provider down")
            return super().embed_documents(texts)
    e = Failing(16)
    m = open_mem(tmp_path / "f.db", embedder=e)
    m.memorize("a memory so the vector tables exist")  # fails too: stays pending
    assert m.ingest("copilot", [COPILOT])["new"] == 4
    assert m.value("select count(*) from conv_turns where embedding_state = 'pending'") == 4
    e.fail = False
    assert m.backfill_vectors() >= 1 and m.backfill_turn_vectors() == 4
    assert m.value("select count(*) from conv_turn_vec") == 4 and m.doctor() == []


# secrets ----------------------------------------------------------------------------------------

#: real-looking fake keys of the common providers, with the kind each must be redacted as
SECRETS = {
    "sk-proj-Xk3v9QmT2pLw8RzN4bYc7HdJ6fGa1sEo5uIqWnVt0MxKyZrB": "openai_key",
    "sk-4f9TqL2mXv8RzN3bYc7HdJ6fGa1sEo5uIqWnVt0MxKyZ": "openai_key",
    "sk-ant-api03-q8Zr4TnW2mXv9LpK3bYc7HdJ6fGa1sEo5uIqWnVt0MxKyZrBdCeF-gHiJ": "anthropic_key",
    "AKIAQ3EGRT5YL7XWNZPD": "aws_access_key",
    "ghp_R8tZk2Lm9QvX4nWb7Yc1Hd6Jf3Ga5sEo0uIq": "github_token",
    "github_pat_11ABCDEFG0aBcDeFgHiJkL_mNoPqRsTuVwXyZ0123456789"
    "abcdefghijklmnopqrstuvwxyzAB": "github_token",
    "xoxb-2847561093-5829301746-Qm8Tz2Lk9RvX4nWb7Yc1Hd6J": "slack_token",
    "AIzaSyD8fK2mQ9vX4nWb7Yc1Hd6Jf3Ga5sEo0uI": "google_api_key",
    "sk_live_51H8fK2mQ9vX4nWb7Yc1Hd6Jf3Ga5sEo0uIqWnVt": "stripe_key",
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9."
    "eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkFsaWNlIn0.8fK2mQ9vX4nWb7Yc1Hd6Jf3Ga5": "jwt",
}
PEM = ("-----BEGIN RSA PRIVATE KEY-----\n"
       "MIIEowIBAAKCAQEA7xK2mQ9vX4nWb7Yc1Hd6Jf3Ga5sEo0uIqWnVt0MxKyZrBdCeF\n"
       "q8Zr4TnW2mXv9LpK3bYc7HdJ6fGa1sEo5uIqWnVt0MxKyZrBdCeFgHiJ==\n-----END RSA PRIVATE KEY-----")
PASSWORD = "Hunter2-Corr3ct-Horse"
DB_URL_PASSWORD = "s3cr3t-Pg-Pass"


def _planted_text(i: int) -> str:
    keys = " and ".join(SECRETS)
    return (f"[{i}] my keys are {keys}; password={PASSWORD}; the database is "
            f"postgres://app:{DB_URL_PASSWORD}@db.internal:5432/prod\n{PEM}")


def test_redact_replaces_each_kind_of_secret():
    mem_patterns = aokun.load_secret_rules(aokun.HERE / "rules" / "secrets.toml")
    for key, kind in SECRETS.items():
        assert aokun.redact(f"key: {key} end", mem_patterns) == f"key: [REDACTED:{kind}] end", key
    assert aokun.redact(PEM, mem_patterns) == "[REDACTED:private_key]"
    assert aokun.redact(f"password={PASSWORD}", mem_patterns) == "password=[REDACTED:password]"
    assert aokun.redact(f'"api_key": "{PASSWORD}"', mem_patterns) == \
        '"api_key": "[REDACTED:password]"'
    assert aokun.redact(f"postgres://app:{DB_URL_PASSWORD}@db:5432/x", mem_patterns) == \
        "postgres://app:[REDACTED:connection_string]@db:5432/x"
    ordinary = ("Use sk-learn? No: scikit-learn 1.5, 4096-d vectors, AKIA is a prefix, "
                "the token budget is 400.")
    assert aokun.redact(ordinary, mem_patterns) == ordinary


def test_a_planted_secret_is_absent_from_every_byte_of_the_file(tmp_path, open_mem):
    db = tmp_path / "s.db"
    m = open_mem(db)
    path = copy_fixture(CLAUDE, tmp_path)
    with path.open("a", encoding="utf-8") as f:
        f.write(claude_record("dddddddd-0000-4000-8000-000000000001", _planted_text(1)) + "\n")
    assert m.ingest("claude-code", [path])["new"] == 7
    stored = m.memorize(_planted_text(2),
                        {"summary": f"the passwd: {PASSWORD}", "key_facts": [_planted_text(3)]})
    m.edit(stored["id"], _planted_text(4))
    text = all_turns(m)["5b0c2f4e-7d1a-4c3b-9e8f-1a2b3c4d5e6f"][-1][1]
    for kind in set(SECRETS.values()) | {"private_key", "password", "connection_string"}:
        assert f"[REDACTED:{kind}]" in text, kind
    assert "[REDACTED:openai_key]" in m.get(stored["id"])["content"]
    # the rest stays searchable
    assert m.conversation_search("keys password database postgres")["results"]
    m.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("s.db*"))
    planted = [*SECRETS, PASSWORD, DB_URL_PASSWORD,
               "MIIEowIBAAKCAQEA7xK2mQ9vX4nWb7Yc1Hd6Jf3Ga5sEo0uIqWnVt0MxKyZrBdCeF"]
    assert [s for s in planted if s.encode() in raw] == []
    assert b"[REDACTED:anthropic_key]" in raw


#: forms the first patterns let through: (text, what it must become)
MORE_FORMS = [
    ("DB_PASSWORD=Tq7hunter2secret", "DB_PASSWORD=[REDACTED:password]"),
    ("export PGPASSWORD=pgsecret99x", "export PGPASSWORD=[REDACTED:password]"),
    ("SECRET_KEY = 'djsecret123zz'", "SECRET_KEY = '[REDACTED:password]'"),
    ('AWS_SESSION_TOKEN: "FwoGZXIvYXdzEBYaDk7"', 'AWS_SESSION_TOKEN: "[REDACTED:password]"'),
    ("OPENAI_API_KEY=proxykey4242", "OPENAI_API_KEY=[REDACTED:password]"),
    ("client_secret: Zz9-client-Sec", "client_secret: [REDACTED:password]"),
    ("DJANGO_SECRET_KEY=letmeinplease", "DJANGO_SECRET_KEY=[REDACTED:password]"),
    ("redis://cache:ab/cd99Slash@redis.internal:6379/0",
     "redis://cache:[REDACTED:connection_string]@redis.internal:6379/0"),
    ("mongodb://root:p@ssAtMongo7@mongo:27017/app",
     "mongodb://root:[REDACTED:connection_string]@mongo:27017/app"),
    ("key:\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUCutKeyLine\n"
     "AAAAAAEAAAAz",
     "key:\n[REDACTED:private_key]"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9wCutBlank\n\nThen we talked about lunch.",
     "[REDACTED:private_key]\n\nThen we talked about lunch."),
    ("my password is hunter2", "my password is [REDACTED:password]"),  # said in prose
    ("我的密码是 hunter2", "我的密码是 [REDACTED:password]"),
    ("WiFi密码：Tr0ub4dor3", "WiFi密码：[REDACTED:password]"),
    ("My password for the bank is Tr0ub4dor&3 and my PIN is 4821.",  # the second trial's
     "My password for the bank is [REDACTED:password] and my PIN is [REDACTED:password]."),
    ("My Gmail login is sophie.mum@gmail.com with password Sunflower2024!",
     "My Gmail login is sophie.mum@gmail.com with password [REDACTED:password]"),
    ("the PIN for the card: 0000", "the PIN for the card: [REDACTED:password]"),
]
#: look like assignments, are prose or placeholders: stay as written
NOT_SECRETS = ["secret: Here is my setup", "The secret: patience.", "password: required",
               "max_tokens=4096", "token: 400", "the api_key: none yet",
               "Secret: the sauce is mostly butter", "the password is weak",
               "my password is in the drawer", "密码是生日", "The wifi password was changed",
               "I need a password manager", "password reset link sent", "Pin the memory 1234"]


def test_redact_catches_env_names_url_passwords_with_slash_or_at_and_cut_keys():
    mem_patterns = aokun.load_secret_rules(aokun.HERE / "rules" / "secrets.toml")
    assert [(t, aokun.redact(t, mem_patterns)) for t, want in MORE_FORMS
            if aokun.redact(t, mem_patterns) != want] == []
    assert [t for t in NOT_SECRETS if aokun.redact(t, mem_patterns) != t] == []


#: (field, fake secret): a memory field written with a secret in it, and the secret alone
FIELD_SECRETS = {
    "topics": "ghp_T0p1cR8tZk2Lm9QvX4nWb7Yc1Hd6Jf3Ga5sE",
    "participants": "xoxb-2847561093-Part1cipant-Qm8Tz2Lk9R",
    "tags": "AKIAQ3EGRT5YTAGSXNZP",
    "session_id": "sk-ant-api03-Sess10nq8Zr4TnW2mXv9LpK3bYc7HdJ6",
    "source": "sk-proj-S0urceXk3v9QmT2pLw8RzN4bYc7HdJ6",
    "sentiment": "AIzaSyD8fK2mQ9vX4nSentim3ntYc1Hd6Jf3Ga5",
    "summary": "DB_PASSWORD=Summ4ryHunter2",
    "key_facts": "PGPASSWORD=KeyF4ctPg99",
}
EDIT_SECRETS = {"topics": "ghp_Ed1tT0p1cZk2Lm9QvX4nWb7Yc1Hd6Jf3Ga5",
                "summary": "SECRET_KEY=Ed1tSumm4ryDj"}
KG_SECRETS = ("ghp_KgObj3ctR8tZk2Lm9QvX4nWb7Yc1Hd6Jf3Ga", "Kg-hunter2-Pass9")


def test_no_field_of_memorize_edit_or_kg_add_keeps_a_secret_in_the_db_or_wal(tmp_path, open_mem):
    db = tmp_path / "f.db"
    m = open_mem(db)
    path = copy_fixture(CLAUDE, tmp_path)
    with path.open("a", encoding="utf-8") as f:
        f.write(claude_record("dddddddd-0000-4000-8000-000000000002",
                              "\n".join(t for t, _ in MORE_FORMS)) + "\n")
    assert m.ingest("claude-code", [path])["new"] == 7
    meta = {k: f"note {v} end" if k in ("summary", "sentiment") else
            v if k in ("session_id", "source") else [f"about {v}"]
            for k, v in FIELD_SECRETS.items()}
    stored = m.memorize("Deploy notes for the staging box.", meta)
    m.edit(stored["id"], metadata={"topics": [f"then {EDIT_SECRETS['topics']}"],
                                   "summary": EDIT_SECRETS["summary"]})
    m.kg_add("Server", "api_key", KG_SECRETS[0])
    m.kg_add("Staging DB", "password", KG_SECRETS[1])
    d = m.get(stored["id"])
    assert d["topics"] == ["then [REDACTED:github_token]"] \
        and d["tags"] == ["about [REDACTED:aws_access_key]"]
    assert d["summary"] == "SECRET_KEY=[REDACTED:password]"
    assert [f["object"] for f in m.kg_query("Staging DB")["facts"]] == ["[REDACTED:password]"]
    planted = [*FIELD_SECRETS.values(), *EDIT_SECRETS.values(), *KG_SECRETS,
               "Tq7hunter2secret", "pgsecret99x", "djsecret123zz", "FwoGZXIvYXdzEBYaDk7",
               "proxykey4242", "Zz9-client-Sec", "letmeinplease", "cd99Slash", "ssAtMongo7",
               "CutKeyLine", "CutBlank"]
    planted = [s.split("=", 1)[-1] for s in planted]  # the value of an assignment
    while_open = b"".join(p.read_bytes() for p in tmp_path.glob("f.db*"))
    m.close()
    after = b"".join(p.read_bytes() for p in tmp_path.glob("f.db*"))
    assert [s for s in planted if s.encode() in while_open or s.encode() in after] == []
    assert b"[REDACTED:connection_string]" in after and b"Then we talked about lunch" in after

# the MCP tools and the CLI --------------------------------------------------------------------

@pytest.mark.slow
def test_mcp_conversation_tools_are_listed_by_default_and_answer(tmp_path, segmenter):
    db = tmp_path / "m.db"
    cfg = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path / "bk"),
                                        ("backup", "daily"): False})
    seeded = aokun.Memory(db, cfg, embedder=FakeEmbedder(16))
    seeded.seg = segmenter
    seeded.ingest("codex", [CODEX])
    seeded.close()

    def factory():
        m = aokun.Memory(db, cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        return m

    async def run():
        async with Client(aokun.build_server(factory, cfg)) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            for name in ("conversation_search", "conversation_get_session"):
                assert tools[name].annotations.read_only_hint is True
            assert "conversation_stats" not in tools  # listed with exposed_tools = all
            found = await c.call_tool("conversation_search",
                                      {"query": "channel_k 召回", "limit": 2})
            assert not found.is_error \
                and found.structured_content["results"][0]["text"].startswith("把 channel_k")
            sid = found.structured_content["results"][0]["session_id"]
            page = await c.call_tool("conversation_get_session",
                                     {"session_id": sid, "offset": 1, "limit": 2})
            assert [t["role"] for t in page.structured_content["turns"]] == ["assistant", "user"]
            both = await c.call_tool("recall",
                                     {"query": "channel_k 召回", "include_conversations": True})
            assert not both.is_error and both.structured_content["conversations"]
            bad = await c.call_tool("conversation_get_session", {"session_id": "nope"})
            assert bad.is_error and "no ingested session" in bad.content[0].text
        every = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path / "bk"),
                                              ("backup", "daily"): False,
                                              ("server", "exposed_tools"): "all"})
        async with Client(aokun.build_server(factory, every)) as c:
            stats = await c.call_tool("conversation_stats", {})
            assert stats.structured_content["by_source"]["codex"]["turns"] == 5
    anyio.run(run)


@pytest.mark.slow
def test_mcp_conversation_stats_tells_the_watchs_progress_only_while_it_reads(tmp_path, segmenter):
    cfg = aokun.Config(None, overrides={
        ("backup", "dir"): str(tmp_path / "bk"), ("backup", "daily"): False,
        ("server", "exposed_tools"): "all", ("conversations", "watch"): False})
    opened = []

    def factory():
        m = aokun.Memory(tmp_path / "w.db", cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        opened.append(m)
        return m
    reading = {"files_done": 10, "files_left": 90, "files_skipped": 0, "turns_done": 400,
               "turns_left": 3600, "turns_per_second": 20.0, "seconds_left": 180,
               "searchable_after": "2026-11-30T10:00:00Z", "started_at": "2026-12-01T09:00:00Z",
               "finished_at": None, "updated_at": "2026-12-01T09:01:00Z"}

    async def run():
        async with Client(aokun.build_server(factory, cfg)) as c:
            quiet = await c.call_tool("conversation_stats", {})
            assert quiet.structured_content["watch"] is None
            assert "watch" not in quiet.content[0].text  # the text leaves nulls out
            opened[-1].watch_state = reading
            busy = (await c.call_tool("conversation_stats", {})).structured_content["watch"]
            assert busy == {k: reading[k] for k in aokun.WATCH_PROGRESS_MCP}  # lean: no times
            found = await c.call_tool("conversation_search", {"query": "anything"})
            warnings = " ".join(found.structured_content["warnings"])
            assert "still being read, newest first" in warnings
            opened[-1].watch_state = dict(reading, files_left=0, turns_left=0, seconds_left=0)
            done = await c.call_tool("conversation_stats", {})
            assert done.structured_content["watch"] is None
    anyio.run(run)


def _cli(db, *args):
    return subprocess.run([sys.executable, str(aokun.HERE / "aokun.py"), "--db", str(db), *args],
                          capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(db.parent),
                               "AOKUN_LOG_LEVEL": "WARNING"})


@pytest.mark.slow
def test_cli_ingest_json_summary_then_nothing_new_and_browse(tmp_path):
    db = tmp_path / "cli.db"
    (tmp_path / "aokun.ini").write_text("[embedding]\nprovider = none\n", encoding="utf-8")
    first = _cli(db, "--config", str(tmp_path / "aokun.ini"), "ingest", "codex",
                 str(FIXTURES / "codex"), "--json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert set(out) == {"sessions", "turns", "new", "skipped", "deleted", "seconds"}
    assert (out["sessions"], out["turns"], out["new"], out["skipped"]) == (1, 5, 5, 0)
    again = _cli(db, "--config", str(tmp_path / "aokun.ini"), "ingest", "codex",
                 str(FIXTURES / "codex"))
    assert again.returncode == 0 and "0 new" in again.stdout, again.stdout + again.stderr
    listed = _cli(db, "--config", str(tmp_path / "aokun.ini"), "conversations", "list")
    assert "0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b" in listed.stdout and "5 turns" in listed.stdout
    found = _cli(db, "--config", str(tmp_path / "aokun.ini"), "conversations", "search",
                 "channel_k")
    assert "把 channel_k 改成 200" in found.stdout, found.stdout + found.stderr
    shown = _cli(db, "--config", str(tmp_path / "aokun.ini"), "conversations", "show",
                 "0199a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b", "--limit", "2")
    assert shown.stdout.count("] user:") == 1 and "more: --offset 2" in shown.stderr
    missing = _cli(db, "--config", str(tmp_path / "aokun.ini"), "ingest", "codex",
                   str(tmp_path / "nope"))
    assert missing.returncode == 1 and missing.stderr.strip().startswith("Error: PATH:") \
        and "Traceback" not in missing.stderr


def test_rebuild_vectors_re_embeds_the_turns_with_the_new_model(tmp_path, open_mem):
    db = tmp_path / "r.db"
    m = open_mem(db)
    m.ingest("codex", [CODEX])
    m.close()
    other = open_mem(db, embedder=FakeEmbedder(32))
    assert other.vector_problem and other.conversation_search("channel_k")["degraded"]
    assert other.rebuild(vectors=True)["turn_vectors"] == 5
    assert "bit[32]" in other.value("select sql from sqlite_master where name = 'conv_turn_vec'")
    hits = other.conversation_search("channel_k 召回")
    assert hits["degraded"] == [] and "vector" in hits["results"][0]["channels"]
    assert other.doctor() == []


def test_a_lone_surrogate_or_a_deeply_nested_line_costs_only_that_line(mem, tmp_path):
    """A `\\ud800` escape (legal JSON, no Unicode character) is stored as U+FFFD; a line nested too
    deep for Python's parser is skipped and counted; the other file and the other lines are
    stored."""
    folder = tmp_path / "projects" / "-home-dev-aokun"
    folder.mkdir(parents=True)
    shutil.copy(CLAUDE, folder / CLAUDE.name)
    other = "6c1d3f5e-8e2b-4d4c-af90-2b3c4d5e6f70"
    lines = CLAUDE.read_text(encoding="utf-8").replace(CLAUDE.stem, other).splitlines(keepends=True)
    bad = claude_record("dddddddd-0000-4000-8000-000000000001", "broken SURROGATE text").replace(
        CLAUDE.stem, other).replace("SURROGATE", "\\ud800")
    deep = '{"type": "user", "message": {"role": "user", "content": ' \
        + "[" * 100000 + "]" * 100000 + "}}\n"
    (folder / f"{other}.jsonl").write_text("".join(lines[:3]) + bad + "\n" + deep
                                           + "".join(lines[3:]), encoding="utf-8")
    out = mem.ingest("claude-code", [tmp_path / "projects"])
    assert (out["files"], out["sessions"], out["skipped"]) == (2, 2, 1), out
    turns = all_turns(mem)
    assert len(turns[CLAUDE.stem]) == 6 and len(turns[other]) == 7
    assert ("user", "broken \ufffd text") in turns[other]
    assert mem.conversation_search("broken text")["results"][0]["text"] == "broken \ufffd text"
    assert mem.ingest("claude-code", [tmp_path / "projects"])["new"] == 0


def test_a_deleted_session_stays_deleted_when_a_new_file_holds_it(mem, tmp_path):
    mem.ingest("chatgpt", [CHATGPT])
    mem.delete_session("67c1a2b3-0000-8000-9000-00000000a001")
    # a later export: other bytes, same conversations
    export = tmp_path / "new-export" / "conversations.json"
    export.parent.mkdir()
    export.write_text(json.dumps(json.loads(CHATGPT.read_text(encoding="utf-8")), indent=1),
                      encoding="utf-8")
    out = mem.ingest("chatgpt", [export])
    assert (out["sessions"], out["new"], out["deleted"]) == (1, 0, 1), out
    assert [s["session_id"] for s in mem.list_sessions()] == \
        ["67c1a2b3-0000-8000-9000-00000000a002"]
    # asked for: back, and its tombstone cleared
    out = mem.ingest("chatgpt", [export], include_deleted=True)
    assert (out["new"], out["deleted"]) == (4, 0), out
    assert mem.ingest("chatgpt", [CHATGPT])["deleted"] == 0 and len(mem.list_sessions()) == 2


@pytest.mark.slow
def test_cli_ingest_skips_a_deleted_session_unless_asked(tmp_path):
    db, ini = tmp_path / "cli.db", tmp_path / "aokun.ini"
    ini.write_text("[embedding]\nprovider = none\n", encoding="utf-8")
    assert _cli(db, "--config", str(ini), "ingest", "claude-code", str(CLAUDE)).returncode == 0
    gone = _cli(db, "--config", str(ini), "conversations", "delete", CLAUDE.stem)
    assert gone.returncode == 0, gone.stderr
    copy = copy_fixture(CLAUDE, tmp_path)  # the session copied to a new path
    again = _cli(db, "--config", str(ini), "ingest", "claude-code", str(copy))
    assert again.returncode == 0 and "0 new" in again.stdout \
        and "1 sessions skipped: deleted" in again.stdout, \
        again.stdout + again.stderr
    assert CLAUDE.stem not in _cli(db, "--config", str(ini), "conversations", "list").stdout
    back = _cli(db, "--config", str(ini), "ingest", "claude-code", str(copy), "--include-deleted",
                "--json")
    assert back.returncode == 0, back.stderr
    assert (json.loads(back.stdout)["new"], json.loads(back.stdout)["deleted"]) == (6, 0)
    assert CLAUDE.stem in _cli(db, "--config", str(ini), "conversations", "list").stdout


def test_turn_index_is_centred_once_enough_vectors_exist_and_still_finds_turns(tmp_path, open_mem,
                                                                               monkeypatch):
    monkeypatch.setattr(aokun, "TURN_CENTER_AFTER", 3)
    m = open_mem(tmp_path / "c.db", embedder=FakeEmbedder(16))
    assert m.ingest("copilot", [COPILOT])["new"] == 4
    assert m.meta_get("turn_vector_center") is not None
    assert m.value("select count(*) from conv_turn_vec") == 4
    # int8: a byte per dimension
    assert m.value("select min(length(embedding)) from conv_turn_vectors") == 16
    text = m.value("select text from conv_turns order by id limit 1")
    hits = m.conversation_search(text, k=4)
    assert hits["results"] and hits["results"][0]["text"] == text
    assert m.doctor() == []


def _crowd_transcript(folder: Path, sid: str, n: int, word: str) -> Path:
    path = folder / "-home-crowd" / f"{sid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"type": "user", "sessionId": sid, "cwd": "/home/crowd",
                         "uuid": f"{sid}-{i}",
                         "timestamp": f"2026-03-{1 + i % 28:02d}T10:00:00.000Z",
                         "message": {"role": "user",
                                     "content": f"{word} deadline {'moved ' * (i % 7)}item {i}"}})
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_turn_keyword_pool_gives_the_unbounded_rows_under_every_filter(mem, tmp_path):
    """conv_bm25 ranks the best k (with a source or time filter FTS_POOL_FACTOR × k) matches
    first; where other personas' or sources' turns crowd that pool it runs again over every
    match: the rows never differ."""
    crowd = _crowd_transcript(tmp_path, "00000000-0000-4000-8000-00000000c001", 120, "crowd")
    mine = _crowd_transcript(tmp_path / "m", "00000000-0000-4000-8000-00000000c002", 30, "mine")
    mem.ingest("claude-code", [crowd], persona_id="crowd")
    mem.ingest("claude-code", [crowd, mine], persona_id="me")
    mem.ingest("codex", [CODEX], persona_id="me")
    base = {"match": aokun.fts_query(mem.seg.tokens("deadline moved")), "source": "",
            "session_id": "", "since": "", "until": "", "k": 8}
    calls, rows = [], mem.rows

    def counting(sql, p=()):
        calls.append(p.get("pool") if isinstance(p, dict) else None)
        return rows(sql, p)
    mem.rows = counting
    for extra in ({"persona_id": "me"}, {"persona_id": "crowd"},
                  {"persona_id": "me", "source": "codex"},
                  {"persona_id": "me", "since": "2026-03-20T00:00:00Z"},
                  {"persona_id": "me", "session_id": "00000000-0000-4000-8000-00000000c002"}):
        params = dict(base, **extra)
        calls.clear()
        got = mem._turn_keyword_rows(params)
        want = rows(mem.queries["conv_bm25"], dict(params, pool=0))
        assert [(r["id"], r["raw"]) for r in got] == [(r["id"], r["raw"]) for r in want], extra
        narrow = extra.get("source") or extra.get("since")
        assert calls[0] == (0 if extra.get("session_id") else 32 if narrow else 8), extra
    assert len(got) == 8


def test_turn_vector_hamming_bound_never_changes_the_rows(mem, tmp_path):
    """The turn vector channel takes its candidates within a Hamming bound learnt from earlier
    searches (as recall's vector channels do); too tight a bound runs it again without: the rows
    are always the unbounded query's, and so are conversation_search's results."""
    mem.ingest("claude-code", [_crowd_transcript(tmp_path, "00000000-0000-4000-8000-00000000c003",
                                                 140, "vector")])
    queries = [f"deadline moved item {i}" for i in range(12)]
    before = [mem.conversation_search(q, k=5)["results"] for q in queries]
    key = next(k for k in mem._hamming_reach if k[0] == "turn_vector")
    assert mem._hamming_bound(key) is not None
    assert [mem.conversation_search(q, k=5)["results"] for q in queries] == before
    v = mem.embedder.embed_query("deadline").astype("float32")
    params = {"persona_id": "", "source": "", "since": "", "until": "", "k": 10,
              "candidates": key[3], "embedding": v.tobytes(), "query_i8": aokun.vector_blob(v),
              "max_hamming": None}
    unbounded = mem.rows(mem.queries["conv_vector"], params)
    for reach in (0.0, 1e6):
        mem._hamming_reach[key] = (reach,) * 8
        got = mem._bounded_knn(key, mem.queries["conv_vector"], params, mem.rows)
        assert [(r["id"], r["raw"]) for r in got] == [(r["id"], r["raw"]) for r in unbounded], reach


def test_rebuild_fts_re_segments_the_turns_and_keeps_every_row(open_mem, tmp_path):
    """`rebuild --fts` empties every keyword index, the turns' too, and makes them again (turns
    were left as they were: a changed dictionary never reached them); nothing else is touched."""
    m = open_mem(tmp_path / "r.db", cfg=aokun.Config(None, overrides={
        ("embedding", "provider"): "none"}))
    for source, (path, _) in EXPECTED.items():
        m.ingest(source, [path], persona_id="conv")
    m.memorize("I like oolong tea.")
    counts = {t: m.value(f"select count(*) from {t}") for t in (
        "documents", "conv_turns", "memory_atoms", "graph_entries", "conv_turns_fts")}
    m.conn.execute("delete from conv_turns_fts where rowid = (select min(id) from conv_turns)")
    assert m.rebuild(fts=True)["fts"] >= counts["conv_turns"] + counts["documents"]
    assert counts == {t: m.value(f"select count(*) from {t}") for t in counts}
    assert m.conversation_search("高铁票订好了吗", k=3, persona_id="conv")["results"]
