"""One exception hierarchy for pyggml. Messages name the file, tensor, key or node at fault, what
was found and what was expected. Every error that user input can cause is one of these."""


class PyggmlError(Exception):
    """Base class of every error pyggml raises on purpose."""


class NativeLibraryError(PyggmlError):
    """libpyggml is missing, cannot be loaded, was built from other sources than the Python code
    (ABI version or struct size differ), or a C entry point reported a failure."""


class InvalidArgumentError(PyggmlError, ValueError):
    """An argument outside its allowed values (a thread count, an op parameter, a size); the
    message names the argument, the value and what is allowed."""


class SettingsError(PyggmlError, ValueError):
    """A PYGGML_* environment variable has a value pyggml cannot use; the message names the
    variable, the value and the allowed values (pyggml.settings lists them)."""


class UnsupportedTypeError(PyggmlError, ValueError):
    """A tensor type that is unknown, or known but not computable by the code asked."""


class ShapeError(PyggmlError, ValueError):
    """Tensor shapes that an op cannot combine; the message names both shapes."""


class ContextFullError(PyggmlError, MemoryError):
    """A Context's size budget is exhausted; the message says how much was needed and left."""


class GraphFullError(PyggmlError):
    """A Graph's node limit is reached."""


class AllocatorError(PyggmlError):
    """The planning allocator was given a graph it cannot plan."""


class SchedulerError(PyggmlError):
    """The scheduler cannot place or split a graph."""


class BackendError(PyggmlError):
    """A backend cannot compute a graph or op it was given."""


class ComputeAbortedError(BackendError):
    """The evaluation callback asked to stop the graph (ggml's GGML_STATUS_ABORTED): the nodes
    after the one it was called for were not computed."""


class UnsupportedOpError(BackendError):
    """No backend (or not the one asked) can compute this op with these types."""


class GGUFError(PyggmlError, ValueError):
    """A GGUF file is malformed or unsupported; the message names the file and what is wrong."""


class TokenizerError(PyggmlError, ValueError):
    """A tokenizer cannot be built from the vocabulary given."""


class ConfigError(PyggmlError, ValueError):
    """An offload config is invalid; the message names file, line and key."""


class ModelError(PyggmlError, ValueError):
    """A model cannot be built or run with the given input (unknown architecture, bad prompt)."""


class UsageError(PyggmlError, ValueError):
    """A command line that cannot be parsed: an unknown flag, a missing or malformed value
    (the CLI exits with status 2, as argparse)."""


class ArgumentTypeError(ModelError, TypeError):
    """An argument of the wrong type given to a pyggml API (`LLM(n_ctx="4096")`); the message
    names the argument, the value and the type expected. Also a TypeError."""


class ContextOverflowError(ModelError):
    """The KV cache has no room for the tokens to evaluate; the message says how many cells are
    needed and free, and the fixes (a larger n_ctx, reset, fewer tokens)."""


class ClosedError(PyggmlError):
    """An object used after close(): an LLM, its generators, or a backend whose thread pool was
    freed. Create a new one."""


class GeneratorInvalidatedError(PyggmlError):
    """A generator resumed after its sequence was changed by something else (a newer generate,
    reset, eval or decode_batch on that sequence): continuing would read a cache that no longer
    holds its tokens."""


class InsufficientMemoryError(PyggmlError, MemoryError):
    """Memory the system cannot give: the message says how much is needed, how much is
    available and what would fit."""


class ChatTemplateError(PyggmlError, ValueError):
    """A chat template is missing, cannot be compiled or fails to render, or chat messages are
    malformed; the message names the template (and line) or the message and field."""


class GrammarError(ModelError):
    """A grammar, JSON schema or regex for constrained output is invalid or unsupported; the
    message names where (a GBNF line:col, a schema path)."""

    def __init__(self, message: str, where: str | None = None):
        super().__init__(message)
        self.where = where
