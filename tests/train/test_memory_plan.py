"""The memory plan (hgpo.train.memory_plan) against hand-worked numbers, the built-in shapes
against the models transformers builds, and ``--plan`` on the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hgpo.train.__main__ import main
from hgpo.train.memory_plan import GIB, RESERVE_GIB, PlanSettings, plan, plan_for_config
from hgpo.train.model_shapes import SHAPES, ModelConfigError, ModelShape, model_shape
from hgpo.train.train_config import PRESETS, resolve
from tests.train.conftest import ROOT

# L=2, h=4, i=8, 2 heads of 2, 1 KV head, V=10, tied, q/k/v biases (Qwen2-style):
#   layer = q 4*4+4 + k 4*2+2 + v 4*2+2 + o 4*4 + MLP 3*4*8 + norms 2*4 = 160
#   model = embeddings 10*4 + 2*160 + final norm 4 = 364
TOY = ModelShape(layers=2, hidden=4, intermediate=8, heads=2, kv_heads=1, head_dim=2, vocab=10,
                 tied=True)  # fmt: skip


def _items(p) -> dict[str, float]:
    return {i.name: i.bytes for i in p.items}


def test_parameter_counts_by_hand():
    assert TOY.layer_params() == 160
    assert TOY.params() == 364
    untied = ModelShape(2, 4, 8, 2, 1, 2, 10, tied=False)
    assert untied.params() == 364 + 40
    qwen3 = ModelShape(2, 4, 8, 2, 1, 2, 10, tied=True, qkv_bias=False, qk_norm=True)
    assert qwen3.layer_params() == 160 - 8 + 2 * 2  # no biases, + q_norm and k_norm (head_dim)
    # LoRA rank 1 on q, k, v, o, gate, up, down: (4+4)+(4+2)+(4+2)+(4+4)+(4+8)+(4+8)+(8+4) = 64
    assert TOY.lora_params(1) == 2 * 64
    assert TOY.kv_bytes_per_token(2) == 2 * 2 * 2 * 2


@pytest.mark.parametrize(
    ("stage", "gpus", "dtype", "expect"),
    [
        (0, 1, 4, (4 * 364, 4 * 364, 8 * 364)),  # fp32, plain AdamW: no master copy
        (0, 2, 2, (2 * 364, 2 * 364, 12 * 364)),  # bf16: fp32 master + moments, not sharded
        (1, 2, 2, (2 * 364, 2 * 364, 12 * 364 / 2)),
        (2, 2, 2, (2 * 364, 2 * 364 / 2, 12 * 364 / 2)),
        (2, 2, 4, (4 * 364, 4 * 364 / 2, 12 * 364 / 2)),  # fp32 ZeRO-2 keeps an fp32 partition
        (3, 4, 2, (2 * 364 / 4, 2 * 364 / 4, 12 * 364 / 4)),
    ],
)
def test_weights_gradients_optimizer_by_zero_stage(stage, gpus, dtype, expect):
    s = PlanSettings(gpus=gpus, dtype_bytes=dtype, zero_stage=stage, reference=False)
    got = _items(plan(TOY, s))
    assert (got["weights"], got["gradients"], got["optimizer"]) == pytest.approx(expect)
    assert ("zero3 live" in got) == (stage == 3)


def test_lora_trains_only_the_adapters_and_has_no_reference_copy():
    s = PlanSettings(dtype_bytes=2, lora_rank=1, reference=True)
    got = _items(plan(TOY, s))
    A = 128
    assert got["weights"] == 2 * 364 + 4 * A
    assert got["gradients"] == 4 * A and got["optimizer"] == 8 * A
    assert "reference" not in got
    assert _items(plan(TOY, PlanSettings(dtype_bytes=2)))["reference"] == 2 * 364


def test_activations_logits_and_kv_cache_by_hand():
    # E = 8h + 3q + 3k + 4i = 32 + 12 + 6 + 32 = 82; n = 1 x (3 + 2) = 5 tokens
    base = dict(micro_batch=1, prompt_tokens=3, response_tokens=2, rollout_batch=3)
    got = _items(plan(TOY, PlanSettings(dtype_bytes=4, **base)))
    assert got["activations"] == 5 * 2 * 82 * 4
    assert got["logits"] == 1 * 2 * 10 * 12
    assert got["kv cache"] == 3 * 5 * (2 * 2 * 2 * 4)
    ckpt = _items(plan(TOY, PlanSettings(dtype_bytes=2, gradient_checkpointing=True, **base)))
    assert ckpt["activations"] == 5 * 2 * 4 * 2 + 5 * 82 * 2
    assert ckpt["logits"] == 1 * 2 * 10 * 14


def test_kept_logits_of_generate_in_fp32(monkeypatch):
    """fp32 generate mode on the hf engine keeps generate's raw logits for the old log-probs:
    rollout_batch x max_response x V x 4 bytes; none in score mode, in bf16, under ZeRO-3 (the
    engine samples from a copy), or past MAX_KEPT_LOGITS (the engine keeps none then)."""
    from hgpo.train import memory_plan

    base = dict(prompt_tokens=3, response_tokens=2, rollout_batch=3, reference=False)
    assert _items(plan(TOY, PlanSettings(dtype_bytes=4, **base)))["kept logits"] == 3 * 2 * 10 * 4
    for s in (PlanSettings(dtype_bytes=4, generate=False, **base),
              PlanSettings(dtype_bytes=2, **base),
              PlanSettings(dtype_bytes=4, zero_stage=3, **base)):  # fmt: skip
        assert "kept logits" not in _items(plan(TOY, s))
    monkeypatch.setattr(memory_plan, "MAX_KEPT_LOGITS", 3 * 2 * 10 * 4 - 1)
    assert "kept logits" not in _items(plan(TOY, PlanSettings(dtype_bytes=4, **base)))


def test_vllm_share_and_the_fit_verdict():
    s = PlanSettings(gpu_gib=10, rollout_engine="vllm", vllm_share=0.5, reference=False)
    p = plan(TOY, s)
    assert _items(p)["vllm share"] == 5 * GIB and "kv cache" not in _items(p)
    assert p.capacity == (10 - RESERVE_GIB) * GIB and p.fits
    assert not plan(TOY, PlanSettings(gpu_gib=RESERVE_GIB + 1e-9)).fits
    assert "does NOT fit" in plan(TOY, PlanSettings(gpu_gib=RESERVE_GIB + 1e-9)).render()


def test_vllm_on_a_cpu_is_its_weights_their_packed_copy_and_its_kv_cache():
    # TOY's linear weights per layer: q 16 + k 8 + v 8 + o 16 + gate 32 + up 32 + down 32 = 144;
    # packed: 2 layers x 144 + the head 10 x 4 (packed though tied) = 328
    s = PlanSettings(dtype_bytes=4, rollout_engine="vllm", cpu=True, vllm_cpu_kv_gib=0.5)
    got = _items(plan(TOY, s))
    assert got["vllm weights"] == 4 * 364 and got["vllm packed"] == 4 * 328
    assert got["vllm kv"] == 0.5 * GIB
    assert "vllm share" not in got and "kv cache" not in got


def test_a_cpu_runs_vllm_kv_cache_is_vllm_cpu_kvcache_space(monkeypatch):
    cfg = resolve(preset="tiny", overrides={"rollout_engine": "vllm", "device": "cpu"})
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert _items(plan_for_config(cfg))["vllm kv"] == 1 * GIB  # the engine's default
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2.5")
    assert _items(plan_for_config(cfg))["vllm kv"] == 2.5 * GIB


def test_builtin_shapes_match_the_models_transformers_builds():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for name, s in SHAPES.items():
        # Qwen3: q/k norms; Qwen2: q/k/v biases; Llama (SmolLM2): neither
        cls = transformers.Qwen3Config if s.qk_norm else transformers.Qwen2Config
        if not s.qk_norm and not s.qkv_bias:
            cls = transformers.LlamaConfig
        extra = {} if s.qkv_bias else {"head_dim": s.head_dim}
        config = cls(
            vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
            num_hidden_layers=s.layers, num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads, tie_word_embeddings=s.tied, **extra,
        )  # fmt: skip
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == s.params(), name
        assert model_shape(name.removesuffix("-Instruct")) == s


def test_a_local_config_is_read(tmp_path):
    cfg = {
        "model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 4, "intermediate_size": 8,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2, "vocab_size": 10,
        "tie_word_embeddings": True,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    s = model_shape(str(tmp_path))
    assert (s.qk_norm, s.qkv_bias, s.params()) == (True, False, 364 + 2 * (-8 + 2 * 2))


def test_every_paper_preset_fits_its_h100s():
    for name in PRESETS:
        if name in ("tiny", "smol-cpu"):  # the CPU presets: not the paper's
            continue
        for engine in ("hf", "vllm"):
            p = plan_for_config(resolve(preset=name, overrides={"rollout_engine": engine}), name)
            assert p.settings.gpus in (2, 4) and p.fits, (name, engine, p.render())


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (None, "cannot read"),
        ("{bad", "is not JSON"),
        ('{"hidden_size": 4}', "no 'num_attention_heads' key"),
    ],
)
def test_plan_with_an_unreadable_config_is_a_named_error(tmp_path, capsys, config, needle):
    if config is not None:
        (tmp_path / "config.json").write_text(config)
    assert main(["--preset", "alfworld-1.5b-k2", "--plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: TrainConfig.model=") and needle in err
    assert err.count("\n") == 1
    with pytest.raises(ModelConfigError, match="built-in shapes"):
        model_shape("org/not-a-model")


def test_plan_prints_and_exits_without_building_a_model():
    code = (
        "import sys; from hgpo.train.__main__ import main; "
        "rc = main(['--preset', 'alfworld-7b-k4', '--plan']); "
        "print('torch' in sys.modules, rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "4 x 80 GiB, ZeRO-3" in r.stdout and ": fits" in r.stdout
    assert r.stdout.strip().endswith("False 0")


def test_zero_1_2_reduce_bucket():
    got = {z: _items(plan(TOY, PlanSettings(zero_stage=z, gpus=2))) for z in (0, 1, 2, 3)}
    assert "zero bucket" not in got[0] and "zero bucket" not in got[3]
    assert got[1]["zero bucket"] == 4 * 5e8  # ZeRO-1 stages an fp32 accumulator
    assert got[2]["zero bucket"] == 2 * 5e8  # ZeRO-2: the bf16 working dtype
    # on a CPU only the written part counts: the model's 364 parameters
    cpu = _items(plan(TOY, PlanSettings(zero_stage=2, dtype_bytes=4, cpu=True)))
    assert cpu["zero bucket"] == 4 * 364
    lora = _items(plan(TOY, PlanSettings(zero_stage=2, lora_rank=1, cpu=True)))
    assert lora["zero bucket"] == 4 * 128  # fp32 adapters


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--plan-gpus", "2"], "--plan-gpus does nothing without --plan"),
        (["--plan", "--plan-gpus", "0"], "--plan-gpus: must be an integer in 1..65536, got 0"),
        (["--plan", "--plan-gpus", "100000000000000000000"], "--plan-gpus: must be an integer"),
        (["--plan", "--plan-gpu-gib", "nan"], "--plan-gpu-gib: must be a finite number in [1.0"),
        (["--plan", "--plan-gpu-gib", "1e-300"], "--plan-gpu-gib: must be a finite number in"),
        (["--plan", "--plan-gpu-gib", "1e308"], "--plan-gpu-gib: must be a finite number in"),
    ],
)
def test_plan_flags_are_checked(argv, needle, capsys):
    assert main(["--preset", "alfworld-1.5b-k2", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("key", "value"),
    [("hidden_size", -4), ("num_attention_heads", 0), ("vocab_size", 2.5),
     ("num_hidden_layers", True), ("num_key_value_heads", 0), ("hidden_size", "4")],
)  # fmt: skip
def test_plan_refuses_a_model_size_that_is_not_a_positive_integer(tmp_path, capsys, key, value):
    cfg = {
        "num_hidden_layers": 2, "hidden_size": 4, "intermediate_size": 8,
        "num_attention_heads": 2, "vocab_size": 10, key: value,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(__import__("json").dumps(cfg))
    assert main(["--preset", "alfworld-1.5b-k2", "--plan", "--model", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{key} must be a positive integer, got {value!r}" in err and err.count("\n") == 1, err
    (tmp_path / "config.json").write_text(
        __import__("json").dumps({**cfg, key: 4, "hidden_size": 6, "num_attention_heads": 4})
    )
    assert main(["--preset", "alfworld-1.5b-k2", "--plan", "--model", str(tmp_path)]) == 2
    assert "hidden_size=6 is not a multiple of num_attention_heads=4" in capsys.readouterr().err


def test_plan_gpus_and_memory_flags_change_the_plan(capsys):
    assert main(["--preset", "alfworld-1.5b-k2", "--plan", "--plan-gpus", "1",
                 "--plan-gpu-gib", "24"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "1 x 24 GiB" in out and "does NOT fit" in out
