"""When to offload the draft model and when to bring it back (Nightjar §5.1: elastic memory).

    resident ──(no speculation ∧ free < τ_low) for T_persist steps──▶ offload ──▶ offloaded
    offloaded ──(waiting queue empty ∧ free > τ_high)────────────────▶ reload ───▶ resident

τ_high > τ_low is the hysteresis: the paper reloads when N_free > S_draft +
τ_low (the draft's footprint comes out of the pool again), so speculation
stays off through a high-load phase instead of thrashing.

"free" is the share of the scheduler's KV token budget that no running or
resident request has reserved: admission reserves prompt + max_new_tokens per
request, so this is the pressure admission actually feels (the paper's N_free
in blocks, as a fraction; its best threshold was 10 % free). It is always
measured against the budget *with the draft resident* (the pool's start-up
size), also while the pool is grown: so "reload above τ_high" is the paper's
N_free > S_draft + τ, free space left after the draft takes its share back.

Where the freed memory goes (``PoolGrowth``, a co-located pair): after an
offload the loop asks the target to grow its KV pool by ``extra_blocks`` (what
the draft's weights and KV pool are worth, TANDEM_KV_GROW_BLOCKS on the
target) and raises its token budget by as many tokens; before a reload it
shrinks the pool back and lowers the budget, and the target refuses while a
live sequence still owns one of the extra blocks (the draft then stays
offloaded and the loop retries after ``retry_steps``). Without it, offload
only frees the draft's memory: on a GPU it returns to the device
(``torch.cuda.empty_cache``), on CPU there is nothing to give.

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


class PoolGrowth(BaseModel):
    """How far the target's KV pool grows while the draft is offloaded (its Info: kv_blocks_base / kv_blocks_max)."""

    base_blocks: int = Field(ge=1, description="Pool size with the draft resident (start-up size).")
    extra_blocks: int = Field(ge=1, description="Blocks added while the draft is offloaded.")
    block_size: int = Field(ge=1, description="Tokens per block.")

    @property
    def extra_tokens(self) -> int:
        return self.extra_blocks * self.block_size


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
