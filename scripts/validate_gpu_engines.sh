#!/usr/bin/env bash
# The GPU engines' real run, on a CUDA host, in one command:
#   1. the core environment (.venv, `make setup`) if it is missing;
#   2. host checks (GPU, driver >= 580 or cuda-compat, free GPU memory, glibc, Pythons, and for TensorRT-LLM
#      CUDA_HOME, MPI and the two package indexes): what is missing is named with how to get it;
#   3. each engine's environment in .venvs/<env> from environments/<env>.txt: built from scratch, or repaired
#      when a previous build stopped halfway (no stamp), TensorRT-LLM the way its install guide says
#      (CUDA 13.0 torch first, then the wheel from NVIDIA's index);
#   4. per engine: parity against the torch engine for every feature (beam, constrained, soft token,
#      sequence and label scoring, plain and soft) in float32 (strict) and bfloat16 (the half-precision-only paths:
#      SGLang MIS, TensorRT-LLM packed encode), then one small `workbench bench` sweep in bfloat16;
#   5. a table engine x feature (reports/gpu_validation/table.md).
# Exit 0 only when everything that should work works (an engine's declared-unsupported feature is skipped,
# not failed); otherwise 1.
#
# Usage (repo root):  scripts/validate_gpu_engines.sh [--dry-run] [vllm] [sglang] [trtllm]
#   --dry-run       check the host for real, print every build, parity and bench step instead of running it
#   CHECKPOINT=DIR  validate on this checkpoint instead of a fresh random one (vocabulary > 9999 for SGLang MIS)
#   FORCE_BUILD=1   rebuild the environments even when they are complete
#   TORCH_CUDA_INDEX_URL, TRTLLM_EXTRA_INDEX_URL   the two indexes TensorRT-LLM's install needs (see
#                   environments/trtllm.txt)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

DRY=0
ENGINES=()
for a in "$@"; do
  case $a in
    --dry-run) DRY=1 ;;
    vllm|sglang|trtllm) ENGINES+=("$a") ;;
    -h|--help) sed -n 2,24p "$0"; exit 0 ;;
    *) echo "error: unknown argument '$a' (engines: vllm sglang trtllm; flag: --dry-run)" >&2; exit 2 ;;
  esac
done
[[ ${#ENGINES[@]} -eq 0 ]] && ENGINES=(vllm sglang trtllm)
OUT=reports/gpu_validation
mkdir -p "$OUT"
rm -f "$OUT"/*.json "$OUT"/table.md

say() { echo "== $*"; }
would() { echo "  would run: $*"; }
do_or_say() { if [[ $DRY == 1 ]]; then would "$*"; else echo "  + $*"; "$@"; fi; }

# ---- 1. core environment --------------------------------------------------------------------------------
PY=${PY:-.venv/bin/python}
say "core environment ($PY)"
if [[ ! -x $PY ]]; then
  do_or_say make setup || { echo "error: the core environment did not build (make setup)" >&2; exit 1; }
fi
CORE_PY=$PY
[[ -x $CORE_PY ]] || CORE_PY=python3  # dry run without a core env: the host checks need only the stdlib

# ---- 2. host ----------------------------------------------------------------------------------------------
say "host checks"
PYTHONPATH=$PWD "$CORE_PY" -m workbench.load.gpu_validation host "${ENGINES[@]}" --out "$OUT"
host_rc=$?
blocked() {  # engine -> non-empty when a missing host piece stops it
  "$CORE_PY" -c "import json,sys; print(' '.join(json.load(open('$OUT/host.json'))['blocked'].get(sys.argv[1], [])))" "$1"
}

# ---- 3. environments ------------------------------------------------------------------------------------
env_name() { case $1 in vllm) echo vllm-cuda ;; *) echo "$1" ;; esac; }
env_python() { case $1 in trtllm) command -v python3.12 || command -v python3.10 ;; *) command -v python3.11 || command -v python3.12 ;; esac; }
smoke() {  # an import that proves the environment is whole
  case $1 in
    vllm) echo "import vllm; print('vllm', vllm.__version__)" ;;
    sglang) echo "import sglang, sglang.srt.entrypoints.http_server; print('sglang', sglang.__version__)" ;;
    trtllm) echo "import tensorrt_llm; print('tensorrt_llm', tensorrt_llm.__version__)" ;;
  esac
}
write_env() { printf '{"status": "%s", "detail": "%s"}\n' "$2" "$3" > "$OUT/env_$1.json"; }

build_env() {
  local e=$1 name dir stamp pyexe
  name=$(env_name "$e"); dir=.venvs/$name; stamp=$dir/.workbench-env-complete
  if [[ -f $stamp && -z ${FORCE_BUILD:-} ]]; then
    echo "  $dir is complete ($(cat "$stamp"))"; write_env "$e" present "$(cat "$stamp")"; return 0
  fi
  pyexe=$(env_python "$e")
  if [[ $DRY == 1 ]]; then
    [[ -d $dir ]] && echo "  $dir exists without its stamp: a build stopped halfway; it would be repaired"
    would "${pyexe:-python3.x} -m venv $dir"
    would "$dir/bin/python -m pip install --upgrade pip setuptools wheel"
    if [[ $e == trtllm ]]; then
      would "$dir/bin/python -m pip install torch==2.9.1 torchvision --index-url \$TORCH_CUDA_INDEX_URL"
      would "$dir/bin/python -m pip install --extra-index-url \$TRTLLM_EXTRA_INDEX_URL -r environments/trtllm.txt"
    else
      would "$dir/bin/python -m pip install -r environments/$name.txt"
    fi
    would "$dir/bin/python -c \"$(smoke "$e")\" && touch $stamp"
    write_env "$e" dry-run "dry run"; return 0
  fi
  [[ -n $pyexe ]] || { write_env "$e" failed "no suitable python"; return 1; }
  if [[ -d $dir && ! -x $dir/bin/python ]]; then echo "  $dir is broken (no python): recreating"; rm -rf "$dir"; fi
  [[ -d $dir ]] && echo "  $dir exists without its stamp (a build stopped halfway): repairing it in place"
  [[ -d $dir ]] || do_or_say "$pyexe" -m venv "$dir" || { write_env "$e" failed "venv"; return 1; }
  do_or_say "$dir/bin/python" -m pip install -q --upgrade pip setuptools wheel || { write_env "$e" failed "pip"; return 1; }
  if [[ $e == trtllm ]]; then
    do_or_say "$dir/bin/python" -m pip install -q torch==2.9.1 torchvision --index-url "$TORCH_CUDA_INDEX_URL" \
      || { write_env "$e" failed "torch cu130 install"; return 1; }
    do_or_say "$dir/bin/python" -m pip install -q --extra-index-url "$TRTLLM_EXTRA_INDEX_URL" -r environments/trtllm.txt \
      || { write_env "$e" failed "tensorrt-llm install"; return 1; }
  else
    do_or_say "$dir/bin/python" -m pip install -q -r "environments/$name.txt" || { write_env "$e" failed "pip install"; return 1; }
  fi
  local ver
  ver=$("$dir/bin/python" -c "$(smoke "$e")" 2>&1 | tail -n 1) || { write_env "$e" failed "import: $ver"; return 1; }
  echo "$ver, built $(date -u +%FT%TZ)" > "$stamp"
  write_env "$e" built "$ver"
}

for e in "${ENGINES[@]}"; do
  say "$e environment"
  why=$(blocked "$e")
  if [[ -n $why && $DRY == 0 ]]; then
    echo "  skipped: the host lacks $why (see the host checks above)"; write_env "$e" blocked "host lacks $why"; continue
  fi
  [[ -n $why ]] && echo "  (this host lacks $why: on a GPU host these steps run)"
  build_env "$e" || echo "  building the $e environment FAILED (reports/gpu_validation/env_$e.json)" >&2
done

# ---- 4. parity and one small load sweep per engine ---------------------------------------------------------
CKPT=${CHECKPOINT:-}
if [[ -z $CKPT ]]; then
  CKPT=$OUT/checkpoint
  say "a fresh random checkpoint with a soft-token projector and a vocabulary above 10k ($CKPT)"
  do_or_say "$PY" -c "from workbench.model.random_checkpoint import make_random_checkpoint as m; m('$CKPT', num_attention_heads=2, head_dim=32, vocab_base=10240)"
fi
export WORKBENCH_TRTLLM_PYTHON=${WORKBENCH_TRTLLM_PYTHON:-$PWD/.venvs/trtllm/bin/python}
for e in "${ENGINES[@]}"; do
  say "$e: parity against the torch engine, then a small load sweep"
  if [[ $DRY == 1 ]]; then
    PYTHONPATH=$PWD "$CORE_PY" -m workbench.load.gpu_validation run "$e" --checkpoint "$CKPT" --out "$OUT" --dry-run
    continue
  fi
  status=$("$PY" -c "import json; print(json.load(open('$OUT/env_$e.json'))['status'])" 2>/dev/null)
  if [[ $status != built && $status != present ]]; then echo "  not run: environment $status"; continue; fi
  timeout 3600 "$PY" -m workbench.load.gpu_validation run "$e" --checkpoint "$CKPT" --out "$OUT" \
    && echo "   passed ($OUT/$e.json)" || echo "   FAILED: see $OUT/$e.json" >&2
done

# ---- 5. the table --------------------------------------------------------------------------------------------
say "results (engine x feature; $OUT/table.md)"
PYTHONPATH=$PWD "$CORE_PY" -m workbench.load.gpu_validation table "$OUT" "${ENGINES[@]}"
ok=$?
if [[ $DRY == 1 ]]; then
  echo "dry run: nothing was built or validated (host check exit $host_rc); on a GPU host drop --dry-run"
  exit 0
fi
[[ -x $PY ]] && "$PY" -m workbench.cli engines list > "$OUT/capability_matrix.md"
exit "$ok"
