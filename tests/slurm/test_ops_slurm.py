"""Slurm operations against the real slurmctld and slurmd 22.05 (tests/slurm_fixtures.py).

The jobs on each node with the GPU indices Slurm gave them; drain after the job (DRAINING while the
real job runs, DRAINED once it ends) with the reason as ``scontrol show node`` reports it, operator
and time included; drain now (the node's jobs requeued); read-only refusing both; resume refused
for each failing check and accepted once the evidence passes, or forced with a reason; every
action in the audit log of both state backends.

Nodes node-01 and node-02 are this machine through loadmaster's local transport, with stand-in
``nvidia-smi`` and ``dmesg`` on PATH printing what each test sets (these machines have no GPU);
node-03 is an SSH node nobody answers for.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from backend.config import load_config
from backend.errors import ConfigError, PolicyError, ReadOnlyRefused
from backend.ops import Operations
from backend.ops.slurm import ResumeRefused
from backend.services import Services
from backend.state import actor
from lab.slurm import SlurmLab
from tests.slurm_fixtures import job_state, node_state, wait_for

pytestmark = [pytest.mark.timeout(180)]


def write_config(tmp_path: Path, lab: SlurmLab, state_url: str | None = None) -> Path:
    cfg = tmp_path / "lm.toml"
    url = f'url = "{state_url}"\n' if state_url else ""
    cfg.write_text(
        '[[nodes]]\nname = "node-01"\nhost = "127.0.0.1"\ntransport = "local"\n\n'
        '[[nodes]]\nname = "node-02"\nhost = "127.0.0.1"\ntransport = "local"\n\n'
        '[[nodes]]\nname = "node-03"\nhost = "127.0.0.1"\nport = 1\n\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n{url}\n'
        f'[slurm]\nenabled = true\nconf = "{lab.conf}"\ninterval = "30s"\n'
    )
    return cfg


class GpuStandIn:
    """``nvidia-smi`` and ``dmesg`` stand-ins on PATH, printing what the test sets."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin = root / "gpu-bin"
        self.bin.mkdir()
        (self.bin / "nvidia-smi").write_text(
            "#!/bin/sh\n"
            'case "$1" in\n'
            f"  --query-compute-apps=*) cat {self.bin}/apps ;;\n"
            f"  --query-gpu=index,uuid) cat {self.bin}/uuids ;;\n"
            f"  --query-gpu=*) cat {self.bin}/gpu ;;\n"
            "  *) echo 'unsupported'; exit 2 ;;\n"
            "esac\n"
        )
        (self.bin / "dmesg").write_text(f"#!/bin/sh\ncat {self.bin}/dmesg.out\nexit $(cat {self.bin}/dmesg.rc)\n")
        for name in ("nvidia-smi", "dmesg"):
            (self.bin / name).chmod(0o755)
        (self.bin / "uuids").write_text("".join(f"{i}, GPU-{i}\n" for i in range(4)))
        self.set()
        monkeypatch.setenv("PATH", f"{self.bin}:{__import__('os').environ['PATH']}")

    def set(
        self,
        *,
        apps: str = "",
        gpu: str = "0, No, 0, 5\n1, No, 0, 5\n2, No, 0, 5\n3, No, 0, 5\n",
        dmesg: str = "",
        dmesg_rc: int = 0,
    ) -> None:
        (self.bin / "apps").write_text(apps)
        (self.bin / "gpu").write_text(gpu)
        (self.bin / "dmesg.out").write_text(dmesg)
        (self.bin / "dmesg.rc").write_text(str(dmesg_rc))


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GpuStandIn:
    return GpuStandIn(tmp_path, monkeypatch)


def services(cfg: Path, *, readonly: bool = False) -> Services:
    return Services(load_config(cfg), readonly=readonly)


def running(lab: SlurmLab, job: str) -> None:
    wait_for(f"job {job} running", lambda: job_state(lab, job) == "RUNNING")


def test_rows_show_jobs_with_their_gpus(slurm: SlurmLab, tmp_path: Path) -> None:
    a = slurm.sbatch("-w", "node-01", "--gres=gpu:2", "-J", "train-llm")
    b = slurm.sbatch("-w", "node-01", "--gres=gpu:1", "-J", "eval")
    running(slurm, a)
    running(slurm, b)
    svc = services(write_config(tmp_path, slurm))
    ops = Operations(svc).slurm
    rows = {r.name: r for r in asyncio.run(ops.rows(fresh=True))}
    assert set(rows) == {"node-01", "node-02", "node-03"}
    r1 = rows["node-01"]
    assert r1.state in ("mixed", "allocated") and r1.partitions == ("gpu",) and r1.gpus == 4
    jobs = {j.job_id: j for j in r1.jobs}
    assert jobs[a].gpus == (0, 1) and jobs[b].gpus == (2,)
    assert jobs[a].name == "train-llm" and jobs[a].user == actor().split("@")[0]
    assert jobs[a].elapsed_s is not None and jobs[a].elapsed_s >= 0
    assert rows["node-02"].state == "idle" and rows["node-02"].jobs == ()
    # At most one read per interval: a second call within it does not run sinfo again.
    snap = asyncio.run(ops.snapshot())
    assert asyncio.run(ops.snapshot()) is snap


def test_gpu_to_job_mapping_on_the_node_matches_slurm(slurm: SlurmLab, tmp_path: Path, gpus: GpuStandIn) -> None:
    """A real batch job on node-01: its process, shown by nvidia-smi on the GPUs Slurm gave it
    (CUDA_VISIBLE_DEVICES), maps back to the job on the node side, as Slurm's IDX says."""
    info = tmp_path / "job-info"
    job = slurm.sbatch(
        "-w", "node-01", "--gres=gpu:2", "-J", "gpu-map",
        script=f'echo "$$ $CUDA_VISIBLE_DEVICES" > {info}.tmp; mv {info}.tmp {info}; exec sleep 600',
    )  # fmt: skip
    running(slurm, job)
    wait_for("the job's pid", info.exists)
    pid, visible = info.read_text().split()
    gpu_ids = [int(g) for g in visible.split(",")]
    gpus.set(apps="".join(f"{pid}, GPU-{g}\n" for g in gpu_ids) + "999999, GPU-3\n")
    svc = services(write_config(tmp_path, slurm))
    ops = Operations(svc).slurm
    mapped = asyncio.run(ops.gpu_jobs("node-01"))
    ours = [(g.gpu, g.job_id) for g in mapped if g.pid == int(pid)]
    assert ours == [(g, job) for g in gpu_ids] and {g.via for g in mapped if g.pid == int(pid)} == {"environ"}
    assert [(g.gpu, g.job_id) for g in mapped if g.pid == 999999] == [(3, None)]  # not a job's process
    rows = {r.name: r for r in asyncio.run(ops.rows(fresh=True))}
    (on_node,) = [j for j in rows["node-01"].jobs if j.job_id == job]
    assert list(on_node.gpus) == gpu_ids  # Slurm's IDX and the node agree


def test_drain_after_the_job_draining_then_drained_audited(
    slurm: SlurmLab, tmp_path: Path, state_url: str | None
) -> None:
    job = slurm.sbatch("-w", "node-01", "--gres=gpu:2", "-J", "train")
    running(slurm, job)
    svc = services(write_config(tmp_path, slurm, state_url))
    ops = Operations(svc).slurm
    plan = asyncio.run(ops.plan_drain(["node-01"], "GPU 1 fell off the bus", prompted_by="Xid 79"))
    shown = plan.shown()
    assert shown[0].startswith("scontrol update NodeName=node-01 State=DRAIN 'Reason=GPU 1 fell off the bus [Xid 79]")
    assert len(shown) == 1 and plan.requeue == ()
    before = time.time()
    res = asyncio.run(ops.drain(plan))
    assert res.nodes == ("node-01",)
    # Slurm keeps the reason as written, with who and when.
    out = slurm.command(["scontrol", "show", "node", "node-01"]).stdout
    reason = next(ln.strip() for ln in out.splitlines() if ln.strip().startswith("Reason="))
    assert f"| loadmaster:{actor()} | " in reason and "GPU 1 fell off the bus [Xid 79]" in reason
    stamp = reason.split(" | ")[2].split()[0]
    assert abs(datetime.strptime(stamp, "%Y-%m-%dT%H:%MZ").replace(tzinfo=UTC).timestamp() - before) < 120
    # The real job still runs: DRAINING; once it ends: DRAINED.
    assert node_state(slurm, "node-01") == "draining"
    rows = {r.name: r for r in asyncio.run(ops.rows(fresh=True))}
    assert rows["node-01"].state == "draining" and rows["node-01"].reason.startswith("GPU 1 fell off the bus")
    assert rows["node-01"].reason_age_s is not None and rows["node-01"].unavailable
    slurm.command(["scancel", job])
    wait_for("node-01 drained", lambda: node_state(slurm, "node-01") == "drained")
    rows = {r.name: r for r in asyncio.run(ops.rows(fresh=True))}
    assert rows["node-01"].state == "drained" and rows["node-01"].drains_30d == 1
    entries = svc.db.audit_entries(action="slurm.drain")
    assert [(e.target, e.outcome) for e in entries] == [("node-01", "ok")]
    assert entries[0].reason == plan.reason and entries[0].detail["commands"] == shown
    svc.db.close()


def test_drain_now_requeues_the_nodes_jobs(slurm: SlurmLab, tmp_path: Path) -> None:
    job = slurm.sbatch("-w", "node-02", "--requeue", "--gres=gpu:1", "-J", "requeue-me")
    stuck = slurm.sbatch("-w", "node-01", "--no-requeue", "-J", "keep-me")
    running(slurm, job)
    running(slurm, stuck)
    svc = services(write_config(tmp_path, slurm))
    ops = Operations(svc).slurm
    with pytest.raises(PolicyError, match=f"job {stuck} cannot be requeued"):
        asyncio.run(ops.plan_drain(["node-01"], "bad ib link", now=True))
    plan = asyncio.run(ops.plan_drain(["node-02"], "bad ib link", now=True))
    assert plan.requeue == (job,) and plan.shown()[1] == f"scontrol requeue {job}"
    asyncio.run(ops.drain(plan))
    # Requeued, and held back by the drain of the only node it may use.
    wait_for(f"job {job} requeued", lambda: job_state(slurm, job) == "PENDING")
    wait_for("node-02 drained", lambda: node_state(slurm, "node-02") == "drained")
    assert job_state(slurm, stuck) == "RUNNING"


def test_readonly_refuses_drain_and_resume(slurm: SlurmLab, tmp_path: Path) -> None:
    cfg = write_config(tmp_path, slurm)
    ro = services(cfg, readonly=True)
    ops = Operations(ro).slurm
    plan = asyncio.run(ops.plan_drain(["node-02"], "maintenance"))
    with pytest.raises(ReadOnlyRefused, match="read-only"):
        asyncio.run(ops.drain(plan))
    slurm.command(["scontrol", "update", "NodeName=node-02", "State=DRAIN", "Reason=by hand"])
    rplan = asyncio.run(ops.plan_resume(["node-02"], force_reason="testing"))
    with pytest.raises(ReadOnlyRefused, match="read-only"):
        asyncio.run(ops.resume(rplan))
    assert node_state(slurm, "node-02") == "drained"
    assert ro.db.audit_entries() == []


def _xid_line(t: float, code: int = 79) -> str:
    stamp = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S,000000+00:00")
    return f"{stamp} NVRM: Xid (PCI:0000:3b:00): {code}, pid=1234, GPU has fallen off the bus.\n"


def test_resume_refused_for_each_failing_check_then_accepted(
    slurm: SlurmLab, tmp_path: Path, gpus: GpuStandIn, state_url: str | None
) -> None:
    svc = services(write_config(tmp_path, slurm, state_url))
    ops = Operations(svc).slurm

    def refused(node: str, needle: str) -> None:
        plan = asyncio.run(ops.plan_resume([node]))
        assert not plan.allowed and needle in (plan.refusal() or ""), plan.refusal()
        with pytest.raises(ResumeRefused) as exc:
            asyncio.run(ops.resume(plan))
        assert needle in str(exc.value) and "\n" not in str(exc.value)

    refused("node-01", "slurm state: idle")  # not drained: nothing to resume
    asyncio.run(ops.drain(asyncio.run(ops.plan_drain(["node-01", "node-03"], "xid 79"))))
    drained_at = time.time()
    old_xid = _xid_line(drained_at - 3600, 48)
    gpus.set(apps="4242, GPU-8f0e\n", dmesg=old_xid)
    refused("node-01", "gpu processes: 1 compute process(es) on the GPUs (pid 4242)")
    gpus.set(gpu="0, No, 0, 5\n1, Yes, 0, 5\n2, No, 0, 5\n3, No, 0, 5\n", dmesg=old_xid)
    refused("node-01", "row remap / ECC: GPU 1 has a pending row remap")
    # The drain recorded 5 lifetime uncorrectable errors per GPU: 7 now on GPU 1 is 2 since.
    gpus.set(gpu="0, No, 0, 5\n1, No, 2, 7\n2, No, 0, 5\n3, No, 0, 5\n", dmesg=old_xid)
    refused("node-01", "row remap / ECC: GPU 1 has 2 uncorrectable ECC error(s) since the drain")
    gpus.set(dmesg=old_xid + _xid_line(drained_at + 2))
    refused("node-01", "xid: 1 Xid(s) since the drain (last: Xid 79")
    gpus.set(dmesg="dmesg: read kernel buffer failed: Operation not permitted\n", dmesg_rc=1)
    refused("node-01", "xid: cannot read the kernel log (dmesg: read kernel buffer failed")
    refused("node-03", "node-03: reachable:")
    # Where the node has dcgmi, its quick diagnostic must pass too.
    gpus.set(dmesg=old_xid)
    dcgmi = gpus.bin / "dcgmi"
    dcgmi.write_text("#!/bin/sh\necho '| PCIe | Fail - GPU 2 link width x8 |'\nexit 226\n")
    dcgmi.chmod(0o755)
    refused("node-01", "dcgm diag: dcgmi diag -r 1 failed: | PCIe | Fail - GPU 2")
    dcgmi.write_text("#!/bin/sh\necho '| Deployment | Pass |'\n")
    assert node_state(slurm, "node-01") == "drained"
    # The evidence passes (an Xid from before the drain does not count): resumed.
    gpus.set(dmesg=old_xid)
    plan = asyncio.run(ops.plan_resume(["node-01"]))
    assert plan.allowed and plan.shown() == ["scontrol update NodeName=node-01 State=RESUME"]
    asyncio.run(ops.resume(plan))
    wait_for("node-01 idle", lambda: node_state(slurm, "node-01") == "idle")
    # --force with a reason overrides a failing check, audited as forced.
    with pytest.raises(Exception, match="--force needs a reason"):
        asyncio.run(ops.plan_resume(["node-03"], force_reason=" "))
    asyncio.run(ops.resume(asyncio.run(ops.plan_resume(["node-03"], force_reason="IPMI shows it healthy"))))
    wait_for("node-03 resumed", lambda: node_state(slurm, "node-03") not in ("drained", "draining"))
    entries = svc.db.audit_entries(action="slurm.resume")
    outcomes = [(e.target, e.outcome) for e in reversed(entries)]
    expected = [("node-01", "refused")] * 6 + [("node-03", "refused"), ("node-01", "refused")]
    assert outcomes == [*expected, ("node-01", "ok"), ("node-03", "forced")]
    forced = entries[0]
    assert forced.reason == "IPMI shows it healthy" and any("reachable: FAIL" in c for c in forced.detail["checks"])
    svc.db.close()


def test_errors_are_one_line(slurm: SlurmLab, tmp_path: Path) -> None:
    ops = Operations(services(write_config(tmp_path, slurm))).slurm
    with pytest.raises(Exception, match="Slurm has no node 'node-99'"):
        asyncio.run(ops.plan_drain(["node-99"], "x"))
    with pytest.raises(Exception, match="a drain needs a reason"):
        asyncio.run(ops.plan_drain(["node-01"], "  "))
    with pytest.raises(Exception, match="one line"):
        asyncio.run(ops.plan_drain(["node-01"], "two\nlines"))
    off = tmp_path / "off.toml"
    off.write_text('[[nodes]]\nname = "n"\nhost = "127.0.0.1"\n')
    with pytest.raises(Exception, match=r"\[slurm\] enabled = true"):
        asyncio.run(Operations(services(off)).slurm.rows())


def test_an_ended_job_slurm_still_lists_is_not_running_and_no_pull_targets_its_nodes(
    slurm: SlurmLab, tmp_path: Path
) -> None:
    # squeue --json and scontrol list a cancelled job for MinJobAge (5 s in the lab, 300 s by
    # default), with its nodes. It is not "running or pending", and `pull --slurm-job` must not
    # go to nodes it no longer holds.
    job = slurm.sbatch("-w", "node-01", "--gres=gpu:1", "-J", "ends-now")
    running(slurm, job)
    ops = Operations(services(write_config(tmp_path, slurm))).slurm
    assert job in {j.job_id for j in asyncio.run(ops.jobs(fresh=True))}
    assert asyncio.run(ops.job_nodes(job)) == ["node-01"]
    slurm.command(["scancel", job])
    seen_ended = refused = False
    deadline = time.monotonic() + 30
    while not (seen_ended and refused) and time.monotonic() < deadline:
        snap = asyncio.run(ops.snapshot(fresh=True))
        listed = {j.job_id: j for j in snap.jobs}
        if job in listed and listed[job].state == "CANCELLED":
            seen_ended = True
            assert listed[job].nodes == ("node-01",)  # Slurm still names the node
            assert job not in {j.job_id for j in asyncio.run(ops.jobs())}  # the same snapshot, filtered
        with pytest.raises(ConfigError) as err:
            asyncio.run(ops.job_nodes(job))
        refused = refused or f"Slurm job {job} has ended (cancelled)" in str(err.value)
    assert seen_ended and refused
