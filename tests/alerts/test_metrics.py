"""The /metrics export (backend.alerts.metrics): gather_metrics on a real state (SQLite file and
PostgreSQL), the exposition through prometheus_client's own HTTP server checked by promtool, the
state database down, the listen address, the Grafana dashboard, and the real Prometheus scraping
it for the month's egress dollars that ``loadmaster egress report`` prints."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.agent.kinds import KINDS
from backend.alerts.metrics import (
    METRIC_NAMES,
    MetricsError,
    MetricsHolder,
    MetricsSnapshot,
    close_metrics_server,
    families,
    gather_metrics,
    parse_listen,
    serve_metrics,
)
from backend.config import load_config
from backend.jobs.store import JobStore
from backend.ledger import Reservation
from backend.services import Services
from backend.telemetry.model import Alert, FleetSnapshot, GpuSample, NodeSnapshot
from tui.cli import main

TB = 10**12
GB = 10**9
DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "loadmaster.json"

CONFIG = """
[[nodes]]
name = "gpu-01"
transport = "local"
site = "coreweave:us-east-04"

[[nodes]]
name = "gpu-02"
transport = "local"
site = "coreweave:us-east-04"

[stores.datasets]
url = "s3://datasets/laion"
provider = "aws"
region = "us-east-1"

[stores.prod]
url = "s3://prod/x"
provider = "aws"
region = "us-east-1"
profile = "prod"

[stores.ckpt]
url = "s3://ckpt/runs"
provider = "aws"
region = "us-east-1"

[egress]
budgets = { datasets = 500 }
monthly_budget_usd = 2000
"""


def _services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str) -> Services:
    path = tmp_path / "loadmaster.toml"
    path.write_text(CONFIG + f"\n[state]\n{state}\n")
    monkeypatch.setenv("LOADMASTER_CONFIG", str(path))
    return Services(load_config())


@pytest.fixture
def services(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_url: str | None) -> Iterator[Services]:
    """Services on each state backend (a SQLite file under tmp_path, a fresh PostgreSQL database),
    with the config file that ``loadmaster`` commands in the same test read too."""
    state = f'url = "{state_url}"' if state_url else f'dir = "{tmp_path / "state"}"'
    s = _services(tmp_path, monkeypatch, state)
    yield s
    s.db.close()


def _job(store: JobStore, job_id: str, node: str, kind: str, state: str, *, age: float, **cols: Any) -> None:
    now = time.time()
    spec = {
        "id": job_id,
        "node": node,
        "kind": kind,
        "label": "",
        "params": {},
        "created": now - age,
        "launched_by": "test@here",
        "launched_from": "here",
        "state_id": store.db.state_id,
    }
    store.insert(spec, f"/jobs/{job_id}")
    store.update(job_id, state=state, started=now - age + 1, **cols)


def _progress(done: int, total: int | None, rate: float | None) -> dict[str, Any]:
    return {"t": time.time(), "bytes_done": done, "bytes_total": total, "rate_bps": rate}


def _fill(services: Services) -> None:
    """Jobs, ledger rows (a settled transfer, a running reservation) and retention audit records."""
    store = JobStore(services.db)
    _job(store, "pull-1", "gpu-01", "pull", "running", age=60, progress=_progress(5 * GB, 10 * GB, 1.25e9))
    _job(store, "up-old", "gpu-02", "upload", "running", age=600, progress=_progress(GB, None, 2e8))
    _job(store, "up-new", "gpu-02", "upload", "cancelling", age=120)
    _job(store, "pull-0", "gpu-01", "pull", "succeeded", age=3600, progress=_progress(3 * GB, 3 * GB, None))
    _job(store, "up-lost", "gpu-01", "upload", "lost", age=7200)
    guard = services.egress
    cfg = services.config
    guard.record_transfer(cfg.store("datasets"), "coreweave:us-east-04", 2 * TB, job_id="pull-0")
    guard.reserve(cfg.store("prod"), [Reservation("pull-1", "coreweave:us-east-04", TB)])
    db = services.db
    db.record_audit("retention.apply", "s3://ckpt/runs/llama", "ok", detail={"bytes_freed": 7 * GB, "planned": 3})
    db.record_audit("retention.apply", "s3://ckpt/runs/llama", "interrupted", detail={"bytes_freed": 3 * GB})
    db.record_audit("retention.apply", "s3://elsewhere/x", "failed", detail={"bytes_freed": GB})
    db.record_audit("egress.override", "datasets -> x", "allowed-over-budget", detail={"bytes_freed": 99 * GB})


def _fleet() -> FleetSnapshot:
    gpus = tuple(GpuSample(index=i, util_pct=3.0) for i in range(8))
    starved = Alert("gpu-02", (0, 1, 2), 0.0, 120, 3, 9e3, 1.0, None, "request-bound")
    cleared = Alert("gpu-01", (4,), 0.0, 60, 2, 9e3, 1.0, None, "request-bound", active=False, ended=1.0)
    nodes = (NodeSnapshot("gpu-01", state="up", gpus=gpus), NodeSnapshot("gpu-02", state="up", gpus=gpus))
    return FleetSnapshot(seq=1, t=0.0, nodes=nodes, alerts=(starved, cleared))


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Exposition text -> name -> [(labels, value)] (the simple text format prometheus_client writes)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$", line)
        assert m, line
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
    return out


# -- gathering ----------------------------------------------------------------------------------


async def test_gather_reads_jobs_egress_retention_and_starved_gpus(services: Services) -> None:
    _fill(services)
    now = time.time()
    snap = await gather_metrics(services, _fleet(), now=now)
    assert dict(snap.up) == {"state": True, "jobs": True, "egress": True, "retention": True, "telemetry": True}
    assert snap.notes == ()
    # Running jobs only (running and cancelling), with their last recorded progress.
    by_id = {f.job_id: f for f in snap.transfers or ()}
    assert set(by_id) == {"pull-1", "up-old"}
    assert (by_id["pull-1"].node, by_id["pull-1"].kind, by_id["pull-1"].rate_bps) == ("gpu-01", "pull", 1.25e9)
    assert (by_id["pull-1"].bytes_done, by_id["pull-1"].bytes_total) == (5 * GB, 10 * GB)
    assert by_id["up-old"].bytes_total is None
    jobs = {(s, k): n for s, k, n in snap.jobs or ()}
    assert jobs[("running", "pull")] == 1 and jobs[("running", "upload")] == 1
    assert jobs[("cancelling", "upload")] == 1 and jobs[("succeeded", "pull")] == 1 and jobs[("lost", "upload")] == 1
    assert jobs[("failed", "shard")] == 0 and len(jobs) == 7 * len(KINDS)  # every state x every kind, zeros too
    # The oldest running upload on gpu-02 started 599 s ago; gpu-01's upload is lost, not running.
    (backlog,) = snap.upload_backlog or ()
    assert backlog[0] == "gpu-02" and backlog[1] == pytest.approx(599, abs=2)
    # Egress: the same figures as the guard's report for this month.
    rep = services.egress.report(now=now)
    assert snap.egress_month == rep.month and snap.egress_usd == pytest.approx(rep.usd)
    routes = {(r.store, r.account, r.route, r.kind): (r.usd, r.in_flight_usd) for r in snap.egress_routes or ()}
    assert routes == {(r.store, r.account or "none", r.label, r.kind): (r.usd, r.in_flight_usd) for r in rep.routes}
    assert routes[("datasets", "aws", "datasets (aws:us-east-1) -> coreweave:us-east-04", "internet")][0] == (
        pytest.approx(1_900 * 0.09)
    )
    assert routes[("prod", "aws/prod", "prod (aws:us-east-1) -> coreweave:us-east-04", "internet")][1] == (
        pytest.approx(900 * 0.09)
    )
    budgets = {(b.scope, b.key): (b.budget_usd, b.ratio) for b in snap.egress_budgets or ()}
    assert budgets[("store", "datasets")] == (500, pytest.approx(171 / 500))
    assert budgets[("account", "aws/prod")] == (2000, pytest.approx(81 / 2000))
    # Starved GPUs: the active alert's three on gpu-02; the cleared one on gpu-01 does not count.
    assert snap.gpus_starved == (("gpu-01", 0), ("gpu-02", 3)) and snap.fleet_gpus == 16
    # Retention: bytes_freed of every retention.apply record, per configured store of the run.
    assert snap.retention_freed == (("ckpt", 10 * GB), ("other", GB))
    # Read incrementally: a new apply adds once, and a record already counted is never recounted.
    services.db.record_audit("retention.apply", "s3://ckpt/runs/gpt", "ok", detail={"bytes_freed": 2 * GB})
    again = await gather_metrics(services, None, now=now)
    assert again.retention_freed == (("ckpt", 12 * GB), ("other", GB))
    assert (await gather_metrics(services, None, now=now)).retention_freed == again.retention_freed
    assert not again.is_up("telemetry") and again.gpus_starved is None
    assert again.notes == (("telemetry", "no fleet snapshot yet"),)


async def test_jobs_the_caller_read_are_used_for_running_jobs(services: Services) -> None:
    _fill(services)
    store = JobStore(services.db)
    store.update("pull-1", progress=_progress(6 * GB, 10 * GB, 2e9))
    records = [services.jobs.get("pull-1"), services.jobs.get("pull-0")]
    snap = await gather_metrics(services, None, jobs=records)
    assert [(f.job_id, f.rate_bps, f.bytes_done) for f in snap.transfers or ()] == [("pull-1", 2e9, 6 * GB)]
    assert snap.upload_backlog == ()  # no running upload among the records given
    assert {(s, k): n for s, k, n in snap.jobs or ()}[("running", "upload")] == 1  # counts: the table


async def test_state_database_down_leaves_those_parts_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    services = _services(tmp_path, monkeypatch, f'url = "postgresql://lm@127.0.0.1:{port}/lm"')
    try:
        snap = await gather_metrics(services, _fleet())
        assert dict(snap.up) == {"state": False, "jobs": False, "egress": False, "retention": False, "telemetry": True}
        assert snap.jobs is None and snap.transfers is None and snap.egress_routes is None
        assert snap.retention_freed is None and snap.gpus_starved == (("gpu-01", 0), ("gpu-02", 3))
        parts = {p for p, _ in snap.notes}
        assert parts == {"jobs", "egress", "retention"}
        assert all("unreachable" in why and "\n" not in why for _, why in snap.notes)
        text = "".join(m.name + "\n" for m in families(snap))
        assert "loadmaster_jobs\n" not in text and "loadmaster_egress_dollars\n" not in text
        up = {s.labels["part"]: s.value for m in families(snap) if m.name == "loadmaster_up" for s in m.samples}
        assert up["state"] == 0 and up["telemetry"] == 1
    finally:
        services.db.close()


# -- exporting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("state_url", ["sqlite"], indirect=True)
async def test_served_metrics_are_what_the_snapshot_holds_and_promtool_finds_no_problem(
    services: Services,
) -> None:
    holder = MetricsHolder()
    server, thread = serve_metrics("127.0.0.1", 0, holder)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        before = _samples(_scrape(url))
        assert set(before) == {"loadmaster_info"}  # nothing gathered yet
        _fill(services)
        holder.set(await gather_metrics(services, _fleet()))
        text = _scrape(url)
        got = _samples(text)
        assert set(got) == METRIC_NAMES  # every family, and no name outside the documented set
        rate = {s[0]["job_id"]: s for s in got["loadmaster_transfer_bytes_per_second"]}
        assert rate["pull-1"] == ({"job_id": "pull-1", "node": "gpu-01", "kind": "pull"}, 1.25e9)
        assert dict((lb["job_id"], v) for lb, v in got["loadmaster_transfer_bytes_total"]) == {
            "pull-1": 5 * GB,
            "up-old": GB,
        }
        assert got["loadmaster_upload_backlog_seconds"][0][0] == {"node": "gpu-02"}
        assert ({"store": "ckpt"}, 10 * GB) in got["loadmaster_retention_freed_bytes_total"]
        assert got["loadmaster_fleet_gpus_starved"] == [({}, 3.0)]
        assert ({"part": "state"}, 1.0) in got["loadmaster_up"]
        for lb, _ in got["loadmaster_egress_dollars"]:
            assert set(lb) == {"account", "store", "route", "kind"}
        # A scrape never touches the database: with it closed, the last snapshot is still served.
        services.db.close()
        assert _samples(_scrape(url)) == got
        # promtool's lint (naming, units, counters' _total, HELP text) has nothing to say.
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
        assert res.returncode == 0 and not (res.stdout + res.stderr).strip(), res.stdout + res.stderr
    finally:
        close_metrics_server(server, thread)


def test_listen_address_and_one_line_errors() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen(":9464") == ("127.0.0.1", 9464)  # loopback unless an address is given
    assert parse_listen("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_listen("[::1]:9464") == ("::1", 9464)
    assert parse_listen("metrics.example:0") == ("metrics.example", 0)
    for bad, says in [
        ("9464", "expected HOST:PORT"),
        ("host:http", "port 'http' is not a number"),
        ("host:70000", "from 0 to 65535"),
        ("::1:9464", "in brackets"),
        ("[nope]:9464", "not an IPv6 address"),
    ]:
        with pytest.raises(MetricsError, match=says) as exc:
            parse_listen(bad)
        assert "\n" not in str(exc.value)
    holder = MetricsHolder()
    server, thread = serve_metrics("127.0.0.1", 0, holder)
    try:
        port = server.server_port
        with pytest.raises(MetricsError) as exc:
            serve_metrics("127.0.0.1", port, holder)
        msg = str(exc.value)
        assert msg.startswith(f"cannot serve metrics on 127.0.0.1:{port}: ") and "in use" in msg and "\n" not in msg
    finally:
        close_metrics_server(server, thread)
    with pytest.raises(MetricsError, match=r"on 192\.0\.2\.1:9464: that address is not on this machine"):
        serve_metrics("192.0.2.1", 9464, holder)


# -- the Grafana dashboard --------------------------------------------------------------------------

#: PromQL words that are not metric names.
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless"}
_PROMQL_WORDS |= {"offset", "inf", "nan"}


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())

    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    return [t["expr"] for p in walk(dash["panels"]) for t in p.get("targets", []) if "expr" in t]


def _metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers outside label matchers, strings, ranges
    and grouping lists, that are not functions, keywords or Grafana variables."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\w+", "", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        rest = e[m.end() :].lstrip()
        if rest.startswith("(") or m.group(0).lower() in _PROMQL_WORDS:
            continue
        names.add(m.group(0))
    return names


def test_dashboard_parses_and_queries_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["schemaVersion"] >= 39 and dash["title"] and dash["uid"]
    (var,) = dash["templating"]["list"]
    assert (var["type"], var["name"], var["query"]) == ("datasource", "datasource", "prometheus")
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"] and all(t["datasource"] == p["datasource"] and t["refId"] for t in p["targets"])
    used: set[str] = set()
    for expr in _dashboard_exprs():
        names = _metric_names(expr)
        assert names and names <= METRIC_NAMES, (expr, names - METRIC_NAMES)
        used |= names
    # Every exported family is drawn somewhere.
    assert used == METRIC_NAMES


# -- end to end: the real Prometheus scrapes the exporter ----------------------------------------------


def _grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$__range", "5m").replace("$__interval", "15s")


@pytest.mark.parametrize("state_url", ["sqlite"], indirect=True)
async def test_prometheus_scrapes_the_months_egress_dollars_of_the_report(
    services: Services, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lab.prometheus import PrometheusServer, ScrapeTarget

    _fill(services)
    holder = MetricsHolder()
    server, thread = serve_metrics("127.0.0.1", 0, holder)
    prom = PrometheusServer(tmp_path / "prom", scrape_interval=0.5)
    try:
        snap: MetricsSnapshot = await gather_metrics(services, _fleet())
        holder.set(snap)
        prom.start()
        prom.set_targets([ScrapeTarget("loadmaster", f"127.0.0.1:{server.server_port}", "console")])
        prom.wait_scraped(timeout=30)
        prom.wait_scraped(timeout=30, after=time.time())  # two scrapes in: rate() and increase() have points
        # What `loadmaster egress report` prints for the same ledger (this month).
        assert main(["egress", "report", "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        got = prom.query("loadmaster_egress_dollars")
        assert sum(v for _, v in got) == pytest.approx(rep["usd"]) and rep["usd"] > 0
        by_route = {lb["route"]: v for lb, v in got}
        assert by_route == pytest.approx({r["route"]: r["usd"] for r in rep["routes"]})
        ((_, total),) = prom.query("sum(loadmaster_egress_dollars)")
        assert total == pytest.approx(rep["usd"])
        # Every dashboard query is valid PromQL that finds series in what was scraped.
        for expr in _dashboard_exprs():
            assert prom.query(_grafana_to_promql(expr)), expr
    finally:
        prom.stop()
        close_metrics_server(server, thread)
