"""llama.cpp's sampling flags on `pyggml run` / `chat` (pyggml/cli/args.py add_sampling_args):
each reaches the sampler with llama.cpp's meaning, bad values are one line naming the flag
before any model loads."""

from __future__ import annotations

import pytest

from pyggml.cli import main, parser
from pyggml.cli.args import sampling_from_args
from pyggml.llm.completion import sampling_params
from pyggml.llm.runtime import LLM


def _kw(*flags, cmd="run"):
    return sampling_from_args(parser().parse_args([cmd, "-m", "x.gguf", *flags]))


def test_defaults_are_llamacpps():
    p = sampling_params(**_kw())
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p, p.repeat_last_n) == \
        (0.8, 40, 0.95, 0.05, 1.0, 64)
    assert (p.mirostat, p.mirostat_tau, p.mirostat_eta) == (0, 5.0, 0.1)
    assert (p.xtc_probability, p.xtc_threshold) == (0.0, 0.1)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n,
            p.dry_sequence_breakers) == (0.0, 1.75, 2, 64, ("\n", ":", "\"", "*"))
    assert p.seed == 0xFFFFFFFF


def test_each_flag_sets_its_parameter():
    kw = _kw("--typical", "0.7", "--mirostat", "2", "--mirostat-lr", "0.3", "--mirostat-ent",
             "4", "--xtc-probability", "0.5", "--xtc-threshold", "0.2", "--dry-multiplier",
             "0.8", "--dry-base", "2", "--dry-allowed-length", "3", "--dry-penalty-last-n",
             "32", "--dry-sequence-breaker", "END", "--dry-sequence-breaker", "\n",
             "--presence-penalty", "0.5", "--frequency-penalty", "0.25", "--repeat-last-n",
             "16", "-l", "15+1", "-l", "7-inf", "--min-keep", "2", "-s", "9")
    p = sampling_params(**kw)
    assert (p.typical_p, p.mirostat, p.mirostat_eta, p.mirostat_tau) == (0.7, 2, 0.3, 4.0)
    assert (p.xtc_probability, p.xtc_threshold) == (0.5, 0.2)
    assert (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n) == \
        (0.8, 2.0, 3, 32)
    assert p.dry_sequence_breakers == ("END", "\n")
    assert (p.presence_penalty, p.frequency_penalty, p.repeat_last_n) == (0.5, 0.25, 16)
    assert p.logit_bias == ((15, 1.0), (7, float("-inf")))
    assert (p.min_keep, p.seed) == (2, 9)
    assert sampling_params(**_kw("--dry-sequence-breaker", "none")).dry_sequence_breakers == ()
    assert sampling_params(**_kw("--dry-base", "0.5")).dry_base == 1.75     # as llama.cpp


@pytest.mark.parametrize("flags,text", [
    (["--typical", "1.5"], "typical_p must be in [0, 1], got 1.5 (flag --typical)"),
    (["--mirostat", "3"], "mirostat must be 0 (off), 1 or 2, got 3 (flag --mirostat)"),
    (["--xtc-probability", "2"], "(flag --xtc-probability)"),
    (["--dry-allowed-length", "-1"], "--dry-allowed-length"),
    (["-l", "abc"], "TOKEN_ID+BIAS")])
@pytest.mark.parametrize("cmd", ["run", "chat"])
def test_bad_flags_are_one_line_before_loading(flags, text, cmd, capsys, tmp_path):
    missing = str(tmp_path / "nope.gguf")        # never opened: the flags fail first
    assert main([cmd, "-m", missing, *flags]) != 0
    err = capsys.readouterr().err
    assert text in err and "nope.gguf" not in err and "Traceback" not in err


def test_run_samples_with_the_flags(tiny_models, capsys):
    """`pyggml run` with mirostat and a seed prints what LLM.generate gives with them."""
    tm = tiny_models.get(arch="gemma3", weight_type="f32", n_layer=2)
    argv = ["run", "-m", str(tm.path), "-p", "hello", "-n", "8", "-s", "5", "--mirostat", "2",
            "--temp", "40", "--ignore-eos", "--no-warmup", "--no-display-prompt"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    with LLM(tm.path, n_threads=1) as m:
        want = "".join(t.text for t in m.generate("hello", 8, seed=5, mirostat=2,
                                                  temperature=40.0, stop_at_eog=False))
    assert out.rstrip("\n") == want
