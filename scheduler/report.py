"""What one iteration did: handed to observers (metrics, Redis, traces) and to learning policies."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.spec_shape import SpecShape
from scheduler.request import FinishReason


@dataclass
class PhaseTimes:
    """Seconds on the scheduler's clock; ``overhead`` is total minus the named phases (admission, planning)."""

    prefill: float = 0.0  # target + draft prefill of admitted requests (run concurrently)
    speculate: float = 0.0  # draft resync (release/prefill) + the speculate call
    draft_sync: float = 0.0  # of speculate: the resync alone (re-prefilling requests the draft did not hold)
    select: float = 0.0
    verify: float = 0.0
    commit: float = 0.0  # appending, stop checks, events, releases
    overhead: float = 0.0
    total: float = 0.0

    @property
    def drafting(self) -> float:
        """The speculate phase less the draft's resync: what the chosen shape cost the draft (the policies' fits)."""
        return max(0.0, self.speculate - self.draft_sync)


@dataclass(slots=True)
class RequestOutcome:
    request_id: str
    shape: SpecShape
    num_drafted: int  # tree nodes sent to verification
    num_accepted: int  # of which accepted
    num_emitted: int  # tokens streamed this step (after stop truncation)
    finish_reason: FinishReason | None = None
    num_pruned: int = 0  # drafted nodes the target's token-wise early exit stopped (FASER §4.2), counted rejected


@dataclass
class StepReport:
    step: int
    started_at: float
    times: PhaseTimes = field(default_factory=PhaseTimes)
    batch_size: int = 0  # requests verified this step
    prefilled_ids: list[str] = field(default_factory=list)
    num_prefill_tokens: int = 0  # tokens emitted by target prefill (first tokens)
    # chunked prefill in the verify forward (prefill_chunks.py): prompt tokens it computed (the prefix cache's
    # hits excluded) and the KV length those chunks attended to (summed over their sequences)
    num_chunk_tokens: int = 0
    num_chunk_context: int = 0
    preempted_ids: list[str] = field(default_factory=list)
    # tokens the speculate call fed the draft before drafting, beyond each request's newest one: the accepted
    # tokens of its last step, and everything since it last drafted for it (the catch-up of Nightjar §4.2)
    num_catchup_tokens: int = 0
    resumed_ids: list[str] = field(default_factory=list)  # preempted requests readmitted with their KV kept
    evicted_ids: list[str] = field(default_factory=list)  # waiting requests whose KV was released (re-prefilled later)
    failed_ids: list[str] = field(default_factory=list)
    draft_available: bool = False  # at the end of the step
    draft_error: str | None = None  # the draft failure this step, if any
    draft_offloaded: bool = False  # at the end of the step: the draft's weights are in host memory (Nightjar §5)
    draft_memory_event: str | None = None  # "offload" or "reload" when the loop did one this step
    kv_pool_event: str | None = None  # "grow", "shrink", "grow-failed" or "shrink-refused" (pool_growth)
    kv_token_budget: int = 0  # at the end of the step: max_tokens_in_flight, grown while the draft is away
    outcomes: list[RequestOutcome] = field(default_factory=list)
    policy: dict[str, float] = field(default_factory=dict)  # the speculation policy's explain() of this step

    @property
    def early_exit_ratio(self) -> float:
        """Share of this step's drafted nodes that verification stopped early (FASER §4.2)."""
        drafted = sum(o.num_drafted for o in self.outcomes)
        return sum(o.num_pruned for o in self.outcomes) / drafted if drafted else 0.0

    @property
    def num_speculating(self) -> int:
        return sum(1 for o in self.outcomes if o.shape.speculates)

    @property
    def num_emitted(self) -> int:
        return self.num_prefill_tokens + sum(o.num_emitted for o in self.outcomes)
