"""How ``loadmaster pull`` starts and ends: only the pull's own stack is imported, and the
executable's quick exit loses neither output nor the state DB's records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lab import Lab
from tests.jobs.conftest import SourceData
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]

#: Never needed by a pull from the console: the console UI, torch, the async S3 client stack.
FORBIDDEN = (
    "textual",
    "tui.app",
    "tui.screens",
    "tui.widgets",
    "torch",
    "aiobotocore",
    "aiohttp",
    "boto3",
    "botocore",
    # backend.storage itself is stdlib and the config (the pull prices its reads with its store
    # profiles); its S3 client stack (aiobotocore, botocore, aiohttp) stays forbidden above.
    "backend.storage.multipart",
    "backend.doctor",
    "backend.checkpoints",
    "backend.shards",
    "backend.telemetry",
    "lab",
)

_PROBE = """
import json, sys
from tui.cli import main
rc = main(sys.argv[1:])
print("@@MODULES " + json.dumps(sorted(sys.modules)))
sys.exit(rc)
"""


def test_pull_imports_only_its_own_stack(source: SourceData, jobs_config_path: Path) -> None:
    # Lab credentials are plain keys in a shared-credentials file: botocore is not needed either.
    argv = [
        "--config",
        str(jobs_config_path),
        "pull",
        source.url,
        "pulls/startup-imports",
        "--node",
        "node-01",
        "--yes",
    ]
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "node-01: succeeded" in res.stdout
    line = next(x for x in res.stdout.splitlines() if x.startswith("@@MODULES "))
    loaded = json.loads(line.removeprefix("@@MODULES "))
    leaked = sorted(m for m in loaded if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))
    assert leaked == []
    assert [m for m in loaded if m.startswith("tui.cli.") and m != "tui.cli._trace"] == ["tui.cli.jobs"]


def test_executable_exits_quickly_without_losing_output_or_records(
    lab: Lab, source: SourceData, jobs_config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exe = Path(sys.executable).parent / "loadmaster"
    dest_rel = "pulls/startup-exit"
    res = subprocess.run(
        [
            str(exe),
            "--config",
            str(jobs_config_path),
            "pull",
            source.url,
            dest_rel,
            "--node",
            "node-01",
            "--yes",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "LOADMASTER_TRACE": "1"},
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    # Everything printed before the quick exit arrived: the whole JSON document and the trace's last line.
    doc = json.loads(res.stdout)
    (job,) = doc["jobs"]
    assert job["state"] == "succeeded" and job["result"]["objects"] == len(source.objects)
    assert "pull: done" in res.stderr
    assert (lab.node("node-01").scratch / dest_rel / "small.bin").stat().st_size == len(source.objects["small.bin"])

    # The state DB holds the finished job and the launch's audit record.
    assert cli_main(["--config", str(jobs_config_path), "jobs", "--local", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[job["id"]]["state"] == "succeeded"
    assert rows[job["id"]]["result"]["bytes"] == source.total
    assert cli_main(["--config", str(jobs_config_path), "audit", "--json", "--action", "pull.launch"]) == 0
    audit = capsys.readouterr().out
    assert "pull.launch" in audit and job["id"] in audit
