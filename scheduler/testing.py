"""Fake workers over a deterministic toy language model, for tests and the simulator.

The toy target is greedy: its next token is a pure hash of the last
``context`` tokens, so "what would the target alone say" is one loop
(``ToyLM.generate``). The toy draft agrees with it with probability
``agree_prob`` (deterministic per prefix and seed), so acceptance is tunable.

``FakeTarget`` and ``FakeDraft`` implement the worker protocols the way a real
service must (see ``scheduler/workers.py``): atomic batches, idempotent
release, typed engine errors; plus knobs to inject latency (on a ``Clock``)
and failures, and call logs to assert on.
"""

from __future__ import annotations

import asyncio

from collections.abc import Sequence

from scheduler.workers import Clock
from shared.engine.errors import DuplicateSequenceError, InvalidRequestError, UnknownSequenceError
from shared.engine.types import AcceptResult, PrefillItem, PrefillResult, SpecItem, TokenTree, VerifyItem

_MASK = (1 << 64) - 1


def _mix(h: int, x: int) -> int:
    """splitmix64 step over (h, x): cheap, well-spread, deterministic across runs (unlike hash())."""
    z = (h ^ (x + 0x9E3779B97F4A7C15 + (h << 6) + (h >> 2))) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


class ToyLM:
    """Greedy toy target: next token = hash(seed, last ``context`` tokens) mod ``vocab_size``."""

    def __init__(self, vocab_size: int = 50, context: int = 3, seed: int = 0) -> None:
        self.vocab_size, self.context, self.seed = vocab_size, context, seed

    def next_token(self, prefix: Sequence[int]) -> int:
        h = _mix(self.seed, 0x5EED)
        for t in prefix[-self.context :]:
            h = _mix(h, t)
        return h % self.vocab_size

    def generate(self, prompt: Sequence[int], max_new_tokens: int, stop_token_ids: Sequence[int] = ()) -> list[int]:
        """Target-only greedy output, stopping after a stop token (kept) or max_new_tokens."""
        seq, out = list(prompt), []
        while len(out) < max_new_tokens:
            tok = self.next_token(seq)
            seq.append(tok)
            out.append(tok)
            if tok in stop_token_ids:
                break
        return out


class ToyDraftLM:
    """Draft for a ``ToyLM``: proposes the target's token with probability ``agree_prob`` per prefix."""

    def __init__(self, target: ToyLM, agree_prob: float = 0.7, seed: int = 1) -> None:
        self.target, self.agree_prob, self.seed = target, agree_prob, seed

    def _unit(self, prefix: Sequence[int]) -> float:
        h = _mix(self.seed, len(prefix))
        for t in prefix[-self.target.context :]:
            h = _mix(h, t)
        return (h >> 11) / float(1 << 53)

    def next_token(self, prefix: Sequence[int]) -> tuple[int, float]:
        """(token, draft probability)."""
        u = self._unit(prefix)
        want = self.target.next_token(prefix)
        if u < self.agree_prob:
            return want, 0.5 + 0.5 * (1 - u)
        wrong = (want + 1 + int(u * 1e6) % (self.target.vocab_size - 1)) % self.target.vocab_size
        return wrong, 0.5 * u


def toy_detokenize(token_ids: Sequence[int]) -> str:
    """One letter per token (a-z, A-Z, then digits), so stop strings are easy to build in tests."""
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    return "".join(alphabet[t % len(alphabet)] for t in token_ids)


class _FakeWorker:
    def __init__(self, clock: Clock | None) -> None:
        self.clock = clock
        self.seqs: dict[str, list[int]] = {}  # seq id -> committed tokens
        self.calls: list[tuple[str, int]] = []  # (method, number of items), for assertions
        self.down = False  # every call raises ConnectionError while set
        self.held = False  # prefill/verify/speculate calls wait while set (a test holds work in flight)

    def crash(self) -> None:
        """Go down and lose all state, like a restarted service."""
        self.down = True
        self.seqs.clear()

    async def _enter(self, method: str, n: int, cost_s: float) -> None:
        self.calls.append((method, n))
        while self.held and method not in ("info", "release"):
            await asyncio.sleep(0.001)
        if self.clock is not None and cost_s > 0:
            await self.clock.sleep(cost_s)
        if self.down:
            raise ConnectionError(f"{type(self).__name__} is down")

    async def info(self) -> dict[str, int]:
        """What a health probe reads (raises ConnectionError while down, like the other calls)."""
        await self._enter("info", 0, 0.0)
        return {"num_live_seqs": len(self.seqs)}

    async def release(self, seq_ids: list[str]) -> None:
        await self._enter("release", len(seq_ids), 0.0)
        for sid in seq_ids:
            self.seqs.pop(sid, None)  # idempotent

    def _check_new(self, items: Sequence[PrefillItem]) -> None:
        for it in items:
            if it.seq_id in self.seqs:
                raise DuplicateSequenceError(f"sequence {it.seq_id} is already live")
            if not it.prompt_ids:
                raise InvalidRequestError(f"sequence {it.seq_id}: empty prompt")

    def _check_known(self, seq_ids: Sequence[str]) -> None:
        for sid in seq_ids:
            if sid not in self.seqs:
                raise UnknownSequenceError(f"sequence {sid} is not held")


class FakeTarget(_FakeWorker):
    """Greedy target over a ``ToyLM``; verify walks the tree, accepting the child equal to the target's token."""

    def __init__(
        self,
        lm: ToyLM,
        clock: Clock | None = None,
        prefill_s: float = 0.0,
        verify_s: float = 0.0,
        verify_per_token_s: float = 0.0,
    ) -> None:
        super().__init__(clock)
        self.lm = lm
        self.prefill_s, self.verify_s, self.verify_per_token_s = prefill_s, verify_s, verify_per_token_s

    async def prefill(self, items: list[PrefillItem]) -> list[PrefillResult]:
        await self._enter("prefill", len(items), self.prefill_s)
        self._check_new(items)
        out = []
        for it in items:
            seq = list(it.prompt_ids)
            seq.append(self.lm.next_token(seq))
            self.seqs[it.seq_id] = seq
            out.append(PrefillResult(it.seq_id, seq[-1]))
        return out

    async def verify(self, items: list[VerifyItem]) -> list[AcceptResult]:
        num_tokens = sum(1 + len(it.tree) for it in items)
        await self._enter("verify", len(items), self.verify_s + self.verify_per_token_s * num_tokens)
        self._check_known([it.seq_id for it in items])
        results = [greedy_accept(self.lm, self.seqs[it.seq_id], it.tree) for it in items]
        for it, res in zip(items, results):
            self.seqs[it.seq_id].extend(res.tokens)  # the target commits path + bonus itself
        return results


def greedy_accept(lm: ToyLM, committed: Sequence[int], tree: TokenTree) -> AcceptResult:
    """Walk the tree from the root: at each row accept the child equal to the target's greedy token."""
    n = len(tree.token_ids)
    children: dict[int, list[int]] = {row: [] for row in range(n + 1)}
    for i, p in enumerate(tree.parent_ids):
        children[p + 1].append(i)
    status = [-1] * n
    seq, accepted, row = list(committed), [], 0
    while True:
        want = lm.next_token(seq)
        hit = None
        for c in children[row]:
            status[c] = 0
            if hit is None and tree.token_ids[c] == want:
                hit = c
        if hit is None:
            break
        status[hit] = 1
        accepted.append(hit)
        seq.append(want)
        row = hit + 1
    tokens = [tree.token_ids[i] for i in accepted] + [want]  # accepted path + bonus
    return AcceptResult(accepted_nodes=accepted, tokens=tokens, node_status=status)


class FakeDraft(_FakeWorker):
    """Draft over a ``ToyDraftLM``: chains, or d x w trees (w alternatives per level along the main path).

    With ``reference`` (the FakeTarget), every speculate checks that the draft's
    view of the sequence equals what the target committed and records any
    difference in ``mismatches``.
    """

    def __init__(
        self,
        lm: ToyDraftLM,
        clock: Clock | None = None,
        prefill_s: float = 0.0,
        speculate_s: float = 0.0,
        reference: FakeTarget | None = None,
    ) -> None:
        super().__init__(clock)
        self.lm = lm
        self.prefill_s, self.speculate_s = prefill_s, speculate_s
        self.reference = reference
        self.mismatches: list[str] = []
        self.num_drafted = 0

    async def prefill(self, items: list[PrefillItem]) -> None:
        await self._enter("prefill", len(items), self.prefill_s)
        self._check_new(items)
        for it in items:
            self.seqs[it.seq_id] = list(it.prompt_ids)

    async def speculate(self, items: list[SpecItem]) -> list[TokenTree]:
        await self._enter("speculate", len(items), self.speculate_s)
        self._check_known([it.seq_id for it in items])
        for it in items:
            if not it.new_tokens:
                self.mismatches.append(f"{it.seq_id}: speculate with no new tokens")
                raise InvalidRequestError(f"sequence {it.seq_id}: speculate needs the newly committed tokens")
        out = []
        for it in items:
            seq = self.seqs[it.seq_id]
            seq.extend(it.new_tokens)
            if self.reference is not None and seq != self.reference.seqs.get(it.seq_id):
                self.mismatches.append(f"{it.seq_id}: draft has {len(seq)} tokens, target differs")
            tree = self._chain(seq, it) if it.chain_len > 0 else self._tree(seq, it.tree_depth, it.tree_width)
            self.num_drafted += len(tree)
            out.append(tree)
        return out

    def _chain(self, seq: list[int], it: SpecItem) -> TokenTree:
        ctx, toks, probs = list(seq), [], []
        for _ in range(it.chain_len):
            tok, p = self.lm.next_token(ctx)
            toks.append(tok)
            probs.append(p)
            ctx.append(tok)
            if it.confidence_threshold > 0 and p <= it.confidence_threshold:
                break  # SmartSpec Algorithm 3: the unsure token is kept, drafting stops after it
        return TokenTree.chain(toks, probs)

    def _tree(self, seq: list[int], depth: int, width: int) -> TokenTree:
        vocab = self.lm.target.vocab_size
        tree, ctx, parent = TokenTree(), list(seq), -1
        for _ in range(depth):
            tok, p = self.lm.next_token(ctx)
            main = len(tree.token_ids)
            for j in range(width):
                tree.token_ids.append((tok + j) % vocab)
                tree.parent_ids.append(parent)
                tree.draft_probs.append(p if j == 0 else (1 - p) / width)
            ctx.append(tok)
            parent = main
        return tree
