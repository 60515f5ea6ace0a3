"""Probes of someone coming from llama.cpp / Ollama (issue: "coming from llama.cpp"): flags exact,
llama.cpp's harmless flags accepted with a note, one refusal format, --version, -sys implying
-cnv, -f -, --no-display-prompt, sampling flags checked before the model loads, an instruct
default for chat."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pyggml.cli import main
from pyggml.cmdline import drop_harmless

PYGGML = [sys.executable, "-m", "pyggml.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _main(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("pyggml ")
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "SUPPRESS" not in out and "pull" in out and "ls" in out


@pytest.mark.parametrize("argv,flag", [
    (["bench", "-u", "json"], "-u"), (["bench", "-dd", "64"], "-dd"), (["run", "-u", "1"], "-u"),
    (["run", "-xyz"], "-xyz"), (["run", "-sm", "row"], "-sm"), (["run", "--foo"], "--foo")])
def test_flags_are_exact_and_refused_in_one_format(capsys, argv, flag):
    code, _, err = _main(capsys, *argv)
    assert code == 2
    assert f"error: unknown flag '{flag}'" in err and err.count("\n") == 1, err


def test_harmless_llamacpp_flags_are_noted_and_dropped():
    argv, notes = drop_harmless(["--jinja", "-m", "x", "-sm", "layer", "--no-mmap", "--mlock",
                                 "--embedding", "-sm", "row", "--", "--jinja"])
    # --no-mmap is honoured (the weights read into host memory), not dropped
    assert argv == ["-m", "x", "--no-mmap", "-sm", "row", "--", "--jinja"]
    assert len(notes) == 4 and all("changes nothing" in n for n in notes)


def test_sampling_flags_are_checked_before_loading(capsys):
    code, _, err = _main(capsys, "run", "-m", "/nonexistent.gguf", "--top-p", "2")
    assert code == 1 and "top_p must be in [0, 1]" in err


def test_run_f_stdin_no_display_prompt_and_sys_implies_cnv(tiny_models):
    model = os.fspath(tiny_models.get("llama"))
    r = subprocess.run(PYGGML + ["run", "-m", model, "-f", "-", "--no-display-prompt", "-n", "3",
                                 "--temp", "0", "-c", "64", "-t", "1"], input="PROMPTTEXT a b",
                       capture_output=True, text=True, timeout=120, env=ENV)
    assert r.returncode == 0, r.stderr
    assert "PROMPTTEXT" not in r.stdout
    r2 = subprocess.run(PYGGML + ["run", "-m", model, "-f", "-", "-n", "3", "--temp", "0",
                                  "-c", "64", "-t", "1"], input="PROMPTTEXT a b",
                        capture_output=True, text=True, timeout=120, env=ENV)
    assert r2.stdout.startswith("PROMPTTEXT a b") and r2.stdout.endswith(r.stdout)
    # -sys without -cnv: a conversation (llama-cli turns it on); the tiny model has no
    # template, so the chat's own error is the proof
    r = subprocess.run(PYGGML + ["run", "-m", model, "-sys", "Be brief.", "-c", "64"],
                       input="hi\n", capture_output=True, text=True, timeout=120, env=ENV)
    assert "needs a conversation" not in r.stderr and "--chat-template" in r.stderr


def test_chat_without_a_model_uses_the_instruct_default_and_answers_commands():
    r = subprocess.run(PYGGML + ["chat", "-c", "512", "-n", "8", "--temp", "0", "-t", "2"],
                       input="/regen\nSay hi.\n/regen\n/help\n/foo\n/exit\n",
                       capture_output=True, text=True, timeout=180, env=ENV)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "(nothing to regenerate yet)"
    reply = lines[1]
    assert reply.strip() and lines[2] == reply           # /regen at temperature 0: same answer
    assert lines[3].startswith("(commands: /help, /regen")
    assert lines[4] == "(unknown command /foo; /help lists the commands)"
    assert len(lines) == 5                                # no command reached the model


def test_list_devices_and_a_busy_port_fail_or_answer_before_loading(tmp_path):
    r = subprocess.run(PYGGML + ["serve", "--list-devices"], capture_output=True, text=True,
                       timeout=60, env=ENV)
    assert r.returncode == 0 and r.stdout.startswith("Available devices:\n")
    assert r.stdout.rstrip().splitlines()[-1].startswith("  CPU: ")
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # the model does not exist: the port is checked first, so the error names the port
        r = subprocess.run(PYGGML + ["serve", "-m", os.fspath(tmp_path / "absent.gguf"),
                                     "--port", str(port)], capture_output=True, text=True,
                           timeout=60, env=ENV)
    assert r.returncode == 1 and "serving" not in r.stderr
    assert r.stderr == (f"pyggml: error: cannot listen on 127.0.0.1:{port}: the address is "
                        f"already in use (--port chooses another)\n")


def test_an_unknown_kv_type_names_the_kv_types_before_loading(capsys):
    code, _, err = _main(capsys, "run", "-m", "/nonexistent.gguf", "-ctk", "q9_0")
    assert code == 1 and err.count("\n") == 1
    assert "type_k must be one of f16, f32, bf16, q8_0" in err and "'q9_0'" in err
