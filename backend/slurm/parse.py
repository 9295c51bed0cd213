"""Slurm's output -> typed snapshots, once, at the boundary: one small adapter per shape.

Slurm's JSON changed shape at every major release, so each shape has its own adapter, chosen by
what the record holds, not by a version number:

- ``v0.0.38`` (Slurm 22.05, ``openapi/v0.0.38``): a node's ``state`` is one lower-case word
  (``allocated``) and its flags are a separate ``state_flags`` list (``["DRAIN"]``);
  ``reason_changed_at`` is epoch seconds; a job's ``job_state`` is a word, ``start_time`` seconds.
- ``v0.0.39+`` (Slurm 23.02 and later, ``data_parser`` v0.0.39 .. v0.0.43: ``scontrol show node
  --json``, slurmrestd; 23.02+'s ``sinfo --json`` is a grouped ``"sinfo"`` list, refused with
  :class:`SinfoGrouped`): a node's ``state`` is a list holding the base state and the flags
  together (``["IDLE", "DRAIN"]``); numbers that may be unset are objects ``{"set": true,
  "infinite": false, "number": 1700000000}`` (``*_NO_VAL``) or plain numbers (23.02's ``UINT64``
  times); a job's ``job_state`` is a string in 23.02 and a list (``["COMPLETED", "COMPLETING"]``)
  from 23.11, reduced to Slurm's one word (``COMPLETING``) as ``job_state_string`` does.
- ``text``: ``scontrol show node -o`` and ``scontrol show job -d -o`` (one record per line), for a
  Slurm without ``--json`` (before 21.08, or built without the openapi plugins).

Everything read is data from outside: bounded, stripped of control characters, and a record that
fails is skipped with one line naming it and the field (``start_time: not a time: -5``); the rest
is still used. Slurm's NO_VAL/INFINITE sentinels (``4294967294``) are "unset", never a number. DRAINING (a busy base state plus
DRAIN) and DRAINED (idle plus DRAIN) are told apart in :class:`backend.slurm.model.NodeState`.
"""

from __future__ import annotations

import json
import math
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
#: Longest node list expression read (65,536 uncompressible 15-character names).
MAX_NODELIST = 1 << 20
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


#: Slurm's "no value" and "infinite" sentinels (``slurm.h``: ``NO_VAL``, ``INFINITE`` and their 16-
#: and 64-bit forms). Plain-number shapes (22.05's v0.0.38, 23.02's ``UINT64`` fields) may carry them
#: where the object shapes say ``{"set": false}`` or ``{"infinite": true}``: never a real number.
NO_VAL16, INFINITE16 = 0xFFFE, 0xFFFF
NO_VAL, INFINITE = 0xFFFFFFFE, 0xFFFFFFFF
NO_VAL64, INFINITE64 = 0xFFFFFFFFFFFFFFFE, 0xFFFFFFFFFFFFFFFF
_SENTINELS = frozenset({NO_VAL, INFINITE, NO_VAL64, INFINITE64})
#: Latest believable epoch second (year 2500): past it a time is a sentinel or junk.
_MAX_EPOCH = 16725225600


def number(value: Any) -> int | float | None:
    """A number from either shape: plain (22.05, 23.02) or ``{"set", "infinite", "number"}``
    (``data_parser`` ``*_NO_VAL``, 23.02+). None when unset, infinite, absent or a NO_VAL/INFINITE
    sentinel; ValueError for anything else that is not a finite number."""
    if isinstance(value, Mapping):
        is_set, infinite = value.get("set"), value.get("infinite", False)
        if not isinstance(is_set, bool) or not isinstance(infinite, bool):
            raise ValueError("a NO_VAL object needs boolean 'set' and 'infinite'")
        if infinite or not is_set:
            return None
        value = value.get("number")
        if value is None:
            raise ValueError("'set' is true but there is no 'number'")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {type(value).__name__} {clean(str(value), 40)!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"not a finite number: {value!r}")
    if value in _SENTINELS:
        return None
    return value


def epoch(value: Any) -> float | None:
    """Epoch seconds from either shape; 0, unset, infinite and the NO_VAL sentinels are None; a
    negative time or one past the year 2500 is refused."""
    n = number(value)
    if n is None or n == 0:
        return None
    if not 0 < n <= _MAX_EPOCH:
        raise ValueError(f"not a time: {n!r}")
    return float(n)


def count(value: Any, *, limit: int = NO_VAL16) -> int:
    """A non-negative count (CPUs) from either shape; unset is 0, a sentinel or a count at or
    past ``limit`` is refused."""
    n = number(value)
    if n is None:
        return 0
    if isinstance(n, float) and not n.is_integer():
        raise ValueError(f"not a whole number: {n!r}")
    if not 0 <= n < limit:
        raise ValueError(f"out of range: {n!r}")
    return int(n)


def flag(value: Any) -> bool:
    """A yes/no field (``BOOL16``: JSON true/false). Anything else is False: what cannot be read
    proves nothing (deny by default: a job whose ``requeue`` is unreadable is not requeued)."""
    return value is True


def node_state(state: Any, flags: Any = ()) -> NodeState:
    """A node's state from 22.05's word plus ``state_flags``, 23.02+'s list (base and flags, as
    ``data_parser``'s ``NODE_STATES`` flag array dumps it: ``["IDLE", "DRAIN"]``) or the text forms'
    ``IDLE+DRAIN``. Exactly one base state (``NODE_STATE_BASE``) is required: none (``["INVALID"]``,
    ``["DRAIN"]``) or two (``["IDLE", "DOWN"]``) is refused rather than guessed."""
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
    bases: list[str] = []
    rest: set[str] = set()
    for w in words:
        low = w.strip().rstrip("*~#!%$@^-").lower()
        if w.strip().endswith("*"):
            rest.add("NOT_RESPONDING")
        if low in BASE_STATES:
            if low not in bases:
                bases.append(low)
        elif low:
            rest.add(clean(w, 40).rstrip("*").upper())
    if not bases:
        raise ValueError(f"no base state in {clean(str(state), 60)!r}")
    if len(bases) > 1:
        raise ValueError(f"two base states ({bases[0]}, {bases[1]}) in {clean(str(state), 60)!r}")
    return NodeState(bases[0], frozenset(rest))


#: Most of one GRES a node may hold (Slurm's counts are 64-bit; past this it is a sentinel or junk).
MAX_GRES_COUNT = 1 << 20
_GRES_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_GRES_COUNT = re.compile(r"^([0-9]{1,19})([KMG]?)$")


def parse_gres(text: Any) -> tuple[Gres, ...]:
    """A node's GRES -> Gres values; ``(null)``/``N/A``/empty -> ().

    Every spelling Slurm prints: ``gpu:8``, ``gpu:h100:8(S:0-1)``, several comma-separated (a
    socket list ``(S:0,1)`` is not a separator), ``gpu:h100:no_consume:2``, a TRES name
    ``gres/gpu:h100:8``, a count with a ``K``/``M``/``G`` suffix, and a name without a count (one).
    A count that is not a number in range is refused, never read as one."""
    text = clean(text)
    if text in ("", "(null)", "N/A"):
        return ()
    out = []
    for item in re.split(r",(?![^(]*\))", text):
        item = item.split("(", 1)[0].strip()
        if not item:
            continue
        if item.startswith("gres/"):
            item = item[len("gres/") :]
        parts = [p for p in item.split(":") if p and p != "no_consume"]
        if not parts:
            raise ValueError(f"unreadable GRES {item[:40]!r}")
        name, kind, n = parts[0], None, 1
        tail = parts[1:]
        m = _GRES_COUNT.match(tail[-1]) if tail else None
        if m:
            n = int(m.group(1)) * _GRES_SUFFIX[m.group(2)]
            tail = tail[:-1]
        if len(tail) > 1:
            raise ValueError(f"unreadable GRES {item[:40]!r}")
        kind = tail[0] if tail else None
        if n >= MAX_GRES_COUNT:
            raise ValueError(f"GRES count {n} of {name!r} out of range")
        out.append(Gres(name, kind, n))
    return tuple(out)


_HOSTLIST = re.compile(r"^[A-Za-z0-9_.,\-\[\]]*$")


def expand_nodes(expr: Any) -> tuple[str, ...]:
    """A Slurm hostlist expression as names; empty for a pending job's empty list.

    Slurm's grammar (``hostlist.c``; python-hostlist implements the same): comma-separated items,
    each a name with any number of bracketed range lists, zero padding kept (``gpu[001-004,010]``,
    ``rack[1-2]-gpu[01-02]``, ``n[1-2]-ib``). Anything else (unbalanced or empty brackets, a
    reversed range, characters no host name has, more than :data:`MAX_JOB_NODES` names) is refused
    with one line."""
    if expr is None:
        return ()
    if not isinstance(expr, str):
        raise ValueError(f"expected a node list, got {type(expr).__name__}")
    text = expr.strip()
    if text in ("", "(null)", "None assigned"):
        return ()
    if len(text) > MAX_NODELIST:
        raise ValueError(f"node list of {len(text)} characters")  # cut short, its last name would be wrong
    if not _HOSTLIST.match(text):
        raise ValueError(f"unreadable node list {clean(text, 60)!r}")
    if "[" not in text and "]" not in text:
        names = [n for n in text.split(",") if n]  # the common case, without the hostlist parser
    else:
        try:
            names = hostlist.expand_hostlist(text)
        except (hostlist.BadHostlist, ValueError, IndexError, OverflowError):
            raise ValueError(f"unreadable node list {text[:60]!r}") from None
    if len(names) > MAX_JOB_NODES:
        raise ValueError(f"node list of {len(names)} names")
    return tuple(dict.fromkeys(node_name(n) for n in names))


class SinfoGrouped(SlurmParseError):
    """``sinfo --json`` of Slurm 23.02 and later: records grouped by partition and state (``"sinfo"``,
    ``data_parser``'s ``SINFO_DATA``), one reason for many nodes. Per-node state comes from
    ``scontrol show node --json`` there (:class:`backend.slurm.client.SlurmClient` switches)."""


def _load(text: str | bytes, key: str) -> list[Any]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SlurmParseError(f"Slurm's answer is not JSON ({clean(str(exc), 120)})") from None
    if not isinstance(doc, dict):
        raise SlurmParseError(f"Slurm's answer has no {key!r} list (is this sinfo/squeue --json?)")
    errors = doc.get("errors")
    if isinstance(errors, list) and errors:
        raise SlurmParseError(f"Slurm reported an error: {_error_text(errors[0])}")
    if key == "nodes" and "nodes" not in doc and isinstance(doc.get("sinfo"), list):
        raise SinfoGrouped(
            "Slurm's sinfo --json (23.02+) groups nodes by partition and state: per-node state needs "
            "scontrol show node --json"
        )
    if not isinstance(doc.get(key), list):
        raise SlurmParseError(f"Slurm's answer has no {key!r} list (is this sinfo/squeue --json?)")
    return list(doc[key])


def _error_text(first: Any) -> str:
    """One of Slurm's ``errors`` (``{"description", "error", "error_number", "source"}`` in 23.02+,
    ``{"error", "errno"}`` in 22.05) as one line."""
    if isinstance(first, Mapping):
        parts = [clean(str(first[k]), 200) for k in ("description", "error") if first.get(k)]
        text = " - ".join(dict.fromkeys(p for p in parts if p))
        if not text and first.get("error_number") is not None:
            text = f"error {clean(str(first.get('error_number')), 20)}"
        return text or "no description"
    return clean(str(first), 200) or "no description"


def _field(rec: Mapping[str, Any], key: str, read: Any, *args: Any, **kwargs: Any) -> Any:
    """``read(rec[key])``, a failure naming the field: ``start_time: not a time: -5``."""
    try:
        return read(rec.get(key), *args, **kwargs)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ValueError(f"{key}: {clean(str(exc), 120)}") from None


def _text(value: Any, limit: int = MAX_FIELD) -> str:
    return clean(value, limit)


def _partitions(value: Any) -> tuple[str, ...]:
    """``["train", "debug"]`` (23.02+ ``CSV_LIST``/``CSV_STRING``) or ``"train,debug"``."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [p for p in value.split(",") if p]
    if not isinstance(value, list):
        raise ValueError("not a list of partitions")
    return tuple(clean(p, 64) for p in value)


def _node_from_json(rec: Mapping[str, Any]) -> SlurmNode:
    state = rec.get("state")
    if isinstance(state, str):
        shape = "v0.0.38"
        st = _field(rec, "state", node_state, rec.get("state_flags") or [])
    else:
        shape = "v0.0.39+"
        st = _field(rec, "state", node_state)
    reason = _field(rec, "reason", _text)
    return SlurmNode(
        name=_field(rec, "name", node_name),
        state=st,
        partitions=_field(rec, "partitions", _partitions),
        address=_field(rec, "address", _text, 255) or None,
        hostname=_field(rec, "hostname", _text, 255) or None,
        reason=reason,
        reason_by=(_field(rec, "reason_set_by_user", _text, 64) or None) if reason else None,
        reason_at=_field(rec, "reason_changed_at", epoch) if reason else None,
        gres=_field(rec, "gres", parse_gres),
        gres_used=_field(rec, "gres_used", _text),
        cpus=_field(rec, "cpus", count),
        shape=shape,
    )


def parse_nodes_json(text: str | bytes) -> tuple[list[SlurmNode], list[str]]:
    """``sinfo --json`` (22.05) / ``scontrol show node --json`` (23.02+) / slurmrestd's ``nodes``
    -> nodes, and one line per skipped record naming the field that could not be read.

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


#: A job's base states (``JOB_STATE_BASE``), as ``data_parser``'s ``JOB_STATE`` flag array names them.
JOB_BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
#: Job flags that name the state in Slurm's own one word (``job_state_string``, first match wins):
#: a job ``["COMPLETED", "COMPLETING"]`` is COMPLETING (it still holds its nodes), as 22.05's
#: string and ``scontrol show job`` say.
JOB_FLAG_WORDS = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)


def _job_state(value: Any) -> str:
    """One word per job, Slurm's ``job_state_string``: 22.05/23.02's string as it is; 23.11+'s list
    (``["RUNNING", "CONFIGURING"]``: one base state and flags) reduced the same way."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("empty job state")
        return clean(value, 32).upper()
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError(f"unreadable job state {clean(str(value), 40)!r}")
    words = [clean(v, 32).upper() for v in value]
    bases = [w for w in dict.fromkeys(words) if w in JOB_BASE_STATES]
    if len(bases) != 1:
        raise ValueError(f"{'no' if not bases else 'more than one'} base job state in {clean(str(value), 60)!r}")
    return next((w for w in JOB_FLAG_WORDS if w in words), bases[0])


def _opt_id(value: Any, *, zero: bool = False) -> str | None:
    """An id, None when unset (0 too, unless ``zero``: an array's task 0 is a task; a NO_VAL or
    INFINITE sentinel always)."""
    n = number(value)
    if n is None or (n == 0 and not zero):
        return None
    if isinstance(n, float):
        if not n.is_integer():
            raise ValueError(f"unreadable id {n!r}")
        n = int(n)
    if n < 0 or n >= NO_VAL:
        raise ValueError(f"unreadable id {n!r}")
    return str(n)


def _gpus_by_node(nodes: tuple[str, ...], details: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``gres_detail`` holds one entry per allocated node, in the node list's order."""
    if details is None or details == []:
        return ()
    if not isinstance(details, list) or not all(isinstance(d, str) for d in details):
        raise ValueError("not a list of strings")
    out = []
    for node, detail in zip(nodes, details, strict=False):
        idx = gres_indices(detail)
        if idx:
            out.append((node, idx))
    return tuple(out)


def _user(rec: Mapping[str, Any]) -> str:
    name = _field(rec, "user_name", _text, 64)
    if name:
        return name
    uid = _field(rec, "user_id", _opt_id, zero=True)
    return uid if uid is not None else "?"


def _job_from_json(rec: Mapping[str, Any]) -> SlurmJob:
    job_id = _field(rec, "job_id", _opt_id)
    if job_id is None:
        raise ValueError("job_id: missing or unset")
    array_job = _field(rec, "array_job_id", _opt_id)
    task = _field(rec, "array_task_id", _opt_id, zero=array_job is not None)
    tasks = _field(rec, "array_task_string", _text, 64)
    if array_job is not None and task is not None:
        shown_id = f"{array_job}_{task}"
    elif array_job is not None and tasks:
        shown_id = f"{array_job}_[{tasks}]"
    else:
        shown_id = job_id
    nodes = _field(rec, "nodes", expand_nodes)
    return SlurmJob(
        job_id=shown_id,
        name=_field(rec, "name", _text, 128),
        user=_user(rec),
        state=_field(rec, "job_state", _job_state),
        partition=_field(rec, "partition", _text, 64),
        nodes=nodes,
        start_time=_field(rec, "start_time", epoch),
        reason=_field(rec, "state_reason", _text, 128),
        gpus=_field(rec, "gres_detail", lambda v: _gpus_by_node(nodes, v)),
        array_job_id=array_job,
        array_task_id=task,
        requeue=flag(rec.get("requeue")),
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
