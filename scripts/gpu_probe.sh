#!/usr/bin/env bash
# The GPU probe (issue 36): the workbench's torch engine at the seeds' shape on a GPU host, every phase under one
# deadline (8 minutes by default), OUTDIR/probe.json rewritten after each phase. What each phase measures:
# docs/gpu.md and workbench/perf/gpu_probe.py.
#
#   scripts/gpu_probe.sh OUTDIR                  # on a CUDA host (cuda:0; --device cuda:N for another GPU)
#   scripts/gpu_probe.sh --plan                  # the phases and their estimates; runs nothing
#   scripts/gpu_probe.sh --cpu-smoke OUTDIR      # every phase at tiny sizes on the CPU (the suite runs this)
#   scripts/gpu_probe.sh OUTDIR --deadline-s 300 # a shorter deadline: the phases that would not fit are skipped
#
# Needs only this repository and the host's Python with torch (CUDA build), transformers and numpy: nothing is
# installed, nothing downloaded, no MLflow. PYTHON=/path/to/python picks the interpreter (default: the repository's
# .venv where there is one, else python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="${PYTHON:-}"
if [[ -z "$py" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then
    py="$root/.venv/bin/python"
  else
    py="$(command -v python3 || command -v python)"
  fi
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error
export HF_HUB_DISABLE_PROGRESS_BARS=1
exec "$py" -m workbench.perf.gpu_probe "$@"
