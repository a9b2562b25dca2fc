//! The mesh model: what Pilotfish knows about services, endpoints and proxies, independent
//! of where it came from (Kubernetes, ServiceEntry, a folder of YAML).

mod endpoint;
mod identity;
pub mod kube;
mod proxy;
mod service;

pub use endpoint::{
    Endpoint, EndpointHealth, Locality, PortEndpoints, ServiceEndpoints, labels_match,
};
pub use identity::{SpiffeId, SpiffeIdError};
pub use kube::{NodeInfo, PodInfo};
pub use proxy::{Proxy, ProxyGenerator, ProxyType};
pub use service::{
    ALL_PROTOCOLS, ExportTo, Protocol, Resolution, Service, ServiceOrigin, ServicePort, TargetPort,
};
