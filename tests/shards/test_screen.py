"""Pilot tests of the Shards screen: the form previews before anything runs, then a conversion."""

from __future__ import annotations

import functools
import secrets
from pathlib import Path
from typing import Any

import pytest
from textual.notifications import Notify
from textual.widgets import Button, DataTable, Input, Select, Static
from textual.widgets.data_table import ColumnKey

from backend.config import default_config
from backend.services import Services
from tests.helpers import Recorder, wait_until
from tests.shards.conftest import make_dataset
from tui.app import LoadmasterApp
from tui.screens.shards import ShardsScreen

SIZE = (120, 40)
settle = functools.partial(wait_until, delay=0.01)  # conversions take real time


async def fill(pilot: Any, screen: ShardsScreen, **values: str) -> None:
    for key, value in values.items():
        screen.query_one(f"#shards-{key}", Input).value = value
    await pilot.pause()


async def test_form_previews_counts_and_get_reduction_then_converts(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=30)
    dest = tmp_path / "out"
    rec = Recorder()
    app = LoadmasterApp(Services(config=default_config()), mode="shards")
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ShardsScreen)
        start = screen.query_one("#shards-start", Button)
        assert start.disabled  # nothing to start before a preview
        await fill(pilot, screen, src=str(src), dest=str(dest), **{"shard-size": "16KB"})
        await settle(pilot, lambda: screen.preview is not None and screen.preview.dest == str(dest))
        pv = rec.of(ShardsScreen.PreviewComputed)[-1].preview
        assert (pv.samples, pv.files) == (30, 60) and pv.shards >= 2
        text = str(screen.query_one("#shards-preview", Static).render())
        assert "30 samples (60 files" in text and f"-> {pv.shards} shard(s)" in text
        assert f"GETs per epoch 60 -> {pv.shards}" in text
        assert "below the recommended 256 MB - 1 GB" in text
        assert not dest.exists()  # previewing wrote nothing
        assert not start.disabled

        await pilot.click("#shards-start")
        await settle(pilot, lambda: any(c.state != "running" for c in screen.conversions.values()))
        (conv,) = screen.conversions.values()
        assert conv.state == "succeeded", conv.detail
        assert conv.progress is not None and conv.progress.shards_done == pv.shards
        manifest_text = str(screen.query_one("#shards-manifest", Static).render())
        assert f"{pv.shards} shards, 30 samples" in manifest_text and "GETs per epoch" in manifest_text
        assert len(list(dest.glob("shard-*.tar"))) == pv.shards
        updates = rec.of(ShardsScreen.ConversionUpdated)
        assert updates[-1].conversion.state == "succeeded"
        # the conversions table has the focus and shows the whole state word; enter: the detail
        table = screen.query_one("#shards-table", DataTable)
        assert table.has_focus and str(table.get_row_at(0)[0]) == "succeeded"
        assert table.columns[ColumnKey("state")].width >= len("succeeded")
        await pilot.press("enter")
        await pilot.pause()
        from tui.widgets.detail import DetailModal

        assert isinstance(app.screen, DetailModal) and dict(app.screen.fields)["destination"] == str(dest)
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is screen
        # the same form again: the destination now holds shards, so the preview refuses it
        screen.action_preview()
        await settle(pilot, lambda: screen.preview is not None and not screen.preview.ok)
        assert "already has" in str(screen.query_one("#shards-preview", Static).render())
        assert screen.query_one("#shards-start", Button).disabled


async def test_bad_input_is_shown_and_start_stays_disabled(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=6)
    (src / "000002.json").unlink()
    app = LoadmasterApp(Services(config=default_config()), mode="shards")
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ShardsScreen)
        await fill(pilot, screen, src=str(src), dest=str(tmp_path / "o"), **{"shard-size": "lots"})
        await settle(pilot, lambda: screen.query_one("#shards-shard-size", Input).has_class("-invalid"))
        assert "expected a size like '512MB'" in str(screen.query_one("#shards-errors", Static).render())
        await fill(pilot, screen, **{"shard-size": "16KB"})
        await settle(pilot, lambda: screen.preview is not None)
        assert not screen.preview.ok
        text = str(screen.query_one("#shards-preview", Static).render())
        assert "1 sample(s) lack a partner file" in text and "000002 (missing json)" in text
        assert screen.query_one("#shards-start", Button).disabled


async def test_read_only_console_refuses_to_start(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_dataset(src, n=4)
    rec = Recorder()
    app = LoadmasterApp(Services(config=default_config(), readonly=True), mode="shards")
    async with app.run_test(size=SIZE, message_hook=rec) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ShardsScreen)
        await fill(pilot, screen, src=str(src), dest=str(tmp_path / "o"), **{"shard-size": "16KB"})
        await settle(pilot, lambda: screen.preview is not None)
        screen.action_start()
        await pilot.pause()
        notes = [n.notification.message for n in rec.of(Notify)]
        assert any("cannot start a conversion" in m for m in notes)
        assert not screen.conversions and not (tmp_path / "o").exists()


@pytest.mark.lab
async def test_a_node_job_started_from_the_form_is_followed_to_its_manifest(lab: Any, s3: Any, tmp_path: Path) -> None:
    """A node-local source cannot be previewed here but starts on the node; JobManager.wait follows it."""
    from backend.config import load_config_file
    from tests.helpers import write_lab_config

    config = load_config_file(write_lab_config(lab, tmp_path / "loadmaster.toml", tmp_path / "state"))
    src = lab.node("node-02").scratch / f"raw-{secrets.token_hex(3)}"
    make_dataset(src, n=20)
    dest = f"s3://{lab.bucket}/screen-shards-{secrets.token_hex(3)}"
    services = Services(config=config)
    app = LoadmasterApp(services, mode="shards")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, ShardsScreen)
            screen.query_one("#shards-node", Select).value = "node-02"
            await fill(pilot, screen, src=str(src), dest=dest, **{"shard-size": "8KB"})
            start = screen.query_one("#shards-start", Button)
            await settle(pilot, lambda: not start.disabled)
            assert "is read on node-02" in str(screen.query_one("#shards-errors", Static).render())
            await pilot.click("#shards-start")
            await wait_until(
                pilot, lambda: any(c.state != "running" for c in screen.conversions.values()), rounds=1800, delay=0.1
            )
            (conv,) = screen.conversions.values()
            assert conv.state == "succeeded", conv.detail
            assert conv.job_id and conv.where == "node-02" and conv.detail == f"job {conv.job_id}"
            assert conv.progress is not None and conv.progress.samples_done == 20
            assert conv.progress.shards_done == conv.progress.shards_total > 1
            manifest_text = str(screen.query_one("#shards-manifest", Static).render())
            assert f"{conv.progress.shards_total:,} shards, 20 samples" in manifest_text
            assert "GETs per epoch 40 ->" in manifest_text
    finally:
        await services.aclose()
