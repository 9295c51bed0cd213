"""The import graph of backend/, tui/ and lab/ has no cycle (function-level and ``TYPE_CHECKING``
imports included).

A cycle hidden behind an import inside a function, or under ``TYPE_CHECKING``, still couples the
modules: each needs the other to be understood, type-checked or moved. There is none today. A cycle
that must stay for a while is listed in :data:`KNOWN_CYCLES` with the issue that removes it; a cycle
that is not inside one of them (a new one, or a known one that grew a module) fails.
"""

from __future__ import annotations

import grimp
import pytest

#: Cycles that exist today, each with the issue that breaks it. Growing one or adding another
#: fails, and so does an entry naming a module no longer in a cycle (narrow the entry, or delete it).
#: The last one, #30's "Services bag" (``Services.ops``: backend.services -> backend.ops, while every
#: operation takes Services), went when the front ends started building ``Operations(services)``.
KNOWN_CYCLES: dict[str, frozenset[str]] = {}


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in graph.modules:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


#: Packages whose every module may be in the known cycle of the same name (a prefix such as
#: ``"backend.ops."``: a new module of the package may join that cycle without an edit here).
KNOWN_PACKAGES: dict[str, str] = {}


def _inside(cycle: list[str], name: str) -> bool:
    prefix = KNOWN_PACKAGES.get(name)
    return all(m in KNOWN_CYCLES[name] or (prefix is not None and m.startswith(prefix)) for m in cycle)


def _unknown(cycles: list[list[str]]) -> list[list[str]]:
    """The cycles not inside one known cycle."""
    return [c for c in cycles if not any(_inside(c, name) for name in KNOWN_CYCLES)]


def _stale(cycles: list[list[str]]) -> list[str]:
    """Modules a known cycle names that are in no cycle inside it now (the entry is out of date)."""
    cycled = {m for name in KNOWN_CYCLES for c in cycles if _inside(c, name) for m in c}
    return sorted(m for name in KNOWN_CYCLES for m in KNOWN_CYCLES[name] if m not in cycled)


def _graph(*, type_checking: bool) -> grimp.ImportGraph:
    # No cache: a cache read back from an earlier run can miss an edit made in the same second.
    return grimp.build_graph("backend", "tui", "lab", exclude_type_checking_imports=not type_checking, cache_dir=None)


def test_backend_and_tui_import_graph_has_no_new_cycle() -> None:
    cycles = _cycles(_graph(type_checking=True))
    assert _unknown(cycles) == [], "a new import cycle (TYPE_CHECKING imports count): break it"
    assert _stale(cycles) == [], "these modules are no longer in a known cycle: narrow KNOWN_CYCLES"


def test_no_cycle_at_run_time() -> None:
    """Without the annotations' imports there is no cycle at all, known or not."""
    assert _cycles(_graph(type_checking=False)) == []


def test_the_allowlist_catches_a_new_a_grown_and_a_gone_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shape #30's Services bag had: two modules, and any module of one package.
    monkeypatch.setitem(KNOWN_CYCLES, "bag", frozenset({"backend.ops", "backend.services"}))
    monkeypatch.setitem(KNOWN_PACKAGES, "bag", "backend.ops.")
    bag = sorted(KNOWN_CYCLES["bag"])
    assert _unknown([bag]) == []
    assert _unknown([[*bag, "backend.ops.new_operation"]]) == []  # a module of the listed package
    assert _unknown([[*bag, "backend.telemetry.hub"]]) != []
    assert _unknown([["backend.telemetry.hub", "backend.telemetry.sources"]]) != []
    assert _stale([bag]) == []
    assert _stale([bag[1:]]) == [bag[0]]  # a module left the cycle: the entry must say so
    assert _stale([]) == bag


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for m in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(m)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [["a.x", "a.y", "a.z"]]


def test_the_lab_contract_covers_all_of_backend() -> None:
    """pyproject's "backend never imports the lab" contract covers the whole backend package (a new
    backend package is covered the day it is added), and the lab is a top-level package of its own."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (lab,) = [c for c in contracts if c["forbidden_modules"] == ["lab"]]
    assert lab["source_modules"] == ["backend"]
    assert (root / "lab" / "__init__.py").exists()
    assert not (root / "backend" / "lab").exists()
