"""Simulated target and draft workers: real worker protocols, virtual time, sampled acceptance.

The scheduler drives them exactly as it drives the gRPC or in-process workers
(scheduler/workers.py). Each call sleeps on the simulation's clock for what the
step costs say it costs, then answers::

    SimTarget.prefill    one forward over the prompts               -> a first token each
    SimTarget.verify     one forward over roots + tree nodes        -> a path accepted by sampling
                         the trace (acceptance.py), then a bonus token
    SimDraft.prefill     one draft forward over the prompts
    SimDraft.speculate   max(k) draft forwards, the first over the newly committed tokens,
                         each later one over the chains (1 token) and trees (w tokens) still going

Token ids carry no text. A drafted node's id is its rank among its siblings (1 =
the draft's top choice), which is how the target knows which candidate its
sampled rank hits; every other token is 1, and the request's last token (its
recorded or bounded output length, ``SimBook``) is the stop token 0.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bench.simulate.acceptance import SIBLING_MISS, AcceptanceTrace, ChainSampler, request_scale
from bench.simulate.shared_processor import SharedProcessor
from bench.simulate.step_costs import StepCosts
from scheduler.workers import Clock
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem, TokenTree, VerifyItem

STOP_TOKEN = 0
TOKEN = 1


@dataclass
class SimRequest:
    kind: str
    prompt_len: int
    output_len: int  # tokens until the stop token (at most max_new_tokens)
    sampler: ChainSampler | None = None


@dataclass
class SimBook:
    """What the simulator knows of each request that a real model would read off its tokens."""

    trace: AcceptanceTrace | None
    seed: int = 0
    requests: dict[str, SimRequest] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed ^ 0xACCE)

    def add(self, request_id: str, kind: str, prompt_len: int, output_len: int, prompt: str | None = None) -> None:
        """``prompt``: the prompt's key (acceptance.prompt_key); a prompt the trace saw replays its own p_i."""
        sampler = None
        if self.trace is not None:
            seen = self.trace.prompt(prompt) is not None
            scale = 1.0 if seen else request_scale(self.trace, kind, self._rng)
            sampler = ChainSampler(self.trace, kind, scale, prompt)
        self.requests[request_id] = SimRequest(kind, prompt_len, output_len, sampler)


class _SimWorker:
    def __init__(self, costs: StepCosts, clock: Clock, processor: SharedProcessor | None = None) -> None:
        self.costs = costs
        self.clock = clock
        self.processor = processor  # shared with the other worker (one CPU), or None (devices of their own)
        self.lens: dict[str, int] = {}  # seq id -> tokens held
        self.busy_s = 0.0

    async def _spend(self, seconds: float) -> None:
        self.busy_s += seconds
        if self.processor is not None:
            await self.processor.run(seconds)
        else:
            await self.clock.sleep(seconds)

    def _forward_s(self, num_seqs: int, num_batched: int, num_context: int, verify: bool = False) -> float:
        return self.costs.forward_s(num_seqs, num_batched, num_context, verify)

    async def release(self, seq_ids: list[str]) -> None:
        for sid in seq_ids:
            self.lens.pop(sid, None)  # idempotent


class SimTarget(_SimWorker):
    def __init__(self, book: SimBook, costs: StepCosts, clock: Clock, seed: int = 0,
                 processor: SharedProcessor | None = None) -> None:  # fmt: skip
        super().__init__(costs, clock, processor)
        self.book = book
        self.rng = random.Random(seed)
        self.kv_blocks = 0

    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        tokens = sum(len(it.prompt_ids) for it in items)
        await self._spend(self.costs.call_s + self._forward_s(len(items), tokens, tokens))
        out = []
        for it in items:
            self.lens[it.seq_id] = len(it.prompt_ids) + 1
            out.append(PrefillResult(it.seq_id, self._token(it.seq_id, len(it.prompt_ids))))
        return out

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]:
        batched = sum(1 + len(it.tree) for it in items)
        context = sum(self.lens.get(it.seq_id, 0) for it in items)
        speculated = any(len(it.tree) for it in items)
        await self._spend(self.costs.call_s + self._forward_s(len(items), batched, context, speculated))
        results = []
        for it in items:
            res = self._walk(it.seq_id, it.tree)
            held = self.lens.get(it.seq_id, 0)
            res.tokens = [self._token(it.seq_id, held + i) for i in range(len(res.tokens))]
            self.lens[it.seq_id] = held + len(res.tokens)
            results.append(res)
        return results

    async def resize_kv(self, num_blocks: int) -> int:
        """Nightjar's pool growth: the simulated pool is whatever it is told (the loop keeps the budget)."""
        self.kv_blocks = num_blocks
        return num_blocks

    def _token(self, seq_id: str, position: int) -> int:
        """The token at sequence ``position``: the stop token where the request's output ends."""
        req = self.book.requests.get(seq_id)
        if req is not None and position - req.prompt_len + 1 >= req.output_len:
            return STOP_TOKEN
        return TOKEN

    def _walk(self, seq_id: str, tree: TokenTree) -> AcceptResult:
        """Accept down the tree: at each depth the target's token is the draft's rank-R candidate, R sampled."""
        n = len(tree)
        if n == 0:
            return AcceptResult(accepted_nodes=[], tokens=[TOKEN], node_status=[])
        req = self.book.requests.get(seq_id)
        sampler = req.sampler if req is not None else None
        children: dict[int, list[int]] = {}
        for i, p in enumerate(tree.parent_ids):
            children.setdefault(p, []).append(i)
        status, accepted, parent, depth = [-1] * n, [], -1, 0
        while kids := children.get(parent):
            for c in kids:
                status[c] = 0
            rank = self._target_rank(sampler, depth, max(tree.token_ids[c] for c in kids))
            hit = next((c for c in kids if tree.token_ids[c] == rank), None)
            if hit is None:
                break
            status[hit] = 1
            accepted.append(hit)
            parent, depth = hit, depth + 1
        return AcceptResult(accepted_nodes=accepted, tokens=[TOKEN] * (len(accepted) + 1), node_status=status)

    def _target_rank(self, sampler: ChainSampler | None, depth: int, max_rank: int) -> int:
        """R with P(R <= w) = 1 - (1 - p_depth) * SIBLING_MISS^(w-1) (acceptance.py); 0 = none of the top max_rank."""
        if sampler is None:
            return 0
        p = sampler.p(depth)
        u = self.rng.random()
        for w in range(1, max_rank + 1):
            if u < 1.0 - (1.0 - p) * SIBLING_MISS ** (w - 1):
                return w
        return 0


class SimDraft(_SimWorker):
    """A draft whose proposals carry the trace's acceptance as draft probabilities (what AdaServe selects by)."""

    def __init__(self, book: SimBook, costs: StepCosts, clock: Clock, reload_s: float = 0.0,
                 processor: SharedProcessor | None = None) -> None:  # fmt: skip
        super().__init__(costs, clock, processor)
        self.book = book
        self.reload_s = reload_s
        self.offloaded = False

    async def prefill(self, items: list[PrefillItem]) -> None:
        tokens = sum(len(it.prompt_ids) for it in items)
        await self._spend(self.costs.call_s + self._forward_s(len(items), tokens, tokens))
        for it in items:
            self.lens[it.seq_id] = len(it.prompt_ids)

    async def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        for it in items:
            if it.seq_id not in self.lens:
                raise KeyError(f"sequence {it.seq_id} is not held by the simulated draft")
            self.lens[it.seq_id] += len(it.new_tokens)
        trees = [self._tree(it) for it in items]
        await self._spend(self.costs.call_s + self._drafting_s(items))
        return trees

    async def offload(self) -> int:
        self.offloaded = True
        self.lens.clear()  # offload drops every sequence (scheduler/workers.py)
        return 1

    async def reload(self) -> int:
        await self._spend(self.reload_s)
        self.offloaded = False
        return 1

    def _drafting_s(self, items: list[SpecItem]) -> float:
        levels = max((it.chain_len or it.tree_depth) for it in items)
        context = sum(self.lens[it.seq_id] for it in items)
        total = self._forward_s(len(items), sum(len(it.new_tokens) for it in items), context)
        for level in range(1, levels):
            going = [it for it in items if (it.chain_len or it.tree_depth) > level]
            batched = sum(1 if it.chain_len else it.tree_width for it in going)
            context += batched
            total += self._forward_s(len(going), batched, context)
        return total

    def _tree(self, it: SpecItem) -> TokenTree:
        req = self.book.requests.get(it.seq_id)
        sampler = req.sampler if req is not None else None
        if it.chain_len:
            probs = sampler.probs(it.chain_len) if sampler is not None else [0.0] * it.chain_len
            if it.confidence_threshold > 0:  # SmartSpec App. A: stop where the draft's confidence drops
                keep = next((i for i, p in enumerate(probs) if i and p < it.confidence_threshold), len(probs))
                probs = probs[:keep]
            return TokenTree.chain([1] * len(probs), probs)
        # w candidates per level, ranks 1..w, the path going on from the top one
        w, d = it.tree_width, it.tree_depth
        probs = sampler.tree_probs(d, w) if sampler is not None else [0.0] * (d * w)
        parents = [-1 if level == 0 else (level - 1) * w for level in range(d) for _ in range(w)]
        return TokenTree(token_ids=list(range(1, w + 1)) * d, parent_ids=parents, draft_probs=list(probs))
