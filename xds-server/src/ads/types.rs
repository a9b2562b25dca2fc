//! The four xDS resource types the engine serves, their type URLs and their push order.

use std::fmt;

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// A served xDS type. The derived order is the make-before-break push order on one ADS
/// stream: clusters before the endpoints that warm them, listeners before the routes they
/// name, and routes last so they never point at a cluster the client does not have yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum XdsType {
    Cluster,
    Endpoint,
    Listener,
    Route,
}

impl XdsType {
    /// Every served type, in push order.
    pub const ALL: [XdsType; 4] = [
        XdsType::Cluster,
        XdsType::Endpoint,
        XdsType::Listener,
        XdsType::Route,
    ];

    /// The type for a type URL; `None` for anything the engine does not serve.
    pub fn from_type_url(type_url: &str) -> Option<XdsType> {
        match type_url {
            CLUSTER_TYPE => Some(XdsType::Cluster),
            ENDPOINT_TYPE => Some(XdsType::Endpoint),
            LISTENER_TYPE => Some(XdsType::Listener),
            ROUTE_TYPE => Some(XdsType::Route),
            _ => None,
        }
    }

    /// Position in [`XdsType::ALL`], for per-type arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn type_url(self) -> &'static str {
        match self {
            XdsType::Cluster => CLUSTER_TYPE,
            XdsType::Endpoint => ENDPOINT_TYPE,
            XdsType::Listener => LISTENER_TYPE,
            XdsType::Route => ROUTE_TYPE,
        }
    }

    /// Istio's short name, used as the `type` label of metrics.
    pub fn short_name(self) -> &'static str {
        match self {
            XdsType::Cluster => "cds",
            XdsType::Endpoint => "eds",
            XdsType::Listener => "lds",
            XdsType::Route => "rds",
        }
    }

    /// Whether an empty name list on the first request means "everything" (the legacy
    /// wildcard). The protocol defines it for listeners and clusters only; RDS and EDS
    /// are always asked for by name (an explicit `*` still works for every type).
    pub fn empty_means_wildcard(self) -> bool {
        matches!(self, XdsType::Cluster | XdsType::Listener)
    }

    /// Whether a SotW response of this type must carry every resource (absent = deleted):
    /// LDS and CDS. RDS and EDS responses may carry only what changed.
    pub fn sends_state_of_the_world(self) -> bool {
        matches!(self, XdsType::Cluster | XdsType::Listener)
    }
}

impl fmt::Display for XdsType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_urls_round_trip_and_order_is_make_before_break() {
        for t in XdsType::ALL {
            assert_eq!(XdsType::from_type_url(t.type_url()), Some(t));
        }
        assert_eq!(XdsType::from_type_url("type.googleapis.com/foo"), None);
        let mut sorted = XdsType::ALL;
        sorted.sort();
        assert_eq!(sorted, XdsType::ALL);
        assert_eq!(
            XdsType::ALL.map(XdsType::short_name),
            ["cds", "eds", "lds", "rds"]
        );
    }
}
