"""Server fuzz (issue 34's acceptance): 250+ malformed requests of every kind the issue tried —
bad JSON, huge numbers, deep nesting, wrong types, bad content types, bad hosts, oversized
bodies, half-sent requests, bad methods and paths, adversarial regexes and YAML on the plan
endpoint — get no 5xx and no hang, `/health` answers within 1 s throughout (polled from a thread
the whole time), and a greedy reply is the same before and after. SmolLM2 on loopback; seeded;
every request has a timeout and the whole test a bound (well under 60 s on 2 cores)."""
import json
import random
import socket
import threading
import time

import httpx
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread
from pyggml.server.guard import Limits

TIMEOUT_S = 10          # a request that takes longer is a hang
N_RANDOM = 200          # random malformed bodies, besides the fixed cases below

EVIL_REGEX = r"(\w|\w|\w)*\.(\w|\w|\w)*\.(\w|\w|\w)*\.(\w|\w|\w)*x"
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n" for a, b in zip("abcdefg", "bcdefgh")) + \
    "gpu_layers: [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n"


@pytest.fixture(scope="module")
def served():
    llm = LLM(ensure_smollm2(), n_ctx=1024, n_threads=2, n_seq_max=2)
    rs = start_in_thread(make_server(llm, 2, "smollm2", queue_size=16, limits=Limits(
        max_body_bytes=1 << 20, body_timeout_s=0.5, header_timeout_s=0.5)))
    yield f"http://127.0.0.1:{rs.port}", rs.port
    rs.stop()
    llm.close()


GOOD_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GOOD_CMPL = {"prompt": "hi", "max_tokens": 2}
JSON = {"content-type": "application/json"}
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize",
         "/v1/messages", "/v1/responses", "/apply-template", "/v1/pyggml/plan"]
BAD_VALUES = [None, True, -1, 1.5, "x", "", [], {}, [1, "a"], {"a": [None]}, "\u0000",
              "\ud800" * 3, 10 ** 30, -10 ** 30, 1e308, "9" * 90, [[[[[[]]]]]], {"": {"": 1}}]
FIELDS = ["messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
          "stop", "stream", "n", "logprobs", "top_logprobs", "stream_options", "response_format",
          "tools", "tool_choice", "logit_bias", "input", "content", "tokens", "model",
          "presence_penalty", "grammar", "json_schema", "args", "config", "system",
          "max_output_tokens", "encoding_format", "chat_template_kwargs"]


def _cases(rng: random.Random) -> list[tuple[str, str, bytes, dict]]:
    """(method, path, raw body, headers) of malformed requests."""
    out = []
    for _ in range(N_RANDOM):
        path = rng.choice(PATHS)
        good = dict(GOOD_CHAT if "chat" in path or "messages" in path else GOOD_CMPL)
        kind = rng.random()
        if kind < 0.25:                         # cut JSON with noise
            raw = json.dumps(good).encode()
            raw = raw[:rng.randrange(len(raw))] + bytes(rng.randrange(256)
                                                         for _ in range(rng.randrange(6)))
        elif kind < 0.65:                       # wrong types and values
            body = dict(good)
            for _ in range(rng.randrange(1, 4)):
                body[rng.choice(FIELDS)] = rng.choice(BAD_VALUES)
            raw = json.dumps(body).encode()
        elif kind < 0.75:                       # huge numbers
            field = rng.choice(["max_tokens", "temperature", "seed", "top_k", "n"])
            num = rng.choice([b"1" + b"0" * 5000, b"-" + b"9" * 400, b"1e999", b"-1e999",
                              b"1." + b"5" * 3000, b"NaN", b"Infinity"])
            raw = json.dumps(good).encode()[:-1] + b', "' + field.encode() + b'": ' + num + b"}"
        elif kind < 0.85:                       # deep nesting
            d = rng.choice([70, 500, 5000])
            field = rng.choice(["prompt", "messages", "tools", "x"])
            raw = (b'{"max_tokens": 2, "' + field.encode() + b'": ' + b"[" * d + b"]" * d
                   + b"}")
        else:                                   # not an object, bad encoding
            raw = rng.choice([b"[]", b"null", b"1", b'"x"', b"\xff\xfe", b"{\"a\": \"\xc3\x28\"}",
                              b"{}" * 3, b"", b"{\"prompt\": \"hi\", \"prompt\": 5}"])
        out.append(("POST", path, raw, dict(JSON)))
    # content types and hosts (no API key: checked), methods, paths
    body = json.dumps(GOOD_CMPL).encode()
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x",
               "application/jsonx", "text/json", "application/json; charset=latin-9"):
        out.append(("POST", "/v1/completions", body, {"content-type": ct}))
    for host in ("evil.example", "evil.example:80", "127.0.0.1.nip.io", "a" * 300, "[::1",
                 "localhost.evil.example", "x y"):
        out.append(("POST", "/v1/completions", body, {**JSON, "host": host}))
        out.append(("GET", "/v1/models", b"", {"host": host}))
    for method, path in (("GET", "/v1/completions"), ("PUT", "/v1/chat/completions"),
                         ("DELETE", "/health"), ("POST", "/nope"), ("GET", "/v1/../etc/passwd"),
                         ("POST", "/health"), ("PATCH", "/v1/pyggml/plan"),
                         ("GET", "/web/../../pyggml/server/app.py"), ("GET", "/" + "a" * 5000)):
        out.append((method, path, body if method != "GET" else b"", dict(JSON)))
    # oversized bodies (limit 1 MiB): 413
    for n in (1 << 20 | 1, 3 << 20):
        out.append(("POST", rng.choice(PATHS), b"{" + b" " * n + b"}", dict(JSON)))
    # the plan endpoint: adversarial regexes, YAML, options that would open files or sockets
    regexes = [EVIL_REGEX, "(" * 300 + "a", "[z-a]", "a{99999999999999999999}", "(?<=a+)b",
               "\\", "*x", r"(\w|\w|\w|\w|\w)*\.(\w|\w|\w)*q"]
    yamls = [ALIAS_BOMB, "[" * 3000 + "]" * 3000, "a: &a [*a]\n", "{{{{", "gpu_layers: " +
             "9" * 50_000, "a: !!python/object/apply:os.system ['true']\n",
             "extends: /etc/passwd\n", "rpc: ['127.0.0.1:1']\n"]
    for rx in regexes:
        out.append(("POST", "/v1/pyggml/plan", json.dumps({"args": ["-ot", f"{rx}=CPU"]}).encode(),
                    dict(JSON)))
    for y in yamls:
        out.append(("POST", "/v1/pyggml/plan", json.dumps({"config": y}).encode(), dict(JSON)))
    for args in (["--rpc", "127.0.0.1:1"], ["--set", 'rpc=["127.0.0.1:1"]'], ["-m", "/etc/passwd"],
                 ["-c", "/etc/passwd"], ["--lora", "/etc/passwd"], ["-ot"], [1, 2], "x"):
        out.append(("POST", "/v1/pyggml/plan", json.dumps({"args": args}).encode(), dict(JSON)))
    return out


def _half_sent(port: int) -> list[bytes]:
    """Requests that stop half-way, all at once: each is closed (or 408) by its deadline."""
    partial = [b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ",
               b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n",
               b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/"
               b"json\r\nContent-Length: 100\r\n\r\n{\"pro",
               b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/"
               b"json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"pro\r\n",
               b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
               b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),        # TLS hello
               b"GARBAGE\r\n\r\n"]
    out = [b""] * (len(partial) * 3)

    def one(i, data):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(data)
                s.settimeout(4)
                got = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
                out[i] = got or b"<closed>"
        except socket.timeout:
            out[i] = b"<hang>"
        except OSError:
            out[i] = b"<closed>"
    threads = [threading.Thread(target=one, args=(i, partial[i % len(partial)]))
               for i in range(len(out))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def _greedy(base) -> str:
    r = httpx.post(f"{base}/v1/completions", timeout=TIMEOUT_S * 3, json={
        "prompt": "The three primary colours are", "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200
    return r.json()["choices"][0]["text"]


def test_fuzz_no_5xx_no_hang_health_within_1s_and_greedy_unchanged(served):
    base, port = served
    t_start = time.monotonic()
    baseline = _greedy(base)
    cases = _cases(random.Random(34))
    assert len(cases) >= 250

    health, stop = [], threading.Event()

    def poll():
        with httpx.Client(timeout=5) as c:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    status = c.get(f"{base}/health").status_code
                except httpx.HTTPError as e:
                    status = repr(e)
                health.append((time.perf_counter() - t0, status))
                time.sleep(0.05)
    poller = threading.Thread(target=poll)
    poller.start()
    bad, n_4xx = [], 0
    try:
        half = threading.Thread(target=lambda: bad.extend(
            ("half-sent", r[:60]) for r in _half_sent(port)
            if r == b"<hang>" or r.startswith(b"HTTP/1.1 5")))
        half.start()
        with httpx.Client(timeout=TIMEOUT_S) as c:
            for method, path, raw, headers in cases:
                try:
                    r = c.request(method, base + path, content=raw, headers=headers)
                except httpx.TimeoutException:
                    bad.append(("hang", method, path, raw[:80]))
                    continue
                except httpx.TransportError as e:
                    # refused before it was all sent (a 413 and close while a 3 MiB body or
                    # a 5,000-character line is still going out): fine for those, not others
                    n_4xx += 1
                    if len(raw) <= 1 << 20 and len(path) < 4000:
                        bad.append((repr(e), method, path, raw[:80]))
                    continue
                n_4xx += 400 <= r.status_code < 500
                if r.status_code >= 500:
                    bad.append((r.status_code, method, path, raw[:80], r.text[:120]))
        half.join(15)
    finally:
        stop.set()
        poller.join(10)
    assert not bad, f"{len(bad)} bad answers: {bad[:5]}"
    # refused; the rest are bodies whose extra fields an endpoint does not read (the plan and
    # Anthropic's endpoints ignore fields they do not know; 225 of 255 were 4xx)
    assert n_4xx >= 0.85 * len(cases)
    slow = [(round(dt, 3), s) for dt, s in health if dt > 1.0 or s != 200]
    assert len(health) > 20 and not slow, slow[:5]
    assert _greedy(base) == baseline
    assert httpx.get(f"{base}/health", timeout=5).json()["status"] == "ok"
    assert time.monotonic() - t_start < 60
