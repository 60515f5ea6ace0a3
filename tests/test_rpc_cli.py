"""rpc-servers named as llama.cpp users name them: `--rpc HOST:PORT` on run / bench / plan /
mem, and `rpc:` in an offload config. The remote device's memory shows in the plan, and a run
split onto it gives the CPU's greedy tokens."""

import re

import httpx
import pytest

from pyggml.backend import base
from pyggml.backend.rpc import rpc_regs, unregister_endpoints
from pyggml.cli import main
from pyggml.llm.runtime import LLM
from support.rpc_server import SERVER_BIN, RpcServer
from support.serve_process import ServeProcess

pytestmark = pytest.mark.skipif(not SERVER_BIN.is_file(),
                                reason=f"{SERVER_BIN} missing: make setup builds it")


@pytest.fixture(scope="module")
def server():
    srv = RpcServer.start()
    yield srv
    unregister_endpoints([srv.endpoint], base.default_registry())
    srv.stop()


@pytest.fixture(scope="module")
def tiny(tiny_models):
    # the model and prompt test_rpc.py splits: its greedy tokens have no near ties
    return str(tiny_models.get(arch="llama", weight_type="q8_0", n_layer=4, n_embd=64).path)


def _greedy(llm, n=8):
    return [t.id for t in llm.generate("the capital of france is", n, temperature=0,
                                       stop_at_eog=False)]


def test_plan_with_rpc_shows_the_remote_device(server, tiny, capsys):
    name = f"RPC[{server.endpoint}]"
    assert main(["plan", "-m", tiny, "-c", "256", "--rpc", server.endpoint, "-ngl", "99"]) == 0
    out = capsys.readouterr().out
    row = re.search(rf"^\s*{re.escape(name)}\s+(\S+) MiB", out, re.M)
    assert row and float(row.group(1)) > 0           # the layers' weights are remote
    assert f"--rpc {server.endpoint}" in out          # the llama.cpp equivalent


def test_mem_plan_only_with_rpc(server, tiny, capsys):
    assert main(["mem", "-m", tiny, "-c", "256", "--plan-only", "--rpc", server.endpoint,
                 "-ngl", "99"]) == 0
    assert f"RPC[{server.endpoint}]" in capsys.readouterr().out


def test_run_and_config_over_rpc_give_the_cpus_tokens(server, tiny, capsys):
    with LLM(tiny, n_ctx=256, n_ubatch=64, n_threads=1) as cpu:
        want = _greedy(cpu)
    cfg = {"rpc": [server.endpoint], "gpu_layers": "all"}
    with LLM(tiny, config=cfg, n_ctx=256, n_ubatch=64,
             n_threads=1) as remote:
        assert any(b.name.startswith("RPC[") for b in remote.backends)
        assert _greedy(remote) == want
    assert main(["run", "-m", tiny, "-c", "64", "--rpc", server.endpoint, "-ngl", "99",
                 "-p", "hello", "-n", "4", "--temp", "0", "--ignore-eos", "--no-warmup"]) == 0
    assert "generation 4 tokens" in capsys.readouterr().err
    assert [r.endpoint for r in rpc_regs(base.default_registry())] == [server.endpoint]


def test_serve_over_rpc_gives_the_cpus_completion(tiny):
    with LLM(tiny, n_ctx=256, n_ubatch=64, n_threads=1) as cpu:
        want = cpu.create_completion("the capital of france is", max_tokens=8,
                                     temperature=0)["choices"][0]["text"]
    # its own rpc-server: one serves one client at a time, and this process holds `server`
    with RpcServer.start() as server, ServeProcess([
            "-m", tiny, "-c", "512", "-np", "2", "-ub", "64", "-t", "1", "--rpc",
            server.endpoint, "-ngl", "99"]) as srv:
        r = httpx.post(f"{srv.base}/v1/completions", timeout=60,
                       json={"prompt": "the capital of france is", "max_tokens": 8,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want
    assert f"devices: RPC[{server.endpoint}]" in srv.stderr, srv.stderr


def test_bad_rpc_endpoints_are_clear(tiny, capsys):
    assert main(["plan", "-m", tiny, "--rpc", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert "127.0.0.1:1" in err and "Traceback" not in err
    assert main(["plan", "-m", tiny, "--set", "rpc=[nonsense]"]) == 1
    assert "expected HOST:PORT" in capsys.readouterr().err
    for empty in ("", ",", " , "):          # an unset variable: not silently CPU only
        assert main(["plan", "-m", tiny, "--rpc", empty]) == 2
        err = capsys.readouterr().err
        assert "no server given" in err and err.count("\n") == 1, err
