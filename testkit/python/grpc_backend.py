"""Backend gRPC servers for the end-to-end tests.

Usage: grpc_backend.py NAME=PORT [NAME=PORT ...]

Each NAME gets its own server on 127.0.0.1:PORT answering the unary method
/pilotfish.test.Echo/Who with its NAME (raw bytes, no protobuf codegen needed), so a
client can tell which backend served each RPC. Prints one line "ready" once every server
listens; runs until stdin closes or SIGTERM.
"""

import signal
import sys
import threading
from concurrent import futures

import grpc

METHOD_SERVICE = "pilotfish.test.Echo"
METHOD_NAME = "Who"


def serve(name: str, port: int) -> grpc.Server:
    def who(request: bytes, context) -> bytes:
        return name.encode()

    handler = grpc.method_handlers_generic_handler(
        METHOD_SERVICE,
        {
            METHOD_NAME: grpc.unary_unary_rpc_method_handler(
                who, request_deserializer=None, response_serializer=None
            )
        },
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if bound != port:
        raise SystemExit(f"could not bind 127.0.0.1:{port}")
    server.start()
    return server


def main() -> None:
    servers = []
    for arg in sys.argv[1:]:
        name, _, port = arg.partition("=")
        servers.append(serve(name, int(port)))
    print("ready", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    for s in servers:
        s.stop(grace=None)


if __name__ == "__main__":
    main()
