"""The SGLang adapter and launcher held to SGLang 0.5.23's own code, loaded from the pinned wheel.

SGLang cannot run here (CUDA only), so these tests check what can be checked without it, against the
wheel itself rather than a description of it (tests/sglang_wheel.py loads the pieces; without the wheel
every test here skips and says how to get it):

- every request body the adapter sends, on every path (native beam search, the client-side loop with
  top-k and with trie children, width 1, sequence and label scoring, soft-token generation and label
  scoring), is a valid `GenerateReqInput` (io_struct.py, unknown keys refused although the real server
  drops them silently), passes the server's `/generate` contract gate (api_types.py `GenerateRequest`,
  which refuses unknown `sampling_params` keys), has only `SamplingParams` keys, and never asks beam
  search for what `BeamCoordinator.validate_and_init` refuses; every `/v1/score` body is a
  `ScoringRequest` with no unknown key;
- the beam score conversion: `sequence_score` computed by the wheel's `BeamGroup.beam_score` (with the
  length penalty the coordinator uses) turns back into the float32 cumulative log-prob bit-exactly;
- a server that refuses native beam search (the wheel's message) makes the adapter fall back to the
  client-side loop and report why;
- every flag of the SGLang command line is one of the wheel's server args (bool flags without a value,
  values among the declared choices); `--disable-radix-cache` is there whenever input_embeds can be sent
  and MIS never runs in float32; and the adapter's launch choices end to end (adapter -> launcher ->
  a stand-in server configured from the command line, which refuses input_embeds without the flag with
  the wheel's message).

Fault injection (each done once while writing this, then reverted):
- `top_logprobs_num` misspelled `top_logprob_num` in `_next_logprobs`: the body test failed ("not a
  GenerateReqInput ... top_logprob_num Extra inputs are not permitted"; the real server would have
  dropped it and answered without top log-probs), and so did test_sglang_adapter_contract;
- `"beam_width"` misspelled `"beam_widht"` in `_beam_native`: the contract gate refused it ("unknown field
  `beam_widht`") in both files. (The first version of the refusal fallback took that 400 for a refusal of
  beam search, because the gate's message lists `beam_width` among the expected fields, and hid it behind
  the client-side loop; the fallback now matches only validate_and_init's own texts.)
- `--disable-radix-cache` dropped from launcher.sglang_spec: the command-line test failed, and the
  end-to-end launch test failed with SGLang's own refusal ("input_embeds is provided while
  disable_radix_cache is False ...");
- the float32 rounding dropped from `cum_logprob_from_score` (returning `score * length`): the
  conversion test failed (-15.285367012023924 vs the float32 -15.285367012023926 for length 29);
- label scores as `math.log` of `scores` instead of `token_logprobs`: test_sglang_adapter_contract failed
  (exact equality, and token 3's probability underflows to 0.0, so its log was -inf);
- the fallback removed from `_beams` (the refusal raised): the refusal test failed (no warning, the
  result an HTTP 400 error).
"""

from __future__ import annotations

import json
import random
import struct
import sys

import numpy as np
import pytest

import sglang_wheel as sw
from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest, Support

pytestmark = [pytest.mark.timeout(300), pytest.mark.contract_only]

# What validate_and_init (beam_search/coordinator.py) refuses in a beam request, by body / sampling_params key.
BEAM_REFUSED_KEYS = {"return_logprob", "return_hidden_states", "return_sampling_mask", "return_routed_experts",
                     "session_params", "lora_path"}
BEAM_REFUSED_SAMPLING = {"json_schema", "regex", "ebnf", "structural_tag", "stop", "stop_regex"}


@pytest.fixture(scope="module", autouse=True)
def wheel():
    return sw.require_wheel()


@pytest.fixture(scope="module")
def soft_ckpt(tmp_path_factory):
    from workbench.testing import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("sgl-wheel") / "soft", n_items=40, levels=(4, 4),
                                  hidden_size=32, num_layers=1, num_attention_heads=2, head_dim=16, vocab_base=50)


@pytest.fixture(scope="module")
def plain_ckpt(tmp_path_factory):
    from workbench.testing import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("sgl-wheel") / "plain", n_items=40, levels=(4, 4),
                                  hidden_size=32, num_layers=1, num_attention_heads=2, head_dim=16, vocab_base=50,
                                  soft_token=False)


@pytest.fixture(scope="module")
def big_vocab_ckpt(tmp_path_factory):
    """Vocabulary > 9999: the only kind MIS can embed its fixed delimiter placeholder in."""
    from workbench.testing import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("sgl-wheel") / "big", n_items=40, levels=(4, 4),
                                  hidden_size=16, num_layers=1, num_attention_heads=2, head_dim=8, vocab_base=10050,
                                  soft_token=False)


def _vocab(ck) -> int:
    return json.loads((ck / "config.json").read_text())["vocab_size"]


def _stand_in(ck, received, **kw):
    from test_gpu_adapters_contract import sglang_app
    from workbench.engines.remote.http_common import PromptEmbedder

    return sglang_app(received, _vocab(ck), table=PromptEmbedder(ck).embed(range(_vocab(ck))).numpy(), **kw)


# ---- the loader -----------------------------------------------------------------------------------------------


def test_models_come_from_the_wheel():
    """The classes are the wheel's (files checked against its RECORD), with the fields the adapter relies on."""
    m = sw.scoring_models()
    assert m.__file__.endswith("!/" + sw.PROTOCOL) and m.ScoringRequest.__module__ == m.__name__
    req = set(m.ScoringRequest.model_fields)
    assert {"query", "items", "label_token_ids", "apply_softmax", "item_first", "return_token_logprobs",
            "embed_override_token_id", "query_embed_overrides", "model"} <= req
    assert {"scores", "token_logprobs", "model", "usage", "object"} <= set(m.ScoringResponse.model_fields)
    gen, as_any = sw.generate_req_input()
    sent = {"input_ids", "input_embeds", "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num",
            "token_ids_logprob"}
    assert sent <= set(gen.model_fields)
    # the runtime types read as Any are not in the annotations of the fields the adapter sends
    fields = sw._class_fields(sw.IO_STRUCT, "GenerateReqInput")
    assert not [f for f in sent if any(name in fields[f] for name in as_any)], as_any
    assert {"beam_width", "n", "max_new_tokens", "ignore_eos", "temperature"} <= sw.sampling_params_fields()
    with pytest.raises(sw.api_types().JsonContractError, match="unknown field `beam_widht`"):
        sw.api_types().GenerateRequest.from_json_value({"input_ids": [1], "sampling_params": {"beam_widht": 2}})


# ---- every body the adapter sends ---------------------------------------------------------------------------------


def _check_generate(body: dict) -> list[str]:
    problems = []
    gate = sw.contract_error(body)
    if gate:
        problems.append(f"contract gate: {gate}")
    try:
        sw.generate_req_input()[0].model_validate(body)
    except Exception as e:  # noqa: BLE001 - reported with the body
        problems.append(f"not a GenerateReqInput: {e}")
    sp = body.get("sampling_params") or {}
    if set(sp) - sw.sampling_params_fields():
        problems.append(f"not SamplingParams keys: {sorted(set(sp) - sw.sampling_params_fields())}")
    if (sp.get("beam_width") or 1) > 1:
        bad = sorted(k for k in BEAM_REFUSED_KEYS if body.get(k)) + sorted(BEAM_REFUSED_SAMPLING & set(sp))
        if sp.get("min_new_tokens") or (sp.get("n") or 1) > sp["beam_width"] or "model" in body:
            bad.append("min_new_tokens / n > beam_width / model")
        if bad:
            problems.append(f"beam request with what validate_and_init refuses: {bad}")
    return problems


def _check_score(body: dict) -> list[str]:
    m = sw.scoring_models()
    problems = [f"unknown ScoringRequest keys {sorted(set(body) - set(m.ScoringRequest.model_fields))}"] \
        if set(body) - set(m.ScoringRequest.model_fields) else []
    try:
        m.ScoringRequest.model_validate(body)
    except Exception as e:  # noqa: BLE001 - reported with the body
        problems.append(f"not a ScoringRequest: {e}")
    return problems


async def test_every_body_the_adapter_sends_is_sglangs(soft_ckpt):
    from test_gpu_adapters_contract import StandIn
    from workbench.engines.remote.sglang import SGLangEngine

    received: list = []
    with StandIn(_stand_in(soft_ckpt, received)) as srv:
        eng = SGLangEngine(soft_ckpt, url=srv.url)
        loop = SGLangEngine(soft_ckpt, url=srv.url, native_beam_search=False)
        try:
            ph = eng.limits.placeholder_id
            p = Prompt.of([5, 6, 7, 8])
            sp = Prompt.of([5, ph, 7], user_vector=np.linspace(-1, 1, 16), placeholder_pos=1)
            cands = ((10, 11), (12,))
            results = [
                *await eng.beam_search([BeamSearchRequest(p, 3, 2), BeamSearchRequest(p, 1, 2),
                                        BeamSearchRequest(p, 2, 2, constrained=True), BeamSearchRequest(sp, 2, 2),
                                        BeamSearchRequest(sp, 2, 2, constrained=True)]),
                *await loop.beam_search([BeamSearchRequest(p, 2, 2), BeamSearchRequest(sp, 2, 1)]),
                *await eng.score([ScoreRequest(p, cands), ScoreRequest(p, cands, "label", (3, 4)),
                                  ScoreRequest(sp, cands, "label", (4, 4))]),
            ]
        finally:
            await eng.close()
            await loop.close()
    kinds = set()
    for path, body in received:
        problems = _check_generate(body) if path == "/generate" else _check_score(body)
        assert not problems, (path, body, problems)
        sp_ = body.get("sampling_params") or {}
        kinds.add((path, "beam_width" in sp_, "input_embeds" in body, "top_logprobs_num" in body,
                   "token_ids_logprob" in body, "embed_override_token_id" in body))
    # every path was taken: native beams (ids, embeds), the loop (top-k, trie children; ids, embeds),
    # sequence scoring, label scoring with and without the override
    assert {("/generate", True, False, False, False, False), ("/generate", True, True, False, False, False),
            ("/generate", False, False, True, False, False), ("/generate", False, False, False, True, False),
            ("/generate", False, True, True, False, False), ("/generate", False, True, False, True, False),
            ("/generate", False, False, False, False, False), ("/v1/score", False, False, False, False, False),
            ("/v1/score", False, False, False, False, True)} <= kinds, kinds
    assert all(r.success for r in results), [r.error for r in results if not r.success]


# ---- native beam search -------------------------------------------------------------------------------------------


def test_beam_score_conversion_is_exact():
    """SGLang returns cum_logprob / length (its BeamGroup.beam_score, run from the wheel); the adapter's inverse gives
    the float32 cumulative log-prob back bit-exactly, also through JSON."""
    from workbench.engines.remote.sglang import cum_logprob_from_score

    rng = random.Random(0)
    inexact = 0
    for _ in range(5000):
        cum = struct.unpack("f", struct.pack("f", -rng.uniform(0.0, 80.0)))[0]  # a float32, as on the device
        n = rng.randint(1, 64)
        score = json.loads(json.dumps(sw.beam_score(cum, n)))
        assert cum_logprob_from_score(score, n) == cum, (cum, n)
        inexact += score * n != cum
    assert inexact > 0  # the float32 rounding is needed, not decoration


async def test_refused_beam_search_falls_back_to_the_loop(plain_ckpt):
    from test_gpu_adapters_contract import StandIn
    from workbench.engines.remote.sglang import SGLangEngine

    refusal = sw.message(sw.BEAM_COORDINATOR, "Beam search currently requires --page-size 1")
    received: list = []
    app = _stand_in(plain_ckpt, received, refuse_beams=refusal)
    with StandIn(app) as srv:
        eng = SGLangEngine(plain_ckpt, url=srv.url)
        try:
            with pytest.warns(UserWarning, match="page-size"):
                res = (await eng.beam_search([BeamSearchRequest(Prompt.of([5, 6, 7]), 2, 2)]))[0]
            assert res.success, res.error
            assert [(b.token_ids, round(b.cum_logprob, 5)) for b in res.beams] == \
                [(t, round(c, 5)) for t, c in app.state.beam_search([5, 6, 7], 2, 2)]
            fs = eng.capabilities().features["beam_search_all_beams"]
            assert fs.status == Support.EMULATED and refusal in fs.reason
            received.clear()  # later requests go to the loop directly
            res = (await eng.beam_search([BeamSearchRequest(Prompt.of([5, 6]), 2, 1)]))[0]
            assert res.success and all("beam_width" not in b["sampling_params"] for _, b in received)
        finally:
            await eng.close()


# ---- the command line ---------------------------------------------------------------------------------------------


def _check_argv(argv: tuple[str, ...]) -> None:
    flags = sw.server_flags()
    i = list(argv).index("sglang.launch_server") + 1
    rest = list(argv[i:])
    while rest:
        flag = rest.pop(0)
        assert flag in flags, f"{flag} is not a server arg of sglang {sw.SGLANG_VERSION}"
        meta = flags[flag]
        if meta["bool"]:
            assert not rest or rest[0].startswith("--"), f"{flag} is store_true: no value"
            continue
        value = rest.pop(0)
        if meta["choices"] is not None:
            assert value in meta["choices"], f"{flag} {value} not in {meta['choices']}"


@pytest.mark.parametrize("case", [("soft", "float32", False), ("soft", "bfloat16", True), ("plain", "float32", False),
                                  ("plain", "float16", True), ("plain", "bfloat16", False)],
                         ids=lambda c: "-".join(map(str, c)))
def test_launcher_command_lines_are_sglang_server_args(case, soft_ckpt, plain_ckpt, monkeypatch):
    from workbench.engines.remote import launcher

    monkeypatch.setenv("WORKBENCH_SGLANG_PYTHON", sys.executable)
    kind, dtype, mis = case
    ck = soft_ckpt if kind == "soft" else plain_ckpt
    argv = launcher.sglang_spec(ck, dtype, enable_mis=mis).argv
    _check_argv(argv)
    assert argv[argv.index("--dtype") + 1] == dtype and argv[argv.index("--page-size") + 1] == "1"
    # input_embeds (soft token) need the radix cache off; said explicitly, not left to --enable-mis
    assert ("--disable-radix-cache" in argv) == (kind == "soft" or mis)
    assert ("--enable-mis" in argv) == mis
    if mis:
        assert argv[argv.index("--attention-backend") + 1] == "flashinfer"


def test_mis_is_never_launched_in_float32(plain_ckpt, monkeypatch):
    from workbench.engines.remote import launcher

    monkeypatch.setenv("WORKBENCH_SGLANG_PYTHON", sys.executable)
    for dtype in ("float32", "float"):
        with pytest.raises(ValueError, match="no float32 attention"):
            launcher.sglang_spec(plain_ckpt, dtype, enable_mis=True)
        with pytest.raises(ValueError, match="no float32 attention"):
            launcher.sglang_spec(plain_ckpt, dtype, delimiter_token_id=9999)


@pytest.fixture
def launched(monkeypatch):
    """SGLangEngine launches through the real launcher; the 'server' is a stand-in configured from its command line."""
    from test_gpu_adapters_contract import StandIn
    from workbench.engines.remote.sglang import SGLangEngine

    monkeypatch.setenv("WORKBENCH_SGLANG_PYTHON", sys.executable)
    seen: dict = {}

    def start(self, spec, log_path=None):
        _check_argv(spec.argv)
        seen["argv"], seen["received"] = spec.argv, []
        app = _stand_in(self.checkpoint, seen["received"], disable_radix_cache="--disable-radix-cache" in spec.argv)
        return self._stack.enter_context(StandIn(app))

    monkeypatch.setattr(SGLangEngine, "_start_server", start)
    return SGLangEngine, seen


async def test_adapter_launch_choices(launched, soft_ckpt, plain_ckpt, big_vocab_ckpt):
    SGLangEngine, seen = launched
    vec = np.linspace(-1, 1, 16)

    # float32 (the default), soft-token checkpoint: no MIS (FlashInfer), radix cache off, soft generation works
    eng = SGLangEngine(soft_ckpt)
    try:
        ph = eng.limits.placeholder_id
        res = (await eng.beam_search([BeamSearchRequest(Prompt.of([5, ph, 7], vec, 1), 2, 2)]))[0]
        assert res.success, res.error  # the stand-in, like SGLang, refuses input_embeds without the flag
        assert "--disable-radix-cache" in seen["argv"] and "--enable-mis" not in seen["argv"]
        caps = eng.capabilities()
        mis = caps.features["multi_item_scoring"]
        assert mis.status == Support.UNSUPPORTED and "float32" in mis.reason and "FlashInfer" in mis.reason
        assert "bfloat16" in caps.features["soft_token_beam_search"].reason  # the input_embeds cast, stated
    finally:
        await eng.close()

    # asking for MIS where it cannot work is refused before anything starts
    seen.clear()
    with pytest.raises(ValueError, match="FlashInfer"):
        SGLangEngine(plain_ckpt, multi_item_scoring=True)
    with pytest.raises(ValueError, match="9999"):
        SGLangEngine(plain_ckpt, "bfloat16", multi_item_scoring=True)
    assert not seen

    # bfloat16: MIS only with a vocabulary that holds the 9999 placeholder
    eng = SGLangEngine(plain_ckpt, "bfloat16")
    try:
        assert "--enable-mis" not in seen["argv"] and "--disable-radix-cache" not in seen["argv"]
        assert "9999" in eng.capabilities().features["multi_item_scoring"].reason
    finally:
        await eng.close()
    eng = SGLangEngine(big_vocab_ckpt, "bfloat16")
    try:
        assert "--enable-mis" in seen["argv"] and "--disable-radix-cache" in seen["argv"]
        assert eng.capabilities().features["multi_item_scoring"].status == Support.NATIVE
        s = (await eng.score([ScoreRequest(Prompt.of([5, 6]), ((10,), (11, 12)), "label", (3, 4))]))[0]
        assert s.success, s.error
    finally:
        await eng.close()

    # the radix cache forced on: SGLang refuses input_embeds (its message), so the adapter refuses soft generation
    eng = SGLangEngine(soft_ckpt, server_options={"disable_radix_cache": False})
    try:
        assert "--disable-radix-cache" not in seen["argv"]
        assert eng.capabilities().features["soft_token_beam_search"].status == Support.UNSUPPORTED
        res = (await eng.beam_search([BeamSearchRequest(Prompt.of([5, ph, 7], vec, 1), 2, 2)]))[0]
        assert not res.success and "--disable-radix-cache" in res.error and not seen["received"]
        eng.input_embeds_ok = True  # what the server itself answers when input_embeds do arrive
        res = (await eng.beam_search([BeamSearchRequest(Prompt.of([5, ph, 7], vec, 1), 2, 2)]))[0]
        assert not res.success and "input_embeds is provided while disable_radix_cache is False" in res.error
    finally:
        await eng.close()
