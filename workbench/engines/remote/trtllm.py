"""TensorRT-LLM behind the workbench contract, over `trtllm-serve` (PyTorch backend).

Pinned: `tensorrt-llm==1.3.0rc20` (environments/trtllm.txt): the first version with every feature
the reference study needed - multi-sequence beam search (1.2.0rc3), out-of-tree models in
trtllm-serve via `--custom_module_dirs` (1.2.0rc4), embeddings through multimodal inputs
(1.3.0rc0), multi-item scoring in the Python API (1.3.0rc20). It needs a CUDA GPU (and pins
torch<=2.10, transformers==4.57.3, numpy<2), so nothing here ran on the CPU machines where it was
written: the capability matrix says "written, not run here", and `scripts/validate_gpu_engines.sh`
is the first real run. Sources read:

- `tensorrt_llm/serve/openai_protocol.py` (`CompletionRequest`: `prompt` as token ids, `n`,
  `best_of`, `use_beam_search`, `length_penalty`, `ignore_eos`, `logprobs`, `return_context_logits`,
  `detokenize`; extra fields are rejected (`extra="forbid"`); `CompletionResponseChoice`: `index`,
  `text`, `token_ids`, `logprobs`, `context_logits`). The fields sent are checked against the
  recorded 1.3.0rc2x field list by tests/test_trtllm_source_contract.py (tests/trtllm_api_facts.json).
  `logprobs` differs between versions: 1.3.0rc2x answers the OpenAI completion form
  `CompletionLogProbs{token_logprobs: [float|null], tokens, top_logprobs, text_offset}`; earlier
  1.x (e.g. the 2025 protocol) refused any truthy `logprobs` in the request ("logprobs is not
  supported"). `_choice_logprobs` reads the OpenAI form, a chat-style `{content: [{logprob}]}` and a
  bare list; a beam without per-token log-probs is re-scored from `context_logits`.
- `tensorrt_llm/commands/serve.py` (trtllm-serve has no `--dtype`: the dtype and the KV-cache share
  go in the `--extra_llm_api_options` YAML that `launcher.trtllm_spec` writes).
- `examples/llm-api/out_of_tree_example/` (`--custom_module_dirs`, `@register_auto_model`) and
  `tensorrt_llm/inputs/registry.py` (`register_input_processor`, `attach_multimodal_embeddings`,
  `inputs["multi_modal_embeddings"]`) for the soft-token model in `engines/in_trtllm/soft_token_plugin/`.

Feature map (static capabilities say "written, not run here" for all of it):
- beam search (native): `/v1/completions` with `use_beam_search`, `n` = `best_of` = beam width,
  `length_penalty=0`, `ignore_eos`, `logprobs=1`; the server is started with
  `--max_beam_width`. Beams come back as choices; the cumulative log-prob is the sum of
  `token_logprobs`.
- sequence / label scoring (fan-out, native): one request per candidate with
  `return_context_logits` (the prompt positions' logits), `max_tokens=1`; the client takes
  log-softmax at the candidate positions (sequence) or after the candidate (label). Used when no
  scoring layer is attached.
- multi-item scoring, soft token, trie constraint: Python-API only in 1.3.0rc20 (`LLM.encode`,
  multimodal embedding inputs, per-request `SamplingParams(logits_processor=...)`), so they go
  through the workbench's serving layer `engines/in_trtllm/scoring_server.py` (`POST /v1/score` in SGLang's
  `/v1/score` shape plus `mode` and `user_vector`; `POST /v1/beam_search`), launched next to
  trtllm-serve (`scoring_layer=True`, the default) or given by `scoring_url`. Without it these
  features are refused with the reason. The user vector travels raw; the plugin projects it.
"""

from __future__ import annotations

import asyncio

from workbench.engines.base import (
    FEATURES,
    Beam,
    BeamSearchRequest,
    Capabilities,
    FeatureSupport,
    RequestError,
    ScoreRequest,
    Support,
)
from workbench.engines.remote.http_common import HTTPEngineBase

TRTLLM_VERSION = "1.3.0rc20"
_NO_LAYER = ("trtllm-serve's HTTP API has no field for it (Python LLM API only); it goes through the workbench "
             "scoring layer (in_trtllm/scoring_server.py), which this adapter was built without: pass scoring_url= or "
             "scoring_layer=True")
_LAYER = "through the workbench scoring layer (in_trtllm/scoring_server.py) around the LLM API: "
_MULTI_ITEM = ("bfloat16/float16: one packed LLM.encode input per request (query <d> item_1 <d> ... with "
               "multi_item_part_lens, encode_only LLM on the FLASHINFER attention backend, PR #14693); float32 is not "
               "supported by that path (FlashInfer's fa2/fa3 kernels take fp16/bf16 only), so in float32 the layer "
               "scores all items of a request as one batched LLM.encode call of query+item inputs and says so in "
               "its /health (multi_item_reason)")


def _log_softmax(row: list[float]) -> list[float]:
    import math

    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def _choice_logprobs(lp) -> list[float | None] | None:
    """Per-token log-probs of one `/v1/completions` choice, whatever form this trtllm-serve answers in.

    - 1.3.0rc2x `CompletionLogProbs` (openai_protocol.py), the OpenAI completion form:
      `{"token_logprobs": [float | null, ...], "tokens": [...], "top_logprobs": [...], "text_offset": [...]}`;
    - a chat-style `{"content": [{"token", "logprob", ...}, ...]}` (`ChatCompletionLogProbs`);
    - a bare list of floats, or of `{"logprob": x}` / `{token_id: x}` dicts.
    None when there is nothing to read (e.g. `logprobs: null`).
    """
    if lp is None:
        return None
    if isinstance(lp, dict):
        if lp.get("token_logprobs") is not None:
            lp = lp["token_logprobs"]
        elif lp.get("content") is not None:
            lp = lp["content"]
        else:
            return None
    if not isinstance(lp, list):
        return None
    out: list[float | None] = []
    for x in lp:
        if x is None or isinstance(x, (int, float)):
            out.append(None if x is None else float(x))
        elif isinstance(x, dict) and "logprob" in x:
            out.append(float(x["logprob"]))
        elif isinstance(x, dict) and len(x) == 1:  # {token_id: logprob} of the sampled token
            out.append(float(next(iter(x.values()))))
        else:
            return None
    return out


class TRTLLMEngine(HTTPEngineBase):
    """The `Engine` protocol over a `trtllm-serve` server (launched from its environment or given by `url`)."""

    name = "trtllm"
    server_key = "trtllm"
    missing_hint = f"TensorRT-LLM {TRTLLM_VERSION} is not installed here"
    server_label = "trtllm-serve"

    def __init__(self, checkpoint, dtype: str = "float32", url: str | None = None, *, scoring_url: str | None = None,
                 scoring_layer: bool = True, request_timeout_s: float = 300.0, max_concurrency: int = 64,
                 server_options: dict | None = None, scoring_options: dict | None = None, log_path=None, **limit_kw):
        self._init_common(checkpoint, dtype, url, request_timeout_s, max_concurrency, limit_kw)
        self.scoring_url = scoring_url.rstrip("/") if scoring_url else None
        self._scoring_clients: dict = {}
        if self._launch_or_connect(url, server_options, log_path) and scoring_layer and self.scoring_url is None:
            from workbench.engines.remote import launcher

            spec = launcher.trtllm_scoring_spec(self.checkpoint, dtype, **(scoring_options or {}))
            self.scoring_url = self._start_server(spec).url

    @staticmethod
    def static_capabilities() -> Capabilities:
        """What the adapter + scoring layer provide, none of it run on the machines where it was written."""
        nr = Support.NOT_RUN_HERE
        f = {
            "beam_search_all_beams": FeatureSupport(
                nr, "/v1/completions use_beam_search + n = best_of (server --max_beam_width); in the sampler"),
            "trie_constraint": FeatureSupport(
                nr, _LAYER + "per-request SamplingParams(logits_processor=trie mask) on beam search; beams re-scored "
                "with raw log-probs (a processor renormalizes over allowed tokens)"),
            "soft_token": FeatureSupport(
                nr, _LAYER + "user vector as multimodal embedding ('user') into the out-of-tree Qwen3/Llama plugin, "
                "which projects it and replaces <|user|>; scoring from context_logits (label and sequence)"),
            "soft_token_beam_search": FeatureSupport(
                nr, _LAYER + "generate() beam search with the multimodal embedding input"),
            "multi_item_scoring": FeatureSupport(nr, _LAYER + _MULTI_ITEM),
            "fanout_scoring": FeatureSupport(
                nr, "one /v1/completions per candidate with return_context_logits; log-softmax client-side"),
        }
        assert set(f) == set(FEATURES)
        return Capabilities("trtllm", f)

    def capabilities(self) -> Capabilities:
        """Runtime view: native where a server is attached, unsupported (with the reason) where it is not."""
        st = self.static_capabilities().features
        layer = self.scoring_url is not None
        f = {k: FeatureSupport(Support.NATIVE, v.reason) for k, v in st.items()}
        if not layer:
            for k in ("trie_constraint", "soft_token", "soft_token_beam_search", "multi_item_scoring"):
                f[k] = FeatureSupport(Support.UNSUPPORTED, _NO_LAYER)
        elif str(self.dtype).lower() in ("float32", "fp32", "float"):
            f["multi_item_scoring"] = FeatureSupport(
                Support.NATIVE, _LAYER + "float32: all items as one batched LLM.encode call of query+item inputs; "
                "the packed multi-item call (multi_item_part_lens, FLASHINFER) needs bfloat16/float16, FlashInfer's "
                "fa2/fa3 kernels take no float32")
        return Capabilities("trtllm", f)

    async def _post_layer(self, path: str, body: dict) -> dict:
        """POST to the scoring layer: its own client per event loop, errors reported like `_post`."""
        import httpx

        loop = asyncio.get_running_loop()
        entry = self._scoring_clients.get(id(loop))
        if entry is None or entry[2] is not loop:
            lim = httpx.Limits(max_connections=self._sem_size, max_keepalive_connections=self._sem_size)
            entry = (httpx.AsyncClient(base_url=self.scoring_url, timeout=self.request_timeout_s, limits=lim),
                     asyncio.Semaphore(self._sem_size), loop)
            self._scoring_clients[id(loop)] = entry
        client, sem = entry[0], entry[1]
        async with sem:
            try:
                r = await client.post(path, json=body)
            except httpx.HTTPError as e:
                raise ConnectionError(f"trtllm scoring layer at {self.scoring_url} did not answer {path}: "
                                      f"{type(e).__name__}: {e}") from e
        if r.status_code != 200:
            try:
                detail = r.json().get("message", r.text[:500])
            except ValueError:
                detail = r.text[:500]
            raise RuntimeError(f"trtllm scoring layer {path} answered HTTP {r.status_code}: {detail}")
        return r.json()

    async def close(self) -> None:
        for client, _, loop in list(self._scoring_clients.values()):
            if loop is asyncio.get_running_loop():
                await client.aclose()
        self._scoring_clients.clear()
        await super().close()

    # ---- beam search ----------------------------------------------------------------------------

    async def _beams(self, r: BeamSearchRequest) -> list[Beam]:
        caps = self.capabilities()
        if r.constrained:
            caps.require("trie_constraint")
        if r.prompt.is_soft:
            caps.require("soft_token_beam_search")
        if r.constrained or r.prompt.is_soft:
            return await self._beam_layer(r)
        body = {"prompt": list(r.prompt.token_ids), "n": r.beam_width, "best_of": r.beam_width,
                "use_beam_search": True, "max_tokens": r.max_new_tokens, "ignore_eos": True,
                "length_penalty": 0.0, "logprobs": 1, "detokenize": False, "temperature": 1.0}
        out = await self._post("/v1/completions", body)
        beams, missing = [], []
        for ch in sorted(out["choices"], key=lambda c: c["index"]):
            ids = ch.get("token_ids")
            if ids is None:
                raise RuntimeError("trtllm-serve returned no token_ids for a beam (detokenize=False expected them)")
            ids = [int(t) for t in ids]
            lps = _choice_logprobs(ch.get("logprobs"))
            if lps is None or len(lps) != len(ids) or any(x is None for x in lps):
                missing.append(len(beams))
                lps = []
            beams.append(Beam(ids, float(sum(lps))))
        if missing:  # a version without per-token log-probs: the raw log-probs from one context-logits pass each
            prompt = list(r.prompt.token_ids)
            rescored = await asyncio.gather(*(self._sequence_logprob(prompt, beams[i].token_ids) for i in missing))
            for i, lp in zip(missing, rescored):
                beams[i] = Beam(beams[i].token_ids, lp)
        beams.sort(key=lambda b: -b.cum_logprob)
        return beams

    async def _beam_layer(self, r: BeamSearchRequest) -> list[Beam]:
        body = {"prompt": list(r.prompt.token_ids), "beam_width": r.beam_width, "max_new_tokens": r.max_new_tokens,
                "constrained": r.constrained, "banned_items": [int(i) for i in r.banned_items]}
        if r.prompt.is_soft:
            body["user_vector"] = list(r.prompt.user_vector)
        out = await self._post_layer("/v1/beam_search", body)
        beams = [Beam([int(t) for t in b["token_ids"]], float(b["cum_logprob"])) for b in out["beams"]]
        beams.sort(key=lambda b: -b.cum_logprob)
        return beams

    # ---- scoring --------------------------------------------------------------------------------

    async def _scores(self, r: ScoreRequest) -> list:
        if self.scoring_url is not None:
            return await self._score_layer(r)
        if r.prompt.is_soft:
            raise RequestError("soft-token scoring is unsupported without the scoring layer: " + _NO_LAYER)
        return list(await asyncio.gather(*(self._score_candidate(r, c) for c in r.candidates)))

    async def _score_layer(self, r: ScoreRequest) -> list:
        """All candidates in one `/v1/score` call to the scoring layer; exact log-probs from `logprobs`."""
        body = {"query": list(r.prompt.token_ids), "items": [list(c) for c in r.candidates], "mode": r.mode,
                "label_token_ids": list(r.label_token_ids), "apply_softmax": False}
        if r.prompt.is_soft:
            body["user_vector"] = list(r.prompt.user_vector)
        out = await self._post_layer("/v1/score", body)
        rows = out["logprobs"]
        if len(rows) != len(r.candidates):
            raise RuntimeError(f"scoring layer returned {len(rows)} rows for {len(r.candidates)} items")
        if r.mode == "sequence":
            return [float(row[0]) for row in rows]
        return [[float(x) for x in row] for row in rows]

    async def _context_logits(self, seq: list[int]) -> list:
        """[len(seq), vocab] prompt-position logits of `seq` from one `/v1/completions` call."""
        body = {"prompt": seq, "max_tokens": 1, "return_context_logits": True, "detokenize": False,
                "temperature": 1.0, "ignore_eos": True}
        out = await self._post("/v1/completions", body)
        logits = out["choices"][0].get("context_logits")  # [len(seq), vocab]: logits at every prompt position
        if logits is None or len(logits) != len(seq):
            n = "no" if logits is None else len(logits)
            raise RuntimeError(f"context_logits has {n} rows for a {len(seq)}-token prompt")
        return logits

    async def _sequence_logprob(self, prompt: list[int], toks: list[int]) -> float:
        logits = await self._context_logits(prompt + list(toks))
        return float(sum(_log_softmax(logits[len(prompt) + j - 1])[t] for j, t in enumerate(toks)))

    async def _score_candidate(self, r: ScoreRequest, cand) -> float | list[float]:
        p = list(r.prompt.token_ids)
        seq = p + list(cand)
        logits = await self._context_logits(seq)
        if r.mode == "sequence":
            return sum(_log_softmax(logits[len(p) + j - 1])[t] for j, t in enumerate(cand))
        last = _log_softmax(logits[-1])
        return [last[t] for t in r.label_token_ids]
