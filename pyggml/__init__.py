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


def __getattr__(name):
    # the model runtime pulls in GGUF, tokenizer and backends: import it on first use
    if name == "LLM":
        from pyggml.llm.runtime import LLM
        return LLM
    if name == "Llama":                 # llama-cpp-python's class (pyggml/llm/compat.py)
        from pyggml.llm.compat import Llama
        return Llama
    if name in ("LlamaState", "LlamaRAMCache", "LlamaDiskCache"):
        from pyggml.llm import state
        return getattr(state, name)
    raise AttributeError(f"module 'pyggml' has no attribute {name!r}")

__all__ = [
    "LLM", "Llama", "LlamaDiskCache", "LlamaRAMCache", "LlamaState", "Context", "EvalOrder", "GGMLType", "Graph", "Op", "PyggmlError", "Tensor", "TensorFlag",
    "ops", "row_size", "__version__",
]
