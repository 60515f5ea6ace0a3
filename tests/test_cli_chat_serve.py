"""`pyggml chat` through a pipe and a pseudo-terminal (Ctrl-C mid-reply), and `pyggml serve` as
a process on a free loopback port. SmolLM2-135M-Instruct; every wait is bounded."""
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from support.serve_process import ENV, PYGGML, ServeProcess


@pytest.fixture(scope="module")
def smol():
    return str(ensure_smollm2())


def test_chat_through_a_pipe(smol):
    script = "What is 2+2?\n/clear\nName a colour.\nAnd another?\n/exit\nnever read\n"
    r = subprocess.run(PYGGML + ["chat", "-m", smol, "--temp", "0", "-n", "12", "-c", "1024",
                                 "-t", "2", "-v"],
                       input=script, capture_output=True, text=True, timeout=180, env=ENV)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert "(conversation cleared)" in out
    with LLM(smol, n_ctx=1024, n_threads=2) as m:
        first = m.create_chat_completion([{"role": "user", "content": "What is 2+2?"}],
                                         max_tokens=12, temperature=0)
    assert out[0] == first["choices"][0]["message"]["content"]
    stats = re.findall(r"evaluated (\d+), reused (\d+)", r.stderr)
    assert len(stats) == 3                       # three replies; "never read" after /exit
    # the third turn kept the second turn's cells: only the new messages were evaluated
    assert int(stats[2][1]) > int(stats[1][1])


def test_chat_without_a_template_names_the_option():
    # the default model of `chat` is an instruct one: the base model (Gemma 3 270M) is named
    from pyggml.models_default import ensure_default_model
    r = subprocess.run(PYGGML + ["chat", "-m", str(ensure_default_model()), "-c", "256"],
                       input="hi\n", capture_output=True,
                       text=True, timeout=120, env=ENV)
    assert r.returncode == 1 and "--chat-template" in r.stderr


def test_chat_says_when_the_context_is_full(smol):
    r = subprocess.run(PYGGML + ["chat", "-m", smol, "--temp", "0", "-c", "64", "-t", "2"],
                       input="Tell me a long story about dragons.\n" * 2, capture_output=True,
                       text=True, timeout=180, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "[context full" in r.stdout and "/clear" in r.stdout


def _read_until(fd, pattern: bytes, timeout_s: float) -> bytes:
    buf, t0 = b"", time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            if re.search(pattern, buf):
                return buf
    raise AssertionError(f"{pattern!r} not seen within {timeout_s} s; got {buf[-500:]!r}")


def test_chat_on_a_terminal_ctrl_c_stops_the_reply_not_the_program(smol):
    pid, fd = pty.fork()
    if pid == 0:                                     # the child: pyggml chat on the pty
        # as a shell starts a foreground program: SIGINT at its default and not blocked (a
        # disposition or mask the test process was left with would pass through exec)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            os.write(2, b"[test: SIGINT was ignored in the test process]\r\n")
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        os.execve(sys.executable, PYGGML + ["chat", "-m", smol, "-c", "2048", "-t", "2",
                                            "--temp", "0.8", "-s", "7"], ENV)
    try:
        _read_until(fd, rb"> ", 120)
        os.write(fd, b"Write a very long essay about the history of Europe.\r")
        _read_until(fd, rb"\r\n[^>\r\n]{20,}", 120)      # the reply is streaming
        os.write(fd, b"\x03")                            # Ctrl-C, as a terminal sends it
        out = _read_until(fd, rb"\[stopped\][\s\S]*> ", 60)
        assert b"Traceback" not in out
        os.write(fd, b"/clear\r")
        _read_until(fd, rb"conversation cleared[\s\S]*> ", 30)
        os.write(fd, b"\x04")                            # Ctrl-D: exit
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                return
            try:
                os.read(fd, 4096)
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError("pyggml chat did not exit on Ctrl-D")
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)


def test_serve_process(smol):
    with ServeProcess(["-m", smol, "-np", "2", "-c", "1024", "-t", "2", "--api-key", "k"]) as srv:
        h = {"Authorization": "Bearer k"}
        assert httpx.get(f"{srv.base}/v1/models", timeout=10).status_code == 401
        r = httpx.post(f"{srv.base}/v1/chat/completions", headers=h, timeout=60,
                       json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                             "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4
        assert r.json()["model"] == Path(smol).name
    assert "serving" in srv.stderr
