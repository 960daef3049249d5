"""Frontier pipelining (FASER §4.3): the draft drafts the next chunk while the target verifies this one.

Each scheduler step verifies one *frontier chunk* of ``s_c`` chained tokens
per speculating request. In the same step, concurrently, the draft service
already drafts the request's next chunk on the *optimistic* prefix (as if the
whole current chunk will be accepted)::

    step t    target: verify C_t            ‖  draft: commit C_t optimistically, draft L = C_{t+1}' (s_c + 1 tokens)
    step t+1  C_t fully accepted, bonus b == L[0]  -> verify C_{t+1} = L[1:]  (no draft wait: frontier advances)
              else (a rejection, or b != L[0])     -> reset: the draft rolls the optimistic tokens back
                                                      (SpecItem.rollback), drafts a fresh chunk from the
                                                      committed prefix, serially, then the pair runs again

Accepted tokens commit at the end of every step (they stream right away).
The lookahead drafts one token more than a chunk because the target's bonus
token takes the first position after the chunk: the lookahead is usable only
when its first token equals that bonus. The target verifies only tokens drafted
from the committed prefix, so output is what serial SD gives (greedy: the
target's greedy output); the chunk verified after a frontier advance holds
the draft's tokens conditioned on that very prefix, with their sparse q.

Where the state lives: ``Request.draft_seen`` counts the *true* tokens the
draft holds; ``FrontierState.optimistic`` the tokens it holds beyond them
(to roll back); ``FrontierState.lookahead`` the chain it drafted last.

When: the step pipelines only when the cost models predict a gain (the §4.3
inequality, per emitted token, with the overlap bounded by the slower side
and a fresh draft charged after every reset)::

    [max(T_p(s_c), T_q(s_c+1)) + (1 - a^(s_c+1)) T_q(s_c)] / l(a, s_c)  <  [T_q(s) + T_p(s)] / l(a, s)

with T_q(n) = n draft forwards of the batch, T_p(n) one target forward of
b*(n+1) tokens (the profiled ``CostModel``s), l(a, n) the expected tokens per
verify at per-token acceptance a (the batch's measured rate, else
``FrontierConfig.alpha``). Without both cost models a configured
``chunk_size`` is used as is (else ``unmodelled_chunk``, 2, when the measured
gate is on, else the step runs serially). Trees are never chunked. Either way the choice
to pipeline is then checked against both modes' measured time per emitted
token at this batch size (``frontier_gate.py``; ``measured=false`` skips it):
the models leave out the two sides slowing each other down.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from scheduler.frontier_gate import SERIAL, MeasuredGate, MeasuredGateConfig
from shared.engine.types import SpecItem, TokenTree
from shared.profiling.cost_model import CostModel

log = logging.getLogger(__name__)


class FrontierConfig(BaseModel):
    """Frontier pipelining settings (off unless the scheduler is given one)."""

    chunk_size: int | None = Field(
        None, ge=1, description="s_c; None = chosen per step from the draft and target cost models (§4.3)."
    )
    max_chunk: int = Field(8, ge=1, description="Largest s_c tried when choosing from the cost models.")
    alpha: float = Field(
        0.7, ge=0.0, le=1.0, description="Per-token acceptance assumed by the cost comparison when none is measured."
    )
    min_gain: float = Field(
        0.05, ge=0.0, description="Predicted per-token saving needed to pipeline (co-execution interference is not modelled)."
    )
    require_gain: bool = Field(
        True, description="Pipeline only when the cost models predict a gain; False always pipelines (tests)."
    )
    unmodelled_chunk: int = Field(
        2, ge=1,
        description="s_c when a cost model is missing (a feature draft has no standalone profile) and no chunk_size "
        "is set; used only with the measured gate, which keeps the steps serial where it does not pay.",
    )  # fmt: skip
    measured: bool = Field(
        True,
        description="Check each choice to pipeline against both modes' measured time per token at this batch size "
        "(frontier_gate.py); False trusts the cost models, or a fixed chunk, every step.",
    )


@dataclass
class FrontierState:
    """Per request: what the draft holds beyond the committed tokens."""

    optimistic: int = 0  # tokens the draft committed beyond the true prefix (roll back on reset)
    lookahead: TokenTree | None = None  # chain drafted on the optimistic prefix last step
    chunk_len: int = 0  # length of the chunk verified last step


@dataclass
class FrontierStats:
    steps: int = 0
    advances: int = 0  # chunks taken from the lookahead (no draft wait)
    resets: int = 0  # chunks drafted fresh after a rejection or a lookahead miss
    per_request: dict[str, FrontierState] = field(default_factory=dict)


def expected_tokens(alpha: float, n: int) -> float:
    """Tokens one verify of an n-chain emits on average: (1 - alpha^(n+1)) / (1 - alpha) (SmartSpec's l)."""
    return n + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (n + 1)) / (1.0 - alpha)


def serial_time(s: int, b: int, context: float, target: CostModel, draft: CostModel, alpha: float) -> float:
    """Serial SD, seconds per emitted token: (T_q(s) + T_p(s)) / l(alpha, s)."""
    t = s * draft.predict(context, b) + target.predict(context, b * (s + 1), verify=s > 0)
    return t / expected_tokens(alpha, s)


def pipelined_time(s_c: int, b: int, context: float, target: CostModel, draft: CostModel, alpha: float) -> float:
    """Frontier pipelining with chunk s_c, seconds per emitted token.

    A round verifies a chunk while the draft drafts s_c + 1 lookahead tokens, so
    it lasts max(T_p(s_c), T_q(s_c + 1)); unless the chunk was fully accepted
    and the lookahead's first token hit the bonus (about alpha^(s_c+1)), the
    next round first waits for a fresh chunk, T_q(s_c) (the §4.3 inequality's
    T_q term, charged per reset).
    """
    t_q = lambda n: n * draft.predict(context, b)  # noqa: E731
    t_p = target.predict(context, b * (s_c + 1), verify=s_c > 0)
    round_s = max(t_p, t_q(s_c + 1)) + (1.0 - alpha ** (s_c + 1)) * t_q(s_c)
    return round_s / expected_tokens(alpha, s_c)


def choose_chunk(
    s: int,
    b: int,
    context: float,
    target: CostModel | None,
    draft: CostModel | None,
    config: FrontierConfig,
    alpha: float | None = None,
) -> int | None:
    """s_c for chains of s tokens in a batch of b (mean context ``context``); None = do not pipeline."""
    if s <= 0:
        return None
    if target is None or draft is None:
        if config.chunk_size:
            return min(s, config.chunk_size)
        return min(s, config.unmodelled_chunk) if config.measured else None  # the measured gate decides
    a = config.alpha if alpha is None else alpha
    candidates = [min(s, config.chunk_size)] if config.chunk_size else range(1, min(s, config.max_chunk) + 1)
    best = min(candidates, key=lambda c: pipelined_time(c, b, context, target, draft, a))
    if config.require_gain and pipelined_time(best, b, context, target, draft, a) >= (1.0 - config.min_gain) * serial_time(
        s, b, context, target, draft, a
    ):
        return None
    return best


def chain_tail(tree: TokenTree, start: int, count: int) -> TokenTree:
    """Nodes start..start+count-1 of a chain, as a chain hanging off node start-1 (its q rows shifted)."""
    end = min(len(tree), start + count)
    out = TokenTree.chain(
        tree.token_ids[start:end], tree.draft_probs[start:end] if len(tree.draft_probs) >= end else None
    )
    out.child_dists = {row - start: d for row, d in tree.child_dists.items() if start <= row < end}
    return out


def chain_head(tree: TokenTree, count: int) -> TokenTree:
    return chain_tail(tree, 0, count)


def lookahead_item(seq_id: str, new_tokens: list[int], chunk: TokenTree, s_c: int, features=None) -> SpecItem:
    """Commit the chunk on the draft optimistically and draft s_c + 1 tokens past it.

    ``features``: a feature draft's held target rows (for ``new_tokens``; the chunk's tokens have none yet,
    the draft runs them on its own outputs and re-runs them when the target's rows arrive)."""
    return SpecItem(seq_id, list(new_tokens) + list(chunk.token_ids), chain_len=s_c + 1, features=features)


@dataclass
class PipelinedStep:
    """What a frontier step hands back to the loop in place of its speculate/select/verify phases."""

    trees: list[TokenTree]
    results: list | None  # list[AcceptResult], or None when the target failed (requests already failed)
    speculate_s: float  # serial drafting (fresh chunks after a reset)
    verify_s: float  # the overlapped verify ‖ lookahead-draft pair
    chunk_size: int = 0


class FrontierPipeline:
    """Runs phases 4-6 of a step as chunk verification overlapped with next-chunk drafting (module docstring)."""

    def __init__(self, config: FrontierConfig | None = None):
        self.config = config or FrontierConfig()
        self.stats = FrontierStats()
        self.gate = MeasuredGate(MeasuredGateConfig(enabled=self.config.measured))

    @property
    def state(self) -> dict[str, FrontierState]:
        return self.stats.per_request

    def after_step(self, report, num_steps: int) -> None:
        """The step's emitted tokens and time (its prefill excluded) for the measured gate; its state logged
        every 500 steps."""
        self.gate.observe(report.num_emitted - report.num_prefill_tokens, report.times.total - report.times.prefill)
        if num_steps % 500 == 499 and self.gate.buckets:
            log.info("frontier pipelining, measured: %s", self.gate.describe())

    def _drop_absent(self, loop, live: set[str]) -> None:
        """Forget the state of requests that left the batch. Finished, aborted and evicted ones were released on
        the draft; one preempted with its KV kept (resident) still holds its optimistic chunk there, rolled back
        when it speculates again."""
        gone = [rid for rid in self.state if rid not in live]
        if not gone:
            return
        resident = {r.id: r for r in getattr(loop, "_waiting", ()) if r.resident}
        for rid in gone:
            st = self.state.pop(rid)
            r = resident.get(rid)
            if r is not None and st.optimistic and r.on_draft:
                r.draft_rollback += st.optimistic

    def reset(self, loop, requests) -> None:
        """Leave pipelining for ``requests``: the optimistic tokens a draft holds are rolled back by the request's
        next speculate call (``Request.draft_rollback``). Before 2026-11-29 the draft's copy was dropped and
        re-prefilled, and a feature draft's re-prefill recomputes the context's features on the target: under
        load, where every arrival made a step serial, that cost more than pipelining won (+42 % TPOT at 8x)."""
        for r in requests:
            st = self.state.pop(r.id, None)
            if st is not None and st.optimistic and r.on_draft:
                r.draft_rollback += st.optimistic

    async def run(self, loop, batch, shapes, ctx, report) -> PipelinedStep | None:
        """One pipelined step, or None (after leaving the pipeline cleanly) when the serial path should run."""
        import asyncio

        spec = [(i, r, s) for i, (r, s) in enumerate(zip(batch, shapes)) if s.speculates]
        self._drop_absent(loop, {r.id for r in batch})
        if spec and loop.draft is not None and loop.link.usable and (
            loop.link.stale or any(not r.on_draft for _, r, _ in spec)
        ):
            # a request the draft does not hold yet (an arrival; a feature draft takes it at its first speculate)
            # goes onto it here, as the serial path would, rather than making the whole batch leave the pipeline
            t = loop.clock.now()
            try:
                await loop.link.sync([r for _, r, _ in spec])
            except Exception as exc:  # noqa: BLE001 - as in the serial path: plain decoding this step
                loop._draft_failed(exc)
                self.state.clear()
            report.times.draft_sync = loop.clock.now() - t
        usable = (
            spec
            and all(s.kind == "chain" for _, _, s in spec)
            and loop.draft is not None
            and loop.link.usable
            and not loop.link.stale
            and all(r.on_draft for _, r, _ in spec)
        )
        s_c = None
        if usable:
            b = len(batch)
            context = sum(r.num_tokens for r in batch) / b
            s_c = choose_chunk(
                max(s.k for _, _, s in spec), b, context, ctx.cost_model, ctx.draft_cost_model, self.config, _alpha(batch)
            )
        if s_c is not None and self.gate.choose(len(batch)) == SERIAL:
            s_c = None  # measured: at this batch size serial steps emit tokens faster (frontier_gate.py)
        elif s_c is None:
            self.gate.ran_serial()
        if s_c is None:
            # only requests about to speculate serially must shed optimistic draft state; the others keep it
            # (still on the draft, released normally when they end, rolled back if they pipeline again)
            self.reset(loop, [r for _, r, _ in spec])
            return None

        clock = loop.clock
        t0 = clock.now()
        self.stats.steps += 1
        chunks: dict[int, TokenTree] = {}
        fresh: list[tuple[int, object, SpecItem]] = []
        for i, r, shape in spec:
            st = self.state.setdefault(r.id, FrontierState())
            c = min(s_c, shape.k)
            la = st.lookahead
            st.lookahead = None
            # the lookahead is usable when the last chunk was fully accepted and its first token is the bonus
            if la is not None and st.optimistic == 0 and len(la) >= 2 and r.num_tokens - r.draft_seen == 1 and (
                la.token_ids[0] == r.last_token
            ):
                chunks[i] = chain_tail(la, 1, c)
                self.stats.advances += 1
            else:
                item = SpecItem(r.id, r.tokens_from(r.draft_seen), chain_len=c, rollback=st.optimistic + r.draft_rollback,
                                features=r.features)  # fmt: skip
                fresh.append((i, r, item))
                self.stats.resets += 1
        if fresh:
            try:
                drafted = await loop.draft.speculate([item for _, _, item in fresh])
                if len(drafted) != len(fresh):
                    raise RuntimeError(f"draft returned {len(drafted)} trees for {len(fresh)} items")
            except Exception as exc:  # noqa: BLE001 - as in the serial path: plain decoding this step
                loop._draft_failed(exc)
                self.state.clear()
                t1 = clock.now()
                trees = [TokenTree() for _ in batch]
                results = await loop._verify(batch, trees, report) if batch else []
                return PipelinedStep(trees, results, t1 - t0, clock.now() - t1, s_c)
            loop.link.recovered()
            if loop.features is not None:
                loop.features.sent([r for _, r, _ in fresh])
            for (i, r, _), tree in zip(fresh, drafted):
                r.draft_seen = r.num_tokens
                r.draft_rollback = 0
                self.state[r.id].optimistic = 0
                chunks[i] = tree if _is_chain(tree) else TokenTree()
        t1 = clock.now()

        trees = [chunks.get(i, TokenTree()) for i in range(len(batch))]
        ahead = [(i, r) for i, r, _ in spec if len(trees[i])]
        items = [lookahead_item(r.id, r.tokens_from(r.draft_seen), trees[i], s_c, r.features) for i, r in ahead]
        calls = [loop._verify(batch, trees, report)]
        if items:
            calls.append(loop.draft.speculate(items))
        outcome = await asyncio.gather(*calls, return_exceptions=True)
        results = outcome[0]
        if isinstance(results, BaseException):
            raise results
        lookaheads = outcome[1] if items else []
        if isinstance(lookaheads, BaseException) or len(lookaheads) != len(items):
            loop._draft_failed(lookaheads if isinstance(lookaheads, Exception) else RuntimeError("lookahead count"))
            self.state.clear()
            lookaheads = []
        if lookaheads and loop.features is not None:
            loop.features.sent([r for _, r in ahead])
        for (i, r), la in zip(ahead, lookaheads):
            st = self.state[r.id]
            st.lookahead = la if _is_chain(la) else None
            st.optimistic = len(trees[i])  # the draft committed the whole chunk
            st.chunk_len = len(trees[i])
            r.draft_seen = r.num_tokens  # true tokens the draft holds (the commit below has not run yet)
            if results is not None:
                # the truth keeps the accepted prefix of the chunk: that much of the optimistic commit was right
                accepted = results[i].num_accepted
                r.draft_seen += accepted
                st.optimistic -= accepted
        return PipelinedStep(trees, results, t1 - t0, clock.now() - t1, s_c)


def _alpha(batch) -> float | None:
    """Per-token acceptance of the batch's recent steps (accepted / drafted), None before any."""
    drafted = accepted = 0
    for r in batch:
        drafted += sum(r.drafted_depths[-16:])
        accepted += sum(r.accepted_lens[-16:])
    return min(0.99, accepted / drafted) if drafted else None


def _is_chain(tree: TokenTree) -> bool:
    return all(p == i - 1 for i, p in enumerate(tree.parent_ids)) and len(tree.parent_ids) == len(tree.token_ids)
