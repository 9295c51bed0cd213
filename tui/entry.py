"""The ``loadmaster`` executable: CLI commands, or the console when no command is given."""

from __future__ import annotations

import sys


def _agent_fast_path(argv: list[str]) -> int | None:
    """``loadmaster agent run|cleanup JOBDIR`` (or ``agent info``) on a node: skip the CLI, config
    and console imports, as ``python -I -m backend.agent`` does.

    Every job start pays this process's start-up, so the node side imports only the runner.
    """
    if argv[:1] != ["agent"]:
        return None
    from backend.agent.__main__ import agent_main

    return agent_main(argv)


def main() -> int:
    argv = sys.argv[1:]
    import os

    if os.environ.get("LOADMASTER_TRACE"):
        from tui.cli._trace import enable_trace

        enable_trace()
    fast = _agent_fast_path(argv)
    if fast is not None:
        return fast
    from tui import cli

    args = cli.parse(argv)

    def body() -> int:
        services = cli.services_for(args)
        if args.command is None:
            from tui.app import run_console

            return run_console(services, theme=args.theme)
        return cli.run(args, services, exit_fast=True)

    return cli.guarded(body)


if __name__ == "__main__":
    sys.exit(main())
