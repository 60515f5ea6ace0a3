"""Checks of the arguments given to `LLM(...)` and its methods, before any work: a wrong type or
range is a typed PyggmlError naming the argument and the value, never a TypeError from deep
inside (numpy, ctypes, an f-string). One place for these rules, so the CLI and the later server
see the same messages.

Integers: int or numpy integer, never bool (`n_ctx=True` is a mistake, not 1). Flags: bool or
numpy bool, never a string (`flash_attn="off"` would be true).
"""

from __future__ import annotations

import numbers
import os

from pyggml.errors import ArgumentTypeError, ModelError

def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def check_int(name: str, v, lo: int | None = None, hi: int | None = None, *,
              none_ok: bool = False, hint: str = "") -> int | None:
    """`v` as an int in [lo, hi]; ArgumentTypeError for a non-integer, ModelError out of range."""
    if v is None and none_ok:
        return None
    if not is_int(v):
        raise ArgumentTypeError(f"{name} must be an integer{' or None' if none_ok else ''}, got "
                                f"{type(v).__name__} {_show(v)}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = (f"in {lo}..{hi}" if lo is not None and hi is not None else
               f">= {lo}" if lo is not None else f"<= {hi}")
        raise ModelError(f"{name} must be {rng}{hint}, got {v}")
    return v


def check_flag(name: str, v, *, none_ok: bool = False) -> None:
    if v is None and none_ok:
        return
    if not (isinstance(v, bool) or type(v).__name__ == "bool_"):
        raise ArgumentTypeError(f"{name} must be True or False{' or None' if none_ok else ''}, "
                                f"got {type(v).__name__} {_show(v)}")


def _check_kv_type(name: str, v) -> None:
    from pyggml.types import GGMLType
    items = v if isinstance(v, (list, tuple)) else [v]
    for x in items:
        if not isinstance(x, (str, GGMLType)) and not is_int(x):
            raise ArgumentTypeError(f"{name} must be a type name such as 'f16' or 'q8_0' (or one "
                                    f"per layer), got {type(x).__name__} {_show(x)}")
        if isinstance(x, str) and x.upper() not in GGMLType.__members__:
            # not a type at all: the KV types are the list to show, not every ggml type
            from pyggml.llm.kv_cache import kv_type_choices
            raise ModelError(f"KV cache {name} must be one of "
                             f"{', '.join(kv_type_choices())}, got {x!r}")


def validate_options(model_path, config, *, n_ctx, n_batch, n_ubatch, n_threads,
                     n_threads_batch, n_seq_max, type_k, type_v, logits_all, flash_attn,
                     n_gpu_layers, offload, progress, swa_full, device=None,
                     verbose=False) -> None:
    """LLM.__init__'s arguments: types and ranges that do not depend on the model (n_ctx 0, the
    trained context, is resolved by pyggml.llm.setup)."""
    if model_path is not None and not isinstance(model_path, (str, os.PathLike)):
        raise ArgumentTypeError(f"model_path must be a path (str or os.PathLike) or None, got "
                                f"{type(model_path).__name__} {_show(model_path)}")
    if config is not None:
        from pyggml.offload.config import Config
        if not isinstance(config, (str, os.PathLike, dict, Config)):
            raise ArgumentTypeError(f"config must be a YAML path, a dict or a "
                                    f"pyggml.offload.config.Config, got {type(config).__name__} "
                                    f"{_show(config)}")
    # types only: the ranges are RunOptions.resolved's (sizes), the CPU backend's (threads) and
    # the KV cache's (n_seq_max), with the messages the CLI shows too
    for name, v in (("n_ctx", n_ctx), ("n_batch", n_batch), ("n_ubatch", n_ubatch),
                    ("n_seq_max", n_seq_max)):
        check_int(name, v)
    check_int("n_gpu_layers", n_gpu_layers)     # its range: the offload rules (ConfigError)
    _check_kv_type("type_k", type_k)
    _check_kv_type("type_v", type_v)
    for name, v in (("logits_all", logits_all), ("flash_attn", flash_attn),
                    ("swa_full", swa_full), ("verbose", verbose)):
        check_flag(name, v)
    check_flag("progress", progress, none_ok=True)
    if device is not None and not isinstance(device, str):
        raise ArgumentTypeError(f"device must be a device name such as 'Vulkan0' or None, got "
                                f"{type(device).__name__} {_show(device)}")
    if offload is not None:
        from pyggml.offload import OffloadPlan
        if not isinstance(offload, OffloadPlan):
            raise ArgumentTypeError(f"offload must be a pyggml.offload.OffloadPlan or None, got "
                                    f"{type(offload).__name__} {_show(offload)}")


def token_list(tokens, what: str = "tokens") -> list[int]:
    """Token ids as a list of ints; ArgumentTypeError naming the first bad element."""
    if isinstance(tokens, (str, bytes, bytearray)):
        raise ArgumentTypeError(f"{what} must be token ids (ints), got {type(tokens).__name__} "
                                f"{_show(tokens)}: tokenize text first (LLM.tokenize)")
    try:
        items = list(tokens)
    except TypeError:
        raise ArgumentTypeError(f"{what} must be a sequence of token ids, got "
                                f"{type(tokens).__name__} {_show(tokens)}") from None
    for i, t in enumerate(items):
        if not is_int(t):
            raise ArgumentTypeError(f"{what}[{i}] must be an integer token id, got "
                                    f"{type(t).__name__} {_show(t)}")
    return [int(t) for t in items]
