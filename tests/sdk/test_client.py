"""The SDK against a fake Tandem servicer on loopback (real gRPC, real interceptors)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from sdk import (
    AsyncClient,
    CancelledError,
    Client,
    DeadlineExceededError,
    FinishReason,
    GenerationError,
    InvalidRequestError,
    NotFoundError,
    ServerError,
    TandemError,
    UnavailableError,
)
from sdk.errors import ContextLengthError, OverloadedError
from shared.rpc.gen.tandem.v1 import common_pb2, tandem_pb2, tandem_pb2_grpc
from shared.rpc.server import TANDEM_SERVICE, add_health, bind, create_server


class NoSuchRequest(Exception):
    grpc_code = "NOT_FOUND"


class FakeTandem(tandem_pb2_grpc.TandemServicer):
    """Token i of a request is 100 + i, text "t{i} ", two tokens per chunk; prompts steer behaviour."""

    def __init__(self) -> None:
        self.requests: list[tandem_pb2.GenerateRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.cancelled: list[str] = []
        self.live: dict[str, asyncio.Event] = {}
        self.done: set[str] = set()
        self._next = 0

    def _id(self, request: tandem_pb2.GenerateRequest) -> str:
        if request.request_id:
            return request.request_id
        self._next += 1
        return f"srv-{self._next}"

    def _validate(self, request: tandem_pb2.GenerateRequest) -> None:
        prompt = request.text if request.WhichOneof("prompt") == "text" else None
        if prompt == "too long":
            raise OverloadedOrLong("prompt of 9000 tokens exceeds max_context 4096")
        if prompt == "busy":
            raise Busy("KV cache full, retry later")
        if request.max_new_tokens > 1000:
            raise ValueError(f"max_new_tokens {request.max_new_tokens} > 1000")
        if prompt == "flaky" and request.request_id.endswith("-1"):  # n samples: sample 1 fails, the rest are slow
            raise Busy("KV cache full, retry later")

    async def Generate(self, request, context):
        self.requests.append(request)
        self.metadata.append({m.key: m.value for m in context.invocation_metadata()})
        self._validate(request)
        rid = self._id(request)
        aborted = self.live.setdefault(rid, asyncio.Event())
        prompt = request.text
        num_prompt = len(request.token_ids.ids) or len(prompt.split())
        yield tandem_pb2.GenerateResponse(
            request_id=rid,
            started=tandem_pb2.GenerateStarted(num_prompt_tokens=num_prompt, arrival_unix_ns=time.time_ns()),
        )
        if prompt == "hang":
            await asyncio.sleep(30)
        reason = tandem_pb2.FINISH_REASON_LENGTH
        error = ""
        n = 0
        try:
            while n < request.max_new_tokens:
                if aborted.is_set():
                    reason = tandem_pb2.FINISH_REASON_ABORTED
                    break
                ids = [100 + i for i in range(n, min(n + 2, request.max_new_tokens))]
                yield tandem_pb2.GenerateResponse(
                    request_id=rid,
                    tokens=tandem_pb2.TokenChunk(
                        token_ids=ids,
                        text="".join(f"t{i - 100} " for i in ids),
                        timestamps_unix_ns=[time.time_ns()] * len(ids),
                        num_accepted=len(ids) - 1,
                    ),
                )
                n += len(ids)
                if prompt == "boom":
                    raise RuntimeError("verify worker died")
                if prompt == "explode":
                    reason, error = tandem_pb2.FINISH_REASON_ERROR, "draft service crashed"
                    break
                if prompt in ("slow", "flaky"):
                    try:
                        await asyncio.wait_for(aborted.wait(), 0.05)
                    except TimeoutError:
                        pass
        except (asyncio.CancelledError, GeneratorExit):  # cancelled at an await, or closed at a yield
            self.cancelled.append(rid)
            raise
        finally:
            self.done.add(rid)
        yield tandem_pb2.GenerateResponse(
            request_id=rid,
            final=tandem_pb2.GenerateSummary(
                finish_reason=reason,
                error=error,
                num_prompt_tokens=num_prompt,
                num_generated_tokens=n,
                ttft_ms=12.5,
                tpot_ms=4.0,
                slo_attained=request.slo.tpot_ms == 0 or request.slo.tpot_ms >= 4.0,
                stats=tandem_pb2.AcceptanceStats(
                    num_steps=(n + 1) // 2,
                    num_draft_tokens=n,
                    num_accepted_tokens=n // 2,
                    mean_accepted_length=2.0,
                    acceptance_rate=0.5,
                ),
                timing=common_pb2.Timing(queue_ns=1_000_000, total_ns=50_000_000),
            ),
        )

    async def GenerateUnary(self, request, context):
        result = tandem_pb2.GenerateResult()
        async for msg in self.Generate(request, context):
            kind = msg.WhichOneof("event")
            result.request_id = msg.request_id
            if kind == "tokens":
                result.token_ids.extend(msg.tokens.token_ids)
                result.text += msg.tokens.text
                result.token_timestamps_unix_ns.extend(msg.tokens.timestamps_unix_ns)
            elif kind == "final":
                result.summary.CopyFrom(msg.final)
        return result

    async def Abort(self, request, context):
        event = self.live.get(request.request_id)
        if event is None:
            raise NoSuchRequest(f"no request {request.request_id!r}")
        if request.request_id in self.done:
            return tandem_pb2.AbortResponse(aborted=False)
        event.set()
        return tandem_pb2.AbortResponse(aborted=True)

    async def Info(self, request, context):
        return tandem_pb2.TandemInfo(
            service_version="0.1.0",
            queue_policy="fcfs",
            speculation_policy="smartspec",
            num_running=1,
            target=common_pb2.ServiceInfo(role="target", model_name="tiny-llama", vocab_size=512, device="cpu"),
        )


class OverloadedOrLong(Exception):
    grpc_code = "OUT_OF_RANGE"


class Busy(Exception):
    grpc_code = "RESOURCE_EXHAUSTED"


@pytest.fixture(scope="module")
def server():
    """The fake servicer on its own event loop thread, so blocking clients can call it."""
    servicer = FakeTandem()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict = {}

    async def start() -> None:
        srv = create_server()
        tandem_pb2_grpc.add_TandemServicer_to_server(servicer, srv)
        await add_health(srv, [TANDEM_SERVICE])
        state["port"] = bind(srv, "127.0.0.1:0")
        await srv.start()
        state["server"] = srv
        ready.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"127.0.0.1:{state['port']}", servicer
    asyncio.run_coroutine_threadsafe(state["server"].stop(None), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


# --- sync ---------------------------------------------------------------------------------------


def test_generate_unary(server) -> None:
    address, fake = server
    with Client(address, metadata=[("x-tenant", "acme")]) as client:
        result = client.generate(
            "hello there",
            max_new_tokens=5,
            slo_tpot_ms=50,
            slo_ttft_ms=500,
            temperature=0.7,
            seed=3,
            speculation=4,
            stop=["\n"],
            priority=2,
        )
    assert result.request_id.startswith("srv-")
    assert result.token_ids == [100, 101, 102, 103, 104] and result.text == "t0 t1 t2 t3 t4 "
    assert result.finish_reason == FinishReason.LENGTH and result.num_generated == 5
    assert result.num_prompt_tokens == 2 and result.ttft_ms == 12.5 and result.tpot_ms == 4.0
    assert result.slo_attained and len(result.token_timestamps_unix_ns) == 5
    assert result.stats.acceptance_rate == 0.5 and result.timing.queue_ms == 1.0 and result.timing.total_ms == 50.0
    sent = fake.requests[-1]
    assert sent.text == "hello there" and sent.max_new_tokens == 5 and list(sent.stop) == ["\n"]
    assert sent.slo.tpot_ms == 50 and sent.slo.ttft_ms == 500 and sent.priority == 2
    assert sent.sampling.temperature == 0.7 and sent.sampling.seed == 3 and sent.sampling.top_p == 1.0
    assert sent.speculation.mode == tandem_pb2.SPECULATION_MODE_FIXED and sent.speculation.k == 4
    assert fake.metadata[-1]["x-tenant"] == "acme"


def test_stream_tokens_and_result(server) -> None:
    address, fake = server
    with Client(address) as client:
        stream = client.stream([1, 2, 3], max_new_tokens=5, request_id="mine-1", speculation="off")
        events = list(stream)
    assert [e.token_ids for e in events] == [[100, 101], [102, 103], [104]]
    assert "".join(e.text for e in events) == "t0 t1 t2 t3 t4 "
    assert all(e.request_id == "mine-1" and len(e.timestamps_unix_ns) == len(e.token_ids) for e in events)
    assert stream.request_id == "mine-1"
    assert stream.result.finish_reason == FinishReason.LENGTH and stream.result.token_ids == [100, 101, 102, 103, 104]
    assert stream.result.num_prompt_tokens == 3
    sent = fake.requests[-1]
    assert list(sent.token_ids.ids) == [1, 2, 3] and sent.speculation.mode == tandem_pb2.SPECULATION_MODE_OFF


def test_abort_a_running_stream(server) -> None:
    address, _ = server
    with Client(address) as client:
        stream = client.stream("slow", max_new_tokens=1000)
        events = iter(stream)
        first = next(events)
        assert client.abort(first.request_id) is True
        rest = list(events)
        assert stream.result.finish_reason == FinishReason.ABORTED
        assert len(rest) < 10  # stopped long before 1000 tokens
        assert client.abort(first.request_id) is False  # already finished
        with pytest.raises(NotFoundError, match="no request 'nope'") as info:
            client.abort("nope")
        assert info.value.code == "NOT_FOUND" and isinstance(info.value, KeyError)


def test_leaving_a_stream_early_cancels_the_call(server) -> None:
    address, fake = server
    with Client(address) as client:
        with client.stream("slow", max_new_tokens=1000, request_id="leaver") as stream:
            for _ in stream:
                break
        deadline = time.monotonic() + 5
        while "leaver" not in fake.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
    assert "leaver" in fake.cancelled


@pytest.mark.parametrize(
    "prompt, kwargs, error, message",
    [
        ("hi", {"max_new_tokens": 5000}, InvalidRequestError, "max_new_tokens 5000 > 1000"),
        ("too long", {}, ContextLengthError, "exceeds max_context"),
        ("busy", {}, OverloadedError, "KV cache full"),
        ("boom", {}, ServerError, "RuntimeError: verify worker died"),
    ],
)
def test_server_errors_map_to_sdk_errors(server, prompt, kwargs, error, message) -> None:
    address, _ = server
    with Client(address) as client:
        with pytest.raises(error, match=message):
            client.generate(prompt, **kwargs)
        with pytest.raises(error, match=message):
            list(client.stream(prompt, **kwargs))
        assert client.generate("still fine", max_new_tokens=1).token_ids == [100]  # server unharmed


def test_generation_error_carries_partial_result(server) -> None:
    address, _ = server
    with Client(address) as client:
        with pytest.raises(GenerationError, match="draft service crashed") as info:
            client.generate("explode", max_new_tokens=8)
    assert info.value.result.token_ids == [100, 101] and info.value.result.finish_reason == FinishReason.ERROR


def test_client_side_validation_raises_before_calling(server) -> None:
    address, fake = server
    before = len(fake.requests)
    with Client(address) as client:
        for bad in [
            dict(prompt="", max_new_tokens=4),
            dict(prompt=[], max_new_tokens=4),
            dict(prompt=[1, -2], max_new_tokens=4),
            dict(prompt="x", max_new_tokens=0),
            dict(prompt="x", temperature=-1.0),
            dict(prompt="x", top_p=0.0),
            dict(prompt="x", speculation={"mode": "fixed"}),
            dict(prompt="x", slo_tpot_ms=-5),
            dict(prompt=[{"role": "user"}], max_new_tokens=4),  # a chat message without content
        ]:
            prompt = bad.pop("prompt")
            with pytest.raises(InvalidRequestError):
                client.generate(prompt, **bad)
    assert len(fake.requests) == before


def test_timeouts_and_unreachable_server(server) -> None:
    address, _ = server
    with Client(address, timeout=0.3) as client:
        started = time.monotonic()
        with pytest.raises(DeadlineExceededError) as info:
            client.generate("hang", max_new_tokens=2)
        assert time.monotonic() - started < 5 and isinstance(info.value, TimeoutError)
        with pytest.raises(DeadlineExceededError):
            list(client.stream("hang", max_new_tokens=2))

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sock.getsockname()[1]}"
    with Client(dead, control_timeout=2) as client:
        with pytest.raises(UnavailableError, match=f"cannot reach Tandem at {dead}") as info:
            client.info()
        assert isinstance(info.value, ConnectionError) and isinstance(info.value, TandemError)


def test_info_and_health(server) -> None:
    address, _ = server
    with Client(address) as client:
        info = client.info()
        assert (info.queue_policy, info.speculation_policy, info.num_running) == ("fcfs", "smartspec", 1)
        assert info.target.model_name == "tiny-llama" and info.target.vocab_size == 512 and info.draft is None
        assert client.health() == "SERVING" and client.health(TANDEM_SERVICE) == "SERVING"
        with pytest.raises(NotFoundError):
            client.health("no.such.Service")


def test_cancelling_a_stream_raises_cancelled(server) -> None:
    address, _ = server
    with Client(address) as client:
        stream = client.stream("slow", max_new_tokens=1000)
        it = iter(stream)
        next(it)
        stream.cancel()
        with pytest.raises(CancelledError):
            list(it)


# --- asyncio ------------------------------------------------------------------------------------


def test_async_client(server) -> None:
    address, fake = server

    async def main() -> None:
        async with AsyncClient(address) as client:
            result = await client.generate("a b c", max_new_tokens=3, sampling={"temperature": 0.5, "top_p": 0.9})
            assert result.token_ids == [100, 101, 102] and result.num_prompt_tokens == 3
            assert fake.requests[-1].sampling.top_p == pytest.approx(0.9)

            stream = client.stream("x", max_new_tokens=4)
            chunks = [e.token_ids async for e in stream]
            assert chunks == [[100, 101], [102, 103]] and stream.result.finish_reason == FinishReason.LENGTH

            stream = client.stream("slow", max_new_tokens=1000)
            async for event in stream:
                assert await client.abort(event.request_id) is True
            assert stream.result.finish_reason == FinishReason.ABORTED

            with pytest.raises(InvalidRequestError, match="max_new_tokens 2000"):
                await client.generate("x", max_new_tokens=2000)
            with pytest.raises(ServerError):
                await stream_all(client.stream("boom", max_new_tokens=4))
            with pytest.raises(GenerationError):
                await client.generate("explode", max_new_tokens=4)
            with pytest.raises(NotFoundError):
                await client.abort("missing")
            with pytest.raises(DeadlineExceededError):
                await client.generate("hang", max_new_tokens=1, timeout=0.3)
            assert (await client.info()).queue_policy == "fcfs"
            assert await client.health() == "SERVING"
            collected = await client.stream("y", max_new_tokens=3).collect()
            assert collected.text == "t0 t1 t2 "

    async def stream_all(stream):
        return [e async for e in stream]

    asyncio.run(main())


def test_a_conversation_travels_as_chat_messages() -> None:
    """A list of messages is a chat prompt: the server renders it with the model's template (GenerateRequest.chat)."""
    from sdk import ChatMessage
    from sdk.client import build_request

    request = build_request([{"role": "system", "content": "Be brief."}, ChatMessage(role="user", content="Hi")],
                            max_new_tokens=8)  # fmt: skip
    assert request.WhichOneof("prompt") == "chat"
    assert [(m.role, m.content) for m in request.chat.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert build_request([1, 2], max_new_tokens=8).WhichOneof("prompt") == "token_ids"


# --- sampling knobs, logprobs, n samples --------------------------------------------------------


def test_every_sampling_knob_reaches_the_wire(server) -> None:
    address, fake = server
    knobs = dict(top_k=40, min_p=0.05, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=-0.25,
                 min_tokens=2, logprobs=3, prompt_logprobs=0)  # fmt: skip

    def sent(request_id: str) -> tandem_pb2.GenerateRequest:
        return next(r for r in fake.requests if r.request_id == request_id)

    with Client(address) as client:
        client.generate("x", max_new_tokens=4, temperature=0.9, ignore_eos=True, request_id="knobs", **knobs)
        assert {k: getattr(sent("knobs").sampling, k) for k in knobs} == pytest.approx(knobs)
        assert sent("knobs").ignore_eos and sent("knobs").sampling.temperature == 0.9
        client.generate("x", max_new_tokens=4, sampling={"top_k": 5, "logprobs": 1}, top_k=7, request_id="mixed")
        assert sent("mixed").sampling.top_k == 7 and sent("mixed").sampling.logprobs == 1  # the keyword wins
        client.generate("x", max_new_tokens=4, request_id="neutral")  # neutral values: optional fields stay unset
        neutral = sent("neutral").sampling
        assert not any(neutral.HasField(f) for f in ("repetition_penalty", "logprobs", "prompt_logprobs", "seed"))
        assert (neutral.top_k, neutral.min_p, neutral.min_tokens, neutral.frequency_penalty) == (0, 0.0, 0, 0.0)


@pytest.mark.parametrize("bad, field", [
    ({"top_k": -1}, "top_k"), ({"top_k": 1 << 32}, "top_k"), ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"), ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"), ({"presence_penalty": -3}, "presence_penalty"),
    ({"min_tokens": -1}, "min_tokens"), ({"min_tokens": 9}, "min_tokens"), ({"logprobs": 21}, "logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"), ({"temperature": float("nan")}, "temperature"),
    ({"seed": 1 << 64}, "seed"), ({"sampling": {"top_kk": 3}}, "top_kk"),
])  # fmt: skip
def test_bad_sampling_values_raise_naming_the_field_without_a_call(server, bad, field) -> None:
    address, fake = server
    before = len(fake.requests)
    with Client(address) as client:
        with pytest.raises(InvalidRequestError, match=rf"sampling\.{field}\b"):
            client.generate("x", max_new_tokens=8, **bad)
        with pytest.raises(InvalidRequestError, match=rf"sampling\.{field}\b"):
            client.stream("x", max_new_tokens=8, **bad)
        with pytest.raises(InvalidRequestError, match=rf"sampling\.{field}\b"):
            client.samples("x", 2, max_new_tokens=8, **bad)
    assert len(fake.requests) == before


def test_samples_are_n_requests_as_the_http_api_sends_them(server) -> None:
    from shared.rpc.sample_seed import sample_seed

    address, fake = server
    with Client(address) as client:
        results = client.samples("a b", 3, max_new_tokens=2, temperature=1.0, seed=21, request_id="many")
        assert [r.request_id for r in results] == ["many-0", "many-1", "many-2"]
        assert all(r.token_ids == [100, 101] for r in results)
        sent = {r.request_id: r.sampling.seed for r in fake.requests[-3:]}
        assert sent == {f"many-{i}": sample_seed(21, i) for i in range(3)} and sent["many-0"] == 21
        assert client.samples("a", 1, max_new_tokens=1, request_id="one")[0].request_id == "one"
        with pytest.raises(InvalidRequestError, match="n must be"):
            client.samples("a", 0, max_new_tokens=1)
        with pytest.raises(GenerationError, match="draft service crashed"):
            client.samples("explode", 2, max_new_tokens=4)

    async def main() -> None:
        async with AsyncClient(address) as client:
            results = await client.samples("c d", 2, max_new_tokens=3, seed=5)
            assert [r.token_ids for r in results] == [[100, 101, 102]] * 2
            assert sorted(r.sampling.seed for r in fake.requests[-2:]) == sorted([5, sample_seed(5, 1)])
            with pytest.raises(InvalidRequestError, match="max_new_tokens 2000"):
                await client.samples("x", 3, max_new_tokens=2000)

    asyncio.run(main())


def test_the_first_failed_sample_cancels_the_others(server) -> None:
    address, fake = server
    with Client(address) as client:
        with pytest.raises(OverloadedError, match="KV cache full"):
            client.samples("flaky", 2, max_new_tokens=1000, request_id="sync")

    async def main() -> None:
        async with AsyncClient(address) as client:
            with pytest.raises(OverloadedError, match="KV cache full"):
                await client.samples("flaky", 3, max_new_tokens=1000, request_id="async")

    asyncio.run(main())
    siblings = {"sync-0", "async-0", "async-2"}

    def stopped() -> bool:  # cancelled mid-run, or cancelled before the server started it
        started = {r.request_id for r in fake.requests}
        return all(rid in fake.cancelled or rid not in started for rid in siblings)

    deadline = time.monotonic() + 5
    while not stopped() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stopped() and not any(rid in fake.done and rid not in fake.cancelled for rid in siblings)
