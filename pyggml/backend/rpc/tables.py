"""pyggml's ops and types as ggml numbers them, for the one ggml version the RPC client speaks to.

The numbers of `enum ggml_op`, `ggml_unary_op` and `ggml_type` are part of ggml's RPC wire
contract: an rpc-server reads them as its own build defines them (RPC_PROTO_PATCH_VERSION goes up
whenever GGML_OP_COUNT changes). These tables are for llama.cpp 0c1e570 / ggml 0.25.3 as vendored
in llama-cpp-python 0.3.36 (RPC protocol 7.0.0, GGML_OP_COUNT 101). tests/test_rpc.py parses the
enums of that ggml.h (a verbatim excerpt in tests/data/rpc/) and checks every row by name.

Op params: pyggml stores each op's parameters in ggml's layout (see pyggml.ops), so they go on
the wire unchanged, except for pyggml's unary ops, which are one ggml op (UNARY) whose
op_params[0] names the function.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.types import GGMLType, Op

GGML_COMMIT = "0c1e570"             # llama.cpp commit of the tables below
GGML_OP_COUNT = 101
GGML_TYPE_COUNT = 43


@dataclass(frozen=True)
class WireOp:
    """How one pyggml op goes on the wire: ggml's op (name in ggml.h without GGML_OP_, number)
    and, for ggml's UNARY op, the unary function (name without GGML_UNARY_OP_, number)."""
    name: str
    number: int
    unary: tuple[str, int] | None = None


# pyggml op -> ggml op. One row per pyggml op (a test checks that none is missing).
OPS: dict[Op, WireOp] = {
    Op.NONE: WireOp("NONE", 0),
    Op.DUP: WireOp("DUP", 1),
    Op.ADD: WireOp("ADD", 2),
    Op.SUB: WireOp("SUB", 6),
    Op.MUL: WireOp("MUL", 7),
    Op.DIV: WireOp("DIV", 8),
    Op.SQR: WireOp("SQR", 9),
    Op.SQRT: WireOp("SQRT", 10),
    Op.CONCAT: WireOp("CONCAT", 22),
    Op.NORM: WireOp("NORM", 24),
    Op.RMS_NORM: WireOp("RMS_NORM", 25),
    Op.MUL_MAT: WireOp("MUL_MAT", 29),
    Op.SCALE: WireOp("SCALE", 32),
    Op.CPY: WireOp("CPY", 34),
    Op.CONT: WireOp("CONT", 35),
    Op.RESHAPE: WireOp("RESHAPE", 36),
    Op.VIEW: WireOp("VIEW", 37),
    Op.PERMUTE: WireOp("PERMUTE", 38),
    Op.TRANSPOSE: WireOp("TRANSPOSE", 39),
    Op.GET_ROWS: WireOp("GET_ROWS", 40),
    Op.SET_ROWS: WireOp("SET_ROWS", 42),
    Op.DIAG_MASK_INF: WireOp("DIAG_MASK_INF", 44),
    Op.SOFT_MAX: WireOp("SOFT_MAX", 46),
    Op.ROPE: WireOp("ROPE", 48),
    Op.FLASH_ATTN_EXT: WireOp("FLASH_ATTN_EXT", 74),
    Op.GELU: WireOp("UNARY", 91, ("GELU", 8)),
    Op.SILU: WireOp("UNARY", 91, ("SILU", 10)),
    Op.TANH: WireOp("UNARY", 91, ("TANH", 4)),
    Op.SUM_ROWS: WireOp("SUM_ROWS", 15),
    Op.MUL_MAT_ID: WireOp("MUL_MAT_ID", 30),
    Op.CLAMP: WireOp("CLAMP", 50),
    Op.ARGSORT: WireOp("ARGSORT", 69),
    Op.SIGMOID: WireOp("UNARY", 91, ("SIGMOID", 7)),
    Op.SOFTPLUS: WireOp("UNARY", 91, ("SOFTPLUS", 15)),
    # pyggml's recurrent ops take a per-token sequence input ggml's do not: never sent (the
    # rpc backend refuses them), numbered for the table's completeness
    Op.SSM_CONV: WireOp("SSM_CONV", 76),
    Op.GATED_DELTA_NET: WireOp("GATED_DELTA_NET", 86),
}

# ggml op numbers never to send: their op_params hold host function pointers (MAP_CUSTOM1..3,
# CUSTOM); a server would call whatever address they name. No row above maps to them.
FORBIDDEN_GGML_OPS = frozenset({92, 93, 94, 95})

# pyggml type -> ggml type number. pyggml's type ids are GGUF's, which are ggml's; the names
# must match ggml.h's GGML_TYPE_<name> (a test checks both).
TYPES: dict[GGMLType, int] = {t: int(t) for t in GGMLType}
