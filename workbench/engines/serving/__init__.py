"""`workbench serve`, in the shapes the clients of other engines already speak.

    serve.py        the process: checks, uvicorn, signals
    app.py          the FastAPI app: error handlers, capabilities, the routers below
    health.py       GET|HEAD /health (liveness), /ready (readiness after the warm-up), /health_generate
    metrics.py      GET /metrics (Prometheus): requests, latency, tokens, queue depth, batch sizes
    openai_api.py   POST /v1/completions, GET /v1/models (OpenAI / vLLM)
    sglang_api.py   POST /v1/score (SGLang 0.5.23), POST /v1/score_sequences (the workbench's sequence scores)
    body_limit.py   every request body bounded, however it is framed
    errors.py       the one error shape; strict token-id types
"""
