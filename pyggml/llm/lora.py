"""LoRA adapters at run time, in llama.cpp's GGUF adapter format (src/llama-adapter.cpp) and
applied where llama.cpp applies them (`build_lora_mm`, `build_lora_mm_id`, `build_inp_embd`).

The file: `general.type` = "adapter", `general.architecture` = the base model's,
`adapter.type` = "lora", `adapter.lora.alpha` (f32; absent or 0: no alpha/rank factor). Its
tensors come in pairs named after the base tensor they adapt, "<base name>.lora_a" and
"<base name>.lora_b" (tensors ending in "_norm.weight" are skipped, as llama.cpp skips them).
For a weight W [n_in, n_out] (ggml order; 3-D [n_in, n_out, n_expert] for stacked experts):
A [n_in, r] and B [r, n_out] (experts: [n_in, r, n_expert] and [r, n_out, n_expert]), and

    y = W·x + s · B·(A·x),   s = scale · alpha / r   (scale alone when alpha is 0)

with the user's `scale` per adapter, computed in float32 as llama.cpp does. token_embd's pair is
stored the other way round: A [r, n_vocab] (rows looked up by token) and B [r, n_embd]; the
embedding gets s · B·A[token] added.

Loading is all or nothing: every metadata key, tensor name, pair and shape is checked before an
adapter is used, and any problem is a `LoraError` naming the file and the key or tensor. The
tensors stay mapped from the file (zero copy, host memory, like the CPU's model weights).

`Loras` is the set applied to one graph: the adapters whose scale is not 0, with their scales.
The builders call `mm` / `mm_id` / `embd` after their plain op; with no adapter applied the
graph is exactly the one without LoRA support. `Loras.tag` names the set (the adapters' paths
and scales): KV cells computed under one set are never reused under another
(pyggml/llm/context.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pyggml import ops
from pyggml.errors import GGUFError, ModelError
from pyggml.tensor import Tensor
from pyggml.types import GGMLType, block_size


class LoraError(ModelError):
    """A LoRA adapter file that does not fit the model (or is no adapter); the message names
    the file and the key or tensor."""


#: the tag of "no adapter applied": what cells computed without LoRA carry
NO_LORA: tuple = ()


def adapter_scale(scale: float, alpha: float, rank: int) -> float:
    """llama.cpp's get_scale in float32: scale · alpha / rank (scale alone when alpha is 0)."""
    s, a = np.float32(scale), np.float32(alpha)
    return float(s * a / np.float32(rank)) if alpha else float(s)


@dataclass(frozen=True)
class LoraPair:
    a: Tensor       # lora_a: [n_in, r] (experts [n_in, r, X]); token_embd: [r, n_vocab]
    b: Tensor       # lora_b: [r, n_out] (experts [r, n_out, X]); token_embd: [r, n_embd]

    @property
    def rank(self) -> int:
        return int(self.b.ne[0])


class LoraAdapter:
    """One adapter file, checked against a model (see the module docstring). `pairs`: base
    tensor name → LoraPair; `alpha`; `path`; `task_name` / `prompt_prefix` (optional metadata,
    llama-server lists them)."""

    def __init__(self, path, hparams, model_tensors: dict):
        from pyggml.gguf import GGUFModel
        self.path = os.fspath(path)
        try:
            self.file = GGUFModel.open(self.path)
        except (GGUFError, OSError) as e:
            raise LoraError(f"LoRA adapter {self.path}: cannot be read as GGUF: {e}") from None
        try:
            self._read(hparams, model_tensors)
        except BaseException:
            self.close()
            raise

    def _str(self, key: str) -> str:
        v = self.file.get(key)
        return v if isinstance(v, str) else ""

    def _read(self, hp, model_tensors: dict) -> None:
        f, p = self.file, self.path
        kind = self._str("general.type")
        if kind != "adapter":
            raise LoraError(f"LoRA adapter {p}: general.type must be 'adapter', got {kind!r} "
                            f"(a model file, not an adapter?)")
        arch = self._str("general.architecture")
        if arch != hp.arch:
            raise LoraError(f"LoRA adapter {p}: general.architecture is {arch!r} but the model "
                            f"is {hp.arch!r} (an adapter for another base model)")
        atype = self._str("adapter.type")
        if atype != "lora":
            raise LoraError(f"LoRA adapter {p}: adapter.type must be 'lora', got {atype!r}")
        alpha = f.get("adapter.lora.alpha", 0.0)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)) or \
                not np.isfinite(alpha):
            raise LoraError(f"LoRA adapter {p}: adapter.lora.alpha must be a number, got "
                            f"{alpha!r}")
        self.alpha = float(np.float32(alpha))
        if f.get("adapter.alora.invocation_tokens") is not None:
            raise LoraError(f"LoRA adapter {p}: an activated LoRA (adapter.alora."
                            f"invocation_tokens) is not supported")
        self.task_name = self._str("adapter.lora.task_name")
        self.prompt_prefix = self._str("adapter.lora.prompt_prefix")

        halves: dict[str, dict[str, str]] = {}
        for tname in f.tensors:
            for sfx in (".lora_a", ".lora_b"):
                if tname.endswith(sfx):
                    halves.setdefault(tname[: -len(sfx)], {})[sfx[-1]] = tname
                    break
            else:
                if tname.endswith("_norm.weight"):
                    continue            # llama.cpp skips norm vectors too
                raise LoraError(f"LoRA adapter {p}: tensor '{tname}' is neither '<base "
                                f"tensor>.lora_a' nor '.lora_b'")
        if not halves:
            raise LoraError(f"LoRA adapter {p}: no '.lora_a' / '.lora_b' tensor in it")
        tensors = f.create_tensors()
        self.pairs: dict[str, LoraPair] = {}
        for base, ab in sorted(halves.items()):
            if set(ab) != {"a", "b"}:
                missing = "lora_b" if "a" in ab else "lora_a"
                raise LoraError(f"LoRA adapter {p}: tensor '{base}.{missing}' is missing (its "
                                f"pair '{base}.lora_{'a' if missing[-1] == 'b' else 'b'}' is "
                                f"there)")
            info = model_tensors.get(base)
            if info is None:
                raise LoraError(f"LoRA adapter {p}: tensor '{base}.lora_a' adapts '{base}', "
                                f"which the model does not have (an adapter for another base "
                                f"model?)")
            a, b = tensors[ab["a"]], tensors[ab["b"]]
            self._check_pair(base, list(info.ne[: max(info.n_dims, 1)]), a, b, hp,
                             "output.weight" in model_tensors)
            self.pairs[base] = LoraPair(a, b)

    def _check_pair(self, base: str, w: list, a: Tensor, b: Tensor, hp,
                    own_output: bool) -> None:
        from pyggml.llm.models import WEIGHT_TYPES
        p = self.path
        sa, sb = list(a.ne[: a.n_dims]), list(b.ne[: b.n_dims])

        def bad(expected: str):
            return LoraError(f"LoRA adapter {p}: tensors '{base}.lora_a' {sa} / '{base}.lora_b' "
                             f"{sb} do not fit '{base}' {w} (expected {expected})")
        for t in (a, b):
            tt = GGMLType(int(t.type))
            if tt not in WEIGHT_TYPES:
                raise LoraError(f"LoRA adapter {p}: tensor '{t.name}' has type {tt.name}, which "
                                f"pyggml cannot compute")
            if t.ne[0] % block_size(tt):
                raise LoraError(f"LoRA adapter {p}: tensor '{t.name}' has rows of {t.ne[0]} "
                                f"values, not a multiple of {tt.name}'s block of "
                                f"{block_size(tt)}")
        if base == "token_embd.weight":
            if hp.tied_output or not own_output:
                raise LoraError(f"LoRA adapter {p}: a LoRA of token_embd.weight on a model "
                                f"whose output matrix is token_embd (tied) is not supported "
                                f"(llama.cpp cannot apply it either)")
            E, V = w[0], w[1]
            r = a.ne[0]
            if a.n_dims > 2 or b.n_dims > 2 or list(a.ne[:2]) != [r, V] or \
                    list(b.ne[:2]) != [r, E]:
                raise bad(f"lora_a [r, {V}] and lora_b [r, {E}]")
            return
        n_in, n_out = w[0], w[1]
        X = w[2] if len(w) > 2 else 1
        r = a.ne[1]
        want_a, want_b = [n_in, r, X], [r, n_out, X]
        if list(a.ne[:3]) != want_a or list(b.ne[:3]) != want_b or r < 1:
            tail = f", {X}" if X > 1 else ""
            raise bad(f"lora_a [{n_in}, r{tail}] and lora_b [r, {n_out}{tail}]")

    @property
    def nbytes(self) -> int:
        """Bytes of the adapter's tensors: what it keeps mapped and reads when applied."""
        return sum(p.a.nbytes() + p.b.nbytes() for p in self.pairs.values())

    def scale_for(self, pair: LoraPair, scale: float) -> float:
        return adapter_scale(scale, self.alpha, pair.rank)

    def close(self) -> None:
        f = getattr(self, "file", None)
        if f is not None:
            f.close()


def load_adapters(specs, model_file) -> list[LoraAdapter]:
    """Open and check the adapters of `specs` [(path, scale), ...] against a ModelFile; all or
    nothing (on any error the ones opened are closed)."""
    out: list[LoraAdapter] = []
    try:
        for path, _ in specs:
            out.append(LoraAdapter(path, model_file.hparams, model_file.model.tensors))
    except BaseException:
        for ad in out:
            ad.close()
        raise
    return out


def check_specs(lora) -> list[tuple[str, float]]:
    """LLM(lora=...): a path, or a list of paths or (path, scale) pairs → [(path, scale)]."""
    from pyggml.errors import ArgumentTypeError
    if lora is None:
        return []
    if isinstance(lora, (str, os.PathLike)):
        lora = [lora]
    if not isinstance(lora, (list, tuple)):
        raise ArgumentTypeError(f"lora must be a path or a list of paths / (path, scale) pairs, "
                                f"got {type(lora).__name__} {lora!r:.60}")
    out = []
    for i, item in enumerate(lora):
        if isinstance(item, (str, os.PathLike)):
            path, scale = item, 1.0
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            path, scale = item
        else:
            raise ArgumentTypeError(f"lora[{i}] must be a path or a (path, scale) pair, got "
                                    f"{type(item).__name__} {item!r:.60}")
        if not isinstance(path, (str, os.PathLike)):
            raise ArgumentTypeError(f"lora[{i}]: the path must be a str, got "
                                    f"{type(path).__name__} {path!r:.60}")
        out.append((os.fspath(path), check_scale(f"lora[{i}] scale", scale)))
    return out


def check_scale(what: str, v) -> float:
    from pyggml.errors import ArgumentTypeError
    if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
        raise ArgumentTypeError(f"{what} must be a number, got {type(v).__name__} {v!r:.60}")
    if not np.isfinite(float(v)):
        raise ModelError(f"{what} must be finite, got {v!r}")
    return float(v)


class Loras:
    """The adapters applied to one graph: [(adapter, scale)] with every scale non-zero (an
    adapter at scale 0 is left out, as llama.cpp leaves it out)."""

    def __init__(self, items):
        self.items = tuple((ad, float(s)) for ad, s in items if float(s) != 0.0)
        self.tag = tuple((ad.path, s) for ad, s in self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def extra_graph_size(self) -> int:
        """Nodes and leafs the adapters may add to a graph: per pair two matmuls (or a lookup
        and a matmul), a scale and an add, and the two tensors."""
        return sum(6 * len(ad.pairs) for ad, _ in self.items)

    def mm(self, ctx, w: Tensor, x: Tensor, res: Tensor, name: str | None = None) -> Tensor:
        """res (= mul_mat(w, x), [n_out, T]) plus each adapter's s·B·(A·x) for the weight named
        `name` (default w.name): llama.cpp's build_lora_mm, one add per adapter."""
        key = name or w.name
        for ad, s in self.items:
            pair = ad.pairs.get(key)
            if pair is None:
                continue
            ab = ops.mul_mat(ctx, pair.b, ops.mul_mat(ctx, pair.a, x))
            res = ops.add(ctx, res, ops.scale(ctx, ab, ad.scale_for(pair, s)))
        return res

    def mm_id(self, ctx, w: Tensor, x: Tensor, ids: Tensor, res: Tensor) -> Tensor:
        """res (= mul_mat_id(w, x, ids), [n_out, k, T]) plus each adapter's expert deltas
        s·B_e·(A_e·x): llama.cpp's build_lora_mm_id."""
        for ad, s in self.items:
            pair = ad.pairs.get(w.name)
            if pair is None:
                continue
            ab = ops.mul_mat_id(ctx, pair.b, ops.mul_mat_id(ctx, pair.a, x, ids), ids)
            res = ops.add(ctx, res, ops.scale(ctx, ab, ad.scale_for(pair, s)))
        return res

    def embd(self, ctx, tokens: Tensor, res: Tensor) -> Tensor:
        """The looked-up embeddings res [E, T] plus s·B·A[tokens] of token_embd's pairs."""
        for ad, s in self.items:
            pair = ad.pairs.get("token_embd.weight")
            if pair is None:
                continue
            d = ops.mul_mat(ctx, pair.b, ops.get_rows(ctx, pair.a, tokens))
            res = ops.add(ctx, res, ops.scale(ctx, d, ad.scale_for(pair, s)))
        return res


def tag_of(value) -> tuple:
    """A tag read back from JSON (lists) as the tuple Loras.tag is."""
    if not value:
        return NO_LORA
    return tuple((str(p), float(s)) for p, s in value)
