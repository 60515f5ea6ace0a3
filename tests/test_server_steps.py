"""How the server's engine cuts prompts into steps (pyggml/server/engine.py): chunks sized to
`step_target_s` from the measured seconds per row, and a new request's first chunk in a step
without older prompts' chunks, so that its time to first token does not wait for a long prompt.
The steps are observed by wrapping the LLM context's decode; SmolLM2, every wait bounded."""
import threading

import httpx
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread
from pyggml.server.engine import Engine
from pyggml.errors import PyggmlError

LONG = " ".join(f"item {i} is a word." for i in range(150))       # ~900 tokens


@pytest.fixture(scope="module")
def llm():
    with LLM(ensure_smollm2(), n_ctx=4096, n_threads=2, n_seq_max=2) as m:
        yield m


def _served(llm, step_target_s):
    steps = []
    orig = llm.context.decode       # every step of the engine is one decode

    def spy(batch, *a, **k):
        steps.append([(sid, len(toks)) for toks, sid in batch])
        return orig(batch, *a, **k)
    llm.context.decode = spy
    rs = start_in_thread(make_server(llm, 2, "m", step_target_s=step_target_s))
    return rs, steps, orig


def _complete(base, prompt, max_tokens, out, key):
    r = httpx.post(f"{base}/v1/completions", timeout=120,
                   json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    out[key] = r.json()


def test_a_short_request_gets_its_own_step_while_a_long_prompt_is_evaluated(llm):
    llm.reset(0), llm.reset(1)
    rs, steps, orig = _served(llm, 0.05)
    base = f"http://127.0.0.1:{rs.port}"
    try:
        n_long = len(llm.tokenize(LONG))
        out = {}
        t = threading.Thread(target=_complete, args=(base, LONG, 1, out, "long"))
        t.start()
        for _ in range(400):                      # until the long prompt has had a step
            if steps:
                break
            threading.Event().wait(0.01)
        _complete(base, "Hi", 2, out, "short")
        t.join(120)
        assert not t.is_alive()
    finally:
        rs.stop()
        llm.context.decode = orig
    long_sid = steps[0][0][0]
    rows = [sum(n for _, n in s) for s in steps]
    # the long prompt went in several chunks, none of them a whole ubatch
    long_chunks = [n for s in steps for sid, n in s if sid == long_sid]
    assert len(long_chunks) >= 3 and sum(long_chunks[:-1]) < n_long
    assert max(rows) < llm.n_ubatch
    # the short request's first step held no chunk of the long prompt
    short_first = next(i for i, s in enumerate(steps) if any(sid != long_sid for sid, _ in s))
    assert all(sid != long_sid for sid, _ in steps[short_first])
    assert any(sid == long_sid for s in steps[short_first + 1:] for sid, _ in s), \
        "the long prompt ended before the short request came: the test saw no overlap"
    assert out["short"]["usage"]["completion_tokens"] == 2
    assert out["long"]["usage"]["prompt_tokens"] == n_long
    # and the answer is the one a lone request gets
    llm.reset(0), llm.reset(1)
    alone = llm.create_completion("Hi", max_tokens=2, temperature=0)
    assert out["short"]["choices"][0]["text"] == alone["choices"][0]["text"]


def test_step_target_zero_takes_whole_ubatches(llm):
    llm.reset(0), llm.reset(1)
    rs, steps, orig = _served(llm, 0)
    try:
        out = {}
        _complete(f"http://127.0.0.1:{rs.port}", LONG, 1, out, "long")
    finally:
        rs.stop()
        llm.context.decode = orig
    assert steps[0] == [(steps[0][0][0], llm.n_ubatch)]


def test_step_target_is_checked(llm):
    with pytest.raises(PyggmlError, match="step_target_s must be >= 0"):
        Engine(llm, 1, step_target_s=-1)
