"""The package as a user installs it: a wheel built by the build backend (setup.py compiles the C
library and the shaders), installed into a fresh virtualenv outside the repository, and every
command run from another folder, with nothing read from the source tree.

The venv gets the wheel only (--no-deps); the dependencies are this interpreter's, reached
through a .pth line that names this environment's site-packages folder (a folder named in a .pth
file is not a site folder itself, so this environment's editable install of the checkout is not
seen there). One build (about a minute on two cores) serves every check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import httpx
import pytest

from pyggml.models_pypi import ensure_smollm2

ROOT = Path(__file__).resolve().parents[1]


def _clean_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PYGGML_") and k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONUNBUFFERED"] = "1"
    # the models stay where this machine caches them (not fetched again); nothing else is shared
    if "PYGGML_MODEL_DIR" in os.environ:
        env["PYGGML_MODEL_DIR"] = os.environ["PYGGML_MODEL_DIR"]
    return env


def _install(tmp: Path) -> dict:
    wheels = tmp / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                        "--disable-pip-version-check", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = wheels.glob("pyggml-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q",
                        "--no-deps", "--no-index", "--disable-pip-version-check", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return {"bin": env_dir / "bin", "py": py, "cwd": cwd, "env": _clean_env(tmp),
            "wheel": wheel}


def _run(inst, args, **kw):
    kw.setdefault("timeout", 240)
    return subprocess.run([str(inst["bin"] / "pyggml"), *args], cwd=inst["cwd"],
                          env=inst["env"], capture_output=True, text=True, **kw)


def _the_wheel_carries_the_library_and_the_shaders(installed):
    import zipfile
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    assert "pyggml/libpyggml.so" in names
    assert "pyggml/shaders/variants.mk" in names
    assert "pyggml/server/web/index.html" in names
    assert installed["wheel"].name.startswith("pyggml-") and "-py3-none-" in installed["wheel"].name
    if any(n.endswith(".spv") for n in names):         # glslangValidator was there
        from pyggml.backend.vulkan.shaders import required_shaders
        assert {f"pyggml/shaders/{s}.spv" for s in required_shaders()} <= set(names)


def _installed_package_reads_nothing_from_the_checkout(installed):
    code = ("import pyggml, pyggml._native as n, pyggml.backend.vulkan.info as vi, "
            "pyggml.backend.vulkan.shaders as vs, json; n.lib(); "
            "print(json.dumps([pyggml.__file__, n._lib._name, str(vi.shader_dir()), "
            "str(vs.VARIANTS_FILE), len(vs.required_shaders())]))")
    r = subprocess.run([str(installed["py"]), "-c", code], cwd=installed["cwd"],
                       env=installed["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    paths = json.loads(r.stdout)
    venv_dir = str(installed["bin"].parent)
    for p in paths[:4]:
        assert p.startswith(venv_dir), (p, paths)
        assert not p.startswith(str(ROOT))
    assert paths[4] > 10


def _installed_commands_work_from_another_folder(installed):
    r = _run(installed, ["--version"])
    assert r.returncode == 0 and r.stdout.startswith("pyggml "), r.stderr
    smol = str(ensure_smollm2())
    r = _run(installed, ["run", "-m", smol, "-p", "The capital of France is", "-n", "4",
                         "--temp", "0", "-t", "2", "-c", "256"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    r = _run(installed, ["chat", "-m", smol, "--temp", "0", "-n", "6", "-c", "512", "-t", "2"],
             input="Hello\n/exit\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    r = _run(installed, ["plan", "-m", smol])
    assert r.returncode == 0, r.stderr
    r = _run(installed, ["mem", "-m", smol, "-c", "256"])
    assert r.returncode == 0, r.stderr
    r = _run(installed, ["bench", "kernels", "--types", "q4_0"])
    assert r.returncode != 0 and "source checkout" in r.stderr and "\n" not in r.stderr.strip()


def _installed_server_answers_the_openai_client(installed):
    import signal
    import socket
    import time
    openai = pytest.importorskip("openai")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(installed["bin"] / "pyggml"), "serve", "-m",
                             str(ensure_smollm2()), "--port", str(port), "-np", "1", "-c", "512",
                             "-t", "2"], cwd=installed["cwd"], env=installed["env"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        t_end = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < t_end, proc.stderr.read()[-2000:]
            time.sleep(0.3)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        out = client.chat.completions.create(model="m", max_tokens=4, temperature=0,
                                             messages=[{"role": "user", "content": "Hi"}])
        assert out.choices[0].message.content
        assert httpx.get(f"{base}/", timeout=10).status_code == 200     # the web page
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


def test_a_wheel_installed_outside_the_checkout_works(tmp_path):
    """One build and one install (a test, not a fixture: xdist workers would build it twice)."""
    inst = _install(tmp_path)
    _the_wheel_carries_the_library_and_the_shaders(inst)
    _installed_package_reads_nothing_from_the_checkout(inst)
    _installed_commands_work_from_another_folder(inst)
    _installed_server_answers_the_openai_client(inst)
