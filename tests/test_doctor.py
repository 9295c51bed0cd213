"""``loadmaster doctor`` against the real lab nodes, and the parser of its one-command script."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

import backend
from backend import __version__
from backend.config import Node
from backend.doctor import NodeReport, check_node, doctor_command, parse_report, run_doctor
from backend.nodes.pool import NodePool
from backend.nodes.transport import LocalTransport
from lab import Lab
from tui.cli import main

REPORT_KEYS = {
    "name",
    "host",
    "transport",
    "reachable",
    "ready",
    "error",
    "problems",
    "ssh_latency_ms",
    "command_ms",
    "os",
    "kernel",
    "arch",
    "cpus",
    "mem_total_bytes",
    "mem_available_bytes",
    "python3",
    "s5cmd",
    "nvidia_smi",
    "gpu_count",
    "gpu_models",
    "driver",
    "nics",
    "scratch",
    "scratch_exists",
    "scratch_writable",
    "scratch_free_bytes",
    "scratch_total_bytes",
    "gpu_ready",
    "gpu_problems",
    "agent",
}
AGENT_KEYS = {"command", "python", "prefix", "isolated", "version", "package", "problem"}
#: Where this checkout's backend package is: the lab's agents import it.
BACKEND_DIR = os.path.dirname(os.path.abspath(backend.__file__))


async def test_ready_node_and_node_without_tools(lab: Lab) -> None:
    pool = NodePool(lab.config.nodes)
    try:
        reports = {r.name: r for r in await run_doctor(pool, ["node-01", "node-03"])}
    finally:
        await pool.close()
    ok = reports["node-01"]
    assert ok.reachable and ok.ready, ok.problems
    assert ok.problems == () and ok.gpu_problems == () and ok.gpu_ready
    assert ok.gpu_count == 8
    assert ok.gpu_models == ("NVIDIA H100 80GB HBM3",)
    assert ok.driver == "550.54.15"
    assert ok.s5cmd and ok.s5cmd.startswith("v")
    assert ok.python3 and ok.python3[0].isdigit()
    assert ok.cpus and ok.cpus >= 1
    assert ok.mem_total_bytes and ok.mem_available_bytes and ok.mem_available_bytes <= ok.mem_total_bytes
    assert ok.kernel and ok.os and ok.arch
    assert "lo" in {n.name for n in ok.nics}
    assert ok.scratch == lab.config.node("node-01").scratch
    assert ok.scratch_exists and ok.scratch_writable
    assert ok.scratch_free_bytes and ok.scratch_total_bytes and ok.scratch_free_bytes <= ok.scratch_total_bytes
    assert ok.ssh_latency_ms is not None and ok.command_ms is not None
    # The agent: the node's own venv (the lab links it to one running this checkout), isolated.
    venv = lab.node("node-01").home / "agent" / "venv"
    assert ok.agent is not None and ok.agent.problem is None
    assert (ok.agent.python, ok.agent.prefix) == (f"{venv}/bin/python", str(venv))
    assert ok.agent.isolated and ok.agent.version == __version__
    assert ok.agent.package == BACKEND_DIR

    bare = reports["node-03"]
    assert bare.reachable and not bare.ready
    assert bare.s5cmd is None and not bare.nvidia_smi and bare.gpu_count == 0
    assert any("s5cmd not found" in p for p in bare.problems)
    # No nvidia-smi: a CPU machine, not a fault, and not what keeps it from data jobs.
    assert not bare.gpu_ready and bare.gpu_problems == ()
    assert not any("nvidia-smi" in p for p in bare.problems)
    assert bare.python3 is not None


async def test_missing_scratch_and_down_node(lab: Lab, lab_node_down) -> None:  # type: ignore[no-untyped-def]
    lab_node_down("node-02")
    nodes = [
        dataclasses.replace(lab.config.node("node-04"), scratch="/nonexistent/lm-scratch"),
        lab.config.node("node-02"),
    ]
    pool = NodePool(nodes)
    try:
        r4, r2 = await run_doctor(pool)
    finally:
        await pool.close()
    assert r4.reachable and not r4.ready and not r4.scratch_exists
    assert r4.problems == (
        "scratch directory /nonexistent/lm-scratch does not exist: create it on the node "
        "(mkdir -p /nonexistent/lm-scratch) or set 'scratch' for this node",
    )
    assert not r2.reachable and not r2.ready
    assert r2.error and "connection refused" in r2.error
    assert r2.as_dict().keys() == REPORT_KEYS


async def test_local_node(tmp_path: Path) -> None:
    t = LocalTransport(Node(name="here", host="localhost", transport="local", scratch=str(tmp_path)))
    r = await check_node(t)
    assert r.reachable and r.transport == "local" and r.ssh_latency_ms is None
    assert r.scratch_exists and r.scratch_writable and r.python3
    # This machine: the console's own interpreter runs the agent, isolated.
    assert r.agent is not None and r.agent.problem is None and r.agent.isolated
    assert (r.agent.python, r.agent.prefix) == (sys.executable, sys.prefix)


def test_cli_doctor_exit_codes_and_text(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(lab.config_path)
    assert main(["--config", cfg, "doctor", "--nodes", "node-01"]) == 0
    out = capsys.readouterr().out
    assert "node-01 (127.0.0.2)  ready" in out
    assert "8 x NVIDIA H100 80GB HBM3, driver 550.54.15" in out
    venv = lab.node("node-01").home / "agent" / "venv"
    assert f"  agent     loadmaster {__version__}, {venv}/bin/python -I, venv {venv}\n" in out
    assert "1 of 1 node(s) ready" in out
    assert main(["--config", cfg, "doctor"]) == 1
    out = capsys.readouterr().out
    assert "node-03 (127.0.0.4)  NOT READY" in out
    assert "problem   s5cmd not found on PATH" in out
    assert "3 of 4 node(s) ready" in out


def test_cli_doctor_node_down_json(lab: Lab, lab_node_down, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    lab_node_down("node-02")
    rc = main(["--config", str(lab.config_path), "doctor", "--json", "--nodes", "node-0[1-2]"])
    assert rc == 1
    data = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in data] == ["node-01", "node-02"]
    for d in data:
        assert set(d) == REPORT_KEYS
    assert set(data[0]["agent"]) == AGENT_KEYS and data[0]["agent"]["isolated"] is True
    assert data[1]["agent"] is None  # unreachable: not asked
    up, down = data
    assert up["ready"] is True and up["gpu_count"] == 8 and isinstance(up["nics"], list)
    assert set(up["nics"][0]) == {"name", "speed_mbps", "state"}
    assert down["reachable"] is False and down["ready"] is False
    assert "connection refused" in down["error"]


# -- the parser, on output shapes the lab cannot produce --------------------------------------------
def canned(nvidia: str, nics: str = "eth0 25000 up\nlo - unknown", scratch: str | None = None) -> str:
    scratch = scratch or "/dev/nvme0n1 3750000000 1000000000 2750000000 27% /mnt/local-nvme\n@@writable"
    return (
        "@@lm:uname\nLinux\n5.15.0-91-generic\nx86_64\n@@lm:os\nUbuntu 22.04.3 LTS\n@@lm:cpus\n96\n"
        "@@lm:mem\nMemTotal:       2113895424 kB\nMemAvailable:   2000000000 kB\n"
        "@@lm:python3\n3.10.12\n@@lm:s5cmd\nv2.2.2-48f7e59\n"
        f"@@lm:nvidia\n{nvidia}\n@@lm:nics\n{nics}\n@@lm:scratch\n{scratch}\n@@lm:end\n"
    )


def test_parse_real_gpu_node_output() -> None:
    rows = "\n".join(f"{i}, NVIDIA H100 80GB HBM3, 535.129.03, 81559" for i in range(8))
    r = parse_report("gpu-01", "gpu-01", "ssh", "/mnt/local-nvme", canned(rows + "\n@@rc 0"))
    assert r.ready and r.gpu_count == 8 and r.driver == "535.129.03"
    assert r.cpus == 96 and r.mem_total_bytes == 2113895424 * 1024
    assert r.nics[0].name == "eth0" and r.nics[0].speed_mbps == 25000 and r.nics[1].speed_mbps is None
    assert r.scratch_free_bytes == 2750000000 * 1024 and r.scratch_total_bytes == 3750000000 * 1024
    assert r.os == "Ubuntu 22.04.3 LTS" and r.kernel == "5.15.0-91-generic"


def test_parse_driver_trouble() -> None:
    r = parse_report("g", "g", "ssh", "/s", canned("No devices were found\n@@rc 6"))
    # Ready for data jobs (tools and scratch are fine), but a GPU fault.
    assert r.ready and not r.gpu_ready and r.nvidia_smi and r.gpu_count == 0
    assert r.problems == ()
    assert r.gpu_problems == ("nvidia-smi found no usable GPU: No devices were found",)
    hung = parse_report("g", "g", "ssh", "/s", canned("@@rc 124"))
    assert hung.gpu_problems == ("nvidia-smi did not answer within 20s (wedged driver or GPU?)",)
    cut = parse_report("g", "g", "ssh", "/s", canned("@@missing").replace("@@lm:end\n", ""))
    assert "the check script did not finish (output cut short)" in cut.problems


def test_doctor_is_one_command() -> None:
    cmd = doctor_command("/mnt/it's here", "/opt/my tools/s5cmd")
    # One shell invocation: the paths are quoted and every section is in the one script.
    assert cmd.startswith("LM_SCRATCH='/mnt/it'\"'\"'s here' LM_S5CMD='/opt/my tools/s5cmd' exec /bin/sh -c ")
    for section in ("uname", "os", "cpus", "mem", "python3", "s5cmd", "nvidia", "nics", "scratch", "end"):
        assert f"@@lm:{section}" in cmd
    assert isinstance(parse_report("n", "h", "ssh", "/s", ""), NodeReport)
