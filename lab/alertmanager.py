"""The real Alertmanager on loopback, for the tests and the lab.

Debian's ``prometheus-alertmanager`` (0.25.0 here) and ``amtool``, started by our code as plain
processes the way an operator starts them; nothing here touches their systemd services.

:class:`AlertmanagerServer` writes a generated config (JSON, which is YAML): one route to one
receiver, ``loadmaster``, that has a webhook (``webhook_url``, ``send_resolved``) or nothing at all
(a receiver with no integrations notifies nobody). ``group_by``, ``group_wait``, ``group_interval``
and ``repeat_interval`` are settable; the tests make them short. Flags: ``--config.file``,
``--storage.path`` under the server's root (silences and the notification log are snapshotted
there on stop and read back on start; alerts live in memory only), ``--web.listen-address``,
``--cluster.listen-address=`` (empty: no gossip, no HA, no settle wait before notifications) and
the default ``--data.retention``. Ready when ``/-/ready`` answers 200.

:meth:`AlertmanagerServer.amtool` runs the real ``amtool`` against the server
(``--alertmanager.url``) with ``HOME`` pointed at the server's root, so no operator's
``~/.config/amtool/config.yml`` changes what the tests see.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from backend.errors import LoadmasterError
from lab.ports import free_port
from lab.process import ManagedProcess, http_ok, write_json_config
from lab.prometheus import PrometheusNotInstalled, _duration, find_binary

ALERTMANAGER_INSTALL_HINT = "apt-get install prometheus-alertmanager (Debian's package ships amtool too)"
#: The one receiver of the generated config.
RECEIVER = "loadmaster"


class AlertmanagerNotInstalled(LoadmasterError):
    """prometheus-alertmanager or amtool was not found."""


class AlertmanagerLabError(LoadmasterError):
    """The lab Alertmanager could not start or answer, or amtool failed."""


def _find(names: list[str]) -> str:
    try:
        return find_binary(names, ALERTMANAGER_INSTALL_HINT)
    except PrometheusNotInstalled as exc:
        raise AlertmanagerNotInstalled(str(exc)) from None


def find_alertmanager() -> str:
    return _find(["prometheus-alertmanager", "alertmanager"])


def find_amtool() -> str:
    return _find(["amtool"])


class AlertmanagerServer(ManagedProcess):
    """The real Alertmanager on ``ip:port`` (a free port if None); config, data and log under ``root``.
    Started, it is ready when ``/-/ready`` answers 200; stopped, SIGTERM to its process group and
    SIGKILL after 20 s: nothing is left running."""

    error = AlertmanagerLabError

    def __init__(
        self,
        root: Path,
        ip: str = "127.0.0.1",
        port: int | None = None,
        *,
        webhook_url: str | None = None,
        send_resolved: bool = True,
        group_by: Iterable[str] = ("alertname",),
        group_wait: float = 30.0,
        group_interval: float = 300.0,
        repeat_interval: float = 4 * 3600.0,
        extra_args: Iterable[str] = (),
    ) -> None:
        self.root = Path(root).absolute()
        self.ip = ip
        self.port = port or free_port(ip)
        self.webhook_url = webhook_url
        self.send_resolved = send_resolved
        self.group_by = tuple(group_by)
        self.group_wait = float(group_wait)
        self.group_interval = float(group_interval)
        self.repeat_interval = float(repeat_interval)
        self.extra_args = tuple(extra_args)

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    @property
    def config_path(self) -> Path:
        return self.root / "alertmanager.yml"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "alertmanager.log"

    # -- config -----------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """One route to :data:`RECEIVER`, with the webhook when one is set."""
        receiver: dict[str, Any] = {"name": RECEIVER}
        if self.webhook_url:
            receiver["webhook_configs"] = [{"url": self.webhook_url, "send_resolved": self.send_resolved}]
        return {
            "route": {
                "receiver": RECEIVER,
                "group_by": list(self.group_by),
                "group_wait": _duration(self.group_wait),
                "group_interval": _duration(self.group_interval),
                "repeat_interval": _duration(self.repeat_interval),
            },
            "receivers": [receiver],
        }

    def write_config(self) -> Path:
        return write_json_config(self.config_path, self.config())

    # -- lifecycle --------------------------------------------------------------------------
    def args(self) -> list[str]:
        return [
            find_alertmanager(),
            f"--config.file={self.config_path}",
            f"--storage.path={self.data_dir}",
            f"--web.listen-address={self.address}",
            "--cluster.listen-address=",
            *self.extra_args,
        ]

    def before_start(self) -> None:
        self.write_config()
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def ready(self) -> bool:
        return http_ok(f"{self.url}/-/ready")

    def start_failure(self) -> str:
        return f"Alertmanager did not become ready on {self.url}"

    # -- amtool -------------------------------------------------------------------------------
    def amtool(self, *args: str, timeout: float = 30.0) -> str:
        """Run the real ``amtool --alertmanager.url=URL ARGS...``; its stdout, or an
        :class:`AlertmanagerLabError` with the tail of its output when it fails."""
        cmd = [find_amtool(), f"--alertmanager.url={self.url}", *args]
        env = {**os.environ, "HOME": str(self.root)}
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL, check=False
            )
        except subprocess.TimeoutExpired:
            raise AlertmanagerLabError(f"amtool {' '.join(args)} against {self.url} took over {timeout:g}s") from None
        if proc.returncode != 0:
            tail = " | ".join(ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip())[-300:]
            raise AlertmanagerLabError(
                f"amtool {' '.join(args)} against {self.url} exited {proc.returncode}: {tail or 'no output'}"
            )
        return proc.stdout
