"""``job show`` and ``job logs`` print what a node wrote through the one sanitiser (#28).

A real shard job runs on the hostile sshd node; once it has finished, the node's log and result are
rewritten as an attacker would: an OSC 52 clipboard write, a screen clear, C1 controls, a
right-to-left override and mark, and a URL with a password. What the CLI prints carries none of
them, and the password is masked.
"""

from __future__ import annotations

import json
import time
import unicodedata
from pathlib import Path

import pytest

from lab import Lab
from tests.helpers import write_lab_config
from tests.security.hostile_node import NAME, HostileNode, forge_json
from tests.security.test_store_reads_ledgered import hostile, shard_src  # noqa: F401 - fixtures, used by name
from tui.cli import main as cli_main

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

EVIL = "ok \x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b31m\u202eevil\u200f https://bob:hunter2@db.example/x"
BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")


def _clean(text: str) -> bool:
    return all(ch in "\n\t" or (unicodedata.category(ch) != "Cc" and ch not in BIDI) for ch in text)


def test_job_show_and_logs_print_no_escape_and_no_secret(
    lab: Lab,
    hostile: HostileNode,  # noqa: F811 - the fixture imported above
    shard_src: tuple[str, int],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, _ = shard_src
    hostile.clear()
    cfg = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state", hostile.config_section())
    dest = hostile.node.scratch / f"out-{tmp_path.name[-8:]}"
    assert cli_main(["--config", str(cfg), "shard", url, str(dest), "--node", NAME, "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["job"]
    job_dir = hostile.jobs / job_id
    deadline = time.monotonic() + 180
    while not (job_dir / "result.json").exists():
        assert time.monotonic() < deadline, "the shard job never finished on the node"
        time.sleep(0.1)
    with open(job_dir / "log", "a") as f:
        f.write(EVIL + "\n")
    forge_json(job_dir / "result.json", "dest", EVIL)
    for argv in (["job", "show", job_id], ["job", "logs", job_id]):
        assert cli_main(["--config", str(cfg), *argv]) in (0, 1)
        out = capsys.readouterr().out
        assert "evil" in out and "ok " in out, argv  # the text is shown ...
        assert _clean(out), (argv, [ln for ln in out.splitlines() if not _clean(ln)])  # ... made safe
        assert "hunter2" not in out and "bob:***@db.example" in out, argv
