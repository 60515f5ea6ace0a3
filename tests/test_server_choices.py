"""n > 1 on the server evaluates the prompt once (pyggml/server/choices.py, engine.py): the
further choices share the first one's KV cells and last logits (Generation.start_copy), as
llama-server's n_cmpl children copy their parent's state. The prompt tokens the engine
evaluated (its counter, /metrics' prompt tokens) are the prompt's once per request, where
separate slots took them n times; the texts are those of separate n = 1 requests with seeds
seed + i (greedy: n copies of the greedy text), streamed or not, on both endpoints, and with
several prompts; a further choice whose first choice goes away before its prompt was
evaluated evaluates the prompt itself."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.testclient import TestClient

from pyggml.llm.completion import sampling_params
from pyggml.llm.generate import Generation
from pyggml.llm.runtime import LLM
from pyggml.server import make_server
from pyggml.server.engine import Job

HOT = {"temperature": 30.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
N = 3


@pytest.fixture(scope="module")
def served(tiny_models):
    llm = LLM(tiny_models.get("llama").path, n_ctx=1024, n_threads=1, n_seq_max=N)
    server = make_server(llm, N, "tiny", chat_template="chatml")
    with TestClient(server.app, base_url="http://127.0.0.1") as c:
        yield c, server
    server.engine.stop()
    llm.close()


def _text(chat):
    return (lambda ch: ch["message"]["content"]) if chat else (lambda ch: ch["text"])


def _stream_texts(r, chat):
    out = {}
    for line in r.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for ch in json.loads(line[6:])["choices"]:
                piece = ch["delta"].get("content") if chat else ch["text"]
                out[ch["index"]] = out.get(ch["index"], "") + (piece or "")
    return out


def _evaluated(server, fn):
    """(what fn() returned, the prompt tokens the engine evaluated meanwhile)."""
    before = server.engine.metrics.prompt_tokens_total
    out = fn()
    return out, server.engine.metrics.prompt_tokens_total - before


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_prompt_is_evaluated_once(served, endpoint, stream):
    c, server = served
    chat = "chat" in endpoint
    words = " ".join(f"w{i}" for i in range(40 + 7 * stream + 3 * chat))    # a fresh prompt
    base = ({"messages": [{"role": "user", "content": words}]} if chat else {"prompt": words})
    base.update(max_tokens=8, ignore_eos=True, **HOT)
    alone = [c.post(endpoint, json=dict(base, seed=5 + i)).json() for i in range(N)]
    singles = [_text(chat)(a["choices"][0]) for a in alone]
    assert len(set(singles)) == N                  # the seeds make the choices differ
    n_prompt = alone[0]["usage"]["prompt_tokens"]
    for s in server.engine.slots:                  # no prefix cache helps the request below
        server.llm.reset(s.seq_id)
    body = dict(base, n=N, seed=5)
    if stream:
        def run():
            with c.stream("POST", endpoint, json=dict(body, stream=True)) as r:
                return _stream_texts(r, chat)
        got, evaluated = _evaluated(server, run)
        assert got == dict(enumerate(singles))
    else:
        r, evaluated = _evaluated(server, lambda: c.post(endpoint, json=body))
        assert r.status_code == 200, r.text
        out = r.json()
        assert [_text(chat)(ch) for ch in out["choices"]] == singles
        assert out["usage"]["completion_tokens"] == 8 * N
        assert out["usage"]["prompt_tokens"] == n_prompt
        assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert n_prompt > 40 and evaluated == n_prompt, \
        f"{evaluated} prompt tokens evaluated for {N} choices of a prompt of {n_prompt}"


def test_greedy_choices_are_the_greedy_text(served):
    c, server = served
    base = {"prompt": "w7 w8 w9 w10 w11 w12", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True}
    one = c.post("/v1/completions", json=base).json()["choices"][0]["text"]
    out = c.post("/v1/completions", json=dict(base, n=N)).json()
    assert [ch["text"] for ch in out["choices"]] == [one] * N


def test_several_prompts_each_evaluated_once(served):
    c, server = served
    # token ids without BOS, starting differently: no prefix of one is cached for the other
    ids = server.llm.tokenize(" ".join(f"w{i}" for i in range(60, 90)), add_special=False)
    prompts = [ids[1:], ids[2:] + ids[:2]]
    assert prompts[0][0] != prompts[1][0]
    base = {"max_tokens": 5, "ignore_eos": True, "seed": 9, **HOT}
    singles = [[c.post("/v1/completions", json=dict(base, prompt=p, seed=9 + i)).json()
                ["choices"][0]["text"] for i in range(2)] for p in prompts]
    for s in server.engine.slots:
        server.llm.reset(s.seq_id)
    r, evaluated = _evaluated(server, lambda: c.post("/v1/completions",
                                                     json=dict(base, prompt=prompts, n=2)))
    assert r.status_code == 200, r.text
    out = r.json()
    assert [ch["text"] for ch in out["choices"]] == singles[0] + singles[1]
    assert evaluated == len(prompts[0]) + len(prompts[1]) == out["usage"]["prompt_tokens"]


def test_a_choice_whose_first_went_away_evaluates_the_prompt(served):
    """The first choice cancelled while waiting: the others are admitted on their own."""
    c, server = served
    llm, engine = server.llm, server.engine
    ids = llm.tokenize("w20 w21 w22 w23")

    def gen(seed):
        return Generation(llm.tokenizer, ids, 6, sampling_params(seed=seed, **HOT),
                          stop_at_eog=False)

    async def run():
        loop = asyncio.get_running_loop()
        jobs = [Job("complete", loop, asyncio.Queue(), ids=ids, gen=gen(31 + i))
                for i in range(N)]
        first, rest = jobs[0], jobs[1:]
        first.children = rest
        for j in rest:
            j.parent = first
        first.cancelled.set()
        engine.submit(first)
        texts = []
        for j in rest:
            parts = []
            while True:
                ev = await asyncio.wait_for(j.events.get(), 60)
                if ev[0] == "text":
                    parts.append(ev[1])
                elif ev[0] == "done":
                    break
                else:
                    raise AssertionError(ev)
            texts.append("".join(parts))
        return texts
    texts = asyncio.run(run())
    alone = [c.post("/v1/completions", json={"prompt": ids, "max_tokens": 6, "seed": 31 + i,
                                             "ignore_eos": True, **HOT}).json()
             ["choices"][0]["text"] for i in range(1, N)]
    assert texts == alone
