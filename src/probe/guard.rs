//! The start-time guard (`runtime: { guard: true }`, docs/guard.md): `guard.py` (embedded
//! from `probe/guard.py`), where it lives in an image, how it wraps the entrypoint, and the
//! variable that carries what it compares against. The assembler computes that document
//! (`crate::stack::guard`) once the audit has found the image's kernels; the guard reads the
//! node's driver and GPUs and answers as `cudastack check` does before the team's code runs.

use crate::probe::PROBE_INTERPRETER;

/// Where the guard lives inside an image whose recipe asks for it.
pub const GUARD_PATH: &str = "/opt/cudastack/guard.py";
/// The guard's source, baked into those images.
pub const GUARD_SOURCE: &str = include_str!("../../probe/guard.py");
/// The variable of the image config that holds the guard's facts (canonical JSON). A
/// variable, not a file of a layer: the kernel coverage is known only after the audit has
/// read the assembled layers, and a file would change the layers it read.
pub const GUARD_EXPECT_ENV: &str = "CUDASTACK_GUARD_EXPECT";
/// `CUDASTACK_GUARD=skip` starts the command unchecked (a deliberate run without GPUs).
pub const GUARD_SKIP_ENV: &str = "CUDASTACK_GUARD";

/// The words in front of the image's entrypoint: the guard by the probe's interpreter,
/// isolated (`-I -S`: nothing of the image's site-packages runs first), then `--`.
pub fn guard_prefix() -> Vec<String> {
    [PROBE_INTERPRETER, "-I", "-S", GUARD_PATH, "--"]
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The entrypoint of a guarded image: the guard, then the recipe's entrypoint. An image
/// without one gets the guard alone, and its `Cmd` (the default `python3`, a recipe's
/// `cmd:`, a `docker run IMAGE ARGS`) becomes what the guard starts.
pub fn guarded_entrypoint(entrypoint: &[String]) -> Vec<String> {
    let mut words = guard_prefix();
    words.extend(entrypoint.iter().cloned());
    words
}

/// The command behind the guard, for readers of an image config that launch the
/// entrypoint themselves (a cluster job wrapping it in torchrun); `None` when `entrypoint`
/// does not start with the guard.
pub fn unguarded(entrypoint: &[String]) -> Option<&[String]> {
    let prefix = guard_prefix();
    (entrypoint.len() >= prefix.len() && entrypoint[..prefix.len()] == prefix[..])
        .then(|| &entrypoint[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_goes_in_front_and_comes_off_again() {
        let train = vec!["python3".to_string(), "train.py".to_string()];
        let guarded = guarded_entrypoint(&train);
        assert_eq!(
            guarded[..5],
            ["/usr/bin/python3", "-I", "-S", GUARD_PATH, "--"]
        );
        assert_eq!(unguarded(&guarded), Some(&train[..]));
        assert_eq!(unguarded(&guarded_entrypoint(&[])), Some(&[][..]));
        assert_eq!(unguarded(&train), None);
    }

    /// `copy:` may not write over the guard.
    #[test]
    fn a_recipe_cannot_copy_over_the_guard() {
        assert!(crate::recipe::copy::check_destination(GUARD_PATH).is_err());
    }
}
