"""The host's cleanup of scratch and leftovers: any tree a tenant can build is removed
whole, without recursion and without following a symlink (security review 2026-11-28:
``shutil.rmtree``, recursive on Python 3.11, raised RecursionError on a tree 1,500
directories deep, so scratch was never emptied, removed or reaped)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.isolation import _chmod_dir_at, base_dir, empty_dir, reap_stale

DEPTH = 2000  # past the recursion limit (1,000), with a path near PATH_MAX


def deep_tree(top: Path, depth: int = DEPTH, outside: Path | None = None) -> None:
    """``top/d/d/...`` ``depth`` levels, each with a file and (given ``outside``) a
    symlink to it; built through directory fds (the full path outgrows PATH_MAX)."""
    top.mkdir(parents=True, exist_ok=True)
    cur = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=cur)
            fd = os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=cur)
            os.write(fd, b"x")
            os.close(fd)
            if outside is not None:
                os.symlink(outside, "ln", dir_fd=cur)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=cur)
            os.close(cur)
            cur = nxt
    finally:
        os.close(cur)


@pytest.fixture(autouse=True)
def _no_deep_tree_left(tmp_path: Path) -> Iterator[None]:
    """Whatever the outcome, no deep tree is left in ``tmp_path``: pytest removes old
    temporary directories with ``shutil.rmtree`` too (every session on the host would
    then hit the same RecursionError). ``rm -rf`` is iterative."""
    yield
    subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory no cleanup may touch, that the tree links to."""
    keep = tmp_path / "outside"
    keep.mkdir()
    (keep / "keep").write_text("host data")
    return keep


def test_empty_dir_removes_a_tree_deeper_than_the_recursion_limit(
    tmp_path: Path, outside: Path
) -> None:
    scratch = tmp_path / "scratch"
    deep_tree(scratch, outside=outside)
    (scratch / "top-link").symlink_to(outside)
    assert empty_dir(scratch) is True
    assert scratch.is_dir() and os.listdir(scratch) == []
    assert (outside / "keep").read_text() == "host data"  # no symlink was followed


def test_remove_tree_removes_unreadable_directories_and_never_follows_symlinks(
    tmp_path: Path, outside: Path
) -> None:
    from sandbox.isolation import remove_tree

    root = tmp_path / "w-1-0"
    deep_tree(root / "scratch", depth=50, outside=outside)
    locked = root / "scratch" / "locked"
    (locked / "inner").mkdir(parents=True)
    (locked / "inner" / "f").write_text("x")
    os.chmod(locked / "inner", 0)
    os.chmod(locked, 0)
    assert remove_tree(root) is True
    assert not root.exists()
    assert (outside / "keep").read_text() == "host data"
    link = tmp_path / "link"
    link.symlink_to(outside)
    assert remove_tree(link) is True
    assert not link.exists() and (outside / "keep").exists()  # the link, not its target


def test_reap_stale_reaps_every_dead_entry_even_after_a_deep_one() -> None:
    """One leftover it cannot handle used to abandon the whole reap (``reaped 0``)."""
    pid = _dead_pid()
    deep = base_dir() / f"w-{pid}-0"
    plain = base_dir() / f"w-{pid}-1"
    try:
        deep_tree(deep / "scratch")
        (plain / "scratch").mkdir(parents=True)
        (plain / "scratch" / "f").write_text("x")
        assert reap_stale() >= 2
        assert not deep.exists() and not plain.exists()
    finally:
        for d in (deep, plain):
            subprocess.run(["rm", "-rf", str(d)], check=False)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_cleanups_chmod_never_follows_a_symlink_swapped_in(tmp_path: Path) -> None:
    """Found by review: the cleanup judged an entry a directory from its listing, then
    ``chmod``-ed it by path; a tenant that swapped a symlink in between had the host, as
    root, make a host file 0700. The entry is opened without following a symlink and
    changed through that fd: a symlink is refused, its target untouched."""
    victim_dir, victim_file = tmp_path / "host-dir", tmp_path / "host-file"
    victim_dir.mkdir(mode=0o755)
    victim_file.write_text("x")
    victim_file.chmod(0o644)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "to-dir").symlink_to(victim_dir)
    (scratch / "to-file").symlink_to(victim_file)
    (scratch / "real").mkdir(mode=0o500)
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in ("to-dir", "to-file"):
            with pytest.raises(NotADirectoryError):
                _chmod_dir_at(fd, name)
        _chmod_dir_at(fd, "real")
    finally:
        os.close(fd)
    assert victim_dir.stat().st_mode & 0o777 == 0o755
    assert victim_file.stat().st_mode & 0o777 == 0o644
    assert (scratch / "real").stat().st_mode & 0o777 == 0o700
    assert empty_dir(scratch) and not any(scratch.iterdir())
    assert victim_dir.is_dir() and victim_file.read_text() == "x"
