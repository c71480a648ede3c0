"""Shared client side of the HTTP engine adapters (vLLM, SGLang, TensorRT-LLM).

An external engine runs in its own environment behind its own HTTP server; the adapter in the
workbench process keeps only what the server cannot: the checkpoint's token layout and limits, the
catalog's prefix trie, the embedding table + projector for soft-token prompts built client-side,
the HTTP client (one per event loop, with a concurrency cap), and a client-side beam loop for
engines whose own beam search cannot take the trie constraint or prompt embeddings. Every failure
ends up in the request's result (`success=False`), never as an exception out of a batch.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from workbench.engines.base import (
    Beam,
    BeamSearchRequest,
    BeamSearchResult,
    EngineUnavailable,
    Limits,
    RequestError,
    ScoreRequest,
    ScoreResult,
    Timings,
    validate_beam_request,
    validate_score_request,
)


@dataclass
class TransportStats:
    """Client-side cost of shipping prompt embeddings (soft token) to the server."""

    requests: int = 0
    encode_s: float = 0.0
    bytes: int = 0

    def add(self, encode_s: float, n_bytes: int) -> None:
        self.requests += 1
        self.encode_s += encode_s
        self.bytes += n_bytes


@dataclass
class CheckpointInfo:
    """What the client needs from a checkpoint without loading the model."""

    path: Path
    vocab_size: int
    hidden_size: int
    max_positions: int
    meta: Any  # CheckpointMeta
    extra: dict = field(default_factory=dict)

    @classmethod
    def read(cls, path) -> "CheckpointInfo":
        from workbench.model.checkpoint import read_meta

        path = Path(path)
        cfg = json.loads((path / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        return cls(path, int(cfg["vocab_size"]), int(cfg["hidden_size"]),
                   int(cfg.get("max_position_embeddings", 2048)), read_meta(path))

    def limits(self, **kw) -> Limits:
        return Limits(max_prompt_tokens=self.max_positions, vocab_size=self.vocab_size,
                      user_vector_dim=self.meta.user_vector_dim, placeholder_id=self.meta.layout.placeholder_id, **kw)


class PromptEmbedder:
    """Builds [T, hidden] prompt embeddings client-side: embedding rows, placeholder <- projector(vec)."""

    def __init__(self, checkpoint: Path):
        self.checkpoint = Path(checkpoint)
        self._table = None
        self._projector = None

    def _load(self):
        import torch
        from safetensors import safe_open

        from workbench.model.checkpoint import load_projector

        files = sorted(self.checkpoint.glob("*.safetensors"))
        for f in files:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    if key.endswith("embed_tokens.weight"):
                        self._table = st.get_tensor(key).to(torch.float32)  # [vocab, hidden]
                        break
            if self._table is not None:
                break
        if self._table is None:
            raise EngineUnavailable(f"no '*embed_tokens.weight' tensor in {self.checkpoint}/*.safetensors")
        self._projector = load_projector(self.checkpoint)

    def embed(self, token_ids: Sequence[int], user_vector=None, placeholder_pos: int | None = None):
        import torch

        if self._table is None:
            self._load()
        emb = self._table[torch.as_tensor(list(token_ids), dtype=torch.long)].clone()  # [T, hidden]
        if user_vector is not None:
            if self._projector is None:
                raise RequestError("this checkpoint has no soft-token projector; send the prompt without a user vector")
            with torch.no_grad():
                vec = torch.as_tensor(user_vector, dtype=torch.float32).reshape(1, -1)
                emb[placeholder_pos] = self._projector(vec)[0].to(emb.dtype)
        return emb

    @staticmethod
    def encode(emb) -> str:
        import torch

        buf = io.BytesIO()
        torch.save(emb.contiguous(), buf)
        return base64.b64encode(buf.getvalue()).decode("ascii")


MAX_LOGPROB_TOKEN_IDS = 128  # vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS in vLLM 0.32.0
# Idle keep-alive connections are dropped by the client after this many seconds. uvicorn (vLLM's
# OpenAI server and `workbench serve`) closes them after 5 s, and httpx's default is also 5 s: a request
# written onto a connection the server is closing at that moment fails with ReadError (a 2-core CPU run
# saw 1 of 1212 torch and 1 of 123 vLLM scoring requests fail so; the cause is inferred, not reproduced).
# Expiring first avoids the race.
KEEPALIVE_EXPIRY_S = 2.0


def token_id_of(key: str) -> int:
    """Token id of a `return_tokens_as_token_ids` log-prob key ("token_id:123" -> 123)."""
    return int(key.rsplit(":", 1)[-1])


class HTTPEngineBase:
    """Common plumbing; subclasses set the class attributes below, build request bodies and parse answers.

    Every subclass implements `_beams(request) -> [Beam]` and `_scores(request) -> scores` for one
    request each; `beam_search` and `score` run them concurrently, wrap each in its result with
    timings, and record any failure in that result (never raised). A subclass that uses
    `_beam_emulated` implements `_next_logprobs(request, prefix, allowed, k)`: raw next-token log-probs
    after prompt+prefix, for the `allowed` ids or the top `k`.
    """

    name = "http"
    server_key = ""  # launcher's name for the server (`find_executable`, `HOW_TO_BUILD`, `server_spec`)
    missing_hint = ""  # check_available's first words when the server environment is absent
    server_label = ""  # what check_available reports as found, e.g. "trtllm-serve"
    served_model_name: str | None = None  # the name a launched server serves; None: ask /v1/models

    @classmethod
    def check_available(cls) -> tuple[bool, str]:
        from workbench.engines.remote import launcher

        exe = launcher.find_executable(cls.server_key)
        if exe is None:
            return False, f"{cls.missing_hint}; {launcher.HOW_TO_BUILD[cls.server_key]}"
        return True, f"{cls.server_label} from {exe}"

    def _init_common(self, checkpoint, dtype: str, url: str | None, request_timeout_s: float, max_concurrency: int,
                     limit_kw: dict) -> None:
        self.info = CheckpointInfo.read(checkpoint)
        self.checkpoint = self.info.path
        self.dtype = dtype
        self.limits = self.info.limits(**limit_kw)
        self.embedder = PromptEmbedder(self.checkpoint)
        self.transport = TransportStats()
        self.request_timeout_s = request_timeout_s
        self._sem_size = max_concurrency
        self._stack = contextlib.ExitStack()
        self.server = None
        self.url = url.rstrip("/") if url else None
        self.model_name: str | None = None
        self._clients: dict[int, Any] = {}  # id(event loop) -> (httpx.AsyncClient, Semaphore, loop)
        self._trie = None
        self._catalog = None

    def _launch_or_connect(self, url: str | None, server_options: dict | None, log_path=None) -> bool:
        """Launch this engine's server (`server_key`) unless `url` names a running one; True if launched."""
        if url is not None:
            return False
        from workbench.engines.remote import launcher

        spec = launcher.server_spec(self.server_key, self.checkpoint, self.dtype, **(server_options or {}))
        self.server = self._start_server(spec, log_path)
        self.url = self.server.url
        self.model_name = self.served_model_name
        return True

    def _start_server(self, spec, log_path=None):
        """Start `spec` on this engine's exit stack (stopped by `close`); a failed start stops the others."""
        from workbench.engines.remote import launcher

        try:
            return self._stack.enter_context(launcher.launch(spec, log_path=log_path))
        except BaseException:
            self._stack.close()
            raise

    def transport_stats(self) -> TransportStats:
        return self.transport

    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]:
        return list(await asyncio.gather(*(self._beam_one(r) for r in requests)))

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        return list(await asyncio.gather(*(self._score_one(r) for r in requests)))

    async def _beam_one(self, r: BeamSearchRequest) -> BeamSearchResult:
        res = BeamSearchResult(request_id=r.request_id, timings=Timings.start(), prompt_tokens=len(r.prompt))
        try:
            self.validate_beam(r)
            res.beams = await self._beams(r)
        except Exception as e:  # noqa: BLE001 - recorded in the result, never raised
            res.success, res.error = False, f"{type(e).__name__}: {e}"
        res.timings.finish()
        return res

    async def _score_one(self, r: ScoreRequest) -> ScoreResult:
        res = ScoreResult(request_id=r.request_id, timings=Timings.start(), prompt_tokens=len(r.prompt))
        try:
            validate_score_request(r, self.limits)
            res.scores = await self._scores(r)
        except Exception as e:  # noqa: BLE001 - recorded in the result, never raised
            res.success, res.error = False, f"{type(e).__name__}: {e}"
        res.timings.finish()
        return res

    def _client(self):
        import httpx

        loop = asyncio.get_running_loop()
        key = id(loop)
        entry = self._clients.get(key)
        if entry is None or entry[2] is not loop:
            limits = httpx.Limits(max_connections=self._sem_size, max_keepalive_connections=self._sem_size,
                                  keepalive_expiry=KEEPALIVE_EXPIRY_S)
            entry = (httpx.AsyncClient(base_url=self.url, timeout=self.request_timeout_s, limits=limits),
                     asyncio.Semaphore(self._sem_size), loop)
            self._clients[key] = entry
        return entry[0], entry[1]

    async def _model(self) -> str:
        if self.model_name is None:
            client, _ = self._client()
            r = await client.get("/v1/models")
            r.raise_for_status()
            self.model_name = r.json()["data"][0]["id"]
        return self.model_name

    async def _post(self, path: str, body: dict, with_model: bool = True) -> dict:
        import httpx

        client, sem = self._client()
        if with_model:
            body = {"model": await self._model(), **body}
        async with sem:
            try:
                r = await client.post(path, json=body)
            except httpx.HTTPError as e:
                raise ConnectionError(f"{self.name} server at {self.url} did not answer {path}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            try:
                detail = r.json()
                detail = detail.get("error", detail)
                detail = detail.get("message", detail) if isinstance(detail, dict) else detail
            except ValueError:
                detail = r.text[:500]
            raise RuntimeError(f"{self.name} {path} answered HTTP {r.status_code}: {detail}")
        return r.json()

    def _get_trie(self):
        if self._trie is None:
            import numpy as np

            from workbench.model.checkpoint import CATALOG_FILE
            from workbench.sids.layout import Catalog

            self._catalog = Catalog(np.load(self.checkpoint / CATALOG_FILE)["item_codes"], self.info.meta.layout)
            self._trie = self._catalog.trie()
        return self._trie

    def validate_beam(self, r: BeamSearchRequest) -> None:
        """The contract's checks plus the catalog's (same rules as the torch engine)."""
        validate_beam_request(r, self.limits)
        if r.constrained:
            trie = self._get_trie()
            if r.max_new_tokens > trie.depth:
                raise RequestError(f"constrained beam search generates one item SID of {trie.depth} tokens; "
                                   f"set max_new_tokens <= {trie.depth}")
            bad = [i for i in r.banned_items if not 0 <= int(i) < trie.n_items]
            if bad:
                raise RequestError(f"banned_items outside the catalog [0, {trie.n_items}): {bad[:5]}")
        elif r.banned_items:
            raise RequestError("banned_items only apply to constrained beam search; set constrained=True")

    async def _beam_emulated(self, r: BeamSearchRequest) -> list[Beam]:
        """Client-side beam search: per step, one-token requests for every live beam, top-k kept."""
        import torch

        trie = self._get_trie() if r.constrained else None
        banned = [list(r.banned_items)] if r.banned_items else None
        beams: list[tuple[list[int], float]] = [([], 0.0)]
        for step in range(r.max_new_tokens):
            allowed_per_beam: list[list[int] | None] = []
            for toks, _ in beams:
                if trie is not None and step < trie.depth:
                    mask = trie.allowed_mask(torch.as_tensor([toks], dtype=torch.long).reshape(1, step), banned=banned)
                    allowed_per_beam.append(torch.nonzero(mask[0]).flatten().tolist())
                else:
                    allowed_per_beam.append(None)
            lps = await asyncio.gather(*(self._next_logprobs(r, toks, allowed, r.beam_width)
                                         for (toks, _), allowed in zip(beams, allowed_per_beam)))
            cands = [(cum + lp, toks + [tok]) for (toks, cum), d in zip(beams, lps) for tok, lp in d.items()]
            if not cands:
                raise RuntimeError(f"no allowed continuation at step {step} (every item banned?)")
            cands.sort(key=lambda c: -c[0])
            beams = [(toks, cum) for cum, toks in cands[: r.beam_width]]
        return [Beam(toks, float(cum)) for toks, cum in beams]

    async def close(self) -> None:
        for client, _, loop in list(self._clients.values()):
            if loop is asyncio.get_running_loop():
                await client.aclose()
        self._clients.clear()
        self._stack.close()

    def close_sync(self) -> None:
        """Stop a launched server from synchronous code (fixtures, atexit)."""
        self._clients.clear()
        self._stack.close()
