"""Obtains a workload certificate from Istio's CA API (Pilotfish's secure port, or istiod)
and writes the files gRPC's `certificate_providers` file watcher and its `tls` channel
credentials read.

    python istio_ca_client.py --ca-address HOST:PORT --root ROOT.pem --token TOKEN_FILE \
        --out DIR [--server-name NAME] [--ttl SECONDS]

- a new ECDSA P-256 key and a CSR without SANs (the CA writes the caller's identity) are
  made with the `openssl` command;
- `istio.v1.auth.IstioCertificateService/CreateCertificate` is called over TLS trusting
  ROOT.pem (`grpc.ssl_channel_credentials`), with the service-account token in TOKEN_FILE
  as call credentials (`authorization: Bearer`, audience `istio-ca`);
- DIR gets `key.pem`, `cert-chain.pem` (leaf and chain) and `root-cert.pem` (the last
  element of the response), each replaced atomically so a watcher never reads half.

Prints one JSON line: {"identity": <URI SAN of the leaf>, "chain": n, "out": DIR}; on a
refusal, {"error": <status code name>, "message": <details>} and exit status 1.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import grpc

METHOD = "/istio.v1.auth.IstioCertificateService/CreateCertificate"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_request(csr: str, ttl: int) -> bytes:
    """IstioCertificateRequest {csr = 1; validity_duration = 3}."""
    data = csr.encode()
    msg = b"\x0a" + varint(len(data)) + data
    if ttl > 0:
        msg += b"\x18" + varint(ttl)
    return msg


def decode_chain(raw: bytes) -> list:
    """IstioCertificateResponse {repeated string cert_chain = 1}."""
    chain, i = [], 0
    while i < len(raw):
        key = raw[i]
        i += 1
        length, shift = 0, 0
        while True:
            b = raw[i]
            i += 1
            length |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if key == 0x0A:
            chain.append(raw[i : i + length].decode())
        i += length
    return chain


def key_and_csr(workdir: str) -> tuple:
    key = os.path.join(workdir, "key.pem")
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key],
        check=True,
        capture_output=True,
    )
    csr = subprocess.run(
        ["openssl", "req", "-new", "-key", key, "-subj", "/O=pilotfish-workload"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    with open(key) as f:
        return f.read(), csr


def uri_san(cert_pem: str) -> str:
    out = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectAltName"],
        input=cert_pem.encode(),
        check=True,
        capture_output=True,
    ).stdout.decode()
    for part in out.replace("\n", ",").split(","):
        part = part.strip()
        if part.startswith("URI:"):
            return part[4:]
    return ""


def write_atomically(directory: str, name: str, content: str) -> None:
    fd, partial = tempfile.mkstemp(dir=directory, prefix=f".{name}.")
    with os.fdopen(fd, "w") as f:
        f.write(content)
    os.replace(partial, os.path.join(directory, name))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ca-address", required=True)
    parser.add_argument("--root", required=True, help="PEM root(s) the server chains to")
    parser.add_argument("--token", required=True, help="file holding the service-account token")
    parser.add_argument("--out", required=True)
    parser.add_argument("--server-name", help="name to verify the server as (default: the host)")
    parser.add_argument("--ttl", type=int, default=0, help="requested lifetime in seconds (0: the CA's default)")
    args = parser.parse_args()

    with open(args.root, "rb") as f:
        root = f.read()
    with open(args.token) as f:
        token = f.read().strip()
    credentials = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(root_certificates=root),
        grpc.access_token_call_credentials(token),
    )
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        key, csr = key_and_csr(workdir)
    with grpc.secure_channel(args.ca_address, credentials, options=options) as channel:
        call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
        try:
            raw = call(encode_request(csr, args.ttl), timeout=20)
        except grpc.RpcError as e:
            print(json.dumps({"error": e.code().name, "message": e.details()}))
            return 1
    chain = decode_chain(raw)
    if len(chain) < 2:
        print(json.dumps({"error": "INTERNAL", "message": f"chain of {len(chain)} certificates"}))
        return 1
    write_atomically(args.out, "key.pem", key)
    write_atomically(args.out, "cert-chain.pem", "".join(chain[:-1]))
    write_atomically(args.out, "root-cert.pem", chain[-1])
    print(json.dumps({"identity": uri_san(chain[0]), "chain": len(chain), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
