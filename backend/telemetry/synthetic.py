"""Synthetic sampler blocks in the exact format a node prints, for demos, tests and benchmarks.

They enter the hub through :meth:`TelemetryHub.ingest`, where real blocks do (after the
transport), so everything downstream (parsing, rates, history, alerts, rendering) is the real path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from backend.config import Node
from backend.errors import NodeUnreachable
from backend.telemetry.sampler import BEGIN, END

NETDEV_HEADER = (
    "Inter-|   Receive                                                |  Transmit\n"
    " face |bytes    packets errs drop fifo frame compressed multicast|"
    "bytes    packets errs drop fifo colls carrier compressed"
)
DF_HEADER = "Filesystem     1024-blocks      Used Available Capacity Mounted on"


def netdev_line(name: str, rx: int, tx: int) -> str:
    """One /proc/net/dev line in the kernel's layout."""
    return (
        f"{name:>6}: {rx:>12} {rx // 1500:>9}    0    0    0     0          0         0 "
        f"{tx:>12} {tx // 1500:>9}    0    0    0     0       0          0"
    )


def diskstats_line(major: int, minor: int, name: str, rsect: int, wsect: int) -> str:
    """One /proc/diskstats line (kernel 5.x+: 20 fields)."""
    return (
        f"{major:>4} {minor:>7} {name} {rsect // 8} 0 {rsect} 1200 {wsect // 8} 0 {wsect} 3400 0 2100 4600 0 0 0 0 0 0"
    )


@dataclass
class SyntheticNode:
    """A fake GPU node whose counters advance with time; :meth:`block` renders one sample."""

    name: str
    gpus: int = 8
    pattern: str = "training"  # training | starved | idle
    model: str = "NVIDIA H100 80GB HBM3"
    speed_mbps: int = 100000
    #: NIC receive while training/starved, as a fraction of line rate.
    rx_fraction: float = 0.2
    disk_write_mbps: float = 200.0
    boot_id: str = "3f1e9a52-7c1d-4e55-9a0b-1c2d3e4f5a6b"
    seed: int = 0
    _rx: int = field(default=10**9, init=False)
    _tx: int = field(default=10**8, init=False)
    _wsect: int = field(default=10**7, init=False)
    _rsect: int = field(default=10**7, init=False)
    _last_t: float | None = field(default=None, init=False)

    def gpu_csv(self, t: float) -> str:
        """nvidia-smi CSV (noheader, nounits) for time ``t``."""
        lines = []
        for i in range(self.gpus):
            w = math.sin(t * 0.7 + i * 1.3 + self.seed)
            if self.pattern == "training":
                util, mem, power = 95 + round(3 * w), 70100 + 37 * i, 640 + 30 * w
            elif self.pattern == "starved":
                util, mem, power = 20 + round(10 * w), 68500 + 29 * i, 210 + 20 * w
            else:
                util, mem, power = 0, 4, 69.5 + w
            lines.append(
                f"{i}, GPU-{self.seed:08x}-0000-4000-8000-{i:012x}, {self.model}, {util}, "
                f"{util // 2}, {mem}, 81559, {60 + round(5 * w)}, {power:.2f}, 700.00"
            )
        return "\n".join(lines)

    def block(self, t: float) -> str:
        """The lines between ``@@lm-begin`` and ``@@lm-end`` for time ``t`` (seconds)."""
        if self._last_t is not None and t > self._last_t:
            dt = t - self._last_t
            busy = self.pattern != "idle"
            rx_bps = self.speed_mbps * 1e6 * (self.rx_fraction if busy else 0.001)
            self._rx += int(rx_bps / 8 * dt)
            self._tx += int(rx_bps / 80 * dt)
            self._wsect += int(self.disk_write_mbps * 1e6 / 512 * dt)
        self._last_t = t
        gpu = self.gpu_csv(t) if self.gpus else "No devices were found"
        rc = "0" if self.gpus else "6"
        return "\n".join(
            [
                f"@@uptime {1000.0 + t:.2f} 15000.00",
                f"@@boot {self.boot_id}",
                "@@gpu",
                gpu,
                f"@@gpu-rc {rc}",
                "@@netdev",
                NETDEV_HEADER,
                netdev_line("lo", 123456, 123456),
                netdev_line("eth0", self._rx, self._tx),
                netdev_line("docker0", 0, 0),
                "@@nic",
                "docker0 -1 r",
                f"eth0 {self.speed_mbps} d",
                "lo -1 -",
                "@@diskstats",
                diskstats_line(259, 0, "nvme0n1", self._rsect, self._wsect),
                diskstats_line(259, 1, "nvme0n1p1", self._rsect, self._wsect),
                "@@block",
                "nvme0n1 d",
                "@@df",
                DF_HEADER,
                "/dev/nvme0n1p1  3750000000 1250000000 2500000000      34% /mnt/local-nvme",
                "@@df-rc 0",
            ]
        )

    def framed(self, t: float) -> str:
        """The block with its frame lines, as the stream prints it."""
        return f"{BEGIN}\n{self.block(t)}\n{END}"


class SyntheticPool:
    """A pool-shaped holder of nodes for a feed-only hub: it has no transports to give."""

    def __init__(self, nodes: tuple[Node, ...] | list[Node]) -> None:
        self.nodes = tuple(nodes)

    def transport(self, name: str) -> Any:
        """Synthetic nodes are fed through ``hub.ingest``; there is nothing to connect to."""
        raise NodeUnreachable(name, "synthetic node: samples are fed, not streamed")

    async def close(self) -> None:
        """Nothing to close."""


def synthetic_fleet(
    count: int, *, gpus: int = 8, starved: tuple[int, ...] = (), site: str = "coreweave:us-east-04"
) -> tuple[list[Node], list[SyntheticNode]]:
    """``count`` node definitions (gpu-001 ...) and their synthetic generators."""
    width = max(3, len(str(count)))
    nodes = [
        Node(name=f"gpu-{i:0{width}d}", host=f"10.0.{i // 250}.{i % 250 + 1}", site=site) for i in range(1, count + 1)
    ]
    gens = [
        SyntheticNode(n.name, gpus=gpus, seed=i, pattern="starved" if i in starved else "training")
        for i, n in enumerate(nodes, start=1)
    ]
    return nodes, gens
