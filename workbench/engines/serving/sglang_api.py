"""SGLang's scoring endpoint: `POST /v1/score`.

`query` token ids, `items` token-id lists, `label_token_ids`, `apply_softmax`, plus `mode`
("label" | "sequence") and the soft-token fields. `scores` holds per item the label log-probs (or
probabilities with `apply_softmax`), or one summed log-prob in mode "sequence".
"""

from __future__ import annotations

import math
from typing import Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field, StrictInt

from workbench.engines.base import Prompt, ScoreRequest
from workbench.engines.serving.errors import NON_FINITE, TokenIds, UserVector, all_finite, error_response

router = APIRouter()


class ScoreBody(BaseModel):
    model: str | None = None
    query: TokenIds = Field(..., description="prompt token ids")
    items: list[TokenIds] = Field(..., description="candidate token-id lists", fail_fast=True)
    label_token_ids: TokenIds = Field(default_factory=list)
    mode: Literal["label", "sequence"] | None = None  # default: label when label_token_ids are given
    apply_softmax: bool = False
    item_first: bool = False
    user_vector: UserVector | None = None
    placeholder_pos: StrictInt | None = None


@router.post("/v1/score")
async def score(body: ScoreBody, request: Request):
    engine, model_name = request.app.state.engine, request.app.state.model_name
    if body.item_first:
        return error_response(400, "item_first=true is not supported: the query (user prompt) is the shared prefix")
    mode = body.mode or ("label" if body.label_token_ids else "sequence")
    try:
        req = ScoreRequest(Prompt.of(body.query, body.user_vector, body.placeholder_pos),
                           tuple(tuple(int(t) for t in it) for it in body.items), mode=mode,
                           label_token_ids=tuple(body.label_token_ids))
    except (TypeError, ValueError) as e:
        return error_response(400, f"bad request: {e}")
    (res,) = await engine.score([req])
    if not res.success:
        return error_response(400, res.error or "request failed")
    scores = res.scores
    if not all_finite(scores):
        return error_response(400, NON_FINITE.format(what="scores"))
    if mode == "label" and body.apply_softmax:
        scores = [softmax(s) for s in scores]
    return {"object": "scoring", "model": body.model or model_name, "scores": scores, "mode": mode,
            "usage": {"prompt_tokens": res.prompt_tokens, "item_tokens": sum(len(i) for i in body.items)}}


def softmax(logps: list[float]) -> list[float]:
    m = max(logps)
    e = [math.exp(x - m) for x in logps]
    z = sum(e)
    return [x / z for x in e]
