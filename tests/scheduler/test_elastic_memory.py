"""Nightjar §5.1's trigger: offload after T_persist scarce steps without speculation, reload with hysteresis."""

from __future__ import annotations

import pytest

from scheduler.policies.elastic_memory import ElasticDraftMemory, ElasticMemoryConfig
from services.scheduler.main import draft_memory_config


def test_offload_needs_persistent_scarcity_without_speculation():
    mem = ElasticDraftMemory(ElasticMemoryConfig(low_free=0.1, high_free=0.3, persist_steps=3))
    scarce = dict(speculated=False, free_share=0.05, num_waiting=5)
    assert [mem.observe(**scarce) for _ in range(2)] == [None, None]
    assert mem.observe(speculated=True, free_share=0.05, num_waiting=5) is None  # speculating: the streak resets
    assert mem.observe(speculated=False, free_share=0.5, num_waiting=5) is None  # memory fine: resets too
    assert [mem.observe(**scarce) for _ in range(3)] == [None, None, "offload"]
    mem.done("offload")
    # hysteresis: free between tau_low and tau_high, or a queue, keeps it offloaded
    assert mem.observe(speculated=False, free_share=0.2, num_waiting=0) is None
    assert mem.observe(speculated=False, free_share=0.9, num_waiting=1) is None
    assert mem.observe(speculated=False, free_share=0.9, num_waiting=0) == "reload"
    mem.done("reload")
    assert not mem.offloaded


def test_failures_back_off_or_disable():
    mem = ElasticDraftMemory(ElasticMemoryConfig(persist_steps=1, retry_steps=2))
    scarce = dict(speculated=False, free_share=0.0, num_waiting=1)
    assert mem.observe(**scarce) == "offload"
    mem.failed("offload")  # transient: try again after retry_steps
    assert [mem.observe(**scarce) for _ in range(3)] == [None, None, "offload"]
    mem.failed("offload", permanent=True)  # a draft that cannot offload: never again
    assert all(mem.observe(**scarce) is None for _ in range(10))


def test_config_spec():
    assert draft_memory_config("off") is None
    assert draft_memory_config("on") == ElasticMemoryConfig()
    assert draft_memory_config("low=0.05,high=0.5,persist=4") == ElasticMemoryConfig(
        low_free=0.05, high_free=0.5, persist_steps=4
    )
    with pytest.raises(ValueError):
        draft_memory_config("low=0.5,high=0.2")
    with pytest.raises(ValueError):
        draft_memory_config("bogus=1")
