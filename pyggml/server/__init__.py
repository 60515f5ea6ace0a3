"""`pyggml serve`: an OpenAI-compatible HTTP server with continuous batching.

    engine.py  the decode loop (slots = sequences of one KV cache, one decode_batch per step)
    app.py     the HTTP API (Starlette), run by uvicorn
"""

from __future__ import annotations

import ipaddress
import socket
import threading

from pyggml.errors import PyggmlError


def bind_warning(host: str, api_key: str | None) -> str | None:
    """The warning to print for a bind address that other machines can reach without a key."""
    if api_key:
        return None
    try:
        loopback = all(ipaddress.ip_address(a[4][0].split("%")[0]).is_loopback
                       for a in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        loopback = host in ("localhost",)
    if loopback:
        return None
    return (f"listening on {host}, which other machines may reach, without --api-key: anyone "
            f"who can connect can use the model")


class RunningServer:
    """A server started in a background thread (tests, embedding pyggml in a program)."""

    def __init__(self, server, uvicorn_server, thread):
        self.server, self._uv, self._thread = server, uvicorn_server, thread

    @property
    def port(self) -> int:
        return self._uv.servers[0].sockets[0].getsockname()[1]

    def stop(self, timeout_s: float = 10.0) -> None:
        self._uv.should_exit = True
        self._thread.join(timeout_s)
        self.server.engine.stop(timeout_s)


def make_server(llm, n_slots: int, model_name: str, chat_template=None,
                api_key: str | None = None, queue_size: int = 64, step_target_s: float = 0.25,
                limits=None, host: str = "127.0.0.1"):
    """The Server (routes, engine). limits: a pyggml.server.guard.Limits (body size, timeouts,
    --allowed-hosts); host: the bind address (its name is always an allowed Host)."""
    from pyggml.server.app import Server
    from pyggml.server.engine import Engine
    if chat_template is not None:
        llm.get_chat_template(chat_template)        # a bad template fails at start, not later
    server = Server(llm, Engine(llm, n_slots, queue_size, step_target_s), model_name,
                    chat_template, api_key)
    if limits is not None:
        server.limits = limits
    server.bind_host = host
    return server


def serve(server, host: str, port: int, sock=None) -> None:
    """Serve until SIGINT/SIGTERM (`pyggml serve`), with the guarded uvicorn settings. sock: a
    socket already listening on host:port (the CLI binds before loading the model)."""
    import uvicorn

    from pyggml.server.guard import uvicorn_config
    server.bind_host = host
    uv = uvicorn.Server(uvicorn_config(server.app, host, port, server.limits))
    uv.run(sockets=[sock] if sock is not None else None)


def start_in_thread(server, host: str = "127.0.0.1", port: int = 0,
                    timeout_s: float = 30.0) -> RunningServer:
    """Serve `server` (from make_server) on host:port (0: a free port) in a daemon thread."""
    import time

    import uvicorn

    from pyggml.server.guard import uvicorn_config
    server.bind_host = host
    cfg = uvicorn_config(server.app, host, port, server.limits)
    uv = uvicorn.Server(cfg)
    t = threading.Thread(target=uv.run, name="pyggml-http", daemon=True)
    t.start()
    t0 = time.monotonic()
    while not uv.started:
        if not t.is_alive() or time.monotonic() - t0 > timeout_s:
            uv.should_exit = True
            server.engine.stop()
            raise PyggmlError(f"the HTTP server did not start on {host}:{port}")
        time.sleep(0.02)
    return RunningServer(server, uv, t)
