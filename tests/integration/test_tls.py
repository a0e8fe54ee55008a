"""TLS and mutual TLS on attnd's TCP listener (--tls-cert/--tls-key/--tls-ca/
--tls-require-client-cert) with a CA, server and client certificates made by openssl in a temp
dir: verified clients connect; plaintext clients, clients trusting another CA and (mTLS) clients
without a certificate or with one from another CA are refused. The unix socket stays plaintext."""

import subprocess

import grpc
import numpy as np
import pytest

import attnd_client as ac

from daemon import BACKEND
from pki import tls_flags

REFUSED_TIMEOUT = 10.0


def works(client):
    logits = np.random.default_rng().standard_normal((2, 50)).astype(np.float32)
    res = client.topk(logits=logits, lengths=np.array([50, 10], np.int32), k=4, timeout=60)
    assert res.indices.shape == (2, 4)
    assert client.info(timeout=60).backend == BACKEND


def refused(client):
    with pytest.raises(ac.AttndError) as e:
        client.info(timeout=REFUSED_TIMEOUT)
    client.close()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE, e.value


def test_tls(make_daemon, pki):
    d = make_daemon(*tls_flags(pki, mutual=False), metrics=False)
    tls = ac.Client(d.tcp_target, root_certificates=pki("ca.pem"))
    works(tls)
    tls.close()
    # By name, checked against the certificate's DNS name.
    port = d.tcp_target.rsplit(":", 1)[1]
    named = ac.Client(f"localhost:{port}", root_certificates=pki("ca.pem"))
    works(named)
    named.close()
    refused(ac.Client(d.tcp_target))  # plaintext
    refused(ac.Client(d.tcp_target, root_certificates=pki("other-ca.pem")))
    with ac.Client(d.unix_target) as unix:  # unix: plaintext
        works(unix)


def test_mutual_tls(make_daemon, pki):
    d = make_daemon(*tls_flags(pki, mutual=True), metrics=False)
    with open(pki("client.key"), "rb") as f:
        key = f.read()
    mtls = ac.Client(
        d.tcp_target,
        root_certificates=pki("ca.pem"),
        private_key=key,
        certificate_chain=pki("client.pem"),
    )
    works(mtls)
    with mtls.session("mtls") as s:  # streams too
        assert s.lease_id
    mtls.close()
    refused(ac.Client(d.tcp_target, root_certificates=pki("ca.pem")))  # no certificate
    refused(
        ac.Client(
            d.tcp_target,
            root_certificates=pki("ca.pem"),
            private_key=pki("rogue.key"),
            certificate_chain=pki("rogue.pem"),
        )
    )
    refused(ac.Client(d.tcp_target))  # plaintext
    assert "error" not in d.log().split("attnd serving")[0].lower()


def test_tls_flag_errors(attnd_bin, pki, tmp_path):
    """Bad TLS flag combinations stop attnd at start (exit 2) with the flag named."""
    sock = f"unix:{tmp_path}/s.sock"
    for flags, name in [
        ([f"--tls-cert={pki('server.pem')}"], "--tls-key"),
        (["--tls-require-client-cert"], "--tls-ca"),
    ]:
        p = subprocess.run(
            [attnd_bin, f"--listen={sock}", "--metrics-listen=", *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 2 and name in p.stderr, (p.returncode, p.stderr)
