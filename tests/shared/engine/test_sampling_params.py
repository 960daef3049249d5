"""Penalties, min_tokens, top-k, min-p and log-probabilities on the target, with and without speculation.

The reference is an independent loop over transformers' own forward: it applies each parameter as the
OpenAI / vLLM definitions read, one token at a time, so a speculative run agreeing with it shows both the
definitions and the per-row tree contexts right.
"""

from __future__ import annotations

import pytest
import torch

from shared.engine.draft_engine import DraftEngine
from shared.engine.sampling import probs_from_logits
from shared.engine.target_engine import TargetEngine
from shared.engine.types import PrefillItem, SamplingParams, SpecItem, VerifyItem

from conftest import make_runner

PROMPT = [5, 17, 17, 42, 8, 3, 17, 60]
NUM_TOKENS = 16


def reference_logits(reference, tokens: list[int], prompt_len: int, params: SamplingParams) -> torch.Tensor:
    """[vocab] the processed logits after ``tokens``, written out from the definitions."""
    logits = reference.logits(tokens)[-1].clone()
    output = tokens[prompt_len:]
    if len(output) < params.min_tokens:
        for t in params.stop_token_ids:
            logits[t] = -float("inf")
    for t in set(tokens):
        if params.repetition_penalty != 1.0:
            r = params.repetition_penalty
            logits[t] = logits[t] / r if logits[t] > 0 else logits[t] * r
    for t in set(output):
        logits[t] -= params.frequency_penalty * output.count(t) + params.presence_penalty
    return logits


def reference_greedy(reference, prompt, params, n):
    tokens = list(prompt)
    for _ in range(n):
        tokens.append(int(reference_logits(reference, tokens, len(prompt), params).argmax()))
    return tokens[len(prompt):]


def run(target: TargetEngine, draft: DraftEngine | None, params: SamplingParams, shape=None, n=NUM_TOKENS):
    """Tokens and their log-probabilities from prefill + verify steps (speculating when ``draft`` is given)."""
    first = target.prefill([PrefillItem("s", PROMPT, params)])[0]
    tokens, lps, new = [first.first_token], [first.logprobs], [first.first_token]
    if draft is not None:
        draft.prefill([PrefillItem("s", PROMPT, params)])
    while len(tokens) < n:
        tree = draft.speculate([shape(new)])[0] if draft is not None else None
        res = target.verify([VerifyItem("s", tree)] if tree is not None else [VerifyItem("s")])[0]
        tokens += res.tokens
        lps += res.logprobs or [None] * len(res.tokens)
        new = res.tokens
    return tokens[:n], lps[:n], first


SHAPES = {
    "plain": None,
    "chain3": lambda new: SpecItem("s", new, chain_len=3),
    "tree3x2": lambda new: SpecItem("s", new, tree_depth=3, tree_width=2),
}
PENALTIES = {
    "repetition": SamplingParams(repetition_penalty=1.8),
    "frequency": SamplingParams(frequency_penalty=1.5),
    "presence": SamplingParams(presence_penalty=2.0),
    "all": SamplingParams(repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.5),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", list(PENALTIES))
def test_greedy_penalties_match_the_definitions(target_model, draft_model, reference, shape, name):
    params = PENALTIES[name]
    target = TargetEngine(make_runner(target_model))
    draft = DraftEngine(make_runner(draft_model)) if SHAPES[shape] else None
    tokens, _, _ = run(target, draft, params, SHAPES[shape])
    assert tokens == reference_greedy(reference, PROMPT, params, NUM_TOKENS)
    plain, _, _ = run(TargetEngine(make_runner(target_model)), None, SamplingParams())
    assert tokens != plain  # the penalty changed the output


@pytest.mark.parametrize("shape", ["plain", "tree3x2"])
def test_min_tokens_holds_stop_ids_back(target_model, draft_model, reference, shape):
    plain, _, _ = run(TargetEngine(make_runner(target_model)), None, SamplingParams())
    stops = tuple(dict.fromkeys(plain[:3]))  # tokens greedy emits early on
    params = SamplingParams(min_tokens=6, stop_token_ids=stops)
    draft = DraftEngine(make_runner(draft_model)) if SHAPES[shape] else None
    tokens, _, _ = run(TargetEngine(make_runner(target_model)), draft, params, SHAPES[shape])
    assert not set(tokens[:6]) & set(stops)
    assert tokens == reference_greedy(reference, PROMPT, params, NUM_TOKENS)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_greedy_logprobs_are_the_targets_log_softmax(target_model, draft_model, reference, shape):
    params = SamplingParams(logprobs=5, prompt_logprobs=3)
    draft = DraftEngine(make_runner(draft_model)) if SHAPES[shape] else None
    tokens, lps, first = run(TargetEngine(make_runner(target_model)), draft, params, SHAPES[shape])
    assert tokens == reference.greedy(PROMPT, NUM_TOKENS)
    full = reference.logits(PROMPT + tokens).log_softmax(-1)  # [P + n, vocab]
    for i, (tok, lp) in enumerate(zip(tokens, lps)):
        row = full[len(PROMPT) - 1 + i]
        assert lp.token_id == tok and abs(lp.logprob - float(row[tok])) < 1e-4
        values, ids = row.topk(5)
        assert list(lp.top_ids) == ids.tolist()
        assert torch.allclose(torch.tensor(lp.top_logprobs), values, atol=1e-4)
    assert [p.token_id for p in first.prompt_logprobs] == PROMPT[1:]
    for t, p in enumerate(first.prompt_logprobs):
        assert abs(p.logprob - float(full[t, PROMPT[t + 1]])) < 1e-4 and len(p.top_ids) == 3


@pytest.mark.parametrize("shape", list(SHAPES))
def test_sampled_logprobs_are_the_distribution_sampled_from(target_model, draft_model, reference, shape):
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=3, logprobs=2, frequency_penalty=0.5)
    draft = DraftEngine(make_runner(draft_model)) if SHAPES[shape] else None
    tokens, lps, _ = run(TargetEngine(make_runner(target_model)), draft, params, SHAPES[shape])
    for i, (tok, lp) in enumerate(zip(tokens, lps)):
        context = PROMPT + tokens[:i]
        probs = probs_from_logits(reference_logits(reference, context, len(PROMPT), params)[None], params)[0]
        assert probs[tok] > 0
        assert abs(lp.logprob - float(probs[tok].log())) < 1e-4


def test_seeded_sampling_repeats_and_top_k_1_is_greedy(target_model, reference):
    params = SamplingParams(temperature=1.0, seed=11)
    a, _, _ = run(TargetEngine(make_runner(target_model)), None, params)
    b, _, _ = run(TargetEngine(make_runner(target_model)), None, params)
    assert a == b
    k1, _, _ = run(TargetEngine(make_runner(target_model)), None, SamplingParams(temperature=1.5, top_k=1, seed=2))
    assert k1 == reference.greedy(PROMPT, NUM_TOKENS)
    m1, _, _ = run(TargetEngine(make_runner(target_model)), None, SamplingParams(temperature=1.5, min_p=1.0, seed=2))
    assert m1 == k1


def test_top_k_and_min_p_filters():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs[0, 2:] == 0).all() and abs(float(probs.sum()) - 1) < 1e-6
    full = torch.softmax(logits, -1)[0]
    kept = probs_from_logits(logits, SamplingParams(temperature=1.0, min_p=0.3))[0]
    assert ((kept > 0) == (full >= 0.3 * full.max())).all()
