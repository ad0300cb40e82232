//! `uv.lock` as an input: uv's own lock, read as uv installs it for one
//! platform. uv.lock is universal (every platform, every extra and group), so the packages
//! are those reachable from the workspace members (`source = { editable | virtual }`)
//! through their default dependencies, each edge's marker evaluated for the target and the
//! extras an edge asks for followed. Every package reached becomes a root pinned to its
//! version, accepted only with the sha256 uv recorded: "their hashes become ours".
//! Dev groups and the members' own extras are not installed (an image is not a dev
//! environment).

use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::str::FromStr;

use pep508_rs::{ExtraName, Requirement};
use serde::Deserialize;
use std::collections::BTreeMap;
use toml::Spanned;

use crate::digest::Digest;
use crate::lock::python_inputs::{
    invalid_requirement, join_relative, InputReader, Origin, PythonInputsError, PUBLISH_OR_COPY,
};

/// The uv.lock format this reader knows (`version = 1`; `revision` changes are additive).
const UV_LOCK_VERSION: u32 = 1;

#[derive(Deserialize)]
struct UvLock {
    version: u32,
    #[serde(default)]
    package: Vec<Spanned<Package>>,
}

#[derive(Deserialize)]
struct Package {
    name: String,
    version: Option<String>,
    #[serde(default)]
    source: BTreeMap<String, toml::Value>,
    #[serde(default)]
    dependencies: Vec<Dependency>,
    #[serde(rename = "optional-dependencies", default)]
    optional_dependencies: BTreeMap<String, Vec<Dependency>>,
    sdist: Option<FileEntry>,
    #[serde(default)]
    wheels: Vec<FileEntry>,
}

#[derive(Deserialize)]
struct Dependency {
    name: String,
    version: Option<String>,
    #[serde(default)]
    extra: Vec<String>,
    marker: Option<String>,
}

#[derive(Deserialize)]
struct FileEntry {
    hash: Option<String>,
}

/// Import the uv.lock at `relative` (from the recipe's directory).
pub(crate) fn import(reader: &mut InputReader, relative: &Path) -> Result<(), PythonInputsError> {
    let file = join_relative(Path::new(""), relative, "python_lock:")?;
    let text = reader.read_text(&file, "python_lock:")?;
    let lock: UvLock = toml::from_str(&text).map_err(|source| PythonInputsError::Toml {
        path: file.clone().into(),
        source: Box::new(source),
    })?;
    let origin_of = |index: usize| {
        let package = &lock.package[index];
        Origin {
            file: file.clone(),
            line: Some(
                1 + text[..package.span().start.min(text.len())]
                    .matches('\n')
                    .count(),
            ),
            place: Some(format!("[[package]] {}", package.get_ref().name)),
        }
    };
    if lock.version != UV_LOCK_VERSION {
        return Err(PythonInputsError::Entry {
            origin: Origin { file: file.clone(), line: None, place: None },
            message: format!("`version = {}`: cudastack reads uv.lock version {UV_LOCK_VERSION}", lock.version),
            hint: "lock again with a uv that writes version 1, or export a PEP 751 lock (`uv export --format pylock.toml`) and name that".into(),
        });
    }
    let packages: Vec<&Package> = lock.package.iter().map(|p| p.get_ref()).collect();
    let members: Vec<usize> = (0..packages.len())
        .filter(|&i| is_member(packages[i]))
        .collect();
    if members.is_empty() {
        return Err(PythonInputsError::Entry {
            origin: Origin { file: file.clone(), line: None, place: None },
            message: "the lock has no workspace member (`source = { editable = ... }` or `{ virtual = ... }`) to start from".into(),
            hint: "name the uv.lock of a project (`uv lock` in the directory of its pyproject.toml)".into(),
        });
    }
    for index in reachable(reader, &packages, &members, &origin_of)? {
        import_package(reader, packages[index], origin_of(index))?;
    }
    Ok(())
}

/// A package of the workspace itself (the project being locked), not a dependency.
fn is_member(package: &Package) -> bool {
    package.source.contains_key("editable") || package.source.contains_key("virtual")
}

/// The packages reached from `members` for the target, in the order first reached.
fn reachable(
    reader: &InputReader,
    packages: &[&Package],
    members: &[usize],
    origin_of: &dyn Fn(usize) -> Origin,
) -> Result<Vec<usize>, PythonInputsError> {
    let mut seen: BTreeSet<(usize, Option<ExtraName>)> = BTreeSet::new();
    let mut queue: VecDeque<(usize, Option<ExtraName>)> =
        members.iter().map(|&m| (m, None)).collect();
    let mut order = Vec::new();
    while let Some((index, extra)) = queue.pop_front() {
        if !seen.insert((index, extra.clone())) {
            continue;
        }
        if !order.contains(&index) && !members.contains(&index) {
            order.push(index);
        }
        let package = packages[index];
        let edges: &[Dependency] = match &extra {
            None => &package.dependencies,
            Some(extra) => package
                .optional_dependencies
                .iter()
                .find(|(key, _)| ExtraName::from_str(key).is_ok_and(|k| &k == extra))
                .map(|(_, list)| list.as_slice())
                .unwrap_or(&[]),
        };
        for dependency in edges {
            if !applies(reader, dependency, || origin_of(index))? {
                continue;
            }
            let target = packages
                .iter()
                .position(|p| {
                    p.name == dependency.name
                        && (dependency.version.is_none() || p.version == dependency.version)
                })
                .ok_or_else(|| PythonInputsError::Entry {
                    origin: origin_of(index),
                    message: format!(
                        "the dependency `{}` is not a package of the lock",
                        dependency.name
                    ),
                    hint: "run `uv lock` again; the lock is incomplete".into(),
                })?;
            queue.push_back((target, None));
            for name in &dependency.extra {
                if let Ok(extra) = ExtraName::from_str(name) {
                    queue.push_back((target, Some(extra)));
                }
            }
        }
    }
    Ok(order)
}

/// Whether a dependency edge's marker holds for the target.
fn applies(
    reader: &InputReader,
    dependency: &Dependency,
    origin: impl Fn() -> Origin,
) -> Result<bool, PythonInputsError> {
    let Some(marker) = &dependency.marker else {
        return Ok(true);
    };
    let text = format!("{} ; {marker}", dependency.name);
    let requirement: Requirement =
        crate::names::parse_requirement(&text).map_err(|e| PythonInputsError::Entry {
            origin: origin(),
            message: format!(
                "the marker of `{}` is not PEP 508: {}",
                dependency.name, e.message
            ),
            hint: "run `uv lock` again, or export a PEP 751 lock and name that".into(),
        })?;
    Ok(requirement.evaluate_markers(&reader.env, &[]))
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
    if !package.source.contains_key("registry") {
        let kind = package.source.keys().next().map_or("no", String::as_str);
        return Err(refuse(format!("`{}` comes from a {kind} source, not an index: cudastack locks packages it can list on an index and pin by sha256", package.name), PUBLISH_OR_COPY));
    }
    let Some(version) = &package.version else {
        return Err(refuse(
            format!("`{}` has no version", package.name),
            "run `uv lock` again",
        ));
    };
    let mut sha256 = BTreeSet::new();
    for file in package.wheels.iter().chain(&package.sdist) {
        let hash = file.hash.as_deref().unwrap_or("");
        sha256.insert(Digest::from_str(hash).map_err(|_| {
            refuse(
                format!(
                    "a file of `{}` {version} has the hash `{hash}`, not a sha256",
                    package.name
                ),
                "cudastack checks sha256, the hash every index publishes; run `uv lock` again",
            )
        })?);
    }
    if sha256.is_empty() {
        return Err(refuse(
            format!("`{}` {version} lists no files", package.name),
            "run `uv lock` again",
        ));
    }
    let text = format!("{}=={version}", package.name);
    let requirement = crate::names::parse_requirement(&text)
        .map_err(|e| refuse(invalid_requirement(&text, &e), "run `uv lock` again"))?;
    reader.add_hashes(requirement.name.clone(), origin.clone(), sha256);
    reader.add_root(requirement, origin)
}

#[cfg(test)]
mod tests {
    use crate::lock::python_inputs::PythonInputs;
    use crate::lock::target::Target;
    use crate::recipe::Recipe;

    const HASH: &str = "sha256:8abb2f1d86890a2dfb989f9a77cfcfd3e47c2a354b01111771326f8aa26e0254";

    fn package(name: &str, version: &str, tail: &str) -> String {
        format!("[[package]]\nname = \"{name}\"\nversion = \"{version}\"\nsource = {{ registry = \"https://pypi.org/simple/\" }}\nwheels = [\n    {{ url = \"https://files.pythonhosted.org/{name}-{version}-py3-none-any.whl\", hash = \"{HASH}\", size = 1 }},\n]\n{tail}\n")
    }

    /// The roots (`name==version`) a uv.lock gives for CPython 3.11 on linux/amd64.
    fn roots(lock: &str) -> Result<Vec<String>, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("uv.lock"), lock).unwrap();
        let path = dir.path().join("r.yaml");
        let recipe = Recipe::parse("name: t\nbase: { debian: bookworm }\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: { version: \"12.4\" }\npython_lock: uv.lock\n", &path).unwrap();
        let target = Target::new(
            "3.11".parse().unwrap(),
            crate::platform::Platform::LinuxAmd64,
            "2.36".parse().unwrap(),
        )
        .unwrap();
        let inputs = PythonInputs::load(&recipe, &path, &target).map_err(|e| e.to_string())?;
        Ok(inputs
            .roots
            .iter()
            .map(|r| r.requirement.to_string())
            .collect())
    }

    /// Default dependencies are followed with their markers and the extras an edge asks
    /// for; dev groups, unreachable packages and the other fork of a package are not.
    #[test]
    fn the_packages_reached_for_the_target_are_imported() {
        let lock = [
            "version = 1\nrevision = 5\nrequires-python = \">=3.10\"\n\n".to_string(),
            package("a", "1.0", "dependencies = [{ name = \"f\", version = \"2.0\", marker = \"python_full_version >= '3.11'\" }]\n[package.optional-dependencies]\nx = [{ name = \"c\" }]"),
            package("b", "1.0", "dependencies = [{ name = \"d\" }]"),
            package("c", "1.0", ""),
            package("d", "1.0", ""),
            package("e", "1.0", ""),
            package("f", "1.0", ""),
            package("f", "2.0", ""),
            package("pytest", "8.0", ""),
            "[[package]]\nname = \"trainer\"\nversion = \"0.1.0\"\nsource = { virtual = \".\" }\ndependencies = [\n    { name = \"a\", extra = [\"x\"] },\n    { name = \"b\", marker = \"sys_platform == 'win32'\" },\n]\n\n[package.dev-dependencies]\ndev = [{ name = \"pytest\" }]\n".to_string(),
        ]
        .concat();
        assert_eq!(roots(&lock).unwrap(), ["a==1.0", "f==2.0", "c==1.0"]);
        // A dependency missing from the lock, or a marker that is not PEP 508, is an error.
        let broken = lock.replace("{ name = \"c\" }", "{ name = \"gone\" }");
        let error = roots(&broken).unwrap_err();
        assert!(
            error.contains("([[package]] a): the dependency `gone` is not a package of the lock"),
            "{error}"
        );
        let broken = lock.replace("sys_platform == 'win32'", "sys_platform = 'win32'");
        let error = roots(&broken).unwrap_err();
        assert!(
            error.contains("the marker of `b` is not PEP 508"),
            "{error}"
        );
    }
}
