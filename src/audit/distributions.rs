//! Installed Python distributions: each installed once, and at the version the framework
//! pins (see [`super::pins`] for where the pins come from).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::image::ImageFs;
use super::{AuditError, Finding, FindingKind};

/// One installed Python distribution (a `.dist-info` with a readable METADATA).
pub(super) struct Installed {
    pub dist_info: PathBuf,
    pub name: String,
    pub version: String,
}

/// The distributions of the image, in `.dist-info` order.
pub(super) fn installed(
    fs: &dyn ImageFs,
    dist_infos: &[PathBuf],
) -> Result<Vec<Installed>, AuditError> {
    let mut installed: Vec<Installed> = Vec::new();
    for dist_info in dist_infos {
        if let Some((name, version)) = read_metadata(fs, dist_info)? {
            installed.push(Installed {
                dist_info: dist_info.clone(),
                name,
                version,
            });
        }
    }
    Ok(installed)
}

/// Distributions installed more than once, and pins that are missing or not met.
pub(super) fn check(installed: &[Installed], pins: &BTreeMap<String, String>) -> Vec<Finding> {
    let by_project = by_project(installed);
    let mut findings = duplicates(&by_project);
    findings.extend(pin_mismatches(&by_project, pins));
    findings
}

fn by_project(installed: &[Installed]) -> BTreeMap<String, Vec<&Installed>> {
    let mut by_project: BTreeMap<String, Vec<&Installed>> = BTreeMap::new();
    for dist in installed {
        by_project
            .entry(crate::names::normalize_name(&dist.name))
            .or_default()
            .push(dist);
    }
    by_project
}

fn duplicates(by_project: &BTreeMap<String, Vec<&Installed>>) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (project, dists) in by_project {
        if dists.len() > 1 {
            findings.push(Finding {
                kind: FindingKind::DuplicateDistribution,
                paths: dists.iter().map(|d| d.dist_info.clone()).collect(),
                evidence: format!(
                    "{project} is installed {} times: {}",
                    dists.len(),
                    dists
                        .iter()
                        .map(|d| d.version.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                hint: "install each distribution once, into one site-packages directory".into(),
            });
        }
    }
    findings
}

fn pin_mismatches(
    by_project: &BTreeMap<String, Vec<&Installed>>,
    pins: &BTreeMap<String, String>,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for (name, pinned) in pins {
        let project = crate::names::normalize_name(name);
        match by_project.get(&project) {
            None => findings.push(Finding {
                kind: FindingKind::PinMismatch,
                paths: Vec::new(),
                evidence: format!("{name}=={pinned} is expected but not installed"),
                hint: format!("install {name}=={pinned}"),
            }),
            Some(dists) => {
                for dist in dists {
                    if !version_matches(pinned, &dist.version) {
                        findings.push(Finding {
                            kind: FindingKind::PinMismatch,
                            paths: vec![dist.dist_info.clone()],
                            evidence: format!(
                                "{name}: expected {pinned}, installed {}",
                                dist.version
                            ),
                            hint: format!(
                                "install {name}=={pinned} (the version the framework was built against) instead of {}",
                                dist.version
                            ),
                        });
                    }
                }
            }
        }
    }
    findings
}

/// Read Name and Version from a METADATA file's header block.
fn read_metadata(
    fs: &dyn ImageFs,
    dist_info: &Path,
) -> Result<Option<(String, String)>, AuditError> {
    let Ok(text) = fs.read_text(&dist_info.join("METADATA")) else {
        return Ok(None);
    };
    let mut name = None;
    let mut version = None;
    for line in text.lines() {
        if line.is_empty() {
            break;
        }
        if let Some(value) = line.strip_prefix("Name:") {
            name = Some(value.trim().to_string());
        } else if let Some(value) = line.strip_prefix("Version:") {
            version = Some(value.trim().to_string());
        }
    }
    Ok(name.zip(version))
}

/// Versions equal under PEP 440, ignoring the installed local label when the pin has none
/// (`2.4.1` pins `2.4.1+cu121`, as `==` does).
pub(super) fn version_matches(pin: &str, installed: &str) -> bool {
    use pep440_rs::Version;
    match (pin.parse::<Version>(), installed.parse::<Version>()) {
        (Ok(pin), Ok(installed)) => {
            if pin.local().is_empty() {
                pin == installed.without_local()
            } else {
                pin == installed
            }
        }
        _ => pin == installed,
    }
}
