"""The official MCP conformance suite (scripts/conformance.py) against `serve --http`, when it is
installed locally: $AOKUN_CONFORMANCE_DIR (default /tmp/conf) holding node@22 and
@modelcontextprotocol/conformance. Every scenario that needs no suite fixture must pass."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import conformance  # noqa: E402

pytestmark = pytest.mark.slow  # every test here takes 0.5 s or more

SUITE = Path(os.environ.get("AOKUN_CONFORMANCE_DIR", "/tmp/conf"))


@pytest.mark.skipif(not (SUITE / "node_modules" / ".bin" / "conformance").exists(),
                    reason=f"the MCP conformance suite is not installed in {SUITE} "
                           "(npm i node@22 @modelcontextprotocol/conformance there, or set "
                           "AOKUN_CONFORMANCE_DIR)")
def test_every_scenario_without_fixtures_passes():
    results = conformance.run_suite(SUITE)
    assert {"server-initialize", "logging-set-level", "completion-complete",
            "prompts-list"} <= set(results)
    assert [name for name, r in results.items() if r == "fail"] == []
