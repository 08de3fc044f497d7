//! Integration tests of segwal, grouped by concern.
