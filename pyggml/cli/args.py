"""The flags the commands share, declared once, with llama.cpp's spellings and pyggml's defaults
(pyggml.llm.setup.RunOptions: the one table of them).

llama.cpp users type single-dash multi-letter flags (-ngl, -ctk, -cnv): argparse would read an
unknown one as a known short flag with the rest as its value (`-cnv` as `-c nv`). `Parser` never
abbreviates and refuses such a token by its name instead (`check_flags`); a number glued to a
flag (`-t2`, `-c4096`) is still taken.
"""

from __future__ import annotations

import argparse
import re

from pyggml.errors import ConfigError, UsageError
from pyggml.llm.setup import DEFAULTS
from pyggml.offload import DeviceCatalog, VirtualSpec, config_from_flags
from pyggml.offload.config import Config

_NUMBER = re.compile(r"^-?\d+(\.\d*)?$")


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching; usage errors raise UsageError (exit status 2)."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message: str):
        raise UsageError(f"{self.prog}: error: {message}")

    def check_flags(self, argv) -> None:
        """Refuse single-dash tokens that are no flag of this parser (see the module doc)."""
        known = set(self._option_string_actions)
        for tok in argv:
            if tok == "--":
                break
            flag = tok.split("=", 1)[0]
            if tok.startswith("--") and flag not in known and flag in UNSUPPORTED:
                raise UsageError(f"{self.prog}: error: {flag} is not a flag of this command" +
                                 UNSUPPORTED[flag])
            if not tok.startswith("-") or tok.startswith("--") or len(tok) <= 2:
                continue
            if flag in known or _NUMBER.match(tok) or _NUMBER.match(tok[2:]):
                continue
            raise UsageError(f"{self.prog}: error: unknown flag {flag!r}" +
                             UNSUPPORTED.get(flag, ""))


#: llama.cpp flags pyggml does not take (yet), and what to use instead
UNSUPPORTED = {
    "-sm": " (llama.cpp's split mode: pyggml splits by layer, as -sm layer)",
    "-mg": " (main GPU: name it first in -dev)",
    "-fa": " (use -fa on|off|auto)",
    "--virtual-device": " (planning only: pyggml plan or pyggml mem)",
    "--assume-device": " (planning only: pyggml plan or pyggml mem)",
}


def int_list(s: str) -> list[int]:
    try:
        return [int(x) for x in str(s).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")


def thread_list(s: str) -> list[int]:
    """Comma-separated thread counts (each >= 1)."""
    out = int_list(s)
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"expected thread counts >= 1, got {s!r}")
    return out


def count_list(s: str) -> list[int]:
    """Comma-separated token counts (>= 0; llama-bench's 0 skips that test)."""
    out = int_list(s)
    if any(n < 0 for n in out):
        raise argparse.ArgumentTypeError(f"expected token counts >= 0, got {s!r}")
    return out


def add_model_args(p, *, config_file: bool = True) -> None:
    """-m, -c (context size or config file), -b, -ub, -t, -tb, -fa, -ctk, -ctv, --swa-full."""
    p.add_argument("-m", "--model", default=None, help="GGUF file (default: Gemma 3 270M)")
    p.add_argument("-c", "--ctx-size", dest="ctx", action="append", metavar="N|FILE",
                   help=f"context size (an integer; default {DEFAULTS.n_ctx}, 0: the model's "
                        f"trained context)" + (" or an offload config file" if config_file
                                              else ""))
    p.add_argument("-b", "--batch-size", type=int, default=None,
                   help=f"default {DEFAULTS.n_batch}")
    p.add_argument("-ub", "--ubatch-size", type=int, default=None,
                   help=f"default {DEFAULTS.n_ubatch}")
    p.add_argument("-t", "--threads", type=int, default=None, help="default: physical cores")
    p.add_argument("-tb", "--threads-batch", type=int, default=None, help="default: -t")
    p.add_argument("-fa", "--flash-attn", choices=("on", "off", "auto"), default="auto")
    p.add_argument("-ctk", "--cache-type-k", default=None, help="f16 (default), f32, q8_0")
    p.add_argument("-ctv", "--cache-type-v", default=None, help="f16 (default), f32, q8_0")
    p.add_argument("--swa-full", action="store_true",
                   help="sliding-window layers keep all n_ctx cells (llama.cpp's --swa-full)")
    p.add_argument("--logits-all", action="store_true",
                   help="logits for every position (llama.cpp's compute-buffer worst case)")


def bounded(cast, lo=None, hi=None, *, what: str):
    """An argparse type: `cast(text)` within [lo, hi], else an error saying `what` was
    expected (-np, --port, --draft-max, ...)."""
    def parse(text: str):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or v != v or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return v
    parse.__name__ = what                   # argparse names the type in some messages
    return parse


positive_int = bounded(int, 1, what="an integer >= 1")
nonnegative_int = bounded(int, 0, what="an integer >= 0")
probability = bounded(float, 0.0, 1.0, what="a probability 0..1")


def add_offload_args(p, *, planning: bool = False) -> None:
    """llama.cpp's offload flags, --set, and (planning: plan, mem) devices this machine lacks."""
    p.add_argument("-ngl", "--n-gpu-layers", "--gpu-layers", type=int, default=None,
                   help="the last N layers on the first GPU device (99: all, with the output)")
    p.add_argument("-dev", "--device", default=None, metavar="DEV[,DEV]",
                   help="GPUs to use, in priority order ('none': CPU only)")
    p.add_argument("-ts", "--tensor-split", default=None, metavar="N,N",
                   help="share of layers per GPU of -dev")
    p.add_argument("-ot", "--override-tensor", action="append", default=[],
                   metavar="REGEX=DEVICE", help="tensors whose name matches REGEX go to DEVICE "
                   "(repeatable, first match wins, before -ngl)")
    p.add_argument("-nkvo", "--no-kv-offload", action="store_true",
                   help="keep the KV cache on the CPU")
    p.add_argument("--no-op-offload", action="store_true",
                   help="never move an op to a GPU when its weight is in host memory")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (e.g. gpu_layers=8, context.n_ctx=8192)")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT[,HOST:PORT]",
                   help="llama.cpp rpc-servers whose devices this run may use (as llama.cpp; "
                        "unauthenticated: loopback or a trusted network only)")
    if not planning:
        return
    p.add_argument("--virtual-device", "--assume-device", dest="virtual_device",
                   action="append", default=[], metavar="NAME=SIZE[:igpu]",
                   help="plan for a device this machine lacks (or a real one with another "
                        "memory size), e.g. laptop=8GiB or apu=16GiB:igpu; planning only")


def add_draft_args(p) -> None:
    """Speculative decoding (pyggml/llm/speculative.py), llama.cpp's spellings: -md (a draft
    model), --draft-max, --draft-min, --draft-p-min; --lookup (prompt lookup decoding: an
    n-gram draft from the prompt and the text so far, llama.cpp's `--spec-type ngram-simple` /
    llama-lookup)."""
    from pyggml.llm.speculative import LOOKUP_NGRAM_MAX
    g = p.add_argument_group("speculative decoding")
    g.add_argument("-md", "--model-draft", "--spec-draft-model", dest="model_draft",
                   default=None, metavar="FILE",
                   help="a draft model with the model's vocabulary (e.g. a smaller sibling)")
    g.add_argument("--lookup", action="store_true",
                   help="prompt lookup decoding: draft from n-grams of the prompt and the text "
                        "so far (no second model)")
    g.add_argument("--lookup-ngram", type=positive_int, default=None, metavar="N",
                   help=f"with --lookup: the longest n-gram compared (default "
                        f"{LOOKUP_NGRAM_MAX})")
    g.add_argument("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max", dest="draft_max",
                   type=positive_int, default=None, metavar="N",
                   help="tokens to draft per round at most (default 16; adapts below it)")
    g.add_argument("--draft-min", "--draft-n-min", "--spec-draft-n-min", dest="draft_min",
                   type=nonnegative_int, default=None, metavar="N",
                   help="fewer drafted tokens than this are not used (default 0)")
    g.add_argument("--draft-p-min", "--spec-draft-p-min", dest="draft_p_min", type=probability,
                   default=0.0, metavar="P",
                   help="with -md: stop drafting below this draft probability (default 0)")


def draft_from_args(args):
    """The draft the speculative-decoding flags ask for (None: none)."""
    from pyggml.llm.speculative import (DRAFT_MAX, DRAFT_MIN, LOOKUP_NGRAM_MAX, DraftModel,
                                        PromptLookup)
    md, lookup = getattr(args, "model_draft", None), getattr(args, "lookup", False)
    if md and lookup:
        raise UsageError("-md (a draft model) and --lookup (prompt lookup) exclude each other: "
                         "choose one draft")
    n_max = getattr(args, "draft_max", None)
    n_min = getattr(args, "draft_min", None)
    n_max = DRAFT_MAX if n_max is None else n_max
    n_min = DRAFT_MIN if n_min is None else n_min
    if md:
        return DraftModel(md, n_max, n_min, args.draft_p_min)
    if lookup:
        return PromptLookup(n_max, n_min,
                            ngram_max=getattr(args, "lookup_ngram", None) or LOOKUP_NGRAM_MAX)
    if getattr(args, "draft_max", None) is not None or getattr(args, "draft_min", None) is not None:
        raise UsageError("--draft-max / --draft-min need a draft: -md FILE or --lookup")
    if getattr(args, "lookup_ngram", None) is not None:
        raise UsageError("--lookup-ngram sets prompt lookup's n-gram: it needs --lookup")
    return None


def draft_plan_options(args) -> dict:
    """Planner.plan options for the speculative-decoding flags: the draft model and n_draft
    ({} without a draft)."""
    d = draft_from_args(args)
    if d is None:
        return {}
    out = {"n_draft": d.n_max}
    if getattr(args, "model_draft", None):
        out["draft_model"] = args.model_draft
    return out


def spec_stats_line(llm) -> str:
    """'draft: 120 drafted, 96 accepted (80.0%), 40 rounds' ('' without a draft)."""
    if llm.speculator is None:
        return ""
    s = llm.stats.spec
    return (f"draft ({llm.speculator.draft.describe()}): {s.drafted} drafted, {s.accepted} "
            f"accepted ({100 * s.acceptance_rate:.1f}%), {s.rounds} rounds")


def split_ctx(values) -> tuple[int | None, str | None]:
    """-c may be given twice: an integer is the context size, anything else a config file."""
    n_ctx, path = None, None
    for v in values or []:
        if str(v).lstrip("-").isdigit():      # a number (a negative one is refused later)
            n_ctx = int(v)
        else:
            path = v
    return n_ctx, path


def parse_ot(item: str) -> tuple[str, str]:
    """'REGEX=DEVICE' -> (regex, device); the device is what follows the last '='."""
    pattern, sep, device = item.rpartition("=")
    if not sep or not pattern or not device.strip():
        raise ConfigError(f"-ot {item}: expected REGEX=DEVICE (e.g. -ot 'ffn_.*=CPU')")
    return pattern, device.strip()


def virtual_specs(args) -> list[VirtualSpec]:
    return [VirtualSpec.parse(v) for v in getattr(args, "virtual_device", None) or []]


def _split(text: str | None, flag: str) -> list[float] | None:
    if text is None:
        return None
    try:
        return [float(x) for x in text.replace("/", ",").split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"{flag} {text!r}: expected numbers like 3,1") from None


def config_from_cli(args, always: bool = False, first_gpu=None) -> Config | None:
    """The Config a command line gives: a file, llama.cpp flags, --set (None: none of them and
    not `always`). Without a file, -ngl uses `first_gpu` (a name; default the registry's first
    GPU), as `LLM(n_gpu_layers=...)` does. -ctk/-ctv/--swa-full are run options, not here."""
    n_ctx, path = split_ctx(getattr(args, "ctx", None))
    ot = [parse_ot(x) for x in getattr(args, "override_tensor", None) or []]
    sets = list(getattr(args, "set", None) or [])
    nkvo = getattr(args, "no_kv_offload", False)
    noop = getattr(args, "no_op_offload", False)
    ngl = getattr(args, "n_gpu_layers", None)
    dev = getattr(args, "device", None)
    split = _split(getattr(args, "tensor_split", None), "-ts")
    rpc_arg = getattr(args, "rpc", None)
    rpc = [e.strip() for e in (rpc_arg or "").split(",") if e.strip()]
    if rpc_arg is not None and not rpc:     # an unset shell variable must not mean "CPU only"
        raise UsageError(f"--rpc {rpc_arg!r}: no server given; expected HOST:PORT[,HOST:PORT]")
    if not (always or path or ot or sets or nkvo or noop or dev or split or rpc):
        return None
    devices = None
    if dev is not None:
        devices = [] if dev.strip().lower() == "none" else [d.strip() for d in dev.split(",")]
    elif rpc:
        devices = None                    # llama.cpp: -ngl spreads over every device, remote too
    elif path is None and (ngl or 0) > 0:
        gpu = first_gpu() if first_gpu else DeviceCatalog.from_registry().default_gpu()
        devices = [gpu] if gpu else None         # None: the resolver says why there is none
    elif path is None:
        devices = [] if not (ngl or 0) else None
    one = (lambda k: v if isinstance(v := getattr(args, k, None), int) else None)
    cfg = config_from_flags(
        path, n_gpu_layers=ngl, overrides=ot, kv_offload=not nkvo, op_offload=not noop,
        devices=devices, n_ctx=n_ctx, n_batch=one("batch_size"), n_ubatch=one("ubatch_size"),
        threads=one("threads"), threads_batch=one("threads_batch"))   # bench: -t is a list
    if split is not None:
        cfg = cfg.with_values({"tensor_split": split}, f"-ts {args.tensor_split}")
    if rpc:
        cfg = cfg.with_values({"rpc": list(cfg.get(("rpc",)) or []) + rpc}, f"--rpc {args.rpc}")
    return cfg.with_sets(sets) if sets else cfg


def run_options(args) -> dict:
    """RunOptions fields the shared flags set (the rest keep their defaults)."""
    n_ctx, _ = split_ctx(getattr(args, "ctx", None))
    out = {"n_ctx": n_ctx, "n_batch": getattr(args, "batch_size", None),
           "n_ubatch": getattr(args, "ubatch_size", None),
           "n_threads": getattr(args, "threads", None),
           "n_threads_batch": getattr(args, "threads_batch", None),
           "type_k": getattr(args, "cache_type_k", None),
           "type_v": getattr(args, "cache_type_v", None),
           "n_seq_max": getattr(args, "parallel", None)}
    out = {k: v for k, v in out.items() if v is not None}
    for flag in ("swa_full", "logits_all"):
        if getattr(args, flag, False):
            out[flag] = True
    if getattr(args, "flash_attn", "auto") == "off":
        out["flash_attn"] = False
    return out
