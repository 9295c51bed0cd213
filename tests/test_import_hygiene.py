"""backend/ is headless: importing any backend module must not pull in textual or tui.

Every module under backend/ is imported (none skipped) in a fresh interpreter, one after the
other; the first module after which ``textual`` or ``tui`` shows up in ``sys.modules`` is named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = r"""
import importlib, json, pkgutil, sys, traceback

import backend

FORBIDDEN = ("textual", "tui")

def leaked():
    return sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)

failures, offenders, modules = [], {}, ["backend"]

def on_error(name):
    failures.append((name, traceback.format_exc(limit=3)))

for info in pkgutil.walk_packages(backend.__path__, "backend.", onerror=on_error):
    modules.append(info.name)

for name in modules:
    before = set(leaked())
    try:
        importlib.import_module(name)
    except BaseException:
        failures.append((name, traceback.format_exc(limit=3)))
        continue
    new = sorted(set(leaked()) - before)
    if new:
        offenders[name] = new[:5]

print(json.dumps({"modules": modules, "offenders": offenders, "failures": failures}))
"""


def test_backend_never_imports_textual_or_tui() -> None:
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    on_disk = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "backend").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    # Nothing skipped: every .py file under backend/ was reached (a folder without __init__.py
    # is invisible to pkgutil, so it would escape this check: give it one).
    missed = sorted(on_disk - set(report["modules"]))
    assert not missed, f"not imported (missing __init__.py?): {missed}"
    assert not report["failures"], "\n".join(f"{n}:\n{tb}" for n, tb in report["failures"])
    assert report["offenders"] == {}, "backend modules import the console (textual/tui): " + json.dumps(
        report["offenders"]
    )


def test_help_loads_neither_the_ssh_stack_nor_the_lab() -> None:
    """``loadmaster --help`` is a new user's first command: it builds every command's parser, and
    a command module that imported the SSH stack or the lab at its top made it cost ~0.3 s."""
    probe = (
        "import contextlib, io, sys\n"
        "sys.argv = ['loadmaster', '--help']\n"
        "from tui.entry import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = ('asyncssh', 'lab.fleet', 'lab.sshd', 'textual')\n"
        "print(sorted(m for m in sys.modules if m in heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
