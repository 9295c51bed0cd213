"""NVIDIA Xid errors: what each code means and what an operator does about it.

The driver logs an Xid (``NVRM: Xid (PCI:...): 79, ...``) when a GPU hits a fault; dcgm-exporter
reports the last one per GPU as ``DCGM_FI_DEV_XID_ERRORS`` and ``nvidia-smi -q`` lists it. The
meanings and actions below follow NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors,
"Analyzing Xid Errors with the Xid Catalog": mnemonic, description and resolution bucket), in the
words an on-call operator acts on: restart the job, reset the GPU, drain and reboot the node, or
drain it for hardware service.
"""

from __future__ import annotations

from dataclasses import dataclass

#: What the operator does, per NVIDIA's resolution buckets.
RESTART_APP = "restart the job (application fault; the GPU is fine)"
RESET_GPU = "drain the node, reset the GPU (nvidia-smi -r) and re-run a GPU health check"
REBOOT = "drain the node and reboot it; if the Xid returns, send the GPU for service"
REPLACE = "drain the node for hardware service: replace the GPU (or its board)"
CHECK_ECC = "drain, reset the GPU to apply the row remap; replace the GPU if remapping failed"
WATCH = "informational: keep watching; act if it repeats"


@dataclass(frozen=True)
class XidInfo:
    code: int
    mnemonic: str
    meaning: str
    action: str
    #: Whether the node should stop taking work until someone acts (drain).
    drain: bool


_CATALOG = (
    XidInfo(
        8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing (channel idle timeout)", RESTART_APP, False
    ),
    XidInfo(
        13, "GR_EXCEPTION", "graphics engine exception (often an out-of-range access by the job)", RESTART_APP, False
    ),
    XidInfo(31, "FAULT_PDE", "GPU memory page fault (illegal address, usually the job's)", RESTART_APP, False),
    XidInfo(32, "PUSHBUFFER_ERROR", "invalid or corrupted push buffer stream (PCIe or driver)", REBOOT, True),
    XidInfo(38, "DRIVER_FIRMWARE_ERROR", "driver firmware error", REBOOT, True),
    XidInfo(
        43, "RESET_CHANNEL_VERIF_ERROR", "GPU stopped processing (the job was killed by a fault)", RESTART_APP, False
    ),
    XidInfo(44, "GR_FAULT_DURING_CTXSW", "graphics engine fault during a context switch", RESET_GPU, True),
    XidInfo(45, "PREEMPTIVE_REMOVAL", "preemptive cleanup after an earlier error or a killed job", WATCH, False),
    XidInfo(46, "GPU_STOPPED_PROCESSING", "GPU stopped processing", RESET_GPU, True),
    XidInfo(48, "DBE", "double-bit ECC error: uncorrectable memory error", CHECK_ECC, True),
    XidInfo(56, "DISPLAY_ENGINE_ERROR", "display engine error", WATCH, False),
    XidInfo(57, "FB_INTERFACE_ERROR", "error programming the video memory interface", REPLACE, True),
    XidInfo(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint/warning", RESET_GPU, True),
    XidInfo(62, "PMU_HALT_ERROR", "internal micro-controller halt", RESET_GPU, True),
    XidInfo(63, "ROW_REMAP_EVENT", "ECC page retirement or row remapping recorded (reset to apply)", CHECK_ECC, True),
    XidInfo(64, "ROW_REMAP_FAILURE", "ECC page retirement or row remapping failed", REPLACE, True),
    XidInfo(68, "NVDEC_ERROR", "video decoder exception", RESTART_APP, False),
    XidInfo(69, "GR_CLASS_ERROR", "graphics engine class error", RESTART_APP, False),
    XidInfo(74, "NVLINK_ERROR", "NVLink error (link down or training failed)", RESET_GPU, True),
    XidInfo(79, "GPU_FELL_OFF_BUS", "the GPU has fallen off the bus (PCIe link lost)", REBOOT, True),
    XidInfo(92, "HIGH_SBE_RATE", "high single-bit ECC error rate", WATCH, False),
    XidInfo(
        94, "CONTAINED_ECC", "contained ECC error: one job's memory hit, the GPU keeps running", RESTART_APP, False
    ),
    XidInfo(95, "UNCONTAINED_ECC", "uncontained ECC error: every job on the GPU is affected", RESET_GPU, True),
    XidInfo(119, "GSP_RPC_TIMEOUT", "GPU System Processor RPC timeout", RESET_GPU, True),
    XidInfo(120, "GSP_ERROR", "GPU System Processor error", RESET_GPU, True),
    XidInfo(123, "SPI_PMU_RPC_FAILURE", "SPI PMU RPC read failure", REPLACE, True),
    XidInfo(140, "UNRECOVERED_ECC", "unrecovered ECC error (row remap pending)", CHECK_ECC, True),
)

CATALOG: dict[int, XidInfo] = {x.code: x for x in _CATALOG}


def describe(code: int) -> XidInfo:
    """The catalog entry for ``code``; an unlisted code says where to look it up."""
    info = CATALOG.get(code)
    if info is not None:
        return info
    return XidInfo(
        code,
        "UNKNOWN",
        f"Xid {code} is not in loadmaster's catalog: look it up in NVIDIA's Xid catalog",
        "check the driver log (dmesg | grep Xid) and NVIDIA's catalog before acting",
        False,
    )
