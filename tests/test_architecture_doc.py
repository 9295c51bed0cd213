"""ARCHITECTURE.md is true to the code: every file it names exists, every class and dotted name
it names is defined where it says.

What is checked:
- backtick-quoted paths (``backend/x.py``, ``tests/...``, ``nodes/agent.py`` under ``backend/``,
  ``x/`` folders) exist; a bare ``name.py`` exists somewhere in the tree;
- backtick-quoted dotted names (``backend.ops``, ``tui.screens.base.LoadmasterScreen``,
  ``ledger.EgressGuard``, ``backend/textfmt.safe_text``) import, from the repository root or
  from ``backend``/one of its packages;
- backtick-quoted class names (``TelemetryHub``, ``AlertStore.sync``) are classes in ``backend/``
  or ``tui/`` (with that attribute);
- in the layout block, each area's own files (``hub.py`` in the ``telemetry/`` line) exist under
  that area.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import typing
from functools import cache, cached_property
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "ARCHITECTURE.md"
SOURCE_DIRS = ("backend", "tui", "lab")
_PATH = re.compile(r"^[\w.-]+(/[\w.-]+)*/?$")
_IDENT = r"[A-Za-z_]\w*"
_DOTTED = re.compile(rf"^{_IDENT}(\.{_IDENT})+$")
_CLASS = re.compile(r"^[A-Z][a-z0-9]+[A-Za-z0-9]*(\.[a-z_]\w*)?$")
_FILE = re.compile(r"\.(py|toml|md|json|sh|tcss|txt)$")
#: The doc's names for instances: ``ops.pulls.plan`` is Operations().pulls.plan.
INSTANCES = {
    "ops": "backend.ops.Operations",
    "services": "backend.services.Services",
    "hub": "backend.telemetry.hub.TelemetryHub",
    "transport": "backend.nodes.transport.Transport",
    "ctx": "backend.agent.context.JobContext",
}
#: Backticked dotted or capitalised words that are not loadmaster's code, and what they are.
NOT_CODE = {
    "torch.save": "PyTorch's function",
    "data.pkl": "a file inside a torch.save zip",
    "DataTable.RowSelected": "Textual's message",
    "egress.override": "an audit action's name",
    "jobs.spec_digest": "a column of the jobs table",
    "jobs.launch_id": "a column of the jobs table",
    "jobs.slurm_job": "a column of the jobs table (schema 7)",
    "job.cancel": "an audit action's name",
    "triage.restage": "an audit action's name (the records are backend/ops/restage.py)",
    "MaxSessions": "an sshd option",
    "MaxStartups": "an sshd option",
    "SetEnv": "an sshd option",
    "LOADMASTER_HOME": "an environment variable",
    "PATH": "an environment variable",
    "RETURNING": "SQL",
    "TYPE_CHECKING": "typing's flag",
}


def _ticks(text: str) -> list[str]:
    """Backtick-quoted tokens outside the fenced layout block, call parentheses dropped."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [re.sub(r"\(.*\)$", "", t.strip()) for t in re.findall(r"`([^`\n]+)`", prose)]


@cache
def _classes() -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for top in SOURCE_DIRS:
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, []).append(path)
    return out


def _class_named(name: str) -> type | None:
    """The class called ``name`` in backend/ or tui/ (the first one found), or None."""
    for path in _classes().get(name, ()):
        module = importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            return cls
    return None


def _path_exists(token: str) -> bool:
    rel = token.rstrip("/")
    if (ROOT / rel).exists():
        return True
    if "/" not in rel:
        return any(True for top in (*SOURCE_DIRS, "tests", "bench", "scripts") for _ in (ROOT / top).rglob(rel))
    return (ROOT / rel).exists() or (ROOT / "backend" / rel).exists()


def _member(cls: type, attr: str) -> tuple[bool, object]:
    """Whether class ``cls`` has ``attr`` (a method, a property, an annotated or assigned
    attribute), and what it leads to (a property's return type; None: unknown)."""
    member = inspect.getattr_static(cls, attr, None)
    if isinstance(member, property | cached_property):
        func = member.fget if isinstance(member, property) else member.func
        try:
            return True, typing.get_type_hints(func).get("return")
        except NameError:  # a return type imported under TYPE_CHECKING: found by its name
            return True, _class_named(str(func.__annotations__.get("return", "")))
    if member is not None:
        return True, member
    for klass in cls.__mro__:
        if attr in getattr(klass, "__annotations__", {}):
            return True, None
        try:
            if re.search(rf"self\.{attr}\s*[:=]", inspect.getsource(klass)):
                return True, None
        except (OSError, TypeError):
            continue
    return False, None


def _walk(obj: object, attrs: list[str]) -> bool:
    for i, attr in enumerate(attrs):
        if isinstance(obj, type):
            found, obj = _member(obj, attr)
            if not found:
                return False
        elif inspect.ismodule(obj) and hasattr(obj, attr):
            obj = getattr(obj, attr)
        else:
            return obj is None and i == len(attrs)  # an attribute of unknown type: not followed
    return True


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute of one, from the root or from backend;
    ``ops.``, ``hub.``, ... name an instance of :data:`INSTANCES`."""
    head, _, rest = dotted.partition(".")
    if head in INSTANCES:
        module, cls = INSTANCES[head].rsplit(".", 1)
        if _walk(getattr(importlib.import_module(module), cls), rest.split(".")):
            return True  # else a module of that name (``ops.pull`` is backend/ops/pull.py)
    packages = [""] + ["backend."] + [f"backend.{p.name}." for p in (ROOT / "backend").iterdir() if p.is_dir()]
    for prefix in packages:
        parts = (prefix + dotted).split(".")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if (
                not (ROOT / module.replace(".", "/")).exists()
                and not (ROOT / f"{module.replace('.', '/')}.py").exists()
            ):
                continue
            try:
                found = _walk(importlib.import_module(module), parts[cut:])
            except ImportError:
                continue
            if found:
                return True
    return False


def _layout_claims(text: str) -> list[tuple[str, str]]:
    """(area folder, file name) for each ``name.py`` an area's line in the layout block names."""
    block = re.search(r"```\n(.*?)```", text, flags=re.S)
    assert block, "ARCHITECTURE.md has a layout block"
    out: list[tuple[str, str]] = []
    top = area = ""
    for line in block.group(1).splitlines():
        indent = len(line) - len(line.lstrip())
        m = re.match(r"^\s*(\S+/)\s", line + " ")
        if indent == 0 and m:
            top = area = m.group(1)
        elif indent == 2:  # an entry of the top folder: a subfolder is its own area
            area = top + m.group(1) if m else top
        for name in re.findall(r"(?<![\w/.])([\w]+\.py)\b", line):
            out.append((area, name))
    return out


TEXT = DOC.read_text()
TOKENS = sorted(set(_ticks(TEXT)))


@pytest.mark.parametrize(
    "token",
    [
        t
        for t in TOKENS
        if "/" in t
        and _PATH.match(t)
        and (_FILE.search(t) or "." not in t.rsplit("/", 1)[-1])
        and t.split("/")[0]
        in {
            *SOURCE_DIRS,
            "tests",
            "scripts",
            "bench",
            "themes",
            "docs",
            *(p.name for p in (ROOT / "backend").iterdir() if p.is_dir()),
        }
    ]
    + [t for t in TOKENS if re.fullmatch(r"[\w]+\.py", t)],
)
def test_a_named_path_exists(token: str) -> None:
    assert _path_exists(token), f"ARCHITECTURE.md names `{token}`, which does not exist"


@pytest.mark.parametrize(
    "token",
    [
        t.replace("/", ".")
        for t in TOKENS
        if _DOTTED.match(t.replace("/", ".")) and not _FILE.search(t) and t not in NOT_CODE
    ],
)
def test_a_named_module_or_attribute_exists(token: str) -> None:
    if _CLASS.match(token):
        cls, attr = token.split(".")
        defs = _classes().get(cls)
        assert defs, f"ARCHITECTURE.md names class `{cls}`, defined nowhere in backend/ or tui/"
        assert any(re.search(rf"\b(def|async def)\s+{attr}\b|\b{attr}\s*[:=]", p.read_text()) for p in defs), (
            f"ARCHITECTURE.md names `{token}`: {cls} has no {attr}"
        )
        return
    assert _resolves(token), f"ARCHITECTURE.md names `{token}`, which does not import"


@pytest.mark.parametrize("name", [t for t in TOKENS if _CLASS.match(t) and "." not in t and t not in NOT_CODE])
def test_a_named_class_exists(name: str) -> None:
    assert name in _classes(), f"ARCHITECTURE.md names class `{name}`, defined nowhere in backend/ or tui/"


@pytest.mark.parametrize(
    "name", [t for t in TOKENS if re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+|[A-Z]{4,}", t) and t not in NOT_CODE]
)
def test_a_named_constant_exists(name: str) -> None:
    pattern = re.compile(rf"^\s*{name}\s*[:=]", re.M)
    assert any(pattern.search(p.read_text()) for top in SOURCE_DIRS for p in (ROOT / top).rglob("*.py")), (
        f"ARCHITECTURE.md names `{name}`, assigned nowhere in backend/ or tui/"
    )


@pytest.mark.parametrize(("area", "name"), _layout_claims(TEXT))
def test_the_layout_block_names_files_that_exist(area: str, name: str) -> None:
    base = ROOT / area
    assert base.is_dir(), f"ARCHITECTURE.md's layout names {area}, which is not a folder"
    assert any(base.rglob(name)), f"ARCHITECTURE.md's layout says {area} holds {name}; it does not"


def test_the_checks_see_the_doc() -> None:
    """The doc names enough for these checks to mean something (a broken parser would pass)."""
    assert len(TOKENS) > 100 and "TelemetryHub.ingest" in TOKENS and "backend/telemetry/hub.py" in TOKENS
    assert len(_layout_claims(TEXT)) > 30


def test_the_checks_refuse_what_does_not_exist() -> None:
    assert not _path_exists("backend/telemetry/nope.py") and _path_exists("telemetry/hub.py")
    assert _resolves("ops.pulls.plan") and not _resolves("ops.pulls.nope")
    assert _resolves("backend.textfmt.safe_text") and not _resolves("backend.textfmt.nope")
    assert _resolves("ledger.EgressGuard") and not _resolves("ledger.NoSuchGuard")
    assert _resolves("hub.ingest_observed") and not _resolves("hub.ingest_nothing")
