"""Load tests: workloads, the load generator, latency metrics, cost, and the sweeps over engines x checkpoints."""
