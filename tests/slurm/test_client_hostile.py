"""The Slurm client against hostile stand-ins for ``sinfo``, ``squeue`` and ``scontrol`` (real
Slurm will not play the attacker): an answer that never ends, one that hangs, HTML, JSON nested past
the recursion limit, escape codes on stderr; and an old Slurm without ``--json`` (the text forms).
Every failure is one line naming the command; nothing is half-used."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from backend.slurm.client import SlurmClient, SlurmError, SlurmNotFound
from backend.slurm.parse import SlurmParseError
from backend.slurm.settings import SlurmSettings

DATA = Path(__file__).parent / "data"
pytestmark = [pytest.mark.timeout(60)]


def stand_in(tmp_path: Path, scripts: dict[str, str]) -> SlurmClient:
    b = tmp_path / "slurm-bin"
    b.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (b / name).write_text("#!/bin/sh\n" + body)
        (b / name).chmod(0o755)
    return SlurmClient(SlurmSettings(enabled=True, bin_dir=str(b), timeout=2.0))


def one_line(exc: BaseException, needle: str) -> None:
    text = str(exc)
    assert "\n" not in text and "\x1b" not in text and needle in text, text


def test_an_endless_answer_is_refused(tmp_path: Path) -> None:
    client = stand_in(tmp_path, {"sinfo": "exec yes '{\"nodes\": ['\n"})
    with pytest.raises(SlurmError) as exc:
        asyncio.run(client.nodes())
    one_line(exc.value, "larger than 64 MiB")


def test_a_hang_times_out(tmp_path: Path) -> None:
    client = stand_in(tmp_path, {"squeue": "sleep 30; echo {}\n"})  # a child holds the pipe
    with pytest.raises(SlurmError) as exc:
        asyncio.run(client.jobs())
    one_line(exc.value, "squeue --json took longer than 2s")


@pytest.mark.parametrize("body", ["echo '<html><body>502</body></html>'", "python3 -c \"print('[' * 200000)\""])
def test_not_json_is_one_line(tmp_path: Path, body: str) -> None:
    client = stand_in(tmp_path, {"sinfo": body + "\n"})
    with pytest.raises(SlurmParseError) as exc:
        asyncio.run(client.nodes())
    one_line(exc.value, "not JSON")


def test_slurm_errors_are_one_clean_line(tmp_path: Path) -> None:
    client = stand_in(
        tmp_path,
        {"sinfo": "printf 'sinfo: error: \\033[2J Unable to contact slurm controller\\nsecond line\\n' >&2; exit 1\n"},
    )
    with pytest.raises(SlurmError) as exc:
        asyncio.run(client.nodes())
    one_line(exc.value, "sinfo --json failed: sinfo: error:")


def test_old_slurm_without_json_uses_the_text_forms(tmp_path: Path) -> None:
    no_json = "echo \"$0: unrecognized option '--json'\" >&2; exit 1\n"
    nodes_txt = tmp_path / "nodes.txt"
    jobs_txt = tmp_path / "jobs.txt"
    shutil.copy(DATA / "scontrol-node-22.05.txt", nodes_txt)
    shutil.copy(DATA / "scontrol-job-22.05.txt", jobs_txt)
    client = stand_in(
        tmp_path,
        {
            "sinfo": no_json,
            "squeue": no_json,
            "scontrol": f'[ "$2" = node ] && exec cat {nodes_txt}; exec cat {jobs_txt}\n',
        },
    )
    snap = asyncio.run(client.snapshot())
    assert [n.shape for n in snap.nodes] == ["text"] * 3
    assert snap.node("node-01").state.label == "draining"  # type: ignore[union-attr]
    assert {j.job_id: j.gpus_on("node-01") for j in snap.jobs_on("node-01")} == {"1": (0, 1), "2": (2,)}


def test_missing_commands_name_the_fix(tmp_path: Path) -> None:
    client = SlurmClient(SlurmSettings(enabled=True, bin_dir=str(tmp_path / "nowhere")))
    with pytest.raises(SlurmNotFound) as exc:
        asyncio.run(client.nodes())
    one_line(exc.value, "apt-get install slurm-client")
