"""The metadata a channel's rewriting interceptors would add, for a stream that carries it itself."""

from __future__ import annotations

import grpc.aio

from shared.rpc.call_details import rewritten_metadata
from shared.rpc.shared_secret import METADATA_KEY, secret_client_interceptors


def test_the_secret_interceptors_reduce_to_their_metadata():
    assert rewritten_metadata(secret_client_interceptors("s3cret"), "/tandem.v1.TargetService/StepStream") == (
        (METADATA_KEY, "s3cret"),
    )
    assert rewritten_metadata([], "/x/Y") == ()


def test_an_interceptor_that_does_more_keeps_the_stream_on_its_channel():
    class Counting(grpc.aio.StreamStreamClientInterceptor):
        async def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
            return await continuation(client_call_details, request_iterator)

    assert rewritten_metadata([*secret_client_interceptors("s"), Counting()], "/x/Y") is None
