"""Peak RSS generating 128 tokens at n_ctx 2048, pyggml vs llama.cpp (llama-cpp-python), each
run in a fresh process; the kernel's high-water mark (VmHWM) at the end, MB = 10^6 bytes.

    .venv/bin/python tools/rss_compare.py [--llamacpp-python /work/ref/llamacpp-venv/bin/python]
        [--reps 3] [--llamacpp-no-extra-bufts] MODEL.gguf [MODEL.gguf ...]

Both sides load the model, evaluate the same short prompt, and decode 128 greedy tokens
(the end-of-generation token ignored), 2 threads. llama.cpp runs at its defaults (the
benchmark protocol: its extra buffer types on, so it holds a repacked copy of most weights
beside the mapped file); --llamacpp-no-extra-bufts turns them off (announced in the output) for
a machine where its AMX path raises SIGILL.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

PROMPT = "Write a short story about a lighthouse keeper."

OURS = """
import json, sys
from pyggml.llm.runtime import LLM
llm = LLM(sys.argv[1], n_ctx=2048, n_threads=2)
n = sum(1 for _ in llm.generate(sys.argv[2], 128, temperature=0, stop_at_eog=False))
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"tokens": n, "hwm_kB": int(hwm)}))
"""

THEIRS = """
import json, sys
import llama_cpp, llama_cpp.llama as L
if sys.argv[3] == "1":
    orig = llama_cpp.llama_model_default_params
    def params():
        p = orig(); p.use_extra_bufts = False; return p
    L.llama_cpp.llama_model_default_params = params
m = llama_cpp.Llama(sys.argv[1], n_ctx=2048, n_threads=2, n_threads_batch=2, verbose=False)
toks = m.tokenize(sys.argv[2].encode())
m.eval(toks)
n = 0
for _ in range(128):
    t = m.sample(temp=0.0)
    m.eval([t])
    n += 1
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"tokens": n, "hwm_kB": int(hwm)}))
"""


def peak_mb(python: str, script: str, model: str, no_extra_bufts: bool = False) -> float:
    out = subprocess.run([python, "-c", script, model, PROMPT, str(int(no_extra_bufts))],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{python} failed on {model}: {out.stderr.strip()[-400:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["tokens"] == 128, r
    return r["hwm_kB"] * 1024 / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--llamacpp-python", default="/work/ref/llamacpp-venv/bin/python")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llamacpp-no-extra-bufts", action="store_true",
                    help="llama.cpp without its repacked buffer types (announced)")
    a = ap.parse_args()
    from pyggml.llm.bench import announce_llamacpp, llamacpp_nondefaults
    announce_llamacpp(llamacpp_nondefaults(no_extra_bufts=a.llamacpp_no_extra_bufts),
                      file=sys.stdout)
    print("| model | pyggml peak RSS | llama.cpp peak RSS | ratio |\n|---|---:|---:|---:|")
    for m in a.models:
        ours, theirs = [], []
        for _ in range(a.reps):                       # interleaved, fresh processes
            ours.append(peak_mb(sys.executable, OURS, m))
            theirs.append(peak_mb(a.llamacpp_python, THEIRS, m, a.llamacpp_no_extra_bufts))
        o, t = statistics.median(ours), statistics.median(theirs)
        print(f"| {m.rsplit('/', 1)[-1]} | {o:.0f} MB | {t:.0f} MB | {o / t:.2f} |", flush=True)


if __name__ == "__main__":
    main()
