//! The integration tests of `pilotfish-mesh` (one test binary; each module is one area).

mod api_corpus;
mod istio_rules;
mod semantic_corpus;
