//! A wheel's declared license as an SPDX expression, from its METADATA: what the SBOM's
//! `licenseDeclared` says. Never an expression the SPDX validators refuse: a text that is
//! not a valid expression of SPDX license-list ids is no answer (NOASSERTION), not a guess.
//!
//! Order (PEP 639, Core Metadata 2.4): `License-Expression`; else a `License` field that is
//! itself a valid expression (`MIT`, `BSD-3-Clause`: many projects write the id there);
//! else the one `License ::` classifier, where it names one license
//! ([`CLASSIFIERS`]; `BSD License` or `Apache Software License` name no version).

use std::io::Read;
use std::path::Path;

/// A METADATA file larger than this is not read (the headers come first; torch's whole
/// METADATA is ~30 kB).
const MAX_METADATA_BYTES: u64 = 4 * 1024 * 1024;

/// Trove classifiers that name exactly one SPDX license (the classifier list,
/// <https://pypi.org/classifiers/>, against the SPDX license list,
/// <https://spdx.org/licenses/>). Left out on purpose: `BSD License`, `Apache Software
/// License`, `GNU General Public License v2 (GPLv2)` (only or or-later?) and the like.
pub const CLASSIFIERS: &[(&str, &str)] = &[
    ("License :: OSI Approved :: MIT License", "MIT"),
    (
        "License :: OSI Approved :: MIT No Attribution License (MIT-0)",
        "MIT-0",
    ),
    ("License :: OSI Approved :: ISC License (ISCL)", "ISC"),
    (
        "License :: OSI Approved :: Apache Software License 2.0",
        "Apache-2.0",
    ),
    (
        "License :: OSI Approved :: Boost Software License 1.0 (BSL-1.0)",
        "BSL-1.0",
    ),
    (
        "License :: OSI Approved :: Mozilla Public License 2.0 (MPL 2.0)",
        "MPL-2.0",
    ),
    (
        "License :: OSI Approved :: Python Software Foundation License",
        "PSF-2.0",
    ),
    (
        "License :: OSI Approved :: The Unlicense (Unlicense)",
        "Unlicense",
    ),
    ("License :: OSI Approved :: zlib/libpng License", "Zlib"),
    (
        "License :: OSI Approved :: Universal Permissive License (UPL)",
        "UPL-1.0",
    ),
    (
        "License :: OSI Approved :: Eclipse Public License 2.0 (EPL-2.0)",
        "EPL-2.0",
    ),
    (
        "License :: OSI Approved :: European Union Public Licence 1.2 (EUPL 1.2)",
        "EUPL-1.2",
    ),
    (
        "License :: OSI Approved :: GNU General Public License v2 or later (GPLv2+)",
        "GPL-2.0-or-later",
    ),
    (
        "License :: OSI Approved :: GNU General Public License v3 or later (GPLv3+)",
        "GPL-3.0-or-later",
    ),
    (
        "License :: OSI Approved :: GNU Lesser General Public License v2 or later (LGPLv2+)",
        "LGPL-2.0-or-later",
    ),
    (
        "License :: OSI Approved :: GNU Lesser General Public License v3 or later (LGPLv3+)",
        "LGPL-3.0-or-later",
    ),
    (
        "License :: OSI Approved :: GNU Affero General Public License v3 or later (AGPLv3+)",
        "AGPL-3.0-or-later",
    ),
    (
        "License :: OSI Approved :: Historical Permission Notice and Disclaimer (HPND)",
        "HPND",
    ),
    (
        "License :: CC0 1.0 Universal (CC0 1.0) Public Domain Dedication",
        "CC0-1.0",
    ),
];

/// The declared license of the wheel at `path`, as a valid SPDX expression; None when the
/// wheel states none that is one, or cannot be read (the SBOM then says NOASSERTION).
pub fn wheel_license(path: &Path) -> Option<String> {
    metadata_license(&read_metadata(path)?)
}

/// The text of the wheel's `*.dist-info/METADATA` (a top-level directory, as the wheel
/// spec places it), at most [`MAX_METADATA_BYTES`].
fn read_metadata(path: &Path) -> Option<String> {
    let file = fs_err::File::open(path).ok()?;
    let mut archive = zip::ZipArchive::new(file.into_parts().0).ok()?;
    let name = archive
        .file_names()
        .filter_map(Result::ok)
        .find(|name| {
            name.split_once('/')
                .is_some_and(|(dir, rest)| dir.ends_with(".dist-info") && rest == "METADATA")
        })?
        .into_owned();
    let entry = archive.by_name(&name).ok()?;
    let mut bytes = Vec::new();
    entry
        .take(MAX_METADATA_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_METADATA_BYTES {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The declared license of a METADATA text (see the module's order).
pub fn metadata_license(metadata: &str) -> Option<String> {
    let headers = headers(metadata);
    let field = |name: &'static str| {
        headers
            .iter()
            .filter(move |(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.trim())
    };
    if let Some(expression) = field("License-Expression").find_map(valid_expression) {
        return Some(expression);
    }
    if let Some(expression) = field("License").find_map(valid_expression) {
        return Some(expression);
    }
    let licenses: Vec<&str> = field("Classifier")
        .filter(|c| c.starts_with("License ::") && *c != "License :: OSI Approved")
        .collect();
    match licenses.as_slice() {
        [one] => CLASSIFIERS
            .iter()
            .find(|(classifier, _)| classifier == one)
            .map(|(_, id)| (*id).to_string()),
        _ => None,
    }
}

/// The header fields of a METADATA text (RFC 822 style: they end at the first empty line; a
/// line starting with white space continues the field before it).
fn headers(metadata: &str) -> Vec<(&str, String)> {
    let mut fields: Vec<(&str, String)> = Vec::new();
    for line in metadata.lines() {
        if line.trim().is_empty() {
            break;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = fields.last_mut() {
                value.push('\n');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            fields.push((key.trim(), value.trim().to_string()));
        }
    }
    fields
}

/// `text` when it is an SPDX expression of license-list ids (and exceptions) only, parsed
/// strictly: no `LicenseRef-` (a document would have to define it), no imprecise names.
pub fn valid_expression(text: &str) -> Option<String> {
    if text.is_empty() || text.len() > 1024 || text.contains('\n') {
        return None;
    }
    let expression = spdx::Expression::parse(text).ok()?;
    let listed = expression.requirements().all(|req| {
        matches!(req.req.license, spdx::LicenseItem::Spdx { .. })
            && req
                .req
                .addition
                .as_ref()
                .is_none_or(|addition| matches!(addition, spdx::AdditionItem::Spdx(_)))
    });
    listed.then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expression_comes_first_then_the_field_then_one_classifier() {
        let metadata = "Metadata-Version: 2.4\nName: a\nLicense-Expression: MIT OR Apache-2.0\nLicense: BSD-3-Clause\n\nbody";
        assert_eq!(
            metadata_license(metadata).as_deref(),
            Some("MIT OR Apache-2.0")
        );
        let field = "Metadata-Version: 2.1\nName: a\nLicense: BSD-3-Clause\nClassifier: License :: OSI Approved :: MIT License\n";
        assert_eq!(metadata_license(field).as_deref(), Some("BSD-3-Clause"));
        // torch writes `License: BSD-3`, which is no SPDX id; its classifier is ambiguous.
        let torch =
            "Name: torch\nLicense: BSD-3\nClassifier: License :: OSI Approved :: BSD License\n";
        assert_eq!(metadata_license(torch), None);
        let classifier =
            "Name: a\nLicense: UNKNOWN\nClassifier: License :: OSI Approved :: MIT License\n";
        assert_eq!(metadata_license(classifier).as_deref(), Some("MIT"));
    }

    #[test]
    fn no_guess_from_two_classifiers_or_a_license_text() {
        let two = "Name: a\nClassifier: License :: OSI Approved :: MIT License\nClassifier: License :: OSI Approved :: ISC License (ISCL)\n";
        assert_eq!(metadata_license(two), None);
        let text = "Name: a\nLicense: Copyright (c) 2024\n        Permission is hereby granted\n";
        assert_eq!(metadata_license(text), None);
        // Only headers count: a `License:` line in the description is not the field.
        assert_eq!(metadata_license("Name: a\n\nLicense: MIT\n"), None);
    }

    #[test]
    fn expressions_are_validated_strictly() {
        for bad in [
            "",
            "BSD",
            "Apache 2.0",
            "MIT/Apache-2.0",
            "LicenseRef-NVIDIA",
            "GPL-2.0+ WITH AdditionRef-x",
            "NVIDIA Proprietary Software",
        ] {
            assert_eq!(valid_expression(bad), None, "{bad}");
        }
        for good in [
            "MIT",
            "Apache-2.0 OR MIT",
            "GPL-2.0-or-later WITH Classpath-exception-2.0",
        ] {
            assert_eq!(valid_expression(good).as_deref(), Some(good));
        }
    }

    #[test]
    fn every_classifier_maps_to_a_valid_id() {
        for (_, id) in CLASSIFIERS {
            assert!(valid_expression(id).is_some(), "{id}");
        }
    }

    #[test]
    fn a_file_that_is_not_a_wheel_has_no_license() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.whl");
        fs_err::write(&path, b"not a zip").unwrap();
        assert_eq!(wheel_license(&path), None);
        assert_eq!(wheel_license(&dir.path().join("missing.whl")), None);
    }
}
