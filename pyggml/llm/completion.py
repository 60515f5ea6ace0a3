"""Completions in llama-cpp-python's (and OpenAI's) shapes: `create_completion`,
`create_chat_completion`, their stream chunks, logprobs, usage; the request checks shared with
the server (sampling parameters, the token budget, stop strings).

A request becomes a `pyggml.llm.generate.Generation` (stop strings, UTF-8 holding-back and
every end of a generation are decided there), run by the one generation loop on the LLM's
context, with the prompt's common prefix kept (`Context.reuse_prefix`); the server runs many
at once (pyggml/server/engine.py).
"""

from __future__ import annotations

import time
import uuid
from typing import Iterator

import numpy as np

from pyggml.errors import ModelError
from pyggml.llm.chat import chat_prompt
from pyggml.llm.chatturn import ChatTurn, prompt_ids
from pyggml.llm.grammar import constraint_for, request_spec
from pyggml.llm.generate import FINISH_CONTEXT, FINISH_LENGTH, Generation, TokenLogprob, run
from pyggml.llm.sampler import SamplingParams


def normalize_stop(stop) -> list[str]:
    """`stop`: None, a string or a list of strings (OpenAI); empty strings are ignored."""
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise ModelError(f"stop must be a string or a list of strings, got {stop!r}")
    return [s for s in stop if s]


def openai_finish_reason(gen: Generation) -> str | None:
    """OpenAI's finish_reason: a full context is 'length' there."""
    return FINISH_LENGTH if gen.finish_reason == FINISH_CONTEXT else gen.finish_reason


# ---- request checks --------------------------------------------------------------------------
def sampling_params(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repeat_penalty=1.0,
                    seed=None, repeat_last_n=64, presence_penalty=0.0, frequency_penalty=0.0,
                    logit_bias=None) -> SamplingParams:
    """llama-cpp-python's / llama-server's defaults; seed None: a random one. logit_bias:
    {token id: bias} or (id, bias) pairs (pyggml/llm/sampler.py)."""
    return SamplingParams(float(temperature), int(top_k), float(top_p), float(min_p),
                          float(repeat_penalty), int(repeat_last_n),
                          0xFFFFFFFF if seed is None else int(seed) & 0xFFFFFFFF,
                          float(presence_penalty), float(frequency_penalty),
                          logit_bias or ()).validate()


def token_budget(n_prompt: int, max_tokens, n_ctx: int) -> int:
    """Tokens a completion may generate: max_tokens (None or <= 0: until the context is full).
    A prompt that leaves no room, or a max_tokens that cannot fit, is a ModelError naming the
    numbers."""
    room = n_ctx - n_prompt
    if room < 1:
        raise ModelError(f"the prompt has {n_prompt} tokens but the context holds {n_ctx} "
                         f"(n_ctx): at least one more token must fit")
    if max_tokens is None or max_tokens <= 0:
        return room
    if not isinstance(max_tokens, (int, np.integer)):
        raise ModelError(f"max_tokens must be an integer, got {max_tokens!r}")
    if n_prompt + max_tokens > n_ctx:
        raise ModelError(f"{n_prompt} prompt tokens + max_tokens {max_tokens} = "
                         f"{n_prompt + max_tokens} exceeds the context of {n_ctx} tokens (n_ctx)")
    return int(max_tokens)


# ---- OpenAI-shaped results -------------------------------------------------------------------
def usage(gen: Generation) -> dict:
    """OpenAI's usage; with speculative decoding also the drafted and accepted tokens."""
    n_prompt, n_gen = len(gen.prompt_ids), len(gen.tokens)
    out = {"prompt_tokens": n_prompt, "completion_tokens": n_gen,
           "total_tokens": n_prompt + n_gen}
    if gen.spec is not None:
        out["draft_tokens"] = gen.n_drafted
        out["draft_accepted_tokens"] = gen.n_accepted
    return out


def completion_logprobs(lps: list[TokenLogprob], start_offset: int) -> dict:
    """OpenAI's legacy completions logprobs: tokens, text_offset, token_logprobs, top_logprobs."""
    out = {"tokens": [], "text_offset": [], "token_logprobs": [], "top_logprobs": []}
    off = start_offset
    for lp in lps:
        out["tokens"].append(lp.text)
        out["text_offset"].append(off)
        out["token_logprobs"].append(lp.logprob)
        out["top_logprobs"].append({t: p for _, t, p in lp.top})
        off += len(lp.text)
    return out


def chat_logprobs(gen: Generation) -> dict:
    """OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs}, ...]}."""
    return {"content": [{"token": lp.text, "logprob": lp.logprob,
                         "bytes": list(lp.text.encode()),
                         "top_logprobs": [{"token": t, "logprob": p, "bytes": list(t.encode())}
                                          for _, t, p in lp.top]}
                        for lp in gen.token_logprobs]}


def _pieces(llm, gen: Generation, spec) -> Iterator[str]:
    """The text of a completion as it becomes safe to show (pyggml.llm.generate.run)."""
    for text in run(llm.context, gen, spec):
        if text:
            yield text


def _model_name(llm) -> str:
    return llm.path


def create_completion(llm, prompt, *, max_tokens=16, temperature=0.8, top_p=0.95, top_k=40,
                      min_p=0.05, repeat_penalty=1.0, seed=None, stop=None, logprobs=None,
                      echo=False, stream=False, seq_id=0, stop_at_eog=True, draft=None,
                      grammar=None, json_schema=None, response_format=None):
    """llama-cpp-python's Llama.create_completion: an OpenAI text_completion dict, or with
    stream=True an iterator of text_completion chunks (the last carries finish_reason).
    draft: speculative decoding, as LLM.generate's (usage then says draft_tokens and
    draft_accepted_tokens); grammar (GBNF text or a pyggml.llm.grammar.GrammarSpec),
    json_schema, response_format: the output is constrained (pyggml/llm/grammar.py)."""
    ids = llm.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise ModelError("empty prompt: at least one token is needed")
    if logprobs is not None and (not isinstance(logprobs, (int, np.integer)) or logprobs < 0):
        raise ModelError(f"logprobs must be a non-negative integer, got {logprobs!r}")
    gen = Generation(llm.tokenizer, ids, token_budget(len(ids), max_tokens, llm.n_ctx),
                     sampling_params(temperature, top_p, top_k, min_p, repeat_penalty, seed),
                     normalize_stop(stop), logprobs, stop_at_eog,
                     token_filter=constraint_for(llm, request_spec(grammar, json_schema,
                                                                   response_format)),
                     seq_id=seq_id)
    spec = llm.speculator_for(draft)
    cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
    prefix = (prompt if isinstance(prompt, str) else llm.detokenize(ids)) if echo else ""

    def chunk(text, finish, lp=None):
        return {"id": cid, "object": "text_completion", "created": created,
                "model": _model_name(llm),
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish}]}

    if stream:
        def chunks():
            if prefix:
                yield chunk(prefix, None)
            n_lp = 0
            off = len(prefix)
            for text in _pieces(llm, gen, spec):
                lp = None
                if logprobs is not None:
                    lp = completion_logprobs(gen.token_logprobs[n_lp:], off)
                    n_lp = len(gen.token_logprobs)
                off += len(text)
                yield chunk(text, None, lp)
            last = chunk("", openai_finish_reason(gen))
            last["usage"] = usage(gen)
            yield last
        return chunks()
    # several threads on one sequence: one completion after another (llama-cpp-python's
    # behaviour), never interleaved steps; a stream is the caller's to iterate, and gets
    # GeneratorInvalidatedError if another call changes its sequence meanwhile
    with llm.context.lock:
        text = "".join(_pieces(llm, gen, spec))
    out = chunk(prefix + text, openai_finish_reason(gen),
                completion_logprobs(gen.token_logprobs, len(prefix)) if logprobs is not None else None)
    out["usage"] = usage(gen)
    return out


def chat_prompt_ids(llm, template, messages) -> list[int]:
    """Token ids of the chat prompt: special tokens parsed and BOS added as the model wants,
    once (a template that writes bos_token itself does not get a second one)."""
    return prompt_ids(llm, chat_prompt(template, messages))


def create_chat_completion(llm, messages, *, chat_template=None, max_tokens=None,
                           temperature=0.8, top_p=0.95, top_k=40, min_p=0.05,
                           repeat_penalty=1.0, seed=None, stop=None, logprobs=False,
                           top_logprobs=None, stream=False, seq_id=0, draft=None, tools=None,
                           tool_choice=None, parallel_tool_calls=None, response_format=None,
                           grammar=None, json_schema=None, chat_template_kwargs=None,
                           reasoning_format=None, reasoning_budget=None):
    """llama-cpp-python's Llama.create_chat_completion: an OpenAI chat.completion dict, or with
    stream=True an iterator of chat.completion.chunk dicts (role first, then deltas of
    content / reasoning_content / tool_calls, then an empty delta with finish_reason).
    tools, tool_choice, parallel_tool_calls, response_format: OpenAI's; grammar (GBNF),
    json_schema, chat_template_kwargs, reasoning_format, reasoning_budget: llama.cpp's
    (pyggml/llm/chatturn.py)."""
    turn = ChatTurn(llm, llm.get_chat_template(chat_template), messages, tools=tools,
                    tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                    grammar=grammar, json_schema=json_schema, response_format=response_format,
                    chat_template_kwargs=chat_template_kwargs,
                    reasoning_format=reasoning_format, reasoning_budget=reasoning_budget)
    ids = turn.ids
    n_lp = (top_logprobs or 0) if logprobs else None
    gen = Generation(llm.tokenizer, ids, token_budget(len(ids), max_tokens, llm.n_ctx),
                     sampling_params(temperature, top_p, top_k, min_p, repeat_penalty, seed),
                     normalize_stop(stop), n_lp, True, token_filter=turn.token_filter(),
                     seq_id=seq_id)
    spec = llm.speculator_for(draft)
    cid, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())

    def chunk(delta, finish):
        return {"id": cid, "object": "chat.completion.chunk", "created": created,
                "model": _model_name(llm),
                "choices": [{"index": 0, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}

    if stream:
        def chunks():
            yield chunk({"role": "assistant"}, None)
            for text in _pieces(llm, gen, spec):
                for d in turn.feed(text):
                    yield chunk(d, None)
            for d in turn.finish():
                yield chunk(d, None)
            last = chunk({}, turn.finish_reason(gen))
            last["usage"] = usage(gen)
            yield last
        return chunks()
    with llm.context.lock:             # as create_completion: one after another
        for text in _pieces(llm, gen, spec):
            turn.feed(text)
    turn.finish()
    return {"id": cid, "object": "chat.completion", "created": created,
            "model": _model_name(llm),
            "choices": [{"index": 0, "message": turn.message(),
                         "logprobs": chat_logprobs(gen) if logprobs else None,
                         "finish_reason": turn.finish_reason(gen)}],
            "usage": usage(gen)}
