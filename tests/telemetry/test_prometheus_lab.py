"""The real parts the Prometheus telemetry source is tested against: the dcgm-exporter stand-in,
the real node_exporter and Prometheus scraping them (``prom_lab``), the benchmark's 1,024-node
backfill (``bench/prometheus_backfill.py``; here 32 nodes), and ``lab up --prometheus``."""

from __future__ import annotations

import json
import re
import subprocess
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.telemetry.settings import TelemetrySettings
from bench.prometheus_backfill import backfill, default_profiling
from lab import Lab, fake_nvidia_smi
from lab.dcgm_exporter import (
    DEFAULT_FIELDS,
    DcgmNode,
    render,
    xid_message,
)
from lab.prometheus import (
    NodeExporter,
    PrometheusNotInstalled,
    PrometheusServer,
    TelemetryStack,
    find_promtool,
)
from tui.cli import main

pytestmark = [pytest.mark.lab]

GPU_NODES = ("node-01", "node-02", "node-04")  # the session lab's nodes with GPUs (node-03 has none)
ALL_NODES = ("node-01", "node-02", "node-03", "node-04")
#: dcgm-exporter's label order (render_metrics.go gpuMetricsFormat, no MIG, default counters).
DCGM_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)(?: (\S+))?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


@dataclass
class Family:
    help: str
    type: str = ""
    #: (labels in their order, value) per sample
    samples: list[tuple[list[tuple[str, str]], float]] = field(default_factory=list)

    def values(self) -> list[float]:
        return [v for _, v in self.samples]

    def label(self, name: str) -> list[str]:
        return [dict(p)[name] for p, _ in self.samples]


def parse_exposition(text: str) -> dict[str, Family]:
    """The text format, strictly: HELP then TYPE then the family's samples, labels well formed.
    (prometheus-client is not a dependency; Prometheus itself parses it in the scrape tests.)"""
    families: dict[str, Family] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert name not in families, f"HELP twice: {line}"
            families[name] = Family(help_text)
        elif line.startswith("# TYPE "):
            name, _, mtype = line[7:].partition(" ")
            assert name in families and not families[name].type, f"TYPE before HELP or twice: {line}"
            families[name].type = mtype
        else:
            m = _SAMPLE.match(line)
            assert m, f"not a sample line: {line!r}"
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            pairs = _LABEL.findall(labels)
            assert ",".join(f'{k}="{v}"' for k, v in pairs) == labels, f"bad labels: {labels!r}"
            assert name == list(families)[-1], f"sample outside its family: {line!r}"
            families[name].samples.append((pairs, float(value)))
    return families


def series(stack: TelemetryStack, expr: str) -> list[tuple[dict[str, str], float]]:
    return stack.prometheus.query(expr)


def by_node(result: list[tuple[dict[str, str], float]], label: str = "instance") -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for labels, value in result:
        out.setdefault(labels[label], []).append(value)
    return out


# -- the stand-in's /metrics ---------------------------------------------------------------------------


def test_stand_in_metrics_are_dcgm_exporters_names_types_and_labels(prom_lab: TelemetryStack) -> None:
    assert prom_lab.dcgm is not None
    text = prom_lab.dcgm.metrics("node-01")
    families = parse_exposition(text)
    # every default counter (the CSV's gauge/counter lines), in field-id order, HELP and TYPE as the CSV
    expected = [f for f in DEFAULT_FIELDS if f.prom_type != "label"]
    assert list(families) == [f.name for f in expected]
    for f in expected:
        fam = families[f.name]
        assert (fam.help, fam.type) == (f.help, f.prom_type)
        assert len(fam.samples) == 8
        for gpu, (pairs, _value) in enumerate(fam.samples):
            extra = ["err_code", "err_msg"] if f.name == "DCGM_FI_DEV_XID_ERRORS" else []
            assert [k for k, _ in pairs] == DCGM_LABELS + extra
            labels = dict(pairs)
            assert labels["gpu"] == str(gpu) and labels["device"] == f"nvidia{gpu}"
            assert labels["Hostname"] == "node-01" and labels["modelName"] == "NVIDIA H100 80GB HBM3"
            assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", labels["pci_bus_id"])
    # the same GPUs (UUIDs, driver) as the node's stand-in nvidia-smi shows over SSH
    sc = fake_nvidia_smi.load_scenario(str(prom_lab.scenario("node-01")))
    uuids = re.findall(r"UUID: (GPU-[0-9a-f-]+)\)", fake_nvidia_smi.listing(sc, 0))
    util = families["DCGM_FI_DEV_GPU_UTIL"]
    assert util.label("UUID") == uuids
    assert set(util.label("DCGM_FI_DRIVER_VERSION")) == {sc["driver"]}
    # doubles are printed with Go's %f, integers as integers
    assert re.search(r"^DCGM_FI_DEV_POWER_USAGE\{.*\} \d+\.\d{6}$", text, re.M)
    assert re.search(r"^DCGM_FI_DEV_GPU_UTIL\{.*\} \d+$", text, re.M)
    assert re.search(r'err_code="0",err_msg="No Error"\} 0$', text, re.M)


def test_promtool_parses_the_stand_ins_text_with_only_dcgm_exporters_own_lint(prom_lab: TelemetryStack) -> None:
    """Prometheus's own parser (promtool check metrics): no parse error; the lint it prints is what
    the real dcgm-exporter draws too (camelCase labels, counters without _total)."""
    assert prom_lab.dcgm is not None
    proc = subprocess.run(
        [find_promtool(), "check", "metrics"],
        input=prom_lab.dcgm.metrics("node-02"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode in (0, 3), proc.stderr  # 3: lint findings only
    allowed = re.compile(
        r"^DCGM_FI_\w+ (label names should be written in 'snake_case' not 'camelCase'"
        r'|counter metrics should have "_total" suffix'
        r"|metric name should not include type 'counter')$"
    )
    findings = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert findings and all(allowed.match(ln) for ln in findings), findings


def test_values_follow_the_nvidia_smi_stand_ins_shapes() -> None:
    """At one scenario time, dcgm's utilisation and memory are nvidia-smi's numbers; profiling
    fields go when the GPU has none; an Xid and a lost GPU are reported as dcgm-exporter does."""
    fields = ["utilization.gpu", "memory.used", "memory.free", "temperature.gpu", "power.draw"]
    base = {**fake_nvidia_smi.DEFAULTS, "start": 0.0}
    for pattern in ("training", "starved", "idle"):
        sc = {**base, "pattern": pattern}
        csv = fake_nvidia_smi.query(sc, fields, {"csv", "noheader", "nounits"}, 7.0)
        smi = [row.split(", ") for row in csv.splitlines()]
        fam = parse_exposition(render(DcgmNode("n1", ""), sc, 7.0, xids={2: 48}))
        for name, col in (
            ("DCGM_FI_DEV_GPU_UTIL", 0),
            ("DCGM_FI_DEV_FB_USED", 1),
            ("DCGM_FI_DEV_FB_FREE", 2),
            ("DCGM_FI_DEV_GPU_TEMP", 3),
            ("DCGM_FI_DEV_POWER_USAGE", 4),
        ):
            assert fam[name].values() == [float(r[col]) for r in smi], (pattern, name)
        util, gr = fam["DCGM_FI_DEV_GPU_UTIL"].values(), fam["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].values()
        assert all(abs(g - u / 100) < 0.05 for g, u in zip(gr, util, strict=True))
        xid = fam["DCGM_FI_DEV_XID_ERRORS"]
        assert xid.values() == [0, 0, 48, 0, 0, 0, 0, 0]
        assert xid.label("err_msg")[2] == "Double Bit ECC Error" == xid_message(48)
    no_prof = render(DcgmNode("n1", "", profiling=False), base, 1.0)
    assert "DCGM_FI_DEV_GPU_UTIL" in no_prof and "DCGM_FI_PROF_" not in no_prof
    fam = parse_exposition(render(DcgmNode("n1", ""), {**base, "lost_gpu": 3, "lost_after": 0.0}, 1.0))
    assert fam["DCGM_FI_DEV_GPU_UTIL"].label("gpu") == ["0", "1", "2", "4", "5", "6", "7"]
    xid = fam["DCGM_FI_DEV_XID_ERRORS"]
    assert dict(zip(xid.label("gpu"), xid.values(), strict=True))["3"] == 79
    assert "DCGM_FI_DEV_POWER_USAGE" not in render(DcgmNode("n1", ""), {**base, "power": "not_supported"}, 1.0)
    newer = render(DcgmNode("n1", "", hostname_label="hostname"), base, 1.0)
    assert 'hostname="n1"' in newer and "Hostname=" not in newer


# -- Prometheus scraping the lab -------------------------------------------------------------------------


def test_prometheus_scrapes_every_node_exporter_and_stand_in(prom_lab: TelemetryStack) -> None:
    targets = prom_lab.prometheus.targets()
    got = sorted((t.job, t.node, t.instance, t.health) for t in targets)
    want = sorted([("node", n, n, "up") for n in ALL_NODES] + [("dcgm", n, n, "up") for n in GPU_NODES])
    assert got == want
    for t in targets:
        ip = prom_lab.nodes[t.node].ip
        assert t.scrape_url.startswith(f"http://{ip}:") and t.scrape_url.endswith("/metrics")
    up = series(prom_lab, "up")
    assert sorted((lab["job"], lab["instance"], v) for lab, v in up) == sorted((j, n, 1.0) for j, n, _, _ in want)


def test_instant_queries_answer_per_node(prom_lab: TelemetryStack) -> None:
    util = series(prom_lab, "DCGM_FI_DEV_GPU_UTIL")
    assert {lab["Hostname"] for lab, _ in util} == set(GPU_NODES)
    assert all(lab["Hostname"] == lab["instance"] == lab["node"] for lab, _ in util)
    per = by_node(util, "Hostname")
    assert all(len(v) == 8 for v in per.values())
    assert min(per["node-01"]) >= 85 and max(per["node-02"]) <= 40  # training vs starved
    fb = by_node(series(prom_lab, "DCGM_FI_DEV_FB_USED"), "Hostname")
    assert min(fb["node-02"]) > 60000  # starved: the memory is still held
    # rate() over node_exporter's counters, for every node (two scrapes within the window)
    deadline = time.monotonic() + 15
    while True:
        rx = series(prom_lab, "rate(node_network_receive_bytes_total[30s])")
        if {lab["instance"] for lab, _ in rx} == set(ALL_NODES) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert {lab["instance"] for lab, _ in rx} == set(ALL_NODES)
    assert all(v >= 0 for _, v in rx) and all("device" in lab for lab, _ in rx)
    fs = series(prom_lab, "node_filesystem_size_bytes")
    assert {lab["instance"] for lab, _ in fs} == set(ALL_NODES)


def test_profiling_field_is_there_only_where_the_gpu_has_it(prom_lab: TelemetryStack) -> None:
    assert set(by_node(series(prom_lab, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"))) == set(GPU_NODES)
    prom_lab.set_profiling("node-04", False)
    prom_lab.wait_scraped()
    gr = by_node(series(prom_lab, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"))
    assert set(gr) == {"node-01", "node-02"}  # gone at once: Prometheus marks the vanished series stale
    assert all(0 <= v <= 1 for v in gr["node-01"] + gr["node-02"])
    assert len(by_node(series(prom_lab, "DCGM_FI_DEV_GPU_UTIL"))["node-04"]) == 8


def test_a_pattern_set_at_runtime_is_what_prometheus_sees(prom_lab: TelemetryStack) -> None:
    prom_lab.set_pattern("node-01", "starved")
    prom_lab.wait_scraped()
    util = by_node(series(prom_lab, 'DCGM_FI_DEV_GPU_UTIL{instance="node-01"}'))["node-01"]
    assert len(util) == 8 and max(util) <= 40
    prom_lab.set_pattern("node-01", "idle")
    prom_lab.wait_scraped()
    assert by_node(series(prom_lab, 'DCGM_FI_DEV_GPU_UTIL{instance="node-01"}'))["node-01"] == [0.0] * 8


def test_an_injected_xid_is_in_dcgm_fi_dev_xid_errors(prom_lab: TelemetryStack) -> None:
    assert series(prom_lab, "DCGM_FI_DEV_XID_ERRORS != 0") == []
    prom_lab.inject_xid("node-02", 5, 79)
    prom_lab.inject_xid("node-04", 0, 48)
    prom_lab.wait_scraped()
    hits = sorted(
        (lab["Hostname"], lab["gpu"], lab["err_code"], lab["err_msg"], v)
        for lab, v in series(prom_lab, "DCGM_FI_DEV_XID_ERRORS != 0")
    )
    assert hits == [
        ("node-02", "5", "79", "GPU has fallen off the bus", 79.0),
        ("node-04", "0", "48", "Double Bit ECC Error", 48.0),
    ]


def test_a_stopped_target_is_down_with_its_scrape_error(prom_lab: TelemetryStack) -> None:
    prom_lab.stop_target("node-04")
    targets = prom_lab.wait_down("node-04", timeout=15)
    mine = [t for t in targets if t.node == "node-04"]
    assert sorted(t.job for t in mine) == ["dcgm", "node"]
    for t in mine:
        assert t.health == "down" and "connection refused" in t.last_error, t
    assert all(t.health == "up" for t in targets if t.node != "node-04")
    down = {(lab["job"], v) for lab, v in series(prom_lab, 'up{instance="node-04"}')}
    assert down == {("node", 0.0), ("dcgm", 0.0)}
    prom_lab.start_target("node-04")
    back = prom_lab.wait_scraped(timeout=15)
    assert all(t.health == "up" for t in back)


# -- the backfill ---------------------------------------------------------------------------------------


def test_backfill_answers_instant_queries_at_now_for_every_node(tmp_path: Path, prom_lab: TelemetryStack) -> None:
    bf = backfill(tmp_path / "bf", nodes=32, gpus=8, history=60, ahead=120, step=10, xids={"node-0007": {3: 79}})
    try:
        assert bf.prometheus is not None and bf.series > 32 * 8 * 6
        assert bf.start < time.time() < bf.end
        prom = bf.prometheus
        names = set(bf.names)
        util = prom.query("DCGM_FI_DEV_GPU_UTIL")
        assert {lab["Hostname"] for lab, _ in util} == names and len(util) == 32 * 8
        rx = prom.query("sum by (instance) (rate(node_network_receive_bytes_total[1m]))")
        assert {lab["instance"] for lab, _ in rx} == names
        assert all(v > 0 for _, v in rx)  # counters increase on every node
        gr = {lab["Hostname"] for lab, _ in prom.query("DCGM_FI_PROF_GR_ENGINE_ACTIVE")}
        assert gr == {n for i, n in enumerate(bf.names) if default_profiling(i, n)} and gr != names
        xid = [(lab["Hostname"], lab["gpu"], v) for lab, v in prom.query("DCGM_FI_DEV_XID_ERRORS != 0")]
        assert xid == [("node-0007", "3", 79.0)]
        assert len(prom.query("up == 1")) == 64
        # the same series shape as what Prometheus scrapes from the live stand-in
        live = series(prom_lab, 'DCGM_FI_DEV_GPU_UTIL{instance="node-01"}')[0][0]
        assert set(util[0][0]) == set(live)
        # and later "now"s answer too, until the backfill's end
        assert len(prom.query("DCGM_FI_DEV_FB_USED", at=time.time() + 100)) == 32 * 8
        assert prom.query("DCGM_FI_DEV_FB_USED", at=bf.end + 400) == []  # past the 5 m lookback
    finally:
        bf.stop()


# -- setup errors and the lab ------------------------------------------------------------------------------


def test_missing_binaries_name_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("lab.prometheus.BIN_DIRS", ())
    with pytest.raises(PrometheusNotInstalled, match=r"apt-get install prometheus-node-exporter$"):
        NodeExporter(tmp_path, "127.0.0.1").start()
    with pytest.raises(PrometheusNotInstalled, match=r"apt-get install prometheus \("):
        PrometheusServer(tmp_path).start()


def test_lab_without_prometheus_writes_no_telemetry_section(tmp_path: Path) -> None:
    lab = Lab(tmp_path / "lab", nodes=1, with_s3=False)
    assert lab.telemetry is None and "[telemetry]" not in lab.config_text()
    assert lab.config_text('\n[telemetry]\nstarved_window = "10s"\n').count("[telemetry]") == 1


def test_cli_lab_up_prometheus_status_and_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "lab"
    rc = main(["lab", "up", "--dir", str(root), "--nodes", "2", "--no-seed", "--prometheus"])
    info = json.loads((root / "lab.json").read_text()) if (root / "lab.json").exists() else {}
    try:
        _out, err = capsys.readouterr()
        assert rc == 0, err
        prom = info["prometheus"]
        url = prom["url"]
        assert re.search(rf"^  prometheus  {re.escape(url)} ", err, re.M), err
        telemetry = tomllib.loads((root / "loadmaster.toml").read_text())["telemetry"]
        assert telemetry["source"] == "auto" and telemetry["prometheus_url"] == url
        assert telemetry["dcgm_node_label"] == "Hostname" and telemetry["node_exporter_node_label"] == "instance"
        assert telemetry["starved_window"] == "10s"  # the sandbox's own key, in the same table
        settings = load_config_file(root / "loadmaster.toml").section(TelemetrySettings)
        assert settings.source == "auto" and settings.prometheus_url == url
        server = PrometheusServer(Path(prom["root"]) / "prometheus", int(url.rsplit(":", 1)[1]))
        targets = server.wait_scraped(4, timeout=30)  # 2 node_exporters, 2 stand-ins
        assert sorted((t.job, t.instance) for t in targets) == [
            ("dcgm", "node-01"),
            ("dcgm", "node-02"),
            ("node", "node-01"),
            ("node", "node-02"),
        ]
        assert [e["address"].split(":")[0] for e in prom["node_exporters"]] == ["127.0.0.2", "127.0.0.3"]
        assert main(["lab", "status", "--dir", str(root)]) == 0
        status = capsys.readouterr().out
        assert re.search(
            rf"^prometheus {re.escape(url)} up  node_exporter 2/2 up, dcgm-exporter stand-in \(2 nodes\) up$",
            status,
            re.M,
        ), status
    finally:
        assert main(["lab", "down", "--dir", str(root)]) == 0
    pids = [prom["pid"], prom["dcgm"]["pid"], *[e["pid"] for e in prom["node_exporters"]]]
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
