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


def reconnect(llm) -> list[str]:
    """Reconnect the rpc-servers of `llm` that went away (a restarted server listens on the
    same endpoint again) and rebuild its run on them: the weights uploaded again, a new KV cache
    (every sequence starts empty). Call it with no generation running (the server's worker does,
    before admitting a request). Returns the problems left (empty: all well again)."""
    from pyggml.backend import rpc
    from pyggml.backend.rpc.backend import RpcBackend
    from pyggml.llm.context import Context
    from pyggml.llm.setup import build_run
    dead = {be.device.conn.endpoint: be.device.conn.timeout_s for be in llm.backends
            if isinstance(be, RpcBackend) and not be.device.conn.alive()}
    if not dead:
        return []
    if llm.speculator is not None:
        return backend_problems(llm)        # a draft model's run would need rebuilding too
    with llm.lock:
        rpc.unregister_endpoints(list(dead))
        try:
            rpc.register_endpoints(list(dead), timeout_s=max(dead.values()))
        except rpc.RpcError as e:
            return [str(e)]
        old = llm.run
        llm.run = build_run(llm.file, llm.offload, old.opts)
        llm.context = Context(llm.run, llm.offload, llm.path)
        try:
            old.close()
        except Exception:           # noqa: BLE001 - its connections are gone anyway
            pass
    return backend_problems(llm)
