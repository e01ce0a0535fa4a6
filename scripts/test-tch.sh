#!/usr/bin/env bash
# The LibTorch (`--features tch`) correctness tests on the CPU: MMDiT and pipeline parity against
# diffusers, the sampler and TP-GRPO credit references, precision (bf16 on LibTorch included)
# and toy TP-GRPO runs, with the ndarray tolerances (docs/gpu.md).
#
#   scripts/test-tch.sh [VENV]   (default $TORCH_VENV, else ./.venv-torch; created with
#                                 torch 2.9.0 from PyPI when missing: ~4 GB, a few minutes)
#
# Not in .ci/run: installing torch and building the tests against it takes 15-20 minutes on two
# cores, on top of the 20 the CI run takes. CI can call this script as it is.
set -euo pipefail
venv=${1:-${TORCH_VENV:-.venv-torch}}
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --progress-bar off torch==2.9.0
fi
export VIRTUAL_ENV=$(cd "$venv" && pwd) PATH="$(cd "$venv" && pwd)/bin:$PATH" LIBTORCH_USE_PYTORCH=1
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/tch}
cargo test --release --features tch --test it -- \
  mmdit_parity:: mmdit_load:: pipeline_parity:: sampler_reference:: sampler_analytic:: \
  sampler_gaussian:: tp_credit_reference:: grpo_loss:: lora:: precision:: rollout:: train_toy::
