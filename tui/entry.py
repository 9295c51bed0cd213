"""The ``loadmaster`` executable: CLI commands, or the console when no command is given."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the node-side fast path below must not pay for the CLI's imports
    import argparse

    from backend.services import Services


def _open_console(services: Services, args: argparse.Namespace) -> int:
    from tui.app import LoadmasterApp

    app = LoadmasterApp(services, theme=args.theme)
    app.run()
    return int(app.return_code or 0)


def _agent_fast_path(argv: list[str]) -> int | None:
    """``loadmaster agent run|cleanup JOBDIR`` on a node: skip the CLI, config and console imports.

    Every job start pays this process's start-up, so the node side imports only the runner.
    """
    if len(argv) != 3 or argv[0] != "agent" or argv[1] not in ("run", "cleanup"):
        return None
    from pathlib import Path

    from backend.agent.runner import cleanup_job, run_job
    from backend.errors import LoadmasterError

    try:
        if argv[1] == "run":
            return run_job(Path(argv[2]))
        cleanup_job(Path(argv[2]))
        return 0
    except (LoadmasterError, OSError) as exc:
        print(f"loadmaster: error: {exc}", file=sys.stderr)
        return 2


def main() -> int:
    argv = sys.argv[1:]
    import os

    if os.environ.get("LOADMASTER_TRACE"):
        from backend.cli._trace import enable_trace

        enable_trace()
    fast = _agent_fast_path(argv)
    if fast is not None:
        return fast
    from backend.cli import main as cli_main

    return cli_main(argv, open_console=_open_console, exit_fast=True)


if __name__ == "__main__":
    sys.exit(main())
