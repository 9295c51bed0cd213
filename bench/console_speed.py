"""How instant the console feels: ``ckpt list``, ``retention plan`` and a screen switch, each as a
ratio against a trivial ``loadmaster --version`` (process start + imports), on the same machine at
the same moment, so a loaded machine inflates both sides alike.

The run is small and real: 12 DCP checkpoints of a tiny model (torch writes them before timing
starts), in a local directory, with a local-only config. Each command runs in a fresh process, as
an operator runs it; rounds alternate the commands. A command that imports torch says so (the
listing and the plan must not: torch's import alone is seconds).

The screen switch is measured in one console (Textual's headless driver): switching through
every screen (Transfers .. Alerts, then Fleet), each switch timed until the screen has painted,
first visits apart from returns to a screen already built. A first visit is measured twice: in a
console that builds each screen on its first visit (``prebuild=False``), and in one that built
them ahead of time, in idle time after its first paint (``prebuild=True``, as ``loadmaster
console`` runs; timing starts once every screen is built). Each switch is
timed twice: wall seconds, and the CPU seconds the console's process spent on it, which is what
the switch takes on an idle machine (on a loaded one the wall time also counts the waits for a
CPU: the ratio to ``--version`` evens that out only in part).

Usage: .venv/bin/python bench/console_speed.py [--rounds 5] [--steps 12]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's loadmaster, also for the screen switches
PROBE = (
    "import sys, time; t = time.perf_counter(); from tui.cli import main; rc = main(sys.argv[1:]); "
    "print('BENCH torch', 'torch' in sys.modules, file=sys.stderr); sys.exit(rc)"
)


def make_run(root: Path, steps: int) -> None:
    """``steps`` real DCP saves (model + AdamW state) of a tiny model under ``root``."""
    import torch
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 16))
    opt = torch.optim.AdamW(model.parameters())
    for i in range(1, steps + 1):
        model(torch.randn(4, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(
                {"model": model.state_dict(), "optim": opt.state_dict()}, checkpoint_id=str(root / f"step-{i * 1000}")
            )


def timed(argv: list[str]) -> tuple[float, bool]:
    """Wall seconds of one command in a fresh process, and whether it imported torch."""
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {out.stderr.strip()[-400:]}")
    return took, "BENCH torch True" in out.stderr


#: The screens a round visits, in order; Fleet (the first screen) last.
MODES = ("transfers", "checkpoints", "retention", "egress", "shards", "alerts", "fleet")


async def screen_switches(cfg: Path, run: Path, rounds: int, *, prebuild: bool) -> dict[str, list[float]]:
    """Seconds per switch, wall and CPU: first visits, then returns to a screen already built
    (``prebuild``: after the console built every screen ahead of time)."""
    os.environ["LOADMASTER_CONFIG_DIR"] = str(cfg.parent / "prefs")
    from backend.config import load_config
    from backend.retention.runs import remember_run
    from backend.services import Services
    from tui.app import LoadmasterApp

    config = load_config(str(cfg))
    remember_run(config, str(run))  # Checkpoints and Retention open on the run and list it
    services = Services(config)
    app = LoadmasterApp(services, mode="fleet", prebuild=prebuild)
    out: dict[str, list[float]] = {"first": [], "again": [], "first cpu": [], "again cpu": []}
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        for _ in range(600 if prebuild else 0):  # the console builds the other screens in idle time
            if len(app.built_ahead) == len(MODES) - 1:
                break
            await asyncio.sleep(0.1)
        else:
            if prebuild:
                raise SystemExit(f"the console built {app.built_ahead} ahead in 60 s, not every screen")
        await pilot.pause()
        for r in range(rounds):
            for mode in MODES:
                t, c = time.perf_counter(), time.process_time()
                app.switch_mode(mode)
                await pilot.pause()  # composed, mounted and painted
                kind = "first" if r == 0 and mode != "fleet" else "again"
                out[kind].append(time.perf_counter() - t)
                out[f"{kind} cpu"].append(time.process_time() - c)
                await app.workers.wait_for_complete()  # a listing is not part of the switch
                await pilot.pause()
    services.db.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="lm-speed-"))
    run = tmp / "run1"
    make_run(run, args.steps)
    cfg = tmp / "loadmaster.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{tmp / "state"}"\n')
    commands = {
        "loadmaster --version": ["--version"],
        "ckpt list": ["--config", str(cfg), "ckpt", "list", str(run)],
        "retention plan": ["--config", str(cfg), "retention", "plan", str(run)],
    }
    times: dict[str, list[float]] = {k: [] for k in commands}
    torch_seen: dict[str, bool] = dict.fromkeys(commands, False)
    timed(commands["loadmaster --version"])  # warm the file cache once
    for _ in range(args.rounds):
        for name, argv in commands.items():
            took, imported = timed(argv)
            times[name].append(took)
            torch_seen[name] |= imported
    switches = asyncio.run(screen_switches(cfg, run, args.rounds, prebuild=False))
    ahead = asyncio.run(screen_switches(cfg, run, args.rounds, prebuild=True))
    base = statistics.median(times["loadmaster --version"])
    load = os.getloadavg()
    print(f"{args.steps}-step DCP run, {args.rounds} rounds, {os.cpu_count()} CPUs, load {load[0]:.1f} {load[1]:.1f}")
    print()
    print("| what | median | ratio to --version | imports torch |")
    print("| :- | -: | -: | :- |")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| {name} | {med:.2f} s | {med / base:.2f}x | {'yes' if torch_seen[name] else 'no'} |")
    for name, got, key in (
        ("screen switch, first visit (built on the visit)", switches, "first"),
        ("screen switch, first visit (built ahead)", ahead, "first"),
        ("screen switch, return", switches, "again"),
        ("screen switch, return (built ahead)", ahead, "again"),
    ):
        med = statistics.median(got[key])
        cpu = statistics.median(got[f"{key} cpu"])
        print(f"| {name} | {med * 1000:.0f} ms (CPU {cpu * 1000:.0f} ms) | {med / base:.3f}x | - |")


if __name__ == "__main__":
    main()
