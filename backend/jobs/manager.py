"""Durable jobs: launch on a node, re-attach from job directories, detect lost jobs, cancel.

A job lives in ``$LOADMASTER_HOME/jobs/<id>/`` on its node (``~/.loadmaster`` when unset) and is
run there by ``<agent> agent run JOBDIR`` in its own session. The console keeps no connection to
it: every view of a job is one remote read of its directory (all jobs of a node in one command),
merged with the local SQLite record of who launched what, when and from where. A job is only
``succeeded`` when its runner wrote that result after verifying its output; a runner that died
without a result (dead pid and stale heartbeat) becomes ``lost``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets as _secrets
import shlex
import shutil
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from backend.agent.context import (
    CANCEL_FILE,
    LOG_FILE,
    PROGRESS_FILE,
    RESULT_FILE,
    SECRETS_FILE,
    done_fifo,
)
from backend.agent.kinds import KINDS
from backend.config import Config
from backend.errors import CommandFailed, JobError, LoadmasterError, NodeError, NodeUnreachable
from backend.jobs.settings import JobSettings
from backend.nodes.transport import Transport
from backend.state import StateDB, actor

log = logging.getLogger(__name__)

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})
ACTIVE = frozenset({"starting", "running", "cancelling"})

JOBS_DDL = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    kind TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '',
    params TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL,
    created REAL NOT NULL,
    launched_by TEXT NOT NULL,
    launched_from TEXT NOT NULL,
    job_dir TEXT,
    pid INTEGER,
    started REAL,
    finished REAL,
    error TEXT,
    result TEXT,
    progress TEXT,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_created ON jobs(created);
CREATE TABLE IF NOT EXISTS job_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id TEXT NOT NULL,
    ts REAL NOT NULL,
    event TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS job_events_job ON job_events(job_id);
"""

#: Lists every job directory of a node (or those matching $1) in one command. Liveness is checked
#: against /proc/<pid>/cmdline naming the job directory, so a recycled pid never looks alive.
SCAN_SCRIPT = r"""
H="${LOADMASTER_HOME:-$HOME/.loadmaster}/jobs"
PAT="$1"; TAIL="$2"; WAIT="$3"; shift 3
# Optionally wait (up to WAIT tenths of a second) until the named jobs have results, so a follower
# sees the end at once without polling the whole scan. The runner opens its FIFO (.ID.done) right after
# writing the result, which ends a blocked read of it at once; where that cannot work (no FIFO,
# no timeout(1)) a sleep per tenth costs almost nothing.
command -v timeout >/dev/null 2>&1 && HAVE_TIMEOUT=1 || HAVE_TIMEOUT=0
n=0
while [ "$n" -lt "$WAIT" ]; do
  pending=
  for id in "$@"; do [ -f "$H/$id/result.json" ] || { pending=$id; break; }; done
  [ -z "$pending" ] && break
  if [ "$HAVE_TIMEOUT" = 1 ] && [ -p "$H/.$pending.done" ] && [ $((WAIT - n)) -ge 5 ]; then
    # The result may land between the check above and this open: then the read waits out its
    # half second (the bound), never longer.
    timeout 0.5 cat "$H/.$pending.done" >/dev/null 2>&1
    [ $? = 124 ] && n=$((n+5)) || n=$((n+1))
  else
    sleep 0.1; n=$((n+1))
  fi
done
echo "@@HOME $H"
echo "@@NOW $(date +%s.%N 2>/dev/null || date +%s)"
[ -d "$H" ] || exit 0
for d in "$H"/$PAT; do
  [ -f "$d/spec.json" ] || continue
  echo "@@JOB ${d##*/}"
  printf '@@SPEC '; tr -d '\n' < "$d/spec.json"; echo
  if [ -f "$d/pid" ]; then
    printf '@@PID '; tr -d '\n' < "$d/pid"; echo
  fi
  # A finished job's liveness does not matter (its result decides): skip the /proc checks.
  if [ -f "$d/pid" ] && [ ! -f "$d/result.json" ]; then
    pid=$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' "$d/pid")
    if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ]; then
      if tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF "$d"; then echo "@@ALIVE 1"; else echo "@@ALIVE 0"; fi
    elif [ -n "$pid" ] && [ ! -d /proc ] && kill -0 "$pid" 2>/dev/null; then echo "@@ALIVE 1"
    else echo "@@ALIVE 0"; fi
  fi
  if [ -f "$d/result.json" ]; then printf '@@RESULT '; tr -d '\n' < "$d/result.json"; echo
  else
    [ -f "$d/heartbeat" ] && { printf '@@BEAT '; head -n 1 "$d/heartbeat"; }
    [ -f "$d/cancel" ] && echo "@@CANCEL 1"
    [ -f "$d/progress.jsonl" ] && tail -n "$TAIL" "$d/progress.jsonl" | sed 's/^/@@PROG /'
  fi
done
exit 0
"""


#: Starts a job in one command: $1 is the job id; stdin is the secrets JSON (one line, maybe
#: empty) then the spec. The spec lands by rename, so a scan never reads half of it.
LAUNCH_SCRIPT = r"""
H="${LOADMASTER_HOME:-$HOME/.loadmaster}/jobs"; ID="$1"; D="$H/$ID"
U=$(umask)
umask 077
mkdir -p "$H" && mkdir "$D" || exit 1
echo "@@HOME $H"
IFS= read -r S || exit 1
if [ -n "$S" ]; then printf '%s\n' "$S" > "$D/secrets.json" || exit 1; fi
S=
cat > "$D/.spec.json.tmp" && mv -f "$D/.spec.json.tmp" "$D/spec.json" || exit 1
cd "$D" || exit 1
export D
# The runner and everything it starts carry the job id: the proof, before any signal, that a
# process group is this job's (see PROVE_SCRIPT).
LOADMASTER_JOB_ID="$ID"; export LOADMASTER_JOB_ID
umask "$U"  # the job (and the files it pulls) runs with the node's own umask
setsid sh -c @INNER@ </dev/null >>"$D/log" 2>&1 &
echo "@@PID $!"
"""


#: Defines ``lm_ours``: true only when process group $G is job $JID's. Either its leader still
#: runs with the start time the runner recorded ($ST, field 22 of /proc/PID/stat) in the boot it
#: recorded ($BOOT), or a member of the group still carries LOADMASTER_JOB_ID=$JID in its
#: environment. After a reboot (another boot id) nothing is ours; a recycled pid or group id
#: proves nothing. Every signal to a job's group is sent only after this check.
PROVE_SCRIPT = r"""
lm_ours() {
  case "$G" in ''|*[!0-9]*) return 1;; esac
  [ "$G" -gt 1 ] || return 1
  if [ -n "$BOOT" ] && [ -r /proc/sys/kernel/random/boot_id ]; then
    [ "$(cat /proc/sys/kernel/random/boot_id)" = "$BOOT" ] || return 1
  fi
  if [ -n "$ST" ] && read -r lm_s 2>/dev/null < "/proc/$G/stat"; then
    set -- ${lm_s##*) }
    [ "${20}" = "$ST" ] && return 0
  fi
  for lm_p in /proc/[0-9]*; do
    read -r lm_s 2>/dev/null < "$lm_p/stat" || continue
    set -- ${lm_s##*) }
    [ "$3" = "$G" ] || continue
    tr '\0' '\n' 2>/dev/null < "$lm_p/environ" | grep -qxF "LOADMASTER_JOB_ID=$JID" && return 0
  done
  return 1
}
"""


def prove_vars(job_id: str, pidinfo: dict[str, Any] | None, fallback_pgid: int | None = None) -> str:
    """Shell assignments of G, ST, BOOT and JID for :data:`PROVE_SCRIPT` from a job's pid file."""
    info = pidinfo or {}
    pgid = info.get("pgid") or fallback_pgid or 0
    try:
        pgid = int(pgid)
    except (TypeError, ValueError):
        pgid = 0
    st = info.get("starttime")
    st_text = str(int(st)) if isinstance(st, int | float) or (isinstance(st, str) and st.isdigit()) else ""
    return (f"G={pgid}; ST={shlex.quote(st_text)}; BOOT={shlex.quote(str(info.get('boot_id') or ''))}; "
            f"JID={shlex.quote(job_id)}; ")


#: Writes a secrets line from stdin into the job directory $1 (0600, builtins only: never an
#: argv), runs the kind's cleanup there (@AGENT@: the node's agent command), and removes the file
#: again whatever happened.
CLEANUP_SCRIPT = r"""
D="$1"
umask 077
IFS= read -r S
if [ -n "$S" ]; then printf '%s\n' "$S" > "$D/secrets.json"; fi
S=
@AGENT@ agent cleanup "$D" >>"$D/log" 2>&1
rc=$?
rm -f "$D/secrets.json"
exit $rc
"""


@dataclass(frozen=True)
class JobProgress:
    """The latest progress point of a job, with the throughput derived from recent points."""

    t: float
    bytes_done: int
    bytes_total: int | None = None
    items_done: int = 0
    items_total: int | None = None
    rate_bps: float | None = None  # bytes per second
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fraction(self) -> float | None:
        """Done fraction (0..1) by bytes, else by items; None when the total is unknown."""
        if self.bytes_total:
            return min(1.0, self.bytes_done / self.bytes_total)
        if self.items_total:
            return min(1.0, self.items_done / self.items_total)
        return None

    @property
    def gbps(self) -> float | None:
        return None if self.rate_bps is None else self.rate_bps * 8 / 1e9

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate."""
        if not self.bytes_total or not self.rate_bps or self.rate_bps <= 0:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / self.rate_bps)

    def as_dict(self) -> dict[str, Any]:
        d = {"t": self.t, "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
             "items_done": self.items_done, "items_total": self.items_total, "rate_bps": self.rate_bps,
             "gbps": self.gbps, "eta_s": self.eta_s, "fraction": self.fraction}
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return d


@dataclass(frozen=True)
class JobRecord:
    """One job as the console knows it: local record merged with its remote directory."""

    id: str
    node: str
    kind: str
    state: str
    created: float
    launched_by: str
    launched_from: str
    label: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    job_dir: str | None = None
    pid: int | None = None
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    progress: JobProgress | None = None
    heartbeat_age: float | None = None
    #: Why the remote state could not be read just now (node unreachable); None when fresh.
    note: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def source(self) -> str:
        return str(self.params.get("src") or self.params.get("source") or "")

    @property
    def destination(self) -> str:
        return str(self.params.get("dest") or self.params.get("destination") or "")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (``loadmaster jobs --json``)."""
        return {
            "id": self.id, "node": self.node, "kind": self.kind, "state": self.state, "label": self.label,
            "created": self.created, "launched_by": self.launched_by, "launched_from": self.launched_from,
            "params": _public_params(self.params), "job_dir": self.job_dir, "pid": self.pid,
            "started": self.started, "finished": self.finished, "error": self.error, "result": self.result,
            "progress": self.progress.as_dict() if self.progress else None,
            "heartbeat_age": self.heartbeat_age, "note": self.note,
        }


@dataclass(frozen=True)
class FleetProgress:
    """A roll-up of several jobs (one pull fanned out to many nodes)."""

    jobs: int
    running: int
    succeeded: int
    failed: int
    bytes_done: int
    bytes_total: int | None
    items_done: int
    items_total: int | None
    rate_bps: float

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.bytes_done / self.bytes_total) if self.bytes_total else None

    @property
    def eta_s(self) -> float | None:
        if not self.bytes_total or self.rate_bps <= 0:
            return None
        return max(0.0, (self.bytes_total - self.bytes_done) / self.rate_bps)


def fleet_rollup(records: Iterable[JobRecord]) -> FleetProgress:
    """Sum progress and throughput over jobs (totals unknown if any job's total is)."""
    recs = list(records)
    bd = bt = idn = it = 0
    bt_known = it_known = True
    rate = 0.0
    for r in recs:
        p = r.progress
        if p is None:
            bt_known = it_known = False
            continue
        bd += p.bytes_done
        idn += p.items_done
        if p.bytes_total is None:
            bt_known = False
        else:
            bt += p.bytes_total
        if p.items_total is None:
            it_known = False
        else:
            it += p.items_total
        if r.state == "running" and p.rate_bps:
            rate += p.rate_bps
    return FleetProgress(
        jobs=len(recs), running=sum(r.state in ACTIVE for r in recs),
        succeeded=sum(r.state == "succeeded" for r in recs),
        failed=sum(r.state in ("failed", "lost", "cancelled") for r in recs),
        bytes_done=bd, bytes_total=bt if bt_known and recs else None, items_done=idn,
        items_total=it if it_known and recs else None, rate_bps=rate,
    )


@dataclass
class _RemoteJob:
    id: str
    spec: dict[str, Any] = field(default_factory=dict)
    pidinfo: dict[str, Any] | None = None
    alive: bool | None = None
    result: dict[str, Any] | None = None
    beat: float | None = None
    cancel_requested: bool = False
    progress: list[dict[str, Any]] = field(default_factory=list)


def _obj(rest: str, what: str) -> dict[str, Any]:
    """One JSON object from a node's scan line: bounded in size and depth, strings cleaned of
    escape sequences (they reach the operator's terminal and the console); ValueError otherwise."""
    from backend.nodes.untrusted import clean_text, loads_bounded

    v = loads_bounded(rest, what=what)
    if not isinstance(v, dict):
        raise ValueError(f"{what}: not a JSON object")

    def clean(x: Any, depth: int = 0) -> Any:
        if isinstance(x, str):
            return clean_text(x)
        if depth < 32 and isinstance(x, dict):
            return {clean_text(str(k)): clean(val, depth + 1) for k, val in x.items()}
        if depth < 32 and isinstance(x, list):
            return [clean(val, depth + 1) for val in x]
        return x

    out: dict[str, Any] = clean(v)
    return out


def parse_scan(text: str) -> tuple[str | None, float | None, list[_RemoteJob]]:
    """Parse :data:`SCAN_SCRIPT` output into (jobs dir, node clock, jobs); what a node prints is
    untrusted: a malformed, oversized or deeply nested line is skipped, never a crash."""
    home: str | None = None
    now: float | None = None
    jobs: list[_RemoteJob] = []
    cur: _RemoteJob | None = None
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        try:
            if tag == "@@HOME":
                home = rest
            elif tag == "@@NOW":
                now = float(rest)
            elif tag == "@@JOB":
                cur = _RemoteJob(rest)
                jobs.append(cur)
            elif cur is None:
                continue
            elif tag == "@@SPEC":
                cur.spec = _obj(rest, "job spec")
            elif tag == "@@PID":
                cur.pidinfo = _obj(rest, "job pid file")
            elif tag == "@@ALIVE":
                cur.alive = rest.strip() == "1"
            elif tag == "@@RESULT":
                cur.result = _obj(rest, "job result")
            elif tag == "@@BEAT":
                cur.beat = float(rest)
            elif tag == "@@CANCEL":
                cur.cancel_requested = True
            elif tag == "@@PROG":
                cur.progress.append(_obj(rest, "progress line"))
        except (ValueError, TypeError):
            continue  # a half-written line (the runner is appending): read it next time
    return home, now, [j for j in jobs if j.spec]


def progress_from_lines(lines: list[dict[str, Any]]) -> JobProgress | None:
    """The last progress point; throughput from the runner's rate, else the points' slope."""
    if not lines:
        return None
    last = lines[-1]
    rate = last.get("rate_bps")
    if rate is None and len(lines) >= 2:
        first = lines[0]
        dt = float(last.get("t", 0)) - float(first.get("t", 0))
        if dt > 0:
            rate = max(0.0, (int(last.get("bytes_done", 0)) - int(first.get("bytes_done", 0))) / dt)
    known = {"t", "bytes_done", "bytes_total", "items_done", "items_total", "rate_bps"}
    return JobProgress(
        t=float(last.get("t", 0.0)), bytes_done=int(last.get("bytes_done", 0)),
        bytes_total=last.get("bytes_total"), items_done=int(last.get("items_done", 0)),
        items_total=last.get("items_total"), rate_bps=None if rate is None else float(rate),
        extra={k: v for k, v in last.items() if k not in known},
    )


def _public_params(params: dict[str, Any]) -> dict[str, Any]:
    # Long verification lists stay in the spec; views show their size only.
    return {k: (f"<{len(v)} entries>" if isinstance(v, list) and len(v) > 20 else v) for k, v in params.items()}


def _read_note(exc: BaseException) -> str:
    if isinstance(exc, NodeUnreachable):
        return f"node unreachable: {exc}"
    return f"cannot read the job's directory: {exc}" if isinstance(exc, LoadmasterError) else repr(exc)


def new_job_id() -> str:
    """A short, sortable, unique job id like ``1129-103200-a1b2``."""
    return time.strftime("%m%d-%H%M%S") + "-" + _secrets.token_hex(2)


class JobManager:
    """Launch, list, follow, cancel and re-attach to jobs on every node."""

    def __init__(self, pool: Any, db: StateDB, config: Config) -> None:
        self.pool = pool
        self.db = db
        self.config = config
        self.settings: JobSettings = config.section("jobs")
        self._homes: dict[str, str] = {}
        self._samples: dict[str, deque[tuple[float, int]]] = {}
        db.ensure(JOBS_DDL)

    # -- launching -----------------------------------------------------------------------------

    def agent_command(self, node: str) -> str:
        """The shell words that start the agent on ``node`` (config ``agent``, default loadmaster)."""
        n = self.config.node(node)
        agent = n.agent or "loadmaster"
        if n.transport == "local" and agent == "loadmaster" and shutil.which("loadmaster") is None:
            # The console's own install: a venv that is not on PATH still has its script.
            own = Path(sys.executable).parent / "loadmaster"
            if own.exists():
                return shlex.quote(str(own))
        return agent

    async def jobs_dir(self, node: str) -> str:
        """The node's jobs directory (``$LOADMASTER_HOME/jobs`` or ``~/.loadmaster/jobs``), created 0700."""
        if node not in self._homes:
            t = self.pool.transport(node)
            res = await t.run(
                'H="${LOADMASTER_HOME:-$HOME/.loadmaster}"; umask 077; mkdir -p "$H/jobs" && printf %s "$H/jobs"',
                timeout=30,
            )
            if not res.ok or not res.stdout.strip():
                raise JobError(f"{node}: cannot create the jobs directory: {res.stderr.strip() or 'no output'}")
            self._homes[node] = res.stdout.strip()
        return self._homes[node]

    async def launch(
        self,
        node: str,
        kind: str,
        params: dict[str, Any],
        *,
        secrets: dict[str, str] | None = None,
        label: str = "",
    ) -> JobRecord:
        """Start a ``kind`` job on ``node`` detached from this console; returns its record."""
        if kind not in KINDS:
            raise JobError(f"unknown job kind {kind!r} (known: {', '.join(sorted(KINDS))})")
        self.config.node(node)
        try:
            json.dumps(params)
        except TypeError as exc:
            raise JobError(f"job parameters must be JSON values: {exc}") from None
        t: Transport = self.pool.transport(node)
        job_id = new_job_id()
        known = self._homes.get(node)
        job_dir = f"{known}/{job_id}" if known else None
        now = time.time()
        spec = {"id": job_id, "kind": kind, "node": node, "label": label, "params": params, "created": now,
                "launched_by": actor(), "launched_from": socket.gethostname()}
        self.db.execute(
            "INSERT INTO jobs (id, node, kind, label, params, state, created, launched_by, launched_from, job_dir,"
            " updated) VALUES (?, ?, ?, ?, ?, 'starting', ?, ?, ?, ?, ?)",
            (job_id, node, kind, label, json.dumps(params), now, spec["launched_by"], spec["launched_from"],
             job_dir, now),
        )
        self._event(job_id, "launch", f"{kind} on {node}")
        # One round trip: create the job directory, write the secrets (0600, first line of stdin)
        # and the spec (the rest), start the agent detached. Secrets never reach an argv: the
        # shell's read/printf are builtins.
        inner = f'exec {self.agent_command(node)} agent run "$D"'
        script = LAUNCH_SCRIPT.replace("@INNER@", shlex.quote(inner))
        payload = (json.dumps(secrets) if secrets else "") + "\n" + json.dumps(spec)
        try:
            res = await t.run(f"sh -c {shlex.quote(script)} launch {shlex.quote(job_id)}", input=payload,
                              timeout=60)
            home = pid_text = None
            for line in res.stdout.splitlines():
                tag, _, rest = line.partition(" ")
                if tag == "@@HOME":
                    home = rest
                elif tag == "@@PID":
                    pid_text = rest.strip()
            if not res.ok or not home or not (pid_text or "").isdigit():
                if home:
                    job_dir = f"{home}/{job_id}"
                raise CommandFailed(node, f"start the {kind} job", res.exit_status,
                                    res.stderr.strip() or "no pid printed")
            pid = int(pid_text or 0)
        except BaseException as exc:
            msg = str(exc) if isinstance(exc, LoadmasterError) else f"{type(exc).__name__}: {exc}"
            self._update(job_id, state="failed", error=f"could not start: {msg}", finished=time.time(),
                         **({"job_dir": job_dir} if job_dir else {}))
            if secrets:
                q = shlex.quote(f"{job_dir}/{SECRETS_FILE}") if job_dir else \
                    f'"${{LOADMASTER_HOME:-$HOME/.loadmaster}}/jobs/"{shlex.quote(job_id)}/{SECRETS_FILE}'
                try:
                    await asyncio.shield(t.run(f"rm -f {q}", timeout=10))
                except Exception:  # noqa: BLE001 - the node is probably unreachable; nothing was started
                    pass
            if isinstance(exc, NodeError):
                raise JobError(f"{node}: could not start the {kind} job: {exc.detail}") from None
            raise
        log.debug("%s: job %s started, pid %d", node, job_id, pid)
        self._homes.setdefault(node, home)
        job_dir = f"{home}/{job_id}"
        self._update(job_id, state="running", pid=pid, started=time.time(), job_dir=job_dir)
        return self.get(job_id)

    # -- local records -------------------------------------------------------------------------

    def _event(self, job_id: str, event: str, detail: str = "") -> None:
        self.db.execute("INSERT INTO job_events (job_id, ts, event, detail) VALUES (?, ?, ?, ?)",
                        (job_id, time.time(), event, detail))

    def _update(self, job_id: str, **cols: Any) -> None:
        if not cols:
            return
        old = self.db.query("SELECT state FROM jobs WHERE id = ?", (job_id,))
        cols["updated"] = time.time()
        for k in ("result", "progress"):
            if k in cols and not isinstance(cols[k], str | None):
                cols[k] = json.dumps(cols[k], default=str)
        sets = ", ".join(f"{k} = ?" for k in cols)
        self.db.execute(f"UPDATE jobs SET {sets} WHERE id = ?", (*cols.values(), job_id))
        if "state" in cols and old and old[0]["state"] != cols["state"]:
            self._event(job_id, cols["state"], cols.get("error") or "")

    def _row_record(self, row: Any, **over: Any) -> JobRecord:
        prog = json.loads(row["progress"]) if row["progress"] else None
        rec = JobRecord(
            id=row["id"], node=row["node"], kind=row["kind"], state=row["state"], created=row["created"],
            launched_by=row["launched_by"], launched_from=row["launched_from"], label=row["label"],
            params=json.loads(row["params"] or "{}"), job_dir=row["job_dir"], pid=row["pid"],
            started=row["started"], finished=row["finished"], error=row["error"],
            result=json.loads(row["result"]) if row["result"] else None,
            progress=JobProgress(**prog) if prog else None,
        )
        return replace(rec, **over) if over else rec

    def resolve_id(self, job_id: str) -> str:
        """The full id of a job given its id or a unique prefix of it."""
        rows = self.db.query("SELECT id FROM jobs WHERE id = ?", (job_id,))
        if rows:
            return str(rows[0]["id"])
        rows = self.db.query("SELECT id FROM jobs WHERE id LIKE ? ORDER BY created DESC LIMIT 5",
                             (job_id.replace("%", "") + "%",))
        if len(rows) == 1:
            return str(rows[0]["id"])
        if not rows:
            raise JobError(f"no job {job_id!r} (see 'loadmaster jobs')")
        raise JobError(f"job id {job_id!r} is ambiguous: {', '.join(r['id'] for r in rows)}")

    def get(self, job_id: str) -> JobRecord:
        """The job's last known record from the local state (no remote read)."""
        jid = self.resolve_id(job_id)
        return self._row_record(self.db.query("SELECT * FROM jobs WHERE id = ?", (jid,))[0])

    def records(self, *, limit: int = 500) -> list[JobRecord]:
        """Every recorded job, newest first (no remote read)."""
        rows = self.db.query("SELECT * FROM jobs ORDER BY created DESC LIMIT ?", (limit,))
        return [self._row_record(r) for r in rows]

    def samples(self, job_id: str) -> list[tuple[float, int]]:
        """(time, bytes done) points seen for a job while this console watched it (for plots)."""
        return list(self._samples.get(job_id, ()))

    # -- re-attaching --------------------------------------------------------------------------

    async def _scan(
        self, node: str, pattern: str = "*", tail: int = 6, *, wait_for: Iterable[str] = (), max_wait: float = 0.0
    ) -> tuple[str | None, float, list[_RemoteJob]]:
        t = self.pool.transport(node)
        ids = " ".join(shlex.quote(i) for i in wait_for)
        tenths = int(max_wait * 10) if ids else 0
        res = await t.run(f"sh -c {shlex.quote(SCAN_SCRIPT)} scan {shlex.quote(pattern)} {int(tail)} {tenths} {ids}",
                          timeout=60 + max_wait)
        if not res.ok:
            raise JobError(f"{node}: cannot read job directories: {res.stderr.strip() or res.exit_status}")
        home, now, jobs = parse_scan(res.stdout)
        if home:
            self._homes.setdefault(node, home)
        return home, now or time.time(), jobs

    async def refresh(
        self, nodes: Iterable[str] | None = None, *, wait_for: Iterable[str] = (), max_wait: float = 0.0
    ) -> list[JobRecord]:
        """Re-read every job directory on ``nodes`` (all by default) and return all records.

        With ``wait_for`` job ids, each node first waits up to ``max_wait`` seconds for those of
        its jobs to finish, so a follower learns of the end promptly with few round trips.
        """
        names = list(nodes) if nodes is not None else [n.name for n in self.config.nodes]
        waiting = set(wait_for)
        by_node: dict[str, list[str]] = {}
        if waiting:
            for row in self.db.query(f"SELECT id, node FROM jobs WHERE id IN ({','.join('?' * len(waiting))})",
                                     tuple(waiting)):
                by_node.setdefault(row["node"], []).append(row["id"])
        results = await self.pool.fanout(
            lambda t: self._scan(t.name, wait_for=by_node.get(t.name, ()), max_wait=max_wait), names,
            timeout=60 + max_wait)
        notes: dict[str, str] = {}
        for node, res in results.items():
            if isinstance(res, BaseException):
                notes[node] = _read_note(res)
                continue
            _home, now, remote = res
            for rj in remote:
                await self._merge(node, rj, now)
        out = []
        for rec in self.records():
            if rec.node in notes and not rec.terminal:
                rec = replace(rec, note=notes[rec.node])
            out.append(rec)
        return out

    async def refresh_job(self, job_id: str, *, max_wait: float = 0.0) -> JobRecord:
        """Re-read one job's directory on its node (waiting up to ``max_wait`` s for it to end)."""
        rec = self.get(job_id)
        try:
            _home, now, remote = await self._scan(rec.node, rec.id, tail=6, wait_for=[rec.id], max_wait=max_wait)
        except LoadmasterError as exc:
            return replace(rec, note=_read_note(exc))
        if not remote:
            if rec.state in ACTIVE and time.time() - rec.created > self.settings.lost_after:
                self._update(rec.id, state="lost", error="the job directory is gone from the node",
                             finished=time.time())
            return self.get(rec.id)
        return await self._merge(rec.node, remote[0], now)

    async def _merge(self, node: str, rj: _RemoteJob, now: float) -> JobRecord:
        spec = rj.spec
        rows = self.db.query("SELECT * FROM jobs WHERE id = ?", (rj.id,))
        if not rows:
            # Launched by another console (or the CLI on another machine): adopt it.
            self.db.execute(
                "INSERT OR IGNORE INTO jobs (id, node, kind, label, params, state, created, launched_by,"
                " launched_from, job_dir, updated) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?)",
                (rj.id, node, spec.get("kind", "?"), spec.get("label", ""), json.dumps(spec.get("params", {})),
                 float(spec.get("created", now)), spec.get("launched_by", "?"), spec.get("launched_from", "?"),
                 f"{self._homes.get(node, '')}/{rj.id}", time.time()),
            )
            self._event(rj.id, "adopt", f"found on {node}")
        prog = progress_from_lines(rj.progress)
        if prog is not None:
            dq = self._samples.setdefault(rj.id, deque(maxlen=600))
            for line in rj.progress:
                t = float(line.get("t", 0))
                if not dq or t > dq[-1][0]:
                    dq.append((t, int(line.get("bytes_done", 0))))
        cols: dict[str, Any] = {}
        pid = (rj.pidinfo or {}).get("pid")
        if pid:
            cols["pid"] = int(pid)
            cols["started"] = float((rj.pidinfo or {}).get("started") or now)
        beat_age = None if rj.beat is None else max(0.0, now - rj.beat)
        if rj.result is not None:
            res = rj.result
            state = str(res.get("state", "failed"))
            cols.update(state=state if state in TERMINAL else "failed", error=res.get("error"),
                        finished=res.get("finished"), result=res.get("details") or {})
            if res.get("progress"):
                prog = progress_from_lines([res["progress"]])
        elif rj.alive:
            cols["state"] = "cancelling" if rj.cancel_requested else "running"
        else:
            since = rj.beat if rj.beat is not None else float(spec.get("created", now))
            if now - since > self.settings.lost_after:
                await self._mark_lost(node, rj, now - since)
                cols.update(state="lost", finished=time.time(),
                            error=self._lost_message(rj, now - since))
        if prog is not None:
            cols["progress"] = {k: v for k, v in prog.__dict__.items()}
        before = rows[0]["state"] if rows else "running"
        self._update(rj.id, **cols)
        rec = self.get(rj.id)
        if rec.state == "succeeded" and before != "succeeded":
            self._on_succeeded(rec)
        return replace(rec, heartbeat_age=beat_age)

    def _on_succeeded(self, rec: JobRecord) -> None:
        if rec.kind == "pull":
            from backend.jobs.pull import egress_record_success

            try:
                egress_record_success(self.config, self.db, rec)
            except LoadmasterError as exc:
                self._event(rec.id, "egress-ledger-failed", str(exc))

    @staticmethod
    def _lost_message(rj: _RemoteJob, age: float) -> str:
        pid = (rj.pidinfo or {}).get("pid")
        if not pid:
            return (f"the runner never started ({age:.0f}s since launch, no result); is loadmaster installed "
                    "on the node (config 'agent')? see 'loadmaster job logs ID'")
        return f"runner pid {pid} is gone and its heartbeat is {age:.0f}s old, with no result (killed, or the " \
               "node rebooted)"

    async def _mark_lost(self, node: str, rj: _RemoteJob, age: float) -> None:
        """Write the lost result on the node, kill leftovers of its process group (only once that
        group is proven to be the job's), and run the kind's cleanup with what it needs."""
        t = self.pool.transport(node)
        job_dir = f"{self._homes.get(node, '')}/{rj.id}"
        result = {"id": rj.id, "kind": rj.spec.get("kind"), "state": "lost", "error": self._lost_message(rj, age),
                  "finished": time.time()}
        if rj.progress:
            result["progress"] = rj.progress[-1]
        # Leftover children (s5cmd) share the dead runner's process group. The group is signalled
        # only when it is proven to be this job's: after a reboot or pid reuse, a group with the
        # same number belongs to someone else and is left alone.
        kill = ""
        if (rj.pidinfo or {}).get("pgid"):
            kill = (f"{prove_vars(rj.id, rj.pidinfo)}{PROVE_SCRIPT}\n"
                    "if lm_ours; then kill -KILL -$G 2>/dev/null; echo '@@SIGNALLED'; else echo '@@LEFT'; fi\n")
        try:
            await t.write_file(f"{job_dir}/{RESULT_FILE}", json.dumps(result), mode=0o644)
            res = await self._run_cleanup(node, rj.id, job_dir, str(rj.spec.get("kind", "")),
                                          rj.spec.get("params") or {}, pre=kill)
            if "@@LEFT" in res.stdout:
                self._event(rj.id, "group-left-alone",
                            f"process group {(rj.pidinfo or {}).get('pgid')} is not proven to be this job's "
                            "(rebooted, or the id was reused): not signalled")
        except LoadmasterError:
            pass  # recorded locally as lost; the node is re-checked on the next refresh
        self._event(rj.id, "lost-cleanup", node)

    async def _cleanup_secrets(self, job_id: str, kind: str, params: dict[str, Any]) -> dict[str, str]:
        """The secrets the kind's cleanup needs, resolved again here as for the launch (the runner
        deleted its copy at start); empty when the kind needs none or they cannot be had."""
        from backend.agent.kinds import cleanup_secrets_for

        fn = cleanup_secrets_for(kind)
        if fn is None:
            return {}
        try:
            return dict(await fn(self.config, params))
        except Exception as exc:  # noqa: BLE001 - cleanup still runs; the log and the event say what it lacked
            msg = str(exc) if isinstance(exc, LoadmasterError) else f"{type(exc).__name__}: {exc}"
            self._event(job_id, "cleanup-without-credentials", msg)
            return {}

    async def _run_cleanup(self, node: str, job_id: str, job_dir: str, kind: str, params: dict[str, Any], *,
                           pre: str = "") -> Any:
        """Run ``agent cleanup`` for a job whose runner cannot (dead or killed), after ``pre``;
        credentials travel on stdin into a 0600 file the cleanup reads and deletes."""
        t = self.pool.transport(node)
        secrets = await self._cleanup_secrets(job_id, kind, params)
        fifo = shlex.quote(str(done_fifo(PurePosixPath(job_dir))))
        script = (f"{pre}rm -f \"$1/{SECRETS_FILE}\" {fifo}\n"
                  + CLEANUP_SCRIPT.replace("@AGENT@", self.agent_command(node)))
        return await t.run(f"sh -c {shlex.quote(script)} cleanup {shlex.quote(job_dir)}",
                           input=(json.dumps(secrets) if secrets else "") + "\n", timeout=300)

    # -- following -----------------------------------------------------------------------------

    async def wait(
        self,
        job_id: str,
        *,
        poll: float | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - documented overall limit
        on_update: Callable[[JobRecord], None] | None = None,
    ) -> JobRecord:
        """Poll the job until it is terminal (or ``timeout`` passes); returns the last record."""
        poll = poll if poll is not None else self.settings.poll_interval
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            rec = await self.refresh_job(job_id, max_wait=poll)
            if on_update is not None:
                on_update(rec)
            if rec.terminal:
                return rec
            if deadline is not None and time.monotonic() >= deadline:
                return rec
            if rec.note:
                await asyncio.sleep(poll)  # node unreachable: the scan returned at once

    async def progress_history(self, job_id: str, *, lines: int = 300) -> list[JobProgress]:
        """The job's last ``lines`` progress points from its node (for throughput plots)."""
        rec = self.get(job_id)
        t = self.pool.transport(rec.node)
        res = await t.run(f"tail -n {int(lines)} {shlex.quote(f'{rec.job_dir}/{PROGRESS_FILE}')} 2>/dev/null",
                          timeout=30)
        pts: list[dict[str, Any]] = []
        for line in res.stdout.splitlines():
            try:
                pts.append(json.loads(line))
            except ValueError:
                continue
        out = []
        for i, _p in enumerate(pts):
            out.append(progress_from_lines(pts[max(0, i - 4):i + 1]))
        return [p for p in out if p is not None]

    async def read_log(self, job_id: str, *, offset: int = 0, tail_lines: int | None = None) -> tuple[str, int]:
        """The job log from byte ``offset`` (or its last lines); returns (text, next offset)."""
        rec = self.get(job_id)
        t = self.pool.transport(rec.node)
        path = shlex.quote(f"{rec.job_dir}/{LOG_FILE}")
        if tail_lines is not None:
            res = await t.run(f"wc -c < {path} 2>/dev/null; tail -n {int(tail_lines)} {path} 2>/dev/null",
                              timeout=30)
            size, _, text = res.stdout.partition("\n")
            return text, int(size.strip() or 0)
        res = await t.run(f"tail -c +{offset + 1} {path} 2>/dev/null", timeout=30)
        text = res.stdout
        return text, offset + len(text.encode())

    async def follow_log(self, job_id: str, *, poll: float | None = None) -> AsyncIterator[str]:
        """Yield the log as it grows until the job ends (re-reading from the last offset)."""
        poll = poll if poll is not None else self.settings.poll_interval
        offset = 0
        while True:
            text, offset = await self.read_log(job_id, offset=offset)
            if text:
                yield text
            rec = await self.refresh_job(job_id)
            if rec.terminal:
                text, offset = await self.read_log(job_id, offset=offset)
                if text:
                    yield text
                return
            await asyncio.sleep(poll)

    # -- cancelling ----------------------------------------------------------------------------

    async def cancel(self, job_id: str, *, reason: str | None = None) -> JobRecord:
        """Stop the job's process group (SIGTERM, then SIGKILL after the grace period) and record it.

        The group is signalled only once it is proven to be the job's (:data:`PROVE_SCRIPT`);
        otherwise only the cancel file is written, which a live runner also obeys.
        """
        rec = await self.refresh_job(job_id)
        if rec.note:
            raise JobError(f"cannot cancel {rec.id}: {rec.note}")
        if rec.terminal:
            raise JobError(f"job {rec.id} already ended ({rec.state}); nothing to cancel")
        t = self.pool.transport(rec.node)
        rows = self.db.query("SELECT pid FROM jobs WHERE id = ?", (rec.id,))
        _home, _now, remote = await self._scan(rec.node, rec.id, tail=1)
        pidinfo = remote[0].pidinfo if remote else None
        d = shlex.quote(rec.job_dir or "")
        steps = max(1, int(self.settings.cancel_grace / 0.2))
        self._update(rec.id, state="cancelling")
        script = (
            f"touch {d}/{CANCEL_FILE}; {prove_vars(rec.id, pidinfo, rows[0]['pid'])}{PROVE_SCRIPT}\n"
            "lm_ours || { echo NOTOURS; exit 0; }\n"
            "kill -TERM -$G 2>/dev/null; n=0\n"
            f"while [ $n -lt {steps} ] && kill -0 -$G 2>/dev/null; do sleep 0.2; n=$((n+1)); done\n"
            "if kill -0 -$G 2>/dev/null && lm_ours; then kill -KILL -$G; echo KILLED; fi\n"
        )
        res = await t.run(script, timeout=self.settings.cancel_grace + 60)
        killed = "KILLED" in res.stdout
        if "NOTOURS" in res.stdout:
            self._event(rec.id, "group-left-alone", "process group not proven to be this job's: only the "
                                                    "cancel file was written")
        _home, now, remote = await self._scan(rec.node, rec.id, tail=6)
        if remote and remote[0].result is None and not remote[0].alive:
            # Gone (killed) before it could write its own result: record "cancelled" and clean up
            # for it. A runner still alive (its group not proven ours) obeys the cancel file.
            result = {"id": rec.id, "kind": rec.kind, "state": "cancelled", "finished": time.time(),
                      "error": "cancelled by request (killed after the grace period)" if killed
                      else "cancelled by request"}
            await t.write_file(f"{rec.job_dir}/{RESULT_FILE}", json.dumps(result), mode=0o644)
            await self._run_cleanup(rec.node, rec.id, rec.job_dir or "", rec.kind, rec.params)
        final = await self.refresh_job(rec.id)
        self.db.record_audit("job.cancel", f"{rec.node}:{rec.id}", final.state,
                             detail={"kind": rec.kind, "killed": killed, "label": rec.label,
                                     "group_proven": "NOTOURS" not in res.stdout}, reason=reason)
        return final


def default_manager_for_tests(config: Config, db_path: str | os.PathLike[str]) -> JobManager:
    """A JobManager over a fresh pool and state DB (tests and benchmarks)."""
    from backend.nodes.pool import NodePool

    return JobManager(NodePool(config.nodes), StateDB(Path(db_path)), config)
