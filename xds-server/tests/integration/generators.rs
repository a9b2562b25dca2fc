//! Behaviour of the generators through [`GeneratedSnapshot`], beyond the golden files:
//! sharing of generated parts between proxies, proxyless wildcard CDS, name filtering,
//! config_dump, change kinds.
