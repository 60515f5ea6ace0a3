"""Quantized dot kernels: weight bytes read per second in a matrix x vector product, next to
this machine's memory read bandwidth measured in the same run.

    .venv/bin/python tools/bench_kernels.py                 # best path, default types
    .venv/bin/python tools/bench_kernels.py --paths avx2,scalar --types q4_0,q8_0 --runs 9
    pyggml bench kernels [same options]                     # the same through the CLI

Method. One weight matrix (rows x cols, default 4096 x 4096) of each type is quantized from
random data and copied until the copies together exceed --min-bytes (default 256 MiB, eight
times this machine's 32 MiB L3), so every matvec streams its weights from DRAM rather than cache.
One timed run does one matvec (pg_matvec: the activation row is quantized once to the type's
vec_dot_type, then one dot per weight row) over each copy in turn; GB/s = weight bytes / time.
With 2 threads each Python thread calls pg_matvec on half of every matrix's rows (ctypes releases
the GIL) and the run ends when both are done.

Bandwidth: pg_bench_read sums the same weight buffer with the widest loads of the best path
(each thread one half for 2 threads). Each kernel run is paired with a bandwidth run right before
it, so both see the same memory and the same background load (this machine is shared: other
processes come and go); "of bw" is the median over runs of (read time / kernel time). GB/s and
bandwidth figures are medians of --runs runs. A standalone 512 MiB read is printed first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyggml import _native, quants  # noqa: E402
from pyggml.errors import UnsupportedTypeError  # noqa: E402
from pyggml.types import GGMLType, as_type  # noqa: E402

DEFAULT_TYPES = "q4_0,q4_1,q5_0,q5_1,q8_0,f16,bf16,f32,q4_k,q6_k"
MIB = 1 << 20


def _run_threads(n_threads: int, work) -> float:
    """Run work(i) in n_threads threads started together; seconds from the first thread's start
    to the last one's end (each thread reads the clock itself: the main thread may not get a
    CPU while the workers run)."""
    if n_threads == 1:
        t0 = time.perf_counter()
        work(0)
        return time.perf_counter() - t0
    barrier = threading.Barrier(n_threads)
    starts, ends = [], []

    def body(i):
        barrier.wait()
        starts.append(time.perf_counter())
        work(i)
        ends.append(time.perf_counter())

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return max(ends) - min(starts)


def measure_bandwidth(n_threads: int, runs: int, nbytes: int = 512 * MIB) -> float:
    """Median GB/s of reading a buffer far larger than the caches with pg_bench_read."""
    buf = np.ones(nbytes, dtype=np.uint8)   # written once so every page is really mapped
    read = _native.fn("pg_bench_read")
    part = nbytes // n_threads
    base = buf.ctypes.data

    def work(i):
        read(base + i * part, part)

    work(0)
    times = [_run_threads(n_threads, work) for _ in range(runs)]
    return part * n_threads / statistics.median(times) / 1e9


class MatvecCase:
    """Copies of one quantized matrix, with everything pg_matvec needs per thread."""

    def __init__(self, type_: GGMLType, rows: int, cols: int, min_bytes: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.type = type_
        self.rows, self.cols = rows, cols
        w = rng.standard_normal((rows, cols), dtype=np.float32)
        try:
            one = quants.quantize(w, type_)                  # (rows, row_bytes) uint8
        except UnsupportedTypeError:
            # types made only with an importance matrix (IQ1_*, IQ2_*, IQ3_*): random codes
            # with each block's fp16 scale 1/16 (IQ1_M keeps it in its scale words' top nibbles)
            size = quants.row_bytes(type_, 256)
            one = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
            if type_ == GGMLType.IQ1_M:
                sc = one[..., 48:56].copy().view(np.uint16)
                for k, nib in enumerate((0x0, 0x0, 0xC, 0x2)):
                    sc[..., k] = (sc[..., k] & 0x0FFF) | (nib << 12)
                one[..., 48:56] = sc.view(np.uint8)
            else:
                one[..., 0], one[..., 1] = 0x00, 0x2C
            one = one.reshape(rows, -1)
        self.row_bytes = one.shape[1]
        self.matrix_bytes = one.nbytes
        self.n_copies = max(1, -(-min_bytes // one.nbytes))
        self.weights = np.empty((self.n_copies,) + one.shape, dtype=np.uint8)
        self.weights[:] = one
        self.x = rng.standard_normal(cols, dtype=np.float32)
        self.out = np.zeros((self.n_copies, rows), dtype=np.float32)
        self.scratch_size = quants.matvec_scratch_size(type_, cols)
        self.reference = quants.matvec(one, type_, self.x)

    def work_fn(self, n_threads: int):
        fn = _native.fn("pg_matvec")
        t, cols, rb = int(self.type), self.cols, self.row_bytes
        per = -(-self.rows // n_threads)
        scratch = [np.empty(self.scratch_size, dtype=np.uint8) for _ in range(n_threads)]
        wbase, obase, x = self.weights.ctypes.data, self.out.ctypes.data, self.x.ctypes.data

        def work(i):
            r0 = i * per
            nr = min(per, self.rows - r0)
            sp = scratch[i].ctypes.data
            for c in range(self.n_copies):
                st = fn(t, cols, nr, wbase + (c * self.rows + r0) * rb, rb, x,
                        obase + (c * self.rows + r0) * 4, sp, self.scratch_size)
                if st:
                    raise RuntimeError(f"pg_matvec({self.type.name}) failed with status {st}")
        return work

    def read_fn(self, n_threads: int):
        """Bandwidth probe over the same weight buffer: thread i reads its share of the bytes."""
        read = _native.fn("pg_bench_read")
        base, total = self.weights.ctypes.data, self.weights.nbytes
        part = total // n_threads

        def work(i):
            read(base + i * part, part if i < n_threads - 1 else total - i * part)
        return work

    def measure(self, n_threads: int, runs: int, kernel_path: str, probe_path: str):
        """Medians over runs of (kernel GB/s, paired bandwidth GB/s, bandwidth time / kernel
        time) with n_threads threads."""
        work, read = self.work_fn(n_threads), self.read_fn(n_threads)
        self.out[:] = 0
        _run_threads(n_threads, work)                       # warm-up (page faults, caches)
        if not np.array_equal(self.out[-1], self.reference):
            raise RuntimeError(f"{self.type.name}: threaded matvec differs from one thread")
        nbytes = self.weights.nbytes
        gbs, bws, ratios = [], [], []
        for _ in range(runs):
            _native.set_cpu_path(probe_path)
            t_read = _run_threads(n_threads, read)
            _native.set_cpu_path(kernel_path)
            t_kernel = _run_threads(n_threads, work)
            gbs.append(nbytes / t_kernel / 1e9)
            bws.append(nbytes / t_read / 1e9)
            ratios.append(t_read / t_kernel)
        return statistics.median(gbs), statistics.median(bws), statistics.median(ratios)


def run(args) -> int:
    types = [as_type(t) for t in args.types.split(",") if t]
    threads = [int(t) for t in str(args.threads).split(",") if t]
    paths = args.paths.split(",") if args.paths else [_native.cpu_path()]
    start_path = _native.cpu_path()
    print(f"libpyggml {_native.version()}; available paths: {', '.join(_native.available_paths())}")
    print(f"matvec {args.rows}x{args.cols} (weights) x {args.cols} (one activation row); "
          f"median of {args.runs} runs; weights cycled over >= {args.min_bytes // MIB} MiB")
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())} "
          f"({os.cpu_count()} CPUs; other processes skew the 2-thread figures)")
    bw = {n: measure_bandwidth(n, args.runs) for n in threads}
    print("memory read bandwidth (512 MiB, best path's loads): " +
          ", ".join(f"{bw[n]:.1f} GB/s ({n} thread{'s' * (n > 1)})" for n in threads))
    head = f"{'path':7s} {'type':5s} {'MiB':>5s} {'act':>4s} "
    head += " ".join(f"{f'{n}T GB/s':>8s} {'bw':>5s} {'of bw':>5s}" for n in threads)
    print(head)
    try:
        for path in paths:
            _native.set_cpu_path(path)
            for t in types:
                try:
                    case = MatvecCase(t, args.rows, args.cols, args.min_bytes)
                except Exception as e:   # a type whose kernels are not there (yet)
                    print(f"{path:7s} {t.name:5s} skipped: {e}")
                    continue
                vdt = quants.vec_dot_type(t).name.lower()
                line = f"{path:7s} {t.name:5s} {case.matrix_bytes / MIB:5.1f} {vdt:>4s} "
                for n in threads:
                    g, b, r = case.measure(n, args.runs, path, start_path)
                    line += f"{g:8.2f} {b:5.1f} {100 * r:4.0f}% "
                print(line, flush=True)
                del case
    finally:
        _native.set_cpu_path(start_path)
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--types", default=DEFAULT_TYPES, help=f"comma list (default {DEFAULT_TYPES})")
    p.add_argument("--paths", default=None, help="kernel paths to compare (default: best)")
    p.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--runs", type=int, default=7, help="timed runs per figure (median)")
    p.add_argument("--min-bytes", type=int, default=256 * MIB,
                   help="weights cycled per run, well above the last-level cache")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_kernels", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
