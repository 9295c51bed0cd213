"""``loadmaster restage`` on the lab: the newest step proven resumable (a real DCP step with model
and AdamW in SeaweedFS) is pulled once and relayed to two real sshd nodes, verified; the bytes the
store sent are counted outside loadmaster (a counting proxy in front of SeaweedFS). A run whose
only step is unproven is refused with its reason, in the audit log, and nothing is pulled."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.errors import PolicyError, ReadOnlyRefused
from backend.ops import Operations
from backend.services import Services
from lab import Lab
from tests.checkpoints.conftest import tiny_full_dcp
from tests.counting_proxy import CountingProxy
from tests.relay.conftest import relay_config, s5cmd_everywhere, store_proxy
from tui.cli import main

__all__ = ["store_proxy", "tiny_full_dcp"]

pytestmark = [pytest.mark.timeout(300)]

NODES = ("node-01", "node-02")


def upload(s3, bucket: str, prefix: str, step_dir: Path, *, drop: str = "") -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    """Every file of ``step_dir`` under ``prefix`` (``drop``: one left out), as name -> bytes."""
    client = s3.client()
    out = {}
    for p in sorted(step_dir.rglob("*")):
        name = p.relative_to(step_dir).as_posix()
        if p.is_file() and name != drop:
            out[name] = p.read_bytes()
            client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=out[name])
    return out


def test_restage_pulls_the_proven_step_once_to_two_nodes(  # type: ignore[no-untyped-def]
    lab: Lab, s3, store_proxy: CountingProxy, tmp_path: Path, tiny_full_dcp, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = tiny_full_dcp
    assert lab.bucket
    prefix = "restage/run-" + secrets.token_hex(3)
    upload(s3, lab.bucket, f"{prefix}/step-10", src)
    step20 = upload(s3, lab.bucket, f"{prefix}/step-20", src)
    upload(s3, lab.bucket, f"{prefix}/step-30", src, drop=".metadata")  # in flight: no commit marker
    run = f"s3://{lab.bucket}/{prefix}"
    cfg = relay_config(lab, tmp_path, store_proxy, pull=s5cmd_everywhere())

    assert main(["--config", str(cfg), "restage", run, "--nodes", ",".join(NODES), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "restart from step 20" in out and "proven resumable" in out, out
    assert "step-30" in out and "not usable" in out and "fan-out: relay" in out, out
    for node in NODES:
        assert not (lab.node(node).scratch / "restart/step-20").exists()

    async def body() -> tuple[object, int]:
        services = Services(load_config_file(cfg))
        triage = Operations(services).triage
        try:
            plan = await triage.restage_plan(run, ",".join(NODES))
            assert plan.startable and plan.checkpoint["step"] == 20, plan.lines()
            store_proxy.reset()  # the proof read the store; from here on only the pull does
            result = await triage.restage(plan)
            served = store_proxy.served
            entries = services.db.audit_entries(action="triage.restage")
            assert [e.outcome for e in entries] == ["staged"]
            return result, served
        finally:
            await services.aclose()

    result, served = asyncio.run(body())
    step_bytes = sum(len(b) for b in step20.values())
    assert result.ok, result.lines()  # type: ignore[attr-defined]
    assert result.ready_s is not None and result.ready_s > 0  # type: ignore[attr-defined]
    # The store sent the step once for two nodes (measured at the store's door, not by loadmaster).
    assert step_bytes <= served < step_bytes * 1.2, (served, step_bytes)
    assert result.store_bytes == step_bytes and result.direct_bytes == 2 * step_bytes  # type: ignore[attr-defined]
    assert result.saved_bytes == step_bytes  # type: ignore[attr-defined]
    for node in NODES:
        dest = lab.node(node).scratch / "restart/step-20"
        for name, body_bytes in step20.items():
            assert hashlib.sha256((dest / name).read_bytes()).digest() == hashlib.sha256(body_bytes).digest(), name
    text = "\n".join(result.lines())  # type: ignore[attr-defined]
    assert "resume-ready: step 20 on 2 node(s)" in text and "saved" in text
    with capsys.disabled():
        print(f"{text}\nstore proxy served {served} bytes for a {step_bytes}-byte step to {len(NODES)} nodes")


def test_no_proven_step_is_refused_with_its_reason(  # type: ignore[no-untyped-def]
    lab: Lab, s3, store_proxy: CountingProxy, tmp_path: Path, tiny_full_dcp, capsys: pytest.CaptureFixture[str]
) -> None:
    src, _ = tiny_full_dcp
    assert lab.bucket
    prefix = "restage/unproven-" + secrets.token_hex(3)
    files = upload(s3, lab.bucket, f"{prefix}/step-40", src)
    shard = next(n for n in files if n.endswith(".distcp"))
    s3.client().put_object(Bucket=lab.bucket, Key=f"{prefix}/step-40/{shard}", Body=files[shard][:-40])  # truncated
    run = f"s3://{lab.bucket}/{prefix}"
    cfg = relay_config(lab, tmp_path, store_proxy, name="refused", pull=s5cmd_everywhere())
    store_proxy.reset()
    rc = main(["--config", str(cfg), "restage", run, "--nodes", ",".join(NODES), "--yes"])
    captured = capsys.readouterr()
    assert rc != 0
    assert "not restaged: no step proves resumable (deny by default: no proof, no pick)" in captured.err
    assert "\n" not in captured.err.strip() and "Traceback" not in captured.err
    assert "step-40" in captured.out and "not usable" in captured.out
    for node in NODES:
        assert not (lab.node(node).scratch / "restart/step-40").exists()
    services = Services(load_config_file(cfg))
    try:
        [entry] = services.db.audit_entries(action="triage.restage")
        assert entry.outcome == "refused" and "no proof, no pick" in str(entry.detail)
    finally:
        services.db.close()
    # Read-only: refused before anything is read.
    ro = Services(load_config_file(cfg), readonly=True)
    try:
        with pytest.raises(ReadOnlyRefused, match="cannot restage a run"):
            triage = Operations(ro).triage
            plan = asyncio.run(triage.restage_plan(run, "node-01"))
            asyncio.run(triage.restage(plan))
    finally:
        ro.db.close()
    with pytest.raises(PolicyError, match="no proof, no pick"):
        services = Services(load_config_file(cfg))
        try:
            triage = Operations(services).triage
            asyncio.run(triage.restage(asyncio.run(triage.restage_plan(run, "node-01"))))
        finally:
            services.db.close()


async def test_S_on_the_triage_screen_restages_to_the_nodes_that_pass(  # type: ignore[no-untyped-def]
    lab: Lab, s3, store_proxy: CountingProxy, tmp_path: Path, tiny_full_dcp
) -> None:
    from textual.widgets import Static

    from tests.helpers import wait_until
    from tui.app import LoadmasterApp
    from tui.screens.triage import TriageScreen
    from tui.widgets.confirm import ConfirmModal

    src, _ = tiny_full_dcp
    assert lab.bucket
    prefix = "restage/screen-" + secrets.token_hex(3)
    upload(s3, lab.bucket, f"{prefix}/step-70", src)
    run = f"s3://{lab.bucket}/{prefix}"
    cfg = relay_config(lab, tmp_path, store_proxy, name="screen", pull=s5cmd_everywhere())
    services = Services(load_config_file(cfg))
    app = LoadmasterApp(services)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            app.open_triage(nodes=",".join(NODES), run=run)
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, TriageScreen)
            restart = screen.query_one("#triage-restart", Static)
            await wait_until(pilot, lambda: "restart from step 70" in str(restart.render()), rounds=1200, delay=0.05)
            assert screen.report is not None and not screen.report.suspects
            assert "loadmaster restage" in str(screen.query_one("#triage-commands", Static).render())
            await pilot.press("S")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmModal), rounds=1200, delay=0.05)
            await pilot.press("y")
            await wait_until(pilot, lambda: "resume-ready" in str(restart.render()), rounds=2400, delay=0.05)
            assert "resume-ready: step 70 on 2 node(s)" in str(restart.render())
    finally:
        await services.aclose()
    for node in NODES:
        assert (lab.node(node).scratch / "restart/step-70/.metadata").is_file()
