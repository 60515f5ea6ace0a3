"""`pyggml info` (CPU features, kernel paths, devices) and `pyggml graph` (a small example)."""

from __future__ import annotations

from pyggml import _native


def cmd_info(args) -> int:
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


def cmd_graph(args) -> int:
    g = _tiny_graph()
    if args.dot:
        from pyggml.cli.output import write_text
        write_text(args.dot, g.to_dot())
        print(f"wrote {args.dot}")
    for i, t in enumerate(g.leafs):
        print(f"leaf {i:3d} {t.name:10s} {t.type.name:5s} ne={list(t.ne)}")
    for i, t in enumerate(g.nodes):
        srcs = ", ".join(s.name for s in t.src if s is not None)
        print(f"node {i:3d} {t.name:10s} {t.op.name:9s} {t.type.name:5s} ne={list(t.ne)} "
              f"<- {srcs} (uses: {g.use_count(t)})")
    return 0


def add_commands(sub) -> None:
    i = sub.add_parser("info", help="CPU features and kernel paths")
    i.set_defaults(func=cmd_info)
    g = sub.add_parser("graph", help="print (and optionally export) a small example graph")
    g.add_argument("--dot", default=None, help="write Graphviz text to this file")
    g.set_defaults(func=cmd_graph)
