"""The benchmark tools' own logic (no benchmark is run): the OLMoE-shaped MoE model's tensor plan
(tools/make_moe_bench_model.py) and the laptop-sized ones (tools/make_laptop_models.py), the
byte-counting TCP proxy of tools/bench_rpc.py and what `pyggml bench` times
(pyggml/llm/bench.py)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import make_moe_bench_model as moe  # noqa: E402


def test_moe_plan_has_olmoe_1b_7b_shape_and_q4_k_m_mix():
    plan = {name: (ne, t) for name, ne, t in moe.tensor_plan()}
    # 3 global tensors + 12 per layer
    assert len(plan) == 3 + 12 * 16
    n_params = sum(int(np.prod(ne)) for ne, _ in plan.values())
    # llama-bench reports the real OLMoE-1B-7B Q4_K_M (and this file) as 6.92 B parameters
    assert 6.91e9 < n_params < 6.93e9
    assert plan["blk.3.ffn_gate_exps.weight"] == ((2048, 1024, 64), "q4_k")
    assert plan["blk.3.ffn_down_exps.weight"] == ((1024, 2048, 64), "q4_k")
    assert plan["output.weight"] == ((2048, 50304), "q6_k")
    assert plan["blk.0.ffn_gate_inp.weight"] == ((2048, 64), "f32")
    # llama.cpp's use_more_bits for 16 layers: the Q6_K layers of attn_v and ffn_down(_exps)
    more = [il for il in range(16) if plan[f"blk.{il}.ffn_down_exps.weight"][1] == "q6_k"]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]
    assert more == [il for il in range(16) if plan[f"blk.{il}.attn_v.weight"][1] == "q6_k"]


def test_moe_row_scales_keep_the_residual_writers_small():
    assert moe.row_scale("token_embd.weight") == np.sqrt(2048)
    assert moe.row_scale("blk.5.attn_output.weight") == 0.05
    assert moe.row_scale("blk.5.ffn_down_exps.weight") == 0.05
    assert moe.row_scale("blk.5.ffn_up_exps.weight") == 1.0


def _echo_server(delay_s: float = 0.0):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)

    def serve():
        c, _ = ls.accept()
        with c:
            while True:
                data = c.recv(65536)
                if not data:
                    break
                time.sleep(delay_s)         # the server's "work"
                c.sendall(data * 2)         # answers twice as many bytes as it gets

    threading.Thread(target=serve, daemon=True).start()
    return ls, f"127.0.0.1:{ls.getsockname()[1]}"


def test_counting_proxy_counts_both_directions():
    from bench_rpc import CountingProxy
    ls, ep = _echo_server(delay_s=0.2)
    proxy = CountingProxy(ep)
    try:
        host, port = proxy.endpoint.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as c:
            got = b""
            for i, chunk in enumerate((b"a" * 1000, b"b" * 3000)):
                if i:
                    time.sleep(0.3)         # the client's "work" between round trips
                c.sendall(chunk)
                want = len(got) + 2 * len(chunk)
                while len(got) < want:
                    got += c.recv(65536)
        deadline = time.monotonic() + 10
        while (proxy.sent, proxy.received) != (4000, 8000) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert got == b"a" * 2000 + b"b" * 6000
        assert proxy.sent == 4000
        assert proxy.received == 8000
        assert proxy.turns == 2             # two answers, each after the client's bytes
        assert 0.4 <= proxy.server_s < 5.0        # each answer >= 0.2 s after its request
        assert 0.3 <= proxy.client_s < 2.0
    finally:
        proxy.close()
        ls.close()


def test_bench_times_graphs_that_exist(tiny_models, monkeypatch):
    """As llama-bench: one untimed run of each test before its repetitions, so no timed run
    builds a graph (the first run of a shape splits, allocates and, on a remote device,
    uploads its graph; llama-bench's timed runs of pp64 are recomputes of its warm-up's)."""
    from pyggml.llm import bench, setup
    timing = [False]
    built_while_timed = []
    real_clock, real_build = time.perf_counter, setup.Run.build_graph

    def clock():                    # the bench's perf_counter() calls start and end each run
        timing[0] = not timing[0]
        return real_clock()

    def build(self, params, *args, **kwargs):   # Run.build_graph's other arguments (lora)
        if timing[0]:                               # passed on as given
            built_while_timed.append(params)
        return real_build(self, params, *args, **kwargs)

    from types import SimpleNamespace
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=clock))
    monkeypatch.setattr(setup.Run, "build_graph", build)
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=2, n_embd=64)
    rows = bench.bench_pyggml(tm.path, [16, 8], [4], [1], 2)
    assert [r.test for r in rows] == ["pp16", "pp8", "tg4"]
    assert all(len(r.tps) == 2 and min(r.tps) > 0 for r in rows)
    assert built_while_timed == []


def test_graph_proxy_reads_the_graph_a_client_sends(tiny_models):
    """tools/rpc_graph_ops.py's proxy in front of a real rpc-server: every command our client
    sends is counted by name, and the last GRAPH_COMPUTE's nodes are the graph the server
    runs: the remote split's computing nodes, with its matmuls and norms by ggml op."""
    import pytest
    from support.rpc_server import SERVER_BIN, RpcServer
    if not SERVER_BIN.is_file():
        pytest.skip(f"{SERVER_BIN} missing: run `make setup`")
    from rpc_graph_ops import ENUMS, GraphProxy, _enum, histogram

    from pyggml.backend import rpc
    from pyggml.llm.runtime import LLM
    from pyggml.types import VIEW_OPS, Op
    text = ENUMS.read_text()
    ops, unary = _enum(text, "ggml_op", "GGML_OP_"), _enum(text, "ggml_unary_op", "GGML_UNARY_OP_")
    glu = _enum(text, "ggml_glu_op", "GGML_GLU_OP_")
    assert (ops[29], unary[8], glu[1]) == ("MUL_MAT", "GELU", "GEGLU")
    srv = RpcServer.start()
    proxy = GraphProxy(srv.endpoint)
    tm = tiny_models.get(arch="llama", weight_type="q8_0", n_layer=4, n_embd=64)
    try:
        rpc.register_endpoints([proxy.endpoint], timeout_s=20.0)
        cfg = {"devices": [f"RPC[{proxy.endpoint}]"], "gpu_layers": "all"}
        with LLM(tm.path, config=cfg, n_ctx=64, n_ubatch=16, n_threads=1) as llm:
            llm.eval([1, 2, 3])
            llm.eval([4])
            sched = llm.sched["decode"]
            remote, = [sp for sp in sched.splits if sched.backends[sp.backend_id].name != "CPU"]
            want = [t for t in remote.graph.nodes if t.op not in VIEW_OPS and t.op != Op.NONE]
        deadline = time.monotonic() + 10
        while proxy.commands.get("GET_TENSOR", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not proxy.errors
        assert proxy.commands["HELLO"] == 1 and proxy.commands["GRAPH_COMPUTE"] >= 2
        h = histogram(proxy.last_graph, ops, unary, glu)
        assert len(proxy.last_graph) == len(want)
        assert h["MUL_MAT"] == sum(t.op == Op.MUL_MAT for t in want)
        assert h["RMS_NORM"] == sum(t.op == Op.RMS_NORM for t in want)
        assert h["UNARY:SILU"] == 4            # one per layer's FFN
    finally:
        rpc.unregister_endpoints([proxy.endpoint])
        proxy.close()
        srv.stop()


def test_laptop_models_have_the_real_shapes_and_q4_k_m_mix():
    import make_laptop_models as lap
    for key, n_params, n_tensors in (("llama8b", 8.030e9, 3 + 1 + 9 * 32),
                                     ("moe30b", 30.532e9, 3 + 12 * 48)):
        shape = lap.MODELS[key][1]
        plan = {name: (ne, t) for name, ne, t in lap.tensor_plan(shape)}
        assert len(plan) == n_tensors
        total = sum(int(np.prod(ne)) for ne, _ in plan.values())
        # llama-bench reports the real files as 8.03 B and 30.53 B parameters
        assert abs(total - n_params) < 0.001e9, (key, total)
        assert plan["output.weight"][1] == "q6_k" and plan["token_embd.weight"][1] == "q4_k"
        more = [il for il in range(shape.n_layer) if plan[f"blk.{il}.attn_v.weight"][1] == "q6_k"]
        assert more == [il for il in range(shape.n_layer) if moe.use_more_bits(il, shape.n_layer)]
    moe_plan = {n: (ne, t) for n, ne, t in lap.tensor_plan(lap.MODELS["moe30b"][1])}
    assert moe_plan["blk.7.ffn_gate_exps.weight"] == ((2048, 768, 128), "q4_k")
    assert moe_plan["blk.7.attn_k.weight"] == ((2048, 512), "q4_k")
    # the real Q4_K_M files: 4.92 GB and 18.6 GB (tensor bytes here, header aside)
    assert 4.90e9 < lap.n_bytes(lap.MODELS["llama8b"][1]) < 4.93e9
    assert 18.5e9 < lap.n_bytes(lap.MODELS["moe30b"][1]) < 18.6e9
