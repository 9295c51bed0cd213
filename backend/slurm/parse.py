"""Slurm's output -> typed snapshots, once, at the boundary: one small adapter per shape.

Slurm's JSON changed shape at every major release, so each shape has its own adapter, chosen by
what the record holds, not by a version number:

- ``v0.0.38`` (Slurm 22.05, ``openapi/v0.0.38``): a node's ``state`` is one lower-case word
  (``allocated``) and its flags are a separate ``state_flags`` list (``["DRAIN"]``);
  ``reason_changed_at`` is epoch seconds; a job's ``job_state`` is a word, ``start_time`` seconds.
- ``v0.0.39+`` (Slurm 23.02 and later, ``data_parser``): a node's ``state`` is a list holding the
  base state and the flags together (``["IDLE", "DRAIN"]``); numbers that may be unset are objects
  ``{"set": true, "infinite": false, "number": 1700000000}`` (24.x) or plain numbers (23.02);
  a job's ``job_state`` is a list too.
- ``text``: ``scontrol show node -o`` and ``scontrol show job -d -o`` (one record per line), for a
  Slurm without ``--json`` (before 21.08, or built without the openapi plugins).

Everything read is data from outside: bounded, stripped of control characters, and a record that
fails is skipped with one line naming it; the rest is still used. DRAINING (a busy base state plus
DRAIN) and DRAINED (idle plus DRAIN) are told apart in :class:`backend.slurm.model.NodeState`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

import hostlist

from backend.errors import LoadmasterError
from backend.slurm.model import BASE_STATES, Gres, NodeState, SlurmJob, SlurmNode, gres_indices
from backend.textfmt import safe_text

#: Longest text kept from one field (a reason, a job name).
MAX_FIELD = 512
#: Most nodes named by one job's node list (a hostlist expanding to millions is hostile).
MAX_JOB_NODES = 65536
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class SlurmParseError(LoadmasterError):
    """Slurm's output could not be read at all (not JSON, not the expected document)."""


def clean(value: Any, limit: int = MAX_FIELD) -> str:
    """Text from Slurm made safe to show (the one sanitiser, :func:`backend.textfmt.safe_text`: no
    escape sequences, control characters or bidi overrides; secrets redacted; at most ``limit``)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {type(value).__name__}")
    return safe_text(value, limit).strip()


def node_name(value: Any) -> str:
    """A node name as Slurm reports it; refused unless it is a plain host name."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"not a node name: {clean(str(value), 64)!r}")
    return value


def epoch(value: Any) -> float | None:
    """Epoch seconds from either shape (a number, or ``{"set", "infinite", "number"}``); 0 and
    unset are None."""
    if isinstance(value, Mapping):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        if value is None:
            return None
        raise ValueError(f"expected a time, got {clean(str(value), 40)!r}")
    return float(value) if 0 < value < 2**40 else None


def node_state(state: Any, flags: Any = ()) -> NodeState:
    """A node's state from 22.05's word plus ``state_flags`` or 23.02+'s list (base and flags)."""
    words: list[str] = []
    if isinstance(state, str):
        words.extend(w for w in re.split(r"[+]", state) if w)
    elif isinstance(state, list) and all(isinstance(w, str) for w in state):
        words.extend(state)
    else:
        raise ValueError(f"unreadable node state {clean(str(state), 60)!r}")
    if not isinstance(flags, list | tuple) or not all(isinstance(w, str) for w in flags):
        raise ValueError("state_flags is not a list of words")
    words.extend(flags)
    base = None
    rest: set[str] = set()
    for w in words:
        low = w.strip().rstrip("*~#!%$@^-").lower()
        if w.endswith("*"):
            rest.add("NOT_RESPONDING")
        if base is None and low in BASE_STATES:
            base = low
        elif low:
            rest.add(clean(w, 40).rstrip("*").upper())
    if base is None:
        raise ValueError(f"no base state in {clean(str(state), 60)!r}")
    return NodeState(base, frozenset(rest))


def parse_gres(text: Any) -> tuple[Gres, ...]:
    """``gpu:a100:8(S:0-1),nic:1`` -> Gres values; ``(null)``/empty -> ()."""
    text = clean(text)
    if text in ("", "(null)", "N/A"):
        return ()
    out = []
    for item in re.split(r",(?![^(]*\))", text):
        item = item.split("(", 1)[0]
        parts = item.split(":")
        if len(parts) < 2 or not parts[-1].isdigit():
            if len(parts) >= 1 and parts[0]:
                out.append(Gres(parts[0], parts[1] if len(parts) > 1 else None, 1))
            continue
        out.append(Gres(parts[0], parts[1] if len(parts) == 3 else None, int(parts[-1])))
    return tuple(out)


def expand_nodes(expr: Any) -> tuple[str, ...]:
    """A job's node list (``node-[01-04]``) as names; empty for a pending job."""
    text = clean(expr, 8192)
    if text in ("", "(null)", "None assigned"):
        return ()
    if "[" not in text:
        names = [n for n in text.split(",") if n]  # the common case, without the hostlist parser
    else:
        try:
            names = hostlist.expand_hostlist(text)
        except hostlist.BadHostlist:
            raise ValueError(f"unreadable node list {text[:60]!r}") from None
    if len(names) > MAX_JOB_NODES:
        raise ValueError(f"node list of {len(names)} names")
    return tuple(node_name(n) for n in names)


def _load(text: str | bytes, key: str) -> list[Any]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SlurmParseError(f"Slurm's answer is not JSON ({clean(str(exc), 120)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise SlurmParseError(f"Slurm's answer has no {key!r} list (is this sinfo/squeue --json?)")
    errors = doc.get("errors")
    if isinstance(errors, list) and errors:
        first = errors[0]
        msg = first.get("error") or first.get("description") if isinstance(first, dict) else first
        raise SlurmParseError(f"Slurm reported an error: {clean(str(msg), 200)}")
    return list(doc[key])


def _node_from_json(rec: Mapping[str, Any]) -> SlurmNode:
    state = rec.get("state")
    if isinstance(state, str):
        shape = "v0.0.38"
        st = node_state(state, rec.get("state_flags") or [])
    else:
        shape = "v0.0.39+"
        st = node_state(state)
    parts = rec.get("partitions") or []
    if isinstance(parts, str):
        parts = [p for p in parts.split(",") if p]
    if not isinstance(parts, list):
        raise ValueError("partitions is not a list")
    reason = clean(rec.get("reason"))
    by = rec.get("reason_set_by_user")
    return SlurmNode(
        name=node_name(rec.get("name")),
        state=st,
        partitions=tuple(clean(p, 64) for p in parts),
        address=clean(rec.get("address"), 255) or None,
        hostname=clean(rec.get("hostname"), 255) or None,
        reason=reason,
        reason_by=(clean(by, 64) or None) if reason else None,
        reason_at=epoch(rec.get("reason_changed_at")) if reason else None,
        gres=parse_gres(rec.get("gres")),
        gres_used=clean(rec.get("gres_used")),
        cpus=int(rec.get("cpus") or 0),
        shape=shape,
    )


def parse_nodes_json(text: str | bytes) -> tuple[list[SlurmNode], list[str]]:
    """``sinfo --json`` / ``scontrol show node --json`` -> nodes, and one line per skipped record.

    sinfo lists a node once per partition in some versions: the first record wins."""
    nodes: dict[str, SlurmNode] = {}
    skipped = []
    for i, rec in enumerate(_load(text, "nodes")):
        try:
            if not isinstance(rec, Mapping):
                raise ValueError("not an object")
            n = _node_from_json(rec)
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            name = rec.get("name") if isinstance(rec, Mapping) else None
            skipped.append(f"node record {i} ({clean(str(name), 64)!r}) skipped: {clean(str(exc), 160)}")
            continue
        nodes.setdefault(n.name, n)
    return list(nodes.values()), skipped


def _job_state(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        value = value[0]
    if not isinstance(value, str) or not value:
        raise ValueError(f"unreadable job state {clean(str(value), 40)!r}")
    return clean(value, 32).upper()


def _opt_id(value: Any, *, zero: bool = False) -> str | None:
    """An id, None when unset (0 too, unless ``zero``: an array's task 0 is a task)."""
    if isinstance(value, Mapping):
        if not value.get("set", False):
            return None
        value = value.get("number")
    if value in (None, "") or isinstance(value, bool) or (value == 0 and not zero):
        return None
    if isinstance(value, int):
        return str(value)
    raise ValueError(f"unreadable id {clean(str(value), 40)!r}")


def _gpus_by_node(nodes: tuple[str, ...], details: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``gres_detail`` holds one entry per allocated node, in the node list's order."""
    if not isinstance(details, list):
        return ()
    out = []
    for node, detail in zip(nodes, details, strict=False):
        idx = gres_indices(detail)
        if idx:
            out.append((node, idx))
    return tuple(out)


def _job_from_json(rec: Mapping[str, Any]) -> SlurmJob:
    job_id = _opt_id(rec.get("job_id"))
    if job_id is None:
        raise ValueError("no job_id")
    array_job = _opt_id(rec.get("array_job_id"))
    task = _opt_id(rec.get("array_task_id"), zero=array_job is not None)
    if array_job is not None and task is not None:
        shown_id = f"{array_job}_{task}"
    elif array_job is not None and clean(rec.get("array_task_string")):
        shown_id = f"{array_job}_[{clean(rec.get('array_task_string'), 64)}]"
    else:
        shown_id = job_id
    nodes = expand_nodes(rec.get("nodes"))
    return SlurmJob(
        job_id=shown_id,
        name=clean(rec.get("name"), 128),
        user=clean(rec.get("user_name"), 64) or str(rec.get("user_id", "?")),
        state=_job_state(rec.get("job_state")),
        partition=clean(rec.get("partition"), 64),
        nodes=nodes,
        start_time=epoch(rec.get("start_time")),
        reason=clean(rec.get("state_reason"), 128),
        gpus=_gpus_by_node(nodes, rec.get("gres_detail")),
        array_job_id=array_job,
        array_task_id=task,
        requeue=bool(rec.get("requeue", False)),
    )


def parse_jobs_json(text: str | bytes) -> tuple[list[SlurmJob], list[str]]:
    """``squeue --json`` -> jobs, and one line per skipped record."""
    jobs = []
    skipped = []
    for i, rec in enumerate(_load(text, "jobs")):
        try:
            if not isinstance(rec, Mapping):
                raise ValueError("not an object")
            jobs.append(_job_from_json(rec))
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            jid = rec.get("job_id") if isinstance(rec, Mapping) else None
            skipped.append(f"job record {i} ({clean(str(jid), 32)}) skipped: {clean(str(exc), 160)}")
    return jobs, skipped


# -- text (scontrol ... -o) ----------------------------------------------------------------------

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")
_REASON_TAIL = re.compile(r"^(?P<text>.*?)\s*\[(?P<who>[^\[\]@]*)@(?P<when>[0-9T:\-]+)\]\s*$")


def key_values(line: str) -> dict[str, str]:
    """``A=1 B=two words C=3`` -> {A: 1, B: two words, C: 3}; the first of a repeated key wins."""
    found = list(_KEY.finditer(line))
    out: dict[str, str] = {}
    for m, nxt in zip(found, [*found[1:], None], strict=False):
        value = line[m.end() : nxt.start() if nxt else len(line)].strip()
        out.setdefault(m.group(1), value)
    return out


def _text_time(value: str) -> float | None:
    """``2026-12-02T01:09:13`` as scontrol prints it (the local time zone) -> epoch seconds."""
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def _node_from_text(line: str) -> SlurmNode:
    reason_raw = ""
    if " Reason=" in line:
        line, _, reason_raw = line.partition(" Reason=")
    kv = key_values(line)
    reason, by, at = clean(reason_raw), None, None
    m = _REASON_TAIL.match(reason)
    if m:
        reason, by, at = m.group("text"), clean(m.group("who"), 64) or None, _text_time(m.group("when"))
    parts = kv.get("Partitions", "")
    return SlurmNode(
        name=node_name(kv.get("NodeName")),
        state=node_state(kv.get("State", "")),
        partitions=tuple(p for p in parts.split(",") if p and p != "(null)"),
        address=clean(kv.get("NodeAddr"), 255) or None,
        hostname=clean(kv.get("NodeHostName"), 255) or None,
        reason=reason,
        reason_by=by if reason else None,
        reason_at=at if reason else None,
        gres=parse_gres(kv.get("Gres")),
        gres_used=clean(kv.get("GresUsed")),
        cpus=int(kv.get("CPUTot") or 0),
        shape="text",
    )


def parse_nodes_text(text: str) -> tuple[list[SlurmNode], list[str]]:
    """``scontrol show node -o`` (one node per line) -> nodes, and one line per skipped record."""
    return _lines(text, _node_from_text, "node")


def _job_from_text(line: str) -> SlurmJob:
    kv = key_values(line)
    user = kv.get("UserId", "").split("(", 1)[0]
    nodes = expand_nodes(kv.get("NodeList"))
    gpus: list[tuple[str, tuple[int, ...]]] = []
    for m in re.finditer(r"\sNodes=(\S+) CPU_IDs=\S* Mem=\S* GRES=(\S*)", line):
        idx = gres_indices(m.group(2))
        if idx:
            gpus.extend((n, idx) for n in expand_nodes(m.group(1)))
    array_job = kv.get("ArrayJobId")
    task = kv.get("ArrayTaskId")
    if array_job and task:
        job_id = f"{array_job}_{task}" if task.isdigit() else f"{array_job}_[{task}]"
    else:
        job_id = kv.get("JobId", "")
    if not re.match(r"^[0-9]+(_[0-9\[\],\-%]+)?$", job_id):
        raise ValueError(f"unreadable JobId {clean(job_id, 32)!r}")
    state = kv.get("JobState", "")
    return SlurmJob(
        job_id=job_id,
        name=clean(kv.get("JobName"), 128),
        user=clean(user, 64),
        state=_job_state(state),
        partition=clean(kv.get("Partition"), 64),
        nodes=nodes,
        start_time=_text_time(kv.get("StartTime", "")),
        reason=clean(kv.get("Reason"), 128),
        gpus=tuple(gpus),
        array_job_id=array_job,
        array_task_id=task,
        requeue=kv.get("Requeue") == "1",
    )


def parse_jobs_text(text: str) -> tuple[list[SlurmJob], list[str]]:
    """``scontrol show job -d -o`` (one job per line) -> jobs, and one line per skipped record."""
    return _lines(text, _job_from_text, "job")


def _lines(text: str, fn: Any, what: str) -> tuple[list[Any], list[str]]:
    out = []
    skipped = []
    for i, line in enumerate(_nonempty(text.splitlines())):
        if line.startswith("No ") and " in the system" in line:
            continue  # "No jobs in the system"
        try:
            out.append(fn(line))
        except (ValueError, TypeError, OverflowError) as exc:
            skipped.append(f"{what} line {i + 1} skipped: {clean(str(exc), 160)}")
    return out, skipped


def _nonempty(lines: Iterable[str]) -> Iterable[str]:
    return (ln for ln in lines if ln.strip())
