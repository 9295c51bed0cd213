"""The pull form's estimate: the egress decision is its first line and on screen at 80x24 and
120x40; nodes get a line each while they fit, else one summary; nothing wraps under a path."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.firsthour.screen_text import screen_lines
from tests.tui.snapshot_services import (
    frozen_clock,
    pull_preview,
    record_egress_month,
    services_with_jobs,
    snapshot_services,
)
from tests.tui.test_snapshots import settle, steady
from tui.app import LoadmasterApp
from tui.screens.transfers import PullPlanned
from tui.widgets.transfers_estimate import decision_line, estimate_lines

SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_clock(monkeypatch):
        yield


def test_the_decision_comes_first_and_many_nodes_are_summarised() -> None:
    services = snapshot_services()
    preview = pull_preview(services, nodes=16, failed=(7,), full=(3,))
    lines = estimate_lines(preview, width=76, node_lines=4)
    assert lines[0].startswith("NOT STARTABLE (2 problems) · ALLOW: ")
    assert "  16 nodes: 14 fit, 1 DO NOT FIT (gpu-a03), 1 did not answer (gpu-a07)" in lines
    assert not any(line.startswith("  gpu-a01 ") for line in lines)  # no line per node
    assert all(len(line) <= 76 for line in lines[1:] if line.startswith("  ") and "egress" not in line)
    listed = estimate_lines(preview, width=116, node_lines=16)
    assert sum(line.startswith("  gpu-a") for line in listed) == 16
    node_rows = [line for line in listed if line.startswith("  gpu-a") and "free" in line]
    assert node_rows and all(len(line) <= 116 and "…" in line or len(line) <= 116 for line in node_rows)


@pytest.mark.parametrize("action", ["allow", "warn", "confirm", "block"])
def test_every_verdict_is_named_in_capitals(action: str) -> None:
    preview = pull_preview(snapshot_services(), nodes=2)
    decision = dataclasses.replace(preview.plan.egress, action=action, message="over the month's budget")
    plan = dataclasses.replace(preview.plan, egress=decision)
    line = decision_line(dataclasses.replace(preview, plan=plan))
    assert line.startswith(f"{action.upper()}: over the month's budget")
    assert ("type a reason" in line) == (action == "confirm")


async def _show_pull(app: Any, pilot: Any, nodes: int) -> Any:
    await settle(pilot)
    await pilot.press("n")
    preview = pull_preview(app.services, nodes=nodes, failed=(7,), full=(3,))
    app.screen.post_message(PullPlanned(preview, "", preview.startable))
    await settle(pilot)
    return preview


@pytest.mark.parametrize("size", list(SIZES))
def test_pull_estimate_snapshot(snap_compare: Any, size: str) -> None:
    """The 16-node pull's estimate as the screen shows it (the snapshot), and its decision above
    the fold: the egress verdict, the node summary and the node that did not answer."""
    services = services_with_jobs(())  # no node contacted: the jobs summary never depends on timing
    record_egress_month(services)
    app = LoadmasterApp(services, theme="loadmaster-dark", mode="transfers")
    shown: list[str] = []

    async def before(pilot: Any) -> None:
        await _show_pull(app, pilot, 16)
        shown.extend(screen_lines(app))

    # steady: the pull form's focused field has a blinking cursor, drawn or not by the moment.
    same = snap_compare(app, terminal_size=SIZES[size], run_before=steady(before))
    text = "\n".join(shown)
    assert "ALLOW: datasets (aws:us-east-1)" in text, text
    assert "16 nodes: 14 fit" in text, text
    assert "gpu-a07: connection refused" in text, text
    assert same
