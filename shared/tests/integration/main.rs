//! The integration tests of `pilotfish-shared` (one test binary; each module is one area).

mod api_corpus;
mod semantic_corpus;
