"""Reaching nodes: one async Transport interface, local subprocess and asyncssh implementations."""

from backend.nodes.transport import LocalTransport, RunResult, Transport

__all__ = ["LocalTransport", "RunResult", "Transport"]
