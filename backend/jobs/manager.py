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
import contextlib
import json
import logging
import shlex
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any

from backend.agent.context import (
    CANCEL_FILE,
    LOG_FILE,
    PROGRESS_FILE,
    RESULT_FILE,
    SECRETS_FILE,
    done_fifo,
)
from backend.agent.kinds import check_known
from backend.agent.kinds import kind as job_kind
from backend.config import Config
from backend.errors import CommandFailed, JobError, LoadmasterError, NodeError, NodeUnreachable
from backend.jobs.records import (
    FOREIGN,
    NODE_UNREADABLE,
    QUARANTINED,
    TERMINAL,
    JobProgress,
    JobRecord,
    LaunchCancel,
    new_job_id,
    progress_from_lines,
    states_text,
)
from backend.jobs.remote import (
    CLEANUP_SCRIPT,
    JOB_ID_RE,
    LAUNCH_SCRIPT,
    LIVE_SCRIPT,
    PROVE_SCRIPT,
    SCAN_SCRIPT,
    RemoteJob,
    ScanResult,
    parse_scan_checked,
    prove_vars,
    spec_digest,
)
from backend.jobs.settings import JobSettings
from backend.jobs.store import JobStore
from backend.nodes.agent import agent_command as node_agent_command
from backend.nodes.transport import Transport
from backend.state import Row, StateDB, StateError, StateUnavailable, actor

if TYPE_CHECKING:
    from backend.nodes.pool import NodePool

log = logging.getLogger(__name__)


def _read_note(exc: BaseException) -> str:
    if isinstance(exc, NodeUnreachable):
        return f"node unreachable: {exc}"
    return f"cannot read the job's directory: {exc}" if isinstance(exc, LoadmasterError) else repr(exc)


class JobManager:
    """Launch, list, follow, cancel and re-attach to jobs on every node."""

    def __init__(
        self, pool: NodePool, db: StateDB, config: Config, *, readonly: bool | Callable[[], bool] = False
    ) -> None:
        self.pool = pool
        self.db = db
        self.config = config
        self.settings: JobSettings = config.section(JobSettings)
        self._homes: dict[str, str] = {}
        self._samples: dict[str, deque[tuple[float, int]]] = {}
        self.store = JobStore(db)
        self._readonly = readonly
        #: One line per job record the last refresh skipped (node and job named), for the front end.
        self.problems: list[str] = []
        #: Why the last refresh could not use the state database (None: it could): said once by
        #: the front ends, never once per node (the nodes were read fine).
        self.state_down: str | None = None
        #: job id -> the launch it is one of, for jobs about to be launched (:meth:`expect_launch`).
        self._launch_of: dict[str, str] = {}

    @property
    def readonly(self) -> bool:
        """Read-only: refreshes show what nodes say but write nothing, on the nodes or the database."""
        return bool(self._readonly() if callable(self._readonly) else self._readonly)

    # -- launching -----------------------------------------------------------------------------

    def agent_command(self, node: str) -> str:
        """The shell words that start the agent on ``node``, before ``agent run|cleanup JOBDIR``: its
        own venv's python run isolated, unless config ``agent`` says otherwise (backend.nodes.agent)."""
        return node_agent_command(self.config.node(node))

    def expect_launch(self, launch_id: str, job_ids: Iterable[str]) -> None:
        """The jobs ``job_ids`` about to be started (by whatever starts them) are one launch."""
        for job_id in job_ids:
            self._launch_of[job_id] = launch_id

    async def launch(
        self,
        node: str,
        kind: str,
        params: dict[str, Any],
        *,
        secrets: dict[str, str] | None = None,
        label: str = "",
        job_id: str | None = None,
        launch_id: str | None = None,
    ) -> JobRecord:
        """Start a ``kind`` job on ``node`` detached from this console; returns its record.

        ``job_id`` is given when something was recorded under it before the start (the pull's
        egress reservation); by default a new one is made. ``launch_id`` (or one given to
        :meth:`expect_launch` for this job id) records the launch it is one of.
        """
        check_known(kind)
        self.config.node(node)
        try:
            json.dumps(params)
        except TypeError as exc:
            raise JobError(f"job parameters must be JSON values: {exc}") from None
        t: Transport = self.pool.transport(node)
        job_id = job_id or new_job_id()
        launch_id = launch_id or self._launch_of.pop(job_id, None)
        known = self._homes.get(node)
        job_dir = f"{known}/{job_id}" if known else None
        now = time.time()
        spec = {
            "id": job_id,
            "kind": kind,
            "node": node,
            "label": label,
            "params": params,
            "created": now,
            "launched_by": actor(),
            "launched_from": socket.gethostname(),
            # The database this job counts in: a console of another one adopts it for display
            # but never puts its bytes in its own ledger.
            "state_id": self.db.state_id,
            **({"launch": launch_id} if launch_id else {}),
        }
        spec_text = json.dumps(spec)
        self.store.insert(spec, job_dir, digest=spec_digest(spec_text), store=_store_name(params))
        self.store.event(job_id, "launch", f"{kind} on {node}")
        # One round trip: create the job directory, write the secrets (0600, first line of stdin)
        # and the spec (the rest), start the agent detached. Secrets never reach an argv: the
        # shell's read/printf are builtins.
        inner = f'exec {self.agent_command(node)} agent run "$D"'
        script = LAUNCH_SCRIPT.replace("@INNER@", shlex.quote(inner))
        payload = (json.dumps(secrets) if secrets else "") + "\n" + spec_text
        try:
            res = await t.run(f"sh -c {shlex.quote(script)} launch {shlex.quote(job_id)}", input=payload, timeout=60)
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
                raise CommandFailed(
                    node, f"start the {kind} job", res.exit_status, res.stderr.strip() or "no pid printed"
                )
            pid = int(pid_text or 0)
        except BaseException as exc:
            msg = str(exc) if isinstance(exc, LoadmasterError) else f"{type(exc).__name__}: {exc}"
            self.store.update(
                job_id,
                state="failed",
                error=f"could not start: {msg}",
                finished=time.time(),
                **({"job_dir": job_dir} if job_dir else {}),
            )
            if secrets:
                q = (
                    shlex.quote(f"{job_dir}/{SECRETS_FILE}")
                    if job_dir
                    else f'"${{LOADMASTER_HOME:-$HOME/.loadmaster}}/jobs/"{shlex.quote(job_id)}/{SECRETS_FILE}'
                )
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
        self.store.update(job_id, state="running", pid=pid, started=time.time(), job_dir=job_dir)
        return self.get(job_id)

    # -- local records -------------------------------------------------------------------------

    def resolve_id(self, job_id: str) -> str:
        """The full id of a job given its id or a unique prefix of it."""
        return self.store.resolve_id(job_id)

    def get(self, job_id: str) -> JobRecord:
        """The job's last known record from the local state (no remote read)."""
        return self.store.get(job_id)

    def records(self, *, limit: int = 500) -> list[JobRecord]:
        """Every recorded job, newest first (no remote read)."""
        return self.store.records(limit=limit)

    def samples(self, job_id: str) -> list[tuple[float, int]]:
        """(time, bytes done) points seen for a job while this console watched it (for plots)."""
        return list(self._samples.get(job_id, ()))

    # -- re-attaching --------------------------------------------------------------------------

    async def _scan(
        self, node: str, pattern: str = "*", tail: int = 6, *, wait_for: Iterable[str] = (), max_wait: float = 0.0
    ) -> ScanResult:
        t = self.pool.transport(node)
        ids = " ".join(shlex.quote(i) for i in wait_for)
        tenths = int(max_wait * 10) if ids else 0
        res = await t.run(
            f"sh -c {shlex.quote(SCAN_SCRIPT)} scan {shlex.quote(pattern)} {int(tail)} {tenths} {ids}",
            timeout=60 + max_wait,
        )
        if not res.ok:
            raise JobError(f"{node}: cannot read job directories: {res.stderr.strip() or res.exit_status}")
        scan = parse_scan_checked(res.stdout)
        if scan.home:
            self._homes.setdefault(node, scan.home)
        return scan

    async def refresh(
        self, nodes: Iterable[str] | None = None, *, wait_for: Iterable[str] = (), max_wait: float = 0.0
    ) -> list[JobRecord]:
        """Re-read every job directory on ``nodes`` (all by default) and return all records.

        A job folder is acted on (recorded, settled, cleaned up) only when it matches a job this
        state database launched (same id, node, kind and spec digest); any other is listed as
        ``foreign`` with the reason and never acted on. One unreadable record is skipped with a
        line in :attr:`problems` naming its node and job; the others are read as usual. With
        ``wait_for`` job ids, each node first waits up to ``max_wait`` seconds for those of its
        jobs to finish, so a follower learns of the end promptly with few round trips.
        """
        names = list(nodes) if nodes is not None else [n.name for n in self.config.nodes]
        by_node = self.store.nodes_of(set(wait_for))
        results = await self.pool.fanout(
            lambda t: self._scan(t.name, wait_for=by_node.get(t.name, ()), max_wait=max_wait),
            names,
            timeout=60 + max_wait,
        )
        notes: dict[str, str] = {}
        problems: list[str] = []
        views: dict[str, JobRecord] = {}
        foreign: list[JobRecord] = []
        try:
            for node, res in results.items():
                if isinstance(res, BaseException):
                    notes[node] = _read_note(res)
                    continue
                problems.extend(self._problem(f"{node}: {line}") for line in res.skipped)
                now = res.now or time.time()
                seen: set[str] = set()
                known = self.store.authorities([rj.id for rj in res.jobs])  # one query per node
                for rj in res.jobs:
                    seen.add(rj.id)
                    try:
                        rec = await self._consider(node, rj, now, known=known)
                    except (StateUnavailable, asyncio.CancelledError):
                        raise
                    except Exception as exc:  # noqa: BLE001 - one bad record never stops the others
                        problems.append(self._problem(f"{node}: job {_text(rj.id)}: skipped: {_why(exc)}"))
                        continue
                    if rec.foreign is not None:
                        foreign.append(rec)
                        if rj.problem:
                            problems.append(self._problem(f"{node}: job {_text(rj.id)}: skipped: {rj.problem}"))
                    else:
                        views[rec.id] = rec
                        if rj.problem:
                            problems.append(self._problem(f"{node}: job {_text(rj.id)}: skipped: {rj.problem}"))
                views.update(await self._vanished(node, seen))
            if not self.readonly:
                for rec in self.store.end_pending():
                    self._on_ended(rec)
                self._release_unseen()
        except StateUnavailable as exc:
            # Monitoring goes on without the state database: what the nodes say, not recorded
            # (the next refresh with the database back records it, ends included).
            self.problems = problems
            self.state_down = str(exc)
            shown = [
                self._unrecorded(node, rj, res.now or time.time(), str(exc))
                for node, res in results.items()
                if not isinstance(res, BaseException)
                for rj in res.jobs
                if rj.problem is None
            ]
            # Newest first, as the records are: node by node, `jobs` (its newest 50) showed the
            # first nodes' oldest jobs and cut the running ones off.
            return sorted(shown, key=lambda r: (r.created, r.id), reverse=True)
        self.problems = problems
        self.state_down = None
        out = []
        for rec in self.records():
            rec = views.get(rec.id, rec)
            if rec.node in notes and not rec.terminal:
                rec = replace(rec, note=notes[rec.node])
            out.append(rec)
        # A foreign folder may reuse a team job's id (or another node's): listed under
        # ID@NODE, so a view keyed by id never confuses the two.
        ids = {r.id for r in out}
        for rec in sorted(foreign, key=lambda r: r.id, reverse=True):  # newest first, as the records
            if rec.id in ids:
                rec = replace(rec, id=f"{rec.id}@{rec.node}")
            if rec.id not in ids:
                ids.add(rec.id)
                out.append(rec)
        return out

    @staticmethod
    def _problem(line: str) -> str:
        log.warning("%s", line)
        return line

    async def refresh_job(self, job_id: str, *, max_wait: float = 0.0) -> JobRecord:
        """Re-read one job's directory on its node (waiting up to ``max_wait`` s for it to end)."""
        rec = self.get(job_id)
        try:
            scan = await self._scan(rec.node, rec.id, tail=6, wait_for=[rec.id], max_wait=max_wait)
        except LoadmasterError as exc:
            return replace(rec, note=_read_note(exc))
        mine = [rj for rj in scan.jobs if rj.id == rec.id]
        if not mine:
            return (await self._vanished(rec.node, set(), only=rec.id)).get(rec.id) or self.get(rec.id)
        seen = await self._consider(rec.node, mine[0], scan.now or time.time())
        if seen.foreign is not None:
            return replace(rec, note=f"the node's copy of this job is not the one launched: {seen.foreign}")
        return seen

    def _verdict(self, node: str, rj: RemoteJob, known: dict[str, Row] | None = None) -> tuple[Row | None, str | None]:
        """(the job's row, None) when the folder is one this database launched; else (None, why not)."""
        row = known.get(rj.id) if known is not None else self.store.authority(rj.id)
        if row is None:
            return None, "no job with this id was launched through this state database"
        if row["adopted"]:
            return None, "adopted from a node by an older loadmaster, never launched through this database"
        if row["node"] != node:
            return None, f"launched on {row['node']}, found on {node}"
        kind = rj.spec.get("kind")
        if row["kind"] != kind:
            return None, f"launched as a {row['kind']} job, the node says {_text(str(kind))!r}"
        # Rows recorded before digests existed (an older loadmaster launched them) match by id,
        # node and kind alone.
        if row["spec_digest"] is not None and row["spec_digest"] != rj.spec_digest:
            return None, "its spec is not the one launched (the digest differs)"
        return row, None

    async def _consider(
        self, node: str, rj: RemoteJob, now: float, *, known: dict[str, Row] | None = None
    ) -> JobRecord:
        """The job folder ``rj`` on ``node`` as a record: merged into its row when it is this
        team's, else shown as foreign (nothing written, nothing done)."""
        row, why = self._verdict(node, rj, known)
        if row is None:
            return self._foreign(node, rj, now, rj.problem or why or "")
        if rj.problem is not None or row["quarantined"]:
            # This team's job, but what the node says of it cannot be used: shown as recorded.
            note = (
                f"{NODE_UNREADABLE} ({rj.problem}); shown as last recorded"
                if rj.problem
                else f"{QUARANTINED}: {row['quarantined']}"
            )
            return replace(self.get(rj.id), note=note)
        return await self._merge(node, rj, now)

    async def _merge(self, node: str, rj: RemoteJob, now: float) -> JobRecord:
        """Fold a (checked) job folder of this team's into its row; read-only: into the view only."""
        before = self.store.state_of(rj.id)
        rec0 = self.get(rj.id)
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
        lost = False
        if rj.result is not None:
            res = rj.result
            cols.update(
                state=str(res["state"]),
                error=None if res.get("error") is None else str(res["error"]),
                finished=None if res.get("finished") is None else float(res["finished"]),
                result=res.get("details") or {},
            )
            if res.get("progress"):
                prog = progress_from_lines([res["progress"]])
        elif rj.alive:
            cols["state"] = "cancelling" if rj.cancel_requested else "running"
        else:
            # The start of the record's clock is this database's launch time, never the node's.
            since = rj.beat if rj.beat is not None else rec0.created
            if now - since > self.settings.lost_after:
                lost = True
                cols.update(state="lost", finished=time.time(), error=self._lost_message(rj, now - since))
        if prog is not None:
            cols["progress"] = {k: v for k, v in prog.__dict__.items()}
        if self.readonly:
            # Shown as the node says (a lost job as lost), never handled: nothing is killed,
            # written on the node, cleaned up, recorded or settled.
            view = {k: v for k, v in cols.items() if k != "progress"}
            if "result" in view and not isinstance(view["result"], dict):
                view.pop("result")
            return replace(rec0, **view, progress=prog if prog is not None else rec0.progress, heartbeat_age=beat_age)
        if lost:
            await self._mark_lost(node, rj, rec0, now - (rj.beat if rj.beat is not None else rec0.created))
        self.store.update(rj.id, **cols)
        rec = self.get(rj.id)
        if rec.terminal and before not in TERMINAL:
            self._on_ended(rec)
        return replace(rec, heartbeat_age=beat_age)

    async def _vanished(self, node: str, seen: set[str], *, only: str | None = None) -> dict[str, JobRecord]:
        """This team's jobs on ``node`` that the record calls starting or running but whose folder
        is gone from a node that answered: ``lost`` (or, never started, ``failed``) once they are
        older than ``lost_after``; the kind's end runs (a pull's reservation is released)."""
        out: dict[str, JobRecord] = {}
        for row in self.store.active_on(node):
            jid = str(row["id"])
            if jid in seen or (only is not None and jid != only):
                continue
            if time.time() - float(row["created"] or 0) <= self.settings.lost_after:
                continue
            never = row["state"] == "starting" and row["pid"] is None
            cols: dict[str, Any] = {
                "state": "failed" if never else "lost",
                "error": "never started on the node (the launch was interrupted)"
                if never
                else "the job directory is gone from the node",
                "finished": time.time(),
            }
            if self.readonly:
                out[jid] = replace(self.get(jid), **cols)
                continue
            self.store.update(jid, **cols)
            rec = self.get(jid)
            self._on_ended(rec)
            out[jid] = rec
        return out

    def _release_unseen(self) -> None:
        """Reservations whose job never appeared (the launch died between the reservation and
        the job's record: SIGKILL, a crash) stop counting after ``[jobs] reservation_grace``."""
        from backend.ledger import EgressLedger

        ledger = EgressLedger(self.db)
        for job_id in ledger.orphan_reservations(time.time() - self.settings.reservation_grace):
            ledger.release(
                job_id, f"the job never appeared within {self.settings.reservation_grace:.0f}s of its reservation"
            )
            log.info("released the reservation of job %s: it never appeared", job_id)

    def _foreign(self, node: str, rj: RemoteJob, now: float, why: str) -> JobRecord:
        """A job folder this database did not launch, for display only: its kind and label as
        the node says them (cleaned), nothing else of it (who launched it is unknown)."""
        spec = rj.spec
        created = spec.get("created")
        label = spec.get("label")
        raw = spec.get("params")
        params: dict[str, Any] = raw if isinstance(raw, dict) and rj.problem is None else {}
        # What it says it copies, as text for the views (never used for anything else).
        shown = {k: _text(v, 300) if isinstance(v := params.get(k), str) else "" for k in ("src", "dest")}
        return JobRecord(
            id=_text(rj.id),
            node=node,
            kind=_text(str(spec.get("kind", "?")), 32),
            state=FOREIGN,
            created=float(created) if isinstance(created, int | float) and rj.problem is None else now,
            launched_by="?",
            launched_from="?",
            label=_text(label, 200) if isinstance(label, str) else "",
            params=shown,
            note=f"foreign: {why}",
            recorded=False,
            foreign=why,
        )

    @staticmethod
    def _unrecorded(node: str, rj: RemoteJob, now: float, why: str) -> JobRecord:
        """A job as its directory on ``node`` shows it, for display while the state database is
        down (nothing is written or acted on; who launched it is not the node's to say)."""
        spec = rj.spec
        res = rj.result or {}
        if rj.result is not None:
            state = str(res.get("state", "failed"))
            state = state if state in TERMINAL else "failed"
        else:
            state = ("cancelling" if rj.cancel_requested else "running") if rj.alive else "unknown"
        lines = [res["progress"]] if res.get("progress") else rj.progress
        return JobRecord(
            id=rj.id,
            node=node,
            kind=_text(str(spec.get("kind", "?")), 32),
            state=state,
            created=float(spec.get("created", now)),
            launched_by="?",
            launched_from="?",
            label=_text(str(spec.get("label", "")), 200),
            params=params if isinstance(params := spec.get("params"), dict) else {},
            error=res.get("error"),
            finished=res.get("finished"),
            result=res.get("details") or None,
            progress=progress_from_lines(lines),
            heartbeat_age=None if rj.beat is None else max(0.0, now - rj.beat),
            note=f"not recorded: {why}",
            recorded=False,
            launch=launch if isinstance(launch := spec.get("launch"), str) and JOB_ID_RE.fullmatch(launch) else None,
        )

    def _on_ended(self, rec: JobRecord) -> None:
        """The kind's console-side end hook (a pull settles its egress reservation). Recorded as
        done only when it returns; the state database failing is tried again on the next refresh,
        by this console or another; anything else (a value the ledger refuses) quarantines the
        row with the reason, so it is not retried forever."""
        if self.readonly:
            return
        if rec.quarantined:  # its stored values cannot be read: never settled from them
            with contextlib.suppress(StateError):
                self.store.quarantine(rec.id, rec.quarantined)
            return
        try:
            job_kind(rec.kind).on_ended(self.config, self.db, rec)
            self.store.end_recorded(rec.id)
        except StateError as exc:
            log.warning("%s: recording the end of job %s failed: %s", rec.node, rec.id, exc)
            with contextlib.suppress(LoadmasterError):
                self.store.event(rec.id, "end-record-failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - one row must never stop every refresh
            why = f"its end cannot be recorded: {_why(exc)}"
            log.warning("%s: job %s quarantined: %s", rec.node, rec.id, why)
            with contextlib.suppress(StateError):
                self.store.quarantine(rec.id, why)

    @staticmethod
    def _lost_message(rj: RemoteJob, age: float) -> str:
        pid = (rj.pidinfo or {}).get("pid")
        if not pid:
            return (
                f"the runner never started ({age:.0f}s since launch, no result); is loadmaster installed "
                "on the node (config 'agent')? see 'loadmaster job logs ID'"
            )
        return (
            f"runner pid {pid} is gone and its heartbeat is {age:.0f}s old, with no result (killed, or the "
            "node rebooted)"
        )

    async def _mark_lost(self, node: str, rj: RemoteJob, rec: JobRecord, age: float) -> None:
        """Write the lost result on the node, kill leftovers of its process group (only once that
        group is proven to be the job's), and run the kind's cleanup with what it needs. Only for
        a job this database launched (``rec``, its row): kind and params come from the row."""
        t = self.pool.transport(node)
        job_dir = f"{self._homes.get(node, '')}/{rj.id}"
        result = {
            "id": rj.id,
            "kind": rec.kind,
            "state": "lost",
            "error": self._lost_message(rj, age),
            "finished": time.time(),
        }
        if rj.progress:
            result["progress"] = rj.progress[-1]
        # Leftover children (s5cmd) share the dead runner's process group. The group is signalled
        # only when it is proven to be this job's: after a reboot or pid reuse, a group with the
        # same number belongs to someone else and is left alone.
        kill = ""
        if (rj.pidinfo or {}).get("pgid"):
            kill = (
                f"{prove_vars(rj.id, rj.pidinfo)}{PROVE_SCRIPT}\n"
                "if lm_ours; then kill -KILL -$G 2>/dev/null; echo '@@SIGNALLED'; else echo '@@LEFT'; fi\n"
            )
        try:
            await t.write_file(f"{job_dir}/{RESULT_FILE}", json.dumps(result), mode=0o644)
            res = await self._run_cleanup(node, rj.id, job_dir, rec.kind, rec.params, pre=kill)
            if "@@LEFT" in res.stdout:
                self.store.event(
                    rj.id,
                    "group-left-alone",
                    f"process group {(rj.pidinfo or {}).get('pgid')} is not proven to be this job's "
                    "(rebooted, or the id was reused): not signalled",
                )
        except LoadmasterError:
            pass  # recorded locally as lost; the node is re-checked on the next refresh
        self.store.event(rj.id, "lost-cleanup", node)

    async def _cleanup_secrets(self, job_id: str, kind: str, params: dict[str, Any]) -> dict[str, str]:
        """The secrets the kind's cleanup needs, resolved again here as for the launch (the runner
        deleted its copy at start); empty when the kind needs none or they cannot be had. Only
        for the node and store recorded at the job's launch."""
        row = self.store.authority(job_id)
        if row is None or row["adopted"] or row["kind"] != kind or row["store"] != _store_name(params):
            self.store.event(job_id, "cleanup-without-credentials", "not the store recorded at the job's launch")
            return {}
        try:
            return await job_kind(kind).cleanup_secrets(self.config, params)
        except Exception as exc:  # noqa: BLE001 - cleanup still runs; the log and the event say what it lacked
            msg = str(exc) if isinstance(exc, LoadmasterError) else f"{type(exc).__name__}: {exc}"
            self.store.event(job_id, "cleanup-without-credentials", msg)
            return {}

    async def _run_cleanup(
        self, node: str, job_id: str, job_dir: str, kind: str, params: dict[str, Any], *, pre: str = ""
    ) -> Any:
        """Run ``agent cleanup`` for a job whose runner cannot (dead or killed), after ``pre``;
        credentials travel on stdin into a 0600 file the cleanup reads and deletes."""
        t = self.pool.transport(node)
        secrets = await self._cleanup_secrets(job_id, kind, params) if self._on_its_node(job_id, node) else {}
        fifo = shlex.quote(str(done_fifo(PurePosixPath(job_dir))))
        script = f'{pre}rm -f "$1/{SECRETS_FILE}" {fifo}\n' + CLEANUP_SCRIPT.replace(
            "@AGENT@", self.agent_command(node)
        )
        return await t.run(
            f"sh -c {shlex.quote(script)} cleanup {shlex.quote(job_dir)}",
            input=(json.dumps(secrets) if secrets else "") + "\n",
            timeout=300,
        )

    def _own(self, node: str, jobs: list[RemoteJob], job_id: str) -> list[RemoteJob]:
        """The folder of ``job_id`` among ``jobs`` when it is the one launched and readable, else []."""
        return [rj for rj in jobs if rj.id == job_id and rj.problem is None and self._verdict(node, rj)[0] is not None]

    def _on_its_node(self, job_id: str, node: str) -> bool:
        row = self.store.authority(job_id)
        return row is not None and row["node"] == node

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
        res = await t.run(
            f"tail -n {int(lines)} {shlex.quote(f'{rec.job_dir}/{PROGRESS_FILE}')} 2>/dev/null", timeout=30
        )
        pts: list[dict[str, Any]] = []
        for line in res.stdout.splitlines():
            try:
                pts.append(json.loads(line))
            except ValueError:
                continue
        out = []
        for i, _p in enumerate(pts):
            out.append(progress_from_lines(pts[max(0, i - 4) : i + 1]))
        return [p for p in out if p is not None]

    async def read_log(self, job_id: str, *, offset: int = 0, tail_lines: int | None = None) -> tuple[str, int]:
        """The job log from byte ``offset`` (or its last lines); returns (text, next offset)."""
        rec = self.get(job_id)
        t = self.pool.transport(rec.node)
        path = shlex.quote(f"{rec.job_dir}/{LOG_FILE}")
        if tail_lines is not None:
            res = await t.run(f"wc -c < {path} 2>/dev/null; tail -n {int(tail_lines)} {path} 2>/dev/null", timeout=30)
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

    def launch_ids(self, launch_id: str) -> list[str]:
        """The ids of the jobs of launch ``launch_id`` (exactly that id); [] when it is none."""
        return self.store.launch_ids(launch_id)

    async def launch_records(self, launch_id: str) -> list[JobRecord]:
        """Every job of the launch, each re-read on its node (all at once)."""
        ids = self.launch_ids(launch_id)
        if not ids:
            raise JobError(f"no launch {launch_id!r} (see 'loadmaster jobs')")
        return list(await asyncio.gather(*(self.refresh_job(i) for i in ids)))

    async def cancel_launch(self, launch_id: str) -> tuple[LaunchCancel, dict[str, Any]]:
        """Cancel every job of the launch that is still running, all at once, as :meth:`cancel`
        does one; the jobs that had already ended are left alone. Returns what became of each,
        and the detail of the launch's one ``job.cancel`` audit record (``backend.ops.jobs``
        writes it, and refuses the cancel in read-only mode)."""
        recs = await self.launch_records(launch_id)
        active = [r for r in recs if not r.terminal]
        if not active:
            raise JobError(f"launch {launch_id} already ended ({states_text(recs)}); nothing to cancel")
        got = await asyncio.gather(*(self.cancel(r.id) for r in active), return_exceptions=True)
        finals: list[JobRecord] = []
        errors: dict[str, str] = {}
        jobs: dict[str, str] = {}
        for rec, res in zip(active, got, strict=True):
            if isinstance(res, asyncio.CancelledError | KeyboardInterrupt):
                raise res
            if isinstance(res, BaseException):
                errors[rec.id] = _why(res)
                jobs[rec.id] = f"not cancelled: {errors[rec.id]}"
                continue
            finals.append(res[0])
            jobs[rec.id] = res[0].state
        ended = tuple(r for r in recs if r.terminal)
        detail = {
            "launch": launch_id,
            "jobs": jobs,
            "nodes": sorted({r.node for r in active}),
            "already_ended": {r.id: r.state for r in ended},
            "kind": active[0].kind,
            "label": active[0].label,
        }
        return LaunchCancel(launch_id, tuple(finals), errors, ended), detail

    async def cancel(self, job_id: str) -> tuple[JobRecord, dict[str, Any]]:
        """Stop the job's process group (SIGTERM, then SIGKILL after the grace period); its final
        record, and the detail of its ``job.cancel`` audit record (``backend.ops.jobs`` writes it,
        and refuses the cancel in read-only mode).

        The group is signalled only once it is proven to be the job's (:data:`PROVE_SCRIPT`);
        otherwise only the cancel file is written, which a live runner also obeys.
        """
        rec = await self.refresh_job(job_id)
        if rec.note:
            raise JobError(f"cannot cancel {rec.id}: {rec.note}")
        if rec.terminal:
            raise JobError(f"job {rec.id} already ended ({rec.state}); nothing to cancel")
        t = self.pool.transport(rec.node)
        remote = self._own(rec.node, (await self._scan(rec.node, rec.id, tail=1)).jobs, rec.id)
        pidinfo = remote[0].pidinfo if remote else None
        d = shlex.quote(rec.job_dir or "")
        steps = max(1, int(self.settings.cancel_grace / 0.2))
        self.store.update(rec.id, state="cancelling")
        script = (
            f"touch {d}/{CANCEL_FILE}; {prove_vars(rec.id, pidinfo, self.store.pid_of(rec.id))}{PROVE_SCRIPT}"
            f"{LIVE_SCRIPT}\n"
            "lm_ours || { echo NOTOURS; exit 0; }\n"
            "kill -TERM -$G 2>/dev/null; n=0\n"
            f"while [ $n -lt {steps} ] && lm_live; do sleep 0.2; n=$((n+1)); done\n"
            "if lm_live && lm_ours; then kill -KILL -$G; echo KILLED; fi\n"
        )
        res = await t.run(script, timeout=self.settings.cancel_grace + 60)
        killed = "KILLED" in res.stdout
        if "NOTOURS" in res.stdout:
            self.store.event(
                rec.id,
                "group-left-alone",
                "process group not proven to be this job's: only the cancel file was written",
            )
        remote = self._own(rec.node, (await self._scan(rec.node, rec.id, tail=6)).jobs, rec.id)
        if remote and remote[0].result is None and not remote[0].alive:
            # Gone (killed) before it could write its own result: record "cancelled" and clean up
            # for it. A runner still alive (its group not proven ours) obeys the cancel file.
            result = {
                "id": rec.id,
                "kind": rec.kind,
                "state": "cancelled",
                "finished": time.time(),
                "error": "cancelled by request (killed after the grace period)" if killed else "cancelled by request",
            }
            await t.write_file(f"{rec.job_dir}/{RESULT_FILE}", json.dumps(result), mode=0o644)
            await self._run_cleanup(rec.node, rec.id, rec.job_dir or "", rec.kind, rec.params)
        final = await self.refresh_job(rec.id)
        detail = {"kind": rec.kind, "killed": killed, "label": rec.label, "group_proven": "NOTOURS" not in res.stdout}
        return final, detail


def _store_name(params: dict[str, Any]) -> str | None:
    """The store a job's params name (a pull's ``store``, an upload's ``store.name``): the only
    store whose credentials its cleanup may be given."""
    st = params.get("store")
    if isinstance(st, dict):
        st = st.get("name") or st.get("url")
    return str(st) if st else None


def _text(value: Any, limit: int = 80) -> str:
    from backend.nodes.untrusted import clean_text

    return clean_text(str(value), limit)


def _why(exc: BaseException) -> str:
    return _text(str(exc) if isinstance(exc, LoadmasterError) else f"{type(exc).__name__}: {exc}", 300)
