"""The Shards screen's "new conversion" form: source, destination, shard size, node, seed, policy.

The form holds only text; :func:`form_request` turns it into a :class:`ShardRequest` (or errors
by field) and :func:`preview_lines` renders a preview for it. The screen does the I/O and calls
:meth:`ShardForm.show_preview` / :meth:`ShardForm.show_errors`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import Button, Input, Label, Select, Static

from backend.errors import LoadmasterError
from backend.ops.shards import ShardPreview, ShardRequest, Shards, ShardSettings
from backend.ops.types import parse_size
from backend.units import bytes_text, usd_text
from tui.widgets.plain import PlainLabel, PlainStatic, plain

if TYPE_CHECKING:
    from backend.services import Services

LOCAL = "__local__"
#: The text fields (key, label, placeholder); their ids are ``shards-<key>``.
TEXT_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("src", "Source", "directory or s3://bucket/prefix of small files"),
    ("dest", "Destination", "directory or s3://bucket/prefix for shards"),
    ("shard-size", "Shard size", "256MB - 1GB"),
    ("seed", "Shuffle seed", "blank: sorted by key"),
)


@dataclass(frozen=True)
class ShardFormValues:
    """What the operator typed, as text."""

    src: str = ""
    dest: str = ""
    shard_size: str = "512MB"
    node: str = LOCAL
    seed: str = ""
    incomplete: str = "error"


def form_request(
    services: Services,
    shards: Shards,
    form: ShardFormValues,
) -> tuple[ShardRequest | None, dict[str, str], Any, Any]:
    """Validate the form: (request, errors by field, source profile, destination profile);
    ``shards`` (the console's ``ops.shards``) resolves the locations typed."""
    errors: dict[str, str] = {}
    settings = services.config.section(ShardSettings)
    size = seed = None
    sprof = dprof = None
    src = dest = ""
    try:
        size = parse_size(form.shard_size) if form.shard_size.strip() else settings.shard_size
    except ValueError as exc:
        errors["shard-size"] = str(exc)
    if form.seed.strip():
        try:
            seed = int(form.seed)
        except ValueError:
            errors["seed"] = f"the shuffle seed must be a whole number, got {form.seed!r}"
    for name, text in (("src", form.src), ("dest", form.dest)):
        try:
            url, prof = shards.location(text)
        except LoadmasterError as exc:
            errors[name] = str(exc)
            continue
        if name == "src":
            src, sprof = url, prof
        else:
            dest, dprof = url, prof
    if errors:
        return None, errors, sprof, dprof
    req = ShardRequest.from_settings(settings, src, dest, shard_size=size, seed=seed, incomplete=form.incomplete)
    try:
        req.validate()
    except LoadmasterError as exc:
        return None, {"form": str(exc)}, sprof, dprof
    return req, {}, sprof, dprof


def preview_lines(pv: ShardPreview) -> list[str]:
    """The preview as the form shows it."""
    r = pv.requests
    lines = [
        f"{pv.samples:,} samples ({pv.files:,} files, {bytes_text(pv.source_bytes)}) -> {pv.shards:,} shard(s)",
        f"GETs per epoch {r.gets_before:,} -> {r.gets_after:,}  ({r.reduction:,.0f}x fewer)",
        f"{usd_text(r.usd_per_epoch_before)} -> {usd_text(r.usd_per_epoch_after)} per epoch ({r.price_source})",
    ]
    lines += [f"warning: {w}" for w in pv.warnings]
    lines += [f"refused: {e}" for e in pv.errors]
    return lines


class ShardForm(VerticalScroll):
    """The conversion form with its preview box and Start button.

    Messages: :class:`ShardForm.Changed` after any edit (the screen re-previews) and
    :class:`ShardForm.StartPressed` when Start is pressed.
    """

    class Changed(Message):
        """A field of the form changed."""

    class StartPressed(Message):
        """The operator pressed Start."""

    def __init__(self, *, shard_size: int, nodes: list[str], id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.default_size = f"{shard_size / 1e6:g}MB"
        self.nodes = nodes

    def compose(self) -> ComposeResult:
        yield PlainStatic("New conversion", id="shards-form-title")
        for key, label, hint in TEXT_FIELDS:
            with Horizontal(classes="shards-field"):
                yield PlainLabel(label, classes="shards-label")
                yield Input(
                    self.default_size if key == "shard-size" else "", placeholder=hint, id=f"shards-{key}", compact=True
                )
        with Horizontal(classes="shards-field"):
            yield Label("Node", classes="shards-label")
            yield Select(
                [("this machine", LOCAL)] + [(plain(n, 200), n) for n in self.nodes],
                value=LOCAL,
                allow_blank=False,
                id="shards-node",
                compact=True,
            )
        with Horizontal(classes="shards-field"):
            yield Label("Incomplete", classes="shards-label")
            yield Select(
                [("refuse (report them)", "error"), ("leave them out", "skip"), ("shard as they are", "keep")],
                value="error",
                allow_blank=False,
                id="shards-incomplete",
                compact=True,
            )
        yield PlainStatic("", id="shards-errors")
        yield PlainStatic("Type a source and a destination to preview.", id="shards-preview")
        with Horizontal(id="shards-buttons"):
            yield Button("Start conversion", id="shards-start", variant="primary", disabled=True)

    def values(self) -> ShardFormValues:
        """The form's current values."""

        def text(key: str) -> str:
            return self.query_one(f"#shards-{key}", Input).value

        return ShardFormValues(
            src=text("src"),
            dest=text("dest"),
            shard_size=text("shard-size"),
            seed=text("seed"),
            node=str(self.query_one("#shards-node", Select).value),
            incomplete=str(self.query_one("#shards-incomplete", Select).value),
        )

    @on(Input.Changed)
    @on(Select.Changed)
    def _changed(self, event: Message) -> None:
        event.stop()
        self.post_message(self.Changed())

    @on(Button.Pressed, "#shards-start")
    def _start_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(self.StartPressed())

    def set_startable(self, startable: bool) -> None:
        """Enable or disable Start."""
        self.query_one("#shards-start", Button).disabled = not startable

    def show_preview(self, pv: ShardPreview) -> None:
        """Show ``pv`` (field errors cleared); Start is enabled when it may run."""
        self.show_errors({})
        box = self.query_one("#shards-preview", Static)
        box.update("\n".join(preview_lines(pv)))
        box.set_class(not pv.ok, "-refused")
        box.set_class(bool(pv.warnings), "-warned")
        self.set_startable(pv.ok)

    def show_errors(self, errors: dict[str, str]) -> None:
        """Mark the fields in ``errors`` invalid and list the messages (an empty dict clears them)."""
        for key, _label, _hint in TEXT_FIELDS:
            self.query_one(f"#shards-{key}", Input).set_class(key in errors, "-invalid")
        box = self.query_one("#shards-errors", Static)
        box.update("\n".join(errors.values()))
        box.set_class(bool(errors), "-active")

    def focus_source(self) -> None:
        """Focus the Source field."""
        self.query_one("#shards-src", Input).focus()
