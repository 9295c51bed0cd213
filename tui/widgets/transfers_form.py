"""The "new pull" form: source, destination, nodes, store, preset and s5cmd knobs, with the estimate."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Input, Label, Select, Static

from backend.ops import PullRequest
from backend.ops.pull import FANOUTS, PRESETS
from tui.widgets.plain import PlainStatic
from tui.widgets.transfers_estimate import estimate_lines

if TYPE_CHECKING:
    from backend.ops import PullPreview

AUTO_STORE = "(from SRC)"
#: The fan-out choice that leaves it to ``[pull] fanout``.
CONFIG_FANOUT = "(config)"
#: Terminal rows the Transfers screen spends around the estimate with the form open (header, tabs,
#: summary, the form's border, caption and fields, the estimate's other lines, the footer).
ROWS_AROUND_NODES = 28


class PullForm(Vertical):
    """Fill in a pull, press Estimate to see the plan, then Launch.

    Messages: :class:`PullForm.EstimateRequested` and :class:`PullForm.LaunchRequested`, both
    carrying a :class:`PullRequest`; the screen does the I/O and calls :meth:`show_estimate`.
    """

    class EstimateRequested(Message):
        """The operator wants the pre-launch estimate for ``request``."""

        def __init__(self, control: PullForm, request: PullRequest) -> None:
            super().__init__()
            self.form = control
            self.request = request

        @property
        def control(self) -> PullForm:
            return self.form

    class LaunchRequested(EstimateRequested):
        """The operator confirmed the estimate and wants ``request`` launched."""

    def __init__(self, *, stores: list[str], id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.stores = stores
        #: The estimate on show (re-laid out when the terminal is resized).
        self.preview: PullPreview | None = None

    def compose(self) -> ComposeResult:
        # One line per row, a label before each field (as on the Shards and Egress screens): the
        # whole form fits an 80x24 terminal with every value in full, the source on its own row.
        # Focus (Tab) order: source, destination, nodes, store, preset, the three knobs, reason,
        # Estimate, Launch.
        yield Label("New pull", classes="transfers-caption")
        with Horizontal(classes="pull-field"):
            yield Label("Source", classes="pull-label")
            yield Input(placeholder="s3://bucket/prefix/", id="pull-src", compact=True)
        with Horizontal(classes="pull-field"):
            yield Label("Destination", classes="pull-label")
            yield Input(placeholder="dir (relative: under scratch)", id="pull-dest", compact=True)
            yield Label("Nodes", classes="pull-label-inner")
            yield Input(placeholder="gpu-[01-04] or one name", id="pull-nodes", compact=True)
        with Horizontal(classes="pull-field"):
            yield Label("Store", classes="pull-label")
            yield Select(
                [(s, s) for s in [AUTO_STORE, *self.stores]],
                value=AUTO_STORE,
                allow_blank=False,
                id="pull-store",
                compact=True,
            )
            yield Label("Preset", classes="pull-label-inner")
            yield Select([(k, k) for k in PRESETS], value="tuned", allow_blank=False, id="pull-preset", compact=True)
            yield Label("Fan-out", classes="pull-label-inner")
            yield Select(
                [(k, k) for k in (CONFIG_FANOUT, *FANOUTS)],
                value=CONFIG_FANOUT,
                allow_blank=False,
                id="pull-fanout",
                compact=True,
                tooltip="direct: every node from the store; relay: seeds from the store, the rest from peers",
            )
        with Horizontal(classes="pull-field"):
            yield Label("Workers", classes="pull-label")
            yield Input(
                str(PRESETS["tuned"][0]),
                id="pull-numworkers",
                type="integer",
                compact=True,
                tooltip="s5cmd --numworkers: objects copied in parallel",
            )
            yield Label("Concurrency", classes="pull-label-inner")
            yield Input(
                str(PRESETS["tuned"][1]),
                id="pull-concurrency",
                type="integer",
                compact=True,
                tooltip="s5cmd cp --concurrency: parts of one object in parallel",
            )
            yield Label("Part MiB", classes="pull-label-inner")
            yield Input(
                str(PRESETS["tuned"][2]),
                id="pull-part-size",
                type="integer",
                compact=True,
                tooltip="s5cmd cp --part-size in MiB",
            )
        with Horizontal(classes="pull-field"):
            yield Label("Reason", classes="pull-label")
            yield Input(placeholder="over budget? why (only if the egress guard asks)", id="pull-reason", compact=True)
            yield Button("Estimate", id="pull-estimate", variant="primary", compact=True)
            yield Button("Launch", id="pull-launch", variant="warning", disabled=True, compact=True)
        # The decision is the estimate's first line; the rest scrolls inside the form.
        with VerticalScroll(id="pull-estimate-box"):
            yield PlainStatic("", id="pull-estimate-text")

    @on(Select.Changed, "#pull-preset")
    def _preset(self, event: Select.Changed) -> None:
        nw, cc, ps = PRESETS[str(event.value)]
        self.query_one("#pull-numworkers", Input).value = str(nw)
        self.query_one("#pull-concurrency", Input).value = str(cc)
        self.query_one("#pull-part-size", Input).value = str(ps)

    @on(Select.Changed, "#pull-fanout")
    @on(Select.Changed, "#pull-store")
    @on(Input.Changed)
    def _edited(self) -> None:
        # Any change invalidates the estimate: Launch needs a fresh one.
        self.query_one("#pull-launch", Button).disabled = True

    def request(self) -> PullRequest:
        """The form's current values."""

        def num(sel: str) -> int | None:
            v = self.query_one(sel, Input).value.strip()
            return int(v) if v.isdigit() and int(v) > 0 else None

        store = str(self.query_one("#pull-store", Select).value)
        fanout = str(self.query_one("#pull-fanout", Select).value)
        reason = self.query_one("#pull-reason", Input).value.strip() or None
        return PullRequest(
            src=self.query_one("#pull-src", Input).value.strip(),
            dest=self.query_one("#pull-dest", Input).value.strip(),
            nodes=self.query_one("#pull-nodes", Input).value.strip(),
            store=None if store == AUTO_STORE else store,
            numworkers=num("#pull-numworkers"),
            concurrency=num("#pull-concurrency"),
            part_size_mib=num("#pull-part-size"),
            reason=reason,
            fanout=None if fanout == CONFIG_FANOUT else fanout,
        )

    @on(Button.Pressed, "#pull-estimate")
    def _estimate(self, event: Button.Pressed) -> None:
        event.stop()
        self.query_one("#pull-estimate-text", Static).update("estimating: listing the source, probing nodes...")
        self.post_message(self.EstimateRequested(self, self.request()))

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        """Enter in any field asks for the estimate (Launch still needs its own press)."""
        event.stop()
        self.query_one("#pull-estimate", Button).press()

    @on(Button.Pressed, "#pull-launch")
    def _launch(self, event: Button.Pressed) -> None:
        event.stop()
        self.query_one("#pull-launch", Button).disabled = True
        self.post_message(self.LaunchRequested(self, self.request()))

    def show_estimate(self, text: str, *, launchable: bool) -> None:
        """Show the estimate (or the reason it cannot start) and enable Launch when it may start."""
        self.preview = None
        self.query_one("#pull-estimate-text", Static).update(text)
        self.query_one("#pull-launch", Button).disabled = not launchable

    def show_preview(self, preview: PullPreview) -> None:
        """Show a pull's estimate, its decision first, and enable Launch when it may start."""
        self.preview = preview
        self._render_preview()
        self.query_one("#pull-launch", Button).disabled = not preview.startable

    def on_resize(self) -> None:
        if self.preview is not None:
            self._render_preview()

    def _render_preview(self) -> None:
        if self.preview is None:
            return
        # The estimate box's scrollbar may take two columns: lines never wrap under it.
        width = (self.content_region.width or 76) - 2
        height = self.app.size.height if self.is_attached else 24
        lines = estimate_lines(self.preview, width=width, node_lines=max(0, height - ROWS_AROUND_NODES))
        self.query_one("#pull-estimate-text", Static).update("\n".join(lines))
