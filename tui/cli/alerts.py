"""``loadmaster alerts``: the site's Alertmanager alerts and silences, from the command line.

``alerts [--json]`` lists what Alertmanager holds, mapped to this inventory's nodes and jobs (the
console's Alerts screen shows the same); ``alerts silence --match alertname=GPUStarved,node=node-02
--for 2h --comment "..."`` makes a silence with the operator as author (audited, refused with
``--readonly``) and prints its id; one that may match alerts loadmaster did not raise needs
``--any-alert``. Every text Alertmanager holds was cleaned when it was read (escape codes,
controls, secrets in URLs: :func:`backend.textfmt.safe_text`); ``alerts silences`` lists them; ``alerts unsilence ID`` expires one. Errors are one
line and exit 2; "alerting degraded: ..." goes to stderr when ``loadmaster watch`` holds changes
it could not deliver.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, Any

from backend.services import Services

if TYPE_CHECKING:
    from backend.ops.alerts import Alerts


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``alerts``, ``alerts silence``, ``alerts silences`` and ``alerts unsilence``."""
    p = sub.add_parser(
        "alerts",
        help="the site's Alertmanager alerts (mapped to nodes and jobs) and silences",
        description="List Alertmanager's alerts ([alerts] alertmanager_url), make and expire silences.",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per alert, one per line")
    p.set_defaults(func=run_list)
    ss = p.add_subparsers(dest="alerts_command", metavar="SUBCOMMAND")

    s = ss.add_parser("silence", help="silence alerts matching labels for a while (audited; prints the id)")
    s.add_argument(
        "--match",
        action="append",
        required=True,
        metavar="NAME=VALUE",
        help="a label matcher (name=value or name=~regex; several with commas or repeated --match)",
    )
    s.add_argument("--for", dest="duration", required=True, metavar="DURATION", help="how long, e.g. 2h (at most 7d)")
    s.add_argument("--comment", required=True, help="why: what the next on-call reads")
    s.add_argument(
        "--any-alert",
        action="store_true",
        help="allow a silence that may match alerts loadmaster did not raise (the site's, other teams'); "
        "without it an exact alertname=<loadmaster condition> matcher is required (recorded in the audit log)",
    )
    s.set_defaults(func=run_silence)

    ls = ss.add_parser("silences", help="the silences in force (and pending); --all also the expired ones")
    ls.add_argument("--all", action="store_true", help="also expired silences")
    ls.add_argument("--json", action="store_true", help="one JSON object per silence, one per line")
    ls.set_defaults(func=run_silences)

    u = ss.add_parser("unsilence", help="expire a silence now (audited)")
    u.add_argument("silence_id", metavar="ID", help="the silence's id (alerts silences lists them)")
    u.add_argument("--reason", default="", help="why, for the audit log")
    u.set_defaults(func=run_unsilence)


def _degraded(alerts: Alerts) -> None:
    status = alerts.status()
    if status.degraded:
        from backend.textfmt import safe_text

        print(f"loadmaster: {safe_text(status.degraded)}", file=sys.stderr)  # may quote the server


def _since(when: Any) -> str:
    from backend.units import age_of

    return age_of(when.timestamp()) if when is not None else "?"


async def run_list(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations
    from backend.ops.alerts import describe
    from backend.textfmt import align_columns

    ops = Operations(services).alerts
    alerts = await ops.site()
    if args.json:
        for a in alerts:
            print(json.dumps(describe(a), sort_keys=True))
    else:
        rows = [["SEVERITY", "ALERTNAME", "NODE", "JOB", "SINCE", "SILENCED BY", "SUMMARY"]]
        for a in alerts:
            node = a.node or a.alert.labels.get("node") or a.alert.labels.get("instance") or "-"
            silenced = ",".join(s[:8] for s in a.alert.silenced_by) or "-"
            rows.append(
                [a.severity or "-", a.name, node, a.job_id or "-", _since(a.alert.starts_at), silenced, a.summary]
            )
        for line in align_columns(rows):
            print(line)
        firing = sum(1 for a in alerts if not a.silenced)
        print(f"{len(alerts)} alert(s): {firing} firing, {len(alerts) - firing} silenced")
    _degraded(ops)
    return 0


async def run_silence(args: argparse.Namespace, services: Services) -> int:
    from backend.errors import ConfigError
    from backend.ops import Operations
    from backend.ops.alerts import SilenceRequest, parse_matchers
    from backend.ops.types import parse_duration

    matchers, regex = parse_matchers(",".join(args.match))
    try:
        duration = parse_duration(args.duration)
    except ValueError as exc:
        raise ConfigError(str(exc), key="--for") from None
    req = SilenceRequest(matchers, duration, args.comment, regex, any_alert=args.any_alert)
    sid = await Operations(services).alerts.silence(req)
    print(sid)
    return 0


async def run_silences(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations
    from backend.textfmt import align_columns

    silences = await Operations(services).alerts.silences()
    shown = [s for s in silences if args.all or s.state != "expired"]
    if args.json:
        for s in shown:
            doc = {
                "id": s.id,
                "matchers": [m.text() for m in s.matchers],
                "state": s.state,
                "starts_at": s.starts_at.isoformat() if s.starts_at else None,
                "ends_at": s.ends_at.isoformat() if s.ends_at else None,
                "created_by": s.created_by,
                "comment": s.comment,
            }
            print(json.dumps(doc, sort_keys=True))
        return 0
    from backend.units import age_text

    rows = [["ID", "STATE", "ENDS IN", "CREATED BY", "MATCHERS", "COMMENT"]]
    for s in shown:
        ends = age_text(s.ends_at.timestamp() - time.time()) if s.ends_at is not None else "?"
        rows.append([s.id, s.state, ends, s.created_by, ",".join(m.text() for m in s.matchers), s.comment])
    for line in align_columns(rows):
        print(line)
    print(f"{len(shown)} silence(s)")
    return 0


async def run_unsilence(args: argparse.Namespace, services: Services) -> int:
    from backend.ops import Operations

    await Operations(services).alerts.expire(args.silence_id, reason=args.reason)
    print(f"silence {args.silence_id} expired")
    return 0
