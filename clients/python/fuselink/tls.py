"""Tls: the certificate files an Agent presents, and the CA it checks the agent with.

Agents serve gRPC over mutual TLS; the identity in the client's certificate (its
SPIFFE ID, spiffe://fuselink/<kind>/<name>) decides what it may do under the agent's
access policy. The default policy gives engine/* the engine role (register its
tensors, watch and unregister them), router/* router and viewer (transfers) and
viewer/* viewer. scripts/certs.sh makes such files.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import List, Optional, Tuple

import grpc


class Tls:
    """PEM files: `cert` and `key` are this client's, `ca` signs the agent's.

    `server_name`, when given, is the name the agent's certificate must carry (one of
    its DNS or IP SANs) instead of the host dialled. The files are read when a
    channel opens.
    """

    def __init__(self, cert: str, key: str, ca: str, server_name: Optional[str] = None) -> None:
        self.cert = cert
        self.key = key
        self.ca = ca
        self.server_name = server_name

    @classmethod
    def from_dir(cls, directory: str, kind: str, name: str,
                 server_name: Optional[str] = None) -> "Tls":
        """The files scripts/certs.sh wrote to `directory` for `kind`-`name`:
        <kind>-<name>.crt and .key, and ca.crt."""
        stem = os.path.join(directory, f"{kind}-{name}")
        return cls(f"{stem}.crt", f"{stem}.key", os.path.join(directory, "ca.crt"),
                   server_name=server_name)

    def credentials(self) -> Tuple[grpc.ChannelCredentials, List[Tuple[str, str]]]:
        """The channel credentials of these files (read now) and the channel options
        they need; the same for grpc's and grpc.aio's channels."""
        def read(path):
            with open(path, "rb") as f:
                return f.read()

        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(self.ca), private_key=read(self.key),
            certificate_chain=read(self.cert))
        options = []
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return credentials, options

    def channel(self, address: str) -> grpc.Channel:
        """A secure grpc.Channel to `address` presenting these files."""
        return open_channel(grpc, address, self, False)

    def __repr__(self):
        return f"Tls(cert={self.cert!r}, key={self.key!r}, ca={self.ca!r}, " \
               f"server_name={self.server_name!r})"


def open_channel(api: ModuleType, address: str, tls: Optional[Tls], plaintext: bool):
    """The channel an Agent talks over: TLS, or plaintext only when asked for. `api`
    is grpc (a grpc.Channel) or grpc.aio (a grpc.aio.Channel)."""
    if plaintext:
        if tls is not None:
            raise ValueError("give tls= or plaintext=True, not both")
        return api.insecure_channel(address)
    if tls is None:
        raise ValueError(
            "fuselink agents serve mutual TLS: pass tls=fuselink.Tls(cert, key, ca) "
            "(scripts/certs.sh makes the files), or plaintext=True for an agent started "
            "with --plaintext")
    credentials, options = tls.credentials()
    return api.secure_channel(address, credentials, options=options)
