"""A retention apply that strips reads each strip's step from the store into the console (the BF16
export is written here): quoted, reserved and settled like a pull (#28), at ``[egress]
console_site``. Real DCP checkpoints in SeaweedFS S3."""

from __future__ import annotations

import dataclasses

import pytest
from retention_helpers import DcpRun  # type: ignore[import-not-found]
from test_retention_apply import POLICY, listing  # type: ignore[import-not-found]

from backend.errors import PolicyError
from backend.ops import Operations
from backend.policy.egress import EgressSettings
from backend.retention import compute_plan
from backend.services import Services


def _with_egress(services: Services, **egress: object) -> Services:
    sections = {**services.config.sections, "egress": EgressSettings(**egress)}  # type: ignore[arg-type]
    return Services(dataclasses.replace(services.config, sections=sections))


def _ledger(services: Services) -> list[dict[str, object]]:
    return [
        dict(r) for r in services.db.query("SELECT job_id, state, bytes, quoted_bytes, dest_site FROM egress_ledger")
    ]


async def test_a_block_budget_refuses_the_apply_before_anything_is_read_or_changed(
    s3, s3_services, dcp_run: DcpRun
) -> None:  # type: ignore[no-untyped-def]
    url = dcp_run.upload(s3, s3_services.config.stores["ckpt"].url.removeprefix("s3://"))
    plan = await compute_plan(s3_services, url, POLICY)
    assert any(a.action == "strip-to-weights" for a in plan.actions)
    blocked = _with_egress(s3_services, per_transfer_limit_usd=0.0000001, action="block")
    try:
        async with blocked.stores.open(url) as store:
            before = await listing(store)
            with pytest.raises(PolicyError, match="egress guard blocks this retention strip"):
                await Operations(blocked).retention.apply(plan)
            assert await listing(store) == before  # no export written, nothing deleted
        assert _ledger(blocked) == []
        assert blocked.db.audit_entries(action="retention.apply") == []
    finally:
        blocked.db.close()


async def test_the_strips_are_reserved_then_settled_at_the_console_site(s3, s3_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    url = dcp_run.upload(s3, s3_services.config.stores["ckpt"].url.removeprefix("s3://"))
    plan = await compute_plan(s3_services, url, POLICY)
    strips = [a for a in plan.actions if a.action == "strip-to-weights"]
    services = _with_egress(s3_services, console_site="aws:eu-west-1")
    try:
        report = await Operations(services).retention.apply(plan)
        assert report.ok, report.as_dict()
        (row,) = _ledger(services)
        want = sum(a.bytes_before for a in strips)
        assert str(row["job_id"]).startswith(f"retention-{plan.hash[:12]}-")
        assert (row["state"], row["bytes"], row["quoted_bytes"], row["dest_site"]) == (
            "settled",
            want,
            want,
            "aws:eu-west-1",
        )
        # A plan with nothing left to strip reserves nothing more.
        again = await Operations(services).retention.apply(plan)
        assert again.count("done") == 0
        assert len(_ledger(services)) == 2 and _ledger(services)[1]["state"] == "released"
    finally:
        services.db.close()


async def test_a_strip_run_here_is_reserved_and_settled_at_what_it_read(s3, s3_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    """`ckpt strip` without --node reads the step into this machine: the same reservation, settled
    to the strip's own count of source bytes; a block budget refuses it before anything is written."""
    from backend.ops.checkpoints import StripRequest

    url = dcp_run.upload(s3, s3_services.config.stores["ckpt"].url.removeprefix("s3://"))
    blocked = _with_egress(s3_services, per_transfer_limit_usd=0.0000001, action="block")
    try:
        async with blocked.stores.open(url) as store:
            before = await listing(store)
            with pytest.raises(PolicyError, match="egress guard blocks this strip"):
                await Operations(blocked).checkpoints.strip(StripRequest(src=f"{url}/step-4000"))
            assert await listing(store) == before
        assert _ledger(blocked) == []
    finally:
        blocked.db.close()
    services = _with_egress(s3_services, console_site="aws:us-east-1")
    try:
        done = await Operations(services).checkpoints.strip(StripRequest(src=f"{url}/step-4000"))
        (row,) = _ledger(services)
        assert str(row["job_id"]).startswith("strip-") and row["state"] == "settled"
        assert row["bytes"] == done.result.source_bytes_read > 0 and row["dest_site"] == "aws:us-east-1"
        assert int(str(row["quoted_bytes"])) >= int(str(row["bytes"]))
    finally:
        services.db.close()


async def test_an_apply_refused_by_another_applys_lock_reads_nothing_and_releases(
    s3, s3_services, dcp_run: DcpRun
) -> None:  # type: ignore[no-untyped-def]
    """A refusal before any action (another apply holds the run) counts nothing: released."""
    from backend.retention.runs import ApplyLock

    url = dcp_run.upload(s3, s3_services.config.stores["ckpt"].url.removeprefix("s3://"))
    plan = await compute_plan(s3_services, url, POLICY)
    async with s3_services.stores.open(url) as store, ApplyLock(store, plan.prefix, run=plan.url, plan=plan.hash):
        with pytest.raises(PolicyError, match="already running"):
            await Operations(s3_services).retention.apply(plan)
    (row,) = _ledger(s3_services)
    assert row["state"] == "released"
