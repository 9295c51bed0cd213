"""The relay's frames: a chunk that is corrupted, reordered, replayed or forged is never written."""

from __future__ import annotations

import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.pulls.relay.protocol import (
    AuthError,
    Chunk,
    ChunkCheck,
    FrameCodec,
    ProtocolError,
    client_handshake,
    read_frame,
    server_handshake,
)

KEY = b"k" * 32


def _frames(data: list[bytes], chunk: int) -> list[bytes]:
    """Every object of ``data`` as chunk frames, in order, then an end message."""
    codec = FrameCodec(KEY)
    out = []
    for i, body in enumerate(data):
        for off in range(0, len(body), chunk):
            out.append(codec.chunk(i, off, body[off : off + chunk]))
    out.append(codec.ctrl({"t": "end"}))
    return out


def _split(frame: bytes) -> tuple[int, bytes, bytes]:
    kind, length = frame[0], int.from_bytes(frame[1:5], "big")
    return kind, frame[5 : 5 + length], frame[5 + length :]


def _receive(frames: list[bytes], sizes: list[int]) -> tuple[list[bytearray], bool]:
    """Apply frames as a receiver does: write each accepted chunk, stop at the first refusal."""
    written = [bytearray(n) for n in sizes]
    check = ChunkCheck(KEY, sizes, [0] * len(sizes))
    for f in frames:
        try:
            got = check.frame(*_split(f))
        except ProtocolError:
            return written, False
        if isinstance(got, Chunk):
            written[got.index][got.offset : got.offset + len(got.data)] = got.data
            check.accepted(got)
    return written, True


objects = st.lists(st.binary(min_size=1, max_size=300), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(objects, st.integers(1, 64))
def test_an_untouched_stream_is_accepted_whole(data: list[bytes], chunk: int) -> None:
    written, ok = _receive(_frames(data, chunk), [len(d) for d in data])
    assert ok and [bytes(w) for w in written] == data


@settings(max_examples=300, deadline=None)
@given(objects, st.integers(1, 64), st.data())
def test_a_flipped_byte_anywhere_stops_the_stream_before_it_is_written(
    data: list[bytes], chunk: int, draw: st.DataObject
) -> None:
    frames = _frames(data, chunk)
    n = draw.draw(st.integers(0, len(frames) - 1))
    pos = draw.draw(st.integers(0, len(frames[n]) - 1))
    bit = draw.draw(st.integers(0, 7))
    bad = bytearray(frames[n])
    bad[pos] ^= 1 << bit
    frames[n] = bytes(bad)
    written, ok = _receive(frames, [len(d) for d in data])
    assert not ok
    # Everything written is the source's bytes; nothing of the damaged frame or after it.
    for w, d in zip(written, data, strict=True):
        for i, b in enumerate(w):
            assert b == 0 or b == d[i]
    # Nothing at or after the damaged frame was written: only the chunks before it.
    before = _receive(frames[:n], [len(d) for d in data])[0]
    assert written == before


@settings(max_examples=200, deadline=None)
@given(objects, st.integers(1, 64), st.data())
def test_reordered_replayed_or_dropped_frames_are_refused(data: list[bytes], chunk: int, draw: st.DataObject) -> None:
    frames = _frames(data, chunk)
    if len(frames) < 2:
        return
    i = draw.draw(st.integers(0, len(frames) - 2))
    how = draw.draw(st.sampled_from(["swap", "replay", "drop"]))
    if how == "swap":
        frames[i], frames[i + 1] = frames[i + 1], frames[i]
    elif how == "replay":
        frames.insert(i + 1, frames[i])
    else:
        del frames[i]
    written, ok = _receive(frames, [len(d) for d in data])
    assert not ok
    for w, d in zip(written, data, strict=True):
        assert all(b == 0 or b == d[k] for k, b in enumerate(w))


def test_a_chunk_under_another_key_is_refused() -> None:
    forged = FrameCodec(b"x" * 32).chunk(0, 0, b"hello")
    with pytest.raises(ProtocolError, match="bad MAC"):
        ChunkCheck(KEY, [5], [0]).frame(*_split(forged))


def test_a_chunk_must_continue_where_the_verified_bytes_end() -> None:
    codec = FrameCodec(KEY)
    ahead = codec.chunk(0, 3, b"lo")
    with pytest.raises(ProtocolError, match="verified bytes end at 0"):
        ChunkCheck(KEY, [5], [0]).frame(*_split(ahead))
    past = FrameCodec(KEY).chunk(0, 0, b"hello!")
    with pytest.raises(ProtocolError, match="runs past its size"):
        ChunkCheck(KEY, [5], [0]).frame(*_split(past))


def _pair(client_secret: str, server_secret: str) -> tuple[object, object]:
    a, b = socket.socketpair()
    result: dict[str, object] = {}

    def serve() -> None:
        try:
            result["server"] = server_handshake(b, server_secret, "g1")
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            result["server"] = exc

    t = threading.Thread(target=serve)
    t.start()
    try:
        client: object = client_handshake(a, client_secret, "g1", "node-02")
    except Exception as exc:  # noqa: BLE001
        client = exc
    a.close()
    t.join(5)
    b.close()
    return client, result["server"]


def test_handshake_agrees_on_a_session_key_only_with_the_secret() -> None:
    client, server = _pair("s3cret", "s3cret")
    assert isinstance(client, bytes) and server == ("node-02", client)
    client, server = _pair("wrong", "s3cret")
    # The client finds the server's proof wrong and leaves before proving anything itself.
    assert isinstance(client, AuthError) and isinstance(server, ConnectionError | AuthError)
    client, server = _pair("s3cret", "wrong")
    assert isinstance(client, AuthError) and isinstance(server, ConnectionError | AuthError)


def test_frames_over_a_socket_round_trip() -> None:
    a, b = socket.socketpair()
    codec = FrameCodec(KEY)
    a.sendall(codec.chunk(0, 0, b"abc") + codec.ctrl({"t": "end"}))
    check = ChunkCheck(KEY, [3], [0])
    got = check.frame(*read_frame(b))
    assert isinstance(got, Chunk) and got.data == b"abc"
    check.accepted(got)
    assert check.frame(*read_frame(b)) == {"t": "end"}
    a.close()
    b.close()
