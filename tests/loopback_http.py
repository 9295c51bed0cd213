"""The in-process HTTP servers the tests run on loopback (a hostile Prometheus, a hostile
Alertmanager, the webhook sink): the stdlib's ThreadingHTTPServer with two test-time costs taken out.

* Its listen backlog is 5: a client that opens a dozen connections at once (the Prometheus source
  sends its queries in parallel) overflows it on a busy machine, the kernel drops the SYNs past it
  and the client sends them again a second later. 128 here: every connection is accepted at once.
* ``serve_forever`` checks for ``shutdown()`` every 0.5 s: stopping the server waited up to that
  long. :func:`serve` polls every 0.05 s.
"""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

#: Seconds between serve_forever's checks for shutdown().
POLL_S = 0.05


class LoopbackHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a backlog for a burst of parallel connections; request threads
    are daemons (a client that hangs never keeps the test process alive)."""

    request_queue_size = 128
    daemon_threads = True


def serve(server: ThreadingHTTPServer, name: str) -> threading.Thread:
    """Serve ``server`` from a daemon thread; ``server.shutdown()`` returns within :data:`POLL_S`."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL_S}, name=name, daemon=True)
    thread.start()
    return thread
