"""Greedy output never depends on who else is served (issue 34, items 6 and 9).

The cause found: the attention accumulates over a sequence's KV cells in cell-index order, and
the cache handed out the lowest free cells, so a token placed in a hole before its sequence's
older cells (a hole left by another sequence, or by a prefix cache trimmed for a new request)
rounded differently from the same token decoded alone. KVCache places each sequence's new
cells after the cells it holds (pyggml/llm/kv_cache.py find_slot_ordered).

And several threads calling LLM.create_completion on the default sequence run one after
another (llama-cpp-python's behaviour), never interleaved into wrong text. SmolLM2 on loopback;
every loop is bounded in count and time."""
import threading

import httpx
import numpy as np
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread

T = 120
PROMPTS = ["The capital of France is", "One, two, three, four,", "def add(a, b):\n   ",
           "Once upon a time, in a small village,", "The best way to learn Python is",
           "Water boils at", "My favourite colour is", "The largest planet in the solar system"]


@pytest.fixture(scope="module")
def llm():
    m = LLM(ensure_smollm2(), n_ctx=2048, n_threads=2, n_seq_max=4)
    yield m
    m.close()


def _alone(llm, toks, steps=6):
    llm.reset()
    logits = [llm.decode_batch([(toks, 0)])[0]]
    fed = []
    for _ in range(steps):
        fed.append(int(np.argmax(logits[-1])))
        logits.append(llm.decode_batch([([fed[-1]], 0)])[0])
    return logits, fed


def test_a_sequence_decoded_over_holes_equals_alone(llm):
    """Another sequence's freed cells lie before this one's: its next tokens must not go there
    (they did, and a logit moved by 0.1)."""
    ta, tb = llm.tokenize(PROMPTS[3]), llm.tokenize(PROMPTS[0] * 3)
    want, fed = _alone(llm, ta)
    llm.reset()
    llm.decode_batch([(tb, 1)])
    got = [llm.decode_batch([(ta, 0)])[0]]
    llm.context.seq_reset(1)                  # holes before sequence 0's cells
    for t in fed:
        got.append(llm.decode_batch([([t], 0)])[0])
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.tobytes() == g.tobytes(), (step, float(np.max(np.abs(w - g))))
    cells = np.flatnonzero(llm.context.kv.spaces["full"].seqs & np.uint64(1))
    pos = llm.context.kv.spaces["full"].pos[cells]
    assert list(pos) == sorted(pos)           # cell order is position order


def test_a_trimmed_prefix_cache_then_reuse_equals_alone(llm):
    """A prefix kept from an earlier reply, the tail dropped, the new prompt's tokens decoded
    after it while other sequences fill the freed cells."""
    ta = llm.tokenize(PROMPTS[4])
    want, fed = _alone(llm, ta)
    llm.reset()
    llm.decode_batch([(ta + llm.tokenize(" and many more words here"), 0)])
    llm.context.seq_keep_first(0, len(ta) - 3)
    llm.decode_batch([(llm.tokenize(PROMPTS[1]), 2)])       # takes the freed cells
    got = [llm.decode_batch([(ta[len(ta) - 3:], 0)])[0]]
    for i, t in enumerate(fed):
        got.append(llm.decode_batch([([t], 0), ([11 + i], 2)])[0])
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.tobytes() == g.tobytes(), (step, float(np.max(np.abs(w - g))))


def test_threads_on_one_llm_serialize_create_completion(llm):
    llm.reset()
    ref = {p: llm.create_completion(p, max_tokens=10, temperature=0)["choices"][0]["text"]
           for p in PROMPTS[:4]}
    results, errors = [], []

    def worker(i):
        for k in range(3):
            p = PROMPTS[(i + k) % 4]
            try:
                results.append(llm.create_completion(p, max_tokens=10, temperature=0)
                               ["choices"][0]["text"] == ref[p])
                results.append(llm.create_chat_completion(
                    [{"role": "user", "content": p}], max_tokens=6, temperature=0)
                    ["choices"][0]["message"]["content"] is not None)
            except Exception as e:              # noqa: BLE001 - counted
                errors.append(repr(e))
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(T)
    assert errors == [] and len(results) == 24 and all(results)


def _stream(base, prompt, max_tokens=12):
    text = []
    with httpx.stream("POST", f"{base}/v1/completions", timeout=T, json={
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                import json
                c = json.loads(line[6:])
                text.append(c["choices"][0]["text"])
    return "".join(text)


def test_greedy_streams_under_load_equal_alone(llm):
    """8 clients × 3 streamed greedy requests with different prompts (and repeated ones, whose
    prefixes come from slot caches built in mixed batches) = the same requests alone."""
    rs = start_in_thread(make_server(llm, 4, "smollm2", queue_size=32, step_target_s=0.05))
    base = f"http://127.0.0.1:{rs.port}"
    try:
        alone = {}
        for p in PROMPTS:
            alone[p] = _stream(base, p)
        got, errors = [], []

        def client(i):
            for k in range(3):
                p = PROMPTS[(i + 3 * k) % len(PROMPTS)]
                try:
                    got.append((p, _stream(base, p)))
                except Exception as e:          # noqa: BLE001 - counted
                    errors.append(repr(e))
        ts = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(T * 2)
        assert errors == [] and len(got) == 24
        wrong = [(p, g, alone[p]) for p, g in got if g != alone[p]]
        assert not wrong, f"{len(wrong)} of 24 differ: {wrong[:2]}"
        # and alone again afterwards (prefix caches built under load)
        assert all(_stream(base, p) == alone[p] for p in PROMPTS[:4])
    finally:
        rs.stop()
