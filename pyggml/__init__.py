"""pyggml: a CPU-first tensor engine for quantized GGUF models.

Lazy tensors and graphs (`Context`, `ops`, `Graph`) are built in Python; kernels run in the C
library `libpyggml` (see `pyggml._native`)."""

from pyggml import ops
from pyggml.context import Context
from pyggml.errors import PyggmlError
from pyggml.graph import EvalOrder, Graph
from pyggml.tensor import Tensor, TensorFlag
from pyggml.types import GGMLType, Op, row_size

__version__ = "0.1.0"

__all__ = [
    "Context", "EvalOrder", "GGMLType", "Graph", "Op", "PyggmlError", "Tensor", "TensorFlag",
    "ops", "row_size", "__version__",
]
