#!/usr/bin/env bash
# Run ON the device machine (device tool), after benchmarks/device/fetch_wheels.sh here:
#   run(command="bash benchmarks/device/gpu_check.sh", carry=[".whl"], timeout_s=400)
# It installs the carried wheels into /tmp/site, then writes to $OUT (each also printed):
#   zero0.jsonl, zero3.jsonl: python -m benchmarks.gpu_check_train --engine hf on the real-size
#       Qwen2.5-1.5B architecture (random weights; 64 prompts x 1,024 tokens, 256 response
#       tokens; bf16 DeepSpeed updates): rollout tokens/s, score/update/sync seconds, peak memory
#   train_tiny.jsonl: the trainer itself on the GPU (tiny preset, WebShop, 2 iterations, bf16)
#   log.txt: everything
# Measured on the H200 (2026-12-04, docs/train.md "GPU check"): ZeRO-0's 3 iterations with the
# 69 s model build and the 36 s toy run, then ZeRO-3's build and first iteration, filled 400 s
# with the installs, so ZeRO-3 now runs 2 iterations and skips the toy run (ZeRO-0 ran it):
# about 7 min, which leaves gpu_smol.sh about 6 of the 15 minutes.
# Carry [".whl", ".smol/a"] to have SmolLM2's first half there for gpu_smol.sh (the next run).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
PY=${PY:-python3}
# a rehearsal on a CPU: DEVICE=cpu CHECK_ARGS="--arch small --prompts 8 ..." PY=... OUT=...
DEVICE=${DEVICE:-cuda}
CHECK_ARGS=${CHECK_ARGS:-}
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DS_BUILD_OPS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
# shellcheck source=benchmarks/device/install_wheels.sh
source benchmarks/device/install_wheels.sh
install_wheels || exit $?
# SmolLM2's first half, kept for gpu_smol.sh's run on this machine
SMOL_STASH=${SMOL_STASH:-/tmp/smol}
if [ -f .smol/a ]; then mkdir -p "$SMOL_STASH" && cp .smol/a "$SMOL_STASH/a"; fi
rc=0
for z in 0 3; do
    stage_args=(--iterations 3)
    [ "$z" = 3 ] && stage_args=(--iterations 2 --toy "")
    # shellcheck disable=SC2086
    $PY -m benchmarks.gpu_check_train --engine hf --zero-stage "$z" "${stage_args[@]}" \
        --device "$DEVICE" $CHECK_ARGS --out "/tmp/gpu_check_z$z" | tee "$OUT/zero$z.jsonl"
    rc=$((rc | ${PIPESTATUS[0]}))
done
rm -rf /tmp/train_tiny
$PY -m hgpo.train --preset tiny --env webshop --device "$DEVICE" --out-dir /tmp/train_tiny
rc=$((rc | $?))
cp /tmp/train_tiny/metrics.jsonl "$OUT/train_tiny.jsonl" 2>/dev/null
echo "exit status $rc"
exit $rc
