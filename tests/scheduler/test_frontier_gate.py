"""The measured pipelining gate: both modes' time per token per batch size, the faster one taken."""

from scheduler.frontier_gate import PIPE, SERIAL, MeasuredGate, MeasuredGateConfig, bucket

# per-token seconds of each mode: pipelining pays at batch 1 and costs under load (faser-eagle, 2026-11-29)
PER_TOKEN = {(0, PIPE): 0.070, (0, SERIAL): 0.078, (3, PIPE): 0.030, (3, SERIAL): 0.024}


def _run(gate: MeasuredGate, batch_size: int, steps: int, switch_cost: float = 0.0) -> list[str]:
    modes, last = [], None
    for _ in range(steps):
        mode = gate.choose(batch_size)
        tokens = 2 * batch_size
        seconds = tokens * PER_TOKEN[(bucket(batch_size), mode)] + (switch_cost if mode != last else 0.0)
        gate.observe(tokens, seconds)
        modes.append(mode)
        last = mode
    return modes


def _steps(gate: MeasuredGate, per_token: dict[str, float], n: int, batch_size: int = 1) -> list[str]:
    """``n`` steps of one token each, at each mode's time per token (read when the step runs)."""
    modes = []
    for _ in range(n):
        mode = gate.choose(batch_size)
        gate.observe(1, per_token[mode])
        modes.append(mode)
    return modes


def test_buckets():
    assert [bucket(b) for b in (1, 2, 3, 4, 7, 8, 15, 16, 64)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_learns_both_modes_in_runs_then_takes_the_faster_per_batch_size():
    cfg = MeasuredGateConfig(min_steps=3, run_steps=4, explore_every=20)
    gate = MeasuredGate(cfg)
    modes = _run(gate, 1, 8, switch_cost=1.0)  # a switch costs a second: it must not be counted
    assert modes == [PIPE] * 4 + [SERIAL] * 4  # runs of 4, the scarcer mode first
    assert gate.buckets[0].rates[PIPE].steps == 3 and gate.buckets[0].rates[SERIAL].steps == 3
    assert gate.preferred(1) == PIPE and _run(gate, 1, 8) == [PIPE] * 8
    assert abs(gate.buckets[0].rates[PIPE].per_token() - 0.070) < 1e-9  # switch steps left out
    under_load = _run(gate, 8, 40, switch_cost=1.0)
    assert gate.preferred(8) == SERIAL and gate.preferred(1) == PIPE
    assert under_load[23:39] == [SERIAL] * 16 and under_load[39] == PIPE  # the 40th step in the bucket retries


def test_the_slower_mode_is_retried_every_explore_every_steps():
    cfg = MeasuredGateConfig(min_steps=2, run_steps=3, explore_every=10)
    gate = MeasuredGate(cfg)
    modes = _run(gate, 8, 60)
    settled = modes[12:]
    runs = [i for i in range(1, len(settled)) if settled[i] == PIPE and settled[i - 1] == SERIAL]
    assert runs and all(settled[i : i + 3] == [PIPE] * 3 for i in runs if i + 3 <= len(settled))
    assert settled.count(PIPE) <= 3 * (len(settled) // 10 + 1)
    assert gate.preferred(8) == SERIAL


def test_a_serial_step_not_asked_about_makes_the_next_pipelined_one_a_switch():
    gate = MeasuredGate(MeasuredGateConfig(min_steps=1, run_steps=2))
    assert gate.choose(1) == PIPE
    gate.observe(2, 0.1)  # the first step of a run: not counted
    assert gate.buckets[0].rates[PIPE].steps == 0
    assert gate.choose(1) == PIPE
    gate.observe(2, 0.1)
    assert gate.buckets[0].rates[PIPE].steps == 1
    gate.ran_serial()
    gate.observe(2, 5.0)  # nothing pending: ignored
    assert gate.choose(1) == SERIAL  # learning: serial has no step yet; the step before ran serially too
    gate.observe(2, 0.2)
    assert gate.buckets[0].rates[SERIAL].steps == 1 and gate.buckets[0].rates[PIPE].steps == 1
    gate.choose(1)  # the serial run goes on
    gate.observe(2, 0.2)
    gate.ran_serial()
    assert gate.choose(1) == PIPE  # after a serial step, a pipelined one is a switch: not counted
    gate.observe(2, 9.0)
    assert gate.buckets[0].rates[PIPE].steps == 1


def test_disabled_always_pipelines():
    gate = MeasuredGate(MeasuredGateConfig(enabled=False))
    assert {gate.choose(b) for b in (1, 8, 32) for _ in range(10)} == {PIPE}


def test_serial_must_be_clearly_faster_to_overrule_pipelining():
    """A tie keeps the models' choice: serial has to measure ``margin`` faster per token."""
    for serial_s, expected in ((0.097, PIPE), (0.090, SERIAL)):
        gate = MeasuredGate(MeasuredGateConfig(min_steps=1, run_steps=2, margin=0.05))
        for mode, seconds in ((PIPE, 0.1), (PIPE, 0.1), (SERIAL, serial_s), (SERIAL, serial_s)):
            assert gate.choose(1) == mode
            gate.observe(1, seconds)
        assert gate.preferred(1) == expected


def test_with_a_window_a_few_slow_steps_do_not_outvote_the_rest():
    """The relay lookahead's gate: the trimmed mean of each mode's last steps, so a process warming up (its first
    pipelined steps ten times slower) does not make serial look faster for long."""
    cfg = MeasuredGateConfig(min_steps=20, run_steps=10, lag=1, window=20, margin=0.05)
    gate, decayed = MeasuredGate(cfg), MeasuredGate(cfg.model_copy(update={"window": 0}))
    for g in (gate, decayed):
        for i in range(40):  # learning: pipe 0.10 s per token with two 1.0 s outliers, serial 0.12
            mode = g.choose(1)
            slow = mode == PIPE and i in (1, 2)
            g.observe(1, 1.0 if slow else 0.10 if mode == PIPE else 0.12)
    assert gate.preferred(1) == PIPE and decayed.preferred(1) == SERIAL
    assert abs(gate.buckets[0].rates[PIPE].per_token() - 0.10) < 1e-9


def test_with_a_window_steps_that_alternate_fast_and_slow_are_judged_on_their_mean():
    """The lookahead at batch 64 on 2 cores: two of three steps fast (0.08), one slow (0.20), a mean of 0.12 per token,
    against serial's steady 0.10. Their median (0.08) would take the slower mode."""
    gate = MeasuredGate(MeasuredGateConfig(min_steps=12, run_steps=12, lag=1, window=24, margin=0.05))
    n = 0
    for _ in range(24):
        mode = gate.choose(64)
        if mode == PIPE:
            n += 1
        gate.observe(1, (0.20 if n % 3 == 0 else 0.08) if mode == PIPE else 0.10)
    assert abs(gate.buckets[4].rates[PIPE].per_token() - 0.12) < 0.01
    assert gate.preferred(64) == SERIAL


def test_with_hysteresis_the_mode_taken_stays_until_the_other_is_clearly_faster():
    cfg = MeasuredGateConfig(min_steps=1, run_steps=2, lag=1, window=4, margin=0.05, hysteresis=0.08, explore_every=1000)
    gate = MeasuredGate(cfg)
    per_token = {PIPE: 0.100, SERIAL: 0.098}  # about even: pipelining is kept (the margin)

    def steps(n):
        return _steps(gate, per_token, n)

    assert steps(4) == [PIPE, PIPE, SERIAL, SERIAL] and steps(4) == [PIPE] * 4
    gate.buckets[0].rates[SERIAL].recent.extend([0.090] * 4)  # 10 % faster: past the margin, not the hysteresis
    assert steps(4) == [PIPE] * 4
    per_token[SERIAL] = 0.080
    gate.buckets[0].rates[SERIAL].recent.extend([0.080] * 4)  # 20 % faster: taken
    assert steps(4) == [SERIAL] * 4
    per_token[PIPE] = 0.083
    gate.buckets[0].rates[PIPE].recent.extend([0.083] * 4)  # pipe back within 4 %: serial is kept
    assert steps(4) == [SERIAL] * 4
    per_token[PIPE] = 0.070
    gate.buckets[0].rates[PIPE].recent.extend([0.070] * 4)
    assert steps(4) == [PIPE] * 4


def test_abba_learning_lets_a_warming_up_process_favour_neither_mode():
    """Step times falling steadily (a process warming up) with both modes equally fast: learnt P S P S ..., the mode
    measured second always looks faster; learnt P S S P P S ..., neither does."""

    def learn(abba: bool) -> tuple[float, float, list[str]]:
        gate = MeasuredGate(MeasuredGateConfig(min_steps=8, run_steps=3, lag=1, window=64, abba=abba))
        t, modes = 1.0, []
        while not gate.buckets or min(r.steps for r in gate.buckets[0].rates.values()) < 8:
            modes.append(gate.choose(1))
            gate.observe(1, t)
            t -= 0.01
        rates = gate.buckets[0].rates
        return rates[PIPE].per_token(), rates[SERIAL].per_token(), modes

    pipe, serial, modes = learn(abba=False)
    assert serial < 0.97 * pipe  # the trend alone makes serial look 3 % faster
    pipe, serial, modes = learn(abba=True)
    assert modes[:12] == [PIPE] * 3 + [SERIAL] * 6 + [PIPE] * 3
    assert abs(serial - pipe) < 0.02 * pipe


def test_fresh_a_slow_stretch_of_the_mode_in_use_does_not_flip_it_but_a_fresh_run_of_the_other_does():
    """Serial is faster (pipe 0.13, serial 0.10 s per token). Then serial has a slow stretch (0.16): set against pipe's
    steps of long ago it looks slower, and without ``fresh`` the gate flips to pipe at once. With ``fresh`` it keeps
    serial until pipe's next exploration run, which measures pipe now: still 0.13 against serial's 0.10 again, so
    serial stays; only a run that measures pipe faster than serial's last steps flips it."""
    base = dict(min_steps=4, run_steps=3, lag=1, window=6, margin=0.05, hysteresis=0.08, explore_every=40)
    per_token = {PIPE: 0.13, SERIAL: 0.10}

    def steps(gate, n):
        return _steps(gate, per_token, n, batch_size=64)

    fresh, stale = MeasuredGate(MeasuredGateConfig(**base, fresh=True)), MeasuredGate(MeasuredGateConfig(**base))
    for gate in (fresh, stale):
        steps(gate, 16)  # learnt both: serial taken
        assert gate.buckets[4].settled == SERIAL
    per_token[SERIAL] = 0.16  # a slow stretch of serial, pipe not measured meanwhile
    assert steps(stale, 8)[-1] == PIPE  # flipped on pipe's old steps
    assert steps(fresh, 8) == [SERIAL] * 8  # kept
    per_token[SERIAL] = 0.10  # the stretch ends before pipe's next run
    modes = steps(fresh, 20)
    assert PIPE in modes and modes[-1] == SERIAL  # pipe explored (3 steps), measured slower: serial kept
    assert modes.count(PIPE) == 3
    per_token[PIPE] = 0.07  # pipe now much faster: its next run flips the gate as it ends
    modes = steps(fresh, 45)
    assert modes[-1] == PIPE


def test_the_relay_lookahead_gate_favours_neither_mode():
    """The relay's lookaheads are an option, not a cost model's choice: once taken after an exploration that measured
    them faster, they are left as soon as steps without them measure past the hysteresis faster (10 % here), and
    taken back only past the same margin the other way (services/target/draft_relay.py)."""
    from services.target.draft_relay import RELAY_GATE

    gate = MeasuredGate(RELAY_GATE)
    per_token = {PIPE: 0.10, SERIAL: 0.11}  # lookaheads 10 % faster while learning (noise, say)
    _steps(gate, per_token, 4 * RELAY_GATE.min_steps, batch_size=64)
    assert gate.buckets[4].settled == PIPE
    per_token[PIPE] = 0.12  # then 10 % slower than without: the next run without them flips the gate as it ends
    modes = _steps(gate, per_token, 2 * RELAY_GATE.explore_every, batch_size=64)
    assert modes[-1] == SERIAL and gate.buckets[4].settled == SERIAL
    per_token[PIPE] = 0.105  # 5 % faster with them: within the hysteresis, the mode taken stays
    assert _steps(gate, per_token, 2 * RELAY_GATE.explore_every, batch_size=64)[-1] == SERIAL
