"""A versioned bucket keeps what a delete removes: on real SeaweedFS with versioning Enabled or
Suspended, the plan says "hides", claims no bytes or dollars saved, and names why; the apply counts
nothing as freed, reports the hidden bytes, and the noncurrent versions are still there. A bucket
that will not say (GetBucketVersioning refused) is treated as keeping versions."""

from __future__ import annotations

import pytest
from retention_helpers import DcpRun  # type: ignore[import-not-found]

from backend.policy.retention import RetentionPlan, RetentionPolicy
from backend.retention import apply_plan, compute_plan
from backend.storage import S3Store
from tui.cli import main

pytestmark = pytest.mark.usefixtures("lock_read_back_at_once")
POLICY = RetentionPolicy(keep_full_latest=2, milestone_every=4000)


def _bucket(services) -> str:  # type: ignore[no-untyped-def]
    return services.config.stores["ckpt"].url.removeprefix("s3://")


@pytest.mark.parametrize("status", ["Enabled", "Suspended"])
async def test_a_plan_on_a_versioned_bucket_hides_and_frees_nothing(  # type: ignore[no-untyped-def]
    s3, s3_services, dcp_run: DcpRun, status: str
) -> None:
    bucket = _bucket(s3_services)
    s3.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    url = dcp_run.upload(s3, bucket)
    if status == "Suspended":  # the versions written while Enabled stay whatever happens next
        s3.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Suspended"})
    plan = await compute_plan(s3_services, url, POLICY)
    assert plan.versioning == status and plan.keeps_versions
    assert plan.totals.bytes_saved > 0 and plan.totals.usd_month_saved is None  # no dollars claimed
    assert status in plan.versions_note() and "billed" in plan.versions_note()
    # the plan file keeps it, under its hash
    again = RetentionPlan.from_json(plan.to_json())
    assert again.versioning == status and again.hash == plan.hash

    report = await apply_plan(s3_services, plan)
    assert report.ok, report.as_dict()
    deleted = [o for o in report.outcomes if o.action == "delete" and o.outcome == "done"]
    assert deleted and all(o.bytes_freed == 0 and o.bytes_hidden > 0 for o in deleted)
    assert report.bytes_hidden >= sum(o.bytes_hidden for o in deleted) and "lifecycle" in report.hidden_note()
    # what was "deleted" no longer lists, and every byte of it is still stored as a version
    c = s3.client()
    listed = {o["Key"] for o in c.list_objects_v2(Bucket=bucket, Prefix="run1/").get("Contents", [])}
    versions = c.list_object_versions(Bucket=bucket, Prefix="run1/")
    noncurrent = {v["Key"]: v["Size"] for v in versions.get("Versions", []) if not v.get("IsLatest")}
    gone = [f"run1/{o.path}" for o in deleted]
    assert all(o.path.startswith("step-") for o in deleted)
    assert not [k for k in listed if any(k.startswith(p + "/") for p in gone)]
    assert sum(v for k, v in noncurrent.items() if any(k.startswith(p + "/") for p in gone)) == sum(
        o.bytes_hidden for o in deleted
    )
    (entry,) = s3_services.db.audit_entries(action="retention.apply")
    assert entry.detail["bytes_freed"] == report.bytes_freed and entry.detail["bytes_hidden"] == report.bytes_hidden


async def test_an_unversioned_bucket_still_saves(s3, s3_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    url = dcp_run.upload(s3, _bucket(s3_services))
    plan = await compute_plan(s3_services, url, POLICY)
    assert plan.versioning == "" and not plan.keeps_versions and plan.versions_note() == ""
    assert plan.totals.usd_month_saved is not None and plan.totals.usd_month_saved > 0
    assert "versioning" not in plan.body()  # a plan file from before the field keeps its hash


async def test_a_bucket_that_will_not_say_is_treated_as_keeping_versions(  # type: ignore[no-untyped-def]
    s3, s3_services, dcp_run: DcpRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = dcp_run.upload(s3, _bucket(s3_services))
    from botocore.exceptions import ClientError

    async def refused(self, **kw):  # type: ignore[no-untyped-def]
        raise ClientError(
            {"Error": {"Code": "AccessDenied", "Message": "s3:GetBucketVersioning"}}, "GetBucketVersioning"
        )

    real_client = S3Store.client

    async def client(self):  # type: ignore[no-untyped-def]
        c = await real_client(self)
        monkeypatch.setattr(type(c), "get_bucket_versioning", refused, raising=False)
        return c

    monkeypatch.setattr(S3Store, "client", client)
    plan = await compute_plan(s3_services, url, POLICY)
    assert plan.versioning.startswith("unknown (") and "access denied" in plan.versioning and plan.keeps_versions
    assert "\n" not in plan.versions_note() and plan.totals.usd_month_saved is None


def test_the_cli_plan_and_apply_say_it(  # type: ignore[no-untyped-def]
    lab, s3, dcp_run: DcpRun, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = s3.new_bucket("ver")
    s3.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    url = dcp_run.upload(s3, bucket)
    cfg = tmp_path / "loadmaster.toml"
    cfg.write_text(
        "\n".join(
            [
                "[stores.ckpt]",
                f'url = "s3://{bucket}"',
                f'endpoint_url = "{s3.endpoint}"',
                'provider = "aws"',
                f'region = "{s3.region}"',
                'profile = "lab"',
                'addressing_style = "path"',
                "[state]",
                f'dir = "{tmp_path / "state"}"',
                "",
            ]
        )
    )
    plan_file = tmp_path / "plan.json"
    args = ["--config", str(cfg), "retention"]
    assert main([*args, "plan", url, "--keep-full", "2", "--milestones", "4000,8000", "--out", str(plan_file)]) == 0
    out = capsys.readouterr().out
    assert "frees nothing now" in out and "saves" not in out and "/month saved" not in out
    assert "note: the bucket keeps versions (versioning Enabled)" in out
    assert main([*args, "apply", str(plan_file), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "freed 0 B" in out
    assert "note: " in out and "only hidden behind delete markers" in out and "lifecycle rule" in out


async def test_the_console_says_it_at_80x24(s3, s3_services, dcp_run: DcpRun) -> None:  # type: ignore[no-untyped-def]
    """The retention screen's summary says "hides … nothing is freed" where it says "saves", and
    the typed confirmation says why before anything runs."""
    from tests.firsthour.screen_text import screen_lines
    from tests.retention.test_retention_screen import settle_workers
    from tui.app import LoadmasterApp
    from tui.widgets.confirm import ConfirmTyped

    bucket = _bucket(s3_services)
    s3.client().put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    url = dcp_run.upload(s3, bucket)
    app = LoadmasterApp(s3_services, mode="retention")
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await pilot.press("o")
        await pilot.press(*url, "enter")
        await settle_workers(pilot)
        assert screen.plan is not None and screen.plan.keeps_versions
        shown = " ".join(" ".join(screen_lines(app)).split())
        assert "hides" in shown and "keeps versions, nothing is freed" in shown and "saves" not in shown
        assert "Hides" in shown and "hidden 486" in shown and "freed 4" not in shown  # the column, the bar
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmTyped)
        dialog = " ".join(" ".join(screen_lines(app)).split())
        assert "Frees nothing now" in dialog and "keeps versions" in dialog
