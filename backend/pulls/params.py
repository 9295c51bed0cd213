"""The node side's reading of a pull job's spec params: :class:`PullParams`, checked once.

The spec is JSON written by the console (:func:`backend.pulls.launch`), but the node reads it
from a file anyone with the node's account could have edited: :func:`read_params` checks each
field the runner uses at the spec's boundary, so a malformed spec is a one-line
:class:`~backend.errors.JobError` naming the field, never a traceback from deep in the copy.
Fields the pull job does not use (``store``, ``bytes_total``, a relay job's ``relay``...) are
left to their readers. A field given as JSON ``null`` counts as absent, as it always did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypedDict

from backend.errors import JobError


class PullParams(TypedDict):
    """What a pull job's runner reads of its spec (``ctx.params``), each field of its type."""

    src: str
    dest: str
    numworkers: int
    concurrency: int
    part_size_mib: int
    #: The s5cmd binary (absent or empty: ``s5cmd`` on PATH).
    s5cmd: NotRequired[str]
    endpoint_url: NotRequired[str]
    #: ``auto`` (or absent): us-east-1 for signing, none given to s5cmd.
    region: NotRequired[str]
    #: A named profile on the node, when the console sent no credentials.
    profile: NotRequired[str]
    #: The plan's objects ([rel, size] or [rel, size, etag] each); absent: listed on the node.
    expected: NotRequired[list[object]]
    #: Large objects a few at a time (a relay seed's flags).
    pipeline: NotRequired[bool]
    verify_workers: NotRequired[int]
    #: "staging" or "per-object" forces that copy mode; anything else: chosen by the runner.
    copy_mode: NotRequired[str]
    unplanned_cap_bytes: NotRequired[int]


def _bad(name: str, want: str, value: object) -> JobError:
    return JobError(f"malformed job spec: params.{name} must be {want}, not {str(value)[:60]!r}")


def _str(raw: Mapping[str, object], name: str, *, required: bool = False) -> str | None:
    value = raw.get(name)
    if value is None:
        if required:
            raise JobError(f"malformed job spec: params.{name} is missing")
        return None
    if not isinstance(value, str):
        raise _bad(name, "a string", value)
    return value


def _int(raw: Mapping[str, object], name: str, *, least: int | None = None, required: bool = False) -> int | None:
    value = raw.get(name)
    if value is None:
        if required:
            raise JobError(f"malformed job spec: params.{name} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (least is not None and value < least):
        raise _bad(name, "a whole number" + (f" >= {least}" if least is not None else ""), value)
    return value


def read_dest(raw: Mapping[str, object]) -> str:
    """The spec's DEST alone (the cleanup reads no more of it)."""
    dest = _str(raw, "dest", required=True)
    assert dest is not None
    return dest


def read_params(raw: Mapping[str, object]) -> PullParams:
    """``raw`` (a job's ``ctx.params``) as :class:`PullParams`; a :class:`JobError` naming the
    first field that is missing or of the wrong type."""
    src = _str(raw, "src", required=True)
    nw = _int(raw, "numworkers", least=1, required=True)
    cc = _int(raw, "concurrency", least=1, required=True)
    ps = _int(raw, "part_size_mib", least=1, required=True)
    assert src is not None and nw is not None and cc is not None and ps is not None
    p = PullParams(src=src, dest=read_dest(raw), numworkers=nw, concurrency=cc, part_size_mib=ps)
    if (s5cmd := _str(raw, "s5cmd")) is not None:
        p["s5cmd"] = s5cmd
    if (endpoint_url := _str(raw, "endpoint_url")) is not None:
        p["endpoint_url"] = endpoint_url
    if (region := _str(raw, "region")) is not None:
        p["region"] = region
    if (profile := _str(raw, "profile")) is not None:
        p["profile"] = profile
    if (copy_mode := _str(raw, "copy_mode")) is not None:
        p["copy_mode"] = copy_mode
    if (workers := _int(raw, "verify_workers", least=0)) is not None:
        p["verify_workers"] = workers
    if (cap := _int(raw, "unplanned_cap_bytes")) is not None:
        p["unplanned_cap_bytes"] = cap
    expected = raw.get("expected")
    if expected is not None:
        if not isinstance(expected, list):
            raise _bad("expected", "a list of objects", expected)
        p["expected"] = expected
    pipeline = raw.get("pipeline")
    if pipeline is not None:
        if not isinstance(pipeline, bool):
            raise _bad("pipeline", "true or false", pipeline)
        p["pipeline"] = pipeline
    return p
