"""The n samples of one HTTP request, run side by side and answered as OpenAI ``choices`` (whole or streamed).

    samples[i] = servicer._generate(request i)   (started already pulled: a bad request failed before this)
    complete:  drain every sample concurrently ──▶ {"choices": [choice 0 .. n-1], "usage": summed}
    stream:    each sample's chunks as they come, tagged with its index ──▶ SSE events, then usage, [DONE]

A client that hangs up aborts every sample (closing a generator aborts its request).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from fastapi import Request

from services.scheduler.http_errors import ApiError
from services.scheduler.http_logprobs import CompletionLogprobs, chat_logprobs
from services.scheduler.http_stop import StopTrimmer
from shared.rpc.gen.tandem.v1 import tandem_pb2


@dataclass
class Shape:
    """How the answer reads: chat or completion, with which extras."""

    chat: bool
    rid: str
    created: int
    model: str
    text_of: Callable[[int], str]
    logprobs: int | None = None  # alternatives per token; None: no logprobs in the answer
    echo_ids: list[int] | None = None  # completions echo: the prompt's ids (its text leads each choice)
    echo_text: str = ""
    hide_output: bool = False  # max_tokens 0 with echo: only the prompt is answered
    stop: list[str] = field(default_factory=list)  # stop strings the text ends before (http_stop.py)
    keep_stop: bool = False  # include_stop_str_in_output

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def base(self, chunk: bool = False) -> dict:
        obj = "chat.completion.chunk" if self.chat and chunk else self.object
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model}


@dataclass
class Sample:
    index: int
    gen: AsyncIterator
    text: list[str] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    prompt_logprobs: list = field(default_factory=list)
    summary: tandem_pb2.GenerateSummary | None = None
    trimmer: StopTrimmer | None = None  # a stream's stop-string hold-back

    def take(self, out: tandem_pb2.GenerateResponse) -> None:
        kind = out.WhichOneof("event")
        if kind == "tokens":
            self.text.append(out.tokens.text)
            self.logprobs.extend(out.tokens.logprobs)
            self.prompt_logprobs.extend(out.tokens.prompt_logprobs)
        elif kind == "final":
            self.summary = out.final


def finish_reason(summary: tandem_pb2.GenerateSummary) -> str:
    return "length" if tandem_pb2.FinishReason.Name(summary.finish_reason).endswith("LENGTH") else "stop"


def usage(summaries: list[tandem_pb2.GenerateSummary], hide_output: bool = False) -> dict:
    """The prompt counted once, the completions summed; ``tandem``: Tandem's own figures (summed over samples,
    the latencies of the slowest)."""
    prompt = summaries[0].num_prompt_tokens
    completion = 0 if hide_output else sum(s.num_generated_tokens for s in summaries)
    steps = sum(s.stats.num_steps for s in summaries)
    drafted = sum(s.stats.num_draft_tokens for s in summaries)
    accepted = sum(s.stats.num_accepted_tokens for s in summaries)
    return {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
        "tandem": {"ttft_ms": round(max(s.ttft_ms for s in summaries), 3),
                   "tpot_ms": round(max(s.tpot_ms for s in summaries), 3), "num_steps": steps,
                   "num_draft_tokens": drafted, "num_accepted_tokens": accepted,
                   "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
                   "mean_accepted_length": round((accepted + steps) / steps if steps else 0.0, 4),
                   "slo_attained": all(s.slo_attained for s in summaries)},
    }  # fmt: skip


def _completion_logprobs(shape: Shape, s: Sample) -> dict | None:
    if shape.logprobs is None:
        return None
    acc = CompletionLogprobs(shape.text_of)
    if shape.echo_ids is not None:
        acc.add_first(shape.echo_ids[0])
        acc.add(s.prompt_logprobs)
    if not shape.hide_output:
        acc.add(s.logprobs)
    return acc.out


def choice(shape: Shape, s: Sample) -> dict:
    text = "" if shape.hide_output else StopTrimmer(shape.stop, shape.keep_stop).whole("".join(s.text))
    reason = finish_reason(s.summary)
    if shape.chat:
        lps = None if shape.logprobs is None else {"content": chat_logprobs(s.logprobs, shape.text_of, shape.logprobs)}
        return {"index": s.index, "message": {"role": "assistant", "content": text}, "logprobs": lps,
                "finish_reason": reason}  # fmt: skip
    return {"index": s.index, "text": shape.echo_text + text if shape.echo_ids is not None else text,
            "finish_reason": reason, "logprobs": _completion_logprobs(shape, s)}  # fmt: skip


async def _watch(task: asyncio.Future, samples: list[Sample], request: Request) -> None:
    """Wait for ``task``; a client that hangs up first aborts every sample."""
    while not task.done():
        await asyncio.wait({task}, timeout=0.1)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            await close(samples, [task])
            raise asyncio.CancelledError
    task.result()


async def complete(samples: list[Sample], shape: Shape, request: Request) -> dict:
    async def drain(s: Sample) -> None:
        async for out in s.gen:
            s.take(out)

    await _watch(asyncio.ensure_future(asyncio.gather(*(drain(s) for s in samples))), samples, request)
    for s in samples:
        if s.summary is None or s.summary.error:
            raise ApiError(500, s.summary.error if s.summary else "a sample ended without a result", "server_error",
                           code="generation_failed")  # fmt: skip
    return shape.base() | {"choices": [choice(shape, s) for s in samples],
                           "usage": usage([s.summary for s in samples], shape.hide_output)}  # fmt: skip


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _delta(shape: Shape, s: Sample, out: tandem_pb2.GenerateResponse, acc: CompletionLogprobs | None) -> dict | None:
    """The chunk choice of one token event, or None when it adds nothing."""
    text = "" if shape.hide_output else s.trimmer.push(out.tokens.text)
    lps = [] if shape.hide_output else list(out.tokens.logprobs)
    if shape.chat:
        if not text and not lps:
            return None
        item = {"index": s.index, "delta": {"content": text}, "finish_reason": None, "logprobs": None}
        if shape.logprobs is not None:
            item["logprobs"] = {"content": chat_logprobs(lps, shape.text_of, shape.logprobs)}
        return item
    first = not s.text  # this sample's first chunk: an echo leads with the prompt
    s.text.append(text)
    before = len(acc.out["tokens"])
    if first and shape.echo_ids is not None:
        text = shape.echo_text + text
        if shape.logprobs is not None:
            acc.add_first(shape.echo_ids[0])
            acc.add(out.tokens.prompt_logprobs)
    chunk_lps = None
    if shape.logprobs is not None:
        acc.add(lps)
        chunk_lps = {k: v[before:] for k, v in acc.out.items()}
    if not text and not (chunk_lps and chunk_lps["tokens"]):
        return None
    return {"index": s.index, "text": text, "finish_reason": None, "logprobs": chunk_lps}


async def stream(samples: list[Sample], shape: Shape, include_usage: bool) -> AsyncIterator[bytes]:
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(s: Sample) -> None:
        try:
            async for out in s.gen:
                await queue.put((s, out))
        except Exception as exc:  # noqa: BLE001 - reported in the stream, the others go on
            await queue.put((s, exc))
        await queue.put((s, None))

    tasks = [asyncio.ensure_future(pump(s)) for s in samples]
    for s in samples:
        s.trimmer = StopTrimmer(shape.stop, shape.keep_stop)
    accs = {s.index: CompletionLogprobs(shape.text_of) for s in samples}
    try:
        if shape.chat:
            yield _event(shape.base(True) | {"choices": [{"index": s.index, "delta": {"role": "assistant", "content": ""},
                                                          "logprobs": None, "finish_reason": None} for s in samples]})
        live = len(samples)
        while live:
            s, out = await queue.get()
            if out is None:
                live -= 1
                continue
            if isinstance(out, Exception):
                yield _event({"error": {"message": str(out), "type": "server_error", "code": "generation_failed"}})
                continue
            kind = out.WhichOneof("event")
            if kind == "tokens":
                item = _delta(shape, s, out, accs[s.index])
                if item is not None:
                    yield _event(shape.base(True) | {"choices": [item]})
            elif kind == "final":
                s.summary = out.final
                if out.final.error:
                    yield _event({"error": {"message": out.final.error, "type": "server_error",
                                            "code": "generation_failed"}})  # fmt: skip
                    continue
                rest = "" if shape.hide_output else s.trimmer.push("", final=True)  # what was held back
                end = {"index": s.index, "finish_reason": finish_reason(out.final), "logprobs": None}
                end |= {"delta": {"content": rest} if rest else {}} if shape.chat else {"text": rest}
                yield _event(shape.base(True) | {"choices": [end]})
        if include_usage and all(s.summary is not None for s in samples):
            yield _event(shape.base(True) | {"choices": [], "usage": usage([s.summary for s in samples],
                                                                          shape.hide_output)})  # fmt: skip
        yield b"data: [DONE]\n\n"
    finally:
        for t in tasks:
            t.cancel()
        await close(samples, tasks)  # a disconnect lands here: closing the generators aborts the requests


async def close(samples: list[Sample], tasks: list[asyncio.Future]) -> None:
    """Close every sample's generator (its request is aborted) once the tasks running them have stopped:
    a generator still inside ``__anext__`` cannot be closed."""
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in samples:
        await s.gen.aclose()
