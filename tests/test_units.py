"""backend.units: the text of bytes, rates, ages, durations and dollars (property tests and the fixed cases).

Each format is read back by a small parser here, so the properties are about numbers: the text never
raises and stays short on any finite input, reads back close to the value, and never orders two values
the wrong way round.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.policy.egress import tier_lines
from backend.policy.prices import TierSlice
from backend.schema import parse_duration
from backend.shards.manifest import RequestArithmetic
from backend.units import (
    UNKNOWN,
    age_of,
    age_text,
    bytes_gib_text,
    bytes_text,
    duration_spec,
    duration_text,
    gbps_text,
    rate_text,
    usd_text,
)

#: Any finite non-negative float, from 0 to the largest double.
finite = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
#: Non-negative values in the range the product meets (under 10^30: past a quetta-anything nothing is real).
realistic = st.floats(min_value=0, max_value=1e30, allow_nan=False, allow_infinity=False)
anything = st.one_of(st.none(), st.floats(), st.integers(min_value=-(10**40), max_value=10**40))

_BYTE_UNITS = {
    "B": 1,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "PB": 10**15,
    "EB": 10**18,
    "ZB": 10**21,
    "YB": 10**24,
    "RB": 10**27,
    "QB": 10**30,
}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_bytes(text: str) -> float:
    number, unit = text.split(" ")
    return float(number.replace(",", "")) * _BYTE_UNITS[unit]


def parse_usd(text: str) -> float:
    """The amount a text stands for; ``<$0.01`` as just under a cent (it is, by the rule)."""
    if text == "<$0.01":
        return 0.005
    assert text.startswith("$"), text
    return float(text[1:].replace(",", ""))


def parse_gbps(text: str) -> float:
    number, unit = text.split(" ")
    assert unit == "Gbps", text
    return 0.005 if number == "<0.01" else float(number)


def parse_clock(text: str) -> float:
    """``3d``, ``1h02m``, ``<1s``, ``1.2e+05d`` as seconds."""
    if text == "<1s":
        return 0.5
    parts = re.fullmatch(r"([0-9.e+]+)([smhd])(?:([0-9]+)([smhd]))?", text)
    assert parts, text
    total = float(parts[1]) * _SECONDS[parts[2]]
    if parts[3]:
        total += int(parts[3]) * _SECONDS[parts[4]]
    return total


# -- never raises, stays short ------------------------------------------------------------------------


@given(anything)
def test_every_function_takes_any_number_or_none(x: float | int | None) -> None:
    for fn in (bytes_text, bytes_gib_text, gbps_text, rate_text, usd_text, age_text, duration_text):
        text = fn(x)
        assert isinstance(text, str) and text
        if x is None or (isinstance(x, float) and not math.isfinite(x)):
            assert text == UNKNOWN


@given(finite)
def test_texts_stay_short_on_any_finite_input(x: float) -> None:
    assert len(bytes_text(x)) <= 10
    assert len(bytes_gib_text(x)) <= 24
    assert len(gbps_text(x)) <= 13
    assert len(rate_text(x)) <= 13
    assert len(usd_text(x)) <= 19
    assert len(age_text(x)) <= 9
    assert len(duration_text(x)) <= 9
    # A negative value is the same text behind a minus sign.
    if x > 0:
        assert bytes_text(-x) == "-" + bytes_text(x) and usd_text(-x) == "-" + usd_text(x)


# -- reads back close to the value -------------------------------------------------------------------


@given(realistic)
def test_bytes_read_back_within_the_last_digit(n: float) -> None:
    text = bytes_text(n)
    back = parse_bytes(text)
    unit = _BYTE_UNITS[text.split(" ")[1]]
    assert back <= n + 0.05 * unit + 1e-9 * n and back >= n - 0.05 * unit - 1e-9 * n - (1 if unit == 1 else 0)


@given(realistic)
def test_the_binary_size_beside_is_the_same_count(n: float) -> None:
    text = bytes_gib_text(n)
    if n < 1000:
        assert text == bytes_text(n)
        return
    decimal, binary = re.fullmatch(r"(.+) \((.+)\)", text).groups()  # type: ignore[union-attr]
    assert decimal == bytes_text(n)
    number, unit = binary.split(" ")
    scale = {
        "B": 1,
        "KiB": 2**10,
        "MiB": 2**20,
        "GiB": 2**30,
        "TiB": 2**40,
        "PiB": 2**50,
        "EiB": 2**60,
        "ZiB": 2**70,
        "YiB": 2**80,
        "RiB": 2**90,
        "QiB": 2**100,
    }[unit]
    assert abs(float(number) * scale - n) <= 0.05 * scale + 1e-9 * n


@given(st.floats(min_value=0.01, max_value=1e11))
def test_dollars_read_back_to_the_cent(x: float) -> None:
    assert abs(parse_usd(usd_text(x)) - x) <= 0.005 + 1e-9 * x


@given(st.floats(min_value=0, max_value=1e5))
def test_rates_read_back_within_the_last_digit(g: float) -> None:
    back = parse_gbps(gbps_text(g))
    assert abs(back - g) <= (0.05 if g >= 9.995 else 0.005) + 1e-9 * g
    assert rate_text(g * 1e9 / 8) == gbps_text(g * 1e9 / 8 * 8 / 1e9)


@given(st.floats(min_value=1, max_value=1e8))
def test_durations_read_back_within_their_smaller_unit(s: float) -> None:
    text = duration_text(s)
    minor = _SECONDS[text[-1]]
    assert abs(parse_clock(text) - s) <= minor  # rounded to the second, then cut to two units


@given(st.floats(min_value=0, max_value=1e8))
def test_ages_round_down_to_their_unit(s: float) -> None:
    text = age_text(s)
    unit = _SECONDS[text[-1]]
    assert parse_clock(text) <= s < parse_clock(text) + unit


@given(
    st.one_of(
        st.integers(min_value=0, max_value=10**12).map(float), st.floats(min_value=0, max_value=1e12, allow_nan=False)
    )
)
def test_a_duration_setting_reads_back_exactly(s: float) -> None:
    assert parse_duration(duration_spec(s)) == s


# -- monotonic ---------------------------------------------------------------------------------------


@given(realistic, realistic)
def test_bytes_are_monotonic(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert parse_bytes(bytes_text(lo)) <= parse_bytes(bytes_text(hi))


@given(st.floats(min_value=0, max_value=1e11), st.floats(min_value=0, max_value=1e11))
def test_dollars_are_monotonic(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert parse_usd(usd_text(lo)) <= parse_usd(usd_text(hi)) or usd_text(lo) == "$0.00"


@given(st.floats(min_value=0, max_value=1e5), st.floats(min_value=0, max_value=1e5))
def test_rates_are_monotonic(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert gbps_text(lo) == "0.00 Gbps" or parse_gbps(gbps_text(lo)) <= parse_gbps(gbps_text(hi))


@given(st.floats(min_value=0, max_value=8e8), st.floats(min_value=0, max_value=8e8))
def test_ages_and_durations_are_monotonic(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert parse_clock(age_text(lo)) <= parse_clock(age_text(hi))
    if lo > 0:
        assert parse_clock(duration_text(lo)) <= parse_clock(duration_text(hi))


# -- the fixed cases ---------------------------------------------------------------------------------


def test_bytes_fixed_cases() -> None:
    assert [bytes_text(n) for n in (0, 1, 999, 1000, 12_600_000_000, 10**15)] == [
        "0 B",
        "1 B",
        "999 B",
        "1.0 kB",
        "12.6 GB",
        "1.0 PB",
    ]
    assert bytes_text(999_950) == "1.0 MB"  # rounding never prints "1000.0 kB"
    assert bytes_text(None) == "?" and bytes_text(-2000) == "-2.0 kB"
    assert bytes_gib_text(16 * 10**9) == "16.0 GB (14.9 GiB)" and bytes_gib_text(12) == "12 B"


def test_small_dollars_read_the_same_everywhere() -> None:
    assert usd_text(0.004) == "<$0.01" and usd_text(0) == "$0.00" and usd_text(0.01) == "$0.01"
    assert usd_text(13_791) == "$13,791.00" and usd_text(None) == "?" and usd_text(-2.5) == "-$2.50"
    # The Egress screen's tier line and the Shards screen's GET arithmetic both say it so.
    (tier,) = tier_lines((TierSlice(0, 0.1, 0.1, 0.04, 0.004),))
    assert tier.endswith("= <$0.01")
    shards = RequestArithmetic(gets_before=10_000, gets_after=10, get_per_1000=0.4, price_source="test").summary()
    assert "$4.00 -> <$0.01 per epoch" in shards


def test_rate_age_and_duration_fixed_cases() -> None:
    assert [gbps_text(g) for g in (0, 0.004, 0.05, 9.1, 9.999, 20, 100)] == [
        "0.00 Gbps",
        "<0.01 Gbps",
        "0.05 Gbps",
        "9.10 Gbps",
        "10.0 Gbps",
        "20.0 Gbps",
        "100.0 Gbps",
    ]
    assert rate_text(1.25e9) == "10.0 Gbps" and rate_text(None) == "?"
    assert [age_text(s) for s in (0, 40, 59.9, 60, 3599, 3600, 3 * 86400 + 5)] == [
        "0s",
        "40s",
        "59s",
        "1m",
        "59m",
        "1h",
        "3d",
    ]
    assert age_text(-5) == "0s" and age_of(0, 100.0) == "?" and age_of(40.0, 100.0) == "1m"
    assert [duration_text(s) for s in (0, 0.14, 0.6, 12, 185, 3725, 90_000)] == [
        "0s",
        "<1s",
        "<1s",
        "12s",
        "3m05s",
        "1h02m",
        "1d01h",
    ]
    assert [duration_spec(s) for s in (7 * 86400, 7200, 90, 1.5, 0)] == ["7d", "2h", "90s", "1.5s", "0s"]
    with pytest.raises(ValueError):
        duration_spec(-1)
