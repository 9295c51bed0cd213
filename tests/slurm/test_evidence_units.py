"""The pure parts of drain and resume: the reason template, Xids from the kernel log after the
drain, the node's process-to-job answers; properties on hostile text."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.errors import ConfigError
from backend.ops.slurm import parse_gpu_jobs, reason_text, xids_since

T = datetime(2026, 12, 2, 1, 30, tzinfo=UTC).timestamp()


def test_reason_template() -> None:
    assert reason_text("GPU 3 fell off the bus", prompted_by="Xid 79", who="alice@ops", t=T) == (
        "GPU 3 fell off the bus [Xid 79] | loadmaster:alice@ops | 2026-12-02T01:30Z"
    )
    assert reason_text(" maintenance ", who="bob@ops", t=T) == "maintenance | loadmaster:bob@ops | 2026-12-02T01:30Z"
    for bad in ("", "   ", "a\nb", "x" * 201, "red \x1b[31m"):
        with pytest.raises(ConfigError, match="--reason"):
            reason_text(bad, who="a@b", t=T)


@given(st.text(max_size=250), st.one_of(st.none(), st.text(max_size=100)))
def test_reason_is_one_clean_line_or_refused(reason: str, prompted: str | None) -> None:
    try:
        text = reason_text(reason, prompted_by=prompted, who="op@host", t=T)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert text.endswith(" | loadmaster:op@host | 2026-12-02T01:30Z")
    assert all(ord(c) >= 32 and not 0x7F <= ord(c) <= 0x9F for c in text)


def test_xids_since_the_drain_only() -> None:
    log = (
        "2026-12-02T01:29:59,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 48, pid=1, DBE\n"
        "2026-12-02T01:30:00,500000+00:00 NVRM: Xid (PCI:0000:3b:00): 79, pid=2, fallen off the bus\n"
        "2026-12-02T01:31:00,000000+00:00 usb 1-1: new device\n"
        "garbage NVRM: Xid (PCI:0000:3b:00): 13\n"
    )
    assert xids_since(log, T) == [(T + 0.5, 79)]


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=400))
def test_hostile_kernel_log_never_escapes(log: str) -> None:
    for ts, code in xids_since(log, 0):
        assert isinstance(code, int) and ts >= 0


def test_processes_map_to_jobs_by_cgroup_then_environ() -> None:
    gpus = "0, GPU-a\n1, GPU-b\n"
    apps = "100, GPU-a\n200, GPU-b\n300, GPU-b\n400, GPU-zzz\n; rm -rf /, GPU-a\n\u00b2, GPU-a\n"
    procs = "100 job_812 SLURM_JOB_ID=999\n200 - SLURM_JOB_ID=905\n300 - -\n\u00b2 job_\u00b2 -\n"
    got = [(g.gpu, g.pid, g.job_id, g.via) for g in parse_gpu_jobs(gpus, apps, procs)]
    assert got == [(0, 100, "812", "cgroup"), (1, 200, "905", "environ"), (1, 300, None, None)]


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200), st.text(max_size=200))
def test_hostile_node_answers_never_escape(gpus: str, apps: str, procs: str) -> None:
    for g in parse_gpu_jobs(gpus, apps, procs):
        assert g.job_id is None or g.job_id.isdigit()


def test_ecc_since_the_drain_against_the_drains_count() -> None:
    from backend.ops.slurm import _gpu_health_check

    now = ("0, No, 3, 12\n1, No, 0, 4\n", "0")
    # The drain recorded 12 and 4: nothing new, although the volatile counter shows older errors.
    assert _gpu_health_check(now, {0: 12, 1: 4}).passed
    c = _gpu_health_check(now, {0: 10, 1: 4})
    assert not c.passed and c.detail == "GPU 0 has 2 uncorrectable ECC error(s) since the drain"
    # No count from the drain (an unreachable node then): the volatile counter decides.
    c = _gpu_health_check(now, None)
    assert not c.passed and "GPU 0 has 3 uncorrectable ECC error(s) (volatile" in c.detail
    assert not _gpu_health_check(("0, No, 0\n", "0"), None).passed  # not the four cells asked for
    assert _gpu_health_check(("0, No, [N/A], [N/A]\n", "0"), None).passed  # GPUs without ECC
