"""What `tandem up` hands each service and how it probes it: from LaunchConfig fields, else TANDEM_* variables."""

from __future__ import annotations

import pytest

from services.launch_tls import TlsPlan
from services.launcher import LaunchConfig
from services.settings import ServiceSettings
from shared.rpc.tls import TlsConfigError
from tests.support.certs import TestCA, self_signed


def test_fields_give_public_tls_and_mutual_tls_inside(tmp_path):
    ca = TestCA()
    roots = ca.write(tmp_path / "ca.crt")
    pc, pk = self_signed(tmp_path / "public")
    ic, ik = ca.issue(tmp_path / "internal")
    plan = TlsPlan.resolve(LaunchConfig(tls_cert=pc, tls_key=pk, internal_tls_cert=ic, internal_tls_key=ik,
                                        internal_tls_ca=roots, internal_mtls=True), {})
    plan.check()
    target = ServiceSettings.from_env(env=plan.env("target"))
    assert target.internal_server_tls().mutual and target.public_tls() is None
    scheduler = ServiceSettings.from_env(env=plan.env("scheduler"))
    assert scheduler.public_tls().cert == pc
    client = scheduler.internal_client_tls()
    assert (client.ca, client.cert, client.key) == (roots, ic, ik)
    assert plan.probe("scheduler").ca == pc  # self-signed: the certificate is its own CA
    assert (plan.probe("draft").ca, plan.probe("draft").cert) == (roots, ic)


def test_the_environment_is_used_when_fields_are_unset_and_blanked_when_tls_is_off(tmp_path):
    cert, key = self_signed(tmp_path / "s")
    plan = TlsPlan.resolve(LaunchConfig(), {"TANDEM_TLS_CERT": str(cert), "TANDEM_TLS_KEY": str(key),
                                            "TANDEM_INTERNAL_TLS_CERT": str(cert), "TANDEM_INTERNAL_TLS_KEY": str(key)})
    assert plan.public.cert == cert and plan.probe("scheduler").ca == cert
    assert not plan.internal.mutual and plan.probe("target").cert is None  # TLS inside, not mutual
    assert ServiceSettings.from_env(env=plan.env("scheduler")).internal_client_tls().ca == cert
    off = TlsPlan.resolve(LaunchConfig(), {})
    assert off.probe("scheduler") is None and off.probe("target") is None
    assert set(off.env("target").values()) == {""}  # an inherited TANDEM_*TLS* variable does not leak through


def test_half_a_configuration_is_refused(tmp_path):
    cert, _ = self_signed(tmp_path / "s")
    with pytest.raises(TlsConfigError, match="only TANDEM_TLS_CERT"):
        TlsPlan.resolve(LaunchConfig(tls_cert=cert), {})
    with pytest.raises(TlsConfigError, match="internal TLS needs the model services' certificate"):
        TlsPlan.resolve(LaunchConfig(internal_mtls=True), {})
