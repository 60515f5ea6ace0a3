"""The one generation loop (pyggml/llm/generate.py): every caller gets the same tokens, the
per-step token filter reaches plain and speculative decoding alike, and whatever ends a
generation, the sequence keeps the cells plain decoding would hold.

SmolLM2-135M-Instruct (make setup) and tiny models; every wait is bounded."""
import subprocess

import numpy as np
import openai
import pytest

from pyggml.llm.completion import sampling_params
from pyggml.llm.generate import Generation, run
from pyggml.llm.runtime import LLM
from pyggml.llm.speculative import PromptLookup
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread
from support.serve_process import ENV, PYGGML

QUESTION = "Name three colors."


@pytest.fixture(scope="module")
def smol():
    return str(ensure_smollm2())


def test_one_chat_through_llm_the_chat_command_and_the_server(smol):
    """The same greedy reply from create_chat_completion, `pyggml chat` and a server slot (the
    official openai client), and from the server again while another request is served."""
    msgs = [{"role": "user", "content": QUESTION}]
    with LLM(smol, n_ctx=1024, n_threads=2, n_seq_max=2) as llm:
        direct = llm.create_chat_completion(msgs, max_tokens=24, temperature=0)
        direct = direct["choices"][0]["message"]["content"]
        llm.reset()
        rs = start_in_thread(make_server(llm, 2, "smol"))
        try:
            client = openai.OpenAI(base_url=f"http://127.0.0.1:{rs.port}/v1", api_key="none",
                                   timeout=120, max_retries=0)
            served = client.chat.completions.create(model="smol", messages=msgs,
                                                    max_tokens=24, temperature=0)
            stream = client.chat.completions.create(model="smol", messages=msgs, max_tokens=24,
                                                    temperature=0, stream=True)
            streamed = "".join(c.choices[0].delta.content or "" for c in stream
                               if c.choices)
        finally:
            rs.stop()
    cli = subprocess.run(PYGGML + ["chat", "-m", smol, "--temp", "0", "-n", "24", "-c", "1024",
                                   "-t", "2"], input=QUESTION + "\n", capture_output=True,
                         text=True, timeout=180, env=ENV)
    assert cli.returncode == 0, cli.stderr
    assert direct.strip(), "an empty reply compares nothing"
    assert served.choices[0].message.content == direct
    assert streamed == direct
    assert cli.stdout.splitlines()[0] == direct


def _banning(banned: set[int], seen: list):
    def token_filter(generated, logits):
        seen.append(len(generated))
        out = logits.copy()
        out[list(banned)] = -np.inf
        return out
    return token_filter


@pytest.mark.parametrize("draft", [None, "lookup"])
def test_the_token_filter_decides_every_token_plain_and_speculative(smol, draft):
    """A filter that forbids the tokens greedy decoding would pick: none of them comes out,
    in plain steps and in speculative rounds (a forbidden draft is rejected), and the two
    give the same tokens."""
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    with LLM(smol, n_ctx=512, n_threads=2) as llm:
        ids = llm.tokenize(prompt)
        free = [t.id for t in llm.generate(ids, 12, temperature=0)]
        banned = set(free[:3])
        seen = []
        gen = Generation(llm.tokenizer, ids, 12, sampling_params(temperature=0),
                         token_filter=_banning(banned, seen))
        spec = PromptLookup(n_max=4) if draft else None
        from pyggml.llm.speculative import Speculator
        text = "".join(run(llm.context, gen, Speculator(llm, spec) if spec else None))
        assert len(gen.tokens) == 12 and not banned & set(gen.tokens)
        assert text == llm.detokenize(gen.tokens)
        assert seen[0] == 0 and sorted(set(seen)) == list(range(12)), \
            "the filter saw every position, with the tokens generated before it"
        if draft:
            assert gen.n_drafted > 0, "no round drafted: the speculative path was not taken"
            plain = Generation(llm.tokenizer, ids, 12, sampling_params(temperature=0),
                               token_filter=_banning(banned, []))
            list(run(llm.context, plain))
            assert plain.tokens == gen.tokens
        assert llm.seq_tokens() == ids + gen.tokens[:-1]


@pytest.mark.parametrize("draft", [None, "lookup"])
def test_a_generation_closed_early_keeps_plain_decodings_cells(smol, draft):
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    with LLM(smol, n_ctx=512, n_threads=2) as llm:
        ids = llm.tokenize(prompt)
        g = llm.generate(ids, 40, temperature=0, draft=draft or False)
        got = [next(g).id for _ in range(5)]
        g.close()
        # plain decoding evaluated every handed-out token but the last; drafts past it go
        assert llm.seq_tokens() == ids + got[:4]
        assert llm.kv.n_used() == len(llm.seq_tokens())


def test_a_completion_resumes_from_the_kept_prefix(smol):
    with LLM(smol, n_ctx=512, n_threads=2) as llm:
        a = llm.create_completion("The capital of France is", max_tokens=6, temperature=0)
        n0 = llm.stats.n_prompt_reused
        b = llm.create_completion("The capital of France is", max_tokens=6, temperature=0)
        assert llm.stats.n_prompt_reused > n0
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
