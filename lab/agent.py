"""The lab nodes' agent: a real virtual environment at the default path, running this console's code.

A real node gets ``python3 -m venv ~/.loadmaster/agent/venv`` and ``pip install 'loadmaster[node]'``
(see :mod:`backend.nodes.agent`). The lab makes the same kind of venv once per lab (``python -m
venv``, no pip, no network) and, instead of installing from an index, lets it import the packages
of the interpreter running the lab (a ``.pth`` file): the nodes run exactly the loadmaster under
test, isolated (``-I``) as on a real node. Each node's ``$LOADMASTER_HOME/agent/venv`` is a link to
it, so the default agent path is the one used.
"""

from __future__ import annotations

import compileall
import site
import subprocess
import sys
from pathlib import Path

import backend
from backend.errors import LoadmasterError

#: The file in the lab venv's site-packages that points it at the console's packages.
PTH_NAME = "loadmaster-lab.pth"


def _checkout() -> Path:
    """The folder holding this ``backend`` package (a checkout, or site-packages)."""
    return Path(backend.__file__).resolve().parent.parent


def make_agent_venv(path: Path) -> Path:
    """A venv at ``path`` (made once, with this interpreter) that imports this interpreter's
    packages and this checkout's ``backend``; returns its python."""
    python = path / "bin" / "python"
    if not (path / "pyvenv.cfg").exists() or not python.exists():
        res = subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", "--clear", str(path)],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            raise LoadmasterError(f"cannot create the lab's agent venv {path}: {res.stderr.strip()[-300:]}")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = path / "lib" / version / "site-packages"
    packages.mkdir(parents=True, exist_ok=True)
    # addsitedir, not a bare path: the console's own .pth files (an editable install) apply too.
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    lines = ["import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs)] if dirs else []
    lines.append(str(_checkout()))  # a checkout run from source
    (packages / PTH_NAME).write_text("\n".join(lines) + "\n")
    return python


def compile_packages(root: Path | None = None) -> None:
    """Compile this checkout's packages to bytecode, as ``pip install`` does for an installed
    loadmaster, once (a no-op when they are current).

    Run from a checkout where ``PYTHONDONTWRITEBYTECODE`` is set (as on these machines), every
    ``loadmaster`` command, and every agent start on a node, would otherwise compile each module
    it imports anew: ~60 ms of CPU per CLI command (measured: a lab pull 0.35 -> 0.31 s wall),
    which no installed copy pays. A checkout that cannot be written is left as it is.
    """
    root = root or _checkout()
    for package in ("backend", "tui", "lab"):
        if (root / package / "__init__.py").is_file():
            compileall.compile_dir(root / package, quiet=2)


def link_agent_venv(node_home: Path, venv: Path) -> Path:
    """Make ``node_home/agent/venv`` (the default agent path) a link to ``venv``; returns the link."""
    link = node_home / "agent" / "venv"
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        return link  # a venv someone installed there by hand: theirs
    link.symlink_to(venv)
    return link
