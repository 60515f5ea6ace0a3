"""Compute buffer and KV cache as n_ctx and n_ubatch vary: a table, a CSV and a plot (planning
only: no weight byte is read, nothing is allocated).

    .venv/bin/python tools/mem_sweep.py [-m MODEL] [--ctx 512,1024,...] [--ub 128,256,512]
        [--logits-all] [-ngl N] [--virtual-device NAME=SIZE[:igpu]] [--csv F] [--plot F.png]

Same as `pyggml mem --sweep-ctx ... --sweep-ub ...`; the figures come from pyggml.planning.memory.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyggml.planning.measure import format_sweep, sweep, virtual_device_arg, write_sweep_csv  # noqa: E402


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None)
    p.add_argument("--ctx", type=_ints, default=[512, 1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--ub", type=_ints, default=[128, 256, 512])
    p.add_argument("--logits-all", action="store_true")
    p.add_argument("-fa", "--flash-attn", choices=("on", "off"), default="on")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    p.add_argument("--virtual-device", action="append", default=[])
    p.add_argument("--csv", default=None)
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    rows = sweep(a.model, a.ctx, a.ub, devices=[virtual_device_arg(v) for v in a.virtual_device],
                 logits_all=a.logits_all, flash_attn=a.flash_attn == "on",
                 n_gpu_layers=a.n_gpu_layers)
    print(format_sweep(rows))
    if a.csv:
        write_sweep_csv(rows, a.csv)
        print(f"wrote {a.csv}")
    if a.plot:
        from pyggml.planning.plots import plot_sweep
        plot_sweep(rows, a.plot)
        print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
