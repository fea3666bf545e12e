#!/usr/bin/env bash
# HGPO on ALFWorld with verl's own trainer (verl 0.9.x, its v1 trainer), one node, 2 GPUs:
# Qwen2.5-1.5B-Instruct, K = 2, 16 tasks x 8 rollouts per step, 50 steps per episode, in the
# style of verl-agent's recipe/hgpo/run_qwen2.5_1.5b_alfworld_train.sh (commit 796ed31).
#
# UNTESTED ON A GPU. Nobody has run this script end to end: only its pieces ran, on a CPU
# (the agent loop against a scripted rollout server, tests/integrations/test_verl_loop.py,
# and its overrides composed against verl 0.9.1's config, test_example_script_composes).
#
# What it needs:
#   pip install -e ".[verl,alfworld]"   (verl 0.9.x with vLLM; ALFWorld's TextWorld engine)
#   VERL_USE_EXTERNAL_MODULES imports, in every verl process,
#     hgpo.integrations.verl       registers algorithm.adv_estimator=hgpo (and every estimator
#                                  of ours) and reads the metadata of each step row;
#     hgpo.integrations.verl_loop  registers the agent loop "hgpo_stepwise": it plays one
#                                  ALFWorld episode per session, one output (row) per step,
#                                  prompts from the paper's templates over the last K steps.
#
# Usage: bash examples/verl/run_qwen2.5_1.5b_alfworld_hgpo.sh [vllm|sglang] [more overrides]
set -euo pipefail
set -x
ENGINE=${1:-vllm}
shift || true
export HF_HOME=${HF_HOME:-$HOME/.cache/huggingface}
export VERL_USE_EXTERNAL_MODULES=hgpo.integrations.verl,hgpo.integrations.verl_loop

here=$(cd "$(dirname "$0")" && pwd)
project_name="qwen2.5_1.5b_alfworld_hgpo"
history_length=2   # K; edit examples/verl/hgpo_agent_loop.yaml (options.history_length) too
train_data_size=16 # tasks per step (rollout groups)
val_data_size=128
group_size=8       # rollouts per task: verl's rollout.n
# 160 steps of 16 tasks drawn from the shuffled training games (verl-agent: 160 "epochs" of a
# 16-row placeholder dataset, a fresh random game at every reset)
data_dir=${DATA_DIR:-$HOME/data/hgpo/alfworld}
experiment_name="k${history_length}_hgpo"
CHECKPOINTS_DIR=${CHECKPOINTS_DIR:-$HOME/checkpoints}

# One row per task (extra_info = {"env", "split", "task_id"}): every training game, and the
# first 128 of valid_seen; the env options (games folder, ...) are the agent loop's own.
python3 -m hgpo.integrations.verl_tasks \
    --env alfworld \
    --out-dir "$data_dir" \
    --val $val_data_size \
    --agent-loop-config "$here/hgpo_agent_loop.yaml"

python3 -m verl.trainer.main_ppo \
    trainer.use_v1=True \
    algorithm.adv_estimator=hgpo \
    algorithm.gamma=0.95 \
    algorithm.use_kl_in_reward=False \
    data.train_files="$data_dir/train.parquet" \
    data.val_files="$data_dir/test.parquet" \
    data.train_batch_size=$train_data_size \
    data.val_batch_size=$val_data_size \
    data.max_prompt_length=4096 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation='left' \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.01 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name="$ENGINE" \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.enable_chunked_prefill=False \
    actor_rollout_ref.rollout.enforce_eager=False \
    actor_rollout_ref.rollout.free_cache_engine=False \
    actor_rollout_ref.rollout.n=$group_size \
    actor_rollout_ref.rollout.val_kwargs.temperature=0.4 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    actor_rollout_ref.rollout.agent.default_agent_loop=hgpo_stepwise \
    actor_rollout_ref.rollout.agent.agent_loop_config_path="$here/hgpo_agent_loop.yaml" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    trainer.critic_warmup=0 \
    trainer.logger='["console"]' \
    trainer.project_name=$project_name \
    trainer.experiment_name=$experiment_name \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.save_freq=40 \
    trainer.test_freq=5 \
    trainer.total_training_steps=160 \
    trainer.total_epochs=1000 \
    trainer.default_local_dir="${CHECKPOINTS_DIR}/${project_name}/${experiment_name}" \
    trainer.val_only=False \
    trainer.val_before_train=False "$@"
