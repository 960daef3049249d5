"""bench.diagnostics.verify_rows: rows spread over the batch, the fitted line, and a measurement that leaves the runner clean."""

from __future__ import annotations

import pytest

from bench.diagnostics.verify_rows import line, measure, readme, spread


def test_rows_are_spread_evenly_and_every_sequence_keeps_its_root():
    assert spread(17, 4) == [5, 4, 4, 4] and spread(16, 4) == [4, 4, 4, 4] and spread(2, 4) == [1, 1, 1, 1]
    assert sum(spread(48, 1)) == 48


def test_the_line_is_the_least_squares_fit():
    a, b = line({4: 52.0, 8: 54.0, 16: 58.0, 32: 66.0})
    assert a == pytest.approx(50.0) and b == pytest.approx(0.5)


def test_a_measurement_on_a_tiny_model_rolls_every_forward_back(tiny_llama):
    from shared.engine.config import EngineConfig
    from shared.engine.runner import ModelRunner

    runner = ModelRunner(tiny_llama, EngineConfig(num_blocks=64, block_size=16))
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    ms = measure(runner, prompts, [2, 5, 9], repeats=3)
    assert set(ms) == {2, 5, 9} and all(v > 0 for v in ms.values())
    assert runner.cache.num_free_blocks == runner.cache.num_blocks  # every sequence released, nothing leaked
    text = readme({"name": "r", "command": "python -m bench.diagnostics.verify_rows", "started_unix": 0, "duration_s": 1,
                   "machine": {"cpu_model": "cpu", "cpu_count": 2, "platform": "linux", "torch": "2"},
                   "target": "/m/t", "dtype": "float32", "repeats": 3,
                   "cells": [{"threads": 1, "batch": 2, "median_ms": {"2": 1.0, "5": 2.0}, "line_ms": {"a": 0.5, "per_row": 0.3}}]})  # fmt: skip
    assert "| 1 | 2 | 1.0 | 2.0 | 0.5 + 0.300·N |" in text


def test_bad_lists_are_usage_errors_before_any_model_loads():
    from typer.testing import CliRunner

    from bench.diagnostics.verify_rows import app

    for args in (["--rows", "4,x"], ["--batch", "0"], ["--threads", ""]):
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and "takes" in result.output
