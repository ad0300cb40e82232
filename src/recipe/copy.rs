//! `copy:`: the team's code, copied from the recipe's directory into the image's top layer.
//!
//! Paths are checked here, where they are written: a source is relative to the recipe's
//! directory (the build context, as a Dockerfile's context) and may not leave it, so a
//! recipe from a pull request cannot copy `~/.ssh` into an image; a destination is an
//! absolute image path. What the entries hold is read at build time (`stack::layers::copy`).

use std::fmt;
use std::path::{Component, Path};

use serde::{Deserialize, Deserializer, Serialize};

/// One `copy:` entry: `{src: train, dst: /workspace/train, exclude: ["**/__pycache__"]}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CopyEntry {
    /// A file or directory, relative to the recipe's directory; it may not leave it.
    #[serde(deserialize_with = "deserialize_source")]
    pub src: String,
    /// Where it goes in the image: an absolute path. A directory's contents go into `dst`
    /// (as `COPY dir/ /dst/`); a file becomes `dst` itself.
    #[serde(deserialize_with = "deserialize_destination")]
    pub dst: String,
    /// `.dockerignore`-syntax patterns, matched against paths relative to `src`
    /// (`**/__pycache__`, `data/`, `!data/README.md`); the recipe directory's own
    /// `.dockerignore` applies first, relative to the recipe directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

impl fmt::Display for CopyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {}", self.src, self.dst)
    }
}

fn deserialize_source<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let src = String::deserialize(deserializer)?;
    check_source(&src).map_err(serde::de::Error::custom)?;
    Ok(src)
}

fn deserialize_destination<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let dst = String::deserialize(deserializer)?;
    check_destination(&dst).map_err(serde::de::Error::custom)?;
    Ok(normalise(&dst))
}

/// A source must stay inside the recipe's directory.
pub fn check_source(src: &str) -> Result<(), String> {
    let path = Path::new(src);
    if src.is_empty() {
        return Err("copy `src` is empty; give a file or directory relative to the recipe (`.` for the whole directory)".into());
    }
    if path.is_absolute() {
        return Err(format!("copy `src: {src}` is absolute; give it relative to the recipe's directory (the build context), which is all a recipe may copy from"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("copy `src: {src}` leaves the recipe's directory with `..`; a recipe copies only from its own directory, so move the files next to it or the recipe next to them"));
    }
    Ok(())
}

/// A destination is an absolute image path without `..` (the layer could not hold it).
pub fn check_destination(dst: &str) -> Result<(), String> {
    let path = Path::new(dst);
    if !path.is_absolute() {
        return Err(format!(
            "copy `dst: {dst}` must be an absolute path in the image (`/workspace/{dst}`)"
        ));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!(
            "copy `dst: {dst}` contains `..`; write the path it means"
        ));
    }
    if path
        .components()
        .any(|c| c.as_os_str().to_string_lossy().starts_with(".wh."))
    {
        return Err(format!(
            "copy `dst: {dst}` has a name starting with `.wh.`, which marks a whiteout in an OCI layer: the image would lose a file of the layers below instead of getting this one"
        ));
    }
    let dst = normalise(dst);
    if dst == "/" {
        return Err("copy `dst: /` would put files over the whole image; copy into a directory of its own (`/workspace`)".into());
    }
    if let Some(protected) = verification_base_at(&dst) {
        return Err(format!(
            "copy `dst: {dst}` would write over `{protected}`, which the verification probe runs with: code copied there would run before the probe and could forge its report\n  hint: copy the team's code into a directory of its own (`/workspace`, `/opt/<team>`)"
        ));
    }
    Ok(())
}

/// What the verification probe runs with and reads before any image code: its own files,
/// the base's interpreter and its standard library, and what the dynamic loader reads
/// before the interpreter's first line (`/etc/ld.so.preload`, its configuration and cache,
/// the library directories it searches, the CUDA and driver directories on the stack's
/// LD_LIBRARY_PATH): a library there runs its constructors before the probe takes the
/// nonce out of its environment. `copy:` (the team's layer, above the probe's) may not write
/// over them or over a directory holding them. The probe's paths are
/// `crate::probe::{PROBE_PATH, EXPECT_PATH, PROBE_INTERPRETER}` (a test there checks they are
/// covered; recipe sits below probe in the module order and cannot import it). A name
/// ending in `*` covers every name it starts (`/usr/local/cuda*`: `/usr/local/cuda-12.1`).
pub const VERIFICATION_BASE: &[&str] = &[
    "/opt/cudastack",
    "/usr/share/cudastack",
    "/usr/bin/python3",
    // CPython reads these beside its executable and one level up at start, `-I` or not: a
    // `home =` there makes another directory its prefix and standard library.
    "/usr/bin/pyvenv.cfg",
    "/usr/pyvenv.cfg",
    "/usr/bin/pybuilddir.txt",
    "/etc/ld.so.preload",
    "/etc/ld.so.conf",
    "/etc/ld.so.cache",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr/lib",
    "/usr/lib32",
    "/usr/lib64",
    "/usr/libx32",
    "/usr/local/lib",
    "/usr/local/lib64",
    "/usr/local/cuda*",
    "/usr/local/nvidia",
];

/// The entry of [`VERIFICATION_BASE`] that writing at the absolute image path `path` would
/// touch, if any (a wheel's `.data/data/` member is checked the same way as `copy:`).
pub fn verification_base_at(path: &str) -> Option<&'static str> {
    let path = normalise(path);
    VERIFICATION_BASE
        .iter()
        .copied()
        .find(|protected| overlaps(&path, protected))
}

/// Whether writing at `dst` can touch `protected`: one lies inside the other. A protected
/// name also covers its versioned siblings (`/usr/bin/python3` covers `/usr/bin/python3.11`,
/// `/etc/ld.so.conf` covers `/etc/ld.so.conf.d`), and one ending in `*` every name it starts.
fn overlaps(dst: &str, protected: &str) -> bool {
    let (protected, any_suffix) = match protected.strip_suffix('*') {
        Some(stem) => (stem, true),
        None => (protected, false),
    };
    let (parent, name) = protected.rsplit_once('/').unwrap_or(("", protected));
    let covered = |path: &str| {
        path.strip_prefix(parent)
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| rest.strip_prefix(name))
            .is_some_and(|rest| {
                any_suffix || rest.is_empty() || rest.starts_with('/') || rest.starts_with('.')
            })
    };
    covered(dst) || protected.starts_with(&format!("{dst}/"))
}

/// `/workspace//train/./` -> `/workspace/train`.
fn normalise(dst: &str) -> String {
    let parts: Vec<&str> = dst
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_stay_in_the_recipe_directory() {
        assert!(check_source("train").is_ok());
        assert!(check_source("./train/model.py").is_ok());
        assert!(check_source(".").is_ok());
        for bad in ["", "/etc/passwd", "../secrets", "train/../../x"] {
            assert!(check_source(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn destinations_may_not_touch_what_the_probe_runs_with() {
        for bad in [
            "/usr/bin/python3",
            "/usr/bin/python3.11",
            "/usr/lib/python3.11/encodings",
            "/usr/lib/python3",
            "/opt/cudastack/probe/probe.py",
            "/usr/share/cudastack",
            "/opt",
            "/usr",
            "/usr/lib",
            "/usr/bin",
            "/usr/share//cudastack/",
            // What CPython reads at start to find its prefix.
            "/usr/pyvenv.cfg",
            "/usr/bin/pyvenv.cfg",
            "/usr/bin/pybuilddir.txt",
            // What the loader reads before the interpreter's first line.
            "/etc/ld.so.preload",
            "/etc/ld.so.conf.d/team.conf",
            "/etc/ld.so.cache",
            "/etc",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libz.so.1",
            "/usr/lib64",
            "/usr/local/lib/libz.so.1",
            "/usr/local/lib/python3.11/dist-packages/team",
            "/usr/local/cuda",
            "/usr/local/cuda-12.1/targets/x86_64-linux/lib/libz.so.1",
            "/usr/local/nvidia/lib64/libcuda.so.1",
        ] {
            let error = check_destination(bad).unwrap_err();
            assert!(error.contains("verification probe"), "{bad}: {error}");
        }
        for good in [
            "/workspace",
            "/opt/team",
            "/usr/local/bin/train",
            "/usr/bin/python3-config-notes",
            "/usr/share/team",
            "/etc/team/config.yaml",
            "/etc/ld.so.conf-notes",
            "/usr/local/share/team",
            "/usr/local/library",
        ] {
            assert!(check_destination(good).is_ok(), "{good}");
        }
    }

    /// `.wh.X` in a layer deletes X below: `/usr/share/.wh.cudastack` would remove the
    /// probe's expectations at run time.
    #[test]
    fn destinations_may_not_be_whiteouts() {
        for bad in [
            "/usr/share/.wh.cudastack",
            "/opt/.wh.cudastack",
            "/usr/bin/.wh.python3.11",
            "/workspace/.wh..wh..opq",
            "/.wh.etc/x",
        ] {
            let error = check_destination(bad).unwrap_err();
            assert!(error.contains("whiteout"), "{bad}: {error}");
        }
        assert!(check_destination("/workspace/.whitelist").is_ok());
    }

    #[test]
    fn destinations_are_absolute_and_normalised() {
        assert!(check_destination("relative").is_err());
        assert!(check_destination("/a/../b").is_err());
        assert!(check_destination("//").is_err());
        assert_eq!(normalise("/workspace//train/./"), "/workspace/train");
    }
}
