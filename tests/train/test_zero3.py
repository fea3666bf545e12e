"""ZeRO-3 on the CPU: the tiny loop (actor, sharded reference, critic) gives ZeRO-0's figures,
its checkpoints hold a consolidated Hugging Face model, a kill and a resume end where a straight
run ends, and the parameter gather yields the unsharded tensors.

The module fixture's four trainer runs overlap (two cores).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hgpo.train.run_metrics import read_metrics
from tests.train.conftest import ROOT, run_env

ARGS = ["--preset", "tiny", "--env", "webshop", "--estimator", "gae", "--val-every", "0"]
"""gae: the critic is a third DeepSpeed engine; the tiny preset's kl_coef > 0 adds the reference."""

FIGURES = (
    "pg_loss",
    "kl",
    "entropy",
    "clip_frac",
    "grad_norm",
    "vf_loss",
    "adv_mean",
    "adv_std",
    "n_steps",
    "gen_tokens",
    "optimizer_steps",
)

REL, ABS = 1e-6, 1e-8
"""ZeRO-3 reduces gradients in flat fp32 partitions, in another order than ZeRO-0: measured
relative differences up to 4e-8 (pg_loss, entropy, grad norm) and 6e-10 absolute on a KL of
1.3e-5. Dropping a micro-batch's gradient (what DeepSpeed 0.19 does when the forward bypasses
the engine, see ``hgpo.train.trainer.begin_forward``) moves pg_loss by 5e-5 relative and the
KL by 2e-7."""


def _ok(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"


def _same(a: dict, b: dict, keys=FIGURES) -> None:
    for k in keys:
        assert a[k] == pytest.approx(b[k], rel=REL, abs=ABS), (a["iteration"], k, a[k], b[k])


def _start(args: list[str], out, extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**run_env(), **(extra or {})}
    cmd = [sys.executable, "-m", "hgpo.train", *ARGS, *args, "--out-dir", str(out)]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait(p: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = p.communicate(timeout=600)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


ZERO3 = ["--zero-stage", "3", "--iterations", "2", "--save-every", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run folders, the runs started together: ZeRO-0 for one iteration; ZeRO-3 for two,
    straight; ZeRO-3 killed in the update of iteration 2 (its checkpoint of iteration 1 is
    complete), then resumed in the same folder."""
    root = tmp_path_factory.mktemp("zero3")
    # (ZeRO-3 runs the packed forward: the ZeRO-0 run too, so both round alike and Adam's first
    # step, which amplifies a near-zero gradient's rounding, gives the same weights)
    zero0 = _start(
        ["--zero-stage", "0", "--iterations", "1", "--shared-prefix-update", "false"],
        root / "zero0",
    )
    zero3 = _start(ZERO3, root / "zero3")
    killed = _wait(_start(ZERO3, root / "resumed", {"HGPO_TRAIN_KILL_AT": "update:2"}))
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (root / "resumed" / "checkpoints" / "latest").read_text().strip() == "iter_000001"
    assert [x["iteration"] for x in read_metrics(root / "resumed")] == [1]
    resumed = _start([*ZERO3, "--resume"], root / "resumed")
    for p in (zero0, zero3, resumed):
        _ok(_wait(p))
    return root


def test_zero3_first_iteration_equals_zero0(runs):
    (z0,) = read_metrics(runs / "zero0")
    z3 = read_metrics(runs / "zero3")
    assert [r["iteration"] for r in z3] == [1, 2]
    _same(z3[0], z0)
    assert z0["kl"] > 0 and z0["vf_loss"] > 0 and z0["grad_norm"] > 0 and z0["entropy"] > 0
    saved = json.loads((runs / "zero3" / "config.json").read_text())
    assert saved["zero_stage"] == 3 and saved["rollout_engine"] == "hf"


def _load_hf(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    tok = AutoTokenizer.from_pretrained(str(path))
    return model, tok


def test_zero3_checkpoint_holds_a_consolidated_hf_model(runs):
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ck = runs / "zero3" / "checkpoints"
    assert (ck / "latest").read_text().strip() == "iter_000002"
    model, tok = _load_hf(ck / "iter_000002" / "hf_model")
    assert (ck / "iter_000002" / "hf_model" / "model.safetensors").is_file()  # what vLLM reads
    assert tok.chat_template and tok.pad_token is not None
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # DeepSpeed's own consolidation of the sharded fp32 weights: the same tensors
    fp32 = get_fp32_state_dict_from_zero_checkpoint(str(ck / "iter_000002"), tag="actor")
    sd = model.state_dict()
    assert set(fp32) == set(sd)
    for k in fp32:
        assert torch.equal(sd[k], fp32[k]), k
    init, _ = _load_hf(runs / "zero3" / "tiny_model")
    moved = max((sd[k] - v).abs().max().item() for k, v in init.state_dict().items())
    assert moved > 1e-5  # trained, not the initial weights
    # ZeRO-0 saves the same folder; after iteration 1 both hold the same weights
    m0, _ = _load_hf(runs / "zero0" / "checkpoints" / "iter_000001" / "hf_model")
    m3, _ = _load_hf(ck / "iter_000001" / "hf_model")
    s0, s3 = m0.state_dict(), m3.state_dict()
    for k in s0:
        assert torch.allclose(s0[k], s3[k], rtol=0, atol=1e-6), k


def test_zero3_kill_and_resume_equals_straight_run(runs):
    import torch

    a, b = read_metrics(runs / "resumed"), read_metrics(runs / "zero3")
    assert [x["iteration"] for x in a] == [1, 2]
    for x, y in zip(a, b, strict=True):
        _same(x, y)
    ma, _ = _load_hf(runs / "resumed" / "checkpoints" / "iter_000002" / "hf_model")
    mb, _ = _load_hf(runs / "zero3" / "checkpoints" / "iter_000002" / "hf_model")
    sa, sb = ma.state_dict(), mb.state_dict()
    for k in sb:
        assert torch.allclose(sa[k], sb[k], rtol=0, atol=1e-6), k


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [True, False])
def test_gathered_named_parameters_under_zero3(monkeypatch, tied, arch):
    """Every parameter comes back once, full-shape and equal to the unsharded model's; the
    module is sharded again afterwards."""
    import copy

    import deepspeed
    import torch

    from hgpo.train import dist
    from hgpo.train.model import gathered_named_parameters
    from hgpo.train.tiny import tiny_model

    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    if not torch.distributed.is_initialized():
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(dist.free_port()))
        # the process group stays up: a later one in this process would be refused by DeepSpeed
        dist.init("cpu")
    full = tiny_model(300, hidden=64, layers=2, seed=3, tie_embeddings=tied, arch=arch)
    want = {n: p.detach().clone() for n, p in full.named_parameters()}
    cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
    module = copy.deepcopy(full)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=cfg)
    sharded = engine.module
    assert all(hasattr(p, "ds_id") and p.numel() == 0 for p in sharded.parameters())
    got = list(gathered_named_parameters(sharded))
    assert [n for n, _ in got] == list(want)
    for name, t in got:
        assert t.shape == want[name].shape, name
        assert torch.equal(t, want[name]), name
    assert all(p.numel() == 0 for p in sharded.parameters())  # partitioned again
    assert ("lm_head.weight" in dict(got)) is not tied
