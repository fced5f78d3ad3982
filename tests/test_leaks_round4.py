"""Nothing leaked, round 4 (issue 33, items 7-8): an embedding endpoint's error body, which may echo
a memory's text, reaches neither the log nor the client; AWS secret access keys in prose, English
and Chinese, are redacted, and 40-character git hashes are not."""

import http.server
import json
import logging
import re
import threading

import anyio
import pytest
from mcp import Client

import aokun

PATTERNS = aokun.load_secret_rules(aokun.HERE / "rules" / "secrets.toml")

# item 7: an endpoint's error body -----------------------------------------------------------------


class EchoingEndpoint:
    """A real local HTTP server that answers every embeddings request 400 with the inputs it was
    sent in its error body, as some OpenAI-compatible endpoints do."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                data = json.dumps({"error": {"message": f"bad input: {body['input']}"}}).encode()
                self.send_response(400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def endpoint():
    e = EchoingEndpoint()
    yield e
    e.close()


@pytest.mark.anyio
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
async def test_an_endpoints_error_body_reaches_neither_the_log_nor_the_client(
        tmp_path, endpoint, segmenter, caplog):
    caplog.set_level(logging.DEBUG)
    cfg = aokun.Config(None, overrides={("backup", "dir"): str(tmp_path / "b"),
                                        ("backup", "daily"): False})

    def factory():
        m = aokun.Memory(tmp_path / "e.db", cfg, embedder=aokun.OpenAIEmbedder(
            endpoint.url, "echo-embed", dimensions=8, max_retries=0, timeout=5.0))
        m.seg = segmenter
        return m

    notes = []

    async def on_log(params):
        notes.append(json.dumps(params.model_dump(mode="json"), ensure_ascii=False))

    word = "Zebrafinch"  # in the memory's text only: wherever it shows up, the text leaked
    async with Client(aokun.build_server(factory, cfg), mode="legacy",
                      logging_callback=on_log) as c:
        await c.set_logging_level("debug")
        r = await c.call_tool("memorize", {"content": f"{word} is the name of the wifi network."})
        assert r.is_error is False
        memory_id = r.structured_content["id"]
        with anyio.fail_after(5):
            while not any(f"memory {memory_id}" in n for n in notes):
                await anyio.sleep(0.02)
    answers = json.dumps(r.structured_content["warnings"], ensure_ascii=False)
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    for where in (answers, logged, "\n".join(notes)):
        assert word not in where and "bad input" not in where
    refusal = [rec.getMessage() for rec in caplog.records if "refused the text" in rec.getMessage()]
    assert f"the embedding provider refused the text of memory {memory_id} (embedding " \
        "endpoint answered 400); it stays without a vector" in refusal
    assert all(re.fullmatch(r"the embedding provider refused the text of (memory|graph entry) "
                            r"\d+ \(embedding endpoint answered 400\); it stays without a vector",
                            line) for line in refusal), refusal
    assert "answered 400" in answers  # the write says why it has no vector: the status


def test_post_json_never_puts_the_body_in_its_error(endpoint):
    import httpx
    with httpx.Client(base_url=endpoint.url + "/") as http, pytest.raises(aokun.AokunError) as e:
        aokun.post_json(http, "embeddings", {"input": ["secret text"]}, 0, "embedding",
                        "[embedding]", rejected=aokun.EmbeddingRejected)
    assert str(e.value) == "embedding endpoint answered 400"


# item 8: AWS secret access keys in prose ----------------------------------------------------------

KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzQ9Ab3Kd+1"  # the shape of one (40 of A-Z a-z 0-9 / +)
KEY2 = "Zq3hV8kLm2NpRt5WxYb7Cd9Ef1Gh4Jk6Mn8Pq0Rs"
GIT_HASH = "3f2a9c1e5b7d8f0a1b2c3d4e5f60718293a4b5c6"
MARK = "[REDACTED:aws_secret_key]"

ROUND4_SHAPES = [
    (f"AWS secret key: {KEY}", f"AWS secret key: {MARK}"),
    (f"the aws secret access key is {KEY2}, keep it safe",
     f"the aws secret access key is {MARK}, keep it safe"),
    (f"AWS key {KEY2}", f"AWS key {MARK}"),
    (f"我的 AWS 访问密钥 AKIAQ3MPLEZZ7ZZQAB2C，secret {KEY}。",
     f"我的 AWS 访问密钥 [REDACTED:aws_access_key]，secret {MARK}。"),
    (f"秘钥是{KEY2}", f"秘钥是{MARK}"),
    (f"私钥：{KEY}", f"私钥：{MARK}"),
    (f"{KEY} is my AWS secret", f"{MARK} is my AWS secret"),
    (f"{KEY2}（这是 AWS 密钥）", f"{MARK}（这是 AWS 密钥）"),
    (f'secret="{KEY}"', f'secret="{MARK}"'),
]
ROUND4_NOT_SECRETS = [
    f"commit {GIT_HASH} fixed the aws upload bug",
    f"the secret fix is in {GIT_HASH}",
    f"密钥轮换的提交是 {GIT_HASH}",
    f"an identifier {KEY} with no word that names a key",
    f"AWS docs at https://example.com/{KEY} explain it",
    f"AWS builds {KEY}x are 41 characters",
]


def test_aws_secret_keys_in_prose_are_redacted_and_hashes_are_not():
    assert [(t, aokun.redact(t, PATTERNS)) for t, want in ROUND4_SHAPES
            if aokun.redact(t, PATTERNS) != want] == []
    assert [t for t in ROUND4_NOT_SECRETS if aokun.redact(t, PATTERNS) != t] == []
