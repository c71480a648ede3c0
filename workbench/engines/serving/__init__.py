"""`workbench serve`, in the shapes the clients of other engines already speak.

    serve.py        the process: checks, uvicorn, signals
    app.py          the FastAPI app: error handlers, health, capabilities, the routers below
    openai_api.py   POST /v1/completions (OpenAI / vLLM)
    sglang_api.py   POST /v1/score (SGLang)
    body_limit.py   every request body bounded, however it is framed
    errors.py       the one error shape; strict token-id types
"""
