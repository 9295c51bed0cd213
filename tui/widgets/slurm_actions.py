"""Drain and resume from the console (Fleet and node detail, keys ``d`` and ``R``), through
``backend.ops.slurm`` exactly as the command line: the reason and drain now / after the job are
asked first, then the exact ``scontrol`` command is shown with what it will do, and only a yes
runs it. A resume shows every evidence check first; a failing check is named and nothing runs
(``loadmaster resume --force REASON`` overrides it on the command line, audited). Read-only
consoles refuse both with one line before asking anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input

from backend.errors import LoadmasterError
from backend.textfmt import safe_text
from tui.widgets.confirm import ConfirmModal
from tui.widgets.plain import PlainLabel, PlainStatic

if TYPE_CHECKING:
    from backend.ops.slurm import ResumePlan, SlurmNodeRow
    from tui.screens.base import LoadmasterScreen

#: (reason, now) as the drain form answers; None: cancelled.
DrainAnswer = tuple[str, bool] | None


class DrainForm(ModalScreen[DrainAnswer]):
    """The reason for the next on-call, and drain after the running jobs (enter) or now."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", show=True)]
    """
    | Key(s) | Description |
    | :- | :- |
    | enter | In the reason: drain after the running jobs end (the safe choice). |
    | escape | Cancel: nothing is drained. |
    """

    def __init__(self, node: str, row: SlurmNodeRow | None, prompted_by: str | None) -> None:
        super().__init__()
        self.node = node
        self.row = row
        self.prompted_by = prompted_by

    def compose(self) -> ComposeResult:
        row = self.row
        state = safe_text(row.state, 12) if row is not None else "unknown"
        jobs = ", ".join(safe_text(j.job_id, 20) for j in row.jobs) if row is not None and row.jobs else "none"
        lines = [f"Slurm: {state} · jobs running: {jobs}"]
        if self.prompted_by:
            lines.append(f"prompted by: {self.prompted_by} (added to the reason)")
        with Vertical(classes="dialog"):
            yield PlainLabel(f"Drain {self.node} in Slurm", classes="dialog--title")
            yield PlainStatic("\n".join(lines), classes="dialog--body")
            yield PlainLabel("Reason (what the next on-call reads):", classes="dialog--prompt")
            yield Input(placeholder="e.g. Xid 79, fell off the bus", id="drain-reason")
            with Horizontal(classes="dialog--buttons"):
                yield Button("After the jobs", id="after", variant="primary")
                yield Button("Now (requeue)", id="now", variant="error")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#drain-reason", Input).focus()

    def _answer(self, now: bool) -> None:
        reason = self.query_one("#drain-reason", Input).value.strip()
        if not reason:
            self.notify("Write a reason first: what the next on-call reads.", severity="warning", markup=False)
            return
        self.dismiss((reason, now))

    @on(Input.Submitted, "#drain-reason")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._answer(now=False)

    @on(Button.Pressed)
    def _button(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self._answer(now=event.button.id == "now")

    def action_cancel(self) -> None:
        self.dismiss(None)


class EvidenceRefused(ModalScreen[None]):
    """A resume refused: every check, the failing one named; nothing ran."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "Close", show=True)]
    """
    | Key(s) | Description |
    | :- | :- |
    | escape | Close: nothing was resumed. |
    """

    def __init__(self, title: str, body: str) -> None:
        super().__init__()
        self.question = title
        self.body = body

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield PlainLabel(self.question, classes="dialog--title")
            yield PlainStatic(self.body, classes="dialog--body")
            with Horizontal(classes="dialog--buttons"):
                yield Button("Close", id="close", variant="primary")

    def on_mount(self) -> None:
        self.query_one("#close", Button).focus()

    @on(Button.Pressed)
    def _button(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


class SlurmKeys:
    """Mixin of the screens with ``d`` and ``R``: they exist only with ``[slurm] enabled``."""

    services: Any

    @property
    def slurm_enabled(self) -> bool:
        from backend.ops.types import SlurmSettings

        return bool(self.services.config.section(SlurmSettings).enabled)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Hidden from the footer (and inert) without Slurm.
        if action in ("drain", "resume") and not self.slurm_enabled:
            return False
        return super().check_action(action, parameters)  # type: ignore[misc,no-any-return]


def evidence_lines(plan: ResumePlan) -> list[str]:
    """One line per check: ``ok`` or ``FAIL``, its name and what was seen."""
    out = []
    for e in plan.evidence:
        for c in e.checks:
            out.append(f"{'ok  ' if c.passed else 'FAIL'} {e.node} {c.name}: {safe_text(c.detail, 160)}")
    return out


def _ready(screen: LoadmasterScreen, what: str) -> bool:
    """Slurm enabled and the console writable (else one line saying which)."""
    from backend.ops.types import SlurmSettings

    if not screen.services.config.section(SlurmSettings).enabled:
        screen.notify("Slurm is not enabled: add [slurm] enabled = true to the config", severity="warning")
        return False
    return screen.require_writable(what)


async def drain_flow(screen: LoadmasterScreen, node: str, row: SlurmNodeRow | None, prompted_by: str | None) -> bool:
    """Ask, plan, show the command, confirm, drain (from a worker). True when it drained."""
    if not _ready(screen, "drain Slurm nodes"):
        return False
    app: Any = screen.app
    answer = await app.push_screen_wait(DrainForm(node, row, prompted_by))
    if answer is None:
        return False
    reason, now = answer
    ops = screen.ops.slurm
    try:
        plan = await ops.plan_drain([node], reason, now=now, prompted_by=prompted_by)
    except LoadmasterError as exc:
        screen.report_error(f"Drain {node}", exc)
        return False
    what = (
        f"Requeues job(s) {', '.join(plan.requeue)} now; the node takes no new work."
        if plan.now and plan.requeue
        else "Running jobs finish first: the node shows draining, then drained. No new work starts on it."
    )
    body = "Runs:\n" + "\n".join(f"  {c}" for c in plan.shown()) + "\n\n" + what + "\nRecorded in the audit log."
    return await _confirm_then(
        screen, f"Drain {node}", body, ops.drain(plan), f"{node} drained in Slurm: {plan.reason}"
    )


async def _confirm_then(screen: LoadmasterScreen, what: str, body: str, action: Any, done: str) -> bool:
    """The confirm dialog (no is the default), then the operation; its error is one line."""
    app: Any = screen.app
    yes = what.split()[0]
    try:
        if not await app.push_screen_wait(ConfirmModal(title=f"{what}?", body=body, yes_label=yes)):
            return False
        await action
    except LoadmasterError as exc:
        screen.report_error(what, exc)
        return False
    finally:
        action.close()  # never awaited when the answer is no
    screen.notify(done, markup=False)
    return True


async def resume_flow(screen: LoadmasterScreen, node: str) -> bool:
    """Gather the evidence, show it, confirm, resume (from a worker). True when it resumed."""
    if not _ready(screen, "resume Slurm nodes"):
        return False
    app: Any = screen.app
    ops = screen.ops.slurm
    screen.notify(f"Checking {node} before a resume (GPU processes, remap/ECC, Xid, reachable)…", timeout=3)
    try:
        plan = await ops.plan_resume([node])
    except LoadmasterError as exc:
        screen.report_error(f"Resume {node}", exc)
        return False
    lines = evidence_lines(plan)
    if not plan.allowed:
        failing = next(c for e in plan.evidence for c in e.failing)
        body = "\n".join(lines) + "\n\nNothing was run. loadmaster resume --force REASON overrides (audited)."
        await app.push_screen_wait(EvidenceRefused(f"Resume {node} refused: {failing.name}", body))
        return False
    body = "Evidence:\n" + "\n".join(lines) + "\n\nRuns:\n" + "\n".join(f"  {c}" for c in plan.shown())
    return await _confirm_then(screen, f"Resume {node}", body, ops.resume(plan), f"{node} resumed in Slurm")
