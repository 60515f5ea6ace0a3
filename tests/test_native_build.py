"""What the compiler made of the C library, where a test of results cannot see it.

The decode kernels' software prefetch changes no bit of any result, only the speed (Qwen 1.5B
decode 1.24x on an Intel VM's AVX-512 path). GCC 12 once deleted it silently: a helper whose only
effect is a prefetch is found "const" and its calls are removed before inlining
(native/src/kquants_x86.h, kq_dot8_prefetch), and decode fell to 0.75x with every test green.
So the built library's disassembly is checked for the prefetch instructions. They prefetch into
L2 (prefetcht1): into L1 (prefetcht0) they held the core's L1 miss buffers and cost AMD Zen 4
decode ~20% (0.72x of a3127c7 with the read limit in reach; BENCHMARKS.md, "Decode on AMD
Zen 4"), with every test green too.
"""

from __future__ import annotations

import platform
import shutil
import subprocess

import pytest

from pyggml import _native

# vec_dot8 kernels that prefetch the next group of weight rows (quants_kquants_avx2.c,
# gemm_avx512.c kquant_rows8, the legacy kernels of quants_legacy_x86.h, the i-quants' of
# iq_x86.h, quants_iq_avx2.c, quants_iq_avx512.c)
PREFETCHING = ("rows8_q4_K", "rows8_q5_K", "rows8_q6_K",
               "rows8_q4_K_avx2", "rows8_q5_K_avx2", "rows8_q6_K_avx2",
               "vec_dot8_q4_0_q8_0", "vec_dot8_q4_1_q8_1", "vec_dot8_q8_0_q8_0",
               "iq4xs_rows8_2s", "iq4xs_rows8_512", "iq4nl_rows8_2b", "iq4nl_rows8_512",
               "mxfp4_rows8_2b", "mxfp4_rows8_512", "vec_dot8_iq3_s_q8_K",
               "vec_dot8_iq2_xxs_q8_K")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the x86 kernels' prefetch (prefetcht1); ARM has no vec_dot8 kernel")
@pytest.mark.parametrize("symbol", PREFETCHING)
def test_decode_kernels_prefetch(symbol):
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is installed with the C toolchain by make setup"
    _native.lib()
    path = next(str(p) for p in _native.library_candidates() if p.is_file())
    asm = subprocess.run([objdump, "-d", "--no-show-raw-insn", f"--disassemble={symbol}", path],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert f"<{symbol}>:" in asm, f"{symbol} is not in {path}"
    assert "prefetcht1" in asm, f"{symbol} in {path} has no prefetch into L2 (prefetcht1)"
    assert "prefetcht0" not in asm, f"{symbol} in {path} prefetches into L1 (prefetcht0)"
