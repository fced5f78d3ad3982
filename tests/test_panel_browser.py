"""The web panel in a real browser: Debian's chromium, headless, driven by Playwright for Python
(never `playwright install`: the system browser is used), against a real `python aokun.py panel`
child process on a temp database. Each page is loaded (and photographed into $PANEL_SHOTS, default
the test's temp folder), a setting is edited, a memory is deleted through the confirm dialog, and
the database and ini file are checked afterwards. With CI=true a missing browser fails; elsewhere
these tests skip, saying why."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import aokun
from mcp_procs import AOKUN, REPO, child_env, free_port, stop, wait_port

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
XSS_TEXT = ('Mallory wrote <script>window.__xss=1</script> and '
            '"><img src=x onerror="window.__xss=2"> here')


def _browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -r requirements-dev.txt)"
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        return "chromium is not installed (apt-get install -y chromium)"
    return None


@pytest.fixture(scope="module")
def browser_ok():
    why = _browser_missing()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run in CI: {why}")
        pytest.skip(f"browser tests skipped: {why}")


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("PANEL_SHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def served(browser_ok, tmp_path, segmenter):
    """A `python aokun.py panel --no-browser` child on a database of four memories and a fact
    history; yields (login URL, db path, ini path, {name: memory id}). The child is always
    stopped."""
    db, ini = tmp_path / "p.db", tmp_path / "aokun.ini"  # the example file, as a user copies it
    ini.write_text(aokun.ini_set(aokun.EXAMPLE_INI.read_text(encoding="utf-8"), {
        ("embedding", "provider"): "none", ("backup", "dir"): str(tmp_path / "backups"),
        ("backup", "daily"): "false"}), encoding="utf-8")
    m = aokun.Memory(db, aokun.Config(ini))
    m.seg = segmenter
    ids = {"alice": m.memorize("Alice lives in Paris and drinks iced americano every morning",
                               {"participants": ["Alice"], "topics": ["coffee"], "source": "chat",
                                "summary": "Alice's coffee"})["id"],
           "bob": m.memorize("Bob started learning the cello last spring",
                             {"participants": ["Bob"]})["id"],
           "xss": m.memorize(XSS_TEXT)["id"],
           "doomed": m.memorize("Forget me: the old wifi password was hunter2",
                                {"importance": 0.2})["id"]}
    m.kg_add("Alice", "lives_in", "London", valid_from="2020-01-01")
    m.kg_add("Alice", "lives_in", "Paris", valid_from="2023-06-01")
    m.kg_add("Alice", "likes", "iced americano", valid_from="2022-03-01")
    m.close()
    port = free_port()
    out = (tmp_path / "panel-stdout.txt").open("wb")
    err = (tmp_path / "panel-stderr.txt").open("wb")
    proc = subprocess.Popen([sys.executable, AOKUN, "--db", str(db), "--config", str(ini), "panel",
                             "--no-browser", "--port", str(port)],
                            cwd=REPO, env=child_env(PYTHONUNBUFFERED=1),
                            stdin=subprocess.DEVNULL, stdout=out, stderr=err)
    try:
        wait_port(port, proc)
        printed = (tmp_path / "panel-stdout.txt").read_text(encoding="utf-8")
        url = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", printed).group(0)
        yield url, db, ini, ids
        assert proc.poll() is None, "the panel died during the test"
    finally:
        stop(proc)
        out.close()
        err.close()
    log = (tmp_path / "panel-stderr.txt").read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log, log[-3000:]


@pytest.fixture
def page(served, tmp_path):
    """A logged-in chromium page (fresh profile) on the served panel, collecting console errors and
    dialogs; fails the test when a page logged an error (a CSP violation, a script error)."""
    from playwright.sync_api import sync_playwright
    url = served[0]
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(tmp_path / "profile"),
                                                       executable_path=CHROMIUM,
                                                       headless=True, args=CHROMIUM_ARGS,
                                                       viewport={"width": 1280, "height": 900})
        try:
            pg = context.new_page()
            pg.errors, pg.dialogs = [], []
            pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
            pg.on("pageerror", lambda e: pg.errors.append(str(e)))
            pg.goto(url)
            assert "token=" not in pg.url and pg.url.endswith("/memories")
            yield pg
            assert pg.errors == []
        finally:
            context.close()


def origin(url: str) -> str:
    return url.split("/?")[0]


def test_every_page_loads_and_looks_right(served, page, shots):
    base = origin(served[0])
    ids = served[3]
    pages = {"memories": "/memories", "memory": f"/memories/{ids['alice']}",
             "recall": "/recall?q=Alice+coffee",
             "graph": "/graph?entity=Alice", "health": "/health", "health-decay": "/health/decay",
             "settings": "/settings", "conversations": "/conversations",
             "search": "/memories?q=cello", "sessions": "/sessions"}
    for name, path in pages.items():
        page.goto(base + path)
        assert page.locator("header.top nav a[aria-current=page]").count() == 1, name
        font = page.evaluate("getComputedStyle(document.body).fontFamily")
        assert font.startswith("system-ui"), name  # CSS loaded
        page.screenshot(path=str(shots / f"{name}.png"), full_page=name != "settings")
    page.goto(base + "/recall?q=Alice+coffee")
    assert page.locator("svg.bar rect.seg").count() >= 2
    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    for name, path in (("phone-memories", "/memories"), ("phone-recall", "/recall?q=Alice+coffee"),
                       ("phone-settings", "/settings")):
        page.goto(base + path)
        # no sideways scroll
        assert page.evaluate("document.documentElement.scrollWidth <= innerWidth + 1"), name
        page.screenshot(path=str(shots / f"{name}.png"))
    page.emulate_media(color_scheme="dark")
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(base + "/recall?q=Alice+coffee")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") == "rgb(18, 21, 27)"
    page.screenshot(path=str(shots / "dark-recall.png"))
    page.goto(base + f"/memories/{ids['alice']}")
    page.screenshot(path=str(shots / "dark-memory.png"))


def test_memory_markup_never_runs(served, page):
    base, ids = origin(served[0]), served[3]
    for path in ("/memories", f"/memories/{ids['xss']}", "/recall?q=Mallory",
                 "/memories?q=Mallory"):
        page.goto(base + path)
        assert page.get_by_text("window.__xss=1", exact=False).count() >= 1, path  # shown as text
        assert page.evaluate("window.__xss === undefined"), path
        assert page.locator("main img").count() == 0, path
    assert page.dialogs == []


def test_edit_a_setting_in_the_browser(served, page, shots):
    base, ini = origin(served[0]), served[2]
    page.goto(base + "/settings")
    field = page.locator('[name="recall.mmr_lambda"]')
    field.fill("2")
    assert page.locator(".setting.changed").count() == 1
    assert page.locator("#changed-count").inner_text() == "1 changed"
    page.get_by_role("button", name="Save changed settings").click()
    alert = page.locator("p.flash.bad")
    assert "[recall] mmr_lambda = 2 is out of range; allowed: 0..1" in alert.inner_text()
    page.screenshot(path=str(shots / "settings-refused.png"))
    assert page.errors == [
        "Failed to load resource: the server responded with a status of 400 (Bad Request)"]
    page.errors.clear()  # the refusal's status, as intended
    assert "mmr_lambda = 0.7" in ini.read_text(encoding="utf-8")
    page.locator('[name="recall.mmr_lambda"]').fill("0.55")
    page.locator('[name="recall.fusion"]').select_option("rrf")
    page.get_by_role("button", name="Save changed settings").click()
    assert "saved [recall] fusion, [recall] mmr_lambda" in page.locator("p.flash.ok").inner_text()
    assert page.locator('[name="recall.mmr_lambda"]').input_value() == "0.55"
    text = ini.read_text(encoding="utf-8")
    assert "mmr_lambda = 0.55" in text and "fusion = rrf" in text and "; MMR trade-off" in text
    cfg = aokun.Config(ini)
    assert cfg.recall.mmr_lambda == 0.55 and cfg.recall.fusion == "rrf"


def test_delete_a_memory_through_the_confirm_dialog(served, page, shots):
    base, db, ini, ids = origin(served[0]), served[1], served[2], served[3]
    page.goto(base + f"/memories/{ids['doomed']}")
    page.screenshot(path=str(shots / "memory-before-delete.png"))
    page.once("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.get_by_role("button", name="Delete…").click()
    assert page.dialogs and "Delete memory" in page.dialogs[-1]
    assert page.url.endswith(f"/memories/{ids['doomed']}")  # dismissed: nothing sent
    page.once("dialog", lambda d: (page.dialogs.append(d.message), d.accept()))
    page.get_by_role("button", name="Delete…").click()
    page.wait_for_url(re.compile(r"/memories\?"))
    assert f"memory {ids['doomed']} deleted" in page.locator("p.flash.ok").inner_text()
    assert "hunter2" not in page.content()
    m = aokun.Memory(db, aokun.Config(ini))
    try:
        with pytest.raises(aokun.NotFound):
            m.get(ids["doomed"])
        assert m.get(ids["alice"])["id"] == ids["alice"]
    finally:
        m.close()


def test_pin_and_importance_in_the_browser(served, page):
    base, db, ini, ids = origin(served[0]), served[1], served[2], served[3]
    page.goto(base + f"/memories/{ids['bob']}")
    page.get_by_role("button", name="Pin").click()
    assert "pinned" in page.locator("p.flash.ok").inner_text()
    page.locator('[name="importance"]').fill("0.85")
    page.get_by_role("button", name="Set").click()
    assert "importance 0.50 → 0.85" in page.locator("p.flash.ok").inner_text()
    m = aokun.Memory(db, aokun.Config(ini))
    try:
        d = m.get(ids["bob"])
        assert d["pinned"] and d["importance"] == 0.85
    finally:
        m.close()


def test_graph_slider_moves_as_of(served, page, shots):
    base = origin(served[0])
    page.goto(base + "/graph?entity=Alice")
    held = page.locator("section.card").first
    assert "Paris" in held.inner_text() and "London" not in held.inner_text()
    slider = page.locator("#as-of-slider")
    slider.evaluate("el => { el.value = 200; el.dispatchEvent(new Event('input')); "
                    "el.dispatchEvent(new Event('change')); }")
    page.wait_for_url(re.compile(r"as_of=2020-07-19"))
    held = page.locator("section.card").first
    assert "London" in held.inner_text() and "Paris" not in held.inner_text()
    page.screenshot(path=str(shots / "graph-as-of.png"), full_page=True)


def test_health_dry_run_then_confirm(served, page, shots):
    base, db = origin(served[0]), served[1]
    page.goto(base + "/health")
    page.get_by_role("link", name="backup…").click()
    page.get_by_text("Would write").first.wait_for()  # the dry run's page has loaded
    page.screenshot(path=str(shots / "health-backup-dry-run.png"))
    assert not list((db.parent / "backups").glob("*manual*"))
    page.get_by_role("button", name="Run backup now").click()
    page.get_by_text("Wrote").first.wait_for()  # the POST's answer has loaded
    assert len(list((db.parent / "backups").glob("*manual*.db"))) == 1


def test_log_out_in_the_browser(served, page, shots):
    """Issue 33 item 11: the Logins page lists this browser; the header's Log out button ends its
    session (its cookie too): the panel then asks for a login link."""
    base = origin(served[0])
    page.goto(base + "/sessions")
    row = page.locator("table.sessions tbody tr")
    assert row.count() == 1 and "this browser" in row.inner_text()
    assert "HeadlessChrome" in row.locator("td").first.get_attribute("title")
    page.screenshot(path=str(shots / "sessions.png"))
    page.get_by_role("button", name="Log out").first.click()
    page.get_by_text("logged out").wait_for()
    assert page.context.cookies() == []
    assert page.goto(base + "/memories").status == 401
    # the plain pages' favicon.ico (404) and the 401 above: not a panel page's errors
    assert all("Failed to load resource" in e for e in page.errors), page.errors
    page.errors.clear()
