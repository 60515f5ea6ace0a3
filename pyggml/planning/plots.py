"""Pictures and tables of an allocation plan (a PlanReport from GraphAllocator.report()).

    rows = timeline_rows(report)                # one row per tensor with memory of its own
    write_timeline_csv(report, "plan.csv")      # tensor, buffer, offset, size, first, last, ...
    read_timeline_csv("plan.csv") == rows       # round-trips
    plot_timeline(report, "timeline.png")       # live bytes per buffer over node index
    plot_address_map(report, "addresses.png")   # offset vs node index: one rectangle per tensor
    plot_sweep(sweep_rows, "sweep.png")         # compute buffer and KV cache vs n_ctx, n_ubatch

A row's lifetime: `first` is the node index at which it got its memory (-1: before the first
node, graph inputs), `last` the node after which the memory was freed or handed on in place
(None: held to the end). Views are left out (they own no memory); a tensor that took a source's
memory in place (`placed` inplace / view_parent) is its own row at the source's offset, starting
where the source ended. matplotlib is imported only here, with the Agg canvas (no display, no
global pyplot state); the format follows the file suffix (.png, .svg, .pdf).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass

from pyggml.alloc import PlanReport

CSV_FIELDS = ("tensor", "buffer", "offset", "size", "first", "last", "buffer_id", "chunk",
              "op", "placed", "parent")
_OWNED = ("fresh", "inplace", "view_parent")
_MiB = float(1 << 20)


@dataclass(frozen=True)
class TimelineRow:
    tensor: str
    buffer: str
    offset: int
    size: int
    first: int
    last: int | None
    buffer_id: int
    chunk: int
    op: str
    placed: str
    parent: str | None


def timeline_rows(report: PlanReport) -> list[TimelineRow]:
    """Tensors that hold memory of their own in a compute buffer, in plan order."""
    names = {b.buffer_id: b.name for b in report.buffers}
    return [TimelineRow(p.name, names.get(p.buffer_id, str(p.buffer_id)), p.offset, p.size,
                        p.first, p.last, p.buffer_id, p.chunk, p.op, p.placed, p.parent)
            for p in report.tensors if p.placed in _OWNED]


def write_timeline_csv(report_or_rows, path) -> list[TimelineRow]:
    rows = (timeline_rows(report_or_rows) if isinstance(report_or_rows, PlanReport)
            else list(report_or_rows))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in rows:
            w.writerow(["" if v is None else v for v in (getattr(r, k) for k in CSV_FIELDS)])
    return rows


def read_timeline_csv(path) -> list[TimelineRow]:
    ints = ("offset", "size", "first", "buffer_id", "chunk")
    out = []
    with open(path, newline="") as f:
        for rec in csv.DictReader(f):
            vals = {k: rec[k] for k in CSV_FIELDS}
            for k in ints:
                vals[k] = int(vals[k])
            vals["last"] = None if vals["last"] == "" else int(vals["last"])
            vals["parent"] = vals["parent"] or None
            out.append(TimelineRow(**vals))
    return out


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _end(r: TimelineRow, n_nodes: int) -> int:
    return n_nodes - 1 if r.last is None else r.last


def _owning_buffers(report: PlanReport):
    return [b for b in report.buffers if b.shares is None and b.peak > 0]


def alive_at(rows: list[TimelineRow], node: int, n_nodes: int) -> list[TimelineRow]:
    """Rows holding memory while `node` runs, largest first."""
    return sorted((r for r in rows if r.first <= node <= _end(r, n_nodes)), key=lambda r: -r.size)


def peak_node(live_bytes: list[int]) -> int:
    """The first node index at which live bytes peak (-1: before the first node)."""
    return max(range(len(live_bytes)), key=lambda i: live_bytes[i]) - 1 if live_bytes else -1


def plot_timeline(report: PlanReport, path, n_labels: int = 8, title: str | None = None) -> None:
    """Live bytes per buffer over node index (step lines), the planned peak as a dashed line, and
    the n_labels largest tensors alive at each buffer's peak, listed next to it."""
    fig = _figure(12, 5)
    ax = fig.add_subplot(1, 1, 1)
    n = report.n_nodes
    rows = timeline_rows(report)
    for k, b in enumerate(_owning_buffers(report)):
        xs = list(range(-1, n))
        ys = [v / _MiB for v in b.live_bytes]
        line = ax.step(xs, ys, where="post", label=f"{b.name}: live bytes", linewidth=1.0)[0]
        color = line.get_color()
        ax.axhline(b.peak / _MiB, color=color, linestyle="--", linewidth=0.8,
                   label=f"{b.name}: planned peak {b.peak / _MiB:.2f} MiB")
        at = peak_node(b.live_bytes)
        mine = alive_at([r for r in rows if r.buffer_id == b.buffer_id], at, n)
        y = b.live_bytes[at + 1] / _MiB
        ax.plot([at], [y], marker="o", markersize=4, color=color)
        text = "\n".join([f"{b.name} at node {at}: {y:.2f} MiB alive"] +
                          [f"{r.tensor} ({r.op.lower()}) {r.size / _MiB:.2f} MiB"
                           for r in mine[:n_labels]] +
                          ([f"... {len(mine) - n_labels} more"] if len(mine) > n_labels else []))
        ax.annotate(text, (at, y), xytext=(0.55 - 0.3 * k, 0.55), textcoords="axes fraction",
                    fontsize=7, va="top", bbox={"boxstyle": "round", "fc": "white", "alpha": 0.9,
                                                "ec": color},
                    arrowprops={"arrowstyle": "->", "color": color, "linewidth": 0.6})
    ax.set_xlabel("node index")
    ax.set_ylabel("MiB alive")
    ax.set_title(title or f"compute buffers: {n} nodes, naive sum {report.naive / _MiB:.1f} MiB, "
                          f"planned {report.peak / _MiB:.2f} MiB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)


_COLORS = {"fresh": "tab:blue", "inplace": "tab:green", "view_parent": "tab:olive"}


def plot_address_map(report: PlanReport, path, n_labels: int = 8) -> None:
    """Per buffer: one rectangle per tensor, x from its first to its last node, y its byte range
    (MiB): rectangles stacked at one offset over time show reuse."""
    from matplotlib.patches import Patch, Rectangle
    bufs = _owning_buffers(report) or report.buffers[:1]
    fig = _figure(12, 4.5 * len(bufs))
    n = report.n_nodes
    rows = timeline_rows(report)
    for k, b in enumerate(bufs):
        ax = fig.add_subplot(len(bufs), 1, k + 1)
        mine = [r for r in rows if r.buffer_id == b.buffer_id]
        bases, acc = {}, 0            # chunks stacked one above the other
        for c, size in enumerate(b.chunk_sizes):
            bases[c] = acc
            acc += size
        for r in mine:
            x0, x1 = r.first, _end(r, n) + 1
            y0 = (bases.get(r.chunk, 0) + r.offset) / _MiB
            ax.add_patch(Rectangle((x0, y0), max(x1 - x0, 0.5), max(r.size / _MiB, 1e-4),
                                   facecolor=_COLORS.get(r.placed, "tab:gray"), alpha=0.55,
                                   edgecolor="black", linewidth=0.2))
        at = peak_node(b.live_bytes)
        for r in alive_at(mine, at, n)[:n_labels]:      # what makes up the peak
            y = (bases.get(r.chunk, 0) + r.offset + r.size / 2) / _MiB
            ax.annotate(f"{r.tensor} {r.size / _MiB:.2f} MiB", (at, y),
                        xytext=(at + 0.04 * n, y), fontsize=7, va="center",
                        arrowprops={"arrowstyle": "-", "linewidth": 0.4})
        ax.axvline(at, color="black", linestyle=":", linewidth=0.6)
        for c in range(1, len(b.chunk_sizes)):
            ax.axhline(bases[c] / _MiB, color="red", linewidth=0.6)
        ax.set_xlim(-2, n + 1)
        ax.set_ylim(0, max(acc, 1) / _MiB * 1.02)
        ax.set_xlabel("node index")
        ax.set_ylabel("offset (MiB)")
        ax.set_title(f"buffer {b.buffer_id} '{b.name}': {len(mine)} tensors in "
                     f"{b.peak / _MiB:.2f} MiB ({b.n_fresh} fresh, {b.n_inplace} in place, "
                     f"{b.n_view_parent} through a view)")
        ax.legend(handles=[Patch(color=c, alpha=0.55, label=k_) for k_, c in _COLORS.items()],
                  fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path)


def plot_sweep(rows: list[dict], path) -> None:
    """Compute buffer and KV cache (MiB) against n_ctx, one line per n_ubatch."""
    fig = _figure(11, 4.5)
    axc = fig.add_subplot(1, 2, 1)
    axk = fig.add_subplot(1, 2, 2)
    for ub in sorted({r["n_ubatch"] for r in rows}):
        pts = sorted((r for r in rows if r["n_ubatch"] == ub), key=lambda r: r["n_ctx"])
        xs = [r["n_ctx"] for r in pts]
        axc.plot(xs, [r["compute"] / _MiB for r in pts], marker="o", label=f"n_ubatch {ub}")
        axk.plot(xs, [r["kv"] / _MiB for r in pts], marker="o", label=f"n_ubatch {ub}")
    for ax, what in ((axc, "compute buffer (planned peak)"), (axk, "KV cache")):
        ax.set_xlabel("n_ctx")
        ax.set_ylabel("MiB")
        ax.set_title(what)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
