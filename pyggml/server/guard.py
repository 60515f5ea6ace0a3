"""What keeps one request (or one web page, or one slow client) from freezing, exhausting or
misusing the server (docs/server.md, "Security and limits"):

- `Guard`, ASGI middleware in front of every route:
  * the Host header, when no API key is set, must name this server: an IP literal, `localhost`
    (and its subdomains), the `--host` name or an `--allowed-hosts` name, else 400 — a DNS
    rebinding page (a name of the attacker's that resolves to 127.0.0.1) sends its own name;
  * a POST's Content-Type, when no API key is set, must be JSON (application/json or
    something+json), else 415: a cross-site page can send text/plain or a form without a CORS
    preflight ("blind" requests), never application/json; a POST without Content-Type is
    taken from programs (curl, SDKs) but not from browsers (those send an Origin header);
  * a request body is read whole before the route runs, at most `max_body_bytes` (413 past
    it, from Content-Length when given) and within `body_timeout_s` (408): a half-sent body
    never holds a route.
- `parse_json`: JSON with depth and number-size limits (400 past them, not a 500), run off the
  event loop by the routes for bodies above a few KB.
- `GuardedH11Protocol`: uvicorn's h11 protocol with a deadline for a request's headers
  (`header_timeout_s`, the whole request line and headers; a slowloris client that sends a byte
  every few seconds is closed) — uvicorn has a keep-alive timeout only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass, field

MAX_JSON_DEPTH = 64
MAX_NUMBER_CHARS = 100          # digits of one JSON number (5,000-digit ints: 400, not a 500)
PARSE_INLINE_BYTES = 16 * 1024  # bodies up to this are parsed on the event loop (microseconds)


@dataclass
class Limits:
    """The server's limits on what requests may send (`pyggml serve` flags)."""
    max_body_bytes: int = 32 << 20
    body_timeout_s: float = 60.0            # the whole body, from the first byte of the request
    header_timeout_s: float = 10.0          # the request line and headers
    max_connections: int = 1024             # beyond: 503 (uvicorn's limit_concurrency)
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)


class JSONLimitError(ValueError):
    """A JSON body past MAX_JSON_DEPTH or MAX_NUMBER_CHARS, or not JSON."""


def _int(s: str):
    if len(s) > MAX_NUMBER_CHARS:
        raise JSONLimitError(f"a number of {len(s)} digits (at most {MAX_NUMBER_CHARS})")
    return int(s)


def _float(s: str):
    if len(s) > MAX_NUMBER_CHARS:
        raise JSONLimitError(f"a number of {len(s)} characters (at most {MAX_NUMBER_CHARS})")
    return float(s)


def _depth_ok(raw: bytes) -> bool:
    """Nesting of [ and { at most MAX_JSON_DEPTH (brackets inside strings counted too: a
    conservative bound that needs no parse; real requests nest a few levels)."""
    depth = 0
    # bytes.translate keeps only the bracket characters and quotes: a short scan in Python
    kept = raw.translate(None, bytes(b for b in range(256) if b not in b'[]{}"\\'))
    in_str = esc = False
    for ch in kept:
        if in_str:
            if esc:
                esc = False
            elif ch == 0x5C:
                esc = True
            elif ch == 0x22:
                in_str = False
            continue
        if ch == 0x22:
            in_str = True
        elif ch in (0x5B, 0x7B):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return False
        elif ch in (0x5D, 0x7D):
            depth -= 1
    return True


def parse_json(raw: bytes):
    """The JSON value of a request body; JSONLimitError (a 400) for invalid JSON, nesting
    deeper than MAX_JSON_DEPTH, numbers longer than MAX_NUMBER_CHARS."""
    if not _depth_ok(raw):
        raise JSONLimitError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return json.loads(raw, parse_int=_int, parse_float=_float)
    except JSONLimitError:
        raise
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise JSONLimitError(str(e)) from None
    except (RecursionError, ValueError) as e:
        raise JSONLimitError(f"{type(e).__name__}: {e}") from None


async def parse_json_async(raw: bytes):
    """parse_json, in a worker thread for bodies above PARSE_INLINE_BYTES."""
    if len(raw) <= PARSE_INLINE_BYTES:
        return parse_json(raw)
    return await asyncio.to_thread(parse_json, raw)


# ---- the Host header ----------------------------------------------------------------------------

def _host_name(value: str) -> str:
    """'Example.com:8080' -> 'example.com'; '[::1]:80' -> '::1'."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1:v.find("]")] if "]" in v else v
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def host_allowed(value: str | None, bind_host: str, allowed: tuple[str, ...]) -> bool:
    """May a request with this Host header be served without an API key? IP literals (a DNS
    rebinding attack needs a name), localhost and its subdomains, the bind host's name, and the
    `allowed` names (a leading '.' allows subdomains; '*' allows all). No Host (HTTP/1.0): yes."""
    if value is None:
        return True
    name = _host_name(value)
    if not name:
        return False
    if "*" in allowed:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    if name == "localhost" or name.endswith(".localhost"):
        return True
    names = {_host_name(bind_host)} | {a.lower().rstrip(".") for a in allowed}
    if name in names:
        return True
    return any(a.startswith(".") and (name.endswith(a) or name == a[1:]) for a in names)


def is_json_type(ctype: str | None) -> bool:
    if not ctype:
        return False
    t = ctype.split(";", 1)[0].strip().lower()
    return t == "application/json" or (t.startswith("application/") and t.endswith("+json"))


# ---- the middleware ------------------------------------------------------------------------------

async def _send_error(send, status: int, message: str, kind: str, headers=()) -> None:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: the Host and Content-Type checks (without an API key) and the bounded
    body read (always). `server`: its api_key, bind_host and limits are read per request."""

    def __init__(self, app, server):
        self.app, self.server = app, server

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        srv = self.server
        limits: Limits = srv.limits
        headers = {}
        for k, v in scope.get("headers") or []:
            headers.setdefault(k, v.decode("latin-1"))
        keyless = not srv.api_key
        if keyless and not host_allowed(headers.get(b"host"), srv.bind_host,
                                        limits.allowed_hosts):
            return await _send_error(
                send, 400, f"Host {headers.get(b'host')!r} is not this server's name: without "
                f"an API key only IP addresses, localhost and --allowed-hosts names are served "
                f"(against DNS rebinding)", "invalid_request_error")
        method = scope.get("method", "GET")
        if method not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        ctype = headers.get(b"content-type")
        # no Content-Type at all: a program's request (curl, SDKs) unless a browser sent it (a
        # browser sends Origin with every cross-site POST, and a typeless Blob body is "simple")
        if keyless and not is_json_type(ctype) and (ctype is not None
                                                    or b"origin" in headers):
            return await _send_error(
                send, 415, f"Content-Type must be application/json, got "
                f"{headers.get(b'content-type')!r} (a server without an API key takes JSON "
                f"only: a cross-site page cannot send that without the browser asking first)",
                "invalid_request_error")
        cl = headers.get(b"content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                return await _send_error(send, 400, "invalid Content-Length",
                                         "invalid_request_error")
            if n > limits.max_body_bytes:
                return await _send_error(send, 413, self._too_big(n), "invalid_request_error")
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.body_timeout_s
        while True:
            left = deadline - loop.time()
            try:
                msg = await asyncio.wait_for(receive(), max(0.0, left))
            except asyncio.TimeoutError:
                return await _send_error(
                    send, 408, f"the request body did not arrive within "
                    f"{limits.body_timeout_s:g} s", "invalid_request_error")
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > limits.max_body_bytes:
                return await _send_error(send, 413, self._too_big(size), "invalid_request_error")
            chunks.append(body)
            if not msg.get("more_body", False):
                break
        whole = b"".join(chunks)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()
        return await self.app(scope, replay, send)

    def _too_big(self, n: int) -> str:
        return (f"the request body has {'at least ' if n else ''}{n} bytes; at most "
                f"{self.server.limits.max_body_bytes} are taken (pyggml serve --max-body-bytes)")


# ---- uvicorn -------------------------------------------------------------------------------------

def guarded_protocol(header_timeout_s: float):
    """uvicorn's H11Protocol with a deadline for each request's line and headers."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _hdr_timer = None

        def _arm(self) -> None:
            if self._hdr_timer is None and not self.transport.is_closing():
                self._hdr_timer = self.loop.call_later(header_timeout_s, self._headers_late)

        def _disarm(self) -> None:
            if self._hdr_timer is not None:
                self._hdr_timer.cancel()
                self._hdr_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()
            elif self.conn.their_state is h11.IDLE:
                self._arm()              # headers (of a next request) not complete yet
            else:
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()       # the keep-alive timeout takes over

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _headers_late(self) -> None:
            self._hdr_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


def uvicorn_config(app, host: str, port: int, limits: Limits, **kw):
    """The uvicorn.Config `pyggml serve` runs: the guarded protocol (header deadline), at most
    limits.max_connections at once, a short keep-alive, shutdown within 2 s."""
    import uvicorn
    return uvicorn.Config(app, host=host, port=port, lifespan="off",
                          http=guarded_protocol(limits.header_timeout_s),
                          limit_concurrency=limits.max_connections, timeout_keep_alive=5,
                          timeout_graceful_shutdown=2, **{"log_level": "warning", **kw})
