"""Pure parsers: one framed sampler block (text) -> counters; two samples -> rates.

Everything here is a function of its text arguments, so tests feed recorded output and the
benchmark injects synthetic samples exactly where real ones enter, after the transport.

The text comes from a node and is not trusted: every string kept (GPU names, error lines,
interface and device names) is cleaned of control characters and escape sequences and cut to a
bounded length, and a section the transport had to cut (a line over its limit) or that lost its
end marker is a *malformed* part of the sample: reported, never parsed.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

from backend.nodes.untrusted import CUT_LINE, MAX_LINE_BYTES, clean_text
from backend.telemetry.model import NO_GPU, DiskRate, GpuSample, NicKind, NicRate, gpu_row

_VIRTUAL_PREFIXES = (
    "docker",
    "veth",
    "br-",
    "virbr",
    "cni",
    "flannel",
    "cali",
    "tun",
    "tap",
    "vxlan",
    "weave",
    "kube",
    "lxc",
    "lxd",
    "podman",
    "cilium",
    "genev",
    "gre",
    "dummy",
    "ifb",
    "wg",
    "zt",
    "tailscale",
    "vnet",
    "nodelocaldns",
    "ip6tnl",
    "sit",
    "erspan",
)
_PARTITION = re.compile(r"^(?:(?:[shv]|xv)d[a-z]+\d+|(?:nvme\d+n\d+|mmcblk\d+|md\d+|loop\d+)p\d+)$")
_NOT_DISK = ("loop", "ram", "zram", "sr", "fd")
_LOST_LINE = re.compile(r"device handle for GPU\s*([0-9A-Fa-f:.]+)?.*GPU is lost", re.I)

#: Largest believable per-interface rate when the line rate is unknown (bits/s): 1.6 Tb/s.
MAX_NIC_BPS_UNKNOWN = 1.6e12
#: Largest believable per-device disk rate (bytes/s): 100 GB/s.
MAX_DISK_BPS = 100e9
_WRAP32 = 2**32
_WRAP64 = 2**64
#: Longest name (GPU model, interface, device) and message kept from a node's output.
NAME_LIMIT = 128
MESSAGE_LIMIT = 200
#: What the sampler names each section, for messages about a malformed one.
_SECTION_SOURCE = {
    "gpu": "nvidia-smi",
    "netdev": "/proc/net/dev",
    "nic": "/sys/class/net",
    "diskstats": "/proc/diskstats",
    "block": "/sys/block",
    "df": "df",
}
#: gpu_status of a sample whose nvidia-smi output was malformed starts with this.
MALFORMED = "malformed"


#: Cleaned names by their raw text: a node prints the same GPU models, UUIDs, interfaces and
#: devices in every block, so each is cleaned once. Bounded: only short texts, and the memo is
#: emptied when it holds this many (a hostile node printing new names each time costs a clean).
_NAMES: dict[str, str] = {}
_NAMES_MAX = 16384
_NAME_MEMO_LEN = 4 * NAME_LIMIT


def _name(text: str) -> str:
    hit = _NAMES.get(text)
    if hit is not None:
        return hit
    out = clean_text(text, NAME_LIMIT)
    if len(text) <= _NAME_MEMO_LEN:
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        _NAMES[text] = out
    return out


def _message(text: str) -> str:
    return clean_text(text, MESSAGE_LIMIT)


@dataclass(frozen=True)
class NicInfo:
    """What /sys/class/net says about one interface."""

    speed_mbps: int | None
    kind: NicKind


@dataclass(frozen=True)
class RawSample:
    """One block's counters, before rates: what the node printed at one instant."""

    uptime: float | None = None
    boot_id: str | None = None
    gpus: tuple[GpuSample, ...] = ()
    gpu_status: str = "ok"
    #: interface -> (rx bytes, tx bytes)
    netdev: dict[str, tuple[int, int]] = field(default_factory=dict)
    nics: dict[str, NicInfo] = field(default_factory=dict)
    #: whole block device -> (sectors read, sectors written)
    diskstats: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: whole block device -> backed by hardware
    disk_physical: dict[str, bool] = field(default_factory=dict)
    scratch_free_bytes: int | None = None
    scratch_total_bytes: int | None = None
    scratch_error: str | None = None
    #: One line per malformed part of the block (a line over the limit, output cut on the node).
    malformed: tuple[str, ...] = ()
    #: Xids in the node's kernel log: (kernel timestamp or line, GPU index or -1, code); None
    #: when this block did not read the log (it does every few blocks).
    xids: tuple[tuple[str, int, int], ...] | None = None
    #: Why the kernel log could not be read (``dmesg: ... Operation not permitted``), if so.
    xid_error: str | None = None


# ---------------------------------------------------------------------------------------------
# nvidia-smi


def _value(text: str) -> float | None:
    """One CSV cell as a number; '[Not Supported]', '[N/A]', '' and junk become None."""
    try:
        return float(text)  # the common case, fast: float() ignores surrounding spaces
    except ValueError:
        pass
    t = text.strip()
    if not t or t.startswith("["):
        return None
    token = t.split()[0]  # tolerate units ("95 %", "700.00 W") when --format lacks nounits
    try:
        return float(token)
    except ValueError:
        return None


def parse_gpu_csv(text: str, rc: str | None = "0") -> tuple[tuple[GpuSample, ...], str]:
    """Parse ``nvidia-smi --query-gpu=<GPU_FIELDS> --format=csv,noheader,nounits`` output.

    Returns (GPUs, status) where status is "ok", NO_GPU (nvidia-smi absent, or "No devices
    were found") or nvidia-smi's own error line (driver not loaded, ...). A GPU that fell off
    the bus, as a "[GPU is lost]" row or an "Unable to determine the device handle" line, is a
    GpuSample with ``lost=True`` at its position (nvidia-smi prints GPUs in index order).
    """
    if rc == "absent":
        return (), NO_GPU
    if "No devices were found" in text and "," not in text:
        return (), NO_GPU
    lines = [ln for ln in text.splitlines() if ln.strip()]
    gpus: list[GpuSample] = []
    errors: list[str] = []
    for ln in lines:
        lost = _LOST_LINE.search(ln) if "GPU is lost" in ln and "," not in ln else None
        if lost:
            bus = lost.group(1) or ""
            gpus.append(GpuSample(index=len(gpus), uuid=_name(bus.rstrip(":.")), lost=True, error="GPU is lost"))
            continue
        if "," not in ln:
            errors.append(_message(ln.strip()))
            continue
        # nvidia-smi's CSV never quotes (no GPU name or UUID holds a comma), so a plain split
        # is exact and several times cheaper than the csv module at fleet scale.
        cells = (
            [c.strip() for c in ln.split(",")]
            if '"' not in ln
            else [c.strip() for c in next(csv.reader([ln], skipinitialspace=True))]
        )
        if cells[0] == "index":
            continue  # the header of --format=csv without noheader
        cells += [""] * (10 - len(cells))
        if "GPU is lost" in ln:
            idx = _value(cells[0])
            gpus.append(
                GpuSample(
                    index=int(idx) if idx is not None else len(gpus),
                    uuid=_name(cells[1].strip()) if not cells[1].startswith("[") else "",
                    lost=True,
                    error="GPU is lost",
                )
            )
            continue
        idx = _value(cells[0])
        try:
            values: list[float | None] = list(map(float, cells[3:10]))  # every number reported: one call
        except ValueError:
            values = [_value(c) for c in cells[3:10]]
        gpus.append(gpu_row(int(idx) if idx is not None else len(gpus), _name(cells[1]), _name(cells[2]), *values))
    if not gpus:
        if rc not in (None, "0") or errors:
            return (), errors[0] if errors else f"nvidia-smi exited {rc}"
        return (), NO_GPU
    return tuple(gpus), "ok"


# ---------------------------------------------------------------------------------------------
# network


def parse_netdev(text: str) -> dict[str, tuple[int, int]]:
    """/proc/net/dev -> {interface: (rx bytes, tx bytes)}; header and junk lines are skipped."""
    out: dict[str, tuple[int, int]] = {}
    for ln in text.splitlines():
        if ":" not in ln:
            continue
        name, _, rest = ln.partition(":")
        fields = rest.split()
        if len(fields) < 9:
            continue
        try:
            out[_name(name.strip())] = (int(fields[0]), int(fields[8]))
        except ValueError:
            continue
    return out


def classify_nic(name: str, flags: str | None = None) -> NicKind:
    """Physical, bond, bond/bridge member, virtual or loopback, from the name and sysfs flags.

    ``flags`` holds letters printed by the sampler: d = /sys/class/net/<if>/device exists,
    m = it has a master (bond or bridge member), b = it is a bond, r = it is a bridge.
    """
    if name == "lo":
        return "loopback"
    f = flags or ""
    if "m" in f:
        return "member"
    if "b" in f or (flags is None and name.startswith(("bond", "team"))):
        return "bond"
    if "r" in f or name.startswith(_VIRTUAL_PREFIXES):
        return "virtual"
    if flags is None:
        return "physical"
    return "physical" if "d" in f else "virtual"


def parse_nic_info(text: str) -> dict[str, NicInfo]:
    """The sampler's ``name speed flags`` lines -> {interface: NicInfo}."""
    out: dict[str, NicInfo] = {}
    for ln in text.splitlines():
        parts = ln.split()
        if len(parts) < 2:
            continue
        name, speed_s = _name(parts[0]), parts[1]
        flags = parts[2] if len(parts) > 2 else "-"
        try:
            speed: int | None = int(speed_s)
        except ValueError:
            speed = None
        if speed is not None and speed <= 0:
            speed = None  # -1 (or 0) means the driver does not know
        out[name] = NicInfo(speed_mbps=speed, kind=classify_nic(name, flags.strip("-")))
    return out


# ---------------------------------------------------------------------------------------------
# disks


def parse_block_list(text: str) -> dict[str, bool]:
    """The sampler's /sys/block listing -> {device: backed by hardware}."""
    out: dict[str, bool] = {}
    for ln in text.splitlines():
        parts = ln.split()
        if parts:
            out[_name(parts[0])] = len(parts) > 1 and parts[1] == "d"
    return out


def parse_diskstats(text: str, whole: dict[str, bool] | None = None) -> dict[str, tuple[int, int]]:
    """/proc/diskstats -> {whole device: (sectors read, sectors written)}.

    ``whole`` (from /sys/block) says which names are whole devices; without it partitions are
    recognised by name (sda1, nvme0n1p1, ...).
    """
    out: dict[str, tuple[int, int]] = {}
    for ln in text.splitlines():
        f = ln.split()
        if len(f) < 10:
            continue
        name = _name(f[2])
        if whole is not None:
            if name not in whole:
                continue
        elif _PARTITION.match(name):
            continue
        if name.startswith(_NOT_DISK) and not (whole or {}).get(name, False):
            continue
        try:
            out[name] = (int(f[5]), int(f[9]))
        except ValueError:
            continue
    return out


_DF_LINE = re.compile(r"^(.*?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)%\s+(.*)$")


def parse_df(text: str, rc: str | None) -> tuple[int | None, int | None, str | None]:
    """``df -P -k PATH`` -> (free bytes, total bytes, error); a missing dir is an error string."""
    if rc == "missing":
        return None, None, "scratch directory missing"
    for ln in text.splitlines()[1:]:
        m = _DF_LINE.match(ln.strip())
        if m:
            return int(m.group(4)) * 1024, int(m.group(2)) * 1024, None
    msg = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return None, None, _message(msg) if msg else f"df exited {_message(str(rc))}"


# ---------------------------------------------------------------------------------------------
# blocks


#: Line breaks other than newline that ``str.splitlines`` also splits on; a block holding one
#: is split line by line, the exact reference, instead of by markers.
_ODD_BREAKS = ("\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e")


def split_sections(block: str) -> dict[str, tuple[str, str | None]]:
    """A framed block -> {section: (body text, the section's rc marker value)}; headers
    ``@@uptime X``/``@@boot X`` become sections whose body is X.

    Cut at the ``@@`` marker lines and the bodies kept whole (a block is ~40 lines and only ~12
    markers, at 256 blocks a second); exactly what :func:`_split_sections_by_line` returns, which
    the tests check, and what runs for a block with other line breaks than newline.
    """
    if not block or not block.isascii() or any(c in block for c in _ODD_BREAKS):
        return _split_sections_by_line(block)
    if block.endswith("\n"):
        block = block[:-1]  # splitlines() yields no empty line after a final newline
    parts = block.split("\n@@")
    if parts[0].startswith("@@"):
        parts[0] = parts[0][2:]
    else:
        del parts[0]  # lines before the first marker belong to no section
    sections: dict[str, list[str]] = {}
    rcs: dict[str, str] = {}
    current: str | None = None
    for part in parts:
        header, newline, body = part.partition("\n")
        tag, _, rest = header.partition(" ")
        if tag.endswith("-rc"):
            rcs[tag[:-3]] = rest.strip()
        elif tag not in ("lm-begin", "lm-end"):
            current = tag
            sections[current] = [rest] if rest else []
        if newline and current is not None:
            sections[current].append(body)  # the lines up to the next marker, joined as they came
    return {k: ("\n".join(v), rcs.get(k)) for k, v in sections.items()}


def _split_sections_by_line(block: str) -> dict[str, tuple[str, str | None]]:
    """:func:`split_sections`, line by line (the reference)."""
    sections: dict[str, list[str]] = {}
    rcs: dict[str, str] = {}
    current: str | None = None
    for ln in block.splitlines():
        if ln.startswith("@@"):
            tag, _, rest = ln[2:].partition(" ")
            if tag.endswith("-rc"):
                rcs[tag[:-3]] = rest.strip()
                continue
            if tag in ("lm-begin", "lm-end"):
                continue
            current = tag
            sections[current] = [rest] if rest else []
            continue
        if current is not None:
            sections[current].append(ln)
    return {k: ("\n".join(v), rcs.get(k)) for k, v in sections.items()}


def malformed_sections(sections: dict[str, tuple[str, str | None]]) -> dict[str, str]:
    """{section: why} for the sections of a block that must not be parsed.

    A section holding a line the transport cut (over ``MAX_LINE_BYTES``), or a GPU section
    without its ``@@gpu-rc`` end line (the sampler cuts nvidia-smi's output on the node past
    ``MAX_GPU_BYTES``, and the marker goes with it), is malformed.
    """
    out: dict[str, str] = {}
    for name, (body, rc) in sections.items():
        source = _SECTION_SOURCE.get(name, name)
        if CUT_LINE in body:
            out[name] = f"{source} printed a line over {MAX_LINE_BYTES // 1024} KiB"
        elif name == "gpu" and rc is None:
            out[name] = f"{source} output was cut (too long) or did not finish"
    return out


def parse_block(block: str) -> RawSample:
    """One sampler block (the lines between ``@@lm-begin`` and ``@@lm-end``) -> RawSample."""
    s = split_sections(block)
    bad = malformed_sections(s) if CUT_LINE in block or ("gpu" in s and s["gpu"][1] is None) else {}
    for name in bad:
        s[name] = ("", "0")  # reported below, never parsed
    uptime = None
    up_text = s.get("uptime", ("", None))[0].split()
    if up_text:
        try:
            uptime = float(up_text[0])
        except ValueError:
            uptime = None
    boot = _name(s.get("boot", ("", None))[0].strip()) or None
    gpus: tuple[GpuSample, ...]
    if "gpu" in bad:
        gpus, gstatus = (), f"{MALFORMED} sample: {bad['gpu']}"
    elif "gpu" in s:
        gtext, grc = s["gpu"]
        gpus, gstatus = parse_gpu_csv(gtext, grc)
    else:
        gpus, gstatus = (), NO_GPU
    whole = parse_block_list(s["block"][0]) if "block" in s else None
    free = total = None
    serr: str | None = None
    if "df" in s:
        free, total, serr = parse_df(*s["df"])
        if "df" in bad:
            free, total, serr = None, None, f"{MALFORMED} sample: {bad['df']}"
    xids, xid_error = parse_xid_log(s["xid"], s.get("xidbus", ("", None))[0]) if "xid" in s else (None, None)
    return RawSample(
        uptime=uptime,
        boot_id=boot,
        xids=xids,
        xid_error=xid_error,
        gpus=gpus,
        gpu_status=gstatus,
        netdev=parse_netdev(s.get("netdev", ("", None))[0]),
        nics=parse_nic_info(s.get("nic", ("", None))[0]),
        diskstats=parse_diskstats(s.get("diskstats", ("", None))[0], whole),
        disk_physical=whole if whole is not None else {},
        scratch_free_bytes=free,
        scratch_total_bytes=total,
        scratch_error=serr,
        malformed=tuple(bad.values()),
    )


# ---------------------------------------------------------------------------------------------
# Xids from the kernel log

#: ``[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.``
_XID_LINE = re.compile(r"^(?:\[\s*(?P<ts>[0-9.]+)\])?.*?NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+)\): (?P<code>\d+)")


def _bus_key(bus: str) -> str:
    """A PCI address as ``dddd:bb:dd`` lower-case (nvidia-smi prints 8 domain digits, the log 4)."""
    parts = bus.strip().lower().split(":")
    if len(parts) >= 3:
        dom, b, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
        try:
            return f"{int(dom, 16):04x}:{b[-2:]}:{dev[-2:]}"
        except ValueError:  # an empty or junk domain from a hostile line
            pass
    return bus.strip().lower()


#: The public name (backend.triage maps Xid lines to GPUs the same way).
bus_key = _bus_key


def parse_xid_log(
    section: tuple[str, str | None], bus_text: str
) -> tuple[tuple[tuple[str, int, int], ...], str | None]:
    """The Xid lines of the kernel log -> ((timestamp or line, GPU index or -1, code), ...), and
    why the log could not be read (dmesg refused: kernel.dmesg_restrict), if so."""
    body, rc = section
    bus_to_gpu: dict[str, int] = {}
    for ln in bus_text.splitlines():
        idx, _, bus = ln.partition(",")
        try:
            bus_to_gpu[_bus_key(bus)] = int(idx.strip())
        except ValueError:
            continue
    out: list[tuple[str, int, int]] = []
    error = None
    for ln in body.splitlines():
        if ln.startswith("dmesg:"):
            error = _message(ln)
            continue
        m = _XID_LINE.search(ln)
        if not m:
            continue
        key = m.group("ts") or _message(ln)
        out.append((key, bus_to_gpu.get(_bus_key(m.group("bus")), -1), int(m.group("code"))))
    if error is None and rc not in (None, "0") and not out:
        error = f"dmesg exited {rc}"
    return tuple(out), error


# ---------------------------------------------------------------------------------------------
# rates


def counter_delta(prev: int, cur: int, max_delta: float) -> int | None:
    """Increase of a counter that may wrap (32 or 64 bit) or reset; None when not believable.

    A counter going backwards is a wrap only if the wrapped delta is plausible (below
    ``max_delta``); otherwise the counter was reset (interface re-created, driver reload) and
    the rate is unknown for this interval rather than negative or absurd.
    """
    if cur >= prev:
        d = cur - prev
        return d if d <= max_delta else None
    for modulus in (_WRAP32, _WRAP64):
        if prev < modulus:
            d = cur + modulus - prev
            if 0 <= d <= max_delta:
                return d
    return None


def compute_rates(
    prev: RawSample | None, cur: RawSample, dt: float | None
) -> tuple[tuple[NicRate, ...], tuple[DiskRate, ...]]:
    """NIC and disk rates between two samples ``dt`` seconds apart (None rates when unknown).

    No previous sample, a changed boot id, a non-positive interval or an implausible counter
    step all give None for the affected rates.
    """
    usable = (
        prev is not None
        and dt is not None
        and dt > 0
        and (prev.boot_id is None or cur.boot_id is None or prev.boot_id == cur.boot_id)
    )
    nics: list[NicRate] = []
    for name, (rx, tx) in cur.netdev.items():
        info = cur.nics.get(name) or NicInfo(None, classify_nic(name))
        rx_g = tx_g = None
        if usable and prev is not None and dt is not None and name in prev.netdev:
            prx, ptx = prev.netdev[name]
            bps_max = (info.speed_mbps * 1e6 * 1.5) if info.speed_mbps else MAX_NIC_BPS_UNKNOWN
            max_bytes = bps_max / 8 * dt + 65536
            drx = counter_delta(prx, rx, max_bytes)
            dtx = counter_delta(ptx, tx, max_bytes)
            rx_g = None if drx is None else drx * 8 / dt / 1e9
            tx_g = None if dtx is None else dtx * 8 / dt / 1e9
        nics.append(NicRate(name, info.kind, rx_g, tx_g, info.speed_mbps))
    disks: list[DiskRate] = []
    for name, (rs, ws) in cur.diskstats.items():
        r_mb = w_mb = None
        if usable and prev is not None and dt is not None and name in prev.diskstats:
            prs, pws = prev.diskstats[name]
            max_sectors = MAX_DISK_BPS / 512 * dt
            dr = counter_delta(prs, rs, max_sectors)
            dw = counter_delta(pws, ws, max_sectors)
            r_mb = None if dr is None else dr * 512 / dt / 1e6
            w_mb = None if dw is None else dw * 512 / dt / 1e6
        physical = cur.disk_physical.get(name, not name.startswith(("md", "dm-", "loop")))
        disks.append(DiskRate(name, r_mb, w_mb, physical))
    return tuple(nics), tuple(disks)
