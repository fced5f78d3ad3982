"""A child process for tests/test_first_start.py: `python tests/watch_child.py LOG GATE AFTER
ARGS...` runs aokun's CLI on ARGS (`--db … --config … serve --http …`) with the deterministic
fakes.FakeEmbedder in place of the configured provider, and writes to LOG a line per transcript
that ingestion opens ("read PATH") and per embedding call ("embed N"). With GATE (a path; "-" for
none), the back-log thread's embedding call after AFTER texts creates GATE and blocks until the
process is killed. Every change of the progress is stored at once (WATCH_PUBLISH_SECONDS 0), so
`stats` in another process says what /health says."""

import sys
import threading
import time
from pathlib import Path

import fakes  # first: it puts the repository folder on sys.path

# isort: split
import aokun

LOG, GATE, AFTER = sys.argv[1], sys.argv[2], int(sys.argv[3])


def note(line: str) -> None:
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(line + "\n")


class GatedEmbedder(fakes.FakeEmbedder):
    """A FakeEmbedder that counts the passages the back-log thread embedded and stops it at the
    gate."""

    passages = 0

    def embed_documents(self, texts):
        if threading.current_thread().name == "aokun-watch-backlog":
            if GATE != "-" and self.passages >= AFTER:
                Path(GATE).write_text(f"{self.passages}\n", encoding="utf-8")
                while True:  # until SIGKILL
                    time.sleep(60)
            self.passages += len(texts)
        if not fakes.is_anchors(texts):
            note(f"embed {len(texts)}")
        return super().embed_documents(texts)


_ingest_jsonl = aokun.Memory._ingest_jsonl


def logged_ingest_jsonl(self, path, *args, **kwargs):
    note(f"read {path}")
    return _ingest_jsonl(self, path, *args, **kwargs)


aokun.make_embedder = lambda cfg: GatedEmbedder(16)
aokun.Memory._ingest_jsonl = logged_ingest_jsonl
aokun.WATCH_PUBLISH_SECONDS = 0.0
aokun.main(sys.argv[4:])
