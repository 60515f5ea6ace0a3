"""`n` > 1 (OpenAI's several choices; llama-server's n_cmpl): the request runs as n one-choice
requests at once on n slots — choice i with seed + i (a random seed stays random), so choice 0
is what n = 1 gives — and their answers are merged: one response with choices 0..n-1 (usage:
the prompt once, the completion tokens of all), or one stream whose chunks carry their choice's
index. n is at most the server's slots (-np), as llama-server bounds n_cmpl by n_parallel.
Each slot evaluates the prompt itself (its own prefix cache; the slots do not share cells).
"""

from __future__ import annotations

import asyncio
import json

from starlette.responses import Response

from pyggml.server.http import BadRequest

SEED_RANDOM = (None, -1, 0xFFFFFFFF)


def wanted(body: dict) -> bool:
    """Whether the body asks for more than one choice (a bad n is checked by choice_bodies)."""
    n = body.get("n")
    return n is not None and n != 1


def choice_bodies(body: dict, n_slots: int) -> list[dict]:
    """The one-choice bodies of a request with n choices; BadRequest naming n when it is not
    an integer in 1..n_slots."""
    n = body.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= n_slots:
        raise BadRequest(f"'n' must be an integer in 1..{n_slots} (the server's slots, -np), "
                         f"got {json.dumps(n)[:40]}", "n")
    seed = body.get("seed")
    out = []
    for i in range(n):
        b = {k: v for k, v in body.items() if k != "n"}
        if i and seed not in SEED_RANDOM and isinstance(seed, int) and not isinstance(seed, bool):
            b["seed"] = (seed + i) % 0xFFFFFFFF
        out.append(b)
    return out


def _usage(parts: list[dict]) -> dict:
    u = dict(parts[0])
    u["completion_tokens"] = sum(p.get("completion_tokens", 0) for p in parts)
    u["total_tokens"] = u.get("prompt_tokens", 0) + u["completion_tokens"]
    return u


async def merged(runs) -> dict | Response:
    """The answers of one-choice runs (coroutines giving a response dict, or a Response to
    send instead) as one response; the first failure is sent as it is."""
    outs = await asyncio.gather(*runs)
    for o in outs:
        if isinstance(o, Response):
            return o
    first = dict(outs[0])
    first["choices"] = [dict(o["choices"][0], index=i) for i, o in enumerate(outs)]
    if all("usage" in o for o in outs):
        first["usage"] = _usage([o["usage"] for o in outs])
    return first


async def merged_stream(streams, include_usage: bool):
    """The chunks of one-choice streams (async iterators of chunk dicts), each with its choice's
    index, as they come; one usage-only chunk at the end when include_usage. Closing it closes
    every stream (their requests are cancelled)."""
    q: asyncio.Queue = asyncio.Queue()

    async def pump(i, it):
        try:
            async for c in it:
                await q.put((i, c))
        finally:
            await q.put((i, None))
    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    left, usages, last = len(tasks), {}, None
    try:
        while left:
            i, c = await q.get()
            if c is None:
                left -= 1
                continue
            if "choices" in c and not c["choices"]:         # a usage-only chunk: merged below
                usages[i], last = c.get("usage"), c
                continue
            if "choices" in c:
                c = dict(c, choices=[dict(x, index=i) for x in c["choices"]])
            yield c
        if include_usage and last is not None and all(usages.get(i) for i in range(len(tasks))):
            yield dict(last, usage=_usage([usages[i] for i in range(len(tasks))]))
    finally:
        for t in tasks:
            t.cancel()
