"""OpenAI completions as vLLM's server extends them: `POST /v1/completions`.

`prompt` as token ids (or a list of token-id prompts), `use_beam_search`, `n` = beam width,
`max_tokens`, plus the workbench's `user_vector`, `placeholder_pos`, `constrained`, `banned_items`.
Every beam comes back as a choice (best first) with its `token_ids` and `cum_logprob`.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Annotated

from fastapi import APIRouter, Request
from pydantic import BaseModel, Discriminator, Field, StrictInt, Tag

from workbench.engines.base import BeamSearchRequest, Prompt
from workbench.engines.serving.errors import PROMPT_MANY, PROMPT_ONE, NON_FINITE, TokenIds, UserVector, error_response

router = APIRouter()


def _prompt_shape(v) -> str:
    """Which shape a `prompt` is, decided by its first element, so a bad one reports that shape's error only."""
    return PROMPT_MANY if isinstance(v, list) and v and isinstance(v[0], list) else PROMPT_ONE


PromptIds = Annotated[
    Annotated[TokenIds, Tag(PROMPT_ONE)] | Annotated[list[TokenIds], Field(fail_fast=True), Tag(PROMPT_MANY)],
    Discriminator(_prompt_shape),
]


class CompletionRequest(BaseModel):
    model: str | None = None
    prompt: PromptIds = Field(..., description="token ids (or a list of token-id prompts)")
    max_tokens: StrictInt = Field(16, ge=1)
    n: StrictInt = Field(1, ge=1, description="beam width: every beam is returned")
    use_beam_search: bool = False
    temperature: float | None = None
    user_vector: UserVector | None = None
    placeholder_pos: StrictInt | None = None
    constrained: bool = False
    banned_items: TokenIds = Field(default_factory=list)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    engine, model_name = request.app.state.engine, request.app.state.model_name
    if not body.use_beam_search and body.n != 1:
        return error_response(400, "this server runs beam search only: set use_beam_search=true (n is the beam width)")
    prompts = body.prompt if body.prompt and isinstance(body.prompt[0], list) else [body.prompt]
    if body.user_vector is not None and len(prompts) != 1:
        return error_response(400, "user_vector applies to one prompt; send one prompt per request")
    try:
        reqs = [
            BeamSearchRequest(Prompt.of(p, body.user_vector, body.placeholder_pos), beam_width=body.n,
                              max_new_tokens=body.max_tokens, constrained=body.constrained,
                              banned_items=tuple(body.banned_items))
            for p in prompts
        ]
    except (TypeError, ValueError) as e:
        return error_response(400, f"bad request: {e}")
    results = await engine.beam_search(reqs)
    failed = [r for r in results if not r.success]
    if failed:
        return error_response(400, failed[0].error or "request failed")
    if not all(math.isfinite(b.cum_logprob) for r in results for b in r.beams):
        return error_response(400, NON_FINITE.format(what="log-probs"))
    choices, gen = [], 0
    for r in results:
        for b in r.beams:
            choices.append({"index": len(choices), "text": "", "token_ids": b.token_ids, "cum_logprob": b.cum_logprob,
                            "logprobs": None, "finish_reason": "length"})
            gen += len(b.token_ids)
    ptoks = sum(r.prompt_tokens for r in results)
    return {
        "id": f"cmpl-{uuid.uuid4().hex[:16]}", "object": "text_completion", "created": int(time.time()),
        "model": body.model or model_name, "choices": choices,
        "usage": {"prompt_tokens": ptoks, "completion_tokens": gen, "total_tokens": ptoks + gen},
    }
