"""The graph each RPC client sends an rpc-server, op by op: ours next to llama.cpp's.

    .venv/bin/python tools/rpc_graph_ops.py [--model PATH] [--llama-bench PATH] [--ngl 99]

Runs `pyggml bench` and `llama-bench` (-p 0 -n 3, 1 thread, flash attention, -ngl N) through a
proxy in front of one rpc-server (1 thread, started here) that parses the client's commands and
keeps the last GRAPH_COMPUTE payload (u32 device | u32 n_nodes | u64 node ids | u32 n_tensors |
296-byte tensor records). Prints, per client, the nodes by ggml op (UNARY and GLU with their
function) and the commands sent, then the ops whose counts differ. Both clients' servers run the
same kernels; this shows whether they are given the same work.
"""

from __future__ import annotations

import argparse
import collections
import re
import struct
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests"))

from bench_rpc import LLAMA_BENCH, CountingProxy, _ours, _theirs  # noqa: E402
from support.rpc_server import RpcServer  # noqa: E402

from pyggml.backend.rpc.protocol import RPC_TENSOR, Cmd  # noqa: E402

ENUMS = REPO / "tests" / "data" / "rpc" / "ggml_enums_0c1e570.h"


def _enum(text: str, name: str, prefix: str) -> list[str]:
    body = text.split(f"enum {name} {{")[1].split("};")[0]
    return re.findall(rf"{prefix}(\w+)", body)


class GraphProxy(CountingProxy):
    """A CountingProxy that also parses what the client sends: commands counted by name, the
    node records of the last GRAPH_COMPUTE kept (in node order)."""

    def __init__(self, target: str):
        self.commands: collections.Counter = collections.Counter()
        self.last_graph: list[tuple] = []
        self.errors: list[str] = []
        super().__init__(target)

    def _pump(self, a, b, field: str) -> None:
        if field != "sent":
            return super()._pump(a, b, field)
        proxy, buf = self, bytearray()

        class Tee:          # the socket the pump reads from, parsing each chunk it returns
            def recv(self, n):
                data = a.recv(n)
                buf.extend(data)
                try:
                    proxy._parse(buf)
                except (struct.error, KeyError, ValueError) as e:
                    proxy.errors.append(repr(e))
                    buf.clear()
                return data

            def shutdown(self, how):
                a.shutdown(how)
        return super()._pump(Tee(), b, field)

    def _parse(self, buf: bytearray) -> None:
        while len(buf) >= 9:
            cmd, n = struct.unpack_from("<BQ", buf)
            if len(buf) < 9 + n:
                return
            payload = bytes(buf[9:9 + n])
            del buf[:9 + n]
            self.commands[Cmd(cmd).name if cmd in set(Cmd) else str(cmd)] += 1
            if cmd == Cmd.GRAPH_COMPUTE:
                _, n_nodes = struct.unpack_from("<II", payload)
                ids = struct.unpack_from(f"<{n_nodes}Q", payload, 8)
                off = 8 + 8 * n_nodes
                (n_tensors,) = struct.unpack_from("<I", payload, off)
                recs = {}
                for i in range(n_tensors):
                    r = RPC_TENSOR.unpack_from(payload, off + 4 + i * RPC_TENSOR.size)
                    recs[r[0]] = r
                self.last_graph = [recs[i] for i in ids]


def histogram(graph: list[tuple], ops: list[str], unary: list[str], glu: list[str]) -> dict:
    """ggml op name -> node count; UNARY and GLU nodes by function (op_params[0])."""
    h: collections.Counter = collections.Counter()
    for r in graph:
        op, p0 = ops[r[11]], r[12]
        if op == "UNARY":
            op = f"UNARY:{unary[p0]}"
        elif op == "GLU":
            op = f"GLU:{glu[p0]}"
        h[op] += 1
    return dict(h)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M)")
    ap.add_argument("--llama-bench", type=Path, default=LLAMA_BENCH)
    ap.add_argument("--ngl", type=int, default=99)
    a = ap.parse_args()
    if not a.llama_bench.exists():
        sys.exit(f"{a.llama_bench} missing: run `make llamacpp-tools`")
    if a.model is None:
        from pyggml.models_default import ensure_default_model
        a.model = str(ensure_default_model())
    text = ENUMS.read_text()
    ops = _enum(text, "ggml_op", "GGML_OP_")
    unary = _enum(text, "ggml_unary_op", "GGML_UNARY_OP_")
    glu = _enum(text, "ggml_glu_op", "GGML_GLU_OP_")
    flags = ["-ngl", str(a.ngl)]
    srv = RpcServer.start(threads=1)
    hists = {}
    try:
        for who in ("pyggml", "llama.cpp"):
            proxy = GraphProxy(srv.endpoint)
            if who == "pyggml":
                _ours(a.model, [proxy.endpoint], flags, 0, 3, 1)
            else:
                _theirs(a.llama_bench, a.model, [proxy.endpoint], flags, 0, 3, 1)
            time.sleep(0.5)
            proxy.close()
            if proxy.errors or not proxy.last_graph:
                sys.exit(f"{who}: no graph captured ({'; '.join(proxy.errors) or 'none sent'})")
            h = hists[who] = histogram(proxy.last_graph, ops, unary, glu)
            views = sum(h.get(v, 0) for v in ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"))
            print(f"{who}: {len(proxy.last_graph)} nodes ({len(proxy.last_graph) - views} that "
                  f"compute); commands {dict(proxy.commands)}")
            print("   " + ", ".join(f"{k} {v}" for k, v in sorted(h.items(), key=lambda x: -x[1])))
    finally:
        srv.stop()
    ours, theirs = hists["pyggml"], hists["llama.cpp"]
    diff = {k: (ours.get(k, 0), theirs.get(k, 0)) for k in set(ours) | set(theirs)
            if ours.get(k, 0) != theirs.get(k, 0)}
    print("\nops whose counts differ (pyggml, llama.cpp): "
          + (", ".join(f"{k} {v}" for k, v in sorted(diff.items())) or "none"))


if __name__ == "__main__":
    main()
