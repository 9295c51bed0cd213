"""A typo in a site is never priced: typed input is an error listing the known ones, a configured
store's or node's site the table does not know makes the quote unpriced ([egress] unpriced_action).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.config import parse_config
from backend.errors import ConfigError
from backend.policy.egress import estimate
from backend.policy.prices import PriceOverrides, default_price_table, price_table, price_transfer
from tui.cli import main

TB = 10**12
TABLE = default_price_table()
AWS_REGIONS = ", ".join(TABLE.providers["aws"].known_regions)
KNOWN = (
    "aws, azure, backblaze-b2, cloudflare-r2, coreweave, crusoe, gcp, lambda, local, nebius, oci, "
    "onprem, runpod, together, vast"
)
REGION_TYPO = (
    f"destination 'aws:us-east1': unknown region 'us-east1' for aws (did you mean us-east-1? "
    f"known: {AWS_REGIONS}); a newer region goes in [prices.providers.aws] known_regions"
)
PROVIDER_TYPO = (
    f"destination 'mars:olympus-1': unknown provider 'mars' (known: {KNOWN}); add it under "
    "[prices.providers] (priced storage) or [prices.sites] (where nodes run)"
)


def test_typed_sites_are_errors_that_list_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert "us-east-1" in AWS_REGIONS.split(", ")
    for dest, message in (("aws:us-east1", REGION_TYPO), ("mars:olympus-1", PROVIDER_TYPO)):
        rc = main(["egress", "estimate", "--bytes", "40TB", "--source", "aws:us-east-1", "--dest", dest])
        assert rc == 2
        assert capsys.readouterr().err == f"loadmaster: error: {message}\n"
        with pytest.raises(ConfigError) as exc:
            TABLE.check_site(dest, what="destination")
        assert str(exc.value) == message
    # The sites the brief and the lab use stay priced.
    assert (
        main(["egress", "estimate", "--bytes", "40TB", "--source", "aws:us-east-1", "--dest", "coreweave:us-east-04"])
        == 0
    )
    assert "$" in capsys.readouterr().out


CONFIG = """
[[nodes]]
name = "gpu-typo"
transport = "local"
site = "aws:us-east1"

[[nodes]]
name = "gpu-ok"
transport = "local"
site = "aws:us-west-2"

[stores.datasets]
url = "s3://datasets/laion"
provider = "aws"
region = "us-east-1"

[egress]
unpriced_action = "{action}"
"""


def _config(tmp_path: Path, action: str) -> str:
    p = tmp_path / "lm.toml"
    p.write_text(CONFIG.replace("{action}", action) + f'\n[state]\ndir = "{tmp_path / "state"}"\n')
    return str(p)


def test_a_configured_typo_is_an_unpriced_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path, "block")
    assert (
        main(["--config", cfg, "egress", "quote", "--store", "datasets", "--node", "gpu-typo", "--bytes", "1TB"]) == 3
    )
    out = capsys.readouterr().out
    assert (
        f"BLOCK: datasets (aws:us-east-1) -> aws:us-east1: 1.0 TB not priced (unpriced: {REGION_TYPO})"
        in out.splitlines()
    )
    # The same store to a real region is priced (inter-region).
    assert main(["--config", cfg, "egress", "quote", "--store", "datasets", "--node", "gpu-ok", "--bytes", "1TB"]) == 0
    assert "$20.00" in capsys.readouterr().out
    cfg = _config(tmp_path, "warn")
    assert (
        main(["--config", cfg, "egress", "quote", "--store", "datasets", "--node", "gpu-typo", "--bytes", "1TB"]) == 0
    )
    assert "WARN: datasets (aws:us-east-1) -> aws:us-east1: 1.0 TB not priced" in capsys.readouterr().out
    # Typed on the command line, the same site is an error.
    assert (
        main(["--config", cfg, "egress", "quote", "--store", "datasets", "--dest", "aws:us-east1", "--bytes", "1TB"])
        == 2
    )
    assert capsys.readouterr().err == f"loadmaster: error: {REGION_TYPO}\n"


def test_operators_add_their_own_sites_and_regions() -> None:
    cfg = parse_config(
        {
            "nodes": [{"name": "n", "transport": "local"}],
            "prices": {
                "sites": {"acme": {"name": "ACME GPU cloud", "known_regions": ["dc1", "dc2"]}},
                "providers": {"aws": {"known_regions": ["us-east-1", "us-fake-9"]}},
            },
        },
        file="lm.toml",
    )
    t = price_table(cfg.section(PriceOverrides))
    assert price_transfer(t, "aws:us-east-1", "acme:dc1", TB).kind == "internet"
    assert not price_transfer(t, "aws:us-east-1", "acme:dc3", TB).priced
    assert price_transfer(t, "aws:us-east-1", "aws:us-fake-9", TB).kind == "inter-region"
    with pytest.raises(ConfigError, match=r"prices\.sites\.acme\.regions"):
        parse_config(
            {"nodes": [{"name": "n", "transport": "local"}], "prices": {"sites": {"acme": {"regions": ["dc1"]}}}},
            file="lm.toml",
        )


def test_the_calculator_refuses_a_typo_too() -> None:
    with pytest.raises(ValueError, match="unknown provider 'mars'"):
        estimate(TABLE, dataset_bytes=TB, runs=1, source="aws:us-east-1", dest="mars:olympus-1")
    with pytest.raises(ValueError, match="unknown region 'us-east1'"):
        estimate(TABLE, dataset_bytes=TB, runs=1, source="aws:us-east1", dest="coreweave:us-east-04")


async def test_the_console_calculator_marks_the_field() -> None:
    from textual.widgets import Input, Static

    from tests.tui.snapshot_services import snapshot_services
    from tui.app import LoadmasterApp

    app = LoadmasterApp(snapshot_services(), theme="loadmaster-dark", mode="egress")
    async with app.run_test(size=(120, 35)) as pilot:
        await pilot.pause()
        app.screen.query_one("#calc-dest", Input).value = "mars:olympus-1"
        await pilot.pause()
        assert app.screen.query_one("#calc-dest", Input).has_class("-invalid")
        assert str(app.screen.query_one("#egress-calc-error", Static).render()) == PROVIDER_TYPO


_PROVIDERS = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).filter(
    lambda p: (
        TABLE.canonical(p) is None
        and TABLE.compute_site(p) is None
        and p not in ("local", "file", "posix")
        and not p.startswith("-")
    )
)
_REGIONS = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=16)


@given(provider=_PROVIDERS, region=_REGIONS)
def test_an_unknown_provider_is_never_priced(provider: str, region: str) -> None:
    for src, dest in (("aws:us-east-1", f"{provider}:{region}"), (f"{provider}:{region}", "coreweave:us-east-04")):
        p = price_transfer(TABLE, src, dest, TB)
        assert not p.priced and p.usd is None and p.note.startswith("unpriced: ")


@given(region=_REGIONS)
def test_an_aws_region_is_priced_exactly_when_it_is_known(region: str) -> None:
    p = price_transfer(TABLE, "aws:us-east-1", f"aws:{region}", TB)
    known = region in TABLE.providers["aws"].known_regions
    assert p.priced == known
    if known:
        assert p.kind == ("same-region" if region == "us-east-1" else "inter-region")
    else:
        assert "unknown region" in p.note
