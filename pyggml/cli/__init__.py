"""The `pyggml` command line.

  pyggml run   [-m MODEL] -p PROMPT -n N [llama.cpp-style flags]   generate text
  pyggml bench [-m MODEL] -p 64,512 -n 32,128 -t 1,2 -r 3 [--compare-llamacpp]
  pyggml bench kernels [--types ...]                                  quantized matvec GB/s
  pyggml plan  [-m MODEL] [-c config.yaml] [-ngl N] [-ot RE=DEV] [--check-fit]   dry run
  pyggml chat  [-m MODEL] [-sys TEXT] [--chat-template FILE|NAME]    conversation
  pyggml serve [-m MODEL] [--host H] [--port P] [-np N] [-c N_CTX] [--api-key KEY]
  pyggml info                                                         CPU features, paths
  pyggml graph [--dot FILE]                                           a small example graph

`-c` takes a context size (an integer, as llama.cpp) or an offload config file (anything else).
Offload (run, bench, plan): -ngl N, -ot REGEX=DEVICE (repeatable), --no-kv-offload,
--no-op-offload, --set KEY=VALUE (repeatable); see configs/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time

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


def _ctx_and_config(values) -> tuple[int | None, str | None]:
    """-c may be given twice: an integer is the context size, anything else a config file."""
    n_ctx, config = None, None
    for v in values or []:
        if v.isdigit():
            n_ctx = int(v)
        else:
            config = v
    return n_ctx, config


def _cmd_run(args) -> int:
    from pyggml.llm.runtime import LLM
    from pyggml.planning.dryrun import config_from_cli
    n_ctx, _ = _ctx_and_config(args.ctx)
    config = config_from_cli(args)          # None without a config file or offload flags
    t0 = time.perf_counter()
    llm = LLM(args.model, config=config, n_ctx=n_ctx or 4096, n_batch=args.batch_size or 2048,
              n_ubatch=args.ubatch_size or 512, n_threads=args.threads,
              n_threads_batch=args.threads_batch, flash_attn=args.flash_attn != "off",
              n_gpu_layers=args.n_gpu_layers or 0, verbose=args.verbose)
    for w in llm.offload.warnings:
        print(f"pyggml: warning: {w}", file=sys.stderr)
    t_load = time.perf_counter() - t0
    if args.verbose:
        hp = llm.hparams
        print(f"model: {llm.path} ({hp.arch}, {hp.n_layer} layers, E={hp.n_embd}, "
              f"V={hp.n_vocab}); threads {llm.backend.n_threads}/{llm.backend.n_threads_batch}; "
              f"kernel path {_native.cpu_path()}", file=sys.stderr)
    if not args.no_warmup:
        llm.eval([llm.tokenizer.bos_id if llm.tokenizer.bos_id is not None else 0])
        llm.reset()
        llm.stats.t_prompt_s = 0.0
        llm.stats.n_prompt_tokens = 0
    print(args.prompt, end="", flush=True)
    gen = llm.generate(args.prompt, args.n_predict, temperature=args.temp, top_k=args.top_k,
                       top_p=args.top_p, min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                       seed=args.seed, stop_at_eog=not args.ignore_eos)
    for tok in gen:
        print(tok.text, end="", flush=True)
    print()
    s = llm.stats
    pp = s.n_prompt_tokens / s.t_prompt_s if s.t_prompt_s else 0.0
    tg = s.n_gen_tokens / s.t_gen_s if s.t_gen_s else 0.0
    print(f"\nload time {t_load * 1000:.0f} ms | prompt {s.n_prompt_tokens} tokens, {pp:.1f} t/s | "
          f"generation {s.n_gen_tokens} tokens, {tg:.1f} t/s | graphs built {s.graphs_built}, "
          f"reused {s.graphs_reused}", file=sys.stderr)
    llm.close()
    return 0


def _int_list(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")


def _cmd_bench(args) -> int:
    from pathlib import Path

    from pyggml.llm import bench
    model = args.model
    if model is None:
        from pyggml.models_default import ensure_default_model
        model = ensure_default_model()
    fa = args.flash_attn != "off"
    from pyggml.planning.dryrun import config_from_cli
    config = config_from_cli(args)
    rows = bench.bench_pyggml(model, args.n_prompt, args.n_gen, args.threads, args.repetitions,
                              flash_attn=fa, n_gpu_layers=args.n_gpu_layers or 0, config=config)
    ref = None
    if args.compare_llamacpp or args.llamacpp_python:
        ref = bench.bench_llamacpp(model, args.n_prompt, args.n_gen, args.threads,
                                   args.repetitions, args.llamacpp_python, flash_attn=fa,
                                   n_gpu_layers=args.n_gpu_layers or 0)
    print(bench.format_table(rows, ref, Path(model).name))
    return 0


def _cmd_plan(args) -> int:
    from pyggml.planning import dryrun as plan
    return plan.run(args, sys.argv[1:])


def _cmd_bench_kernels(args) -> int:
    """`pyggml bench kernels`: tools/bench_kernels.py (matvec GB/s per type vs memory bandwidth)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "tools" / "bench_kernels.py"
    if not path.is_file():
        raise PyggmlError(f"{path} not found: `bench kernels` runs from a source checkout")
    spec = importlib.util.spec_from_file_location("pyggml_bench_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run(args)


def _parser() -> argparse.ArgumentParser:
    from pyggml.planning import dryrun as plan_args
    p = argparse.ArgumentParser(prog="pyggml", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="generate text with a GGUF model")
    r.add_argument("-m", "--model", default=None, help="GGUF file (default: Gemma 3 270M)")
    r.add_argument("-p", "--prompt", default="The capital of France is")
    r.add_argument("-n", "--n-predict", type=int, default=128)
    r.add_argument("-t", "--threads", type=int, default=None)
    r.add_argument("-tb", "--threads-batch", type=int, default=None)
    r.add_argument("-c", "--ctx-size", dest="ctx", action="append",
                   help="context size (integer) or offload config file")
    r.add_argument("-b", "--batch-size", type=int, default=None, help="default 2048")
    r.add_argument("-ub", "--ubatch-size", type=int, default=None, help="default 512")
    r.add_argument("--temp", type=float, default=0.8)
    r.add_argument("--top-k", type=int, default=40)
    r.add_argument("--top-p", type=float, default=0.95)
    r.add_argument("--min-p", type=float, default=0.05)
    r.add_argument("--repeat-penalty", type=float, default=1.0)
    r.add_argument("-s", "--seed", type=int, default=0xFFFFFFFF)
    r.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto")
    r.add_argument("-ngl", "--n-gpu-layers", type=int, default=None,
                   help="the last N layers on the first GPU device (99: all, with the output)")
    r.add_argument("--ignore-eos", action="store_true")
    r.add_argument("--no-warmup", action="store_true")
    r.add_argument("-v", "--verbose", action="store_true")
    plan_args.add_offload_arguments(r)
    r.set_defaults(func=_cmd_run)

    b = sub.add_parser("bench", help="llama-bench style pp/tg tokens/s (or `bench kernels`)")
    b.add_argument("-m", "--model", default=None)
    b.add_argument("-p", "--n-prompt", type=_int_list, default=[64, 512])
    b.add_argument("-n", "--n-gen", type=_int_list, default=[32, 128])
    b.add_argument("-t", "--threads", type=_int_list, default=[1, 2])
    b.add_argument("-r", "--repetitions", type=int, default=3)
    b.add_argument("-fa", "--flash-attn", choices=("on", "off"), default="on")
    b.add_argument("-ngl", "--n-gpu-layers", type=int, default=None)
    b.add_argument("-c", "--ctx-size", dest="ctx", action="append",
                   help="an offload config file")
    plan_args.add_offload_arguments(b)
    b.add_argument("--compare-llamacpp", action="store_true",
                   help="also run llama.cpp (llama-cpp-python) with the same settings")
    b.add_argument("--llamacpp-python", default=None,
                   help="interpreter that has llama-cpp-python (default: this one)")
    b.set_defaults(func=_cmd_bench)

    bk = sub.add_parser("bench-kernels", help=argparse.SUPPRESS)
    for opt, kw in (("--types", {"default": "q4_0,q4_1,q5_0,q5_1,q8_0,f16,bf16,f32,q4_k,q6_k"}),
                    ("--paths", {"default": None}), ("--threads", {"default": "1,2"}),
                    ("--rows", {"type": int, "default": 4096}),
                    ("--cols", {"type": int, "default": 4096}),
                    ("--runs", {"type": int, "default": 7}),
                    ("--min-bytes", {"type": int, "default": 256 << 20})):
        bk.add_argument(opt, **kw)
    bk.set_defaults(func=_cmd_bench_kernels)

    from pyggml.planning import measure as mem
    mm = sub.add_parser("mem", help="memory per device: planned, and measured after a warm-up")
    mem.add_arguments(mm)
    mm.set_defaults(func=mem.cmd_mem)

    pl = sub.add_parser("plan", help="dry run: where each tensor goes, memory per device")
    pl.add_argument("-m", "--model", default=None, help="GGUF file (default: Gemma 3 270M)")
    pl.add_argument("-c", "--ctx-size", dest="ctx", action="append",
                    help="context size (integer) or offload config file")
    pl.add_argument("-ngl", "--n-gpu-layers", type=int, default=None)
    pl.add_argument("-t", "--threads", type=int, default=None)
    pl.add_argument("-tb", "--threads-batch", type=int, default=None)
    pl.add_argument("-b", "--batch-size", type=int, default=None)
    pl.add_argument("-ub", "--ubatch-size", type=int, default=None)
    pl.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto")
    plan_args.add_offload_arguments(pl)
    plan_args.add_arguments(pl)
    pl.set_defaults(func=_cmd_plan)

    from pyggml.cli import chat, serve          # commands in their own modules
    for mod in (chat, serve):
        mod.register(sub)

    i = sub.add_parser("info", help="CPU features and kernel paths")
    i.set_defaults(func=_cmd_info)
    g = sub.add_parser("graph", help="print (and optionally export) a small example graph")
    g.add_argument("--dot", default=None, help="write Graphviz text to this file")
    g.set_defaults(func=_cmd_graph)
    return p


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["bench", "kernels"]:
        argv = ["bench-kernels"] + argv[2:]
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except PyggmlError as e:
        print(f"pyggml: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
