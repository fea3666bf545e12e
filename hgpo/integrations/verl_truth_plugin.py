"""Imported for its effect: verl's legacy PPO task runner builds the truth trainer.

Load it in every verl process through ``import verl``::

    VERL_USE_EXTERNAL_MODULES=hgpo.integrations.verl_truth_plugin python -m verl.trainer.main_ppo \\
        trainer.use_v1=false "+trainer.hgpo_truth.env='toy:tmaze:length=0'" \\
        +trainer.hgpo_truth.every=5 ...

It calls :func:`hgpo.integrations.verl_truth.install` (``verl.trainer.main_ppo_v0`` then
builds :class:`~hgpo.integrations.verl_truth.TruthRayPPOTrainer`, which reads
``trainer.hgpo_truth``). verl 0.9.1's default v1 trainer (``trainer.use_v1=true``) does not go
through that runner and logs no truth.
"""

from __future__ import annotations

from hgpo.integrations.verl_truth import install

install()
