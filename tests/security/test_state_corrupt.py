"""A state database that is truncated, overwritten or damaged on disk (real SQLite files, cut and
scribbled on) is a one-line error naming the file and ``loadmaster state repair``, which keeps
every row it can still read; a full disk (a real 1 MiB tmpfs) is one line too."""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.state import SQLiteState, StateCorrupt, StateError, check_state, repair_state
from tui.cli import main

AUDITS = 3000
JOBS = 400


def fill(path: Path) -> None:
    """A state database as loadmaster writes it: jobs and audit records, checkpointed to the file."""
    db = SQLiteState(path)
    db.executemany(
        "INSERT INTO jobs (id, node, kind, state, created, launched_by, launched_from, updated)"
        " VALUES (?, 'node-01', 'pull', 'succeeded', ?, 'op@host', 'cli', ?)",
        [(f"job-{i:05d}", float(i), float(i)) for i in range(JOBS)],
    )
    for i in range(AUDITS):
        db.record_audit("retention.apply", f"s3://bucket/run/{i}", "ok", detail={"i": i})
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("state-template") / "state.sqlite3"
    fill(path)
    return path


@pytest.fixture
def state(tmp_path: Path, template: Path) -> tuple[Path, Path]:
    """(config file, state database path): a local node and the state dir under tmp_path."""
    sdir = tmp_path / "state"
    sdir.mkdir()
    shutil.copyfile(template, sdir / "state.sqlite3")
    cfg = tmp_path / "lm.toml"
    cfg.write_text(f'[[nodes]]\nname = "here"\ntransport = "local"\n\n[state]\ndir = "{sdir}"\n')
    return cfg, sdir / "state.sqlite3"


def cli(capsys: pytest.CaptureFixture[str], cfg: Path, *argv: str) -> tuple[int, str, str]:
    rc = main(["--config", str(cfg), *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def assert_one_line_damaged(err: str, db: Path) -> None:
    [line] = err.strip().splitlines()
    assert line.startswith(f"loadmaster: error: state database {db} is damaged (")
    assert "run 'loadmaster state repair'" in line


def truncate(db: Path, fraction: float) -> None:
    with open(db, "r+b") as f:
        f.truncate(int(os.path.getsize(db) * fraction))


def scribble(db: Path, offset: int, data: bytes) -> None:
    with open(db, "r+b") as f:
        f.seek(offset)
        f.write(data)


@pytest.mark.parametrize("argv", [["audit"], ["jobs", "--local"], ["egress", "report"]])
def test_a_truncated_database_is_one_line_for_every_command(
    state: tuple[Path, Path], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    cfg, db = state
    truncate(db, 0.6)
    rc, _out, err = cli(capsys, cfg, *argv)
    assert rc == 2
    assert_one_line_damaged(err, db)


def test_repair_keeps_what_a_truncated_file_still_holds(
    state: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, db = state
    truncate(db, 0.6)
    damaged = db.read_bytes()
    rc, out, _err = cli(capsys, cfg, "state", "check")
    assert rc == 1 and "damaged" in out
    rc, out, err = cli(capsys, cfg, "state", "repair")
    assert rc == 0, err
    assert out.startswith(f"fresh state database at {db}: kept ")
    backups = list(db.parent.glob("state.sqlite3.damaged-*"))
    assert [b.name for b in backups if not b.name.endswith(("-wal", "-shm"))]
    backup = next(b for b in backups if not b.name.endswith(("-wal", "-shm")))
    assert backup.read_bytes() == damaged  # the damaged file is kept exactly as it was
    assert cli(capsys, cfg, "state", "check")[0] == 0
    # Every command works again, with the rows that could be read.
    rc, out, _ = cli(capsys, cfg, "audit", "--json")
    assert rc == 0
    kept = sqlite3.connect(db)
    jobs = kept.execute("SELECT count(*) FROM jobs").fetchone()[0]
    audits = kept.execute("SELECT count(*) FROM audit").fetchone()[0]
    kept.close()
    assert 0 < jobs + audits < JOBS + AUDITS
    assert cli(capsys, cfg, "jobs", "--local")[0] == 0


def test_an_overwritten_header_is_refused_and_repair_starts_fresh(
    state: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, db = state
    scribble(db, 0, os.urandom(100))
    rc, _out, err = cli(capsys, cfg, "audit")
    assert rc == 2
    assert_one_line_damaged(err, db)
    with pytest.raises(StateCorrupt):  # the class a front end catches to offer the repair
        SQLiteState(db)
    rc, out, err = cli(capsys, cfg, "state", "repair", "--json")
    assert rc == 0 and '"repaired": true' in out
    assert "could not be read" in err
    assert cli(capsys, cfg, "audit")[0] == 0


def test_a_damaged_page_is_found_when_read_and_repair_keeps_the_rest(
    state: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, db = state
    page = sqlite3.connect(db).execute("PRAGMA page_size").fetchone()[0]
    pages = os.path.getsize(db) // page
    scribble(db, page * (pages // 2), os.urandom(page * 2))  # two pages in the middle
    rc, _out, err = cli(capsys, cfg, "audit", "--limit", "100000")
    assert rc == 2
    assert_one_line_damaged(err, db)
    report = repair_state(db)
    assert sum(report.kept.values()) > 0.9 * (JOBS + AUDITS)  # only the damaged pages' rows are lost
    assert report.lost and check_state(db) == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 1.0), where=st.floats(0.0, 1.0), length=st.integers(0, 20_000))
def test_any_damage_is_a_state_error_and_repair_always_recovers(
    template: Path, tmp_path_factory: pytest.TempPathFactory, cut: float, where: float, length: int
) -> None:
    db = tmp_path_factory.mktemp("fuzz") / "state.sqlite3"
    shutil.copyfile(template, db)
    size = os.path.getsize(db)
    scribble(db, int(where * size), os.urandom(length))
    truncate(db, cut)
    try:
        s = SQLiteState(db)
        try:
            s.query("SELECT * FROM jobs")
            s.audit_entries(limit=100_000)
            s.record_audit("x", "y", "ok")
        finally:
            s.close()
    except StateError:
        pass  # one line; anything else (sqlite3.DatabaseError) fails the test
    repair_state(db)
    assert check_state(db) == []
    SQLiteState(db).close()


def test_a_full_disk_is_one_line(tmp_path: Path, small_fs: Path) -> None:
    db = SQLiteState(small_fs / "state.sqlite3")
    try:
        with pytest.raises(StateError, match=rf"^no space left on the disk of state database {small_fs}/"):
            for i in range(10_000):
                db.record_audit("pull.launch", "s3://b/p", "started", detail={"pad": "x" * 4000, "i": i})
    finally:
        db.close()


def test_a_directory_in_the_way_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "state.sqlite3").mkdir()
    with pytest.raises(StateError, match="is not a regular file; move it away"):
        SQLiteState(tmp_path / "state.sqlite3")


def test_repair_of_a_healthy_database_does_nothing(
    state: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cfg, db = state
    rc, out, _ = cli(capsys, cfg, "state", "repair")
    assert rc == 0 and "ok, nothing to repair" in out
    assert not list(db.parent.glob("*.damaged-*"))


@pytest.mark.parametrize("value", ["not-a-time", None])
def test_a_damaged_audit_time_is_state_corrupt_not_a_type_error(tmp_path: Path, value: object) -> None:
    """A scribbled page can leave text or NULL where an audit row's time was (hypothesis found a file
    cut at 99.6 % that did): reading the log is one StateCorrupt naming the repair."""
    db = tmp_path / "state.sqlite3"
    fill(db)
    with sqlite3.connect(db) as raw:
        try:
            raw.execute("UPDATE audit SET ts = ? WHERE id = (SELECT MAX(id) FROM audit)", (value,))
        except sqlite3.IntegrityError:
            pytest.skip("the schema keeps NULL out of audit.ts; text is the case that gets through")
    s = SQLiteState(db)
    try:
        with pytest.raises(StateCorrupt, match=r"audit log holds a damaged row .*state repair"):
            s.audit_entries()
    finally:
        s.close()
