"""Checks generated xDS resources the way Envoy would accept them, without an Envoy:

1. protoc-gen-validate (PGV) rules from Envoy's own protos, on every resource and on every
   nested `google.protobuf.Any` of a known type (PGV's `validate()` does not open `Any`s);
   an `Any` whose type cannot be found fails, since Envoy would reject it too.
2. Cross references PGV cannot see, within one proxy's view: every cluster a route or
   listener names is in CDS, every route configuration a listener asks RDS for exists and
   every one exists because a listener asks for it, every EDS cluster gets a
   ClusterLoadAssignment, no name appears twice in a response, no two listeners share an
   address, and no route configuration lists a domain or a virtual host name twice.

Input: a directory tree of `<view>.<type>.pb` files (each an encoded
envoy.service.discovery.v3.DiscoveryResponse), where `<type>` is cds, eds, lds or rds;
files sharing a `<view>` prefix (relative path) are one proxy's view.
Exit status 0 when everything passes; 1 with one line per problem otherwise.

Usage: validate_xds.py DIR
"""
import importlib
import os
import pkgutil
import sys

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from protoc_gen_validate.validator import ValidationFailed, validate

from envoy.service.discovery.v3 import discovery_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

TYPES = {
    "cds": cluster_pb2.Cluster,
    "eds": endpoint_pb2.ClusterLoadAssignment,
    "lds": listener_pb2.Listener,
    "rds": route_pb2.RouteConfiguration,
}
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
TCP_PROXY = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy"

_imported_packages = set()


def message_class(full_name):
    """The Python class of a message type, importing the xds-protos package that defines it."""
    pool = descriptor_pool.Default()
    try:
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))
    except KeyError:
        pass
    # `a.b.v3.Msg` (or `a.b.v3.Msg.Nested`) lives in a module of package `a.b.v3`.
    parts = full_name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        package = ".".join(parts[:cut])
        if package in _imported_packages:
            continue
        try:
            module = importlib.import_module(package)
        except ImportError:
            continue
        _imported_packages.add(package)
        for info in pkgutil.iter_modules(module.__path__):
            if info.name.endswith("_pb2"):
                importlib.import_module(f"{package}.{info.name}")
        try:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(full_name))
        except KeyError:
            continue
    return None


def unpack(any_msg):
    full_name = any_msg.type_url.split("/")[-1]
    cls = message_class(full_name)
    if cls is None:
        return None, full_name
    inner = cls()
    inner.ParseFromString(any_msg.value)
    return inner, full_name


def nested_anys(msg, path):
    """Every google.protobuf.Any inside msg (not msg itself), with its field path."""
    for field, value in msg.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            items = [(f"{path}.{field.name}[{k}]", v) for k, v in value.items()]
            value_field = field.message_type.fields_by_name["value"]
            if value_field.type != FieldDescriptor.TYPE_MESSAGE:
                continue
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            items = [(f"{path}.{field.name}[{i}]", v) for i, v in enumerate(value)]
        else:
            items = [(f"{path}.{field.name}", value)]
        for item_path, item in items:
            if item.DESCRIPTOR.full_name == "google.protobuf.Any":
                yield item_path, item
            else:
                yield from nested_anys(item, item_path)


def validate_deep(msg, path, problems):
    """PGV on msg and, recursively, on every Any it carries."""
    try:
        validate(msg)
    except ValidationFailed as e:
        problems.append(f"{path} ({msg.DESCRIPTOR.full_name}): {e}")
    for any_path, any_msg in nested_anys(msg, path):
        inner, name = unpack(any_msg)
        if inner is None:
            problems.append(f"{any_path}: unknown type {name} (Envoy would reject it)")
            continue
        validate_deep(inner, f"{any_path}<{name}>", problems)


def route_clusters(rc):
    for vh in rc.virtual_hosts:
        for r in vh.routes:
            if not r.HasField("route"):
                continue
            where = f"route {rc.name}/{vh.name}/{r.name}"
            a = r.route
            if a.HasField("cluster") or a.WhichOneof("cluster_specifier") == "cluster":
                yield where, a.cluster
            elif a.WhichOneof("cluster_specifier") == "weighted_clusters":
                for c in a.weighted_clusters.clusters:
                    yield where, c.name
            for m in a.request_mirror_policies:
                yield where, m.cluster


def listener_references(listener):
    """(clusters, rds names) a listener refers to."""
    clusters, rds = [], []
    hcms = []
    chains = list(listener.filter_chains)
    if listener.HasField("default_filter_chain"):
        chains.append(listener.default_filter_chain)
    for chain in chains:
        for f in chain.filters:
            if not f.HasField("typed_config"):
                continue
            inner, name = unpack(f.typed_config)
            if name == TCP_PROXY:
                if inner.WhichOneof("cluster_specifier") == "cluster":
                    clusters.append(inner.cluster)
                else:
                    clusters.extend(c.name for c in inner.weighted_clusters.clusters)
            elif name == HCM:
                hcms.append(inner)
    if listener.HasField("api_listener"):
        inner, name = unpack(listener.api_listener.api_listener)
        if name == HCM:
            hcms.append(inner)
    for h in hcms:
        if h.HasField("rds"):
            rds.append(h.rds.route_config_name)
        elif h.HasField("route_config"):
            clusters.extend(c for _, c in route_clusters(h.route_config))
    return clusters, rds


def check_view(view, resources, problems):
    def names(kind, name_of):
        seen = set()
        for r in resources.get(kind, []):
            n = name_of(r)
            if n in seen:
                problems.append(f"{view}: {kind} response names {n!r} twice")
            seen.add(n)
        return seen

    clusters = names("cds", lambda c: c.name)
    assignments = names("eds", lambda c: c.cluster_name)
    names("lds", lambda l: l.name)
    routes = names("rds", lambda r: r.name)
    for c in resources.get("cds", []):
        if c.type == cluster_pb2.Cluster.EDS:
            service = c.eds_cluster_config.service_name or c.name
            if service not in assignments:
                problems.append(f"{view}: EDS cluster {c.name} has no ClusterLoadAssignment")
    for rc in resources.get("rds", []):
        for where, cluster in route_clusters(rc):
            if cluster not in clusters:
                problems.append(f"{view}: {where} names cluster {cluster!r}, which CDS does not send")
    addresses = {}
    asked_for = set()
    for listener in resources.get("lds", []):
        if listener.HasField("address") and listener.address.HasField("socket_address"):
            a = listener.address.socket_address
            at = f"{a.address}:{a.port_value}"
            if at in addresses:
                problems.append(f"{view}: listeners {addresses[at]} and {listener.name} share the address {at}")
            addresses.setdefault(at, listener.name)
        cs, rds = listener_references(listener)
        asked_for.update(rds)
        for c in cs:
            if c not in clusters:
                problems.append(f"{view}: listener {listener.name} names cluster {c!r}, which CDS does not send")
        for r in rds:
            if r not in routes:
                problems.append(f"{view}: listener {listener.name} asks RDS for {r!r}, which does not exist")
    for rc in resources.get("rds", []):
        if rc.name not in asked_for:
            problems.append(f"{view}: no listener asks RDS for route configuration {rc.name!r}")
        vhosts, domains = set(), set()
        for vh in rc.virtual_hosts:
            if vh.name in vhosts:
                problems.append(f"{view}: route configuration {rc.name!r} names virtual host {vh.name!r} twice")
            vhosts.add(vh.name)
            for d in vh.domains:
                if d in domains:
                    problems.append(f"{view}: route configuration {rc.name!r} lists domain {d!r} twice")
                domains.add(d)


def main(root):
    problems = []
    views = {}
    count = 0
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith(".pb"):
                continue
            view_name, kind = name[: -len(".pb")].rsplit(".", 1)
            if kind not in TYPES:
                problems.append(f"{name}: unknown type suffix {kind!r}")
                continue
            view = os.path.relpath(os.path.join(dirpath, view_name), root)
            response = discovery_pb2.DiscoveryResponse()
            with open(os.path.join(dirpath, name), "rb") as f:
                response.ParseFromString(f.read())
            expected = TYPES[kind].DESCRIPTOR.full_name
            for i, resource in enumerate(response.resources):
                inner, type_name = unpack(resource)
                if type_name != expected or inner is None:
                    problems.append(f"{view}.{kind}[{i}]: expected {expected}, got {type_name}")
                    continue
                count += 1
                label = getattr(inner, "name", "") or getattr(inner, "cluster_name", "")
                validate_deep(inner, f"{view}.{kind} {label}", problems)
                views.setdefault(view, {}).setdefault(kind, []).append(inner)
    for view, resources in sorted(views.items()):
        check_view(view, resources, problems)
    for p in problems:
        print(p)
    print(f"checked {count} resources in {len(views)} views: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
