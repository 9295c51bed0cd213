"""The console's footer: Textual's, rebuilt only when the key hints it shows have changed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Footer
from textual.widgets._footer import FooterKey

if TYPE_CHECKING:
    from textual.app import ComposeResult
    from textual.screen import Screen

#: What a footer shows, for one key hint: key, how it is written, description, action, whether
#: it is enabled, its tooltip and its group.
HintKey = tuple[str, str, str, str, bool, str, object]


class SteadyFooter(Footer):
    """Textual's :class:`~textual.widgets.Footer`, recomposed only when its hints changed.

    Textual's footer throws its key widgets away and builds them again each time the screen's
    bindings are refreshed: on every return to a screen and every focus change, although the
    hints are nearly always the same. Each rebuild restyles every key (a third of a return to a
    built screen). This one ignores the refresh of a screen being hidden (its return refreshes
    them again), and compares what it would show with what it shows and keeps it when
    they are equal; the first build, and any change of key, description, enabled state or
    command-palette hint, still rebuilds it as Textual's does.
    """

    _shown: tuple[HintKey, ...] | None = None

    def _hints(self, screen: Screen[object]) -> tuple[HintKey, ...]:
        """The key hints the footer would show for ``screen`` now (what :meth:`compose` reads)."""
        app = screen.app
        hints = [
            (
                binding.key,
                app.get_key_display(binding),
                binding.description,
                binding.action,
                enabled,
                tooltip,
                binding.group,
            )
            for (_, binding, enabled, tooltip) in screen.active_bindings.values()
            if binding.show or binding.key == app.COMMAND_PALETTE_BINDING
        ]
        palette = ("", "", "", "", self.show_command_palette and app.ENABLE_COMMAND_PALETTE, "", None)
        return (*hints, palette)

    def compose(self) -> ComposeResult:
        """Textual's keys, each bound to the footer's ``compact`` given that value before it is
        mounted: a key starts compact, and its binding to the (not compact) footer then flipped
        it back on mount, restyling each key twice more on a screen's first show. The key that
        is not bound (the command palette's) keeps Textual's compact, its class set up front too."""
        for widget in super().compose():
            if isinstance(widget, FooterKey):
                compact = self.compact if widget._reactive_connect else True  # FooterKey's default
                widget.set_reactive(FooterKey.compact, compact)
                widget.set_class(compact, "-compact", update=False)
            yield widget

    async def build_ahead(self) -> None:
        """Build the key hints of a screen that is not shown yet (the console builds screens
        ahead of time): Textual's footer builds them on the screen's first show otherwise."""
        if not self.is_attached:
            return
        hints = self._hints(self.screen)
        if self._bindings_ready and hints == self._shown:
            return
        self._bindings_ready = True
        self._shown = hints
        with self._context():  # composed as from the footer's own queue (its keys bind to it)
            await self.recompose()

    def bindings_changed(self, screen: Screen[object]) -> None:
        if not screen.is_current:
            return  # leaving, or built ahead: the bindings are refreshed again when it is shown
        if self.is_attached and screen is self.screen and screen.app.app_focus:
            hints = self._hints(screen)
            if self._bindings_ready and hints == self._shown:
                return
            self._shown = hints
        super().bindings_changed(screen)
