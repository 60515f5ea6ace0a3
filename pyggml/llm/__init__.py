"""Language-model pieces built on the tensor engine: tokenizers (`tokenizer`)."""

from pyggml.llm.tokenizer import Tokenizer, TokenAttr

__all__ = ["Tokenizer", "TokenAttr"]
