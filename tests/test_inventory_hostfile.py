"""The hostfile inventory source over generated DeepSpeed/MPI hostfiles (hypothesis).

Whatever mix of hosts, ``slots=N``, other launcher options, comments and blank lines a hostfile
holds, the fleet read through the seam (``ConfigNodes`` asking ``HostfileInventory``) is every
listed host once, in the file's order, with its slots; a host listed twice, or one junk line
anywhere, stops the load with a one-line ConfigError naming the file and the config key (and the
junk line's number), never a guess.

Each rule was checked by removing it from a copy of ``read_hostfile`` (comments kept, blank lines
kept, slots dropped, an option without ``=`` accepted, negative slots accepted, line numbers from 0,
twins merged): a test here fails on each.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.errors import ConfigError
from backend.inventory.model import Defaults, NodeEntry
from backend.inventory.tables import ConfigNodes


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None


_names = st.from_regex(r"[a-z][a-z0-9.-]{0,14}", fullmatch=True)
_comment_text = st.text(st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20)
_space = st.sampled_from(["", " ", "  ", "\t"])
#: Options the launcher reads and the inventory skips (MPI's ``max_slots``, a DeepSpeed extra).
_other_opt = st.sampled_from(["max_slots=16", "gpus=8", "port=2222"])


@st.composite
def host_line(draw: st.DrawFn, host: Host) -> str:
    opts = [draw(_other_opt)] if draw(st.booleans()) else []
    if host.slots is not None:
        opts.insert(draw(st.integers(0, len(opts))), f"slots={host.slots}")
    comment = f" #{draw(_comment_text)}" if draw(st.booleans()) else ""
    return draw(_space) + " ".join([host.name, *opts]) + draw(_space) + comment


_filler = st.one_of(
    _space,  # blank (or whitespace-only) line
    _space.flatmap(lambda lead: _comment_text.map(lambda text: f"{lead}#{text}")),
)


@st.composite
def hostfile(draw: st.DrawFn) -> tuple[list[str], list[Host]]:
    """The file's lines, and the hosts it lists in order (unique names: the fleet refuses twins)."""
    names = draw(st.lists(_names, min_size=1, max_size=12, unique=True))
    hosts = [Host(n, draw(st.none() | st.integers(0, 4096))) for n in names]
    lines: list[str] = []
    for host in hosts:
        lines += draw(st.lists(_filler, max_size=2))
        lines.append(draw(host_line(host)))
    lines += draw(st.lists(_filler, max_size=2))
    return lines, hosts


#: Lines a launcher would choke on: an option without ``=``, an empty value, slots not a whole
#: number (a Unicode digit included: ``str.isdigit`` says yes to it, ``int`` does not).
_junk = st.sampled_from(
    [
        "worker slots",
        "worker slots=",
        "worker slots=eight",
        "worker slots=-1",
        "worker slots=2.5",
        "worker slots=\u00b2",
        "worker 8",
        "worker slots=4 extra",
    ]
)


def _read(lines: list[str]) -> tuple[Path, list[tuple[str, int | None]]]:
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "hosts").write_text("\n".join(lines) + "\n")
        nodes = ConfigNodes().nodes([NodeEntry(hostfile="hosts")], Defaults(), file="lm.toml", base=Path(d))
        return Path(d) / "hosts", [(n.name, n.slots) for n in nodes]


@given(hostfile())
def test_every_listed_host_once_in_order_with_its_slots(generated: tuple[list[str], list[Host]]) -> None:
    lines, hosts = generated
    _, got = _read(lines)
    assert got == [(h.name, h.slots) for h in hosts]


@given(hostfile(), _junk, st.data())
def test_a_junk_line_is_one_line_naming_it(
    generated: tuple[list[str], list[Host]], junk: str, data: st.DataObject
) -> None:
    lines, _ = generated
    at = data.draw(st.integers(0, len(lines)), label="junk line index")
    lines = [*lines[:at], junk, *lines[at:]]
    with pytest.raises(ConfigError) as err:
        _read(lines)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("lm.toml: nodes[0].hostfile: ")
    assert f"/hosts:{at + 1}: " in msg and "slots" in msg
    assert err.value.key == "nodes[0].hostfile"


@given(hostfile(), st.data())
def test_a_host_listed_twice_is_refused(generated: tuple[list[str], list[Host]], data: st.DataObject) -> None:
    """Twice is not "once, with the later slots": which line would the console act on?"""
    lines, hosts = generated
    twin = data.draw(st.sampled_from(hosts), label="host listed again")
    at = data.draw(st.integers(0, len(lines)), label="its second line's index")
    with pytest.raises(ConfigError) as err:
        _read([*lines[:at], twin.name, *lines[at:]])
    assert str(err.value) == f"lm.toml: nodes[0]: duplicate node name {twin.name!r} (also defined by nodes[0])"
