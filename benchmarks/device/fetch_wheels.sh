#!/usr/bin/env bash
# Run HERE (a machine with the package registries), in the repository root, before a GPU check
# on this workplace's device machine. That machine reaches no registry. It has Python 3.12,
# torch 2.11 (CUDA 13), transformers and tokenizers, but no deepspeed and none of deepspeed's
# pydantic/hjson, and none of WebShop's bm25s/rapidfuzz. This puts them in .whl/ (git-ignored,
# about 8 MB), which the run carries: carry [".whl"].
# vLLM cannot travel: its wheel is 336 MB (the limit is 64 MiB) and it pins its own torch, so
# on that machine the check uses the hf rollout engine.
set -euo pipefail
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d .whl \
    hjson pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection \
    "typing-extensions>=4.16" bm25s rapidfuzz
# deepspeed is published as a source archive only; the device builds it (no ops, about 10 s)
python3 -m pip download -q --no-deps --no-binary=:all: -d .whl deepspeed==0.19.8
ls -la .whl && du -sh .whl
