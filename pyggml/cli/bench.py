"""`pyggml bench` (llama-bench's tests and outputs) and `pyggml bench kernels` (matvec GB/s)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyggml.cli.args import thread_list
from pyggml.cmdline import add_hf_arg, add_offload_args
from pyggml.errors import PyggmlError, UsageError
from pyggml.offload.flags import config_from_cli


def _ints(lo: int, what: str):
    """An argparse type: llama-bench's lists of integers — comma separated, each an integer or
    a range 'first-last', 'first-last+step', 'first-last*mult' — each at least `lo`."""
    def parse(text: str) -> list[int]:
        out = []
        for part in str(text).split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "-" in part[1:]:
                    first, rest = part[0] + part[1:].split("-", 1)[0], part[1:].split("-", 1)[1]
                    op, step = ("+", 1)
                    for o in "+*":
                        if o in rest:
                            rest, s = rest.split(o, 1)
                            op, step = o, int(s)
                    a, b = int(first), int(rest)
                    if step < 1 or (op == "*" and step < 2) or (op == "*" and a < 1) or b < a:
                        raise ValueError
                    x = a
                    while x <= b:
                        out.append(x)
                        x = x + step if op == "+" else x * step
                else:
                    out.append(int(part))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated integers or ranges (a-b, a-b+s, a-b*m), got "
                    f"{text!r}") from None
        if any(n < lo for n in out):
            raise argparse.ArgumentTypeError(f"expected {what} >= {lo}, got {text!r}")
        return out
    parse.__name__ = what
    return parse


def _pair(text: str) -> tuple[int, int]:
    parts = str(text).split(",")
    try:
        p, g = (int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PP,TG (two token counts), got {text!r}") \
            from None
    if p < 0 or g < 0:
        raise argparse.ArgumentTypeError(f"expected token counts >= 0, got {text!r}")
    return p, g


def _words(text: str) -> list[str]:
    return [w.strip().lower() for w in str(text).split(",") if w.strip()]


def _flat(lists, default):
    """A flag given several times adds to its list (llama-bench's rule); absent: default."""
    return [x for lst in lists for x in lst] if lists else list(default)


def cmd_bench(args) -> int:
    from pyggml.backend.cpu import default_n_threads
    from pyggml.llm import bench
    from pyggml.llm.kv_cache import kv_type_choices
    from pyggml.models_default import ensure_default_model
    D = bench.DEFAULTS
    if args.repetitions < 1:
        raise UsageError(f"-r {args.repetitions}: expected at least 1 repetition")
    prompts, gens = _flat(args.n_prompt, D["n_prompt"]), _flat(args.n_gen, D["n_gen"])
    pgs = list(args.pg or [])
    if not bench.tests_of(prompts, gens, pgs):
        raise UsageError("-p, -n and -pg are all 0: nothing to measure (llama-bench's 0 skips "
                         "a test)")
    choices = kv_type_choices()
    types = {}
    for flag, attr in (("-ctk", "cache_type_k"), ("-ctv", "cache_type_v")):
        vals = _flat(getattr(args, attr), D["type_k"])
        for v in vals:
            if v not in choices:
                raise UsageError(f"{flag} {v}: expected one of {', '.join(choices)}")
        types[attr] = vals
    fas = _flat(args.flash_attn, D["flash_attn"])
    for v in fas:
        if v not in ("on", "off", "auto", "1", "0"):
            raise UsageError(f"-fa {v}: expected on, off or auto")
    threads = _flat(args.threads, [default_n_threads()])
    batches, ubatches = _flat(args.batch_size, D["n_batch"]), _flat(args.ubatch_size, D["n_ubatch"])
    depths = _flat(args.n_depth, D["n_depth"])
    setting_list = bench.settings_of(threads, batches, ubatches, types["cache_type_k"],
                                     types["cache_type_v"],
                                     list(dict.fromkeys(v not in ("off", "0") for v in fas)))
    model = args.model or ensure_default_model()
    config = config_from_cli(args)
    ngl = args.n_gpu_layers or 0
    rows = bench.bench_pyggml(model, prompts, gens, threads, args.repetitions,
                              n_gpu_layers=ngl, config=config, progress=sys.stderr.isatty(),
                              pgs=pgs, depths=depths, setting_list=setting_list)
    ref, notes = None, []
    if args.llamacpp_python:
        if any(depths) or pgs or any(s != bench.Setting(n_threads=s.n_threads,
                                                        flash_attn=s.flash_attn)
                                     for s in setting_list):
            raise UsageError("--llamacpp-python measures pp and tg at depth 0 with the default "
                             "sizes and f16 KV only; compare -d/-pg/-b/-ub/-ctk/-ctv with "
                             "llama.cpp's llama-bench (--compare-llamacpp)")
        ref = bench.bench_llamacpp(model, prompts, gens, threads, args.repetitions,
                                   args.llamacpp_python, flash_attn=setting_list[0].flash_attn,
                                   n_gpu_layers=ngl, no_extra_bufts=args.llamacpp_no_extra_bufts)
        notes = bench.llamacpp_nondefaults(no_extra_bufts=args.llamacpp_no_extra_bufts)
    elif args.compare_llamacpp:
        if args.llamacpp_no_extra_bufts:
            raise UsageError("--llamacpp-no-extra-bufts needs --llamacpp-python (llama-bench "
                             "runs at its defaults)")
        ref = bench.bench_llama_bench(model, bench.tests_of(prompts, gens, pgs), depths,
                                      setting_list, args.repetitions, exe=args.llama_bench)
        notes = bench.llamacpp_nondefaults()
    print(bench.format_output(args.output, rows, bench.ModelFacts.of(model), ref=ref,
                              ref_notes=notes, n_gpu_layers=ngl))
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
    from pyggml.llm.bench import LLAMA_BENCH
    b = sub.add_parser("bench", help="llama-bench: pp/tg tokens/s, at depth, with KV types "
                                     "(or `bench kernels`)")
    b.add_argument("-m", "--model", default=None)
    add_hf_arg(b)
    count = _ints(0, "token counts")
    b.add_argument("-p", "--n-prompt", type=count, action="append", metavar="N[,N]",
                   help="prompt tokens (default 512; 0 skips)")
    b.add_argument("-n", "--n-gen", type=count, action="append", metavar="N[,N]",
                   help="generated tokens (default 128; 0 skips)")
    b.add_argument("-pg", dest="pg", type=_pair, action="append", metavar="PP,TG",
                   help="a prompt then generated tokens, timed together (repeatable)")
    b.add_argument("-d", "--n-depth", type=count, action="append", metavar="N[,N]",
                   help="tokens in the KV cache before each test, untimed (default 0)")
    b.add_argument("-b", "--batch-size", type=_ints(1, "batch sizes"), action="append",
                   metavar="N[,N]", help="default 2048")
    b.add_argument("-ub", "--ubatch-size", type=_ints(1, "ubatch sizes"), action="append",
                   metavar="N[,N]", help="default 512")
    b.add_argument("-ctk", "--cache-type-k", type=_words, action="append", metavar="T[,T]",
                   help="K cache types (default f16)")
    b.add_argument("-ctv", "--cache-type-v", type=_words, action="append", metavar="T[,T]",
                   help="V cache types (default f16)")
    b.add_argument("-t", "--threads", type=thread_list, action="append", metavar="N[,N]",
                   help="default: the physical cores")
    b.add_argument("-r", "--repetitions", type=int, default=bench_defaults()["reps"])
    b.add_argument("-fa", "--flash-attn", type=_words, action="append", metavar="on|off[,..]",
                   help="default on")
    b.add_argument("-o", "--output", choices=("md", "csv", "json", "jsonl"), default="md")
    b.add_argument("-c", "--ctx-size", dest="ctx", action="append",
                   help="an offload config file")
    add_offload_args(b)
    b.add_argument("--compare-llamacpp", action="store_true",
                   help="also run llama.cpp's llama-bench with the same tests (a ratio per row)")
    b.add_argument("--llama-bench", default=str(LLAMA_BENCH), metavar="PATH",
                   help="llama.cpp's llama-bench for --compare-llamacpp (default: the one "
                        "`make llamacpp-tools` builds)")
    b.add_argument("--llamacpp-python", default=None,
                   help="compare through llama-cpp-python in this interpreter instead "
                        "(pp and tg at depth 0 only)")
    b.add_argument("--llamacpp-no-extra-bufts", action="store_true",
                   help="with --llamacpp-python: llama.cpp without its repacked/AMX buffer "
                        "types (VMs without AMX)")
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


def bench_defaults() -> dict:
    from pyggml.llm.bench import DEFAULTS
    return DEFAULTS
