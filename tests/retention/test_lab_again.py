"""``lab down``, ``lab up``, then the console: the screens open on the new lab's bucket (what they
remember is keyed by the lab's identity, not the config path), with no error and no old jobs."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input

from backend.config import Config, load_config
from backend.retention.runs import remember_run
from backend.services import Services
from backend.ui_prefs import config_key, load_ui_prefs
from tests.helpers import settle_workers
from tui.app import LoadmasterApp
from tui.cli import main

pytestmark = [pytest.mark.lab]

OLD_JOB = "1201-235959-0ld1"


def _lab_env(root: Path, monkeypatch: pytest.MonkeyPatch) -> Config:
    for k, v in json.loads((root / "lab.json").read_text())["env"].items():
        monkeypatch.setenv(k, v)
    return load_config(str(root / "loadmaster.toml"))


def _record_a_job(config: Config) -> None:
    services = Services(config)
    try:
        node = config.nodes[0].name
        spec = {
            "id": OLD_JOB,
            "node": node,
            "kind": "pull",
            "label": "the old lab's pull",
            "params": {"src": "s3://old/x", "dest": "/tmp/x"},
            "created": time.time(),
            "launched_by": "tester",
            "launched_from": "here",
        }
        services.jobs.store.insert(spec, None)
        assert any(r.id == OLD_JOB for r in services.jobs.records())
    finally:
        services.db.close()


async def _console(config: Config) -> tuple[list[str], list[str], list[str]]:
    """The run folders Checkpoints and Retention open on, the Transfers job ids, and the errors."""
    services = Services(config)
    try:
        app = LoadmasterApp(services, mode="checkpoints")
        async with app.run_test(size=(120, 40)) as pilot:
            opened = []
            for mode, box in (("checkpoints", "#ckpt-url"), ("retention", "#retention-url"), ("transfers", "")):
                app.switch_mode(mode)
                for _ in range(5):
                    await settle_workers(pilot)
                if box:
                    opened.append(app.screen.query_one(box, Input).value)
            table = app.screen.query_one(DataTable)
            jobs = [str(k.value) for k in table.rows]
            return opened, jobs, [f"{e.title}: {e.summary}" for e in app.errors]
    finally:
        services.db.close()


def test_lab_down_then_up_opens_the_console_on_the_new_lab(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    root = tmp_path / "lab"
    assert main(["lab", "up", "--dir", str(root), "--nodes", "1", "--no-seed"]) == 0
    try:
        first = _lab_env(root, monkeypatch)
        old_run = f"{first.stores['lab'].url}/checkpoints/llama-demo"
        remember_run(first, old_run)  # what the screens do after listing a run
        _record_a_job(first)
    finally:
        assert main(["lab", "down", "--dir", str(root)]) == 0
    assert main(["lab", "up", "--dir", str(root), "--nodes", "1", "--no-seed"]) == 0
    try:
        again = _lab_env(root, monkeypatch)
        assert again.source == first.source and config_key(again) != config_key(first)  # same file, new lab
        # even had the old lab's entry survived (a lab killed, not taken down), the key differs
        remember_run(first, old_run)
        assert load_ui_prefs()["last_run"][config_key(first)] == old_run
        opened, jobs, errors = asyncio.run(_console(again))
    finally:
        assert main(["lab", "down", "--dir", str(root)]) == 0
    capsys.readouterr()
    new_bucket = again.stores["lab"].url
    assert opened and all(url.startswith(new_bucket) for url in opened), (opened, new_bucket)
    assert OLD_JOB not in jobs
    assert not errors, errors
