"""Grouping files into samples gives one answer whatever order the listing comes in.

A local source is listed in the directories' own order (ext4 returns names in hash order) and
not sorted before grouping, so :func:`group_samples` must not depend on the order: the samples,
the file kept where two names map to one key and extension (WebDataset lower-cases extensions),
the collisions reported and the unkeyed files must be what a walk through the *sorted* listing
gives. The reference below is that walk, written plainly; the property is checked over generated
listings with nested folders, case-only clashes, multi-dot extensions, dot-files and names
without an extension, each in a random order.
"""

from __future__ import annotations

import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from backend.shards.plan import SourceFile, group_samples, scan_local, split_key

NAME = st.sampled_from(["000001", "000002", "a", "a-b", "a.b", "B", ".h", "x"])
EXT = st.sampled_from(["jpg", "JPG", "Jpg", "json", "seg.png", "SEG.png", "cls", ""])
FOLDER = st.sampled_from(["", "d/", "d/e/", "a.c/", "D/"])


def _walk_sorted(files: list[SourceFile]) -> tuple[list[tuple[str, tuple]], tuple, tuple]:
    """Samples, collisions and unkeyed files of the sorted listing, the first file of each
    (key, lower-cased extension) kept and every later one reported with it."""
    kept: dict[str, dict[str, tuple[str, str, int]]] = {}
    collisions, unkeyed = [], []
    for rel, size in sorted(files):
        key, ext = split_key(rel)
        if key is None or ext is None:
            unkeyed.append(rel)
            continue
        exts = kept.setdefault(key, {})
        if ext.lower() in exts:
            collisions.append((exts[ext.lower()][1], rel))
        else:
            exts[ext.lower()] = (ext, rel, size)
    samples = [(k, tuple(v[e] for e in sorted(v))) for k, v in sorted(kept.items())]
    return samples, tuple(collisions), tuple(unkeyed)


@st.composite
def listings(draw: st.DrawFn) -> list[SourceFile]:
    paths = draw(
        st.lists(
            st.builds(lambda f, n, e: f + n + (f".{e}" if e else ""), FOLDER, NAME, EXT),
            unique=True,
            max_size=40,
        )
    )
    files = [SourceFile(p, draw(st.integers(0, 5000))) for p in paths]
    return draw(st.permutations(files))


@settings(max_examples=300, deadline=None)
@given(listings())
def test_grouping_does_not_depend_on_the_listing_order(files: list[SourceFile]) -> None:
    samples, problems = group_samples(files)
    want_samples, want_collisions, want_unkeyed = _walk_sorted(files)
    assert [(s.key, s.files) for s in samples] == want_samples
    assert problems.collisions == want_collisions
    assert problems.unkeyed == want_unkeyed
    again, again_problems = group_samples(sorted(files, reverse=True))
    assert again == samples and again_problems == problems


def test_an_unsorted_local_listing_plans_as_the_sorted_one(tmp_path: Path) -> None:
    # Real directories: scan_local(ordered=False) returns the kernel's order; the plan's input
    # (the samples and problems) must be the sorted listing's.
    src = tmp_path / "src"
    for i in range(300):
        folder = src / f"part{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:06d}.jpg").write_bytes(os.urandom(i % 50))
        (folder / f"{i:06d}.json").write_bytes(b"{}")
    (src / "part0" / "000000.JPG").write_bytes(b"clash")  # a collision, reported the same way
    files, _ = scan_local(str(src), ordered=False)
    ordered, _ = scan_local(str(src))
    assert files != ordered and sorted(files) == ordered  # the kernel's order is not the sorted one
    assert group_samples(files) == group_samples(ordered)
    assert group_samples(files)[1].collisions == (("part0/000000.JPG", "part0/000000.jpg"),)
