"""A staged pull's renames into DEST (backend/pulls/staging.py ``Staging.place``): each folder is
checked once and renamed into through its open descriptor while its path still leads to it. A
folder or target that leads out of DEST is refused, also when it is swapped for a symlink after
objects already went into it; nothing is ever written outside DEST; the descriptors are closed."""

from __future__ import annotations

import os
from pathlib import Path

from backend.pulls import staging as staging_mod
from backend.pulls.objects import PulledObject
from backend.pulls.staging import Staging


def _staged(dest: Path, rels: list[str]) -> tuple[Staging, list[PulledObject]]:
    st = Staging.create(dest, "job-1", None, 0)
    objs = []
    for rel in rels:
        f = st.path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(rel.encode())
        objs.append(PulledObject(rel, len(rel.encode()), None))
    return st, objs


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_objects_land_in_their_folders_and_the_folders_are_closed_after(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    rels = ["top.bin", *(f"d{i}/x/o{j}.bin" for i in range(staging_mod.OPEN_FOLDERS + 6) for j in range(2))]
    before = _open_fds()
    st, objs = _staged(dest, rels)
    for o in objs:
        assert st.place(o) is None, o.rel
    for rel in rels:
        assert (dest / rel).read_bytes() == rel.encode()
    assert st.placed == set(rels)
    assert _open_fds() - before <= staging_mod.OPEN_FOLDERS
    st.remove()
    assert _open_fds() == before
    assert not st.path.exists()


def test_a_folder_or_target_leading_out_of_dest_is_refused(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (outside / "victim").write_bytes(b"keep")
    (dest / "link").symlink_to(outside, target_is_directory=True)
    (dest / "inside").mkdir()
    (dest / "inside" / "victim").symlink_to(outside / "victim")
    st, objs = _staged(dest, ["link/a.bin", "inside/victim"])
    why = st.place(objs[0])
    assert why is not None and "outside" in why and str(outside) in why
    why = st.place(objs[1])
    assert why is not None and "symlink to" in why
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]
    assert (outside / "victim").read_bytes() == b"keep"
    assert st.placed == set()
    st.remove()


def test_a_folder_swapped_for_a_symlink_after_objects_went_in_is_checked_again(tmp_path: Path) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    st, objs = _staged(dest, ["sub/a.bin", "sub/b.bin", "sub/c.bin"])
    assert st.place(objs[0]) is None
    # The folder kept open is moved away and a symlink out of DEST takes its name.
    (dest / "sub").rename(dest / "sub.old")
    (dest / "sub").symlink_to(outside, target_is_directory=True)
    why = st.place(objs[1])
    assert why is not None and str(outside) in why, why
    assert list(outside.iterdir()) == []
    assert not (dest / "sub.old" / "b.bin").exists()  # not into the old folder either: its path is gone
    # Put back as a real folder: objects go in again.
    (dest / "sub").unlink()
    (dest / "sub").mkdir()
    assert st.place(objs[2]) is None
    assert (dest / "sub" / "c.bin").read_bytes() == b"sub/c.bin"
    st.remove()
