"""State backends side by side: the embedded SQLite file and a shared PostgreSQL, in one run.

Both backends run the same loadmaster code in the same run, on the same machine:

* SQLite      -- ``SQLiteState`` on a file in a temp dir (WAL, ``synchronous=NORMAL``, BEGIN
  IMMEDIATE for every transaction, 30 s busy timeout);
* PostgreSQL  -- ``PostgresState`` on a real private cluster this script starts in /tmp
  (``lab.postgres.PrivateCluster``: loopback TCP, SCRAM, ``fsync`` and
  ``synchronous_commit`` on); the password is only in the cluster's 0600 pgpass (``PGPASSFILE``).

What is measured, each on a fresh database per backend:

1. ledger writes: ``EgressGuard.record_transfer`` of ``--writes`` finished transfers (one job id
   each, 10 GB from an AWS us-east-1 store to a CoreWeave site, so every row is priced at its
   tier), one writer; writes/s, p50/p99 per write. Plus, as context, the round trip of one
   ``SELECT 1`` and the same writes on a PostgreSQL database with ``synchronous_commit = off``
   (a diagnostic only: it shows what the commit's WAL flush costs; loadmaster does not set it).
2. reservations under concurrency: ``--procs`` OS processes (multiprocessing, spawn), each with
   its own config and StateDB handle as a console has, opened and used once before a barrier (a
   0-byte reservation, released: a console's connection has served earlier launches and reports,
   so its server backend's caches are warm); released together,
   each makes ``--calls`` ``EgressGuard.reserve()`` calls of one 10 GB Reservation against an
   ``[egress]`` monthly budget with ``action = "block"``. Run twice: a budget all calls fit in,
   and one about half of them fit in (allowed vs refused counted; the reserved $ is checked never
   to exceed the budget). Every run checks that the reserved rows equal the allowed calls.
   Latency is per ``reserve()`` call (lock wait included); throughput is calls over the window
   from the first call to the last. CPU per call: the reservers' own (``process_time`` after the
   barrier) and the PostgreSQL server's (its postmaster, live and reaped children, from /proc),
   and how busy the machine's CPUs were during the window.
3. the audit log: ``--audit-rows`` rows inserted with one ``executemany`` (one transaction; timed),
   then ``audit_entries(limit=1000)``, ``action=`` (a common and a rare action; there is no index on
   ``action``), ``actor_like=`` (a common and a rare prefix; index ``audit_actor``), median of 5
   after one warm-up; on PostgreSQL again after ``ANALYZE audit`` (what autovacuum does to a table
   soon after a bulk load); and ``loadmaster audit`` (the CLI, a fresh process each time: start-up,
   config, connect, query, print) with ``--limit 1``, ``--limit 1000`` and ``--action``. And ``state migrate`` of a SQLite state holding
   that many audit rows into a fresh PostgreSQL database (the rows counted on arrival).

Prints one table per part with the ratio PostgreSQL / SQLite, then one JSON line (also written to
``--json PATH``). Records the date, the load average before and after, and the versions.

    .venv/bin/python bench/state.py                 # 100 reservers x 5 calls, 2,000 writes, 100,000 audit rows
    .venv/bin/python bench/state.py --quick         # smoke run, < 60 s
    .venv/bin/python bench/state.py --json /tmp/state.json
    .venv/bin/python bench/state.py --parts reservations --procs 10   # one part, other sizes
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import queue
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backend.config import Config, parse_config  # noqa: E402
from backend.errors import LoadmasterError, PolicyError  # noqa: E402
from backend.ledger import EgressGuard, Reservation  # noqa: E402
from backend.state import StateDB, open_state  # noqa: E402

GB = 10**9
DEST = "coreweave:us-east-04"
STORE = "datasets"
#: Bytes per transfer and per reservation: priced as internet egress out of AWS us-east-1.
NBYTES = 10 * GB
BACKENDS = ("sqlite", "postgresql")


class BenchError(LoadmasterError):
    """The bench could not run (one line: what to fix)."""


def pct(values: list[float], p: int) -> float:
    """The ``p``-th percentile (inclusive method, as the other benches)."""
    if not values:
        return float("nan")
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int | str) -> list[str]:
    """Fields of /proc/PID/stat after the command name (field 3 on: state, ppid, ...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def server_cpu_s(postmaster: int) -> float:
    """CPU seconds the PostgreSQL server has used: the postmaster, its live children (backends,
    WAL writer, checkpointer) and the children it has reaped (backends of closed connections)."""
    own = _stat_fields(postmaster)
    total = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            f = _stat_fields(entry)
        except OSError:
            continue
        if int(f[1]) == postmaster:
            total += int(f[11]) + int(f[12])
    return total / _TICK


def machine_cpu() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + vals[4]  # idle + iowait
    total = sum(vals[:8])
    return total - idle, total


def busy_pct(before: tuple[int, int], after: tuple[int, int]) -> float:
    busy, total = after[0] - before[0], after[1] - before[1]
    return 100.0 * busy / total if total else float("nan")


def raw_config(state: dict[str, str], budget_usd: float) -> dict[str, Any]:
    """The TOML document a console of this bench reads (as a dict): one node at a CoreWeave site,
    one priced AWS store, an [egress] monthly budget that blocks."""
    return {
        "nodes": [{"name": "gpu-01", "transport": "local", "site": DEST}],
        "stores": {STORE: {"url": "s3://datasets/laion", "provider": "aws", "region": "us-east-1"}},
        "egress": {"monthly_budget_usd": budget_usd, "action": "block"},
        "state": state,
    }


def config_of(state: dict[str, str], budget_usd: float) -> Config:
    return parse_config(raw_config(state, budget_usd), file="bench-state.toml", base=Path.cwd())


def toml_of(raw: dict[str, Any]) -> str:
    """``raw`` (this bench's shape only) as TOML, for the CLI runs."""
    node = raw["nodes"][0]
    store = raw["stores"][STORE]
    lines = [
        "[[nodes]]",
        *(f"{k} = {json.dumps(v)}" for k, v in node.items()),
        f"[stores.{STORE}]",
        *(f"{k} = {json.dumps(v)}" for k, v in store.items()),
        "[egress]",
        *(f"{k} = {json.dumps(v)}" for k, v in raw["egress"].items()),
        "[state]",
        *(f"{k} = {json.dumps(v)}" for k, v in raw["state"].items()),
    ]
    return "\n".join(lines) + "\n"


class Backends:
    """Fresh databases on both backends: SQLite files under ``work``, PostgreSQL databases on one
    private cluster started in ``work/pg``."""

    def __init__(self, work: Path) -> None:
        from lab.postgres import PrivateCluster

        self.work = work
        self.cluster = PrivateCluster(work / "pg")
        self.n = 0

    def start(self) -> None:
        self.cluster.start()
        # libpq reads the password from here, in this process and in every child and CLI run.
        os.environ.update(self.cluster.env())

    def stop(self) -> None:
        self.cluster.stop(mode="fast")

    def fresh(self, backend: str, name: str, *, synchronous_commit: bool = True) -> dict[str, str]:
        """The ``[state]`` table of a new, empty database on ``backend``."""
        self.n += 1
        if backend == "sqlite":
            return {"dir": str(self.work / "sqlite" / f"{self.n:02d}-{name}")}
        db = f"bench_{self.n:02d}_{name}"
        url = self.cluster.create_database(db)
        if not synchronous_commit:
            from psycopg import sql

            with self.cluster.connect() as conn:
                conn.execute(sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(sql.Identifier(db)))
        return {"url": url}

    def postmaster(self) -> int:
        pid = self.cluster.pid()
        if pid is None:
            raise BenchError(f"no postmaster.pid in {self.cluster.data_dir}: the cluster is not running")
        return pid

    def server_version(self) -> str:
        with self.cluster.connect() as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


def count_statements(db: StateDB, fn: Any) -> int:
    """How many statements ``fn()`` sends through ``db`` (BEGIN and COMMIT not counted)."""
    counted = [0]
    run = db._run

    def counting(sql: str, params: Any) -> Any:
        counted[0] += 1
        return run(sql, params)

    db._run = counting  # type: ignore[method-assign]
    try:
        fn()
    finally:
        db._run = run  # type: ignore[method-assign]
    return counted[0]


# -- 1. ledger writes ------------------------------------------------------------------------------


def bench_writes(state: dict[str, str], n: int, rtt_n: int, postmaster: int | None) -> dict[str, float]:
    """``n`` record_transfer calls by one writer; and ``rtt_n`` round trips of SELECT 1. With
    ``postmaster``, the server's CPU during the writes too."""
    config = config_of(state, 1e12)
    db = open_state(config)
    try:
        guard = EgressGuard(config, db)
        store = config.stores[STORE]
        for _ in range(min(rtt_n, 50)):  # warm-up: connection, statement caches
            db.query("SELECT 1 AS ok")
        rtt = []
        for _ in range(rtt_n):
            t = time.perf_counter()
            db.query("SELECT 1 AS ok")
            rtt.append(time.perf_counter() - t)
        statements = count_statements(db, lambda: guard.record_transfer(store, DEST, NBYTES, job_id="warm-up"))
        lat = []
        srv0 = server_cpu_s(postmaster) if postmaster else 0.0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for i in range(n):
            t = time.perf_counter()
            guard.record_transfer(store, DEST, NBYTES, job_id=f"write-{i:06d}")
            lat.append(time.perf_counter() - t)
        wall = time.perf_counter() - t0
        client_cpu = time.process_time() - cpu0
        server_cpu = server_cpu_s(postmaster) - srv0 if postmaster else 0.0
        rows = db.query("SELECT COUNT(*) AS n FROM egress_ledger WHERE state = 'settled'")
        if int(rows[0]["n"]) != n + 1:
            raise BenchError(f"expected {n + 1} settled ledger rows, found {rows[0]['n']}")
    finally:
        db.close()
    return {
        "writes": float(n),
        "wall_s": wall,
        "writes_per_s": n / wall,
        "p50_ms": 1000 * pct(lat, 50),
        "p99_ms": 1000 * pct(lat, 99),
        "statements_per_write": float(statements),
        "client_cpu_ms_per_write": 1000 * client_cpu / n,
        "server_cpu_ms_per_write": 1000 * server_cpu / n,
        "rtt_p50_us": 1e6 * pct(rtt, 50),
        "rtt_p99_us": 1e6 * pct(rtt, 99),
    }


# -- 2. concurrent reservations --------------------------------------------------------------------


def reserver(
    index: int, state: dict[str, str], budget: float, calls: int, barrier: Any, results: Any, done: Any
) -> None:
    """One console: its own config and StateDB handle, opened before the barrier; then ``calls``
    reserve() calls of one Reservation each. Puts one result dict on ``results``, then keeps its
    connection until ``done`` is set (the server's CPU is read before the backends exit)."""
    out: dict[str, Any] = {"index": index, "allowed": [], "refused": [], "errors": []}
    db: StateDB | None = None
    try:
        config = config_of(state, budget)
        db = open_state(config)
        guard = EgressGuard(config, db)
        store = config.stores[STORE]
        # A console's connection is open and has been used before this launch (the egress report,
        # an earlier launch): one reservation of 0 bytes, released, warms the same statements on
        # this connection and in its server backend. A released row does not count.
        guard.reserve(store, [Reservation(f"warm-{index:03d}", DEST, 0)])
        guard.release(f"warm-{index:03d}", "bench warm-up")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which stops the run
        barrier.abort()
        out["errors"].append(f"setup: {exc}")
        results.put(out)
        if db is not None:
            db.close()
        return
    try:
        barrier.wait()
        out["start"] = time.monotonic()
        cpu0 = time.process_time()
        for k in range(calls):
            item = Reservation(f"r{index:03d}-{k:03d}", DEST, NBYTES)
            t = time.perf_counter()
            try:
                guard.reserve(store, [item])
            except PolicyError:
                out["refused"].append(time.perf_counter() - t)
            except LoadmasterError as exc:  # a StateError: the lock waited too long, the server went away
                out["errors"].append(str(exc))
            else:
                out["allowed"].append(time.perf_counter() - t)
        out["end"] = time.monotonic()
        out["cpu_s"] = time.process_time() - cpu0
    except BaseException as exc:  # noqa: BLE001
        out["errors"].append(f"{type(exc).__name__}: {exc}")
    results.put(out)
    done.wait(timeout=900)
    db.close()


def bench_reservations(
    state: dict[str, str], budget: float, procs: int, calls: int, postmaster: int | None
) -> dict[str, Any]:
    """``procs`` spawned reservers behind a barrier against one database; what they got, checked
    against what the ledger holds."""
    config = config_of(state, budget)
    db = open_state(config)  # creates the schema before the consoles open it
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    done = ctx.Event()
    children = [
        ctx.Process(target=reserver, args=(i, state, budget, calls, barrier, results, done), daemon=True)
        for i in range(procs)
    ]
    t_spawn = time.perf_counter()
    for c in children:
        c.start()
    try:
        barrier.wait(timeout=900)
    except threading.BrokenBarrierError:
        first = "a reserver did not reach the barrier within 900 s"
        with contextlib.suppress(queue.Empty):
            while True:
                o = results.get(timeout=5)
                if o["errors"]:
                    first = o["errors"][0]
                    break
        done.set()
        for c in children:
            c.kill()
        db.close()
        raise BenchError(f"reservers could not start: {first}") from None
    spawn_s = time.perf_counter() - t_spawn
    srv0 = server_cpu_s(postmaster) if postmaster else 0.0
    mach0 = machine_cpu()
    outs = [results.get(timeout=900) for _ in children]
    mach1 = machine_cpu()
    server_cpu = server_cpu_s(postmaster) - srv0 if postmaster else 0.0
    done.set()
    for c in children:
        c.join(timeout=60)
    allowed = [x for o in outs for x in o["allowed"]]
    refused = [x for o in outs for x in o["refused"]]
    errors = [e for o in outs for e in o["errors"]]
    every = allowed + refused
    if not any("end" in o for o in outs):
        raise BenchError(f"no reserver finished: {errors[0] if errors else 'no result'}")
    window = max(o["end"] for o in outs if "end" in o) - min(o["start"] for o in outs if "start" in o)
    rows = db.query(
        "SELECT COUNT(*) AS n, COUNT(DISTINCT job_id) AS jobs, COALESCE(SUM(usd), 0) AS usd"
        " FROM egress_ledger WHERE state = 'reserved'"
    )
    db.close()
    n_rows, jobs, usd = int(rows[0]["n"]), int(rows[0]["jobs"]), float(rows[0]["usd"])
    return {
        "procs": procs,
        "calls": procs * calls,
        "budget_usd": budget,
        "allowed": len(allowed),
        "refused": len(refused),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "spawn_s": spawn_s,
        "window_s": window,
        "calls_per_s": len(every) / window if window > 0 else float("nan"),
        "p50_ms": 1000 * pct(every, 50),
        "p99_ms": 1000 * pct(every, 99),
        "max_ms": 1000 * max(every) if every else float("nan"),
        "allowed_p50_ms": 1000 * pct(allowed, 50),
        "refused_p50_ms": 1000 * pct(refused, 50),
        "client_cpu_ms_per_call": 1000 * sum(o.get("cpu_s", 0.0) for o in outs) / max(1, len(every)),
        "server_cpu_ms_per_call": 1000 * server_cpu / max(1, len(every)),
        "machine_busy_pct": busy_pct(mach0, mach1),
        "reserved_rows": n_rows,
        "reserved_jobs": jobs,
        "reserved_usd": usd,
        "rows_equal_allowed": n_rows == len(allowed) == jobs,
        "within_budget": usd <= budget + 1e-9,
    }


# -- 3. the audit log ------------------------------------------------------------------------------

USERS = [f"user{i:02d}" for i in range(18)] + ["alice", "zed"]
ACTIONS = ("pull.start", "retention.apply", "egress.override", "ckpt.upload")


def audit_rows(n: int) -> list[tuple[Any, ...]]:
    """``n`` audit rows: 20 actors (``alice@`` ~5%, ``zed@`` 0.1%), four common actions and a rare
    one (``state.repair``, 0.1%), oldest first."""
    rows = []
    t0 = time.time() - n
    for i in range(n):
        user = "zed" if i % 1000 == 500 else USERS[i % 19]
        action = "state.repair" if i % 1000 == 7 else ACTIONS[i % 4]
        rows.append(
            (
                t0 + i,
                f"{user}@console-{i % 3}",
                action,
                f"s3://runs/run-{i % 97}/step-{i}",
                "done",
                f"{i:064x}" if action == "retention.apply" else None,
                "approved by kim" if action == "egress.override" else None,
                json.dumps({"bytes": i * 4096, "objects": i % 500, "node": f"gpu-{i % 64:02d}"}, sort_keys=True),
            )
        )
    return rows


def timed(fn: Any, reps: int = 5) -> tuple[float, int]:
    """Median seconds of ``fn()`` over ``reps`` after one warm-up, and how many rows it returned."""
    got = fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), len(got)


def bench_audit(state: dict[str, str], n: int, work: Path, cli_reps: int) -> dict[str, Any]:
    config = config_of(state, 1e12)
    db = open_state(config)
    out: dict[str, Any] = {"rows": n}
    try:
        rows = audit_rows(n)
        t = time.perf_counter()
        db.executemany(
            "INSERT INTO audit (ts, actor, action, target, outcome, plan_hash, reason, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        out["insert_s"] = time.perf_counter() - t
        got = int(db.query("SELECT COUNT(*) AS n FROM audit")[0]["n"])
        if got != n:
            raise BenchError(f"expected {n} audit rows, found {got}")
        queries = {
            "limit=1000": lambda: db.audit_entries(limit=1000),
            "action=pull.start": lambda: db.audit_entries(limit=1000, action="pull.start"),
            "action=state.repair (0.1%)": lambda: db.audit_entries(limit=1000, action="state.repair"),
            "actor_like=alice@ (5%)": lambda: db.audit_entries(limit=1000, actor_like="alice@"),
            "actor_like=zed@ (0.1%)": lambda: db.audit_entries(limit=1000, actor_like="zed@"),
        }
        for name, fn in queries.items():
            s, k = timed(fn)
            out[name] = {"ms": 1000 * s, "rows": k}
        if db.dialect == "postgresql":
            # Just loaded, the table has no statistics yet and the planner may scan it whole;
            # autovacuum analyzes it within a minute or so. Timed again after ANALYZE (the steady
            # state of a table that grows slowly). SQLite keeps no statistics unless told to, and
            # loadmaster never tells it: its figures above are its steady state.
            db.execute("ANALYZE audit")
            for name, fn in queries.items():
                s, k = timed(fn)
                out[name]["analyzed_ms"] = 1000 * s
    finally:
        db.close()
    # The CLI: `loadmaster audit`, a fresh process each run, as an operator types it.
    cfg = work / f"cli-{'pg' if 'url' in state else 'sqlite'}.toml"
    cfg.write_text(toml_of(raw_config(state, 1e12)))
    env = {**os.environ, "LOADMASTER_CONFIG": str(cfg)}
    exe = Path(sys.executable).with_name("loadmaster")
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "tui.entry"]
    for name, args in {
        "cli audit --limit 1": ["--limit", "1"],
        "cli audit --limit 1000": ["--limit", "1000"],
        "cli audit --limit 1000 --action pull.start": ["--limit", "1000", "--action", "pull.start"],
    }.items():
        times = []
        for _ in range(cli_reps):
            t = time.perf_counter()
            proc = subprocess.run(
                [*base, "audit", *args], env=env, cwd=work, capture_output=True, text=True, check=False
            )
            times.append(time.perf_counter() - t)
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["?"])[-1]
                raise BenchError(f"loadmaster audit {' '.join(args)} exited {proc.returncode}: {err}")
        out[name] = {"ms": 1000 * statistics.median(times), "rows": len(proc.stdout.splitlines())}
    return out


# -- the run ---------------------------------------------------------------------------------------

PARTS = ("writes", "reservations", "audit")


def ratio(pg: float, lite: float) -> str:
    return f"{pg / lite:.2f}x" if lite else "-"


def run_writes(backends: Backends, writes: int, rtt_n: int) -> dict[str, Any]:
    pm = backends.postmaster()
    w = {
        "sqlite": bench_writes(backends.fresh("sqlite", "writes"), writes, rtt_n, None),
        "postgresql": bench_writes(backends.fresh("postgresql", "writes"), writes, rtt_n, pm),
        "postgresql_sync_off": bench_writes(
            backends.fresh("postgresql", "writes_nosync", synchronous_commit=False), writes, rtt_n, pm
        ),
    }
    s, p, d = w["sqlite"], w["postgresql"], w["postgresql_sync_off"]
    print(f"\n1. ledger writes: EgressGuard.record_transfer x {writes}, one writer, 10 GB each, priced\n")
    print("| | SQLite | PostgreSQL | PostgreSQL / SQLite | PostgreSQL, synchronous_commit=off (diagnostic) |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| writes/s | {s['writes_per_s']:.0f} | {p['writes_per_s']:.0f} | "
        f"{ratio(p['writes_per_s'], s['writes_per_s'])} | {d['writes_per_s']:.0f} |"
    )
    for key, label, f in (
        ("p50_ms", "p50 ms per write", ".2f"),
        ("p99_ms", "p99 ms per write", ".2f"),
        ("client_cpu_ms_per_write", "loadmaster CPU ms per write", ".2f"),
        ("server_cpu_ms_per_write", "server CPU ms per write", ".2f"),
    ):
        print(f"| {label} | {s[key]:{f}} | {p[key]:{f}} | {ratio(p[key], s[key])} | {d[key]:{f}} |")
    print(
        f"| statements per write (+ BEGIN, COMMIT) | {s['statements_per_write']:.0f} | "
        f"{p['statements_per_write']:.0f} | | {d['statements_per_write']:.0f} |"
    )
    print(
        f"| SELECT 1 round trip p50 (p99) us | {s['rtt_p50_us']:.0f} ({s['rtt_p99_us']:.0f}) | "
        f"{p['rtt_p50_us']:.0f} ({p['rtt_p99_us']:.0f}) | {ratio(p['rtt_p50_us'], s['rtt_p50_us'])} | "
        f"{d['rtt_p50_us']:.0f} ({d['rtt_p99_us']:.0f}) |",
        flush=True,
    )
    return w


def run_reservations(backends: Backends, procs: int, calls: int) -> dict[str, Any]:
    probe_cfg = config_of(backends.fresh("sqlite", "probe"), 1e12)
    probe_db = open_state(probe_cfg)
    probe = EgressGuard(probe_cfg, probe_db)
    whole = probe.quote_transfer(probe_cfg.stores[STORE], DEST, procs * calls * NBYTES)
    statements = count_statements(
        probe_db, lambda: probe.reserve(probe_cfg.stores[STORE], [Reservation("probe", DEST, NBYTES)])
    )
    probe_db.close()
    all_usd = float(whole.usd or 0.0)
    # A budget of $0 is avoided: decide() divides by the budget when the quote is $0 (free tier).
    budgets = {"fits": max(1e6, 10 * all_usd), "half": max(0.01, round(all_usd / 2, 2))}
    pm = backends.postmaster()
    r: dict[str, Any] = {"statements_per_call": statements}
    for label, budget in budgets.items():
        for b in BACKENDS:
            state = backends.fresh(b, f"reserve_{label}")
            r[f"{b}/{label}"] = bench_reservations(state, budget, procs, calls, pm if b == "postgresql" else None)
    print(
        f"\n2. reservations: {procs} processes x {calls} reserve() calls of 10 GB, released together "
        f"(all {procs * calls} would cost ${all_usd:,.2f}; {statements} statements + BEGIN, COMMIT per call)\n"
    )
    print(
        "| backend, budget | allowed / refused / errors | p50 ms | p99 ms | max ms | calls/s | "
        "CPU ms per call: loadmaster + server | machine CPU busy | "
        "reserved rows (= allowed) | reserved $ <= budget $ | spawn s |"
    )
    print("|---|---|---:|---:|---:|---:|---|---:|---|---|---:|")
    for label, budget in budgets.items():
        for b in BACKENDS:
            x = r[f"{b}/{label}"]
            print(
                f"| {b}, ${budget:,.2f} | {x['allowed']} / {x['refused']} / {x['errors']} | {x['p50_ms']:.1f} | "
                f"{x['p99_ms']:.1f} | {x['max_ms']:.1f} | {x['calls_per_s']:.0f} | "
                f"{x['client_cpu_ms_per_call']:.1f} + {x['server_cpu_ms_per_call']:.1f} | "
                f"{x['machine_busy_pct']:.0f}% | "
                f"{x['reserved_rows']} ({'yes' if x['rows_equal_allowed'] else 'NO'}) | "
                f"${x['reserved_usd']:,.2f} <= ${budget:,.2f} ({'yes' if x['within_budget'] else 'NO'}) | "
                f"{x['spawn_s']:.1f} |"
            )
    for label in budgets:
        s, p = r[f"sqlite/{label}"], r[f"postgresql/{label}"]
        print(
            f"PostgreSQL / SQLite, budget {label}: p50 {ratio(p['p50_ms'], s['p50_ms'])}, "
            f"p99 {ratio(p['p99_ms'], s['p99_ms'])}, throughput {ratio(p['calls_per_s'], s['calls_per_s'])}"
        )
    for x in r.values():
        if isinstance(x, dict) and x["first_error"]:
            print(f"first error: {x['first_error']}")
    sys.stdout.flush()
    return r


def bench_migrate(backends: Backends, n: int) -> dict[str, float]:
    """``state migrate`` of a SQLite state holding ``n`` audit rows into a fresh PostgreSQL
    database (the copy's own seconds and with connecting), the rows counted on arrival."""
    from backend.state.copy import migrate_state
    from backend.state.postgres import PostgresState

    config = config_of(backends.fresh("sqlite", "migrate"), 1e12)
    db = open_state(config)
    try:
        db.executemany(
            "INSERT INTO audit (ts, actor, action, target, outcome, plan_hash, reason, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            audit_rows(n),
        )
    finally:
        db.close()
    url = backends.fresh("postgresql", "migrate")["url"]
    t = time.perf_counter()
    report = migrate_state(config.state_dir() / "state.sqlite3", url)
    wall = time.perf_counter() - t
    target = PostgresState(url)
    try:
        got = target.counts(["audit"])["audit"]
    finally:
        target.close()
    if got != n:
        raise BenchError(f"state migrate copied {got} audit rows of {n}")
    return {"rows": n, "copy_s": report.seconds, "wall_s": wall}


def run_audit(backends: Backends, n_audit: int, work: Path, cli_reps: int) -> dict[str, Any]:
    a: dict[str, Any] = {b: bench_audit(backends.fresh(b, "audit"), n_audit, work, cli_reps) for b in BACKENDS}
    m = a["migrate"] = bench_migrate(backends, n_audit)
    print(
        f"\n`state migrate` of {n_audit:,} audit rows, SQLite -> PostgreSQL: {m['copy_s']:.2f} s copying, "
        f"{m['wall_s']:.2f} s with connecting"
    )
    print(f"\n3. audit log over {n_audit:,} entries (median of 5 after a warm-up; CLI: median of {cli_reps})\n")
    print(
        "| | SQLite ms (rows) | PostgreSQL ms (rows), just loaded | PostgreSQL ms after ANALYZE | "
        "PostgreSQL / SQLite (after ANALYZE) |"
    )
    print("|---|---:|---:|---:|---:|")
    sa, pa = a["sqlite"], a["postgresql"]
    print(
        f"| insert {n_audit:,} rows (executemany, one transaction) | {1000 * sa['insert_s']:.0f} | "
        f"{1000 * pa['insert_s']:.0f} | | {ratio(pa['insert_s'], sa['insert_s'])} |"
    )
    for key in (k for k in sa if isinstance(sa[k], dict)):
        name = key if key.startswith("cli ") else f"audit_entries({key})"
        analyzed = pa[key].get("analyzed_ms")
        after = f"{analyzed:.1f}" if analyzed is not None else "(the CLI runs after it)"
        print(
            f"| {name} | {sa[key]['ms']:.1f} ({sa[key]['rows']}) | {pa[key]['ms']:.1f} ({pa[key]['rows']}) | "
            f"{after} | {ratio(analyzed if analyzed is not None else pa[key]['ms'], sa[key]['ms'])} |"
        )
    sys.stdout.flush()
    return a


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run (< 60 s)")
    ap.add_argument("--writes", type=int, help="ledger writes per backend (2000; quick 100)")
    ap.add_argument("--procs", type=int, help="concurrent reserver processes (100; quick 20)")
    ap.add_argument("--calls", type=int, help="reserve() calls per process (5; quick 2)")
    ap.add_argument("--audit-rows", type=int, help="audit rows (100000; quick 5000)")
    ap.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated parts to run (default {','.join(PARTS)})"
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON here")
    args = ap.parse_args()
    q = args.quick
    writes = args.writes or (100 if q else 2000)
    procs = args.procs or (20 if q else 100)
    calls = args.calls or (2 if q else 5)
    n_audit = args.audit_rows or (5000 if q else 100_000)
    rtt_n = 200 if q else 2000
    cli_reps = 1 if q else 3
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        ap.error(f"unknown part {unknown[0]!r} (parts: {', '.join(PARTS)})")
    if min(writes, procs, calls, n_audit) < 1:
        ap.error("sizes must be at least 1")

    started = datetime.now()
    load_before = os.getloadavg()
    t_all = time.perf_counter()
    # A dir under /tmp that the postgres user can pass through (the cluster runs as postgres under root).
    work = Path(tempfile.mkdtemp(prefix="lm-bench-state-", dir="/tmp"))
    os.chmod(work, 0o755)
    # Never read or write the operator's real config, prefs or state.
    os.environ["LOADMASTER_CONFIG_DIR"] = str(work / "cfg")
    os.environ["LOADMASTER_DATA_DIR"] = str(work / "data")
    os.environ.pop("LOADMASTER_CONFIG", None)
    backends = Backends(work)
    result: dict[str, Any] = {}
    try:
        backends.start()
        result["meta"] = {
            "date": started.strftime("%Y-%m-%d"),
            "time": started.strftime("%H:%M"),
            "load_before": [round(x, 2) for x in load_before],
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "postgresql": backends.server_version(),
            "sizes": {"writes": writes, "procs": procs, "calls": calls, "audit_rows": n_audit},
            "parts": parts,
        }
        print(
            f"{started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, load {load_before[0]:.2f} {load_before[1]:.2f} "
            f"{load_before[2]:.2f}; Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
            f"PostgreSQL {result['meta']['postgresql']} (private cluster on 127.0.0.1)",
            flush=True,
        )
        if "writes" in parts:
            result["writes"] = run_writes(backends, writes, rtt_n)
        if "reservations" in parts:
            result["reservations"] = run_reservations(backends, procs, calls)
        if "audit" in parts:
            result["audit"] = run_audit(backends, n_audit, work, cli_reps)
    except LoadmasterError as exc:
        print(f"bench/state.py: {exc}", file=sys.stderr)
        return 1
    finally:
        try:
            backends.stop()
        except LoadmasterError as exc:
            print(f"bench/state.py: {exc}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    load_after = os.getloadavg()
    result["meta"]["load_after"] = [round(x, 2) for x in load_after]
    result["meta"]["wall_s"] = round(time.perf_counter() - t_all, 1)
    print(
        f"\nload average at the end: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f} on "
        f"{os.cpu_count()} CPUs; whole run {result['meta']['wall_s']:.0f} s"
    )
    line = json.dumps(result, sort_keys=True, default=str)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    ok = all(
        x["rows_equal_allowed"] and x["within_budget"] and not x["errors"]
        for x in result.get("reservations", {}).values()
        if isinstance(x, dict)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
