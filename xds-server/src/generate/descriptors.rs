//! The Envoy descriptor set embedded in the binary (for proto JSON and canonical
//! encoding). It is derived from the one envoy-types ships, so it always matches the Rust
//! types we encode with, pruned to the files our messages need and stripped of comments;
//! `scripts/gen-envoy-descriptors.sh` regenerates it and `--check` proves it current.

use std::sync::LazyLock;

use prost_reflect::DescriptorPool;

static DESCRIPTORS: &[u8] = include_bytes!("envoy-descriptors.bin");

static POOL: LazyLock<Result<DescriptorPool, String>> =
    LazyLock::new(|| DescriptorPool::decode(DESCRIPTORS).map_err(|e| e.to_string()));

/// The decoded descriptor pool, or why the embedded set is unreadable (a build defect,
/// reported to callers rather than panicking).
pub fn pool() -> Result<&'static DescriptorPool, &'static str> {
    POOL.as_ref().map_err(String::as_str)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_message_we_emit_is_described() {
        let pool = super::pool().unwrap();
        for name in [
            "envoy.config.cluster.v3.Cluster",
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
            "envoy.config.listener.v3.Listener",
            "envoy.config.route.v3.RouteConfiguration",
            "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "envoy.extensions.filters.http.router.v3.Router",
            "envoy.extensions.filters.http.fault.v3.HTTPFault",
            "envoy.extensions.filters.http.grpc_web.v3.GrpcWeb",
            "envoy.extensions.filters.http.cors.v3.Cors",
            "envoy.extensions.filters.http.cors.v3.CorsPolicy",
            "envoy.extensions.filters.listener.original_dst.v3.OriginalDst",
            "envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector",
            "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "envoy.extensions.transport_sockets.proxy_protocol.v3.ProxyProtocolUpstreamTransport",
            "envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer",
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate",
            "envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
            "envoy.admin.v3.ConfigDump",
            "envoy.service.discovery.v3.DiscoveryResponse",
        ] {
            assert!(pool.get_message_by_name(name).is_some(), "{name} missing");
        }
    }
}
