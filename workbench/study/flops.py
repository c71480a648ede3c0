"""The FLOP counts moved to `workbench/model/flops.py`: they describe a decoder LM, not a study, and the GPU probe
(perf/) counts with them, which may read the study only through study/outputs.py. This module keeps the old import
path (training's `from workbench.study.flops import train_flops`) working until that line moves."""

from workbench.model.flops import (  # noqa: F401 - re-exported
    attention_flops,
    causal_pairs,
    forward_flops,
    linear_params_per_layer,
    lm_head_flops,
    matmul_flops_per_token,
    train_flops,
)
