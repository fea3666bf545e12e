# Sourced by gpu_check.sh and gpu_smol.sh on the device machine: installs the carried .whl/
# (fetch_wheels.sh) into /tmp/site and builds DeepSpeed there with no ops. Needs PY.
install_wheels() {
    [ -d .whl ] || { echo "error: .whl/ is missing: run bash benchmarks/device/fetch_wheels.sh" \
        "here and carry [\".whl\"]"; return 2; }
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || return 1
    $PY -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/deepspeed-*.tar.gz || return 1
    $PY -c "import torch, transformers, deepspeed; print('torch', torch.__version__, \
'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__, \
'cuda', torch.cuda.is_available())"
}
