"""`POST /v1/score` is SGLang 0.5.23's: its request and answer models, and its semantics, on a real
`workbench serve` process (torch engine, tiny random soft-token checkpoint, word-level tokenizer).

- The models: SGLang's own `ScoringRequest` / `ScoringResponse` / `UsageInfo`, loaded at test time from the
  sglang 0.5.23 wheel that `make test` fetches (tests/sglang_wheel.py executes those classes from the wheel's
  protocol.py, checked against the wheel's RECORD; no copy of SGLang's code lives in this repo). Every body
  of `OK_BODIES` is a valid `ScoringRequest`, and every answer is exactly a `ScoringResponse` dump:
  validated and dumped again, it comes back unchanged (every field, nulls included). Without the wheel the
  two schema tests skip, saying how to get it, and the other tests check the numbers and rules only.
- The numbers, against the engine's own forward (`prompt_logits` of the whole `query + item`
  sequence, not the scoring path the server uses): `apply_softmax` false gives exp(log-prob)
  (SGLang's `_convert_logprobs_to_scores`), true a softmax over the labels at `temperature`;
  `item_first` scores `item + query`; text is the tokenizer's encoding of `f"{query}{item}"`.
- SGLang's rules: `items: []` -> empty `scores`; no `label_token_ids` -> 400 with SGLang's message;
  `usage` counts every `query + item` sequence; label lists per item; its refusals (duplicates,
  temperature without softmax, text mixed with ids); the workbench's sequence mode lives on
  `/v1/score_sequences` and a `mode` on `/v1/score` is refused.

Fault injection (done once while writing this, then reverted): `label_scores` returning the log-probs
for `apply_softmax` false failed 6 tests (every exp comparison; the schema rows still passed, as log-probs
are floats too); `sequences` ignoring `item_first` failed the item-first test; `item_first: bool = True`
in the then-vendored copy failed the wheel comparison and the defaults test; with the models loaded from the
wheel, `item_first` defaulting to True in `ScoreBody` failed the defaults test.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import sglang_wheel  # noqa: E402
from workbench.engines.base import Prompt, ScoreRequest  # noqa: E402
from workbench.engines.remote.launcher import launch, workbench_serve_spec  # noqa: E402
from workbench.engines.registry import create_engine  # noqa: E402
from workbench.engines.serving.sglang_api import ScoreBody  # noqa: E402
from workbench.testing import make_random_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(300)

# SGLang's scoring models from the wheel (None without it: the schema checks then skip, saying so)
sgl = sglang_wheel.scoring_models() if sglang_wheel.wheel_path() else None
# protocol.py's sha256 in the 0.5.23 wheel's RECORD (urlsafe base64): a different file is a different contract
PROTOCOL_SHA256 = "fiHUglEm07yTt-q6glByY9ABdh-sImzLHRYXtfcrgjU"
QUERY, ITEMS, LABELS = [5, 6, 7], [[8, 9], [10], [11, 12, 13]], [3, 4, 121]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(url, in-process engine on the same checkpoint: references and the tokenizer)."""
    d = tmp_path_factory.mktemp("sglang_score")
    ck = make_random_checkpoint(d / "ck", hidden_size=32, n_items=40, levels=(4, 4), vocab_base=120,
                                max_position_embeddings=128, seed=7)
    spec = workbench_serve_spec(ck, threads=1)
    engine = create_engine("torch", ck)
    try:
        with launch(spec, log_path=d / "server.log") as server:
            yield server.url, engine
    finally:
        asyncio.run(engine.close())


def post(url: str, body: dict, path: str = "/v1/score") -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=60)


def ok(url: str, body: dict) -> dict:
    """A 200 whose answer is exactly an SGLang `ScoringResponse` (and whose request is an SGLang one) when the
    wheel is here."""
    if sgl is not None:
        sgl.ScoringRequest.model_validate(body)
    r = post(url, body)
    assert r.status_code == 200, r.text[:500]
    d = r.json()
    if sgl is not None:
        assert sgl.ScoringResponse.model_validate(d).model_dump(mode="json") == d
    return d


def ref_logprobs(engine, seq: list[int], labels: list[int], vec=None, pos=None) -> np.ndarray:
    """The label tokens' log-probs after `seq`, from one forward of the whole sequence."""
    import torch

    logits = engine.prompt_logits(Prompt.of(seq, vec, pos))[-1].double()
    return torch.log_softmax(logits, -1)[labels].numpy()


def error(r: httpx.Response, status: int, phrase: str) -> None:
    assert r.status_code == status, (r.status_code, r.text[:500])
    e = r.json()
    assert set(e) == {"error"} and set(e["error"]) == {"message", "type", "code"} and e["error"]["code"] == status
    assert phrase in e["error"]["message"], e["error"]["message"]


# ---- the models -------------------------------------------------------------------------------------------


def test_models_are_the_wheels():
    """The scoring models are executed from the pinned wheel's protocol.py (the file its RECORD lists, with the
    digest pinned here), not from a copy."""
    sglang_wheel.require_wheel()
    src = sglang_wheel.source(sglang_wheel.PROTOCOL)  # raises unless the file matches the wheel's RECORD
    assert sglang_wheel._record()[sglang_wheel.PROTOCOL] == PROTOCOL_SHA256
    for cls in (sgl.ScoringRequest, sgl.ScoringResponse, sgl.UsageInfo, sgl.ErrorResponse):
        assert cls.__module__ == sgl.__name__ and f"class {cls.__name__}(BaseModel):" in src
    assert sgl.__file__.endswith("!/" + sglang_wheel.PROTOCOL)


def test_request_fields_are_sglangs_plus_the_soft_token():
    """Every field of SGLang's ScoringRequest is a field here, with SGLang's default (model aside: the
    answer names the served model when none is asked for); the only others are the workbench's."""
    sglang_wheel.require_wheel()
    theirs, ours = sgl.ScoringRequest.model_fields, ScoreBody.model_fields
    assert set(ours) - set(theirs) == {"user_vector", "placeholder_pos", "mode"}
    assert set(theirs) <= set(ours)
    for name, f in theirs.items():
        if name != "model":
            assert ours[name].get_default(call_default_factory=True) == f.get_default(call_default_factory=True), name
    assert ours["temperature"].metadata == theirs["temperature"].metadata  # gt=0, allow_inf_nan=False


OK_BODIES = [
    ("ids", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS}),
    ("softmax", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "apply_softmax": True}),
    ("temperature", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "apply_softmax": True,
                     "temperature": 0.5}),
    ("token-logprobs", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "return_token_logprobs": True}),
    ("item-first", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "item_first": True}),
    ("text", {"query": "w5 w6 w7", "items": [" w8 w9", " w10"], "label_token_ids": LABELS}),
    ("text-one-item", {"query": "w5 w6 w7", "items": " w8", "label_token_ids": LABELS}),
    ("text-item-first", {"query": "w5 w6 w7", "items": ["w8 w9 ", "w10 "], "label_token_ids": LABELS,
                         "item_first": True}),
    ("no-query", {"items": [[8, 9], [11, 12, 13]], "label_token_ids": LABELS}),
    ("empty-item", {"query": QUERY, "items": [[], [8]], "label_token_ids": LABELS}),
    ("labels-per-item", {"query": QUERY, "items": ITEMS, "label_token_ids": [[3], [4, 3], [121, 5, 6]]}),
    ("no-items", {"query": QUERY, "items": [], "label_token_ids": LABELS}),
    ("no-items-no-labels-list", {"items": [], "label_token_ids": [], "return_token_logprobs": True}),
    ("model", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "model": "mine"}),
    ("override-id-alone", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "embed_override_token_id": 7}),
    ("unknown-keys", {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "stream": False}),
]


@pytest.mark.parametrize("body", [b for _, b in OK_BODIES], ids=[n for n, _ in OK_BODIES])
def test_every_answer_is_an_sglang_scoring_response(served, body):
    sglang_wheel.require_wheel()
    d = ok(served[0], body)
    n_items = 1 if isinstance(body["items"], str) else len(body["items"])
    assert len(d["scores"]) == n_items and d["object"] == "scoring" and d["pooled_hidden_states"] is None
    assert (d["token_logprobs"] is None) != bool(body.get("return_token_logprobs"))
    served_name = httpx.get(served[0] + "/health").json()["model"]
    assert d["model"] == body.get("model", served_name)  # SGLang echoes the request's ("default" when absent)
    assert d["usage"]["total_tokens"] == d["usage"]["prompt_tokens"] and d["usage"]["completion_tokens"] == 0


# ---- the numbers --------------------------------------------------------------------------------------------


def test_apply_softmax_false_is_exp_of_the_label_logprobs(served):
    """SGLang returns each label's probability (exp of its log-prob over the whole vocabulary), not a
    log-prob and not renormalised over the labels; `token_logprobs` are the log-probs themselves."""
    url, engine = served
    d = ok(url, {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "return_token_logprobs": True})
    (own,) = asyncio.run(engine.score([ScoreRequest(Prompt.of(QUERY), tuple(map(tuple, ITEMS)), "label",
                                                    tuple(LABELS))]))
    ref = np.array([ref_logprobs(engine, QUERY + it, LABELS) for it in ITEMS])
    scores, logps = np.array(d["scores"]), np.array(d["token_logprobs"])
    assert np.allclose(logps, own.scores, atol=1e-5) and np.allclose(logps, ref, atol=1e-4)
    assert np.allclose(scores, np.exp(logps), rtol=1e-12, atol=0)
    assert np.allclose(scores, np.exp(ref), rtol=1e-4, atol=1e-7)
    assert (scores > 0).all() and (scores.sum(1) < 1 - 1e-3).all()  # probabilities of 3 of 147 tokens


@pytest.mark.parametrize("temperature", [1.0, 0.5, 3.0])
def test_apply_softmax_true_is_a_softmax_over_the_labels(served, temperature):
    url, engine = served
    d = ok(url, {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "apply_softmax": True,
                 "temperature": temperature})
    ref = np.array([ref_logprobs(engine, QUERY + it, LABELS) for it in ITEMS]) / temperature
    want = np.exp(ref - ref.max(1, keepdims=True))
    assert np.allclose(d["scores"], want / want.sum(1, keepdims=True), atol=1e-4)
    assert np.allclose(np.sum(d["scores"], 1), 1.0, atol=1e-12)


def test_item_first_scores_item_then_query(served):
    url, engine = served
    d = ok(url, {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "item_first": True})
    ref = np.array([ref_logprobs(engine, it + QUERY, LABELS) for it in ITEMS])
    assert np.allclose(d["scores"], np.exp(ref), rtol=1e-4, atol=1e-7)
    plain = ok(url, {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS})["scores"]
    assert not np.allclose(d["scores"], plain, rtol=1e-2)  # the model reads the order
    assert d["usage"]["prompt_tokens"] == sum(len(QUERY) + len(it) for it in ITEMS)


@pytest.mark.parametrize("item_first", [False, True])
def test_text_is_the_tokenized_concatenation(served, item_first):
    """`f"{query}{item}"` (or item first) through the checkpoint's tokenizer: the same numbers as its ids."""
    url, engine = served
    tok = engine.checkpoint.tokenizer
    query, items = "w5 w6 <|user|> w7", ([" w8 w9", " <a_1><b_2>"] if not item_first else ["w8 w9 ", "<a_1><b_2> "])
    vec = np.linspace(-1, 1, engine.limits.user_vector_dim).round(6).tolist()
    body = {"query": query, "items": items, "label_token_ids": LABELS, "item_first": item_first}
    if item_first:
        body["query"] = "w5 w6 w7"
    else:
        body["user_vector"] = vec  # the placeholder is found in the text's tokens
    d = ok(url, body)
    seqs = [tok(f"{it}{body['query']}" if item_first else f"{body['query']}{it}")["input_ids"] for it in items]
    assert all(0 not in s for s in seqs)  # no [UNK]: the text is the words and tokens it means
    ph = engine.limits.placeholder_id
    ref = np.array([ref_logprobs(engine, s, LABELS, *((vec, s.index(ph)) if ph in s else ())) for s in seqs])
    assert np.allclose(d["scores"], np.exp(ref), rtol=1e-4, atol=1e-7)
    assert d["usage"]["prompt_tokens"] == sum(map(len, seqs))
    if not item_first:
        ids = ok(url, {"query": seqs[0][:4], "items": [s[4:] for s in seqs], "label_token_ids": LABELS,
                       "user_vector": vec, "placeholder_pos": 2})
        assert ids["scores"] == d["scores"]


def test_soft_token_placeholder_found_when_omitted(served):
    url, engine = served
    ph, dim = engine.limits.placeholder_id, engine.limits.user_vector_dim
    vec = np.linspace(1, -1, dim).round(6).tolist()
    query = [5, ph, 7]
    body = {"query": query, "items": ITEMS, "label_token_ids": LABELS, "user_vector": vec}
    found, given = ok(url, body), ok(url, {**body, "placeholder_pos": 1})
    assert found["scores"] == given["scores"]
    ref = np.array([ref_logprobs(engine, query + it, LABELS, vec, 1) for it in ITEMS])
    assert np.allclose(found["scores"], np.exp(ref), rtol=1e-4, atol=1e-7)
    plain = ok(url, {"query": [5, 6, 7], "items": ITEMS, "label_token_ids": LABELS})
    assert not np.allclose(found["scores"], plain["scores"], rtol=1e-2)


def test_empty_items_answer_empty_scores(served):
    d = ok(served[0], {"query": QUERY, "items": [], "label_token_ids": LABELS, "return_token_logprobs": True})
    assert d["scores"] == [] and d["token_logprobs"] == [] and d["usage"]["prompt_tokens"] == 0


def test_usage_counts_every_query_item_sequence(served):
    d = ok(served[0], {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS})
    n = sum(len(QUERY) + len(it) for it in ITEMS)
    assert d["usage"] == {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0,
                          "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}


def test_labels_per_item_and_edge_sequences(served):
    url, engine = served
    per = [[3], [4, 3], [121, 5, 6]]
    d = ok(url, {"query": QUERY, "items": ITEMS, "label_token_ids": per, "return_token_logprobs": True})
    for it, lab, row in zip(ITEMS, per, d["token_logprobs"]):
        assert np.allclose(row, ref_logprobs(engine, QUERY + it, lab), atol=1e-4)
    # no query: each item alone; an empty item: the label tokens right after the query
    d = ok(url, {"items": ITEMS[2:], "label_token_ids": LABELS})
    assert np.allclose(d["scores"], [np.exp(ref_logprobs(engine, ITEMS[2], LABELS))], rtol=1e-4, atol=1e-7)
    d = ok(url, {"query": QUERY, "items": [[], [8]], "label_token_ids": LABELS})
    assert np.allclose(d["scores"], np.exp([ref_logprobs(engine, QUERY, LABELS),
                                            ref_logprobs(engine, QUERY + [8], LABELS)]), rtol=1e-4, atol=1e-7)


# ---- SGLang's refusals, and the workbench's ----------------------------------------------------------------

BASE = {"query": QUERY, "items": ITEMS, "label_token_ids": LABELS}
REFUSED = [
    # (id, body, status, key phrase): SGLang's messages where SGLang refuses
    ("no-labels", {"query": QUERY, "items": ITEMS}, 400,
     "label_token_ids is required for generation (CausalLM) models"),
    ("no-labels-no-items", {"items": []}, 400, "label_token_ids is required"),
    ("no-items", {"query": QUERY, "label_token_ids": LABELS}, 400, "items must be provided"),
    ("empty-labels", {**BASE, "label_token_ids": []}, 400, "label_token_ids must be a nonempty list"),
    ("labels-per-item-count", {**BASE, "label_token_ids": [[3], [4]]}, 400, "one list per item"),
    ("empty-label-list", {**BASE, "label_token_ids": [[3], [], [4]]}, 400, "nonempty candidate list"),
    ("negative-label", {**BASE, "label_token_ids": [3, -1]}, 400, "nonnegative integers"),
    ("duplicate-labels", {**BASE, "label_token_ids": [3, 3]}, 400, "must not contain duplicate tokens"),
    ("oov-label", {**BASE, "label_token_ids": [10**6]}, 400, "Token ID 1000000 is out of vocabulary (vocab size:"),
    ("temperature-without-softmax", {**BASE, "temperature": 0.5}, 400, "temperature requires apply_softmax=True"),
    ("temperature-zero", {**BASE, "apply_softmax": True, "temperature": 0}, 422, "greater than 0"),
    ("text-query-id-items", {**BASE, "query": "w5 w6"}, 400, "Invalid combination of query/items types"),
    ("id-query-text-items", {**BASE, "items": ["w8"]}, 400, "Invalid combination of query/items types"),
    ("mixed-items", {**BASE, "items": ["w8", [9]]}, 422, "items.1: Input should be a valid string"),
    ("bool-in-items", {**BASE, "items": [[8, True]]}, 422, "items.0.1: Input should be a valid integer"),
    ("pooled-hidden-states", {**BASE, "return_pooled_hidden_states": True}, 400, "not supported for CausalLM models"),
    ("embed-overrides", {**BASE, "embed_override_token_id": 7, "query_embed_overrides": [[0.0] * 32]}, 400,
     "send user_vector"),
    ("score-extraction", {**BASE, "score_extraction_token": "w9"}, 400, "score_extraction_token is not supported"),
    ("vector-item-first", lambda c: {**BASE, "query": [5, c["ph"]], "user_vector": [0.1] * c["dim"],
                                     "item_first": True}, 400, "item_first is not supported when embeddings"),
    ("mode-sequence", {**BASE, "mode": "sequence"}, 400, "POST /v1/score_sequences"),
    ("mode-label", {**BASE, "mode": "label"}, 400, "`mode` is not a field of SGLang's /v1/score"),
    ("one-token-sequence", {"items": [[8, 9], [10]], "label_token_ids": LABELS}, 400,
     "items[1]: its query + item sequence has 1 token(s)"),
    ("too-many-items", {**BASE, "items": [[8]] * 1025, "item_first": True}, 400, "exceed the engine limit of 1024"),
]


@pytest.mark.parametrize("row", REFUSED, ids=[r[0] for r in REFUSED])
def test_refusals(served, row):
    url, engine = served
    _, body, status, phrase = row
    ctx = {"ph": engine.limits.placeholder_id, "dim": engine.limits.user_vector_dim}
    error(post(url, body(ctx) if callable(body) else body), status, phrase)


def test_sequence_scores_live_on_their_own_route(served):
    """The workbench's sum of item-token log-probs: `/v1/score_sequences`, never SGLang's route."""
    url, engine = served
    r = post(url, {"query": QUERY, "items": ITEMS}, "/v1/score_sequences")
    assert r.status_code == 200, r.text[:300]
    d = r.json()
    (own,) = asyncio.run(engine.score([ScoreRequest(Prompt.of(QUERY), tuple(map(tuple, ITEMS)))]))
    assert np.allclose(d["scores"], own.scores, atol=1e-5) and d["object"] == "workbench.sequence_scores"
    ref = [sum(ref_logprobs(engine, QUERY + it[:j], [t])[0] for j, t in enumerate(it)) for it in ITEMS]
    assert np.allclose(d["scores"], ref, atol=1e-4)
    assert d["usage"] == {"prompt_tokens": 3, "item_tokens": 6, "total_tokens": 9}
    error(post(url, {"query": QUERY, "items": ITEMS, "mode": "label"}, "/v1/score_sequences"), 400, "has no `mode`")
    assert math.isfinite(sum(d["scores"]))
