"""What a pull's launch imports, and what it leaves for later (#33 item 3).

Each check runs in a fresh interpreter (this test process imported everything long ago):

- opening the state (every command that reads or writes jobs) makes the state's id without
  ``uuid``, which imports ``platform``;
- the egress guard a pull passes loads neither the month's report nor ``difflib`` (a typo's hint);
- the node's runner starts s5cmd without having imported ``http.client`` (with ``email`` and
  ``ssl``, ~20 ms): the verifier imports it where it sends a HEAD the plain way.

What each deferred part does is tested where it is used (the report, a region's typo hint, the
plain HEAD); here, that it still works once the import moved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backend.config import parse_config
from backend.ledger import EgressGuard
from backend.policy.prices import default_price_table
from backend.state import SQLiteState

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def _loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


def test_opening_the_state_does_not_import_uuid(tmp_path: Path) -> None:
    db_path = tmp_path / "state.sqlite3"
    code = f"from backend.state import SQLiteState\nSQLiteState({str(db_path)!r}).state_id"
    assert _loaded_after(code, ("uuid", "platform")) == []
    # The id is still 128 random bits, 32 hex digits, made once and kept.
    first = SQLiteState(db_path).state_id
    assert len(first) == 32 and int(first, 16) >= 0
    assert SQLiteState(db_path).state_id == first
    assert SQLiteState(tmp_path / "other.sqlite3").state_id != first


def test_a_pulls_egress_guard_loads_no_report_and_no_difflib(tmp_path: Path) -> None:
    code = "import backend.ledger, backend.policy.egress"
    assert _loaded_after(code, ("backend.ledger.report", "difflib")) == []
    # Both still work where they are used: the month's report, and a typo's hint.
    guard = EgressGuard(parse_config({}), SQLiteState(tmp_path / "state.sqlite3"))
    assert guard.report().routes == ()
    table = default_price_table()
    region = table.providers["aws"].known_regions[0]
    problem = table.site_problem(f"aws:{region}x")
    assert problem is not None and f"did you mean {region}?" in problem


def test_the_node_runner_starts_s5cmd_before_importing_http_client() -> None:
    code = "import backend.agent.runner, backend.pulls.job"
    assert _loaded_after(code, ("http.client", "email.parser")) == []
