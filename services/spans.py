"""Attributes on the server span of the current call.

The tracing interceptor (shared.rpc.interceptors) opens one SERVER span per
RPC, parented on the scheduler's span, and makes it current while the handler
runs; handlers only add what the call was about (architecture.md §6: batch size, k or
tree size, accepted length), as ``tandem.*`` attributes.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue


def recording() -> bool:
    """Whether the current span records: attributes that cost a pass over a batch are computed only then."""
    return trace.get_current_span().is_recording()


def annotate(**attributes: AttributeValue) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes({f"tandem.{name}": value for name, value in attributes.items()})


def event(name: str, **attributes: AttributeValue) -> None:
    """A span event on the current call's server span (offload, reload: things that happened, not sizes)."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, {f"tandem.{key}": value for key, value in attributes.items()})


def grammar_cost(engine: object, timing=None) -> dict[str, AttributeValue]:
    """The grammar work of an engine's last call (masks computed, matcher time), for ``annotate``; {} if none.
    ``timing``: a response Timing that gets the same time as ``grammar_ns``."""
    book = getattr(engine, "grammars", None)
    if book is None:
        return {}
    masks, seconds = book.stats.take()
    if timing is not None:
        timing.grammar_ns = int(seconds * 1e9)
    return {"grammar_masks": masks, "grammar_ms": round(seconds * 1e3, 3)} if masks or seconds else {}
