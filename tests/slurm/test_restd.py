"""``[slurm] url``: nodes and jobs read from slurmrestd's REST API (``GET /slurm/<api>/nodes`` and
``/jobs``) through the same per-shape adapters, against a small HTTP responder serving recorded
24.05 JSON (tests/slurm/data). The user name and the JWT go in the headers; the token never
appears in an error; a refusal is one line naming slurmrestd and Slurm's own error; bad settings
are one line naming the key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from backend.config import parse_config
from backend.errors import ConfigError
from backend.slurm.client import SlurmClient, SlurmError
from backend.slurm.settings import SlurmSettings
from tests.helpers import serving

DATA = Path(__file__).parent / "data"
TOKEN = "eyJhbGciOiJIUzI1NiJ9.secret-jwt-value"


@pytest.fixture
async def restd() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A responder speaking slurmrestd v0.0.41's read paths from recorded 24.05 JSON; every
    request's path and Slurm headers are kept for the test to read."""
    seen: list[dict[str, Any]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append({"path": request.path, **{k: v for k, v in request.headers.items() if k.startswith("X-SLURM")}})
        if request.headers.get("X-SLURM-USER-TOKEN") != TOKEN:
            body = {"errors": [{"error": "Authentication failure", "description": "invalid or expired token"}]}
            return web.json_response(body, status=401)
        name = {"nodes": "sinfo-24.05.json", "jobs": "squeue-24.05.json"}[request.match_info["what"]]
        return web.Response(body=(DATA / name).read_bytes(), content_type="application/json")

    app = web.Application()
    app.add_routes([web.get("/slurm/v0.0.41/{what:nodes|jobs}", answer)])
    async with serving(app) as url:
        yield url, seen


def settings(url: str, **kw: Any) -> SlurmSettings:
    return SlurmSettings(enabled=True, url=url, api="v0.0.41", user="oncall", **kw)


async def test_nodes_and_jobs_come_from_slurmrestd(restd: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = restd
    snap = await SlurmClient(settings(url), env={"SLURM_JWT": TOKEN}).snapshot()
    by = {n.name: n for n in snap.nodes}
    assert by["gpu-101"].state.label == "draining" and by["gpu-102"].state.label == "drained"
    assert by["gpu-101"].reason_by == "erin" and by["gpu-101"].shape
    assert [(j.job_id, j.state) for j in snap.jobs] == [("12001", "RUNNING"), ("12002", "PENDING")]
    assert snap.jobs[0].gpus_on("gpu-101") == (3, 4)
    # One call for nodes and one for jobs, with the user and the token in the headers.
    assert [s["path"] for s in seen] == ["/slurm/v0.0.41/nodes", "/slurm/v0.0.41/jobs"]
    assert all(s["X-SLURM-USER-NAME"] == "oncall" and s["X-SLURM-USER-TOKEN"] == TOKEN for s in seen)


async def test_partitions_filter_the_rest_answer_too(restd: tuple[str, list[dict[str, Any]]]) -> None:
    url, _seen = restd
    nodes, _ = await SlurmClient(settings(url, partitions=("cpu",)), env={"SLURM_JWT": TOKEN}).nodes()
    assert nodes and all("cpu" in n.partitions for n in nodes)


async def test_a_refusal_is_one_line_without_the_token(restd: tuple[str, list[dict[str, Any]]]) -> None:
    url, seen = restd
    with pytest.raises(SlurmError) as err:
        await SlurmClient(settings(url), env={"SLURM_JWT": TOKEN + "-expired"}).snapshot()
    msg = str(err.value)
    assert msg.startswith(f"slurmrestd {url} answered GET /slurm/v0.0.41/nodes with HTTP 401")
    assert "invalid or expired token" in msg and "\n" not in msg
    assert "secret-jwt" not in msg and seen[-1]["X-SLURM-USER-TOKEN"] == TOKEN + "-expired"
    # No token in the environment: none is sent.
    with pytest.raises(SlurmError):
        await SlurmClient(settings(url), env={}).nodes()
    assert "X-SLURM-USER-TOKEN" not in seen[-1]


async def test_unreachable_is_one_line() -> None:
    with pytest.raises(SlurmError) as err:
        await SlurmClient(settings("http://127.0.0.1:9", timeout=3.0), env={}).nodes()
    assert "slurmrestd http://127.0.0.1:9 unreachable" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("url", "ftp://x", "http:// or https://"),
        ("url", "http://u:p@slurm:6820", "no credentials"),
        ("api", "0.0.39", "v0.0.39"),
        ("token_env", "SLURM JWT", "environment variable"),
    ],
)
def test_bad_settings_name_the_key(key: str, value: str, says: str, tmp_path: Path) -> None:
    raw = {"nodes": [{"name": "n1", "host": "127.0.0.1"}], "slurm": {"enabled": True, key: value}}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, file="t.toml", base=tmp_path).section(SlurmSettings)
    assert key in str(err.value) and says in str(err.value)
