"""The scheduler's mirror of the target's prefix cache (scheduler/prefix_estimate.py) and LAPS-SD's use of it."""

from scheduler.policies.laps_sd import LapsSD
from scheduler.prefix_estimate import PrefixEstimate
from scheduler.request import Request


def test_a_waiting_request_is_charged_only_what_no_running_request_covered():
    est = PrefixEstimate(block_size=4)
    running = Request("a", list(range(1, 19)))  # 4 full blocks + 2
    waiting = Request("b", list(range(1, 13)) + [99, 98, 97, 96, 95])
    other = Request("c", list(range(1, 13)) + [7], cache_salt="tenant-x")
    est.update([waiting, other], [running])
    assert waiting.num_cached_estimate == 12 and other.num_cached_estimate == 0
    assert LapsSD.tokens_to_prefill(waiting) == len(waiting.prompt_ids) - 12
    again = Request("d", list(range(1, 19)))
    est.update([again], [])  # "a" ended: its blocks stay recorded (the target keeps them cached)
    assert again.num_cached_estimate == 16  # never the block of the last token


def test_the_mirror_forgets_least_recently_used_blocks():
    est = PrefixEstimate(block_size=2, capacity_blocks=3)
    est.update([], [Request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])])  # 4 blocks: the first falls out
    probe = Request("p", [1, 2, 3, 4, 5])
    est.update([probe], [])
    assert probe.num_cached_estimate == 0
