"""The server under attack (issue 34): nothing a request sends can freeze, exhaust or redirect
it. Regexes and YAML from plan requests and configs are bounded in time and size; a plan request
opens no connection and no file, by an allow-list; chat templates render under a time and size
budget; request bodies have a size limit, a read deadline and bounded JSON; half-sent headers
are dropped; without an API key the Host header and the Content-Type are checked (DNS
rebinding, blind cross-site requests); a prompt that renders or tokenizes to nothing is a 400.
SmolLM2 on loopback servers; every loop is bounded in count and time."""
import json
import socket
import threading
import time

import httpx
import pytest

from pyggml.errors import ChatTemplateError, ConfigError
from pyggml.llm.chat import ChatTemplate, chat_prompt
from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.offload.config import load_config, parse_text, safe_load_bounded
from pyggml.offload.saferegex import SafeRegex
from pyggml.server import make_server, start_in_thread
from pyggml.server.guard import Limits, host_allowed, parse_json, JSONLimitError

T = 60
# catastrophic for a backtracking engine on a tensor name (3^n paths): seconds in `re`
EVIL_REGEX = r"(\w|\w|\w)*\.(\w|\w|\w)*\.(\w|\w|\w)*\.(\w|\w|\w)*x"
ALIAS_BOMB = ("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
              "b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
              "d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
              "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n"
              "f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
              "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n"
              "h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
              "gpu_layers: [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n")


@pytest.fixture(scope="module")
def llm():
    m = LLM(ensure_smollm2(), n_ctx=2048, n_threads=2, n_seq_max=2)
    yield m
    m.close()


@pytest.fixture(scope="module")
def server(llm):
    rs = start_in_thread(make_server(llm, 2, "smollm2", queue_size=8, limits=Limits(
        max_body_bytes=12 << 20, body_timeout_s=1.5, header_timeout_s=1.0,
        allowed_hosts=("pyggml.example",))))
    yield f"http://127.0.0.1:{rs.port}", rs
    rs.stop()


def _health_ms(base) -> float:
    t0 = time.perf_counter()
    r = httpx.get(f"{base}/health", timeout=T)
    assert r.status_code == 200
    return (time.perf_counter() - t0) * 1000


# ---- 1. regexes ----------------------------------------------------------------------------------

def test_a_catastrophic_regex_is_refused_within_its_budget():
    rx = SafeRegex(EVIL_REGEX)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="catastrophic backtracking"):
        for _ in range(50):
            rx.search("blk.10.ffn_down_exps.weight")
    assert time.perf_counter() - t0 < 1.0
    assert SafeRegex(r"blk\.\d+\.ffn_(up|down)").search("blk.3.ffn_up.weight")
    with pytest.raises(ConfigError, match="missing \\), unterminated subpattern"):   # re's
        SafeRegex("ffn_(up")


# adversarial regexes (catastrophic, huge, malformed) and YAML documents (bombs, deep nesting,
# huge, syntax errors): each a 400 within 1 s, /health answering meanwhile
ADVERSARIAL_REGEXES = [EVIL_REGEX, r"(\w|\w|\w)*\.(\w|\w|\w)*\.(\w|\w|\w)*\.(\w|\w)*z",
                       "(" * 200 + "a" + ")" * 200 + "[", "a" * 2000, "(?P<x>a)(?P<x>b)",
                       "[z-a]", "*bad", "a{99999999999999999999}", "\\", "(?<=a+)b"] + [
    "(" + "|".join([r"\w"] * k) + r")*\.(\w|\w|\w)*\.(\w|\w|\w)*\.(\w|\w|\w)*q"
    for k in range(3, 18)]
ADVERSARIAL_YAML = [ALIAS_BOMB, "[" * 5000 + "]" * 5000, "a:\n" + "  - " * 2000 + "x\n",
                    "gpu_layers: " + "9" * 300_000 + "\n", "a: &a [*a]\n", "a: *nope\n",
                    "{{{{", "overrides: [{match: '" + EVIL_REGEX + "', device: CPU}]\n",
                    "a: !!python/object/apply:os.system ['true']\n", "extends: /etc/passwd\n"] + [
    ALIAS_BOMB.replace("gpu_layers", f"k{i}") for i in range(15)]


def test_fifty_adversarial_regexes_and_yaml_documents_each_400_within_1s(server):
    base, _ = server
    bodies = ([{"args": ["-ot", f"{rx}=CPU"]} for rx in ADVERSARIAL_REGEXES] +
              [{"config": y} for y in ADVERSARIAL_YAML])
    assert len(bodies) >= 50
    slow = []
    for body in bodies:
        t0 = time.perf_counter()
        r = httpx.post(f"{base}/v1/pyggml/plan", json=body, timeout=T)
        dt = time.perf_counter() - t0
        assert r.status_code == 400, (body, r.status_code, r.text[:300])
        assert r.json()["error"]["param"] in ("args", "config")
        if dt > 1.0:
            slow.append((dt, json.dumps(body)[:80]))
    assert not slow, slow
    assert _health_ms(base) < 1000


def test_a_plan_with_a_catastrophic_regex_never_stalls_health(server):
    base, _ = server
    done = threading.Event()
    out = {}

    def plan():
        out["r"] = httpx.post(f"{base}/v1/pyggml/plan", timeout=T,
                              json={"args": ["-ot", f"{EVIL_REGEX}=CPU"]})
        done.set()
    t = threading.Thread(target=plan)
    t.start()
    worst = 0.0
    for _ in range(20):
        if done.is_set():
            break
        worst = max(worst, _health_ms(base))
        time.sleep(0.02)
    t.join(T)
    assert out["r"].status_code == 400 and "catastrophic" in out["r"].json()["error"]["message"]
    assert worst < 1000


# ---- 2. YAML -------------------------------------------------------------------------------------

def test_an_alias_bomb_is_refused_within_1s_naming_the_file(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    for load in (lambda: load_config(path), lambda: parse_text(ALIAS_BOMB, "inline.yaml"),
                 lambda: safe_load_bounded(ALIAS_BOMB, "inline.yaml")):
        t0 = time.perf_counter()
        with pytest.raises(ConfigError, match=r"(bomb|inline)\.yaml:\d+:\d+: the YAML expands "
                                              r"to more than 100000 values"):
            load()
        # unbounded it took 29 s and 2 GB; bounded it stops at the value budget, well under
        # a second on an idle machine (10 s: room for a loaded one, never the 29 s)
        assert time.perf_counter() - t0 < 10.0
    with pytest.raises(ConfigError, match="nested more than 64"):
        safe_load_bounded("[" * 100_000, "deep.yaml")
    # anchors and aliases within the budget still work
    assert parse_text("gpu_layers: &n 3\ncontext: {n_ctx: *n}\n", "ok.yaml").get(
        ("context", "n_ctx")) == 3


def test_plan_cli_refuses_an_alias_bomb_quickly(tmp_path, capsys):
    from pyggml.cli import main
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    t0 = time.perf_counter()
    rc = main(["plan", "-m", str(ensure_smollm2()), "-c", str(path)])
    assert rc != 0 and time.perf_counter() - t0 < 10
    assert "bomb.yaml:" in capsys.readouterr().err


# ---- 3. no connection, no file, by an allow-list ----------------------------------------------

@pytest.fixture
def listener():
    """A loopback port that counts the connections it gets."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(0.1)
    got = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                c, _ = s.accept()
                got.append(1)
                c.close()
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield s.getsockname()[1], got
    stop.set()
    t.join(5)
    s.close()


@pytest.mark.parametrize("spell", [
    lambda p: {"args": ["--set", f"rpc=['127.0.0.1:{p}']"]},
    lambda p: {"args": f"--set rpc.0=127.0.0.1:{p}"},
    lambda p: {"args": ["--rpc", f"127.0.0.1:{p}"]},
    lambda p: {"config": f"rpc: ['127.0.0.1:{p}']\n"},
    lambda p: {"config": "gpu_layers: 1\n", "args": ["--set", f"rpc=[127.0.0.1:{p}]"]},
])
def test_a_plan_request_never_opens_a_connection(server, listener, spell):
    base, _ = server
    port, got = listener
    r = httpx.post(f"{base}/v1/pyggml/plan", json=spell(port), timeout=T)
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "not connected to it" in msg or "rpc has 0 item(s)" in msg, msg
    time.sleep(0.2)
    assert got == []


@pytest.mark.parametrize("body, words", [
    ({"args": ["--set", "extends=/etc/passwd"]}, "`extends` is not taken by a what-if plan"),
    ({"args": ["--model", "/etc/passwd"]}, "the model is the one being served"),
    ({"args": ["--mod", "/etc/passwd"]}, "--mod"),
    ({"args": ["-c", "/etc/passwd"]}, "a config file of the server is not read"),
])
def test_a_plan_request_reads_no_file(server, body, words):
    base, _ = server
    r = httpx.post(f"{base}/v1/pyggml/plan", json=body, timeout=T)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


# ---- 4, 5. chat templates ------------------------------------------------------------------------

MSGS = [{"role": "user", "content": "hi"}]
EVIL_TEMPLATES = {
    "nested loops": "{% set l = range(90000)|list %}{% for a in l %}{% for b in l %}{% endfor %}"
                    "{% endfor %}",
    "range": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "a 1 GB string": "{{ 'a' * 1000000000 }}",
    "center": "{{ 'a'|center(1000000000) }}",
    "format": "{{ '{:>1000000000}'.format(1) }}",
    "printf": "{{ '%01000000000d' % 1 }}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}"
                "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
    "power": "{{ 10 ** 100000000 }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "empty": "{{ '' }}",
}


@pytest.mark.parametrize("name", list(EVIL_TEMPLATES))
def test_a_malicious_template_is_refused_in_bounded_time(name):
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=f"chat template {name}"):
        chat_prompt(ChatTemplate(EVIL_TEMPLATES[name], name), MSGS)
    assert time.perf_counter() - t0 < 3.0          # RENDER_TIMEOUT_S is 2 s


def test_templates_still_render():
    from pyggml.llm.chat import BUILTIN_TEMPLATES
    t = ChatTemplate(BUILTIN_TEMPLATES["chatml"], "chatml")
    assert chat_prompt(t, MSGS) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ok = ChatTemplate("{% for i in range(3) %}{{ i ~ ('x' * 3) }}{% endfor %}{{ '%05d' % 7 }}",
                      "small")
    assert chat_prompt(ok, MSGS) == "0xxx1xxx2xxx00007"


def test_an_empty_prompt_is_a_400_and_holds_no_slot(llm, tmp_path):
    path = tmp_path / "empty.jinja"
    path.write_text("{% for m in messages %}{% endfor %}")
    rs = start_in_thread(make_server(llm, 2, "smollm2", chat_template=str(path), queue_size=4))
    base = f"http://127.0.0.1:{rs.port}"
    try:
        for _ in range(6):                  # more than the slots: none is held
            r = httpx.post(f"{base}/v1/chat/completions", timeout=10,
                           json={"messages": MSGS, "max_tokens": 4})
            assert r.status_code == 400 and "empty prompt" in r.json()["error"]["message"]
        L = httpx.get(f"{base}/v1/pyggml/live", timeout=10).json()
        assert L["slots_busy"] == 0 and L["queue_length"] == 0
        r = httpx.post(f"{base}/v1/completions", timeout=T,
                       json={"prompt": "Hello", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200
    finally:
        rs.stop()


def test_an_endless_template_never_blocks_the_server(llm, tmp_path):
    path = tmp_path / "endless.jinja"
    path.write_text(EVIL_TEMPLATES["nested loops"])
    rs = start_in_thread(make_server(llm, 2, "smollm2", chat_template=str(path), queue_size=4))
    base = f"http://127.0.0.1:{rs.port}"
    try:
        out = []
        ts = [threading.Thread(target=lambda: out.append(httpx.post(
            f"{base}/v1/chat/completions", timeout=T, json={"messages": MSGS})))
            for _ in range(2)]
        for t in ts:
            t.start()
        worst = max(_health_ms(base) for _ in range(10))
        for t in ts:
            t.join(T)
        assert [r.status_code for r in out] == [400, 400]
        assert "took more than" in out[0].json()["error"]["message"]
        assert worst < 1000
    finally:
        rs.stop()


# ---- 7. bodies, JSON and headers -----------------------------------------------------------------

def test_health_answers_while_a_10mb_body_is_parsed(server):
    base, _ = server
    body = json.dumps({"prompt": "Hi", "max_tokens": 1, "junk": list(range(1_500_000))})
    assert 10e6 < len(body) < 12 << 20
    done = threading.Event()
    res = {}

    def post():
        res["r"] = httpx.post(f"{base}/v1/completions", content=body, timeout=T,
                              headers={"content-type": "application/json"})
        done.set()
    t = threading.Thread(target=post)
    t.start()
    times = []
    while not done.is_set() and len(times) < 200:
        times.append(_health_ms(base))
    t.join(T)
    assert res["r"].status_code == 200
    assert max(times) < 500, max(times)


def test_body_limits(server):
    base, _ = server
    big = b"{" + b" " * (13 << 20) + b"}"
    r = httpx.post(f"{base}/v1/completions", content=big, timeout=T,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and "--max-body-bytes" in r.json()["error"]["message"]
    for raw, words in ((b'{"prompt": ' + b"[" * 100 + b"]" * 100 + b"}", "nested more than"),
                       (b'{"prompt": "x", "max_tokens": 1' + b"0" * 5000 + b"}", "digits"),
                       (b'{"prompt": "x", "temperature": 1.' + b"5" * 5000 + b"}", "characters"),
                       (b'{"prompt": "x"', "not valid JSON")):
        r = httpx.post(f"{base}/v1/completions", content=raw, timeout=T,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def _raw(port: int, data: bytes, wait_s: float) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.settimeout(wait_s)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return out
                out += chunk
        except socket.timeout:
            return out + b"<open>"


def test_half_sent_requests_are_dropped(server):
    base, rs = server
    port = rs.port
    # headers never finished: closed after header_timeout_s (1 s)
    t0 = time.perf_counter()
    assert _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ", 5) == b""
    assert 0.8 < time.perf_counter() - t0 < 4
    # a body that never comes: 408 after body_timeout_s (1.5 s)
    out = _raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
               b"application/json\r\nContent-Length: 100\r\n\r\n{\"pro", 6)
    assert out.startswith(b"HTTP/1.1 408"), out[:200]
    # 50 at once do not hold the server
    socks = []
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            socks.append(s)
        assert _health_ms(base) < 1000
        time.sleep(1.6)
        closed = 0
        for s in socks:
            s.settimeout(2)
            try:
                closed += s.recv(10) == b""
            except OSError:
                closed += 1
        assert closed == 50
    finally:
        for s in socks:
            s.close()


def test_json_limits_unit():
    assert parse_json(b'{"a": [1, 2.5, {"b": null}]}') == {"a": [1, 2.5, {"b": None}]}
    assert parse_json(b'{"s": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['
                      b'[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}')      # brackets in a string
    for raw in (b"[" * 65 + b"]" * 65, b"1" * 101, b"{", b"\xff"):
        with pytest.raises(JSONLimitError):
            parse_json(raw)


# ---- 8. DNS rebinding and blind cross-site requests ------------------------------------------------

def test_host_header_and_content_type_without_a_key(server):
    base, rs = server
    ok = {"prompt": "Hi", "max_tokens": 1}
    for host, want in (("evil.example", 400), ("evil.example:8080", 400),
                       ("127.0.0.1.nip.io", 400), (f"127.0.0.1:{rs.port}", 200),
                       ("localhost", 200), ("[::1]:80", 200), ("pyggml.example", 200),
                       ("PYGGML.example.:99", 200)):
        r = httpx.post(f"{base}/v1/completions", json=ok, headers={"host": host}, timeout=T)
        assert r.status_code == want, (host, r.text)
        if want == 400:
            assert "DNS rebinding" in r.json()["error"]["message"]
        assert httpx.get(f"{base}/health", headers={"host": host},
                         timeout=T).status_code == want
    raw = json.dumps(ok)
    for ctype, origin, want in (("text/plain", None, 415),
                                ("application/x-www-form-urlencoded", None, 415),
                                ("multipart/form-data; boundary=x", None, 415),
                                (None, "http://evil.example", 415),
                                (None, None, 200), ("application/json; charset=utf-8", None, 200),
                                ("application/vnd.api+json", None, 200)):
        h = {k: v for k, v in (("content-type", ctype), ("origin", origin)) if v}
        r = httpx.post(f"{base}/v1/completions", content=raw, headers=h, timeout=T)
        assert r.status_code == want, (ctype, origin, r.text)
    assert host_allowed("a.b.example", "0.0.0.0", (".b.example",))
    assert not host_allowed("a.b.example", "0.0.0.0", ("b.example",))


def test_with_a_key_any_host_and_a_lowercase_bearer(llm):
    rs = start_in_thread(make_server(llm, 2, "smollm2", api_key="sekrit", queue_size=4))
    base = f"http://127.0.0.1:{rs.port}"
    try:
        for auth, want in (("Bearer sekrit", 200), ("bearer sekrit", 200), ("BEARER  sekrit", 200),
                           ("Bearer wrong", 401), ("Basic sekrit", 401), ("", 401)):
            r = httpx.get(f"{base}/v1/models", headers={"authorization": auth,
                                                        "host": "my.box.lan"}, timeout=T)
            assert r.status_code == want, auth
    finally:
        rs.stop()
