"""Derives the Envoy descriptor set pilotfish-xds embeds (for proto JSON) from the one the
`envoy-types` crate ships: only the files the generators' messages need (their transitive
imports), without source comments, serialized deterministically.

Usage: envoy_descriptors.py TYPES_BIN OUT [--check]
"""
import sys

from google.protobuf import descriptor_pb2

# Every message Pilotfish emits or wraps lives in (or is imported by) one of these files.
ROOTS = [
    "envoy/admin/v3/config_dump.proto",
    "envoy/config/cluster/v3/cluster.proto",
    "envoy/config/endpoint/v3/endpoint.proto",
    "envoy/config/listener/v3/listener.proto",
    "envoy/config/route/v3/route.proto",
    "envoy/extensions/filters/http/cors/v3/cors.proto",
    "envoy/extensions/filters/http/fault/v3/fault.proto",
    "envoy/extensions/filters/http/grpc_web/v3/grpc_web.proto",
    "envoy/extensions/filters/http/jwt_authn/v3/config.proto",
    "envoy/extensions/filters/http/rbac/v3/rbac.proto",
    "envoy/extensions/filters/http/router/v3/router.proto",
    "envoy/extensions/filters/listener/http_inspector/v3/http_inspector.proto",
    "envoy/extensions/filters/listener/original_dst/v3/original_dst.proto",
    "envoy/extensions/filters/listener/tls_inspector/v3/tls_inspector.proto",
    "envoy/extensions/filters/network/http_connection_manager/v3/http_connection_manager.proto",
    "envoy/extensions/filters/network/rbac/v3/rbac.proto",
    "envoy/extensions/filters/network/tcp_proxy/v3/tcp_proxy.proto",
    "envoy/extensions/path/match/uri_template/v3/uri_template_match.proto",
    "envoy/extensions/retry/host/previous_hosts/v3/previous_hosts.proto",
    "envoy/extensions/retry/priority/previous_priorities/v3/previous_priorities_config.proto",
    "envoy/extensions/transport_sockets/proxy_protocol/v3/upstream_proxy_protocol.proto",
    "envoy/extensions/transport_sockets/raw_buffer/v3/raw_buffer.proto",
    "envoy/extensions/transport_sockets/tls/v3/tls.proto",
    "envoy/extensions/upstreams/http/v3/http_protocol_options.proto",
    "envoy/service/discovery/v3/discovery.proto",
]


def main() -> int:
    source, out = sys.argv[1], sys.argv[2]
    check = "--check" in sys.argv[3:]
    full = descriptor_pb2.FileDescriptorSet()
    with open(source, "rb") as f:
        full.ParseFromString(f.read())
    by_name = {f.name: f for f in full.file}
    missing = [r for r in ROOTS if r not in by_name]
    if missing:
        print(f"envoy-types' descriptor set lacks {missing}", file=sys.stderr)
        return 1
    needed = set()
    stack = list(ROOTS)
    while stack:
        name = stack.pop()
        if name in needed:
            continue
        needed.add(name)
        stack.extend(by_name[name].dependency)
    pruned = descriptor_pb2.FileDescriptorSet()
    # Keep the source order, which lists every file after its imports.
    for f in full.file:
        if f.name in needed:
            copy = pruned.file.add()
            copy.CopyFrom(f)
            copy.ClearField("source_code_info")
    data = pruned.SerializeToString(deterministic=True)
    if check:
        try:
            with open(out, "rb") as f:
                current = f.read()
        except FileNotFoundError:
            current = b""
        if current != data:
            print(f"{out} is out of date: run scripts/gen-envoy-descriptors.sh", file=sys.stderr)
            return 1
        return 0
    with open(out, "wb") as f:
        f.write(data)
    print(f"wrote {out}: {len(pruned.file)} files, {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
