"""The ``loadmaster`` command line: subcommands are discovered from the modules of this package.

Each module ``tui/cli/<feature>.py`` defines ``register(subparsers)`` adding its commands;
each command sets ``func(args, services) -> int`` (sync or async). User errors
(:class:`LoadmasterError`) print one clear line to stderr and exit 2; never a traceback.

Start-up imports only the module of the command being run (see :data:`COMMANDS`); help, the
console and anything unknown build the full parser from every module, as before.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import logging
import os
import pkgutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

from backend import __version__
from backend.config import load_config
from backend.errors import LoadmasterError
from backend.services import Services

log = logging.getLogger(__name__)

#: Which module registers each top-level command, so running one imports only its module (each
#: feature module pulls in its own stack: S3 clients, SSH, telemetry). A command missing here
#: still works through the full parser; tests/test_cli_commands.py keeps this table equal to
#: what the modules' ``register`` functions add.
COMMANDS: dict[str, str] = {
    "agent": "jobs",
    "alerts": "alerts",
    "audit": "retention",
    "ckpt": "ckpt",
    "doctor": "fleet",
    "drain": "slurm",
    "egress": "egress",
    "job": "jobs",
    "jobs": "jobs",
    "keeper": "keeper",
    "lab": "lab",
    "nodes": "fleet",
    "pull": "jobs",
    "restage": "restage",
    "resume": "slurm",
    "retention": "retention",
    "shard": "shard",
    "slurm": "slurm",
    "state": "state",
    "top": "top",
    "triage": "triage",
    "upload": "ckpt",
    "watch": "watch",
}

#: What command_module answers for ``--version``: the parser needs no feature module at all (the
#: baseline that bench/console_speed.py compares commands with stays the bare start-up).
VERSION_ONLY = "--version"

#: Top-level options that take a value (the word after them is not the command).
_VALUE_OPTIONS = frozenset({"--config", "--theme"})


def command_module(argv: Sequence[str]) -> str | None:
    """The feature module for the command in ``argv``, or None (help, console, unknown: all modules);
    VERSION_ONLY for ``--version`` before any command."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word.startswith("--") and len(word) > 2 and any(o.startswith(word) for o in _VALUE_OPTIONS):
            skip = True  # also an abbreviation argparse accepts (--conf FILE)
        elif word == "--version":
            return VERSION_ONLY
        elif word == "--" or word in ("-h", "--help"):
            return None
        elif not word.startswith("-"):
            return COMMANDS.get(word)
    return None


def feature_modules() -> list[str]:
    """Every feature module of this package (those that may register commands)."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The argument parser with every feature module's subcommands (or only ``only``'s)."""
    parser = argparse.ArgumentParser(
        prog="loadmaster",
        description="Operations console for GPU training fleets. Without a command, opens the console.",
    )
    parser.add_argument("--version", action="version", version=f"loadmaster {__version__}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="config file (default: $LOADMASTER_CONFIG, "
        "./loadmaster.toml, the platform config dir, else this machine alone)",
    )
    parser.add_argument(
        "--readonly", action="store_true", help="monitor and plan only: nothing can be launched, cancelled or deleted"
    )
    parser.add_argument("--theme", help="console theme (loadmaster-dark, loadmaster-light, loadmaster-contrast)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = [] if only == VERSION_ONLY else [only] if only else feature_modules()
    for name in names:
        module = importlib.import_module(f"{__name__}.{name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def _exit_now(services: Services, code: int) -> None:
    """End the process at once after a command finished: output flushed, state DB closed.

    Skips closing SSH connections (the node ends their sessions; jobs run detached, in their own
    sessions) and the interpreter's teardown of every imported module.
    """
    if "db" in services.__dict__:
        services.db.close()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _run_command(
    func: Callable[..., Any], args: argparse.Namespace, services: Services, *, exit_fast: bool = False
) -> int:
    if inspect.iscoroutinefunction(func):

        async def runner() -> int:
            try:
                code = int(await func(args, services) or 0)
            except BaseException:
                await services.aclose()
                raise
            if exit_fast:
                _exit_now(services, code)
            await services.aclose()
            return code

        return asyncio.run(runner())
    try:
        return int(func(args, services) or 0)
    finally:
        if "db" in services.__dict__:
            services.db.close()


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed command line (argparse exits with its usage message on a malformed one)."""
    argv = list(argv)
    args = build_parser(command_module(argv)).parse_args(argv)
    log.debug("cli: parsed")
    return args


def services_for(args: argparse.Namespace) -> Services:
    """The services a command line asks for: its config, read-only flag and SSH connection mode."""
    config = load_config(args.config)
    log.debug("cli: config loaded")
    for note in config.notes:  # deprecated keys: once per command, on stderr (stdout stays data)
        print(f"loadmaster: note: {note}", file=sys.stderr)
    # Commands reach SSH nodes through the connection keeper (connections kept between commands,
    # [ssh] persist); the console holds its own, and `doctor` measures fresh ones.
    return Services(
        config=config,
        readonly=args.readonly,
        keep_connections=args.command is not None and not getattr(args, "direct_ssh", False),
    )


def run(args: argparse.Namespace, services: Services, *, exit_fast: bool = False) -> int:
    """Run the parsed COMMAND. With ``exit_fast`` (the ``loadmaster`` executable, never in-process
    callers), a command that sets ``exit_fast`` in its defaults ends the process as soon as it
    returns (see :func:`_exit_now`)."""
    return _run_command(args.func, args, services, exit_fast=exit_fast and getattr(args, "exit_fast", False))


def guarded(body: Callable[[], int]) -> int:
    """Run ``body``: a user error (:class:`LoadmasterError`) prints one clean line and gives 2."""
    try:
        return body()
    except LoadmasterError as exc:
        from backend.textfmt import safe_text

        # an error can carry a node's stderr or a server's answer: the one sanitiser (no escape
        # sequence reaches the operator's terminal, no credential in a URL)
        text = "\n".join(safe_text(line, None) for line in str(exc).splitlines())
        print(f"loadmaster: error: {text}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("loadmaster: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`loadmaster audit | head`): stop quietly, as a Unix tool does, and
        # point stdout at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def main(argv: Sequence[str] | None = None, *, exit_fast: bool = False) -> int:
    """Run one COMMAND from ``argv`` (the console, opened without one, is tui.entry's to start)."""
    log.debug("cli: imported")
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        build_parser().print_help(sys.stderr)
        return 2

    return guarded(lambda: run(args, services_for(args), exit_fast=exit_fast))
