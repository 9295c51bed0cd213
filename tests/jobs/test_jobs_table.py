"""``loadmaster jobs`` fits 120 columns (paths cut in the middle, each job's id whole; ``--wide``
for everything), says how each pull's bytes were proven (``size-only`` plainly), and says a state
database that cannot be reached once, not once per node, without blaming the nodes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.jobs.fmt import middle, verified_short
from backend.jobs.records import JobProgress, JobRecord, launch_job_ids
from backend.ops import Operations, PullRequest
from backend.services import Services
from lab import Lab
from tests.helpers import write_lab_config
from tests.jobs.conftest import SourceData
from tui.cli.jobs import TABLE_WIDTH, job_rows

pytestmark = pytest.mark.timeout(300)
LOADMASTER = str(Path(sys.executable).parent / "loadmaster")
SRC = "s3://ml-datasets-eu-west/team-vision/laion-2b-filtered/shards/webdataset/"
DEST = "/mnt/local-nvme/loadmaster/scratch/datasets/laion-2b-filtered/epoch-0003"


def _records(n: int) -> list[JobRecord]:
    ids = launch_job_ids("1202-031500-c3d4", [f"gpu-a{i:02d}" for i in range(1, n + 1)])
    out = []
    for i, (node, job_id) in enumerate(ids.items()):
        state = ("running", "succeeded", "failed", "cancelling")[i % 4]
        out.append(
            JobRecord(
                id=job_id,
                node=node,
                kind="pull",
                state=state,
                created=1.0e9,
                launched_by="alice@ops",
                launched_from="bastion",
                params={"src": SRC, "dest": DEST},
                result={"verified": "size-only", "verification": {"size-only": 4}} if state == "succeeded" else None,
                progress=JobProgress(t=1.0e9, bytes_done=640 * 10**9, bytes_total=1_280 * 10**9, rate_bps=1.1e9),
                note="node unreachable: timed out" if i == 5 else None,
                launch="1202-031500-c3d4",
            )
        )
    return out


def test_sixteen_nodes_fit_120_columns_with_every_id_whole() -> None:
    recs = _records(16)
    lines = job_rows(recs)
    assert max(len(line) for line in lines) <= TABLE_WIDTH, "\n".join(lines)
    for r, line in zip(recs, lines[1:], strict=True):
        assert line.startswith(r.id + " ") and r.node in line
        assert "…" in line and SRC[:7] in line and DEST[-7:] in line  # both ends of both paths
    assert "size-only" in lines[2]
    wide = job_rows(recs, wide=True)
    assert all(f"{SRC} -> {DEST}" in line for line in wide[1:])
    assert max(len(line) for line in wide) > TABLE_WIDTH


def test_long_node_names_and_a_foreign_id_still_fit() -> None:
    recs = [
        r.__class__(**{**r.__dict__, "node": "a-very-long-node-name-in-rack-17.cluster.example"}) for r in _records(3)
    ]
    foreign = JobRecord(
        id="x" * 64, node="gpu-a01", kind="pull", state="foreign", created=1.0e9, launched_by="?",
        launched_from="?", foreign="no job with this id was launched through this state database",
    )  # fmt: skip
    lines = job_rows([*recs, foreign])
    assert max(len(line) for line in lines) <= TABLE_WIDTH, "\n".join(lines)
    assert all(r.id in "\n".join(lines) for r in recs)


def test_verified_method_in_a_word() -> None:
    assert verified_short({"verified": "bytes", "verification": {"crc64nvme": 3}}) == "crc64nvme"
    assert verified_short({"verified": "bytes", "verification": {"md5": 1, "crc32c": 3}}) == "crc32c+md5"
    assert verified_short({"verified": "size-only", "verification": {"size-only": 2}}) == "size-only"
    assert verified_short({"verified": "partly", "verification": {"size-only": 2, "md5": 2}}) == "partly size-only 2/4"
    assert verified_short(None) == "-" and verified_short({"objects": 3}) == "-"
    assert middle("abcdefghij", 5) == "ab…ij" and middle("abc", 5) == "abc"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOADMASTER, "--config", str(cfg), *args], capture_output=True, text=True, timeout=240)


async def test_jobs_with_the_state_database_down_says_so_once(lab: Lab, source: SourceData, tmp_path: Path) -> None:
    cfg = write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state")
    services = Services(config=load_config_file(cfg))
    try:
        # An older job on the last node: with the database down the nodes' jobs are still listed
        # newest first across nodes (not node by node, the first nodes' oldest jobs first).
        older = await Operations(services).pulls.start(
            PullRequest(src=source.url, dest=f"pulls/dbdown-old-{tmp_path.name}", nodes="node-04")
        )
        await services.jobs.wait(older.records[0].id, timeout=120)
        req = PullRequest(src=source.url, dest=f"pulls/dbdown-{tmp_path.name}", nodes="node-0[1,2,4]")
        started = await Operations(services).pulls.start(req)
        for r in started.records:
            await services.jobs.wait(r.id, timeout=120)
    finally:
        await services.aclose()
    ok = _cli(cfg, "jobs")
    assert ok.returncode == 0, ok.stderr
    mine = [line for line in ok.stdout.splitlines() if line.startswith(f"{started.launch}.")]
    assert len(mine) == 3 and max(len(line) for line in ok.stdout.splitlines()) <= TABLE_WIDTH, ok.stdout
    # How the bytes were proven, in --json and in the table.
    rows = {r["id"]: r for r in json.loads(_cli(cfg, "jobs", "--json").stdout)}
    for line in mine:
        job = rows[line.split()[0]]
        assert job["result"]["verified"] in ("bytes", "partly", "size-only")
        assert line.split()[1:4] == ["pull", job["node"], "succeeded"], line
        assert f"  {verified_short(job['result'])}  " in line and verified_short(job["result"]) != "-", line

    # The same fleet, its state in a PostgreSQL that does not answer.
    down = write_lab_config(
        lab,
        tmp_path / "down.toml",
        tmp_path / "state-down",
        state_url=f"postgresql://loadmaster@127.0.0.1:{_closed_port()}/loadmaster",
    )
    res = _cli(down, "jobs")
    assert "Traceback" not in res.stderr
    err = [line for line in res.stderr.splitlines() if line.strip()]
    assert len([line for line in err if "state database" in line]) == 1, res.stderr
    assert not any("not read" in line or "node-0" in line for line in err), res.stderr  # no node is blamed
    assert len(res.stderr) < 500, res.stderr
    rows = res.stdout.splitlines()[1:]  # under the header, newest first: the launch's three
    assert [line.startswith(f"{started.launch}.") for line in rows[:3]] == [True] * 3, res.stdout
    assert any(line.startswith(f"{older.launch}.") for line in rows[3:]), res.stdout
    assert res.returncode == 4


def test_a_launch_on_many_nodes_is_named_in_one_short_line() -> None:
    from backend.jobs.fmt import nodes_text

    assert nodes_text(["node-02", "node-01", "node-01"]) == "node-01, node-02"
    many = nodes_text(f"gpu-a{i:02d}" for i in range(16, 0, -1))
    assert many == "16 nodes: gpu-a01, gpu-a02, gpu-a03 ... gpu-a16"
