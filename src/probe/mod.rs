//! The probe assets: what the build bakes into every image's config layer and the
//! verification stage runs. `probe.py` (embedded from `probe/probe.py`) at [`PROBE_PATH`],
//! the [`expect::Expectations`] it compares against at [`EXPECT_PATH`], and for images
//! without torch the [`native`] probe binary beside it, when the image's glibc
//! ([`glibc`]) can run it.
//!
//! This module holds the contract between the build and the probe, and nothing about how
//! a stack is assembled: the assembler (`crate::stack`) computes the expectations from
//! the stack it builds and writes them, so the probe's side never depends on it.

pub mod expect;
pub mod glibc;
pub mod native;

/// Where the probe lives inside every image cudastack builds.
pub const PROBE_PATH: &str = "/opt/cudastack/probe/probe.py";
/// What the recipe and lock say the image holds; the probe compares against it.
pub const EXPECT_PATH: &str = "/usr/share/cudastack/expect.json";
/// The probe's source, baked into images.
pub const PROBE_SOURCE: &str = include_str!("../../probe/probe.py");
