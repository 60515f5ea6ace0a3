"""Process settings read from the environment: the one place that reads PYGGML_* variables.

| variable                | values                                   | default                    |
|-------------------------|------------------------------------------|----------------------------|
| `PYGGML_CPU_PATH`       | `scalar`, `avx2`, `avx512`, `amx`, `neon`| the best path of the CPU   |
| `PYGGML_AVXVNNI`        | `0` (off) or `1`                         | `1` where the CPU has it   |
| `PYGGML_LIB`            | path of a `libpyggml.so`                 | `build/native/libpyggml.so`|
| `PYGGML_MODEL_DIR`      | folder of the default model (and of the  | `~/.cache/gemma3_270m_...`|
|                         | instruct models, pyggml/models_pypi.py)  | (`~/.cache/pyggml/models`)|
| `PYGGML_SCHED_DEBUG`    | `0`, `1` (splits) or `2` (every node)    | `0`                        |
| `PYGGML_VULKAN_DEVICES` | device indices `0` / `1,0`, or `none`    | every device               |
| `PYGGML_SHADER_DIR`     | folder of the compiled SPIR-V shaders    | `build/shaders`            |
| `PYGGML_RPC`            | rpc-servers `host:port[,host:port]`      | none                       |
| `PYGGML_RPC_TIMEOUT`    | seconds one RPC socket operation may take| `60`                       |
| `PYGGML_RPC_HASH_MIN`   | bytes from which weights go by hash first| `65536`                    |

- `PYGGML_CPU_PATH` forces the C kernel path. The C library reads it itself when it loads (its
  own tests run without Python); `pyggml._native` then applies `Settings.cpu_path` and warns if
  this CPU or build cannot run it (the best path stays in use).
- `PYGGML_AVXVNNI=0`: the C library treats the CPU as one without AVX-VNNI (read by the library
  itself when it loads): the avx2 path's prompt gemms take their AVX2-only form (maddubs +
  madd), as on CPUs without it, so both forms can be tested and measured on one machine.
- `PYGGML_SCHED_DEBUG`: 1 prints the scheduler's splits and their inputs after each split, 2 also
  every node with its backend and cause tag (a Scheduler's `debug=` argument overrides it).
- `PYGGML_VULKAN_DEVICES`: which Vulkan devices to open, in that order (`0,0` opens device 0
  twice: two backends on one GPU); `none` (or `off`, `-1`) disables Vulkan.
- `PYGGML_RPC`: llama.cpp rpc-servers whose devices the registry lists (RPC[host:port]; see
  docs/rpc.md), connected when the registry first loads its backend modules.
  `PYGGML_RPC_TIMEOUT` and `PYGGML_RPC_HASH_MIN` are the defaults of
  `pyggml.backend.rpc.register_endpoints`' timeout_s and hash_min_bytes.

When they are read: `current()` builds a Settings from the environment each time it is called,
and each engine part calls it when it is made, never at import time: the library loader when it
first loads libpyggml, a Scheduler in its constructor, Vulkan discovery when the devices are first
listed, a Vulkan context when it opens its device, `default_model_path()` when called. A variable
changed later affects only parts made later. `override(settings)` installs a Settings for code in
its `with` block instead (tests, embedding applications).

Invalid values raise SettingsError naming the variable, the value and the allowed values; empty
values mean "not set". Every variable is checked whenever settings are read, so a bad value fails
the first engine part made (even one that does not use that variable) instead of being ignored.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

from pyggml.errors import SettingsError

CPU_PATHS = ("scalar", "avx2", "avx512", "neon", "amx")     # pg_path order (native/include/pyggml.h)
SCHED_DEBUG_LEVELS = (0, 1, 2)
VULKAN_DISABLED = ("none", "off", "-1")
VARIABLES = ("PYGGML_CPU_PATH", "PYGGML_AVXVNNI", "PYGGML_LIB", "PYGGML_MODEL_DIR",
             "PYGGML_SCHED_DEBUG",
             "PYGGML_VULKAN_DEVICES", "PYGGML_SHADER_DIR", "PYGGML_RPC", "PYGGML_RPC_TIMEOUT",
             "PYGGML_RPC_HASH_MIN")


@dataclass(frozen=True)
class Settings:
    """The values of the PYGGML_* variables (see the module docstring); None = not set.

    vulkan_devices: the Vulkan device indices to open (None: every device; (): Vulkan off)."""
    cpu_path: str | None = None
    avx_vnni: bool | None = None
    lib: Path | None = None
    model_dir: Path | None = None
    sched_debug: int = 0
    vulkan_devices: tuple[int, ...] | None = None
    shader_dir: Path | None = None
    rpc_endpoints: tuple[str, ...] = ()
    rpc_timeout_s: float = 60.0
    rpc_hash_min_bytes: int = 64 << 10

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Settings":
        """Read and check every variable of `environ` (default: os.environ) now."""
        env = os.environ if environ is None else environ

        def raw(name: str) -> str | None:
            v = env.get(name)
            return v.strip() if v is not None and v.strip() else None

        def path(name: str) -> Path | None:
            v = raw(name)
            return None if v is None else Path(v).expanduser()

        return cls(cpu_path=_cpu_path(raw("PYGGML_CPU_PATH")),
                   avx_vnni=_avx_vnni(raw("PYGGML_AVXVNNI")), lib=path("PYGGML_LIB"),
                   model_dir=path("PYGGML_MODEL_DIR"),
                   sched_debug=_sched_debug(raw("PYGGML_SCHED_DEBUG")),
                   vulkan_devices=_vulkan_devices(raw("PYGGML_VULKAN_DEVICES")),
                   shader_dir=path("PYGGML_SHADER_DIR"),
                   rpc_endpoints=_rpc_endpoints(raw("PYGGML_RPC")),
                   rpc_timeout_s=_positive_float("PYGGML_RPC_TIMEOUT", raw("PYGGML_RPC_TIMEOUT"),
                                                 60.0),
                   rpc_hash_min_bytes=_byte_count("PYGGML_RPC_HASH_MIN",
                                                  raw("PYGGML_RPC_HASH_MIN"), 64 << 10))


def _cpu_path(v: str | None) -> str | None:
    if v is None:
        return None
    if v.lower() not in CPU_PATHS:
        raise SettingsError(f"PYGGML_CPU_PATH={v!r}: expected one of {', '.join(CPU_PATHS)}")
    return v.lower()


def _avx_vnni(v: str | None) -> bool | None:
    if v is None:
        return None
    if v not in ("0", "1"):
        raise SettingsError(f"PYGGML_AVXVNNI={v!r}: expected 0 or 1")
    return v == "1"


def _sched_debug(v: str | None) -> int:
    if v is None:
        return 0
    if v not in ("0", "1", "2"):
        raise SettingsError(f"PYGGML_SCHED_DEBUG={v!r}: expected 0, 1 or 2")
    return int(v)


def _vulkan_devices(v: str | None) -> tuple[int, ...] | None:
    if v is None:
        return None
    if v.lower() in VULKAN_DISABLED:
        return ()
    parts = [x.strip() for x in v.split(",")]
    if not all(x.isdigit() for x in parts):
        raise SettingsError(f"PYGGML_VULKAN_DEVICES={v!r}: expected device indices like '0' or "
                            f"'1,0', or 'none'")
    return tuple(int(x) for x in parts)


def _rpc_endpoints(v: str | None) -> tuple[str, ...]:
    if v is None:
        return ()
    out = tuple(x.strip() for x in v.split(",") if x.strip())
    for e in out:
        host, sep, port = e.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise SettingsError(f"PYGGML_RPC={v!r}: expected host:port[,host:port] with ports in "
                                f"1..65535, got {e!r}")
    return out


def _positive_float(name: str, v: str | None, default: float) -> float:
    if v is None:
        return default
    try:
        x = float(v)
    except ValueError:
        x = -1.0
    if not x > 0 or x == float("inf"):
        raise SettingsError(f"{name}={v!r}: expected a number of seconds > 0")
    return x


def _byte_count(name: str, v: str | None, default: int) -> int:
    if v is None:
        return default
    if not v.isdigit():
        raise SettingsError(f"{name}={v!r}: expected a number of bytes >= 0")
    return int(v)


_override: list[Settings] = []


def current() -> Settings:
    """The settings in effect: the innermost override(), else the environment read now."""
    return _override[-1] if _override else Settings.from_env()


@contextlib.contextmanager
def override(settings: Settings) -> Iterator[Settings]:
    """Use `settings` instead of the environment inside the `with` block (not thread-local)."""
    _override.append(settings)
    try:
        yield settings
    finally:
        _override.pop()


def child_environment() -> Mapping[str, str]:
    """The environment child processes inherit (llama.cpp's tools run by the benchmarks: what
    in it changes their behaviour is reported, pyggml.llm.bench.llamacpp_nondefaults)."""
    return os.environ
