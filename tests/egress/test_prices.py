"""Tier arithmetic of the shipped price table, by hand, at the boundaries and mid-month."""

from __future__ import annotations

import pytest

from backend.config import parse_config
from backend.errors import ConfigError
from backend.policy.prices import (
    GB,
    PriceOverrides,
    default_price_table,
    parse_site,
    price_table,
    price_transfer,
    tiered_cost,
)

TB = 10**12
TIB_GB = 1099.511627776  # GCP bills its tiers in TiB: 1 TiB = 1099.511627776 GB

# Cumulative internet egress cost of a month's volume starting from zero, worked by hand from each
# provider's published tiers (GB = 10^9 bytes).
CUMULATIVE = [
    # AWS: 100 GB free, $0.09 to 10 TB, $0.085 next 40 TB, $0.07 next 100 TB, $0.05 above 150 TB.
    ("aws", 100, 0.0),
    ("aws", 10_000, 9_900 * 0.09),  # 891
    ("aws", 50_000, 891 + 40_000 * 0.085),  # 4,291
    ("aws", 150_000, 891 + 3_400 + 100_000 * 0.07),  # 11,291
    ("aws", 200_000, 11_291 + 50_000 * 0.05),  # 13,791
    # R2: no egress charge at any volume.
    ("r2", 100, 0.0),
    ("r2", 10_000, 0.0),
    ("r2", 50_000, 0.0),
    ("r2", 150_000, 0.0),
    # GCP: $0.12 to 1 TiB, $0.11 to 10 TiB, $0.08 beyond (no free allowance subtracted).
    ("gcs", 100, 100 * 0.12),  # 12
    ("gcs", 10_000, TIB_GB * 0.12 + (10_000 - TIB_GB) * 0.11),  # 1,110.995
    ("gcs", 50_000, TIB_GB * 0.12 + 9 * TIB_GB * 0.11 + (50_000 - 10 * TIB_GB) * 0.08),  # 4,340.849
    ("gcs", 150_000, TIB_GB * 0.12 + 9 * TIB_GB * 0.11 + (150_000 - 10 * TIB_GB) * 0.08),
    # Azure: 100 GB free, next 10 TB $0.087, next 40 TB $0.083, next 100 TB $0.07.
    ("azure", 100, 0.0),
    ("azure", 10_000, 9_900 * 0.087),  # 861.30
    ("azure", 50_000, 10_000 * 0.087 + 39_900 * 0.083),  # 4,181.70
    ("azure", 150_000, 870 + 40_000 * 0.083 + 99_900 * 0.07),  # 11,183
    # Backblaze B2: flat $0.01/GB (free allowance not subtracted).
    ("b2", 100, 1.0),
    ("b2", 10_000, 100.0),
    ("b2", 50_000, 500.0),
    ("b2", 150_000, 1_500.0),
]


@pytest.mark.parametrize(("provider", "gb", "usd"), CUMULATIVE)
def test_cumulative_cost_at_tier_boundaries(provider: str, gb: float, usd: float) -> None:
    tiers = default_price_table().provider(provider).internet_tiers  # type: ignore[union-attr]
    cost, slices = tiered_cost(tiers, 0.0, gb)
    assert cost == pytest.approx(usd, abs=1e-6)
    assert sum(s.gb for s in slices) == pytest.approx(gb)


# 100 GB more when 9,950 GB already left this month: the transfer straddles AWS's 10 TB bound.
PART_USED = [
    ("aws", 50 * 0.09 + 50 * 0.085),  # 8.75: half at $0.09, half at $0.085
    ("gcs", 100 * 0.11),  # 11.00: all inside 1-10 TiB
    ("azure", 100 * 0.087),  # 8.70: Azure's bound is 10,100 GB
    ("r2", 0.0),
    ("b2", 100 * 0.01),
]


#: A real region of each provider (a made-up one leaves the transfer unpriced).
REGION = {"aws": "us-east-1", "gcs": "us-east1", "azure": "eastus", "r2": "auto", "b2": "us-west-004"}


@pytest.mark.parametrize(("provider", "usd"), PART_USED)
def test_month_already_part_used(provider: str, usd: float) -> None:
    p = price_transfer(
        default_price_table(),
        f"{provider}:{REGION[provider]}",
        "coreweave:us-east-04",
        100 * GB,
        month_to_date_bytes=9_950 * GB,
    )
    assert p.kind == "internet" and p.priced
    assert p.usd == pytest.approx(usd)


@pytest.mark.parametrize("provider", ["aws", "gcs", "azure", "r2", "b2"])
def test_splitting_a_month_into_transfers_costs_the_same_as_one(provider: str) -> None:
    tiers = default_price_table().provider(provider).internet_tiers  # type: ignore[union-attr]
    whole, _ = tiered_cost(tiers, 0, 200_000)
    parts = 0.0
    start = 0.0
    for gb in (50, 70, 9_000, 1_000, 39_880, 100_000, 50_000):
        c, _ = tiered_cost(tiers, start, gb)
        parts += c
        start += gb
    assert start == 200_000
    assert parts == pytest.approx(whole)


def test_late_month_terabyte_costs_the_top_tier_not_the_first() -> None:
    # 1 TB after 150 TB this month: $0.05/GB = $50, not $90 (priced from zero) ...
    p = price_transfer(default_price_table(), "aws:us-east-1", "coreweave:us-east-04", TB, month_to_date_bytes=150 * TB)
    assert p.usd == pytest.approx(50.0)
    # ... and 151 TB from zero is not 151,000 x $0.05.
    p = price_transfer(default_price_table(), "aws:us-east-1", "coreweave:us-east-04", 151 * TB)
    assert p.usd == pytest.approx(11_291 + 1_000 * 0.05)


def test_brief_scenario_200_tb_from_s3() -> None:
    # 40 TB x 5 runs = 200 TB = 200,000 GB out of S3 us-east-1 to an external GPU cloud:
    #   100 GB free                       =      $0
    #   9,900 GB x $0.09                  =    $891
    #   40,000 GB x $0.085                =  $3,400
    #   100,000 GB x $0.07                =  $7,000
    #   50,000 GB x $0.05                 =  $2,500
    #   total                             = $13,791
    p = price_transfer(default_price_table(), "s3:us-east-1", "coreweave:us-east-04", 200 * TB)
    assert [round(s.usd, 6) for s in p.tiers] == [0, 891, 3_400, 7_000, 2_500]
    assert [s.gb for s in p.tiers] == [100, 9_900, 40_000, 100_000, 50_000]
    assert p.usd == pytest.approx(13_791)


def test_same_region_free_inter_region_charged_unknown_region_not_free() -> None:
    t = default_price_table()
    assert price_transfer(t, "aws:us-east-1", "aws:us-east-1", TB).usd == 0
    inter = price_transfer(t, "aws:us-east-1", "aws:us-west-2", TB)
    assert inter.kind == "inter-region" and inter.usd == pytest.approx(1_000 * 0.02)
    assert price_transfer(t, "aws:us-east-1", "aws", TB).kind == "inter-region"


def test_unpriced_sources_never_read_as_zero() -> None:
    t = default_price_table()
    for src in ("local", "coreweave:us-east-04", None):
        p = price_transfer(t, src, "aws:us-east-1", TB)
        assert not p.priced and p.usd is None and "unpriced" in p.note


def test_aliases_and_sites() -> None:
    t = default_price_table()
    assert {t.canonical(a) for a in ("aws", "s3", "S3")} == {"aws"}
    assert t.canonical("r2") == t.canonical("cloudflare-r2") == "cloudflare-r2"
    assert t.canonical("gcs") == "gcp" and t.canonical("b2") == "backblaze-b2"
    assert t.canonical("local") is None
    assert parse_site("aws:us-east-1").region == "us-east-1"
    with pytest.raises(ConfigError, match="provider:region"):
        parse_site("aws:")


def test_every_entry_names_source_date_and_flags_unconfirmed() -> None:
    t = default_price_table()
    assert {"aws", "gcp", "azure", "cloudflare-r2", "backblaze-b2"} <= set(t.providers)
    for p in t.providers.values():
        assert p.source.startswith("https://") and len(p.checked) == 10
        if not p.confirmed:
            assert p.note and (p.unconfirmed or any(not x.confirmed for x in p.internet_tiers))
    # The brief's figures: S3 requests and storage, R2 requests and storage.
    aws, r2 = t.provider("aws"), t.provider("r2")
    assert (aws.get_per_1000, aws.put_per_1000, aws.storage_gb_month) == (0.0004, 0.005, 0.023)  # type: ignore[union-attr]
    assert (r2.get_per_1000 * 1000, r2.put_per_1000 * 1000, r2.storage_gb_month) == pytest.approx((0.36, 4.5, 0.015))  # type: ignore[union-attr]
    azure = price_transfer(t, "azure:eastus", "coreweave:us-east-04", TB)
    assert "unconfirmed" in azure.note


def test_overrides_from_config() -> None:
    cfg = parse_config(
        {
            "nodes": [{"name": "n1", "transport": "local"}],
            "prices": {
                "providers": {
                    "s3": {"internet_tiers": [{"up_to_gb": 100, "usd_per_gb": 0.0}, {"usd_per_gb": 0.05}]},
                    "wasabi": {
                        "internet_tiers": [{"usd_per_gb": 0.0}],
                        "inter_region_per_gb": 0.0,
                        "same_region_per_gb": 0.0,
                        "get_per_1000": 0.0,
                        "put_per_1000": 0.0,
                        "storage_gb_month": 0.0069,
                    },
                },
                "aliases": {"corp-s3": "aws"},
            },
        },
        file="lm.toml",
    )
    t = price_table(cfg.section(PriceOverrides))
    assert price_transfer(t, "corp-s3:us-east-1", "lambda:us-west-1", 1_100 * GB).usd == pytest.approx(50.0)
    assert price_transfer(t, "wasabi:us-east-1", "lambda:us-west-1", TB).usd == 0.0
    assert price_table(PriceOverrides()).provider("aws") == default_price_table().provider("aws")


@pytest.mark.parametrize(
    ("prices", "key"),
    [
        ({"providers": {"aws": {"internet_tier": []}}}, "prices.providers.aws.internet_tier"),
        (
            {"providers": {"aws": {"internet_tiers": [{"usd_per_gb": 0.1}, {"usd_per_gb": 0.05}]}}},
            "prices.providers.aws.internet_tiers[0].up_to_gb",
        ),
        ({"providers": {"aws": {"storage_gb_month": -1}}}, "prices.providers.aws.storage_gb_month"),
        ({"providers": {"newco": {"storage_gb_month": 0.01}}}, "prices.providers.newco.internet_tiers"),
    ],
)
def test_bad_overrides_name_the_key(prices: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")) as exc:
        parse_config({"nodes": [{"name": "n1", "transport": "local"}], "prices": prices}, file="lm.toml")
    assert "lm.toml" in str(exc.value)


def test_tier_lines_keep_small_amounts_readable() -> None:
    from backend.policy.egress import tier_lines
    from backend.policy.prices import TierSlice

    lines = tier_lines(
        (
            TierSlice(0, 3.6, 3.6, 0.09, 0.324),
            TierSlice(100, 10000, 9900, 0.09, 891.0),
            TierSlice(0, 0.0012, 0.0012, 0.09, 0.0001, confirmed=False),
        )
    )
    assert lines[0].startswith("3.6 GB x $0.0900")  # not "4 GB": the pull moved 3.6 GB
    assert lines[1] == "9,900 GB x $0.0900 = $891.00"
    assert lines[2].startswith("0.0012 GB x") and lines[2].endswith("(unconfirmed rate)")
