"""Imported for its effect: verl's trainers build the truth trainer where it is asked for.

Load it in every verl process through ``import verl``::

    VERL_USE_EXTERNAL_MODULES=hgpo.integrations.verl_truth_plugin python -m verl.trainer.main_ppo \\
        "+trainer.hgpo_truth.env='toy:tmaze:length=0'" +trainer.hgpo_truth.every=5 \\
        trainer.v1.trainer_mode=hgpo_truth ...     # verl 0.9.1's default v1 trainer
        # or: trainer.use_v1=false                 # the legacy trainer

It calls :func:`hgpo.integrations.verl_truth.install` (``verl.trainer.main_ppo_v0`` then builds
:class:`~hgpo.integrations.verl_truth.TruthRayPPOTrainer`) and, where ``transfer_queue`` is
installed (verl's v1 trainer cannot run without it), :func:`~hgpo.integrations.verl_truth
.register_v1` (the v1 trainer mode ``hgpo_truth``). Both read ``trainer.hgpo_truth``; a v1 run
with another ``trainer_mode`` logs no truth.
"""

from __future__ import annotations

from hgpo.extras import installed
from hgpo.integrations.verl_truth import install, register_v1

install()
if installed("transfer_queue"):
    register_v1()
