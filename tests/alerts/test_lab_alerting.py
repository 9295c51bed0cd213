"""``loadmaster lab up --alerting``: the real Alertmanager, a ``loadmaster watch`` sending to it, and
(with ``--prometheus``) Prometheus scraping the watcher's /metrics; ``lab down`` stops them all."""

from __future__ import annotations

import json
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from lab.prometheus import PrometheusServer
from tui.cli import main


def _gone(pid: int) -> bool:
    p = Path(f"/proc/{pid}/stat")
    return not p.exists() or p.read_text().split()[2] == "Z"


def test_lab_up_alerting_starts_alertmanager_and_a_watcher(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "lab"
    rc = main(["lab", "up", "--dir", str(root), "--nodes", "2", "--no-seed", "--alerting", "--prometheus"])
    info = json.loads((root / "lab.json").read_text()) if (root / "lab.json").exists() else {}
    try:
        _out, err = capsys.readouterr()
        assert rc == 0, err
        am = info["alerting"]["alertmanager"]
        watch = info["alerting"]["watch"]
        assert f"  alerts  Alertmanager {am['url']}" in err
        alerts = tomllib.loads((root / "loadmaster.toml").read_text())["alerts"]
        assert alerts == {"alertmanager_url": am["url"]}
        with urllib.request.urlopen(f"{am['url']}/api/v2/status", timeout=10) as resp:
            assert json.loads(resp.read())["cluster"]["status"] == "disabled"  # no gossip on a laptop
        prom = info["prometheus"]
        server = PrometheusServer(Path(prom["root"]) / "prometheus", int(prom["url"].rsplit(":", 1)[1]))
        deadline = time.monotonic() + 60
        got: list[object] = []
        while time.monotonic() < deadline:
            got = server.api("/api/v1/query", {"query": 'loadmaster_info{job="loadmaster"}'})["result"]
            if got:
                break
            time.sleep(0.1)
        assert got, f"Prometheus never scraped the watcher:\n{(root / 'watch.log').read_text()[-2000:]}"
        log = (root / "watch.log").read_text()
        assert f"serving metrics on http://{watch['metrics']}/metrics" in log and "Traceback" not in log
    finally:
        assert main(["lab", "down", "--dir", str(root)]) == 0
    for pid in (am["pid"], watch["pid"], prom["pid"]):
        deadline = time.monotonic() + 10
        while not _gone(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(pid), f"pid {pid} outlived lab down"
