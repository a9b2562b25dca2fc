//! The mesh model: what Pilotfish knows about services, endpoints and proxies, independent
//! of where it came from (Kubernetes, ServiceEntry, a folder of YAML).

mod proxy;

pub use proxy::{Proxy, ProxyGenerator, ProxyType};
