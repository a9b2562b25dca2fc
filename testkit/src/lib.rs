//! Pilotfish test infrastructure.
