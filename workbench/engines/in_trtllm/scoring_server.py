"""The workbench's serving layer around TensorRT-LLM's Python LLM API (scoring, soft token, trie constraint).

Why it exists: `trtllm-serve` (TensorRT-LLM 1.3.0rc20) exposes only the OpenAI routes; multi-item
scoring (`LLM.encode`), multimodal embedding inputs (the soft token, taken by the out-of-tree model in
`soft_token_plugin/`) and per-request logits processors (the trie constraint) exist only in the Python
API. The reference study put a small HTTP layer around the LLM API for that; this is ours. It runs
inside the TensorRT-LLM environment on a GPU host:

    .venvs/trtllm/bin/python -m workbench.engines.in_trtllm.scoring_server --checkpoint DIR --port 8001

(`launcher.trtllm_scoring_spec` builds that command line). It imports only numpy, fastapi/pydantic
(both installed with tensorrt-llm, whose trtllm-serve is a FastAPI app) and `workbench.engines.base`
at import time; `tensorrt_llm` and torch are imported when the backend is built, and a missing
`tensorrt_llm` raises `EngineUnavailable` saying how to get it.

Routes (bodies shaped like SGLang 0.5.23's `/v1/score`, `ScoringRequest` / `ScoringResponse` in
`python/sglang/srt/entrypoints/openai/protocol.py`, so one client shape serves both engines):
- `POST /v1/score` {query: [ids], items: [[ids]], label_token_ids: [ids], mode: "label"|"sequence",
  apply_softmax, user_vector?: [floats]} -> {scores, logprobs, model, object: "scoring", usage}.
  `scores` is SGLang's shape (label mode: probabilities of the label tokens per item); `logprobs` is
  the exact log form the workbench reads (label mode: per item, per label; sequence mode: per item,
  [sum of the item's token log-probs]).
- `POST /v1/beam_search` {prompt, beam_width, max_new_tokens, user_vector?, constrained,
  banned_items} -> {beams: [{token_ids, cum_logprob}]} best first.
- `GET /health`, `GET /v1/models`.

TensorRT-LLM calls (1.3.0rc2x sources, read from NVIDIA/TensorRT-LLM; the facts the tests check are in
tests/trtllm_api_facts.json; never run on the CPU machines where this was written -
`scripts/validate_gpu_engines.sh` is the first real run):
- `LLM(model, dtype, encode_only=True[, attn_backend="FLASHINFER"])` and `LLM.encode(inputs,
  batch_indexed_model_output=False)` (`tensorrt_llm/llmapi/llm.py`: `encode(self, inputs,
  add_special_tokens=True, batch_indexed_model_output=True, copy_logits_to_host=True,
  return_raw_logits=False, **model_kwargs)`; every unknown keyword lands in `**model_kwargs` and is
  passed to the model's forward, so nothing else may be given). With `batch_indexed_model_output=False`
  the forward runs with `gather_context_logits=True` and each `EncoderOutput.logits` is the request's
  slice `[len(prompt_token_ids), vocab]` of the packed logits: row t predicts token t+1.
- multi-item scoring (PR #14693, TRTLLM-12982): one input per request, `{"prompt_token_ids": query <d>
  item_1 <d> ... item_N <d>, "multi_item_part_lens": [len(query), len(item_1), ..., len(item_N)]}`
  (`encode` checks `sum(part_lens) + len(part_lens) == len(prompt_token_ids)` and that either all
  inputs of a call carry part lengths or none). Only the FlashInfer attention backend supports it
  (`FlashInferAttention.support_multi_item_scoring`, `tensorrt_llm/_torch/attention_backend/
  flashinfer.py`; VANILLA/TRTLLM raise "Attention does not support multi-item scoring"), through its
  fa2/fa3 paged prefill kernels, which take fp16/bf16 only: so the packed path needs bfloat16 or
  float16, and float32 falls back to the batched path below with the reason in `/health`
  (`--multi-item packed` with float32 refuses to start). What is read follows the upstream LLM-API
  test of this feature (tests/unittest/llmapi/, `test_multi_item_and_single_item_agreement` with
  `_split_multi_item_sequence`): the rows of the query and of each item's tokens equal those of the
  plain sequence `query + item_i`; the delimiter rows are compared nowhere, so none is read: label
  log-probs come from the row of the item's last token, sequence log-probs from the query's last row
  (first item token) and the item's own rows. The delimiter id is then irrelevant to the result
  (`--mis-delimiter`, default 0).
- batched scoring (float32, an empty query, or `--multi-item batched`): all items of a request go into
  one `encode` call as separate `query + item` inputs (the query is recomputed per item).
- soft token: the generation `LLM` (the plugin module imported first, so its `@register_auto_model`
  classes replace Qwen3/Llama) gets `{"prompt_token_ids": ids, "multi_modal_embeddings":
  {"user": [vector]}}` (embeddings as multimodal inputs, >= 1.3.0rc0; see soft_token_plugin/);
  scoring reads `RequestOutput.context_logits` with `SamplingParams(max_tokens=1,
  return_context_logits=True)`.
- beam search: `SamplingParams(use_beam_search=True, n=best_of=beam_width, max_tokens,
  length_penalty=0, end_id=-1)` on `LLM(max_beam_width=...)`; trie constraint as a per-request
  `SamplingParams(logits_processor=...)` subclassing `tensorrt_llm.sampling_params.LogitsProcessor`
  (`__call__(req_id, logits, token_ids, stream_ptr, client_id)`, logits changed in place;
  pattern of `examples/llm-api/llm_logits_processor.py`). A processor masks before the sampler's
  log-softmax, so TensorRT-LLM's beam scores are renormalized over the allowed tokens; the torch
  oracle scores raw log-probs, so every constrained beam is re-scored here with one context-logits
  pass (raw log-probs of its tokens) before it is returned.
"""


import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

from workbench.engines.base import EngineUnavailable, RequestError

TRTLLM_VERSION = "1.3.0rc20"
USER_MODALITY = "user"  # same key as soft_token_plugin.modeling_soft_token.USER_MODALITY


def _log_softmax_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def _as_numpy(t) -> np.ndarray:
    """torch tensor (any device/dtype) or nested list -> float64 numpy."""
    if hasattr(t, "detach"):
        t = t.detach().float().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


# ---- the layer's own logic, independent of TensorRT-LLM (what the contract tests exercise) ----------


@dataclass(frozen=True)
class ScoreJob:
    query: tuple[int, ...]
    items: tuple[tuple[int, ...], ...]
    mode: Literal["label", "sequence"]
    label_token_ids: tuple[int, ...]
    user_vector: tuple[float, ...] | None = None


def item_logprobs(logp: np.ndarray, n_query: int, item: Sequence[int], job: ScoreJob) -> list[float]:
    """Per-item result from the log-softmaxed logits [len(query)+len(item), vocab] of `query + item`.

    Row t predicts token t+1, so item token j (at position n_query + j) is read from row n_query+j-1,
    and the label tokens from the last row (after the item's last token).
    """
    if logp.shape[0] != n_query + len(item):
        raise RuntimeError(f"got logits for {logp.shape[0]} positions, expected {n_query + len(item)}")
    if job.mode == "sequence":
        return [float(sum(logp[n_query + j - 1, t] for j, t in enumerate(item)))]
    return [float(logp[-1, t]) for t in job.label_token_ids]


def packed_sequence(query: Sequence[int], items: Sequence[Sequence[int]],
                    delimiter: int) -> tuple[list[int], list[int]]:
    """`query <d> item_1 <d> ... item_N <d>` and the delimiter positions (PR #14693's and SGLang's layout)."""
    seq, delims = list(query), []
    for it in items:
        delims.append(len(seq))
        seq.append(delimiter)
        seq.extend(it)
    delims.append(len(seq))
    seq.append(delimiter)
    return seq, delims


def multi_item_part_lens(query: Sequence[int], items: Sequence[Sequence[int]]) -> list[int]:
    """`[len(query), len(item_1), ...]`: what `LLM.encode` takes as `multi_item_part_lens` for `packed_sequence`."""
    return [len(query)] + [len(it) for it in items]


def packed_item_logprobs(logp: np.ndarray, query: Sequence[int], items: Sequence[Sequence[int]], delims: list[int],
                         job: ScoreJob) -> list[list[float]]:
    """Per-item results from the log-softmaxed logits [len(packed), vocab] of one packed multi-item sequence.

    Only rows the upstream test pins to the single-sequence ones are read (module docstring): the
    query's last row predicts an item's first token, the row of item token j-1 predicts token j, and
    the row of the item's last token holds the label distribution after the item.
    """
    n_q = len(query)
    if n_q == 0:
        raise RuntimeError("packed multi-item scoring needs a non-empty query")
    if logp.shape[0] != delims[-1] + 1:
        raise RuntimeError(f"got logits for {logp.shape[0]} positions, expected {delims[-1] + 1} (packed sequence)")
    res = []
    for i, it in enumerate(items):
        start = delims[i] + 1  # the item's first token
        if job.mode == "sequence":
            rows = [n_q - 1] + [start + j - 1 for j in range(1, len(it))]
            res.append([float(sum(logp[r, t] for r, t in zip(rows, it)))])
        else:
            res.append([float(logp[start + len(it) - 1, t]) for t in job.label_token_ids])
    return res


FP32_NAMES = {"float32", "fp32", "float", "torch.float32"}
HALF_NAMES = {"bfloat16", "bf16", "float16", "fp16", "half", "torch.bfloat16", "torch.float16"}
MULTI_ITEM_DTYPE_REASON = ("TensorRT-LLM multi-item scoring (LLM.encode with multi_item_part_lens) runs only on the "
                           "FlashInfer attention backend, whose fa2/fa3 prefill kernels take bfloat16/float16: float32 "
                           "is not supported")


def resolve_multi_item(requested: str, dtype: str) -> tuple[bool, str]:
    """(use the packed multi-item call, reason) for `--multi-item` `requested` at model `dtype` (resolved, not 'auto').

    `packed` with float32 is refused (ValueError) rather than silently scored another way; `auto`
    falls back to batched scoring with the reason, which `/health` reports.
    """
    d = str(dtype).lower()
    if requested not in ("auto", "packed", "batched"):
        raise ValueError(f"--multi-item must be auto, packed or batched, not {requested!r}")
    if requested == "batched":
        return False, "batched: --multi-item batched"
    if d in HALF_NAMES:
        return True, f"packed: multi_item_part_lens on the FlashInfer backend in {d}"
    if requested == "packed":
        raise ValueError(f"--multi-item packed with dtype {dtype!r}: {MULTI_ITEM_DTYPE_REASON}; serve in bfloat16 "
                         "or float16, or use --multi-item batched")
    return False, f"batched: {MULTI_ITEM_DTYPE_REASON} (dtype {dtype})"


class LLMScorer:
    """Turns score / beam jobs into LLM API calls and the answers back into numbers.

    `encode_llm` is an `LLM(..., encode_only=True)` (plain scoring through `LLM.encode`); `gen_llm`
    an `LLM(...)` with the soft-token plugin loaded (soft token, beam search, trie constraint).
    `api` holds the two TensorRT-LLM classes this needs (`SamplingParams`, `LogitsProcessor`), so the
    contract tests can pass stand-ins without importing tensorrt_llm.
    """

    def __init__(self, encode_llm, gen_llm, api, *, catalog=None, vocab_size: int, multi_item: bool = False,
                 mis_delimiter: int = 0, multi_item_reason: str = ""):
        self.encode_llm, self.gen_llm, self.api = encode_llm, gen_llm, api
        self.catalog = catalog
        self.vocab_size = vocab_size
        self.multi_item, self.mis_delimiter = multi_item, int(mis_delimiter)
        self.multi_item_reason = multi_item_reason or ("packed" if multi_item else "batched")

    # -- scoring --

    def score(self, job: ScoreJob) -> list[list[float]]:
        if job.mode == "label" and not job.label_token_ids:
            raise RequestError("mode 'label' needs label_token_ids")
        if not job.items or any(len(it) == 0 for it in job.items):
            raise RequestError("items must be non-empty token-id lists")
        for ids in (job.query, *job.items, job.label_token_ids):
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise RequestError(f"token ids outside the vocabulary [0, {self.vocab_size})")
        if job.user_vector is not None:
            return self._score_soft(job)
        if self.multi_item and job.query:  # the packed layout needs a query row to predict each first item token
            return self._score_packed(job)
        return self._score_batched(job)

    def _score_batched(self, job: ScoreJob) -> list[list[float]]:
        seqs = [{"prompt_token_ids": list(job.query) + list(it)} for it in job.items]
        outs = self.encode_llm.encode(seqs, batch_indexed_model_output=False)
        if not isinstance(outs, list):
            outs = [outs]
        if len(outs) != len(seqs):
            raise RuntimeError(f"LLM.encode returned {len(outs)} outputs for {len(seqs)} inputs")
        res = []
        for it, out in zip(job.items, outs):
            logits = _as_numpy(out.logits)  # [T, vocab] token-indexed (batch_indexed_model_output=False)
            if logits.ndim != 2:
                raise RuntimeError(f"LLM.encode returned logits of shape {logits.shape}; expected [tokens, vocab]")
            res.append(item_logprobs(_log_softmax_rows(logits), len(job.query), it, job))
        return res

    def _score_packed(self, job: ScoreJob) -> list[list[float]]:
        """One `LLM.encode` input per request: the packed sequence and its `multi_item_part_lens`."""
        seq, delims = packed_sequence(job.query, job.items, self.mis_delimiter)
        inp = {"prompt_token_ids": seq, "multi_item_part_lens": multi_item_part_lens(job.query, job.items)}
        # a list of one input, so the answer is a list of one EncoderOutput (llm.py: a non-list input is unbatched)
        outs = self.encode_llm.encode([inp], batch_indexed_model_output=False)
        out = outs[0] if isinstance(outs, list) else outs
        logits = _as_numpy(out.logits)  # [len(seq), vocab]: the request's slice of the token-indexed logits
        if logits.ndim != 2:
            raise RuntimeError(f"LLM.encode returned logits of shape {logits.shape}; expected [tokens, vocab]")
        return packed_item_logprobs(_log_softmax_rows(logits), job.query, job.items, delims, job)

    def _soft_prompt(self, ids: Sequence[int], user_vector) -> dict:
        return {"prompt_token_ids": list(ids), "multi_modal_embeddings": {USER_MODALITY: [list(user_vector)]}}

    def _context_logprobs(self, prompts: list[dict]) -> list[np.ndarray]:
        sp = self.api.SamplingParams(max_tokens=1, return_context_logits=True, end_id=-1)
        outs = self.gen_llm.generate(prompts, sampling_params=sp, use_tqdm=False)
        res = []
        for p, out in zip(prompts, outs):
            cl = out.context_logits
            if cl is None:
                raise RuntimeError("TensorRT-LLM returned no context_logits (needs gather_context_logits / "
                                   "return_context_logits support in this build)")
            logp = _log_softmax_rows(_as_numpy(cl))
            if logp.shape[0] != len(p["prompt_token_ids"]):
                raise RuntimeError(f"context_logits has {logp.shape[0]} rows for {len(p['prompt_token_ids'])} tokens")
            res.append(logp)
        return res

    def _score_soft(self, job: ScoreJob) -> list[list[float]]:
        prompts = [self._soft_prompt(list(job.query) + list(it), job.user_vector) for it in job.items]
        return [item_logprobs(lp, len(job.query), it, job)
                for it, lp in zip(job.items, self._context_logprobs(prompts))]

    # -- beam search --

    def trie_processor(self, prompt_len: int, banned_items: Sequence[int]):
        """A per-request `LogitsProcessor` masking every beam's next token to the trie's children."""
        import torch

        trie, depth = self.catalog.trie(), self.catalog.depth
        banned = [list(banned_items)] if banned_items else None

        class TrieLogitsProcessor(self.api.LogitsProcessor):
            def __call__(self, req_id, logits, token_ids, stream_ptr, client_id):
                rows = logits.view(-1, logits.shape[-1])  # [beams, vocab]
                gen = [list(t[prompt_len:]) for t in token_ids][: rows.shape[0]]
                step = len(gen[0]) if gen else 0
                if step >= depth:
                    return
                prefixes = torch.as_tensor(gen, dtype=torch.long).reshape(len(gen), step)
                allowed = trie.allowed_mask(prefixes, banned=banned)  # [beams, layout vocab] bool
                mask = torch.full((rows.shape[0], rows.shape[1]), float("-inf"))
                mask[:, : allowed.shape[1]][allowed] = 0.0
                stream = None if stream_ptr is None else torch.cuda.ExternalStream(stream_ptr)
                with torch.cuda.stream(stream):
                    rows += mask.to(rows.device, non_blocking=True)

        return TrieLogitsProcessor()

    def beam_search(self, prompt: Sequence[int], beam_width: int, max_new_tokens: int, user_vector=None,
                    constrained: bool = False, banned_items: Sequence[int] = ()) -> list[dict]:
        if constrained and self.catalog is None:
            raise RequestError("constrained beam search needs the checkpoint's catalog.npz next to the weights")
        kw = dict(use_beam_search=True, n=beam_width, best_of=beam_width, max_tokens=max_new_tokens,
                  length_penalty=0.0, end_id=-1)
        if constrained:
            kw["logits_processor"] = self.trie_processor(len(prompt), banned_items)
        sp = self.api.SamplingParams(**kw)
        inp = self._soft_prompt(prompt, user_vector) if user_vector is not None else {"prompt_token_ids": list(prompt)}
        out = self.gen_llm.generate(inp, sampling_params=sp, use_tqdm=False)
        out = out[0] if isinstance(out, list) else out
        beams = [{"token_ids": [int(t) for t in o.token_ids], "cum_logprob": float(o.cumulative_logprob)}
                 for o in out.outputs]
        if constrained:  # raw (un-renormalized) log-probs, like the torch oracle
            prompts = [self._soft_prompt(list(prompt) + b["token_ids"], user_vector) if user_vector is not None
                       else {"prompt_token_ids": list(prompt) + b["token_ids"]} for b in beams]
            for b, lp in zip(beams, self._context_logprobs(prompts)):
                n = len(prompt)
                b["cum_logprob"] = float(sum(lp[n + j - 1, t] for j, t in enumerate(b["token_ids"])))
        beams.sort(key=lambda b: -b["cum_logprob"])
        return beams


# ---- the HTTP app -------------------------------------------------------------------------------------


def create_app(scorer: LLMScorer, model_name: str = "workbench"):
    """The FastAPI app over `scorer` (the LLM API runs in the server's threadpool, one call at a time)."""
    import threading

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    class ScoreBody(BaseModel):
        query: list[int]
        items: list[list[int]]
        label_token_ids: list[int] = Field(default_factory=list)
        mode: Literal["label", "sequence"] = "label"
        apply_softmax: bool = False
        item_first: bool = False
        user_vector: list[float] | None = None
        model: str | None = None

    class BeamBody(BaseModel):
        prompt: list[int]
        beam_width: int = Field(ge=1)
        max_new_tokens: int = Field(ge=1)
        user_vector: list[float] | None = None
        constrained: bool = False
        banned_items: list[int] = Field(default_factory=list)
        model: str | None = None

    app = FastAPI(title="workbench TensorRT-LLM scoring layer")
    lock = threading.Lock()  # the LLM API object is driven from one request at a time

    def error(status: int, msg: str):
        return JSONResponse({"object": "error", "message": msg, "type": "BadRequestError" if status == 400
                             else "InternalServerError", "code": status}, status_code=status)

    @app.get("/health")
    def health():
        return {"status": "ok", "multi_item": "packed" if scorer.multi_item else "batched",
                "multi_item_reason": scorer.multi_item_reason}

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "workbench-trtllm"}]}

    @app.post("/v1/score")
    def score(body: ScoreBody):
        if body.item_first:
            return error(400, "item_first is not supported by the workbench scoring layer")
        job = ScoreJob(tuple(body.query), tuple(tuple(i) for i in body.items), body.mode, tuple(body.label_token_ids),
                       None if body.user_vector is None else tuple(body.user_vector))
        try:
            with lock:
                logprobs = scorer.score(job)
        except RequestError as e:
            return error(400, str(e))
        except Exception as e:  # noqa: BLE001
            return error(500, f"{type(e).__name__}: {e}")
        if body.mode == "label" and body.apply_softmax:
            scores = []
            for row in logprobs:
                m = max(row)
                w = [math.exp(x - m) for x in row]
                scores.append([x / sum(w) for x in w])
        elif body.mode == "label":
            scores = [[math.exp(x) for x in row] for row in logprobs]
        else:
            scores = logprobs
        n_tok = len(body.query) * len(body.items) + sum(len(i) for i in body.items)
        return {"scores": scores, "logprobs": logprobs, "model": body.model or model_name, "object": "scoring",
                "usage": {"prompt_tokens": n_tok, "total_tokens": n_tok, "completion_tokens": 0}}

    @app.post("/v1/beam_search")
    def beam_search(body: BeamBody):
        try:
            with lock:
                beams = scorer.beam_search(body.prompt, body.beam_width, body.max_new_tokens, body.user_vector,
                                           body.constrained, body.banned_items)
        except RequestError as e:
            return error(400, str(e))
        except Exception as e:  # noqa: BLE001
            return error(500, f"{type(e).__name__}: {e}")
        return {"beams": beams, "model": body.model or model_name, "object": "beam_search"}

    return app


# ---- building the real TensorRT-LLM backend (GPU host only) -----------------------------------------


def checkpoint_dtype(checkpoint) -> str:
    """The dtype `LLM(dtype="auto")` would load: the checkpoint config's `torch_dtype` (or `dtype`), else float32."""
    import json

    raw = json.loads((Path(checkpoint) / "config.json").read_text())
    for cfg in (raw, raw.get("text_config") or {}):
        for key in ("torch_dtype", "dtype"):  # transformers 4.x writes torch_dtype, 5.x dtype
            if cfg.get(key):
                return str(cfg[key])
    return "float32"


def llm_kwargs(model_dir: str, dtype: str, *, max_beam_width: int, multi_item: bool,
               kv_cache_config) -> tuple[dict, dict]:
    """Keyword arguments of the two `LLM(...)` calls: (encode-only LLM, generation LLM).

    Every key must be a `TorchLlmArgs` field (llm.py's BaseLLM.__init__ rejects any other with
    "got invalid argument"); tests/test_trtllm_source_contract.py checks them against the facts
    recorded from the 1.3.0rc2x sources. The encode-only LLM needs no KV cache, so only the generation
    LLM gets `kv_cache_config` (its `free_gpu_memory_fraction` leaves room for trtllm-serve on the GPU).
    """
    enc = {"model": model_dir, "dtype": dtype, "encode_only": True}
    if multi_item:  # the only attention backend with multi-item scoring (module docstring)
        enc["attn_backend"] = "FLASHINFER"
    gen = {"model": model_dir, "dtype": dtype, "max_beam_width": max_beam_width, "kv_cache_config": kv_cache_config}
    return enc, gen


def kv_cache_kwargs(kv_fraction: float) -> dict:
    """`KvCacheConfig(...)` of the generation LLM (fields of llm_args.py's KvCacheConfig)."""
    return {"free_gpu_memory_fraction": float(kv_fraction), "enable_block_reuse": False}


def build_scorer(checkpoint, dtype: str = "auto", max_beam_width: int = 32, multi_item: str = "auto",
                 mis_delimiter: int | None = None, kv_fraction: float = 0.3) -> LLMScorer:
    """Load the checkpoint twice through the LLM API (encode-only and generation); needs tensorrt_llm + CUDA."""
    import os

    ck = Path(checkpoint).resolve()
    # float32 + --multi-item packed is refused before anything heavy is imported or loaded
    use_mis, reason = resolve_multi_item(multi_item, checkpoint_dtype(ck) if dtype == "auto" else dtype)
    try:
        import tensorrt_llm  # noqa: F401
        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.llmapi import KvCacheConfig
        from tensorrt_llm.sampling_params import LogitsProcessor
    except ImportError as e:
        from workbench.engines.remote.launcher import HOW_TO_BUILD

        raise EngineUnavailable(
            f"the TensorRT-LLM scoring layer needs tensorrt_llm {TRTLLM_VERSION} ({e}); run it with the TensorRT-LLM "
            f"environment's python on a GPU host ({HOW_TO_BUILD['trtllm']})"
        ) from e
    from workbench.engines.remote.launcher import serving_dir

    # the plugin finds workbench.json and projector.safetensors through the serving view's config.json
    # symlink; this names the checkpoint outright for a model directory that is a copy
    os.environ.setdefault("WORKBENCH_TRTLLM_CHECKPOINT", str(ck))
    # registers SoftTokenQwen3ForCausalLM / SoftTokenLlamaForCausalLM (out-of-tree models) before loading
    import workbench.engines.in_trtllm.soft_token_plugin  # noqa: F401

    enc_kw, gen_kw = llm_kwargs(str(serving_dir(ck)), dtype, max_beam_width=max_beam_width, multi_item=use_mis,
                                kv_cache_config=KvCacheConfig(**kv_cache_kwargs(kv_fraction)))
    encode_llm = LLM(**enc_kw)
    gen_llm = LLM(**gen_kw)
    catalog = None
    if (ck / "catalog.npz").exists():
        from workbench.model.checkpoint import read_meta
        from workbench.sids.layout import Catalog

        catalog = Catalog(np.load(ck / "catalog.npz")["item_codes"], read_meta(ck).layout)
    import json

    cfg = json.loads((ck / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)

    class _API:
        pass

    api = _API()
    api.SamplingParams, api.LogitsProcessor = SamplingParams, LogitsProcessor
    return LLMScorer(encode_llm, gen_llm, api, catalog=catalog, vocab_size=int(cfg["vocab_size"]), multi_item=use_mis,
                     mis_delimiter=0 if mis_delimiter is None else mis_delimiter, multi_item_reason=reason)


def parser() -> argparse.ArgumentParser:
    """The command line (`launcher.trtllm_scoring_spec` builds it; the tests parse that back)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="workbench checkpoint directory (HF weights + workbench.json)")
    p.add_argument("--host", default="127.0.0.1", help="interface to bind")
    p.add_argument("--port", type=int, default=8001, help="TCP port")
    p.add_argument("--dtype", default="auto", help="model dtype passed to LLM(dtype=...)")
    p.add_argument("--max-beam-width", type=int, default=32, help="LLM(max_beam_width=...) of the generation LLM")
    p.add_argument("--multi-item", choices=["auto", "packed", "batched"], default="auto",
                   help="multi-item scoring: one packed LLM.encode input per request (multi_item_part_lens, "
                        "FlashInfer, bfloat16/float16 only) or one encode input per item; auto: packed unless float32")
    p.add_argument("--mis-delimiter", type=int, default=None, help="token id placed between items when packing (0)")
    p.add_argument("--kv-fraction", type=float, default=0.3, help="free GPU memory fraction for the KV cache")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    t0 = time.perf_counter()
    scorer = build_scorer(a.checkpoint, a.dtype, a.max_beam_width, a.multi_item, a.mis_delimiter, a.kv_fraction)
    print(f"[trtllm-scoring] models loaded in {time.perf_counter() - t0:.1f} s; serving on {a.host}:{a.port}",
          file=sys.stderr, flush=True)
    import uvicorn

    uvicorn.run(create_app(scorer), host=a.host, port=a.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
