"""ggml's own quantizers on fixed rows, for tests/test_quants_iq.py: IQ4_NL, IQ4_XS and MXFP4
as llama-quantize writes them without an importance matrix (ggml_quantize_chunk with no
imatrix), from libggml-base of llama-cpp-python 0.3.36 (built from source in its own venv;
never a dependency of pyggml or its tests):

    /work/ref/llamacpp-venv/bin/python tools/make_iq_quant_refs.py tests/data/iq_quant_refs.npz

Rows (float32, 8 per type, 512 elements): normal, uniform, heavy-tailed, with exact zeros and
all-zero blocks, tiny and huge magnitudes, a block max that is negative, repeated values.
Stored: `<type>.x` the rows, `<type>.q` ggml's bytes (uint8 [rows, row bytes]).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

TYPES = {"iq4_nl": 20, "iq4_xs": 23, "mxfp4": 39}
ROW_BYTES = {"iq4_nl": 512 // 32 * 18, "iq4_xs": 512 // 256 * 136, "mxfp4": 512 // 32 * 17}
N = 512


def rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = [rng.standard_normal(N), rng.uniform(-1, 1, N), rng.standard_t(2, N),
         np.where(rng.random(N) < 0.3, 0.0, rng.standard_normal(N)),
         rng.standard_normal(N) * np.repeat(10.0 ** rng.integers(-6, 4, N // 32), 32),
         -np.abs(rng.standard_normal(N)), np.repeat(rng.standard_normal(N // 8), 8),
         rng.standard_normal(N) * 1e-3]
    r[3][64:96] = 0.0
    return np.asarray(r, dtype=np.float32)


def main(argv) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    import llama_cpp
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    f = lib.ggml_quantize_chunk
    f.restype = ctypes.c_size_t
    f.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                  ctypes.c_int64, ctypes.c_void_p]
    data = {"llama_cpp_version": np.array(llama_cpp.__version__)}
    for i, (name, t) in enumerate(TYPES.items()):
        x = rows(100 + i)
        q = np.zeros((len(x), ROW_BYTES[name]), np.uint8)
        n = f(t, x.ctypes.data, q.ctypes.data, 0, len(x), N, None)
        assert n == q.nbytes, (name, n, q.nbytes)
        data[f"{name}.x"], data[f"{name}.q"] = x, q
    np.savez_compressed(argv[0], **data)
    print(f"{argv[0]}: {Path(argv[0]).stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
