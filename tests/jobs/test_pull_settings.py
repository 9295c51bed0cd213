"""The ``[pull]`` section (#30): the pull's and relay's knobs, moved out of ``[jobs]``.

An old ``[jobs]`` key is still read, with a one-line note naming where it moved; where both
sections set a key, ``[pull]`` wins and the note says the ``[jobs]`` one is ignored; a bad value is
reported under the key the file wrote. The command line prints each note once, on stderr.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.config import load_config_file, parse_config
from backend.errors import ConfigError
from backend.jobs.settings import JobSettings
from backend.pulls.settings import PullSettings
from backend.schema import parse_section
from tui.cli import main

NODE = '[[nodes]]\nname = "here"\ntransport = "local"\nscratch = "/tmp"\n\n'


def test_pull_settings_defaults_and_strict_parsing() -> None:
    s = PullSettings()
    assert (s.numworkers, s.concurrency, s.part_size_mib, s.fanout) == (256, 32, 64, "direct")
    parsed = parse_section(PullSettings, {"numworkers": 64, "relay_grace": "2s"}, file="f", key="pull")
    assert parsed.numworkers == 64 and parsed.relay_grace == 2.0
    with pytest.raises(ConfigError, match=r"pull\.numworkers: expected a whole number >= 1"):
        parse_section(PullSettings, {"numworkers": 0}, file="f", key="pull")
    with pytest.raises(ConfigError, match=r"pull\.fanout: expected one of direct, relay, relay-ssh, auto"):
        parse_section(PullSettings, {"fanout": "sideways"}, file="f", key="pull")


def test_jobs_keeps_only_what_every_job_kind_uses() -> None:
    parsed = parse_section(JobSettings, {"lost_after": "30s"}, file="f", key="jobs")
    assert parsed.lost_after == 30.0
    with pytest.raises(ConfigError, match=r"jobs\.bogus: unknown key"):
        parse_section(JobSettings, {"bogus": 1}, file="f", key="jobs")
    assert not hasattr(JobSettings(), "numworkers")


def test_the_new_spelling_has_no_note() -> None:
    cfg = parse_config({"jobs": {"lost_after": "3s"}, "pull": {"numworkers": 8}}, file="f.toml")
    assert cfg.section(PullSettings).numworkers == 8 and cfg.section(JobSettings).lost_after == 3.0
    assert cfg.notes == ()


def test_an_old_jobs_key_is_read_with_a_note_naming_where_it_moved() -> None:
    cfg = parse_config(
        {"jobs": {"numworkers": 8, "relay_ports": "42000-42010", "lost_after": "3s"}, "pull": {"concurrency": 3}},
        file="f.toml",
    )
    pull = cfg.section(PullSettings)
    assert (pull.numworkers, pull.relay_ports, pull.concurrency) == (8, "42000-42010", 3)
    assert cfg.section(JobSettings).lost_after == 3.0
    assert cfg.notes == (
        "f.toml: [jobs] numworkers is deprecated: it moved to [pull] numworkers",
        "f.toml: [jobs] relay_ports is deprecated: it moved to [pull] relay_ports",
    )


def test_a_key_in_both_sections_pull_wins_and_the_note_says_so() -> None:
    cfg = parse_config({"jobs": {"numworkers": 8}, "pull": {"numworkers": 3}}, file="f.toml")
    assert cfg.section(PullSettings).numworkers == 3
    assert cfg.notes == (
        "f.toml: [jobs] numworkers is ignored: [pull] numworkers is set too and wins (delete the [jobs] one)",
    )


def test_a_bad_old_key_is_reported_once_under_the_key_the_file_wrote() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"nodes": [{"name": "here", "transport": "local"}], "jobs": {"numworkers": 0}}, file="f.toml")
    assert str(err.value) == "f.toml: jobs.numworkers: expected a whole number >= 1, got 0"


def test_the_command_line_prints_each_note_once_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(NODE + '[jobs]\nlost_after = "3s"\ns5cmd = "/opt/s5cmd"\n')
    assert load_config_file(cfg).section(PullSettings).s5cmd == "/opt/s5cmd"
    assert main(["--config", str(cfg), "nodes"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"loadmaster: note: {cfg}: [jobs] s5cmd is deprecated: it moved to [pull] s5cmd"]
    assert "deprecated" not in out
    cfg.write_text(NODE + '[jobs]\nlost_after = "3s"\n\n[pull]\ns5cmd = "/opt/s5cmd"\n')
    assert main(["--config", str(cfg), "nodes"]) == 0
    assert capsys.readouterr().err == ""
