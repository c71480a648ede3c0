"""The TensorRT-LLM adapter, scoring layer, plugin and launcher against TensorRT-LLM's own 1.3.0rc2x names.

TensorRT-LLM cannot be imported here (it needs CUDA) and the package registry holds no source of
1.3.0rc20 (only wheel-stub sdists of other 1.3.0 rcs: PKG-INFO, LICENSE, pyproject.toml and a
build backend that downloads the wheel from NVIDIA's own index). So the names the workbench relies
on were read from the upstream sources once and recorded in tests/trtllm_api_facts.json (field,
flag and parameter names with the file each comes from; no code). These tests exercise the real
workbench code (the adapter over HTTP against a stand-in trtllm-serve, the scoring layer with
recording LLM stand-ins, the launcher's command lines and option files) and check everything it
sends against those facts:

- every field of every `/v1/completions` body is a `CompletionRequest` field (`extra="forbid"`);
- every keyword given to `LLM(...)`, `LLM.encode`, `LLM.generate`, `SamplingParams` and `KvCacheConfig`
  exists there (for `encode`, among the named parameters: an unknown keyword would not fail, it would
  go through `**model_kwargs` into the model's forward - the bug this file was written for);
- the multi-item input obeys `multi_item_part_lens` (sum + count == prompt length) and runs on FLASHINFER;
- the `--extra_llm_api_options` YAML keys are `TorchLlmArgs` / `KvCacheConfig` fields, every flag of the
  trtllm-serve command line exists in serve.py, and trtllm-serve gets no `--dtype`;
- the soft-token plugin finds `projector.safetensors` behind the serving view (issue: the view leaves it out).

With `TRTLLM_SOURCE_DIR` set to a TensorRT-LLM checkout (or a site-packages that holds `tensorrt_llm/`),
`test_facts_rederived_from_source` parses the real files (ast, no import) and checks the recorded facts
and the workbench's usage against them; without it that test skips.

Faults injected once each while writing this (each made the named test fail, then was reverted):
- the old packed call `encode({...}, batch_indexed_model_output=False, item_delimiter_indices=[...])`
  -> test_scoring_layer_calls_match_llm_api ("not a named parameter of LLM.encode");
- `"use_beam_serch"` in the adapter's beam body -> test_completions_fields_exist_in_completion_request;
- `"dtype"` renamed `"model_dtype"` in trtllm_spec's options -> test_trtllm_serve_command_and_extra_options;
- `--dtype` appended to trtllm_spec's argv -> test_trtllm_serve_command_and_extra_options;
- `multi_item_part_lens` with the query length left out -> test_scoring_layer_calls_match_llm_api;
- the plugin's old `Path(model_dir).resolve() / "projector.safetensors"` (in checkpoint_files.projector_file)
  -> test_plugin_finds_projector_behind_serving_view;
- `resolve_multi_item` returning packed for float32 -> test_float32_multi_item_is_refused_or_reported.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from workbench.engines.base import BeamSearchRequest, Prompt, ScoreRequest

pytestmark = pytest.mark.timeout(120)

FACTS = json.loads((Path(__file__).parent / "trtllm_api_facts.json").read_text())
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from workbench.testing import make_random_checkpoint

    return make_random_checkpoint(tmp_path_factory.mktemp("trt-src") / "ck", n_items=30, levels=(4, 4), hidden_size=32,
                                  num_layers=1, num_attention_heads=2, head_dim=16, vocab_base=50)


def _vocab(ckpt) -> int:
    return json.loads((ckpt / "config.json").read_text())["vocab_size"]


# ---- a stand-in trtllm-serve that records bodies and can answer each logprobs form ----------------------


from test_gpu_adapters_contract import StandIn  # noqa: E402  (the suite's one stand-in server)


def _rows(prompt, vocab):
    return [[math.sin(0.1 * (t + 1) * (v + 1)) for v in range(vocab)] for t in prompt]


def serve_app(received: list, vocab: int, logprobs_form: str = "openai"):
    """`/v1/completions` validating like `CompletionRequest` (extra="forbid" over the recorded fields)."""
    fields = set(FACTS["openai_protocol"]["CompletionRequest"])
    app = FastAPI()

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": "workbench", "object": "model", "owned_by": "tensorrt_llm"}]}

    @app.post("/v1/completions")
    async def completions(req: Request):
        body = await req.json()
        received.append(body)
        extra = sorted(set(body) - fields)
        if extra:
            return JSONResponse({"object": "error", "message": f"Extra inputs are not permitted: {extra}",
                                 "type": "BadRequestError", "param": None, "code": 400}, status_code=400)
        prompt = body["prompt"]
        choices = []
        if body.get("use_beam_search"):
            for i in range(body["n"]):
                toks = [(7 + i + k) % vocab for k in range(body["max_tokens"])]
                lps = [-0.5 * (i + 1) - 0.1 * k for k in range(body["max_tokens"])]
                lp = {"openai": {"text_offset": [], "token_logprobs": lps, "tokens": [], "top_logprobs": []},
                      "chat": {"content": [{"token": "", "logprob": x, "bytes": None} for x in lps]},
                      "none": None}[logprobs_form]
                choices.append({"index": i, "text": "", "token_ids": toks, "logprobs": lp, "finish_reason": "length"})
        else:
            choices.append({"index": 0, "text": "", "token_ids": [1], "logprobs": None, "finish_reason": "length",
                            "context_logits": _rows(prompt, vocab) if body.get("return_context_logits") else None})
        return {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": body["model"], "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + 1, "completion_tokens": 1}}

    return app


@pytest.mark.contract_only
async def test_completions_fields_exist_in_completion_request(ckpt):
    """Every body the adapter posts validates as 1.3.0rc2x's CompletionRequest (beam search, both scorings)."""
    from workbench.engines.remote.trtllm import TRTLLMEngine

    vocab = _vocab(ckpt)
    received: list = []
    with StandIn(serve_app(received, vocab)) as srv:
        eng = TRTLLMEngine(ckpt, url=srv.url)
        try:
            p = Prompt.of([5, 6, 7, 8])
            b = (await eng.beam_search([BeamSearchRequest(p, 3, 2)]))[0]
            s = await eng.score([ScoreRequest(p, ((10, 11), (12,))),
                                 ScoreRequest(p, ((10, 11),), mode="label", label_token_ids=(3, 4))])
        finally:
            await eng.close()
    assert b.success and all(x.success for x in s), (b.error, [x.error for x in s])
    sent = set().union(*received)
    fields = set(FACTS["openai_protocol"]["CompletionRequest"])
    assert sent <= fields, sent - fields
    assert {"use_beam_search", "return_context_logits", "logprobs"} <= sent
    # what the adapter reads back is in the response models
    read = {"index", "token_ids", "logprobs", "context_logits"}
    assert read <= set(FACTS["openai_protocol"]["CompletionResponseChoice"])
    assert "token_logprobs" in FACTS["openai_protocol"]["CompletionLogProbs"]


@pytest.mark.contract_only
@pytest.mark.parametrize("form", ["openai", "chat", "none"])
async def test_beam_logprobs_read_in_every_form(ckpt, form):
    """1.3.0rc2x answers CompletionLogProbs; other forms are read too, and a beam without them is re-scored."""
    from workbench.engines.remote.trtllm import TRTLLMEngine, _log_softmax

    vocab = _vocab(ckpt)
    received: list = []
    with StandIn(serve_app(received, vocab, form)) as srv:
        eng = TRTLLMEngine(ckpt, url=srv.url)
        try:
            res = (await eng.beam_search([BeamSearchRequest(Prompt.of([5, 6, 7, 8]), 3, 2)]))[0]
        finally:
            await eng.close()
    assert res.success, res.error
    if form == "none":  # raw log-probs of each beam from one context-logits request per beam
        want = []
        for i in range(3):
            toks = [(7 + i + k) % vocab for k in range(2)]
            rows = _rows([5, 6, 7, 8] + toks, vocab)
            want.append(sum(_log_softmax(rows[3 + j])[t] for j, t in enumerate(toks)))
        assert sorted(round(b.cum_logprob, 9) for b in res.beams) == sorted(round(w, 9) for w in want)
        assert sum(1 for r in received if r.get("return_context_logits")) == 3
    else:
        assert [round(b.cum_logprob, 6) for b in res.beams] == [-1.1, -2.1, -3.1]


# ---- the scoring layer's LLM-API calls, recorded and checked against the signatures -------------------


class RecordingModel:
    """Deterministic logits: the row after a prefix depends on the prefix (and the user vector)."""

    def __init__(self, vocab: int):
        self.table = np.random.default_rng(3).normal(size=(1024, vocab)) * 3

    def rows(self, ids, vec=None) -> np.ndarray:
        salt = 0 if vec is None else int(abs(sum(vec)) * 977)
        return np.stack([self.table[(sum(ids[: t + 1]) * 31 + t + salt) % len(self.table)] for t in range(len(ids))])


class RecordingEncodeLLM:
    """`LLM.encode` of 1.3.0rc2x: the named parameters, a `**model_kwargs` catch-all recorded as a fault,
    and the multi-item semantics of the upstream test (each item's rows = rows of query + item)."""

    def __init__(self, model: RecordingModel):
        self.model, self.calls = model, []

    def encode(self, inputs, add_special_tokens=True, batch_indexed_model_output=True, copy_logits_to_host=True,
               return_raw_logits=False, **model_kwargs):
        named = dict(add_special_tokens=add_special_tokens, batch_indexed_model_output=batch_indexed_model_output,
                     copy_logits_to_host=copy_logits_to_host, return_raw_logits=return_raw_logits)
        self.calls.append({"inputs": inputs, "named": named, "model_kwargs": model_kwargs})
        batch = inputs if isinstance(inputs, list) else [inputs]
        with_parts = [("multi_item_part_lens" in i) for i in batch]
        if any(with_parts) and not all(with_parts):
            raise ValueError('"multi_item_part_lens" must either be provided for all prompts or for none')
        outs = []
        for inp in batch:
            ids = inp["prompt_token_ids"]
            parts = inp.get("multi_item_part_lens")
            if parts is None:
                logits = self.model.rows(ids)
            else:
                if len(parts) < 2 or sum(parts) + len(parts) != len(ids):
                    raise ValueError('"multi_item_part_lens" inconsistent with prompt length')
                q = ids[: parts[0]]
                logits = np.full((len(ids), self.model.table.shape[1]), np.nan)  # delimiter rows: undefined
                logits[: parts[0]] = self.model.rows(q)
                start = parts[0] + 1
                for n in parts[1:]:
                    logits[start:start + n] = self.model.rows(q + ids[start:start + n])[parts[0]:]
                    start += n + 1
            outs.append(types.SimpleNamespace(logits=logits, prompt_token_ids=ids, prompt=None))
        return outs if isinstance(inputs, list) else outs[0]


class RecordingGenLLM:
    def __init__(self, model: RecordingModel):
        self.model, self.calls = model, []

    def generate(self, inputs, sampling_params=None, use_tqdm=True, lora_request=None, prompt_adapter_request=None,
                 kv_cache_retention_config=None, disaggregated_params=None, scheduling_params=None,
                 conversation_params=None, cache_salt=None, priority=0.5):
        import torch

        self.calls.append({"inputs": inputs, "sampling_params": sampling_params, "use_tqdm": use_tqdm})
        single = isinstance(inputs, dict)
        outs = []
        for inp in [inputs] if single else inputs:
            ids = inp["prompt_token_ids"]
            vec = (inp.get("multi_modal_embeddings") or {}).get("user", [None])[0]
            kw = sampling_params.kw
            if kw.get("use_beam_search"):
                beams = [([], 0.0)]
                for _ in range(kw["max_tokens"]):
                    cand = []
                    for toks, cum in beams:
                        logits = torch.tensor(self.model.rows(ids + toks, vec)[-1:][None])
                        if kw.get("logits_processor") is not None:
                            kw["logits_processor"](0, logits, [ids + toks], None, None)
                        lp = torch.log_softmax(logits.flatten().double(), -1)
                        cand += [(cum + float(lp[t]), toks + [t]) for t in torch.topk(lp, kw["n"]).indices.tolist()
                                 if torch.isfinite(lp[t])]
                    beams = [(t, c) for c, t in sorted(cand, key=lambda x: -x[0])[: kw["n"]]]
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=t, cumulative_logprob=c)
                                                           for t, c in beams], context_logits=None))
            else:
                outs.append(types.SimpleNamespace(outputs=[], context_logits=self.model.rows(ids, vec)))
        return outs[0] if single else outs


class RecordingAPI:
    class SamplingParams:
        calls: list = []

        def __init__(self, **kw):
            self.kw = kw
            RecordingAPI.SamplingParams.calls.append(kw)

    class LogitsProcessor:
        pass


def _scorer(ckpt, multi_item: bool):
    from workbench.engines.in_trtllm.scoring_server import LLMScorer
    from workbench.model.checkpoint import read_meta
    from workbench.sids.layout import Catalog

    vocab = _vocab(ckpt)
    model = RecordingModel(vocab)
    enc, gen = RecordingEncodeLLM(model), RecordingGenLLM(model)
    catalog = Catalog(np.load(ckpt / "catalog.npz")["item_codes"], read_meta(ckpt).layout)
    return LLMScorer(enc, gen, RecordingAPI, catalog=catalog, vocab_size=vocab, multi_item=multi_item,
                     mis_delimiter=vocab - 1), enc, gen, model


@pytest.mark.contract_only
def test_scoring_layer_calls_match_llm_api(ckpt):
    """Every call the layer makes (packed + batched scoring, soft token, plain/constrained/soft beams)."""
    from workbench.engines.in_trtllm.scoring_server import ScoreJob, _log_softmax_rows, kv_cache_kwargs, llm_kwargs
    from workbench.model.checkpoint import read_meta

    llm, args = FACTS["llm"], FACTS["llm_args"]
    RecordingAPI.SamplingParams.calls.clear()
    ph = read_meta(ckpt).layout.placeholder_id
    vec = tuple(np.linspace(0.5, 1.5, 16))
    results = {}
    for packed in (True, False):
        scorer, enc, gen, model = _scorer(ckpt, packed)
        for mode, labels in (("sequence", ()), ("label", (3, 4))):
            job = ScoreJob((5, 6, 7), ((10, 11), (12,), (13, 14, 15)), mode, labels)
            results[packed, mode] = scorer.score(job)
        scorer.score(ScoreJob((5, ph, 7), ((10, 11),), "sequence", (), vec))
        scorer.beam_search([5, 6, 7], 3, 2)
        scorer.beam_search([5, 6, 7], 2, scorer.catalog.depth, constrained=True, banned_items=[0])
        scorer.beam_search([5, ph, 7], 2, 2, user_vector=vec)
        for c in enc.calls:
            assert not c["model_kwargs"], f"not a named parameter of LLM.encode: {sorted(c['model_kwargs'])} " \
                                          "(it would reach the model's forward as **model_kwargs)"
            assert c["named"]["batch_indexed_model_output"] is False  # token-indexed [T, vocab] logits
            for inp in c["inputs"]:
                assert set(inp) <= set(llm["encode_input_keys"]), inp.keys()
                if packed:  # LLM.encode's own check (llm.py) and the layout of the upstream test
                    parts = inp["multi_item_part_lens"]
                    assert len(parts) >= 2 and sum(parts) + len(parts) == len(inp["prompt_token_ids"])
                    assert parts[0] == 3  # the query's length first, then each item's
        assert any("multi_item_part_lens" in i for c in enc.calls for i in c["inputs"]) == packed
        for c in gen.calls:
            inputs = c["inputs"] if isinstance(c["inputs"], list) else [c["inputs"]]
            assert all(set(i) <= set(llm["generate_input_keys"]) for i in inputs)
        # the soft token rides as the 'user' multimodal embedding
        assert any("multi_modal_embeddings" in i for c in gen.calls
                   for i in (c["inputs"] if isinstance(c["inputs"], list) else [c["inputs"]]))
    # packed and batched give the same numbers: the packed rows are read where upstream pins them
    for mode in ("sequence", "label"):
        assert np.allclose(results[True, mode], results[False, mode]), mode
    lp = _log_softmax_rows(model.rows([5, 6, 7, 13, 14, 15]))
    assert abs(results[True, "sequence"][2][0] - (lp[2, 13] + lp[3, 14] + lp[4, 15])) < 1e-9
    assert abs(results[True, "label"][0][1] - _log_softmax_rows(model.rows([5, 6, 7, 10, 11]))[-1, 4]) < 1e-9
    # generate() keywords, SamplingParams keywords
    gen_kw = {"inputs", "sampling_params", "use_tqdm"}
    assert gen_kw <= set(llm["LLM.generate"])
    used_sp = set().union(*RecordingAPI.SamplingParams.calls)
    assert used_sp <= set(FACTS["sampling_params"]["SamplingParams_confirmed"]), used_sp
    # LLM(...) and KvCacheConfig(...) keywords
    for multi in (True, False):
        enc_kw, gen_kw2 = llm_kwargs("/m", "bfloat16", max_beam_width=8, multi_item=multi, kv_cache_config=object())
        for kw in (enc_kw, gen_kw2):
            assert set(kw) <= set(llm["LLM.__init__"]) | set(args["TorchLlmArgs_confirmed"]), kw.keys()
        assert enc_kw["encode_only"] is True and "kv_cache_config" not in enc_kw
        if multi:
            assert enc_kw["attn_backend"] in args["multi_item_attn_backends"]
        else:
            assert "attn_backend" not in enc_kw
    assert set(kv_cache_kwargs(0.3)) <= set(args["KvCacheConfig_confirmed"])


@pytest.mark.contract_only
def test_float32_multi_item_is_refused_or_reported(ckpt):
    from workbench.engines.remote.trtllm import TRTLLMEngine
    from workbench.engines.in_trtllm.scoring_server import checkpoint_dtype, resolve_multi_item

    for d in FACTS["llm_args"]["multi_item_dtypes"]:
        assert resolve_multi_item("auto", d)[0] and resolve_multi_item("packed", d)[0]
    use, why = resolve_multi_item("auto", "float32")
    assert not use and "float32" in why and "bfloat16" in why
    with pytest.raises(ValueError, match="bfloat16"):
        resolve_multi_item("packed", "float32")
    assert not resolve_multi_item("batched", "bfloat16")[0]
    assert checkpoint_dtype(ckpt) == "float32"  # what LLM(dtype="auto") loads for the random checkpoints
    static = TRTLLMEngine.static_capabilities().features["multi_item_scoring"].reason
    assert "bfloat16" in static and "float32" in static and "multi_item_part_lens" in static
    eng32 = TRTLLMEngine(ckpt, url="http://127.0.0.1:9", scoring_url="http://127.0.0.1:9", dtype="float32")
    fs = eng32.capabilities().features["multi_item_scoring"]
    assert fs.status.value == "native" and "float32" in fs.reason and "batched" in fs.reason


# ---- launcher: trtllm-serve flags, the extra-options YAML, the scoring layer's command line ---------------


@pytest.mark.contract_only
def test_trtllm_serve_command_and_extra_options(ckpt, monkeypatch):
    import yaml

    from workbench.engines.remote import launcher
    from workbench.engines.in_trtllm.scoring_server import parser

    serve, args = FACTS["serve"], FACTS["llm_args"]
    monkeypatch.setenv("WORKBENCH_TRTLLM_BIN", sys.executable)
    monkeypatch.setenv("WORKBENCH_TRTLLM_PYTHON", sys.executable)
    spec = launcher.trtllm_spec(ckpt, "bfloat16", port=8133, kv_fraction=0.35)
    argv = list(spec.argv)
    assert argv[1] in serve["entry_point_commands"] and argv[1] == "serve"
    flags = {a for a in argv if a.startswith("--")}
    assert flags <= set(serve["serve_flags"]), flags - set(serve["serve_flags"])
    assert not flags & set(serve["absent_flags"])
    assert argv[argv.index("--backend") + 1] in serve["backend_choices"]
    opts = yaml.safe_load(Path(argv[argv.index("--extra_llm_api_options") + 1]).read_text())  # as serve.py reads it
    assert set(opts) <= set(args["TorchLlmArgs_confirmed"]) | set(FACTS["llm"]["LLM.__init__"]), opts.keys()
    assert opts["dtype"] == "bfloat16"
    assert set(opts["kv_cache_config"]) <= set(args["KvCacheConfig_confirmed"])
    assert opts["kv_cache_config"]["free_gpu_memory_fraction"] == 0.35
    assert spec.env["WORKBENCH_TRTLLM_CHECKPOINT"] == str(ckpt.resolve())
    assert "WORKBENCH_TRTLLM_DTYPE" not in spec.env  # read by nothing
    # the scoring layer's command line parses back with its own parser
    lspec = launcher.trtllm_scoring_spec(ckpt, "float32", port=8134, multi_item="auto", mis_delimiter=2)
    a = parser().parse_args(list(lspec.argv[3:]))
    assert (a.dtype, a.multi_item, a.mis_delimiter, a.checkpoint) == ("float32", "auto", 2, str(ckpt.resolve()))
    assert lspec.env["WORKBENCH_TRTLLM_CHECKPOINT"] == str(ckpt.resolve())


# ---- the soft-token plugin finds its projector behind the serving view ---------------------------------------


def _checkpoint_files():
    """in_trtllm/soft_token_plugin/checkpoint_files.py loaded on its own (the package __init__ imports tensorrt_llm)."""
    path = REPO / "workbench" / "engines" / "in_trtllm" / "soft_token_plugin" / "checkpoint_files.py"
    spec = importlib.util.spec_from_file_location("wb_trtllm_checkpoint_files", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_plugin_finds_projector_behind_serving_view(ckpt, tmp_path, monkeypatch):
    from transformers import AutoConfig

    from workbench.engines.remote.launcher import WORKBENCH_ONLY_FILES, serving_dir

    cf = _checkpoint_files()
    monkeypatch.delenv(cf.CHECKPOINT_ENV, raising=False)
    view = serving_dir(ckpt)
    # the view stays a plain HF directory (vLLM/SGLang load every *.safetensors in it) ...
    assert not any((view / f).exists() for f in WORKBENCH_ONLY_FILES)
    # ... and it is what TensorRT-LLM's model config is named after (the bug: the projector was looked up there)
    name = AutoConfig.from_pretrained(str(view))._name_or_path
    assert Path(name).resolve() == view.resolve() and not (Path(name).resolve() / "projector.safetensors").exists()
    assert cf.checkpoint_dir(name) == ckpt.resolve()
    assert cf.projector_file(name) == ckpt.resolve() / "projector.safetensors"
    assert cf.workbench_meta(name)["projector"]["in_dim"] == 16
    # a copied model directory (no symlinks, no workbench files): the launcher's env var names the checkpoint
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in view.iterdir():
        shutil.copy(f.resolve(), copy / f.name)
    with pytest.raises(FileNotFoundError, match=cf.CHECKPOINT_ENV):
        cf.projector_file(copy)
    monkeypatch.setenv(cf.CHECKPOINT_ENV, str(ckpt))
    assert cf.projector_file(copy) == ckpt.resolve() / "projector.safetensors"


# ---- with a TensorRT-LLM source tree: re-derive the facts from the real files ------------------------------


def _source_root() -> Path | None:
    d = os.environ.get("TRTLLM_SOURCE_DIR")
    if not d:
        return None
    root = Path(d)
    return root if (root / "tensorrt_llm" / "llmapi" / "llm.py").is_file() else None


def _class_fields(tree: ast.Module, name: str) -> set[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    raise AssertionError(f"class {name} not found")


def _class_bases(tree: ast.Module, name: str) -> list[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return [b.id for b in node.bases if isinstance(b, ast.Name)]
    return []


def _all_fields(tree: ast.Module, name: str) -> set[str]:
    out = _class_fields(tree, name)
    for base in _class_bases(tree, name):
        try:
            out |= _all_fields(tree, base)
        except AssertionError:
            pass
    return out


def _method_params(tree: ast.Module, cls: str, meth: str) -> list[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == meth:
                    return [a.arg for a in f.args.args + f.args.kwonlyargs if a.arg != "self"]
    raise AssertionError(f"{cls}.{meth} not found")


def _click_flags(tree: ast.Module, func: str) -> set[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == func:
            return {c.value for d in node.decorator_list for c in ast.walk(d)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("--")}
    raise AssertionError(f"{func} not found")


@pytest.mark.skipif(_source_root() is None, reason="TRTLLM_SOURCE_DIR (a TensorRT-LLM source tree) not set: the "
                    "recorded facts in tests/trtllm_api_facts.json are what the other tests check")
def test_facts_rederived_from_source():
    root = _source_root()

    def parse(rel: str) -> ast.Module:
        return ast.parse((root / rel).read_text())

    proto = parse("tensorrt_llm/serve/openai_protocol.py")
    for cls in ("CompletionRequest", "CompletionResponseChoice", "CompletionLogProbs"):
        assert set(FACTS["openai_protocol"][cls]) <= _class_fields(proto, cls), cls
    assert "forbid" in (root / "tensorrt_llm/serve/openai_protocol.py").read_text()
    serve_flags = _click_flags(parse("tensorrt_llm/commands/serve.py"), "serve")
    used = {"--host", "--port", "--backend", "--max_beam_width", "--custom_module_dirs", "--extra_llm_api_options"}
    assert used <= serve_flags and "--dtype" not in serve_flags
    llm = parse("tensorrt_llm/llmapi/llm.py")
    base = "BaseLLM" if any(isinstance(n, ast.ClassDef) and n.name == "BaseLLM" for n in ast.walk(llm)) else "LLM"
    assert set(FACTS["llm"]["LLM.encode"]) <= set(_method_params(llm, base, "encode"))
    assert {"inputs", "sampling_params", "use_tqdm"} <= set(_method_params(llm, base, "generate"))
    assert set(FACTS["llm"]["EncoderOutput"]) <= _class_fields(llm, "EncoderOutput")
    assert "multi_item_part_lens" in (root / "tensorrt_llm/llmapi/llm.py").read_text()
    args = parse("tensorrt_llm/llmapi/llm_args.py")
    torch_fields = _all_fields(args, "TorchLlmArgs") | set(FACTS["llm"]["LLM.__init__"])
    from workbench.engines.in_trtllm.scoring_server import kv_cache_kwargs, llm_kwargs

    for multi in (True, False):
        for kw in llm_kwargs("/m", "bfloat16", max_beam_width=4, multi_item=multi, kv_cache_config=None):
            assert set(kw) <= torch_fields
    assert {"dtype", "kv_cache_config"} <= torch_fields
    assert set(kv_cache_kwargs(0.3)) <= _all_fields(args, "KvCacheConfig")
    sp = _class_fields(parse("tensorrt_llm/sampling_params.py"), "SamplingParams")
    assert {"max_tokens", "return_context_logits", "end_id", "use_beam_search", "n", "best_of", "length_penalty",
            "logits_processor"} <= sp
