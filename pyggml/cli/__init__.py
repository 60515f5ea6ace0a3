"""The `pyggml` command line (all argparse lives in this package).

  pyggml run   [-m MODEL] -p PROMPT -n N [llama.cpp-style flags]   generate text
  pyggml bench [-m MODEL] -p 64,512 -n 32,128 -t 1,2 -r 3 [--compare-llamacpp]
  pyggml bench kernels [--types ...]                                  quantized matvec GB/s
  pyggml plan  [-m MODEL] [-c config.yaml] [-ngl N] [-ot RE=DEV] [--check-fit]   dry run
  pyggml mem   [-m MODEL] [-c N] [-ub N] [--virtual-device NAME=SIZE] [--fit]  memory per device
  pyggml chat  [-m MODEL] [-sys TEXT] [--chat-template FILE|NAME]    conversation
  pyggml serve [-m MODEL] [--host H] [--port P] [-np N] [-c N_CTX] [--api-key KEY]
  pyggml pull  USER/REPO[:QUANT]                                      a GGUF from the hub
  pyggml ls                                                           the GGUFs in its cache
  pyggml info                                                         CPU features, paths
  pyggml graph [--dot FILE]                                           a small example graph

`-c` takes a context size (an integer, as llama.cpp) or an offload config file (anything else).
Offload (run, bench, plan, mem): -ngl N, -dev, -ts, -ot REGEX=DEVICE (repeatable),
--no-kv-offload, --no-op-offload, --set KEY=VALUE (repeatable); see configs/README.md.
Every failure prints one line `pyggml: error: ...` and exits non-zero (2 for usage errors).
"""

from __future__ import annotations

import os
import sys

from pyggml.cli import bench, chat, info, mem, models, plan, run, serve
from pyggml.cmdline import Parser, drop_harmless
from pyggml.errors import PyggmlError, UsageError

COMMANDS = (run, chat, serve, bench, plan, mem, models, info)


def parser() -> Parser:
    from pyggml import __version__
    p = Parser(prog="pyggml", description="Run quantized GGUF language models on the CPU (and "
               "Vulkan GPUs), llama.cpp's flags and an OpenAI-compatible server.")
    p.add_argument("--version", action="version", version=f"pyggml {__version__}")
    p.add_argument("--list-devices", action="store_true",
                   help="list the devices -dev / -ngl / -ot may name, then exit")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser,
                           metavar="COMMAND")
    for module in COMMANDS:
        module.add_commands(sub)
    return p


def list_devices() -> int:
    """`--list-devices` (any command, as llama.cpp's tools): the devices -dev / -ngl / -ot may
    name, with their memory; the CPU last."""
    from pyggml.backend.catalog import DeviceCatalog
    from pyggml.units import fmt_bytes
    print("Available devices:")
    for d in DeviceCatalog.from_registry().infos:
        mem = (f" ({fmt_bytes(d.total)}, {fmt_bytes(d.free)} free)" if d.total else "")
        soft = " [software: used only where named]" if d.software else ""
        print(f"  {d.name}: {d.description or d.name}{mem}{soft}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--list-devices" in argv[:argv.index("--")] if "--" in argv else "--list-devices" in argv:
        try:
            return list_devices()
        except PyggmlError as e:
            print(f"pyggml: error: {e}", file=sys.stderr)
            return 1
    if argv[:2] == ["bench", "kernels"]:
        argv = ["bench-kernels"] + argv[2:]
    try:
        p = parser()
        if argv and not argv[0].startswith("-"):
            rest, notes = drop_harmless(argv[1:])
            argv = argv[:1] + rest
            for note in notes:
                print(f"pyggml: note: {note}", file=sys.stderr)
        if argv and argv[0] in p._subparsers._group_actions[0].choices:
            p._subparsers._group_actions[0].choices[argv[0]].check_flags(argv[1:])
        args = p.parse_args(argv)
        args.argv = argv
        models.resolve_model(args)          # -hf, and chat / serve's instruct default
        return args.func(args)
    except UsageError as e:
        msg = str(e)
        print(msg if msg.startswith("pyggml") else f"pyggml: error: {msg}", file=sys.stderr)
        return 2
    except PyggmlError as e:
        print(f"pyggml: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`pyggml run | head`): quiet, as other tools
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 141
    except MemoryError:
        print("pyggml: error: out of memory (try a smaller -c / -ub, or -ngl 0)",
              file=sys.stderr)
        return 1
    except OSError as e:            # a file or device the command could not use
        where = f" {e.filename}" if getattr(e, "filename", None) else ""
        print(f"pyggml: error:{where} {e.strerror or e}", file=sys.stderr)
        return 1
    except Exception as e:          # a bug: still one line, with what to report
        print(f"pyggml: internal error: {type(e).__name__}: {e} (please report it with the "
              f"command line)", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
