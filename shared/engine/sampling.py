"""Turning logits into the distributions that target and draft sample from.

    logits [rows, vocab] ──/ temperature──softmax──top-k──top-p──min-p──▶ probs [rows, vocab]   (target, dense)
    logits [vocab]       ──same──top-k──▶ SparseDist [k]                           (draft, on the wire)

Losslessness rests on one rule: the target's acceptance test uses exactly the
``p`` that ``probs_from_logits`` returns, and a draft reports exactly the ``q``
it sampled from. Everything here is pure torch and runs on any device; random
draws use an explicit ``torch.Generator`` so that a per-request seed gives the
same output every time.
"""

from __future__ import annotations

import torch

from shared.engine.errors import InvalidRequestError
from shared.engine.sampling_checks import MAX_LOGPROBS, validate_sampling  # noqa: F401 - re-exported
from shared.engine.types import SamplingParams, SparseDist

DRAFT_TOP_K = 64  # tokens a draft distribution keeps; 64 * (8 + 4) bytes per row on the wire


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target probabilities for every row: softmax(logits / T), then top-k, top-p, min-p; one-hot argmax when greedy.

    ``logits`` is ``[num_rows, vocab_size]`` (any leading shape works); the
    result has the same shape, float32, each row summing to 1.
    """
    validate_sampling(params)
    logits = logits.float()  # [num_rows, vocab_size]
    if params.greedy:
        # greedy is the T -> 0 limit: all mass on the argmax (first one on ties)
        top = logits.argmax(dim=-1, keepdim=True)  # [num_rows, 1]
        return torch.zeros_like(logits).scatter_(-1, top, 1.0)
    probs = torch.softmax(logits / params.temperature, dim=-1)  # [num_rows, vocab_size]
    if 0 < params.top_k < probs.shape[-1]:
        kth = probs.topk(params.top_k, dim=-1).values[..., -1:]  # [num_rows, 1]
        probs = probs.masked_fill(probs < kth, 0.0)  # ties at the k-th value all stay
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if params.top_p < 1.0:
        probs = top_p_filter(probs, params.top_p)
    if params.min_p > 0.0:
        floor = params.min_p * probs.amax(dim=-1, keepdim=True)  # [num_rows, 1]
        probs = probs.masked_fill(probs < floor, 0.0)  # the most probable token always stays
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-probable set whose mass reaches ``top_p``, renormalised.

    A token survives iff the mass strictly ahead of it (in descending order) is
    below ``top_p``; the most probable token has nothing ahead of it, so every
    row keeps at least one token.
    """
    sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)  # [num_rows, vocab_size] each
    mass_ahead = sorted_probs.cumsum(dim=-1) - sorted_probs  # [num_rows, vocab_size]
    drop_sorted = mass_ahead >= top_p  # [num_rows, vocab_size], in sorted order
    drop = torch.empty_like(drop_sorted).scatter_(-1, sorted_ids, drop_sorted)  # back to vocab order
    probs = probs.masked_fill(drop, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator: seeded when ``seed`` is given (reproducible), else from OS entropy.

    Keep one per request for its whole life: re-creating it every step from the
    same seed would replay the same random numbers each step.
    """
    generator = torch.Generator(device="cpu")
    if seed is None:
        generator.seed()  # non-deterministic seed from std::random_device
    else:
        generator.manual_seed(seed)
    return generator


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from ``probs`` ``[vocab_size]`` with ``generator`` (probs move to its device)."""
    probs = probs.to(generator.device)  # [vocab_size]
    return int(torch.multinomial(probs, 1, generator=generator).item())


def draft_dist(logits_row: torch.Tensor, params: SamplingParams, top_k: int = DRAFT_TOP_K) -> SparseDist:
    """The distribution a sampling draft draws its proposals from, as a ``SparseDist``.

    Temperature and top-p as for the target, then only the ``top_k`` most
    probable tokens, renormalised. Truncating the draft costs nothing in
    correctness: acceptance only needs the ``q`` the draft really sampled from,
    and this is it. Zero-probability tokens are dropped, so a greedy draft
    yields a single token with probability 1.
    """
    if top_k < 1:
        raise InvalidRequestError(f"draft top_k must be >= 1, got {top_k}")
    probs = probs_from_logits(logits_row.unsqueeze(0), params)[0]  # [vocab_size]
    top_probs, top_ids = probs.topk(min(top_k, probs.numel()))  # [k] each, descending
    num_positive = int((top_probs > 0).sum())  # positives are a prefix because topk is sorted
    top_probs, top_ids = top_probs[:num_positive], top_ids[:num_positive]
    return SparseDist(token_ids=top_ids.long(), probs=top_probs / top_probs.sum())


def inverse_cdf(mass: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """mass [B, K] (rows sum to 1, most probable first; zeros only at the end), u [B] in [0, 1) -> the drawn column
    [B]: the first whose cumulative mass passes u. The draft's draw on the host and on the device alike
    (drafting.ChainDrafter, sampled_chain_step.py), so a request's proposals do not depend on which path ran."""
    cdf = mass.cumsum(-1)  # [B, K]
    at = (cdf <= u[:, None] * cdf[:, -1:]).sum(-1).clamp_max(mass.shape[1] - 1)  # [B] first cdf past u
    return torch.where(mass.gather(1, at[:, None])[:, 0] > 0, at, torch.zeros_like(at))  # rounding at the tail


def sample_sparse(dist: SparseDist, generator: torch.Generator) -> int:
    """Draw one token id from a ``SparseDist``."""
    index = torch.multinomial(dist.probs.float().to(generator.device), 1, generator=generator).item()
    return int(dist.token_ids[index])


def dense_probs(dist: SparseDist, vocab_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Scatter a ``SparseDist`` into a ``[vocab_size]`` float32 vector (repeated ids add up)."""
    dense = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # [vocab_size]
    return dense.index_add_(0, dist.token_ids.to(device).long(), dist.probs.to(device).float())
