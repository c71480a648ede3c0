"""OpenAI completions as vLLM 0.32's server speaks them: `POST /v1/completions`, `GET /v1/models`.

A drop-in for the clients vLLM users already have (the `openai` client, `vllm bench serve`), on an
engine that only decodes deterministically (beam search; greedy is beam width 1). Every parameter of
vLLM 0.32's `CompletionRequest` (`vllm/entrypoints/openai/completion/protocol.py`) is either honoured,
accepted with its effect documented here, or refused with a 400 that names it; nothing is silently
dropped. A field that neither OpenAI, vLLM nor the workbench defines is a 400 too.

Honoured:
- `model`: the served name (`GET /v1/models`), or absent; any other name is a 404 (`model_not_found`),
  as vLLM answers (it says "The model `x` does not exist").
- `prompt`: token ids, a list of token-id prompts, a text, or a list of texts (at most `MAX_PROMPTS`).
  Text is tokenized with the checkpoint's tokenizer without special tokens (`add_special_tokens`,
  vLLM's default true, defaults to false here: a SID prompt has no BOS; true is honoured).
- `use_beam_search`, `n`, `best_of`: `n` beams are returned, best first; the beam width is `best_of`
  when given (must be >= n: OpenAI's "generate best_of, return the best n"; vLLM 0.32 has no
  `best_of` and its width is `n`). Without beam search `n` must be 1 and the answer is greedy
  (beam width 1), which needs `temperature` absent or 0: sampling is refused.
- `max_tokens` (null: 16, as vLLM), `min_tokens` (<= max_tokens: always met, beams run to max_tokens).
- `echo` (the prompt's text before each choice's text; not with `logprobs`, as vLLM refuses under beam
  search), `logprobs` 0 (see below), `stream` + `stream_options` (`include_usage`, `continuous_usage_stats`),
  `skip_special_tokens` (default false here, true in vLLM: SID tokens may be special tokens and must
  appear in `text`), `return_token_ids` (adds `prompt_token_ids`), `return_tokens_as_token_ids`,
  `request_id` / the `X-Request-Id` header (the answer's id is `cmpl-<it>`).
- The workbench's own: `user_vector` + `placeholder_pos` (soft token; for a text prompt the position of
  its one `<|user|>` is found when `placeholder_pos` is absent), `constrained`, `banned_items`, and in
  every choice `token_ids` (generated ids) and `cum_logprob` (their summed log-prob).

Accepted, with no effect by construction (documented, not ignored):
- `temperature` under beam search: vLLM 0.32 ranks beams by raw log-probs too (`logprobs_mode`
  "raw_logprobs"), so it has no effect there either (this repo's vLLM adapter sends 1.0).
- `length_penalty` (any finite value): vLLM divides a finished beam's cum log-prob by
  `len ** length_penalty`; here every beam has exactly `max_tokens` tokens (no EOS stop), so the
  order of the beams is the same for every value, and scores are reported unpenalized as vLLM does.
- `ignore_eos`: beams always run to `max_tokens` (a SID has a fixed length); `finish_reason` is "length".
- `seed` (decoding is deterministic), `user`, `session_id` (identifiers), `include_stop_str_in_output`
  (there are no stop strings), `stream_interval` (a stream carries each prompt's beams in one chunk).

Refused (400 naming it) unless absent or at its no-op value: the sampling and stopping parameters
(`top_p` 1, `top_k` 0/-1, `min_p` 0, `repetition_penalty` 1, `presence_penalty` 0,
`frequency_penalty` 0, `logit_bias`, `stop`, `stop_token_ids`, `bad_words`, `allowed_token_ids`,
`watermarking`), `suffix`, `prompt_logprobs`, `logprob_token_ids`, `prompt_embeds` (use
`user_vector`), `response_format`, `structured_outputs`, `truncate_prompt_tokens`, `priority` and the
other vLLM extensions in `_NO_OP_VALUES`. `logprobs` > 0 is refused: top-k alternatives are not
computed, and none are invented.

`logprobs: 0` gives each choice the OpenAI completions `logprobs` object: `tokens` (each id decoded
alone), `token_logprobs`, `top_logprobs` (per position the chosen token only, what vLLM returns for
`logprobs: 0`) and `text_offset` (where each token starts in `text`). The log-probs come from a
second pass that scores every prefix of the returned beams (`mode="sequence"`, differences of
prefix sums): the model's full-vocabulary log-probs of the chosen tokens, equal to the search's own
up to float rounding (their sum matches `cum_logprob` to ~1e-5). A position at or after a generated
`<|user|>` placeholder has null log-probs (the engine refuses to score the placeholder as content; a
constrained beam, a catalog SID, never holds it).

Streaming (`stream: true`): the search runs first (so a bad request is still a plain 4xx), then one
`text_completion` chunk per prompt holds all its choices, then the usage chunk (`choices: []`) when
`stream_options.include_usage` is set, then `data: [DONE]`. vLLM refuses streaming with beam search;
`vllm bench serve` and the `openai` client read this stream unchanged (text from `choices[0].text`,
output tokens from the usage chunk).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictInt, StrictStr, Tag

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest
from workbench.engines.serving.errors import (
    NON_FINITE,
    PROMPT_MANY,
    PROMPT_ONE,
    TEXT,
    TEXTS,
    TokenIds,
    UserVector,
    all_finite,
    cap,
    error_response,
    excerpt,
    json_answer,
)

router = APIRouter()

MAX_PROMPTS = 1024  # prompts per request, vLLM's default VLLM_MAX_COMPLETION_PROMPTS


def _prompt_shape(v) -> str:
    """Which shape a `prompt` is, decided up front so a bad one reports that shape's error only: a text,
    a list of texts (every element a string), a list of token-id lists (first element a list), else
    token ids (so `[5, "6"]` is an id list with a bad element, not a text batch)."""
    if isinstance(v, str):
        return TEXT
    if isinstance(v, list) and v:
        if isinstance(v[0], list):
            return PROMPT_MANY
        if all(isinstance(x, str) for x in v):
            return TEXTS
    return PROMPT_ONE


Prompts = Annotated[
    Annotated[TokenIds, Tag(PROMPT_ONE)]
    | Annotated[list[TokenIds], Field(fail_fast=True), Tag(PROMPT_MANY)]
    | Annotated[StrictStr, Tag(TEXT)]
    | Annotated[list[StrictStr], Tag(TEXTS)],
    Discriminator(_prompt_shape),
]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class CompletionRequest(BaseModel):
    """The fields that are honoured or accepted; everything else lands in `model_extra` and is checked
    against `_NO_OP_VALUES` (a no-op value passes, anything else is a 400 naming the field)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: Prompts = Field(..., description="token ids, a list of token-id prompts, a text or a list of texts")
    max_tokens: StrictInt | None = Field(16, ge=1)
    n: StrictInt = Field(1, ge=1, description="beams returned (beam search); 1 without")
    best_of: StrictInt | None = Field(None, ge=1, description="beam width (>= n); default n")
    use_beam_search: bool = False
    length_penalty: FiniteFloat = 1.0
    temperature: FiniteFloat | None = Field(None, ge=0)
    echo: bool | None = False
    logprobs: StrictInt | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: StrictInt = Field(0, ge=0)
    skip_special_tokens: bool = False
    add_special_tokens: bool = False
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    request_id: str | None = None
    # accepted, no effect by construction (module docstring)
    seed: StrictInt | None = None
    user: str | None = None
    session_id: str | None = None
    include_stop_str_in_output: bool = False
    stream_interval: StrictInt | None = Field(None, ge=1)
    # the workbench's own
    user_vector: UserVector | None = None
    placeholder_pos: StrictInt | None = None
    constrained: bool = False
    banned_items: TokenIds = Field(default_factory=list)


_SAMPLING = "a sampling parameter; this server decodes deterministically (beam search, greedy = width 1)"
_STOPPING = "beams always run to max_tokens (a SID has a fixed length), nothing stops them early"
# Known OpenAI / vLLM 0.32 parameters this server cannot honour: (values that are a no-op, why not).
_NO_OP_VALUES: dict[str, tuple[tuple[Any, ...], str]] = {
    "top_p": ((None, 1, 1.0), _SAMPLING),
    "top_k": ((None, 0, -1), _SAMPLING),
    "min_p": ((None, 0, 0.0), _SAMPLING),
    "repetition_penalty": ((None, 1, 1.0), _SAMPLING),
    "presence_penalty": ((None, 0, 0.0), _SAMPLING),
    "frequency_penalty": ((None, 0, 0.0), _SAMPLING),
    "logit_bias": ((None, {}), "per-token biases are not applied; use constrained/banned_items for the catalog"),
    "watermarking": ((None, False), _SAMPLING),
    "stop": ((None, "", []), _STOPPING),
    "stop_token_ids": ((None, []), _STOPPING),
    "bad_words": ((None, []), "word bans are not applied; use constrained/banned_items for the catalog"),
    "allowed_token_ids": ((None,), "token allow-lists are not applied; use constrained=true for valid SIDs"),
    "suffix": ((None, ""), "no fill-in-the-middle"),
    "prompt_logprobs": ((None,), "prompt log-probs are not computed; POST /v1/score scores sequences"),
    "logprob_token_ids": ((None, []), "log-probs of chosen tokens only (logprobs=0); /v1/score reads label ids"),
    "prompt_embeds": ((None, []), "prompt embeddings are not taken; send user_vector + placeholder_pos"),
    "response_format": ((None, {"type": "text"}), "no structured output"),
    "structured_outputs": ((None,), "no structured output"),
    "truncate_prompt_tokens": ((None,), "prompts are never truncated; an over-long one is a 400"),
    "truncation_side": ((None,), "prompts are never truncated"),
    "priority": ((None, 0), "no priority scheduling"),
    "cache_salt": ((None,), "no shared prefix cache to salt"),
    "kv_transfer_params": ((None,), "no disaggregated serving"),
    "ec_transfer_params": ((None,), "no disaggregated serving"),
    "vllm_xargs": ((None, {}), "no custom extensions"),
    "repetition_detection": ((None,), _STOPPING),
    "thinking_token_budget": ((None,), "not a reasoning model"),
    "spaces_between_special_tokens": ((None, True), "decoding uses the tokenizer's own spacing"),
    "return_token_offsets": ((None, False), "only vLLM's render endpoints have it"),
    "routed_experts_prompt_start": ((None, 0), "not a mixture-of-experts model"),
    "mm_payload": ((None, "tensors"), "no multimodal input"),
    "return_mm_kwargs": ((None,), "no multimodal input"),
}
EXTENSIONS = ("user_vector", "placeholder_pos", "constrained", "banned_items")


def _is_no_op(value, allowed: tuple) -> bool:
    """`value` is one of `allowed` as JSON means it: 1 and 1.0 are the same number, but `true` is not 1."""
    for a in allowed:
        if a is None or isinstance(a, bool) or isinstance(value, bool):
            if value is a or (type(value) is type(a) and value == a):
                return True
        elif isinstance(a, (int, float)) and isinstance(value, (int, float)):
            if value == a:
                return True
        elif type(value) is type(a) and value == a:
            return True
    return False


def refusal(body: CompletionRequest) -> str | None:
    """Why this server cannot answer `body` as asked (a 400 naming the parameter), or None."""
    extra = body.model_extra or {}
    unknown = sorted(k for k in extra if k not in _NO_OP_VALUES)
    if unknown:
        return (f"unknown parameter{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown[:5]))}: this server takes "
                f"OpenAI / vLLM completions parameters plus {', '.join(EXTENSIONS)} (docs/serving.md)")
    for k, v in extra.items():
        allowed, why = _NO_OP_VALUES[k]
        if not _is_no_op(v, allowed):
            shown = " or ".join("null" if a is None else json.dumps(a) for a in allowed)
            return f"{k}={excerpt(v)} is not supported: {why}; leave it out (or send {shown})"
    if not body.use_beam_search:
        if body.n != 1:
            return ("n > 1 needs beam search: set use_beam_search=true (n beams are returned); without it the answer "
                    "is greedy (n=1)")
        if body.best_of not in (None, 1):
            return "best_of > 1 needs beam search: set use_beam_search=true (best_of is then the beam width)"
        if body.temperature not in (None, 0):
            return (f"temperature={body.temperature} asks for sampling; this server decodes deterministically: send "
                    "temperature 0 (or none) for greedy, or use_beam_search=true")
    elif body.best_of is not None and body.best_of < body.n:
        return f"best_of={body.best_of} is less than n={body.n}: best_of is the beam width, n beams are returned"
    if body.logprobs is not None and body.logprobs != 0:
        return (f"logprobs={body.logprobs} asks for the top alternatives at every position, which this server does "
                "not compute (and will not invent); logprobs=0 gives the chosen tokens' log-probs")
    if body.echo and body.logprobs is not None:
        return "echo with logprobs needs prompt log-probs, which beam search does not compute (vLLM refuses it too)"
    if body.stream_options is not None and not body.stream:
        return "stream_options needs stream=true"
    if body.min_tokens > (body.max_tokens or 16):
        return f"min_tokens={body.min_tokens} exceeds max_tokens={body.max_tokens}"
    return None


def _texts_and_ids(body: CompletionRequest, tokenizer) -> tuple[list[list[int]], list[str | None]] | str:
    """(token ids per prompt, the prompt's text where it was given as text), or why not (a 400)."""
    p, shape = body.prompt, _prompt_shape(body.prompt)
    texts = [p] if shape == TEXT else list(p) if shape == TEXTS else None
    if texts is None:
        ids = p if shape == PROMPT_MANY else [p]
        if len(ids) > MAX_PROMPTS:
            return f"{len(ids)} prompts in one request; at most {MAX_PROMPTS} (send several requests)"
        return [list(x) for x in ids], [None] * len(ids)
    if len(texts) > MAX_PROMPTS:
        return f"{len(texts)} prompts in one request; at most {MAX_PROMPTS} (send several requests)"
    if tokenizer is None:
        return "this checkpoint has no tokenizer, so text prompts cannot be read; send token ids"
    enc = [tokenizer(t, add_special_tokens=body.add_special_tokens)["input_ids"] for t in texts]
    return [list(map(int, e)) for e in enc], list(texts)


def _decode(tokenizer, ids, skip_special: bool = False) -> str:
    return "" if tokenizer is None or not ids else tokenizer.decode(list(ids), skip_special_tokens=skip_special)


def _echoed(tokenizer, prompt_text: str | None, p_ids, out_ids, out: str, skip_special: bool) -> str:
    """The prompt's text (as given, or decoded from its ids) joined to the completion `out` the way the
    tokenizer joins them (a word-level tokenizer puts a space between tokens; vLLM's plain concatenation
    would glue "w6" and "w58" into "w6w58")."""
    head = _decode(tokenizer, p_ids, skip_special)
    full = _decode(tokenizer, list(p_ids) + list(out_ids), skip_special)
    joiner = full[len(head): len(full) - len(out)] if full.startswith(head) and full.endswith(out) else ""
    return (head if prompt_text is None else prompt_text) + joiner + out


def _token_strings(tokenizer, ids, skip_special: bool, as_ids: bool) -> tuple[list[str], list[int]]:
    """Each token decoded alone (or `token_id:N`, as vLLM's `return_tokens_as_token_ids`), and where it
    starts in the choice's text: the length of the decoded prefix through it minus its own decoded
    length, so tokenizers that join tokens with spaces (word-level) get true offsets, not a running sum."""
    toks, offsets, start = [], [], 0
    for i, t in enumerate(ids):
        toks.append(f"token_id:{t}" if as_ids or tokenizer is None else _decode(tokenizer, [t]))
        end = len(_decode(tokenizer, ids[: i + 1], skip_special))
        start = max(start, end - len(_decode(tokenizer, [t], skip_special)))
        offsets.append(start)
    return toks, offsets


async def _chosen_logprobs(engine, prompt: Prompt, beams) -> list[list[float | None]] | str:
    """Per beam, the log-prob of each chosen token given the prompt and the tokens before it: every
    distinct prefix of the beams is scored (mode "sequence"; chunks of the engine's candidate limit),
    and a token's log-prob is the difference of consecutive prefix sums. A position at or after a
    generated `<|user|>` placeholder is None (null): the engine refuses to score the placeholder as
    content, so it is not computed, and not guessed. Or an error message."""
    ph = getattr(getattr(engine, "limits", None), "placeholder_id", None)
    prefixes = sorted({tuple(b.token_ids[: j + 1]) for b in beams for j in range(len(b.token_ids))
                       if ph not in b.token_ids[: j + 1]})
    limit = getattr(getattr(engine, "limits", None), "max_candidates", 1024)
    chunks = [tuple(prefixes[i: i + limit]) for i in range(0, len(prefixes), limit)]
    results = await engine.score([ScoreRequest(prompt, c, mode="sequence") for c in chunks]) if chunks else []
    sums: dict[tuple[int, ...], float] = {(): 0.0}
    for c, r in zip(chunks, results):
        if not r.success:
            return f"logprobs could not be computed: {r.error}"
        sums.update(zip(c, (float(s) for s in r.scores)))
    out = []
    for b in beams:
        ids = tuple(b.token_ids)
        out.append([sums[ids[: j + 1]] - sums[ids[:j]] if ids[: j + 1] in sums else None for j in range(len(ids))])
    return out


@router.get("/v1/models")
async def models(request: Request):
    """The one served model, as vLLM lists it (`root` is the checkpoint folder: `vllm bench serve`
    without `--model` loads its tokenizer from there)."""
    engine = request.app.state.engine
    ck, limits = getattr(engine, "checkpoint", None), getattr(engine, "limits", None)
    card = {"id": request.app.state.model_name, "object": "model", "created": int(time.time()), "owned_by": "workbench",
            "root": str(ck.path) if getattr(ck, "path", None) else None, "parent": None,
            "max_model_len": getattr(limits, "max_prompt_tokens", None), "permission": []}
    return {"object": "list", "data": [card]}


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request):
    app = request.app
    engine, model_name = app.state.engine, app.state.model_name
    tokenizer = getattr(app.state, "tokenizer", None)
    if body.model not in (None, "", model_name):
        return error_response(404, f"The model `{cap(body.model, 100)}` does not exist. Valid aliases: {model_name}.",
                              "model_not_found")
    why = refusal(body)
    if why:
        return error_response(400, why)
    got = _texts_and_ids(body, tokenizer)
    if isinstance(got, str):
        return error_response(400, got)
    ids, texts = got
    if body.user_vector is not None and len(ids) != 1:
        return error_response(400, "user_vector applies to one prompt; send one prompt per request")
    pos = body.placeholder_pos
    ph = getattr(getattr(engine, "limits", None), "placeholder_id", None)
    if texts[0] is not None and body.user_vector is not None and pos is None and ids[0].count(ph) == 1:
        pos = ids[0].index(ph)  # a text prompt cannot know its token positions
    width = (body.best_of or body.n) if body.use_beam_search else 1
    max_tokens = body.max_tokens or 16
    try:
        prompts = [Prompt.of(p, body.user_vector, pos) for p in ids]
        reqs = [BeamSearchRequest(p, beam_width=width, max_new_tokens=max_tokens, constrained=body.constrained,
                                  banned_items=tuple(body.banned_items)) for p in prompts]
    except (TypeError, ValueError) as e:
        return error_response(400, f"bad request: {e}")
    results = await engine.beam_search(reqs)
    failed = [r for r in results if not r.success]
    if failed:
        return error_response(400, failed[0].error or "request failed")
    kept = [r.beams[: body.n] if body.use_beam_search else r.beams[:1] for r in results]
    if not all(math.isfinite(b.cum_logprob) for beams in kept for b in beams):
        return error_response(400, NON_FINITE.format(what="log-probs"))
    token_lps: list = [None] * len(kept)
    if body.logprobs is not None:
        for i, (p, beams) in enumerate(zip(prompts, kept)):
            token_lps[i] = await _chosen_logprobs(engine, p, beams)
            if isinstance(token_lps[i], str):
                return error_response(400, token_lps[i])
        if not all_finite([x for lps in token_lps for beam in lps for x in beam if x is not None]):
            return error_response(400, NON_FINITE.format(what="token log-probs"))

    per_prompt, index = [], 0
    for p_ids, text, beams, lps in zip(ids, texts, kept, token_lps):
        choices = []
        for j, b in enumerate(beams):
            out = _decode(tokenizer, b.token_ids, body.skip_special_tokens)
            if body.echo:
                out = _echoed(tokenizer, text, p_ids, b.token_ids, out, body.skip_special_tokens)
            choice = {"index": index, "text": out, "logprobs": None, "finish_reason": "length",
                      "stop_reason": None, "token_ids": list(b.token_ids), "cum_logprob": b.cum_logprob}
            if lps is not None:
                toks, offsets = _token_strings(tokenizer, b.token_ids, body.skip_special_tokens,
                                               bool(body.return_tokens_as_token_ids))
                choice["logprobs"] = {"tokens": toks, "token_logprobs": lps[j], "text_offset": offsets,
                                      "top_logprobs": [None if lp is None else {t: lp} for t, lp in zip(toks, lps[j])]}
            if body.return_token_ids:
                choice["prompt_token_ids"] = list(p_ids)
            choices.append(choice)
            index += 1
        per_prompt.append(choices)
    ptoks = sum(len(p) for p in ids)
    gen = sum(len(c["token_ids"]) for cs in per_prompt for c in cs)
    usage = {"prompt_tokens": ptoks, "completion_tokens": gen, "total_tokens": ptoks + gen}
    head = {"id": f"cmpl-{request.headers.get('x-request-id') or body.request_id or uuid.uuid4().hex}",
            "object": "text_completion", "created": int(time.time()), "model": model_name}
    if body.stream:
        from fastapi.responses import StreamingResponse

        opts = body.stream_options or StreamOptions()
        return StreamingResponse(_events(head, per_prompt, ids, usage, bool(opts.include_usage),
                                         bool(opts.include_usage and opts.continuous_usage_stats)),
                                 media_type="text/event-stream")
    return json_answer({**head, "choices": [c for cs in per_prompt for c in cs], "usage": usage})


async def _events(head: dict, per_prompt: list[list[dict]], ids: list[list[int]], usage: dict, include_usage: bool,
                  continuous: bool):
    """The SSE stream: one chunk per prompt (all its choices), the usage chunk when asked, `[DONE]`."""
    for choices, p_ids in zip(per_prompt, ids):
        chunk = {**head, "choices": choices}
        if continuous:
            gen = sum(len(c["token_ids"]) for c in choices)
            chunk["usage"] = {"prompt_tokens": len(p_ids), "completion_tokens": gen, "total_tokens": len(p_ids) + gen}
        yield f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"
    if include_usage:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': usage}, separators=(',', ':'))}\n\n"
    yield "data: [DONE]\n\n"
