"""One root exception type with specific subclasses, in the style of asyncssh.misc.Error.

Every error a user can cause or meet carries a message that names the thing to fix; the CLI and
the console print ``str(exc)`` and never a traceback for these.
"""

from __future__ import annotations


class LoadmasterError(Exception):
    """Root of every error loadmaster raises on purpose."""


class ConfigError(LoadmasterError):
    """The configuration is invalid: the message names the file, the key path and what is expected."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        self.file = file
        self.key = key
        where = ""
        if file and key:
            where = f"{file}: {key}: "
        elif file:
            where = f"{file}: "
        elif key:
            where = f"{key}: "
        super().__init__(f"{where}{message}")


class NodeError(LoadmasterError):
    """Something went wrong reaching or using one node."""

    def __init__(self, node: str, message: str) -> None:
        self.node = node
        self.detail = message
        super().__init__(f"{node}: {message}")


class NodeUnreachable(NodeError):
    """The node could not be reached (refused, timed out, DNS, auth)."""


class HostKeyRefused(NodeUnreachable):
    """The node's host key is unknown or changed; both fingerprints are in the message."""

    def __init__(self, node: str, message: str, *, offered: str | None = None, expected: str | None = None) -> None:
        self.offered = offered
        self.expected = expected
        super().__init__(node, message)


class CommandFailed(NodeError):
    """A remote command exited non-zero where success was required."""

    def __init__(self, node: str, command: str, exit_status: int | None, stderr: str) -> None:
        self.command = command
        self.exit_status = exit_status
        self.stderr = stderr
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else "no error output"
        super().__init__(node, f"command {command!r} exited {exit_status}: {tail}")


class CommandTimeout(NodeError):
    """A remote command did not finish within its timeout."""


class StoreError(LoadmasterError):
    """An object store operation failed (missing bucket, bad credentials, ...)."""


class JobError(LoadmasterError):
    """A job could not be started, found or controlled."""


class PolicyError(LoadmasterError):
    """A policy refused an action, or a plan no longer matches the facts."""


class ReadOnlyRefused(PolicyError):
    """An operation that changes something was asked of read-only services (``--readonly``)."""
