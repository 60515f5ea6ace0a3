"""GGUF files: open and validate, typed metadata, a tensor table, weights mapped with zero copy.

    model = open_gguf("model.gguf")            # or the first part of model-00001-of-00003.gguf
    model.arch                                  # 'gemma3'
    model.get_u32("{arch}.block_count")         # 18; model.arch_key("block_count") names the key
    model.tensors["token_embd.weight"]          # TensorInfo(type, ne, offset, nbytes): no weight read
    weights = model.create_tensors()            # {name: Tensor}; data = address in the mmapped file
    model.copy_tensors_to(write, progress=True) # tensor by tensor, for weights placed on other devices

Parsing is the `gguf` package's `GGUFReader`, subclassed to make it safe on hostile files:
every read is checked against the file size, counts and lengths are checked against the bytes
left before any loop or allocation (so nothing allocates more than the file could describe),
arrays are read as one view instead of one numpy object per element (the reader's own loop takes
8 s and 700 MB on a 262k-token vocabulary), and big-endian files are refused. On top of that it
checks what ggml checks and the reader does not: key and value types, nested arrays, duplicate keys
and tensor names, `general.alignment` (UINT32, power of two), tensor names under 64 bytes, ranks
<= 4, known types, ne[0] a multiple of the block size, sizes, offsets aligned and inside the file,
no overlapping tensors, and the split-file keys. Every failure is a GGUFError naming the file,
where in it (key, tensor) and what was found versus expected; the reader's own exceptions
(ValueError, IndexError, UnicodeDecodeError, ...) are converted too.
"""

from __future__ import annotations

import os
import re
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
from gguf.constants import GGUFValueType
from gguf.gguf_reader import GGUFReader, ReaderField

from pyggml.backend.base import BufferUsage
from pyggml.errors import GGUFError, InvalidArgumentError
from pyggml.types import TYPE_TRAITS, GGMLType

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NAME_BYTES = 63             # ggml: GGML_MAX_NAME = 64 including the terminator
INT64_MAX = (1 << 63) - 1

HEADER_BYTES = 24               # magic, version, n_tensors, n_kv
MIN_KV_BYTES = 8 + 1 + 4 + 1    # key length, a non-empty key, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8   # name length, n_dims, type, offset (empty name, 0 dims)

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"
_SPLIT_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# Smallest encoding of one value of each type (strings: their uint64 length).
_MIN_VALUE_BYTES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2, GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4,
    GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1, GGUFValueType.STRING: 8,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
# numpy dtypes of fixed-size values, always little-endian (big-endian files are refused).
_NP_TYPES = {
    GGUFValueType.UINT8: np.dtype("<u1"), GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"), GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"), GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"), GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"), GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}
_INT_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
_FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})

_REQUIRED = object()


# ---- records -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """One row of the tensor table, read from the tensor-info records only (no weight bytes).

    ne: elements per dimension in ggml order (ne[0] innermost), padded with 1 to 4 entries.
    n_dims: the rank stored in the file. offset: absolute byte offset of the data in its file
    (part `part` of a split model). nbytes: row_size(type, ne[0]) * ne[1] * ne[2] * ne[3].
    """
    name: str
    type: GGMLType
    ne: tuple[int, int, int, int]
    n_dims: int
    offset: int
    nbytes: int
    part: int = 0

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order: reversed(ne[:n_dims])."""
        return tuple(reversed(self.ne[: self.n_dims]))

    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]


@dataclass
class _KV:
    """One metadata value. `value`: Python int/float/bool for scalars, a uint8 view for a string,
    a little-endian numpy view for a numeric array, (starts, lengths) for an array of strings."""
    type: GGUFValueType
    elem_type: GGUFValueType | None
    value: Any
    count: int = 1

    def type_name(self) -> str:
        if self.type == GGUFValueType.ARRAY:
            return f"ARRAY[{self.elem_type.name}]"
        return self.type.name


class MappedBuffer:
    """The memory-mapped bytes of one GGUF file: what weight tensors' `buffer` points at.

    Read-only host memory (PROT_READ). Tensors created from it keep it (and the mapping) alive.
    """
    is_host = True
    usage = BufferUsage.WEIGHTS     # the scheduler places ops next to their weights

    def __init__(self, path: Path, memmap: np.ndarray):
        self.path = path
        self.memmap = memmap
        self.base = int(memmap.ctypes.data)
        self.size = int(memmap.size)
        self.name = f"mmap:{path.name}"

    def __repr__(self) -> str:
        return f"MappedBuffer({str(self.path)!r}, {self.size} bytes)"


class _Bad(Exception):
    """Internal: a problem found while parsing; turned into GGUFError with the file and place."""


# ---- the reader, made safe -----------------------------------------------------------------------

def _decode(raw: np.ndarray, what: str) -> str:
    try:
        return raw.tobytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Bad(f"{what} is not valid UTF-8 ({e.reason} at byte {e.start})") from None


def _value_type(raw: int, what: str) -> GGUFValueType:
    try:
        return GGUFValueType(int(raw))
    except ValueError:
        raise _Bad(f"unknown {what} {int(raw)} (known: 0..12)") from None


class _SafeReader(GGUFReader):
    """GGUFReader with bounds-checked reads, pre-checked counts, one-view arrays, and validation.

    `where` says what is being parsed (for error messages); `kv` and `infos` are the results.
    """

    def __init__(self, path: Path, file_size: int):
        self.where = "header"
        self.file_size = file_size
        self.kv: dict[str, _KV] = {}
        self.infos: list[TensorInfo] = []
        self._buf: memoryview | None = None
        super().__init__(path, mode="r")

    # -- primitive reads: never past the end of the file --
    def _get(self, offset, dtype, count=1, override_order=None):
        offset, count = int(offset), int(count)
        itemsize = np.dtype(dtype).itemsize
        end = offset + itemsize * count
        if offset < 0 or count < 0 or end > self.file_size:
            raise _Bad(f"needs bytes [{offset}, {end}) but the file is {self.file_size} bytes "
                       f"(truncated, or a corrupt length/count)")
        return super()._get(offset, dtype, count, override_order)

    # -- key/value records --
    def _build_fields(self, offs: int, count) -> int:
        for i in range(int(count)):
            self.where = f"key/value #{i} (offset {offs})"
            start = offs
            klen, kdata = self._get_str(offs)
            key = _decode(kdata, "key")
            if not key:
                raise _Bad("empty key")
            self.where = f"key {key!r}"
            offs += 8 + int(klen[0])
            raw_vtype = self._get(offs, np.uint32)
            offs += 4
            vtype = _value_type(raw_vtype[0], "value type")
            if key in self.fields:
                raise _Bad(f"duplicate key (first defined at offset {self.fields[key].offset})")
            size, parts, idxs, types = self._get_field_parts(offs, vtype)
            self.fields[key] = ReaderField(start, key, [klen, kdata, raw_vtype, *parts],
                                           [i + 3 for i in idxs], types)
            self.kv[key] = self._kv_value(vtype, parts)
            offs += size
        return offs

    def _get_field_parts(self, orig_offs: int, raw_type: int):
        gtype = GGUFValueType(int(raw_type))
        if gtype != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        # Arrays: one view for numbers, one walk over the lengths for strings. The reader's own
        # loop makes two numpy objects per element and has no bound on the count.
        raw_itype = self._get(orig_offs, np.uint32)
        itype = _value_type(raw_itype[0], "array element type")
        if itype == GGUFValueType.ARRAY:
            raise _Bad("nested arrays are not supported (ggml rejects them)")
        alen = self._get(orig_offs + 4, np.uint64)
        n = int(alen[0])
        offs = orig_offs + 12
        left = self.file_size - offs
        if n > left // _MIN_VALUE_BYTES[itype]:
            raise _Bad(f"array of {n} {itype.name} needs at least {n * _MIN_VALUE_BYTES[itype]} "
                       f"bytes but only {left} are left in the file")
        if itype == GGUFValueType.STRING:
            starts, lens, end = self._walk_strings(offs, n)
            return end - orig_offs, [raw_itype, alen, starts, lens], [2, 3], [gtype, itype]
        vals = self._get(offs, _NP_TYPES[itype], n)
        return 12 + int(vals.nbytes), [raw_itype, alen, vals], [2], [gtype, itype]

    def _walk_strings(self, offs: int, n: int):
        """Starts and lengths of n strings from offs. Memory: 8 bytes per string in numpy (n is
        at most a file-size/8) plus one bounded chunk of Python ints."""
        if self._buf is None:
            self._buf = memoryview(self.data).cast("B")
        buf, size = self._buf, self.file_size
        unpack = struct.Struct("<Q").unpack_from
        starts = np.empty(n, dtype=np.int64)
        chunk: list[int] = []
        done = 0
        for i in range(n):
            if offs + 8 > size:
                raise _Bad(f"string #{i} of {n}: its length field at offset {offs} is past the "
                           f"end of the file ({size} bytes)")
            (length,) = unpack(buf, offs)
            offs += 8
            if length > size - offs:
                raise _Bad(f"string #{i} of {n} claims {length} bytes but only {size - offs} are "
                           f"left in the file")
            chunk.append(offs)
            offs += length
            if len(chunk) == 65536:
                starts[done:done + len(chunk)] = chunk
                done += len(chunk)
                chunk.clear()
        starts[done:done + len(chunk)] = chunk
        lens = np.empty(n, dtype=np.int64)
        if n:
            lens[:-1] = starts[1:] - starts[:-1] - 8
            lens[-1] = offs - starts[-1]
        return starts, lens, offs

    @staticmethod
    def _kv_value(vtype: GGUFValueType, parts: list) -> _KV:
        if vtype == GGUFValueType.ARRAY:
            itype = GGUFValueType(int(parts[0][0]))
            n = int(parts[1][0])
            if itype == GGUFValueType.STRING:
                return _KV(vtype, itype, (parts[2], parts[3]), n)
            vals = parts[2].view(_NP_TYPES[itype])
            if itype == GGUFValueType.BOOL:
                vals = vals != 0
            return _KV(vtype, itype, vals, n)
        if vtype == GGUFValueType.STRING:
            return _KV(vtype, None, parts[1])
        raw = parts[-1].view(_NP_TYPES[vtype])
        if vtype == GGUFValueType.BOOL:
            return _KV(vtype, None, bool(raw[0] != 0))
        return _KV(vtype, None, raw[0].item())

    # -- tensor-info records --
    def _build_tensor_info(self, offs: int, count):
        self._check_alignment()
        fields = []
        self._pending: list[tuple] = []
        seen: set[str] = set()
        for i in range(int(count)):
            self.where = f"tensor info #{i} (offset {offs})"
            # peek at name length and rank first, to name the real problem (not "truncated")
            nlen = int(self._get(offs, np.uint64)[0])
            if nlen > MAX_NAME_BYTES:
                raise _Bad(f"tensor name length {nlen}, at most {MAX_NAME_BYTES} bytes allowed")
            name = _decode(self._get(offs + 8, np.uint8, nlen), "tensor name")
            self.where = f"tensor {name!r}"
            n_dims = int(self._get(offs + 8 + nlen, np.uint32)[0])
            if n_dims > MAX_DIMS:
                raise _Bad(f"n_dims = {n_dims}, at most {MAX_DIMS}")
            field = self._get_tensor_info_field(offs)
            offs += sum(int(p.nbytes) for p in field.parts)
            # check each record as it comes, so garbage fails at its first record
            if name in seen:
                raise _Bad("duplicate tensor name")
            seen.add(name)
            self._pending.append(self._check_tensor_info(name, field))
            fields.append(field)
        self.where = "tensor infos"
        return offs, fields

    @staticmethod
    def _check_tensor_info(name: str, field: ReaderField) -> tuple:
        """(name, type, ne, n_dims, relative offset, nbytes) of a well-formed record."""
        _nlen, _name, n_dims_a, dims_a, type_a, offset_a = field.parts
        n_dims = int(n_dims_a[0])
        dims = [int(x) for x in dims_a]
        raw_type = int(type_a[0])
        try:
            ttype = GGMLType(raw_type)
            tr = TYPE_TRAITS[ttype]
        except (ValueError, KeyError):
            raise _Bad(f"unknown tensor type id {raw_type}") from None
        for d, x in enumerate(dims):
            if x > INT64_MAX:
                raise _Bad(f"ne[{d}] = {x} is negative as int64")
        ne = tuple(dims + [1] * (MAX_DIMS - n_dims))
        n_el = 1
        for x in ne:
            n_el *= x
        if n_el > INT64_MAX:
            raise _Bad(f"ne = {list(ne)}: element count {n_el} overflows int64")
        if ne[0] % tr.block_size:
            raise _Bad(f"type {ttype.name}: ne[0] = {ne[0]} is not a multiple of the block "
                       f"size {tr.block_size}")
        nbytes = ne[0] // tr.block_size * tr.type_size * ne[1] * ne[2] * ne[3]
        return name, ttype, ne, n_dims, int(offset_a[0]), nbytes

    def _check_alignment(self) -> None:
        kv = self.kv.get("general.alignment")
        if kv is None:
            return
        self.where = "key 'general.alignment'"
        if kv.type != GGUFValueType.UINT32:
            raise _Bad(f"has type {kv.type_name()}, expected UINT32")
        a = kv.value
        if a == 0 or a & (a - 1):
            raise _Bad(f"= {a}, expected a power of two")

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
        """Place the checked records in the file (the reader's version makes numpy views without
        checking anything)."""
        data_offset = int(start_offs)
        self.data_offset = data_offset
        align = int(self.alignment)
        if fields and data_offset > self.file_size:
            self.where = "tensor data"
            raise _Bad(f"the data section would start at offset {data_offset}, past the end of "
                       f"the file ({self.file_size} bytes)")
        infos = []
        for name, ttype, ne, n_dims, rel, nbytes in self._pending:
            self.where = f"tensor {name!r}"
            if rel % align:
                raise _Bad(f"data offset {rel} is not a multiple of the alignment {align}")
            start = data_offset + rel
            if start + nbytes > self.file_size:
                raise _Bad(f"data [{start}, {start + nbytes}) ({ttype.name}, ne={list(ne)}, "
                           f"{nbytes} bytes) runs past the end of the file ({self.file_size} "
                           f"bytes)")
            infos.append(TensorInfo(name, ttype, ne, n_dims, start, nbytes))
        by_start = sorted((i for i in infos if i.nbytes), key=lambda i: i.offset)
        for a, b in zip(by_start, by_start[1:]):
            if a.offset + a.nbytes > b.offset:
                self.where = f"tensor {b.name!r}"
                raise _Bad(f"data [{b.offset}, {b.offset + b.nbytes}) overlaps tensor {a.name!r} "
                           f"at [{a.offset}, {a.offset + a.nbytes})")
        self.infos = infos


# ---- one file ------------------------------------------------------------------------------------

class GGUFPart:
    """One GGUF file, parsed and validated: its metadata, tensor table and mapping."""

    def __init__(self, path: Path, version: int, alignment: int, data_offset: int,
                 kv: dict[str, _KV], infos: list[TensorInfo], buffer: MappedBuffer):
        self.path = path
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.kv = kv
        self.infos = infos
        self.buffer = buffer

    @property
    def size(self) -> int:
        return self.buffer.size


def _check_header(path: Path, head: bytes, size: int) -> None:
    if size < HEADER_BYTES:
        raise GGUFError(f"{path}: file of {size} bytes is too short for a GGUF header "
                        f"({HEADER_BYTES} bytes)")
    if head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: bad magic {head[:4]!r}, expected {GGUF_MAGIC!r} (not a GGUF file)")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
    if version and not version & 0xFFFF:
        raise GGUFError(f"{path}: version field reads {version:#010x}: a big-endian GGUF file, "
                        f"which is not supported")
    if version not in SUPPORTED_VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version}, expected one of {SUPPORTED_VERSIONS}")
    left = size - HEADER_BYTES
    if n_kv > INT64_MAX or n_kv > left // MIN_KV_BYTES:
        raise GGUFError(f"{path}: header: n_kv = {n_kv}, but {left} bytes after the header hold "
                        f"at most {left // MIN_KV_BYTES} key/value records")
    if n_tensors > INT64_MAX or n_tensors > (left - n_kv * MIN_KV_BYTES) // MIN_TENSOR_INFO_BYTES:
        raise GGUFError(f"{path}: header: n_tensors = {n_tensors}, but {left} bytes after the "
                        f"header cannot hold that many tensor infos with {n_kv} key/values")


def open_part(path: str | os.PathLike) -> GGUFPart:
    """Open and validate one GGUF file (split keys are not interpreted here)."""
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise GGUFError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as e:
        raise GGUFError(f"{path}: cannot open: {e.strerror or e}") from None
    _check_header(path, head, st.st_size)
    reader = _SafeReader.__new__(_SafeReader)   # made first, so that errors can say where
    reader.where = "header"
    try:
        reader.__init__(path, st.st_size)
    except _Bad as e:
        raise GGUFError(f"{path}: {reader.where}: {e}") from None
    except Exception as e:  # the reader's own ValueError/IndexError/..., numpy errors, MemoryError
        raise GGUFError(f"{path}: {reader.where}: unreadable ({type(e).__name__}: {e})") from e
    version = int(struct.unpack_from("<I", head, 4)[0])
    buffer = MappedBuffer(path, reader.data)
    return GGUFPart(path, version, int(reader.alignment), int(reader.data_offset), reader.kv,
                    reader.infos, buffer)


# ---- the model: one file or all parts of a split ------------------------------------------------

def split_path(prefix: str | os.PathLike, split_no: int, split_count: int) -> Path:
    """The file name of part `split_no` (0-based) of `split_count`: prefix-00001-of-00003.gguf."""
    return Path(f"{prefix}-{split_no + 1:05d}-of-{split_count:05d}.gguf")


class GGUFModel:
    """A GGUF model: metadata (from the first file), every tensor of every part, and the mappings.

    Keep this object (or the tensors made by create_tensors, which hold its buffers) alive while
    tensor data addresses are in use.
    """

    def __init__(self, parts: list[GGUFPart]):
        if isinstance(parts, (str, os.PathLike)):
            raise InvalidArgumentError(f"GGUFModel({str(parts)!r}): takes opened parts; open a "
                                       f"file with GGUFModel.open(path) or open_gguf(path)")
        self.parts = parts
        self.path = parts[0].path
        self.paths = [p.path for p in parts]
        self.version = parts[0].version
        self.alignment = parts[0].alignment
        self.kv = parts[0].kv
        self.tensors: dict[str, TensorInfo] = {}
        for i, part in enumerate(parts):
            for info in part.infos:
                if info.name in self.tensors:
                    first = self.paths[self.tensors[info.name].part]
                    raise GGUFError(f"{part.path}: tensor {info.name!r} is also in {first}")
                self.tensors[info.name] = info if i == 0 else _with_part(info, i)
        self._str_cache: dict[str, list] = {}

    @classmethod
    def open(cls, path: str | os.PathLike) -> "GGUFModel":
        return open_gguf(path)

    # ---- basic facts ----
    @property
    def arch(self) -> str:
        """general.architecture (required)."""
        return self.get_str("general.architecture")

    def arch_key(self, suffix: str) -> str:
        """'{arch}.' + suffix, e.g. arch_key('context_length') -> 'gemma3.context_length'."""
        return f"{self.arch}.{suffix}"

    @property
    def n_bytes(self) -> int:
        """Total bytes of tensor data."""
        return sum(t.nbytes for t in self.tensors.values())

    def __repr__(self) -> str:
        arch = self.kv.get("general.architecture")
        arch = self.get_str("general.architecture") if arch is not None else "?"
        return (f"GGUFModel({str(self.path)!r}, arch={arch}, {len(self.parts)} file(s), "
                f"{len(self.kv)} keys, {len(self.tensors)} tensors)")

    # ---- metadata ----
    def keys(self) -> list[str]:
        return list(self.kv)

    def __contains__(self, key: str) -> bool:
        return self._key(key) in self.kv

    def value_type(self, key: str) -> str | None:
        """'UINT32', 'STRING', 'ARRAY[FLOAT32]', ... or None when absent."""
        kv = self.kv.get(self._key(key))
        return kv.type_name() if kv is not None else None

    def _key(self, key: str) -> str:
        return key.replace("{arch}", self.arch) if "{arch}" in key else key

    def _lookup(self, key: str, default, expected: str):
        key = self._key(key)
        kv = self.kv.get(key)
        if kv is None and default is _REQUIRED:
            raise GGUFError(f"{self.path}: required key {key!r} ({expected}) is missing")
        return key, kv

    def _wrong_type(self, key: str, kv: _KV, expected: str) -> GGUFError:
        return GGUFError(f"{self.path}: key {key!r} has type {kv.type_name()}, expected {expected}")

    def _get_int(self, key: str, default, lo: int, hi: int, expected: str):
        key, kv = self._lookup(key, default, expected)
        if kv is None:
            return default
        if kv.type not in _INT_TYPES:
            raise self._wrong_type(key, kv, expected)
        if not lo <= kv.value <= hi:
            raise GGUFError(f"{self.path}: key {key!r} = {kv.value} is out of range for "
                            f"{expected} [{lo}, {hi}]")
        return kv.value

    def get_u32(self, key: str, default=_REQUIRED) -> int:
        """An unsigned 32-bit value (any integer type whose value fits). '{arch}' in `key` is the
        architecture. Missing: `default`, or GGUFError when no default is given."""
        return self._get_int(key, default, 0, 0xFFFFFFFF, "uint32")

    def get_i32(self, key: str, default=_REQUIRED) -> int:
        return self._get_int(key, default, -(1 << 31), (1 << 31) - 1, "int32")

    def get_int(self, key: str, default=_REQUIRED) -> int:
        """Any integer type, as a Python int."""
        return self._get_int(key, default, -(1 << 63), (1 << 64) - 1, "an integer")

    def get_f32(self, key: str, default=_REQUIRED) -> float:
        """A FLOAT32 (or FLOAT64) value as a Python float."""
        key, kv = self._lookup(key, default, "float32")
        if kv is None:
            return default
        if kv.type not in _FLOAT_TYPES:
            raise self._wrong_type(key, kv, "FLOAT32")
        return float(kv.value)

    def get_bool(self, key: str, default=_REQUIRED) -> bool:
        key, kv = self._lookup(key, default, "bool")
        if kv is None:
            return default
        if kv.type != GGUFValueType.BOOL:
            raise self._wrong_type(key, kv, "BOOL")
        return kv.value

    def get_str(self, key: str, default=_REQUIRED) -> str:
        key, kv = self._lookup(key, default, "string")
        if kv is None:
            return default
        if kv.type != GGUFValueType.STRING:
            raise self._wrong_type(key, kv, "STRING")
        try:
            return kv.value.tobytes().decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{self.path}: key {key!r}: string is not valid UTF-8 "
                            f"({e.reason} at byte {e.start})") from None

    def get_arr(self, key: str, default=_REQUIRED, elem: str | None = None, raw: bool = False):
        """An array: list[str] for strings (list[bytes] with raw=True), else a read-only numpy
        view of the file (little-endian; BOOL arrays as numpy bool). `elem` ('FLOAT32', 'INT32',
        'STRING', ...) requires that element type."""
        expected = f"ARRAY[{elem.upper()}]" if elem else "an array"
        key, kv = self._lookup(key, default, expected)
        if kv is None:
            return default
        if kv.type != GGUFValueType.ARRAY or (elem and kv.elem_type.name != elem.upper()):
            raise self._wrong_type(key, kv, expected)
        if kv.elem_type != GGUFValueType.STRING:
            return kv.value
        return self._strings(key, kv, raw)

    def array_len(self, key: str, default=_REQUIRED):
        """The element count of an array (no element is read)."""
        key, kv = self._lookup(key, default, "an array")
        if kv is None:
            return default
        if kv.type != GGUFValueType.ARRAY:
            raise self._wrong_type(key, kv, "an array")
        return kv.count

    def string_spans(self, key: str) -> tuple:
        """(buffer, starts, lengths) of an ARRAY[STRING]: the file's bytes and where each
        element lies in them (numpy int arrays), for readers that want no object per element."""
        key, kv = self._lookup(key, _REQUIRED, "ARRAY[STRING]")
        if kv.type != GGUFValueType.ARRAY or kv.elem_type != GGUFValueType.STRING:
            raise self._wrong_type(key, kv, "ARRAY[STRING]")
        starts, lens = kv.value
        return self.parts[0].buffer.memmap, starts, lens

    def _strings(self, key: str, kv: _KV, raw: bool) -> list:
        ck = ("raw:" if raw else "str:") + key
        cached = self._str_cache.get(ck)
        if cached is not None:
            return list(cached)
        buf = self.parts[0].buffer.memmap
        starts, lens = kv.value
        mv = memoryview(buf).cast("B")
        out = [bytes(mv[s:s + n]) for s, n in zip(starts.tolist(), lens.tolist())]
        if not raw:
            try:
                out = [b.decode("utf-8") for b in out]
            except UnicodeDecodeError:
                bad = next(i for i, b in enumerate(out) if not _is_utf8(b))
                raise GGUFError(f"{self.path}: key {key!r}: element {bad} is not valid UTF-8 "
                                f"({out[bad]!r}); use raw=True for bytes") from None
        self._str_cache[ck] = out
        return list(out)

    def get_u32_per_layer(self, key: str, n_layer: int, default=_REQUIRED) -> list[int]:
        """A per-layer uint32 value: a scalar (same for all layers) or an array of n_layer."""
        key, kv = self._lookup(key, default, f"uint32 or ARRAY[{n_layer}] of uint32")
        if kv is None:
            return [default] * n_layer
        if kv.type != GGUFValueType.ARRAY:
            return [self.get_u32(key)] * n_layer
        if kv.elem_type not in _INT_TYPES:
            raise self._wrong_type(key, kv, "an integer array")
        if kv.count != n_layer:
            raise GGUFError(f"{self.path}: key {key!r} has {kv.count} values, expected one per "
                            f"layer ({n_layer})")
        vals = [int(x) for x in kv.value.tolist()]
        if any(not 0 <= v <= 0xFFFFFFFF for v in vals):
            raise GGUFError(f"{self.path}: key {key!r}: values out of range for uint32")
        return vals

    def get(self, key: str, default=None):
        """Any value as plain Python (arrays as lists), or `default` when absent."""
        key = self._key(key)
        kv = self.kv.get(key)
        if kv is None:
            return default
        if kv.type == GGUFValueType.STRING:
            return self.get_str(key)
        if kv.type == GGUFValueType.ARRAY:
            v = self.get_arr(key)
            return v if isinstance(v, list) else v.tolist()
        return kv.value

    # ---- tensors ----
    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path}: no tensor named {name!r}") from None

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The raw bytes of a tensor: a read-only uint8 view of the mapped file (no copy)."""
        info = self.tensor_info(name)
        mm = self.parts[info.part].buffer.memmap
        return mm[info.offset: info.offset + info.nbytes]

    def tensor_array(self, name: str) -> np.ndarray:
        """A numpy view in numpy order: F32/F16/F64/I* typed with shape `info.shape`; other types
        (quantized, BF16) as uint8 with the last axis the bytes of one row."""
        info = self.tensor_info(name)
        raw = self.tensor_bytes(name)
        dtype = _PLAIN_DTYPES.get(info.type)
        shape = info.shape or (1,)
        if dtype is not None:
            return raw.view(dtype).reshape(shape)
        tr = TYPE_TRAITS[info.type]
        return raw.reshape(shape[:-1] + (info.ne[0] // tr.block_size * tr.type_size,))

    def create_tensors(self, ctx=None, names: Iterable[str] | None = None) -> dict:
        """Weight Tensors whose data is the mapped file (zero copy), in a no_alloc Context (a new
        one when `ctx` is None). Each tensor's `buffer` is the MappedBuffer of its file."""
        from pyggml.context import Context
        if ctx is None:
            ctx = Context(no_alloc=True, name="weights")
        elif not ctx.no_alloc:
            raise InvalidArgumentError("create_tensors needs a Context(no_alloc=True): weight data "
                                       "is the mapped file, not the context's arena")
        out = {}
        for name in (self.tensors if names is None else names):
            info = self.tensor_info(name)
            t = ctx.new_tensor(info.type, info.ne[:max(info.n_dims, 1)], name=name)
            buf = self.parts[info.part].buffer
            t.buffer = buf
            t.data = buf.base + info.offset
            out[name] = t
        return out

    def copy_tensors_to(self, dst_write_fn: Callable[[TensorInfo, np.ndarray], Any],
                        names: Iterable[str] | None = None, progress: bool | None = None,
                        desc: str = "loading weights") -> int:
        """Call dst_write_fn(info, src) for each tensor, src being its bytes (read-only uint8 view
        of the mapping), in file order, with a progress bar in bytes. progress: True/False, or
        None = only when stderr is a terminal. Returns the bytes copied. The backend layer uses
        this to place weights in device buffers."""
        infos = self._in_file_order(names)
        with _progress_bar(sum(i.nbytes for i in infos), progress, desc) as bar:
            for info in infos:
                dst_write_fn(info, self.tensor_bytes(info.name))
                bar(info.nbytes)
        return sum(i.nbytes for i in infos)

    def read_tensors_into(self, dst_of: Callable[[TensorInfo], np.ndarray],
                          names: Iterable[str] | None = None, progress: bool | None = None,
                          desc: str = "reading weights") -> int:
        """Read each tensor's bytes from its file into dst_of(info) (a writable uint8 array of
        info.nbytes), in file order, with copy_tensors_to's progress bar. Unlike copy_tensors_to
        this reads with read(2), not through the mapping: the file's pages end up in the page
        cache but are never mapped into this process, so its RSS holds the copy only once.
        Returns the bytes read; GGUFError naming the file and tensor if the file is now shorter
        than when it was opened."""
        infos = self._in_file_order(names)
        files: dict[int, Any] = {}
        try:
            with _progress_bar(sum(i.nbytes for i in infos), progress, desc) as bar:
                for info in infos:
                    f = files.get(info.part)
                    if f is None:
                        f = files[info.part] = open(self.paths[info.part], "rb", buffering=0)
                    view, done = memoryview(dst_of(info)).cast("B"), 0
                    f.seek(info.offset)
                    while done < info.nbytes:
                        n = f.readinto(view[done: info.nbytes])
                        if not n:
                            raise GGUFError(f"{self.paths[info.part]}: tensor '{info.name}': the "
                                            f"file ends at byte {info.offset + done}, before the "
                                            f"tensor's {info.nbytes} bytes (changed since it was "
                                            f"opened?)")
                        done += n
                    bar(info.nbytes)
        except OSError as e:
            raise GGUFError(f"{self.path}: cannot read the weights: {e.strerror or e}") from None
        finally:
            for f in files.values():
                f.close()
        return sum(i.nbytes for i in infos)

    def _in_file_order(self, names: Iterable[str] | None) -> list[TensorInfo]:
        infos = [self.tensor_info(n) for n in (self.tensors if names is None else names)]
        infos.sort(key=lambda i: (i.part, i.offset))
        return infos

    def close(self) -> None:
        """Drop this object's references to the mappings (tensors made from it keep theirs)."""
        self.parts = []
        self._str_cache.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _progress_bar:
    """A tqdm bar in bytes while weights are copied (progress True/False, or None: only when
    stderr is a terminal); calling the object advances it."""

    def __init__(self, total: int, progress: bool | None, desc: str):
        show = sys.stderr.isatty() if progress is None else bool(progress)
        self.bar = None
        if show:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False)

    def __call__(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


_PLAIN_DTYPES = {
    GGMLType.F32: np.dtype("<f4"), GGMLType.F16: np.dtype("<f2"), GGMLType.F64: np.dtype("<f8"),
    GGMLType.I8: np.dtype("<i1"), GGMLType.I16: np.dtype("<i2"), GGMLType.I32: np.dtype("<i4"),
    GGMLType.I64: np.dtype("<i8"),
}


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _with_part(info: TensorInfo, part: int) -> TensorInfo:
    return TensorInfo(info.name, info.type, info.ne, info.n_dims, info.offset, info.nbytes, part)


def _split_keys(part: GGUFPart) -> tuple[int | None, int | None, int | None]:
    """(split.no, split.count, split.tensors.count) as ints, None when absent."""
    out = []
    for key in (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT):
        kv = part.kv.get(key)
        if kv is None:
            out.append(None)
            continue
        if kv.type not in _INT_TYPES or kv.value < 0:
            raise GGUFError(f"{part.path}: key {key!r} has type {kv.type_name()} value "
                            f"{kv.value!r}, expected a non-negative integer (UINT16)")
        out.append(int(kv.value))
    return tuple(out)


def open_gguf(path: str | os.PathLike) -> GGUFModel:
    """Open a GGUF model. For a split model pass the first part (name-00001-of-0000N.gguf): every
    part is opened and checked (split.no, split.count, split.tensors.count)."""
    first = open_part(path)
    no, count, n_total = _split_keys(first)
    if count is None or count <= 1 and not no:
        if count == 1 and n_total is not None and n_total != len(first.infos):
            raise GGUFError(f"{first.path}: {SPLIT_TENSORS_COUNT} = {n_total} but the file has "
                            f"{len(first.infos)} tensors")
        return GGUFModel([first])
    m = _SPLIT_NAME.match(first.path.name)
    if no:
        hint = (f"; open {split_path(first.path.parent / m['prefix'], 0, count)}" if m else "")
        raise GGUFError(f"{first.path}: this is part {no + 1} of a {count}-part split model "
                        f"({SPLIT_NO} = {no}); open the first part{hint}")
    if m is None:
        raise GGUFError(f"{first.path}: {SPLIT_COUNT} = {count} but the name does not follow "
                        f"'<prefix>-00001-of-{count:05d}.gguf', so the other parts cannot be found")
    if int(m["count"]) != count:
        raise GGUFError(f"{first.path}: the name says {int(m['count'])} parts but "
                        f"{SPLIT_COUNT} = {count}")
    prefix = first.path.parent / m["prefix"]
    parts = [first]
    for i in range(1, count):
        p = split_path(prefix, i, count)
        if not p.exists():
            raise GGUFError(f"{first.path}: split part {i + 1} of {count} is missing: {p}")
        part = open_part(p)
        p_no, p_count, _ = _split_keys(part)
        if p_no != i or p_count != count:
            raise GGUFError(f"{p}: expected {SPLIT_NO} = {i} and {SPLIT_COUNT} = {count} "
                            f"(part {i + 1} of {count}), found {p_no} and {p_count}")
        parts.append(part)
    model = GGUFModel(parts)
    if n_total is not None and n_total != len(model.tensors):
        raise GGUFError(f"{first.path}: {SPLIT_TENSORS_COUNT} = {n_total} but the {count} parts "
                        f"hold {len(model.tensors)} tensors")
    return model
