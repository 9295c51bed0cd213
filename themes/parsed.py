"""A Textual stylesheet whose parsed rules are shared by every stylesheet of the process.

Textual (8.x) keeps parsed rules per :class:`~textual.css.stylesheet.Stylesheet` and re-parses
every source into a fresh one on each ``reparse``: the console parsed its ~30 stylesheets twice
as it started (once when its theme is applied, once more as the first screen mounts) and again
on every theme change, even back to a theme it had shown. Parsing is a pure function of the CSS
text, where it was read from and the variables, so the rules are kept per process under exactly
that key: a return to a theme costs no parse, a start parses each source once, and so does every
console started after it in the same process (the test suite starts hundreds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.css.stylesheet import Stylesheet
from textual.css.types import CSSLocation

if TYPE_CHECKING:
    from textual.css.model import RuleSet

#: (css, read_from, is_default_rules, tie_breaker, scope, variables) -> the rules parsed from it.
#: Bounded in practice by sources x themes (a few hundred lists of rules).
_PARSED: dict[tuple[object, ...], list[RuleSet]] = {}


class SharedParseStylesheet(Stylesheet):
    """A Stylesheet that reads parsed rules from the process-wide cache (rules are never
    changed once parsed: Textual's own cache hands the same lists out again too)."""

    def __init__(self, *, variables: dict[str, str] | None = None) -> None:
        super().__init__(variables=variables)
        self._variables_key = _key(self._variables)

    def set_variables(self, variables: dict[str, str]) -> None:
        super().set_variables(variables)
        self._variables_key = _key(self._variables)

    def _parse_rules(
        self,
        css: str,
        read_from: CSSLocation,
        is_default_rules: bool = False,
        tie_breaker: int = 0,
        scope: str = "",
    ) -> list[RuleSet]:
        key = (css, read_from, is_default_rules, tie_breaker, scope, self._variables_key)
        rules = _PARSED.get(key)
        if rules is None:
            rules = super()._parse_rules(css, read_from, is_default_rules, tie_breaker, scope)
            _PARSED[key] = rules
        return rules

    def reparse(self) -> None:
        """Textual's ``reparse`` (parse into a fresh stylesheet, so an error leaves this one
        whole), with the fresh one of this class: through the shared rules."""
        fresh = SharedParseStylesheet(variables=self._variables)
        for read_from, source in self.source.items():
            fresh.add_source(
                source.content,
                read_from=read_from,
                is_default_css=source.is_defaults,
                tie_breaker=source.tie_breaker,
                scope=source.scope,
            )
        try:
            fresh.parse()
        except Exception:
            self._invalid_css.update(fresh._invalid_css)  # as Textual: not re-parsed on the way out
            raise
        self._rules = fresh.rules
        self._rules_map = None
        self.source = fresh.source
        self._require_parse = False


def _key(variables: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(variables.items()))
