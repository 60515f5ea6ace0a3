"""Files the commands write: whole or not at all, and a clear error when they cannot."""

from __future__ import annotations

import os
import tempfile

from pyggml.errors import PyggmlError


def write_text(path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder (nothing half-written);
    PyggmlError naming the path when it cannot be written."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".pyggml-")
    except OSError as e:
        raise PyggmlError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise PyggmlError(f"cannot write {path}: {e.strerror or e}") from None


def writable(path) -> str:
    """`path` if a file can be created there (checked before long work starts), else
    PyggmlError naming it."""
    write_text(path, "")
    return os.fspath(path)
