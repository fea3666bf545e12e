"""The per-step inputs an estimator reads beyond the batch, as the studies supply them.

An estimator declares what it reads (``hgpo.estimator_reads(name)``, keys of
``hgpo.STEP_INPUTS``); :class:`StepInputs` gives exactly those for one toy rollout batch, so a
study runs any registered estimator, a user's too, without knowing its name:

- ``values``: the caller's state values V(s_t) of each step (the studies' critic: the exact V
  in studies.bias_variance, the value table in studies.train_toy);
- ``entropy``: the exact entropy of the policy at each step's context,
  H_t = -sum_a pi(a | c_t) log pi(a | c_t) (nats; 0 log 0 = 0, ``scipy.special.entr``), from
  the policy's probabilities at the rows the batch visited;
- ``observations``: each step's observation as text, ``agentenvs.toytext.render(env)``'s
  sentence of its observation id: the text the LLM policy reads as the current observation on
  the same env played as text (``--env toy:...``), a function of the observation id only, so
  two steps have the same text exactly when the POMDP shows them the same observation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from hgpo import estimator_reads

__all__ = ["StepInputs", "observation_texts", "step_entropy"]


def step_entropy(probs: np.ndarray) -> np.ndarray:
    """float64[n] H_t = -sum_a p_ta log p_ta of float[n, A] probabilities (0 log 0 = 0)."""
    from scipy.special import entr

    return entr(np.asarray(probs, dtype=np.float64)).sum(axis=-1)


@functools.lru_cache(maxsize=16)  # keyed by the env object (a POMDP hashes by identity)
def _texts(env: Any) -> tuple[str, ...]:
    from agentenvs.toytext import render

    return render(env).obs_text


def observation_texts(env: Any, obs_ids: np.ndarray) -> list[str]:
    """The text of each observation id of ``env`` (a toyenvs.POMDP), as the toy text env shows
    it (:func:`agentenvs.toytext.render`)."""
    texts = _texts(env)
    return [texts[o] for o in np.asarray(obs_ids, dtype=np.int64).tolist()]


class StepInputs:
    """The inputs of one batch ``rb`` (a toyenvs.Rollouts of ``env``), each made on first use.

    Args:
        env: the toyenvs.POMDP that ``rb`` was played on (observation texts).
        rb: the batch.
        values: float64[n] V(s_t) of each step, or None when the caller has no critic (an
            estimator that reads values is then a named error).
        probs: float[n, A] pi(. | c_t) of each step, or a function returning it (called once,
            on first use), or None when no policy is at hand (entropy is then an error).
    """

    def __init__(
        self,
        env: Any,
        rb: Any,
        values: np.ndarray | None = None,
        probs: np.ndarray | Callable[[], np.ndarray] | None = None,
    ) -> None:
        self.env, self.rb, self.values, self._probs = env, rb, values, probs

    @functools.cached_property
    def entropy(self) -> np.ndarray:
        """float64[n] the policy's entropy at each step's context."""
        if self._probs is None:
            raise ValueError("entropy: this study has no policy probabilities for its steps")
        probs = self._probs() if callable(self._probs) else self._probs
        return step_entropy(probs)

    @functools.cached_property
    def observations(self) -> list[str]:
        """Each step's observation text (:func:`observation_texts`)."""
        return observation_texts(self.env, self.rb.batch.state)

    def of(self, name: str) -> dict[str, Any]:
        """The keyword arguments of ``hgpo.compute_advantages(name, ...)``: exactly the inputs
        estimator ``name`` reads."""
        out: dict[str, Any] = {}
        for key in estimator_reads(name):
            if key == "values":
                if self.values is None:
                    raise ValueError(f"estimator {name!r} reads values; this study has no critic")
                out["values"] = self.values
            elif key in ("entropy", "observations"):
                out[key] = getattr(self, key)
            else:  # an input added to hgpo.STEP_INPUTS that no study supplies yet
                raise ValueError(
                    f"estimator {name!r} reads {key!r}, which the studies do not supply"
                )
        return out
