"""What a node prints to the sampler is bounded and printable before it reaches ``top`` or the
console: an ``nvidia-smi`` printing 200 MB without a newline (a real stand-in on a real sshd
node's PATH) is a malformed sample, reported, at bounded memory; escape sequences never reach
the terminal; a node that ignores the sampler script and floods a block is cut off too."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.config import Node
from backend.nodes.transport import LocalTransport
from backend.telemetry.hub import TelemetryHub
from backend.telemetry.sampler import BEGIN, END, MAX_BLOCK_LINES
from backend.telemetry.settings import TelemetrySettings
from lab import Lab, LabNodeOptions

#: nvidia-smi stand-ins: 200 MB on one line; 200 MB of plausible CSV lines; escape sequences.
FLOOD_ONE_LINE = "#!/bin/sh\nhead -c 200000000 /dev/zero | tr '\\0' x\n"
FLOOD_LINES = (
    "#!/bin/sh\nyes '0, GPU-0000, NVIDIA H100 80GB HBM3, 97, 48, 70000, 81559, 71, 640.0, 700.0' | head -c 200000000\n"
)
HOSTILE_NAME = "\x1b]0;owned\x07\x1b[2J\x1b[31mNVIDIA H100\x1b[0m\u202e"
ESCAPES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")

#: Runs the CLI and reports its own peak memory on stderr (the figure the flood used to blow up).
#: VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec, so a child forked
#: from a big pytest process (torch and DeepSpeed loaded by earlier tests) reported the parent's
#: 800-900 MB as its own. VmHWM belongs to the child's own address space.
RSS_PROBE = (
    "import re, sys\nfrom tui.cli import main\nrc = main(sys.argv[1:])\n"
    "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)\n"
    "sys.stderr.write(f'\\nmaxrss_kib={hwm}\\n')\n"
    "sys.exit(rc)\n"
)
#: The command's peak RSS without a flood is ~100 MB; the unbounded reader used > 1 GB.
RSS_BOUND_KIB = 400 * 1024


@pytest.fixture(scope="module")
def flood_lab() -> Iterator[Lab]:
    """Three real sshd nodes: node-01 floods one line, node-02 floods lines, node-03 is healthy
    but names its GPUs with escape sequences."""
    root = Path(tempfile.mkdtemp(prefix="lm-flood-lab-"))
    lab = Lab(
        root,
        nodes=3,
        with_s3=False,
        first_ip=90,
        options={
            "node-01": LabNodeOptions(nvidia_smi=False),
            "node-02": LabNodeOptions(nvidia_smi=False),
            "node-03": LabNodeOptions(gpus=2, extra={"model": HOSTILE_NAME}),
        },
    ).up()
    try:
        for name, script in (("node-01", FLOOD_ONE_LINE), ("node-02", FLOOD_LINES)):
            smi = lab.node(name).bin_dir / "nvidia-smi"
            smi.write_text(script)
            smi.chmod(0o755)
        # 1 s: a loaded test machine must not make a healthy node look stale (3.5 missed samples).
        lab.write_config("\n[telemetry]\ninterval = 1\n")
        yield lab
    finally:
        lab.down()
        subprocess.run(["rm", "-rf", str(root)], check=False)


def run_cli(config: Path, *argv: str) -> tuple[subprocess.CompletedProcess[str], int]:
    env = {**os.environ, "LOADMASTER_SSH_PERSIST": "0"}
    res = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, "--config", str(config), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    rss = int(re.findall(r"maxrss_kib=(\d+)", res.stderr)[-1])
    return res, rss


def test_top_reports_the_floods_as_malformed_samples_at_bounded_memory(flood_lab: Lab) -> None:
    res, rss = run_cli(flood_lab.config_path, "top", "--once")
    assert res.returncode == 4, res.stderr
    assert "Traceback" not in res.stderr
    stderr = [ln for ln in res.stderr.splitlines() if ln.startswith("loadmaster:")]
    assert len(stderr) == 1 and stderr[0].startswith("loadmaster: could not read 2 of 3 node(s): "), res.stderr
    assert "node-01 (malformed sample: nvidia-smi printed a line over 64 KiB)" in stderr[0]
    assert "node-02 (malformed sample: nvidia-smi output was cut (too long) or did not finish)" in stderr[0]
    rows = {ln.split()[0]: ln for ln in res.stdout.splitlines()[2:] if ln.startswith("node-")}
    header = res.stdout.splitlines()[1]  # the columns are aligned under their names

    def cell(row: str, name: str, after: str) -> str:
        return row[header.index(name) : header.index(after)].strip()

    healthy = rows["node-03"]  # its row is complete
    assert (cell(healthy, "STATE", "SSH"), cell(healthy, "GPUS", "UTIL")) == ("up", "2"), healthy
    assert "malformed sample" in rows["node-01"] and "malformed sample" in rows["node-02"]
    assert max(len(ln) for ln in res.stdout.splitlines()) < 400  # nothing printed whole
    assert not ESCAPES.search(res.stdout + res.stderr)
    assert rss < RSS_BOUND_KIB, f"top --once peaked at {rss} KiB"


def test_top_json_carries_cleaned_names(flood_lab: Lab) -> None:
    res, _rss = run_cli(flood_lab.config_path, "top", "--json", "--count", "3", "--nodes", "node-03")
    assert res.returncode == 0, res.stderr
    tick = json.loads(res.stdout.splitlines()[-1])
    [node] = tick["nodes"]
    assert {g["name"] for g in node["gpus"]} == {"NVIDIA H100"}
    assert "\\u001b" not in res.stdout and "\x1b" not in res.stdout


class _HostileSampler(LocalTransport):
    """A node that ignores the sampler script it is sent and prints ``script`` instead (no real
    sampler misbehaves like this: the node plays the attacker)."""

    def __init__(self, node: Node, script: str) -> None:
        super().__init__(node)
        self.script = script

    def stream(self, command: str, *, input: str | bytes | None = None) -> Any:
        return super().stream(self.script)


class _Pool:
    def __init__(self, transport: LocalTransport) -> None:
        self.nodes = (transport.node,)
        self._t = transport

    def transport(self, name: str) -> LocalTransport:
        return self._t


async def _hub_errors(tmp_path: Path, script: str) -> str | None:
    node = Node(name="evil", host="localhost", transport="local", scratch=str(tmp_path))
    hub = TelemetryHub(_Pool(_HostileSampler(node, script)), TelemetrySettings(interval=0.2))
    await hub.start()
    try:
        for _ in range(600):
            await asyncio.sleep(0.05)
            snap = hub.snapshot().nodes[0]
            if snap.error:
                return snap.error
        return None
    finally:
        await hub.stop()


async def test_a_block_flooded_with_lines_is_dropped_and_reported(tmp_path: Path) -> None:
    script = f"while :; do echo {BEGIN}; yes '@@netdev' | head -n {MAX_BLOCK_LINES + 5000}; echo {END}; sleep 0.2; done"
    error = await _hub_errors(tmp_path, script)
    assert error == "malformed sample: more than 20,000 lines or 4 MiB in one block; dropped"


async def test_a_line_flood_outside_the_sampler_is_cut_by_the_transport(tmp_path: Path) -> None:
    # No node-side cut here: the transport's own line limit is what bounds it.
    script = (
        f"while :; do echo {BEGIN}; echo '@@gpu'; head -c 30000000 /dev/zero | tr '\\0' 7; echo; "
        f"echo '@@gpu-rc 0'; echo {END}; sleep 0.2; done"
    )
    error = await _hub_errors(tmp_path, script)
    assert error == "malformed sample: nvidia-smi printed a line over 64 KiB"


@pytest.mark.parametrize(
    "output",
    [
        "\x1b]0;owned\x07\x1b[2JNVIDIA-SMI has failed \x1b[31mbecause it could not talk\x1b[0m",
        "\x9b31mNo devices\x07 \u202eyug",
    ],
)
def test_escape_sequences_from_nvidia_smi_never_reach_the_table(
    tmp_path: Path, output: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tui.cli import main

    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s\\n' {_sh_quote(output)}\nexit 9\n")
    smi.chmod(0o755)
    (tmp_path / "scratch").mkdir()
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        f'[[nodes]]\nname = "here"\ntransport = "local"\nscratch = "{tmp_path / "scratch"}"\n\n'
        f'[telemetry]\ninterval = 0.2\nnvidia_smi = "{smi}"\n'
    )
    assert main(["--config", str(cfg), "top", "--once"]) == 0
    out = capsys.readouterr().out
    assert not ESCAPES.search(out)
    assert "NVIDIA-SMI has failed" in out or "No devices" in out


def _sh_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _strings(raw: Any) -> list[str]:
    """Every text a RawSample keeps (what can reach a screen)."""
    out = [raw.gpu_status, raw.boot_id or "", raw.scratch_error or "", *raw.malformed]
    for g in raw.gpus:
        out += [g.name, g.uuid, g.error or ""]
    out += list(raw.netdev) + list(raw.nics) + list(raw.diskstats) + list(raw.disk_physical)
    return out


_SECTIONS = [
    "@@uptime 12.5 3",
    "@@boot x",
    "@@gpu",
    "@@gpu-rc 0",
    "@@netdev",
    "@@nic",
    "@@diskstats",
    "@@block",
    "@@df",
    "@@df-rc 0",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_SECTIONS) | st.text(max_size=120), max_size=40))
def test_any_block_parses_to_printable_bounded_text(lines: list[str]) -> None:
    from backend.telemetry.parse import MESSAGE_LIMIT, parse_block

    raw = parse_block("\n".join(lines))
    for text in _strings(raw):
        assert not ESCAPES.search(text) and len(text) <= MESSAGE_LIMIT + 40


def test_a_cut_line_or_a_missing_end_marker_is_a_malformed_part() -> None:
    from backend.nodes.untrusted import CUT_LINE
    from backend.telemetry.parse import parse_block

    gpu = "0, GPU-1, NVIDIA H100, 97, 48, 70000, 81559, 71, 640.0, 700.0"
    netdev = "  eth0: 100 1 0 0 0 0 0 0 200 2 0 0 0 0 0 0"
    ok = parse_block(f"@@gpu\n{gpu}\n@@gpu-rc 0\n@@netdev\n{netdev}")
    assert ok.gpu_status == "ok" and len(ok.gpus) == 1 and not ok.malformed
    cut = parse_block(f"@@gpu\n{gpu}\n{CUT_LINE}\n@@gpu-rc 0\n@@netdev\n{netdev}")
    assert cut.gpus == () and cut.gpu_status == "malformed sample: nvidia-smi printed a line over 64 KiB"
    assert cut.netdev == {"eth0": (100, 200)}  # the rest of the sample still counts
    unended = parse_block(f"@@gpu\n{gpu}\n{gpu}\n@@netdev\n{netdev}")
    assert unended.gpus == () and unended.malformed == ("nvidia-smi output was cut (too long) or did not finish",)
    net_cut = parse_block(f"@@gpu\n{gpu}\n@@gpu-rc 0\n@@netdev\n{CUT_LINE}")
    assert net_cut.netdev == {} and net_cut.malformed == ("/proc/net/dev printed a line over 64 KiB",)
