"""Helpers for the tests only: nothing in the `workbench` package imports this module.

`TINY_STUDY_OVERRIDES` is the smallest real study the tests train through the pipeline.
`make_random_checkpoint` is re-exported from `workbench.model.random_checkpoint` (production code:
the benchmarks build random checkpoints too), so the tests keep one import for their fixtures.
"""

from __future__ import annotations

from workbench.model.random_checkpoint import make_random_checkpoint  # re-export for the tests

__all__ = ["TINY_STUDY_OVERRIDES", "make_random_checkpoint"]

# The smallest real personalization study (ML-100K, collaborative SIDs, a 1-layer model, `none` + `soft_token`,
# one short epoch, 30 test users): overrides on top of experiments/quickstart.yaml, shared by the tests that
# train and evaluate through the real pipeline (notebook 02, load tests on trained checkpoints).
TINY_STUDY_OVERRIDES: dict = {
    "semantic_ids": {"item_vectors": "collab", "also_fit": [], "levels": 2, "codebook_size": 16},
    "user_sids": {"levels": 1, "codebook_size": 8},
    "embeddings": {"als_factors": 16, "als_iterations": 3},
    "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 16,
              "intermediate_size": 64, "bpe_vocab_size": 500},
    "training": {"epochs": 1, "valid_users": 30, "batch_targets": 256, "num_threads": 1, "bf16": False, "workers": 1},
    "methods": {"run": ["none", "soft_token"], "recent_k": 3, "long_m": 5},
    "evaluation": {"test_users": 30, "bootstrap": 50, "sasrec_epochs": 1, "validity_users": 5,
                   "latency_requests": 2, "sasrec_lr_grid": [0.002], "als_regularization_grid": [0.05],
                   "als_alpha_grid": [1.0], "ease_lambda_grid": [200.0]},
}  # fmt: skip
