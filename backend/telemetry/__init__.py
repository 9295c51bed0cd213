"""Live fleet telemetry: GPU (nvidia-smi), NIC (/proc/net/dev) and disk (/proc/diskstats) sampling.

One long-lived stream per node prints framed blocks (see :mod:`backend.telemetry.sampler`); pure
parsers turn a block into counters (:mod:`backend.telemetry.parse`); the hub
(:mod:`backend.telemetry.hub`) turns counters into rates, history and starvation alerts, and hands
front ends immutable :class:`~backend.telemetry.model.FleetSnapshot` objects.
"""
