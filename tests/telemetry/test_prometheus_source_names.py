"""The per-refresh memo of series sources (job/instance) says what :func:`_source` says, for any labels."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from backend.telemetry.prometheus import _source, _SourceNames

_VALUES = st.one_of(
    st.none(),
    st.text(max_size=6),
    st.integers(),
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


@given(st.lists(st.fixed_dictionaries({}, optional={"job": _VALUES, "instance": _VALUES}), max_size=20))
def test_the_memo_names_each_series_as_source_does(series: list[dict[str, Any]]) -> None:
    """Text, numbers, booleans (True == 1), lists and dicts (not hashable, from a hostile answer)."""
    names = _SourceNames()
    assert [names(labels) for labels in series] == [_source(labels) for labels in series]


def test_labels_that_are_not_text_are_a_question_mark_not_an_error() -> None:
    names = _SourceNames()
    assert names({"job": ["dcgm"], "instance": {"a": 1}}) == "?/?"
    assert (
        names({"job": "dcgm", "instance": "n1:9400"}) == "dcgm/n1:9400" == names({"job": "dcgm", "instance": "n1:9400"})
    )
