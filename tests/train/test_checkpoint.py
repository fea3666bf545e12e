"""Atomic checkpoint folders and the latest marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(("stage", "refused"), [(0, False), (2, True), (3, True)])
def test_resume_on_another_number_of_ranks(tmp_path, stage, refused):
    # DeepSpeed cannot re-partition ZeRO-1/2/3 optimizer states; ZeRO-0 resumes anywhere
    import types

    from hgpo.train.train_config import TrainConfigError
    from hgpo.train.trainer import Trainer

    root = tmp_path / "checkpoints"
    tmp = ckpt.tmp_dir(root, 1)
    (tmp / "trainer_state.json").write_text(json.dumps({"iteration": 1, "world_size": 2}))
    ckpt.commit(root, tmp, 1, keep=2)
    loaded = []
    saved = {"lr": 3e-4, "weight_decay": 0.01}
    opt = types.SimpleNamespace(param_groups=[dict(saved), dict(saved)])
    actor = types.SimpleNamespace(
        load_checkpoint=lambda path, tag, **kw: loaded.append(tag), optimizer=opt
    )
    fake = types.SimpleNamespace(
        out=tmp_path,
        world=1,
        cfg=types.SimpleNamespace(zero_stage=stage, lr=1e-6, weight_decay=0.0),
        actor=actor,
        critic=None,
        lora=False,
        engine_sync=lambda: None,
    )
    if refused:
        with pytest.raises(TrainConfigError, match=r"written by 2 ranks .*zero_stage=\d.*hf_model"):
            Trainer._load(fake)
        assert loaded == []
    else:
        Trainer._load(fake)
        assert loaded == ["actor"] and fake.start == 2
        # the --lr given with --resume wins over the learning rate in the optimizer state
        assert opt.param_groups == [{"lr": 1e-6, "weight_decay": 0.0}] * 2


def _three_checkpoints(out):
    root = out / "checkpoints"
    for it in (1, 2, 3):
        tmp = ckpt.tmp_dir(root, it)
        (tmp / "trainer_state.json").write_text(json.dumps({"iteration": it}))
        (tmp / "actor").mkdir()
        (tmp / "actor" / "w.pt").write_bytes(bytes([it]) * 100)
        ckpt.commit(root, tmp, it, keep=3)
    return [root / f"iter_{it:06d}" for it in (1, 2, 3)]


def _flip(p):
    p.write_bytes(bytes([p.read_bytes()[0] ^ 1]) + p.read_bytes()[1:])


@pytest.mark.parametrize(
    ("harm", "why"),
    [
        (lambda c: (c / "actor" / "w.pt").write_bytes(b"\3" * 40), "actor/w.pt is 40 bytes, 100"),
        (lambda c: (c / "trainer_state.json").write_text(""), "trainer_state.json is 0 bytes"),
        (lambda c: _flip(c / "trainer_state.json"), "trainer_state.json differs from what"),
        (lambda c: (c / "actor" / "w.pt").unlink(), "actor/w.pt is missing"),
        (lambda c: (c / ckpt.MANIFEST).write_text("{"), "manifest.json cannot be read"),
    ],
)
def test_resume_passes_over_a_damaged_checkpoint_with_a_note(tmp_path, harm, why):
    import types

    from hgpo.train.preflight import note_resume
    from hgpo.train.rundir import resume_checkpoint

    _, two, three = _three_checkpoints(tmp_path)
    assert ckpt.latest_good(tmp_path / "checkpoints") == (three, [])
    harm(three)
    good, damaged = resume_checkpoint(tmp_path)
    assert good == two and [p for p, _ in damaged] == [three] and damaged[0][1].startswith(why)
    note = note_resume(types.SimpleNamespace(out_dir=str(tmp_path), resume=True))
    assert note.startswith(f"--resume: checkpoint {three} is damaged ({why}")
    assert note.endswith(f"passed over; the run resumes from {two}") and "\n" not in note


def test_resume_refuses_in_one_line_when_no_checkpoint_is_intact(tmp_path):
    from hgpo.train.rundir import resume_checkpoint
    from hgpo.train.train_config import TrainConfigError

    for c in _three_checkpoints(tmp_path):
        (c / "actor" / "w.pt").write_bytes(b"")
    (tmp_path / "checkpoints" / "latest").write_text("")  # the marker emptied too
    with pytest.raises(TrainConfigError) as e:
        resume_checkpoint(tmp_path)
    msg = str(e.value)
    assert msg.startswith(f"--resume: checkpoint {tmp_path / 'checkpoints' / 'iter_000003'} is "
                          "damaged: actor/w.pt is 0 bytes, 100 were written (and the 2 older")  # fmt: skip
    assert "--fresh" in msg and "\n" not in msg
    # a checkpoint from before manifests were written: its trainer_state.json is checked
    old = tmp_path / "old"
    _three_checkpoints(old)
    for c in (old / "checkpoints").glob("iter_*"):
        (c / ckpt.MANIFEST).unlink()
    (old / "checkpoints" / "iter_000003" / "trainer_state.json").write_text("")
    good, damaged = resume_checkpoint(old)
    assert good.name == "iter_000002" and "trainer_state.json cannot be read" in damaged[0][1]


def test_a_checkpoint_torch_cannot_write_is_an_os_error_naming_its_folder(tmp_path, monkeypatch):
    """torch.save on a full disk raises RuntimeError("... unexpected pos ..."): an OSError
    naming the checkpoint's folder, and the half-written folder is removed."""
    import errno
    import types

    from hgpo.train.run_checkpoint import save_run

    def save_checkpoint(path, tag, **kw):
        (Path(path) / tag).mkdir()
        (Path(path) / tag / "half.pt").write_bytes(b"\0" * 64)
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")

    monkeypatch.setattr(ckpt, "LOW_ROOM", 2**62)  # this disk counts as full
    actor = types.SimpleNamespace(save_checkpoint=save_checkpoint)
    cfg = types.SimpleNamespace(keep_checkpoints=2, save=lambda p: None)
    with pytest.raises(OSError) as e:
        save_run(tmp_path, cfg, 3, rank=0, world=1, actor=actor, critic=None, lora=False,
                 tok=None, model_path="m")  # fmt: skip
    assert e.value.errno == errno.ENOSPC and "unexpected pos 64" in e.value.strerror
    assert e.value.filename == str(tmp_path / "checkpoints" / ".tmp-iter_000003")
    assert not (tmp_path / "checkpoints" / ".tmp-iter_000003").exists()


@pytest.mark.parametrize(
    ("stop", "rc", "line"),
    [
        (OSError(28, "No space left on device"), 1,
         "error: no space left on device (ENOSPC) writing {out}; kept checkpoint iter_000003 in "
         "{out}/checkpoints; go on with --resume"),
        (OSError(30, "Read-only file system", "/r/metrics.jsonl"), 1,
         "error: read-only file system (EROFS) writing /r/metrics.jsonl; kept checkpoint "
         "iter_000003 in {out}/checkpoints; go on with --resume"),
        (KeyboardInterrupt(), 130,
         "interrupted; kept checkpoint iter_000003 in {out}/checkpoints; go on with --resume"),
    ],
    ids=["ENOSPC", "EROFS", "ctrl-c"],
)  # fmt: skip
def test_a_full_disk_a_read_only_folder_or_ctrl_c_is_one_line(
    tmp_path, monkeypatch, capsys, stop, rc, line
):
    from hgpo.train import trainer
    from hgpo.train.__main__ import main

    out = tmp_path / "run"
    _three_checkpoints(out)

    def train(cfg):
        raise stop

    monkeypatch.setattr(trainer, "train", train)
    args = ["--preset", "tiny", "--env", "toy:keydoor:size=4", "--out-dir", str(out), "--resume"]
    assert main(args) == rc
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == line.format(out=out) and "Traceback" not in err
