"""The web panel over real HTTP (starlette's TestClient) on a temp database: every route, its
refusals (no or reused login token, a foreign Host or Origin, no CSRF token, a bad setting, another
persona's id), escaping of memory text and setting values, the settings file edited in place, and
`serve --http` serving the panel at /panel behind its own login."""

import json
import re
import subprocess
import sys
import time

import pytest
from starlette.testclient import TestClient

import aokun
from mcp_procs import REPO, child_env, free_port, serve_args, stop, wait_port, write_ini

ORIGIN = "http://127.0.0.1:8765"
XSS_TEXT = ('Mallory wrote <script>window.__xss=1</script> and '
            '"><img src=x onerror="window.__xss=2"> here')
GET_PAGES = ["/memories", "/memories/{id}", "/recall?q=Alice", "/graph?entity=Alice", "/health",
             "/health/decay", "/health/lifecycle", "/health/consolidate", "/health/backup",
             "/health/vacuum", "/settings", "/conversations"]


@pytest.fixture
def panel(mem, tmp_path):
    """(Panel, a logged-out TestClient, the Memory, the ini path, {name: memory id}) on a Memory
    with three memories (one of persona p2, one with markup) and a fact history about Alice."""
    ids = {"alice": mem.memorize("Alice lives in Paris and drinks iced americano",
                                 {"participants": ["Alice"], "source": "chat",
                                  "session_id": "s1"})["id"],
           "xss": mem.memorize(XSS_TEXT, {"summary": 'odd <b>"quoted"</b>'})["id"],
           "p2": mem.memorize("Persona two keeps this one", {"persona_id": "p2"})["id"]}
    mem.kg_add("Alice", "lives_in", "London", valid_from="2020-01-01")
    mem.kg_add("Alice", "lives_in", "Paris", valid_from="2023-06-01")
    ini = tmp_path / "aokun.ini"
    ini.write_text(aokun.EXAMPLE_INI.read_text(encoding="utf-8"), encoding="utf-8")
    web, app = aokun.panel_app(lambda: mem, aokun.Config(None), ini, "127.0.0.1", 8765)
    client = TestClient(app, base_url=ORIGIN)
    return web, client, mem, ini, ids


def login(web, client) -> str:
    """Log `client` in with the panel's one-time token; returns the session's CSRF token."""
    r = client.get(f"/?token={web.login_token}", follow_redirects=False)
    assert r.status_code == 303
    client.cookies = r.cookies
    page = client.get("/settings").text
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


def post(client, path, data, origin=ORIGIN, **kw):
    headers = {"Origin": origin} if origin else {}
    return client.post(path, data=data, headers=headers, follow_redirects=False, **kw)


# login and the guard ------------------------------------------------------------------------------

@pytest.mark.parametrize("page", GET_PAGES + ["/"])
def test_every_page_needs_a_login(panel, page):
    web, client, _, _, ids = panel
    page = page.format(id=ids["alice"])
    r = client.get(page)
    assert r.status_code == 401 and "python aokun.py panel" in r.text
    assert client.get(page + ("&" if "?" in page else "?") + "token=wrong").status_code == 401


def test_the_token_becomes_a_strict_httponly_cookie_and_works_once(panel):
    web, client, _, _, _ = panel
    token = web.login_token
    r = client.get(f"/health?token={token}&persona=p2", follow_redirects=False)
    # the token leaves the URL
    assert r.status_code == 303 and r.headers["location"] == "/health?persona=p2"
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    client.cookies = r.cookies
    assert client.get("/health").status_code == 200
    other = TestClient(client.app, base_url=ORIGIN)
    assert other.get(f"/health?token={token}").status_code == 401  # used once already
    assert web.login_token == ""


@pytest.mark.slow
def test_every_page_answers_once_logged_in(panel):
    web, client, _, _, ids = panel
    login(web, client)
    for page in GET_PAGES:
        r = client.get(page.format(id=ids["alice"]))
        assert r.status_code == 200, (page, r.text[:500])
        assert r.headers["content-security-policy"].startswith("default-src 'none'")
        assert r.headers["x-frame-options"] == "DENY" and r.headers["cache-control"] == "no-store"
    assert client.get("/", follow_redirects=False).headers["location"] == "/memories"
    assert "prefers-color-scheme: dark" in client.get("/static/panel.css").text
    assert "confirm" in client.get("/static/panel.js").text
    assert client.get("/static/base.html").status_code == 404


def test_foreign_host_and_origin_are_refused(panel):
    web, client, _, _, ids = panel
    csrf = login(web, client)
    # DNS rebinding
    assert client.get("/memories", headers={"Host": "evil.example:8765"}).status_code == 421
    assert client.get("/memories", headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.get("/memories", headers={"Origin": "http://127.0.0.1:9999"}).status_code == 403
    path, data = f"/memories/{ids['alice']}/pin", {"csrf": csrf, "persona": ""}
    # a POST must say where it comes from
    assert post(client, path, data, origin=None).status_code == 403
    assert post(client, path, data, origin="http://evil.example").status_code == 403
    assert post(client, path, data, origin="null").status_code == 403
    assert not panel[2].get(ids["alice"])["pinned"]
    assert post(client, path, data).status_code == 303
    assert panel[2].get(ids["alice"])["pinned"]


def test_a_post_needs_the_sessions_csrf_token(panel):
    web, client, mem, _, ids = panel
    csrf = login(web, client)
    path = f"/memories/{ids['alice']}/delete"
    assert post(client, path, {"confirm": "yes"}).status_code == 403
    r = post(client, path, {"confirm": "yes", "csrf": csrf[:-1] + "x"})
    assert r.status_code == 403 and "CSRF" in r.text
    assert mem.get(ids["alice"])["id"] == ids["alice"]
    anonymous = TestClient(client.app, base_url=ORIGIN)
    # no session cookie
    assert post(anonymous, path, {"confirm": "yes", "csrf": csrf}).status_code == 401


# memories -----------------------------------------------------------------------------------------

def test_memory_actions_go_through_the_engine(panel):
    web, client, mem, _, ids = panel
    csrf = login(web, client)
    i = ids["alice"]
    base = {"csrf": csrf, "persona": ""}
    r = post(client, f"/memories/{i}/edit",
             base | {"content": "Alice lives in Lyon now", "summary": "moved"})
    assert r.status_code == 303 and r.headers["location"].startswith(f"/memories/{i}?")
    assert mem.get(i)["content"] == "Alice lives in Lyon now" and mem.get(i)["summary"] == "moved"
    # its index was rebuilt
    assert [h["id"] for h in mem.recall("Lyon", channels=["bm25"])["results"]] == [i]
    assert mem.recall("Paris", channels=["bm25"])["results"] == []
    post(client, f"/memories/{i}/importance", base | {"importance": "0.9"})
    assert mem.get(i)["importance"] == 0.9
    r = post(client, f"/memories/{i}/importance", base | {"importance": "lots"})
    assert r.status_code == 400 and "importance" in r.text and "&#39;lots&#39;" in r.text
    assert post(client, f"/memories/{i}/importance", base | {"importance": "2"}).status_code == 400
    post(client, f"/memories/{i}/archive", base)
    assert mem.get(i)["archived"]
    post(client, f"/memories/{i}/restore", base)
    assert not mem.get(i)["archived"]
    post(client, f"/memories/{i}/pin", base)
    post(client, f"/memories/{i}/unpin", base)
    assert not mem.get(i)["pinned"]
    assert post(client, f"/memories/{i}/explode", base).status_code == 404
    assert post(client, f"/memories/{i}/delete", base).status_code == 400  # not confirmed
    r = post(client, f"/memories/{i}/delete", base | {"confirm": "yes"})
    assert r.status_code == 303 and r.headers["location"].startswith("/memories?")
    with pytest.raises(aokun.NotFound):
        mem.get(i)
    assert client.get(f"/memories/{i}").status_code == 404


def test_a_persona_sees_and_changes_only_its_own(panel):
    web, client, mem, _, ids = panel
    csrf = login(web, client)
    assert client.get(f"/memories/{ids['p2']}").status_code == 404
    assert "Persona two" in client.get(f"/memories/{ids['p2']}?persona=p2").text
    assert client.get(f"/memories/{ids['alice']}?persona=p2").status_code == 404
    assert "Persona two" not in client.get("/memories").text
    listed = client.get("/memories?persona=p2").text
    assert "Persona two" in listed and "Alice" not in listed
    r = post(client, f"/memories/{ids['p2']}/delete",
             {"csrf": csrf, "persona": "", "confirm": "yes"})
    assert r.status_code == 404 and mem.get(ids["p2"], "p2")
    r = post(client, f"/memories/{ids['p2']}/delete",
             {"csrf": csrf, "persona": "p2", "confirm": "yes"})
    assert r.status_code == 303 and "persona=p2" in r.headers["location"]
    with pytest.raises(aokun.NotFound):
        mem.get(ids["p2"], "p2")


def test_memories_filters_and_search(panel):
    web, client, mem, _, ids = panel
    login(web, client)
    mem.set_flag(ids["xss"], "archived", True)
    assert "Mallory" not in client.get("/memories").text
    assert "Mallory" in client.get("/memories?archived=all").text
    only = client.get("/memories?archived=only").text
    assert "Mallory" in only and "iced americano" not in only
    assert "iced americano" in client.get("/memories?source=chat").text
    assert "iced americano" not in client.get("/memories?source=import").text
    assert "iced americano" in client.get("/memories?session=s1").text
    assert "iced americano" not in client.get("/memories?pinned=1").text
    assert "iced americano" not in client.get("/memories?to=2001-01-01").text
    assert "iced americano" in client.get("/memories?from=2001-01-01").text
    found = client.get("/memories?q=americano").text
    assert "iced americano" in found and "score" in found


def test_memories_filter_by_project(panel, tmp_path):
    web, client, mem, _, ids = panel
    login(web, client)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    mem.memorize("The repo's database is PostgreSQL 16", {"project": str(repo)})
    mem.memorize("The other repo deploys with Ansible", {"project": str(tmp_path / "other")})
    page = client.get("/memories", params={"project": str(repo / "src")}).text
    assert "PostgreSQL 16" in page and "Ansible" not in page and "iced americano" not in page
    found = client.get("/memories", params={"project": str(repo), "q": "database"}).text
    assert "PostgreSQL 16" in found and "Ansible" not in found
    assert "Ansible" in client.get("/memories").text


def test_memory_page_shows_atoms_and_graph(panel):
    web, client, mem, _, ids = panel
    login(web, client)
    page = client.get(f"/memories/{ids['alice']}").text
    atoms = mem.get(ids["alice"])["atoms"]
    assert atoms and all(a["content"] in page for a in atoms)
    assert 'class="state active"' in page and "Graph entries" in page
    assert 'href="/graph?entity=Alice"' in page
    assert aokun._time_left(None) == "no end"
    in_3_days = aokun.now() + aokun.dt.timedelta(days=3, hours=1)
    assert aokun._time_left(aokun.iso(in_3_days)) == "in 3 d"
    five_hours_ago = aokun.now() - aokun.dt.timedelta(hours=5, minutes=1)
    assert aokun._time_left(aokun.iso(five_hours_ago)) == "ended 5 h ago"


def test_memory_text_is_never_rendered_unescaped(panel):
    web, client, _, _, ids = panel
    login(web, client)
    for page in ["/memories", "/memories/{id}", "/recall?q=Mallory", "/memories?q=Mallory"]:
        html = client.get(page.format(id=ids["xss"])).text
        assert "Mallory" in html, page
        assert "<script>window" not in html and "<img src=x" not in html, page
        assert '<b>"quoted' not in html, page
        assert "&lt;script&gt;" in html or "&lt;img" in html, page
    # an unknown entity named in markup: its message
    html = client.get("/graph?entity=%3Cscript%3Ex").text
    assert "<script>x" not in html


# recall, graph, health ----------------------------------------------------------------------------

def test_recall_page_draws_the_explain_parts(panel):
    web, client, mem, _, ids = panel
    login(web, client)
    html = client.get("/recall?q=Alice+Paris&k=3").text
    assert 'class="seg relevance"' in html and "route weights" in html and "bm25" in html
    out = mem.recall("Alice Paris", 3, explain=True)
    # the head of each hit shows the MCP answer's relevance (— for an uncalibrated model)
    shown = ["—" if h["relevance"] is None else f"{h['relevance']:.2f}" for h in out["results"]]
    assert html.count('title="relevance: how likely') == len(shown) and shown
    assert all(f">{x}</span>" in html for x in shown)
    for h in out["results"]:
        bar = aokun.score_bar(h["explain"], h["score"], mem.cfg.recall)
        assert bar and {p["part"] for p in bar} <= {k for k, _ in aokun.SCORE_PARTS}
        assert sum(p["value"] for p in bar) == pytest.approx(h["score"], rel=1e-6)
        e = h["explain"]
        routes = e["doc_share"] + e["graph_share"] + e["cross_route_bonus"]
        fused = (routes + e["neighbour"] + e.get("time_boost", 0)) * e["source_boost"]
        assert fused == pytest.approx(h["score"], abs=1e-5)
    assert client.get("/recall?q=Alice&k=many").status_code == 400
    assert client.get("/recall?q=Alice&as_of=yesterday-ish").status_code == 400


def test_graph_page_as_of(panel):
    web, client, _, _, _ = panel
    login(web, client)
    now = client.get("/graph?entity=Alice").text
    then = client.get("/graph?entity=Alice&as_of=2021-06-01").text
    held = lambda html: html.split("Timeline")[0]  # noqa: E731 (the "holding at" card)
    assert "Paris" in held(now) and "London" not in held(now)
    assert "London" in held(then) and "Paris" not in held(then)
    assert 'type="range"' in now and "2020-01-01" in now
    r = client.get("/graph?entity=Nobody")
    assert r.status_code == 404


def test_health_maintenance_dry_run_then_confirm(panel, tmp_path):
    web, client, mem, _, _ = panel
    csrf = login(web, client)
    html = client.get("/health").text
    assert "ok: integrity check passed" in html and "documents" in html
    dry = client.get("/health/backup").text
    assert "Would write" in dry and 'action="/health/backup"' in dry
    assert not mem.backup_dir().exists() or not list(mem.backup_dir().glob("*manual*"))
    r = post(client, "/health/backup", {"csrf": csrf, "persona": ""})
    assert r.status_code == 200 and "Wrote" in r.text
    assert len(list(mem.backup_dir().glob("*manual*.db"))) == 1
    for command in ("decay", "lifecycle", "consolidate", "vacuum"):
        assert post(client, f"/health/{command}",
                    {"csrf": csrf, "persona": ""}).status_code == 200, command
    assert client.get("/health/explode").status_code == 404
    assert post(client, "/health/vacuum", {"persona": ""}).status_code == 403


# settings -----------------------------------------------------------------------------------------

def test_settings_page_lists_every_setting_with_help_and_default(panel):
    web, client, _, _, _ = panel
    login(web, client)
    html = client.get("/settings").text
    for section, kv in aokun.DEFAULTS.items():
        for key in kv:
            assert f'name="{section}.{key}"' in html, (section, key)
    assert "MMR trade-off: 1 = pure relevance" in html
    assert 'name="recall.mmr_lambda" type="number" step="any" min="0" max="1"' in html
    assert 'name="recall.rrf_k" type="number" step="1" min="1"' in html
    assert '<option selected>score</option>' in html
    assert 'type="password"' in html and "restart the MCP clients' servers" in html
    forms = aokun.settings_form(aokun.Config(None))
    keys = [(s["name"], x["key"]) for s in forms for g in s["groups"] for x in g["settings"]]
    assert sorted(keys) == sorted((s, k) for s, kv in aokun.DEFAULTS.items() for k in kv)


def test_saving_a_setting_edits_the_file_in_place(panel):
    web, client, _, ini, _ = panel
    csrf = login(web, client)
    before = ini.read_text(encoding="utf-8").splitlines()
    r = post(client, "/settings", {"csrf": csrf, "persona": "", "recall.mmr_lambda": "0.5",
                                   "recall.fusion": "rrf", "recall.rrf_k": "60",
                                   "forgetting.timezone": "Asia/Shanghai"})
    assert r.status_code == 303 and "saved" in r.headers["location"]
    after = ini.read_text(encoding="utf-8").splitlines()
    assert len(after) == len(before)
    changed = {(b, a) for b, a in zip(before, after, strict=True) if b != a}
    assert changed == {("mmr_lambda = 0.7", "mmr_lambda = 0.5"), ("fusion = score", "fusion = rrf"),
                       ("timezone =", "timezone = Asia/Shanghai")}
    cfg = aokun.Config(ini)
    assert cfg.recall.mmr_lambda == 0.5 and cfg.recall.fusion == "rrf"
    r = post(client, "/settings", {"csrf": csrf, "persona": "", "recall.mmr_lambda": "0.5"})
    location = r.headers["location"]
    assert "nothing+changed" in location or "nothing%20changed" in location


@pytest.mark.parametrize("field,value,message", [
    ("recall.mmr_lambda", "2", "[recall] mmr_lambda = 2 is out of range; allowed: 0..1"),
    ("recall.rrf_k", "ten", "[recall] rrf_k = &#39;ten&#39; is not a int"),
    ("backup.daily", "maybe", "[backup] daily = &#39;maybe&#39; is not a bool"),
    ("recall.fusion", "best", "[recall] fusion = &#39;best&#39; is not one of score, rrf"),
    ("server.exposed_tools", "recall, fly", "names unknown tools"),
    ("server.port", "0", "[server] port = 0 is out of range; allowed: 1..65535"),
])
def test_a_bad_setting_is_refused_with_the_loaders_message(panel, field, value, message):
    web, client, _, ini, _ = panel
    csrf = login(web, client)
    before = ini.read_text(encoding="utf-8")
    r = post(client, "/settings", {"csrf": csrf, "persona": "", field: value,
                                   "recall.score_alpha": "0.6"})
    assert r.status_code == 400
    assert message in r.text
    # what was typed stays
    assert 'name="recall.score_alpha" type="number" step="any" min="0" value="0.6"' in r.text
    # (a select cannot show a value it does not offer)
    if field not in ("recall.fusion", "backup.daily"):
        assert f'value="{value}"' in r.text
    assert ini.read_text(encoding="utf-8") == before  # nothing written
    assert not [p for p in ini.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_setting_value_is_escaped(panel):
    web, client, _, ini, _ = panel
    csrf = login(web, client)
    evil = '"><script>window.__xss=3</script>'
    post(client, "/settings", {"csrf": csrf, "persona": "", "server.allowed_hosts": evil})
    assert aokun.Config(ini).server.allowed_hosts == evil
    html = client.get("/settings").text
    assert "<script>window.__xss" not in html and "&#34;&gt;&lt;script&gt;" in html


def test_saving_without_an_ini_starts_from_the_example(mem, tmp_path):
    ini = tmp_path / "new" / "aokun.ini"
    ini.parent.mkdir()
    aokun.save_settings(ini, {("recall", "max_k"): "50"})
    text = ini.read_text(encoding="utf-8")
    assert "max_k = 50" in text and "; Largest k a caller may ask for" in text
    assert aokun.Config(ini).recall.max_k == 50
    with pytest.raises(aokun.InputError, match="no setting"):
        aokun.save_settings(ini, {("recall", "nope"): "1"})


def test_ini_set_keeps_everything_else():
    text = ("; top\n[recall]\n; help\nmmr_lambda = 0.7\nweird = a\n  continued\nmax_k=3\n\n"
            "[text]\nuserdict = x\n")
    out = aokun.ini_set(text, {("recall", "weird"): "b", ("recall", "max_k"): "9",
                               ("recall", "rrf_k"): "61",
                               ("text", "stopwords"): "s.txt", ("backup", "dir"): ""})
    assert out == ("; top\n[recall]\n; help\nmmr_lambda = 0.7\nweird = b\nmax_k = 9\nrrf_k = 61\n\n"
                   "[text]\nuserdict = x\nstopwords = s.txt\n\n[backup]\ndir =\n")
    assert aokun.ini_set("[a]\r\nk = 1\r\n", {("a", "k"): "2"}) == "[a]\r\nk = 2\r\n"
    with pytest.raises(aokun.InputError):
        aokun.ini_set(text, {("recall", "max_k"): "1\n[server]"})
    layout = aokun.ini_layout(aokun.EXAMPLE_INI.read_text(encoding="utf-8"))
    recall = next(s for s in layout if s["name"] == "recall")
    weights = next(g for g in recall["groups"]
                   if g["help"] == "Channel weights inside their route.")
    assert [k for k, _ in weights["keys"]] == ["weight_bm25", "weight_vector",
                                               "weight_graph_keyword", "weight_graph_vector"]


# serve --http at /panel ---------------------------------------------------------------------------

@pytest.mark.slow
def test_serve_http_serves_the_panel_behind_its_own_login(tmp_path):
    import httpx
    db, ini = tmp_path / "h.db", write_ini(tmp_path, "none", server={"token": "s3cret"})
    port = free_port()
    err_path = tmp_path / "stderr.txt"
    with err_path.open("wb") as err:
        args = serve_args(db, ini, "--http", "--port", str(port))
        proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env=child_env(),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_port(port, proc)
            deadline = time.monotonic() + 20
            while "/panel/?token=" not in err_path.read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            token = re.search(r"/panel/\?token=(\S+)", err_path.read_text()).group(1)
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base) as h:
                # the MCP endpoint keeps its bearer token
                assert h.post("/mcp", json={}).status_code == 401
                assert h.get("/panel/health").status_code == 401
                r = h.get(f"/panel/health?token={token}", follow_redirects=False)
                assert r.status_code == 303 and r.headers["location"] == "/panel/health"
                assert "path=/panel" in r.headers["set-cookie"].lower()
                page = h.get("/panel/health")
                assert page.status_code == 200 and 'href="/panel/static/panel.css"' in page.text
                assert h.get("/panel/memories", headers={"Host": "evil.example"}).status_code == 421
        finally:
            stop(proc)
    assert "Traceback" not in err_path.read_text()


# conversations ------------------------------------------------------------------------------------

def test_conversations_lists_sessions_shows_turns_in_order_and_searches(panel, tmp_path):
    web, client, mem, _, _ = panel
    sid = "0a1b2c3d-0000-4000-8000-00000000abcd"
    lines = [{"type": "user", "sessionId": sid, "cwd": "/home/dev/x", "uuid": f"u{i}",
              "timestamp": f"2026-03-02T09:0{i}:00.000Z",
              "message": {"role": "user" if i % 2 == 0 else "assistant", "content": text}}
             for i, text in enumerate(["Which espresso grinder did we pick for the office?",
                                       "The Niche Zero, because it is quiet. " + XSS_TEXT,
                                       "And the beans?"])]
    for line in lines:
        line["type"] = line["message"]["role"]
        if line["type"] == "assistant":
            line["message"]["content"] = [{"type": "text", "text": line["message"]["content"]}]
    path = tmp_path / "claude" / "-home-dev-x" / f"{sid}.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    assert mem.ingest("claude-code", [path])["new"] == 3
    login(web, client)
    listing = client.get("/conversations").text
    assert "Which espresso grinder" in listing and "claude-code" in listing and "3 turns" in listing
    page = client.get(f"/conversations?session={sid}&source=claude-code").text
    assert page.index("Which espresso grinder") < page.index("Niche Zero") \
        < page.index("And the beans?")
    assert "<script>window.__xss" not in page and "&lt;script&gt;" in page
    found = client.get("/conversations?q=espresso+grinder").text
    assert "Which espresso grinder" in found
    other = client.get("/conversations?persona=p2").text
    assert "espresso" not in other and "No conversations yet" in other
    missing = client.get(f"/conversations?session={sid}&persona=p2")
    assert missing.status_code == 404 and "espresso" not in missing.text


@pytest.mark.slow
def test_health_and_conversations_show_the_watchs_progress(panel):
    web, client, mem, _, _ = panel
    login(web, client)
    assert "History watch" not in client.get("/health").text  # no watch ever ran on this file
    mem.watch_state = {"files_done": 1200, "files_left": 28800, "files_skipped": 3,
                       "turns_done": 61000, "turns_left": 1450000, "turns_per_second": 7.5,
                       "seconds_left": 193333, "searchable_after": "2026-11-20T08:15:00Z",
                       "started_at": "2026-12-01T09:00:00Z", "finished_at": None,
                       "updated_at": "2026-12-01T11:00:00Z"}
    html = " ".join(client.get("/health").text.split())
    for text in ("History watch", "reading the history already there",
                 "1,200 read · 28,800 left · 3 left out", "61,000 stored · about 1,450,000 left",
                 "7.5 turns/s", "about 53.7 h", "every session written after 2026-11-20 08:15"):
        assert text in html, text
    line = " ".join(client.get("/conversations").text.split())
    assert "28,800 files left, about 53.7 h" in line and 'href="/health#watch"' in line
    mem.watch_state = dict(mem.watch_state, files_left=0, turns_left=0, seconds_left=0,
                           searchable_after=None, finished_at="2026-12-03T10:00:00Z")
    html = " ".join(client.get("/health").text.split())
    assert "following the clients" in html and "history read</dt><dd>2026-12-03 10:00" in html
    assert "files left" not in client.get("/conversations").text


def test_memory_page_shows_its_history_edits_and_consolidation(panel):
    web, client, mem, _, ids = panel
    mem.edit(ids["alice"], "Alice lives in Paris and drinks iced americano, no sugar")
    other = mem.memorize("Alice lives in Paris and drinks iced americano, no sugar at all")["id"]
    login(web, client)
    page = client.get(f"/memories/{ids['alice']}").text
    history = page[page.index("<h2>History"):]
    assert history.index("stored") < history.index("edited or rebuilt")
    assert [h["what"] for h in mem.history(ids["alice"])][:2] == ["insert", "edit"]
    with pytest.raises(aokun.NotFound):
        mem.history(ids["alice"], "p2")  # another persona's id is not there
    merged = mem.consolidate(dry_run=False, similarity=0.0, min_jaccard=0.5)
    survivor = next((c["survivor"] for c in merged["clusters"]
                     if other in c["members"] + [c["survivor"]]), None)
    assert survivor is not None, merged
    page = client.get(f"/memories/{survivor}").text
    assert "consolidated:" in page and "Restore undoes it" in page


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\u0085", "\v", "\f", "\x1c", "\x1d", "\x1e",
                                  "\x00", "\x1b"])
def test_a_setting_with_a_line_break_of_any_kind_is_refused(panel, char):
    web, client, _, ini, _ = panel
    csrf = login(web, client)
    before = ini.read_text(encoding="utf-8")
    evil = f"localhost{char}[server]{char}token = attacker-known-token"
    r = post(client, "/settings", {"csrf": csrf, "persona": "", "server.allowed_hosts": evil})
    assert r.status_code == 400
    assert f"[server] allowed_hosts: the value holds U+{ord(char):04X}" in r.text
    assert ini.read_text(encoding="utf-8") == before
    # a later save of another setting does not turn anything into lines either
    assert post(client, "/settings",
                {"csrf": csrf, "persona": "", "recall.max_k": "40"}).status_code == 303
    cfg = aokun.Config(ini)
    assert cfg.recall.max_k == 40 and cfg.server.token == aokun.Config(None).server.token
    assert "attacker" not in ini.read_text(encoding="utf-8")


def test_a_hand_written_value_with_u2028_stays_one_line_on_the_next_save(tmp_path):
    ini = tmp_path / "aokun.ini"
    ini.write_text("[server]\nallowed_hosts = a\u2028[server]\u2028token = attacker\n",
                   encoding="utf-8")
    aokun.save_settings(ini, {("recall", "max_k"): "40"})
    cfg = aokun.Config(ini)
    assert cfg.server.token != "attacker"
    assert cfg.server.allowed_hosts == "a\u2028[server]\u2028token = attacker"
    assert "\ttab" == \
        aokun.ini_set("[a]\nk = 1\n", {("a", "k"): "x\ttab"}).split("x")[1].rstrip("\n")


@pytest.mark.slow
def test_a_second_panel_on_a_busy_port_is_one_line_and_prints_no_link(tmp_path):
    db, ini, port = tmp_path / "p.db", write_ini(tmp_path), free_port()
    cmd = [sys.executable, aokun.__file__, "--db", str(db), "--config", str(ini), "panel",
           "--port", str(port), "--no-browser"]
    first = subprocess.Popen(cmd, cwd=REPO, env=child_env(PYTHONUNBUFFERED=1),
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
    try:
        wait_port(port, first)
        link = first.stdout.readline().split()[-1]
        import http.client
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", link.split(str(port), 1)[1])
        assert conn.getresponse().status == 303  # the first one's link logs in
        conn.close()
        second = subprocess.run(cmd, cwd=REPO, env=child_env(), stdin=subprocess.DEVNULL,
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 1 and second.stdout == "", second.stdout
        assert "Traceback" not in second.stderr
        [line] = second.stderr.strip().splitlines()
        assert f"port {port} on 127.0.0.1 is in use" in line and "--port" in line, line
        assert "token=" not in second.stderr
    finally:
        stop(first)


def test_a_page_holds_the_watchers_back_log_as_a_tool_call_does(panel, monkeypatch):
    """Issue 26: the back-log waits (yield_to_foreground) while a panel page runs."""
    web, client, mem, _, _ = panel
    login(web, client)
    seen = []
    recall = mem.recall

    def spy(*args, **kwargs):
        seen.append(mem._calls_in_flight)
        return recall(*args, **kwargs)
    monkeypatch.setattr(mem, "recall", spy)
    assert client.get("/recall?q=Alice").status_code == 200
    assert seen == [1] and mem._calls_in_flight == 0
