"""The ``loadmaster`` executable: CLI commands, or the console when no command is given."""

from __future__ import annotations

import argparse
import sys

from backend.cli import main as cli_main
from backend.services import Services


def _open_console(services: Services, args: argparse.Namespace) -> int:
    from tui.app import LoadmasterApp

    app = LoadmasterApp(services, theme=args.theme)
    app.run()
    return int(app.return_code or 0)


def main() -> int:
    return cli_main(sys.argv[1:], open_console=_open_console)


if __name__ == "__main__":
    sys.exit(main())
