"""An Engine-protocol client for `workbench serve` (the torch or hf engine behind HTTP).

Load tests drive every engine over HTTP, from the client side, so that the workbench's own engine
is measured like vLLM, SGLang and TensorRT-LLM (serialization, the event loop and the network stack
included). Requests go out concurrently (one HTTP call each); an HTTP error becomes a failed
result carrying the server's message, never an exception.
"""

from __future__ import annotations

import asyncio
from typing import Sequence

from workbench.engines.base import (
    Beam,
    BeamSearchRequest,
    BeamSearchResult,
    Capabilities,
    FeatureSupport,
    ScoreRequest,
    ScoreResult,
    Support,
    Timings,
)


class HTTPEngine:
    """Client for a `workbench serve` endpoint at `base_url` (e.g. http://127.0.0.1:8100)."""

    def __init__(self, base_url: str, name: str = "torch-http", timeout_s: float = 600.0, max_connections: int = 256):
        import httpx

        self.name = name
        self.base_url = base_url.rstrip("/")
        from workbench.engines.remote.http_common import KEEPALIVE_EXPIRY_S

        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                              keepalive_expiry=KEEPALIVE_EXPIRY_S)  # shorter than the server's: see there
        self._client = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, limits=limits)
        self._caps: Capabilities | None = None

    async def health(self) -> dict:
        r = await self._client.get("/health")
        r.raise_for_status()
        return r.json()

    async def fetch_capabilities(self) -> Capabilities:
        r = await self._client.get("/v1/capabilities")
        r.raise_for_status()
        d = r.json()
        self._caps = Capabilities(engine=self.name, features={
            k: FeatureSupport(Support(v["status"]), v["reason"]) for k, v in d["features"].items()})
        return self._caps

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            raise RuntimeError("call `await engine.fetch_capabilities()` first (capabilities come from the server)")
        return self._caps

    async def beam_search(self, requests: Sequence[BeamSearchRequest]) -> list[BeamSearchResult]:
        return list(await asyncio.gather(*(self._beam_one(r) for r in requests)))

    async def score(self, requests: Sequence[ScoreRequest]) -> list[ScoreResult]:
        return list(await asyncio.gather(*(self._score_one(r) for r in requests)))

    async def close(self) -> None:
        await self._client.aclose()

    @staticmethod
    def _soft_fields(p) -> dict:
        if not p.is_soft:
            return {}
        return {"user_vector": list(p.user_vector), "placeholder_pos": p.placeholder_pos}

    async def _post(self, path: str, body: dict):
        """(json, error message or None)."""
        import httpx

        try:
            r = await self._client.post(path, json=body)
        except httpx.HTTPError as e:
            return None, f"HTTP transport error: {type(e).__name__}: {e}"
        if r.status_code != 200:
            try:
                msg = r.json()["error"]["message"]
            except Exception:  # noqa: BLE001 - a non-JSON error body
                msg = r.text[:500]
            return None, f"HTTP {r.status_code}: {msg}"
        return r.json(), None

    async def _beam_one(self, r: BeamSearchRequest) -> BeamSearchResult:
        t = Timings.start()
        body = {"prompt": list(r.prompt.token_ids), "n": r.beam_width, "max_tokens": r.max_new_tokens,
                "use_beam_search": True, "constrained": r.constrained, "banned_items": list(r.banned_items),
                **self._soft_fields(r.prompt)}
        d, err = await self._post("/v1/completions", body)
        t.finish()
        if err:
            return BeamSearchResult(r.request_id, success=False, error=err, timings=t, prompt_tokens=len(r.prompt))
        beams = [Beam(list(c["token_ids"]), float(c["cum_logprob"])) for c in d["choices"]]
        return BeamSearchResult(r.request_id, beams=beams, timings=t, prompt_tokens=len(r.prompt))

    async def _score_one(self, r: ScoreRequest) -> ScoreResult:
        """Mode "label": SGLang's `/v1/score`, reading its `token_logprobs` (the label log-probs themselves;
        `scores` holds their exp). Mode "sequence": the workbench's `/v1/score_sequences`."""
        t = Timings.start()
        body = {"query": list(r.prompt.token_ids), "items": [list(c) for c in r.candidates],
                **self._soft_fields(r.prompt)}
        if r.mode == "label":
            body |= {"label_token_ids": list(r.label_token_ids), "apply_softmax": False, "return_token_logprobs": True}
        d, err = await self._post("/v1/score" if r.mode == "label" else "/v1/score_sequences", body)
        t.finish()
        if err:
            return ScoreResult(r.request_id, success=False, error=err, timings=t, prompt_tokens=len(r.prompt))
        scores = d["token_logprobs"] if r.mode == "label" else d["scores"]
        return ScoreResult(r.request_id, scores=scores, timings=t, prompt_tokens=len(r.prompt))
