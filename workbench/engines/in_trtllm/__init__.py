"""What runs INSIDE TensorRT-LLM's own environment (its python, its torch), never in the workbench's process.

    scoring_server.py    the scoring layer around TensorRT-LLM's LLM API (`python -m` of this module)
    soft_token_plugin/   out-of-tree soft-token models, loaded by `trtllm-serve --custom_module_dirs`

The launcher (remote/launcher.py) names these by module path and folder path on a command line only; nothing
the workbench imports at run time imports them (an import-linter contract holds that).
"""
