//! Shared helpers for integration tests.
#![allow(dead_code)]
pub mod fixture_server;
