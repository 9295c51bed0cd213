"""Output of a command on a node is bounded and printable, on every transport: real sshd (through
the command server and over plain channels) and local subprocesses."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.errors import CommandFailed
from backend.nodes.transport import Transport
from backend.nodes.untrusted import (
    CUT_LINE,
    MAX_LINE_BYTES,
    OutputTooLarge,
    clean_block,
    clean_text,
)
from tests import test_transports

# The transport contract's own fixture: real sshd (command server, plain channels) and local.
transport = test_transports.transport

CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


async def test_a_line_without_newline_is_cut_and_the_stream_goes_on(transport: Transport) -> None:
    cmd = "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo next; printf 'tail without newline'"
    lines = [line async for line in transport.stream(cmd)]
    assert lines == [CUT_LINE, "next", "tail without newline"]


async def test_a_line_just_under_the_limit_is_whole(transport: Transport) -> None:
    cmd = f"head -c {MAX_LINE_BYTES} /dev/zero | tr '\\0' y; echo"
    [line] = [line async for line in transport.stream(cmd)]
    assert line == "y" * MAX_LINE_BYTES


async def test_run_output_over_the_limit_stops_the_command(transport: Transport) -> None:
    transport.output_limit = 1 << 20  # the default (256 MiB) works the same, only slower to show
    with pytest.raises(OutputTooLarge, match=r"printed more than 1,048,576 bytes; stopped it"):
        await transport.run("head -c 5000000 /dev/zero; sleep 30")
    with pytest.raises(OutputTooLarge, match=r"\(stderr\) printed more than|printed more than"):
        await transport.run("head -c 5000000 /dev/zero >&2")
    # The transport is fine afterwards, and output at the limit is returned whole.
    res = await transport.run(f"head -c {1 << 20} /dev/zero | tr '\\0' z")
    assert res.stdout == "z" * (1 << 20)


async def test_stderr_in_errors_is_printable(transport: Transport) -> None:
    with pytest.raises(CommandFailed) as info:
        await transport.run("printf '\\033]0;owned\\007\\033[2Jdisk \\033[31mfull\\n' >&2; exit 3", check=True)
    assert str(info.value).endswith("exited 3: disk full")
    assert not CONTROLS.search(str(info.value))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_cleaned_text_has_no_control_characters(text: str) -> None:
    line = clean_text(text, 50)
    assert not CONTROLS.search(line) and len(line) <= 50
    block = clean_block(text)
    assert not CONTROLS.search(block.replace("\n", "").replace("\t", ""))
    assert "\x1b" not in block  # no escape sequence can survive: its introducer is gone


def test_escape_sequences_are_removed_whole() -> None:
    assert clean_text("\x1b]8;;http://evil/\x07click\x1b]8;;\x07 \x1b[1;31mred\x1b[0m") == "click red"
    assert clean_text("a\x1bPq#0;2;0;0;0\x1b\\b") == "ab"  # DCS (sixel) with its payload
    assert clean_text("x" * 1000, 10) == "x" * 9 + "…"
