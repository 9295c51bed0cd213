"""A relay receiver's report cannot inflate "egress saved" beyond what the plan could save (#28).

A real relay pull on the lab's four nodes (one seed from the lab's SeaweedFS, three receivers),
launched detached; once each receiver has finished on its node, its ``result.json`` is rewritten
as a hostile node would (more bytes received from peers than the pull holds; a number that is not
one; a bool), then a refresh records the ends. The saving is at most the plan's bytes, one row per receiver, so a
group's savings never exceed bytes x receivers; an unreadable count claims nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from lab import Lab
from tests.counting_proxy import CountingProxy
from tests.relay.conftest import RelaySource, relay_config
from tests.security.hostile_node import forge_json
from tui.cli import main as cli_main

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(list(argv))
    return rc, out.getvalue(), err.getvalue()


#: What each receiver of the one pull claims it received from peers, and what it saves: the plan's
#: bytes at most; a count that is not a number claims nothing.
CLAIMS: dict[str, tuple[Any, str | None]] = {
    "node-02": (10**15, "plan"),  # huge
    "node-03": ("1e30", None),  # not a number
    "node-04": (True, None),  # a bool
}


def test_a_receiver_cannot_report_more_saved_than_the_plan_holds(
    lab: Lab, relay_source: RelaySource, store_proxy: CountingProxy, tmp_path: Path
) -> None:
    # One relay pull, three receivers (one seed): each receiver's report is forged its own way,
    # and one refresh records every end. Savings are per receiver, so each claim is judged alone.
    cfg = relay_config(lab, tmp_path, store_proxy)
    dest = f"pulls/saved-{tmp_path.name[-8:]}"
    rc, out, err = _cli(
        "--config", str(cfg), "pull", relay_source.url, dest, "--nodes", "node-0[1-4]", "--fanout", "relay",
        "--yes", "--json", "--detach",
    )  # fmt: skip
    assert rc == 0, err
    jobs = json.loads(out)["jobs"]
    receivers = {j["node"]: j for j in jobs if j["params"]["relay"]["role"] != "seed"}
    assert sorted(receivers) == sorted(CLAIMS)
    deadline = time.monotonic() + 240
    for node, receiver in receivers.items():
        result = lab.node(node).home / "jobs" / receiver["id"] / "result.json"
        while not result.exists():  # the relay really runs; no console watches it end
            assert time.monotonic() < deadline, f"the receiver on {node} never finished on its node"
            time.sleep(0.1)
        assert '"peer_bytes"' in result.read_text()
        forge_json(result, "peer_bytes", CLAIMS[node][0])
    rc, _, err = _cli("--config", str(cfg), "jobs", "--json", "--limit", "1000")
    assert rc in (0, 4), err
    db = sqlite3.connect(tmp_path / "state-lm" / "state.sqlite3")
    rows = {jid: (nbytes, note) for jid, nbytes, note in db.execute("SELECT job_id, bytes, note FROM fanout_savings")}
    assert sorted(rows) == sorted(receivers[n]["id"] for n, (_said, saved) in CLAIMS.items() if saved), rows
    for node, (said, saved) in CLAIMS.items():
        if saved is None:
            continue
        nbytes, note = rows[receivers[node]["id"]]
        assert nbytes == relay_source.total
        assert f"capped at the plan's {relay_source.total} bytes: the receiver reported {said}" in note
