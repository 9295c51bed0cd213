"""The CLI's command -> module table: it must name exactly what each module's ``register`` adds,
so running one command can import only its own module without any command going missing."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tui import cli

ROOT = Path(__file__).resolve().parents[1]


def _registered(module: str) -> set[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register = getattr(importlib.import_module(f"tui.cli.{module}"), "register", None)
    if register is not None:
        register(sub)
    return set(sub.choices)


def test_command_table_matches_every_modules_register() -> None:
    actual = {cmd: mod for mod in cli.feature_modules() for cmd in _registered(mod)}
    assert cli.COMMANDS == actual


def test_no_two_modules_register_the_same_command() -> None:
    seen: dict[str, str] = {}
    for mod in cli.feature_modules():
        for cmd in _registered(mod):
            assert cmd not in seen, f"{cmd!r} registered by {seen[cmd]} and {mod}"
            seen[cmd] = mod


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        (["pull", "s3://b/p/", "d", "--node", "n"], "jobs"),
        (["--config", "x.toml", "jobs"], "jobs"),
        (["--readonly", "--theme", "pull", "egress", "report"], "egress"),  # a value that looks like a command
        (["--config", "pull", "nodes"], "fleet"),
        (["--conf", "pull", "nodes"], "fleet"),  # argparse's abbreviations take a value too
        (["--config=x.toml", "top"], "top"),
        (["doctor"], "fleet"),
        ([], None),  # the console
        (["--help"], None),
        (["-h", "pull"], None),
        (["--version"], cli.VERSION_ONLY),
        (["--readonly", "--version", "pull"], cli.VERSION_ONLY),
        (["no-such-command"], None),  # the full parser says what exists
        (["--", "pull"], None),
    ],
)
def test_command_module_finds_the_command_word(argv: list[str], module: str | None) -> None:
    assert cli.command_module(argv) == module


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_single_module_parser_knows_the_command(command: str) -> None:
    parser = cli.build_parser(cli.COMMANDS[command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert command in sub.choices


def test_running_a_command_imports_only_its_module() -> None:
    code = (
        "import json, sys\n"
        "from tui import cli\n"
        "argv = ['--config', '/nonexistent.toml', 'jobs', '--local']\n"
        "cli.build_parser(cli.command_module(argv)).parse_args(argv)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('tui.cli.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["tui.cli.jobs"]


def test_version_imports_no_feature_module() -> None:
    """``--version`` is the start-up baseline bench/console_speed.py divides by: no command module
    (tui.cli.fleet alone pulled in doctor and asyncssh, 1 s)."""
    code = (
        "import json, sys\n"
        "from tui import cli\n"
        "try:\n"
        "    cli.parse(['--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('tui.cli.') or m == 'asyncssh')))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert run.stdout.splitlines()[0] == f"loadmaster {__import__('backend').__version__}"
    assert json.loads(run.stdout.splitlines()[-1]) == []


def test_unknown_command_still_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["no-such-command"])
    err = capsys.readouterr().err
    for command in ("pull", "doctor", "retention", "shard"):
        assert command in err


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``loadmaster ckpt size ... | head -1``: the closed pipe is no traceback, just exit 141."""
    env = {**os.environ, "LOADMASTER_CONFIG_DIR": str(tmp_path / "cfg"), "LOADMASTER_DATA_DIR": str(tmp_path / "d")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from tui.entry import main; sys.exit(main())",
            "ckpt",
            "size",
            "--params",
            "405e9",
            "--retained",
            "5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=Path(__file__).parents[1],
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
