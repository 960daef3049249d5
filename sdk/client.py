"""Python client for the Tandem public endpoint (tandem.v1.Tandem), sync and asyncio.

    from sdk import Client

    with Client("127.0.0.1:50051") as client:
        result = client.generate("Once upon a time", max_new_tokens=64, slo_tpot_ms=50)
        print(result.text, result.finish_reason, result.tpot_ms, result.stats.acceptance_rate)

        chat = [{"role": "user", "content": "What is the capital of France?"}]   # the model's chat template
        print(client.generate(chat, max_new_tokens=32).text)                     # (server side; Info.chat_template)

        with client.stream([1, 502, 77], max_new_tokens=32, speculation=4) as stream:
            for event in stream:                  # TokenEvent per committed chunk
                print(event.text, end="", flush=True)
        print(stream.result.ttft_ms)

        r = client.generate("The sky is", temperature=0.8, top_k=40, min_p=0.05, repetition_penalty=1.1, logprobs=3)
        print([(lp.token_id, lp.logprob, [a.token_id for a in lp.top]) for lp in r.logprobs])
        for sample in client.samples("Once upon a time", n=4, temperature=1.0, seed=7):   # the HTTP API's n
            print(sample.text)

    async with AsyncClient("127.0.0.1:50051") as client:
        async for event in client.stream("Hello", max_new_tokens=16):
            ...

Failures raise ``sdk.errors.TandemError`` subclasses carrying the server's
message; a request that ends with FINISH_REASON_ERROR raises
``GenerationError`` (with the partial result). Timeouts: ``timeout`` bounds
generation calls (None: no deadline), ``control_timeout`` bounds abort, info
and health. The current OpenTelemetry context travels with every call, so a
caller's span becomes the parent of the request's trace.
"""

from __future__ import annotations

import asyncio
import os
import queue
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sdk.errors import GenerationError, ServerError, TandemError, from_rpc_error
from sdk.request import Prompt, build_request, sample_requests
from sdk.types import (
    AcceptanceStats,
    ChatMessage,
    FinishReason,
    GenerateResult,
    ModelInfo,
    Sampling,
    ServerInfo,
    Speculation,
    Timing,
    TokenEvent,
    TokenLogprob,
    TopLogprob,
)
from shared.rpc.channel import aio_channel, sync_channel
from shared.rpc.tls_mismatch import tls_problem
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2, tandem_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
_UNSET: Any = object()


# --- protobuf <-> SDK types -------------------------------------------------------------------

_FINISH_FROM_PB = {
    tandem_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    tandem_pb2.FINISH_REASON_STOP: FinishReason.STOP,
    tandem_pb2.FINISH_REASON_EOS: FinishReason.EOS,
    tandem_pb2.FINISH_REASON_ABORTED: FinishReason.ABORTED,
    tandem_pb2.FINISH_REASON_ERROR: FinishReason.ERROR,
}

def logprobs_from_pb(msgs: Sequence[common_pb2.TokenLogprobs]) -> list[TokenLogprob]:
    """The wire's TokenLogprobs as SDK models (float32 on the wire; -inf stays -inf)."""
    return [
        TokenLogprob(token_id=lp.token_id, logprob=lp.logprob,
                     top=[TopLogprob(token_id=t, logprob=v) for t, v in zip(lp.top_ids, lp.top_logprobs)])
        for lp in msgs
    ]  # fmt: skip


def _timing(msg: common_pb2.Timing) -> Timing:
    return Timing(
        queue_ms=msg.queue_ns / 1e6, forward_ms=msg.forward_ns / 1e6, total_ms=msg.total_ns / 1e6,
        start_unix_ns=msg.start_unix_ns,
    )  # fmt: skip


def _apply_summary(result: GenerateResult, summary: tandem_pb2.GenerateSummary) -> GenerateResult:
    s = summary.stats
    result.finish_reason = _FINISH_FROM_PB.get(summary.finish_reason, FinishReason.UNSPECIFIED)
    result.error = summary.error
    result.num_prompt_tokens = summary.num_prompt_tokens or result.num_prompt_tokens
    result.ttft_ms = summary.ttft_ms
    result.tpot_ms = summary.tpot_ms
    result.slo_attained = summary.slo_attained
    result.stats = AcceptanceStats(
        num_steps=s.num_steps, num_draft_tokens=s.num_draft_tokens, num_accepted_tokens=s.num_accepted_tokens,
        mean_accepted_length=s.mean_accepted_length, acceptance_rate=s.acceptance_rate,
    )  # fmt: skip
    result.timing = _timing(summary.timing)
    return result


def result_from_pb(msg: tandem_pb2.GenerateResult) -> GenerateResult:
    result = GenerateResult(
        request_id=msg.request_id,
        token_ids=list(msg.token_ids),
        text=msg.text,
        token_timestamps_unix_ns=list(msg.token_timestamps_unix_ns),
        logprobs=logprobs_from_pb(msg.logprobs),
        prompt_logprobs=logprobs_from_pb(msg.prompt_logprobs),
    )
    return _apply_summary(result, msg.summary)


def _model_info(msg: common_pb2.ServiceInfo) -> ModelInfo:
    return ModelInfo(**{f.name: getattr(msg, f.name) for f in msg.DESCRIPTOR.fields})


def info_from_pb(msg: tandem_pb2.TandemInfo) -> ServerInfo:
    return ServerInfo(
        service_version=msg.service_version,
        queue_policy=msg.queue_policy,
        speculation_policy=msg.speculation_policy,
        num_running=msg.num_running,
        num_waiting=msg.num_waiting,
        chat_template=msg.chat_template,
        target=_model_info(msg.target) if msg.HasField("target") else None,
        draft=_model_info(msg.draft) if msg.HasField("draft") else None,
    )


def _check(result: GenerateResult) -> GenerateResult:
    if result.finish_reason == FinishReason.ERROR:
        raise GenerationError(result.error or "generation failed", result)
    return result


class _Assembler:
    """Folds the Generate stream (started, tokens..., final) into events and a result."""

    def __init__(self) -> None:
        self.result: GenerateResult | None = None
        self._partial = GenerateResult(request_id="")
        self.finished = False

    @property
    def request_id(self) -> str | None:
        return self._partial.request_id or None

    def feed(self, msg: tandem_pb2.GenerateResponse) -> TokenEvent | None:
        if msg.request_id:
            self._partial.request_id = msg.request_id
        kind = msg.WhichOneof("event")
        if kind == "started":
            self._partial.num_prompt_tokens = msg.started.num_prompt_tokens
        elif kind == "tokens":
            chunk = msg.tokens
            self._partial.token_ids.extend(chunk.token_ids)
            self._partial.text += chunk.text
            self._partial.token_timestamps_unix_ns.extend(chunk.timestamps_unix_ns)
            event = TokenEvent(
                request_id=self._partial.request_id,
                token_ids=list(chunk.token_ids),
                text=chunk.text,
                timestamps_unix_ns=list(chunk.timestamps_unix_ns),
                num_accepted=chunk.num_accepted,
                logprobs=logprobs_from_pb(chunk.logprobs),
                prompt_logprobs=logprobs_from_pb(chunk.prompt_logprobs),
            )
            self._partial.logprobs.extend(event.logprobs)
            self._partial.prompt_logprobs.extend(event.prompt_logprobs)
            return event
        elif kind == "final":
            self.result = _apply_summary(self._partial, msg.final)
            self.finished = True
        return None

    def finish(self) -> GenerateResult:
        if self.result is None:
            raise ServerError("the Generate stream ended without a final message", code="INTERNAL")
        return _check(self.result)


# --- sync -------------------------------------------------------------------------------------


class TokenStream:
    """Iterator of ``TokenEvent``s for one request; ``result`` holds the summary once it ends.

    Leaving a ``with`` block early (or ``cancel()``) cancels the call; the server
    then aborts the request.
    """

    def __init__(self, call: Any, target: str, tls: bool = False) -> None:
        self._call = call
        self._target = target
        self._tls = tls
        self._asm = _Assembler()

    @property
    def request_id(self) -> str | None:
        """The request id, known once the first message arrived."""
        return self._asm.request_id

    @property
    def result(self) -> GenerateResult | None:
        return self._asm.result

    def __iter__(self) -> Iterator[TokenEvent]:
        try:
            for msg in self._call:
                event = self._asm.feed(msg)
                if event is not None:
                    yield event
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self._target, tls_hint=tls_hint(exc, self._target, self._tls)) from None
        self._asm.finish()

    def collect(self) -> GenerateResult:
        """Drain the stream and return the result."""
        for _ in self:
            pass
        return self._asm.finish()

    def cancel(self) -> None:
        self._call.cancel()

    def __enter__(self) -> "TokenStream":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._asm.finished:
            self.cancel()


class _Endpoint:
    """What both clients share: stubs, timeouts, metadata, and every request built and reply parsed once.

    Each public call is a plan (stub method, request, timeout, parse); ``Client`` runs it blocking,
    ``AsyncClient`` awaits it.
    """

    def __init__(
        self,
        target: str,
        channel: Any,
        *,
        timeout: float | None,
        control_timeout: float,
        metadata: Sequence[tuple[str, str]],
        wait_for_ready: bool,
        tls: bool = False,
    ) -> None:
        self.target = target
        self._tls = tls
        self.timeout = timeout
        self.control_timeout = control_timeout
        self._metadata = list(metadata) or None
        self._wait = wait_for_ready
        self._channel = channel
        self._stub = tandem_pb2_grpc.TandemStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)

    def _deadline(self, timeout: float | None, *, control: bool = False) -> float | None:
        return (self.control_timeout if control else self.timeout) if timeout is _UNSET else timeout

    def _open_stream(self, prompt: Prompt, timeout: float | None, kwargs: dict) -> Any:
        request = build_request(prompt, **kwargs)
        return self._stub.Generate(
            request, timeout=self._deadline(timeout), metadata=self._metadata, wait_for_ready=self._wait
        )

    def _generate_plan(self, prompt: Prompt, timeout: float | None, kwargs: dict) -> tuple:
        parse = lambda msg: _check(result_from_pb(msg))  # noqa: E731
        return self._stub.GenerateUnary, build_request(prompt, **kwargs), self._deadline(timeout), parse

    def _samples_plan(self, prompt: Prompt, n: int, timeout: float | None, kwargs: dict) -> tuple:
        parse = lambda msg: _check(result_from_pb(msg))  # noqa: E731
        return self._stub.GenerateUnary, sample_requests(prompt, n, **kwargs), self._deadline(timeout), parse

    def _abort_plan(self, request_id: str, timeout: float | None) -> tuple:
        request = tandem_pb2.AbortRequest(request_id=request_id)
        return self._stub.Abort, request, self._deadline(timeout, control=True), lambda reply: reply.aborted

    def _info_plan(self, timeout: float | None) -> tuple:
        return self._stub.Info, common_pb2.InfoRequest(), self._deadline(timeout, control=True), info_from_pb

    def _health_plan(self, service: str, timeout: float | None) -> tuple:
        parse = lambda reply: health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)  # noqa: E731
        request = health_pb2.HealthCheckRequest(service=service)
        return self._health.Check, request, self._deadline(timeout, control=True), parse


def _security(
    api_key: str | None, tls: bool, root_certificates: str | Path | bytes | None, metadata: Sequence[tuple[str, str]]
) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, str]]]:
    """Channel credentials (TLS when ``tls`` or a CA bundle is given) and the metadata with the API key.

    ``api_key`` defaults to $TANDEM_API_KEY; it travels as ``authorization: Bearer <key>``."""
    key = api_key if api_key is not None else os.environ.get("TANDEM_API_KEY") or None
    metadata = [*metadata, *((("authorization", f"Bearer {key}"),) if key else ())]
    if root_certificates is None and not tls:
        return None, metadata
    roots = Path(root_certificates).read_bytes() if isinstance(root_certificates, (str, Path)) else root_certificates
    return grpc.ssl_channel_credentials(root_certificates=roots), metadata


def tls_hint(exc: Any, target: str, tls: bool) -> str | None:
    """What is wrong with TLS when a call could not connect (a plaintext client at a TLS endpoint, TLS at a
    plaintext one, an untrusted certificate), else None. May dial ``target`` once (a TLS hello, <= 2 s)."""
    code = exc.code() if hasattr(exc, "code") else None
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return None
    return tls_problem(target, tls=tls, details=(exc.details() if hasattr(exc, "details") else None) or "")


class Client(_Endpoint):
    """Blocking client. ``target`` is host:port of the scheduler."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = None,
        control_timeout: float = 10.0,
        metadata: Sequence[tuple[str, str]] = (),
        wait_for_ready: bool = False,
        tracing: bool = True,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: str | Path | bytes | None = None,
    ) -> None:
        credentials, metadata = _security(api_key, tls, root_certificates, metadata)
        super().__init__(
            target,
            sync_channel(target, tracing=tracing, credentials=credentials),
            timeout=timeout,
            control_timeout=control_timeout,
            metadata=metadata,
            wait_for_ready=wait_for_ready,
            tls=credentials is not None,
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, method: Any, request: Any, timeout: float | None, parse: Any) -> Any:
        try:
            reply = method(request, timeout=timeout, metadata=self._metadata, wait_for_ready=self._wait)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.target, tls_hint=tls_hint(exc, self.target, self._tls)) from None
        return parse(reply)

    def generate(self, prompt: Prompt, *, timeout: float | None = _UNSET, **kwargs: Any) -> GenerateResult:
        """Generate to completion (GenerateUnary). Keyword arguments: see ``build_request``."""
        return self._run(*self._generate_plan(prompt, timeout, kwargs))

    def stream(self, prompt: Prompt, *, timeout: float | None = _UNSET, **kwargs: Any) -> TokenStream:
        """Start a streaming generation; iterate the returned TokenStream for TokenEvents."""
        return TokenStream(self._open_stream(prompt, timeout, kwargs), self.target, self._tls)

    def samples(self, prompt: Prompt, n: int, *, timeout: float | None = _UNSET, **kwargs: Any) -> list[GenerateResult]:
        """``n`` samples of ``prompt``, generated concurrently (the HTTP API's ``n``; ``sample_requests``), in order.
        The first failure cancels the other calls (the server aborts them) and raises."""
        method, requests, deadline, parse = self._samples_plan(prompt, n, timeout, kwargs)
        calls = [method.future(r, timeout=deadline, metadata=self._metadata, wait_for_ready=self._wait)
                 for r in requests]  # fmt: skip
        finished: queue.SimpleQueue = queue.SimpleQueue()
        for call in calls:
            call.add_done_callback(finished.put)
        results: dict[int, GenerateResult] = {}
        try:
            while len(results) < len(calls):  # in the order they finish, so a failure is seen when it happens
                call = finished.get()
                results[next(i for i, c in enumerate(calls) if c is call)] = parse(call.result())
            return [results[i] for i in range(len(calls))]
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.target, tls_hint=tls_hint(exc, self.target, self._tls)) from None
        finally:
            for call in calls:
                call.cancel()  # no-op on finished calls

    def abort(self, request_id: str, *, timeout: float | None = _UNSET) -> bool:
        """Stop a request; False when it had already finished. Unknown ids raise NotFoundError."""
        return self._run(*self._abort_plan(request_id, timeout))

    def info(self, *, timeout: float | None = _UNSET) -> ServerInfo:
        return self._run(*self._info_plan(timeout))

    def health(self, service: str = "", *, timeout: float | None = _UNSET) -> str:
        """grpc.health.v1 status of ``service`` ("" = the server as a whole): "SERVING", "NOT_SERVING", ..."""
        return self._run(*self._health_plan(service, timeout))


# --- asyncio ----------------------------------------------------------------------------------


class AsyncTokenStream:
    """Async iterator of ``TokenEvent``s; ``result`` holds the summary once it ends."""

    def __init__(self, call: Any, target: str, tls: bool = False) -> None:
        self._call = call
        self._target = target
        self._tls = tls
        self._asm = _Assembler()

    @property
    def request_id(self) -> str | None:
        return self._asm.request_id

    @property
    def result(self) -> GenerateResult | None:
        return self._asm.result

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        try:
            async for msg in self._call:
                event = self._asm.feed(msg)
                if event is not None:
                    yield event
        except grpc.aio.AioRpcError as exc:
            hint = await asyncio.to_thread(tls_hint, exc, self._target, self._tls)
            raise from_rpc_error(exc, self._target, tls_hint=hint) from None
        self._asm.finish()

    async def collect(self) -> GenerateResult:
        async for _ in self:
            pass
        return self._asm.finish()

    def cancel(self) -> None:
        self._call.cancel()

    async def __aenter__(self) -> "AsyncTokenStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._asm.finished:
            self.cancel()


class AsyncClient(_Endpoint):
    """asyncio client; same methods as ``Client``, awaited (``stream`` returns an async iterator)."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = None,
        control_timeout: float = 10.0,
        metadata: Sequence[tuple[str, str]] = (),
        wait_for_ready: bool = False,
        tracing: bool = True,
        api_key: str | None = None,
        tls: bool = False,
        root_certificates: str | Path | bytes | None = None,
    ) -> None:
        credentials, metadata = _security(api_key, tls, root_certificates, metadata)
        super().__init__(
            target,
            aio_channel(target, tracing=tracing, credentials=credentials),
            timeout=timeout,
            control_timeout=control_timeout,
            metadata=metadata,
            wait_for_ready=wait_for_ready,
            tls=credentials is not None,
        )

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, method: Any, request: Any, timeout: float | None, parse: Any) -> Any:
        try:
            reply = await method(request, timeout=timeout, metadata=self._metadata, wait_for_ready=self._wait)
        except grpc.aio.AioRpcError as exc:
            hint = await asyncio.to_thread(tls_hint, exc, self.target, self._tls)
            raise from_rpc_error(exc, self.target, tls_hint=hint) from None
        return parse(reply)

    async def generate(self, prompt: Prompt, *, timeout: float | None = _UNSET, **kwargs: Any) -> GenerateResult:
        return await self._run(*self._generate_plan(prompt, timeout, kwargs))

    def stream(self, prompt: Prompt, *, timeout: float | None = _UNSET, **kwargs: Any) -> AsyncTokenStream:
        return AsyncTokenStream(self._open_stream(prompt, timeout, kwargs), self.target, self._tls)

    async def samples(self, prompt: Prompt, n: int, *, timeout: float | None = _UNSET,
                      **kwargs: Any) -> list[GenerateResult]:  # fmt: skip
        """As ``Client.samples``: n concurrent requests, the first failure cancels the rest and raises."""
        method, requests, deadline, parse = self._samples_plan(prompt, n, timeout, kwargs)
        tasks = [asyncio.ensure_future(self._run(method, r, deadline, parse)) for r in requests]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t for t in tasks if t.done() and t.exception() is not None), None)
            if failed is not None:
                raise failed.exception()
            return [task.result() for task in tasks]
        finally:
            for task in tasks:
                task.cancel()

    async def abort(self, request_id: str, *, timeout: float | None = _UNSET) -> bool:
        return await self._run(*self._abort_plan(request_id, timeout))

    async def info(self, *, timeout: float | None = _UNSET) -> ServerInfo:
        return await self._run(*self._info_plan(timeout))

    async def health(self, service: str = "", *, timeout: float | None = _UNSET) -> str:
        return await self._run(*self._health_plan(service, timeout))


__all__ = [
    "AcceptanceStats",
    "AsyncClient",
    "AsyncTokenStream",
    "ChatMessage",
    "Client",
    "FinishReason",
    "GenerateResult",
    "ModelInfo",
    "Sampling",
    "ServerInfo",
    "Speculation",
    "TandemError",
    "Timing",
    "TokenEvent",
    "TokenLogprob",
    "TokenStream",
    "TopLogprob",
    "build_request",
]
