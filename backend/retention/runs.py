"""One identity per run folder, and the lock that lets one retention apply run on it at a time.

``s3://bucket/run``, ``store/run`` (a configured store name), a relative path and an absolute
path of the same folder are the same run: pins, milestones, plans, locks and in-flight lists
all key on :func:`run_url`.

The apply lock lives in the run folder itself (``.loadmaster-apply.lock``), so every operator's
commands see it whatever their state DB: it names who holds it, is refreshed while the apply
runs, and is taken over only when it has been silent for longer than ``LOCK_STALE_S`` (a
lock refreshed within that window is never taken over: two containers can share a hostname and a
pid; the lock names its machine by :func:`machine_identity`).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from backend.errors import PolicyError

if TYPE_CHECKING:
    from backend.config import Config
    from backend.storage import ObjectStore

LOCK_KEY = ".loadmaster-apply.lock"
#: A lock not refreshed for this long belongs to an apply that died (it refreshes every 30 s).
LOCK_STALE_S = 600.0
LOCK_REFRESH_S = 30.0
#: How long a new holder waits before reading its lock back (two writers: the last one wins).
_SETTLE_S = 0.3


def run_url(config: Config, ref: str) -> str:
    """The canonical URL of a run folder given as ``s3://...``, ``store/run`` or a local path."""
    from backend.checkpoints.upload import url_join

    ref = ref.strip()
    if not ref:
        raise PolicyError("no run folder given (expected s3://bucket/run, store/run or a local directory)")
    if "://" in ref:
        if not ref.startswith("s3://"):
            raise PolicyError(f"unsupported URL {ref!r}: use s3://bucket/run, store/run or a local directory")
        return ref.rstrip("/")
    name, _, rest = ref.partition("/")
    if name in config.stores:
        return url_join(config.stores[name].url, rest.strip("/")).rstrip("/")
    return os.path.realpath(os.path.expanduser(ref)).rstrip("/") or "/"


def run_keys(config: Config, ref: str) -> tuple[str, ...]:
    """Every spelling of a run under which older records may have been stored (for reading)."""
    url = run_url(config, ref)
    keys = [url, ref.rstrip("/")]
    for name, store in config.stores.items():
        base = store.url.rstrip("/")
        if url == base or url.startswith(base + "/"):
            keys.append(f"{name}{url[len(base) :]}")
    return tuple(dict.fromkeys(keys))


@dataclass(frozen=True)
class LockInfo:
    """Who holds a run's apply lock."""

    holder: str
    host: str
    pid: int
    plan: str
    started: float
    refreshed: float
    token: str
    machine: str = ""  # machine_identity() of the holder ("" in locks written before it existed)

    def describe(self) -> str:
        since = datetime.fromtimestamp(self.started).strftime("%Y-%m-%d %H:%M:%S")
        return f"{self.holder} on {self.host} (pid {self.pid}, plan {self.plan[:12]}, since {since})"

    def stale(self, now: float) -> bool:
        """Only silence proves an apply dead: a lock refreshed within ``LOCK_STALE_S`` is never
        taken over, whoever holds it (two containers may share a hostname and a pid)."""
        return now - self.refreshed > LOCK_STALE_S

    def holder_gone(self) -> bool:
        """Its holder ran on this very machine (same identity, not just the same hostname) and
        its process is gone: said in the refusal, so the operator can unlock at once."""
        if not self.machine or self.machine != machine_identity() or self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def machine_identity() -> str:
    """Who this process runs on, as two machines never share it: the hostname plus the kernel's
    boot id (differs per VM or boot), the machine id and the pid namespace (differs per container)."""

    def read(path: str) -> str:
        try:
            with open(path, encoding="ascii", errors="replace") as f:
                return f.read(64).strip()
        except OSError:
            return ""

    try:
        pidns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        pidns = ""
    parts = [socket.gethostname(), read("/etc/machine-id"), read("/proc/sys/kernel/random/boot_id"), pidns]
    return "/".join(parts)


def _parse_lock(raw: bytes) -> LockInfo | None:
    try:
        d = json.loads(raw[:65536])
        return LockInfo(
            str(d["holder"]),
            str(d["host"]),
            int(d["pid"]),
            str(d.get("plan", "")),
            float(d["started"]),
            float(d["refreshed"]),
            str(d["token"]),
            str(d.get("machine", "")),
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


async def read_lock(store: ObjectStore, prefix: str = "") -> LockInfo | None:
    """The lock on the run at ``prefix`` of ``store``, if any (an unreadable lock counts as none)."""
    from backend.storage import join_key

    return await read_lock_key(store, join_key(prefix, LOCK_KEY))


class ApplyLock:
    """``async with ApplyLock(store, prefix, run=..., plan=...)``: one apply per run at a time."""

    def __init__(self, store: ObjectStore, prefix: str, *, run: str, plan: str) -> None:
        from backend.state import actor
        from backend.storage import join_key

        self.store, self.key, self.run = store, join_key(prefix, LOCK_KEY), run
        self.info = LockInfo(
            actor(),
            socket.gethostname(),
            os.getpid(),
            plan,
            time.time(),
            time.time(),
            secrets.token_hex(8),
            machine_identity(),
        )
        self._task: asyncio.Task[None] | None = None
        self.took_over: LockInfo | None = None

    def _body(self) -> bytes:
        i = self.info
        return json.dumps(
            {
                "holder": i.holder,
                "host": i.host,
                "pid": i.pid,
                "plan": i.plan,
                "started": i.started,
                "refreshed": time.time(),
                "token": i.token,
                "machine": i.machine,
            }
        ).encode()

    async def __aenter__(self) -> ApplyLock:
        info = await self.store.stat(self.key)
        if info is not None:
            held = _parse_lock(await self.store.get_bytes(self.key))
            if held is not None and not held.stale(time.time()):
                if held.holder_gone():
                    raise PolicyError(
                        f"a retention apply of {self.run} holds its lock, but its process is gone from this machine: "
                        f"{held.describe()}; remove the lock with 'loadmaster retention unlock {self.run}'"
                    )
                raise PolicyError(
                    f"a retention apply of {self.run} is already running: {held.describe()}; wait for it to "
                    f"finish, or if it died, 'loadmaster retention unlock {self.run}' (a lock is also taken "
                    f"over once it is {LOCK_STALE_S / 60:.0f} minutes without a heartbeat)"
                )
            self.took_over = held
        await self.store.put_bytes(self.key, self._body())
        await asyncio.sleep(_SETTLE_S)
        mine = _parse_lock(await self.store.get_bytes(self.key))
        if mine is None or mine.token != self.info.token:
            other = mine.describe() if mine else "another apply"
            raise PolicyError(
                f"a retention apply of {self.run} started at the same moment by {other}: "
                "this one stopped before touching anything"
            )
        self._task = asyncio.create_task(self._refresh())
        return self

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(LOCK_REFRESH_S)
            try:
                await self.store.put_bytes(self.key, self._body())
            except Exception:  # noqa: BLE001,S112 - a missed heartbeat is retried; staleness takes 10 min
                continue

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            held = await read_lock_key(self.store, self.key)
            if held is not None and held.token == self.info.token:
                await self.store.delete_many([self.key])
        except Exception:  # noqa: BLE001,S110 - the lock then goes stale; never mask the apply's own error
            pass


async def read_lock_key(store: ObjectStore, key: str) -> LockInfo | None:
    """The lock stored at ``key``, if any (an unreadable lock counts as none)."""
    info = await store.stat(key)
    return None if info is None else _parse_lock(await store.get_bytes(key))


def opening_run(config: Config, prefs: dict[str, Any]) -> tuple[str, bool]:
    """The run folder a Checkpoints or Retention screen opens on, and whether to list it at once:
    the last run listed with this config, else the config's ``[ui] opening_run`` (the sandbox lab
    writes its demo run there), else the first store's root (typed in, not listed: a bucket root
    is rarely one run)."""
    from backend.ui_prefs import config_key

    last = prefs.get("last_run")
    remembered = last.get(config_key(config)) if isinstance(last, dict) else None
    if isinstance(remembered, str) and remembered:
        return remembered, True
    if config.ui.opening_run:
        return config.ui.opening_run, True
    first = next(iter(config.stores.values()), None)
    return (first.url if first else ""), False


def remembered_runs(config: Config, prefs: dict[str, Any], url: str) -> dict[str, str]:
    """The ``last_run`` preference with ``url`` as this config's last listed run."""
    last = prefs.get("last_run")
    out = {k: v for k, v in last.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(last, dict) else {}
    from backend.ui_prefs import config_key

    out[config_key(config)] = url
    return out


def remember_run(config: Config, url: str) -> None:
    """Remember ``url`` as the run the screens open on next time (best effort: the preference
    file is a convenience, and an unwritable one must not fail a listing)."""
    from backend.errors import ConfigError
    from backend.ui_prefs import load_ui_prefs, update_ui_prefs

    try:
        update_ui_prefs(last_run=remembered_runs(config, load_ui_prefs(), url))
    except ConfigError:
        pass
