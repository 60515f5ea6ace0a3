"""Helpers for tests that talk to a running `pyggml serve` (in-process or a child process)."""

from __future__ import annotations

import httpx

# two planning-only GPUs (the web page's Model view and the plan endpoint must show each with
# the bytes `pyggml mem` prints)
TWO_VIRTUAL_GPUS = """virtual_devices:
  - {name: laptop, memory: 64MiB}
  - {name: egpu, memory: 256MiB}
devices: [laptop, egpu]
gpu_layers: all
context: {n_ctx: 1024, n_ubatch: 128}
"""


def metrics(base: str) -> dict[str, float]:
    """GET /metrics as {sample name with labels: value}."""
    out = {}
    for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out
