"""Pure parser tests against recorded samples in NVIDIA's and the kernel's documented formats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.telemetry.model import NO_GPU
from backend.telemetry.parse import (
    classify_nic,
    parse_block,
    parse_df,
    parse_diskstats,
    parse_gpu_csv,
    parse_netdev,
    parse_nic_info,
    split_sections,
)


def test_eight_h100(recorded):
    gpus, status = parse_gpu_csv(recorded("h100_8x.csv"))
    assert status == "ok"
    assert [g.index for g in gpus] == list(range(8))
    g0 = gpus[0]
    assert g0.name == "NVIDIA H100 80GB HBM3"
    assert g0.uuid == "GPU-2b7f3c4a-9d1e-4c2b-8a6f-0e1d2c3b4a50"
    assert (g0.util_pct, g0.mem_util_pct, g0.mem_used_mib, g0.mem_total_mib) == (97, 41, 71234, 81559)
    assert (g0.temp_c, g0.power_w, g0.power_limit_w) == (63, 652.31, 700.0)
    assert not any(g.lost for g in gpus)


def test_power_not_supported_and_na(recorded):
    gpus, status = parse_gpu_csv(recorded("power_not_supported.csv"))
    assert status == "ok"
    assert [g.power_w for g in gpus] == [None, None]
    assert [g.power_limit_w for g in gpus] == [None, None]
    assert gpus[0].util_pct == 88
    assert gpus[1].util_pct is None and gpus[1].mem_used_mib == 20087


def test_gpu_lost_mid_stream(recorded):
    gpus, status = parse_gpu_csv(recorded("gpu_lost.csv"), "15")
    assert status == "ok"
    assert [(g.index, g.lost) for g in gpus] == [(0, False), (1, False), (2, True), (3, False), (4, True)]
    assert gpus[2].uuid == "0000:3A:00.0"  # the bus id from the handle error
    assert gpus[2].util_pct is None and gpus[4].mem_used_mib is None


def test_units_and_header_tolerated():
    text = (
        "index, uuid, name, utilization.gpu [%], utilization.memory [%], memory.used [MiB], "
        "memory.total [MiB], temperature.gpu, power.draw [W], power.limit [W]\n"
        "0, GPU-1, NVIDIA H100 80GB HBM3, 95 %, 47 %, 70140 MiB, 81559 MiB, 71, 650.10 W, 700.00 W\n"
    )
    gpus, status = parse_gpu_csv(text)
    assert status == "ok" and len(gpus) == 1
    assert (gpus[0].util_pct, gpus[0].mem_used_mib, gpus[0].power_w) == (95, 70140, 650.10)


def test_missing_fields_are_none():
    gpus, _ = parse_gpu_csv("0, GPU-1, NVIDIA H100 80GB HBM3, 95\n")
    assert gpus[0].util_pct == 95
    assert gpus[0].mem_used_mib is None and gpus[0].power_limit_w is None


@pytest.mark.parametrize(
    ("text", "rc"),
    [("", "absent"), ("No devices were found\n", "6")],
)
def test_no_gpu_is_not_an_error(text, rc):
    assert parse_gpu_csv(text, rc) == ((), NO_GPU)


def test_driver_failure_is_reported():
    msg = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    gpus, status = parse_gpu_csv(msg + "\n", "9")
    assert gpus == () and status == msg


def test_netdev(recorded):
    dev = parse_netdev(recorded("proc_net_dev.txt"))
    assert dev["ens1f0"] == (812345678901234, 12345678901)
    assert dev["veth1a2b3c"] == (5678, 91011)
    assert dev["lo"][0] == 9123456789
    assert "face |bytes" not in " ".join(dev)


def test_nic_classification(recorded):
    info = parse_nic_info(recorded("nic_info.txt"))
    kinds = {k: v.kind for k, v in info.items()}
    assert kinds == {
        "bond0": "bond",
        "docker0": "virtual",
        "ens1f0": "member",
        "ens1f1": "member",
        "ib0": "physical",
        "lo": "loopback",
        "veth1a2b3c": "member",
    }
    assert info["docker0"].speed_mbps is None  # -1 = unknown
    assert info["ib0"].speed_mbps == 400000


def test_nic_classification_by_name_without_sysfs():
    assert classify_nic("eth0") == "physical"
    assert classify_nic("docker0") == "virtual"
    assert classify_nic("cali12ab") == "virtual"
    assert classify_nic("flannel.1") == "virtual"
    assert classify_nic("bond0") == "bond"
    assert classify_nic("eth0", "") == "virtual"  # sysfs says: no device behind it


def test_diskstats_whole_devices_only(recorded):
    from backend.telemetry.parse import parse_block_list

    whole = parse_block_list(recorded("block.txt"))
    disks = parse_diskstats(recorded("diskstats.txt"), whole)
    # loop devices are not disks; md0 is kept but marked virtual (its members carry the bytes).
    assert set(disks) == {"nvme0n1", "nvme1n1", "sda", "md0"}
    assert disks["nvme0n1"] == (96276480, 1820345678)
    assert whole["md0"] is False and whole["nvme0n1"] is True
    # Without /sys/block, partitions are recognised by name and loop devices skipped.
    by_name = parse_diskstats(recorded("diskstats.txt"))
    assert set(by_name) == {"nvme0n1", "nvme1n1", "sda", "md0"}


def test_df(recorded):
    free, total, err = parse_df(recorded("df.txt"), "0")
    assert (free, total, err) == (5000984352 * 1024, 7501476528 * 1024, None)
    assert parse_df("", "missing") == (None, None, "scratch directory missing")
    _f, _t, err = parse_df("df: /mnt/x: Permission denied\n", "1")
    assert err == "df: /mnt/x: Permission denied"


def test_full_block(h100_block):
    raw = parse_block(h100_block(uptime=1234.5))
    assert raw.uptime == 1234.5
    assert raw.boot_id == "b0a7c1d2-0000-4000-8000-000000000001"
    assert len(raw.gpus) == 8 and raw.gpu_status == "ok"
    assert raw.scratch_free_bytes == 5000984352 * 1024
    assert raw.disk_physical["nvme0n1"] and not raw.disk_physical["md0"]


def test_block_without_nvidia_smi(block):
    raw = parse_block(block(gpu="", gpu_rc="absent", df="", df_rc="missing"))
    assert raw.gpus == () and raw.gpu_status == NO_GPU
    assert raw.scratch_error == "scratch directory missing"


def test_sections_ignore_frame_lines():
    s = split_sections("@@lm-begin\n@@uptime 5.0 1\n@@gpu\nx, y\n@@gpu-rc 0\n@@lm-end")
    assert s["uptime"] == ("5.0 1", None)
    assert s["gpu"] == ("x, y", "0")


def test_xid_lines_of_the_kernel_log_map_to_gpus_by_pci_bus() -> None:
    from backend.telemetry.parse import parse_xid_log

    bus = "0, 00000000:18:00.0\n1, 00000000:2A:00.0\n"
    log = (
        "[ 12.5] NVRM: Xid (PCI:0000:2a:00): 48, pid=7, DBE (double bit error) ECC error\n"
        "Dec 01 10:00:00 gpu-01 kernel: NVRM: Xid (PCI:0000:18:00): 94, pid=8, Contained: SM\n"
        "[ 13.0] NVRM: Xid (PCI:0000:ff:00): 13, unknown bus\n"
        "[ 14.0] eth0: link up\n"
    )
    xids, err = parse_xid_log((log, "0"), bus)
    assert err is None
    assert [(g, c) for _k, g, c in xids] == [(1, 48), (0, 94), (-1, 13)]
    _, refused = parse_xid_log(("dmesg: read kernel buffer failed: Operation not permitted", "1"), bus)
    assert refused and "not permitted" in refused


@settings(max_examples=200)
@given(st.text(max_size=4000))
def test_any_kernel_log_text_parses_without_raising(text: str) -> None:
    from backend.telemetry.parse import parse_xid_log

    xids, _ = parse_xid_log((text, "0"), text[:200])
    assert all(isinstance(c, int) and isinstance(g, int) for _k, g, c in xids)


_BLOCK_PIECES = st.sampled_from(
    [
        "@@",
        "@@lm-begin",
        "@@lm-end",
        "@@gpu",
        "@@gpu-rc 0",
        "@@gpu-rc",
        "@@df-rc  1 ",
        "@@uptime 5.0 1",
        "@@ x",
        "\n",
        "\n",
        "\n",
        "0, GPU-1, H100, 95",
        " ",
        "@",
        "\r",
        "\r\n",
        "\x0c",
        "\u2028",
        "é",
        "",
    ]
)


@settings(max_examples=500)
@given(st.lists(st.one_of(_BLOCK_PIECES, st.text(max_size=8)), max_size=40).map("".join))
def test_split_sections_by_markers_is_the_line_by_line_reference(block: str) -> None:
    """The marker-cut fast path returns exactly what the line-by-line split does, for any text
    (frame and rc lines, repeated or empty markers, final newlines, other line breaks)."""
    from backend.telemetry.parse import _split_sections_by_line

    assert split_sections(block) == _split_sections_by_line(block)


def test_gpu_rows_equal_the_dataclass_they_stand_for() -> None:
    from backend.telemetry.model import GpuSample, gpu_row

    args = (3, "GPU-x", "NVIDIA H100", 95.0, None, 70000.0, 81559.0, 61.0, 640.5, 700.0)
    fast, slow = gpu_row(*args), GpuSample(*args)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert parse_gpu_csv("3, GPU-x, NVIDIA H100, 95, [N/A], 70000, 81559, 61, 640.5, 700.00")[0] == (slow,)
