"""Slurm's own commands, run the way an operator runs them: one ``sinfo`` and one ``squeue`` per
read (never one call per node), ``scontrol update`` for a change. From Slurm 23.02 ``sinfo --json``
is grouped by partition and state (``{"sinfo": [...]}``, one reason for many nodes), so there the
nodes are read with ``scontrol show node --json`` (one record per node) from the first read on.

Each command runs with its arguments as a list (no shell), ``SLURM_CONF`` from the config when set,
a timeout, and its output read up to :data:`MAX_OUTPUT` bytes. Errors are one line naming the
command and what Slurm said. ``--json`` is used where this Slurm has it (21.08+ with the openapi
plugins); otherwise the text forms ``scontrol show node -o`` and ``scontrol show job -d -o``.

With ``[slurm] url`` the nodes and jobs are read from slurmrestd instead (``GET
/slurm/<api>/nodes`` and ``/jobs``: the same JSON shapes, the same adapters), with
``X-SLURM-USER-NAME`` and, when ``token_env`` is set in the environment, ``X-SLURM-USER-TOKEN``
(the token is never shown). Changes still run ``scontrol``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import time
from dataclasses import dataclass

from backend.errors import LoadmasterError
from backend.slurm.model import SlurmJob, SlurmNode, SlurmSnapshot
from backend.slurm.parse import (
    SinfoGrouped,
    clean,
    parse_jobs_json,
    parse_jobs_text,
    parse_nodes_json,
    parse_nodes_text,
)
from backend.slurm.settings import SlurmSettings

#: The most bytes read from one command (1,024 nodes of sinfo --json are about 2 MB).
MAX_OUTPUT = 64 * 1024 * 1024
INSTALL_HINT = "install Slurm's client commands (Debian: apt-get install slurm-client) or set [slurm] bin_dir"


class SlurmError(LoadmasterError):
    """A Slurm command failed or could not run: the message names the command and Slurm's words."""


class SlurmNotFound(SlurmError):
    """sinfo/squeue/scontrol are not installed where the config says."""


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    rc: int
    stdout: bytes
    stderr: str


class SlurmClient:
    """Runs Slurm's commands for one ``[slurm]`` section."""

    def __init__(self, settings: SlurmSettings, *, env: dict[str, str] | None = None) -> None:
        self.settings = settings
        self._env = env
        self._json: bool | None = None
        #: This Slurm's ``sinfo --json`` groups nodes (23.02+): nodes are read with scontrol.
        self._grouped_sinfo = False

    def binary(self, name: str) -> str:
        """The path of Slurm's ``name`` command; SlurmNotFound when absent."""
        if self.settings.bin_dir:
            path = os.path.join(os.path.expanduser(self.settings.bin_dir), name)
            if os.access(path, os.X_OK):
                return path
        else:
            found = shutil.which(name)
            if found:
                return found
        raise SlurmNotFound(f"{name} not found ({INSTALL_HINT})")

    def env(self) -> dict[str, str]:
        env = dict(self._env if self._env is not None else os.environ)
        if self.settings.conf:
            env["SLURM_CONF"] = os.path.expanduser(self.settings.conf)
        return env

    def _check_conf(self) -> None:
        """A configured ``conf`` that cannot be read is refused before any command runs: Slurm's
        commands retry a missing slurm.conf for up to 60 s, so the operator would wait out the
        timeout to read "slurmctld busy or down?" instead of what to fix."""
        if not self.settings.conf:
            return
        path = os.path.expanduser(self.settings.conf)
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise SlurmError(f"cannot read slurm.conf {path}: {exc.strerror} (set [slurm] conf)") from None

    def argv(self, name: str, *args: str) -> list[str]:
        """The command as it will run (shown to the operator before any change)."""
        cluster = ["--clusters", self.settings.cluster] if self.settings.cluster and name != "scontrol" else []
        return [name, *cluster, *args]

    async def run(self, argv: list[str], *, check: bool = True) -> CommandResult:
        """Run one Slurm command; SlurmError on a non-zero exit when ``check``."""
        full = [self.binary(argv[0]), *argv[1:]]
        self._check_conf()
        try:
            proc = await asyncio.create_subprocess_exec(
                *full,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self.env(),
                start_new_session=True,
            )
        except OSError as exc:
            raise SlurmError(f"cannot run {argv[0]}: {exc.strerror}") from None
        try:
            out, err = await asyncio.wait_for(_read(proc), timeout=self.settings.timeout)
        except TimeoutError:
            await _kill_and_reap(proc)
            raise SlurmError(
                f"{shlex.join(argv)} took longer than {self.settings.timeout:g}s (slurmctld busy or down?)"
            ) from None
        rc = proc.returncode if proc.returncode is not None else -1
        stderr = err.decode(errors="replace")
        if check and rc != 0:
            raise SlurmError(f"{shlex.join(argv)} failed: {_first_line(stderr) or f'exit {rc}'}")
        return CommandResult(tuple(argv), rc, out, stderr)

    async def _json_or_text(self, json_argv: list[str], text_argv: list[str]) -> tuple[bool, bytes]:
        if self._json is not False:
            res = await self.run(json_argv, check=False)
            if res.rc == 0:
                self._json = True
                return True, res.stdout
            if not _no_json(res.stderr):
                raise SlurmError(f"{shlex.join(json_argv)} failed: {_first_line(res.stderr) or f'exit {res.rc}'}")
            self._json = False
        res = await self.run(text_argv)
        return False, res.stdout

    async def rest(self, what: str) -> bytes:
        """``GET /slurm/<api>/<what>`` from slurmrestd: the JSON body; SlurmError naming slurmrestd
        and its first error otherwise (never the token)."""
        import getpass

        from backend.http import HttpClient

        st = self.settings
        env = self._env if self._env is not None else os.environ
        headers = {"Accept": "application/json", "X-SLURM-USER-NAME": st.user or getpass.getuser()}
        token = env.get(st.token_env)
        if token:
            headers["X-SLURM-USER-TOKEN"] = token
        http = HttpClient(
            st.url,
            name="slurmrestd",
            timeout=st.timeout,
            max_body=MAX_OUTPUT,
            error=SlurmError,
            follow_redirects=False,
            headers=headers,
        )
        path = f"/slurm/{st.api}/{what}"
        try:
            answer = await http.request("GET", path)
        finally:
            await http.close()
        if answer.status != 200:
            why = _rest_error(answer.body) or answer.reason or "no reason given"
            raise SlurmError(f"slurmrestd {http.shown} answered GET {path} with HTTP {answer.status}: {why}")
        return answer.body

    async def nodes(self) -> tuple[list[SlurmNode], list[str]]:
        """Every node (of the configured partitions), in one call."""
        parts = ["--partition", ",".join(self.settings.partitions)] if self.settings.partitions else []
        text_argv = self.argv("scontrol", "show", "node", "-o", "-d")
        if self.settings.url:
            is_json, out = True, await self.rest("nodes")
        elif self._grouped_sinfo:
            is_json, out = True, (await self.run(self.argv("scontrol", "show", "node", "--json"))).stdout
        else:
            is_json, out = await self._json_or_text(self.argv("sinfo", "--json", *parts), text_argv)
        try:
            nodes, skipped = parse_nodes_json(out) if is_json else parse_nodes_text(out.decode(errors="replace"))
        except SinfoGrouped:
            # 23.02+: sinfo --json is one record per partition and state (one reason for many
            # nodes); scontrol show node --json is one record per node, in the same shapes.
            self._grouped_sinfo = True
            out = (await self.run(self.argv("scontrol", "show", "node", "--json"))).stdout
            nodes, skipped = parse_nodes_json(out)
        if self.settings.partitions:
            wanted = set(self.settings.partitions)
            nodes = [n for n in nodes if wanted & set(n.partitions)]
        return nodes, skipped

    async def jobs(self) -> tuple[list[SlurmJob], list[str]]:
        """Every job (running and pending), in one call."""
        if self.settings.url:
            return parse_jobs_json(await self.rest("jobs"))
        is_json, out = await self._json_or_text(
            self.argv("squeue", "--json"), self.argv("scontrol", "show", "job", "-d", "-o")
        )
        return parse_jobs_json(out) if is_json else parse_jobs_text(out.decode(errors="replace"))

    async def snapshot(self) -> SlurmSnapshot:
        """Nodes and jobs, read now: two Slurm calls."""
        nodes, s1 = await self.nodes()
        jobs, s2 = await self.jobs()
        return SlurmSnapshot(tuple(nodes), tuple(jobs), time.time(), tuple(s1 + s2), skipped_jobs=len(s2))


async def _read(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """stdout up to MAX_OUTPUT (past it the command is killed: refused), stderr's first 64 KiB."""
    assert proc.stdout is not None and proc.stderr is not None
    err_task = asyncio.ensure_future(_read_capped(proc.stderr, 64 * 1024))
    try:
        out = await _read_capped(proc.stdout, MAX_OUTPUT + 1)
        if len(out) > MAX_OUTPUT:
            await _kill_and_reap(proc)
            raise SlurmError(f"Slurm's answer is larger than {MAX_OUTPUT // 2**20} MiB: refused")
        err = await err_task
        await proc.wait()
        return out, err
    finally:
        err_task.cancel()


async def _kill_and_reap(proc: asyncio.subprocess.Process) -> None:
    """Kill the command and read its pipes to their end: asyncio's wait() returns only once the
    pipes have closed, and a pipe left full never does."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: a child holding the pipe goes too
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            while await stream.read(1 << 20):
                pass
    await proc.wait()


async def _read_capped(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Read to EOF or ``limit`` bytes, whichever comes first (each read waits: a cancellation point)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await stream.read(min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _rest_error(body: bytes) -> str:
    """slurmrestd's first error (``{"errors": [{"error": ..., "description": ...}]}``), one line."""
    import json

    try:
        doc = json.loads(body[:65536])
    except (ValueError, RecursionError):
        return _first_line(body[:300].decode(errors="replace"))
    errors = doc.get("errors") if isinstance(doc, dict) else None
    if isinstance(errors, list) and errors and isinstance(errors[0], dict):
        e = errors[0]
        parts = [clean(e.get(k), 200) for k in ("description", "error") if e.get(k)]
        return " - ".join(dict.fromkeys(p for p in parts if p))
    return ""


def _first_line(text: str) -> str:
    lines = [clean(ln, 300) for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else ""


def _no_json(stderr: str) -> bool:
    """This Slurm has no ``--json`` (an old release, or no openapi/data_parser plugin)."""
    s = stderr.lower()
    return "unrecognized option" in s or "invalid option" in s or ("plugin" in s and "json" in s)
