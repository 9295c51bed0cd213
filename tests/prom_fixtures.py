"""Prometheus for the tests: the real Prometheus and node_exporter, the dcgm-exporter stand-in.

Registered by tests/conftest.py (``pytest_plugins``). ``prometheus_lab`` starts, for the session's
``lab`` nodes, a node_exporter on every node's IP, the dcgm stand-in for the GPU nodes (scenario
files copied from the nodes' stand-in nvidia-smi, so both show the same GPUs and a test changing
one leaves the other alone) and a Prometheus scraping them every half second. ``prom_lab`` is the same
object, put back as it started after the test (targets up, no Xid, scenarios and profiling). A
machine without Prometheus fails these tests with the install hint (CI installs it, scripts/test.sh
too).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.errors import LoadmasterError
from lab import Lab
from lab.prometheus import PrometheusNotInstalled, StackNode, TelemetryStack

#: Seconds between scrapes in the tests (the lab's default is 5): a change reaches Prometheus
#: (``wait_scraped``) half a second after it is made, not a second.
TEST_SCRAPE_INTERVAL = 0.5


@pytest.fixture(scope="session")
def prometheus_lab(lab: Lab) -> Iterator[TelemetryStack]:
    """A started :class:`TelemetryStack` for the lab's nodes: ``.url``, ``.set_pattern(node, p)``,
    ``.inject_xid(node, gpu, code)``, ``.stop_target(node)`` / ``.start_target(node)``,
    ``.wait_scraped()``, ``.prometheus`` (queries, targets)."""
    root = Path(tempfile.mkdtemp(prefix="lm-prom-"))
    nodes = []
    for n in lab.telemetry_nodes():
        if n.scenario is not None:
            copy = root / "scenarios" / f"{n.name}.json"
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(n.scenario, copy)
            n = StackNode(n.name, n.ip, gpus=n.gpus, pattern=n.pattern, scenario=copy, profiling=n.profiling)
        nodes.append(n)
    stack = TelemetryStack(root, nodes, scrape_interval=TEST_SCRAPE_INTERVAL)
    try:
        stack.start()
        stack.wait_scraped(timeout=60, fresh=False)
    except PrometheusNotInstalled as exc:
        shutil.rmtree(root, ignore_errors=True)
        pytest.fail(str(exc), pytrace=False)
    except LoadmasterError as exc:
        stack.stop()
        pytest.fail(str(exc), pytrace=False)
    try:
        yield stack
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def prom_lab(prometheus_lab: TelemetryStack) -> Iterator[TelemetryStack]:
    """The session's ``prometheus_lab``, restored after the test and, when the test changed
    anything Prometheus may still hold, scraped again."""
    try:
        yield prometheus_lab
    finally:
        if prometheus_lab.restore():
            prometheus_lab.wait_scraped(timeout=60)
