#!/usr/bin/env bash
# First real run of the GPU engines: build each engine's environment on a CUDA host, launch its
# server on a small workbench checkpoint, run the parity suite against the torch engine and print
# the capability matrix. One JSON line per engine goes to reports/gpu_validation/<engine>.json.
#
# Usage (GPU host, from the repo root, core env active):  scripts/validate_gpu_engines.sh [vllm sglang trtllm]
#   CHECKPOINT=DIR   validate on this checkpoint instead of a fresh random one (head_dim >= 32)
#   SKIP_BUILD=1     use the environments already under .venvs/
# Exit status: number of engines that failed to build, launch or match the torch engine.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
ENGINES=("${@:-vllm sglang trtllm}")
read -r -a ENGINES <<< "${ENGINES[*]}"
OUT=reports/gpu_validation
mkdir -p "$OUT"

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader \
  || echo "warning: nvidia-smi not found; SGLang and TensorRT-LLM need a CUDA GPU" >&2

build_env() {  # conda is the documented route; each env lives in .venvs/<name>
  local name=$1 yml=$2
  [[ -n "${SKIP_BUILD:-}" || -d ".venvs/$name" ]] && return 0
  conda env create -p ".venvs/$name" -f "environments/$yml"
}

CKPT=${CHECKPOINT:-}
if [[ -z "$CKPT" ]]; then
  CKPT=$(mktemp -d)/ckpt
  "$PY" -c "from workbench.testing import make_random_checkpoint as m; m('$CKPT', num_attention_heads=2, head_dim=32)" || exit 1
fi

failed=0
for engine in "${ENGINES[@]}"; do
  case $engine in
    vllm)   build_env vllm-cuda vllm-cuda.yml ;;
    sglang) build_env sglang sglang.yml ;;
    trtllm) build_env trtllm trtllm.yml ;;
    *) echo "unknown engine $engine" >&2; failed=$((failed + 1)); continue ;;
  esac || { echo "building the $engine environment failed" >&2; failed=$((failed + 1)); continue; }
  echo "== $engine: parity against the torch engine on $CKPT"
  if timeout 3600 "$PY" -m workbench.cli engines validate "$engine" --checkpoint "$CKPT" > "$OUT/$engine.json"; then
    echo "   passed ($OUT/$engine.json)"
  else
    echo "   FAILED: see $OUT/$engine.json" >&2
    failed=$((failed + 1))
  fi
done
"$PY" -m workbench.cli engines list | tee "$OUT/capability_matrix.md"
exit "$failed"
