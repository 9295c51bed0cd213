"""Pull once, fan out inside the cluster (issue #21).

``k`` seed nodes pull a source from the store with s5cmd, exactly as a direct pull does, and every
other node receives the same objects from a peer over the cluster network, in a chain or a tree
(:mod:`backend.pulls.relay.planner`), writing to its DEST and forwarding to its own children while it
receives (:mod:`backend.pulls.relay.node`). Peers speak :mod:`backend.pulls.relay.protocol`: an HMAC handshake
on a per-job secret (delivered in the job's 0600 secrets file), then frames that each carry a
sequence number and a MAC, chunks with the SHA-256 of their bytes, checked before anything is
written or forwarded. The job kind is :mod:`backend.pulls.relay.job`.

Node side modules import nothing of the console's (the runner imports the kind's module alone).
"""
