"""The plain baseline: transformers `generate` for beam search, one forward per candidate for scoring.

This is what a researcher would write first, and the oracle the fast engine is checked against:

- beam search: `generate(num_beams=n, num_return_sequences=n, do_sample=False, length_penalty=0.0,
  output_scores=True, return_dict_in_generate=True)`; `sequences_scores` is then the plain sum of
  the beam's token log-probs. EOS is disabled on the model's generation config (passing
  `eos_token_id=None` to `generate` is not enough, transformers refills it), so every beam has
  exactly `max_new_tokens` tokens.
- the catalog constraint: `prefix_allowed_tokens_fn` backed by the same PrefixTrie.
- soft token: `inputs_embeds` with the placeholder row replaced by the projected user vector.
- scoring: fan-out, one forward of `prompt + candidate` per candidate (no shared prefix).

Requests run one at a time in a worker thread (the baseline does no cross-request batching).
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Sequence

from workbench.engines.base import (
    Beam,
    BeamSearchRequest,
    BeamSearchResult,
    Capabilities,
    FeatureSupport,
    Limits,
    RequestError,
    ScoreRequest,
    ScoreResult,
    Support,
    Timings,
    dtype_max,
    validate_beam_request,
    validate_score_request,
)
from workbench.engines.checks import require_device, validate_constraint, validate_projected


class HFEngine:
    name = "hf"

    def __init__(self, checkpoint, dtype: str = "float32", device: str = "cpu", max_beam_width: int = 64,
                 max_new_tokens: int = 64, max_candidates: int = 1024, max_candidate_tokens: int = 64, **_ignored):
        import torch

        from workbench.model.checkpoint import LoadedCheckpoint, load_checkpoint

        device = require_device(device)
        ck = checkpoint if isinstance(checkpoint, LoadedCheckpoint) else load_checkpoint(checkpoint, dtype=dtype, device=device)
        self.checkpoint = ck
        self.model = ck.model.eval()
        self.model.generation_config.eos_token_id = None
        self.model.generation_config.bos_token_id = None
        self.device = torch.device(device)
        self.projector = ck.projector
        self.catalog = ck.catalog
        self.trie = ck.catalog.trie()
        self.limits = Limits(
            max_prompt_tokens=ck.max_positions,
            vocab_size=int(ck.model.config.vocab_size),
            max_beam_width=max_beam_width,
            max_new_tokens=max_new_tokens,
            max_candidates=max_candidates,
            max_candidate_tokens=max_candidate_tokens,
            user_vector_dim=ck.meta.user_vector_dim if self.projector is not None else None,
            placeholder_id=ck.meta.layout.placeholder_id,
            max_abs_user_value=dtype_max("float32", dtype),  # projector in float32, model in `dtype`
            dtype=dtype,
        )
        self._lock = threading.Lock()

    @staticmethod
    def static_capabilities() -> Capabilities:
        return Capabilities(
            engine="hf",
            features={
                "beam_search_all_beams": FeatureSupport(Support.NATIVE, "generate(num_beams=n, num_return_sequences=n)"),
                "trie_constraint": FeatureSupport(Support.NATIVE, "prefix_allowed_tokens_fn over the prefix trie"),
                "soft_token": FeatureSupport(Support.NATIVE, "inputs_embeds with the placeholder row replaced"),
                "soft_token_beam_search": FeatureSupport(Support.NATIVE, "generate(inputs_embeds=..., num_beams=n)"),
                "multi_item_scoring": FeatureSupport(Support.EMULATED, "fan-out: one forward per candidate"),
                "fanout_scoring": FeatureSupport(Support.NATIVE, "one forward per candidate"),
            },
        )

    def capabilities(self) -> Capabilities:
        return self.static_capabilities()

    async def close(self) -> None:
        return None

    # ---- public async API --------------------------------------------------------------------
    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]:
        return await asyncio.to_thread(lambda: [self._guard_beam(r) for r in requests])

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        return await asyncio.to_thread(lambda: [self._guard_score(r) for r in requests])

    def _guard_beam(self, r: BeamSearchRequest) -> BeamSearchResult:
        t = Timings.start()
        try:
            validate_beam_request(r, self.limits)
            validate_constraint(r, self.catalog)
            with self._lock:
                beams = self.beam_search_one(r)
        except RequestError as e:
            return BeamSearchResult(r.request_id, success=False, error=str(e), timings=t.finish(), prompt_tokens=len(r.prompt))
        except Exception as e:  # noqa: BLE001 - one failing request never aborts the batch
            return BeamSearchResult(r.request_id, success=False, error=f"{type(e).__name__}: {e}", timings=t.finish(),
                                    prompt_tokens=len(r.prompt))
        return BeamSearchResult(r.request_id, beams=beams, timings=t.finish(), prompt_tokens=len(r.prompt))

    def _guard_score(self, r: ScoreRequest) -> ScoreResult:
        t = Timings.start()
        try:
            validate_score_request(r, self.limits)
            with self._lock:
                scores = self.score_one(r)
        except RequestError as e:
            return ScoreResult(r.request_id, success=False, error=str(e), timings=t.finish(), prompt_tokens=len(r.prompt))
        except Exception as e:  # noqa: BLE001
            return ScoreResult(r.request_id, success=False, error=f"{type(e).__name__}: {e}", timings=t.finish(),
                               prompt_tokens=len(r.prompt))
        return ScoreResult(r.request_id, scores=scores, timings=t.finish(), prompt_tokens=len(r.prompt))

    # ---- the plain implementations -----------------------------------------------------------
    def embeds(self, prompt, extra_ids: Sequence[int] = ()):
        """[1, L, hidden] input embeddings of prompt (+ extra ids), soft token applied."""
        import torch

        ids = torch.as_tensor([*prompt.token_ids, *extra_ids], dtype=torch.long, device=self.device)[None]
        x = self.model.get_input_embeddings()(ids)
        if prompt.is_soft:
            from workbench.model.projector import project

            vec = torch.as_tensor(prompt.user_vector, dtype=torch.float32)[None]
            x = x.clone()
            row = project(self.projector, vec, dtype=x.dtype)[0]
            validate_projected(row, prompt.user_vector, str(x.dtype).removeprefix("torch."))
            x[0, prompt.placeholder_pos] = row
        return x

    def beam_search_one(self, r: BeamSearchRequest) -> list[Beam]:
        import torch

        p = r.prompt
        n_prompt = len(p.token_ids)
        kwargs = {}
        if p.is_soft:
            kwargs["inputs_embeds"] = self.embeds(p)
            offset = 0  # with inputs_embeds, generate's input_ids hold only generated tokens
        else:
            kwargs["input_ids"] = torch.as_tensor([p.token_ids], dtype=torch.long, device=self.device)
            offset = n_prompt
        if r.constrained:
            banned = [list(r.banned_items)] if r.banned_items else None

            def allowed(batch_id, input_ids):
                gen = input_ids[offset:][None].cpu()
                if gen.shape[1] >= self.trie.depth:
                    return []
                return self.trie.allowed_mask(gen, banned=banned)[0].nonzero().squeeze(1).tolist()

            kwargs["prefix_allowed_tokens_fn"] = allowed
        with torch.inference_mode():
            out = self.model.generate(
                **kwargs,
                attention_mask=torch.ones(1, n_prompt, dtype=torch.long, device=self.device),
                num_beams=r.beam_width,
                num_return_sequences=r.beam_width,
                do_sample=False,
                length_penalty=0.0,
                early_stopping=False,
                max_new_tokens=r.max_new_tokens,
                min_new_tokens=r.max_new_tokens,
                output_scores=True,
                return_dict_in_generate=True,
                eos_token_id=None,
                pad_token_id=self.model.config.pad_token_id or 0,
            )
        seqs = out.sequences[:, -r.max_new_tokens :].tolist()
        if r.beam_width > 1:
            scores = out.sequences_scores.float().tolist()
        else:  # greedy search reports no sequence score; recompute it with one forward
            scores = [self.sequence_logprob(p, seqs[0])]
        beams = [Beam(s, float(c)) for s, c in zip(seqs, scores) if math.isfinite(c) and c > -1e8]
        beams.sort(key=lambda b: -b.cum_logprob)
        return beams

    def sequence_logprob(self, prompt, tokens: Sequence[int]) -> float:
        """Sum of the log-probs of `tokens` after `prompt` (full vocabulary, one forward)."""
        import torch

        n = len(prompt.token_ids)
        with torch.inference_mode():
            lp = torch.log_softmax(self.model(inputs_embeds=self.embeds(prompt, tokens)).logits[0].float(), -1)
        rows = lp[n - 1 : n - 1 + len(tokens)]
        return float(rows.gather(1, torch.as_tensor(list(tokens), device=rows.device)[:, None]).sum())

    def score_one(self, r: ScoreRequest) -> list:
        import torch

        n = len(r.prompt.token_ids)
        out = []
        with torch.inference_mode():
            for cand in r.candidates:
                logits = self.model(inputs_embeds=self.embeds(r.prompt, cand)).logits[0].float()
                lp = torch.log_softmax(logits, -1)
                if r.mode == "label":
                    out.append(lp[n + len(cand) - 1, list(r.label_token_ids)].tolist())
                else:
                    rows = lp[n - 1 : n - 1 + len(cand)]
                    out.append(float(rows.gather(1, torch.as_tensor(cand, device=rows.device)[:, None]).sum()))
        return out

    def prompt_logits(self, prompt):
        """Logits [L, vocab] of one forward over the prompt (soft token applied): the parity reference."""
        import torch

        with torch.inference_mode():
            return self.model(inputs_embeds=self.embeds(prompt)).logits[0]
