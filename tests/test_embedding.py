"""LLM.embed against llama-cpp-python's Llama.embed (embedding mode, mean and last-token pooling,
normalized): tests/data/embedding_refs.json, made by tools/make_embed_refs.py.

SmolLM2: cosine >= 0.999 (the issue's bar). Gemma 3 270M: >= 0.995; measured 0.998-0.9996
(mean) and 0.996-0.998 (last token), the same for flash attention on and off and for the mean
without the BOS row: its final hidden states agree with llama.cpp's to the degree its logits do
(top-5 within 0.5 of ~29, tests/test_llm_gemma.py), which is the model runtime's agreement, not
the pooling's."""
import json
from pathlib import Path

import numpy as np
import pytest

from pyggml.errors import ModelError
from pyggml.llm.runtime import LLM
from pyggml.models_default import default_model_path
from pyggml.models_pypi import ensure_smollm2

REFS = json.loads((Path(__file__).parent / "data" / "embedding_refs.json").read_text())


@pytest.mark.parametrize("model,min_cos", [("SmolLM2-135M-Instruct.Q4_1.gguf", 0.999),
                                           ("gemma-3-270m-q4_k_m.gguf", 0.995)])
def test_embeddings_equal_llama_cpp(model, min_cos):
    path = ensure_smollm2() if model.startswith("Smol") else default_model_path()
    ref = REFS["models"][model]
    with LLM(path, n_ctx=512, n_threads=2) as m:
        for pooling in ("mean", "last"):
            got = np.array(m.embed(REFS["texts"], pooling=pooling))
            want = np.array(ref[pooling])
            assert got.shape == want.shape
            assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
            cos = (got * want).sum(1) / np.linalg.norm(want, axis=1)
            print(model, pooling, "cosine", np.round(cos, 5))
            assert cos.min() >= min_cos
        # a text longer than one ubatch, and the sequence is left empty
        one = m.embed("word " * 300)
        assert len(one) == m.hparams.n_embd and m.seq_tokens(0) == []
        with pytest.raises(ModelError, match="pooling must be one of"):
            m.embed(["x"], pooling="max")


def test_embedding_of_a_long_text_is_split_into_ubatches(tiny_models):
    tm = tiny_models.get(arch="llama", weight_type="f32")
    with LLM(tm.path, n_ctx=256, n_threads=1, n_ubatch=16) as small, \
            LLM(tm.path, n_ctx=256, n_threads=1, n_ubatch=128) as big:
        ids = list(range(5, 105))
        np.testing.assert_allclose(small.embed([ids])[0], big.embed([ids])[0], atol=1e-5)
