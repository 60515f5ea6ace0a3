"""`n` > 1 (OpenAI's several choices; llama-server's n_cmpl): the request runs as n one-choice
requests at once on n slots — choice i with seed + i (a random seed stays random), so choice 0
is what n = 1 gives — and their answers are merged: one response with choices 0..n-1 (usage:
the prompt once, the completion tokens of all), or one stream whose chunks carry their choice's
index. n is at most the server's slots (-np), as llama-server bounds n_cmpl by n_parallel.

The prompt is evaluated once: the n jobs go to the engine as one `Group` — the first with the
others as its children, admitted together when n slots are free; when the first has evaluated
the prompt, each further choice's sequence shares its KV cells and samples its first token
from the same logits (pyggml/server/engine.py, Generation.start_copy), as llama-server copies
a parent slot's state to its children. The tokens are the ones n separate requests with those
seeds give.
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


class Group:
    """The n choices of one prompt, as their jobs are built (one request handler each): when
    the last is added, the first is submitted with the others as its children (one queue
    entry; pyggml/server/engine.py). Choices whose prompts differ after all (a template that
    renders differently per call) are submitted one by one, each evaluating its own."""

    def __init__(self, n: int):
        self.n, self.jobs = n, {}

    def member(self, i: int):
        """What choice i's handler passes on with its job: add(job, submit) for choice i."""
        return lambda job, submit: self.add(i, job, submit)

    def add(self, i: int, job, submit) -> None:
        """Choice i's job; submit(job) hands one job to the engine (BadRequest when it cannot:
        the other choices' jobs then end with the same error)."""
        self.jobs[i] = job
        if len(self.jobs) < self.n:
            return
        first, rest = self.jobs[0], [self.jobs[k] for k in range(1, self.n)]
        together = all(j.ids == first.ids for j in rest)
        if together:
            first.children = rest
            for j in rest:
                j.parent = first
        try:
            for j in [first] if together else [first] + rest:
                submit(j)
        except BadRequest as e:
            for j in rest:
                j.emit("error", e.status, str(e))
            raise


def members(n_bodies: int, n: int) -> list:
    """Per one-choice body (prompt by prompt, each prompt's n choices in order): the Group
    member its handler passes on (None when n is 1: nothing to share)."""
    if n <= 1:
        return [None] * n_bodies
    groups = [Group(n) for _ in range(n_bodies // n)]
    return [groups[j // n].member(j % n) for j in range(n_bodies)]


def _usage(parts: list[dict], per_prompt: int = 1) -> dict:
    """One usage of several runs; per_prompt: consecutive runs that share a prompt (counted
    once each)."""
    u = dict(parts[0])
    u["prompt_tokens"] = sum(p.get("prompt_tokens", 0) for p in parts[::per_prompt])
    u["completion_tokens"] = sum(p.get("completion_tokens", 0) for p in parts)
    u["total_tokens"] = u.get("prompt_tokens", 0) + u["completion_tokens"]
    return u


async def merged(runs, per_prompt: int = 1) -> dict | Response:
    """The answers of one-choice runs (coroutines giving a response dict, or a Response to
    send instead) as one response; the first failure is sent as it is."""
    outs = await asyncio.gather(*runs)
    for o in outs:
        if isinstance(o, Response):
            return o
    first = dict(outs[0])
    first["choices"] = [dict(o["choices"][0], index=i) for i, o in enumerate(outs)]
    if all("usage" in o for o in outs):
        first["usage"] = _usage([o["usage"] for o in outs], per_prompt)
    return first


async def merged_stream(streams, include_usage: bool, per_prompt: int = 1):
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
            yield dict(last, usage=_usage([usages[i] for i in range(len(tasks))], per_prompt))
    finally:
        for t in tasks:
            t.cancel()


MAX_PROMPTS = 64        # prompts in one completions request (each a queued one-choice run)


def prompt_bodies(body: dict, n_slots: int) -> tuple[list[dict], int] | None:
    """OpenAI's batched completions: a `prompt` list of several prompts (strings, or lists of
    token ids) as one-choice bodies, prompt by prompt and each prompt's n choices in order (so
    choice k·n + i is prompt k's choice i, as OpenAI numbers them), and n; None for one prompt."""
    prompt = body.get("prompt")
    if not (isinstance(prompt, list) and len(prompt) > 1 and
            (all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt))):
        return None
    if len(prompt) > MAX_PROMPTS:
        raise BadRequest(f"'prompt' has {len(prompt)} prompts, at most {MAX_PROMPTS} are taken",
                         "prompt")
    out, n = [], 1
    for p in prompt:
        one = dict(body, prompt=p)
        if wanted(one):
            parts = choice_bodies(one, n_slots)
            n = len(parts)
        else:
            parts = [one]
        out += parts
    return out, n

