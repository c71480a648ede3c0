"""TensorRT-LLM behind the workbench contract, over `trtllm-serve` (PyTorch backend).

Pinned: `tensorrt-llm==1.3.0rc20` (environments/trtllm.yml): the first version with every feature
the reference study needed - multi-sequence beam search (1.2.0rc3), out-of-tree models in
trtllm-serve via `--custom_module_dirs` (1.2.0rc4), embeddings through multimodal inputs
(1.3.0rc0), multi-item scoring in the Python API (1.3.0rc20). It needs a CUDA GPU (and pins
torch<=2.10, transformers==4.57.3, numpy<2), so nothing here ran on the CPU machines where it was
written: the capability matrix says "written, not run here", and `scripts/validate_gpu_engines.sh`
is the first real run. Sources read:

- `tensorrt_llm/serve/openai_protocol.py` (`CompletionRequest`: `prompt` as token ids, `n`,
  `best_of`, `use_beam_search`, `length_penalty`, `ignore_eos`, `logprobs`, `return_context_logits`,
  `detokenize`; extra fields are rejected (`extra="forbid"`); `CompletionResponseChoice`: `index`,
  `text`, `token_ids`, `logprobs.token_logprobs`, `context_logits`).
- `examples/llm-api/out_of_tree_example/` (`--custom_module_dirs`, `@register_auto_model`) and
  `tensorrt_llm/inputs/registry.py` (`register_input_processor`, `attach_multimodal_embeddings`,
  `inputs["multi_modal_embeddings"]`) for the soft-token model in `trtllm_plugin/`.

Feature map:
- beam search (native): `/v1/completions` with `use_beam_search`, `n` = `best_of` = beam width,
  `length_penalty=0`, `ignore_eos`, `logprobs=1`; the server is started with
  `--max_beam_width`. Beams come back as choices; the cumulative log-prob is the sum of
  `token_logprobs`.
- sequence / label scoring (fan-out, native): one request per candidate with
  `return_context_logits` (the prompt positions' logits), `max_tokens=1`; the client takes
  log-softmax at the candidate positions (sequence) or after the candidate (label).
- trie constraint: per-request logits processors exist only in the Python LLM API
  (`SamplingParams(logits_processor=...)`), not over trtllm-serve's HTTP API: unsupported here.
- soft token (+ beam search): the out-of-tree model in `trtllm_plugin/` takes the projected user
  vector as a multimodal embedding and replaces the `<|user|>` placeholder; it is reachable through
  the LLM API (`multi_modal_embeddings`), and trtllm-serve's HTTP completions API has no field for raw
  embeddings, so over HTTP it is unsupported until the workbench's TRT-LLM serving layer exists.
- multi-item scoring: `LLM.encode` in the Python API only; same serving-layer gap: unsupported here.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

from workbench.engines.base import (
    FEATURES,
    Beam,
    BeamSearchRequest,
    BeamSearchResult,
    Capabilities,
    FeatureSupport,
    RequestError,
    ScoreRequest,
    ScoreResult,
    Support,
    Timings,
    validate_score_request,
)
from workbench.engines.http_common import HTTPEngineBase

TRTLLM_VERSION = "1.3.0rc20"
_NO_HTTP = ("trtllm-serve's HTTP API has no field for it (LLM-API only: the plugin in "
            "workbench/engines/trtllm_plugin is written for it; the workbench serving layer is not built yet)")


def _log_softmax(row: list[float]) -> list[float]:
    import math

    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


class TRTLLMEngine(HTTPEngineBase):
    """The `Engine` protocol over a `trtllm-serve` server (launched from its environment or given by `url`)."""

    name = "trtllm"

    def __init__(self, checkpoint, dtype: str = "float32", url: str | None = None, *, request_timeout_s: float = 300.0,
                 max_concurrency: int = 64, server_options: dict | None = None, log_path=None, **limit_kw):
        self._init_common(checkpoint, dtype, url, request_timeout_s, max_concurrency, limit_kw)
        if url is None:
            from workbench.engines import launcher

            self._launch(launcher.trtllm_spec(self.checkpoint, dtype, **(server_options or {})), log_path)

    @classmethod
    def check_available(cls) -> tuple[bool, str]:
        from workbench.engines import launcher

        exe = launcher.find_executable("trtllm")
        if exe is None:
            return False, f"TensorRT-LLM {TRTLLM_VERSION} is not installed here; {launcher.HOW_TO_BUILD['trtllm']}"
        return True, f"trtllm-serve from {exe}"

    @staticmethod
    def static_capabilities() -> Capabilities:
        f = {
            "beam_search_all_beams": FeatureSupport(
                Support.NATIVE, "/v1/completions use_beam_search + n = best_of (server --max_beam_width); in the sampler"),
            "trie_constraint": FeatureSupport(
                Support.UNSUPPORTED, "per-request logits processors are LLM-API only; " + _NO_HTTP),
            "soft_token": FeatureSupport(Support.UNSUPPORTED, "out-of-tree model takes the vector as a multimodal "
                                         "embedding; " + _NO_HTTP),
            "soft_token_beam_search": FeatureSupport(Support.UNSUPPORTED, _NO_HTTP),
            "multi_item_scoring": FeatureSupport(Support.UNSUPPORTED, "LLM.encode multi-item scoring is Python-API only; "
                                                 + _NO_HTTP),
            "fanout_scoring": FeatureSupport(
                Support.NATIVE, "one /v1/completions per candidate with return_context_logits; log-softmax client-side"),
        }
        assert set(f) == set(FEATURES)
        return Capabilities("trtllm", f)

    def capabilities(self) -> Capabilities:
        return self.static_capabilities()

    # ---- beam search ----------------------------------------------------------------------------

    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]:
        return list(await asyncio.gather(*(self._beam_one(r) for r in requests)))

    async def _beam_one(self, r: BeamSearchRequest) -> BeamSearchResult:
        res = BeamSearchResult(request_id=r.request_id, timings=Timings.start(), prompt_tokens=len(r.prompt))
        try:
            self.validate_beam(r)
            caps = self.capabilities()
            if r.constrained:
                caps.require("trie_constraint")
            if r.prompt.is_soft:
                caps.require("soft_token_beam_search")
            body = {"prompt": list(r.prompt.token_ids), "n": r.beam_width, "best_of": r.beam_width,
                    "use_beam_search": True, "max_tokens": r.max_new_tokens, "ignore_eos": True,
                    "length_penalty": 0.0, "logprobs": 1, "detokenize": False, "temperature": 1.0}
            out = await self._post("/v1/completions", body)
            beams = []
            for ch in sorted(out["choices"], key=lambda c: c["index"]):
                ids = ch.get("token_ids")
                if ids is None:
                    raise RuntimeError("trtllm-serve returned no token_ids for a beam (detokenize=False expected them)")
                lps = ch["logprobs"]["token_logprobs"]
                beams.append(Beam([int(t) for t in ids], float(sum(lps))))
            beams.sort(key=lambda b: -b.cum_logprob)
            res.beams = beams
        except Exception as e:  # noqa: BLE001
            res.success, res.error = False, f"{type(e).__name__}: {e}"
        res.timings.finish()
        return res

    # ---- scoring --------------------------------------------------------------------------------

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        return list(await asyncio.gather(*(self._score_one(r) for r in requests)))

    async def _score_one(self, r: ScoreRequest) -> ScoreResult:
        res = ScoreResult(request_id=r.request_id, timings=Timings.start(), prompt_tokens=len(r.prompt))
        try:
            validate_score_request(r, self.limits)
            if r.prompt.is_soft:
                raise RequestError("soft-token scoring is unsupported on trtllm-serve: " + _NO_HTTP)
            res.scores = list(await asyncio.gather(*(self._score_candidate(r, c) for c in r.candidates)))
        except Exception as e:  # noqa: BLE001
            res.success, res.error = False, f"{type(e).__name__}: {e}"
        res.timings.finish()
        return res

    async def _score_candidate(self, r: ScoreRequest, cand) -> float | list[float]:
        p = list(r.prompt.token_ids)
        seq = p + list(cand)
        body = {"prompt": seq, "max_tokens": 1, "return_context_logits": True, "detokenize": False,
                "temperature": 1.0, "ignore_eos": True}
        out = await self._post("/v1/completions", body)
        logits = out["choices"][0]["context_logits"]  # [len(seq), vocab]: logits at every prompt position
        if len(logits) != len(seq):
            raise RuntimeError(f"context_logits has {len(logits)} rows for a {len(seq)}-token prompt")
        if r.mode == "sequence":
            return sum(_log_softmax(logits[len(p) + j - 1])[t] for j, t in enumerate(cand))
        last = _log_softmax(logits[-1])
        return [last[t] for t in r.label_token_ids]
