"""The shader list is written once (shaders/variants.mk): the Makefile compiles it and the Vulkan
backend reads it (pyggml/backend/vulkan/shaders.py) for the modules it needs; a module missing
from the build is still named. No Vulkan device needed."""

import shutil
import sys
import subprocess
from pathlib import Path

import pytest

from pyggml import settings
from pyggml.backend.vulkan import backend, shaders
from pyggml.errors import BackendError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_the_backend_needs_what_make_builds_but_the_tools_probe():
    built = subprocess.run(["make", "-s", "shader-names"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    tools = shaders.read_variables(shaders.VARIANTS_FILE.read_text())["VK_TOOL_SHADERS"]
    assert sorted(shaders.required_shaders()) == sorted(
        set(built) - {t.split(":")[0] for t in tools})
    assert "mul_mat_vec_id_q4_k_sg" in shaders.required_shaders()
    assert len(built) == len(set(built))


def test_make_logic_in_the_list_is_refused():
    with pytest.raises(BackendError, match="not a plain `NAME := words` assignment"):
        shaders.read_variables("VK_SHADERS := $(foreach t,a b,x_$(t))\n")
    assert shaders.read_variables("# c\nA := x \\\n    y   # z\n") == {"A": ["x", "y"]}


def test_a_missing_shader_is_named(tmp_path):
    names = shaders.required_shaders()
    for n in names[1:]:
        (tmp_path / f"{n}.spv").write_bytes(b"\x03\x02\x23\x07")     # the SPIR-V magic
    with settings.override(settings.Settings(shader_dir=tmp_path)):
        why = backend._check_shaders()
    assert why is not None and f"({names[0]})" in why and "make shaders" in why
    (tmp_path / f"{names[0]}.spv").write_bytes(b"\x03\x02\x23\x07")
    with settings.override(settings.Settings(shader_dir=tmp_path)):
        assert backend._check_shaders() is None


def test_the_iq_codebooks_of_the_shaders_are_the_c_tables():
    """shaders/iq_grids.glsl and pyggml/backend/vulkan/iq_grids.py are generated from
    native/src/iq_grids.h by tools/make_iq_grids_glsl.py: neither is stale."""
    r = subprocess.run([sys.executable, str(REPO / "tools" / "make_iq_grids_glsl.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
