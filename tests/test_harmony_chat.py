"""gpt-oss's harmony replies in a chat turn (pyggml/llm/chatturn.py): the analysis channel is
reasoning_content, only the text of the final message is content — no header, channel or end
marker reaches either — in LLM.create_chat_completion (whole and streamed), `pyggml chat` and
the server; reasoning_format "none" keeps the raw text.

The reply is forced with a grammar (SmolLM2-135M-Instruct does not speak harmony) under
gpt-oss's own chat template (tests/data/templates/openai-gpt-oss-120b.jinja): the chat path
decides everything from the template, so the turn is the one a gpt-oss model gets."""
import subprocess
from pathlib import Path

import httpx
import pytest

from pyggml.llm.chat import ChatTemplate
from pyggml.llm.chatturn import ChatTurn
from pyggml.llm.runtime import LLM
from pyggml.models_pypi import ensure_smollm2
from pyggml.server import make_server, start_in_thread
from support.serve_process import ENV, PYGGML

TEMPLATE = Path(__file__).parent / "data" / "templates" / "openai-gpt-oss-120b.jinja"
ANALYSIS, FINAL = "User asks for the capital. It is Paris.", "The capital of France is Paris."
REPLY = (f"<|channel|>analysis<|message|>{ANALYSIS}<|end|>"
         f"<|start|>assistant<|channel|>final<|message|>{FINAL}")
GRAMMAR = 'root ::= "' + REPLY + '"'
MSGS = [{"role": "user", "content": "What is the capital of France?"}]


class _Tokenizer:
    bos_id = None


class _NoModel:
    """What ChatTurn asks of a model when no generation runs."""
    tokenizer = _Tokenizer()

    def tokenize(self, text):
        return [0]


@pytest.mark.parametrize("chunk", [1, 3, 7, 1000])
def test_turn_splits_analysis_from_final_however_the_text_streams(chunk):
    t = ChatTurn(_NoModel(), ChatTemplate(TEMPLATE.read_text(), "gpt-oss"), MSGS)
    reply = (f"<|channel|>analysis<|message|>{ANALYSIS}<|end|><|start|>assistant<|channel|>"
             f"commentary<|message|>Let me answer.<|end|><|start|>assistant<|channel|>final"
             f"<|message|>{FINAL}<|return|>")
    deltas = []
    for i in range(0, len(reply), chunk):
        deltas += t.feed(reply[i:i + chunk])
    deltas += t.finish()
    msg = t.message()
    assert msg["reasoning_content"] == ANALYSIS
    # a commentary preamble is text for the user too (harmony's "preamble"), then the final
    assert msg["content"] == "Let me answer." + FINAL
    assert all("<|" not in v for d in deltas for v in d.values() if isinstance(v, str))
    assert "".join(d.get("content", "") for d in deltas) == msg["content"]
    raw = ChatTurn(_NoModel(), ChatTemplate(TEMPLATE.read_text(), "gpt-oss"), MSGS,
                   reasoning_format="none")
    raw.feed(reply)
    raw.finish()
    assert raw.message()["content"] == reply and "reasoning_content" not in raw.message()


@pytest.fixture(scope="module")
def smol():
    with LLM(ensure_smollm2(), n_ctx=1024, n_threads=2) as m:
        yield m


def test_llm_chat_completion_whole_and_streamed(smol):
    kw = dict(chat_template=str(TEMPLATE), grammar=GRAMMAR, max_tokens=80, temperature=0)
    msg = smol.create_chat_completion(MSGS, **kw)["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (ANALYSIS, FINAL)
    reasoning = content = ""
    for c in smol.create_chat_completion(MSGS, stream=True, **kw):
        d = c["choices"][0]["delta"]
        reasoning += d.get("reasoning_content") or ""
        content += d.get("content") or ""
    assert (reasoning, content) == (ANALYSIS, FINAL)


def test_server_reply_is_the_final_channel(smol):
    rs = start_in_thread(make_server(smol, 1, "gpt-oss-like", chat_template=str(TEMPLATE)))
    try:
        r = httpx.post(f"http://127.0.0.1:{rs.port}/v1/chat/completions", timeout=120,
                       json={"messages": MSGS, "grammar": GRAMMAR, "max_tokens": 80,
                             "temperature": 0})
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == (ANALYSIS, FINAL)
    finally:
        rs.stop()


def test_cli_chat_prints_the_final_channel(tmp_path):
    g = tmp_path / "harmony.gbnf"
    g.write_text(GRAMMAR)
    r = subprocess.run(PYGGML + ["chat", "-m", str(ensure_smollm2()), "--temp", "0", "-n", "80",
                                 "-c", "1024", "-t", "2", "--chat-template", str(TEMPLATE),
                                 "--grammar-file", str(g)],
                       input=MSGS[0]["content"] + "\n/exit\n", capture_output=True, text=True,
                       timeout=180, env=ENV)
    assert r.returncode == 0, r.stderr
    # through a pipe the reasoning is left out: the one line printed is the final message
    assert r.stdout.splitlines()[0] == FINAL
