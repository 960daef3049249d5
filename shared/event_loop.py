"""The asyncio event loop Tandem's service processes run on: uvloop where it is installed (TANDEM_EVENT_LOOP).

    from shared.event_loop import run_loop
    run_loop(serve(settings))          # uvloop's loop, or asyncio's with TANDEM_EVENT_LOOP=asyncio

A step stream costs each process a few loop wake-ups and callbacks per message, and the scheduler's loop
runs every request's token stream and observer besides: uvloop (libuv under asyncio's API, the loop
vLLM's and SGLang's servers run on) does that work in C. On a 2-core machine it took 4-10 % off the
scheduler's per-step orchestration (docs/services.md, "Step streams"). Nothing in Tandem depends on
which loop runs: ``asyncio`` keeps the standard one, and without uvloop installed the standard one is
used with a warning.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
CHOICES = ("uvloop", "asyncio")


def loop_choice(environ=os.environ) -> str:
    choice = environ.get("TANDEM_EVENT_LOOP", "uvloop").strip().lower() or "uvloop"
    if choice not in CHOICES:
        raise ValueError(f"TANDEM_EVENT_LOOP must be one of {', '.join(CHOICES)}, got {choice!r}")
    return choice


def loop_factory(environ=os.environ):
    """The event loop factory ``TANDEM_EVENT_LOOP`` names (None: asyncio's default)."""
    if loop_choice(environ) == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        log.warning("TANDEM_EVENT_LOOP=uvloop but uvloop is not installed: running on asyncio's loop")
        return None
    return uvloop.new_event_loop


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the configured loop; a bad ``TANDEM_EVENT_LOOP`` exits with its message."""
    try:
        factory = loop_factory()
    except ValueError as exc:
        main.close()  # never awaited
        raise SystemExit(f"error: {exc}") from None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
