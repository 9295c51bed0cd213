"""Relay faults on the lab's 4 nodes: a node killed mid-chain, cancel, a slow node."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.ops import Operations
from lab import Lab
from tests.counting_proxy import CountingProxy
from tests.relay.conftest import NODES, RelaySource, assert_copy, relay_config
from tui.cli import main as cli_main

pytestmark = pytest.mark.timeout(180)

#: Each hop capped (6.25 MB/s): the ~17 MB copy is under way for seconds, long enough to act on.
SLOW = "relay_max_gbps = 0.05\n"
#: A config of one local node, for what is refused before any node is reached.
HERE = '[[nodes]]\nname = "here"\ntransport = "local"\nscratch = "/tmp"\n\n'


def _job_dir(lab: Lab, node: str, dest: str, timeout: float = 30.0) -> Path:
    """The job directory on ``node`` of the pull into ``dest`` (found by its spec)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for spec in (lab.node(node).home / "jobs").glob("*/spec.json"):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(spec.read_text())["params"]["dest"].endswith(dest):
                    return spec.parent
        time.sleep(0.05)
    raise AssertionError(f"no job for {dest} on {node}")


def _progress(job_dir: Path) -> dict[str, Any]:
    try:
        lines = (job_dir / "progress.jsonl").read_text().splitlines()
    except OSError:
        return {}
    return json.loads(lines[-1]) if lines else {}


def _wait_progress(job_dir: Path, low: int, high: int | None = None, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = _progress(job_dir)
        if p.get("bytes_done", 0) >= low and (high is None or p.get("bytes_done", 0) <= high):
            return p
        time.sleep(0.05)
    raise AssertionError(f"{job_dir}: progress never reached {low} bytes ({_progress(job_dir)})")


def _pgid(job_dir: Path) -> int:
    return int(json.loads((job_dir / "pid").read_text())["pgid"])


def _json_document(text: str) -> dict[str, Any]:
    """The pull's --json document in what was captured. redirect_stdout swaps the process's
    sys.stdout, so a command the test runs meanwhile (``job cancel``) prints into the same buffer,
    before or after the document."""
    start = 0 if text.startswith("{") else text.find("\n{") + 1
    if start == 0 and not text.startswith("{"):
        return {}
    doc, _end = json.JSONDecoder().raw_decode(text, start)
    return doc if isinstance(doc, dict) else {}


@contextlib.contextmanager
def _pull_in_thread(cfg: Path, source: RelaySource, dest: str, *extra: str) -> Iterator[dict[str, Any]]:
    """Run ``loadmaster pull`` in a thread (the test acts on the nodes meanwhile); its outcome."""
    out: dict[str, Any] = {}

    def run() -> None:
        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            args = ["--config", str(cfg), "pull", source.url, dest, "--nodes", "node-0[1-4]", "--yes", "--json"]
            out["rc"] = cli_main([*args, "--fanout", "relay", *extra])
        out["json"] = _json_document(so.getvalue())
        out["err"] = se.getvalue()

    t = threading.Thread(target=run)
    t.start()
    try:
        yield out
    finally:
        t.join(150)
    assert not t.is_alive(), "the pull never ended"


def test_node_killed_mid_chain_leaves_three_verified_and_the_fourth_retried(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    cfg = relay_config(lab, tmp_path, store_proxy, pull=SLOW)
    dest = "pulls/relay-killed"
    total = relay_source.total
    store_proxy.reset()
    with _pull_in_thread(cfg, relay_source, dest) as out:
        victim = _job_dir(lab, "node-02", dest)
        below = _job_dir(lab, "node-03", dest)
        _wait_progress(below, total // 5, total * 4 // 5)
        os.killpg(_pgid(victim), signal.SIGKILL)  # the node's relay dies mid-chain
    assert out["rc"] == 0, out["err"]
    jobs = {(j["node"], j["kind"]): j for j in out["json"]["jobs"]}
    assert jobs[("node-02", "relay")]["state"] == "lost"
    assert jobs[("node-02", "pull")]["state"] == "succeeded"  # its copy, fetched from the store
    for node in NODES:
        assert_copy(lab.node(node).scratch / dest, relay_source)
    for node in ("node-01", "node-03", "node-04"):
        assert jobs[(node, "relay")]["state"] == "succeeded", jobs[(node, "relay")]
    # node-03 re-attached to node-01 within 10 s and resumed from its last verified chunk.
    relay3 = jobs[("node-03", "relay")]["result"]["relay"]
    first, again = relay3["attachments"]
    assert (first["upstream"], again["upstream"]) == ("node-02", "node-01")
    assert again["after_s"] < 10 and 0 < again["at_bytes"] < total
    served = jobs[("node-01", "relay")]["result"]["relay"]["served"]
    assert served["node-03"]["bytes"] == total - again["at_bytes"]
    assert relay3["upstream"] == "node-01"
    # The store sent the seed's copy and the retry's: both priced and in the ledger.
    assert 2 * total <= store_proxy.served < 2 * total * 1.05
    db = sqlite3.connect(tmp_path / "state-lm" / "state.sqlite3")
    rows = dict(db.execute("SELECT job_id, bytes FROM egress_ledger WHERE state = 'settled'").fetchall())
    assert rows == {jobs[("node-01", "relay")]["id"]: total, jobs[("node-02", "pull")]["id"]: total}
    (retry,) = db.execute("SELECT detail FROM audit WHERE action = 'pull.retry'").fetchall()
    assert json.loads(retry[0])["retry_of"] == jobs[("node-02", "relay")]["id"]
    assert "fetching its copy from the store" in out["err"]


def test_cancel_stops_the_whole_chain_and_removes_partial_files_everywhere(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    cfg = relay_config(lab, tmp_path, store_proxy, pull=SLOW)
    dest = "pulls/relay-cancelled"
    total = relay_source.total
    with _pull_in_thread(cfg, relay_source, dest) as out:
        mid = _job_dir(lab, "node-03", dest)
        _wait_progress(mid, total // 5, total * 4 // 5)
        spec = json.loads((mid / "spec.json").read_text())
        assert cli_main(["--config", str(cfg), "job", "cancel", spec["id"], "--yes"]) == 0
    assert out["rc"] == 1
    states = {j["node"]: j["state"] for j in out["json"]["jobs"]}
    assert states == dict.fromkeys(NODES, "cancelled"), states
    for node in NODES:
        d = lab.node(node).scratch / dest
        for p in d.rglob("*"):  # complete objects may stay; nothing half-written does
            if p.is_file():
                rel = p.relative_to(d).as_posix()
                assert rel in relay_source.objects and p.stat().st_size == len(relay_source.objects[rel]), p


def test_a_slow_node_does_not_hold_back_the_others(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    # node-01 feeds node-02 and node-03; node-02 feeds node-04. node-03 stalls (SIGSTOP): its
    # siblings' subtree finishes regardless, then node-03 catches up.
    cfg = relay_config(lab, tmp_path, store_proxy, pull=SLOW)
    dest = "pulls/relay-slow"
    total = relay_source.total
    with _pull_in_thread(cfg, relay_source, dest, "--degree", "2") as out:
        slow = _job_dir(lab, "node-03", dest)
        _wait_progress(slow, 1)
        os.killpg(_pgid(slow), signal.SIGSTOP)
        try:
            leaf = _job_dir(lab, "node-04", dest)
            _wait_progress(leaf, total, timeout=30)
            assert _progress(slow).get("bytes_done", 0) < total
        finally:
            os.killpg(_pgid(slow), signal.SIGCONT)
    assert out["rc"] == 0, out["err"]
    for node in NODES:
        assert_copy(lab.node(node).scratch / dest, relay_source)
    parents = {j["node"]: j["result"]["relay"]["upstream"] for j in out["json"]["jobs"]}
    assert parents == {"node-01": None, "node-02": "node-01", "node-03": "node-01", "node-04": "node-02"}


def test_a_stalled_node_is_routed_around_and_catches_up(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    # node-02 freezes mid-chain (SIGSTOP: its connections stay open but nothing moves): node-03
    # hears nothing for [pull] relay_silence (set as a user would, shorter than the 5 s default),
    # re-attaches to node-01 within 10 s and finishes; node-02 finishes when thawed.
    cfg = relay_config(lab, tmp_path, store_proxy, pull=SLOW + 'relay_silence = "2.5s"\n')
    dest = "pulls/relay-stalled"
    total = relay_source.total
    with _pull_in_thread(cfg, relay_source, dest) as out:
        stalled = _job_dir(lab, "node-02", dest)
        below = _job_dir(lab, "node-03", dest)
        _wait_progress(below, total // 5, total * 4 // 5)
        os.killpg(_pgid(stalled), signal.SIGSTOP)
        try:
            _wait_progress(_job_dir(lab, "node-04", dest), total, timeout=30)
        finally:
            os.killpg(_pgid(stalled), signal.SIGCONT)
    assert out["rc"] == 0, out["err"]
    for node in NODES:
        assert_copy(lab.node(node).scratch / dest, relay_source)
    jobs = {j["node"]: j for j in out["json"]["jobs"]}
    assert {j["kind"] for j in jobs.values()} == {"relay"}  # nothing needed the store again
    first, again = jobs["node-03"]["result"]["relay"]["attachments"]
    assert (first["upstream"], again["upstream"]) == ("node-02", "node-01")
    assert again["after_s"] < 10
    assert again["why"] == "lost node-02: silent for 2.5s"  # the window it was given, not the default


@pytest.mark.parametrize("value", ["1s", "500ms", 0, "soon"])
def test_a_silence_window_too_short_or_malformed_is_one_line_naming_the_key(
    tmp_path: Path, value: object, capsys: pytest.CaptureFixture[str]
) -> None:
    # An idle upstream pings every second: a window under two pings would take quiet upstreams
    # for frozen ones. The config is refused before any command runs (here `nodes`).
    (tmp_path / "lm.toml").write_text(f"{HERE}[pull]\nrelay_silence = {json.dumps(value)}\n")
    assert cli_main(["--config", str(tmp_path / "lm.toml"), "nodes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "pull.relay_silence: expected " in err, err


async def test_a_failed_seed_fails_its_tree_at_once_and_leaves_no_partial_files(
    lab: Lab, s3, store_proxy: CountingProxy, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    import secrets

    from backend.config import load_config_file
    from backend.ops import PullRequest
    from backend.services import Services

    prefix = "relay/vanishing-" + secrets.token_hex(3)
    client = s3.client()
    for i in range(3):
        client.put_object(Bucket=lab.bucket, Key=f"{prefix}/obj-{i}", Body=os.urandom(2 << 20))
    cfg = relay_config(lab, tmp_path, store_proxy)
    services = Services(load_config_file(cfg))
    try:
        req = PullRequest(f"s3://{lab.bucket}/{prefix}/", "pulls/relay-vanishing", "node-0[1-4]", fanout="relay")
        preview = await Operations(services).pulls.plan(req)
        client.delete_object(Bucket=lab.bucket, Key=f"{prefix}/obj-1")  # gone between the plan and the copy
        started = await Operations(services).pulls.start(req, shown=preview)
        t0 = time.monotonic()
        final = {r.node: await services.jobs.wait(r.id, timeout=60) for r in started.records}
        took = time.monotonic() - t0
    finally:
        await services.aclose()
    assert final["node-01"].state == "failed" and "s5cmd" in (final["node-01"].error or "")
    for node in ("node-02", "node-03", "node-04"):
        assert final[node].state == "failed", final[node]
        assert "failed: seed:" in (final[node].error or ""), final[node].error
    assert took < 15  # not after relay_reattach (20 s) of trying to re-attach
    for node in NODES:  # complete objects may stay; nothing half-written does
        d = lab.node(node).scratch / "pulls/relay-vanishing"
        for p in d.rglob("*") if d.exists() else ():
            assert p.name in ("obj-0", "obj-2") and p.stat().st_size == 2 << 20, p


def test_a_node_a_child_left_stops_waiting_once_its_upstream_says_that_child_is_done(tmp_path: Path) -> None:
    # node-03 left a frozen node-02 for node-01 and finished there: node-01's pings tell node-02,
    # which ends then instead of after its grace (60 s here). Real sockets on loopback, no lab.
    from backend.agent.context import JobContext
    from backend.pulls.relay.node import Holdings, Receiver, RelayServer, Upstream
    from tests.relay.test_node import _receiver, _seed, _server

    h, _ = _seed(tmp_path, [200_000, 3])
    seed = _server(h)  # planned child "child" (node-02 here)
    port = seed.sock.getsockname()[1]
    middle_h = Holdings(tmp_path / "child", h.objects)
    middle = RelayServer(
        middle_h, JobContext.in_process("relay", {}), secret="right", group="g", listen=("127.0.0.1", 0),
        planned=["leaf"], chunk_size=1 << 16, grace_s=60,
    )  # fmt: skip
    try:
        child = _receiver(tmp_path, h, port, "right")
        child.h = middle_h
        child.on_done_below = middle.done_elsewhere
        child.run()
        child.watch()  # after its copy the child keeps reading the seed's pings
        middle.ready_at = time.time()
        assert not middle.subtree_done()  # "leaf" is planned here and never came: within the grace
        (tmp_path / "leaf").mkdir()
        leaf = Receiver(
            Holdings(tmp_path / "leaf", h.objects), JobContext.in_process("relay", {}), secret="right", group="g",
            me="leaf", upstreams=[Upstream("seed", "127.0.0.1", port)], reattach_s=5.0,
        )  # fmt: skip
        leaf.run()
        leaf.send({"t": "done"})  # its subtree is done at the seed
        deadline = time.monotonic() + 30
        while not middle.subtree_done() and time.monotonic() < deadline:
            middle.changed.wait(0.1)
        assert middle.subtree_done() and middle.abandoned() == []
        leaf.close()
        child.close()
    finally:
        seed.stop()
        middle.stop()


@pytest.mark.parametrize("done", ["leaf", [1], [""], ["x" * 256], [f"n{i}" for i in range(65)]])
def test_a_ping_whose_done_list_is_not_node_names_ends_the_connection(tmp_path: Path, done: object) -> None:
    from backend.pulls.relay.protocol import ProtocolError
    from tests.relay.test_node import _receiver, _seed

    h, _ = _seed(tmp_path, [10])
    recv = _receiver(tmp_path, h, 9, "right")
    heard: list[list[str]] = []
    recv.on_done_below = heard.append
    with pytest.raises(ProtocolError, match="is not a list of node names"):
        recv._heard_done({"t": "ping", "done": done})
    recv._heard_done({"t": "ping", "done": ["leaf"]})
    recv._heard_done({"t": "ping"})  # an upstream of an earlier release says nothing: nothing changes
    assert heard == [["leaf"]]
