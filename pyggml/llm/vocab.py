"""Token texts of a vocabulary, stored compactly.

A 262k-token vocabulary (Gemma 3) held as a Python list of str plus a dict str -> id costs about
60 MiB of objects (a str is ~50 bytes of header, a dict entry ~40, an id above 256 another 28).
`Vocab` keeps the texts as one UTF-8 blob with offsets, and the text -> id index as an
open-addressing hash table of two flat arrays: about 10 bytes per token, ~9 MiB for Gemma 3.

    v = Vocab.from_texts(["<unk>", "a", "b"])      # or from_buffer(file bytes, starts, lengths)
    v[1]            # 'a'      (id -> text, decoded on demand)
    v.get("b")      # 2        (text -> id, None when absent; v.index("b") raises KeyError)
    "a" in v, len(v)

Texts are str; bytes that are not UTF-8 round-trip through surrogateescape, as the tokenizer's
other tables. Lookups hash with Python's own (per-process) str hash, so the table is built in
the process that uses it, and is never saved.
"""

from __future__ import annotations

from array import array
from typing import Iterable

import numpy as np

_EMPTY = -1
_CHUNK = 1 << 14        # texts gathered per step by from_buffer


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class DuplicateTextError(ValueError):
    """Two ids have the same text (`ids` names them); the caller words the error."""

    def __init__(self, text: str, ids: tuple[int, int]):
        super().__init__(f"duplicate text {text!r} at ids {ids[0]} and {ids[1]}")
        self.text, self.ids = text, ids


class Vocab:
    """n token texts: blob (bytes, all texts' UTF-8 back to back), offsets (n + 1,), and a hash
    table of capacity 2^k >= 2n: slot -> id (or -1) and slot -> the text's str hash."""

    __slots__ = ("_blob", "_offs", "_slot_id", "_slot_hash", "_mask")

    def __init__(self, blob: bytes, offsets: np.ndarray):
        offsets = np.asarray(offsets, dtype=np.int64)
        self._blob = blob.tobytes() if isinstance(blob, np.ndarray) else bytes(blob)
        self._offs = array("q", offsets.tobytes())
        n = len(offsets) - 1
        hashes = np.empty(n, dtype=np.int64)
        blob = self._blob
        for c in range(0, n, _CHUNK):
            o = offsets[c:c + _CHUNK + 1].tolist()
            hashes[c:c + len(o) - 1] = [hash(blob[a:b].decode("utf-8", "surrogateescape"))
                                        for a, b in zip(o, o[1:])]
        self._build_index(hashes)

    @classmethod
    def from_texts(cls, texts: Iterable[str | bytes]) -> "Vocab":
        parts = [t if isinstance(t, bytes) else _utf8(t) for t in texts]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        return cls(b"".join(parts), offsets)

    @classmethod
    def from_buffer(cls, buf, starts: np.ndarray, lengths: np.ndarray) -> "Vocab":
        """From texts at byte offsets `starts` (n,) of `buf` (a GGUF mapping), `lengths` (n,)
        bytes each: gathered into one blob, never a Python object per text for all at once."""
        starts = np.asarray(starts, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        src = np.frombuffer(buf, dtype=np.uint8)
        blob = np.empty(int(offsets[-1]), dtype=np.uint8)
        n = len(starts)
        for c in range(0, n, _CHUNK):              # chunks: small index arrays at a time
            e = min(c + _CHUNK, n)
            a, b = offsets[c], offsets[e]
            # blob byte j of text i comes from starts[i] + (j - offsets[i])
            where = np.repeat(starts[c:e] - offsets[c:e], lengths[c:e]) + np.arange(a, b)
            blob[a:b] = src[where]
        return cls(blob, offsets)

    def _build_index(self, hashes: np.ndarray) -> None:
        n = len(hashes)
        cap = 1 << max(4, int(2 * n - 1).bit_length())       # load factor <= 1/2
        mask = cap - 1
        slot_id = np.full(cap, _EMPTY, dtype=np.int32)
        slot_hash = np.zeros(cap, dtype=np.int64)
        todo = np.arange(n, dtype=np.int64)
        slot = hashes & mask
        # linear probing, placed in rounds: in each round every unplaced id tries its next
        # slot, and of several ids wanting one free slot the lowest id takes it. Slots are never
        # freed, so a lookup walking from hash & mask meets its id before an empty slot.
        while todo.size:
            want = slot[todo]
            free = slot_id[want] == _EMPTY
            uniq, first = np.unique(want[free], return_index=True)
            winners = todo[free][first]
            slot_id[uniq] = winners
            slot_hash[uniq] = hashes[winners]
            placed = np.zeros(n, dtype=bool)
            placed[winners] = True
            todo = todo[~placed[todo]]
            slot[todo] = (slot[todo] + 1) & mask
        self._slot_id = array("i", slot_id.tobytes())
        self._slot_hash = array("q", slot_hash.tobytes())
        self._mask = mask
        self._check_unique(hashes)

    def _check_unique(self, hashes: np.ndarray) -> None:
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
        for k in same.tolist():                  # equal hashes: equal texts, or a collision
            a, b = int(order[k]), int(order[k + 1])
            if self[a] == self[b]:
                raise DuplicateTextError(self[a], (min(a, b), max(a, b)))

    # ---- id -> text --------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._offs) - 1

    def __getitem__(self, token_id: int) -> str:
        return self.text_bytes(token_id).decode("utf-8", "surrogateescape")

    def text_bytes(self, token_id: int) -> bytes:
        if token_id < 0:
            raise IndexError(token_id)
        offs = self._offs
        return self._blob[offs[token_id]:offs[token_id + 1]]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    # ---- text -> id --------------------------------------------------------------------------
    def get(self, text: str, default=None):
        h = hash(text)
        mask, ids, hashes = self._mask, self._slot_id, self._slot_hash
        j = h & mask
        while True:
            tid = ids[j]
            if tid == _EMPTY:
                return default
            if hashes[j] == h:
                offs = self._offs
                if self._blob[offs[tid]:offs[tid + 1]] == text.encode("utf-8",
                                                                    "surrogateescape"):
                    return tid
            j = (j + 1) & mask

    def index(self, text: str) -> int:
        tid = self.get(text)
        if tid is None:
            raise KeyError(text)
        return tid

    def __contains__(self, text) -> bool:
        return isinstance(text, str) and self.get(text) is not None

    def nbytes(self) -> int:
        """Bytes held by the tables (what this representation costs)."""
        return (len(self._blob) + self._offs.itemsize * len(self._offs)
                + self._slot_id.itemsize * len(self._slot_id)
                + self._slot_hash.itemsize * len(self._slot_hash))
