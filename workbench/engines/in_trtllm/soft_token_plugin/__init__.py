"""Out-of-tree TensorRT-LLM models for the soft token (load with `trtllm-serve --custom_module_dirs <this dir>`).

Written against TensorRT-LLM 1.3.0rc20 (see modeling_soft_token.py for the APIs used and their
sources). It imports `tensorrt_llm`, so it is only importable inside the TRT-LLM environment; it has
not run on the CPU machines where it was written (scripts/validate_gpu_engines.sh is its first run).
"""

from .modeling_soft_token import SoftTokenLlamaForCausalLM, SoftTokenQwen3ForCausalLM  # noqa: F401
