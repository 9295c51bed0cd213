"""Relay pulls on the lab's 4 real sshd nodes from SeaweedFS through a counting proxy."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import socket
import sqlite3
from pathlib import Path

import pytest

from backend.ops import Operations
from lab import Lab
from tests.counting_proxy import CountingProxy
from tests.jobs.conftest import SourceData
from tests.relay.conftest import NODES, RelaySource, assert_copy, layout, relay_config, s5cmd_everywhere
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(180)


def _pull(cfg: Path, source: RelaySource, dest: str, *extra: str) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(
            ["--config", str(cfg), "pull", source.url, dest, "--nodes", "node-0[1-4]", "--yes", "--json", *extra]
        )
    text = out.getvalue()
    return rc, (json.loads(text) if text.strip().startswith("{") else {}), err.getvalue()


def _why(out: dict, err: str, served: int, source: RelaySource) -> str:
    """What each job of a pull did (kind, state, error, role, upstream, attachments) and the CLI's
    own lines: a byte count off by a whole copy names the node that went to the store and why."""
    rows = [f"the store sent {served} bytes for a {source.total}-byte source"]
    for j in out.get("jobs", []):
        relay = (j.get("result") or {}).get("relay") or {}
        rows.append(
            f"{j.get('node')} {j.get('kind')} {j.get('state')}: error={j.get('error')!r} role={relay.get('role')} "
            f"upstream={relay.get('upstream')} attachments={relay.get('attachments')}"
        )
    return "\n".join([*rows, "the pull's stderr:", err])


def test_relay_store_sends_once_direct_sends_four_times(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    cfg = relay_config(lab, tmp_path, store_proxy)
    store_proxy.reset()
    rc, out, err = _pull(cfg, relay_source, "pulls/relay-1x", "--fanout", "relay")
    assert rc == 0, err
    relay_bytes = store_proxy.served
    jobs = {j["node"]: j for j in out["jobs"]}
    assert {j["kind"] for j in jobs.values()} == {"relay"}
    assert jobs["node-01"]["result"]["relay"]["role"] == "seed"
    for node in NODES:
        assert jobs[node]["state"] == "succeeded", jobs[node]
        assert_copy(lab.node(node).scratch / "pulls/relay-1x", relay_source)
    for node in NODES:
        job = jobs[node]
        # Peers listen on the node's own cluster address (here the address the console reaches
        # it at), never on every address; the relay secret came in the secrets file, deleted at start.
        assert job["params"]["relay"]["listen"][0] == lab.node(node).ip
        job_dir = Path(job["job_dir"])
        assert not (job_dir / "secrets.json").exists()
        assert "LOADMASTER_RELAY_SECRET" not in (job_dir / "spec.json").read_text()
        seed = node == "node-01"
        assert (job_dir / "aws-credentials").exists() is False
        assert job["result"]["relay"]["store_bytes"] == (relay_source.total if seed else 0)
    # Receivers prove each object as a direct pull would: the store's full-object checksum that the
    # console read (relay["checksums"]) where the store keeps one, else the MD5 ETag.
    checksums = jobs["node-02"]["params"]["relay"]["checksums"]
    assert len(checksums) == len(jobs["node-02"]["params"]["expected"])
    for node in NODES[1:]:
        proven = jobs[node]["result"]["verification"]
        # An empty object is made, not received: its size is its proof.
        assert sum(proven.values()) == sum(1 for o in jobs[node]["params"]["expected"] if o[1] > 0), proven
        want = {c.split(":")[0] for c in checksums if c}
        assert want <= set(proven), (want, proven)
    # node-03 has no s5cmd: it received everything from its upstream.
    assert jobs["node-03"]["result"]["relay"]["upstream"] == "node-02"
    assert relay_source.total <= relay_bytes < relay_source.total * 1.05, _why(out, err, relay_bytes, relay_source)
    assert "instead of 4x" in err and "saves" in err

    # The same data, each node from the store: 4x.
    direct_cfg = relay_config(lab, tmp_path, store_proxy, name="direct", pull=s5cmd_everywhere())
    store_proxy.reset()
    rc, out, err = _pull(direct_cfg, relay_source, "pulls/direct-4x", "--fanout", "direct")
    assert rc == 0, err
    direct_bytes = store_proxy.served
    assert 4 * relay_source.total <= direct_bytes < 4 * relay_source.total * 1.05
    for node in NODES:
        assert_copy(lab.node(node).scratch / "pulls/direct-4x", relay_source)
        assert layout(lab.node(node).scratch / "pulls/relay-1x") == layout(lab.node(node).scratch / "pulls/direct-4x")

    # The ledger holds what the store sent: the seed's bytes only.
    db = sqlite3.connect(tmp_path / "state-lm" / "state.sqlite3")
    rows = db.execute("SELECT job_id, bytes, state FROM egress_ledger").fetchall()
    assert rows == [(jobs["node-01"]["id"], relay_source.total, "settled")]


def test_relay_ssh_carries_the_hops_through_ssh_and_listens_on_loopback_only(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    cfg = relay_config(lab, tmp_path, store_proxy)
    rc, out, err = _pull(cfg, relay_source, "pulls/relay-ssh", "--fanout", "relay-ssh", "--detach")
    assert rc == 2 and "drop --detach" in err
    store_proxy.reset()
    rc, out, err = _pull(cfg, relay_source, "pulls/relay-ssh", "--fanout", "relay-ssh")
    assert rc == 0, err
    served = store_proxy.served
    assert relay_source.total <= served < relay_source.total * 1.05, _why(out, err, served, relay_source)
    for j in out["jobs"]:
        assert j["state"] == "succeeded", j
        relay = j["params"]["relay"]
        # Nothing listens on the cluster network; each node finds the nodes above it on its own
        # loopback, where the console's SSH connection forwards to them.
        assert relay["listen"][0] == "127.0.0.1"
        assert all(addr == "127.0.0.1" for _name, addr, _port in relay["upstreams"])
        assert_copy(lab.node(j["node"]).scratch / "pulls/relay-ssh", relay_source)
    ups = {j["node"]: j["result"]["relay"]["upstream"] for j in out["jobs"]}
    assert ups == {"node-01": None, "node-02": "node-01", "node-03": "node-02", "node-04": "node-03"}


def _free_run(n: int) -> int:
    """The first of ``n`` consecutive ports free on 127.0.0.1, below Linux's ephemeral range (no
    outgoing connection takes one of them meanwhile)."""
    for lo in range(20000, 32000, n):
        try:
            with contextlib.ExitStack() as held:
                for p in range(lo, lo + n):
                    held.enter_context(socket.create_server(("127.0.0.1", p)))
        except OSError:
            continue
        return lo
    raise AssertionError(f"no {n} consecutive free ports on 127.0.0.1")


async def test_a_relay_port_is_never_one_an_outgoing_connection_holds(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    """bind() refuses a port that an outgoing connection holds, established or in TIME_WAIT (60 s
    after it closed), SO_REUSEADDR or not: the plan must not give such a port to a relay. (In CI a
    relay-ssh node found its loopback port held by the TIME_WAIT of an earlier pull's connection,
    failed, and fetched its copy from the store again.)"""
    from backend.config import load_config_file
    from backend.ops import PullRequest
    from backend.services import Services

    lo = _free_run(6)
    cfg = relay_config(lab, tmp_path, store_proxy, pull=f'relay_ports = "{lo}-{lo + 5}"\n')
    server = socket.create_server(("127.0.0.1", 0))
    held = []
    for port in (lo, lo + 1):  # outgoing connections from those ports, as any client's would be
        c = socket.socket()
        c.bind(("127.0.0.1", port))
        c.connect(server.getsockname())
        held.append((c, server.accept()[0]))
    closed, peer = held.pop()
    closed.close()  # the side that closes first keeps the port in TIME_WAIT
    peer.close()
    services = Services(load_config_file(cfg))
    try:
        req = PullRequest(relay_source.url, "pulls/relay-ports", "node-0[1-4]", fanout="relay-ssh")
        preview = await Operations(services).pulls.plan(req)
    finally:
        await services.aclose()
        for c, p in held:
            c.close()
            p.close()
        server.close()
    ports = sorted(port for _addr, port in preview.plan.relay_listen.values())
    assert ports == list(range(lo + 2, lo + 6)), (lo, ports)


def test_a_seed_takes_large_objects_a_few_at_a_time(lab: Lab, s3, store_proxy: CountingProxy, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    prefix = "relay/large-" + secrets.token_hex(3)
    body = os.urandom(16 << 20)
    objects = {f"part-{i}.bin": bytes([i]) + body[1:] for i in range(4)}  # 64 MiB in 4 objects
    client = s3.client()
    for name, data in objects.items():
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/{name}", Body=data)
    source = SourceData(lab.bucket, prefix, objects)
    cfg = relay_config(lab, tmp_path, store_proxy)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(
            ["--config", str(cfg), "pull", source.url, "pulls/large", "--nodes", "node-0[1-2]", "--fanout", "relay"]
            + ["--yes", "--json"]
        )
    assert rc == 0, err.getvalue()
    # [pull] numworkers = 8, concurrency 4, 5 MiB parts: the seed copies 4 objects at a time.
    assert "seeds: s5cmd --numworkers 4 cp --concurrency 4 --part-size 5" in err.getvalue()
    jobs = {j["node"]: j for j in json.loads(out.getvalue())["jobs"]}
    assert jobs["node-01"]["params"]["numworkers"] == 4 and jobs["node-02"]["params"]["numworkers"] == 8
    for node in ("node-01", "node-02"):
        assert_copy(lab.node(node).scratch / "pulls/large", source)


def test_a_receiver_refuses_a_dest_that_leads_outside_and_the_rest_go_on(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    dest = "pulls/relay-symlink"
    outside = tmp_path / "outside"
    outside.mkdir()
    trap = lab.node("node-03").scratch / dest
    trap.mkdir(parents=True)
    (trap / "meta").symlink_to(outside)  # meta/index.json would land outside DEST
    try:
        cfg = relay_config(lab, tmp_path, store_proxy)
        rc, out, err = _pull(cfg, relay_source, dest, "--fanout", "relay")
        assert rc == 1
        assert list(outside.iterdir()) == []
        jobs = {(j["node"], j["kind"]): j for j in out["jobs"]}
        assert jobs[("node-03", "relay")]["state"] == "failed"
        assert "refusing to write" in jobs[("node-03", "relay")]["error"]
        # Its child went to the node above it; the retry from the store refuses the same way.
        assert jobs[("node-04", "relay")]["result"]["relay"]["upstream"] == "node-02"
        assert "not retried" in err or jobs[("node-03", "pull")]["state"] == "failed"
        for node in ("node-01", "node-02", "node-04"):
            assert_copy(lab.node(node).scratch / dest, relay_source)
    finally:
        (trap / "meta").unlink()
