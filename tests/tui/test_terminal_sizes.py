"""The columns an operator decides on stay visible from 80x24 up to very wide terminals.

Each screen is rendered (deterministic services, frozen clock) and its text read back from the
exported screenshot; a header missing from the screen means the column is clipped or scrolled
away. Known clippings are strict xfails naming the fix, so a fix shows up as XPASS.
"""

from __future__ import annotations

import re
from collections import defaultdict
from html import unescape
from typing import Any

import pytest

from tests.tui.snapshot_services import frozen_clock, record_egress_month, snapshot_services
from tui.app import LoadmasterApp

SIZES = {"80x24": (80, 24), "100x30": (100, 30), "120x34": (120, 34), "150x40": (150, 40), "250x60": (250, 60)}

#: screen -> column headers that must be on screen at every size
IMPORTANT: dict[str, tuple[str, ...]] = {
    "fleet": ("Node", "State", "Util avg/min", "Hint"),
    "transfers": ("Node", "Progress", "State"),
    "checkpoints": ("Step", "Kind", "Size", "Age"),
    "retention": ("Step", "Action", "Freed"),
    "egress": ("Store -> node site", "USD", "Projected"),
    "shards": ("Source -> destination", "State"),
}

#: (screen, size) -> why it is clipped today (strict: a fix turns these into XPASS)
KNOWN: dict[tuple[str, str], str] = {}


def screen_text(svg: str) -> str:
    """The text of an exported SVG screenshot, one line per terminal row."""
    rows: dict[float, list[tuple[float, str]]] = defaultdict(list)
    for m in re.finditer(r'<text[^>]*\bx="([\d.]+)"[^>]*\by="([\d.]+)"[^>]*>([^<]*)</text>', svg):
        rows[float(m.group(2))].append((float(m.group(1)), unescape(m.group(3)).replace("\xa0", " ")))
    return "\n".join("".join(t for _, t in sorted(parts)) for _, parts in sorted(rows.items()))


@pytest.fixture(autouse=True)
def _frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    with frozen_clock(monkeypatch):
        yield


def _cases() -> list[Any]:
    out = []
    for screen in IMPORTANT:
        for size in SIZES:
            reason = KNOWN.get((screen, size))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            out.append(pytest.param(screen, size, marks=marks, id=f"{screen}-{size}"))
    return out


@pytest.mark.parametrize(("screen", "size"), _cases())
async def test_important_columns_visible(screen: str, size: str) -> None:
    services = snapshot_services()
    if screen == "egress":
        record_egress_month(services)
    app = LoadmasterApp(services, theme="loadmaster-dark", mode=screen)
    async with app.run_test(size=SIZES[size]) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        text = screen_text(app.export_screenshot())
    missing = [h for h in IMPORTANT[screen] if h not in text]
    assert not missing, f"{screen} at {size}: {missing} not on screen:\n{text}"
    # The footer keeps the way out and the way to every other key on screen at every size.
    footer = text.rstrip().splitlines()[-1]
    assert "? Help" in footer and "q Quit" in footer, f"{screen} at {size}: footer clipped: {footer!r}"


#: Keys every screen shares, documented once in README's table of common keys.
COMMON_KEYS = {"slash", "enter", "escape", "r", "ctrl+r", "o", "n", "c", "ctrl+s"}


def test_readme_names_every_screen_and_its_keys() -> None:
    """The docs name all 7+ screens' digits and each screen's own keys (`?` shows the same)."""
    import importlib
    from pathlib import Path

    from textual.binding import Binding

    from tui.screens.base import SCREEN_SPECS, LoadmasterScreen

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    first, last = SCREEN_SPECS[0].key, SCREEN_SPECS[-1].key
    assert f"`{first}`-`{last}` switch between " + ", ".join(s.title for s in SCREEN_SPECS[:-1]) in readme
    para = readme[readme.index("Screen keys") :]
    para = " ".join(para[: para.index("A text field takes")].split())
    missing = []
    for spec in SCREEN_SPECS:
        cls = getattr(importlib.import_module(spec.module), spec.class_name)
        own = [
            b.key
            for klass in cls.__mro__[: cls.__mro__.index(LoadmasterScreen)]
            for b in Binding.make_bindings(klass.__dict__.get("BINDINGS", ()))
            if b.key not in COMMON_KEYS
        ]
        part = para.split(f" {spec.title} `", 1)[1].split(" · ", 1)[0] if f" {spec.title} `" in para else ""
        part = "`" + part
        missing += [f"{spec.title}: `{k}`" for k in own if f"`{k}`" not in part]
    assert not missing, f"README's screen keys do not name: {missing}"


def test_readme_names_every_console_key() -> None:
    """Every key the console binds everywhere (digits aside) is named in README's console line."""
    from pathlib import Path

    from textual.binding import Binding

    from tui.app import LoadmasterApp

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    para = readme[readme.index("## The console") : readme.index("The same key does the same thing")]
    shown = {"question_mark": "?", "ctrl+p": "ctrl+p", "ctrl+t": "ctrl+t"}
    missing = [
        b.key
        for b in Binding.make_bindings(LoadmasterApp.BINDINGS)
        if not b.key.isdigit()
        and b.key not in ("ctrl+q", "ctrl+c", "escape")
        and f"`{shown.get(b.key, b.key)}`" not in para
    ]
    assert not missing, f"README's console keys do not name: {missing}"


@pytest.mark.parametrize("size", ["80x24", "120x34"])
async def test_a_64_step_plan_shows_what_it_keeps_and_why(size: str, tmp_path: Any, monkeypatch: Any) -> None:
    """What the operator decides on: every step the plan keeps (full or as weights) is a row on
    screen with its reason, ahead of the deletes, even at 80x24."""
    from textual.widgets import Input

    from tests.tui.snapshot_services import snapshot_run

    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "config"))
    app = LoadmasterApp(snapshot_services(state_dir=tmp_path / "state"), theme="loadmaster-dark", mode="retention")
    async with app.run_test(size=SIZES[size]) as pilot:
        screen = app.screen
        screen.query_one("#retention-url", Input).value = str(snapshot_run())
        screen.query_one("#milestone-every", Input).value = "8000"
        screen.action_reload()
        for _ in range(10):
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            if screen.plan is not None and not any(w.is_running for w in app.workers):
                break
        text = screen_text(app.export_screenshot())
    plan = screen.plan
    assert plan is not None and len(plan.actions) == 64
    kept = [a for a in plan.actions if a.action != "delete"]
    assert len(kept) == 5  # 2 latest full, 3 milestones as weights
    lines = text.splitlines()
    for a in kept:
        row = next((line for line in lines if line.split()[:2] == [str(a.step), a.action]), None)
        assert row is not None, f"step {a.step} ({a.action}) not on screen:\n{text}"
        assert a.reason.split(" (")[0] in row, f"step {a.step}'s reason cut: {row!r}"


async def test_checkpoints_at_80x24_lists_many_steps_and_the_runs_own_size(tmp_path: Any, monkeypatch: Any) -> None:
    """At 80x24 Checkpoints shows more than a handful of steps, and the footprint line uses the
    run's own parameter count (read from its tensors), not the assumed 70e9."""
    from textual.widgets import Input

    from tests.tui.snapshot_services import snapshot_run

    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "config"))
    app = LoadmasterApp(snapshot_services(state_dir=tmp_path / "state"), theme="loadmaster-dark", mode="checkpoints")
    async with app.run_test(size=SIZES["80x24"]) as pilot:
        footprint_before = screen_text(app.export_screenshot())
        screen = app.screen
        screen.query_one("#ckpt-url", Input).value = str(snapshot_run())
        screen.action_reload()
        for _ in range(5):
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
        text = screen_text(app.export_screenshot())
    assert "70B params (assumed" in footprint_before  # nothing listed: the size is said to be assumed
    assert "212 params (from step-32000's tensors)" in text and "assumed" not in text
    steps = [line for line in text.splitlines() if line.split()[1:3] == ["full", "dcp"]]
    assert len(steps) >= 8, text
