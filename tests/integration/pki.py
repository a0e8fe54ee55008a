"""A throwaway PKI for the TLS tests, made with openssl in a temp dir: a CA, a server
certificate for 127.0.0.1 / localhost, a client certificate, and a second CA with a "rogue"
client certificate that the daemon must refuse.
    path = make_pki(dirname)("client.pem")
"""

import os
import subprocess


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(dirname, name):
    openssl(
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-subj",
        f"/CN=attnd test {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=dirname,
    )


def make_leaf(dirname, ca, name, extensions):
    openssl(
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        f"/CN={name}",
        cwd=dirname,
    )
    with open(os.path.join(dirname, f"{name}.ext"), "w") as f:
        f.write(extensions)
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=dirname,
    )


def make_pki(d):
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_leaf(
        d,
        "ca",
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    make_leaf(d, "ca", "client", "extendedKeyUsage=clientAuth\n")
    make_leaf(d, "other-ca", "rogue", "extendedKeyUsage=clientAuth\n")
    return lambda name: os.path.join(d, name)


def tls_flags(pki, mutual):
    flags = [f"--tls-cert={pki('server.pem')}", f"--tls-key={pki('server.key')}"]
    if mutual:
        flags += [f"--tls-ca={pki('ca.pem')}", "--tls-require-client-cert"]
    return flags
