"""SGLang's scoring endpoint `POST /v1/score`, as sglang 0.5.23 defines it, and the workbench's own
`POST /v1/score_sequences`.

`/v1/score` takes SGLang's `ScoringRequest` and answers its `ScoringResponse`
(`sglang/srt/entrypoints/openai/protocol.py` in the 0.5.23 wheel; the semantics are
`TokenizerManagerScoreMixin.score_request` in `sglang/srt/managers/tokenizer_manager_score_mixin.py`),
so an SGLang client gets SGLang's numbers from the workbench's engine:

- one row per item, one value per label token, read after `query + item` (`item + query` with
  `item_first`): with `apply_softmax` false the label tokens' probabilities, exp(log-prob) over the
  whole vocabulary (they do not sum to 1; `_convert_logprobs_to_scores`), with true a softmax over
  the label tokens at `temperature` (which SGLang allows only with `apply_softmax`).
- `query` and `items` are token ids or text. Text is what SGLang's one-sequence-per-item path does:
  the tokenizer's encoding of the concatenated string `f"{query}{item}"` (no separator; special
  tokens as the tokenizer adds them). Mixing text and token ids is refused (for a text query with
  token-id items SGLang formats each id list into the string, e.g. "...[8, 9]").
- `label_token_ids` is required (one list for every item, or one list per item), nonempty, without
  duplicates; `items: []` answers an empty `scores`; `return_token_logprobs` adds the label tokens'
  raw log-probs (`token_logprobs`); `usage.prompt_tokens` = `total_tokens` = the tokens of every
  scored `query + item` sequence (the query counted once per item).
- Semantics of SGLang's one-sequence-per-item path: with `--enable-mis` SGLang packs
  `query <9999> item_1 <9999> ...` and each item also conditions on the delimiter; the engine never does.

Not supported here (400s that say why): `query_embed_overrides` / `item_embed_overrides` (rows already
in the model's hidden space; the engine applies its projector to a user vector, so the workbench's soft
token is `user_vector` + `placeholder_pos`, the <|user|> position, found in the query when omitted),
`score_extraction_token` (SGLang itself refuses it unless its radix cache and chunked prefill are off)
and `return_pooled_hidden_states` (SGLang refuses it for CausalLM models, as these are).

`/v1/score_sequences` is the workbench's extension, on its own route because its answer is not
SGLang's: per item, the sum of its tokens' log-probs after the query (token ids only). A `mode`
field on `/v1/score` (where it used to select this) is refused rather than ignored, so an old client
cannot mistake probabilities for log-probs.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Sequence

from fastapi import APIRouter, Request
from pydantic import BaseModel, Discriminator, Field, StrictInt, Tag

from workbench.engines.base import Prompt, RequestError, ScoreRequest
from workbench.engines.serving.errors import (
    NON_FINITE,
    PROMPT_MANY,
    PROMPT_ONE,
    TEXT,
    TEXTS,
    TokenIds,
    UserVector,
    all_finite,
    error_response,
    json_answer,
)

router = APIRouter()

TokenIdLists = Annotated[list[TokenIds], Field(fail_fast=True)]


def _ids_shape(v) -> str:
    """`[1, 2]` or `[[1], [2]]`, by the first element, so a bad value reports that shape's error only."""
    return PROMPT_MANY if isinstance(v, list) and v and isinstance(v[0], list) else PROMPT_ONE


def _query_shape(v) -> str:
    return TEXT if isinstance(v, str) else PROMPT_ONE


def _items_shape(v) -> str:
    if isinstance(v, str):
        return TEXT
    return TEXTS if isinstance(v, list) and v and isinstance(v[0], str) else PROMPT_MANY


Query = Annotated[Annotated[str, Tag(TEXT)] | Annotated[TokenIds, Tag(PROMPT_ONE)], Discriminator(_query_shape)]
Items = Annotated[
    Annotated[str, Tag(TEXT)] | Annotated[list[str], Field(fail_fast=True), Tag(TEXTS)]
    | Annotated[TokenIdLists, Tag(PROMPT_MANY)],
    Discriminator(_items_shape),
]
Labels = Annotated[Annotated[TokenIds, Tag(PROMPT_ONE)] | Annotated[TokenIdLists, Tag(PROMPT_MANY)],
                   Discriminator(_ids_shape)]


class ScoreBody(BaseModel):
    """SGLang 0.5.23's `ScoringRequest`, every field with its type and default (token ids strict), plus
    the workbench's soft token (`user_vector`, `placeholder_pos`)."""

    query: Query | None = None
    items: Items | None = None
    embed_override_token_id: StrictInt | None = None
    query_embed_overrides: list[list[float]] | None = None
    item_embed_overrides: list[list[list[float]] | None] | None = None
    label_token_ids: Labels | None = None
    apply_softmax: bool = False
    temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    return_token_logprobs: bool = False
    item_first: bool = False
    return_pooled_hidden_states: bool = False
    score_extraction_token: str | None = None
    model: str | None = None  # SGLang echoes it, "default" when absent; here the served model's name then
    user_vector: UserVector | None = None
    placeholder_pos: StrictInt | None = None
    mode: Any = None  # not a field of either route: refused with a pointer to /v1/score_sequences


# Messages of SGLang 0.5.23 (score_request), so a client sees the same words from either server.
NEED_LABELS = "label_token_ids is required for generation (CausalLM) models."
NEED_ITEMS = "items must be provided"
TEMPERATURE = "temperature requires apply_softmax=True"
MODE_MOVED = ("`mode` is not a field of SGLang's /v1/score: label scores come without it (probabilities, as "
              "SGLang returns them; `return_token_logprobs: true` adds the log-probs) and sequence scores moved to "
              "POST /v1/score_sequences")
EMBED_OVERRIDES = ("query_embed_overrides / item_embed_overrides are not supported by this server: they are rows in "
                   "the model's hidden space, and the engine builds the soft token with its projector; send "
                   "user_vector (the checkpoint's user vector) with the <|user|> placeholder in the query "
                   "(placeholder_pos optional)")
EXTRACTION = ("score_extraction_token is not supported by this server (SGLang 0.5.23 allows it only with "
              "--disable-radix-cache and --chunked-prefill-size -1): send one query + item per readout")
POOLED = ("return_pooled_hidden_states is not supported for CausalLM models. It requires a model with a "
          "task-specific head (e.g. SequenceClassification or RewardModel).")
EMBED_ITEM_FIRST = "item_first is not supported when embeddings are supplied"
MIXED = ("Invalid combination of query/items types for score_request: send query and items both as text or both "
         "as token ids")


@router.post("/v1/score")
async def score(body: ScoreBody, request: Request):
    state = request.app.state
    try:
        if body.mode is not None:
            raise RequestError(MODE_MOVED)
        if body.temperature != 1.0 and not body.apply_softmax:
            raise RequestError(TEMPERATURE)
        if body.label_token_ids is None:
            raise RequestError(NEED_LABELS)
        if body.items is None:
            raise RequestError(NEED_ITEMS)
        if not body.items:  # SGLang answers an empty list before checking the labels, the query or the rest
            return _answer(body, state.model_name, [], [], 0)
        items = [body.items] if isinstance(body.items, str) else body.items
        limits = getattr(state.engine, "limits", None)
        labels = item_labels(body.label_token_ids, len(items), limits.vocab_size if limits else None)
        if body.query_embed_overrides is not None or body.item_embed_overrides is not None:
            raise RequestError(EMBED_OVERRIDES)
        if body.score_extraction_token is not None:
            raise RequestError(EXTRACTION)
        if body.item_first and body.user_vector is not None:
            raise RequestError(EMBED_ITEM_FIRST)
        if limits is not None and len(items) > limits.max_candidates:
            raise RequestError(f"{len(items)} candidates exceed the engine limit of {limits.max_candidates}; "
                               "split the request")
        seqs = sequences(body.query, items, body.item_first, getattr(state, "tokenizer", None))
        short = next((i for i, s in enumerate(seqs) if len(s) < 2), None)
        if short is not None:  # SGLang would read the labels after a lone token; the engine needs prompt + candidate
            raise RequestError(f"items[{short}]: its query + item sequence has {len(seqs[short])} token(s); this "
                               "engine reads the label tokens after a prompt and a candidate, so it needs 2 or more")
        if body.return_pooled_hidden_states:
            raise RequestError(POOLED)
        pos = body.placeholder_pos
        if pos is None and body.user_vector is not None and limits is not None and limits.placeholder_id in seqs[0]:
            pos = seqs[0].index(limits.placeholder_id)  # SGLang, too, finds override positions by their token
        cap = len(body.query) if isinstance(body.query, list) and body.query and not body.item_first else None
        union = tuple(dict.fromkeys(t for row in labels for t in row))
        groups = split_shared_prefix(seqs, cap, keep=1 if pos is None else pos + 1)
        reqs = [ScoreRequest(Prompt.of(p, body.user_vector, pos), tuple(tuple(x) for x in c), mode="label",
                             label_token_ids=union) for p, c, _ in groups]
    except RequestError as e:
        return error_response(400, str(e))
    except (TypeError, ValueError) as e:
        return error_response(400, f"bad request: {e}")
    results = await state.engine.score(reqs)
    failed = [r for r in results if not r.success]
    if failed:
        return error_response(400, failed[0].error or "request failed")
    column = {t: j for j, t in enumerate(union)}
    logps: list = [None] * len(items)
    for (_, _, idx), res in zip(groups, results):
        for i, row in zip(idx, res.scores):
            logps[i] = [row[column[t]] for t in labels[i]]
    if not all_finite(logps):
        return error_response(400, NON_FINITE.format(what="scores"))
    scores = [label_scores(row, body.apply_softmax, body.temperature) for row in logps]
    return json_answer(_answer(body, state.model_name, scores, logps, sum(len(s) for s in seqs)))


def _answer(body: ScoreBody, model_name: str, scores: list, logps: list, prompt_tokens: int) -> dict:
    """SGLang's `ScoringResponse(...).model_dump()`: every field, unset ones as null, usage as its `UsageInfo`."""
    usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens, "completion_tokens": 0,
             "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}
    return {"scores": scores, "pooled_hidden_states": None,
            "token_logprobs": logps if body.return_token_logprobs else None,
            "model": body.model or model_name, "usage": usage, "object": "scoring"}


def item_labels(label_token_ids: list, n_items: int, vocab_size: int | None) -> list[list[int]]:
    """Each item's label tokens, with SGLang's checks and messages (`score_request`): one shared list or
    one per item, nonempty, nonnegative, no duplicates, inside the vocabulary (the model's here; SGLang
    uses the tokenizer's `vocab_size`, which leaves out added tokens such as the SID tokens)."""
    if not label_token_ids:
        raise RequestError("label_token_ids must be a nonempty list")
    if isinstance(label_token_ids[0], list):
        if len(label_token_ids) != n_items:
            raise RequestError("label_token_ids must have one list per item")
        rows = [list(r) for r in label_token_ids]
    else:
        rows = [list(label_token_ids)] * n_items
    for row in rows:
        if not row:
            raise RequestError("each item must have a nonempty candidate list")
        if any(t < 0 for t in row):
            raise RequestError("label_token_ids must contain nonnegative integers")
        if len(set(row)) != len(row):
            raise RequestError("label_token_ids must not contain duplicate tokens")
        for t in row:
            if vocab_size is not None and t >= vocab_size:
                raise RequestError(f"Token ID {t} is out of vocabulary (vocab size: {vocab_size})")
    return rows


def sequences(query, items: list, item_first: bool, tokenizer) -> list[list[int]]:
    """The token ids SGLang scores per item: `query + item` (`item + query` with `item_first`); text is
    tokenized as the one concatenated string, as SGLang's one-sequence-per-item path sends it."""
    text_items = isinstance(items[0], str)
    if query is None:  # SGLang: an omitted query is empty, of the items' kind
        query = "" if text_items else []
    if isinstance(query, list) and not text_items:
        return [list(it) + query if item_first else query + list(it) for it in items]
    if not (isinstance(query, str) and text_items):
        raise RequestError(MIXED)
    if tokenizer is None:
        raise RequestError("text query/items need the checkpoint's tokenizer, and this server has none: send "
                           "token ids")
    texts = [f"{it}{query}" if item_first else f"{query}{it}" for it in items]
    return [list(ids) for ids in tokenizer(texts)["input_ids"]]


def split_shared_prefix(seqs: Sequence[list[int]], cap: int | None, keep: int) -> list[tuple]:
    """(prompt, candidates, item indices) groups for the engine, whose label scores are read after
    `prompt + candidate`: any cut of a sequence into a nonempty prompt and candidate gives its score.

    One group when every sequence starts with the same `keep` tokens or more (the query, and the
    <|user|> placeholder inside it) and is longer than that prefix: the prompt is computed once. Else
    one group per item (e.g. `item_first`, or items that share nothing), cut before its last token.
    `cap` keeps a token-id query as the prompt, so its cached prefix serves the next request too."""
    lcp = min(len(s) for s in seqs) - 1  # every candidate keeps at least one token
    first = seqs[0]
    for s in seqs[1:]:
        lcp = min(lcp, next((i for i, (a, b) in enumerate(zip(first, s)) if a != b), lcp))
    k = lcp if cap is None else min(lcp, cap)
    if k >= keep:
        return [(first[:k], [s[k:] for s in seqs], list(range(len(seqs))))]
    return [(s[:-1], [s[-1:]], [i]) for i, s in enumerate(seqs)]


def label_scores(logps: list[float], apply_softmax: bool, temperature: float) -> list[float]:
    """SGLang's `_convert_logprobs_to_scores`: a softmax over the labels (centred, at `temperature`),
    or each label's probability exp(log-prob), not renormalised."""
    if apply_softmax:
        top = max(logps)
        weights = [math.exp((x - top) / temperature) for x in logps]
        total = sum(weights)
        return [w / total for w in weights]
    return [math.exp(x) if x != float("-inf") else 0.0 for x in logps]


# ---- the workbench's extension ------------------------------------------------------------------------


class SequenceScoreBody(BaseModel):
    """Per item, the sum of its tokens' log-probs after the query (the engine's mode "sequence")."""

    model: str | None = None
    query: TokenIds = Field(..., description="prompt token ids")
    items: TokenIdLists = Field(..., description="candidate token-id lists")
    user_vector: UserVector | None = None
    placeholder_pos: StrictInt | None = None
    mode: Any = None  # refused: this route has one mode


@router.post("/v1/score_sequences")
async def score_sequences(body: SequenceScoreBody, request: Request):
    engine, model_name = request.app.state.engine, request.app.state.model_name
    if body.mode is not None:
        return error_response(400, "/v1/score_sequences has no `mode`: it always sums each item's token log-probs; "
                                   "label scores are POST /v1/score (SGLang's)")
    try:
        req = ScoreRequest(Prompt.of(body.query, body.user_vector, body.placeholder_pos),
                           tuple(tuple(it) for it in body.items), mode="sequence")
    except (TypeError, ValueError) as e:
        return error_response(400, f"bad request: {e}")
    (res,) = await engine.score([req])
    if not res.success:
        return error_response(400, res.error or "request failed")
    if not all_finite(res.scores):
        return error_response(400, NON_FINITE.format(what="scores"))
    item_tokens = sum(len(i) for i in body.items)
    return json_answer({"object": "workbench.sequence_scores", "model": body.model or model_name,
                        "scores": res.scores, "usage": {"prompt_tokens": res.prompt_tokens, "item_tokens": item_tokens,
                                                        "total_tokens": res.prompt_tokens + item_tokens}})
