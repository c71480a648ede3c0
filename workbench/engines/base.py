"""The engine contract: typed requests and results, capabilities, and the async Engine protocol.

Every engine (the workbench's own `torch` engine, the `hf` baseline, vLLM, SGLang, TensorRT-LLM)
speaks token ids only; tokenization and prompt building happen before (study/prompts.py).
Results record failures (`success=False`, `error=...`) instead of raising, so one bad request never
aborts a batch or a load sweep (the shape of vLLM's `RequestFuncOutput`).

- `beam_search`: every beam comes back, best first, with its generated token ids (prompt excluded)
  and the cumulative log-probability of those tokens (no length penalty).
- `score`: mode "sequence" returns, per candidate, the sum of its token log-probs given the prompt;
  mode "label" returns, per candidate, the log-probs of `label_token_ids` read right after the
  candidate's last token (e.g. yes/no).
- A soft-token prompt carries a user vector and the position of the `<|user|>` placeholder; the
  engine projects the vector with the checkpoint's projector and replaces that embedding.

`validate_*` turns bad input into a `RequestError` with a message that says what to fix; engines
call them before any model work and report the error in the result.
"""

from __future__ import annotations

import enum
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal, Protocol, Sequence, runtime_checkable

import numpy as np


class RequestError(ValueError):
    """A request the engine refuses before touching the model (bad input, over a limit)."""


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (package missing, no GPU); the message says how to get it."""


def _new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Prompt:
    """Token ids, plus for the soft-token method the user vector and the placeholder position."""

    token_ids: tuple[int, ...]
    user_vector: tuple[float, ...] | None = None
    placeholder_pos: int | None = None

    @classmethod
    def of(cls, token_ids: Sequence[int], user_vector=None, placeholder_pos: int | None = None) -> "Prompt":
        vec = None if user_vector is None else tuple(float(x) for x in np.asarray(user_vector).reshape(-1))
        return cls(tuple(int(t) for t in token_ids), vec, placeholder_pos)

    @property
    def is_soft(self) -> bool:
        return self.user_vector is not None

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class BeamSearchRequest:
    prompt: Prompt
    beam_width: int
    max_new_tokens: int
    # Constrain generation to valid item SIDs of the checkpoint's catalog (prefix trie).
    constrained: bool = False
    # Item indices (catalog order) that constrained search must not complete (already seen).
    banned_items: tuple[int, ...] = ()
    request_id: str = field(default_factory=_new_id)


@dataclass(frozen=True)
class ScoreRequest:
    prompt: Prompt
    candidates: tuple[tuple[int, ...], ...]
    mode: Literal["sequence", "label"] = "sequence"
    label_token_ids: tuple[int, ...] = ()
    request_id: str = field(default_factory=_new_id)


@dataclass
class Timings:
    """Wall-clock stamps (time.perf_counter seconds) of one request inside the engine/client."""

    submitted: float = 0.0
    first_token: float | None = None  # where the engine exposes it (end of prefill)
    done: float = 0.0

    @property
    def e2e_s(self) -> float:
        return self.done - self.submitted

    @classmethod
    def start(cls) -> "Timings":
        return cls(submitted=time.perf_counter())

    def finish(self) -> "Timings":
        self.done = time.perf_counter()
        return self


@dataclass
class Beam:
    token_ids: list[int]  # generated tokens only, prompt excluded
    cum_logprob: float


@dataclass
class BeamSearchResult:
    request_id: str
    beams: list[Beam] = field(default_factory=list)  # best first, all of them
    success: bool = True
    error: str | None = None
    timings: Timings = field(default_factory=Timings)
    prompt_tokens: int = 0


@dataclass
class ScoreResult:
    request_id: str
    # mode "sequence": one float per candidate; mode "label": one list (per label token) per candidate
    scores: list = field(default_factory=list)
    success: bool = True
    error: str | None = None
    timings: Timings = field(default_factory=Timings)
    prompt_tokens: int = 0


class Support(str, enum.Enum):
    NATIVE = "native"
    EMULATED = "emulated"
    UNSUPPORTED = "unsupported"
    NOT_INSTALLED = "not installed"
    NOT_RUN_HERE = "written, not run here"


# The features of the capability matrix, in display order.
FEATURES: tuple[str, ...] = (
    "beam_search_all_beams",
    "trie_constraint",
    "soft_token",
    "soft_token_beam_search",
    "multi_item_scoring",
    "fanout_scoring",
)


@dataclass(frozen=True)
class FeatureSupport:
    status: Support
    reason: str = ""


@dataclass(frozen=True)
class Capabilities:
    engine: str
    features: dict[str, FeatureSupport]

    def __post_init__(self) -> None:
        missing = set(FEATURES) - set(self.features)
        if missing:
            raise ValueError(f"capabilities of {self.engine} miss features {sorted(missing)}")

    def supports(self, feature: str) -> bool:
        return self.features[feature].status in (Support.NATIVE, Support.EMULATED)

    def require(self, feature: str) -> None:
        fs = self.features[feature]
        if fs.status not in (Support.NATIVE, Support.EMULATED):
            raise RequestError(f"engine {self.engine!r} does not support {feature}: {fs.status.value} ({fs.reason})")


@dataclass(frozen=True)
class Limits:
    """Request-size limits an engine enforces (configurable per engine instance)."""

    max_prompt_tokens: int
    vocab_size: int
    max_beam_width: int = 64
    max_new_tokens: int = 64
    max_candidates: int = 1024
    max_candidate_tokens: int = 64
    user_vector_dim: int | None = None  # None: the checkpoint has no projector
    placeholder_id: int | None = None
    # Largest |value| a user vector may hold: `dtype_max` of the dtypes it passes through (None: unchecked).
    # Necessary, not sufficient: the projector's output can still overflow, so engines check it too.
    max_abs_user_value: float | None = None
    dtype: str | None = None  # the engine's compute dtype, named in messages


def dtype_max(*dtypes: str) -> float:
    """The largest finite value every one of `dtypes` (torch names: "float32", "bfloat16") can hold.

    From `torch.finfo`, imported here and not at module level: base.py stays importable without torch.
    """
    import torch

    return min(float(torch.finfo(getattr(torch, d)).max) for d in dtypes)


@runtime_checkable
class Engine(Protocol):
    name: str

    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]: ...

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]: ...

    def capabilities(self) -> Capabilities: ...

    async def close(self) -> None: ...


# ---- validation ---------------------------------------------------------------------------------


def validate_prompt(p: Prompt, lim: Limits, extra_tokens: int = 0) -> None:
    if len(p.token_ids) == 0:
        raise RequestError("empty prompt: a prompt needs at least one token id")
    if len(p.token_ids) + extra_tokens > lim.max_prompt_tokens:
        raise RequestError(
            f"prompt of {len(p.token_ids)} tokens (+{extra_tokens} to generate/score) exceeds the "
            f"model's limit of {lim.max_prompt_tokens}; shorten the history or raise max_position_embeddings"
        )
    bad = [t for t in p.token_ids if not 0 <= t < lim.vocab_size]
    if bad:
        raise RequestError(f"token ids outside the vocabulary [0, {lim.vocab_size}): {bad[:5]}")
    n_ph = sum(1 for t in p.token_ids if lim.placeholder_id is not None and t == lim.placeholder_id)
    if p.is_soft:
        if lim.user_vector_dim is None:
            raise RequestError("this checkpoint has no soft-token projector; send the prompt without a user vector")
        if len(p.user_vector) != lim.user_vector_dim:
            raise RequestError(
                f"user vector has {len(p.user_vector)} values; the checkpoint's projector expects {lim.user_vector_dim}"
            )
        if not all(math.isfinite(x) for x in p.user_vector):
            raise RequestError("user vector contains NaN or inf; fold the user in again or drop the request")
        peak = max((abs(x) for x in p.user_vector), default=0.0)
        if lim.max_abs_user_value is not None and peak > lim.max_abs_user_value:
            raise RequestError(
                f"user vector values reach {peak:.3g}, beyond what the engine's dtype ({lim.dtype}) can hold "
                f"(|value| <= {lim.max_abs_user_value:.3g}); a user embedding is never this large: "
                "normalize the vector (e.g. to unit L2 norm) or fold the user in again"
            )
        if n_ph != 1:
            raise RequestError(f"a soft-token prompt needs exactly one <|user|> placeholder, found {n_ph}")
        if p.placeholder_pos is None or not 0 <= p.placeholder_pos < len(p.token_ids):
            raise RequestError(f"placeholder_pos {p.placeholder_pos} is not a position of the prompt")
        if p.token_ids[p.placeholder_pos] != lim.placeholder_id:
            raise RequestError(
                f"placeholder_pos {p.placeholder_pos} holds token {p.token_ids[p.placeholder_pos]}, "
                f"not the <|user|> placeholder {lim.placeholder_id}"
            )
    elif p.placeholder_pos is not None:
        raise RequestError(
            f"placeholder_pos {p.placeholder_pos} is given without a user_vector; send both (a soft-token prompt) "
            "or neither"
        )
    elif n_ph:
        raise RequestError("prompt contains the <|user|> placeholder but no user vector; pass user_vector")


def validate_beam_request(r: BeamSearchRequest, lim: Limits) -> None:
    if not 1 <= r.beam_width <= lim.max_beam_width:
        raise RequestError(f"beam_width {r.beam_width} outside 1..{lim.max_beam_width} (engine limit)")
    if not 1 <= r.max_new_tokens <= lim.max_new_tokens:
        raise RequestError(f"max_new_tokens {r.max_new_tokens} outside 1..{lim.max_new_tokens}")
    validate_prompt(r.prompt, lim, extra_tokens=r.max_new_tokens)


def validate_score_request(r: ScoreRequest, lim: Limits) -> None:
    if not r.candidates:
        raise RequestError("score request has no candidates")
    if len(r.candidates) > lim.max_candidates:
        raise RequestError(f"{len(r.candidates)} candidates exceed the engine limit of {lim.max_candidates}; split the request")
    if r.mode not in ("sequence", "label"):
        raise RequestError(f"unknown score mode {r.mode!r}; use 'sequence' or 'label'")
    if r.mode == "label" and not r.label_token_ids:
        raise RequestError("mode 'label' needs label_token_ids (e.g. the ids of 'yes' and 'no')")
    longest = 0
    for i, c in enumerate(r.candidates):
        if not c:
            raise RequestError("empty candidate: every candidate needs at least one token")
        if len(c) > lim.max_candidate_tokens:
            raise RequestError(f"candidate of {len(c)} tokens exceeds the limit of {lim.max_candidate_tokens}")
        if any(not 0 <= t < lim.vocab_size for t in c):
            raise RequestError(f"candidate token ids outside the vocabulary [0, {lim.vocab_size})")
        # the soft token belongs to the prompt (its one position gets the projected vector); in a candidate
        # it would be scored as a plain embedding row, a meaningless score
        if lim.placeholder_id is not None and lim.placeholder_id in c:
            raise RequestError(
                f"candidate {i} contains the <|user|> placeholder token {lim.placeholder_id}; candidates are item "
                "tokens: put the placeholder in the query and send the user_vector with it"
            )
        longest = max(longest, len(c))
    if any(not 0 <= t < lim.vocab_size for t in r.label_token_ids):
        raise RequestError(f"label token ids outside the vocabulary [0, {lim.vocab_size})")
    validate_prompt(r.prompt, lim, extra_tokens=longest)
