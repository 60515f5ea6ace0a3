"""Completions in llama-cpp-python's (and OpenAI's) shapes: `create_completion`,
`create_chat_completion`, their stream chunks, logprobs, usage; the request checks shared with
the server (sampling parameters, the token budget, stop strings).

A request becomes a `pyggml.llm.generate.Generation` (stop strings, UTF-8 holding-back and
every end of a generation are decided there), run by the one generation loop on the LLM's
context, with the prompt's common prefix kept (`Context.reuse_prefix`); the server runs many
at once (pyggml/server/engine.py).
"""

from __future__ import annotations

import inspect
import time
import uuid
from dataclasses import replace
from typing import Iterator

import numpy as np

from pyggml.errors import ModelError
from pyggml.llm.chat import chat_prompt
from pyggml.llm.chatturn import ChatTurn, prompt_ids
from pyggml.llm.grammar import constraint_for, request_spec
from pyggml.llm.generate import (FINISH_CONTEXT, FINISH_LENGTH, Generation, TokenLogprob,
                                 decode_step, run)
from pyggml.llm.sampler import DRY_BREAKERS, SamplingParams


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
                    logit_bias=None, typical_p=1.0, mirostat_mode=None, mirostat_tau=5.0,
                    mirostat_eta=0.1, xtc_probability=0.0, xtc_threshold=0.1,
                    dry_multiplier=0.0, dry_base=1.75, dry_allowed_length=2,
                    dry_penalty_last_n=64, dry_sequence_breakers=None, min_keep=0, tfs_z=None,
                    mirostat=None) -> SamplingParams:
    """llama-cpp-python's / llama-server's names and defaults; seed None: a random one.
    logit_bias: {token id: bias} or (id, bias) pairs; mirostat_mode (llama-cpp-python) or
    mirostat (llama-server): 0, 1 or 2; dry_sequence_breakers None: llama.cpp's defaults.
    tfs_z: accepted only off (1.0; llama.cpp removed tail-free sampling) (pyggml/llm/sampler.py)."""
    if mirostat_mode is not None and mirostat is not None and mirostat_mode != mirostat:
        raise ModelError(f"mirostat_mode {mirostat_mode!r} and mirostat {mirostat!r} disagree: "
                         f"give one")
    mode = mirostat_mode if mirostat_mode is not None else mirostat
    if tfs_z is not None and tfs_z != 1.0:
        raise ModelError(f"tfs_z {tfs_z!r}: tail-free sampling is not supported (llama.cpp "
                         f"removed it); 1.0 is off")
    num = lambda v: float(v) if isinstance(v, (int, float, np.number)) \
        and not isinstance(v, bool) else v      # noqa: E731 - a wrong type: validate names it
    return SamplingParams(num(temperature), top_k, num(top_p), num(min_p),
                          num(repeat_penalty), repeat_last_n,
                          0xFFFFFFFF if seed is None else
                          int(seed) & 0xFFFFFFFF if isinstance(seed, (int, np.integer)) else seed,
                          num(presence_penalty), num(frequency_penalty), logit_bias or (),
                          typical_p=num(typical_p), xtc_probability=num(xtc_probability),
                          xtc_threshold=num(xtc_threshold), mirostat=0 if mode is None else mode,
                          mirostat_tau=num(mirostat_tau), mirostat_eta=num(mirostat_eta),
                          dry_multiplier=num(dry_multiplier), dry_base=num(dry_base),
                          dry_allowed_length=dry_allowed_length,
                          dry_penalty_last_n=dry_penalty_last_n,
                          dry_sequence_breakers=DRY_BREAKERS if dry_sequence_breakers is None
                          else dry_sequence_breakers, min_keep=min_keep).validate()


#: the sampling keywords create_completion / create_chat_completion / LLM.generate take
SAMPLING_KEYWORDS = frozenset(inspect.signature(sampling_params).parameters)


def check_sampling_keywords(fn: str, kw: dict) -> None:
    """TypeError (as Python's own) for a keyword that is not a sampling parameter."""
    for k in kw:
        if k not in SAMPLING_KEYWORDS:
            raise TypeError(f"{fn}() got an unexpected keyword argument {k!r}")


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


# ---- several choices of one prompt (n > 1) ---------------------------------------------------
def choice_seq_ids(llm, n, seq_id: int) -> list[int]:
    """The sequences of n choices: seq_id, then the lowest other ones. ModelError when n is
    not an integer >= 1 or more than the LLM's sequences (n_seq_max)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ModelError(f"n must be an integer >= 1 (choices), got {n!r}")
    if n > llm.n_seq_max:
        raise ModelError(f"n={n} choices need {n} sequences but this LLM has n_seq_max="
                         f"{llm.n_seq_max}: open it with LLM(..., n_seq_max={n})")
    return [seq_id] + [s for s in range(llm.n_seq_max) if s != seq_id][:n - 1]


def choice_params(params: SamplingParams, i: int) -> SamplingParams:
    """Choice i's sampling: the same, with seed + i (a random seed stays random), so choice 0
    is what n=1 gives and the others differ."""
    if i == 0 or params.seed == 0xFFFFFFFF:
        return params
    return replace(params, seed=(params.seed + i) % 0xFFFFFFFF)


def choices_budget(n_prompt: int, max_tokens, n_ctx: int, n: int) -> int:
    """token_budget for n choices sharing the prompt's cells: each needs its own max_tokens
    cells (and two prompt tokens evaluated again)."""
    budget = token_budget(n_prompt, max_tokens, n_ctx)
    if n > 1 and max_tokens is not None and max_tokens > 0 and \
            n_prompt + n * (max_tokens + 2) > n_ctx:
        raise ModelError(f"{n} choices of max_tokens {max_tokens} after {n_prompt} prompt "
                         f"tokens need {n_prompt + n * (max_tokens + 2)} cells, more than the "
                         f"context of {n_ctx} tokens (n_ctx)")
    return budget


def run_choices(ctx, gens: list[Generation]) -> Iterator[tuple[int, str]]:
    """Drive several generations of one prompt, each on its own sequence, to their ends:
    (choice index, new text) after each step. The first evaluates the prompt; the others then
    hold its cells (Context.seq_copy) and evaluate only its last two tokens again (see
    Context.reuse_prefix); after that one decode per step carries every live choice. The
    other choices' sequences are forgotten at the end (their cells go back); the first keeps
    what n=1 would."""
    st = ctx.stats
    first, rest = gens[0], gens[1:]
    t0 = time.perf_counter()
    t1 = None
    try:
        with ctx.lock:
            first.start(ctx)
            first.next_input()
            yield 0, first.advance(decode_step(ctx, [first])[first.seq_id])
            for g in rest:
                ctx.seq_copy(first.seq_id, g.seq_id)
                g.start(ctx)
        st.t_prompt_s += time.perf_counter() - t0
        t1 = time.perf_counter()
        while True:
            live = [(i, g) for i, g in enumerate(gens) if not g.done]
            if not live:
                break
            with ctx.lock:
                for _, g in live:
                    g.next_input()
                outs = decode_step(ctx, [g for _, g in live])
                texts = [(i, g.advance(outs[g.seq_id])) for i, g in live]
            yield from texts
    finally:
        if t1 is not None:
            st.t_gen_s += time.perf_counter() - t1
        with ctx.lock:
            for g in gens:
                if g.ctx is not None and not g.done:
                    g.close()
            if not ctx.closed:
                for g in rest:
                    if g.ctx is not None:
                        ctx.seq_reset(g.seq_id)


def _texts(llm, gens, spec) -> Iterator[tuple[int, str]]:
    """(choice index, text) pieces of one or several choices."""
    if len(gens) == 1:
        for text in _pieces(llm, gens[0], spec):
            yield 0, text
        return
    if spec is not None:
        raise ModelError("n > 1 choices with speculative decoding are not supported: pass "
                         "draft=False")
    for i, text in run_choices(llm.context, gens):
        if text:
            yield i, text


def cache_restore(llm, ids: list[int], seq_id: int) -> None:
    """With a prompt cache (LLM.set_cache): restore the state sharing the longest prefix with
    `ids` when it covers more than the sequence holds (a state of another model is passed
    over), as llama-cpp-python does."""
    cache = getattr(llm, "cache", None)
    if cache is None:
        return
    from pyggml.llm.state import StateError, common_prefix
    try:
        state = cache[ids]
    except KeyError:
        return
    except StateError:
        return
    if common_prefix(state.tokens.tolist(), ids) > llm.context.common_prefix(ids, seq_id):
        try:
            llm.load_state(state, seq_id)
        except StateError:
            pass


def cache_store(llm, seq_id: int) -> None:
    """With a prompt cache: the sequence's state after a completion, keyed by its tokens."""
    cache = getattr(llm, "cache", None)
    if cache is not None and not llm.closed:
        with llm.lock:
            toks = llm.seq_tokens(seq_id)
            if toks:
                cache[toks] = llm.save_state(seq_id)


def create_completion(llm, prompt, *, max_tokens=16, stop=None, logprobs=None, echo=False,
                      stream=False, seq_id=0, stop_at_eog=True, draft=None, grammar=None,
                      json_schema=None, response_format=None, n=1, **sampling):
    """llama-cpp-python's Llama.create_completion: an OpenAI text_completion dict, or with
    stream=True an iterator of text_completion chunks (the last of each choice carries its
    finish_reason). Sampling keywords: sampling_params's (temperature, top_p, top_k, min_p,
    typical_p, repeat_penalty, presence_penalty, frequency_penalty, logit_bias, seed,
    mirostat_mode, mirostat_tau, mirostat_eta, llama-server's xtc_* / dry_* / repeat_last_n /
    min_keep). n: choices (OpenAI's), sharing the prompt's cells (run_choices; the LLM needs
    n_seq_max >= n; choice i samples with seed + i). draft: speculative decoding, as
    LLM.generate's (usage then says draft_tokens and draft_accepted_tokens); grammar (GBNF text
    or a pyggml.llm.grammar.GrammarSpec), json_schema, response_format: the output is
    constrained (pyggml/llm/grammar.py)."""
    check_sampling_keywords("create_completion", sampling)
    sids = choice_seq_ids(llm, n, seq_id)
    ids = llm.tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise ModelError("empty prompt: at least one token is needed")
    if logprobs is not None and (not isinstance(logprobs, (int, np.integer)) or logprobs < 0):
        raise ModelError(f"logprobs must be a non-negative integer, got {logprobs!r}")
    params = sampling_params(**sampling)
    budget = choices_budget(len(ids), max_tokens, llm.n_ctx, len(sids))
    spec_req = request_spec(grammar, json_schema, response_format)
    cache_restore(llm, ids, sids[0])
    gens = [Generation(llm.tokenizer, ids, budget, choice_params(params, i),
                       normalize_stop(stop), logprobs, stop_at_eog,
                       token_filter=constraint_for(llm, spec_req), seq_id=sid)
            for i, sid in enumerate(sids)]
    spec = llm.speculator_for(draft) if len(gens) == 1 or draft is not None else None
    cid, created = f"cmpl-{uuid.uuid4()}", int(time.time())
    prefix = (prompt if isinstance(prompt, str) else llm.detokenize(ids)) if echo else ""

    def choice(i, text, finish, lp=None):
        return {"text": text, "index": i, "logprobs": lp, "finish_reason": finish}

    def chunk(choices):
        return {"id": cid, "object": "text_completion", "created": created,
                "model": _model_name(llm), "choices": choices}

    def total_usage():
        u = usage(gens[0])
        if len(gens) > 1:
            u["completion_tokens"] = sum(len(g.tokens) for g in gens)
            u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        return u

    if stream:
        def chunks():
            n_lp, off = [0] * len(gens), [len(prefix)] * len(gens)
            if prefix:
                for i in range(len(gens)):
                    yield chunk([choice(i, prefix, None)])
            ended = [False] * len(gens)
            for i, text in _texts(llm, gens, spec):
                g, lp = gens[i], None
                if logprobs is not None:
                    lp = completion_logprobs(g.token_logprobs[n_lp[i]:], off[i])
                    n_lp[i] = len(g.token_logprobs)
                off[i] += len(text)
                yield chunk([choice(i, text, None, lp)])
                if len(gens) > 1 and g.done and not ended[i]:
                    ended[i] = True
                    yield chunk([choice(i, "", openai_finish_reason(g))])
            if len(gens) > 1:
                for i, g in enumerate(gens):
                    if not ended[i]:
                        yield chunk([choice(i, "", openai_finish_reason(g))])
                last = chunk([])
            else:
                last = chunk([choice(0, "", openai_finish_reason(gens[0]))])
            last["usage"] = total_usage()
            cache_store(llm, sids[0])
            yield last
        return chunks()
    # several threads on one sequence: one completion after another (llama-cpp-python's
    # behaviour), never interleaved steps; a stream is the caller's to iterate, and gets
    # GeneratorInvalidatedError if another call changes its sequence meanwhile
    texts = [""] * len(gens)
    with llm.context.lock:
        for i, text in _texts(llm, gens, spec):
            texts[i] += text
        cache_store(llm, sids[0])
    out = chunk([choice(i, prefix + texts[i], openai_finish_reason(g),
                        completion_logprobs(g.token_logprobs, len(prefix))
                        if logprobs is not None else None) for i, g in enumerate(gens)])
    out["usage"] = total_usage()
    return out


def chat_prompt_ids(llm, template, messages) -> list[int]:
    """Token ids of the chat prompt: special tokens parsed and BOS added as the model wants,
    once (a template that writes bos_token itself does not get a second one)."""
    return prompt_ids(llm, chat_prompt(template, messages))


def create_chat_completion(llm, messages, *, chat_template=None, max_tokens=None, stop=None,
                           logprobs=False, top_logprobs=None, stream=False, seq_id=0,
                           draft=None, tools=None, tool_choice=None, parallel_tool_calls=None,
                           response_format=None, grammar=None, json_schema=None,
                           chat_template_kwargs=None, reasoning_format=None,
                           reasoning_budget=None, n=1, **sampling):
    """llama-cpp-python's Llama.create_chat_completion: an OpenAI chat.completion dict, or with
    stream=True an iterator of chat.completion.chunk dicts (role first, then deltas of
    content / reasoning_content / tool_calls, then an empty delta with finish_reason; with
    n > 1 each choice's chunks carry its index). Sampling keywords and n: as
    create_completion's. tools, tool_choice, parallel_tool_calls, response_format: OpenAI's;
    grammar (GBNF), json_schema, chat_template_kwargs, reasoning_format, reasoning_budget:
    llama.cpp's (pyggml/llm/chatturn.py). chat_template None: the LLM's (LLM(chat_template=))
    or the model's own."""
    check_sampling_keywords("create_chat_completion", sampling)
    sids = choice_seq_ids(llm, n, seq_id)

    def new_turn():
        return ChatTurn(llm, llm.get_chat_template(chat_template), messages, tools=tools,
                        tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls,
                        grammar=grammar, json_schema=json_schema,
                        response_format=response_format,
                        chat_template_kwargs=chat_template_kwargs,
                        reasoning_format=reasoning_format, reasoning_budget=reasoning_budget)
    turns = [new_turn() for _ in sids]
    ids = turns[0].ids
    n_lp = (top_logprobs or 0) if logprobs else None
    params = sampling_params(**sampling)
    budget = choices_budget(len(ids), max_tokens, llm.n_ctx, len(sids))
    cache_restore(llm, ids, sids[0])
    gens = [Generation(llm.tokenizer, ids, budget, choice_params(params, i), normalize_stop(stop),
                       n_lp, True, token_filter=turn.token_filter(), seq_id=sid)
            for i, (sid, turn) in enumerate(zip(sids, turns))]
    spec = llm.speculator_for(draft) if len(gens) == 1 or draft is not None else None
    cid, created = f"chatcmpl-{uuid.uuid4()}", int(time.time())

    def chunk(i, delta, finish):
        return {"id": cid, "object": "chat.completion.chunk", "created": created,
                "model": _model_name(llm),
                "choices": [{"index": i, "delta": delta, "logprobs": None,
                             "finish_reason": finish}]}

    def total_usage():
        u = usage(gens[0])
        if len(gens) > 1:
            u["completion_tokens"] = sum(len(g.tokens) for g in gens)
            u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        return u

    if stream:
        def chunks():
            for i in range(len(gens)):
                yield chunk(i, {"role": "assistant"}, None)
            for i, text in _texts(llm, gens, spec):
                for d in turns[i].feed(text):
                    yield chunk(i, d, None)
            for i, (g, turn) in enumerate(zip(gens, turns)):
                for d in turn.finish():
                    yield chunk(i, d, None)
                last = chunk(i, {}, turn.finish_reason(g))
                if i == len(gens) - 1:
                    last["usage"] = total_usage()
                    cache_store(llm, sids[0])
                yield last
        return chunks()
    with llm.context.lock:             # as create_completion: one after another
        for i, text in _texts(llm, gens, spec):
            turns[i].feed(text)
        cache_store(llm, sids[0])
    for turn in turns:
        turn.finish()
    return {"id": cid, "object": "chat.completion", "created": created,
            "model": _model_name(llm),
            "choices": [{"index": i, "message": turn.message(),
                         "logprobs": chat_logprobs(g) if logprobs else None,
                         "finish_reason": turn.finish_reason(g)}
                        for i, (g, turn) in enumerate(zip(gens, turns))],
            "usage": total_usage()}
