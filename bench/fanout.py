"""Fan-out benchmark: loadmaster's NodePool against ``pdsh -R ssh`` on the same lab, same run.

Starts its own lab of real sshd nodes (default 16) on loopback, then for several rounds runs
``true`` on every node, alternating which tool goes first:

* loadmaster cold: a fresh NodePool (every handshake included) -> fanout -> results in hand;
* loadmaster warm: the same pool again (connections and per-connection command servers reused);
* loadmaster warm, channels: a pool with ``command_server=False`` (a new SSH channel, hence a
  new login shell, per command: what reusing connections alone buys);
* pdsh: ``pdsh -R ssh -f 32`` with the lab's key, known_hosts and port (a new ssh per node).

Prints a markdown table and the median ratios. Root's ~/.bashrc on the lab machine runs
``pyenv init`` for every non-interactive ssh command (sshd starts bash, which sources it), so
every remote ``true`` costs the same shell start-up for both tools.

Usage: .venv/bin/python bench/fanout.py [--nodes 16] [--rounds 5] [--handshakes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backend.nodes.pool import NodePool  # noqa: E402
from backend.nodes.transport import Transport  # noqa: E402
from lab import Lab, LabNodeOptions  # noqa: E402


async def true_on(t: Transport) -> int | None:
    return (await t.run("true", check=True)).exit_status


async def loadmaster_round(lab: Lab, handshakes: int, server: bool = True) -> tuple[float, float, float]:
    """(cold seconds, warm seconds, close seconds) for one fresh pool."""
    pool = NodePool(lab.config.nodes, max_handshakes=handshakes, command_server=server)
    try:
        t0 = time.perf_counter()
        cold = await pool.fanout(true_on)
        t1 = time.perf_counter()
        warm = await pool.fanout(true_on)
        t2 = time.perf_counter()
    finally:
        t3 = time.perf_counter()
        await pool.close()
        t4 = time.perf_counter()
    bad = {k: v for k, v in {**cold, **warm}.items() if v != 0}
    if bad:
        raise SystemExit(f"loadmaster fan-out failed: {bad}")
    return t1 - t0, t2 - t1, t4 - t3


async def pdsh_round(lab: Lab, pdsh: str) -> float:
    ips = ",".join(n.ip for n in lab.nodes)
    env = {
        **os.environ,
        "PDSH_SSH_ARGS_APPEND": (
            f"-i {lab.user_key} -o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
            f"-o BatchMode=yes -o IdentitiesOnly=yes -p {lab.port}"
        ),
    }
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        pdsh,
        "-S",
        "-R",
        "ssh",
        "-f",
        "32",
        "-l",
        "root",
        "-w",
        ips,
        "true",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    elapsed = time.perf_counter() - t0
    # -S: exit with the largest remote status. stderr may carry pyenv rehash races (noise).
    if proc.returncode != 0:
        raise SystemExit(f"pdsh failed ({proc.returncode}): {err.decode()[-500:]}")
    return elapsed


async def bench(lab: Lab, rounds: int, handshakes: int, pdsh: str) -> list[tuple[float, ...]]:
    rows = []
    # One untimed warm-up of each, so first-use effects (page cache, sshd start-up) hit neither.
    await loadmaster_round(lab, handshakes)
    await pdsh_round(lab, pdsh)
    for i in range(rounds):
        if i % 2 == 0:
            cold, warm, close = await loadmaster_round(lab, handshakes)
            p = await pdsh_round(lab, pdsh)
            ccold, cwarm, _ = await loadmaster_round(lab, handshakes, server=False)
        else:
            ccold, cwarm, _ = await loadmaster_round(lab, handshakes, server=False)
            p = await pdsh_round(lab, pdsh)
            cold, warm, close = await loadmaster_round(lab, handshakes)
        rows.append((cold, warm, close, p, ccold, cwarm))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--handshakes", type=int, default=10, help="NodePool max concurrent handshakes")
    args = ap.parse_args()
    pdsh = shutil.which("pdsh")
    if not pdsh:
        print("pdsh is not installed (apt-get install pdsh)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="lm-bench-fanout-"))
    opts = {f"node-{i:02d}": LabNodeOptions(nvidia_smi=False) for i in range(1, args.nodes + 1)}
    lab = Lab(root, nodes=args.nodes, with_s3=False, options=opts).up()
    try:
        rows = asyncio.run(bench(lab, args.rounds, args.handshakes, pdsh))
    finally:
        lab.down()
        shutil.rmtree(root, ignore_errors=True)
    print(f"## Fan-out of `true` to {args.nodes} sshd nodes: loadmaster NodePool vs `pdsh -R ssh`\n")
    print(
        f"{os.cpu_count()} CPUs; NodePool max_handshakes={args.handshakes}; pdsh -f 32. "
        "Times in ms; ratio = loadmaster / pdsh (lower is better).\n"
    )
    print(
        "| round | loadmaster cold | loadmaster warm | pdsh | cold / pdsh | warm / pdsh | cold / warm "
        "| channels: cold / warm |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for i, (cold, warm, _close, p, ccold, cwarm) in enumerate(rows, 1):
        print(
            f"| {i} | {cold * 1000:.0f} | {warm * 1000:.0f} | {p * 1000:.0f} | {cold / p:.2f} | "
            f"{warm / p:.3f} | {cold / warm:.0f}x | {ccold * 1000:.0f} / {cwarm * 1000:.0f} ms |"
        )
    cold, warm, close, p, ccold, cwarm = (statistics.median(c) for c in zip(*rows, strict=True))
    print(
        f"| **median** | **{cold * 1000:.0f}** | **{warm * 1000:.0f}** | **{p * 1000:.0f}** | "
        f"**{cold / p:.2f}** | **{warm / p:.3f}** | **{cold / warm:.0f}x** | "
        f"**{ccold * 1000:.0f} / {cwarm * 1000:.0f} ms** |"
    )
    print(
        f"\nloadmaster cold = new pool: handshakes + command server start + `true`; warm = same pool again. "
        f"channels = a pool with command_server=False (reused connections, one channel and login shell "
        f"per command). Pool close (not timed above): median {close * 1000:.0f} ms. Root's ~/.bashrc runs "
        f"`pyenv init` for every login shell sshd starts: pdsh and the channel mode pay it per command, "
        f"the command server once per connection."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
