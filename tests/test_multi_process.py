"""Several processes on one SQLite file: two `serve` stdio servers (two concurrent SDK client
sessions) and the CLI writing at the same time. No error, no 'database is locked', every write
stored exactly once, a healthy file afterwards."""

import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

import aokun
from mcp_procs import REPO, child_env, cli, serve_args, write_ini

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more

PER_SERVER = 50
CLI_WRITES = 20


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_two_servers_and_the_cli_write_one_file(tmp_path):
    # the file does not exist yet: they race to create it
    db, ini = tmp_path / "shared.db", write_ini(tmp_path, "none")
    params = StdioServerParameters(command=sys.executable, args=serve_args(db, ini), cwd=str(REPO),
                                   env=child_env())
    results: dict[str, list] = {"A": [], "B": []}
    recalls: dict[str, dict] = {}
    errlogs = {name: (tmp_path / f"server-{name}.stderr").open("w+", encoding="utf-8")
               for name in results}
    cli_runs = []

    async def server(name):
        async with Client(stdio_client(params, errlog=errlogs[name])) as c:
            limiter = anyio.CapacityLimiter(4)  # up to 4 calls in flight per session

            async def one(i):
                async with limiter:
                    content = f"Server {name} memory {i}: Hana sorted {i} shells."
                    metadata = {"session_id": f"s-{name}", "topics": ["shells"],
                                "participants": ["Hana"]}
                    r = await c.call_tool("memorize", {"content": content, "metadata": metadata})
                    results[name].append(r)

            async with anyio.create_task_group() as tg:
                for i in range(PER_SERVER):
                    tg.start_soon(one, i)
            r = await c.call_tool("recall", {"query": f"Server {name} memory 7",
                                             "session_id": f"s-{name}", "limit": 3})
            recalls[name] = {"is_error": r.is_error, "text": r.content[0].text,
                             "hits": (r.structured_content or {}).get("results", [])}

    def cli_writes():
        def one(i):
            return cli(db, ini, "memorize", f"CLI memory {i}: 命令行写入第{i}条", "--topic", "cli",
                       timeout=120)
        with ThreadPoolExecutor(3) as pool:
            cli_runs.extend(pool.map(one, range(CLI_WRITES)))

    started = time.monotonic()
    with anyio.fail_after(150):
        async with anyio.create_task_group() as tg:
            tg.start_soon(server, "A")
            tg.start_soon(server, "B")
            tg.start_soon(anyio.to_thread.run_sync, cli_writes)
    took = time.monotonic() - started

    texts = []
    for _name, rs in results.items():
        assert len(rs) == PER_SERVER
        for r in rs:
            texts.append(r.content[0].text)
            assert r.is_error is False, r.content[0].text
            assert r.structured_content["status"] == "done"
            assert r.structured_content["deduplicated"] is False
    for run in cli_runs:
        texts += [run.stdout, run.stderr]
        assert run.returncode == 0, run.stderr
        assert re.fullmatch(r"\d+\n", run.stdout), run.stdout
    for name, rec in recalls.items():
        assert rec["is_error"] is False, rec["text"]
        assert rec["hits"]
        assert rec["hits"][0]["text"] == f"Server {name} memory 7: Hana sorted 7 shells."
    for f in errlogs.values():
        f.seek(0)
        texts.append(f.read())
        f.close()
    everything = "\n".join(texts)
    lowered = everything.lower()
    assert "locked" not in lowered and "busy" not in lowered, everything[-3000:]
    assert "Traceback" not in everything, everything[-3000:]

    server_ids = [r.structured_content["id"] for rs in results.values() for r in rs]
    cli_ids = [int(run.stdout) for run in cli_runs]
    all_ids = server_ids + cli_ids
    assert len(set(all_ids)) == len(all_ids) == 2 * PER_SERVER + CLI_WRITES

    with aokun.Memory(db, aokun.Config(ini)) as m:
        assert m.value("select count(*) from documents") == 2 * PER_SERVER + CLI_WRITES
        assert sorted(r["id"] for r in m.rows("select id from documents")) == sorted(all_ids)
        assert m.value("select count(*) from documents where session_id = 's-A'") == PER_SERVER
        assert m.value("select count(*) from documents where session_id = 's-B'") == PER_SERVER
        assert m.value("select count(*) from documents"
                       " where content like 'CLI memory %'") == CLI_WRITES
        assert m.value("select count(*) from memory_write_ops where status != 'done'") == 0
        assert m.doctor() == []
        assert m.stats()["counts"]["documents_fts"] == 2 * PER_SERVER + CLI_WRITES
    assert took < 120, f"took {took:.0f}s"
