"""Adversarial command lines, as a new user (llama.cpp habits) or an attacker would type them:
each gives its exit status (2 for usage errors), a message that starts with `pyggml` and names
what was wrong, and never a traceback. Commands that load a model use a tiny one."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyggml.cli import main

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"


@pytest.fixture(scope="module")
def tiny(tiny_models):
    return str(tiny_models.get(arch="llama", weight_type="q8_0").path)


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny):
    d = tmp_path_factory.mktemp("probes")
    (d / "prompt.txt").write_bytes(b"Once upon a time\n")
    (d / "notes.txt").write_text("not a model\n")
    return d


# (argv, exit status, text the error must contain); {m}: the tiny model, {d}: a folder of files
PROBES = [
    # llama.cpp spellings: taken, or refused by their own name
    (["run", "-m", "{m}", "-cnv"], 1, "--chat-template"),     # a model without a template
    # llama-cli: -sys turns the conversation on (the tiny model has no template: its error)
    (["run", "-m", "{m}", "-sys", "be brief"], 1, "--chat-template"),
    (["run", "-m", "{m}", "-sys", "be brief", "-no-cnv"], 2, "needs a conversation"),
    (["chat", "-m", "{m}", "-xyz"], 2, "unknown flag '-xyz'"),
    (["serve", "-m", "{m}", "--port", "http"], 2, "port number 1..65535"),
    (["run", "-m", "{m}", "-sm", "row"], 2, "split mode"),
    (["run", "-m", "{m}", "-np", "0"], 2, "-np/--parallel: expected an integer >= 1, got '0'"),
    (["serve", "-m", "{m}", "-np", "x"], 2, "-np/--parallel: expected an integer >= 1"),
    (["run", "-m", "{m}", "--virtual-device", "a=1GiB"], 2, "planning only: pyggml plan"),
    (["run", "-m", "{m}", "--lookup", "--draft-max", "0"], 2, "--draft-max/--draft"),
    (["run", "-m", "{m}", "--lookup", "--draft-min", "-1"], 2, "expected an integer >= 0"),
    (["run", "-m", "{m}", "--lookup", "--lookup-ngram", "x"], 2, "expected an integer >= 1"),
    (["run", "-m", "{m}", "--lookup-ngram", "4"], 2, "it needs --lookup"),
    (["run", "-m", "{m}", "-md", "{m}", "--draft-p-min", "2"], 2, "a probability 0..1"),
    (["serve", "-m", "{m}", "--step-ms", "-5"], 2, "expected milliseconds >= 0"),
    (["run", "-m", "{m}", "-md", "{d}/notes.txt", "-n", "1"], 1, "notes.txt"),
    (["chat", "-m", "{m}", "--assume-device=a=1GiB"], 2, "--assume-device is not a flag"),
    (["run", "-m", "{m}", "-mg", "1"], 2, "main GPU"),
    (["run", "-m", "{m}", "-xyz", "1"], 2, "unknown flag '-xyz'"),
    (["run", "-m", "{m}", "-ctk", "q4_k", "-n", "1"], 1, "type_k must be one of"),
    (["run", "-m", "{m}", "-ctv", "bogus", "-n", "1"], 1, "bogus"),
    (["run", "-m", "{m}", "-dev", "nope", "-n", "1"], 1, "unknown device 'nope'"),
    (["run", "-m", "{m}", "-ts", "1,1", "-n", "1"], 1, "tensor_split"),
    (["run", "-m", "{m}", "-ts", "a,b", "-n", "1"], 1, "-ts 'a,b'"),
    (["run", "-m", "{m}", "-ngl", "-1"], 1, "-ngl must be >= 0"),
    (["run", "-m", "{m}", "-ngl", "abc"], 2, "invalid int value: 'abc'"),
    (["run", "-m", "{m}", "-n", "-5"], 2, "-n -5"),
    (["run", "-m", "{m}", "-f", "{d}/missing.txt"], 1, "cannot read the prompt file"),
    (["run", "-m", "{m}", "-fa", "maybe"], 2, "invalid choice: 'maybe'"),
    (["run", "-m", "{m}", "--prompt-cache", "x"], 2, "unknown flag '--prompt-cache'"),
    (["run", "-m", "{m}", "--tem", "0"], 2, "unknown flag '--tem'"),     # no abbreviation
    (["run", "-m", "{m}", "-c", "-5"], 1, "n_ctx must be a positive integer"),
    (["run", "-m", "{m}", "-ub", "0", "-n", "1"], 1, "n_ubatch must be a positive integer"),
    (["run", "-m", "{m}", "-b", "0", "-n", "1"], 1, "n_batch must be a positive integer"),
    (["run", "-m", "{d}/missing.gguf"], 1, "missing.gguf"),
    (["run", "-m", "{d}/notes.txt"], 1, "notes.txt"),
    (["run", "-m", "{d}"], 1, "pyggml: error"),
    (["run", "-m", "{m}", "-c", "{d}/missing.yaml"], 1, "missing.yaml"),
    (["run", "-m", "{m}", "-ot", "noequal"], 1, "expected REGEX=DEVICE"),
    (["run", "-m", "{m}", "-ot", "[=CPU"], 1, "invalid regex"),
    (["run", "-m", "{m}", "--set", "nokey"], 1, "nokey"),
    (["run", "-m", "{m}", "--set", "gpu_layers=many"], 1, "gpu_layers"),
    # other commands
    (["bench", "-m", "{m}", "-r", "0"], 2, "-r 0"),
    (["bench", "-m", "{m}", "-p", "0", "-n", "0"], 2, "nothing to measure"),
    (["bench", "-m", "{m}", "-t", "0"], 2, "thread counts >= 1"),
    (["bench", "-m", "{m}", "-p", "abc"], 2, "comma-separated integers"),
    (["bench", "-m", "{m}", "-t", "1,x"], 2, "comma-separated integers"),
    (["bench", "-m", "{m}", "-n", "-2"], 2, "token counts >= 0"),
    (["serve", "-m", "{m}", "--port", "99999"], 2, "port number 1..65535"),
    (["plan", "-m", "{m}", "--emit-yaml", "{d}/no/such/dir/x.yaml"], 1, "cannot write"),
    (["plan", "-m", "{m}", "-ub", "0"], 1, "n_ubatch"),
    (["plan", "-m", "{m}", "-c", "-3"], 1, "n_ctx"),
    (["plan", "-m", "{m}", "--virtual-device", "=1GiB"], 1, "expected NAME=SIZE"),
    (["plan", "-m", "{m}", "--virtual-device", "gpu=lots"], 1, "'lots'"),
    (["plan", "-m", "{m}", "--virtual-device", "cpu=1GiB"], 1, "the CPU always exists"),
    (["plan", "-m", "{m}", "--virtual-device", "x=1GiB:tpu"], 1, "kind must be 'gpu' or 'igpu'"),
    (["plan", "-m", "{m}", "--assume-device", "x=-1"], 1, "'-1'"),
    (["plan", "-m", "{m}", "-ngl", "99", "-dev", "none"], 1, "names no GPU"),
    (["mem", "-m", "{m}", "--plan-only", "--json", "{d}/no/such/dir/x.json"], 1, "cannot write"),
    (["mem", "-m", "{m}", "--fit", "--budget", "nosize"], 1, "expected DEVICE=SIZE"),
    (["mem", "-m", "{m}", "--fit", "--budget", "CPU=lots"], 1, "'lots'"),
    (["mem", "-m", "{m}", "--budget", "nosize"], 1, "expected DEVICE=SIZE"),
    (["mem", "-m", "{m}", "--budget", "CPU=2GiB"], 1, "add --fit"),
    (["mem", "-m", "{m}", "--warmup", "bogus"], 2, "invalid choice: 'bogus'"),
    (["mem", "-m", "{m}", "--sweep-ctx", "a,b"], 2, "comma-separated integers"),
    (["mem", "-m", "{m}", "--plan-only", "-c", "-1"], 1, "n_ctx"),
    (["graph", "--dot", "{d}/no/such/dir/g.dot"], 1, "cannot write"),
    (["run", "-m", "{m}", "-c", "100000000", "-n", "1"], 1, "would fit"),
    (["run", "-m", "{m}", "-t", "300"], 1, "got 300"),
    (["run", "-m", "{m}", "-tb", "300"], 1, "got 300"),
    (["run", "-m", "{m}", "-t", "-2"], 1, "got -2"),
    (["bench", "-m", "{m}", "-t", "-1", "-p", "8", "-n", "0", "-r", "1"], 2, "thread counts >= 1, got '-1'"),
    (["info", "extra"], 2, "unrecognized arguments"),
    (["nosuchcommand"], 2, "invalid choice: 'nosuchcommand'"),
    ([], 2, "required"),
]


def _fill(argv, m, d):
    return [a.format(m=m, d=d) for a in argv]


@pytest.mark.parametrize("argv,status,text", PROBES, ids=[" ".join(p[0]) or "(none)"
                                                         for p in PROBES])
def test_probe(argv, status, text, tiny, files, capsys):
    rc = main(_fill(argv, tiny, files))
    out, err = capsys.readouterr()
    assert rc == status, err
    assert text in err, err
    first = err.strip().splitlines()[0]
    assert first.startswith("pyggml"), err
    assert "Traceback" not in err and "Traceback" not in out


# command lines that must work
WORKS = [
    (["run", "-m", "{m}", "-t2", "-c64", "-n", "2", "--temp", "0", "--no-warmup"], "generation"),
    (["run", "-m", "{m}", "-f", "{d}/prompt.txt", "-n", "1", "--temp", "0"], "generation"),
    (["run", "-m", "{m}", "-no-cnv", "-n", "1"], "generation"),
    (["run", "-m", "{m}", "-np", "2", "--swa-full", "-n", "1", "-ctk", "f32", "-ctv", "f32"],
     "generation"),
    (["run", "-m", "{m}", "--temp", "-1", "-n", "1"], "generation"),    # llama.cpp: greedy
    (["plan", "-m", "{m}", "-c", "0"], ""),                             # trained context
    (["bench", "-m", "{m}", "-p", "0,8", "-n", "0", "-r", "1", "-t", "1"], ""),  # 0: skipped
    (["run", "-m", "{m}", "--seed", "-1", "-n", "2"], "generation"),     # llama.cpp: random
    (["run", "-m", "{m}", "-c", "16", "-n", "-1", "--ignore-eos"], "the context is full"),
    (["plan", "-m", "{m}", "-c", "2048", "-c", str(CONFIGS / "cpu-only.yaml")], ""),
]


@pytest.mark.parametrize("argv,text", WORKS, ids=[" ".join(p[0]) for p in WORKS])
def test_works(argv, text, tiny, files, capsys):
    assert main(_fill(argv, tiny, files)) == 0
    assert text in capsys.readouterr().err


def test_prompt_escapes_are_processed_as_llama_cpp(tiny, capsys):
    assert main(["run", "-m", tiny, "-p", "a\\nb\\tc", "-n", "1", "--temp", "0"]) == 0
    assert capsys.readouterr().out.startswith("a\nb\tc")
    assert main(["run", "-m", tiny, "-p", "a\\nb", "--no-escape", "-n", "1"]) == 0
    assert capsys.readouterr().out.startswith("a\\nb")


def test_reverse_prompt_stops_generation(capsys):
    argv = ["run", "-p", "hello", "-n", "24", "--temp", "0", "--ignore-eos", "--no-warmup"]
    assert main(argv) == 0
    full = capsys.readouterr().out[len("hello"):]
    stop = full[:2]
    assert len(full) > 8 and stop
    assert main(argv + ["-r", stop]) == 0
    out = capsys.readouterr()
    cut = out.out[len("hello"):]
    assert cut.startswith(stop) and len(cut) < len(full)
    # the stats count the steps taken before the stop (they said 0.0 t/s: the loop's time was
    # added only when the iterator was collected)
    assert " | generation " in out.err and " 0.0 t/s" not in out.err


def _cli(*argv, **kw):
    return subprocess.run([sys.executable, "-m", "pyggml.cli", *argv], capture_output=True,
                          timeout=120, **kw)


def test_a_closed_pipe_is_quiet(tiny):
    p = subprocess.Popen([sys.executable, "-m", "pyggml.cli", "run", "-m", tiny, "-n", "64",
                          "--ignore-eos", "--temp", "0"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.read(3)
    p.stdout.close()                             # `| head -c 3`
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) in (0, 141) and "Traceback" not in err


def test_unwritable_model_cache_is_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = dict(os.environ, PYGGML_MODEL_DIR=str(blocker / "models"))    # even root cannot
    r = _cli("plan", env=env)
    err = r.stderr.decode()
    assert r.returncode == 1 and "PYGGML_MODEL_DIR" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_prompt_that_is_not_utf8(tiny):
    r = subprocess.run([sys.executable, "-m", "pyggml.cli", "run", "-m", tiny, "-n", "2",
                        "-p", os.fsdecode(b"caf\xe9 \xff\xfe ok")], capture_output=True,
                       timeout=120)
    assert r.returncode == 0 and b"Traceback" not in r.stderr and b"generation" in r.stderr


def test_a_bug_is_one_line_with_what_to_report(monkeypatch, capsys):
    from pyggml.cli import info

    def broken(args):
        raise RuntimeError("boom")
    monkeypatch.setattr(info, "cmd_info", broken)
    assert main(["info"]) == 70
    err = capsys.readouterr().err
    assert err.strip() == ("pyggml: internal error: RuntimeError: boom (please report it with "
                           "the command line)")
