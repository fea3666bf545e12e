"""Atomic checkpoint folders and the latest marker."""

from __future__ import annotations

from hgpo.train import checkpoint as ckpt


def test_commit_publishes_prunes_and_survives_a_stale_tmp(tmp_path):
    root = tmp_path / "checkpoints"
    assert ckpt.latest(root) is None
    for it in (1, 2, 3):
        tmp = ckpt.tmp_dir(root, it)
        (tmp / "w.bin").write_bytes(bytes([it]) * 10)
        ckpt.commit(root, tmp, it, keep=2)
    assert ckpt.latest(root) == root / "iter_000003"
    assert sorted(p.name for p in root.glob("iter_*")) == ["iter_000002", "iter_000003"]
    # a run killed while writing checkpoint 4 leaves a temporary folder: latest is unchanged
    half = ckpt.tmp_dir(root, 4)
    (half / "w.bin").write_bytes(b"\0")
    assert ckpt.latest(root) == root / "iter_000003"
    tmp = ckpt.tmp_dir(root, 4)  # the retry starts clean
    assert list(tmp.iterdir()) == []
    ckpt.commit(root, tmp, 4, keep=2)
    assert not list(root.glob(".tmp-*"))


def test_atomic_write_text_replaces(tmp_path):
    p = tmp_path / "a" / "x.txt"
    ckpt.atomic_write_text(p, "one")
    ckpt.atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [q.name for q in p.parent.iterdir()] == ["x.txt"]
