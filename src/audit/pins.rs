//! Expected pins from a framework's own metadata: the `==` requirements in torch's
//! `Requires-Dist` (e.g. `nvidia-cudnn-cu12==9.1.0.70; platform_system == "Linux" and
//! platform_machine == "x86_64"`) that apply to the image's platform. The audit compares
//! them with what is installed, so a wheel swapped in later cannot silently skew cuDNN.

use std::collections::BTreeMap;
use std::path::Path;

use pep508_rs::pep440_rs::Operator;
use pep508_rs::{MarkerEnvironment, VersionOrUrl};

use super::AuditError;
use crate::names::normalize_name;
use crate::rootfs::host_path;
use crate::version::PythonVersion;

/// The marker environment of CPython `python` on Linux `machine` (e.g. `x86_64`).
pub fn linux_environment(python: PythonVersion, machine: &str) -> MarkerEnvironment {
    crate::names::linux_marker_environment(&format!("{python}.0"), machine)
}

/// The exact pins (`name==version`, no wildcard, no extra) among the `Requires-Dist` lines of
/// a METADATA text whose markers hold in `environment`. Keys are normalised project names.
/// Lines that do not parse are skipped: a pin we cannot read is not a pin we can check.
pub fn pins_from_metadata(
    metadata: &str,
    environment: &MarkerEnvironment,
) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    for line in metadata.lines() {
        if line.is_empty() {
            break; // End of the header block; the description follows.
        }
        let Some(value) = line.strip_prefix("Requires-Dist:") else {
            continue;
        };
        let Ok(requirement) =
            crate::names::parse_requirement::<pep508_rs::VerbatimUrl>(value.trim())
        else {
            continue;
        };
        if !requirement.marker.evaluate(environment, &[]) {
            continue;
        }
        let Some(VersionOrUrl::VersionSpecifier(specifiers)) = &requirement.version_or_url else {
            continue;
        };
        if let [only] = &specifiers[..] {
            if matches!(only.operator(), Operator::Equal | Operator::ExactEqual) {
                pins.insert(
                    normalize_name(requirement.name.as_ref()),
                    only.version().to_string(),
                );
            }
        }
    }
    pins
}

/// Read the pins of the installed distribution `project` (any `.dist-info` in `site_dir`,
/// an image path, whose name normalises to it). None when it is not installed there.
pub fn pins_of_installed(
    root: &Path,
    site_dir: &Path,
    project: &str,
    environment: &MarkerEnvironment,
) -> Result<Option<BTreeMap<String, String>>, AuditError> {
    let wanted = normalize_name(project);
    let host_site = host_path(root, site_dir);
    let entries = match std::fs::read_dir(&host_site) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(AuditError::Io {
                path: host_site,
                source,
            })
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            name.strip_suffix(".dist-info")
                .and_then(|stem| stem.split_once('-'))
                .is_some_and(|(name, _)| normalize_name(name) == wanted)
        })
        .collect();
    names.sort();
    let Some(dist_info) = names.first() else {
        return Ok(None);
    };
    let metadata = host_site.join(dist_info).join("METADATA");
    let text = std::fs::read_to_string(&metadata).map_err(|source| AuditError::Io {
        path: metadata.clone(),
        source,
    })?;
    Ok(Some(pins_from_metadata(&text, environment)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Modelled on the header of torch 2.4.1's METADATA (its nvidia-* pins as listed in
    /// DESIGN.md), abridged, plus a line after the header block that must be ignored.
    const TORCH_METADATA: &str = "Metadata-Version: 2.1\n\
Name: torch\n\
Version: 2.4.1\n\
Requires-Python: >=3.8.0\n\
Requires-Dist: filelock\n\
Requires-Dist: typing-extensions>=4.8.0\n\
Requires-Dist: sympy\n\
Requires-Dist: nvidia-cuda-nvrtc-cu12==12.1.105; platform_system == \"Linux\" and platform_machine == \"x86_64\"\n\
Requires-Dist: nvidia-cuda-runtime-cu12==12.1.105; platform_system == \"Linux\" and platform_machine == \"x86_64\"\n\
Requires-Dist: nvidia-cudnn-cu12==9.1.0.70; platform_system == \"Linux\" and platform_machine == \"x86_64\"\n\
Requires-Dist: triton==3.0.0; platform_system == \"Linux\" and platform_machine == \"x86_64\" and python_version < \"3.13\"\n\
Requires-Dist: opt-einsum>=3.3; extra == \"opt-einsum\"\n\
Requires-Dist: optree>=0.11.0; extra == \"optree\"\n\
\n\
Requires-Dist: not-a-header==1.0\n";

    #[test]
    fn torch_pins_for_linux_x86_64() {
        let python: PythonVersion = "3.11".parse().unwrap();
        let pins = pins_from_metadata(TORCH_METADATA, &linux_environment(python, "x86_64"));
        assert_eq!(
            pins,
            BTreeMap::from([
                ("nvidia-cuda-nvrtc-cu12".into(), "12.1.105".into()),
                ("nvidia-cuda-runtime-cu12".into(), "12.1.105".into()),
                ("nvidia-cudnn-cu12".into(), "9.1.0.70".into()),
                ("triton".into(), "3.0.0".into()),
            ])
        );
        let arm = pins_from_metadata(TORCH_METADATA, &linux_environment(python, "aarch64"));
        assert!(arm.is_empty(), "{arm:?}");
        let py313: PythonVersion = "3.13".parse().unwrap();
        let newer = pins_from_metadata(TORCH_METADATA, &linux_environment(py313, "x86_64"));
        assert!(!newer.contains_key("triton"));
    }
}
