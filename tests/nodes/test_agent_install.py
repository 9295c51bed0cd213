"""The node agent kept apart from the training environment: its own venv, run isolated (-I).

Against real sshd nodes: the session lab (whose nodes' default agent path links to a venv running
this checkout, and which have no ``loadmaster`` on PATH), and a one-node lab of its own whose
sessions carry a training repo's PYTHONPATH, with a ``backend/`` package that breaks on import.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import backend
from backend import __version__
from backend.config import Node, load_config_file
from backend.doctor import run_doctor
from backend.nodes.agent import agent_command, install_command, is_python, parse_probe
from backend.nodes.pool import NodePool
from backend.services import Services
from lab import Lab, LabNodeOptions
from lab.agent import compile_packages, link_agent_venv
from tests.helpers import write_lab_config
from tests.jobs.conftest import fresh_services
from tests.pulls_helpers import launch_pull, plan_pull
from tui.cli import main

pytestmark = pytest.mark.timeout(240)

BACKEND_DIR = os.path.dirname(os.path.abspath(backend.__file__))
DEFAULT = '"${LOADMASTER_HOME:-$HOME/.loadmaster}/agent/venv/bin/python" -I -m backend.agent'
SHADOW = "a training repo's backend/ shadowed loadmaster"


# -- which command, without a node -----------------------------------------------------------------
def test_the_agent_command_for_each_kind_of_node() -> None:
    assert agent_command(Node(name="gpu", host="gpu")) == DEFAULT
    here = Node(name="here", host="localhost", transport="local")
    assert agent_command(here, local_python="/opt/my env/bin/python") == "'/opt/my env/bin/python' -I -m backend.agent"
    assert agent_command(here) == f"{sys.executable} -I -m backend.agent"
    # The `agent` setting: a python runs isolated too; a loadmaster executable (or wrapper) as written.
    assert (
        agent_command(Node(name="g", host="g", agent="/opt/lm/bin/python3.11"))
        == "/opt/lm/bin/python3.11 -I -m backend.agent"
    )
    assert agent_command(Node(name="g", host="g", agent="/opt/lm/bin/loadmaster")) == "/opt/lm/bin/loadmaster"
    assert agent_command(Node(name="g", host="g", agent="conda run -n lm loadmaster")) == "conda run -n lm loadmaster"
    assert [is_python(a) for a in ("python3", "/usr/bin/python", "python3.12", "pythonic", "loadmaster")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert install_command() == (
        "python3 -m venv ~/.loadmaster/agent/venv && ~/.loadmaster/agent/venv/bin/pip "
        f"install 'loadmaster[node]=={__version__}'"
    )


def test_config_agent_is_unset_by_default_and_an_override_when_set(tmp_path: Path) -> None:
    cfg = tmp_path / "lm.toml"
    cfg.write_text(
        '[defaults]\nagent = "/opt/lm/bin/python3"\n[[nodes]]\nname = "a"\n'
        '[[nodes]]\nname = "b"\nagent = "/srv/lm/bin/loadmaster"\n[[nodes]]\nname = "c"\n'
    )
    a, b, _c = load_config_file(cfg).nodes
    assert (a.agent, b.agent) == ("/opt/lm/bin/python3", "/srv/lm/bin/loadmaster")
    cfg.write_text('[[nodes]]\nname = "a"\n')
    assert load_config_file(cfg).nodes[0].agent is None


def test_the_entry_ignores_pythonpath(tmp_path: Path) -> None:
    repo = _training_repo(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(repo)}
    plain = subprocess.run(
        [sys.executable, "-m", "backend.agent", "info"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode != 0 and SHADOW in plain.stderr  # the plant bites an ordinary start
    res = subprocess.run(
        [sys.executable, "-I", "-m", "backend.agent", "agent", "info"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    info = json.loads(res.stdout)
    assert info["package"] == BACKEND_DIR and info["isolated"] is True and info["version"] == __version__
    bad = subprocess.run(
        [sys.executable, "-I", "-m", "backend.agent", "start"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "usage: python -I -m backend.agent" in bad.stderr


def test_probe_answers_become_one_line_problems() -> None:
    node = Node(name="gpu", host="gpu")
    missing = parse_probe(node, ["@@agent missing /home/u/.loadmaster/agent/venv"])
    assert missing.problem == (
        "no agent venv at /home/u/.loadmaster/agent/venv: run python3 -m venv "
        "/home/u/.loadmaster/agent/venv && /home/u/.loadmaster/agent/venv/bin/pip install "
        f"'loadmaster[node]=={__version__}'"
    )
    old = parse_probe(node, ["usage: loadmaster [-h] ...", "\x1b[31mno such action\x1b[0m", "@@agent rc 2"])
    assert old.problem is not None and old.problem.startswith(f"the agent ({DEFAULT}) does not answer 'agent info'")
    assert "no such action" in old.problem and "\x1b" not in old.problem
    info = {"python": "/v/bin/python", "prefix": "/v", "isolated": True, "version": "0.0.1", "package": "/v/b"}
    stale = parse_probe(node, [json.dumps(info), "@@agent rc 0"])
    assert stale.python == "/v/bin/python" and stale.problem == (
        f"the agent is loadmaster 0.0.1, this console {__version__}: run python3 -m venv /v && "
        f"/v/bin/pip install 'loadmaster[node]=={__version__}'"
    )
    fine = parse_probe(node, [json.dumps({**info, "version": __version__}), "@@agent rc 0"])
    assert fine.problem is None and fine.isolated


# -- the session lab: a job end to end ------------------------------------------------------------
def _seed(s3, bucket: str) -> tuple[str, dict[str, bytes]]:  # type: ignore[no-untyped-def]
    prefix = f"agent-{secrets.token_hex(3)}"
    objects = {"a.bin": os.urandom(300_000), "sub/b.json": b'{"ok": true}\n'}
    client = s3.client()
    for name, body in objects.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=body)
    return f"s3://{bucket}/{prefix}/", objects


async def _pull_and_wait(config_path: Path, node: str, url: str, dest_rel: str, tmp_path: Path) -> None:
    """Pull on ``node``; the launching console closes at once and another one sees the job finish."""
    config = load_config_file(config_path)
    svc = Services(config=config)
    try:
        assert svc.jobs.agent_command(node) == DEFAULT  # the node's own agent venv, isolated
        plan = await plan_pull(svc, url, dest_rel, [node])
        [rec] = await launch_pull(svc, plan)
    finally:
        await svc.aclose()  # every connection of the launching console closed: the job runs on
    other = fresh_services(config)  # another console of the team: its own connections, the team's state
    try:
        await other.jobs.refresh([node])
        final = await other.jobs.wait(rec.id, timeout=120)
        log, _ = await other.jobs.read_log(rec.id)
    finally:
        await other.aclose()
    assert final.state == "succeeded", f"{final.error}\n{log}"


async def test_a_job_runs_end_to_end_through_the_isolated_agent(lab: Lab, s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert lab.bucket
    url, objects = _seed(s3, lab.bucket)
    cfg = write_lab_config(lab, tmp_path / "lm.toml", tmp_path / "state")
    # No loadmaster on the node's PATH: only the agent venv can have run the job.
    assert shutil.which("loadmaster", path=str(lab.node("node-01").bin_dir)) is None
    await _pull_and_wait(cfg, "node-01", url, "pulls/agent-e2e", tmp_path)
    dest = lab.node("node-01").scratch / "pulls/agent-e2e"
    assert {n: (dest / n).read_bytes() for n in objects} == objects


# -- a training node: PYTHONPATH holds a repo with its own backend/ ------------------------------
def _training_repo(root: Path) -> Path:
    repo = root / "training-repo"
    (repo / "backend").mkdir(parents=True, exist_ok=True)
    (repo / "backend" / "__init__.py").write_text(f"raise ImportError({SHADOW!r})\n")
    return repo


@pytest.fixture(scope="module")
def training_node(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Path]]:
    """A one-node lab (train-01) whose sessions carry a training repo's PYTHONPATH; a config with
    the session lab's nodes and store plus it."""
    root = tmp_path_factory.mktemp("training-lab")
    repo = _training_repo(root)
    mini = Lab(
        root / "lab",
        nodes=1,
        with_s3=False,
        first_ip=150,
        options={"node-01": LabNodeOptions(nvidia_smi=False, env={"PYTHONPATH": str(repo)})},
    ).up()
    try:
        n = mini.nodes[0]
        entry = (
            f'\n[[nodes]]\nname = "train-01"\nhost = "{n.ip}"\nport = {n.port}\nidentity = ["{mini.user_key}"]\n'
            f'known_hosts = "{mini.known_hosts}"\nscratch = "{n.scratch}"\n'
        )
        yield mini, write_lab_config(lab, root / "lm.toml", root / "state", entry)
    finally:
        mini.down()


async def test_a_backend_package_on_the_nodes_pythonpath_does_not_shadow_the_agent(
    training_node: tuple[Lab, Path],
    lab: Lab,
    s3,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    mini, cfg = training_node
    pool = NodePool([load_config_file(cfg).node("train-01")])
    try:
        res = await pool.transport("train-01").run("echo $PYTHONPATH; python3 -c 'import backend'", timeout=60)
    finally:
        await pool.close()
    assert res.exit_status != 0 and SHADOW in res.stderr  # what a non-isolated agent would meet
    assert lab.bucket
    url, objects = _seed(s3, lab.bucket)
    await _pull_and_wait(cfg, "train-01", url, "pulls/shadowed", tmp_path)
    dest = mini.nodes[0].scratch / "pulls/shadowed"
    assert {n: (dest / n).read_bytes() for n in objects} == objects


def test_doctor_shows_the_agents_interpreter_or_how_to_install_it(
    training_node: tuple[Lab, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    mini, cfg = training_node
    node = load_config_file(cfg).node("train-01")
    venv = mini.nodes[0].home / "agent" / "venv"

    async def report():  # type: ignore[no-untyped-def]
        pool = NodePool([node])
        try:
            [r] = await run_doctor(pool)
        finally:
            await pool.close()
        return r

    r = asyncio.run(report())
    assert r.ready, r.problems
    assert r.agent is not None and r.agent.problem is None and r.agent.isolated
    assert (r.agent.python, r.agent.prefix, r.agent.package) == (f"{venv}/bin/python", str(venv), BACKEND_DIR)
    venv.unlink()  # a node nobody installed the agent on
    try:
        r = asyncio.run(report())
        want = (
            f"no agent venv at {venv}: run python3 -m venv {venv} && {venv}/bin/pip install "
            f"'loadmaster[node]=={__version__}'"
        )
        assert not r.ready and r.problems == (want,)
        assert main(["--config", str(cfg), "doctor", "--nodes", "train-01"]) == 1
        out = capsys.readouterr().out.splitlines()
        assert "  agent     MISSING" in out and f"  problem   {want}" in out
    finally:
        link_agent_venv(mini.nodes[0].home, mini.agent_venv)


def test_the_lab_compiles_the_checkout_as_an_install_would(tmp_path: Path) -> None:
    """With PYTHONDONTWRITEBYTECODE set (as on these machines) nothing writes bytecode, so every
    CLI command and agent start would compile what it imports: the lab compiles the packages once."""
    import importlib.util

    for pkg in ("backend", "tui", "lab"):
        (tmp_path / pkg / "sub").mkdir(parents=True)
        (tmp_path / pkg / "__init__.py").write_text("")
        (tmp_path / pkg / "sub" / "mod.py").write_text("X = 1\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "__init__.py").write_text("")
    compile_packages(tmp_path)
    for pkg in ("backend", "tui", "lab"):
        source = tmp_path / pkg / "sub" / "mod.py"
        cached = Path(importlib.util.cache_from_source(str(source)))
        assert cached.is_file() and cached.stat().st_size > 0
    assert not (tmp_path / "other" / "__pycache__").exists()  # only loadmaster's own packages
    compile_packages(tmp_path)  # current: nothing to do, no error
