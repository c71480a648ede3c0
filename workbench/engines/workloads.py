"""Synthetic workloads: a deterministic, unique request per index over a checkpoint's vocabulary.

This is the one builder of synthetic requests: the load benchmark (`bench.py`), the
microbenchmark and the compute-floor benchmark (`workbench/perf/`) all draw their prompts here,
so a prompt of a given shape means the same thing in every measurement.

A workload turns a request index into a `BeamSearchRequest` or a `ScoreRequest` of a fixed shape
(prompt length, beam width, new tokens, candidates per request). Requests are a pure function of
(seed, index), so every engine in a sweep gets exactly the same prompts, and each index gets its
own prompt: the first token encodes the index (no two requests of a point share a first token, so
no engine can reuse another request's prefix, as in the reference study) and the rest is random
base-vocabulary tokens.

For a soft-token checkpoint the prompt carries the `<|user|>` placeholder (position 1) and a
random user vector, so the projector and embedding replacement are part of what is measured.
Scoring candidates are real item SIDs from the checkpoint's catalog when their length matches the
SID depth (otherwise random SID-block tokens of the requested length).

Only `workbench.json` and `catalog.npz` are read (numpy, no torch), so building a workload is cheap.

`TestSplitWorkload` replays a trained checkpoint's real test prompts instead (`load.prompts_from:
test_split`; the prompts come from the study that trained it, see `load/sources.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest
from workbench.sids.layout import SidLayout

KINDS = ("beam_search", "scoring")


@dataclass(frozen=True)
class WorkloadShape:
    """The request shape of a load test (one config `load` section)."""

    kind: str  # beam_search | scoring
    prompt_tokens: int
    beam_width: int = 30
    max_new_tokens: int = 5
    constrained: bool = False
    candidates: int = 500
    candidate_tokens: int = 5
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown workload kind {self.kind!r}; use one of {KINDS}")
        if self.prompt_tokens < 2:
            raise ValueError(f"prompt_tokens must be >= 2 (index token + content), got {self.prompt_tokens}")

    @property
    def name(self) -> str:
        """A compact label, also the workload tag: runs with different shapes never join."""
        if self.kind == "beam_search":
            mode = "c" if self.constrained else "u"
            return f"beam_search/p{self.prompt_tokens}/b{self.beam_width}/n{self.max_new_tokens}/{mode}"
        return f"scoring/p{self.prompt_tokens}/c{self.candidates}x{self.candidate_tokens}"


class SyntheticWorkload:
    """Synthetic prompts of `shape.prompt_tokens` tokens over a checkpoint's base vocabulary."""

    def __init__(self, shape: WorkloadShape, layout: SidLayout, item_token_ids: np.ndarray | None = None,
                 user_vector_dim: int | None = None):
        if layout.base_vocab_size < 4:
            raise ValueError(f"base vocabulary of {layout.base_vocab_size} tokens is too small for synthetic prompts")
        self.shape = shape
        self.kind = shape.kind
        self.layout = layout
        self.item_token_ids = item_token_ids  # [n_items, item_depth] token ids of catalog SIDs
        self.user_vector_dim = user_vector_dim
        self._low = 2  # ids 0/1 are often [UNK]/[PAD]-like specials in a base vocabulary

    @classmethod
    def from_checkpoint(cls, shape: WorkloadShape, checkpoint, soft_token: bool | None = None):
        """Read the layout/catalog of `checkpoint` (a folder, or a LoadedCheckpoint such as the in-memory ones of
        `random_checkpoint.random_model`); `soft_token=None` follows the checkpoint: soft-token prompts where it
        carries a projector (a user vector size in its metadata)."""
        from workbench.model.checkpoint import CATALOG_FILE, LoadedCheckpoint, read_meta

        if isinstance(checkpoint, LoadedCheckpoint):
            meta, item_ids = checkpoint.meta, checkpoint.catalog.item_token_ids
        else:
            meta = read_meta(checkpoint)
            cat = Path(checkpoint) / CATALOG_FILE
            item_ids = meta.layout.item_codes_to_ids(np.load(cat)["item_codes"]) if cat.exists() else None
        use_soft = (meta.user_vector_dim is not None) if soft_token is None else soft_token
        if use_soft and meta.user_vector_dim is None:
            raise ValueError(f"{checkpoint} has no soft-token projector; set soft_token to false")
        return cls(shape, meta.layout, item_ids, meta.user_vector_dim if use_soft else None)

    @property
    def name(self) -> str:
        return self.shape.name + ("/soft" if self.user_vector_dim else "")

    def prompt(self, index: int) -> Prompt:
        if index < 0:
            raise ValueError(f"request index must be >= 0, got {index}")
        rng = np.random.default_rng([self.shape.seed, index])
        span = self.layout.base_vocab_size - self._low
        ids = rng.integers(self._low, self.layout.base_vocab_size, size=self.shape.prompt_tokens)
        ids[0] = self._low + index % span  # distinct first token within every window of `span` requests
        if self.user_vector_dim:
            ids[1] = self.layout.placeholder_id
            vec = rng.standard_normal(self.user_vector_dim).astype(np.float32)
            return Prompt.of(ids, user_vector=vec, placeholder_pos=1)
        return Prompt.of(ids)

    def requests(self, count: int, first: int = 0) -> list[BeamSearchRequest | ScoreRequest]:
        """Requests `first` .. `first + count - 1`; use disjoint ranges for request sets that must differ."""
        return [self.request(i) for i in range(first, first + count)]

    def candidates(self, index: int) -> tuple[tuple[int, ...], ...]:
        s = self.shape
        rng = np.random.default_rng([self.shape.seed, index, 1])
        if self.item_token_ids is not None and s.candidate_tokens == self.item_token_ids.shape[1]:
            n = len(self.item_token_ids)
            rows = rng.choice(n, size=s.candidates, replace=s.candidates > n)
            return tuple(tuple(int(t) for t in self.item_token_ids[r]) for r in rows)
        lo = self.layout.item_level_offset(0)
        hi = self.layout.special_offset
        toks = rng.integers(lo, hi, size=(s.candidates, s.candidate_tokens))
        return tuple(tuple(int(t) for t in row) for row in toks)

    def request(self, index: int) -> BeamSearchRequest | ScoreRequest:
        s = self.shape
        if s.kind == "beam_search":
            return BeamSearchRequest(prompt=self.prompt(index), beam_width=s.beam_width,
                                     max_new_tokens=s.max_new_tokens, constrained=s.constrained,
                                     request_id=f"r{index}")  # fmt: skip
        return ScoreRequest(prompt=self.prompt(index), candidates=self.candidates(index), request_id=f"r{index}")


class TestSplitWorkload(SyntheticWorkload):
    """A trained checkpoint's real test prompts (its method's layout and tokenizer), replayed in order.

    Request i sends test prompt `i mod n` (n = the study's test users): within a rate point of at most
    n requests every prompt is a different user's, so no two share more than the method's fixed
    markers. Constrained beam search bans each user's seen items, exactly as evaluation does, so a
    load run and its quality run measure the same requests. Scoring candidates are catalog items.
    """

    __test__ = False  # not a pytest class despite the name

    def __init__(self, shape: WorkloadShape, layout: SidLayout, prompts, item_token_ids: np.ndarray | None):
        dim = prompts.user_vectors.shape[1] if prompts.user_vectors is not None else None
        super().__init__(shape, layout, item_token_ids, dim)
        if len(prompts) == 0:
            raise ValueError("the study has no test prompts for this checkpoint")
        self.prompts = prompts  # personalization.PromptSet
        lengths = prompts.lengths()
        self.prompt_tokens_mean = float(lengths.mean())

    @classmethod
    def from_prompt_set(cls, shape: WorkloadShape, checkpoint: str | Path, prompts) -> "TestSplitWorkload":
        from workbench.model.checkpoint import CATALOG_FILE, read_meta

        meta = read_meta(checkpoint)
        if prompts.method != meta.method:
            raise ValueError(f"{checkpoint} is a {meta.method!r} checkpoint but the prompts are {prompts.method!r}")
        if shape.kind == "beam_search" and shape.constrained and shape.max_new_tokens != meta.layout.item_depth:
            raise ValueError(f"constrained beam search writes one SID: load.max_new_tokens must be the SID depth "
                             f"{meta.layout.item_depth} of {checkpoint}, got {shape.max_new_tokens}")
        cat = Path(checkpoint) / CATALOG_FILE
        item_ids = meta.layout.item_codes_to_ids(np.load(cat)["item_codes"]) if cat.exists() else None
        return cls(shape, meta.layout, prompts, item_ids)

    @property
    def name(self) -> str:
        s = self.shape
        if s.kind == "beam_search":
            return f"beam_search/test_split/b{s.beam_width}/n{s.max_new_tokens}/{'c' if s.constrained else 'u'}"
        return f"scoring/test_split/c{s.candidates}x{s.candidate_tokens}"

    def prompt(self, index: int) -> Prompt:
        if index < 0:
            raise ValueError(f"request index must be >= 0, got {index}")
        return self.prompts.engine_prompt(index % len(self.prompts))

    def request(self, index: int) -> BeamSearchRequest | ScoreRequest:
        s = self.shape
        if s.kind == "beam_search":
            i = index % len(self.prompts)
            banned = tuple(int(x) for x in self.prompts.seen[i]) if (s.constrained and self.prompts.seen) else ()
            return BeamSearchRequest(prompt=self.prompt(index), beam_width=s.beam_width, max_new_tokens=s.max_new_tokens,
                                     constrained=s.constrained, banned_items=banned, request_id=f"r{index}")  # fmt: skip
        return ScoreRequest(prompt=self.prompt(index), candidates=self.candidates(index), request_id=f"r{index}")
