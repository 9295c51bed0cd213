"""Transfers at 80x24 and 120x40: each job's whole id (jobs of one launch share its time part),
its node, state and progress stay on screen; a launch with a failed node; the database down said
once, in the shell's status line; how each job's bytes were proven in its detail."""

from __future__ import annotations

from typing import Any

import pytest

from tests.firsthour.screen_text import screen_lines
from tests.tui.snapshot_services import frozen_clock, launch_records, services_with_jobs
from tests.tui.test_snapshots import settle
from tui.app import LoadmasterApp

SIZES = {"80x24": (80, 24), "120x40": (120, 40)}


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_clock(monkeypatch):
        yield


async def _show(app: Any, pilot: Any, records: tuple[Any, ...]) -> None:
    await settle(pilot)


def _ids_whole(records: tuple[Any, ...], lines: list[str], size: str) -> None:
    for r in records:
        row = next((line for line in lines if r.id in line), None)
        assert row is not None, f"{r.id} not whole on screen at {size}:\n" + "\n".join(lines)
        assert r.node in row and r.state in row


async def test_every_job_id_is_whole_on_screen() -> None:
    """At 80x24, then with the terminal resized to 120x40."""
    records = launch_records(nodes=4, failed=3)
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")
    async with app.run_test(size=SIZES["80x24"]) as pilot:
        await _show(app, pilot, records)
        _ids_whole(records, screen_lines(app), "80x24")
        await pilot.resize_terminal(*SIZES["120x40"])
        await settle(pilot)
        _ids_whole(records, screen_lines(app), "120x40")


async def test_the_database_down_is_one_line_for_every_job() -> None:
    records = launch_records(nodes=16, failed=0, recorded=False)
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")
    async with app.run_test(size=SIZES["120x40"]) as pilot:
        await _show(app, pilot, records)
        text = "\n".join(screen_lines(app))
    said = [line for line in text.splitlines() if "database" in line.lower()]
    assert len(said) == 1 and "STATE DATABASE DOWN" in said[0], text


@pytest.mark.parametrize("size", list(SIZES))
def test_launch_with_a_failed_node_snapshot(snap_compare: Any, size: str) -> None:
    records = launch_records(nodes=4, failed=3)
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")

    async def before(pilot: Any) -> None:
        await _show(app, pilot, records)

    assert snap_compare(app, terminal_size=SIZES[size], run_before=before)


def _proven(records: tuple[Any, ...], results: dict[int, dict[str, Any]]) -> tuple[Any, ...]:
    """``records`` with job ``i`` succeeded under ``results[i]``."""
    import dataclasses

    return tuple(
        dataclasses.replace(r, state="succeeded", result=results[i]) if i in results else r
        for i, r in enumerate(records)
    )


async def test_the_detail_says_how_the_bytes_were_proven() -> None:
    """At 120x40, then with the terminal resized to 80x24 (each job's detail read again)."""
    from textual.widgets import Static

    from tui.widgets.transfers_table import TransfersTable

    weak = {
        "objects": 4,
        "bytes": 1_280 * 10**9,
        "verified": "size-only",
        "verification": {"size-only": 4},
        "verified_text": "verified: size-only for 4 of 4 objects (the store gives no checksum and no MD5 ETag)",
    }
    strong = {"objects": 4, "bytes": 1_280 * 10**9, "verified": "bytes", "verification": {"crc64nvme": 4}}
    records = _proven(launch_records(nodes=4, failed=3), {0: weak, 1: strong})
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")
    said: dict[tuple[str, int], str] = {}
    async with app.run_test(size=SIZES["120x40"]) as pilot:
        await settle(pilot)
        table = app.screen.query_one(TransfersTable)
        info = app.screen.query_one("#transfers-detail-info", Static)
        for size in ("120x40", "80x24"):
            if size != "120x40":
                await pilot.resize_terminal(*SIZES[size])
                await settle(pilot)
            for i in (0, 1):
                table.focus()
                table.move_cursor(row=[str(k.value) for k in table.rows].index(records[i].id))
                for _ in range(200):
                    await pilot.pause()
                    if records[i].id in str(info.render()) and "result:" in str(info.render()):
                        break
                said[size, i] = str(info.render())
    for size in ("120x40", "80x24"):
        assert "verified: size-only for 4 of 4 objects" in said[size, 0], (size, said[size, 0])
        assert "bytes proven by crc64nvme" in said[size, 1], (size, said[size, 1])
        assert "size-only" not in said[size, 1]


async def test_a_sixteen_node_launch_shows_each_whole_id() -> None:
    """Ids of a launch (``<launch>.<n>``, up to 19 characters) are whole at 80 columns, the
    column growing for them; the rows that fit show node, id and state. At 120x40, then with
    the terminal resized to 80x24."""
    import dataclasses

    from backend.jobs.records import launch_job_ids

    base = launch_records(nodes=16, failed=3)
    ids = launch_job_ids("1117-030500-c3d4", [r.node for r in base])
    records = tuple(dataclasses.replace(r, id=ids[r.node], launch="1117-030500-c3d4") for r in base)
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")
    shown = {}
    async with app.run_test(size=SIZES["120x40"]) as pilot:
        await settle(pilot)
        shown["120x40"] = screen_lines(app)
        await pilot.resize_terminal(*SIZES["80x24"])
        await settle(pilot)
        shown["80x24"] = screen_lines(app)
    for size, lines in shown.items():
        rows = [line for line in lines if line.split()[:1] and line.split()[0].startswith("gpu-a")]
        assert len(rows) >= 3, f"{size}:\n" + "\n".join(lines)
        for line in rows:
            node = line.split()[0]
            assert f" {ids[node]} " in line and ("running" in line or "failed" in line), (size, line)


@pytest.mark.parametrize("jobs", [0, 4], ids=["no-jobs", "4-jobs"])
async def test_no_column_is_cut_by_the_screen_edge(jobs: int) -> None:
    """The last column on screen is whole or not shown (the edge cut ETA to ``ET`` at 80 columns);
    the path gives way to the others and is cut in the middle, with "…". With no jobs at 80x24
    then resized to 120x40; with four at 120x40 then resized to 80x24."""
    from tests.tui.table_edges import cut_at_edge, header_on_screen
    from tui.widgets.transfers_table import TransfersTable

    records = launch_records(nodes=4, failed=3) if jobs else ()
    app = LoadmasterApp(services_with_jobs(records), theme="loadmaster-dark", mode="transfers")
    order = ("120x40", "80x24") if jobs else ("80x24", "120x40")
    async with app.run_test(size=SIZES[order[0]]) as pilot:
        await settle(pilot)
        table = app.screen.query_one(TransfersTable)
        for size in order:
            if size != order[0]:
                await pilot.resize_terminal(*SIZES[size])
                await settle(pilot)
            assert cut_at_edge(app, table) == [], size
            headers = header_on_screen(app, table)
            assert headers[:4] == ["Node", "Job", "State", "Progress"], (size, headers)
            if size == "120x40":
                assert headers[-1] == "Source -> Destination"
                routes = [str(table.get_row_at(i)[-1]) for i in range(table.row_count)]
                assert all("…" in r and " -> " in r for r in routes), routes


async def test_the_route_and_its_slurm_tag_stay_at_120_columns_beside_a_long_id() -> None:
    """Seen in CI: jobs of other launches on the same nodes, one with a 28-character id, pushed
    the route (which leads with a pull's Slurm job) off a 120-column Transfers table. Progress
    narrows first (its byte counts cut with '…'), so the route stays."""
    import dataclasses

    from tui.widgets.transfers_table import TransfersTable

    records = list(launch_records(nodes=30, failed=0))
    records[0] = dataclasses.replace(records[0], id="x" * 28, slurm_job="4242")
    app = LoadmasterApp(services_with_jobs(tuple(records)), theme="loadmaster-dark", mode="transfers")
    async with app.run_test(size=SIZES["120x40"]) as pilot:
        await _show(app, pilot, tuple(records))
        table = app.screen.query_one(TransfersTable)
        assert table.shown_columns[-1] == "what", table.shown_columns
        row = " ".join(str(c) for c in table.get_row("x" * 28))
        assert "slurm 4242 " in row and "x" * 28 in row, row
