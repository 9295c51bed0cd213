"""The Transport interface every node is reached through, and its local-subprocess implementation.

Commands are shell strings run by the node's ``/bin/sh`` (over SSH by loadmaster's
per-connection command server, or by the login shell where that cannot start: write POSIX sh),
so callers build them with :func:`shlex.quote`/:func:`shlex.join`. Secrets never go in a
command: pass them as ``input`` (stdin) or write them with :meth:`Transport.write_file` (0600).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from backend.config import Node
from backend.errors import CommandFailed, CommandTimeout, NodeUnreachable
from backend.nodes.untrusted import (
    MAX_OUTPUT_BYTES,
    OutputTooLarge,
    bounded_lines,
    clean_block,
    read_capped,
)

#: sshd's default MaxSessions is 10; one spare for OpenSSH's own needs (agent, control).
DEFAULT_CHANNELS = 9
#: Seconds between SSH keepalives, and how many may go unanswered: a node that stops answering
#: (a black-holed link) is declared unreachable after interval x count seconds, 15 by default.
DEFAULT_KEEPALIVE = 5.0
DEFAULT_KEEPALIVE_COUNT = 3
#: Backoff after a failed connect: first delay and ceiling, in seconds.
DEFAULT_BACKOFF = (1.0, 30.0)


@dataclass(frozen=True)
class RunResult:
    """What one command did on one node."""

    node: str
    command: str
    exit_status: int | None
    stdout: str
    stderr: str
    elapsed: float

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


class Transport(ABC):
    """Run commands and move small files on one node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        #: Most bytes one command may print on stdout (and on stderr) before it is stopped.
        self.output_limit = MAX_OUTPUT_BYTES

    @property
    def name(self) -> str:
        return self.node.name

    @abstractmethod
    async def run(
        self,
        command: str,
        *,
        input: str | bytes | None = None,
        check: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the Transport contract
    ) -> RunResult:
        """Run ``command`` to completion; raise CommandFailed if ``check`` and it exits non-zero."""

    @abstractmethod
    def stream(self, command: str, *, input: str | bytes | None = None) -> AsyncIterator[str]:
        """Yield ``command``'s stdout line by line; closing the iterator stops the command."""

    async def read_file(self, path: str) -> bytes:
        """The bytes of a file on the node (FileNotFoundError when absent)."""
        res = await self._run_bytes(f"cat -- {shlex.quote(path)}")
        if res[0] != 0:
            err = res[2].decode(errors="replace")
            if "No such file" in err:
                raise FileNotFoundError(f"{self.name}:{path}")
            raise CommandFailed(self.name, f"cat {path}", res[0], err)
        return res[1]

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o600) -> None:
        """Write a file on the node atomically (tmp then rename), created with ``mode``."""
        q = shlex.quote(path)
        tmp = shlex.quote(f"{path}.tmp.{os.getpid()}")
        cmd = (
            f'umask 077 && mkdir -p -- "$(dirname -- {q})" && cat > {tmp} && chmod {mode:o} {tmp} && mv -f -- {tmp} {q}'
        )
        payload = data.encode() if isinstance(data, str) else data
        code, _out, err = await self._run_bytes(cmd, input=payload)
        if code != 0:
            raise CommandFailed(self.name, f"write {path}", code, err.decode(errors="replace"))

    @abstractmethod
    async def _run_bytes(self, command: str, *, input: bytes | None = None) -> tuple[int | None, bytes, bytes]:
        """Run a command with binary stdin/stdout (file transfer)."""

    async def connect(self) -> object:  # noqa: B027 - optional hook, a no-op for local
        """Open the connection now, waiting for a handshake slot (a no-op for local)."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook, a no-op for local
        """Release the connection (a no-op for local)."""


class ExecTransport(Transport):
    """A transport built on one primitive, :meth:`exec_bytes`: SSH, and SSH through the keeper."""

    @abstractmethod
    async def exec_bytes(
        self,
        command: str,
        input: bytes | None,
        timeout: float | None,  # noqa: ASYNC109
    ) -> tuple[int | None, bytes, bytes, float]:
        """Run ``command`` with binary stdin; (exit status, stdout, stderr, seconds)."""

    async def run(
        self,
        command: str,
        *,
        input: str | bytes | None = None,
        check: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the Transport contract
    ) -> RunResult:
        data = input.encode() if isinstance(input, str) else input
        code, out, err, elapsed = await self.exec_bytes(command, data, timeout)
        result = RunResult(
            self.name, command, code, out.decode(errors="replace"), err.decode(errors="replace"), elapsed
        )
        if check and not result.ok:
            raise _failed(result)
        return result

    async def _run_bytes(self, command: str, *, input: bytes | None = None) -> tuple[int | None, bytes, bytes]:
        code, out, err, _ = await self.exec_bytes(command, input, None)
        return code, out, err


def _failed(result: RunResult) -> CommandFailed:
    # The node's stderr ends up in a message on the operator's terminal: printable text only.
    return CommandFailed(result.node, result.command, result.exit_status, clean_block(result.stderr))


async def communicate_capped(
    proc: asyncio.subprocess.Process, data: bytes | None, node: str, command: str, limit: int = MAX_OUTPUT_BYTES
) -> tuple[bytes, bytes]:
    """A subprocess's stdout and stderr, each bounded by ``limit`` bytes (OutputTooLarge beyond).

    On any failure the readers are stopped before it propagates: the caller kills the process
    and reaps it with :func:`reap` (nothing else may be reading its pipes then).
    """

    async def feed() -> None:
        if proc.stdin is None:
            return
        try:
            if data:
                proc.stdin.write(data)
                await proc.stdin.drain()
            proc.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the command exited without reading its input

    assert proc.stdout is not None and proc.stderr is not None
    tasks = [
        asyncio.ensure_future(read_capped(proc.stdout, limit, node=node, what=f"command {command!r}")),
        asyncio.ensure_future(read_capped(proc.stderr, limit, node=node, what=f"command {command!r} (stderr)")),
        asyncio.ensure_future(feed()),
    ]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    await proc.wait()
    return tasks[0].result() or b"", tasks[1].result() or b""


async def reap(proc: asyncio.subprocess.Process) -> None:
    """Wait for a killed subprocess: its pipes are read to their end first (asyncio's wait()
    returns only once every pipe closed, and a pipe nobody reads stays paused, unclosed)."""
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(Exception):
                while await pipe.read(1 << 16):
                    pass
    await proc.wait()


class LocalTransport(Transport):
    """This machine, through local subprocesses: the embedded default needs no SSH."""

    async def run(
        self,
        command: str,
        *,
        input: str | bytes | None = None,
        check: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the Transport contract
    ) -> RunResult:
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh",
                "-c",
                command,
                stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise NodeUnreachable(self.name, f"cannot start /bin/sh: {exc}") from exc
        data = input.encode() if isinstance(input, str) else input
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
            # lands as the command finishes, leaving the caller running after stop().
            async with asyncio.timeout(timeout):
                out, err = await communicate_capped(proc, data, self.name, command, self.output_limit)
        except TimeoutError:
            _kill_group(proc.pid)
            await reap(proc)
            raise CommandTimeout(self.name, f"command {command!r} did not finish within {timeout:g}s") from None
        except OutputTooLarge:
            _kill_group(proc.pid)
            await reap(proc)
            raise
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            raise
        result = RunResult(
            self.name,
            command,
            proc.returncode,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            time.monotonic() - start,
        )
        if check and not result.ok:
            raise _failed(result)
        return result

    async def stream(self, command: str, *, input: str | bytes | None = None) -> AsyncIterator[str]:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            if input is not None and proc.stdin is not None:
                proc.stdin.write(input.encode() if isinstance(input, str) else input)
                await proc.stdin.drain()
                proc.stdin.close()
            assert proc.stdout is not None
            # Bounded lines: a node printing 200 MB without a newline costs one line's memory.
            async for raw in bounded_lines(proc.stdout):
                yield raw.decode(errors="replace")
        finally:
            if proc.returncode is None:
                _kill_group(proc.pid)
                await proc.wait()

    async def read_file(self, path: str) -> bytes:
        return await asyncio.to_thread(Path(path).read_bytes)

    async def write_file(self, path: str, data: bytes | str, *, mode: int = 0o600) -> None:
        payload = data.encode() if isinstance(data, str) else data
        await asyncio.to_thread(_atomic_write, Path(path), payload, mode)

    async def _run_bytes(self, command: str, *, input: bytes | None = None) -> tuple[int | None, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(input)
        return proc.returncode, out, err


def _atomic_write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, 9)
    except (ProcessLookupError, PermissionError):
        pass
