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


# ---- sliding-window layers (Gemma 3: 5 of 6 layers see the last 512 positions) ---------------
@pytest.fixture(scope="module")
def gemma():
    """Two sequences, ubatches of 64: the sliding-window layers get their own cell space
    (smaller than n_ctx), so its placement is what these tests see."""
    from pyggml.models_default import ensure_default_model
    m = LLM(ensure_default_model(), n_ctx=2048, n_threads=2, n_seq_max=2, n_ubatch=64)
    assert "swa" in m.kv.spaces and m.kv.spaces["swa"].n_cells < m.n_ctx
    yield m
    m.close()


def _swa_cells_in_position_order(m, seq_id):
    sp = m.context.kv.spaces["swa"]
    cells = np.flatnonzero(sp.seqs & np.uint64(1 << seq_id))
    return sp.pos[cells]


def test_swa_a_sequence_decoded_over_holes_equals_alone(gemma):
    """As the full space's test above, in the sliding-window space: another sequence's freed
    cells lie before this one's."""
    m = gemma
    ta = m.tokenize("The history of the old harbour town begins with fishermen. " * 3)[:20]
    tb = m.tokenize(PROMPTS[0] * 20)[:90]
    want, fed = _alone(m, ta)
    m.reset()
    m.decode_batch([(tb, 1)])
    got = [m.decode_batch([(ta, 0)])[0]]
    m.context.seq_reset(1)
    for t in fed:
        got.append(m.decode_batch([([t], 0)])[0])
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.tobytes() == g.tobytes(), (step, float(np.max(np.abs(w - g))))


def test_swa_past_the_window_beside_another_sequence_equals_alone(gemma):
    """A sequence longer than the window (its oldest cells are dropped and reused) decoded
    beside another one, and after a prefix of it was trimmed and taken up again, gives the
    logits of the same tokens alone, bit for bit."""
    m = gemma
    ta = m.tokenize("The history of the old harbour town begins with fishermen. " * 60)[:600]
    tb = m.tokenize("Bread is made of flour, water, salt and yeast, kneaded well. " * 60)[:540]
    assert len(ta) == 600 and len(tb) == 540

    def run(neighbour: bool):
        m.reset()
        if neighbour:
            m.decode_batch([(tb[:100], 1)])
        out, k = [], 0
        for n in (64, 64, 128, 200, 144):          # uneven chunks, beside the other's
            seqs = [(ta[k:k + n], 0)]
            if neighbour and 100 + k < len(tb):
                seqs.append((tb[100 + k:100 + k + 37], 1))
            out.append(m.decode_batch(seqs)[0])
            k += n
            if neighbour and k == 256:          # its cells freed: holes among this one's
                m.context.seq_reset(1)
        fed = [int(np.argmax(out[-1]))]
        for i in range(6):
            seqs = [([fed[-1]], 0)] + ([([7 + i], 1)] if neighbour else [])
            out.append(m.decode_batch(seqs)[0])
            fed.append(int(np.argmax(out[-1])))
        return out, fed
    want, fed = run(False)
    got, _ = run(True)
    for step, (w, g) in enumerate(zip(want, got)):
        assert w.tobytes() == g.tobytes(), (step, float(np.max(np.abs(w - g))))
    # the last token dropped (a trimmed prefix cache), the other sequence takes cells, the
    # token evaluated again: the same logits
    n = m.context.seq_len(0)
    assert n == 606 and m.context.kv.can_keep_prefix(0, n - 1)
    m.context.seq_keep_first(0, n - 1)
    m.decode_batch([(tb[300:340], 1)])
    again = m.decode_batch([([fed[-2]], 0)])[0]
    assert again.tobytes() == want[-1].tobytes()


def test_swa_rings_give_the_logits_of_the_full_space_until_they_wrap(gemma):
    """The second sequence's ring, beside the first, past the window (cells dropped) but before
    the ring wraps (window + n_ubatch = 576 positions): the logits of --swa-full (every cell
    kept, in position order, masking alone hides the rest) bit for bit. Once a ring wraps, a
    query's newest keys sit before its oldest: another order, the same for every sequence."""
    from pyggml.models_default import ensure_default_model
    m = gemma
    assert m.kv.swa_ring == 512 + 64
    ta = m.tokenize("The history of the old harbour town begins with fishermen. " * 60)[:570]
    tb = m.tokenize("Bread is made of flour, water, salt and yeast, kneaded well. " * 60)[:300]
    m.reset()
    m.decode_batch([(tb[:150], 0)])
    got = [m.decode_batch([(ta[:320], 1), (tb[150:], 0)])[1], m.decode_batch([(ta[320:], 1)])[1]]
    assert m.context.kv.seq_pos_min(1, "swa") > 0           # the window dropped cells
    with LLM(ensure_default_model(), n_ctx=2048, n_threads=2, n_seq_max=2, n_ubatch=64,
             swa_full=True) as full:
        assert "swa" not in full.kv.spaces
        want = [full.decode_batch([(ta[:320], 0)])[0], full.decode_batch([(ta[320:], 0)])[0]]
    for w, g in zip(want, got):
        assert w.tobytes() == g.tobytes(), float(np.max(np.abs(w - g)))
