"""Where a step's tokens stop a request (scheduler/stops.py), against a token-by-token reference."""

from __future__ import annotations

import random

from scheduler.request import FinishReason, Request
from scheduler.stops import first_stop
from shared.engine.types import SamplingParams


def _reference(req: Request, tokens: list[int], detok) -> tuple[int, FinishReason | None]:
    out = list(req.output_ids)
    for j, tok in enumerate(tokens):
        out.append(tok)
        if tok in req.stop_token_ids:
            return j + 1, FinishReason.STOP_TOKEN
        if req.stop_strings and len(out) > req.sampling.min_tokens and any(s in detok(out) for s in req.stop_strings):
            return j + 1, FinishReason.STOP_STRING
        if len(out) >= req.max_new_tokens:
            return j + 1, FinishReason.LENGTH
    return len(tokens), None


def test_first_stop_matches_the_token_by_token_rule() -> None:
    detok = lambda ids: "".join(chr(97 + t % 26) for t in ids)  # noqa: E731
    rng = random.Random(3)
    for case in range(2000):
        req = Request(id=f"r{case}", prompt_ids=[1, 2], max_new_tokens=rng.randint(1, 12),
                      stop_token_ids=rng.sample(range(8), rng.randint(0, 2)),
                      stop_strings=["cd"] if rng.random() < 0.3 else [],
                      sampling=SamplingParams(min_tokens=rng.randint(0, 3)))  # fmt: skip
        req.output_ids = [rng.randrange(8, 26) for _ in range(rng.randint(0, req.max_new_tokens - 1))]
        tokens = [rng.randrange(26) for _ in range(rng.randint(0, 6))]
        before = list(req.output_ids)
        assert first_stop(req, tokens, detok, window=30) == _reference(req, tokens, detok), case
        assert req.output_ids == before  # it commits nothing itself


def test_a_stop_token_on_the_last_allowed_position_is_a_stop_not_a_length() -> None:
    req = Request(id="r", prompt_ids=[1], max_new_tokens=3, stop_token_ids=[9])
    req.output_ids = [4, 5]
    assert first_stop(req, [9, 7], None, 0) == (1, FinishReason.STOP_TOKEN)
    assert first_stop(req, [8, 9], None, 0) == (1, FinishReason.LENGTH)
