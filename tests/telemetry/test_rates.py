"""Counter deltas: wraps, resets and reboots never give negative or absurd rates."""

from __future__ import annotations

from backend.telemetry.parse import compute_rates, counter_delta, parse_block

NIC = "eth0 100000 d"
BLOCKS = "nvme0n1 d"


def netdev(rx: int, tx: int) -> str:
    return (
        f"Inter-| Receive | Transmit\n face |bytes packets|bytes packets\n"
        f"  eth0: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0"
    )


def disk(rs: int, ws: int) -> str:
    return f" 259 0 nvme0n1 100 0 {rs} 10 200 0 {ws} 20 0 30 30 0 0 0 0 0 0"


def sample(block, rx, tx, rs=0, ws=0, **kw):
    return parse_block(block(netdev=netdev(rx, tx), nic=NIC, diskstats=disk(rs, ws), block=BLOCKS, **kw))


def test_plain_rates(block):
    a = sample(block, 0, 0, 0, 0, uptime=100.0)
    b = sample(block, 1_250_000_000, 125_000_000, 2_000_000, 4_000_000, uptime=101.0)
    nics, disks = compute_rates(a, b, 1.0)
    (eth,) = nics
    assert eth.rx_gbps == 10.0 and eth.tx_gbps == 1.0
    assert eth.rx_pct == 10.0  # of 100 Gb/s
    (nvme,) = disks
    assert nvme.read_mbps == 2_000_000 * 512 / 1e6
    assert nvme.write_mbps == 4_000_000 * 512 / 1e6


def test_32bit_wrap_is_a_small_positive_delta(block):
    a = sample(block, 2**32 - 1000, 2**32 - 10)
    b = sample(block, 500, 20)
    (eth,), _ = compute_rates(a, b, 1.0)
    assert eth.rx_gbps == 1500 * 8 / 1e9
    assert eth.tx_gbps == 30 * 8 / 1e9


def test_counter_reset_gives_unknown_not_negative(block):
    # The interface was re-created: the counter restarts far below its old 64-bit value.
    a = sample(block, 9_000_000_000_000, 5_000_000_000_000, 10**9, 10**9)
    b = sample(block, 1000, 1000, 10, 10)
    (eth,), (nvme,) = compute_rates(a, b, 1.0)
    assert eth.rx_gbps is None and eth.tx_gbps is None
    assert nvme.read_mbps is None and nvme.write_mbps is None


def test_reboot_changes_boot_id(block):
    a = sample(block, 1000, 1000, boot="boot-a")
    b = sample(block, 2_000_000, 2_000_000, boot="boot-b")  # counters grew, but from zero
    (eth,), (nvme,) = compute_rates(a, b, 1.0)
    assert eth.rx_gbps is None and nvme.write_mbps is None


def test_absurd_jump_beyond_line_rate_is_dropped(block):
    a = sample(block, 0, 0)
    b = sample(block, 10**13, 0)  # 80 Tb in one second on a 100 Gb/s NIC
    (eth,), _ = compute_rates(a, b, 1.0)
    assert eth.rx_gbps is None and eth.tx_gbps == 0.0


def test_first_sample_and_bad_interval(block):
    b = sample(block, 10, 10)
    (eth,), (nvme,) = compute_rates(None, b, None)
    assert eth.rx_gbps is None and nvme.write_mbps is None
    (eth,), _ = compute_rates(b, b, 0.0)
    assert eth.rx_gbps is None


def test_counter_delta_rules():
    assert counter_delta(10, 20, 100) == 10
    assert counter_delta(10, 200, 100) is None
    assert counter_delta(2**32 - 5, 5, 100) == 10
    assert counter_delta(2**40, 5, 100) is None
    assert counter_delta(2**64 - 5, 5, 100) == 10


def test_hub_uses_node_uptime_for_interval(h100_block):
    from backend.config import Node
    from backend.telemetry.hub import TelemetryHub
    from backend.telemetry.synthetic import SyntheticPool

    hub = TelemetryHub(SyntheticPool([Node(name="n", host="h")]), feed_only=True)
    hub.ingest("n", h100_block(uptime=100.0, netdev=netdev(0, 0), nic=NIC), t=5.0)
    # Arrived 3 s later (network hiccup) but the node sampled 1 s later: the rate uses 1 s.
    snap = hub.ingest("n", h100_block(uptime=101.0, netdev=netdev(125_000_000, 0), nic=NIC), t=8.0)
    assert snap.rx_gbps == 1.0
    assert snap.rx_pct == 1.0
