"""An xDS-enabled gRPC server (proxyless, gRFC A36) for the end-to-end tests.

Usage: GRPC_XDS_BOOTSTRAP=FILE grpc_xds_server.py NAME HOST:PORT

`grpc.server(..., xds=True)` with `grpc.xds_server_credentials` (falling back to plaintext
where the control plane configures no TLS) listens on HOST:PORT; gRPC asks the control
plane for the listener named by the bootstrap's `server_listener_resource_name_template`
(`xds.istio.io/grpc/lds/inbound/HOST:PORT`) and serves only once it has it, with the
filter chain, TLS and RBAC filters it names. Methods (raw bytes, no protobuf codegen):

- /pilotfish.test.Echo/Who answers NAME;
- /pilotfish.test.Echo/Peer answers the caller's SPIFFE identity as the TLS handshake
  proved it (the URI SAN of its certificate, from `context.auth_context()`), or
  "plaintext" when the connection has no peer certificate.

Prints "ready" once the server is started (not yet serving: that waits for the listener);
runs until stdin closes or SIGTERM.
"""

import signal
import sys
import threading
from concurrent import futures

import grpc

SERVICE = "pilotfish.test.Echo"


def peer_identity(context) -> str:
    auth = context.auth_context() or {}
    for key in ("peer_spiffe_id", "x509_subject_alternative_name"):
        for value in auth.get(key, []):
            text = value.decode() if isinstance(value, bytes) else str(value)
            if text.startswith("spiffe://"):
                return text
    return "plaintext"


def main() -> None:
    name, address = sys.argv[1], sys.argv[2]
    handlers = {
        "Who": grpc.unary_unary_rpc_method_handler(
            lambda request, context: name.encode(),
            request_deserializer=None,
            response_serializer=None,
        ),
        "Peer": grpc.unary_unary_rpc_method_handler(
            lambda request, context: peer_identity(context).encode(),
            request_deserializer=None,
            response_serializer=None,
        ),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), xds=True)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    credentials = grpc.xds_server_credentials(grpc.insecure_server_credentials())
    if server.add_secure_port(address, credentials) == 0:
        raise SystemExit(f"could not bind {address}")
    server.start()
    print("ready", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    server.stop(grace=None)


if __name__ == "__main__":
    main()
