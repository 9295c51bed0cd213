"""The ``loadmaster`` command line: subcommands are discovered from the modules of this package.

Each module ``backend/cli/<feature>.py`` defines ``register(subparsers)`` adding its commands;
each command sets ``func(args, services) -> int`` (sync or async). User errors
(:class:`LoadmasterError`) print one clear line to stderr and exit 2; never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

from backend import __version__
from backend.config import load_config
from backend.errors import LoadmasterError
from backend.services import Services

ConsoleOpener = Callable[[Services, argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every feature module's subcommands."""
    parser = argparse.ArgumentParser(
        prog="loadmaster",
        description="Operations console for GPU training fleets. Without a command, opens the console.",
    )
    parser.add_argument("--version", action="version", version=f"loadmaster {__version__}")
    parser.add_argument("--config", metavar="FILE", help="config file (default: $LOADMASTER_CONFIG, "
                        "./loadmaster.toml, the platform config dir, else this machine alone)")
    parser.add_argument("--readonly", action="store_true",
                        help="monitor and plan only: nothing can be launched, cancelled or deleted")
    parser.add_argument("--theme", help="console theme (loadmaster-dark, loadmaster-light, loadmaster-contrast)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def _run_command(func: Callable[..., Any], args: argparse.Namespace, services: Services) -> int:
    if inspect.iscoroutinefunction(func):
        async def runner() -> int:
            try:
                return int(await func(args, services) or 0)
            finally:
                await services.aclose()

        return asyncio.run(runner())
    try:
        return int(func(args, services) or 0)
    finally:
        if "db" in services.__dict__:
            services.db.close()


def main(argv: Sequence[str] | None = None, *, open_console: ConsoleOpener | None = None) -> int:
    """Entry point. ``open_console`` is supplied by the console package (tui.entry)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        services = Services(config=config, readonly=args.readonly)
        if args.command is None:
            if open_console is None:
                parser.error("the console is not installed; run a COMMAND (see --help)")
            return open_console(services, args)
        return _run_command(args.func, args, services)
    except LoadmasterError as exc:
        print(f"loadmaster: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("loadmaster: interrupted", file=sys.stderr)
        return 130
