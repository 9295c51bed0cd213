"""UI preferences file: where it lives, atomic saves, unusable files, unwritable dirs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from backend.errors import ConfigError
from backend.ui_prefs import load_ui_prefs, prefs_path, save_ui_prefs, update_ui_prefs


@pytest.fixture
def cfg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


def test_prefs_live_in_the_config_dir_and_merge(cfg: Path) -> None:
    assert prefs_path() == cfg / "ui-prefs.json"
    assert load_ui_prefs() == {}
    update_ui_prefs(theme="loadmaster-light")
    update_ui_prefs(sort="name")
    assert json.loads((cfg / "ui-prefs.json").read_text()) == {"sort": "name", "theme": "loadmaster-light"}
    # Atomic: no temp files left beside it.
    assert sorted(p.name for p in cfg.iterdir()) == ["ui-prefs.json"]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_unusable_file_means_nothing_remembered(cfg: Path, content: str) -> None:
    cfg.mkdir(parents=True)
    (cfg / "ui-prefs.json").write_text(content)
    assert load_ui_prefs() == {}
    update_ui_prefs(theme="loadmaster-dark")  # and it is replaced by a good one
    assert load_ui_prefs() == {"theme": "loadmaster-dark"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_dir_is_a_clear_error(cfg: Path) -> None:
    cfg.mkdir(parents=True)
    cfg.chmod(0o500)
    try:
        with pytest.raises(ConfigError, match=r"ui-prefs\.json: cannot save UI preferences.*LOADMASTER_CONFIG_DIR"):
            save_ui_prefs({"theme": "x"})
    finally:
        cfg.chmod(0o700)


def test_config_dir_that_is_a_file_is_a_clear_error(cfg: Path) -> None:
    cfg.write_text("not a directory")
    with pytest.raises(ConfigError, match=r"cannot save UI preferences"):
        save_ui_prefs({"theme": "x"})
