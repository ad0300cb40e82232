//! PEP 751 lock files (`pylock.toml`), both ways.
//!
//! Import ([`import`]): each package whose marker holds for the target becomes a root pinned
//! to its version (`name==version`), and the sha256 of its listed files become the only
//! files accepted for it: "their hashes become ours". The resolver still reads each chosen
//! wheel's metadata, so a lock that misses a dependency fails to lock instead of building
//! an image that cannot import.
//!
//! Export ([`to_pylock`]): the wheels of a cudastack lock as PEP 751, so pip (`pip install
//! -r` from 25.1 on reads it as a lock), uv (`uv pip install -r pylock.toml`) and other
//! tools install the very same files. Written as `pylock.<name>.toml` beside the lock
//! ([`pylock_path`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use pep508_rs::MarkerTree;
use serde::{Deserialize, Serialize};
use toml::Spanned;

use crate::digest::Digest;
use crate::lock::lockfile::{ArtifactKind, Location, Lockfile};
use crate::lock::python_inputs::{
    invalid_requirement, join_relative, InputReader, Origin, PythonInputsError, PUBLISH_OR_COPY,
};
use crate::platform::Platform;

/// The PEP 751 versions this reader knows: 1.x (a reader must refuse a newer major).
const LOCK_VERSION_MAJOR: &str = "1";

#[derive(Deserialize)]
struct Pylock {
    #[serde(rename = "lock-version")]
    lock_version: String,
    #[serde(default)]
    environments: Vec<String>,
    #[serde(default)]
    packages: Vec<Spanned<Package>>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    version: Option<String>,
    marker: Option<String>,
    sdist: Option<File>,
    #[serde(default)]
    wheels: Vec<File>,
    vcs: Option<toml::Value>,
    directory: Option<toml::Value>,
    archive: Option<toml::Value>,
}

#[derive(Deserialize, Serialize)]
struct File {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// A wheel of the recipe's `wheels:`, relative to the recipe's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(default)]
    hashes: BTreeMap<String, String>,
}

/// Import the PEP 751 lock at `relative` (from the recipe's directory).
pub(crate) fn import(reader: &mut InputReader, relative: &Path) -> Result<(), PythonInputsError> {
    let file = join_relative(Path::new(""), relative, "python_lock:")?;
    let text = reader.read_text(&file, "python_lock:")?;
    let lock: Pylock = toml::from_str(&text).map_err(|source| PythonInputsError::Toml {
        path: file.clone().into(),
        source: Box::new(source),
    })?;
    let whole = |message: String, hint: &str| PythonInputsError::Entry {
        origin: Origin {
            file: file.clone(),
            line: None,
            place: None,
        },
        message,
        hint: hint.to_string(),
    };
    if lock.lock_version.split('.').next() != Some(LOCK_VERSION_MAJOR) {
        return Err(whole(
            format!(
                "`lock-version = \"{}\"`: cudastack reads PEP 751 lock version 1",
                lock.lock_version
            ),
            "export the lock again with a tool that writes PEP 751 version 1.0",
        ));
    }
    if !lock.environments.is_empty() {
        let mut fits = false;
        for environment in &lock.environments {
            let marker = MarkerTree::from_str(environment).map_err(|e| {
                whole(
                    format!(
                        "the environment `{environment}` is not a PEP 508 marker: {}",
                        e.message
                    ),
                    "fix or regenerate the lock",
                )
            })?;
            fits |= marker.evaluate(&reader.env, &[]);
        }
        if !fits {
            return Err(whole(format!("the lock is for the environments {:?}, and the image's Python and platform are none of them", lock.environments), "lock for this platform and Python (e.g. `uv lock` with `environments` that include Linux and this Python)"));
        }
    }
    for package in &lock.packages {
        let line = 1 + text[..package.span().start.min(text.len())]
            .matches('\n')
            .count();
        let origin = Origin {
            file: file.clone(),
            line: Some(line),
            place: Some(format!("[[packages]] {}", package.get_ref().name)),
        };
        import_package(reader, package.get_ref(), origin)?;
    }
    Ok(())
}

fn import_package(
    reader: &mut InputReader,
    package: &Package,
    origin: Origin,
) -> Result<(), PythonInputsError> {
    let refuse = |message: String, hint: &str| PythonInputsError::Entry {
        origin: origin.clone(),
        message,
        hint: hint.to_string(),
    };
    if package.vcs.is_some() || package.directory.is_some() || package.archive.is_some() {
        return Err(refuse(format!("`{}` comes from a VCS, a directory or an archive URL, not an index: cudastack locks packages it can list on an index and pin by sha256", package.name), PUBLISH_OR_COPY));
    }
    let Some(version) = &package.version else {
        return Err(refuse(
            format!("`{}` has no version", package.name),
            "an index package in a PEP 751 lock has one; regenerate the lock",
        ));
    };
    let text = match &package.marker {
        Some(marker) => format!("{}=={version} ; {marker}", package.name),
        None => format!("{}=={version}", package.name),
    };
    let requirement = crate::names::parse_requirement(&text)
        .map_err(|e| refuse(invalid_requirement(&text, &e), "fix or regenerate the lock"))?;
    if !requirement.evaluate_markers(&reader.env, &[]) {
        return Ok(());
    }
    let mut sha256 = BTreeSet::new();
    for file in package.wheels.iter().chain(&package.sdist) {
        let Some(hex) = file.hashes.get("sha256") else {
            return Err(refuse(format!("a file of `{}` {version} has no sha256 (only {:?})", package.name, file.hashes.keys().collect::<Vec<_>>()), "cudastack checks sha256, the hash every index publishes; regenerate the lock with sha256 hashes"));
        };
        sha256.insert(Digest::from_hex(hex).map_err(|_| {
            refuse(
                format!("`{hex}` is not a sha256"),
                "fix or regenerate the lock",
            )
        })?);
    }
    if sha256.is_empty() {
        return Err(refuse(format!("`{}` {version} lists no files", package.name), "a PEP 751 package from an index lists its wheels (or sdist) with hashes; regenerate the lock"));
    }
    reader.add_hashes(requirement.name.clone(), origin.clone(), sha256);
    reader.add_root(requirement, origin)
}

#[derive(Serialize)]
struct PylockOut<'a> {
    #[serde(rename = "lock-version")]
    lock_version: &'a str,
    environments: Vec<String>,
    #[serde(rename = "requires-python")]
    requires_python: String,
    #[serde(rename = "created-by")]
    created_by: &'a str,
    packages: Vec<PackageOut>,
}

#[derive(Serialize)]
struct PackageOut {
    name: String,
    version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<String>,
    wheels: Vec<File>,
}

/// The wheels of `lock` as a PEP 751 lock (deterministic: the lock's order, no dates).
pub fn to_pylock(lock: &Lockfile) -> String {
    let target = &lock.target;
    let packages = lock
        .artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Wheel)
        .map(|artifact| PackageOut {
            name: artifact.name.clone(),
            version: artifact.version.clone(),
            index: artifact
                .source
                .starts_with("http")
                .then(|| artifact.source.clone()),
            wheels: vec![File {
                name: Some(artifact.filename.to_string()),
                url: artifact.url.as_url().map(ToString::to_string),
                path: match &artifact.url {
                    Location::Recipe(path) => Some(path.clone()),
                    Location::Url(_) => None,
                },
                size: Some(artifact.size),
                hashes: BTreeMap::from([("sha256".to_string(), artifact.sha256.hex())]),
            }],
        })
        .collect();
    let out = PylockOut {
        lock_version: "1.0",
        environments: vec![format!(
            "sys_platform == 'linux' and platform_machine == '{}' and python_version == '{}'",
            target.arch.wheel_arch(),
            target.python
        )],
        requires_python: format!("=={}.*", target.python),
        created_by: "cudastack",
        packages,
    };
    toml::to_string(&out).expect("a PEP 751 lock always serialises")
}

/// `pylock.<name>.toml` beside the recipe's lock; PEP 751 names allow no dots, so the
/// recipe name's dots become `-`, and a platform other than linux/amd64 is appended
/// (`pylock.torch2-4-1-cu121-linux-arm64.toml`).
pub fn pylock_path(lock_path: &Path, recipe_name: &str, platform: Platform) -> PathBuf {
    let name = format!("{recipe_name}{}", platform.lock_suffix()).replace('.', "-");
    lock_path.with_file_name(format!("pylock.{name}.toml"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::python_inputs::PythonInputs;
    use crate::lock::target::Target;
    use crate::recipe::Recipe;

    const SIX: &str = "8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254";

    fn lock() -> Lockfile {
        let target = Target::new(
            "3.11".parse().unwrap(),
            Platform::LinuxAmd64,
            "2.36".parse().unwrap(),
        )
        .unwrap();
        let json = serde_json::json!({
            "lock_format": crate::lock::LOCK_FORMAT_VERSION,
            "recipe_digest": Digest::of_bytes(b"r").to_string(),
            "target": target,
            "requirements": ["six"],
            "artifacts": [
                { "kind": "wheel", "name": "six", "version": "1.16.0", "filename": "six-1.16.0-py2.py3-none-any.whl",
                  "url": "https://files.pythonhosted.org/packages/d9/5a/six-1.16.0-py2.py3-none-any.whl",
                  "sha256": format!("sha256:{SIX}"), "size": 11053, "source": "https://pypi.org/simple/" },
                { "kind": "deb", "name": "tzdata", "version": "2024a-0+deb12u1", "filename": "tzdata_2024a-0+deb12u1_all.deb",
                  "url": "https://deb.debian.org/debian/pool/main/t/tzdata/tzdata_2024a-0+deb12u1_all.deb",
                  "sha256": Digest::of_bytes(b"tz").to_string(), "size": 1, "source": "debian", "platform": "all", "suite": "bookworm", "component": "main", "layer": "base" },
            ],
        });
        Lockfile::from_json(&json.to_string(), Path::new("t.lock")).unwrap()
    }

    /// The export holds the wheels only, and reads back as the same pins and hashes.
    #[test]
    fn export_reads_back_as_the_same_pins() {
        let text = to_pylock(&lock());
        assert!(text.starts_with("lock-version = \"1.0\"\nenvironments = [\"sys_platform == 'linux' and platform_machine == 'x86_64' and python_version == '3.11'\"]\nrequires-python = \"==3.11.*\"\ncreated-by = \"cudastack\"\n"), "{text}");
        assert!(!text.contains("tzdata"), "{text}");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pylock.job.toml"), &text).unwrap();
        let path = dir.path().join("r.yaml");
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\npython_lock: pylock.job.toml\n", &path).unwrap();
        let inputs = PythonInputs::load(&recipe, &path, &lock().target).unwrap();
        let roots: Vec<String> = inputs
            .roots
            .iter()
            .map(|r| r.requirement.to_string())
            .collect();
        assert_eq!(roots, ["six==1.16.0"]);
        let pin = &inputs.constraints.hashes[&"six".parse().unwrap()];
        assert_eq!(
            pin.sha256.iter().map(|d| d.hex()).collect::<Vec<_>>(),
            [SIX]
        );
        assert_eq!(
            pin.origin.to_string(),
            "pylock.job.toml:6 ([[packages]] six)"
        );
        // Another platform's Python is not this lock's environment.
        let arm = Target::new(
            "3.12".parse().unwrap(),
            Platform::LinuxArm64,
            "2.36".parse().unwrap(),
        )
        .unwrap();
        let error = PythonInputs::load(&recipe, &path, &arm)
            .unwrap_err()
            .to_string();
        assert!(error.contains("none of them"), "{error}");
    }

    #[test]
    fn the_export_is_named_after_the_recipe_without_dots() {
        let lock = Path::new("recipes/torch2.4.1-cu121-py3.11.lock");
        assert_eq!(
            pylock_path(lock, "torch2.4.1-cu121-py3.11", Platform::LinuxAmd64),
            Path::new("recipes/pylock.torch2-4-1-cu121-py3-11.toml")
        );
        assert_eq!(
            pylock_path(lock, "job", Platform::LinuxArm64),
            Path::new("recipes/pylock.job-linux-arm64.toml")
        );
    }
}
