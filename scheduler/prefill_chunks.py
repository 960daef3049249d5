"""The loop's side of chunked prefill: which requests are mid-prefill, and the chunks each step runs.

    admit ──▶ take(new): prompts longer than one chunk start a chunked prefill here (shorter ones: the loop's
              one-piece prefill, as before); they stay in the loop's running set, but out of its verify batch.
              A prompt identical to one already prefilling (n samples) waits for it and then takes its
              blocks from the target's prefix cache (``_waits``): one prefill for all the samples
    plan  ──▶ split the step's budget (policies/prefill_split.py): a chunk per prefilling request,
              B - P to speculation
    verify ─▶ ONE target.step(prefill chunks, verify trees): the chunks join the running requests' forward;
              the draft prefills the same chunks meanwhile (it is idle while the target verifies)
    the chunk that ends a prompt brings the first token: committed, streamed, as a one-piece prefill's

A target that is lost (restart, outage) or a request that is evicted starts over: the loop re-admits it
and ``take`` begins a fresh chunked prefill (the target releases the old id first; its prefix cache keeps
the blocks that were done). A draft that misses a chunk, fails, or lags (the target's prefix cache served
more) is resynchronised at the request's first speculate (draft_link.py), from its own prefix cache.
With a feature-level (EAGLE) draft the chunks' target features are joined and relayed at that speculate.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from scheduler.policies.prefill_split import Decoding, PrefillNeed, Split, pair_cost, split_budget
from scheduler.policies.speculation import wants_draft
from scheduler.prefix_estimate import PrefixEstimate
from scheduler.request import Request, RequestState
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, VerifyItem

log = logging.getLogger(__name__)


@dataclass
class _Progress:
    req: Request
    tokens: list[int]  # the prompt being prefilled (prompt + output so far, after a recompute)
    done: int = 0  # tokens in the target's KV cache
    started: bool = False  # the target holds the sequence (a later chunk resumes it)
    on_draft: bool = False  # the draft got chunks of it
    draft_done: bool = False  # ... and the whole prompt
    cached: int = 0  # the prefix the target's cache likely serves (prefix_estimate.py): the first chunk's offset
    after: str | None = None  # an identical prompt's request (n samples): this one's first chunk waits for it

    @property
    def offset(self) -> int:
        """Tokens the next chunk attends besides its own (the chunk cost's o, policies/prefill_split.py)."""
        return self.done if self.started else self.cached


class ChunkedPrefill:
    def __init__(self, chunk: int) -> None:
        self.chunk = chunk  # 0: off (one-piece prefills)
        self.active: dict[str, _Progress] = {}  # admission order
        self.split = Split()
        self.num_chunks = 0  # prefill chunks run, all time
        self.num_cached_tokens = 0  # prompt tokens the target's prefix cache served to chunked prefills
        self.estimate = PrefixEstimate()  # the target's prefix cache as the policies see it

    # ------------------------------------------------------------------ admission and batch
    def take(self, new: list[Request], loop) -> list[Request]:
        """Start chunked prefills for the long prompts of ``new``; returns the rest (prefilled in one piece)."""
        if self.chunk <= 0:
            return new
        rest = []
        firsts = {_prompt_key(p.req): rid for rid, p in self.active.items() if p.after is None}
        for req in new:
            key = _prompt_key(req)
            sibling = firsts.get(key)
            if sibling == req.id:  # re-admitted (a target restart, an eviction): it starts over as the first
                sibling = None
            old = self.active.pop(req.id, None)
            if old is not None and old.on_draft:
                loop.link.stale.add(req.id)  # released on the draft before its next sync
            if req.num_tokens <= self.chunk and sibling is None:
                rest.append(req)
                firsts[key] = req.id
                continue
            self.active[req.id] = _Progress(req, req.tokens(), cached=self.estimate.estimate(req), after=sibling)
            firsts.setdefault(key, req.id)
        return rest

    def ready(self, running) -> list[Request]:
        """The running requests that decode this step (not mid-prefill)."""
        return [r for r in running if r.id not in self.active]

    @property
    def planned(self) -> bool:
        return bool(self.split.chunks)

    def plan(self, batch: list[Request], now: float, config, loop) -> int | None:
        """Split this step's budget; returns speculation's share (SpecContext.token_budget)."""
        self.estimate.update(loop._waiting, batch)  # also with chunking off: admission charges uncached tokens only
        if self.chunk <= 0:  # off (or a frontier loop): every prompt went in one piece (``take``), nothing to split
            self.split = Split()
            return config.token_budget
        for rid, p in list(self.active.items()):  # ended, or evicted (not holding its KV): it starts over
            if p.req.state.done or (p.req.state is RequestState.WAITING and not p.req.resident):
                del self.active[rid]
                if p.on_draft:
                    loop.link.pending_release.append(rid)
        needs = [
            PrefillNeed(p.req.id, len(p.tokens) - p.done, now - (p.req.arrival_time or now), _s(p.req.slo.ttft_ms),
                        offset=p.offset)
            for p in self.active.values() if p.req.state is RequestState.RUNNING and not self._waits(p)
        ]  # fmt: skip
        if not needs:  # no prompt in progress (most steps): split_budget would give the whole budget back
            self.split = Split(spec_budget=config.token_budget)
            return config.token_budget
        decoding = [Decoding(r.tpot, _s(r.slo.tpot_ms)) for r in batch]
        cost = config.cost_model
        per_token = cost.predict(self.chunk, self.chunk) / self.chunk if cost is not None else None
        self.split = split_budget(
            needs, decoding, chunk=self.chunk, budget=config.token_budget, prefill_token_s=per_token,
            pair_cost=self.pair_cost(config, loop.target),
        )  # fmt: skip
        return self.split.spec_budget if needs else config.token_budget

    def _waits(self, p: _Progress) -> bool:
        """Samples of one prompt (HTTP ``n``, ``Client.samples``) share its prefill: a copy's first chunk waits
        until the first sibling's prefill is done, then the target's prefix cache serves every full block of it
        by reference (copy-on-write past them) and the copy computes only its last partial block."""
        if p.after is not None and p.after not in self.active:
            p.after = None  # the sibling is prefilled (a short one already in this step's prefill call), or gone
        return p.after is not None

    @staticmethod
    def pair_cost(config, target) -> float:
        """r of the chunk cost (policies/prefill_split.py): the configured one, else the target's shape where the
        worker knows it (an in-process engine; the scheduler service sets the config from the target's Info)."""
        if config.prefill_pair_cost is not None:
            return config.prefill_pair_cost
        shape = getattr(target, "model_shape", None)
        return pair_cost(shape.attention_width, shape.num_layers, shape.layer_params) if shape is not None else 0.0

    # ------------------------------------------------------------------ the step's forward
    async def verify(self, loop, items: list[VerifyItem], report) -> list[AcceptResult]:
        """The step's target call: the planned chunks and ``items`` in one forward (raises as target.verify)."""
        if not self.split.chunks:
            return await loop.target.verify(items)
        plan = [(self.active[rid], n) for rid, n in self.split.chunks.items()]
        self.split = Split()
        chunks = [_item(p, n) for p, n in plan]
        to_draft = [(p, n) for p, n in plan if self._draft_takes(loop, p)]
        calls = [target_step(loop.target, chunks, items)]
        if stale := [p.req.id for p, _ in to_draft if not p.on_draft and p.req.id in loop.link.stale]:
            await _release_stale(loop, stale)  # an old attempt's sequence: gone before the fresh first chunk
        if to_draft and loop.link.usable:
            final = [p.done + n >= len(p.tokens) for p, n in to_draft]  # the target's last chunk: the draft's too
            draft_items = [_item(p, 0 if last else n, draft=True) for (p, n), last in zip(to_draft, final)]
            calls.append(loop.draft.prefill(draft_items))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        if len(calls) > 1:
            if isinstance(outcomes[1], Exception):
                loop._draft_failed(outcomes[1], also_stale=[p.req.id for p, _ in to_draft])
            for (p, _), last in zip(to_draft, final):
                p.on_draft = not isinstance(outcomes[1], Exception)
                p.draft_done = p.on_draft and last
        for p, _ in to_draft if len(calls) == 1 else ():  # the draft failed before its chunk went out
            if p.on_draft:
                loop.link.stale.add(p.req.id)
            p.on_draft = False
        if isinstance(outcomes[0], Exception):
            loop._fail([p.req for p, _ in plan], "target step failed", outcomes[0], report)
            raise outcomes[0]
        prefilled, results = outcomes[0]
        if len(prefilled) != len(plan) or any(r.seq_id != p.req.id for r, (p, _) in zip(prefilled, plan)):
            raise RuntimeError("target step returned prefill results that do not match its chunks")
        self._absorb(loop, plan, prefilled, report)
        return results

    def _draft_takes(self, loop, p: _Progress) -> bool:
        """The draft prefills the same chunks when it is up, token-level, and the request may speculate."""
        return loop.link.usable and loop.features is None and wants_draft(loop.spec_policy, p.req) and (
            p.on_draft or not p.started)  # fmt: skip

    def _absorb(self, loop, plan, prefilled: list[PrefillResult], report) -> None:
        now = loop.clock.now()
        for (p, _), res in zip(plan, prefilled):
            req = p.req
            first_chunk, p.started = not p.started, True
            report.num_chunk_tokens += max(0, res.num_prefilled - p.done - res.num_cached)
            report.num_chunk_context += res.num_prefilled
            p.done = res.num_prefilled
            self.num_chunks += 1
            self.num_cached_tokens += res.num_cached
            if loop.features is not None:
                (loop.features.on_prefill if first_chunk else loop.features.on_verify)(req, res)
            if res.pending:
                continue
            del self.active[req.id]
            if req.state is not RequestState.RUNNING:  # aborted or preempted meanwhile
                continue
            if p.draft_done and loop.link.up:
                loop.link.mark(req, len(p.tokens))  # the draft has the whole prompt too
            elif p.on_draft:
                loop.link.stale.add(req.id)  # part of it: released, then re-prefilled (from its cache) at sync
            report.prefilled_ids.append(req.id)
            report.num_prefill_tokens += len(loop._commit_tokens(req, [res.first_token], now))


def _prompt_key(req: Request) -> tuple:
    """Requests with this key feed the target identical KV (the same tokens under the same cache salt)."""
    return req.cache_salt, tuple(req.tokens())


async def _release_stale(loop, ids: list[str]) -> None:
    try:
        await loop.draft.release(ids)
        loop.link.stale.difference_update(ids)
    except Exception as exc:  # noqa: BLE001 - the draft is down: its chunks are skipped, resynced later
        loop._draft_failed(exc)


def _item(p: _Progress, n: int, *, draft: bool = False) -> PrefillItem:
    first = not (p.on_draft if draft else p.started)
    tokens = p.tokens if first else []
    return PrefillItem(p.req.id, tokens, p.req.sampling, max_tokens=n, resume=not first, cache_salt=p.req.cache_salt,
                       grammar=p.req.grammar if first else None)  # the first chunk builds the grammar state


async def target_step(target, prefills: list[PrefillItem], verifies: list[VerifyItem]):
    """One Step (prefill chunks + verify trees in one forward); a worker without ``step``: prefill, then verify."""
    step = getattr(target, "step", None)
    if step is not None:
        return await step(prefills, verifies)
    prefilled = await target.prefill(prefills)
    return prefilled, (await target.verify(verifies) if verifies else [])


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3
