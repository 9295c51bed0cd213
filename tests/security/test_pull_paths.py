"""A pull writes only inside DEST: keys with '..', absolute keys, control characters and symlinks
in DEST are refused at listing time, before launch, and again by the runner on the node.

The hostile responder serves the keys SeaweedFS refuses to store; the symlink cases use the
lab's real SeaweedFS. Every pull is a real job on a lab node running the real s5cmd.
"""

from __future__ import annotations

import posixpath
import secrets
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.errors import StoreError
from backend.pulls.objects import PulledObject, check_objects, parse_source, rel_problem
from backend.services import Services
from lab import Lab
from tests.pulls_helpers import launch_pull, plan_pull
from tests.security.conftest import HOSTILE_KEY_ID, HOSTILE_SECRET
from tests.security.hostile_s3 import HostileS3, md5_etag

pytestmark = pytest.mark.timeout(240)

HOSTILE_SECRETS = {"AWS_ACCESS_KEY_ID": HOSTILE_KEY_ID, "AWS_SECRET_ACCESS_KEY": HOSTILE_SECRET}

# -- the rule, as a property ----------------------------------------------------------------------

_segments = st.sampled_from(["..", ".", "", "a", "b.bin", "x y", "\n", "\x00", "\u2028", "\x85", "~", "*"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_segments, min_size=1, max_size=6), st.booleans())
def test_an_accepted_name_stays_inside_dest_as_written(segments: list[str], absolute: bool) -> None:
    rel = ("/" if absolute else "") + "/".join(segments)
    if rel_problem(rel) is None:
        joined = "/dest/" + rel
        # Nothing to normalise away: the path s5cmd is given is the path that gets written.
        assert posixpath.normpath(joined) == joined
        assert joined.startswith("/dest/") and not joined.endswith("/")
        assert not any(c in rel for c in "\n\x00\u2028\x85")
    else:
        with pytest.raises(StoreError, match="refusing to pull"):
            check_objects(parse_source("s3://b/p/"), [PulledObject(rel, 1)])


def test_file_and_folder_at_one_path_are_refused() -> None:
    with pytest.raises(StoreError, match="folder of other keys"):
        check_objects(parse_source("s3://b/p/"), [PulledObject("a", 1), PulledObject("a/b", 1)])


# -- refused at listing time, before anything is launched -----------------------------------------

ESCAPING_KEYS = [
    ("data/../../{canary}", "'..' segment"),
    ("data//tmp/{canary}", "absolute path"),
    ("data/line\nbreak-{canary}", "control character"),
    ("data/./{canary}", "'.' segment"),
    ("data/dir/{canary}/", "empty segment"),
]


@pytest.mark.parametrize(("template", "why"), ESCAPING_KEYS)
async def test_escaping_key_refuses_the_pull_before_launch(
    hostile_s3: HostileS3, hostile_services: Services, lab: Lab, template: str, why: str
) -> None:
    canary = "canary-" + secrets.token_hex(4)
    key = template.format(canary=canary)
    hostile_s3.put("evil", "data/ok.bin", b"fine" * 100)
    hostile_s3.put("evil", key, b"evil bytes")
    for with_creds in (False, True):  # the S3-client listing and the s5cmd listing the launch uses
        from backend.pulls.listing import list_source
        from backend.pulls.plan import resolve_store

        with pytest.raises(StoreError) as err:
            await list_source(
                parse_source("s3://evil/data/"),
                resolve_store(hostile_services.config, "s3://evil/data/", "hostile"),
                credentials=with_creds,
            )
        assert why in str(err.value) and canary in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(StoreError, match="refusing to pull"):
        await plan_pull(hostile_services, "s3://evil/data/", "pulls/sec-escape", ["node-01"], store="hostile")
    assert hostile_services.jobs.records() == []
    assert not list(lab.node("node-01").root.rglob(f"*{canary}*"))


# -- refused again by the runner on the node ------------------------------------------------------


async def _run_forged(
    svc: Services, lab: Lab, hostile: HostileS3, expected: list[list[object]] | None, dest_rel: str
) -> tuple[str, str | None]:
    dest = str(lab.node("node-01").scratch / dest_rel)
    params = {
        "src": "s3://evil/data/",
        "dest": dest,
        "endpoint_url": hostile.endpoint,
        "region": "us-east-1",
        "numworkers": 4,
        "concurrency": 2,
        "part_size_mib": 5,
        "expected": expected,
    }
    rec = await svc.jobs.launch("node-01", "pull", params, secrets=HOSTILE_SECRETS)
    final = await svc.jobs.wait(rec.id, timeout=120)
    return final.state, final.error


async def test_runner_refuses_a_forged_spec(hostile_s3: HostileS3, hostile_services: Services, lab: Lab) -> None:
    canary = "canary-" + secrets.token_hex(4)
    hostile_s3.put("evil", "data/ok.bin", b"ok")
    hostile_s3.put("evil", f"data/../../{canary}", b"evil")
    for rel, why in ((f"../../{canary}", "'..' segment"), (f"/tmp/{canary}", "absolute path")):
        state, error = await _run_forged(
            hostile_services, lab, hostile_s3, [["ok.bin", 2, md5_etag(b"ok")], [rel, 4, None]], "pulls/sec-forged"
        )
        assert state == "failed" and why in (error or ""), error
    assert not list(lab.node("node-01").root.rglob(f"*{canary}*"))
    assert not Path(f"/tmp/{canary}").exists()
    assert not any((lab.node("node-01").scratch / "pulls/sec-forged").glob("*"))  # nothing pulled at all


async def test_runner_refuses_escaping_keys_in_its_own_listing(
    hostile_s3: HostileS3, hostile_services: Services, lab: Lab
) -> None:
    canary = "canary-" + secrets.token_hex(4)
    hostile_s3.put("evil", "data/ok.bin", b"ok")
    hostile_s3.put("evil", f"data/../../{canary}", b"evil")
    state, error = await _run_forged(hostile_services, lab, hostile_s3, None, "pulls/sec-nodelist")
    assert state == "failed" and "'..' segment" in (error or "") and canary in (error or ""), error
    assert not list(lab.node("node-01").root.rglob(f"*{canary}*"))


# -- symlinks in DEST (the real SeaweedFS and s5cmd) ----------------------------------------------


@pytest.fixture
def linked_source(lab: Lab, s3) -> str:  # type: ignore[no-untyped-def]
    prefix = "sec-links-" + secrets.token_hex(3)
    client = s3.client()
    for name, body in {"top.bin": b"top" * 1000, "sub/file.bin": b"sub" * 1000}.items():
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{name}", Body=body)
    return f"s3://{lab.bucket}/{prefix}/"


def _services(lab: Lab, tmp_path: Path) -> Services:
    from backend.config import load_config_file
    from tests.helpers import write_lab_config

    return Services(config=load_config_file(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")))


async def test_symlink_in_dest_leading_out_is_refused_and_nothing_is_written(
    lab: Lab, linked_source: str, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("the operator's")
    node_scratch = lab.node("node-01").scratch
    svc = _services(lab, tmp_path)
    try:
        for name, make in (
            ("dir", lambda d: (d / "sub").symlink_to(outside)),
            ("file", lambda d: (d / "top.bin").symlink_to(outside / "precious")),
        ):
            dest = node_scratch / f"pulls/sec-link-{name}-{secrets.token_hex(2)}"
            dest.mkdir(parents=True)
            make(dest)
            plan = await plan_pull(svc, linked_source, str(dest), ["node-01"])
            [rec] = await launch_pull(svc, plan)
            final = await svc.jobs.wait(rec.id, timeout=120)
            assert final.state == "failed", final.error
            assert "symlink" in (final.error or "") and "nothing was pulled" in (final.error or ""), final.error
            assert sorted(p.name for p in outside.iterdir()) == ["precious"]
            assert (outside / "precious").read_text() == "the operator's"  # noqa: ASYNC240
            assert not (dest / "top.bin").exists() or (dest / "top.bin").is_symlink()
        # A symlink that stays inside DEST is the operator's own layout: the pull goes through it.
        dest = node_scratch / f"pulls/sec-link-inside-{secrets.token_hex(2)}"
        (dest / "real-sub").mkdir(parents=True)
        (dest / "sub").symlink_to(dest / "real-sub")
        plan = await plan_pull(svc, linked_source, str(dest), ["node-01"])
        [rec] = await launch_pull(svc, plan)
        final = await svc.jobs.wait(rec.id, timeout=120)
        assert final.state == "succeeded", final.error
        assert (dest / "real-sub" / "file.bin").read_bytes() == b"sub" * 1000  # noqa: ASYNC240
    finally:
        await svc.aclose()
