"""Which interpreter runs loadmaster's agent on a node, kept apart from the training environment.

The wheel ships top-level ``backend``, ``tui`` and ``themes`` packages, and ``aiobotocore`` pins
``botocore`` tightly: installed into a training venv, pip would overwrite same-named packages
silently, and a training repo's own ``backend/`` on PYTHONPATH would shadow the agent. So, the way
pipx or ``uv tool`` install a CLI tool, the agent has a virtual environment of its own on every
node, ``$LOADMASTER_HOME/agent/venv`` (``~/.loadmaster/agent/venv`` by default, beside the jobs
directory), and its interpreter runs isolated (``-I``), so the node's PYTHONPATH and user
site-packages never reach it. :func:`install_command` is how that venv is made.

A node's ``agent`` setting overrides the default: a python (``/opt/lm/bin/python``) runs the agent
isolated the same way; anything else (``/opt/lm/bin/loadmaster``, a wrapper) runs as written,
followed by ``agent run|cleanup JOBDIR``. A ``transport = "local"`` node is this machine: the
console's own interpreter runs the agent, isolated too.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any

from backend import __version__
from backend.config import Node
from backend.nodes.untrusted import REASON_LIMIT, clean_text, loads_bounded

#: The agent's own virtual environment on a node, as shell text (expanded there): under
#: loadmaster's node home, where the jobs directory lives too.
VENV_SHELL = '"${LOADMASTER_HOME:-$HOME/.loadmaster}/agent/venv"'
#: Its interpreter, as shell text.
VENV_PYTHON_SHELL = '"${LOADMASTER_HOME:-$HOME/.loadmaster}/agent/venv/bin/python"'
#: The same path as the README and messages name it when the node's own is not known.
VENV_TEXT = "~/.loadmaster/agent/venv"
#: What the agent's interpreter runs: isolated (-I), the node-side entry only.
AGENT_ARGS = "-I -m backend.agent"
#: What :func:`probe_command` prints besides the agent's own answer.
PROBE_MARK = "@@agent"

_PYTHON = re.compile(r"python[0-9.]*")


def is_python(agent: str) -> bool:
    """Whether an ``agent`` setting names a Python interpreter (not a loadmaster executable)."""
    word = agent.strip()
    return bool(word) and " " not in word and bool(_PYTHON.fullmatch(word.rsplit("/", 1)[-1]))


def agent_python(node: Node, *, local_python: str | None = None) -> str | None:
    """Shell words naming the interpreter that runs the agent on ``node``; None where the node's
    ``agent`` setting names a loadmaster executable (which runs under its own interpreter)."""
    if node.agent:
        return shlex.quote(node.agent.strip()) if is_python(node.agent) else None
    if node.transport == "local":
        return shlex.quote(local_python or sys.executable)
    return VENV_PYTHON_SHELL


def agent_command(node: Node, *, local_python: str | None = None) -> str:
    """The shell words that start loadmaster's agent on ``node``, standing where the ``loadmaster``
    executable would: callers append ``agent run JOBDIR`` or ``agent cleanup JOBDIR``.

    By default ``<node home>/agent/venv/bin/python -I -m backend.agent``; for a local node,
    ``local_python`` (the console's own interpreter) instead. The node's ``agent`` setting wins.
    """
    python = agent_python(node, local_python=local_python)
    if python is None:
        return (node.agent or "").strip()
    return f"{python} {AGENT_ARGS}"


def _shell_path(path: str) -> str:
    """``path`` quoted for a shell, a leading ``~/`` left to expand."""
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


def install_command(venv: str = VENV_TEXT, version: str = __version__) -> str:
    """The commands that install the agent into its own venv on a node (run there as the user
    loadmaster connects as), at the console's loadmaster version."""
    v = _shell_path(venv)
    return f"python3 -m venv {v} && {v}/bin/pip install 'loadmaster[node]=={version}'"


def probe_command(node: Node, *, local_python: str | None = None) -> str:
    """Shell text that asks the node's agent (``agent info``) which interpreter and venv it runs in.

    Prints ``@@agent missing VENV`` where the default venv is not there; otherwise the agent's last
    lines of output (its answer is one JSON line), then ``@@agent rc N``.
    """
    ask = f'{{ {agent_command(node, local_python=local_python)} agent info 2>&1; echo "{PROBE_MARK} rc $?"; }}'
    ask += " | tail -n 6"
    if node.agent or node.transport == "local":
        return ask
    return f'V={VENV_SHELL}; if [ -x "$V/bin/python" ]; then {ask}; else echo "{PROBE_MARK} missing $V"; fi'


@dataclass(frozen=True)
class AgentReport:
    """Which interpreter and venv run the agent on a node, or why jobs cannot start there."""

    #: The command jobs start with (shell words, before ``agent run JOBDIR``).
    command: str
    #: The agent's interpreter (``sys.executable``) and its environment (``sys.prefix``).
    python: str | None = None
    prefix: str | None = None
    #: Whether it ran isolated (``-I``): the node's PYTHONPATH cannot shadow it.
    isolated: bool = False
    version: str | None = None
    #: Where its ``backend`` package was imported from.
    package: str | None = None
    #: Why jobs cannot start on this node (None when the agent answered as this console's version).
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (the ``agent`` object of ``loadmaster doctor --json``)."""
        return {
            "command": self.command,
            "python": self.python,
            "prefix": self.prefix,
            "isolated": self.isolated,
            "version": self.version,
            "package": self.package,
            "problem": self.problem,
        }


def _fix(node: Node, venv: str | None) -> str:
    """What to do about an agent that does not answer as it should."""
    if node.agent:
        return f"install loadmaster {__version__} where the node's 'agent' setting ({node.agent}) points"
    if node.transport == "local":
        return (
            f"install loadmaster {__version__} into this console's interpreter (-I ignores PYTHONPATH), "
            "or set this node's 'agent'"
        )
    return f"run {install_command(venv or VENV_TEXT)}"


def parse_probe(node: Node, lines: list[str], *, local_python: str | None = None) -> AgentReport:
    """What :func:`probe_command` printed, as a report (with a one-line problem where there is one)."""
    cmd = agent_command(node, local_python=local_python)
    info: dict[str, Any] | None = None
    rc: str | None = None
    said: list[str] = []
    for ln in lines:
        if ln.startswith(f"{PROBE_MARK} missing "):
            venv = clean_text(ln[len(f"{PROBE_MARK} missing ") :].strip(), REASON_LIMIT)
            return AgentReport(cmd, problem=f"no agent venv at {venv}: {_fix(node, venv)}")
        if ln.startswith(f"{PROBE_MARK} rc "):
            rc = ln[len(f"{PROBE_MARK} rc ") :].strip()
        elif ln.startswith("{"):
            try:
                doc = loads_bounded(ln, what="the agent's answer")
            except ValueError:
                doc = None
            info = doc if isinstance(doc, dict) else info
        elif ln.strip():
            said.append(clean_text(ln.strip(), REASON_LIMIT))
    if info is None or rc != "0":
        detail = said[-1] if said else f"exit status {rc or '?'}"
        return AgentReport(cmd, problem=f"the agent ({cmd}) does not answer 'agent info': {detail}; {_fix(node, None)}")

    def text(key: str) -> str | None:
        value = info.get(key) if info else None
        return clean_text(value, REASON_LIMIT) if isinstance(value, str) else None

    report = AgentReport(
        cmd,
        python=text("python"),
        prefix=text("prefix"),
        isolated=info.get("isolated") is True,
        version=text("version"),
        package=text("package"),
    )
    if report.version != __version__:
        return replace(
            report,
            problem=f"the agent is loadmaster {report.version}, this console "
            f"{__version__}: {_fix(node, report.prefix)}",
        )
    return report
