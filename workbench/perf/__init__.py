"""Single-request performance: the engine microbenchmark, the compute-floor and A/B benchmarks (each invocation one
MLflow run: record.py), and what a faster variant costs in quality (variant_quality.py)."""
