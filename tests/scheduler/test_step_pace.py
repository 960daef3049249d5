"""Continuation steps per plan from the measured step time (scheduler/step_pace.py): many while steps are short, one
when they are long, so an arrival never waits much longer than the wait budget for the steps already asked for."""

from __future__ import annotations

from scheduler.step_pace import StepPace, repeat_for


def test_the_repeat_is_the_largest_that_keeps_an_arrivals_wait_within_the_budget():
    # (2R + 1) * step <= wait
    assert repeat_for(3, 0.0005, 0.004) == 3  # 7 steps of 0.5 ms: 3.5 ms
    assert repeat_for(4, 0.0005, 0.004) == 3  # 9 steps would be 4.5 ms
    assert repeat_for(3, 0.0008, 0.004) == 2  # 5 x 0.8 = 4 ms
    assert repeat_for(3, 0.0016, 0.004) == 1  # at batch 64 on 2 cores
    assert repeat_for(3, 0.008, 0.004) == 1  # a GPU step of an 8B model: at least 1 (the target never waits)
    assert repeat_for(1, 0.0001, 0.004) == 1 and repeat_for(0, 0.0001, 0.004) == 0  # never past the configured most
    assert repeat_for(3, 0.0, 0.004) == 1  # nothing measured


def test_the_pace_follows_the_step_time_once_warm():
    pace = StepPace(3, 0.004, warm=4)
    t = 100.0
    for _ in range(4):
        assert pace.repeat == 1  # not warm yet
        pace.tick(t)
        t += 0.0005
    pace.tick(t)
    assert pace.repeat == 3 and abs(pace.step_s - 0.0005) < 1e-9
    for _ in range(60):  # the steps slow down (a bigger batch): the repeat comes down with them
        t += 0.002
        pace.tick(t)
    assert pace.repeat == 1


def test_an_idle_pause_is_not_a_step():
    pace = StepPace(3, 0.004, warm=2)
    for t in (0.0, 0.0005, 0.001, 0.0015):
        pace.tick(t)
    pace.tick(30.0)  # the server idled for half a minute
    assert pace.repeat == 3 and pace.step_s < 0.001


def test_the_run_aheads_ask_the_pace_for_their_repeat_where_they_have_one():
    from scheduler.verify_ahead import VerifyAhead
    from services.scheduler.run_ahead import RunAhead

    pace = StepPace(3, 0.004, warm=1)
    decode, verify = RunAhead(repeat=3, pace=pace), VerifyAhead(repeat=3)
    verify.pace = pace
    assert decode.most() == verify.most == 1  # nothing measured yet
    for t in (0.0, 0.0005, 0.001):
        pace.tick(t)
    assert decode.most() == verify.most == 3
    assert RunAhead(repeat=2).most() == 2 and VerifyAhead(repeat=2).most == 2  # no pace: the fixed repeat
