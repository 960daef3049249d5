"""The iteration loop's configuration (scheduler/engine_loop.py): caps, budgets, cost models, and the
collaborators each option switches on (frontier pipelining, elastic draft memory, target recovery)."""

from __future__ import annotations

import os

from pydantic import BaseModel, Field

from scheduler.frontier import FrontierConfig
from scheduler.policies.elastic_memory import ElasticMemoryConfig, PoolGrowth
from scheduler.target_link import TargetRecoveryConfig
from shared.profiling.cost_model import CostModel


class SchedulerConfig(BaseModel):
    max_batch_size: int = Field(64, ge=1, description="Most requests running (verified) at once.")
    max_tokens_in_flight: int = Field(
        1 << 16,
        ge=1,
        description="Token budget over running requests, each reserving prompt + max_new_tokens from admission.",
    )
    draft_retry_initial_s: float = Field(1.0, ge=0, description="Wait after a draft failure before trying it again.")
    draft_retry_max_s: float = Field(30.0, ge=0, description="Cap of the exponential draft retry backoff.")
    stop_string_window: int = Field(
        16, ge=1, description="Extra tokens decoded beyond the longest stop string when matching stop strings."
    )
    keep_kv_on_preempt: bool = Field(
        True,
        description="A preempted request keeps its KV on both workers while the token budget allows (resumed "
        "without a prefill); False: always released and recomputed (re-prefilled) on readmission.",
    )
    token_budget: int | None = Field(
        None,
        ge=1,
        description="Verify tokens per target forward before it turns compute-bound (AdaServe's B, from the "
        "profiler); handed to the policies in SpecContext. None = not profiled (policies use their own default).",
    )
    cost_model: CostModel | None = Field(
        None, description="The target's fitted T_fwd (profiler), handed to the policies in SpecContext."
    )
    draft_cost_model: CostModel | None = Field(
        None, description="The draft's fitted T_fwd per forward, when it was profiled; in SpecContext."
    )
    frontier: FrontierConfig | None = Field(
        None,
        description="Frontier pipelining (FASER §4.3): verify chain speculation in chunks while the draft drafts "
        "the next chunk concurrently; None = serial speculate then verify.",
    )
    draft_ahead: bool = Field(
        False,
        description="Send each request's next speculate as soon as a verify's outcome is in, so the draft drafts "
        "while the loop commits (draft_ahead.py); not with frontier pipelining or feature-level drafts.",
    )
    draft_relay: bool = Field(
        False,
        description="The target hands each verified step's tokens straight to the draft, whose next trees go "
        "straight back to it (draft_relay.py); needs a target worker that relays (step streams), and every "
        "drafted node verified (no tree selection); instead of draft_ahead where both are on.",
    )
    draft_memory: ElasticMemoryConfig | None = Field(
        None,
        description="Offload the draft's weights under KV pressure while nothing speculates, reload when the "
        "queue is empty (Nightjar §5.1); None = the draft stays resident.",
    )
    pool_growth: PoolGrowth | None = Field(
        None,
        description="With draft_memory: the target's KV pool grows by this while the draft is offloaded, and "
        "max_tokens_in_flight (the budget with the draft resident) by as many tokens; None = it does not grow.",
    )
    target_recovery: TargetRecoveryConfig = Field(
        default_factory=TargetRecoveryConfig,
        description="How long requests wait for a target that went down (target_link.py) before they fail.",
    )
    prefill_chunk: int = Field(
        default_factory=lambda: int(os.environ.get("TANDEM_PREFILL_CHUNK", "512")),
        ge=0,
        description="Chunked prefill (prefill_chunks.py): prompts longer than this many tokens are prefilled in "
        "chunks of at most this size, each in a step's one forward beside the running requests' verify trees, "
        "under one token budget (policies/prefill_split.py). 0 = one-piece prefills. Off while frontier "
        "pipelining is on. Default from TANDEM_PREFILL_CHUNK, else 512.",
    )
    prefill_pair_cost: float | None = Field(
        None,
        ge=0,
        description="Chunked prefill's r = alpha / gamma: what one attended (query, key) pair costs per token's pass "
        "through the layers; chunks shrink with their offset so that each costs what C tokens cost at offset 0 "
        "(policies/prefill_split.py). None: from the target's shape (its Info, or an in-process engine; else 0). "
        "0: chunks of C tokens at any offset.",
    )
