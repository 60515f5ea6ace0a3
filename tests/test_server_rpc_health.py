"""`/health` reflects the backends (issue 34): a served model on llama.cpp's own rpc-server
(unmodified, `make setup` builds it) answers 200 while the server lives, 503 naming the
endpoint once it is killed (found without sending anything, within a second), and a request
then fails with 503 naming it too, never a hang; restarted on the same port, the next request
reconnects (the weights uploaded again) and gives the same tokens. Tiny llama, loopback, every
wait bounded."""
import subprocess
import time

import httpx
import pytest

from pyggml.backend import rpc
from pyggml.llm.runtime import LLM
from pyggml.server import make_server, start_in_thread
from support.rpc_server import SERVER_BIN, RpcServer

pytestmark = pytest.mark.skipif(not SERVER_BIN.is_file(),
                                reason=f"{SERVER_BIN} missing: run `make setup`")


def test_health_is_503_naming_a_dead_rpc_server(tiny_models):
    srv = RpcServer.start()
    rs = llm = None
    try:
        rpc.register_endpoints([srv.endpoint], timeout_s=5)
        tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=4, n_embd=64)
        llm = LLM(tm.path, config={"devices": [f"RPC[{srv.endpoint}]"], "gpu_layers": "all"},
                  n_ctx=128, n_ubatch=32, n_threads=1)
        rs = start_in_thread(make_server(llm, 1, "tiny"))
        base = f"http://127.0.0.1:{rs.port}"
        assert httpx.get(f"{base}/health", timeout=10).json() == {"status": "ok"}
        r0 = httpx.post(f"{base}/v1/completions", timeout=30,
                        json={"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0})
        assert r0.status_code == 200 and r0.json()["usage"]["completion_tokens"] == 3
        srv.stop()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            h = httpx.get(f"{base}/health", timeout=5)
            if h.status_code != 200:
                break
            time.sleep(0.05)
        assert h.status_code == 503 and time.monotonic() - t0 < 1.0
        err = h.json()["error"]
        assert srv.endpoint in err["message"] and err["type"] == "unavailable_error"
        t0 = time.monotonic()
        r = httpx.post(f"{base}/v1/completions", timeout=30,
                       json={"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0})
        assert r.status_code == 503 and srv.endpoint in r.json()["error"]["message"], r.text
        assert time.monotonic() - t0 < 10
        # the same server again on the same port: the next request reconnects
        srv.proc = subprocess.Popen([str(SERVER_BIN), "-H", "127.0.0.1", "-t", "1", "-p",
                                     str(srv.port)], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert srv._wait_ready(20)
        again = httpx.post(f"{base}/v1/completions", timeout=60,
                           json={"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0})
        assert again.status_code == 200, again.text
        assert again.json()["choices"][0]["text"] == r0.json()["choices"][0]["text"]
        assert httpx.get(f"{base}/health", timeout=10).json() == {"status": "ok"}
    finally:
        if rs is not None:
            rs.stop()
        if llm is not None:
            llm.close()
        rpc.unregister_endpoints([srv.endpoint])
        srv.stop()
