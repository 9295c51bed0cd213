"""Who feeds whom: seeds per site with s5cmd, chains and trees of a degree, fallbacks upstream."""

from __future__ import annotations

import pytest

from backend.errors import ConfigError
from backend.pulls.relay.planner import PeerNode, plan_topology


def _nodes(n: int, site: str = "cw:a", s5: bool = True) -> list[PeerNode]:
    return [PeerNode(f"gpu-{i:02d}", site, s5) for i in range(1, n + 1)]


def test_default_is_one_chain_from_one_seed() -> None:
    t = plan_topology(_nodes(4))
    assert t.seeds == ("gpu-01",)
    assert t.lines() == ["gpu-01 (seed) -> gpu-02 -> gpu-03 -> gpu-04"]
    assert t.ancestors("gpu-04") == ["gpu-03", "gpu-02", "gpu-01"]


def test_tree_of_degree_two_fills_level_by_level() -> None:
    t = plan_topology(_nodes(7), degree=2)
    assert t.children["gpu-01"] == ("gpu-02", "gpu-03")
    assert t.children["gpu-02"] == ("gpu-04", "gpu-05")
    assert t.children["gpu-03"] == ("gpu-06", "gpu-07")
    assert max(len(t.chain(n)) for n in t.parent) == 2


def test_two_seeds_split_the_nodes_and_back_each_other_up() -> None:
    t = plan_topology(_nodes(6), seeds=2)
    assert t.seeds == ("gpu-01", "gpu-02")
    assert sorted(len(t.chain(n)) for n in t.parent) == [0, 0, 1, 1, 2, 2]
    leaf = next(n for n in t.parent if len(t.chain(n)) == 2)
    assert t.ancestors(leaf)[-1] in t.seeds and set(t.seeds) <= set(t.ancestors(leaf))


def test_sites_relay_only_inside_themselves_and_a_seed_needs_s5cmd() -> None:
    nodes = [PeerNode("a1", "cw:a", False), PeerNode("a2", "cw:a"), PeerNode("b1", "aws:us-east-1")]
    t = plan_topology(nodes)
    assert set(t.seeds) == {"a2", "b1"} and t.parent["a1"] == "a2"
    with pytest.raises(ConfigError, match="no node at site cw:a has s5cmd"):
        plan_topology([PeerNode("a1", "cw:a", False)])
    with pytest.raises(ConfigError, match="degree must be at least 1"):
        plan_topology(_nodes(2), degree=0)


@pytest.mark.parametrize("n,degree,seeds", [(16, 1, 1), (16, 3, 2), (9, 2, 3), (1, 1, 1)])
def test_every_node_is_reached_once(n: int, degree: int, seeds: int) -> None:
    t = plan_topology(_nodes(n), seeds=seeds, degree=degree)
    assert sorted(t.parent) == [f"gpu-{i:02d}" for i in range(1, n + 1)]
    assert all(len(k) <= degree for k in t.children.values())
    for node in t.parent:  # no cycles: every chain ends at a seed
        chain = t.chain(node)
        assert (chain[-1] if chain else node) in t.seeds


def test_seed_flags_land_large_objects_one_after_another() -> None:
    from backend.pulls.relay.planner import seed_flags

    mib = 1 << 20
    # The brief's checkpoint: 29 x 4.8 GB safetensors, tuned flags: one object at a time, 32 parts.
    assert seed_flags(29 * 4_800_000_000, 29, 256, 32, 64) == (1, 32, 64)
    # 16 x 64 MiB: 8 MiB parts, two objects at a time (16 streams).
    assert seed_flags(16 * 64 * mib, 16, 256, 32, 64) == (2, 32, 8)
    # Small objects land in order anyway; three objects cannot be pipelined: as given.
    assert seed_flags(10_000 * 50_000, 10_000, 512, 4, 8) == (512, 4, 8)
    assert seed_flags(3 * 1024 * mib, 3, 256, 32, 64) == (256, 32, 64)
