"""`GET /health`: whether the server can answer — its backends included. An rpc-server the
served model runs on that went away (its connection closed or failed) makes the server
unhealthy: 503 naming the endpoint, as llama-server answers 503 while it cannot serve."""

from __future__ import annotations


def backend_problems(llm) -> list[str]:
    """One line per backend of `llm` that cannot compute any more (empty: all well). Only
    looks at connections, sends nothing, never blocks."""
    from pyggml.backend.rpc.backend import RpcBackend
    out = []
    for be in llm.backends:
        if isinstance(be, RpcBackend):
            conn = be.device.conn
            if not conn.alive():
                out.append(f"RPC server {conn.endpoint} is unreachable ({conn.broken})")
    return sorted(set(out))


def health_body(llm) -> tuple[int, dict]:
    """(HTTP status, body) of /health."""
    problems = backend_problems(llm)
    if not problems:
        return 200, {"status": "ok"}
    return 503, {"status": "error",
                 "error": {"message": "; ".join(problems), "type": "unavailable_error",
                           "code": 503}}
