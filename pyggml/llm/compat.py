"""`pyggml.Llama`: llama-cpp-python's `Llama` class on pyggml's `LLM`, for code that migrates.

The constructor takes llama-cpp-python's keywords with its defaults (n_ctx 512, n_batch 512,
...). Each is honoured (use_mmap=False reads the weights into host memory), accepted as
harmless (it changes nothing here: use_mlock, no_perf, offload_kqv, op_offload, a one-device
split_mode), or — when set to anything but its
default — refused with `UnsupportedKeywordError` naming it (rope / YaRN overrides, kv_overrides,
tensor_split, main_gpu, vocab_only, lora_base, a chat_handler or tokenizer object, spm_infill, numa,
attention_type, an unknown chat_format). Unknown keywords are an ArgumentTypeError (llama-cpp-
python ignores them silently). `Llama.from_pretrained(repo_id, filename)` downloads through the
hub code (pyggml/models/hub.py: the Hugging Face cache, $HF_ENDPOINT, offline mode).

Methods as llama-cpp-python's: `__call__` / `create_completion` (its positional order),
`create_chat_completion`, `create_embedding` and `embed` (its normalize=False default),
`n_ctx()` / `n_vocab()` / `n_embd()` (also usable as numbers), `token_bos()` / `token_eos()`,
`save_state` / `load_state`, `set_cache`; a sampling call without a seed draws it from the
session's generator seeded with `seed` (a fixed seed makes the whole session reproducible, as
llama-cpp-python's sampler state does). Differences: `tokenize(text)` parses special tokens
unless `special=False` is given and `detokenize` returns str (pyggml's LLM's).
"""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path

import numpy as np

from pyggml.errors import ArgumentTypeError, ModelError, PyggmlError
from pyggml.llm.runtime import LLM
from pyggml.llm.sampler import DEFAULT_SEED, RANDOM_SEEDS

# llama_split_mode / llama_pooling_type / the "unspecified" values of llama.h
SPLIT_NONE, SPLIT_LAYER = 0, 1
POOLINGS = {-1: "mean", 0: None, 1: "mean", 3: "last"}      # 0 (none) / 2 (cls): refused
# llama-cpp-python's chat_format names -> pyggml's built-in templates
CHAT_FORMATS = {"chatml": "chatml", "qwen": "chatml", "llama-2": "llama2-sys",
                "llama-3": "llama3", "zephyr": "zephyr", "vicuna": "vicuna", "gemma": "gemma",
                "openchat": "openchat", "chatglm3": "chatglm3", "mistral-instruct": "mistral-v1"}
# llama-cpp-python's create_completion positional order
COMPLETION_ARGS = ("prompt", "suffix", "max_tokens", "temperature", "top_p", "min_p",
                   "typical_p", "logprobs", "echo", "stop", "frequency_penalty",
                   "presence_penalty", "repeat_penalty", "top_k", "stream", "seed", "tfs_z",
                   "mirostat_mode", "mirostat_tau", "mirostat_eta", "model", "stopping_criteria",
                   "logits_processor", "grammar", "logit_bias")


class UnsupportedKeywordError(ModelError):
    """A llama-cpp-python keyword pyggml cannot honour, set to something but its default."""


class _Count(int):
    """An int that is also callable (llama-cpp-python's n_ctx() is a method, pyggml's a
    number): `llm.n_ctx` and `llm.n_ctx()` both work."""

    def __call__(self) -> int:
        return int(self)


# keyword: the default whose value changes nothing here (anything else is refused)
_REFUSED = {"main_gpu": 0, "tensor_split": None, "vocab_only": False, "kv_overrides": None,
            "rope_scaling_type": -1, "attention_type": -1, "rope_freq_base": 0.0,
            "rope_freq_scale": 0.0, "yarn_ext_factor": -1.0, "yarn_attn_factor": 1.0,
            "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0, "yarn_orig_ctx": 0,
            "lora_base": None, "numa": False,
            "chat_handler": None, "tokenizer": None, "spm_infill": False}
_WHY = {"lora_base": "the adapter is applied to this model's own weights: a separate "
                     "higher-precision base is not supported (pass lora_path alone)",
        "chat_handler": "pass chat_format or chat_template (a built-in name or a Jinja file)",
        "tokenizer": "the model's own tokenizer is used",
        "kv_overrides": "GGUF metadata overrides are not supported",
        "tensor_split": "one device at a time (device= names it)",
        "main_gpu": "one device at a time (device= names it)"}


class Llama(LLM):
    """llama-cpp-python's Llama (see the module docstring)."""

    def __init__(self, model_path: str | os.PathLike, *, n_gpu_layers: int = 0,
                 split_mode: int = SPLIT_LAYER, main_gpu: int = 0, tensor_split=None,
                 vocab_only: bool = False, use_mmap: bool = True, use_mlock: bool = False,
                 kv_overrides=None, seed: int = DEFAULT_SEED, n_ctx: int = 512,
                 n_batch: int = 512, n_ubatch: int = 512, n_threads: int | None = None,
                 n_threads_batch: int | None = None, rope_scaling_type: int | None = -1,
                 pooling_type: int = -1, attention_type: int = -1, rope_freq_base: float = 0.0,
                 rope_freq_scale: float = 0.0, yarn_ext_factor: float = -1.0,
                 yarn_attn_factor: float = 1.0, yarn_beta_fast: float = 32.0,
                 yarn_beta_slow: float = 1.0, yarn_orig_ctx: int = 0,
                 logits_all: bool = False, embedding: bool = False, offload_kqv: bool = True,
                 flash_attn: bool = False, op_offload: bool | None = None,
                 swa_full: bool | None = None, no_perf: bool = False,
                 last_n_tokens_size: int = 64, lora_base=None, lora_scale: float = 1.0,
                 lora_path=None, numa=False, chat_format: str | None = None,
                 chat_handler=None, draft_model=None, tokenizer=None, type_k: int | None = None,
                 type_v: int | None = None, spm_infill: bool = False, verbose: bool = True,
                 chat_template=None, device: str | None = None, **kwargs):
        if kwargs:
            raise ArgumentTypeError(f"Llama() got unknown keyword arguments: "
                                    f"{', '.join(sorted(kwargs))} (llama-cpp-python ignores "
                                    f"these silently; pyggml does not)")
        given = locals()
        refused = [k for k, default in _REFUSED.items() if given[k] != default]
        if split_mode not in (SPLIT_NONE, SPLIT_LAYER):
            refused.append("split_mode")
        if not offload_kqv:
            refused.append("offload_kqv")
        if pooling_type not in POOLINGS or POOLINGS[pooling_type] is None:
            refused.append("pooling_type")
        if chat_format is not None and chat_format not in CHAT_FORMATS:
            refused.append("chat_format")
        if refused:
            why = [f"{k}={given[k]!r}" + (f" ({_WHY[k]})" if k in _WHY else "")
                   for k in refused]
            extra = (f"; chat_format: one of {', '.join(CHAT_FORMATS)}"
                     if "chat_format" in refused else "")
            raise UnsupportedKeywordError(f"Llama(): not supported here: {'; '.join(why)}"
                                          f"{extra}")
        if chat_format is not None and chat_template is None:
            chat_template = CHAT_FORMATS[chat_format]
        kv_types = {}
        for name, t in (("type_k", type_k), ("type_v", type_v)):
            if t is not None:
                from pyggml.types import GGMLType
                kv_types[name] = GGMLType(int(t)).name.lower() if isinstance(t, int) else t
        super().__init__(model_path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                         n_threads=n_threads, n_threads_batch=n_threads_batch,
                         logits_all=logits_all, flash_attn=flash_attn,
                         n_gpu_layers=n_gpu_layers, swa_full=bool(swa_full), device=device,
                         verbose=verbose, draft_model=draft_model, chat_template=chat_template,
                         embedding=embedding, progress=False if not verbose else None,
                         # llama.cpp maps the file by default and still repacks most CPU
                         # weights into its own memory: True is our default (None)
                         use_mmap=None if use_mmap else False,
                         lora=None if lora_path is None else [(lora_path, lora_scale)],
                         **kv_types)
        self.model_path = os.fspath(model_path)
        self.lora_base, self.lora_path, self.lora_scale = lora_base, lora_path, lora_scale
        self.pooling = POOLINGS[pooling_type]
        self.last_n_tokens_size = last_n_tokens_size
        self.seed = seed
        self._session = None if seed in RANDOM_SEEDS else np.random.Generator(
            np.random.MT19937(seed))

    # ---- sizes as llama-cpp-python's methods -------------------------------------------------
    n_ctx = property(lambda self: _Count(self.run.opts.n_ctx))
    n_vocab = property(lambda self: _Count(self.hparams.n_vocab))
    n_embd = property(lambda self: _Count(self.hparams.n_embd))

    def token_bos(self) -> int:
        return self.tokenizer.bos_id

    def token_eos(self) -> int:
        return self.tokenizer.eos_id

    def tokenize(self, text, add_bos=None, special=None, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """LLM.tokenize; llama-cpp-python's add_bos / special when given."""
        return super().tokenize(text, add_special if add_bos is None else add_bos,
                                parse_special if special is None else special)

    def set_seed(self, seed: int) -> None:
        self.seed = seed
        self._session = None if seed in RANDOM_SEEDS else np.random.Generator(
            np.random.MT19937(seed))

    def _sampling_defaults(self, kw: dict) -> dict:
        if kw.get("seed") is None and self._session is not None:
            kw["seed"] = int(self._session.integers(0, 0xFFFFFFFF))
        kw.setdefault("repeat_last_n", self.last_n_tokens_size)
        return kw

    # ---- completions -------------------------------------------------------------------------
    def create_completion(self, *args, **kw):
        """llama-cpp-python's create_completion (its positional order too)."""
        if len(args) > len(COMPLETION_ARGS):
            raise ArgumentTypeError(f"create_completion takes at most {len(COMPLETION_ARGS)} "
                                    f"positional arguments")
        for name, v in zip(COMPLETION_ARGS, args):
            if name in kw:
                raise ArgumentTypeError(f"create_completion got {name} twice")
            kw[name] = v
        if "prompt" not in kw:
            raise ArgumentTypeError("create_completion needs a prompt")
        for name in ("suffix", "stopping_criteria", "logits_processor"):
            if kw.pop(name, None) is not None:
                raise UnsupportedKeywordError(f"create_completion: {name} is not supported")
        model = kw.pop("model", None)
        prompt = kw.pop("prompt")
        if kw.get("stop") == []:
            kw["stop"] = None
        out = super().create_completion(prompt, **self._sampling_defaults(kw))
        return _named(out, model)

    __call__ = create_completion

    def create_chat_completion(self, messages, **kw):
        """llama-cpp-python's create_chat_completion."""
        for name in ("functions", "function_call", "logits_processor"):
            if kw.pop(name, None) is not None:
                raise UnsupportedKeywordError(f"create_chat_completion: {name} is not "
                                              f"supported (tools / tool_choice are)")
        model = kw.pop("model", None)
        return _named(super().create_chat_completion(messages, **self._sampling_defaults(kw)),
                      model)

    # ---- embeddings --------------------------------------------------------------------------
    def embed(self, input, normalize: bool = False, truncate: bool = True,
              return_count: bool = False):
        """llama-cpp-python's embed: one vector per input (pooled as pooling_type says)."""
        if not truncate:
            raise UnsupportedKeywordError("embed: truncate=False is not supported (an input "
                                          "longer than n_ctx is an error)")
        single = isinstance(input, str)
        vecs = super().embed([input] if single else list(input), self.pooling or "mean",
                             normalize)
        out = vecs[0] if single else vecs
        if return_count:
            n = sum(len(self.tokenize(x)) for x in ([input] if single else input))
            return out, n
        return out

    def create_embedding(self, input, model: str | None = None) -> dict:
        """llama-cpp-python's create_embedding: OpenAI's embeddings response."""
        items = [input] if isinstance(input, str) else list(input)
        vecs, n = self.embed(items, return_count=True)
        return {"object": "list", "model": model or self.model_path,
                "data": [{"object": "embedding", "embedding": v, "index": i}
                         for i, v in enumerate(vecs)],
                "usage": {"prompt_tokens": n, "total_tokens": n}}

    # ---- the hub -----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, repo_id: str, filename: str | None = None,
                        additional_files=None, local_dir=None, local_dir_use_symlinks="auto",
                        cache_dir=None, **kwargs) -> "Llama":
        """A model from the Hugging Face hub: `filename` is a file name or glob pattern
        matching one GGUF of `repo_id` (None: pyggml's choice, Q4_K_M, as `pyggml pull`); a
        split model's other parts and `additional_files` (patterns) come too. kwargs: the
        constructor's."""
        paths = download(repo_id, filename, additional_files, local_dir, cache_dir)
        return cls(paths[0], **kwargs)


def _named(out, model):
    if model is None or not isinstance(out, dict):
        return out
    return dict(out, model=model)


_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)


def download(repo_id: str, filename: str | None, additional_files=None, local_dir=None,
             cache_dir=None) -> list[Path]:
    """The files from_pretrained fetches (the model's first); PyggmlError one line for a
    missing repo, no match, several matches or a failed download."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (EntryNotFoundError, HfHubHTTPError,
                                        LocalEntryNotFoundError)
    from pyggml.models import hub
    spec = hub.parse_spec(repo_id)
    files = hub._repo_files(spec.repo)
    if filename is None:
        wanted = hub.choose_files(files, spec)
    else:
        wanted = [_one(spec.repo, files, filename)]
        m = _SPLIT.search(wanted[0])
        if m:                                   # a split model: every part
            stem = _SPLIT.sub("", wanted[0])
            wanted = sorted(f for f in files if _SPLIT.search(f) and _SPLIT.sub("", f) == stem)
    for pat in additional_files or ():
        wanted.append(_one(spec.repo, files, pat))
    out = []
    for f in wanted:
        try:
            out.append(Path(hf_hub_download(spec.repo, f, local_dir=local_dir,
                                            cache_dir=cache_dir)))
        except LocalEntryNotFoundError:
            raise PyggmlError(f"{spec.repo}/{f} is not cached and the hub cannot be reached "
                              f"(or offline mode is on)") from None
        except EntryNotFoundError:
            raise PyggmlError(f"{spec.repo} has no file {f}") from None
        except (HfHubHTTPError, OSError) as e:
            raise PyggmlError(f"downloading {spec.repo}/{f} failed: {hub._first_line(e)} "
                              f"(run it again: the download resumes)") from None
    return out


def _one(repo: str, files: list[str], pattern: str) -> str:
    found = [f for f in files if fnmatch.fnmatchcase(f, pattern)] or \
        [f for f in files if fnmatch.fnmatchcase(f.lower(), pattern.lower())]   # q8_0: Q8_0
    if len(found) > 1 and all(_SPLIT.search(f) for f in found):
        found = [f for f in found if _SPLIT.search(f).group(1) == "00001"] or found
    if not found:
        raise PyggmlError(f"{repo} has no file matching {pattern!r} (it has: "
                          f"{', '.join(sorted(files))[:300]})")
    if len(found) > 1:
        raise PyggmlError(f"{repo}: {len(found)} files match {pattern!r} "
                          f"({', '.join(sorted(found))[:300]}): name one")
    return found[0]
