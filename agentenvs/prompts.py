"""The paper's prompt templates (verl-agent ``prompts/alfworld.py`` and ``prompts/webshop.py``).

The template text, typos included ("observaitons"), is the reference's, so prompts match the
paper's token for token. The first step (and K = 0) uses the template without history.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentenvs.memory import EpisodeMemory
from hgpo.options import bad, check_int

ALFWORLD_TEMPLATE_NO_HIS = """
You are an expert agent operating in the ALFRED Embodied Environment.
Your current observation is: {current_observation}
Your admissible actions of the current situation are: [{admissible_actions}].

Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291 (trailing space is part of the reference text)

ALFWORLD_TEMPLATE = """
You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {task_description}
Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} observaitons and the corresponding actions you took: {action_history}
You are now at step {current_step} and your current observation is: {current_observation}
Your admissible actions of the current situation are: [{admissible_actions}].

Now it's your turn to take an action.
You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291

WEBSHOP_TEMPLATE_NO_HIS = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment. 
Your task is to: {task_description}.
Your current observation is: {current_observation}.
Your admissible actions of the current situation are: 
[
{available_actions}
].

Now it's your turn to take one action for the current step.
You should first reason step-by-step about the current situation, then think carefully which admissible action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291

WEBSHOP_TEMPLATE = """
You are an expert autonomous agent operating in the WebShop e\u2011commerce environment.
Your task is to: {task_description}.
Prior to this step, you have already taken {step_count} step(s). Below are the most recent {history_length} observations and the corresponding actions you took: {action_history}
You are now at step {current_step} and your current observation is: {current_observation}.
Your admissible actions of the current situation are: 
[
{available_actions}
].

Now it's your turn to take one action for the current step.
You should first reason step-by-step about the current situation, then think carefully which admissible action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
"""  # noqa: W291

WEBSHOP_MAX_PROMPT_CHARS = 13000
"""The reference falls back to the no-history template above this many characters."""


def alfworld_task(first_observation: str) -> str:
    """The goal text after "Your task is to: " in ALFWorld's first observation."""
    marker = "Your task is to: "
    at = first_observation.find(marker)
    if at == -1:
        raise ValueError(
            f"first_observation has no {marker!r}: first_observation={first_observation[:80]!r}"
        )
    return first_observation[at + len(marker) :].strip()


def format_alfworld_actions(admissible: Sequence[str]) -> str:
    """Admissible commands as the reference lists them: quoted, "\\n " between, no 'help'."""
    return "\n ".join(f"'{s}'" for s in admissible if s != "help")


def format_webshop_actions(available_actions: Sequence[str]) -> str:
    """Available actions as the reference lists them: one quoted action and a comma per line."""
    return "\n".join(f"'{s}'," for s in available_actions)


def _check_prompt_args(memory: EpisodeMemory, history_length: int) -> None:
    """The history arguments of a prompt, checked whether or not the memory is empty yet."""
    if not isinstance(memory, EpisodeMemory):
        raise bad("memory", "an agentenvs.memory.EpisodeMemory", type(memory).__name__)
    check_int("history_length", history_length, lo=0)


def alfworld_prompt(
    task: str,
    observation: str,
    admissible: Sequence[str],
    memory: EpisodeMemory,
    history_length: int,
) -> str:
    """The paper's ALFWorld prompt for the current step (no-history form at step 1 or K = 0)."""
    _check_prompt_args(memory, history_length)
    actions = format_alfworld_actions(admissible)
    if len(memory) == 0 or history_length <= 0:
        return ALFWORLD_TEMPLATE_NO_HIS.format(
            current_observation=observation, admissible_actions=actions
        )
    history, n = memory.fetch(history_length)
    return ALFWORLD_TEMPLATE.format(
        task_description=task,
        step_count=len(memory),
        history_length=n,
        action_history=history,
        current_step=len(memory) + 1,
        current_observation=observation,
        admissible_actions=actions,
    )


def webshop_prompt(
    task: str,
    observation: str,
    available_actions: Sequence[str],
    memory: EpisodeMemory,
    history_length: int,
) -> str:
    """The paper's WebShop prompt; ``observation`` is the formatted page (:func:`webshop_anchor`).

    Like the reference, a history prompt longer than 13,000 characters is replaced by the
    no-history prompt.
    """
    _check_prompt_args(memory, history_length)
    actions = format_webshop_actions(available_actions)
    no_his = WEBSHOP_TEMPLATE_NO_HIS.format(
        task_description=task, current_observation=observation, available_actions=actions
    )
    if len(memory) == 0 or history_length <= 0:
        return no_his
    history, n = memory.fetch(history_length)
    prompt = WEBSHOP_TEMPLATE.format(
        task_description=task,
        step_count=len(memory),
        history_length=n,
        action_history=history,
        current_step=len(memory) + 1,
        current_observation=observation,
        available_actions=actions,
    )
    return no_his if len(prompt) > WEBSHOP_MAX_PROMPT_CHARS else prompt
