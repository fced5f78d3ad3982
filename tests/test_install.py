"""Issue 35: installed like a tool, data where data lives. pyproject.toml builds a wheel of the one
module (hatchling); installed into a fresh venv, `aokun` runs from another folder and finds its
schema/, sql/, rules/ and web/ in <venv>/share/aokun, its config and database in the user folders
(platformdirs; conftest points XDG_DATA_HOME and XDG_CONFIG_HOME into the test's temp folder)."""

import os
import re
import site
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import aokun
from mcp_procs import REPO, child_env


def requirement_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [re.sub(r"\s+#.*", "", x).strip() for x in lines if x.strip() and x[0] != "#"]


def test_pyproject_depends_on_exactly_the_requirements():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["dependencies"] == requirement_lines(REPO / "requirements.txt")
    assert project["scripts"] == {"aokun": "aokun:main"}


def test_without_a_path_the_database_and_config_live_in_the_user_folders(tmp_path, monkeypatch):
    data, config = Path(os.environ["XDG_DATA_HOME"]), Path(os.environ["XDG_CONFIG_HOME"])
    monkeypatch.setattr(aokun, "HERE", tmp_path / "checkout")  # a checkout without data/aokun.db
    assert aokun.find_config() is None
    cfg = aokun.load_config()
    assert aokun.database_path(cfg) == data / "aokun" / "aokun.db"
    assert aokun.config_target(None) == config / "aokun" / "aokun.ini"
    ini = config / "aokun" / "aokun.ini"
    ini.parent.mkdir(parents=True)
    ini.write_text("[storage]\ndb = mine.db\n", encoding="utf-8")
    (tmp_path / "checkout").mkdir()
    (tmp_path / "checkout" / "aokun.ini").write_text("[storage]\ndb = no.db\n", encoding="utf-8")
    assert aokun.find_config() == ini  # the user config folder before the checkout's ini
    assert aokun.database_path(aokun.load_config()) == ini.parent / "mine.db"


def test_an_existing_data_aokun_db_beside_aokun_py_keeps_being_used(tmp_path, monkeypatch):
    monkeypatch.setattr(aokun, "HERE", tmp_path)
    old = tmp_path / "data" / "aokun.db"
    old.parent.mkdir()
    old.touch()
    assert aokun.database_path(aokun.Config(None)) == old


@pytest.mark.slow
def test_the_wheel_installs_a_command_that_runs_from_another_folder(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                            "--no-build-isolation", "-q", "-w", str(dist), str(REPO)],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    wheel = next(dist.glob("aokun-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "aokun.py" in names and not [n for n in names if n.startswith(("tests/", "scripts/"))]
    for part in ("schema/0001_init.sql", "sql/recall.sql", "rules/ingest/codex.toml",
                 "web/panel.css", "service/aokun.service", "aokun.example.ini"):
        assert f"aokun-{aokun.__version__}.data/data/share/aokun/{part}" in names

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                                "--no-deps", "--no-index", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    code = "import sysconfig; print(sysconfig.get_path('purelib'))"
    purelib = subprocess.run([python, "-c", code], capture_output=True, text=True,
                             check=True).stdout.strip()
    # the dependencies: this interpreter's, after the venv's own site-packages (--no-deps above)
    Path(purelib, "test-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ini = Path(os.environ["XDG_CONFIG_HOME"]) / "aokun" / "aokun.ini"
    ini.parent.mkdir(parents=True)
    ini.write_text("[embedding]\nprovider = none\n[backup]\ndaily = false\n", encoding="utf-8")
    command = str(python.with_name("aokun.exe" if os.name == "nt" else "aokun"))

    def run(*args):
        r = subprocess.run([command, *args], cwd=elsewhere, capture_output=True, text=True,
                           encoding="utf-8", timeout=120, env=child_env(PYTHONPATH=""))
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        return r

    assert "memorize" in run("--help").stdout
    db = Path(os.environ["XDG_DATA_HOME"]) / "aokun" / "aokun.db"
    stats = run("stats").stdout
    assert f"database: {db} " in stats and f"config: {ini}" in stats
    run("memorize", "Alice 喜欢冰美式")
    assert "冰美式" in run("recall", "冰美式").stdout
    where = subprocess.run([python, "-c", "import aokun; print(aokun.HERE, aokun.SHARE)"],
                           cwd=elsewhere, capture_output=True, text=True, env=child_env(),
                           check=True).stdout.split()
    assert where == [purelib, str(env_dir / "share" / "aokun")]
    assert not list(elsewhere.iterdir())  # nothing written into the working folder
