"""The workbench's own engine (registry name "torch"): beam search, multi-item scoring and soft tokens on one
fast path. Importing this package imports no torch; the engine module imports it when an engine is built.

    engine.py    the scheduler and per-request state: one worker thread, one mixed forward per iteration
    model.py     FastLM: the hand-written Qwen3 / Llama forward and its attention over the segments
    search.py    the tensor math around a forward: trie mask, beam selection, candidate scores
    fused.py     variant compile=True: the per-layer elementwise work as torch.compile kernels
    int8.py      variant quantize="int8": the layer GEMMs on PyTorch's dynamic int8 kernel
    onednn.py    gemm="auto" / "onednn": the layer GEMMs on oneDNN with weights packed once
    segments.py  the row layouts one forward runs (prompts; streams over a shared prompt KV) and their builders
    layers.py    what every layer is made of: norms, GEMM wrappers, the elementwise ops, the weights
    options.py   the variants' names and command-line flags (no torch import: the CLI reads it)

Each imports only those below it (an import-linter contract): the model applies the variants at load, and
the variants build on layers.py and segments.py, never on the model.
"""
