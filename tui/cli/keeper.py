"""``loadmaster keeper status|stop``: the SSH connections commands keep between runs ([ssh] persist)."""

from __future__ import annotations

import argparse
import json
import time

from backend.services import Services
from backend.textfmt import align_columns


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("keeper", help="the SSH connections kept between commands ([ssh] persist): status, stop")
    ksub = p.add_subparsers(dest="keeper_command", metavar="ACTION", required=True)
    st = ksub.add_parser("status", help="is a keeper running for this config, and which nodes it holds")
    st.add_argument("--json", action="store_true", help="print the keeper's own report as JSON")
    st.set_defaults(func=cmd_status, direct_ssh=True)
    sp = ksub.add_parser("stop", help="close the kept connections now (the next command connects afresh)")
    sp.set_defaults(func=cmd_stop, direct_ssh=True)


def cmd_status(args: argparse.Namespace, services: Services) -> int:
    from backend.nodes.keeper import keeper_status, persist_seconds, socket_path

    persist = persist_seconds(services.config)
    report = keeper_status(services.config)
    if args.json:
        print(
            json.dumps(
                report or {"running": False, "persist": persist, "socket": str(socket_path(services.config))}, indent=2
            )
        )
        return 0 if report else 1
    if report is None:
        state = (
            f"commands keep connections for {persist:g}s"
            if persist > 0
            else "off ([ssh] persist = 0): every command connects on its own"
        )
        print(f"no connection keeper running for {services.config.source} ({state})")
        return 1
    up = time.time() - report["started"]
    others = report["clients"]
    print(
        f"keeper pid {report['pid']}: up {up:.0f}s, {report['requests']} requests, idle {report['idle_s']:.0f}s "
        f"of {report['persist']:g}s, {others or 'no'} other command{'' if others == 1 else 's'} connected"
    )
    rows = [["NODE", "STATE", "CONNECTED", "HANDSHAKE", "ERROR"]]
    for name, n in report["nodes"].items():
        hs = f"{n['handshake_ms']:.0f} ms" if n.get("handshake_ms") is not None else "-"
        rows.append(
            [
                name,
                n["state"] if n["connected"] or n["state"] != "up" else "closed",
                "yes" if n["connected"] else "no",
                hs,
                n.get("error") or "-",
            ]
        )
    print("\n".join(align_columns(rows)))
    print(f"config {report['config']}")
    print(f"socket {report['socket']}")
    return 0


def cmd_stop(args: argparse.Namespace, services: Services) -> int:
    from backend.nodes.keeper import stop_keeper

    pid = stop_keeper(services.config)
    if pid is None:
        print(f"no connection keeper running for {services.config.source}")
        return 0
    print(f"stopped keeper pid {pid}: its connections are closed")
    return 0
