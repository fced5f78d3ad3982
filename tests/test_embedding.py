"""Embedding providers: an OpenAI-compatible endpoint served by a real local HTTP server, outages
and back-fill, dimension/model mismatch and `rebuild --vectors`, and the real local model."""

import http.server
import json
import socket
import threading
import time

import numpy as np
import pytest

import aokun
from fakes import FakeEmbedder, count, fts_ids


class FakeOpenAI:
    """POST /v1/embeddings in the OpenAI format. `script` holds (status, headers) answers given
    before the normal 200s; `requests` records every request (path, headers, body). `down` answers
    503 to everything; a request with an input containing `reject` (a marker) gets 400, as an
    endpoint refusing one input for good does. `unusable` ("nan" or "zero") answers 200 with NaN or
    all-zero vectors: for every input, or only those containing `unusable_marker` when set."""

    def __init__(self, port: int = 0, dim: int = 8):
        self.dim, self.script, self.requests = dim, [], []
        self.down, self.reject = False, None
        self.unusable, self.unusable_marker = None, None
        self.vectors = FakeEmbedder(dim)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, status, body, headers=()):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"),
                                       "body": body})
                if self.path != "/v1/embeddings":
                    return self._send(404, {"error": {"message": "not found"}})
                if outer.script:
                    status, headers = outer.script.pop(0)
                    return self._send(status, {"error": {"message": f"scripted {status}"}}, headers)
                if outer.down:
                    return self._send(503, {"error": {"message": "down for maintenance"}},
                                      [("Retry-After", "0")])
                inputs = body["input"]
                if outer.reject and any(outer.reject in t for t in inputs):
                    error = {"message": f"input {outer.reject} is not allowed"}
                    return self._send(400, {"error": error})
                data = [{"object": "embedding", "index": i,
                         "embedding": [float(x) * 3 for x in outer.vectors.vector(t)]}
                        for i, t in enumerate(inputs)]
                for d, t in zip(data, inputs, strict=True):
                    if outer.unusable and (outer.unusable_marker is None
                                           or outer.unusable_marker in t):
                        d["embedding"] = [float("nan") if outer.unusable == "nan"
                                          else 0.0] * outer.dim
                self._send(200, {"object": "list", "data": data[::-1], "model": body["model"],
                                 "usage": {"prompt_tokens": 1, "total_tokens": 1}})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeOpenAI()
    yield s
    s.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def openai(url, **kw):
    kw.setdefault("max_retries", 4)
    kw.setdefault("timeout", 5.0)
    return aokun.OpenAIEmbedder(url, "remote-embed", api_key="sk-test", **kw)


def test_openai_happy_path(server):
    e = openai(server.url)
    m = e.embed_documents(["first text", "second text", "third"])
    assert m.shape == (3, 8) and m.dtype == np.float32 and e.dim == 8
    np.testing.assert_allclose(np.linalg.norm(m, axis=1), 1.0, atol=1e-6)
    # rows come back in input order even though the server sent them reversed
    np.testing.assert_allclose(m[0], server.vectors.vector("first text"), atol=1e-6)
    np.testing.assert_allclose(m[2], server.vectors.vector("third"), atol=1e-6)
    req = server.requests[0]
    assert req["auth"] == "Bearer sk-test" and req["body"]["model"] == "remote-embed"
    assert req["body"]["input"] == ["first text", "second text", "third"]
    assert "dimensions" not in req["body"]


def test_openai_batches_and_sends_dimensions(server):
    e = openai(server.url, batch_size=2, dimensions=8)
    assert e.embed_documents([f"t{i}" for i in range(5)]).shape == (5, 8)
    assert [len(r["body"]["input"]) for r in server.requests] == [2, 2, 1]
    assert all(r["body"]["dimensions"] == 8 for r in server.requests)


def test_429_with_retry_after_is_retried(server):
    server.script = [(429, [("Retry-After", "0")])]
    e = openai(server.url)
    t = time.monotonic()
    m = e.embed_documents(["hello"])
    elapsed = time.monotonic() - t
    assert len(server.requests) == 2
    np.testing.assert_allclose(m[0], server.vectors.vector("hello"), atol=1e-6)
    assert elapsed < 0.45, "Retry-After: 0 must be honoured instead of the 0.5 s backoff"


def test_5xx_retried_then_gives_up(server):
    server.script = [(503, [("Retry-After", "0")])] * 2
    assert openai(server.url).embed_query("x").shape == (8,)
    assert len(server.requests) == 3
    server.requests.clear()
    server.script = [(500, [("Retry-After", "0")])] * 10
    with pytest.raises(aokun.EmbeddingError, match="after 2 retries"):
        openai(server.url, max_retries=2).embed_query("x")
    assert len(server.requests) == 3


@pytest.mark.parametrize("status", [401, 402, 403])
def test_auth_errors_fail_at_once(server, status):
    server.script = [(status, [])] * 5
    with pytest.raises(aokun.EmbeddingError, match="api_key"):
        openai(server.url).embed_documents(["hello"])
    assert len(server.requests) == 1


def test_wrong_dimension_from_endpoint_is_an_error(server):
    with pytest.raises(aokun.EmbeddingError, match="8-d vectors, expected 16"):
        openai(server.url, dimensions=16).embed_query("x")


def _openai_config(url):
    return aokun.Config(None, overrides={("embedding", "provider"): "openai",
                                         ("embedding", "base_url"): url,
                                          ("embedding", "model"): "remote-embed",
                                         ("embedding", "api_key"): "sk-test",
                                          ("embedding", "max_retries"): 1,
                                         ("embedding", "timeout_seconds"): 5.0})


@pytest.mark.slow
def test_endpoint_down_still_stores_then_backfills(db_path, segmenter):
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    cfg = _openai_config(url)
    mem = aokun.Memory(db_path, cfg)  # the configured provider, as the server builds it
    mem.seg = segmenter
    try:
        assert isinstance(mem.embedder, aokun.CachedEmbedder) and mem.embedder.provider == "openai"
        r = mem.memorize("The deploy key lives in the team vault", {"participants": ["Lena"]})
        assert r["status"] == "done" and r["embedding"] == "pending"
        assert r["warnings"] and "embedding failed" in r["warnings"][0] \
            and "back-filled" in r["warnings"][0]
        assert fts_ids(mem, "documents_fts", "vault") == [r["id"]]  # keyword search works meanwhile
        assert count(mem, "memory_atoms") == 1 and count(mem, "graph_entries") > 0
        assert any("awaiting vectors" in p for p in mem.doctor())
        assert mem.backfill_vectors() == 0  # still down: quietly nothing

        srv = FakeOpenAI(port=port)
        try:
            n = mem.backfill_vectors()
            entries = count(mem, "graph_entries",
                            "node_id in (select id from graph_nodes where node_type = 'fact')")
            assert n == 1 + entries
            assert mem.value("select embedding_state from documents where id = ?", (r["id"],)) == \
                "done"
            assert count(mem, "doc_vec") == 1 and count(mem, "graph_vec") == entries
            assert count(mem, "doc_vectors") == 1 and count(mem, "graph_vectors") == entries
            assert mem.meta_get("embedding_dim") == "8" \
                and mem.meta_get("embedding_model") == "remote-embed"
            assert mem.doctor() == []
            r2 = mem.memorize("A second memory while the endpoint is up")
            assert r2["embedding"] == "done" and r2["warnings"] == []
        finally:
            srv.close()
    finally:
        mem.close()


def _snapshot(mem):
    return (mem.rows("select id, content, embedding_state, updated_at from documents order by id"),
            mem.rows("select doc_id, embedding from doc_vectors order by doc_id"),
            mem.rows("select entry_id, embedding from graph_vectors order by entry_id"))


@pytest.mark.parametrize("new", [FakeEmbedder(8), FakeEmbedder(16, model="other-16")],
                         ids=["dim", "model"])
def test_dimension_or_model_mismatch_then_rebuild(db_path, open_mem, new):
    m16 = open_mem(db_path, FakeEmbedder(16))
    for text in ("Mira plays the cello", "Nate fixes old radios", "Oslo trip in June"):
        m16.memorize(text, {"participants": [text.split()[0]]})
    before = _snapshot(m16)
    m16.close()

    m = open_mem(db_path, new)
    problem = m.vector_problem
    assert problem and "rebuild --vectors" in problem
    assert "16" in problem and str(new.dim) in problem and new.model in problem \
        and "fake-16" in problem
    assert not m.vectors_usable
    assert _snapshot(m) == before  # stored rows untouched
    assert m.meta_get("embedding_dim") == "16" and m.meta_get("embedding_model") == "fake-16"
    assert problem in m.doctor()
    assert new.calls == 0  # nothing was embedded with the wrong model
    r = m.memorize("Written while the vectors are unusable")
    assert r["status"] == "done" and r["embedding"] == "pending" and new.calls == 0
    assert count(m, "doc_vec") == 3

    out = m.rebuild(vectors=True)
    entries = count(m, "graph_entries",
                    "node_id in (select id from graph_nodes where node_type = 'fact')")
    assert out == {"vectors": 4 + entries}
    assert m.vector_problem is None and m.vectors_usable
    assert m.meta_get("embedding_dim") == str(new.dim) \
        and m.meta_get("embedding_model") == new.model
    blobs = m.rows("select doc_id, embedding from doc_vectors order by doc_id")
    assert len(blobs) == 4 and all(len(b["embedding"]) == new.dim for b in blobs)
    for b in blobs:
        text = m.value("select content from documents where id = ?", (b["doc_id"],))
        np.testing.assert_allclose(aokun.blob_vector(b["embedding"]), new.vector(text), atol=0.01)
    assert count(m, "graph_vec") == entries == count(m, "graph_vectors") \
        and count(m, "doc_vec") == 4
    assert [d["content"] for d in _snapshot(m)[0][:3]] == [d["content"] for d in before[0]]
    assert m.doctor() == []
    m.close()

    again = open_mem(db_path, type(new)(new.dim, model=new.model))
    assert again.vector_problem is None and again.doctor() == []


def test_reopen_with_same_embedder_has_no_problem(db_path, open_mem):
    open_mem(db_path).memorize("hello vectors")
    m = open_mem(db_path)
    assert m.vector_problem is None and m.doctor() == []


@pytest.mark.slow
def test_local_model_vectors_carry_meaning(local_mem):
    mem = local_mem
    texts = {
        "coffee": "Alice drinks an iced americano every morning before work",
        "port": "The staging server listens on port 8090 behind nginx",
        "tokyo": "我下周要去东京出差，住在新宿附近",
        "cat": "Bob adopted a small grey kitten from the shelter",
    }
    ids = {k: mem.memorize(v)["id"] for k, v in texts.items()}
    assert mem.meta_get("embedding_dim") == "384" and mem.embedder.provider == "local"
    assert all(mem.get(i)["embedding_state"] == "done" for i in ids.values())

    def nearest(query):
        v = np.asarray(mem.embedder.embed_query(query), np.float32)
        rows = mem.rows(mem.queries["recall_vector"],
                        {"embedding": v.tobytes(), "query_i8": aokun.vector_blob(v),
                                                      "k": 20, "candidates": 20, "persona_id": "",
                                                      "max_archived": 0, "as_of": "",
                         "max_hamming": None})
        return [r["id"] for r in rows if r["id"] in ids.values()][0]

    # no shared keywords between query and memory: only the meaning connects them
    assert nearest("what coffee does she like?") == ids["coffee"]
    assert nearest("日本旅行计划") == ids["tokyo"]
    assert nearest("which pet did he get") == ids["cat"]
    assert nearest("web proxy configuration") == ids["port"]


@pytest.mark.slow
def test_local_model_truncates_long_text(db_path, open_mem):
    # the real tokenizer decides the cut; a 64-token window keeps the test fast (512 costs seconds)
    mem = open_mem(db_path, aokun.LocalEmbedder(max_tokens=64))
    long_text = "这是一个很长的句子，用来测试向量截断。" * 300 + "结尾的鹦鹉螺"
    r = mem.memorize(long_text)
    assert r["embedding_truncated"] is True and r["embedding"] == "done"
    assert mem.value("select content from documents where id = ?", (r["id"],)) == long_text
    assert fts_ids(mem, "documents_fts", "鹦鹉螺") == [r["id"]]
    cut, truncated = mem.embedder.prepare(long_text)
    assert truncated and 0 < len(cut) < 100
    short = mem.memorize("a short one")
    assert short["embedding_truncated"] is False
    assert mem.doctor() == []


def test_switch_to_endpoint_with_other_native_dim_then_rebuild(db_path, open_mem, server,
                                                               segmenter):
    """16-d fake vectors stored; the new OpenAI-compatible endpoint (no `dimensions` set) makes
    8-d vectors. The stored dim must not be forced onto the new model, and rebuild must work."""
    open_mem(db_path, FakeEmbedder(16)).memorize("Quinn collects vinyl records",
                                                 {"participants": ["Quinn"]})
    mem = aokun.Memory(db_path, _openai_config(server.url))
    mem.seg = segmenter
    try:
        assert mem.vector_problem and "fake-16" in mem.vector_problem \
            and "remote-embed" in mem.vector_problem
        assert "makes 16-d" not in mem.vector_problem  # the new model's dim is not known yet
        out = mem.rebuild(vectors=True)
        entries = count(mem, "graph_entries",
                        "node_id in (select id from graph_nodes where node_type = 'fact')")
        assert out == {"vectors": 1 + entries}
        assert mem.meta_get("embedding_dim") == "8" \
            and mem.meta_get("embedding_model") == "remote-embed"
        assert all(len(r["embedding"]) == 8 for r in mem.rows("select embedding from doc_vectors"))
        assert mem.doctor() == []
    finally:
        mem.close()
    # reopening with the same dimension-less endpoint adopts the stored 8-d without a problem
    again = aokun.Memory(db_path, _openai_config(server.url))
    try:
        assert again.vector_problem is None and again.embedder.dim == 8 and again.doctor() == []
    finally:
        again.close()


def test_rebuild_vectors_probes_the_dimension(db_path, open_mem, server, segmenter):
    """A file written with provider none, then `rebuild --vectors` with a dimension-less
    endpoint."""
    open_mem(db_path, aokun.Embedder()).memorize("Rita studies Portuguese on the train")
    mem = aokun.Memory(db_path, _openai_config(server.url))
    mem.seg = segmenter
    try:
        assert mem.embedder.dim == 0 and not mem.has_table("doc_vec")
        out = mem.rebuild(vectors=True)
        assert out["vectors"] == 1 + count(mem, "graph_entries",
                                           "node_id in (select id from graph_nodes where node_type "
                                           "= 'fact')")
        assert mem.embedder.dim == 8 and mem.meta_get("embedding_dim") == "8"
        assert count(mem, "documents", "embedding_state = 'done'") == 1
        assert mem.doctor() == []
    finally:
        mem.close()


def test_contextual_vectors_follow_the_session(db_path, open_mem):
    """A memory's vector is computed from the memory right before it in its session and the memory
    (stored text unchanged); inserts, edits, deletes and `rebuild --vectors` keep that true."""
    fake = FakeEmbedder(16)
    mem = open_mem(db_path, fake)

    def vec(doc_id):
        return aokun.blob_vector(mem.value("select embedding from doc_vectors where doc_id = ?",
                                           (doc_id,)))

    def meta(i):
        return {"session_id": "s1", "timestamp": f"2024-01-01T00:00:0{i}Z"}

    def embedded(doc_id, *lines):
        """Whether the memory's vector is the embedding of `lines` (its context, then itself)."""
        return np.allclose(vec(doc_id), fake.vector("\n".join(lines)), atol=0.01)

    a, b = (r["id"] for r in mem.memorize_many([("Where did you go last May?", meta(1)),
                                                 ("We went hiking in the Alps.", meta(2))]))
    c = mem.memorize("It rained every single day.", meta(3))["id"]
    alone = mem.memorize("No session: embedded alone.")["id"]
    assert mem.get(b)["content"] == "We went hiking in the Alps."
    assert embedded(a, "Where did you go last May?")
    assert embedded(b, "Where did you go last May?", "We went hiking in the Alps.")
    assert embedded(c, "We went hiking in the Alps.", "It rained every single day.")
    assert embedded(alone, "No session: embedded alone.")
    # an out-of-order insert becomes the context of the memory after it
    d = mem.memorize("Then we took the train home.",
                     meta(2) | {"timestamp": "2024-01-01T00:00:02.5Z"})["id"]
    mem.wait_refresh()
    assert embedded(d, "We went hiking in the Alps.", "Then we took the train home.")
    assert embedded(c, "Then we took the train home.", "It rained every single day.")
    assert "Fact: It rained every single day.\nContext: Then we took the train home." \
        in mem.get(c)["graph_entries"]
    mem.edit(a, content="Where did you go last June?")
    mem.wait_refresh()
    assert embedded(b, "Where did you go last June?", "We went hiking in the Alps.")
    assert "Fact: We went hiking in the Alps.\nContext: Where did you go last June?" \
        in mem.get(b)["graph_entries"]
    mem.delete(d)
    mem.wait_refresh()
    assert embedded(c, "We went hiking in the Alps.", "It rained every single day.")
    assert "Fact: It rained every single day.\nContext: We went hiking in the Alps." \
        in mem.get(c)["graph_entries"]
    assert [i for i in mem.recall("train", k=5, channels="graph_keyword")["results"]] == []
    assert mem.value("select count(*) from documents where embedding_state != 'done'") == 0
    before = {i: vec(i) for i in (a, b, c, alone)}
    mem.rebuild(vectors=True)
    assert all(np.allclose(vec(i), v, atol=0.01) for i, v in before.items())
    assert mem.doctor() == []


def test_contextual_vectors_off(db_path, open_mem):
    fake = FakeEmbedder(16)
    mem = open_mem(db_path, fake, cfg=aokun.Config(None,
                                                   overrides={("embedding", "context_turns"): 0}))
    ids = [r["id"] for r in mem.memorize_many([("first turn here", {"session_id": "s"}),
                                               ("second turn here", {"session_id": "s"})])]
    blob = mem.value("select embedding from doc_vectors where doc_id = ?", (ids[1],))
    assert np.allclose(aokun.blob_vector(blob), fake.vector("second turn here"), atol=0.01)


def test_vector_text_carries_labels(db_path, open_mem):
    """Topics, tags and sentiment follow the memory in its vector text (not in its stored text)."""
    fake = FakeEmbedder(16)
    mem = open_mem(db_path, fake)
    i = mem.memorize("Went skating with Tom.",
                     {"topics": ["sport"], "tags": ["winter"], "sentiment": "happy"})["id"]
    blob = mem.value("select embedding from doc_vectors where doc_id = ?", (i,))
    assert np.allclose(aokun.blob_vector(blob),
                       fake.vector("Went skating with Tom.\nsport winter happy"), atol=0.01)
    assert mem.get(i)["content"] == "Went skating with Tom."
    mem.rebuild(vectors=True)
    stored = mem.value("select embedding from doc_vectors where doc_id = ?", (i,))
    assert np.allclose(aokun.blob_vector(stored),
                       fake.vector("Went skating with Tom.\nsport winter happy"), atol=0.01)


def test_backfill_goes_through_every_batch(db_path, open_mem):
    """Documents and graph entries pending in more than one batch are all embedded."""
    mem = open_mem(db_path, FakeEmbedder(16))
    for i in range(3):
        mem.memorize(f"Fact number {i} is here. Another sentence {i} follows.", {"session_id": "s"})
    with mem.tx() as c:
        c.execute("update documents set embedding_state = 'pending'")
        c.execute("update graph_entries set embedding_state = 'pending' where embedding_state = "
                  "'done'")
    pending = mem.value("select count(*) from documents where embedding_state = 'pending'") + \
        mem.value("select count(*) from graph_entries where embedding_state = 'pending'")
    assert mem.backfill_vectors(batch=2) == pending > 4
    assert mem.value("select count(*) from graph_entries where embedding_state = 'pending'") == 0
    assert mem.doctor() == []


@pytest.mark.slow
def test_server_background_backfill_stops_when_the_server_stops(db_path, open_mem):
    """A server shutting down must not first embed every pending memory: the background thread's
    back-fill checks the stop event between batches (the lifespan waits for it up to 30 s and a
    stdio client kills the server after 2 s)."""
    class Slow(FakeEmbedder):
        def embed_documents(self, texts):
            time.sleep(0.2)
            return super().embed_documents(texts)

    mem = open_mem(db_path, Slow(16))
    mem.memorize_many([(f"Pending memory number {i} about topic {i}.", None) for i in range(640)])
    with mem.tx() as c:
        c.execute("update documents set embedding_state = 'pending'")
    mem.cfg.backup.on_version_change = False
    stop = threading.Event()
    worker = threading.Thread(target=aokun._background, args=(mem, stop), daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while (mem.value("select count(*) from documents where embedding_state = 'done'") == 0
           and time.monotonic() < deadline):
        time.sleep(0.01)
    stop.set()
    started = time.monotonic()
    worker.join(timeout=10)
    assert not worker.is_alive() and time.monotonic() - started < 1.0
    # left for later
    assert mem.value("select count(*) from documents where embedding_state = 'pending'") > 0
    mem.backfill_vectors()  # the next start finishes it
    assert mem.doctor() == []


# refused inputs, outages and rebuild --vectors ---------------------------------------------------

POISON = "POISONPILL"


@pytest.mark.parametrize("status, refused",
                         [(400, True), (413, True), (422, True), (404, False), (408, False)])
def test_4xx_about_the_input_is_a_refusal(server, status, refused):
    server.script = [(status, [("Retry-After", "0")])] * 5
    with pytest.raises(aokun.EmbeddingError) as e:
        openai(server.url, max_retries=1).embed_documents(["hello"])
    assert isinstance(e.value, aokun.EmbeddingRejected) is refused
    assert len(server.requests) == (2 if status == 408 else 1)  # 408 is retried like 429


@pytest.fixture
def remote(db_path, server, segmenter):
    """A Memory on the configured OpenAI-compatible provider, served by `server`."""
    mem = aokun.Memory(db_path, _openai_config(server.url))
    mem.seg = segmenter
    yield mem
    mem.close()


def _fact_entries(mem, where="1"):
    return count(mem, "graph_entries",
                 f"node_id in (select id from graph_nodes where node_type = 'fact') and {where}")


def test_refused_memory_is_marked_and_never_blocks_the_others(remote, server):
    server.reject = POISON
    texts = [f"Ordinary memory {i} about the garden shed." for i in range(5)]
    res = remote.memorize_many([(t, None) for t in texts[:2]] + [(f"A {POISON} memory.", None)] +
                               [(t, None) for t in texts[2:]])
    assert [r["embedding"] for r in res] == ["done", "done", "pending", "done", "done", "done"]
    assert [r["status"] for r in res] == ["done"] * 6
    bad = res[2]
    assert any("refused" in w and "400" in w for w in bad["warnings"]) and res[0]["warnings"] == []
    assert remote.value("select embedding_error from documents where id = ?",
                        (bad["id"],)).startswith(
        "embedding endpoint answered 400")
    assert count(remote, "doc_vectors") == 5 \
        and _fact_entries(remote, "embedding_state = 'done'") == 5
    assert remote.stats()["counts"]["documents_refused_vectors"] == 1
    assert remote.stats()["counts"]["documents_awaiting_vectors"] == 0
    problems = remote.doctor()
    assert len(problems) == 2, problems  # the memory and its fact entry
    assert problems[0].startswith("1 memories without a vector") \
        and f"memory {bad['id']}: " in problems[0]
    assert "400" in problems[0] and "rebuild --vectors" in problems[0]
    server.requests.clear()
    # a refused text is not sent again
    assert remote.backfill_vectors() == 0 and server.requests == []
    # editing it to a text the endpoint takes gives it a vector and clears the reason
    r = remote.edit(bad["id"], content="Now an ordinary memory too.")
    assert r["embedding"] == "done" and remote.doctor() == []


def test_backfill_after_an_outage_skips_the_refused_one(remote, server):
    server.down = True
    res = remote.memorize_many([("First memory from the outage.", None),
                                (f"The {POISON} one.", None),
                                ("Third memory from the outage.", None)])
    assert [r["embedding"] for r in res] == ["pending"] * 3
    assert all("embedding failed" in r["warnings"][0] for r in res)
    assert remote.backfill_vectors() == 0  # still down: transient, nothing marked refused
    assert count(remote, "documents", "embedding_error is not null") == 0
    assert remote.vectors_awaited()
    server.down, server.reject = False, POISON
    n = remote.backfill_vectors(batch=2)
    assert n == 2 + _fact_entries(remote, "embedding_state = 'done'") == 4
    assert remote.value("select id from documents where embedding_error is not null") == \
        res[1]["id"]
    assert not remote.vectors_awaited()


def test_rebuild_vectors_with_the_endpoint_down_keeps_every_vector(remote, server):
    remote.memorize_many([(f"Memory {i} about the lighthouse keeper.", None) for i in range(3)])
    before = _snapshot(remote)[1:]
    vectors = count(remote, "doc_vectors") + count(remote, "graph_vectors")
    assert vectors == 6
    server.down = True
    remote.embedder._cache.clear()  # as in a fresh process (the CLI): nothing cached
    with pytest.raises(aokun.EmbeddingError, match=r"embedded 0 of 6 .*503.*kept") as e:
        remote.rebuild(vectors=True)
    assert "\n" not in str(e.value)
    assert _snapshot(remote)[1:] == before
    assert count(remote, "doc_vec") + count(remote, "graph_vec") == vectors  # the index too
    assert remote.recall("lighthouse keeper", k=3)["results"]  # still found, by meaning too
    server.down = False
    assert remote.backfill_vectors() == 6  # what rebuild could not redo is back-filled
    assert remote.rebuild(vectors=True) == {"vectors": 6} and remote.doctor() == []


def test_rebuild_vectors_refused_text_fails_only_that_one(remote, server):
    remote.memorize_many([("Memory about apples.", None), (f"Memory about {POISON}.", None),
                          ("Memory about pears.", None)])
    server.reject = POISON
    remote.embedder._cache.clear()
    with pytest.raises(aokun.EmbeddingError, match="embedded 4 of 6 .*refused 2 texts"):
        remote.rebuild(vectors=True)
    assert count(remote, "doc_vectors") == 3  # the refused one keeps its old vector
    assert count(remote, "documents", "embedding_error is not null") == 1
    assert count(remote, "documents", "embedding_state = 'done'") == 2


def test_rebuild_vectors_to_another_model_builds_before_dropping(db_path, open_mem, server,
                                                                 segmenter):
    old = open_mem(db_path, FakeEmbedder(16))
    old.memorize_many([(f"Memory {i} about the night train.", None) for i in range(3)])
    before = _snapshot(old)
    old.close()
    mem = aokun.Memory(db_path, _openai_config(server.url))
    mem.seg = segmenter
    try:
        assert mem.vector_problem
        # the new model refuses one text: fewer new vectors than old ones
        server.reject = "Memory 2"
        with pytest.raises(aokun.EmbeddingError,
                           match=r"embedded 4 of 6 .*refused 2 texts.*6 stored vectors are kept"):
            mem.rebuild(vectors=True)
        assert _snapshot(mem) == before and mem.meta_get("embedding_model") == "fake-16"
        assert count(mem, "doc_vec") == 3 and mem.vector_problem
        server.reject, server.down = None, True
        with pytest.raises(aokun.EmbeddingError, match="embedded 0 of 6 .*503"):
            mem.rebuild(vectors=True)
        assert _snapshot(mem) == before
        server.down = False
        assert mem.rebuild(vectors=True) == {"vectors": 6}
        assert mem.meta_get("embedding_model") == "remote-embed" and mem.vector_problem is None
        assert mem.doctor() == []
    finally:
        mem.close()


@pytest.mark.slow
def test_cli_rebuild_vectors_exits_nonzero_with_one_line(tmp_path, server, segmenter):
    import subprocess
    import sys
    db = tmp_path / "cli.db"
    mem = aokun.Memory(db, _openai_config(server.url))
    mem.seg = segmenter
    mem.memorize("The only memory, about the ferry timetable.")
    mem.close()
    ini = tmp_path / "aokun.ini"
    ini.write_text(f"[embedding]\nprovider = openai\nbase_url = {server.url}\n"
                   "model = remote-embed\napi_key = sk-test\nmax_retries = 0\n"
                   "timeout_seconds = 5\n", encoding="utf-8")
    server.down = True
    r = subprocess.run([sys.executable, str(aokun.HERE / "aokun.py"), "--db", str(db), "--config",
                        str(ini), "rebuild", "--vectors"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0, r
    errors = [line for line in r.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "embedded 0 of 2" in errors[0] and "Traceback" not in r.stderr
    with aokun.Memory(db, _openai_config(server.url)) as again:
        assert count(again, "doc_vectors") == 1 and count(again, "graph_vectors") == 1


def test_running_server_backfills_once_the_endpoint_is_back(remote, server, monkeypatch):
    """The endpoint is down when memories are written; the server's background thread tries again on
    its bounded schedule and embeds them once it answers, without a restart."""
    server.down = True
    ids = [r["id"] for r in remote.memorize_many([("Written during the outage, one.", None),
                                                  ("Written during the outage, two.", None)])]
    monkeypatch.setattr(aokun, "BACKFILL_RETRY_SECONDS", (0.05, 0.1))
    remote.cfg.forgetting.scheduler_interval_seconds = 3600.0
    remote.cfg.backup.on_version_change = False
    remote.cfg.backup.daily = False
    stop = threading.Event()
    worker = threading.Thread(target=aokun._background, args=(remote, stop), daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        # it keeps trying while down
        while len(server.requests) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert count(remote, "documents", "embedding_state = 'pending'") == 2
        server.down = False
        while count(remote, "documents",
                    "embedding_state = 'pending'") and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        worker.join(10)
    assert not worker.is_alive()
    assert [remote.get(i)["embedding_state"] for i in ids] == ["done", "done"]
    assert remote.doctor() == []


@pytest.mark.parametrize("mode", ["nan", "zero"])
def test_nan_or_zero_vectors_are_a_provider_failure(remote, server, mode):
    remote.memorize("The lighthouse keeper logs the weather at dawn.")
    server.unusable = mode  # every vector unusable: the provider is failing
    r = remote.memorize("The lighthouse lamp needs new oil every week.")
    assert r["embedding"] == "pending" and any("unusable" in w for w in r["warnings"])
    remote.embedder._cache.clear()
    # the query vector is unusable too: keyword channels answer
    out = remote.recall("lighthouse", k=5)
    assert {h["id"] for h in out["results"]} >= {r["id"]}
    assert any(d["channel"] == "vector" and "unusable query vector" in d["reason"]
               for d in out["degraded"])
    with pytest.raises(aokun.EmbeddingError, match="unusable"):
        remote.rebuild(vectors=True)  # keeps the good vectors, writes no NaN
    assert count(remote, "doc_vectors") == 1 and remote.backfill_vectors() == 0
    assert not [p for p in remote.doctor() if "unusable" in p]
    # only one input unusable: that text is refused, the others of the batch get their vectors
    server.unusable_marker = "BADVEC"
    res = remote.memorize_many([("A BADVEC memory about the pier.", None),
                                ("The pier was painted blue.", None)])
    assert [x["embedding"] for x in res] == ["pending", "done"]
    assert "unusable vector" \
        in remote.value("select embedding_error from documents where id = ?", (res[0]["id"],))
    server.unusable = None
    remote.embedder._cache.clear()
    assert remote.backfill_vectors() >= 1
    out = remote.recall("lighthouse oil", k=5)
    assert out["degraded"] == [] and out["results"]


def test_stored_unusable_vector_is_skipped_flagged_and_dropped(remote, server):
    ids = [remote.memorize(t)["id"] for t in ("The lighthouse keeper logs the weather.",
                                              f"The {POISON} lighthouse lamp.",
                                              "The lighthouse stairs.")]
    with remote.tx() as c:  # as an older version stored a NaN vector (int8: all zeros)
        c.execute("update doc_vectors set embedding = zeroblob(8) where doc_id = ?", (ids[1],))
        c.execute("update graph_vectors set embedding = zeroblob(8)")
    out = remote.recall("lighthouse", k=5)  # no TypeError: the NULL distance is skipped
    assert ids[1] in {h["id"] for h in out["results"]} and out["degraded"] == []
    problems = remote.doctor()
    assert any(p.startswith("1 unusable (NaN or all-zero) document vectors")
               for p in problems), problems
    assert any(p.startswith("3 unusable (NaN or all-zero) graph entry vectors")
               for p in problems), problems
    server.reject = POISON
    remote.embedder._cache.clear()
    with pytest.raises(aokun.EmbeddingError, match="refused"):
        remote.rebuild(vectors=True)
    # refused: its old NaN vector is gone
    assert count(remote, "doc_vectors", f"doc_id = {ids[1]}") == 0
    assert count(remote, "doc_vec", f"doc_id = {ids[1]}") == 0
    assert not [p for p in remote.doctor() if "unusable" in p]
