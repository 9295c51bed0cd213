"""The shell scripts the console runs on a node for its jobs, and the parsing of what they print.

Each script is one ``sh -c`` round trip: :data:`SCAN_SCRIPT` lists job directories,
:data:`LAUNCH_SCRIPT` starts a job, :data:`PROVE_SCRIPT` proves a process group is a job's before
any signal, :data:`CLEANUP_SCRIPT` runs a kind's cleanup with its secrets on stdin. What a node
prints is untrusted: :func:`parse_scan` bounds, cleans and skips, never crashes.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

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


#: Defines ``lm_live``: true while process group $G has a member that still runs. A member that
#: has exited but is not reaped yet (a zombie) is gone: a job's runner is orphaned to the node's
#: init, which in a container may reap late or never, and ``kill -0`` counts a zombie as there
#: (a cancel then waited out its whole grace and reported the job killed).
LIVE_SCRIPT = r"""
lm_live() {
  for lm_p in /proc/[0-9]*; do
    read -r lm_s 2>/dev/null < "$lm_p/stat" || continue
    set -- ${lm_s##*) }
    [ "$3" = "$G" ] && [ "$1" != Z ] && [ "$1" != X ] && return 0
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
    return (
        f"G={pgid}; ST={shlex.quote(st_text)}; BOOT={shlex.quote(str(info.get('boot_id') or ''))}; "
        f"JID={shlex.quote(job_id)}; "
    )


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


#: What a node may say about a job, as types and ranges: anything outside them makes the whole
#: record unreadable (skipped with one line naming the node and the job, never half-used).
MAX_PID = 4_194_304  # Linux's PID_MAX_LIMIT
MAX_BYTES = 1 << 60  # 1 EiB: more than any store sends one job
MAX_ITEMS = 1 << 48
MAX_RATE_BPS = 1e13  # 80 Tb/s
MAX_NUMBER = float(1 << 63)  # any other number in a node's JSON (SQLite's INTEGER range)
TIME_MAX = 4_102_444_800.0  # 2100-01-01: a time past it is not a clock reading
MAX_TEXT = 64 * 1024
#: A job id loadmaster makes (new_job_id) or accepts from a node: one plain path segment.
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: The states a job's result may name.
RESULT_STATES = frozenset({"succeeded", "failed", "cancelled", "lost"})


class BadRecord(ValueError):
    """A job record from a node that fails its types or ranges: the message names the field."""


def spec_digest(text: str) -> str:
    """The digest of a job spec as written to its node (the exact JSON text): a console acts on
    a job folder only when its spec has the digest recorded at launch."""
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass
class RemoteJob:
    """One job directory as :data:`SCAN_SCRIPT` reported it (untrusted: cleaned and bounded).

    ``problem`` is set when a field fails its type or range (:func:`check_job`); such a record
    is shown as unreadable and nothing of it is used.
    """

    id: str
    spec: dict[str, Any] = field(default_factory=dict)
    pidinfo: dict[str, Any] | None = None
    alive: bool | None = None
    result: dict[str, Any] | None = None
    beat: float | None = None
    cancel_requested: bool = False
    progress: list[dict[str, Any]] = field(default_factory=list)
    #: sha256 of the spec line exactly as the node printed it (see :func:`spec_digest`).
    spec_digest: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class ScanResult:
    """One node's scan: its jobs dir, its clock, its job records, and one line per record that
    could not be read at all (no spec)."""

    home: str | None
    now: float | None
    jobs: list[RemoteJob]
    skipped: list[str] = field(default_factory=list)


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


def parse_scan(text: str) -> tuple[str | None, float | None, list[RemoteJob]]:
    """Parse :data:`SCAN_SCRIPT` output into (jobs dir, node clock, jobs); what a node prints is
    untrusted: a malformed, oversized or deeply nested line is skipped, never a crash."""
    res = parse_scan_checked(text)
    return res.home, res.now, res.jobs


def parse_scan_checked(text: str) -> ScanResult:
    """:func:`parse_scan` with every record checked for types and ranges (:func:`check_job`) and
    a line for each job directory whose spec could not be read."""
    home: str | None = None
    now: float | None = None
    jobs: list[RemoteJob] = []
    cur: RemoteJob | None = None
    skipped: list[str] = []
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        try:
            if tag == "@@HOME":
                home = rest
            elif tag == "@@NOW":
                t = float(rest)
                now = t if 0 < t < TIME_MAX else None
            elif tag == "@@JOB":
                cur = RemoteJob(rest)
                jobs.append(cur)
            elif cur is None:
                continue
            elif tag == "@@SPEC":
                cur.spec_digest = spec_digest(rest)
                cur.spec = _obj(rest, "job spec")
            elif tag == "@@PID":
                cur.pidinfo = _obj(rest, "job pid file")
            elif tag == "@@ALIVE":
                cur.alive = rest.strip() == "1"
            elif tag == "@@RESULT":
                cur.result = _obj(rest, "job result")
            elif tag == "@@BEAT":
                cur.beat = float(rest) if rest.strip() else None
            elif tag == "@@CANCEL":
                cur.cancel_requested = True
            elif tag == "@@PROG":
                cur.progress.append(_obj(rest, "progress line"))
        except (ValueError, TypeError) as exc:
            if cur is not None and tag in ("@@PID", "@@RESULT", "@@BEAT"):
                # Written by rename (pid, result) or in one write (heartbeat): never torn.
                cur.problem = cur.problem or _problem_text(tag, exc)
            # A progress line may be half-written (the runner is appending): read it next time.
            continue
    out: list[RemoteJob] = []
    for j in jobs:
        if not j.spec:
            skipped.append(f"job {_id_text(j.id)}: skipped: its spec is missing or not a JSON object")
            continue
        if j.problem is None:
            try:
                check_job(j)
            except BadRecord as exc:
                j.problem = str(exc)
        out.append(j)
    return ScanResult(home, now, out, skipped)


def _problem_text(tag: str, exc: BaseException) -> str:
    from backend.nodes.untrusted import clean_text

    what = {"@@PID": "pid file", "@@RESULT": "result.json", "@@BEAT": "heartbeat"}.get(tag, tag)
    return clean_text(f"{what}: {exc}", 200)


def _id_text(job_id: str) -> str:
    from backend.nodes.untrusted import clean_text

    return clean_text(job_id, 80) or "?"


# -- types and ranges ---------------------------------------------------------------------------


def _number(where: str, v: Any, lo: float, hi: float, *, integer: bool = False) -> float | int:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise BadRecord(f"{where}: expected a number, got {type(v).__name__}")
    if integer and not isinstance(v, int):
        raise BadRecord(f"{where}: expected a whole number, got {v!r}")
    if not (lo <= v <= hi):  # NaN fails both
        raise BadRecord(f"{where}: {v!r} is outside {lo:g}..{hi:g}")
    return v


def _opt_number(d: dict[str, Any], where: str, key: str, lo: float, hi: float, *, integer: bool = False) -> None:
    v = d.get(key)
    if v is not None:
        _number(f"{where} {key}", v, lo, hi, integer=integer)


def _opt_text(d: dict[str, Any], where: str, key: str, limit: int = MAX_TEXT) -> None:
    v = d.get(key)
    if v is not None and not isinstance(v, str):
        raise BadRecord(f"{where} {key}: expected text, got {type(v).__name__}")
    if isinstance(v, str) and len(v) > limit:
        raise BadRecord(f"{where} {key}: {len(v):,} characters, more than {limit:,}")


def _bounded(where: str, v: Any) -> None:
    """Every number anywhere in ``v`` finite and within a 64-bit integer's range (one pass, no
    paths built: a spec carries tens of thousands of object sizes)."""
    stack: list[Any] = [v]
    while stack:
        x = stack.pop()
        t = type(x)
        if t is dict:
            stack.extend(x.values())
        elif t is list:
            stack.extend(x)
        elif (t is int or t is float) and not (-MAX_NUMBER <= x <= MAX_NUMBER):  # NaN fails too
            raise BadRecord(f"{where}: a number ({x!r}) is outside the 64-bit range")


def check_progress(p: dict[str, Any], where: str = "progress") -> None:
    """A progress point's fields in their types and ranges; BadRecord naming the field."""
    _opt_number(p, where, "t", 0, TIME_MAX)
    _opt_number(p, where, "bytes_done", 0, MAX_BYTES, integer=True)
    _opt_number(p, where, "bytes_total", 0, MAX_BYTES, integer=True)
    _opt_number(p, where, "items_done", 0, MAX_ITEMS, integer=True)
    _opt_number(p, where, "items_total", 0, MAX_ITEMS, integer=True)
    _opt_number(p, where, "rate_bps", 0, MAX_RATE_BPS)
    extra = p.get("extra")
    if isinstance(extra, dict):  # the ledger settles a stopped pull with it: a count like bytes_done
        _opt_number(extra, f"{where} extra", "unplanned_bytes", 0, MAX_BYTES, integer=True)
    _bounded(where, p)


def check_job(j: RemoteJob) -> None:
    """Check every field a scan read against its type and range (BadRecord naming the first that
    fails); the pid file's numbers become ints."""
    if not JOB_ID_RE.fullmatch(j.id):
        raise BadRecord("the job directory's name is not a job id")
    s = j.spec
    if s.get("id") != j.id:
        raise BadRecord("spec id differs from the job directory's name")
    _opt_text(s, "spec", "kind", 64)
    if not isinstance(s.get("kind"), str):
        raise BadRecord("spec kind: expected text")
    for key in ("node", "label", "launched_by", "launched_from", "state_id"):
        _opt_text(s, "spec", key, 4096)
    _opt_number(s, "spec", "created", 0, TIME_MAX)
    if s.get("params") is not None and not isinstance(s["params"], dict):
        raise BadRecord("spec params: expected an object")
    _bounded("spec", s)
    if j.pidinfo is not None:
        p = j.pidinfo
        _number("pid file pid", p.get("pid"), 1, MAX_PID, integer=True)
        _opt_number(p, "pid file", "pgid", 1, MAX_PID, integer=True)
        _opt_number(p, "pid file", "started", 0, TIME_MAX)
        _opt_number(p, "pid file", "starttime", 0, MAX_NUMBER, integer=True)
        _opt_text(p, "pid file", "boot_id", 64)
        _opt_text(p, "pid file", "job_id", 64)
    if j.beat is not None:
        _number("heartbeat", j.beat, 0, TIME_MAX)
    if j.result is not None:
        r = j.result
        if r.get("state") not in RESULT_STATES:
            raise BadRecord(f"result state: expected one of {', '.join(sorted(RESULT_STATES))}")
        _opt_text(r, "result", "error")
        _opt_number(r, "result", "finished", 0, TIME_MAX)
        _opt_number(r, "result", "started", 0, TIME_MAX)
        details = r.get("details")
        if details is not None and not isinstance(details, dict):
            raise BadRecord("result details: expected an object")
        if isinstance(details, dict):
            _opt_number(details, "result details", "bytes", 0, MAX_BYTES, integer=True)
            # The ledger settles the job with bytes + unplanned_bytes: a negative one would offset.
            _opt_number(details, "result details", "unplanned_bytes", 0, MAX_BYTES, integer=True)
            _bounded("result details", details)
        prog = r.get("progress")
        if prog is not None:
            if not isinstance(prog, dict):
                raise BadRecord("result progress: expected an object")
            check_progress(prog, "result progress")
    for line in j.progress:
        check_progress(line)
