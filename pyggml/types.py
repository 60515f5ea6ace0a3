"""Tensor types and ops. Values are shared with `native/include/pyggml.h` (tests/test_types.py
parses the header and checks both sides agree).

Type ids are those stored in GGUF files; block sizes and bytes per block are ggml's. Q8_1 is 36
bytes (two fp16 + 32 int8) as in current ggml; `gguf.constants` still lists the old 40.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from pyggml.errors import UnsupportedTypeError


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


@dataclass(frozen=True)
class TypeTraits:
    """Static facts of one tensor type: elements per block and bytes per block."""
    type: GGMLType
    block_size: int
    type_size: int

    @property
    def is_quantized(self) -> bool:
        return self.block_size > 1

# (elements per block, bytes per block)
_SIZES = {
    GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2), GGMLType.F64: (1, 8),
    GGMLType.I8: (1, 1), GGMLType.I16: (1, 2), GGMLType.I32: (1, 4), GGMLType.I64: (1, 8),
    GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20), GGMLType.Q5_0: (32, 22),
    GGMLType.Q5_1: (32, 24), GGMLType.Q8_0: (32, 34), GGMLType.Q8_1: (32, 36),
    GGMLType.Q2_K: (256, 84), GGMLType.Q3_K: (256, 110), GGMLType.Q4_K: (256, 144),
    GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210), GGMLType.Q8_K: (256, 292),
    GGMLType.IQ2_XXS: (256, 66), GGMLType.IQ2_XS: (256, 74), GGMLType.IQ3_XXS: (256, 98),
    GGMLType.IQ1_S: (256, 50), GGMLType.IQ4_NL: (32, 18), GGMLType.IQ3_S: (256, 110),
    GGMLType.IQ2_S: (256, 82), GGMLType.IQ4_XS: (256, 136), GGMLType.IQ1_M: (256, 56),
    GGMLType.TQ1_0: (256, 54), GGMLType.TQ2_0: (256, 66), GGMLType.MXFP4: (32, 17),
    GGMLType.NVFP4: (64, 36), GGMLType.Q1_0: (128, 18),
}

TYPE_TRAITS: dict[GGMLType, TypeTraits] = {
    t: TypeTraits(t, blk, size) for t, (blk, size) in _SIZES.items()
}


def as_type(t: int | str | GGMLType) -> GGMLType:
    """Normalize an int id, a name ('q4_0', 'Q4_K') or a GGMLType; raise UnsupportedTypeError."""
    if isinstance(t, GGMLType):
        return t
    if isinstance(t, str):
        try:
            return GGMLType[t.upper()]
        except KeyError:
            raise UnsupportedTypeError(
                f"unknown tensor type name {t!r}; known: {', '.join(x.name for x in GGMLType)}"
            ) from None
    try:
        if isinstance(t, bool) or int(t) != t:      # 1.5 or True is no type id
            raise TypeError
        return GGMLType(int(t))
    except (ValueError, TypeError):
        raise UnsupportedTypeError(f"unknown tensor type id {t!r}") from None


def traits(t: int | str | GGMLType) -> TypeTraits:
    return TYPE_TRAITS[as_type(t)]


def block_size(t) -> int:
    """Elements per block (1 for plain types)."""
    return traits(t).block_size


def type_size(t) -> int:
    """Bytes per block (bytes per element for plain types)."""
    return traits(t).type_size


def is_quantized(t) -> bool:
    return traits(t).block_size > 1


def row_size(t, n: int) -> int:
    """Bytes of a row of `n` elements of type `t`. `n` must be a multiple of the block size."""
    tr = traits(t)
    if n < 0 or n % tr.block_size:
        raise UnsupportedTypeError(
            f"a row of {tr.type.name} must hold a multiple of {tr.block_size} elements, got {n}")
    return n // tr.block_size * tr.type_size


# Types the C kernels compute (grows with the kernels). Others are known (loadable, sizeable)
# but a backend's supports_op says no.
COMPUTE_TYPES = frozenset({
    GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
    GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q8_1, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K,
    GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q8_K, GGMLType.I32,
    GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4, GGMLType.IQ2_XXS, GGMLType.IQ2_XS,
    GGMLType.IQ2_S, GGMLType.IQ3_XXS, GGMLType.IQ3_S, GGMLType.IQ1_S, GGMLType.IQ1_M,
    GGMLType.TQ1_0, GGMLType.TQ2_0,
})


class Op(IntEnum):
    """Graph ops; values shared with `pg_op` in pyggml.h."""
    NONE = 0
    DUP = 1
    ADD = 2
    SUB = 3
    MUL = 4
    DIV = 5
    SQR = 6
    SQRT = 7
    SCALE = 8
    NORM = 9
    RMS_NORM = 10
    MUL_MAT = 11
    CPY = 12
    CONT = 13
    RESHAPE = 14
    VIEW = 15
    PERMUTE = 16
    TRANSPOSE = 17
    GET_ROWS = 18
    SET_ROWS = 19
    DIAG_MASK_INF = 20
    SOFT_MAX = 21
    ROPE = 22
    CONCAT = 23
    GELU = 24
    SILU = 25
    FLASH_ATTN_EXT = 26
    TANH = 27
    MUL_MAT_ID = 28
    ARGSORT = 29
    SUM_ROWS = 30
    CLAMP = 31
    SIGMOID = 32
    # recurrent layers (native/src/ops_ssm.c)
    SSM_CONV = 48
    GATED_DELTA_NET = 49
    SOFTPLUS = 50


# Ops that only reinterpret their source's memory (no kernel runs for them).
VIEW_OPS = frozenset({Op.RESHAPE, Op.VIEW, Op.PERMUTE, Op.TRANSPOSE})

ROPE_MODE_NORMAL = 0
ROPE_MODE_NEOX = 2

# argsort order (op_params[0]), as ggml_sort_order
SORT_ORDER_ASC = 0
SORT_ORDER_DESC = 1
