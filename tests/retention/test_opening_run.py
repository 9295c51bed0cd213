"""The Checkpoints and Retention screens open on something useful: the last run listed with
this config, else the config's ``[ui] opening_run`` (where ``lab up`` writes its demo run); never
the bucket root as one 'incomplete' step."""

from __future__ import annotations

from pathlib import Path

from retention_helpers import DcpRun  # type: ignore[import-not-found]
from textual.widgets import Input

from backend.config import parse_config
from backend.retention.runs import opening_run, remembered_runs
from tests.helpers import settle_workers
from tui.app import LoadmasterApp
from tui.screens.checkpoints import CheckpointsScreen
from tui.screens.retention import RetentionScreen


def test_opening_run_prefers_the_last_run_then_the_configured_one(tmp_path: Path) -> None:
    node = [{"name": "here", "transport": "local"}]
    stores = {"lab": {"url": "s3://lab-1a2b"}}
    lab = parse_config(
        {"nodes": node, "stores": stores, "ui": {"opening_run": "s3://lab-1a2b/checkpoints/llama-demo"}},
        file="lab.toml",
        base=tmp_path,
    )
    assert opening_run(lab, {}) == ("s3://lab-1a2b/checkpoints/llama-demo", True)
    # A store named "lab" means nothing to the product: without the key, the store's root.
    plain = parse_config({"nodes": node, "stores": stores}, file="plain.toml", base=tmp_path)
    assert opening_run(plain, {}) == ("s3://lab-1a2b", False)
    prefs = {"last_run": remembered_runs(lab, {}, "s3://lab-1a2b/checkpoints/other")}
    assert opening_run(lab, prefs) == ("s3://lab-1a2b/checkpoints/other", True)
    other = parse_config(
        {"nodes": node, "stores": {"ckpt": {"url": "s3://team-ckpts"}}}, file="team.toml", base=tmp_path
    )
    assert opening_run(other, prefs) == ("s3://team-ckpts", False)  # another config's run is not reused
    assert opening_run(other, {"last_run": "garbage"}) == ("s3://team-ckpts", False)


def test_a_new_sandbox_at_the_same_path_does_not_open_on_the_old_ones_run(tmp_path: Path) -> None:
    """What the screens remember is keyed by the config file and the run it opens on: lab up writes
    the same file with a new bucket, and the new lab opens on its own demo run."""
    node = [{"name": "here", "transport": "local"}]

    def sandbox(bucket: str):  # type: ignore[no-untyped-def]
        raw = {"nodes": node, "stores": {"lab": {"url": f"s3://{bucket}"}}}
        raw["ui"] = {"opening_run": f"s3://{bucket}/checkpoints/llama-demo"}
        return parse_config(raw, file=str(tmp_path / "lab.toml"), base=tmp_path)

    first, again = sandbox("lab-0ld"), sandbox("lab-new")
    assert first.source == again.source
    prefs = {"last_run": remembered_runs(first, {}, "s3://lab-0ld/checkpoints/other")}
    assert opening_run(first, prefs) == ("s3://lab-0ld/checkpoints/other", True)
    assert opening_run(again, prefs) == ("s3://lab-new/checkpoints/llama-demo", True)


async def test_a_run_listed_on_retention_is_where_checkpoints_opens(
    tmp_path: Path,
    local_services,  # type: ignore[no-untyped-def]
    dcp_run: DcpRun,
) -> None:
    root = dcp_run.copy_to(tmp_path / "run1")
    async with LoadmasterApp(local_services, mode="retention").run_test(size=(160, 50)) as pilot:
        screen = pilot.app.screen
        assert isinstance(screen, RetentionScreen)
        screen.query_one("#retention-url", Input).value = str(root)
        screen.action_reload()
        await settle_workers(pilot)
        assert screen.plan is not None
    from backend.services import Services

    again = Services(local_services.config)  # a new console: the first one closed its services
    async with LoadmasterApp(again, mode="checkpoints").run_test(size=(160, 50)) as pilot:
        screen = pilot.app.screen
        assert isinstance(screen, CheckpointsScreen)
        await settle_workers(pilot)
        assert screen.query_one("#ckpt-url", Input).value == str(root)
        assert screen.catalog is not None and len(screen.catalog.steps) == 14
