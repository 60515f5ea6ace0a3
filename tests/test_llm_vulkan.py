"""The model runtime with layers offloaded to Vulkan (lavapipe in CI): -ngl places weights and
KV on the device, the scheduler splits the graph, results agree with the CPU, and Gemma 3 fully on
Vulkan gives llama.cpp's greedy tokens. Skips only where no Vulkan device exists."""
import numpy as np
import pytest

from pyggml.backend import vulkan
from pyggml.errors import ConfigError
from pyggml.llm.runtime import LLM

pytestmark = pytest.mark.skipif(vulkan.unavailable_reason() is not None,
                                reason=f"no Vulkan device: {vulkan.unavailable_reason()}")

PROMPT = [2, 17, 99, 5, 300, 41, 7, 8, 250, 3, 77, 12, 19]


@pytest.mark.parametrize("ngl", [2, 99])
def test_tiny_model_offloaded_matches_cpu(tiny_models, ngl):
    tm = tiny_models.get(arch="gemma3", weight_type="f16")
    with LLM(tm.path, n_ctx=64, n_threads=1, type_k="f32", type_v="f32") as cpu:
        ref = [cpu.eval(PROMPT)] + [cpu.eval([t]) for t in (5, 6, 7)]
    with LLM(tm.path, n_ctx=64, n_threads=1, n_gpu_layers=ngl, type_k="f32", type_v="f32",
             device="Vulkan0") as g:
        dev = g.backends[0].device.name
        assert dev.lower().startswith("vulkan")
        on_gpu = [n for n, p in g.offload.weights.items() if p.device == dev]
        # llama.cpp's -ngl: the last N of the n_layer + 1 slots (the output is the last)
        assert "blk.1.attn_q.weight" in on_gpu
        assert ("blk.0.attn_q.weight" in on_gpu) == (ngl > 2)
        assert "output.weight" in on_gpu                                   # tied: duplicated
        assert g.weights["blk.1.attn_q.weight"].buffer is g.weight_buffers[dev]
        got = [g.eval(PROMPT)] + [g.eval([t]) for t in (5, 6, 7)]
        # all of layer 0 on the device (ngl 99): the token lookup reads the tied output's copy
        # there, so the whole graph is one device split; else the lookup is on the CPU
        assert (g.run.embd_lookup is g.weights["output.weight"]) == (ngl > 2)
        assert g.sched["prefill"].get_n_splits() == (1 if ngl > 2 else 2)
        # F16 weights, F32 activations on the device vs the CPU's F16-converted activations
        for a, b in zip(got, ref):
            assert np.max(np.abs(a - b)) <= 2e-2 * np.max(np.abs(b))
            assert int(np.argmax(a)) == int(np.argmax(b))


def test_no_gpu_layers_means_no_device_backend(tiny_models):
    tm = tiny_models.get(arch="llama", weight_type="q8_0")
    with LLM(tm.path, n_ctx=32, n_threads=1) as m:
        assert [b.name for b in m.backends] == ["CPU"]
    with pytest.raises(ConfigError, match="-ngl must be >= 0"):
        LLM(tm.path, n_ctx=32, n_gpu_layers=-1)


def test_gemma_fully_on_vulkan_gives_llamacpp_greedy_tokens():
    # "The capital of France is": llama.cpp's greedy ids; its top-1/top-2 margin first drops
    # under 0.5 at step 4, so the first 4 must agree (tests/test_llm_gemma.py has the details)
    ref = [506, 5279, 529, 506, 2891, 529, 7001, 236761]
    with LLM(n_ctx=512, n_threads=2, n_gpu_layers=99, device="Vulkan0") as m:
        assert all(p.device != "CPU" for n, p in m.offload.weights.items()
                   if n.startswith("blk.") or n.startswith("output"))
        logits = m.eval(m.tokenize("The capital of France is"))
        top = [int(i) for i in np.argsort(-logits)[:3]]
        assert top == [506, 496, 9079]
        assert abs(float(logits[506]) - 19.1317) < 0.5
        got = [t.id for t in m.generate("The capital of France is", 6, temperature=0,
                                        stop_at_eog=False)]
    assert got[:4] == ref[:4]
