"""Tls: the certificate files an Agent presents, and the CA it checks the agent with.

Agents serve gRPC over mutual TLS; the identity in the client's certificate (its
SPIFFE ID, spiffe://fuselink/<kind>/<name>) decides what it may do under the agent's
access policy. The default policy gives engine/* the engine role (register its
tensors, watch and unregister them), router/* router and viewer (transfers) and
viewer/* viewer. scripts/certs.sh makes such files.
"""

import os

import grpc


class Tls:
    """PEM files: `cert` and `key` are this client's, `ca` signs the agent's.

    `server_name`, when given, is the name the agent's certificate must carry (one of
    its DNS or IP SANs) instead of the host dialled. The files are read when a
    channel opens.
    """

    def __init__(self, cert, key, ca, server_name=None):
        self.cert = cert
        self.key = key
        self.ca = ca
        self.server_name = server_name

    @classmethod
    def from_dir(cls, directory, kind, name, server_name=None):
        """The files scripts/certs.sh wrote to `directory` for `kind`-`name`:
        <kind>-<name>.crt and .key, and ca.crt."""
        stem = os.path.join(directory, f"{kind}-{name}")
        return cls(f"{stem}.crt", f"{stem}.key", os.path.join(directory, "ca.crt"),
                   server_name=server_name)

    def channel(self, address):
        """A secure grpc.Channel to `address` presenting these files."""
        def read(path):
            with open(path, "rb") as f:
                return f.read()

        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(self.ca), private_key=read(self.key),
            certificate_chain=read(self.cert))
        options = []
        if self.server_name:
            options.append(("grpc.ssl_target_name_override", self.server_name))
        return grpc.secure_channel(address, credentials, options=options)

    def __repr__(self):
        return f"Tls(cert={self.cert!r}, key={self.key!r}, ca={self.ca!r}, " \
               f"server_name={self.server_name!r})"


def open_channel(address, tls, plaintext):
    """The channel an Agent talks over: TLS, or plaintext only when asked for."""
    if plaintext:
        if tls is not None:
            raise ValueError("give tls= or plaintext=True, not both")
        return grpc.insecure_channel(address)
    if tls is None:
        raise ValueError(
            "fuselink agents serve mutual TLS: pass tls=fuselink.Tls(cert, key, ca) "
            "(scripts/certs.sh makes the files), or plaintext=True for an agent started "
            "with --plaintext")
    return tls.channel(address)
