"""Which certificates each service of `tandem up` gets, and how the launcher probes it with them.

    plan = TlsPlan.resolve(config, env)     # LaunchConfig fields, else TANDEM_TLS_* / TANDEM_INTERNAL_TLS_* in env
    plan.check()                            # every file loads and matches, before anything starts (TlsConfigError)
    env.update(plan.env("target"))          # what the child reads (ServiceSettings)
    check(address, service, tls=plan.probe("target"))

    public endpoint   scheduler serves tls_cert/tls_key          probe trusts tls_ca (default: tls_cert itself)
    internal hops     target, draft serve internal_tls_cert/key  scheduler and probe trust internal_tls_ca
                                                                 (default: internal_tls_cert itself)
    mutual TLS        internal_mtls: the model services require a client certificate signed by that CA, and
                      the scheduler and the probe present internal_tls_cert/key

The internal secret stays on with TLS: a second factor, should a certificate leak.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from shared.rpc.tls import ClientTls, ServerTls, TlsConfigError

MODEL_ROLES = ("target", "draft")
TLS_VARS = ("TANDEM_TLS_CERT", "TANDEM_TLS_KEY", "TANDEM_INTERNAL_TLS_CERT", "TANDEM_INTERNAL_TLS_KEY",
            "TANDEM_INTERNAL_TLS_CA", "TANDEM_INTERNAL_TLS_SERVER_NAME")


@dataclass(frozen=True)
class TlsPlan:
    public: ServerTls | None = None  # the scheduler's public endpoint
    public_ca: Path | None = None  # what a client of it trusts
    internal: ServerTls | None = None  # what target and draft serve (client_ca set: mutual TLS)
    internal_ca: Path | None = None  # what the scheduler trusts for them

    @classmethod
    def resolve(cls, config, env: Mapping[str, str]) -> TlsPlan:
        """From ``config`` (a LaunchConfig) and, for fields it leaves unset, the TANDEM_* variables in ``env``."""
        def pick(value: Path | None, var: str) -> Path | None:
            return value if value is not None else (Path(env[var]) if env.get(var, "").strip() else None)

        cert, key = pick(config.tls_cert, "TANDEM_TLS_CERT"), pick(config.tls_key, "TANDEM_TLS_KEY")
        icert = pick(config.internal_tls_cert, "TANDEM_INTERNAL_TLS_CERT")
        ikey = pick(config.internal_tls_key, "TANDEM_INTERNAL_TLS_KEY")
        ica = pick(config.internal_tls_ca, "TANDEM_INTERNAL_TLS_CA")
        mutual = config.internal_mtls or (config.internal_tls_ca is None and ica is not None)
        public = ServerTls.from_files(cert, key, None, "TANDEM_TLS")
        internal = ServerTls.from_files(icert, ikey, (ica or icert) if mutual else None, "TANDEM_INTERNAL_TLS")
        if internal is None and (ica is not None or config.internal_mtls):
            raise TlsConfigError("internal TLS needs the model services' certificate and key "
                                 "(TANDEM_INTERNAL_TLS_CERT and TANDEM_INTERNAL_TLS_KEY)")
        return cls(public=public, public_ca=(config.tls_ca or cert) if public else None,
                   internal=internal, internal_ca=(ica or icert) if internal else None)

    def check(self) -> None:
        """Load every file (TlsConfigError naming the one that is unusable)."""
        for server in (self.public, self.internal):
            if server is not None:
                server.load()
        for role in ("scheduler", *MODEL_ROLES):
            probe = self.probe(role)
            if probe is not None:
                probe.credentials()

    def env(self, role: str) -> dict[str, str]:
        """The child's TLS variables; "" blanks one it would inherit (ServiceSettings reads "" as unset)."""
        out = dict.fromkeys(TLS_VARS, "")
        internal = self.internal
        if role in MODEL_ROLES and internal is not None:
            out.update(TANDEM_INTERNAL_TLS_CERT=str(internal.cert), TANDEM_INTERNAL_TLS_KEY=str(internal.key),
                       TANDEM_INTERNAL_TLS_CA=str(internal.client_ca or ""))
        if role == "scheduler":
            if self.public is not None:
                out.update(TANDEM_TLS_CERT=str(self.public.cert), TANDEM_TLS_KEY=str(self.public.key))
            if internal is not None:
                out["TANDEM_INTERNAL_TLS_CA"] = str(self.internal_ca)
                if internal.mutual:  # the scheduler presents the services' certificate as its client certificate
                    out.update(TANDEM_INTERNAL_TLS_CERT=str(internal.cert), TANDEM_INTERNAL_TLS_KEY=str(internal.key))
        return out

    def probe(self, role: str) -> ClientTls | None:
        """How the launcher dials ``role``'s health: the credentials that service serves."""
        if role == "scheduler":
            return ClientTls(ca=self.public_ca, what="TANDEM_TLS") if self.public is not None else None
        internal = self.internal
        if internal is None:
            return None
        mutual = internal.mutual
        return ClientTls(ca=self.internal_ca, cert=internal.cert if mutual else None,
                         key=internal.key if mutual else None)

