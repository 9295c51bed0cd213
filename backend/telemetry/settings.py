"""The ``[telemetry]`` config section: where samples come from (SSH, Prometheus), sampling interval,
history length, starvation thresholds."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from backend.schema import parse_duration, parse_size


def _mib(value: str | int | float) -> int:
    """A memory threshold in MiB: a bare number is MiB, a string like '4GiB' is a size."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"expected a non-negative number of MiB, got {value!r}")
        return int(value)
    return parse_size(value) // 2**20


@dataclass(frozen=True)
class TelemetrySettings:
    """How the fleet is sampled and when a node counts as GPU-starved."""

    #: Seconds between samples on every node (0.2 - 60).
    interval: float = field(default=1.0, metadata={"parse": parse_duration})
    #: How much history each node keeps (at least 15 minutes).
    history_seconds: float = field(default=900.0, metadata={"parse": parse_duration})
    #: A node is "stale" after this many intervals without a sample.
    stale_after_missed: int = 3
    #: GPUs holding more than this much memory (MiB) are considered to hold a training job.
    starved_memory_mib: int = field(default=2048, metadata={"parse": _mib})
    #: Mean utilisation (%) below which a job-holding node is "GPU starved".
    starved_util_pct: float = 50.0
    #: How long (seconds) utilisation must stay low before the alert is raised.
    starved_window: float = field(default=60.0, metadata={"parse": parse_duration})
    #: NIC receive at or above this % of line rate while starved means "input-bound".
    input_bound_pct: float = 70.0
    #: The nvidia-smi command run on nodes (a path where it is not on the login PATH).
    nvidia_smi: str = "nvidia-smi"
    #: Seconds between SSH round-trip latency probes.
    latency_every: float = field(default=10.0, metadata={"parse": parse_duration})
    #: First and largest wait (seconds) before restarting a node's stream after it failed.
    backoff_initial: float = 1.0
    backoff_max: float = 30.0
    #: Where the numbers come from: ``ssh`` (a sampler stream per node), ``prometheus`` (the
    #: site's Prometheus: dcgm-exporter and node_exporter), or ``auto`` (Prometheus for the nodes
    #: it has, SSH for the rest), or ``replay`` (a recorded Prometheus answer played from
    #: ``replay_file``: backend/telemetry/sources/replay.py).
    source: Literal["ssh", "prometheus", "auto", "replay"] = "ssh"
    #: The Prometheus HTTP API (``http://prometheus.internal:9090``).
    prometheus_url: str | None = None
    #: The label that names a node on dcgm-exporter series (dcgm-exporter sets ``Hostname``).
    dcgm_node_label: str = "Hostname"
    #: The label that names a node on node_exporter series (``instance``, port stripped).
    node_exporter_node_label: str = "instance"
    #: Seconds between Prometheus refreshes (each is a few instant queries for the whole fleet).
    prometheus_interval: float = field(default=5.0, metadata={"parse": parse_duration})
    #: The range of rate() over node_exporter counters (at least 4 scrape intervals).
    prometheus_rate_window: float = field(default=60.0, metadata={"parse": parse_duration})
    #: How long one Prometheus request may take before the source counts as unreachable.
    prometheus_timeout: float = field(default=5.0, metadata={"parse": parse_duration})
    #: With Prometheus unreachable, sample over SSH meanwhile (false: show the nodes stale).
    prometheus_fallback_ssh: bool = True
    #: The recording ``source = "replay"`` plays, one frame every ``prometheus_interval``.
    replay_file: str | None = None

    def __post_init__(self) -> None:
        if not 0.2 <= self.interval <= 60:
            raise ValueError(f"interval must be between 0.2 and 60 seconds, got {self.interval:g}")
        if self.history_seconds < 900:
            raise ValueError(f"history_seconds must be at least 900 (15 minutes), got {self.history_seconds:g}")
        if self.stale_after_missed < 1:
            raise ValueError(f"stale_after_missed must be at least 1, got {self.stale_after_missed}")
        if not 0 < self.starved_util_pct <= 100:
            raise ValueError(f"starved_util_pct must be in (0, 100], got {self.starved_util_pct:g}")
        if not 0 < self.input_bound_pct <= 100:
            raise ValueError(f"input_bound_pct must be in (0, 100], got {self.input_bound_pct:g}")
        if self.starved_window <= 0:
            raise ValueError(f"starved_window must be positive, got {self.starved_window:g}")
        if self.latency_every <= 0:
            raise ValueError(f"latency_every must be positive, got {self.latency_every:g}")
        if not 0 < self.backoff_initial <= self.backoff_max:
            raise ValueError("backoff_initial must be positive and not above backoff_max")
        if not self.nvidia_smi.strip():
            raise ValueError("nvidia_smi must name a command")
        if self.source == "replay" and not self.replay_file:
            raise ValueError('source = "replay" needs replay_file (a recording of Prometheus answers)')
        if self.source in ("prometheus", "auto") and not self.prometheus_url:
            raise ValueError(f'source = "{self.source}" needs prometheus_url (http://host:9090)')
        if self.prometheus_url and not self.prometheus_url.startswith(("http://", "https://")):
            raise ValueError(f"prometheus_url must be an http:// or https:// URL, got {self.prometheus_url!r}")
        if not 1 <= self.prometheus_interval <= 300:
            raise ValueError(f"prometheus_interval must be between 1 and 300 seconds, got {self.prometheus_interval:g}")
        if self.prometheus_rate_window < 2:
            raise ValueError(f"prometheus_rate_window must be at least 2 seconds, got {self.prometheus_rate_window:g}")
        if self.prometheus_timeout <= 0:
            raise ValueError("prometheus_timeout must be positive")

    @property
    def history_capacity(self) -> int:
        """Samples kept per metric: history_seconds at the sampling interval."""
        return int(round(self.history_seconds / self.interval))
