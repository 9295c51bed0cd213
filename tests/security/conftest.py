"""Fixtures for the attacker's tests. Several engineers add fixtures here: append, never rewrite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from backend.config import load_config_file
from backend.services import Services
from lab import Lab
from tests.helpers import write_lab_config
from tests.security.hostile_s3 import HostileS3

# -- the hostile S3 responder (pulls, uploads, deletes) -------------------------------------------

HOSTILE_KEY_ID = "HOSTILEKEYID"
HOSTILE_SECRET = "hostile-secret-key-never-in-argv"


@pytest.fixture
def hostile_s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[HostileS3]:
    """A hostile S3 endpoint on 127.0.0.1 (a free port) with bucket ``evil``; its keys are in
    the environment, where a profile-less store's credential chain finds them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", HOSTILE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", HOSTILE_SECRET)
    server = HostileS3().start()
    server.bucket("evil")
    try:
        yield server
    finally:
        server.stop()


def hostile_store_section(server: HostileS3, *, checksum: str | None = None) -> str:
    """A ``[stores.hostile]`` config section for the responder (no profile: env credentials)."""
    lines = [
        "",
        "[stores.hostile]",
        'url = "s3://evil"',
        f'endpoint_url = "{server.endpoint}"',
        'region = "us-east-1"',
        'addressing_style = "path"',
    ]
    if checksum:
        lines.append(f'checksum = "{checksum}"')
    return "\n".join(lines) + "\n"


@pytest.fixture
async def hostile_services(lab: Lab, hostile_s3: HostileS3, tmp_path: Path) -> AsyncIterator[Services]:
    """Services over the lab's nodes with the hostile responder as store ``hostile``."""
    cfg = write_lab_config(lab, tmp_path / "hostile.toml", tmp_path / "state", hostile_store_section(hostile_s3))
    svc = Services(config=load_config_file(cfg))
    try:
        yield svc
    finally:
        await svc.aclose()


# -- a really full file system (ENOSPC): a small tmpfs --------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs mounted at ``tmp_path/full``: writes past 1 MiB fail with ENOSPC.

    Mounting needs root (CAP_SYS_ADMIN); elsewhere the test is skipped with the reason.
    """
    import os
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("a real full file system needs a tmpfs mount, which needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
