"""The [telemetry] section: defaults, validation with the key path in the message."""

from __future__ import annotations

import pytest

from backend.config import parse_config
from backend.errors import ConfigError
from backend.schema import parse_section
from backend.telemetry.settings import TelemetrySettings


def test_defaults():
    s = TelemetrySettings()
    assert s.interval == 1.0 and s.history_seconds >= 900
    assert s.starved_util_pct == 50 and s.starved_window == 60 and s.input_bound_pct == 70


def test_parse_durations_and_sizes():
    s = parse_section(
        TelemetrySettings,
        {"interval": "500ms", "history_seconds": "30m", "starved_memory_mib": "8GiB", "starved_window": "2m"},
        file="f.toml",
        key="telemetry",
    )
    assert (s.interval, s.history_seconds, s.starved_memory_mib, s.starved_window) == (0.5, 1800.0, 8192, 120.0)
    assert s.history_capacity == 3600


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ({"interval": 0.1}, "between 0.2 and 60"),
        ({"interval": 61}, "between 0.2 and 60"),
        ({"history_seconds": 60}, "at least 900"),
        ({"starved_util_pct": 0}, "starved_util_pct"),
        ({"intervall": 1}, "telemetry.intervall"),
    ],
)
def test_bad_values_name_the_key(raw, needle):
    with pytest.raises(ConfigError) as exc:
        parse_section(TelemetrySettings, raw, file="lm.toml", key="telemetry")
    assert needle in str(exc.value) and "lm.toml" in str(exc.value)


def test_config_section_without_the_table():
    cfg = parse_config({"nodes": [{"name": "a", "host": "h"}]}, file="x.toml")
    assert cfg.section(TelemetrySettings) == TelemetrySettings()
