//! cuDNN agreement: `cudnn_version.h`, the `libcudnn.so.X.Y.Z` file names and the installed
//! nvidia-cudnn wheel must name one cuDNN release.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::distributions::Installed;
use super::image::ImageFs;
use super::{io_error, AuditError, Finding, FindingKind};

/// A cuDNN version as one source states it; sources that only know the major leave the rest None.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CudnnClaim {
    source: String,
    path: PathBuf,
    parts: Vec<u64>,
}

impl CudnnClaim {
    fn text(&self) -> String {
        self.parts
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(".")
    }
}

/// Every cuDNN version the image states: headers, then library file names, then wheels (the
/// order the finding lists them in).
pub(super) fn claims(
    fs: &dyn ImageFs,
    headers: &[PathBuf],
    library_names: &[PathBuf],
    installed: &[Installed],
) -> Result<Vec<CudnnClaim>, AuditError> {
    let mut claims = header_claims(fs, headers)?;
    claims.extend(library_name_claims(library_names));
    claims.extend(wheel_claims(installed));
    Ok(claims)
}

fn header_claims(fs: &dyn ImageFs, headers: &[PathBuf]) -> Result<Vec<CudnnClaim>, AuditError> {
    let mut claims = Vec::new();
    for header in headers {
        let text = fs.read_text(header).map_err(io_error(header))?;
        if let Some((major, minor, patch)) = parse_cudnn_header(&text) {
            claims.push(CudnnClaim {
                source: "cudnn_version.h".into(),
                path: header.clone(),
                parts: vec![major, minor, patch],
            });
        }
    }
    Ok(claims)
}

fn library_name_claims(library_names: &[PathBuf]) -> Vec<CudnnClaim> {
    let mut claims = Vec::new();
    for library in library_names {
        let name = library.file_name().unwrap_or_default().to_string_lossy();
        if let Some(parts) = name
            .strip_prefix("libcudnn.so.")
            .and_then(numeric_parts)
            .filter(|parts| !parts.is_empty())
        {
            claims.push(CudnnClaim {
                source: "library file name".into(),
                path: library.clone(),
                parts,
            });
        }
    }
    claims
}

fn wheel_claims(installed: &[Installed]) -> Vec<CudnnClaim> {
    let mut claims = Vec::new();
    for dist in installed {
        let normalized = crate::names::normalize_name(&dist.name);
        if normalized.starts_with("nvidia-cudnn-") {
            if let Some(parts) = dist
                .version
                .split(['+', '-'])
                .next()
                .and_then(numeric_parts)
            {
                claims.push(CudnnClaim {
                    source: format!("{} wheel version", dist.name),
                    path: dist.dist_info.clone(),
                    parts: parts.into_iter().take(3).collect(),
                });
            }
        }
    }
    claims
}

/// A finding when two claims disagree on a part both state (a major-only claim agrees with
/// any release of that major).
pub(super) fn mismatch(claims: &[CudnnClaim]) -> Option<Finding> {
    let agree = |a: &CudnnClaim, b: &CudnnClaim| a.parts.iter().zip(&b.parts).all(|(x, y)| x == y);
    let disagreeing = claims
        .iter()
        .enumerate()
        .any(|(i, a)| claims[i + 1..].iter().any(|b| !agree(a, b)));
    if !disagreeing {
        return None;
    }
    let mut evidence = String::from("the cuDNN version sources disagree:\n");
    for claim in claims {
        let _ = writeln!(
            evidence,
            "{} says {} ({})",
            claim.source,
            claim.text(),
            claim.path.display()
        );
    }
    Some(Finding {
        kind: FindingKind::CudnnVersionMismatch,
        paths: claims.iter().map(|c| c.path.clone()).collect(),
        evidence: evidence.trim_end().to_string(),
        hint: "install headers and libraries from one cuDNN release (the one torch pins), and remove the other copy".into(),
    })
}

/// Parse `#define CUDNN_MAJOR 9` / `CUDNN_MINOR` / `CUDNN_PATCHLEVEL` from cudnn_version.h.
pub fn parse_cudnn_header(text: &str) -> Option<(u64, u64, u64)> {
    let define = |name: &str| {
        text.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("#define") && words.next() == Some(name))
                .then(|| words.next()?.parse::<u64>().ok())
                .flatten()
        })
    };
    Some((
        define("CUDNN_MAJOR")?,
        define("CUDNN_MINOR")?,
        define("CUDNN_PATCHLEVEL")?,
    ))
}

fn numeric_parts(text: &str) -> Option<Vec<u64>> {
    text.split('.').map(|part| part.parse().ok()).collect()
}
