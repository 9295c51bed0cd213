"""Telemetry test helpers: recorded real-format samples and block assembly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def read(name: str) -> str:
    return (DATA / name).read_text()


def make_block(
    *,
    gpu: str | None = None,
    gpu_rc: str = "0",
    netdev: str | None = None,
    nic: str | None = None,
    diskstats: str | None = None,
    block: str | None = None,
    df: str | None = None,
    df_rc: str = "0",
    uptime: float | None = 1000.0,
    boot: str | None = "b0a7c1d2-0000-4000-8000-000000000001",
) -> str:
    """A sampler block as the node's sh loop prints it (sections in the script's order)."""
    out: list[str] = []
    if uptime is not None:
        out.append(f"@@uptime {uptime:.2f} 2000.00")
    if boot is not None:
        out.append(f"@@boot {boot}")
    if gpu is not None:
        out += ["@@gpu", gpu.rstrip("\n"), f"@@gpu-rc {gpu_rc}"]
    if netdev is not None:
        out += ["@@netdev", netdev.rstrip("\n")]
    if nic is not None:
        out += ["@@nic", nic.rstrip("\n")]
    if diskstats is not None:
        out += ["@@diskstats", diskstats.rstrip("\n")]
    if block is not None:
        out += ["@@block", block.rstrip("\n")]
    if df is not None:
        out += ["@@df", df.rstrip("\n"), f"@@df-rc {df_rc}"]
    return "\n".join(out)


@pytest.fixture
def recorded() -> Callable[[str], str]:
    """``recorded("h100_8x.csv")``: the text of a recorded sample in tests/telemetry/data."""
    return read


@pytest.fixture
def block() -> Callable[..., str]:
    """``block(gpu=..., netdev=..., ...)``: assemble a sampler block."""
    return make_block


def full_block(**overrides: object) -> str:
    """A complete block of the recorded 8x H100 node."""
    parts: dict[str, object] = {
        "gpu": read("h100_8x.csv"),
        "netdev": read("proc_net_dev.txt"),
        "nic": read("nic_info.txt"),
        "diskstats": read("diskstats.txt"),
        "block": read("block.txt"),
        "df": read("df.txt"),
    }
    parts.update(overrides)
    return make_block(**parts)  # type: ignore[arg-type]


@pytest.fixture
def h100_block() -> Callable[..., str]:
    """``h100_block(uptime=..., netdev=...)``: the recorded 8x H100 node's block, with overrides."""
    return full_block
