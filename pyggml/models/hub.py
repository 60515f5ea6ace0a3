"""`pyggml pull user/repo[:QUANT]` and `-hf user/repo[:QUANT]`: GGUF files from the Hugging Face
hub through huggingface_hub, into its standard cache (~/.cache/huggingface/hub, or $HF_HOME /
$HF_HUB_CACHE), so files other tools downloaded are reused and ours serve them. huggingface_hub
does the transfer: a progress bar, resumable downloads (a dropped connection resumes from the
bytes it has), $HF_ENDPOINT (a mirror), $HF_TOKEN, and offline mode ($HF_HUB_OFFLINE=1: only
the cache is read).

The file is chosen as llama.cpp's `-hf` does: QUANT names the quantization (case-insensitive,
default Q4_K_M); a split model (NAME-00001-of-00003.gguf) is fetched whole and its first file
returned; mmproj-* files (vision projectors) are never chosen. A repo with one GGUF needs no
QUANT. Every failure is one PyggmlError line (a missing repo, a missing quant with the ones the
repo has, no network and not cached).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from pyggml.errors import PyggmlError

DEFAULT_QUANT = "Q4_K_M"
# when the default is missing: llama.cpp's hub endpoint falls back along these
FALLBACK_QUANTS = ("Q4_K_M", "Q4_0", "Q4_K_S", "Q5_K_M", "Q8_0", "Q6_K", "Q3_K_M", "F16", "BF16")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
_SPEC = re.compile(r"^([\w.\-]+/[\w.\-]+)(?::([\w.\-]+))?$")


@dataclass(frozen=True)
class Spec:
    repo: str
    quant: str | None           # None: the default (Q4_K_M, or the repo's only GGUF)


def parse_spec(text: str) -> Spec:
    """'user/repo' or 'user/repo:QUANT' (also a hf.co/ or huggingface.co/ prefix)."""
    t = str(text).strip()
    for prefix in ("https://huggingface.co/", "huggingface.co/", "hf.co/"):
        if t.startswith(prefix):
            t = t[len(prefix):]
    m = _SPEC.match(t)
    if not m:
        raise PyggmlError(f"{text!r} is not a model on the hub: expected user/repo or "
                          f"user/repo:QUANT (e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M)")
    return Spec(m.group(1), m.group(2))


def _quant_of(name: str) -> str | None:
    """The quantization a GGUF file name carries ('...-Q4_K_M.gguf' -> 'Q4_K_M')."""
    base = _SPLIT.sub(".gguf", Path(name).name)
    m = re.search(r"(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|F16|BF16|F32)(?=\.gguf$)", base, re.I)
    return m.group(1).upper() if m else None


def choose_files(files: list[str], spec: Spec) -> list[str]:
    """The files of `spec`'s model among a repo's files (split shards in order)."""
    ggufs = [f for f in files if f.lower().endswith(".gguf")
             and not Path(f).name.lower().startswith("mmproj")]
    if not ggufs:
        raise PyggmlError(f"{spec.repo} has no GGUF file")

    def matching(q: str) -> list[str]:
        q = q.upper()
        return [f for f in ggufs if (_quant_of(f) or "") == q or
                re.search(rf"[-_.]{re.escape(q)}([-_.]|$)", _SPLIT.sub("", Path(f).name).upper()
                          .removesuffix(".GGUF") + ".") is not None]
    if spec.quant:
        found = matching(spec.quant)
    elif len({_SPLIT.sub(".gguf", f) for f in ggufs}) == 1:
        found = ggufs
    else:
        found = next((m for q in FALLBACK_QUANTS if (m := matching(q))), [])
    if not found:
        have = sorted({q for f in ggufs if (q := _quant_of(f))})
        want = spec.quant or DEFAULT_QUANT
        raise PyggmlError(f"{spec.repo} has no {want} GGUF (it has: "
                          f"{', '.join(have) or ', '.join(Path(f).name for f in ggufs)}); "
                          f"name one as {spec.repo}:QUANT")
    # one model: the first file's group (a split model: all its shards)
    first = sorted(found)[0]
    group = _SPLIT.sub("", first)
    if _SPLIT.search(first):
        found = sorted(f for f in found if _SPLIT.sub("", f) == group)
        n = int(_SPLIT.search(found[0]).group(2))
        if len(found) != n:
            raise PyggmlError(f"{spec.repo}: {Path(first).name} is split in {n} files but the "
                              f"repo has {len(found)} of them")
        return found
    return [first]


def _offline() -> bool:
    from huggingface_hub import constants
    return bool(constants.HF_HUB_OFFLINE)


def _cached_files(repo: str) -> list[str]:
    """The files of `repo` in the cache (its newest revision), relative names."""
    from huggingface_hub import scan_cache_dir
    try:
        info = scan_cache_dir()
    except Exception:                      # no cache folder yet
        return []
    for r in info.repos:
        if r.repo_id == repo and r.repo_type == "model":
            revs = sorted(r.revisions, key=lambda x: x.last_modified, reverse=True)
            if revs:
                root = revs[0].snapshot_path
                return [str(Path(f.file_path).relative_to(root)) for f in revs[0].files]
    return []


def _repo_files(repo: str) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    if _offline():
        files = _cached_files(repo)
        if not files:
            raise PyggmlError(f"{repo} is not in the Hugging Face cache and offline mode is on "
                              f"(HF_HUB_OFFLINE)")
        return files
    try:
        return HfApi().list_repo_files(repo)
    except GatedRepoError:
        raise PyggmlError(f"{repo} is gated: accept its terms on the hub and set HF_TOKEN") \
            from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise PyggmlError(f"{repo}: no such model repository on "
                          f"{_endpoint()} (or it is private: set HF_TOKEN)") from None
    except OfflineModeIsEnabled:
        return _cached_files(repo)
    except (HfHubHTTPError, OSError) as e:
        files = _cached_files(repo)
        if files:
            return files
        raise PyggmlError(f"{repo}: the hub cannot be reached ({_first_line(e)}) and nothing "
                          f"of it is cached") from None


def _endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def pull(text: str, progress: bool = True) -> Path:
    """Download (or find in the cache) the model `text` names; the path of its (first) file."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, LocalEntryNotFoundError
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    spec = parse_spec(text)
    files = choose_files(_repo_files(spec.repo), spec)
    paths = []
    if not progress:
        disable_progress_bars()
    try:
        for f in files:
            try:
                paths.append(Path(hf_hub_download(spec.repo, f)))
            except LocalEntryNotFoundError:
                raise PyggmlError(f"{spec.repo}/{f} is not cached and the hub cannot be reached "
                                  f"(or offline mode is on)") from None
            except EntryNotFoundError:
                raise PyggmlError(f"{spec.repo} has no file {f}") from None
            except (HfHubHTTPError, OSError) as e:
                raise PyggmlError(f"downloading {spec.repo}/{f} failed: {_first_line(e)} "
                                  f"(run it again: the download resumes)") from None
    finally:
        if not progress:
            enable_progress_bars()
    return paths[0]


@dataclass
class CachedModel:
    repo: str
    file: str
    path: Path
    size: int
    arch: str
    quant: str


def list_cached() -> list[CachedModel]:
    """Every GGUF in the Hugging Face cache (first files of split models), with its
    architecture and quantization read from its header."""
    from huggingface_hub import scan_cache_dir
    try:
        info = scan_cache_dir()
    except Exception:
        return []
    out = []
    for r in info.repos:
        if r.repo_type != "model":
            continue
        for rev in r.revisions:
            for f in rev.files:
                name = f.file_name
                if not name.lower().endswith(".gguf"):
                    continue
                m = _SPLIT.search(name)
                if m and int(m.group(1)) != 1:
                    continue
                size = f.size_on_disk
                if m:
                    size = sum(g.size_on_disk for g in rev.files
                               if _SPLIT.sub("", g.file_name) == _SPLIT.sub("", name))
                arch, quant = _describe(f.file_path)
                out.append(CachedModel(r.repo_id, str(Path(f.file_path).relative_to(
                    rev.snapshot_path)), Path(f.file_path), size, arch,
                    quant or _quant_of(name) or "?"))
    return sorted(out, key=lambda m: (m.repo, m.file))


def _describe(path) -> tuple[str, str | None]:
    """(architecture, file type name) from a GGUF header ('?' when unreadable)."""
    try:
        from gguf import LlamaFileType

        from pyggml.gguf import open_gguf
        with open_gguf(path) as g:
            arch = g.arch
            ft = g.get_int("general.file_type", None)
        name = LlamaFileType(ft).name.removeprefix("MOSTLY_") if ft is not None else None
        return arch, name
    except Exception:
        return "?", None
