"""`pyggml bench` (llama-bench's table) and `pyggml bench kernels` (matvec GB/s)."""

from __future__ import annotations

import sys
from pathlib import Path

from pyggml.cli.args import count_list, thread_list
from pyggml.cmdline import add_hf_arg, add_offload_args
from pyggml.errors import PyggmlError, UsageError
from pyggml.offload.flags import config_from_cli


def cmd_bench(args) -> int:
    from pyggml.llm import bench
    from pyggml.models_default import ensure_default_model
    if args.repetitions < 1:
        raise UsageError(f"-r {args.repetitions}: expected at least 1 repetition")
    if not any(args.n_prompt) and not any(args.n_gen):
        raise UsageError("-p and -n are all 0: nothing to measure (llama-bench's 0 skips a test)")
    model = args.model or ensure_default_model()
    fa = args.flash_attn != "off"
    config = config_from_cli(args)
    rows = bench.bench_pyggml(model, args.n_prompt, args.n_gen, args.threads, args.repetitions,
                              flash_attn=fa, n_gpu_layers=args.n_gpu_layers or 0, config=config,
                              progress=sys.stderr.isatty())
    ref = None
    if args.compare_llamacpp or args.llamacpp_python:
        ref = bench.bench_llamacpp(model, args.n_prompt, args.n_gen, args.threads,
                                   args.repetitions, args.llamacpp_python, flash_attn=fa,
                                   n_gpu_layers=args.n_gpu_layers or 0,
                                   no_extra_bufts=args.llamacpp_no_extra_bufts)
    notes = bench.llamacpp_nondefaults(no_extra_bufts=args.llamacpp_no_extra_bufts) if ref else []
    print(bench.format_table(rows, ref, Path(model).name, ref_notes=notes))
    return 0


def cmd_bench_kernels(args) -> int:
    """tools/bench_kernels.py (matvec GB/s per type vs memory bandwidth)."""
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "tools" / "bench_kernels.py"
    if not path.is_file():
        raise PyggmlError(f"{path} not found: `bench kernels` runs from a source checkout")
    spec = importlib.util.spec_from_file_location("pyggml_bench_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run(args)


def add_commands(sub) -> None:
    b = sub.add_parser("bench", help="llama-bench style pp/tg tokens/s (or `bench kernels`)")
    b.add_argument("-m", "--model", default=None)
    add_hf_arg(b)
    b.add_argument("-p", "--n-prompt", type=count_list, default=[64, 512])
    b.add_argument("-n", "--n-gen", type=count_list, default=[32, 128])
    b.add_argument("-t", "--threads", type=thread_list, default=[1, 2])
    b.add_argument("-r", "--repetitions", type=int, default=3)
    b.add_argument("-fa", "--flash-attn", choices=("on", "off"), default="on")
    b.add_argument("-c", "--ctx-size", dest="ctx", action="append",
                   help="an offload config file")
    add_offload_args(b)
    b.add_argument("--compare-llamacpp", action="store_true",
                   help="also run llama.cpp (llama-cpp-python) with the same settings")
    b.add_argument("--llamacpp-python", default=None,
                   help="interpreter that has llama-cpp-python (default: this one)")
    b.add_argument("--llamacpp-no-extra-bufts", action="store_true",
                   help="llama.cpp without its repacked/AMX buffer types (VMs without AMX)")
    b.set_defaults(func=cmd_bench)

    bk = sub.add_parser("bench-kernels")         # `pyggml bench kernels`; not listed
    for opt, kw in (("--types", {"default": "q4_0,q4_1,q5_0,q5_1,q8_0,f16,bf16,f32,q4_k,q6_k"}),
                    ("--paths", {"default": None}), ("--threads", {"default": "1,2"}),
                    ("--rows", {"type": int, "default": 4096}),
                    ("--cols", {"type": int, "default": 4096}),
                    ("--runs", {"type": int, "default": 7}),
                    ("--min-bytes", {"type": int, "default": 256 << 20})):
        bk.add_argument(opt, **kw)
    bk.set_defaults(func=cmd_bench_kernels)
