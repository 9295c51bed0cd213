"""Strict dataclass-from-TOML validation: unknown keys and wrong types name their key path.

Each config section is a frozen dataclass; :func:`parse_section` builds one from a raw mapping,
rejecting unknown keys and values of the wrong type with a :class:`ConfigError` that names the
file and the dotted key path. Feature modules declare their own section dataclasses and reuse this.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, get_args, get_origin

from backend.errors import ConfigError

T = TypeVar("T")

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "pb": 10**15,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "pib": 2**50,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "p": 10**15,
}
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800, "": 1}


def parse_size(value: str | int | float) -> int:
    """Parse a byte size such as ``40TB``, ``512MB``, ``1.5GiB`` or ``1e9`` (GB = 10^9 bytes)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a size like '512MB', got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value!r}")
        return int(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"expected a size like '512MB', '40TB' or '1.5GiB', got {value!r}")
    return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])


def parse_duration(value: str | int | float) -> float:
    """Parse a duration such as ``2h``, ``90s``, ``1.5m``, ``500ms`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '2h', got {value!r}")
    if isinstance(value, int | float):
        return float(value)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).lower() not in _DURATION_UNITS:
        raise ValueError(f"expected a duration like '90s', '2h' or '7d', got {value!r}")
    return float(m.group(1)) * _DURATION_UNITS[m.group(2).lower()]


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin in (list, tuple):
        args = get_args(tp)
        if not args:
            return "a list"
        plural = {str: "strings", int: "integers", float: "numbers", bool: "booleans"}
        return f"a list of {plural.get(args[0], _type_name(args[0]))}"
    if origin is dict:
        return "a table"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def coerce(value: Any, tp: Any, *, file: str | None, key: str) -> Any:
    """Check ``value`` against type ``tp`` (dataclasses recursively), raising ConfigError."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, file=file, key=key)
            except ConfigError as exc:
                errors.append(exc)
        raise ConfigError(f"expected {_type_name(tp)}, got {value!r}", file=file, key=key)
    if origin is typing.Literal:
        choices = get_args(tp)
        if value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"expected one of {allowed}, got {value!r}", file=file, key=key)
        return value
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"expected {_type_name(tp)}, got {value!r}", file=file, key=key)
        (inner,) = get_args(tp)[:1] or (Any,)
        items = [coerce(v, inner, file=file, key=f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a table, got {value!r}", file=file, key=key)
        _kt, vt = get_args(tp) or (str, Any)
        return {str(k): coerce(v, vt, file=file, key=f"{key}.{k}") for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise ConfigError(f"expected a table, got {value!r}", file=file, key=key)
        return parse_section(tp, value, file=file, key=key)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"expected {_type_name(tp)}, got {value!r}", file=file, key=key)


def parse_section(cls: type[T], raw: Mapping[str, Any], *, file: str | None, key: str) -> T:
    """Build dataclass ``cls`` from ``raw``; unknown keys and bad types raise ConfigError.

    A field may declare ``metadata={"parse": fn}`` to convert its raw value (sizes, durations);
    ``fn`` raising ValueError becomes a ConfigError naming the key.
    """
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields))
        path = f"{key}.{unknown[0]}" if key else unknown[0]
        raise ConfigError(f"unknown key (allowed here: {allowed})", file=file, key=path)
    kwargs: dict[str, Any] = {}
    for name, value in raw.items():
        field = fields[name]
        path = f"{key}.{name}" if key else name
        parser = field.metadata.get("parse")
        if parser is not None:
            try:
                kwargs[name] = parser(value)
            except (ValueError, TypeError) as exc:
                raise ConfigError(str(exc), file=file, key=path) from None
        else:
            kwargs[name] = coerce(value, hints[name], file=file, key=path)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    ]
    if missing:
        path = f"{key}.{missing[0]}" if key else missing[0]
        raise ConfigError("required key is missing", file=file, key=path)
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        raise ConfigError(str(exc), file=file, key=key or None) from None
