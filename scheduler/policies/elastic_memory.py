"""When to offload the draft model and when to bring it back (Nightjar §5.1: elastic memory).

    resident ──(no speculation ∧ free < τ_low) for T_persist steps──▶ offload ──▶ offloaded
    offloaded ──(waiting queue empty ∧ free > τ_high)────────────────▶ reload ───▶ resident

τ_high > τ_low is the hysteresis: the paper reloads when N_free > S_draft +
τ_low (the draft's footprint comes out of the pool again), so speculation
stays off through a high-load phase instead of thrashing.

"free" is the share of the scheduler's KV token budget (``max_tokens_in_flight``,
sized from the target's KV pool) that no running or resident request has
reserved: admission reserves prompt + max_new_tokens per request, so this is
the pressure admission actually feels (the paper's N_free in blocks, as a
fraction; its best threshold was 10 % free).

Where the freed memory goes: when draft and target share one accelerator, the
draft's weights and KV pool leave the device and the target can grow into
them; the target's pool is sized at start-up here, so the space is
released to the device (``torch.cuda.empty_cache``) but not yet added to the
target's pool. On CPU there is no device memory to give: offload frees the
draft's KV tensors and stops its forwards, nothing more.

Pure: the loop (engine_loop.py) feeds it one observation per step and
carries out what it answers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

Action = Literal["offload", "reload"]


class ElasticMemoryConfig(BaseModel):
    low_free: float = Field(0.1, ge=0.0, le=1.0, description="τ_low: offload below this free share of the KV budget.")
    high_free: float = Field(
        0.3, ge=0.0, le=1.0, description="τ_high: reload above this free share (and an empty queue); > τ_low."
    )
    persist_steps: int = Field(8, ge=1, description="T_persist: consecutive scarce steps without speculation.")
    retry_steps: int = Field(32, ge=1, description="Steps to wait after a failed reload before the next try.")


class ElasticDraftMemory:
    """The trigger of §5.1; ``offloaded`` is what the draft is known to be."""

    def __init__(self, config: ElasticMemoryConfig | None = None) -> None:
        self.config = cfg = config or ElasticMemoryConfig()
        if cfg.high_free <= cfg.low_free:
            raise ValueError(f"τ_high ({cfg.high_free}) must exceed τ_low ({cfg.low_free})")
        self.offloaded = False
        self.enabled = True  # off for good once the draft cannot offload (model-free draft)
        self._scarce_steps = 0
        self._wait_steps = 0

    def observe(self, *, speculated: bool, free_share: float, num_waiting: int) -> Action | None:
        """One step's outcome -> what to do now (the loop reports back with ``done`` / ``failed``)."""
        cfg = self.config
        if not self.enabled:
            return None
        if self._wait_steps > 0:
            self._wait_steps -= 1
            return None
        if not self.offloaded:
            scarce = not speculated and free_share < cfg.low_free  # conditions (1)-(2)
            self._scarce_steps = self._scarce_steps + 1 if scarce else 0
            return "offload" if self._scarce_steps >= cfg.persist_steps else None  # (3)
        return "reload" if num_waiting == 0 and free_share > cfg.high_free else None

    def done(self, action: Action) -> None:
        self.offloaded = action == "offload"
        self._scarce_steps = 0

    def failed(self, action: Action, *, permanent: bool = False) -> None:
        """``permanent``: the draft cannot do it at all (a model-free draft): stop asking."""
        if permanent:
            self.enabled = False
        self._scarce_steps = 0
        self._wait_steps = self.config.retry_steps
