"""Bulk memorize stays fast as the file grows (issue 37): each write segments, dates and
looks up only what it has not already, and stores exactly the rows it stored before."""

import random

import pytest

import aokun

EN = ["Alice met Bob at Lisbon and talked about chess for {k} minutes.",
      "Reminder: Carmen has a dentist appointment on day {k} of the month.",
      "Bob and Alice are planning a trip to Kyoto next Friday, {k} days.",
      "Deepak's favourite hobby is sourdough; started {k} years ago. C++ & e-mail 3.5%!"]
ZH = ["小明在北京遇到了小红，一起聊了{k}分钟的围棋。",
      "李雷说项目预算是{k}万元，截止日期推迟到春节后。",
      "韩梅梅下周要去上海出差，预计待{k}天。", "提醒：王芳第{k}天要去公园看医生。中秋节见！"]


def _texts(n: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(EN + ZH).format(k=rng.randint(2, 999))
                     for _ in range(rng.randint(1, 3))) for _ in range(n)]


def _whole_line(seg, line: str, keep_stopwords: bool = False) -> tuple[str, ...]:
    """The tokens jieba's cut_for_search gives for the whole line, as Segmenter keeps them."""
    out = [t.strip().lower() for t in seg._tokenizer().cut_for_search(line)]
    return tuple(t for t in out if t and aokun._WORD.search(t)
                 and (keep_stopwords or t not in seg.stopwords))


def test_tokens_are_jiebas_of_the_whole_line(segmenter):
    """Segmenter cuts each run of jieba's re_han_default once: the tokens of a line are those
    jieba's cut_for_search gives for the whole line."""
    for text in _texts(60) + ["Fact: 小明喜欢拿铁 — a_b #x 第3.5天", "  ", "中秋节见！C++"]:
        for keep in (False, True):
            got = segmenter.tokens(text, keep_stopwords=keep)
            assert tuple(got) == _whole_line(segmenter, aokun.fold(text), keep), text


def test_a_write_of_known_words_calls_jieba_for_none(open_mem, db_path, segmenter, monkeypatch):
    """A memory whose words earlier memories held (its graph entries, facts and FTS lines all new
    texts) is cut without jieba."""
    mem = open_mem(db_path)
    mem.memorize("Alice met Bob at Lisbon. Bob likes chess.", {"participants": ["Alice", "Bob"]})
    tk = segmenter._tokenizer()
    calls = []
    real = tk.cut_for_search
    monkeypatch.setattr(tk, "cut_for_search", lambda s, *a, **kw: calls.append(s) or real(s))
    mem.memorize("Bob met Alice at Lisbon. Alice likes chess.", {"participants": ["Bob", "Alice"]})
    assert calls == []


def test_a_write_dates_each_text_once(open_mem, db_path, monkeypatch):
    """event_spans runs once per text of a write (its content, each fact), however many stages ask,
    and lunar dates are computed once per day."""
    mem = open_mem(db_path)
    seen = []
    real = aokun.event_spans
    monkeypatch.setattr(aokun, "event_spans", lambda text, *a, **kw: seen.append(text)
                        or real(text, *a, **kw))
    mem.memorize("李雷说截止日期推迟到春节后。韩梅梅下周要去上海出差。小明明天去公园。")
    assert seen and len(seen) == len(set(seen))
    lunar = []
    from lunar_python import Lunar
    monkeypatch.setattr(Lunar, "fromYmd", lambda *a: lunar.append(a) or Lunar(*a, 0, 0, 0))
    mem.memorize("王芳说春节后再见。")
    assert lunar == []


def test_a_fact_like_no_atom_ranks_no_atoms(open_mem, db_path):
    """A fact that shares too few words with every atom of its type to reinforce one never ranks
    the atoms holding its common words; one that does still reinforces."""
    mem = open_mem(db_path)
    mem.memorize_many([(f"Alice met Bob at Lisbon and talked about chess for {k} minutes.", {})
                       for k in range(2, 40)])
    ranked = []
    mem.conn.exec_trace = lambda _c, sql, _b: not ranked.append(sql) if "20 best BM25" in sql else 1
    mem.memorize("Carmen prefers jazz records and goes to Kyoto every Sunday.")
    assert ranked == []
    mem.memorize("Alice met Bob at Lisbon and talked about chess for 41 minutes.")
    assert ranked


def _stored(mem) -> dict:
    rows = {
        "documents": "select id, content, event_at, event_end, key_facts from documents",
        "atoms": "select id, document_id, atom_type, content, subject, confidence, expires_at, "
                 "reinforcement_count, state, slot, slot_value, superseded_by from memory_atoms",
        "sources": "select atom_id, document_id from atom_sources",
        "entries": "select id, document_id, node_id, edge_id, text, confidence from graph_entries",
        "fts": "select rowid, segmented from documents_fts union all select -rowid, segmented "
               "from memory_atoms_fts union all select rowid + 1e9, segmented "
               "from graph_entries_fts"}
    return {k: mem.rows(q) for k, q in rows.items()}


@pytest.mark.slow
def test_stored_rows_are_those_of_the_plain_pipeline(open_mem, tmp_path, monkeypatch, segmenter,
                                                    frozen_now):
    """The same memories written with every shortcut and with none (each text dated and segmented
    anew, every reinforcement candidate ranked) store the same rows."""
    texts = _texts(150)
    batches = [[(t, {"participants": ["Alice"] if "Alice" in t else []}) for t in texts[i:i + 40]]
               for i in range(0, len(texts), 40)]
    fast = open_mem(tmp_path / "fast.db")
    for b in batches:
        fast.memorize_many(b)
    monkeypatch.setattr(aokun.Layers, "_event_spans", lambda self, text, p: aokun.event_spans(
        text, p.created_at, self.rules.event_dates, aokun.local_tz(self.cfg.forgetting.timezone)))
    monkeypatch.setattr(aokun.Layers, "_may_reinforce", lambda *a: True)
    monkeypatch.setattr(aokun, "_lunar_day", aokun._lunar_day.__wrapped__)
    monkeypatch.setattr(aokun, "_lunar_of", aokun._lunar_of.__wrapped__)
    plain = open_mem(tmp_path / "plain.db")
    plain.seg = aokun.Segmenter(segmenter.stopwords_path, segmenter.userdict_path)
    plain.seg._cut = lambda line, keep: _whole_line(plain.seg, line, keep)
    for b in batches:
        plain.memorize_many(b)
    assert _stored(fast) == _stored(plain)
