"""The brief's scenario through the estimator, with its numbers written out."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from backend.policy.egress import (
    EgressSettings,
    break_even_month,
    estimate,
    month_bounds,
    month_elapsed,
    projected_bytes,
)
from backend.policy.prices import default_price_table

TB = 10**12


def brief(**kw):  # type: ignore[no-untyped-def]
    args = dict(
        dataset_bytes=40 * TB,
        runs=5,
        source="aws:us-east-1",
        dest="coreweave:us-east-04",
        nodes=16,
        per_node="sharded",
        objects=500_000_000,
    )
    args.update(kw)
    return estimate(default_price_table(), **args)


def test_brief_scenario_sharded() -> None:
    e = brief()
    d = e.as_dict()
    # 40 TB x 5 runs = 200 TB = 200,000 GB; 100 GB free, 9,900 x 0.09 = 891, 40,000 x 0.085 = 3,400,
    # 100,000 x 0.07 = 7,000, 50,000 x 0.05 = 2,500: egress $13,791.
    assert d["bytes_out"] == 200 * TB
    assert d["egress_usd"] == pytest.approx(13_791)
    # 500 million 50 KB files read 5 times = 2.5 billion GETs x $0.0004/1,000 = $1,000 ($200 a run).
    assert d["requests_usd"] == pytest.approx(1_000)
    assert d["total_usd"] == pytest.approx(14_791)
    # Storage of the 40 TB at S3 Standard $0.023/GB-month = $920, reported beside the total.
    assert d["storage_usd"] == pytest.approx(920)
    alts = {a["key"]: a for a in d["alternatives"]}
    # Same bytes as 512 MB shards: 40e12 / 512e6 = 78,125 shards x 5 runs = 390,625 GETs = $0.15625.
    assert alts["shards"]["requests_usd"] == pytest.approx(0.15625)
    assert alts["shards"]["egress_usd"] == pytest.approx(13_791)
    # Read from R2: egress $0; 2.5e9 Class B x $0.36/million = $900; storage 40,000 x 0.015 = $600.
    r2 = alts["r2-read"]
    assert (r2["egress_usd"], r2["requests_usd"], r2["storage_usd"]) == pytest.approx((0, 900, 600))
    # Replicate once to R2: 40 TB out of S3 in a fresh month = 9,900 x 0.09 + 30,000 x 0.085
    # = 891 + 2,550 = 3,441; plus 500M S3 GETs ($200) and 500M R2 Class A PUTs x $4.50/M ($2,250)
    # = $5,891 once. Monthly now 14,791 + 920 = 15,711; after 900 + 600 = 1,500; saves 14,211/month:
    # break-even after 5,891 / 14,211 = 0.4145 months, i.e. within month 1.
    rep = alts["r2-replicate"]
    assert rep["one_time_usd"] == pytest.approx(5_891)
    assert rep["break_even_months"] == pytest.approx(5_891 / 14_211)
    assert break_even_month(rep["break_even_months"]) == 1


def test_every_node_syncing_the_whole_dataset_is_sixteen_times_the_bytes() -> None:
    d = brief(per_node="full").as_dict()
    # 16 nodes x 200 TB = 3,200 TB = 3,200,000 GB: 11,291 for the first 150 TB
    # + 3,050,000 x 0.05 = 152,500 -> $163,791; GETs 16 x 2.5e9 x 0.0004/1000 = $16,000.
    assert d["bytes_out"] == 3_200 * TB
    assert d["egress_usd"] == pytest.approx(163_791)
    assert d["requests_usd"] == pytest.approx(16_000)
    sharded = next(a for a in d["alternatives"] if a["key"] == "sharded")
    assert sharded["egress_usd"] == pytest.approx(13_791)


def test_month_already_part_used_shifts_the_estimate() -> None:
    # With 150 TB already out this month, all 200 TB fall in the $0.05 tier: $10,000.
    e = brief(month_to_date_bytes=150 * TB, objects=0)
    assert e.primary.egress_usd == pytest.approx(10_000)
    assert e.primary.requests_usd == 0


def test_unpriced_source_is_said_so() -> None:
    e = brief(source="coreweave:us-east-04", dest="aws:us-east-1")
    assert not e.primary.priced and e.primary.total_usd is None and "unpriced" in e.primary.note
    assert e.as_dict()["total_usd"] is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"runs": 0}, "runs"),
        ({"nodes": 0}, "nodes"),
        ({"dataset_bytes": 0}, "dataset size"),
        ({"per_node": "half"}, "per-node"),
        ({"objects": -1}, "objects"),
    ],
)
def test_bad_inputs(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        brief(**kw)


def test_month_arithmetic() -> None:
    start, end = month_bounds("2026-02")
    assert (end - start).days == 28
    assert month_bounds("2026-12")[1] == datetime(2027, 1, 1, tzinfo=UTC)
    mid = datetime(2026, 11, 16, tzinfo=UTC)  # 15 of 30 days elapsed
    assert month_elapsed("2026-11", mid) == pytest.approx(0.5)
    assert projected_bytes(10 * TB, "2026-11", mid) == 20 * TB
    with pytest.raises(ValueError, match="2026-11"):
        month_bounds("Nov")


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="warn_at"):
        EgressSettings(warn_at=2)
    with pytest.raises(ValueError, match="budgets.x"):
        EgressSettings(budgets={"x": -5})
