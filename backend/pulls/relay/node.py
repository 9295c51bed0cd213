"""One node of a relay pull: what it holds, the server its children read from, the receiver that
reads from its upstream.

Every node serves its children from its own disk: :class:`Holdings` says, per object, how many
bytes are verified and written and in which file (the temporary while it arrives, the final
name once renamed). A child is served independently of its siblings, from wherever it is, so a
slow child holds back only its own subtree, and a child that re-attaches (its upstream died) to
any node above it resumes from the last verified byte: every node above has at least what the
dead one had.

A receiver writes each object as a direct pull does: a temporary beside the final name in
s5cmd's own naming scheme (so the pull's cleanup recognises it), renamed once every byte is
verified and the size matches the listing. Every byte it has passed a SHA-256 check on each hop
from the seed's file, and the seed's copy passed the direct pull's own verification (sizes, a
fresh listing's ETags, MD5 of single-part objects) before any receiver may end: its end message
says so, and only then does a receiver finish. A receiver hashes each chunk once (to check it)
and forwards it with that digest; the seed hashes each chunk once, whatever its children.

A peer is data, not authority, even one holding the secret: each receiver checks an object's
bytes against the listing before the object is renamed into place, with the proof a direct pull
would choose (:func:`receiver_proofs`): the store's full-object checksum (CRC64NVME, CRC32C, CRC32,
SHA-256, SHA-1) where the spec carries one, else a single-part object's MD5 ETag (the listing comes
from the console in the spec, not from a peer); every number in a message is range-checked
(:func:`count_in`, :func:`rate_in`); a handshake has :data:`HANDSHAKE_S` in all and handshakes
have a cap of their own (:data:`MAX_HANDSHAKES`), so peers without the secret never take a real
child's place; and a local write error (a full disk, EIO) fails the receiver with one line naming
DEST instead of re-attaching for ever.

The node's parts, one module each: :mod:`~backend.pulls.relay.holdings` (what it holds, shared by
both sides; the errors it ends with), :mod:`~backend.pulls.relay.server` (serving its children),
:mod:`~backend.pulls.relay.receiver` (reading from its upstream, re-attaching) and
:mod:`~backend.pulls.relay.proofs` (each object's proof, and the thread that computes it). This
module names them for the relay job kind (``backend.pulls.relay.job``).
"""

from __future__ import annotations

from backend.pulls.relay.holdings import (
    CONNECT_S,
    PING_S,
    SILENCE_S,
    Cancelled,
    CorruptObject,
    FatalUpstream,
    Holdings,
    LocalWriteError,
    RateWindow,
    listing_digest,
)
from backend.pulls.relay.proofs import MD5_BACKLOG, Md5Pipe, ObjectProof, ProofPipe, receiver_proofs
from backend.pulls.relay.protocol import HANDSHAKE_S
from backend.pulls.relay.receiver import SLOW_RATIO, SLOW_S, START_S, Receiver, Upstream, temp_name
from backend.pulls.relay.server import (
    LISTEN_RETRY_S,
    MAX_CONNECTIONS,
    MAX_HANDSHAKES,
    STAT_S,
    ChildState,
    RelayServer,
)

__all__ = [
    "CONNECT_S",
    "HANDSHAKE_S",
    "LISTEN_RETRY_S",
    "MAX_CONNECTIONS",
    "MAX_HANDSHAKES",
    "MD5_BACKLOG",
    "PING_S",
    "SILENCE_S",
    "SLOW_RATIO",
    "SLOW_S",
    "START_S",
    "STAT_S",
    "Cancelled",
    "ChildState",
    "CorruptObject",
    "FatalUpstream",
    "Holdings",
    "LocalWriteError",
    "Md5Pipe",
    "ObjectProof",
    "ProofPipe",
    "RateWindow",
    "RelayServer",
    "Receiver",
    "Upstream",
    "listing_digest",
    "receiver_proofs",
    "temp_name",
]
