"""One graph's compute-buffer plan over time: live bytes per buffer over node index with the
tensors that make up the peak (PNG/SVG), the placement as CSV (tensor, buffer, offset, size,
first, last, ...), and an address map (offset vs node index, one rectangle per tensor).

    .venv/bin/python tools/mem_timeline.py [-m MODEL] [-c 2048] [-ub 512] [--logits-all]
        [-ngl N] [--virtual-device NAME=SIZE] [--out-dir DIR] [--format png|svg]

Writes DIR/timeline.{png,svg}, DIR/address_map.{png,svg}, DIR/plan.csv for the worst-case ubatch
graph the runtime reserves (planning only), and prints the allocator's summary.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyggml.planning import plots as memplot  # noqa: E402
from pyggml.planning.measure import virtual_device_arg  # noqa: E402
from pyggml.planning.memory import plan_memory  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default=None)
    p.add_argument("-c", "--ctx-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("--logits-all", action="store_true")
    p.add_argument("-fa", "--flash-attn", choices=("on", "off"), default="on")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    p.add_argument("--virtual-device", action="append", default=[])
    p.add_argument("--phase", default="prefill", choices=("prefill", "decode"))
    p.add_argument("--out-dir", default=".")
    p.add_argument("--format", default="png", choices=("png", "svg", "pdf"))
    a = p.parse_args(argv)
    plan = plan_memory(a.model, n_ctx=a.ctx_size, n_ubatch=a.ubatch_size,
                       logits_all=a.logits_all, flash_attn=a.flash_attn == "on",
                       n_gpu_layers=a.n_gpu_layers,
                       devices=[virtual_device_arg(v) for v in a.virtual_device])
    rep = plan.reports.get(a.phase) or plan.reports["prefill"]
    print(rep.summary())
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    memplot.write_timeline_csv(rep, out / "plan.csv")
    memplot.plot_timeline(rep, out / f"timeline.{a.format}")
    memplot.plot_address_map(rep, out / f"address_map.{a.format}")
    for name in ("plan.csv", f"timeline.{a.format}", f"address_map.{a.format}"):
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
