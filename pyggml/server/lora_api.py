"""llama-server's LoRA endpoints and its per-request "lora" field (pyggml/llm/lora.py has the
adapters; `pyggml serve --lora FILE` / `--lora-scaled FILE:SCALE` loads them).

- GET /lora-adapters: [{id, path, scale, task_name, prompt_prefix}], the global scales.
- POST /lora-adapters [{id, scale}, ...]: sets the global scales; an adapter not listed gets 0
  (llama-server's construct_lora_list). Requests already running keep the scales they started
  with; later ones use the new ones.
- A request's "lora": [{id, scale}, ...] for that request only (again: not listed → 0); absent,
  null or []: the global scales at the time the request arrives.

An unknown id, a scale that is no finite number or a malformed entry is a 400 naming the field
(llama-server ignores unknown ids; here nothing is ignored silently). Prefix caching and scale
changes: every slot's KV cells carry the scales they were computed under, and a request reuses
a slot's cells only when its scales are the same (Context.reuse_prefix), so a scale change never
reuses KV computed under another scale — where llama-server clears a slot's cache when the
slot's adapters change, pyggml keeps it for a later request with the old scales.
"""

from __future__ import annotations

import asyncio
import json
import math

from starlette.responses import JSONResponse

from pyggml.server import guard
from pyggml.server.http import BadRequest


def scales_of(llm, entries, field: str = "lora") -> tuple:
    """[{id, scale}, ...] → one scale per loaded adapter (not listed: 0), else BadRequest."""
    n = len(llm.context.adapters)
    if not isinstance(entries, list):
        raise BadRequest(f"'{field}' must be a list of {{\"id\": N, \"scale\": X}} objects, got "
                         f"{json.dumps(entries)[:40]}", field)
    scales = [0.0] * n
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) - {"id", "scale"} or "id" not in e:
            raise BadRequest(f"'{field}[{i}]' must be an object {{\"id\": N, \"scale\": X}}, got "
                             f"{json.dumps(e)[:60]}", field)
        aid, scale = e["id"], e.get("scale", 0.0)
        if isinstance(aid, bool) or not isinstance(aid, int) or not 0 <= aid < n:
            which = f"ids 0..{n - 1}" if n else "none is loaded: serve --lora FILE"
            raise BadRequest(f"'{field}[{i}].id': no LoRA adapter {json.dumps(aid)[:20]} "
                             f"({which})", field)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or \
                not math.isfinite(scale):
            raise BadRequest(f"'{field}[{i}].scale' must be a finite number, got "
                             f"{json.dumps(scale)[:20]}", field)
        scales[aid] = float(scale)
    return tuple(scales)


def request_scales(llm, body: dict) -> tuple:
    """The scales a completion request is decoded with: its "lora" field, else the global
    scales now (frozen: a later POST /lora-adapters does not change a running request)."""
    entries = body.get("lora")
    if entries is None or entries == []:
        return tuple(llm.context.lora_scales)
    return scales_of(llm, entries)


async def list_adapters(server, request):
    """GET /lora-adapters."""
    return JSONResponse(server.llm.lora_adapters)


async def set_adapters(server, request):
    """POST /lora-adapters: [{id, scale}, ...] → the global scales; {"success": true}."""
    raw = await request.body()
    try:
        body = await guard.parse_json_async(raw)
    except guard.JSONLimitError as e:
        raise BadRequest(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, list):
        raise BadRequest("the request body must be an array of {\"id\": N, \"scale\": X}")
    scales = scales_of(server.llm, body, "body")
    # the context's lock: waits for a decode step in progress (off the event loop)
    await asyncio.to_thread(server.llm.set_lora_scales, list(scales))
    return JSONResponse({"success": True})
