"""Make tests/data/llamacpp_native_refs.json: llama-server's answers to its native endpoints
(POST /completion, POST /infill) on Qwen2.5-Coder-0.5B-Instruct at temperature 0, which
pyggml's /completion and /infill (pyggml/server/llamacpp_api.py) must reproduce: the same
prompt layout (the FIM tokens, the extra files), the same tokens, stop_type and stopping_word.

llama-server is the one built from the llama-cpp-python 0.3.36 sdist (`make llamacpp-tools`);
it is never a pyggml dependency. From the repository root:

    .venv/bin/python tools/make_llamacpp_native_refs.py \
        --server ~/.cache/pyggml/llamacpp-0.3.36/bin/llama-server \
        --model ~/.cache/pyggml/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
        --out tests/data/llamacpp_native_refs.json
"""

import argparse
import json
import socket
import subprocess
import time
from pathlib import Path

import httpx

# (endpoint, request body); temperature 0 everywhere: llama-server samples greedily
REQUESTS = [
    ("/completion", {"prompt": "def fibonacci(n):", "n_predict": 24}),
    ("/completion", {"prompt": "# A list of fruits:\n1. apple\n2.", "n_predict": 32,
                     "stop": ["4."]}),
    ("/completion", {"prompt": ["Numbers: ", 16, 11, 17, 11], "n_predict": 12}),
    ("/completion", {"prompt": "<|im_start|>user\nReply with the word OK only.<|im_end|>\n"
                               "<|im_start|>assistant\n", "n_predict": 16}),
    ("/infill", {"input_prefix": "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    ",
                 "input_suffix": "\n", "n_predict": 16}),
    ("/infill", {"input_prefix": "import math\n\ndef area(r):\n    return ",
                 "input_suffix": "\n", "prompt": "math",
                 "input_extra": [{"filename": "util.py", "text": "def square(x):\n    return x * x\n"}],
                 "n_predict": 12}),
]
N_CTX = 2048
KEEP = ("content", "tokens", "stop_type", "stopping_word", "tokens_predicted",
        "tokens_evaluated", "prompt")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    port = free_port()
    proc = subprocess.Popen([a.server, "-m", a.model, "--port", str(port), "-c", str(N_CTX),
                             "-np", "1", "-t", "2", "--no-webui"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        out = []
        for path, body in REQUESTS:
            req = dict(body, temperature=0, return_tokens=True, cache_prompt=False)
            r = httpx.post(base + path, json=req, timeout=300)
            r.raise_for_status()
            out.append({"path": path, "request": body,
                        "answer": {k: r.json()[k] for k in KEEP}})
    finally:
        proc.terminate()
        proc.wait(30)
    Path(a.out).write_text(json.dumps({"model": Path(a.model).name, "n_ctx": N_CTX,
                                       "server": "llama-server (llama-cpp-python 0.3.36 sdist)",
                                       "cases": out}, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {a.out}: {len(out)} answers")


if __name__ == "__main__":
    main()
