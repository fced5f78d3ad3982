"""Time questions through a real MCP client (in-process): a month of a year, a year and a deadline
("before February", "3月之前") open a window that finds a memory by its event date or by when it
was written, and explain says which matched."""

import pytest
from mcp import Client

import aokun
from fakes import FakeEmbedder

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def server(tmp_path, segmenter):
    cfg = aokun.Config(None, overrides={("forgetting", "timezone"): "UTC",
                                        ("backup", "dir"): str(tmp_path / "backups"),
                                        ("backup", "daily"): False})

    def factory():
        m = aokun.Memory(tmp_path / "m.db", cfg, embedder=FakeEmbedder(16))
        m.seg = segmenter
        return m
    return aokun.build_server(factory, cfg)


MEMORIES = [  # (text, written)
    ("Book the ryokan in Kyoto by 2027-02-01", "2026-12-01T10:00:00Z"),
    ("2027年2月20日之前交季度报告", "2026-12-01T10:00:00Z"),
    ("Hiked the Lion's Head trail with Ana", "2025-03-14T10:00:00Z"),
    ("和小王去看了樱花", "2025-03-20T10:00:00Z"),
    ("Planted tomatoes in the garden", "2026-06-10T10:00:00Z"),
    ("Renewed the car insurance", "2026-11-02T10:00:00Z"),
]


@pytest.mark.parametrize("now, query, expect, match, window", [
    ("2027-01-10T09:00:00Z", "What do I need to do before February?",
     "Book the ryokan in Kyoto by 2027-02-01", "event", ("2027-01-10", "2027-02-01")),
    ("2027-01-10T09:00:00Z", "3月之前要做什么", "2027年2月20日之前交季度报告", "event",
     ("2027-01-10", "2027-03-01")),
    ("2026-12-05T09:00:00Z", "What did I do in March 2025?",
     "Hiked the Lion's Head trail with Ana", "written", ("2025-03-01", "2025-04-01")),
    ("2026-12-05T09:00:00Z", "2025年3月我做了什么", "和小王去看了樱花", "written",
     ("2025-03-01", "2025-04-01")),
])
async def test_a_time_question_opens_its_window(server, monkeypatch, now, query, expect, match,
                                                window):
    async with Client(server) as c:
        for text, written in MEMORIES:
            monkeypatch.setenv("AOKUN_NOW", written)
            r = await c.call_tool("memorize", {"content": text, "metadata": {"timestamp": written}})
            assert r.is_error is False
        monkeypatch.setenv("AOKUN_NOW", now)
        r = await c.call_tool("recall", {"query": query, "limit": 3, "explain": True})
        hits = r.structured_content["results"]
    hit = next(h for h in hits if h["text"] == expect)
    assert "time_window" in hit["channels"]
    explain = hit["explain"]
    got = explain["time_window"]["start"][:10], explain["time_window"]["end"][:10]
    assert got == window and explain["time_match"] == match
    if match == "event":  # which date matched
        assert explain["time_event"]["start"] <= explain["time_window"]["end"]
    for other in hits:  # a memory of another time is not boosted
        if other["text"] in ("Planted tomatoes in the garden", "Renewed the car insurance"):
            assert other["explain"]["time_match"] is None
