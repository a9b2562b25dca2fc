//! Endpoints of the mesh model: one reachable address of a workload behind one service
//! port, with the labels DestinationRule subsets select on and the locality EDS groups by.

use std::collections::BTreeMap;
use std::fmt;

/// Where a workload runs: Istio's `region/zone/subzone`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

impl Locality {
    /// Parses Istio's `region/zone/subzone` form (also the `.`-separated form of the
    /// `istio-locality` pod label). Missing parts are empty.
    pub fn parse(s: &str) -> Locality {
        let sep = if s.contains('/') { '/' } else { '.' };
        let mut parts = s.splitn(3, sep).map(str::to_string);
        Locality {
            region: parts.next().unwrap_or_default(),
            zone: parts.next().unwrap_or_default(),
            subzone: parts.next().unwrap_or_default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.region.is_empty() && self.zone.is_empty() && self.subzone.is_empty()
    }
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.region, self.zone, self.subzone)
    }
}

/// Health of an endpoint, from EndpointSlice conditions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum EndpointHealth {
    /// `ready` (nil means true).
    #[default]
    Healthy,
    /// Not ready and not terminating (starting, failing probes): sent, as `UNHEALTHY`,
    /// only for services that send unhealthy endpoints
    /// ([`Service::send_unhealthy_endpoints`](super::Service::send_unhealthy_endpoints)).
    Unhealthy,
    /// Not ready and shutting down: never sent (Istio 1.30 counts a rollout's old Pods
    /// neither as healthy nor as unhealthy).
    Terminating,
}

impl EndpointHealth {
    /// Maps EndpointSlice conditions the way Istio 1.30 does: `ready` (nil means true) is
    /// healthy, whatever the other conditions say; otherwise `terminating` (nil means
    /// true) is terminating; otherwise unhealthy. `serving` only matters to Istio's
    /// persistent sessions (draining endpoints), which Pilotfish does not support.
    pub fn from_conditions(ready: Option<bool>, terminating: Option<bool>) -> Self {
        if ready.unwrap_or(true) {
            EndpointHealth::Healthy
        } else if terminating.unwrap_or(true) {
            EndpointHealth::Terminating
        } else {
            EndpointHealth::Unhealthy
        }
    }
}

/// One address serving one port of a service.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    /// IP address, or a host name for DNS-resolved ServiceEntry endpoints.
    pub address: String,
    /// Port on the workload (the target port), which EDS and clusters connect to.
    pub port: u32,
    /// Workload labels: DestinationRule subsets and `sourceLabels` select on them.
    pub labels: BTreeMap<String, String>,
    pub locality: Locality,
    pub health: EndpointHealth,
    pub service_account: Option<String>,
    /// Load-balancing weight (ServiceEntry endpoints); `None` is weight 1.
    pub weight: Option<u32>,
    /// Network the workload is on (multi-network meshes); empty for the local network.
    pub network: String,
    /// The Pod (or WorkloadEntry) the endpoint belongs to, as `<namespace>/<name>`, for
    /// debug output.
    pub workload: Option<String>,
}

/// All endpoints of one service port.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct PortEndpoints {
    /// The service port number (not the target port).
    pub service_port: u32,
    pub endpoints: Vec<Endpoint>,
}

impl PortEndpoints {
    /// Endpoints whose labels include every label of `selector` (an empty selector matches all).
    pub fn matching<'a>(
        &'a self,
        selector: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a Endpoint> + 'a {
        self.endpoints
            .iter()
            .filter(move |e| labels_match(selector, &e.labels))
    }
}

/// All endpoints of one service (Kubernetes Service or ServiceEntry host), per port.
#[derive(Clone, Debug, PartialEq, Eq, Default, Hash)]
pub struct ServiceEndpoints {
    pub hostname: String,
    pub namespace: String,
    /// Sorted by service port.
    pub ports: Vec<PortEndpoints>,
}

impl ServiceEndpoints {
    pub fn port(&self, service_port: u32) -> Option<&PortEndpoints> {
        self.ports.iter().find(|p| p.service_port == service_port)
    }
}

/// Whether `labels` carries every key/value of `selector`.
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_istio_1_30_rules() {
        use EndpointHealth::*;
        // (ready, terminating) -> health, as Istio's endpointHealthStatus reads them.
        let cases = [
            ((None, None), Healthy),
            ((Some(true), Some(false)), Healthy),
            // `ready` alone decides health, even while terminating.
            ((Some(true), Some(true)), Healthy),
            ((Some(false), Some(false)), Unhealthy),
            // A missing `terminating` counts as terminating for an unready endpoint.
            ((Some(false), None), Terminating),
            ((Some(false), Some(true)), Terminating),
        ];
        for ((ready, terminating), want) in cases {
            assert_eq!(
                EndpointHealth::from_conditions(ready, terminating),
                want,
                "ready {ready:?}, terminating {terminating:?}"
            );
        }
    }

    #[test]
    fn locality_parses_both_forms() {
        let l = Locality::parse("us-east1/us-east1-b/rack1");
        assert_eq!(
            (l.region.as_str(), l.zone.as_str(), l.subzone.as_str()),
            ("us-east1", "us-east1-b", "rack1")
        );
        let l = Locality::parse("eu.eu-west1-a");
        assert_eq!(
            (l.region.as_str(), l.zone.as_str(), l.subzone.as_str()),
            ("eu", "eu-west1-a", "")
        );
        assert!(Locality::parse("").is_empty());
        assert_eq!(Locality::parse("r/z/s").to_string(), "r/z/s");
    }

    #[test]
    fn label_selection() {
        let sel: BTreeMap<_, _> = [("version".to_string(), "v1".to_string())].into();
        let mut labels: BTreeMap<_, _> = [("app".to_string(), "reviews".to_string())].into();
        assert!(!labels_match(&sel, &labels));
        labels.insert("version".into(), "v1".into());
        assert!(labels_match(&sel, &labels));
        assert!(labels_match(&BTreeMap::new(), &labels));
    }
}
