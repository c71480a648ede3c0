"""The workbench's own engine (registry name "torch"): beam search, multi-item scoring and soft tokens on one
fast path. Importing this package imports no torch; the engine module imports it when an engine is built.

    engine.py    the scheduler and per-request state: one worker thread, one mixed forward per iteration
    search.py    the tensor math of a step: segments, trie mask, beam selection, candidate scores
    model.py     FastLM: the hand-written Qwen3 / Llama forward over prefill and shared-prompt segments
    fused.py     compile=True: the per-layer elementwise work as torch.compile kernels
    int8.py      quantize="int8": the layer GEMMs on PyTorch's dynamic int8 kernel
    onednn.py    gemm="auto" / "onednn": the layer GEMMs on oneDNN with weights packed once
    options.py   the variants' names and command-line flags (no torch import: the CLI reads it)
"""
