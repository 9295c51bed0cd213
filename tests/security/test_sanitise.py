"""The one sanitiser for text from outside (backend/textfmt.py): whatever a node, Alertmanager,
Prometheus or a store says, what reaches a terminal has no escape sequence, no control character,
no bidi override, no secret in a URL, and stays within its length."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from backend.textfmt import MASK, redact, redact_known, safe_block, safe_text

#: Characters a terminal acts on (C0 but tab/newline in blocks, DEL, C1) and the bidi controls.
_ACTIVE = {chr(c) for c in (*range(0x00, 0x20), *range(0x7F, 0xA0))} | set("\u202a\u202b\u202c\u202d\u202e")
_ACTIVE |= set("\u2066\u2067\u2068\u2069\u200e\u200f\u061c")

#: Text built from what attacks are made of, mixed with anything.
_PIECES = st.sampled_from(
    [
        "\x1b[31m",
        "\x1b]52;c;Y3VybCBldmlsLnNo\x07",  # OSC 52: write the clipboard
        "\x1b]8;;http://evil/\x1b\\",  # a hyperlink
        "\x1b]0;title\x9c",
        "\x9b2J",
        "\x1bP+q\x1b\\",
        "\u202e",
        "\u2066",
        "\r",
        "\n",
        "\x00",
        "https://u:p4ss@host/x",
        "?token=abc",
    ]
)
_TEXT = st.lists(st.one_of(_PIECES, st.text(max_size=8)), max_size=12).map("".join)


@given(text=_TEXT, limit=st.integers(min_value=1, max_value=300))
@example(text="\x1b]52;c;ZXZpbA==\x07ok", limit=10)
def test_safe_text_is_one_inert_line_within_its_limit(text: str, limit: int) -> None:
    out = safe_text(text, limit)
    assert not (_ACTIVE & set(out)), repr(out)
    assert len(out) <= limit
    assert "p4ss" not in out


@given(text=_TEXT)
def test_safe_block_keeps_lines_but_nothing_active(text: str) -> None:
    out = safe_block(text)
    assert not ((_ACTIVE - {"\n", "\t"}) & set(out)), repr(out)
    assert "p4ss" not in out


@given(text=_TEXT)
def test_cleaning_twice_changes_nothing_more(text: str) -> None:
    once = safe_text(text, None)
    assert safe_text(once, None) == once


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "postgresql://loadmaster:hunter2@db.internal:5432/lm refused",
            "postgresql://loadmaster:***@db.internal:5432/lm refused",
        ),
        ("postgres://:hunter2@db/lm", "postgres://:***@db/lm"),
        ("clone https://ghp_abcdefghij0123456789@github.com/x/y", "clone https://***@github.com/x/y"),
        (
            "POST https://hooks.slack.com/services/T000/B000/XXXXXXXX failed",
            "POST https://hooks.slack.com/services/*** failed",
        ),
        ("https://discord.com/api/webhooks/123456/abc-DEF_ghi", "https://discord.com/api/webhooks/***"),
        (
            "GET https://b.s3.amazonaws.com/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=f00d&x=1",
            "GET https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&x=1",
        ),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", "Authorization: Bearer ***"),
        ("key AKIAIOSFODNN7EXAMPLE leaked", f"key {MASK} leaked"),
        ("sent Authorization: Basic dXNlcjpwYXNz", "sent Authorization: Basic ***"),
        (
            "Basic authentication required; token expiration soon",
            "Basic authentication required; token expiration soon",
        ),
        ("https://x/api/v1/job/ab12cd34ef56ab12cd34ef56ab12cd34ef", "https://x/api/v1/job/***"),
        ("ssh://root@node-01:22", "ssh://root@node-01:22"),
        (
            "s3://ckpt/run-7/global_step_000120000/model-00001-of-00008.safetensors missing",
            "s3://ckpt/run-7/global_step_000120000/model-00001-of-00008.safetensors missing",
        ),
        # Plain text and ordinary URLs are left alone.
        ("node-01 GPU 3 at 99 %", "node-01 GPU 3 at 99 %"),
        ("see http://prometheus:9090/graph?g0.expr=up", "see http://prometheus:9090/graph?g0.expr=up"),
        ("http://console.example/job/pull-20240501-1", "http://console.example/job/pull-20240501-1"),
    ],
)
def test_secrets_in_urls_are_redacted(text: str, shown: str) -> None:
    assert redact(text) == shown
    assert safe_text(text) == shown


def test_a_known_secret_is_removed_wherever_it_is_echoed() -> None:
    url = "https://chat.example/hook/T0KEN-s3cret-9f8e7d"
    said = "404: no such hook /hook/T0KEN-s3cret-9f8e7d (token T0KEN-s3cret-9f8e7d)"
    out = redact_known(said, [url])
    assert "T0KEN" not in out and "s3cret" not in out
    assert out == "404: no such hook *** (token ***)"


def test_a_flood_costs_a_bounded_amount() -> None:
    out = safe_text("\x1b[31m" * 1_000_000 + "x" * 1_000_000, 100)
    assert len(out) <= 100 and "\x1b" not in out


def test_watch_prints_a_change_as_one_clean_line() -> None:
    from tui.cli.watch import _line

    line = _line(
        "firing", {"alertname": "JobLost", "node": "gpu-01", "job_id": "j\x1b]52;c;eA==\x07-1"}, "died:\r\nFAKE"
    )
    assert line == "firing JobLost [] job_id=j-1, node=gpu-01: died: FAKE"
