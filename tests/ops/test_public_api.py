"""The front ends import backend only through the operation layer (#30): the import-linter contract
in pyproject.toml covers every backend module but the allowed ones, and every name an ops module
exports resolves (its re-exports load on first use, so a wrong table would only fail at run time).
"""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import backend.ops

ROOT = Path(__file__).resolve().parents[2]
#: What tui/ may import from backend (and the ops package's modules).
ALLOWED = {"ops", "errors", "units", "config", "services", "textfmt"}
#: The tui modules that may import more: entry points that start a process of their own, and the lab.
ENTRY_POINTS = {"tui.entry", "tui.cli.jobs", "tui.cli.keeper", "tui.cli.lab"}


def _tui_contract() -> dict[str, list[str]]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["source_modules"] == ["tui"]]
    return contract  # type: ignore[no-any-return]


def test_the_contract_forbids_every_other_backend_module() -> None:
    """A backend package added later must be named in the contract (or be allowed here on purpose)."""
    present = {
        p.stem if p.is_file() else p.name
        for p in (ROOT / "backend").iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())
    }
    contract = _tui_contract()
    forbidden = {m.removeprefix("backend.") for m in contract["forbidden_modules"] if m.startswith("backend.")}
    assert forbidden == present - ALLOWED
    assert "lab" in contract["forbidden_modules"]


def test_only_entry_points_are_exempt() -> None:
    importers = {rule.split(" -> ")[0].strip() for rule in _tui_contract().get("ignore_imports", [])}
    assert importers <= ENTRY_POINTS


def test_every_exported_name_resolves() -> None:
    for info in pkgutil.iter_modules(backend.ops.__path__, "backend.ops."):
        module = importlib.import_module(info.name)
        for name in getattr(module, "__all__", ()):
            assert getattr(module, name) is not None, f"{info.name}.{name}"


def test_a_wrong_name_is_an_attribute_error() -> None:
    import backend.ops.types as types

    try:
        types.NoSuchType  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchType" in str(exc)
    else:
        raise AssertionError("a name not in the table resolved")


def test_the_public_types_load_lazily() -> None:
    """Importing ops.types loads none of the modules it re-exports until a name is asked for."""
    code = (
        "import sys\nimport backend.ops.types as t\n"
        "print('backend.telemetry.model' in sys.modules)\n"
        "t.FleetSnapshot\nprint('backend.telemetry.model' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
