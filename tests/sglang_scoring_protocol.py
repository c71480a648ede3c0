"""SGLang 0.5.23's scoring models, copied verbatim: the reference the tests hold `POST /v1/score` to.

Source: the `sglang==0.5.23` wheel (the version environments/sglang.yml pins),
`sglang/srt/entrypoints/openai/protocol.py` (upstream: python/sglang/srt/entrypoints/openai/protocol.py;
the wheel records no commit, so the file is cited by the sha256 its RECORD lists,
`PROTOCOL_SHA256` below). Everything between the two `verbatim` lines is that file's text of
`VERBATIM` (one statement each, in this order, blank lines between them), untouched.

Why a copy and not an import: protocol.py imports `msgspec`, `openai` and `sglang.utils` (which pulls
in most of SGLang), none of which the test environment has or should get for six pydantic classes;
the classes themselves need only pydantic and `typing`. tests/test_sglang_score_schema.py compares
this text with the wheel's, statement by statement, whenever the wheel is in data/cache/wheels
(`make test` downloads it there, without dependencies), so the copy cannot drift silently; without the
wheel that one test skips and says why, and every other test still runs against this copy.
"""

from __future__ import annotations

from typing import List, Optional, Union

from pydantic import BaseModel, Field, model_serializer

SGLANG_VERSION = "0.5.23"
PROTOCOL_PATH = "sglang/srt/entrypoints/openai/protocol.py"
PROTOCOL_SHA256 = "fiHUglEm07yTt-q6glByY9ABdh-sImzLHRYXtfcrgjU"  # urlsafe base64, as in the wheel's RECORD
VERBATIM = ("DEFAULT_MODEL_NAME", "ErrorResponse", "PromptTokensDetails", "CompletionTokensDetails", "UsageInfo",
            "ScoringRequest", "ScoringResponse")

# ---- verbatim from sglang==0.5.23 protocol.py: begin ----
DEFAULT_MODEL_NAME = "default"


class ErrorResponse(BaseModel):
    object: str = "error"
    message: str
    type: str
    param: Optional[str] = None
    code: int


class PromptTokensDetails(BaseModel):
    """Details about prompt tokens."""

    cached_tokens: int = 0
    # Multimodal prompt token counts (only populated when present in the prompt)
    image_tokens: Optional[int] = None
    audio_tokens: Optional[int] = None
    video_tokens: Optional[int] = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        data = handler(self)
        # Drop multimodal fields when absent so text-only/cache-only responses
        # keep the original {"cached_tokens": N} shape.
        for key in ("image_tokens", "audio_tokens", "video_tokens"):
            if data.get(key) is None:
                data.pop(key, None)
        return data


class CompletionTokensDetails(BaseModel):
    """Details about completion tokens."""

    reasoning_tokens: int = 0


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: Optional[int] = 0
    # Used to return cached tokens info when --enable-cache-report is set
    prompt_tokens_details: Optional[PromptTokensDetails] = None
    reasoning_tokens: Optional[int] = 0
    # The OpenAI location of reasoning_tokens; set only when there are some.
    completion_tokens_details: Optional[CompletionTokensDetails] = None


class ScoringRequest(BaseModel):
    query: Optional[Union[str, List[int]]] = (
        None  # Query text or pre-tokenized token IDs
    )
    items: Optional[Union[str, List[str], List[List[int]]]] = (
        None  # Item text(s) or pre-tokenized token IDs
    )
    # Placeholder token id used to locate embedding override positions in query/items.
    embed_override_token_id: Optional[int] = None
    # Query embedding overrides.
    query_embed_overrides: Optional[List[List[float]]] = (
        None  # [num_query_embed_overrides][hidden_size]
    )
    # Per-item embedding overrides (null entries skip that item).
    item_embed_overrides: Optional[List[Optional[List[List[float]]]]] = (
        None  # [num_items][num_item_embed_overrides][hidden_size]
    )
    label_token_ids: Optional[Union[List[int], List[List[int]]]] = (
        None  # shared candidates or one candidate list per item
    )
    apply_softmax: bool = False
    temperature: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    return_token_logprobs: bool = False
    item_first: bool = False
    return_pooled_hidden_states: bool = False

    # Setwise readout: when set, the readout is taken AT every occurrence of this
    # token in each `query + item` sequence instead of the last token, and `scores`
    # is returned nested (one `[Nᵢ x num_labels]` matrix per item). SeqCls pools the
    # head there; CausalLM reads label-token logprobs there. Both support batched
    # and --enable-mis.
    score_extraction_token: Optional[str] = None

    model: str = DEFAULT_MODEL_NAME


class ScoringResponse(BaseModel):
    # Pointwise (no `score_extraction_token`): a single [num_rows x num_labels]
    # matrix. Setwise: nested [num_items][Nᵢ x num_labels]. The nesting depth
    # disambiguates the two shapes.
    scores: Union[
        List[List[float]],  # pointwise: [num_rows x num_labels]
        List[List[List[float]]],  # setwise: [num_items][Nᵢ x num_labels]
    ]
    # Parallel to `scores`: flat [num_rows x hidden] (pointwise) or one such
    # matrix per item (setwise).
    pooled_hidden_states: Optional[
        Union[
            List[Optional[List[float]]],  # pointwise: [num_rows x hidden]
            List[List[Optional[List[float]]]],  # setwise: [num_items][Nᵢ x hidden]
        ]
    ] = None
    token_logprobs: Optional[List[List[float]]] = None
    model: str
    usage: Optional[UsageInfo] = None
    object: str = "scoring"
# ---- verbatim from sglang==0.5.23 protocol.py: end ----
