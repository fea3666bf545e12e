"""HGPO and every estimator of this project inside other trainers (verl, verl-agent).

Nothing in the core imports this package: it is the top layer, next to ``hgpo.train``. Each
module guards its own extra (``pip install -e ".[verl]"``); see docs/integrations.md.
"""
