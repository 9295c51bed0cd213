"""The real test lab: sshd nodes on 127.0.0.x, SeaweedFS S3 on loopback, the real s5cmd.

Session-scoped: started once per pytest run, torn down at the end. Tests that stop a node use
``lab_node_down`` (or call ``node.stop()``/``node.start()`` themselves and restart in a finally).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import Lab, LabNodeOptions

pytest_plugins = ["tests.pg_fixtures", "tests.prom_fixtures", "tests.am_fixtures"]

# Under pytest-xdist (CI runs two workers) each worker is its own machine as far as the lab is
# concerned: its own lab, and its own temporary directory, so what lives in the shared /tmp by
# design (the connection keeper's fallback socket dir, tmux's server socket) is not shared.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    _worker_tmp = Path(tempfile.gettempdir()) / f"lm-xdist-{_WORKER}"
    _worker_tmp.mkdir(mode=0o755, exist_ok=True)
    os.environ["TMPDIR"] = str(_worker_tmp)
    tempfile.tempdir = str(_worker_tmp)

LAB_NODE_OPTIONS = {
    "node-01": LabNodeOptions(gpus=8, pattern="training"),
    "node-02": LabNodeOptions(gpus=8, pattern="starved"),
    "node-03": LabNodeOptions(gpus=0, nvidia_smi=False, s5cmd=False),
    "node-04": LabNodeOptions(gpus=8, pattern="training", site="aws:us-east-1"),
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest test files first (tests/durations.json, written by scripts/test_durations.py).

    CI runs ``--dist loadfile --no-loadscope-reorder``: pytest-xdist hands each worker whole files
    in this order, so the last files to start are short ones and neither worker sits idle at the
    end while the other runs a long file (xdist's own order, most tests first, put the 100 s
    console-in-tmux file of three tests near the end). A file's tests keep their order; a file
    the figures do not know counts as its tests x the median seconds per test.
    """
    path = Path(__file__).with_name("durations.json")
    known: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    files: dict[str, int] = {}  # file -> its tests, in collection order
    for item in items:
        file = item.nodeid.split("::", 1)[0]
        files[file] = files.get(file, 0) + 1
    per_test = sorted(known[f] / n for f, n in files.items() if f in known) or [1.0]
    median = per_test[len(per_test) // 2]
    order = {f: i for i, f in enumerate(sorted(files, key=lambda f: -known.get(f, files[f] * median)))}
    items.sort(key=lambda item: order[item.nodeid.split("::", 1)[0]])


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the operator's real config or data dirs."""
    monkeypatch.setenv("LOADMASTER_DATA_DIR", str(tmp_path / "lm-data"))
    monkeypatch.setenv("LOADMASTER_CONFIG_DIR", str(tmp_path / "lm-config"))
    monkeypatch.delenv("LOADMASTER_CONFIG", raising=False)
    # No connection keeper outlives a test's command (tests/jobs/test_keeper.py turns it on).
    # LOADMASTER_TEST_SSH_PERSIST=2s runs every command of the suite through short-lived keepers.
    monkeypatch.setenv("LOADMASTER_SSH_PERSIST", os.environ.get("LOADMASTER_TEST_SSH_PERSIST", "0"))


@pytest.fixture(scope="session")
def lab_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="lm-lab-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def lab(lab_root: Path) -> Iterator[Lab]:
    """Four real sshd nodes and SeaweedFS S3; ``lab.config`` is a Config for them."""
    if not shutil.which("sshd") and not os.path.exists("/usr/sbin/sshd"):
        pytest.fail("sshd missing: run .ci/run (it installs openssh-server) or apt-get install openssh-server")
    lab = Lab(lab_root, nodes=4, options=LAB_NODE_OPTIONS).up()
    saved = {k: os.environ.get(k) for k in lab.env()}
    os.environ.update({k: v for k, v in lab.env().items() if k != "LOADMASTER_CONFIG"})
    try:
        yield lab
    finally:
        lab.down()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def s3(lab: Lab):  # type: ignore[no-untyped-def]
    """The lab's SeaweedFS S3 (``s3.endpoint``, ``s3.new_bucket()``, ``s3.client()``)."""
    assert lab.s3 is not None
    return lab.s3


@pytest.fixture
def lab_node_down(lab: Lab) -> Iterator[object]:
    """Call ``lab_node_down(name)`` to stop a node; it is started again after the test."""
    stopped: list[str] = []

    def stop(name: str) -> None:
        lab.node(name).stop()
        stopped.append(name)

    yield stop
    for name in stopped:
        lab.node(name).start()


@pytest.fixture
def local_services(tmp_path: Path, state_url: str | None):  # type: ignore[no-untyped-def]
    """Services for a machine-local config (stores are plain directories), on each state
    backend: the embedded SQLite file and a fresh PostgreSQL database (``state_url``)."""
    from backend.config import parse_config
    from backend.services import Services

    raw: dict[str, object] = {"nodes": [{"name": "here", "transport": "local"}]}
    if state_url is not None:
        raw["state"] = {"url": state_url}
    config = parse_config(raw, file="test.toml", base=tmp_path)
    services = Services(config)
    yield services
    services.db.close()


@pytest.fixture(scope="module")
def lock_read_back_at_once() -> Iterator[None]:
    """An apply reads its run lock back at once instead of after ``_SETTLE_S`` (0.3 s each apply).

    The pause lets a second apply that wrote the lock at the same moment win; a module whose tests
    run one apply at a time (retention's property tests race pins, marks and kills, not applies)
    waits it out for nothing. The lock is still written, read back and checked;
    tests/retention/test_run_safety.py races two applies with the real pause."""
    from backend.retention import runs

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runs, "_SETTLE_S", 0.0)
        yield
