"""`workbench serve`: load a checkpoint into an engine and serve it (uvicorn) until a signal.

The cheap checks (port, checkpoint folder, safetensors) run before the model loads; SIGINT, SIGTERM
and SIGHUP shut down gracefully (in-flight requests finish, the engine closes) and the CLI exits
128 + signal (`workbench/signals.py`). Binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

from contextlib import contextmanager


def check_port(host: str, port: int) -> None:
    """Raise UsageError unless `host:port` can be bound now: checked before the model loads (which takes
    a while) instead of uvicorn failing after it. Port 0 is refused: the OS would pick a port that the
    clients (and the log line they read) do not know. SO_REUSEADDR as uvicorn sets it, so a port that
    only has connections in TIME_WAIT passes, and one with a live listener does not."""
    import errno
    import socket

    from workbench.errors import UsageError

    if port == 0:
        raise UsageError("port 0 (a port the OS picks) is refused: clients could not know it; use --port 1-65535")
    if not 1 <= port <= 65535:
        raise UsageError(f"port {port} is not a TCP port; use --port 1-65535 (default 8100)")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise UsageError(f"cannot bind --host {host}: {e.strerror}; give an address of this machine "
                         "(127.0.0.1 for local only, 0.0.0.0 for every interface)") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} on {host} is already in use (another server?); stop it or choose "
                                 "another port with --port") from None
            why = "ports below 1024 need root; " if e.errno == errno.EACCES and port < 1024 else ""
            raise UsageError(f"cannot bind {host}:{port}: {e.strerror}; {why}choose another --host/--port") from None


def serve(checkpoint, engine: str = "torch", host: str = "127.0.0.1", port: int = 8100, dtype: str = "float32",
          device: str = "cpu", **options) -> None:
    """Load `checkpoint` into `engine` on `device` (cpu | cuda | cuda:N) and serve it until SIGINT/SIGTERM (then
    close it cleanly).

    The cheap checks run first (a free port, a checkpoint folder with safetensors weights, a device this machine
    has), so a mistake is reported in a second instead of after the model has loaded."""
    from workbench.engines.checks import require_device
    from workbench.model.checkpoint import read_meta, require_safetensors

    check_port(host, port)
    meta = read_meta(checkpoint)
    require_safetensors(checkpoint)
    device = require_device(device)
    import uvicorn

    from workbench.engines.registry import create_engine

    eng = create_engine(engine, checkpoint=checkpoint, dtype=dtype, device=device, **options)
    print(f"engine {getattr(eng, 'name', engine)} ({getattr(eng, 'dtype', dtype)}) on {checkpoint}, device {device}",
          flush=True)
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: binding {host}: the server has no authentication", flush=True)
    from workbench.engines.serving.app import create_app

    app = create_app(eng, model_name=f"{meta.backbone}:{meta.method}")
    # keep-alive 30 s (uvicorn's default is 5): clients under load reuse connections instead of racing the
    # server's close of an idle one (see http_common.KEEPALIVE_EXPIRY_S, which expires them first anyway)
    config = uvicorn.Config(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=30,
                            timeout_keep_alive=30)
    server = uvicorn.Server(config)  # not uvicorn.run: it swallows the interrupt the CLI turns into 128 + signal
    with _hangup_as_terminate():
        server.run()
    if not server.started:
        raise RuntimeError(f"the server on {host}:{port} did not start; see the log lines above")


@contextmanager
def _hangup_as_terminate():
    """SIGHUP shuts the server down like SIGTERM: uvicorn handles only SIGINT and SIGTERM (in-flight
    requests finish, the lifespan closes the engine), then re-raises the signal it caught, which the
    CLI turns into its exit status (`signals.py`); a hang-up still exits 128 + SIGHUP."""
    import os
    import signal
    import threading

    from workbench import signals

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hung_up: list[int] = []

    def on_hup(signum, frame) -> None:
        hung_up.append(signum)
        os.kill(os.getpid(), signal.SIGTERM)

    old = signal.signal(signal.SIGHUP, on_hup)
    try:
        yield
    except signals.Terminated:
        if hung_up:
            raise signals.Terminated(signal.SIGHUP) from None
        raise
    finally:
        signal.signal(signal.SIGHUP, old)
