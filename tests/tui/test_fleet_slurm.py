"""Fleet and node detail with ``[slurm] enabled``, against the real slurmctld and slurmd 22.05 on
loopback (tests/slurm_fixtures.py) whose nodes are the lab's sshd nodes of the same names: the
Slurm column and the reason (who, how long ago), the repeat-offender mark from the audit log, the
drained/down and job filters, partitions as heatmap groups, drain from ``d`` (the exact command,
confirm, draining while a real job runs), resume refused naming the failing check, read-only
refusal, and the Slurm job on each GPU in node detail.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from textual.widgets import DataTable, Input, Static

from backend.config import load_config_file
from backend.ops.slurm import JobOnNode, SlurmNodeRow
from backend.services import Services
from lab import Lab
from lab.slurm import SlurmLab
from tests.firsthour.screen_text import screen_lines
from tests.helpers import wait_until
from tests.slurm_fixtures import job_state, node_state, slurm, slurm_lab, wait_for
from tests.triage.test_triage_lab import kernel_log
from tui.app import LoadmasterApp
from tui.screens.fleet import FleetScreen
from tui.screens.node_detail import NodeDetailScreen, gpu_job_cell
from tui.widgets.confirm import ConfirmModal
from tui.widgets.fleet_format import slurm_reason_cell, slurm_state_cell, split_reason
from tui.widgets.fleet_heatmap import FleetHeatmap
from tui.widgets.fleet_table import COLUMN_KEYS, PRIORITY_SLURM, FleetTable, column_layout
from tui.widgets.slurm_actions import DrainForm, EvidenceRefused

__all__ = ["slurm", "slurm_lab"]

pytestmark = [pytest.mark.timeout(240)]


def row(name: str = "node-01", **kw: Any) -> SlurmNodeRow:
    base: dict[str, Any] = {
        "name": name,
        "state": "idle",
        "state_text": "IDLE",
        "partitions": ("gpu",),
        "reason": "",
        "reason_by": None,
        "reason_age_s": None,
        "gpus": 4,
        "jobs": (),
        "drains_30d": 0,
        "unavailable": False,
    }
    base.update(kw)
    return SlurmNodeRow(**base)


# -- pure: the columns and the cells -------------------------------------------------------------


@given(st.integers(min_value=1, max_value=400), st.booleans())
def test_slurm_columns_give_way_in_their_priority_order(width: int, errors: bool) -> None:
    skip = frozenset() if errors else frozenset({"error"})
    layout = column_layout(width, skip=skip, slurm=True)
    shown = [key for key, _w in layout]
    wanted = [k for k in PRIORITY_SLURM if k not in skip]
    assert sorted(shown, key=wanted.index) == wanted[: len(shown)]
    assert shown == [k for k in COLUMN_KEYS if k in shown]
    if len(shown) > 1:
        assert sum(w + 2 for _k, w in layout) <= width
    # Without Slurm its columns never show.
    assert not {"slurm", "reason"} & {k for k, _w in column_layout(width, skip=skip)}


@pytest.mark.parametrize("width", [78, 80])
def test_at_80_columns_slurm_state_stays_beside_the_alerts(width: int) -> None:
    shown = dict(column_layout(width, slurm=True))
    assert {"node", "state", "slurm", "alerts"} <= set(shown)
    assert shown["slurm"] >= len("draining*") and shown["alerts"] >= len("STARVED line rate unknown")


def test_cells_say_state_repeat_offender_reason_who_and_when() -> None:
    assert slurm_state_cell(None) == "-"
    assert slurm_state_cell(row(state="draining")) == "draining"
    assert slurm_state_cell(row(state="drained", drains_30d=3)) == "drained ×3"
    assert slurm_state_cell(row(state="drained", drains_30d=2)) == "drained"
    templ = "Xid 79 [Xid 79 GPU 2] | loadmaster:alice | 2026-12-02T03:00Z"
    assert split_reason(templ, "root") == ("Xid 79 [Xid 79 GPU 2]", "alice")
    assert split_reason("bad psu", "bob") == ("bad psu", "bob")
    assert (
        slurm_reason_cell(row(reason=templ, reason_by="root", reason_age_s=7300))
        == "Xid 79 [Xid 79 GPU 2] (alice, 2h ago)"
    )
    assert slurm_reason_cell(row(reason="bad psu", reason_by="bob", reason_age_s=None)) == "bad psu (bob, when unknown)"
    # Text from Slurm is made safe for the terminal.
    assert "\x1b" not in slurm_reason_cell(row(reason="x\x1b[31mred", reason_by="e\x1bvil", reason_age_s=5))


def test_a_long_reason_gives_way_to_who_and_when() -> None:
    from tui.widgets.fleet_table import reason_fit

    text = "bad psu, RMA ticket 4411 (root, 19s ago)"
    assert reason_fit(text, 60) == text
    assert reason_fit(text, 26) == "bad psu, … (root, 19s ago)"
    for width in range(1, 45):
        fit = reason_fit(text, width)
        assert len(fit) <= width
        if width >= 20:
            assert fit.endswith("(root, 19s ago)")


def test_gpu_job_cell_joins_slurm_indices_and_the_nodes_own_answer() -> None:
    from backend.ops.slurm import GpuJob

    r = row(jobs=(JobOnNode("41", "alice", "train", 60.0, (0, 1)),))
    on_node = (GpuJob(1, 100, "41", "cgroup"), GpuJob(2, 200, "42", "cgroup"), GpuJob(3, 300, None, None))
    assert [gpu_job_cell(i, r, on_node) for i in range(5)] == ["41", "41", "42", "pid 300", "-"]
    assert gpu_job_cell(0, None, None) == "-"


# -- against the real Slurm ----------------------------------------------------------------------


def services_for(lab: Lab, sl: SlurmLab, tmp_path: Path, *, readonly: bool = False) -> Services:
    cfg = tmp_path / "lm.toml"
    text = lab.config_text(f'\n[slurm]\nenabled = true\nconf = "{sl.conf}"\ninterval = "5s"\n')
    # Each test its own audit log: drain counts (the repeat-offender mark) are the test's own.
    shared = f'dir = "{lab.root / "state"}"'
    assert shared in text
    cfg.write_text(text.replace(shared, f'dir = "{tmp_path / "state"}"'))
    services = Services(config=load_config_file(cfg))
    services.readonly = readonly
    return services


def cell(app: LoadmasterApp, node: str, column: str) -> str:
    table = app.screen.query_one(FleetTable)
    table.flush_all()
    cells = table._row_cells.get(node)
    return str(cells[COLUMN_KEYS.index(column)]) if cells else ""


async def fleet_ready(app: LoadmasterApp, pilot: Any) -> FleetScreen:
    screen = app.screen
    assert isinstance(screen, FleetScreen)
    screen.show_view("table")
    await wait_until(pilot, lambda: cell(app, "node-01", "slurm") not in ("", "-"), rounds=1200, delay=0.05)
    return screen


async def job_running(pilot: Any, sl: SlurmLab, job: str) -> None:
    """Until Slurm runs ``job``, the console running meanwhile: slurmctld starts a batch job on
    its next scheduling pass, up to a second after the submission, which the console's start
    overlaps. A test then reads Slurm afresh (:func:`refresh`) before it looks for the job."""
    await wait_until(pilot, lambda: job_state(sl, job) == "RUNNING", rounds=1800, delay=0.05)


async def refresh(screen: FleetScreen, pilot: Any) -> None:
    screen._read_slurm(fresh=True)  # a worker, registered as it starts: waited for below
    await pilot.pause()
    await screen.workers.wait_for_complete()
    await pilot.pause()


def modal_text(app: LoadmasterApp) -> str:
    return "\n".join(str(s.render()) for s in app.screen.query(Static)) + "\n" + "\n".join(screen_lines(app))


async def test_fleet_shows_slurm_and_drains_from_d(lab: Lab, slurm: SlurmLab, tmp_path: Path) -> None:
    services = services_for(lab, slurm, tmp_path)
    # node-03 was drained three times in 30 days (the audit log): a repeat offender.
    for _ in range(3):
        services.db.record_audit("slurm.drain", "node-03", "ok", reason="flaky")
    slurm.command(["scontrol", "update", "NodeName=node-03", "State=DRAIN", "Reason=bad psu"])
    job = slurm.sbatch("-w", "node-01", "--gres=gpu:2", "-J", "train", script="sleep 300")
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await fleet_ready(app, pilot)
        await job_running(pilot, slurm, job)
        await refresh(screen, pilot)
        assert cell(app, "node-01", "slurm") in ("mixed", "allocated")
        assert cell(app, "node-03", "slurm") == "drained ×3"
        assert cell(app, "node-04", "slurm") == "-"  # not a Slurm node
        header = next(line for line in screen_lines(app) if "Node" in line and "Slurm" in line)
        assert "State" in header and "Alerts" in header
        conditions = str(screen.query_one("#fleet-conditions", Static).render())
        assert "Slurm: 1 drained, 1 drained 3+ times in 30 days" in conditions
        # The reason with who set it and how long ago (its column shows from 100 columns).
        assert cell(app, "node-03", "reason").startswith("bad psu (")
        assert cell(app, "node-03", "reason").endswith("s ago)")
        # f: drained/down only; j: the nodes of the job.
        await pilot.press("f")
        await pilot.pause()
        assert set(screen.query_one(FleetTable)._row_cells) == {"node-03"}
        await pilot.press("f")  # slowest GPUs: triage's ranking
        await wait_until(pilot, lambda: screen.preset == "slowest GPUs" and screen.slowest, rounds=1200, delay=0.05)
        assert set(screen.query_one(FleetTable)._row_cells) <= {n for n, _g, _r in screen.slowest}
        assert "filter: slowest GPUs" in str(screen.query_one("#fleet-conditions", Static).render())
        await pilot.press("f")
        await pilot.pause()
        assert len(screen.query_one(FleetTable)._row_cells) == 4
        await pilot.press("j")
        await pilot.press(*job)
        await pilot.pause()
        assert set(screen.query_one(FleetTable)._row_cells) == {"node-01"}, (screen.filter_text, job)
        await pilot.press("escape", "escape")
        await pilot.pause()
        # d on node-01: the reason, after the job, the exact command, confirm.
        table = screen.query_one(FleetTable)
        table.move_cursor(row=table._row_order.index("node-01"))
        table.focus()
        await pilot.press("d")
        await wait_until(pilot, lambda: isinstance(app.screen, DrainForm))
        app.screen.query_one("#drain-reason", Input).value = "fan noise"
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), rounds=600, delay=0.05)
        shown = modal_text(app)
        assert "scontrol update NodeName=node-01 State=DRAIN" in shown and "fan noise" in shown
        assert "draining, then drained" in shown
        await pilot.press("y")
        await wait_until(pilot, lambda: cell(app, "node-01", "slurm") == "draining", rounds=1200, delay=0.05)
        assert node_state(slurm, "node-01") == "draining"
        reason = slurm.command(["scontrol", "show", "node", "node-01"]).stdout
        assert "Reason=fan noise" in reason and "loadmaster:" in reason
        # R on node-01: an Xid in its kernel log since the drain; refused, the failing check named.
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
        xid = f"{stamp} node-01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
        with kernel_log(lab, "node-01", xid):
            await pilot.press("R")
            await wait_until(pilot, lambda: not isinstance(app.screen, FleetScreen), rounds=1200, delay=0.05)
            assert isinstance(app.screen, EvidenceRefused), modal_text(app)
            refused = modal_text(app)
            assert "Resume node-01 refused: xid" in refused and "FAIL node-01 xid: 1 Xid(s) since the drain" in refused
            await pilot.press("escape")
        assert node_state(slurm, "node-01") == "draining"
        # The heatmap groups Slurm's nodes by partition.
        screen.show_view("heatmap")
        await pilot.pause()
        grid = screen.query_one(FleetHeatmap).grid
        assert set(grid._group_of.values()) >= {"partition:gpu"}
        assert any("partition gpu · nodes" in line for line in screen_lines(app))
        # The job ends: drained.
        slurm.command(["scancel", job])
        wait_for("node-01 drained", lambda: node_state(slurm, "node-01") == "drained")
        screen.show_view("table")
        await refresh(screen, pilot)
        await wait_until(pilot, lambda: cell(app, "node-01", "slurm") == "drained", rounds=1200, delay=0.05)
        # No Xid, nothing on the GPUs: the evidence passes, the command is shown, y resumes.
        table.move_cursor(row=table._row_order.index("node-01"))
        await pilot.press("R")
        await wait_until(pilot, lambda: not isinstance(app.screen, FleetScreen), rounds=1200, delay=0.05)
        assert isinstance(app.screen, ConfirmModal), modal_text(app)
        assert "scontrol update NodeName=node-01 State=RESUME" in modal_text(app)
        await pilot.press("y")
        # The console reads Slurm again after the resume: the drain is gone from the row at once
        # (``idle*`` until slurmctld's ping of the node answers, which Fleet's next read shows).
        await wait_until(pilot, lambda: cell(app, "node-01", "slurm").startswith("idle"), rounds=1200, delay=0.05)
        wait_for("node-01 idle", lambda: node_state(slurm, "node-01") == "idle")
        await refresh(screen, pilot)
        await wait_until(pilot, lambda: cell(app, "node-01", "slurm") == "idle", rounds=1200, delay=0.05)
        entries = services.db.audit_entries(limit=20, action="slurm.drain")
        assert any(e.target == "node-01" and e.outcome == "ok" for e in entries)
        resumes = [(e.target, e.outcome) for e in services.db.audit_entries(limit=20, action="slurm.resume")]
        assert ("node-01", "ok") in resumes


async def test_node_detail_shows_the_job_on_each_gpu(lab: Lab, slurm: SlurmLab, tmp_path: Path) -> None:
    services = services_for(lab, slurm, tmp_path)
    job = slurm.sbatch("-w", "node-02", "--gres=gpu:2", "-J", "eval", script="sleep 60")
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(120, 40)) as pilot:
        await job_running(pilot, slurm, job)
        await refresh(await fleet_ready(app, pilot), pilot)  # node detail reads this snapshot
        app.screen.open_node("node-02")  # type: ignore[attr-defined]
        await wait_until(pilot, lambda: isinstance(app.screen, NodeDetailScreen))
        detail = app.screen
        assert isinstance(detail, NodeDetailScreen)
        await wait_until(pilot, lambda: detail.is_mounted and bool(detail.query("#node-slurm")))
        slurm_line = detail.query_one("#node-slurm", Static)
        await wait_until(pilot, lambda: str(slurm_line.render()).startswith("Slurm"), rounds=1200, delay=0.05)
        line = str(slurm_line.render())
        assert f"job {job} " in line and "eval" in line
        held = next(j.gpus for j in detail.slurm_row.jobs if j.job_id == job)  # type: ignore[union-attr]
        assert len(held) == 2
        table = detail.query_one("#node-gpus", DataTable)
        await wait_until(pilot, lambda: table.row_count > 0, rounds=1200, delay=0.05)
        jobs = {int(str(table.get_row_at(r)[0])): str(table.get_row_at(r)[1]) for r in range(table.row_count)}
        for idx in held:
            assert job in jobs[idx].split(","), jobs
    services.db.close()


async def test_read_only_refuses_drain_and_resume(lab: Lab, slurm: SlurmLab, tmp_path: Path) -> None:
    services = services_for(lab, slurm, tmp_path, readonly=True)
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await fleet_ready(app, pilot)
        table = screen.query_one(FleetTable)
        table.focus()
        for key in ("d", "R"):
            await pilot.press(key)
            await pilot.pause(0.2)
            assert not isinstance(app.screen, DrainForm | ConfirmModal | EvidenceRefused)
        notes = [n.message for n in app._notifications]
        assert any("Read-only mode: cannot drain Slurm nodes" in m for m in notes), notes
        assert any("Read-only mode: cannot resume Slurm nodes" in m for m in notes), notes
    assert node_state(slurm, "node-01") == "idle"
    services.db.close()


async def test_drain_now_shows_the_requeue_and_refuses_a_job_that_cannot_be_requeued(
    lab: Lab, slurm: SlurmLab, tmp_path: Path
) -> None:
    services = services_for(lab, slurm, tmp_path)
    stuck = slurm.sbatch("-w", "node-02", "--gres=gpu:1", "--no-requeue", "-J", "stuck", script="sleep 60")
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="fleet")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await fleet_ready(app, pilot)
        await job_running(pilot, slurm, stuck)
        await refresh(screen, pilot)
        table = screen.query_one(FleetTable)

        async def drain_now(node: str, reason: str) -> None:
            table.move_cursor(row=table._row_order.index(node))
            table.focus()
            await pilot.press("d")
            await wait_until(pilot, lambda: isinstance(app.screen, DrainForm))
            app.screen.query_one("#drain-reason", Input).value = reason
            await pilot.click("#now")

        # A job Slurm may not requeue: drain now is refused, in one line, and nothing is drained.
        await drain_now("node-02", "psu")
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen), rounds=600, delay=0.05)
        for _ in range(10):
            if any(f"job {stuck} cannot be requeued" in n.message for n in app._notifications):
                break
            await pilot.pause(0.05)
        notes = [n.message for n in app._notifications]
        assert any(f"job {stuck} cannot be requeued" in m for m in notes), notes
        assert node_state(slurm, "node-02") in ("mixed", "allocated")
        # A job that may be requeued (on node-03): the requeue is shown with the drain, both run.
        slurm.command(["scancel", stuck])
        job = slurm.sbatch("-w", "node-03", "--gres=gpu:1", "-J", "train", script="sleep 60")
        wait_for(f"job {job} running", lambda: job_state(slurm, job) == "RUNNING")
        await refresh(screen, pilot)
        await drain_now("node-03", "psu")
        await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), rounds=600, delay=0.05)
        shown = modal_text(app)
        assert "State=DRAIN" in shown and f"scontrol requeue {job}" in shown and f"Requeues job(s) {job}" in shown
        await pilot.press("y")
        await wait_until(pilot, lambda: isinstance(app.screen, FleetScreen), rounds=600, delay=0.05)
        wait_for(f"job {job} requeued", lambda: job_state(slurm, job) in ("PENDING", "CONFIGURING", ""))
        wait_for("node-03 drained", lambda: node_state(slurm, "node-03") == "drained")
        await refresh(screen, pilot)
        await wait_until(pilot, lambda: cell(app, "node-03", "slurm") == "drained", rounds=1200, delay=0.05)
