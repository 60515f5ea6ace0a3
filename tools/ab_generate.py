"""Tokens/s of LLM.generate (greedy, 64 tokens after the first; median of runs 2-4) with the
pyggml package found in TREE — to A/B two checkouts' Python with one library:

    for i in 1 2 3 4 5; do for t in /tmp/before /work/main; do
        PYGGML_LIB=/work/main/build/native/libpyggml.so .venv/bin/python tools/ab_generate.py $t MODEL.gguf
    done; done
"""
import os
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1])
import pyggml  # noqa: E402
from pyggml.llm.runtime import LLM  # noqa: E402

with LLM(sys.argv[2], n_ctx=1024, n_threads=2) as llm:
    rates = []
    for _ in range(4):
        g = llm.generate("Write a long story about a dragon and a knight.", 65, temperature=0,
                         stop_at_eog=False)
        next(g)
        t0 = time.perf_counter()
        n = sum(1 for _ in g)
        rates.append(n / (time.perf_counter() - t0))
    print(os.path.dirname(pyggml.__file__), f"{statistics.median(rates[1:]):.2f}",
          "load", " ".join(f"{x:.2f}" for x in os.getloadavg()))
