"""The build backend's C and shader steps (setuptools; the project's metadata is in pyproject.toml).

`pip install .`, `python -m build` and `make setup` (an editable install) come through here:

- build_ext compiles native/src/*.c into pyggml/libpyggml.so with setuptools' compiler, with the
  flags of native/Makefile (each *_avx2.c / *_avx512.c / *_amx.c / *_neon.c / *_dotprod.c with its
  own -m flags, only for its architecture; ops_*.c at -O3; -ffp-contract=off everywhere so the
  SIMD kernels repeat the scalar reference's fp32 operations). native/'s sources are not edited:
  this mirrors its Makefile, and tests/test_packaging.py compares the two source lists.
- build_shaders compiles the SPIR-V modules shaders/variants.mk lists for the backend
  (VK_SHADERS and VK_TYPED_SHADERS) into pyggml/shaders/, with a copy of variants.mk: the
  installed package reads both from there (pyggml/backend/vulkan/shaders.py, info.py). Without
  glslangValidator the wheel has no shaders and the Vulkan backend says so (as `make shaders`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from setuptools import Command, Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "native"

BASE_FLAGS = ["-std=c11", "-O2", "-g", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-function",
              "-ffp-contract=off", "-D_GNU_SOURCE", "-pthread", "-fno-strict-aliasing",
              "-UNDEBUG"]
X86_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
X86_AVX512 = X86_AVX2 + ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
ISA_FLAGS = {                       # suffix -> (architecture, flags), as native/Makefile
    "_avx2": ("x86_64", X86_AVX2),
    "_avx512": ("x86_64", X86_AVX512),
    "_amx": ("x86_64", X86_AVX512 + ["-mamx-tile", "-mamx-int8"]),
    "_neon": ("aarch64", ["-march=armv8-a"]),
    "_dotprod": ("aarch64", ["-march=armv8.2-a+dotprod"]),
}


def native_sources(arch: str) -> list[tuple[str, list[str]]]:
    """(source relative to the root, its extra flags) for a target architecture."""
    out = []
    for src in sorted((NATIVE / "src").glob("*.c")):
        stem = src.stem
        isa = next((s for s in ISA_FLAGS if stem.endswith(s)), None)
        flags = []
        if isa is not None:
            want, flags = ISA_FLAGS[isa]
            if want != arch:
                continue
        if stem.startswith("ops_"):
            flags = flags + ["-O3"]
        out.append((str(src.relative_to(ROOT)), flags))
    return out


class BuildNative(build_ext):
    """build_ext for the one ctypes library (no Python C API: a plain shared object)."""

    def get_ext_filename(self, fullname):
        parts = fullname.split(".")         # called with the full name and with the last part
        if parts[-1] == "libpyggml":
            return os.path.join(*parts[:-1], "libpyggml.so")
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        return []

    def _arch(self) -> str:
        cc = self.compiler.compiler_so[0]
        try:
            out = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True,
                                 check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            import platform
            return platform.machine()
        return out.strip().split("-")[0]

    def build_extension(self, ext):
        if ext.name != "pyggml.libpyggml":
            return super().build_extension(ext)
        arch = self._arch()
        include = [str(NATIVE / "include"), str(NATIVE / "src")]
        by_flags: dict[tuple[str, ...], list[str]] = {}
        for src, flags in native_sources(arch):
            by_flags.setdefault(tuple(flags), []).append(src)
        objects = []
        for flags, srcs in by_flags.items():
            objects += self.compiler.compile(srcs, output_dir=self.build_temp,
                                             include_dirs=include,
                                             extra_postargs=BASE_FLAGS + list(flags),
                                             depends=ext.depends)
        out = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        self.compiler.link_shared_object(objects, out, extra_postargs=["-pthread", "-lm"])


_ASSIGNMENT = re.compile(r"^([A-Z_]+)\s*:=\s*(.*)$")


def shader_variants(path: Path) -> list[tuple[str, str, list[str]]]:
    """(name, source, defines) of every module the backend loads, expanded as the Makefile does
    ('%' -> the type, '@' -> it in capitals, as the Makefile's vk_uc)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    v: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        m = _ASSIGNMENT.match(line)
        if m:
            v[m.group(1)] = m.group(2).split()
    entries = list(v.get("VK_SHADERS", []))
    for e in v.get("VK_TYPED_SHADERS", []):
        for t in v.get("VK_TYPES", []):
            entries.append(e.replace("%", t).replace("@", t.upper()))
    out = []
    for e in entries:
        name, src, defines = (e.split(":") + ["", ""])[:3]
        out.append((name, src, [d for d in defines.split("+") if d]))
    return out


class BuildShaders(Command):
    description = "compile the Vulkan shaders (shaders/variants.mk) into pyggml/shaders"
    user_options = [("build-lib=", "b", "where the package is being built")]

    def initialize_options(self):
        self.build_lib = None

    def finalize_options(self):
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def run(self):
        out = Path(self.build_lib) / "pyggml" / "shaders"
        out.mkdir(parents=True, exist_ok=True)
        variants = ROOT / "shaders" / "variants.mk"
        shutil.copyfile(variants, out / "variants.mk")
        glslang = shutil.which(os.environ.get("GLSLANG", "glslangValidator"))
        if glslang is None:
            print("build_shaders: glslangValidator not installed (apt-get install "
                  "glslang-tools); the Vulkan backend will say its shaders are missing")
            return
        from concurrent.futures import ThreadPoolExecutor

        def compile_one(item):
            name, src, defines = item
            dst = out / f"{name}.spv"
            srcp = ROOT / "shaders" / src
            deps = [srcp, variants, *(ROOT / "shaders").glob("*.glsl")]
            if dst.exists() and dst.stat().st_mtime >= max(p.stat().st_mtime for p in deps):
                return None
            r = subprocess.run([glslang, "-V", "--target-env", "vulkan1.1", *defines,
                                "-o", str(dst), str(srcp)], capture_output=True, text=True)
            return None if r.returncode == 0 else f"{name}: {r.stdout}{r.stderr}"
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            errors = [e for e in pool.map(compile_one, shader_variants(variants)) if e]
        if errors:
            raise RuntimeError("shader compile failed:\n" + "\n".join(errors))


class BuildPy(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):     # editable: `make shaders`
            self.run_command("build_shaders")


try:                                   # setuptools >= 70.1 has it; older ones through `wheel`
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:                    # pragma: no cover
    from wheel.bdist_wheel import bdist_wheel


class BdistWheel(bdist_wheel):
    """The library is loaded with ctypes (no Python C API): one wheel per platform serves every
    Python 3 (tag py3-none-<platform>)."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    ext_modules=[Extension("pyggml.libpyggml",
                           sources=[s for s, _ in native_sources("any")] +
                           sorted(str(p.relative_to(ROOT))
                                  for p in (NATIVE / "src").glob("*_*.c")
                                  if any(p.stem.endswith(k) for k in ISA_FLAGS)),
                           depends=sorted(str(p.relative_to(ROOT)) for p in
                                          [*(NATIVE / "src").glob("*.h"),
                                           *(NATIVE / "include").glob("*.h")]))],
    # not setuptools' default build/: the Makefile's outputs live there (build/native, ...)
    options={"build": {"build_base": "build/setuptools"}},
    cmdclass={"build_ext": BuildNative, "build_shaders": BuildShaders, "build_py": BuildPy,
              "bdist_wheel": BdistWheel},
)
