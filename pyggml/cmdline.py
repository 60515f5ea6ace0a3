"""The command line that `pyggml`'s commands and the HTTP server's what-if plans share: llama.cpp's
model and offload flags declared once, with llama.cpp's spellings and pyggml's defaults
(pyggml.llm.setup.RunOptions: the one table of them), and read into RunOptions fields
(`run_options`; the offload flags are read into a Config by pyggml.offload.flags).

llama.cpp users type single-dash multi-letter flags (-ngl, -ctk, -cnv): argparse would read an
unknown one as a known short flag with the rest as its value (`-cnv` as `-c nv`). `Parser` never
abbreviates and refuses such a token by its name instead (`check_flags`); a number glued to a
flag (`-t2`, `-c4096`) is still taken.
"""

from __future__ import annotations

import argparse
import re

from pyggml.errors import UsageError
from pyggml.llm.setup import DEFAULTS
from pyggml.offload.flags import split_ctx

_NUMBER = re.compile(r"^-?\d+(\.\d*)?$")


class Parser(argparse.ArgumentParser):
    """argparse without prefix matching; usage errors raise UsageError (exit status 2)."""

    def __init__(self, *a, **kw):
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):     # one style for every refusal
            flag = message.split(": ", 1)[1].split()[0]
            if flag.startswith("-"):
                message = f"unknown flag {flag.split('=', 1)[0]!r}" + \
                    UNSUPPORTED.get(flag.split("=", 1)[0], "")
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
            # every single-dash token, two letters too: argparse would take `-o` for `-ot`
            # and `-u 1` for `-ub 1` (it matches short flags by prefix even without abbrev)
            if not tok.startswith("-") or tok.startswith("--") or tok == "-":
                continue
            if flag in known or _NUMBER.match(tok) or (len(tok) > 2 and
                                                       _NUMBER.match(tok[2:]) and
                                                       tok[:2] in known):
                continue
            raise UsageError(f"{self.prog}: error: unknown flag {flag!r}" +
                             UNSUPPORTED.get(flag, ""))


#: llama.cpp flags that change nothing here: accepted with a one-line note (flag -> why; a flag
#: with a value lists the values that are harmless)
HARMLESS = {
    "--jinja": (None, "chat templates are always Jinja here"),
    "--mlock": (None, "pyggml does not lock the weights in memory"),
    "--embedding": (None, "the server always answers /v1/embeddings"),
    "--embeddings": (None, "the server always answers /v1/embeddings"),
    "-cb": (None, "batching is always continuous"),
    "--cont-batching": (None, "batching is always continuous"),
    "--no-webui": (None, "the web page stays at / (it needs --api-key off loopback)"),
    "-sm": (("layer", "none"), "pyggml splits by layer"),
    "--split-mode": (("layer", "none"), "pyggml splits by layer"),
}


def drop_harmless(argv: list[str]) -> tuple[list[str], list[str]]:
    """argv without HARMLESS flags (and their harmless values), and one note per flag dropped;
    a harmful value (`-sm row`) is left for the parser to refuse."""
    out, notes, i = [], [], 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            out += argv[i:]
            break
        flag, eq, val = tok.partition("=")
        if flag in HARMLESS:
            values, why = HARMLESS[flag]
            if values is None and not eq:
                notes.append(f"{flag} is accepted and changes nothing: {why}")
                i += 1
                continue
            if values is not None:
                v = val if eq else (argv[i + 1] if i + 1 < len(argv) else None)
                if v in values:
                    notes.append(f"{flag} {v} is accepted and changes nothing: {why}")
                    i += 1 if eq else 2
                    continue
        out.append(tok)
        i += 1
    return out, notes


#: llama.cpp flags pyggml does not take (yet), and what to use instead
UNSUPPORTED = {
    "-sm": " (llama.cpp's split mode: pyggml splits by layer; -sm layer is accepted)",
    "--split-mode": " (pyggml splits by layer; --split-mode layer is accepted)",
    "-mg": " (main GPU: name it first in -dev)",
    "-fa": " (use -fa on|off|auto)",
    "--virtual-device": " (planning only: pyggml plan or pyggml mem)",
    "--assume-device": " (planning only: pyggml plan or pyggml mem)",
}


def add_hf_arg(p) -> None:
    """-hf USER/REPO[:QUANT]: a model from the Hugging Face hub (pyggml/models/hub.py)."""
    p.add_argument("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None,
                   metavar="USER/REPO[:QUANT]",
                   help="a GGUF from the Hugging Face hub, downloaded into its cache (QUANT "
                        "default Q4_K_M)")


def add_model_args(p, *, config_file: bool = True) -> None:
    """-m, -c (context size or config file), -b, -ub, -t, -tb, -fa, -ctk, -ctv, --swa-full,
    --mmap / --no-mmap."""
    p.add_argument("-m", "--model", default=None,
                   help="GGUF file (default: Gemma 3 270M; chat and serve: SmolLM2-135M-Instruct)")
    add_hf_arg(p)
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
    kv_types = "f16 (default), f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl"
    p.add_argument("-ctk", "--cache-type-k", default=None, help=kv_types)
    p.add_argument("-ctv", "--cache-type-v", default=None, help=kv_types)
    p.add_argument("--swa-full", action="store_true",
                   help="sliding-window layers keep all n_ctx cells (llama.cpp's --swa-full)")
    p.add_argument("--logits-all", action="store_true",
                   help="logits for every position (llama.cpp's compute-buffer worst case)")
    mm = p.add_mutually_exclusive_group()
    mm.add_argument("--mmap", dest="use_mmap", action="store_const", const=True, default=None,
                    help="the CPU's weights stay mapped from the file (default: read into "
                         "huge-page memory when the system has them and they fit)")
    mm.add_argument("--no-mmap", dest="use_mmap", action="store_const", const=False,
                    help="read the CPU's weights into host memory (as llama.cpp's --no-mmap)")


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


class _LoraScaled(argparse.Action):
    """--lora-scaled FNAME SCALE (older llama.cpp) or FNAME:SCALE[,FNAME:SCALE] (llama.cpp now)."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = getattr(namespace, self.dest, None) or []
        if len(values) == 2 and _NUMBER.match(values[1]) and not _scaled_item(values[0]):
            items.append((values[0], values[1]))
        else:
            for v in values:
                for part in v.split(","):
                    item = _scaled_item(part)
                    if item is None:
                        raise UsageError(f"{parser.prog}: error: --lora-scaled {v}: expected "
                                         f"FNAME:SCALE (or FNAME SCALE), e.g. adapter.gguf:0.5")
                    items.append(item)
        setattr(namespace, self.dest, items)


def _scaled_item(text: str):
    path, sep, scale = text.rpartition(":")
    return (path, scale) if sep and path and _NUMBER.match(scale) else None


class _LoraFiles(argparse.Action):
    """--lora FNAME[,FNAME]: adapters at scale 1 (repeatable)."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = getattr(namespace, self.dest, None) or []
        items += [(p, "1.0") for p in values.split(",") if p]
        setattr(namespace, self.dest, items)


def add_lora_args(p) -> None:
    """llama.cpp's LoRA flags (run, chat, serve): --lora, --lora-scaled and
    --lora-init-without-apply."""
    p.add_argument("--lora", dest="lora", action=_LoraFiles, metavar="FNAME[,FNAME]",
                   help="a LoRA adapter (llama.cpp's GGUF adapter format) applied at scale 1 "
                        "(repeatable)")
    p.add_argument("--lora-scaled", dest="lora", action=_LoraScaled, nargs="+",
                   metavar="FNAME:SCALE", help="a LoRA adapter with its scale: FNAME:SCALE"
                   "[,FNAME:SCALE] or FNAME SCALE (repeatable)")
    p.add_argument("--lora-init-without-apply", action="store_true",
                   help="load the adapters with scale 0 (serve: set them with POST "
                        "/lora-adapters)")


def lora_from_args(args) -> dict:
    """LLM keywords of the LoRA flags: {} without any, else lora=[(path, scale)] and
    lora_init_without_apply; a bad scale is a UsageError (before the model loads)."""
    items = getattr(args, "lora", None) or []
    if not items:
        if getattr(args, "lora_init_without_apply", False):
            raise UsageError("--lora-init-without-apply needs --lora or --lora-scaled")
        return {}
    out = []
    for path, scale in items:
        try:
            value = float(scale)
        except ValueError:
            value = float("nan")
        if value != value or value in (float("inf"), float("-inf")):
            raise UsageError(f"--lora-scaled {path}: scale {scale!r} is not a finite number")
        out.append((path, value))
    return {"lora": out, "lora_init_without_apply": bool(args.lora_init_without_apply)}


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
    if getattr(args, "use_mmap", None) is not None:
        out["use_mmap"] = args.use_mmap
    if getattr(args, "flash_attn", "auto") == "off":
        out["flash_attn"] = False
    return out
