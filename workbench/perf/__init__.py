"""Single-request performance: the engine microbenchmark and the compute-floor benchmark."""
