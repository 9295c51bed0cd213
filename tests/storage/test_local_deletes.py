"""A local store's deletes and writes act on exactly the key named: never through a symbolic link
(a step folder ``step-900 -> step-100``, a file link, a link among the key's folders, a link out of
the root), not even one swapped in after the listing."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.errors import StoreError
from backend.storage import LocalStore, localfs


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def files_under(d: Path) -> dict[str, bytes]:
    """Every regular file under ``d`` (links not followed) and its bytes."""
    out = {}
    for dirpath, _dirs, files in os.walk(d):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                out[str(p.relative_to(d))] = p.read_bytes()
    return out


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    root, outside = tmp_path / "store", tmp_path / "outside"
    (root / "run" / "step-100").mkdir(parents=True)
    (root / "run" / "step-100" / "model.pt").write_bytes(b"weights-100")
    (root / "run" / "step-100" / "optim.pt").write_bytes(b"optim-100")
    outside.mkdir()
    (outside / "precious.pt").write_bytes(b"precious")
    return root, outside


def test_a_step_folder_link_is_refused_and_its_target_kept(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    os.symlink("step-100", root / "run" / "step-900")
    res = run(LocalStore(root).delete_many(["run/step-900/model.pt", "run/step-900/optim.pt"]))
    assert res.deleted == () and set(res.errors) == {"run/step-900/model.pt", "run/step-900/optim.pt"}
    assert (
        "symbolic link" in res.errors["run/step-900/model.pt"] and "run/step-900" in res.errors["run/step-900/model.pt"]
    )
    assert "\n" not in res.errors["run/step-900/model.pt"]
    assert (root / "run" / "step-100" / "model.pt").read_bytes() == b"weights-100"
    assert (root / "run" / "step-100" / "optim.pt").read_bytes() == b"optim-100"


def test_a_file_link_removes_the_link_itself_never_its_target(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "run" / "step-200").mkdir()
    os.symlink(outside / "precious.pt", root / "run" / "step-200" / "model.pt")
    os.symlink("../step-100/optim.pt", root / "run" / "step-200" / "optim.pt")
    res = run(LocalStore(root).delete_many(["run/step-200/model.pt", "run/step-200/optim.pt"]))
    assert res.ok and set(res.deleted) == {"run/step-200/model.pt", "run/step-200/optim.pt"}
    assert (outside / "precious.pt").read_bytes() == b"precious"
    assert (root / "run" / "step-100" / "optim.pt").read_bytes() == b"optim-100"
    assert not (root / "run" / "step-200").exists()  # emptied, pruned


def test_a_link_as_a_middle_component_is_refused(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    (root / "run" / "step-300").mkdir()
    os.symlink("../step-100", root / "run" / "step-300" / "sub")
    res = run(LocalStore(root).delete_many(["run/step-300/sub/model.pt"]))
    assert not res.ok and "run/step-300/sub" in res.errors["run/step-300/sub/model.pt"]
    assert (root / "run" / "step-100" / "model.pt").exists()


def test_a_link_under_the_root_leading_outside_is_refused(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    os.symlink(outside, root / "elsewhere")
    store = LocalStore(root)
    res = run(store.delete_many(["elsewhere/precious.pt"]))
    assert not res.ok and "symbolic link" in res.errors["elsewhere/precious.pt"]
    assert (outside / "precious.pt").read_bytes() == b"precious"
    with pytest.raises(StoreError, match="symbolic link"):
        run(store.put_bytes("elsewhere/precious.pt", b"overwritten"))
    with pytest.raises(StoreError, match="symbolic link"):
        run(store.list("elsewhere"))
    assert (outside / "precious.pt").read_bytes() == b"precious"
    assert run(store.list_dirs("")) == ["run"]  # a linked folder is no folder of the store


def test_a_folder_swapped_for_a_link_after_the_listing_is_refused(tree: tuple[Path, Path], tmp_path: Path) -> None:
    root, outside = tree
    (outside / "step-100").mkdir()
    (outside / "step-100" / "model.pt").write_bytes(b"someone else's")
    store = LocalStore(root)
    keys = [o.key for o in run(store.list("run/step-100"))]
    assert keys == ["run/step-100/model.pt", "run/step-100/optim.pt"]
    os.rename(root / "run", tmp_path / "moved-run")
    os.symlink(outside, root / "run")  # "run" now leads to outside/, which has a step-100 too
    res = run(store.delete_many(keys))
    assert res.deleted == () and all("symbolic link" in why for why in res.errors.values())
    assert (outside / "step-100" / "model.pt").read_bytes() == b"someone else's"


def test_a_folder_swapped_for_a_link_mid_walk_does_not_redirect_the_delete(
    tree: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap lands between the walk opening ``run/step-100`` and the unlink: the unlink acts
    in the folder the walk holds (moved away), never in the link's target."""
    root, outside = tree
    (outside / "model.pt").write_bytes(b"someone else's")
    real = localfs.open_dir

    def open_then_swap(name: str, dir_fd: int) -> int:
        fd = real(name, dir_fd)
        if name == "step-100":
            os.rename(root / "run" / "step-100", tmp_path / "moved-step")
            os.symlink(outside, root / "run" / "step-100")
        return fd

    monkeypatch.setattr(localfs, "open_dir", open_then_swap)
    res = run(LocalStore(root).delete_many(["run/step-100/model.pt"]))
    assert res.ok
    assert (outside / "model.pt").read_bytes() == b"someone else's"
    assert not (tmp_path / "moved-step" / "model.pt").exists()  # the file the walk held is the one gone
    assert (tmp_path / "moved-step" / "optim.pt").exists()


def test_a_write_never_replaces_a_link_or_writes_through_one(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    os.symlink(outside / "precious.pt", root / "run" / "lock.json")
    store = LocalStore(root)
    with pytest.raises(StoreError, match=r"symbolic link.*refused to overwrite"):
        run(store.put_bytes("run/lock.json", b"{}"))
    assert (root / "run" / "lock.json").is_symlink() and (outside / "precious.pt").read_bytes() == b"precious"
    src = root.parent / "src.bin"
    src.write_bytes(b"copied")
    with pytest.raises(StoreError, match="symbolic link"):
        run(store.copy_in(src, "run/lock.json"))
    run(store.put_bytes("run/new/dir/a.json", b"{}"))  # missing folders are made
    assert (root / "run" / "new" / "dir" / "a.json").read_bytes() == b"{}"
    run(store.copy_in(src, "run/step-100/model.pt"))  # a regular file is replaced whole
    assert (root / "run" / "step-100" / "model.pt").read_bytes() == b"copied"
    assert not [p for p in (root / "run").rglob("*.tmp-lm")]


def test_a_folder_or_special_file_is_not_deleted_as_an_object(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    os.mkfifo(root / "run" / "fifo")
    res = run(LocalStore(root).delete_many(["run/step-100", "run/fifo"]))
    assert set(res.errors) == {"run/step-100", "run/fifo"} and "directory" in res.errors["run/step-100"]
    assert (root / "run" / "step-100" / "model.pt").exists() and (root / "run" / "fifo").exists()


# -- the property: exactly the named regular files, nothing through a link, nothing outside ------

NAMES = st.sampled_from(["a", "b", "c", "step-1", "step-10"])


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[tuple[str, ...]], list[tuple[tuple[str, ...], str]], list[str]]:
    files = draw(st.lists(st.lists(NAMES, min_size=1, max_size=3).map(tuple), min_size=1, max_size=8, unique=True))
    links = draw(
        st.lists(
            st.tuples(
                st.lists(NAMES, min_size=1, max_size=3).map(tuple), st.sampled_from(["out", "in-dir", "in-file"])
            ),
            max_size=4,
        )
    )
    extra = draw(st.lists(st.lists(NAMES, min_size=1, max_size=4).map("/".join), max_size=4))
    return files, links, extra


def build(spec: tuple, base: Path) -> tuple[Path, Path]:
    """The generated tree under ``base``: the store root (files, links out of it, links inside it)
    and a folder outside it that a link may lead to."""
    files, links, _extra = spec
    root, outside = base / "store", base / "outside"
    root.mkdir()
    subs = ("", "a", "step-1", "a/b")
    for sub in subs:
        (outside / sub).mkdir(parents=True, exist_ok=True)
    for sub in subs:
        for n in ("a", "b", "c", "step-1", "step-10"):
            if not (outside / sub / n).exists():
                (outside / sub / n).write_bytes(b"outside " + sub.encode() + n.encode())
    made: list[str] = []
    for parts in files:
        p = root.joinpath(*parts)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            if not p.exists():
                p.write_bytes("/".join(parts).encode())
                made.append("/".join(parts))
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue
    for parts, kind in links:
        p = root.joinpath(*parts)
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            if kind == "out":
                os.symlink(outside, p)
            elif kind == "in-dir" and made:
                os.symlink(root / made[0].rsplit("/", 1)[0] if "/" in made[0] else root, p)
            elif made:
                os.symlink(root / made[-1], p)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue
    return root, outside


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=trees(), data=st.data())
def test_delete_many_removes_exactly_the_named_files_inside_the_root(
    tmp_path_factory: pytest.TempPathFactory, spec: tuple, data: st.DataObject
) -> None:
    files, links, extra = spec
    root, outside = build(spec, tmp_path_factory.mktemp("prop"))
    outside_before = files_under(outside)
    inside_before = files_under(root)
    link_paths = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink()}
    listed = [o.key for o in run(LocalStore(root).list())]
    keys = data.draw(st.lists(st.sampled_from(sorted(set(listed) | set(extra) | link_paths) or ["a"]), max_size=6))

    res = run(LocalStore(root).delete_many(keys))

    assert files_under(outside) == outside_before  # nothing outside the root, ever
    inside_after = files_under(root)

    def through_link(key: str) -> bool:
        parts = key.split("/")
        return any(root.joinpath(*parts[:i]).is_symlink() for i in range(1, len(parts)))

    for key in keys:
        if through_link(key):
            assert key in res.errors  # refused, not followed
    # a regular file is gone only when it was named exactly; every named one outside links is gone
    for rel, body in inside_before.items():
        if rel in keys and not through_link(rel):
            assert rel not in inside_after and rel in res.deleted
        else:
            assert inside_after.get(rel) == body
    for key in res.deleted:
        assert not through_link(key)


def through_a_link(root: Path, key: str) -> bool:
    parts = key.split("/")
    return any(root.joinpath(*parts[:i]).is_symlink() for i in range(1, len(parts) + 1))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(spec=trees(), data=st.data())
def test_a_streamed_write_changes_exactly_its_key_and_never_writes_through_a_link(
    tmp_path_factory: pytest.TempPathFactory, spec: tuple, data: st.DataObject
) -> None:
    """``LocalStore.writing`` (a strip's shards): the key named becomes a regular file with the
    bytes written, or the write is refused; nothing else inside the root changes, nothing outside
    it ever does, and a link at the key or on the way to it is never written through or replaced."""
    _files, _links, extra = spec
    root, outside = build(spec, tmp_path_factory.mktemp("prop"))
    outside_before, inside_before = files_under(outside), files_under(root)
    links_before = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink()}
    listed = [o.key for o in run(LocalStore(root).list())]
    under_links = {f"{link}/{name}" for link in links_before for name in ("a", "step-1/c")}
    key = data.draw(st.sampled_from(sorted(set(listed) | set(extra) | links_before | under_links)))
    body = data.draw(st.binary(min_size=1, max_size=64))

    refused = None
    try:
        with LocalStore(root).writing(key) as f:
            f.write(body)
    except StoreError as exc:
        refused = str(exc)
    except (NotADirectoryError, IsADirectoryError, FileExistsError):
        refused = "not a folder"  # a regular file where the key needs a folder: nothing was written

    assert files_under(outside) == outside_before  # nothing outside the root, ever
    assert {str(p.relative_to(root)) for p in root.rglob("*") if p.is_symlink()} == links_before  # links stay
    after = files_under(root)
    assert not [k for k in after if k.rsplit("/", 1)[-1].endswith(".tmp-lm")]  # no part left behind
    if through_a_link(root, key):
        assert refused is not None and "\n" not in refused
    if refused is None:
        assert after.get(key) == body and not through_a_link(root, key)
    for rel, before in inside_before.items():
        if rel != key or refused is not None:
            assert after.get(rel) == before
