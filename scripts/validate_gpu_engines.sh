#!/usr/bin/env bash
# First real run of the GPU engines: build each engine's environment on a CUDA host, launch its
# server on a small workbench checkpoint, run the parity suite against the torch engine and print
# the capability matrix. One JSON line per engine goes to reports/gpu_validation/<engine>.json.
# trtllm: the adapter launches trtllm-serve (beam search, fan-out) AND the workbench scoring layer
# (python -m workbench.engines.trtllm_scoring_server from the trtllm env: LLM.encode scoring, soft
# token via the plugin, trie constraint via a logits processor), so its parity run covers the layer;
# a layer smoke test (/health + one /v1/score) runs first and goes to trtllm_layer.json.
# sglang: multi-item scoring (--enable-mis) embeds SGLang's fixed delimiter placeholder 9999, so the
# fresh checkpoint has a vocabulary above 10k.
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
  "$PY" -c "from workbench.model.random_checkpoint import make_random_checkpoint as m; m('$CKPT', num_attention_heads=2, head_dim=32, vocab_base=10240)" || exit 1
fi

export WORKBENCH_TRTLLM_PYTHON=${WORKBENCH_TRTLLM_PYTHON:-$PWD/.venvs/trtllm/bin/python}

trtllm_layer_smoke() {  # start the scoring layer alone, ask /health and one /v1/score, always stop it
  timeout 1200 "$PY" - "$CKPT" > "$OUT/trtllm_layer.json" <<'PYCODE'
import json, sys, httpx
from workbench.engines import launcher
with launcher.launch(launcher.trtllm_scoring_spec(sys.argv[1]), quiet=False) as srv:
    health = httpx.get(srv.url + "/health", timeout=30).json()
    body = {"query": [11, 12, 13], "items": [[20], [21, 22]], "label_token_ids": [5, 6]}
    r = httpx.post(srv.url + "/v1/score", json=body, timeout=300)
    print(json.dumps({"health": health, "status": r.status_code, "answer": r.json(), "started_s": srv.started_s}))
    sys.exit(0 if r.status_code == 200 else 1)
PYCODE
}

failed=0
for engine in "${ENGINES[@]}"; do
  case $engine in
    vllm)   build_env vllm-cuda vllm-cuda.yml ;;
    sglang) build_env sglang sglang.yml ;;
    trtllm) build_env trtllm trtllm.yml ;;
    *) echo "unknown engine $engine" >&2; failed=$((failed + 1)); continue ;;
  esac || { echo "building the $engine environment failed" >&2; failed=$((failed + 1)); continue; }
  if [[ $engine == trtllm ]]; then
    echo "== trtllm scoring layer smoke test"
    trtllm_layer_smoke && echo "   layer answered ($OUT/trtllm_layer.json)" \
      || { echo "   scoring layer FAILED: see $OUT/trtllm_layer.json" >&2; failed=$((failed + 1)); }
  fi
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
