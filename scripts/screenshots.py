"""Regenerate docs/screenshots/*.svg: the on-call session of docs/walkthrough.md, on the sandbox.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots] [--size 120x34]
                                            [--theme loadmaster-dark] [--lab-dir DIR]

Starts the sandbox exactly as an operator does (``loadmaster lab up --dir``), opens the console
on it headless (Textual's Pilot, the keys an operator presses), saves one SVG per step with
``App.save_screenshot``, and always stops the sandbox (``loadmaster lab down``). Everything on the
pictures is real: sshd nodes, SeaweedFS, s5cmd, DCP checkpoints; only nvidia-smi is a stand-in.
Takes a minute or two.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOADMASTER = Path(sys.executable).parent / "loadmaster"
#: Generous: the sandbox's sampling, listing and the pull run on real processes.
WAIT = 120.0


def lab_up(lab_dir: Path, env: dict[str, str]) -> str:
    """``loadmaster lab up --dir``; returns the console command it printed."""
    up = subprocess.run(
        [str(LOADMASTER), "lab", "up", "--dir", str(lab_dir)], env=env, capture_output=True, text=True, timeout=600
    )
    if up.returncode != 0:
        raise SystemExit(f"lab up failed:\n{up.stderr}")
    return up.stdout.strip().splitlines()[-1]


def lab_down(lab_dir: Path, env: dict[str, str]) -> None:
    subprocess.run(
        [str(LOADMASTER), "lab", "down", "--dir", str(lab_dir)], env=env, capture_output=True, text=True, timeout=120
    )


def apply_command_env(command: str) -> Path:
    """Take the printed command's VAR=value words into this process; returns its --config path."""
    words = shlex.split(command)
    config = Path(words[words.index("--config") + 1])
    for word in words:
        if "=" in word and not word.startswith("-"):
            key, _, value = word.partition("=")
            os.environ[key] = value
    return config


async def until(pilot: Any, check: Callable[[], object], what: str, limit: float = WAIT) -> None:
    """Let the console run until ``check()`` holds (SystemExit naming ``what`` after ``limit`` s)."""
    end = time.monotonic() + limit
    while not check():
        if time.monotonic() > end:
            shot = pilot.app.save_screenshot(filename="lm-screenshots-timeout.svg", path=tempfile.gettempdir())
            errors = "".join(f"\n  {e.source}: {e.detail}" for e in getattr(pilot.app, "errors", []))
            raise SystemExit(
                f"timed out waiting for {what} (the screen then: {shot})"
                + (f"\nerrors the console recorded:{errors}" if errors else "")
            )
        await pilot.pause(0.25)


async def switch(pilot: Any, key: str, mode: str) -> None:
    """Switch to a screen (what its digit ``key`` does; a focused text field would take the
    digit as text, so the mode is switched directly) and wait until it is the active one."""
    await pilot.app.switch_mode(mode)
    await until(pilot, lambda: pilot.app.current_mode == mode and pilot.app.screen.is_mounted, f"the {mode} screen")
    await pilot.pause(0.3)


def text_of(app: Any, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


async def session(config_path: Path, out: Path, size: tuple[int, int], theme: str) -> list[Path]:
    """Drive the on-call story and save a screenshot at each step."""
    from backend.config import load_config_file
    from backend.services import Services
    from tui.app import LoadmasterApp

    services = Services(load_config_file(config_path))
    app = LoadmasterApp(services, theme=theme)
    bucket = next(iter(services.config.stores.values())).url.rstrip("/")
    run = f"{bucket}/checkpoints/llama-demo"
    saved: list[Path] = []

    def shot(name: str, *, keep_toasts: bool = False) -> None:
        if not keep_toasts:
            app.clear_notifications()
        saved.append(Path(app.save_screenshot(filename=f"{name}.svg", path=str(out))))
        print(f"  {saved[-1].relative_to(ROOT) if saved[-1].is_relative_to(ROOT) else saved[-1]}")

    async with app.run_test(size=size) as pilot:
        # 1. The fleet, and the starved node's alert with its hint.
        await until(pilot, lambda: services.telemetry.snapshot().active_alerts, "the starved alert")
        await pilot.pause(1.0)
        shot("01-fleet-starved-alert")

        # 2. The starved node's detail: per-GPU utilisation, NICs, the alert's hint in full.
        table = app.screen.query_one("#fleet-table")
        table.move_cursor(row=table.get_row_index("node-02"))
        await pilot.press("enter")
        await until(pilot, lambda: "GPU starved" in text_of(app, "#node-header"), "node detail")
        await pilot.pause(2.0)  # a few samples into the plots
        shot("02-node-detail")
        await pilot.press("escape")

        # 3. Transfers: a new pull, its estimate with the egress quote.
        await switch(pilot, "2", "transfers")
        await pilot.press("n")
        await pilot.press(*f"{bucket}/datasets/laion-mini/shards/", "tab", *"laion-shards", "tab", *"node-01,node-04")
        await pilot.click("#pull-estimate")
        await until(pilot, lambda: "month to date" in text_of(app, "#pull-estimate-text"), "the pull estimate")
        shot("03-transfers-pull-estimate")

        # 4. Launched; both jobs complete.
        await pilot.click("#pull-launch")

        def pulls_done() -> bool:
            jobs = app.screen.records if hasattr(app.screen, "records") else ()
            pulls = [r for r in jobs if r.kind == "pull"]
            return len(pulls) == 2 and all(r.terminal for r in pulls)

        await until(pilot, pulls_done, "the pulls to finish")
        await pilot.pause(1.0)
        shot("04-transfers-pull-done")

        # 5. Checkpoints of the run: full DCP steps with optimizer state, one still uploading.
        await switch(pilot, "3", "checkpoints")
        url = app.screen.query_one("#ckpt-url")
        url.value = run
        url.focus()
        await pilot.press("enter")
        await until(pilot, lambda: app.screen.query_one("#ckpt-steps").row_count >= 12, "the checkpoint listing")
        await pilot.pause(0.5)
        shot("05-checkpoints")

        # 6. Retention: the plan for the policy in the config.
        await switch(pilot, "4", "retention")
        await pilot.press("o", "end", *"/checkpoints/llama-demo", "enter")
        await until(pilot, lambda: getattr(app.screen, "plan", None) is not None, "the retention plan")
        await pilot.pause(0.5)
        shot("06-retention-plan")

        # 7. Apply: the typed confirmation.
        await pilot.press("a")
        await pilot.pause(0.5)
        await pilot.press(*"llama-demo")
        await pilot.pause(0.3)
        shot("07-retention-confirm")
        await pilot.press("enter")
        await until(pilot, lambda: "Applied plan" in text_of(app, "#retention-status"), "the apply to finish")
        await pilot.pause(1.0)
        shot("08-retention-applied")

        # 9. Egress month to date, including the pull just made.
        await switch(pilot, "5", "egress")
        await pilot.press("r")
        await pilot.pause(2.0)
        await app.workers.wait_for_complete()
        await pilot.pause(0.5)
        shot("09-egress")

        # 10. The keys of a screen: ? on the Fleet screen.
        await switch(pilot, "1", "fleet")
        nodes = len(services.config.nodes)
        await until(
            pilot,
            lambda: app.screen.query_one("#fleet-table").row_count == nodes,
            "the fleet table to show every node again",
        )
        await pilot.press("question_mark")
        await until(pilot, lambda: type(app.screen).__name__ == "HelpScreen", "the help screen")
        await pilot.pause(0.5)
        shot("10-help")
        await pilot.press("escape")
    return saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    ap.add_argument("--size", default="120x34", help="terminal COLUMNSxROWS (default 120x34)")
    ap.add_argument("--theme", default="loadmaster-dark")
    ap.add_argument(
        "--lab-dir",
        default="/tmp/loadmaster-demo",
        help="where the sandbox lives; a fixed path keeps the pictures stable "
        "(default /tmp/loadmaster-demo, removed afterwards)",
    )
    args = ap.parse_args()
    cols, rows = (int(x) for x in args.size.lower().split("x"))
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    work = Path(tempfile.mkdtemp(prefix="lm-shots-"))
    lab_dir = Path(args.lab_dir).resolve()
    if lab_dir.exists() and any(lab_dir.iterdir()):
        raise SystemExit(
            f"{lab_dir} is not empty; pass --lab-dir or run 'loadmaster lab down --dir {lab_dir}' and remove it"
        )
    env = dict(os.environ)
    env.update({"LOADMASTER_DATA_DIR": str(work / "data"), "LOADMASTER_CONFIG_DIR": str(work / "config")})
    env.pop("LOADMASTER_CONFIG", None)
    os.environ.update({k: env[k] for k in ("LOADMASTER_DATA_DIR", "LOADMASTER_CONFIG_DIR")})
    print(f"starting the sandbox in {lab_dir} ...")
    try:
        command = lab_up(lab_dir, env)
        config_path = apply_command_env(command)
        print(f"console: {command}")
        asyncio.run(session(config_path, out, (cols, rows), args.theme))
    finally:
        lab_down(lab_dir, env)
        shutil.rmtree(lab_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
