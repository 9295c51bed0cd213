"""The wheel an operator installs: console script, themes inside, torch only in the node extra."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        check=True,
    )
    (whl,) = out.glob("loadmaster-*.whl")
    return whl


def test_wheel_ships_packages_and_themes(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "backend/__init__.py" in names
    assert "tui/app.py" in names
    assert "lab/__init__.py" in names, "`loadmaster lab` needs the lab package in the wheel"
    assert "themes/__init__.py" in names
    tcss = [n for n in names if n.startswith("themes/") and n.endswith(".tcss")]
    assert "themes/app.tcss" in tcss, names
    assert not any(n.startswith("tests/") for n in names), "tests must not ship in the wheel"


def test_wheel_metadata_entry_point_and_extras(wheel: Path) -> None:
    zf = zipfile.ZipFile(wheel)
    meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(zf.read(meta_name).decode())
    requires = meta.get_all("Requires-Dist") or []
    base = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("textual") for r in base)
    assert any(r.startswith("asyncssh") for r in base)
    # An operator's laptop must not need torch: it is only in the node extra.
    assert not any(r.startswith("torch") for r in base)
    node_extra = [r for r in requires if r.replace('"', "'").endswith("extra == 'node'")]
    assert any(r.startswith("torch") for r in node_extra), requires
    assert any(r.startswith("safetensors") for r in node_extra)
    ep_name = next(n for n in zf.namelist() if n.endswith(".dist-info/entry_points.txt"))
    assert "loadmaster = tui.entry:main" in zf.read(ep_name).decode()


def test_installed_wheel_runs_with_its_themes(wheel: Path, tmp_path: Path) -> None:
    """A plain (non-editable) install finds its themes: import from the wheel, not the checkout."""
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)], check=True
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import themes, tui.app, pathlib;"
        "assert pathlib.Path(themes.__file__).is_relative_to(sys.argv[1]), themes.__file__;"
        "paths = tui.app.LoadmasterApp.CSS_PATH;"
        "paths = paths if isinstance(paths, list) else [paths];"
        "assert paths and all(pathlib.Path(p).exists() for p in paths), paths;"
        "print('ok')"
    )
    res = subprocess.run([sys.executable, "-c", code, str(target)], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "ok" in res.stdout
