"""Inference engines behind one contract (`base.py`); look them up lazily via `registry.py`.

    base.py, registry.py          the contract (requests, results, capabilities) and the lookup by name
    checks.py, numerics.py        request checks the engines share; rounding bounds the parity tests derive
    workloads.py, parity.py       the prompts every engine is measured on; engines checked against the oracle
    hf_engine.py                  the plain transformers baseline ("hf"): the torch engine's own oracle
    torch/                        the workbench's own engine ("torch")
    remote/                       clients of external engines' servers (vLLM, SGLang, TensorRT-LLM) + launcher
    serving/                      `workbench serve`: the in-process engines behind HTTP
    in_trtllm/                    what runs inside TensorRT-LLM's environment (kept apart from all of the above)
"""
