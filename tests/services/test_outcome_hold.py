"""Outcome hold (services/target/outcome_hold.py): while steps are short, a continuation step's outcome waits for the
next one's and both leave as one message; the last two outcomes a plan owes, errors and long steps leave alone."""

from __future__ import annotations

from services.target.outcome_hold import OutcomeHold
from shared.rpc.gen.tandem.v1 import common_pb2, target_pb2

FAST, SLOW = 0.0005, 0.05


def _steps(hold: OutcomeHold, owed: list[tuple[int, float]]) -> list[list[int]]:
    """Offer one outcome per (steps after it, step time); the messages written, as lists of step numbers."""
    sent = []
    for step, (after, took) in enumerate(owed):
        msg = hold.offer(target_pb2.TargetOutcome(step=step), after, took)
        if msg is not None:
            sent.append([msg.step, *(o.step for o in msg.then)])
    return sent


def test_a_plan_of_four_short_steps_sends_three_messages_the_first_two_steps_together():
    hold = OutcomeHold(hold_s=0.002)
    assert _steps(hold, [(3, FAST), (2, FAST), (1, FAST), (0, FAST)]) == [[0, 1], [2], [3]]
    assert hold.num_held == 1


def test_the_last_two_outcomes_of_a_group_leave_alone():
    """The scheduler asks for more steps once it has read the last-but-one outcome owed: that outcome never waits
    behind another, nor carries one the scheduler must commit first."""
    assert _steps(OutcomeHold(0.002), [(4, FAST), (3, FAST), (2, FAST), (1, FAST), (0, FAST)]) == [[0, 1], [2], [3], [4]]
    assert _steps(OutcomeHold(0.002), [(2, FAST), (1, FAST), (0, FAST)]) == [[0], [1], [2]]  # R = 2: nothing held
    assert _steps(OutcomeHold(0.002), [(1, FAST), (0, FAST)]) == [[0], [1]]
    assert _steps(OutcomeHold(0.002), [(0, FAST)]) == [[0]]


def test_long_steps_are_never_held():
    """A step that took longer than the hold (a GPU forward of a real model) leaves at once: holding it would delay
    its tokens by a whole step."""
    assert _steps(OutcomeHold(0.002), [(3, SLOW), (2, SLOW), (1, SLOW), (0, SLOW)]) == [[0], [1], [2], [3]]
    assert _steps(OutcomeHold(0.0), [(3, FAST), (2, FAST), (1, FAST), (0, FAST)]) == [[0], [1], [2], [3]]


def test_an_error_is_not_held_and_takes_what_was_held_with_it_in_order():
    hold = OutcomeHold(0.002)
    assert hold.offer(target_pb2.TargetOutcome(step=7), 3, FAST) is None
    refused = target_pb2.TargetOutcome(step=8, error=common_pb2.StepError(code=3, message="no"))
    msg = hold.offer(refused, 2, FAST)
    assert msg.step == 7 and [o.step for o in msg.then] == [8] and msg.then[0].error.message == "no"
    alone = hold.offer(target_pb2.TargetOutcome(step=9, error=common_pb2.StepError(code=3)), 1, FAST)
    assert alone.step == 9 and not alone.then


def test_at_most_most_outcomes_travel_together():
    sent = _steps(OutcomeHold(0.002, most=3), [(4, FAST), (3, FAST), (2, FAST), (1, FAST), (0, FAST)])
    assert sent == [[0, 1, 2], [3], [4]]
