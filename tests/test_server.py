"""`pyggml serve` (pyggml/server/): the official `openai` client and raw HTTP against servers on
free loopback ports. SmolLM2-135M-Instruct for most tests; Gemma 3 270M for "batching is
invisible" (its Q4_K matmuls give the same bits with one row or many, so the tokens of a stream
decoded beside others must equal the same request alone). Every request loop is bounded in
count and time."""
import json
import random
import threading
import time

import httpx
import openai
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import bind_warning, make_server, start_in_thread
from support.http_server import metrics

TIMEOUT_S = 60


@pytest.fixture(scope="module")
def smol_server():
    llm = LLM(ensure_smollm2(), n_ctx=4096, n_threads=2, n_seq_max=4)
    rs = start_in_thread(make_server(llm, 4, "smollm2", queue_size=16))
    base = f"http://127.0.0.1:{rs.port}"
    yield base, openai.OpenAI(base_url=f"{base}/v1", api_key="none", timeout=TIMEOUT_S,
                              max_retries=0)
    rs.stop()
    llm.close()


@pytest.fixture(scope="module")
def smol_ref():
    with LLM(ensure_smollm2(), n_ctx=1024, n_threads=2) as m:
        yield m


MSGS = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Name the largest planet of the solar system."}]


def test_chat_greedy_equals_the_python_api_stream_and_usage(smol_server, smol_ref):
    base, client = smol_server
    r = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=16,
                                       temperature=0)
    ref = smol_ref.create_chat_completion(MSGS, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == ref["choices"][0]["message"]["content"]
    assert r.choices[0].finish_reason == ref["choices"][0]["finish_reason"]
    assert r.usage.prompt_tokens == ref["usage"]["prompt_tokens"]
    assert r.usage.completion_tokens == ref["usage"]["completion_tokens"]
    stream = client.chat.completions.create(model="smollm2", messages=MSGS, max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        r.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # the second request found its prompt in a slot's cache (a slot keeps the cells of its
    # prompt and reply; the last prompt token is always evaluated again for its logits)
    cached = chunks[-1].usage.prompt_tokens_details.cached_tokens
    assert r.usage.prompt_tokens - 2 <= cached < r.usage.prompt_tokens
    assert metrics(base)["pyggml_prompt_tokens_reused_total"] >= r.usage.prompt_tokens - 2


def test_completion_stop_strings_logprobs_and_echo(smol_server, smol_ref):
    base, client = smol_server
    prompt = "The days of the week are Monday, Tuesday,"
    full = client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0)
    ref = smol_ref.create_completion(prompt, max_tokens=20, temperature=0)
    assert full.choices[0].text == ref["choices"][0]["text"]
    text = full.choices[0].text
    stop = text[len(text) // 2:len(text) // 2 + 4]
    r = client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0,
                                  stop=[stop])
    assert r.choices[0].text == text[:text.index(stop)] and r.choices[0].finish_reason == "stop"
    s = list(client.completions.create(model="m", prompt=prompt, max_tokens=20, temperature=0,
                                       stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text
    lp = client.completions.create(model="m", prompt=prompt, max_tokens=3, temperature=0,
                                   logprobs=2, echo=True)
    assert lp.choices[0].text.startswith(prompt)
    assert len(lp.choices[0].logprobs.tokens) == 3 == lp.usage.completion_tokens


def test_small_endpoints(smol_server):
    base, client = smol_server
    assert httpx.get(f"{base}/health", timeout=10).json() == {"status": "ok"}
    assert client.models.list().data[0].id == "smollm2"
    toks = httpx.post(f"{base}/tokenize", json={"content": "Hello world"}, timeout=10).json()
    assert toks["tokens"] and all(isinstance(t, int) for t in toks["tokens"])
    back = httpx.post(f"{base}/detokenize", json=toks, timeout=10).json()
    assert back == {"content": "Hello world"}
    e = client.embeddings.create(model="m", input=["a cat", "a dog"])
    assert len(e.data) == 2 and len(e.data[0].embedding) == 576
    assert abs(sum(x * x for x in e.data[0].embedding) - 1) < 1e-4
    m = httpx.get(f"{base}/metrics", timeout=10)
    assert m.headers["content-type"].startswith("text/plain")
    for name in ("requests_total", "tokens_predicted_total", "predicted_tokens_seconds",
                 "queue_length", "kv_cells_used"):
        assert f"pyggml_{name}" in m.text


def test_context_overflow_is_a_400_naming_the_prompt(smol_server):
    """The slots share the whole context (tests/test_server_context.py): 1,100 tokens fit in
    one request of a 4-slot server of 4,096 cells; 4,200 do not."""
    base, _ = smol_server
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "word " * 4200}, timeout=30)
    err = r.json()["error"]
    assert r.status_code == 400 and "4096" in err["message"] and err["param"] == "prompt"
    assert err["type"] == "context_length_exceeded"
    r = httpx.post(f"{base}/v1/completions", json={"prompt": "word " * 1100, "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 1024


def test_cancelled_stream_frees_its_slot(smol_server):
    base, _ = smol_server
    before = metrics(base)["pyggml_requests_cancelled_total"]
    with httpx.Client(timeout=TIMEOUT_S) as c:
        with c.stream("POST", f"{base}/v1/completions",
                      json={"prompt": "Once upon a time", "max_tokens": 900, "stream": True,
                            "temperature": 0.8, "seed": 1}) as resp:
            n = 0
            for line in resp.iter_lines():
                n += line.startswith("data: ")
                if n >= 3:
                    break
    t0 = time.monotonic()
    while time.monotonic() - t0 < 20:
        m = metrics(base)
        if m["pyggml_slots_busy"] == 0 and m["pyggml_requests_cancelled_total"] > before:
            break
        time.sleep(0.1)
    m = metrics(base)
    assert m["pyggml_slots_busy"] == 0 and m["pyggml_requests_cancelled_total"] > before
    assert m["pyggml_tokens_predicted_total"] > 0


def test_burst_of_64_all_complete_or_get_503(smol_server):
    base, _ = smol_server
    results = []
    lock = threading.Lock()

    def one(i):
        try:
            r = httpx.post(f"{base}/v1/completions", json={"prompt": f"Count: {i},",
                                                           "max_tokens": 4, "temperature": 0},
                           timeout=TIMEOUT_S)
            out = (r.status_code, r.headers.get("retry-after"), r.json())
        except httpx.HTTPError as e:             # a hang or a dropped connection fails below
            out = (None, None, repr(e))
        with lock:
            results.append(out)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S + 10)
    assert len(results) == 64
    ok = [r for r in results if r[0] == 200]
    busy = [r for r in results if r[0] == 503]
    assert len(ok) + len(busy) == 64, [r for r in results if r[0] not in (200, 503)][:3]
    assert ok and all(r[2]["usage"]["completion_tokens"] >= 1 for r in ok)
    assert all(r[1] is not None and r[2]["error"]["type"] == "server_busy" for r in busy)


def _malformed(rng: random.Random):
    """(path, raw body) of bad requests: fuzzed JSON, wrong types, bad ranges, empty messages."""
    good_chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    good_cmpl = {"prompt": "hi", "max_tokens": 2}
    bad_values = {
        "messages": [[], "hi", [{"role": 1, "content": "x"}], [{"content": "x"}], [1], None,
                     [{"role": "user", "content": {"a": 1}}]],
        "prompt": [123, [], [-1], [10 ** 9], {"a": 1}, None, "", [True]],
        "max_tokens": ["5", 1.5, -2, 2 ** 41, True, [1]],    # 10 ** 7: clamped (unified cache)
        "temperature": [-1, -0.01, "hot", float("nan"), True, [0.5]],
        "top_p": [1.5, -0.1, "x"], "top_k": [-1, 1.5, "x"], "min_p": [2, "x"],
        "repeat_penalty": [0, -1, "x"], "seed": ["x", 1.5], "stream": ["yes", 1],
        "stop": [1, [1, 2], {"a": "b"}], "n": [0, "x", -1], "logprobs": [-1, 100, "x"],
        "stream_options": ["x", 3],
    }
    cases = []
    for _ in range(200):
        kind = rng.random()
        if kind < 0.3:
            base = json.dumps(rng.choice([good_chat, good_cmpl])).encode()
            cut = base[:rng.randrange(len(base))]
            noise = bytes(rng.randrange(256) for _ in range(rng.randrange(8)))
            cases.append((rng.choice(["/v1/chat/completions", "/v1/completions"]), cut + noise))
        elif kind < 0.35:
            cases.append(("/v1/chat/completions", rng.choice([b"[]", b"1", b'"x"', b"null"])))
        else:
            chat = rng.random() < 0.5
            body = dict(good_chat if chat else good_cmpl)
            keys = [k for k in bad_values if not ((k == "prompt" and chat) or
                                                  (k == "messages" and not chat))]
            if chat and "logprobs" in keys:
                keys.remove("logprobs")
            k = rng.choice(keys)
            body[k] = rng.choice(bad_values[k])
            if k in ("messages", "prompt") and body[k] is None:
                del body[k]
            path = "/v1/chat/completions" if chat else "/v1/completions"
            cases.append((path, json.dumps(body, allow_nan=True).encode()))
    return cases


def test_200_malformed_requests_get_4xx_and_the_server_still_answers(smol_server, smol_ref):
    base, client = smol_server
    cases = _malformed(random.Random(16))
    with httpx.Client(timeout=30) as c:
        for path, raw in cases:
            r = c.post(base + path, content=raw, headers={"content-type": "application/json"})
            assert 400 <= r.status_code < 500, (path, raw, r.status_code, r.text[:200])
            assert "error" in r.json() and r.json()["error"]["message"]
        r = c.post(f"{base}/v1/chat/completions", json={"messages": [], "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = c.post(f"{base}/v1/chat/completions", json={**{"messages": MSGS}, "top_k": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"
        r = c.post(f"{base}/v1/chat/completions", json={"messages": MSGS, "max_tokens": 8,
                                                        "temperature": 0, "unknown": {"x": 1},
                                                        "n_probs": 0, "model": "another-name"})
    ref = smol_ref.create_chat_completion(MSGS, max_tokens=8, temperature=0)
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == \
        ref["choices"][0]["message"]["content"]


def test_api_key_and_bind_warning(tiny_models):
    assert bind_warning("127.0.0.1", None) is None and bind_warning("localhost", None) is None
    assert "without --api-key" in bind_warning("0.0.0.0", None)
    assert bind_warning("0.0.0.0", "k") is None
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    with LLM(tm.path, n_ctx=256, n_threads=1, n_seq_max=1) as llm:
        rs = start_in_thread(make_server(llm, 1, "tiny", chat_template="chatml", api_key="sekret"))
        base = f"http://127.0.0.1:{rs.port}"
        try:
            assert httpx.get(f"{base}/health", timeout=10).status_code == 200
            r = httpx.get(f"{base}/v1/models", timeout=10)
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
            r = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer wrong"},
                          timeout=10)
            assert r.status_code == 401
            c = openai.OpenAI(base_url=f"{base}/v1", api_key="sekret", timeout=30, max_retries=0)
            assert c.models.list().data[0].id == "tiny"
            r = c.chat.completions.create(model="t", messages=[{"role": "user", "content": "a"}],
                                          max_tokens=3, temperature=0)
            assert r.usage.completion_tokens <= 3
        finally:
            rs.stop()


PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "My favourite fruit is", "1, 2, 3, 4,", "The sky is blue because",
           "In the beginning", "Water boils at"]


def _eight_streams_vs_alone(model_path, prompts):
    llm = LLM(model_path, n_ctx=8 * 256, n_threads=2, n_seq_max=8)
    rs = start_in_thread(make_server(llm, 8, "m"))
    base = f"http://127.0.0.1:{rs.port}"
    try:
        body = lambda p: {"prompt": p, "max_tokens": 10, "temperature": 0}    # noqa: E731
        with httpx.Client(timeout=TIMEOUT_S) as c:
            alone = [c.post(f"{base}/v1/completions", json=body(p)).json()["choices"][0]["text"]
                     for p in prompts]
        assert metrics(base)["pyggml_decode_steps_multi_seq_total"] == 0
        got = [None] * 8
        start = threading.Barrier(8, timeout=TIMEOUT_S)

        def stream(i):
            parts = []
            with httpx.Client(timeout=TIMEOUT_S) as c:
                start.wait()
                with c.stream("POST", f"{base}/v1/completions",
                              json={**body(prompts[i]), "stream": True}) as resp:
                    for line in resp.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            parts.append(json.loads(line[6:])["choices"][0]["text"])
            got[i] = "".join(parts)
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        m = metrics(base)
        return got, alone, m
    finally:
        rs.stop()
        llm.close()


def test_batching_is_invisible_eight_streams_equal_each_alone(tiny_models):
    """The engine's batching: 8 concurrent greedy streams, each the tokens of the same request
    alone, and decode steps that carried several sequences."""
    tm = tiny_models.get(arch="llama", weight_type="q4_k", n_embd=256, n_ff=512)
    prompts = [f"the capital of {w} is" for w in ("france", "italy", "the sea", "rome",
                                                  "paris", "stars", "books", "dog")]
    got, alone, m = _eight_streams_vs_alone(tm.path, prompts)
    assert all(a for a in alone) and len(set(alone)) > 1
    assert got == alone
    assert m["pyggml_decode_steps_multi_seq_total"] > 0
    assert m["pyggml_decode_max_seqs_per_step"] >= 4


def test_batching_is_invisible_on_gemma():
    """Gemma on the default (SIMD) path: a MUL_MAT row computed among other tokens' rows (gemm)
    has the bits of the row alone (vec_dot), so 8 concurrent greedy streams give exactly the
    tokens of each alone (native/tests/test_gemm.c proves it kernel by kernel)."""
    got, alone, m = _eight_streams_vs_alone(None, PROMPTS)
    assert m["pyggml_decode_max_seqs_per_step"] >= 4
    assert got == alone
