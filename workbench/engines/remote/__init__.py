"""Clients of engines that run as HTTP servers in their own environments, and the launcher that starts them.

    http_common.py   what the adapters share: the HTTP client, prompt embedding, capabilities, launching
    vllm.py          vLLM (`vllm serve`, CPU or CUDA build): registry name "vllm"
    sglang.py        SGLang (`python -m sglang.launch_server`, GPU): registry name "sglang"
    trtllm.py        TensorRT-LLM (`trtllm-serve` plus the workbench's scoring layer, GPU): registry name "trtllm"
    http_engine.py   the workbench's own engines behind `workbench serve`, over HTTP
    launcher.py      start, health-check and always stop those servers (their command lines live here)

Nothing here imports vllm, sglang or tensorrt_llm: those run in other processes, spoken to over HTTP.
"""
