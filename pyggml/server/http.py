"""What every API module of the server shares (app.py's OpenAI routes, anthropic_api.py,
responses_api.py, props.py): the request-error exception, OpenAI's error object, the bounded
JSON body read, llama-server's sampling defaults. A module of its own so the API modules and
app.py import it, not each other."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse

from pyggml.server import guard

#: llama-server's sampling defaults
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.param, self.status, self.kind, self.headers = param, status, kind, headers


def bool_field(body: dict, name: str, default: bool = False) -> bool:
    """A request's boolean field (absent or null: `default`); BadRequest naming it otherwise."""
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{name}' must be a boolean, got {json.dumps(v)[:40]}", name)
    return v


def error_response(status: int, message: str, param=None, kind="invalid_request_error",
                   headers=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status}}, status_code=status, headers=headers)


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    try:                        # bounded depth and numbers; big bodies off the event loop
        body = await guard.parse_json_async(raw)
    except guard.JSONLimitError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def sse(obj) -> str:
    """One server-sent event carrying `obj` as JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

