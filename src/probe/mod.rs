//! The probe assets: what the build bakes into every image's config layer and the
//! verification stage runs. `probe.py` (embedded from `probe/probe.py`) at [`PROBE_PATH`],
//! the [`expect::Expectations`] it compares against at [`EXPECT_PATH`], and for images
//! without torch the [`native`] probe binary beside it, when the image's glibc
//! ([`glibc`]) can run it; and the start-time [`guard`] of images that ask for it.
//!
//! This module holds the contract between the build and the probe, and nothing about how
//! a stack is assembled: the assembler (`crate::stack`) computes the expectations from
//! the stack it builds and writes them, so the probe's side never depends on it.

pub mod expect;
pub mod glibc;
pub mod guard;
pub mod native;

/// Where the probe lives inside every image cudastack builds.
pub const PROBE_PATH: &str = "/opt/cudastack/probe/probe.py";
/// The interpreter the probe runs with, by absolute path: every cudastack image has the
/// base's dpkg `python3` there. Not `python3` looked up on PATH: the stack's PATH puts
/// /usr/local/bin first, where a wheel's scripts (a `python3` console script) would
/// replace the probe and read its nonce before anything checked it.
pub const PROBE_INTERPRETER: &str = "/usr/bin/python3";
/// What the recipe and lock say the image holds; the probe compares against it.
pub const EXPECT_PATH: &str = "/usr/share/cudastack/expect.json";
/// The probe's source, baked into images.
pub const PROBE_SOURCE: &str = include_str!("../../probe/probe.py");

#[cfg(test)]
mod tests {
    use super::*;

    /// `copy:` may not write over what the probe runs with (recipe::copy keeps the list,
    /// since recipe sits below probe): every path here must be refused there.
    #[test]
    fn a_recipe_cannot_copy_over_what_the_probe_runs_with() {
        for path in [
            PROBE_PATH,
            EXPECT_PATH,
            PROBE_INTERPRETER,
            "/usr/lib/python3.11/os.py",
        ] {
            assert!(
                crate::recipe::copy::check_destination(path).is_err(),
                "{path}"
            );
        }
    }
}
