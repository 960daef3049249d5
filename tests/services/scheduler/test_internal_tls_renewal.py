"""The scheduler's credentials to the model services follow their files: after the CA and the client
certificate are replaced (a CA rotation under mutual TLS), the worker's calls go over a new channel that
presents the new certificate, while the old certificate is refused by the server."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio
import pytest

from services.scheduler.grpc_workers import GrpcTargetWorker, WorkerRpcError
from services.scheduler.internal_tls import follow_client_tls
from shared.rpc.gen.tandem.v1 import common_pb2
from shared.rpc.server import bind, create_server
from shared.rpc.tls import ClientTls, ServerTls
from tests.support.certs import TestCA, replace_files


def _info_server() -> grpc.aio.Server:
    async def info(request, context):
        return common_pb2.ServiceInfo(model_name="tiny", vocab_size=512)

    server = create_server()
    handler = grpc.unary_unary_rpc_method_handler(
        info, request_deserializer=common_pb2.InfoRequest.FromString,
        response_serializer=common_pb2.ServiceInfo.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("tandem.v1.TargetService", {"Info": handler}),))
    return server


def test_a_rotated_ca_and_client_certificate_reach_new_calls(tmp_path):
    old_ca, new_ca = TestCA("old"), TestCA("new")
    roots = old_ca.write(tmp_path / "ca.crt")  # what both sides trust, replaced in place below
    server_cert, server_key = old_ca.issue(tmp_path / "server")
    client_cert, client_key = old_ca.issue(tmp_path / "client", common_name="scheduler")
    tls = ClientTls(ca=roots, cert=client_cert, key=client_key)

    async def main() -> None:
        server = _info_server()
        port = bind(server, "127.0.0.1:0", tls=ServerTls(server_cert, server_key, client_ca=roots))
        await server.start()
        worker = GrpcTargetWorker(f"127.0.0.1:{port}", credentials=tls.credentials())
        follow = asyncio.create_task(follow_client_tls(tls, [worker], interval_s=0.1))
        try:
            assert (await worker.info()).model_name == "tiny"
            first = worker.channel
            # the new CA signs everything: server certificate, client certificate, both sides' trust
            bundle = tmp_path / "bundle.crt"
            bundle.write_bytes(new_ca.write(tmp_path / "new.crt").read_bytes())
            new_server = new_ca.issue(tmp_path / "server2")
            new_client = new_ca.issue(tmp_path / "client2", common_name="scheduler")
            replace_files({bundle: roots, new_server[0]: server_cert, new_server[1]: server_key,
                           new_client[0]: client_cert, new_client[1]: client_key})
            for _ in range(100):
                if worker.channel is not first:
                    break
                await asyncio.sleep(0.05)
            assert worker.channel is not first
            assert (await worker.info()).model_name == "tiny"  # a new handshake, both sides renewed
            old_trust = ClientTls(ca=old_ca.write(tmp_path / "old-only.crt"))  # trusts only the old CA
            stale = GrpcTargetWorker(f"127.0.0.1:{port}", credentials=old_trust.credentials())
            with pytest.raises(WorkerRpcError):
                await stale.info(wait_s=1.0)
            await stale.close()
        finally:
            follow.cancel()
            await asyncio.gather(follow, return_exceptions=True)
            await worker.close()
            await server.stop(0)

    asyncio.run(main())


def test_a_tls_mismatch_with_the_target_is_named_at_once(tmp_path):
    """The scheduler waits for a target that is still loading, but not for one whose TLS does not match."""
    from services.scheduler.main import _target_info, internal_channel_args
    from shared.rpc.tls import TlsConfigError
    from tests.support.certs import self_signed

    cert, key = self_signed(tmp_path / "s")

    async def main() -> list[str]:
        tls_server, plain_server = _info_server(), _info_server()
        tls_port = bind(tls_server, "127.0.0.1:0", tls=ServerTls(cert, key))
        plain_port = bind(plain_server, "127.0.0.1:0")
        await tls_server.start()
        await plain_server.start()
        errors = []
        for port, channel in ((tls_port, {}), (plain_port, internal_channel_args(ClientTls(ca=cert)))):
            address = f"127.0.0.1:{port}"
            worker = GrpcTargetWorker(address, **channel)
            try:
                with pytest.raises(TlsConfigError) as info:
                    await asyncio.wait_for(_target_info(worker, 60, address), 10)
                errors.append(str(info.value))
            finally:
                await worker.close()
        await tls_server.stop(0)
        await plain_server.stop(0)
        return errors

    plaintext_at_tls, tls_at_plaintext = asyncio.run(main())
    assert "speaks TLS but this client dialled it in plaintext" in plaintext_at_tls
    assert "does not speak TLS (plaintext) but this client dialled it with TLS" in tls_at_plaintext


def test_the_https_certificate_follows_its_files(tmp_path):
    import ssl

    from services.scheduler.internal_tls import follow_https
    from tests.support.certs import der, self_signed, served_certificate

    cert, key = self_signed(tmp_path / "live")
    tls = ServerTls(cert, key)

    async def main() -> None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=context)
        address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
        follow = asyncio.create_task(follow_https(tls, context, interval_s=0.05))
        try:
            first = await asyncio.to_thread(served_certificate, address)
            _, wrong_key = self_signed(tmp_path / "wrong")
            replace_files({wrong_key: key})  # half-written: the old pair stays
            await asyncio.sleep(0.3)
            assert await asyncio.to_thread(served_certificate, address) == first == der(cert)
            new_cert, new_key = self_signed(tmp_path / "new")
            replace_files({new_cert: cert, new_key: key})
            for _ in range(100):
                if await asyncio.to_thread(served_certificate, address) != first:
                    break
                await asyncio.sleep(0.05)
            assert await asyncio.to_thread(served_certificate, address) == der(new_cert)
        finally:
            follow.cancel()
            server.close()

    asyncio.run(main())
