"""TLS and mutual TLS for the request plane, with certificates made on the fly by trustme.

Real sockets, a real TLS server and real TLS clients: TLS works end to end; a
plaintext client is refused by a TLS server (and the reverse); a client
without a certificate is refused under mutual TLS; a wrong CA fails with
``CannotConnect`` and a clear message.  Every case checks that a healthy TLS
stream on the same server keeps flowing.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest
import trio
import trustme

from dynamo_trio import CannotConnect, Config
from dynamo_trio.request_plane import ConnectionPool, RequestPlaneServer

from ._harness import CONFIG, fd_count, open_healthy, streaming_handler, wait_until

if TYPE_CHECKING:
    from pathlib import Path

REAL = dataclasses.replace(CONFIG, heartbeat_interval=0.05, heartbeat_timeout=2.0)


@dataclasses.dataclass
class Pki:
    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def write_identity(cert: trustme.LeafCert, directory: Path, name: str) -> tuple[Path, Path]:
    chain = directory / f"{name}.pem"
    key = directory / f"{name}.key"
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    cert.private_key_pem.write_to_path(str(key))
    return chain, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    server_cert, server_key = write_identity(
        ca.issue_cert("127.0.0.1", "localhost"), directory, "server"
    )
    client_cert, client_key = write_identity(ca.issue_cert("frontend"), directory, "client")
    stranger_cert, stranger_key = write_identity(
        other.issue_cert("stranger"), directory, "stranger"
    )
    return Pki(
        directory / "ca.pem",
        directory / "other-ca.pem",
        server_cert,
        server_key,
        client_cert,
        client_key,
        stranger_cert,
        stranger_key,
    )


def server_config(pki: Pki, *, client_auth: bool = False):
    return dataclasses.replace(
        REAL,
        tls=True,
        tls_cert=pki.server_cert,
        tls_key=pki.server_key,
        tls_ca=pki.ca if client_auth else None,
        tls_client_auth=client_auth,
    )


def client_config(pki: Pki, *, ca=None, identity=None):
    cert, key = identity or (None, None)
    return dataclasses.replace(REAL, tls=True, tls_ca=ca or pki.ca, tls_cert=cert, tls_key=key)


async def serve(nursery, config):
    server = RequestPlaneServer(config, streaming_handler)
    host, port = await nursery.start(server.serve)
    return server, f"{host}:{port}"


async def test_tls_works_end_to_end(pki, nursery):
    server, address = await serve(nursery, server_config(pki))
    pool = ConnectionPool(client_config(pki), nursery, name="frontend")
    healthy = await open_healthy(pool, address, nursery)
    await healthy.assert_flowing(at_least=20)
    pool.close_all()
    await wait_until(lambda: server.sessions == 0)


async def test_mutual_tls_lets_a_client_with_a_certificate_in(pki, nursery):
    _server, address = await serve(nursery, server_config(pki, client_auth=True))
    identity = (pki.client_cert, pki.client_key)
    pool = ConnectionPool(client_config(pki, identity=identity), nursery, name="frontend")
    healthy = await open_healthy(pool, address, nursery)
    await healthy.assert_flowing()
    pool.close_all()


@pytest.mark.parametrize(
    ("case", "words"),
    [
        ("plaintext-client", "closed the connection during the handshake"),
        ("no-client-cert", "TLS handshake"),
        ("client-cert-from-another-ca", "TLS handshake"),
        ("wrong-ca", "certificate verify failed"),
        ("wrong-server-name", "certificate verify failed"),
    ],
)
async def test_a_client_that_may_not_in_is_refused_clearly_and_disturbs_nobody(
    pki, nursery, case, words, no_errors_logged
):
    mutual = case in ("no-client-cert", "client-cert-from-another-ca")
    server, address = await serve(nursery, server_config(pki, client_auth=mutual))
    identity = (pki.client_cert, pki.client_key)
    healthy_pool = ConnectionPool(client_config(pki, identity=identity), nursery, name="healthy")
    healthy = await open_healthy(healthy_pool, address, nursery)
    baseline = fd_count()

    config = {
        "plaintext-client": dataclasses.replace(REAL),
        "no-client-cert": client_config(pki),
        "client-cert-from-another-ca": client_config(
            pki, identity=(pki.stranger_cert, pki.stranger_key)
        ),
        "wrong-ca": client_config(pki, ca=pki.other_ca),
        "wrong-server-name": dataclasses.replace(client_config(pki), tls_server_name="elsewhere"),
    }[case]
    pool = ConnectionPool(config, nursery, name="intruder")
    # Under TLS 1.3 the server checks a client's certificate after the client
    # thinks the TLS handshake is over: the refusal arrives at its first read,
    # which is still part of connecting (the request-plane handshake).
    with pytest.raises(CannotConnect, match=words) as info:
        await pool.connect(address)
    if case == "wrong-ca":
        assert "DYN_TCP_TLS_CA" in str(info.value)
    await healthy.assert_flowing()
    await wait_until(lambda: server.sessions == 1)
    await wait_until(lambda: fd_count() <= baseline)
    healthy_pool.close_all()


async def test_a_tls_client_of_a_plaintext_worker_is_told_so(pki, nursery):
    _server, address = await serve(nursery, REAL)
    pool = ConnectionPool(client_config(pki), nursery, name="frontend")
    with pytest.raises(CannotConnect, match=r"TLS handshake with .* failed"):
        await pool.connect(address)
    healthy = await open_healthy(ConnectionPool(REAL, nursery, name="h"), address, nursery)
    await healthy.assert_flowing()


def test_tls_settings_come_from_the_environment(pki):
    env = {
        "DYN_TCP_TLS_CERT": str(pki.server_cert),
        "DYN_TCP_TLS_KEY": str(pki.server_key),
        "DYN_TCP_TLS_CA": str(pki.ca),
        "DYN_TCP_TLS_CLIENT_AUTH": "1",
        "DYN_TCP_TLS_SERVER_NAME": "worker.internal",
    }
    config = Config.from_env(env).request_plane
    assert config.tls  # implied by the files
    assert (config.tls_cert, config.tls_key, config.tls_ca) == (
        pki.server_cert,
        pki.server_key,
        pki.ca,
    )
    assert config.tls_client_auth and config.tls_server_name == "worker.internal"
    assert not Config.from_env({**env, "DYN_TCP_TLS": "0"}).request_plane.tls
    assert not Config.from_env({}).request_plane.tls
    assert Config.from_env({"DYN_TCP_TLS": "yes"}).request_plane.tls
    with pytest.raises(ValueError, match="DYN_TCP_TLS"):
        Config.from_env({"DYN_TCP_TLS": "maybe"})


def test_a_tls_server_without_a_certificate_is_a_clear_error(pki, tmp_path):
    with pytest.raises(ValueError, match="DYN_TCP_TLS_CERT and DYN_TCP_TLS_KEY"):
        RequestPlaneServer(dataclasses.replace(REAL, tls=True), streaming_handler)
    with pytest.raises(ValueError, match="DYN_TCP_TLS_CA"):
        RequestPlaneServer(
            dataclasses.replace(server_config(pki), tls_client_auth=True), streaming_handler
        )
    with pytest.raises(ValueError, match="cannot load the request-plane certificate"):
        RequestPlaneServer(
            dataclasses.replace(server_config(pki), tls_key=tmp_path / "missing.key"),
            streaming_handler,
        )


async def test_a_pool_with_an_unreadable_ca_is_a_clear_error(tmp_path, nursery):
    with pytest.raises(ValueError, match="cannot load the request-plane CA"):
        ConnectionPool(
            dataclasses.replace(REAL, tls=True, tls_ca=tmp_path / "none.pem"), nursery, name="x"
        )
    await trio.lowlevel.checkpoint()
