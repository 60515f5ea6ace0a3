"""An IQ4_XS file of a dense model for speed runs (BENCHMARKS.md, "IQ/MXFP4 kernels"): llama.cpp's
own llama-quantize requantizes a Q4_K_M GGUF to its IQ4_XS mix (IQ4_XS where a row is a multiple
of 256, its fallbacks elsewhere: IQ4_NL, Q5_1, Q5_K; the embedding Q8_0 or Q6_K, as
llama_tensor_get_type picks). The values are requantized from Q4_K_M, so the file is for speed
(which depends on shapes and types), not for quality. Not for tests.

    .venv/bin/python tools/make_iq4_xs_model.py [MODEL.gguf ...] [--out DIR] [--threads N]
        (default: the Qwen2.5-Coder 0.5B and 1.5B Q4_K_M files of ~/.cache/pyggml/models, into
        ~/.cache/pyggml/bench/, name *-iq4_xs.gguf; a present file is kept)

llama-quantize comes from `make llamacpp-tools` (build/llamacpp-tools/bin; if only the build
tree is there: `cmake --build build/llamacpp-tools --target llama-quantize`).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUANTIZE = REPO / "build" / "llamacpp-tools" / "bin" / "llama-quantize"
MODELS = Path.home() / ".cache" / "pyggml" / "models"
DEFAULT = [MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
           MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]


def requantize(src: Path, out_dir: Path, threads: int) -> Path:
    dst = out_dir / src.name.replace("q4_k_m", "iq4_xs")
    if dst == out_dir / src.name:
        dst = out_dir / (src.stem + "-iq4_xs.gguf")
    if dst.exists():
        print(f"{dst}: present, kept")
        return dst
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_suffix(".part")
    subprocess.run([str(QUANTIZE), "--allow-requantize", str(src), str(tmp), "IQ4_XS",
                    str(threads)], check=True, stdout=subprocess.DEVNULL)
    tmp.rename(dst)
    print(f"{dst}: written")
    return dst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", type=Path, default=DEFAULT)
    p.add_argument("--out", type=Path, default=Path.home() / ".cache" / "pyggml" / "bench")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if not QUANTIZE.is_file():
        print(f"make_iq4_xs_model: {QUANTIZE} not built (see the docstring)", file=sys.stderr)
        return 1
    for m in args.models:
        requantize(m, args.out, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
