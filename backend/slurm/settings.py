"""The ``[slurm]`` config section: where loadmaster reads Slurm's nodes and jobs, and how often.

[slurm]
enabled = true
partitions = ["gpu"]          # only these partitions' nodes (default: every partition)
cluster = ""                  # a cluster of a multi-cluster site (passed as --clusters)
conf = "/etc/slurm/slurm.conf" # SLURM_CONF for the commands (default: Slurm's own lookup)
bin_dir = ""                  # where sinfo, squeue and scontrol are (default: PATH)
interval = "30s"              # at most one sinfo and one squeue per interval
timeout = "10s"               # one Slurm command may take this long
inventory = false             # true: Slurm's nodes are loadmaster's nodes ([[nodes]] override them)
url = "http://slurmctld:6820" # read nodes and jobs from slurmrestd instead (drain/resume: scontrol)
api = "v0.0.39"               # slurmrestd's API version in the path (/slurm/<api>/nodes)
token_env = "SLURM_JWT"       # the environment variable holding the JWT (never the config)
user = ""                     # X-SLURM-USER-NAME (default: the login name)
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

from backend.schema import parse_duration

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _names(value: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"expected a list of partition names, got {value!r}")
    bad = [v for v in value if not _NAME.match(v)]
    if bad:
        raise ValueError(f"not a Slurm partition name: {bad[0]!r}")
    return tuple(value)


def _url(value: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a URL string, got {value!r}")
    if not value:
        return value
    u = urllib.parse.urlsplit(value)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError("expected slurmrestd's http:// or https:// URL, e.g. http://slurmctld:6820")
    if u.username or u.password or u.query or u.fragment:
        raise ValueError("slurmrestd's URL takes no credentials, query or fragment (the JWT comes from token_env)")
    return value.rstrip("/")


def _api(value: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"v\d+\.\d+\.\d+", value):
        raise ValueError(f"expected slurmrestd's API version like v0.0.39, got {value!r}")
    return value


def _env_name(value: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", value):
        raise ValueError(f"expected an environment variable name, got {value!r}")
    return value


def _user(value: str) -> str:
    if not isinstance(value, str) or (value and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}", value)):
        raise ValueError(f"not a user name: {value!r}")
    return value


def _cluster(value: str) -> str:
    if not isinstance(value, str) or (value and not _NAME.match(value)):
        raise ValueError(f"not a Slurm cluster name: {value!r}")
    return value


@dataclass(frozen=True)
class SlurmSettings:
    """Whether Slurm is a source of node state and jobs, and how loadmaster runs its commands."""

    enabled: bool = False
    #: Only nodes of these partitions (empty: all).
    partitions: tuple[str, ...] = field(default=(), metadata={"parse": _names})
    #: The ``--clusters`` of a multi-cluster site (empty: the local one).
    cluster: str = field(default="", metadata={"parse": _cluster})
    #: ``SLURM_CONF`` for the commands (empty: Slurm's own lookup).
    conf: str = ""
    #: The directory holding ``sinfo``, ``squeue`` and ``scontrol`` (empty: PATH).
    bin_dir: str = ""
    #: Seconds between reads of Slurm's state (sinfo and squeue once each per interval).
    interval: float = field(default=30.0, metadata={"parse": parse_duration})
    #: Seconds one Slurm command may take.
    timeout: float = field(default=10.0, metadata={"parse": parse_duration})
    #: Slurm is the node inventory: its nodes, at Slurm's NodeAddr, with ``[defaults]``' connection
    #: details; a ``[[nodes]]`` entry of the same name overrides them (backend/inventory/).
    inventory: bool = False
    #: slurmrestd's URL: nodes and jobs are read from its REST API instead of sinfo and squeue
    #: (drain and resume still run scontrol). Empty: the commands.
    url: str = field(default="", metadata={"parse": _url})
    #: slurmrestd's API version, in the path: ``/slurm/<api>/nodes``.
    api: str = field(default="v0.0.39", metadata={"parse": _api})
    #: The environment variable holding slurmrestd's JWT (``X-SLURM-USER-TOKEN``); unset: none sent.
    token_env: str = field(default="SLURM_JWT", metadata={"parse": _env_name})
    #: ``X-SLURM-USER-NAME`` (empty: the login name).
    user: str = field(default="", metadata={"parse": _user})

    def __post_init__(self) -> None:
        if self.interval < 5:
            raise ValueError(f"interval must be at least 5s (slurmctld serves everyone), got {self.interval:g}s")
        if self.timeout <= 0:
            raise ValueError("timeout must be a positive duration")
