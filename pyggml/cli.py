"""The `pyggml` command line: run | bench | info | graph (more subcommands arrive with their
features: plan, mem)."""

from __future__ import annotations

import argparse
import sys

from pyggml import _native
from pyggml.errors import PyggmlError


def _cmd_info(args) -> int:
    feats = _native.cpu_features()
    print(f"libpyggml {_native.version()}")
    print("cpu features: " + (" ".join(k for k, v in feats.items() if v) or "(none)"))
    print(f"kernel path:  {_native.cpu_path()} (available: {', '.join(_native.available_paths())})")
    return 0


def _tiny_graph():
    from pyggml import Context, Graph, ops
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor_2d("q4_0", 64, 32, name="w")
    x = ctx.new_tensor_2d("f32", 64, 4, name="x").set_input()
    y = ops.silu(ctx, ops.mul_mat(ctx, w, x, name="wx"), name="act")
    out = ops.rms_norm(ctx, y, 1e-6, name="out").set_output()
    g = Graph()
    g.build_forward_expand(out)
    return g


def _cmd_graph(args) -> int:
    g = _tiny_graph()
    if args.dot:
        g.to_dot(args.dot)
        print(f"wrote {args.dot}")
    for i, t in enumerate(g.leafs):
        print(f"leaf {i:3d} {t.name:10s} {t.type.name:5s} ne={list(t.ne)}")
    for i, t in enumerate(g.nodes):
        srcs = ", ".join(s.name for s in t.src if s is not None)
        print(f"node {i:3d} {t.name:10s} {t.op.name:9s} {t.type.name:5s} ne={list(t.ne)} "
              f"<- {srcs} (uses: {g.use_count(t)})")
    return 0


def _cmd_run(args) -> int:
    _cmd_info(args)
    print("model runtime not built yet: showing the plan of a tiny graph instead")
    return _cmd_graph(argparse.Namespace(dot=None))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="pyggml", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="generate text with a GGUF model")
    r.add_argument("-m", "--model", default=None)
    r.add_argument("-p", "--prompt", default="The capital of France is")
    r.add_argument("-n", "--n-predict", type=int, default=32)
    r.set_defaults(func=_cmd_run)
    i = sub.add_parser("info", help="CPU features and kernel paths")
    i.set_defaults(func=_cmd_info)
    g = sub.add_parser("graph", help="print (and optionally export) a small example graph")
    g.add_argument("--dot", default=None, help="write Graphviz text to this file")
    g.set_defaults(func=_cmd_graph)
    args = p.parse_args(argv)
    try:
        return args.func(args)
    except PyggmlError as e:
        print(f"pyggml: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
