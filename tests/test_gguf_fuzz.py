"""Fuzzing pyggml.gguf: mutated and truncated variants of small valid GGUF files must either raise
GGUFError naming the file, or open as a model that passes every validation rule — never another
exception, a crash, a hang (time budget per case) or a memory blow-up.

`--fuzz-cases N` sets the total (default 300 in `make test`; `make fuzz` runs 2000). Cases are
drawn from a fixed seed: case i of base B always makes the same file, and a failure prints the
seed, case, mutation and where the offending file was saved.
"""

from __future__ import annotations

import resource
import signal
import struct
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import GGUFValueType as VT

from fixtures.gguf_bytes import gguf_bytes, kv, layout, tensor
from fixtures.tiny_models import make_tiny_model
from pyggml.errors import GGUFError
from pyggml.gguf import open_gguf
from pyggml.types import TYPE_TRAITS, GGMLType

FUZZ_SEED = 0x67677566
CASE_SECONDS = 5.0              # one case may take at most this long (a real case takes ~1 ms)
MAX_RSS_GROWTH = 256 * 2**20    # peak RSS may grow at most this much over all cases
BASE_SHARES = {"compact": 0.5, "tiny_model": 0.3, "split_part": 0.2}

T = GGMLType
ABSURD = [0, 1, 2, 3, 4, 5, 31, 32, 33, 63, 64, 255, 256, 4095, 65535, 2**31 - 1, 2**31,
          2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


class CaseTimeout(Exception):
    pass


# ---- the valid files mutated -----------------------------------------------------------------------

def compact_file() -> bytes:
    """Every value type, arrays of each kind, tensors of several types and ranks, in ~3 KB."""
    kvs = [
        kv("general.architecture", "llama"), kv("general.alignment", 32),
        kv("llama.block_count", 2), kv("llama.u8", 7, VT.UINT8), kv("llama.i8", -7, VT.INT8),
        kv("llama.u16", 700, VT.UINT16), kv("llama.i16", -700, VT.INT16),
        kv("llama.i32", -70000, VT.INT32), kv("llama.f32", 0.5), kv("llama.ok", True),
        kv("llama.u64", 2**40, VT.UINT64), kv("llama.i64", -2**40, VT.INT64),
        kv("llama.f64", 0.25, VT.FLOAT64), kv("general.name", "fuzz base"),
        kv("tokenizer.ggml.tokens", ["<unk>", "<s>", "</s>", "\u2581a", "b", "<0x00>"]),
        kv("tokenizer.ggml.scores", [0.0, 0.0, 0.0, -1.0, -2.0, 0.0]),
        kv("tokenizer.ggml.token_type", [2, 3, 3, 1, 1, 6]),
        kv("llama.flags", [True, False], elem_type=VT.BOOL),
        kv("llama.ff", [64, 96], elem_type=VT.UINT32),
        kv("llama.big", [1, 2], elem_type=VT.UINT64),
    ]
    tensors = [
        tensor("token_embd.weight", T.Q8_0, [64, 6]), tensor("output_norm.weight", T.F32, [64]),
        tensor("blk.0.attn_q.weight", T.Q4_0, [64, 64]), tensor("blk.0.x", T.F16, [8, 2, 3]),
        tensor("blk.0.k", T.Q4_K, [256, 1]), tensor("blk.0.v", T.Q6_K, [256, 1, 1, 2]),
        tensor("blk.0.i", T.I32, [5]),
    ]
    return gguf_bytes(kvs, tensors)


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    """name -> (path opened, path mutated, original bytes, layout of the mutated file)."""
    root = tmp_path_factory.mktemp("fuzz_bases")
    out = {}
    p = root / "compact.gguf"
    p.write_bytes(compact_file())
    out["compact"] = (p, p, p.read_bytes(), layout(p))
    tm = make_tiny_model(root / "tiny" / "t.gguf", "gemma3", "q4_0", n_layer=1, n_embd=32,
                         n_ff=64, n_head=2, n_vocab=400)
    out["tiny_model"] = (tm.path, tm.path, tm.path.read_bytes(), layout(tm.path))
    sm = make_tiny_model(root / "split" / "s.gguf", "llama", "q8_0", n_layer=1, n_embd=32,
                         n_ff=64, n_head=2, n_vocab=400, split_max_tensors=6)
    last = sm.paths[-1]
    out["split_part"] = (sm.path, last, last.read_bytes(), layout(last))
    for name, (opened, _, _, _) in out.items():
        open_gguf(opened)        # the bases themselves are valid
    return out


# ---- mutations ---------------------------------------------------------------------------------

def _put(buf: bytearray, off: int, size: int, value: int) -> None:
    buf[off:off + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def _get(buf: bytes, off: int, size: int) -> int:
    return int.from_bytes(buf[off:off + size], "little")


def mutate(orig: bytes, lay, rng: np.random.Generator) -> tuple[bytes, str]:
    """One random mutation (sometimes two or three stacked); returns (bytes, description)."""
    buf = bytearray(orig)
    descs = []
    n_mut = 1 if rng.random() < 0.8 else int(rng.integers(2, 4))
    header_end = lay.data_offset
    for _ in range(n_mut):
        kind = rng.choice(["bitflip", "bitflip_header", "truncate", "absurd_int", "offset_past_end",
                           "absurd_dim", "wrong_type", "delete", "insert", "scribble",
                           "swap_fields"])
        if kind in ("bitflip", "bitflip_header"):
            hi = len(buf) if kind == "bitflip" else min(header_end, len(buf))
            flips = []
            for _ in range(int(rng.integers(1, 9))):
                pos = int(rng.integers(0, max(hi, 1)))
                if pos < len(buf):
                    bit = int(rng.integers(0, 8))
                    buf[pos] ^= 1 << bit
                    flips.append(f"{pos}.{bit}")
            descs.append(f"{kind} {' '.join(flips)}")
        elif kind == "truncate":
            if rng.random() < 0.6:
                n = int(rng.integers(0, min(header_end + 64, len(buf)) + 1))
            else:
                n = int(rng.integers(0, len(buf) + 1))
            del buf[n:]
            descs.append(f"truncate to {n}")
        elif kind == "absurd_int":
            f = lay.fields[int(rng.integers(len(lay.fields)))]
            old = _get(buf, f.offset, f.size)
            cands = ABSURD + [old + 1, old - 1, old * 2, old + 2**32, len(orig), len(orig) + 1,
                              int(rng.integers(0, 2**63)) * 2 + int(rng.integers(0, 2))]
            v = int(cands[int(rng.integers(len(cands)))])
            _put(buf, f.offset, f.size, v)
            descs.append(f"absurd_int {f.kind}@{f.offset} of {f.owner!r}: {old} -> "
                         f"{v & ((1 << (8 * f.size)) - 1)}")
        elif kind == "offset_past_end":
            fs = lay.of_kind("toffset")
            if fs:
                f = fs[int(rng.integers(len(fs)))]
                past = len(orig) - lay.data_offset
                v = [past, past + lay.alignment, past - lay.alignment, 2**63, 2**64 - 32,
                     _get(buf, f.offset, 8) + lay.alignment][int(rng.integers(6))]
                _put(buf, f.offset, 8, max(v, 0))
                descs.append(f"offset_past_end {f.owner!r} -> {max(v, 0)}")
        elif kind == "absurd_dim":
            fs = lay.of_kind("dim", "n_dims")
            if fs:
                f = fs[int(rng.integers(len(fs)))]
                v = int(ABSURD[int(rng.integers(len(ABSURD)))])
                _put(buf, f.offset, f.size, v)
                descs.append(f"absurd_dim {f.kind} of {f.owner!r} -> {v & ((1 << 8 * f.size) - 1)}")
        elif kind == "wrong_type":
            fs = lay.of_kind("vtype", "arr_type", "ttype")
            if fs:
                f = fs[int(rng.integers(len(fs)))]
                v = int(rng.integers(0, 45)) if rng.random() < 0.8 else int(rng.integers(0, 2**32))
                _put(buf, f.offset, 4, v)
                descs.append(f"wrong_type {f.kind} of {f.owner!r} -> {v}")
        elif kind in ("delete", "insert", "scribble"):
            pos = int(rng.integers(0, max(min(header_end, len(buf)), 1)))
            n = int(rng.integers(1, 17))
            if kind == "delete":
                del buf[pos:pos + n]
            elif kind == "insert":
                buf[pos:pos] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            else:
                buf[pos:pos + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()[:len(buf) - pos]
            descs.append(f"{kind} {n} bytes at {pos}")
        else:  # swap_fields: copy one numeric field's bytes onto another of the same size
            f, g = (lay.fields[int(rng.integers(len(lay.fields)))] for _ in range(2))
            if f.size == g.size and max(f.offset, g.offset) + f.size <= len(buf):
                buf[g.offset:g.offset + g.size] = orig[f.offset:f.offset + f.size]
                descs.append(f"copy {f.kind}@{f.offset} onto {g.kind}@{g.offset}")
    return bytes(buf), "; ".join(descs) or "no-op"


# ---- checks on a file that opened ----------------------------------------------------------------

def check_valid(m) -> None:
    """Everything the loader promises about a model it accepted."""
    sizes = [p.size for p in m.parts]
    spans: dict[int, list] = {}
    for name, t in m.tensors.items():
        tr = TYPE_TRAITS[GGMLType(t.type)]
        assert 1 <= len(t.ne) == 4 and t.n_dims <= 4 and all(0 <= x for x in t.ne), name
        assert t.ne[0] % tr.block_size == 0, name
        assert t.nbytes == t.ne[0] // tr.block_size * tr.type_size * t.ne[1] * t.ne[2] * t.ne[3]
        part = m.parts[t.part]
        assert (t.offset - part.data_offset) % part.alignment == 0, name
        assert part.data_offset <= t.offset and t.offset + t.nbytes <= sizes[t.part], name
        if t.nbytes:
            spans.setdefault(t.part, []).append((t.offset, t.offset + t.nbytes, name))
    for lst in spans.values():
        lst.sort()
        for a, b in zip(lst, lst[1:]):
            assert a[1] <= b[0], f"{a[2]} overlaps {b[2]}"
    for key in m.keys():
        try:
            m.get(key)
        except GGUFError:
            pass                       # e.g. a string that is not UTF-8: an error on access
    ts = m.create_tensors()
    total = 0

    def sink(info, src):
        nonlocal total
        total += int(src.sum(dtype=np.uint64)) if src.size else 0   # touch every byte

    m.copy_tensors_to(sink, progress=False)
    assert len(ts) == len(m.tensors)


# ---- the fuzz loop -------------------------------------------------------------------------------

def _on_alarm(signum, frame):
    raise CaseTimeout(f"case ran over {CASE_SECONDS} s")


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024    # Linux: KiB


@pytest.mark.parametrize("base", list(BASE_SHARES))
def test_fuzz_gguf(base, bases, request, tmp_path):
    total = request.config.getoption("--fuzz-cases")
    n_cases = max(1, round(total * BASE_SHARES[base]))
    opened, target, orig, lay = bases[base]
    part_paths = {str(opened), str(target)}
    try:
        old = signal.signal(signal.SIGALRM, _on_alarm)
        use_alarm = True
    except ValueError:                      # not the main thread: time each case afterwards
        use_alarm, old = False, None
    failures, outcomes = [], {"GGUFError": 0, "opened": 0}
    rss0 = _maxrss()
    try:
        for case in range(n_cases):
            rng = np.random.default_rng([FUZZ_SEED, list(BASE_SHARES).index(base), case])
            data, desc = mutate(orig, lay, rng)
            target.write_bytes(data)
            t0 = time.perf_counter()
            rss_before = _maxrss()
            problem = None
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
            try:
                m = open_gguf(opened)
                check_valid(m)
                del m
                outcomes["opened"] += 1
            except GGUFError as e:
                outcomes["GGUFError"] += 1
                if not any(p in str(e) for p in part_paths):
                    problem = f"GGUFError does not name the file: {e}"
            except BaseException as e:     # noqa: BLE001 - anything else is the bug we look for
                if isinstance(e, KeyboardInterrupt):
                    raise
                problem = "".join(traceback.format_exception_only(type(e), e)).strip()
                problem += "\n" + "".join(traceback.format_tb(e.__traceback__)[-3:])
            finally:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            dt = time.perf_counter() - t0
            if problem is None and dt > CASE_SECONDS:
                problem = f"took {dt:.2f} s (budget {CASE_SECONDS} s)"
            grew = _maxrss() - rss_before
            if problem is None and grew > MAX_RSS_GROWTH // 2:
                problem = f"peak RSS grew by {grew / 2**20:.0f} MB in one case"
            if problem is not None:
                saved = tmp_path / f"fail-{base}-{case}.gguf"
                saved.write_bytes(data)
                failures.append(f"seed={FUZZ_SEED:#x} base={base} case={case} mutation: {desc}\n"
                                f"  file saved at {saved}\n  {problem}")
                if len(failures) >= 10:
                    break
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)
        target.write_bytes(orig)
    assert not failures, f"{len(failures)} fuzz failures:\n" + "\n".join(failures)
    assert _maxrss() - rss0 < MAX_RSS_GROWTH
    # the mutations must mostly hit structure (else this test proves little)
    assert outcomes["GGUFError"] >= 0.4 * n_cases, outcomes
