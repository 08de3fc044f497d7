//! The crash harness.
