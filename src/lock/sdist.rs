//! The source distributions of the recipe's `build:` list, read when the recipe is locked
//! : which file, by sha256; what the package needs at run time (its PKG-INFO's
//! `Requires-Dist` when the sdist declares them statically, else the recipe's `requires:`);
//! and what its build needs (`[build-system] requires` of its pyproject.toml, plus the
//! toolchain every CUDA extension build uses). Nothing is built here: the lock records the
//! inputs, and `build` compiles them (src/stack/source_build.rs).
//!
//! The sdist is fetched into memory (an sdist is kB to a few MB; [`MAX_SDIST_BYTES`] caps
//! it), its sha256 checked against the index's, and read as a gzip tar without unpacking
//! anything: only `NAME-VERSION/PKG-INFO` and `NAME-VERSION/pyproject.toml` are looked at.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use pep440_rs::Version;
use pep508_rs::{PackageName, Requirement};

use crate::digest::Digest;
use url::Url;

use crate::fetch::git::{self, Commit, GitSource};
use crate::fetch::http::HttpClient;
use crate::fetch::index::DistFile;
use crate::fetch::metadata::{Metadata, MAX_METADATA_BYTES};
use crate::fetch::source::PackageSource;
use crate::fetch::source_tree::SourceTree;
use crate::lock::python_inputs::LocalProject;
use crate::lock::LockError;
use crate::recipe::SourceBuild;

/// The Debian packages every source build installs in its builder: the host compiler
/// (torch's `cpp_extension` calls `c++`, and nvcc calls `g++` for host code) and the
/// headers of the base's Python (`Python.h`).
pub const BUILD_DEBS: &[&str] = &["g++", "python3-dev"];

/// The largest sdist read (flash-attn 2.6.3's is 2.6 MB, vLLM's about 9 MB).
pub const MAX_SDIST_BYTES: u64 = 256 * 1024 * 1024;

/// What the build of `build:` entries needs besides each package's own build requirements.
#[derive(Debug, Clone, Default)]
pub struct BuildRequest {
    /// The recipe's `build:` entries.
    pub builds: Vec<SourceBuild>,
    /// Installed in every builder: setuptools, wheel, ninja, and the nvcc of the stack's
    /// CUDA release when the image itself is of the runtime flavor.
    pub toolchain: Vec<Requirement>,
    /// The commit each git requirement (by its URL as written) had in the previous lock:
    /// a moved branch or tag changes nothing until `lock --upgrade`.
    pub git_commits: BTreeMap<String, Commit>,
    /// The local projects the requirements files name by directory, and the recipe's
    /// directory they are relative to.
    pub projects: Vec<LocalProject>,
    pub recipe_dir: PathBuf,
}

/// One sdist of `build:`, found and read.
#[derive(Debug, Clone)]
pub struct SdistInfo {
    pub name: PackageName,
    pub version: Version,
    /// The file as the index lists it, its sha256 checked against the bytes.
    pub file: DistFile,
    pub sha256: Digest,
    pub size: u64,
    /// Which of the lock's sources it came from (an index into them).
    pub source: usize,
    /// The package's metadata with the run requirements the lock resolves.
    pub metadata: Metadata,
    /// `[build-system] requires` of its pyproject.toml (PEP 518's default without one).
    pub build_requires: Vec<Requirement>,
}

/// A git requirement of the recipe's Python inputs (`name @ git+URL`), with the commit a
/// previous lock chose for it: kept until `lock --upgrade` ([`BuildRequest::git_commits`]).
pub(crate) fn inspect_git(
    name: &PackageName,
    source: &GitSource,
    locked: Option<&Commit>,
) -> Result<SdistInfo, LockError> {
    let commit = match locked {
        Some(commit) => {
            git::check_kept(source, commit)?;
            commit.clone()
        }
        None => git::resolve(source)?,
    };
    let tree = git::fetch_tree(source, &commit)?;
    let pinned = source.at(&commit);
    sdist_of_tree(name, &tree, pinned.to_url(), &pinned.to_string())
}

/// A local project named by its directory, read as it is now (the lock records the sha256
/// of its tree; `build` refuses a tree that changed since).
pub(crate) fn inspect_project(
    recipe_dir: &Path,
    project: &LocalProject,
) -> Result<SdistInfo, LockError> {
    let refused = |why: String| LockError::ProjectSource {
        package: project.name.clone(),
        url: project.path.clone(),
        why,
        hint: "name a directory inside the recipe's, holding a pyproject.toml".into(),
    };
    let dir = project_dir(recipe_dir, &project.path).map_err(refused)?;
    let tree = SourceTree::read_dir(&dir).map_err(refused)?;
    let url = Url::from_directory_path(&dir)
        .map_err(|()| refused("its directory is not an absolute path".into()))?;
    sdist_of_tree(&project.name, &tree, url, &project.path)
}

/// The directory of a project at `path` (relative to the recipe's, checked by name when
/// read), refused when a link on the way leads out of the recipe's directory.
pub(crate) fn project_dir(recipe_dir: &Path, path: &str) -> Result<PathBuf, String> {
    let root = if recipe_dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        recipe_dir
    };
    let root = std::fs::canonicalize(root).map_err(|e| format!("the recipe's directory: {e}"))?;
    let dir = std::fs::canonicalize(root.join(path)).map_err(|e| format!("`{path}`: {e}"))?;
    if !dir.starts_with(&root) {
        return Err(format!(
            "`{path}` leads out of the recipe's directory through a symbolic link"
        ));
    }
    Ok(dir)
}

/// The sdist a source tree makes: its name, version and requirements from its pyproject.toml,
/// its bytes the tree's canonical archive (`NAME-VERSION.tar`), found at `url`.
fn sdist_of_tree(
    name: &PackageName,
    tree: &SourceTree,
    url: Url,
    shown: &str,
) -> Result<SdistInfo, LockError> {
    let project = |why: String, hint: &str| LockError::ProjectSource {
        package: name.clone(),
        url: shown.to_string(),
        why,
        hint: hint.to_string(),
    };
    let text = tree
        .file("pyproject.toml")
        .ok_or_else(|| project("its tree has no `pyproject.toml` at its top".into(), "a project built from source is locked by the static `[project]` table of its pyproject.toml (PEP 621); add one, or name the project's directory (`#subdirectory=DIR` for git)"))?;
    let text = std::str::from_utf8(text)
        .map_err(|_| project("its `pyproject.toml` is not UTF-8".into(), "fix the file"))?;
    let declared = StaticProject::read(text).map_err(|why| project(why, "cudastack locks a project by the name, version and dependencies its pyproject.toml declares, without running its build; declare them in `[project]` (not in `dynamic`)"))?;
    if declared.metadata.name != *name {
        return Err(project(
            format!(
                "its pyproject.toml names the project `{}`",
                declared.metadata.name
            ),
            &format!("require it as `{}`", declared.metadata.name),
        ));
    }
    let version = declared.metadata.version.clone();
    let top = format!("{name}-{version}");
    let archive = tree.archive(&top);
    let sha256 = Digest::of_bytes(&archive);
    let filename = crate::fetch::file_name::FileName::new(format!("{top}.tar"))
        .map_err(|e| project(e.to_string(), "rename the project"))?;
    let file = DistFile {
        filename,
        url,
        sha256: Some(sha256),
        size: Some(archive.len() as u64),
        requires_python: declared.metadata.requires_python.clone(),
        yanked: false,
        yanked_reason: None,
        upload_time: None,
        core_metadata: Default::default(),
    };
    Ok(SdistInfo {
        name: name.clone(),
        version,
        file,
        sha256,
        size: archive.len() as u64,
        source: 0,
        metadata: declared.metadata,
        build_requires: declared.build_requires,
    })
}

/// What a pyproject.toml declares statically: the core metadata of PEP 621's `[project]`
/// and `[build-system] requires`.
struct StaticProject {
    metadata: Metadata,
    build_requires: Vec<Requirement>,
}

impl StaticProject {
    fn read(text: &str) -> Result<StaticProject, String> {
        let table: toml::Table =
            toml::from_str(text).map_err(|e| format!("its pyproject.toml is not TOML: {e}"))?;
        let project = table
            .get("project")
            .and_then(toml::Value::as_table)
            .ok_or("its pyproject.toml has no `[project]` table")?;
        let dynamic: Vec<&str> = project
            .get("dynamic")
            .and_then(toml::Value::as_array)
            .map(|list| list.iter().filter_map(toml::Value::as_str).collect())
            .unwrap_or_default();
        for field in ["version", "dependencies", "optional-dependencies"] {
            if dynamic.contains(&field) {
                return Err(format!("its pyproject.toml lists `{field}` in `[project] dynamic`: the build decides it"));
            }
        }
        let string = |key: &str| {
            project
                .get(key)
                .and_then(toml::Value::as_str)
                .ok_or_else(|| format!("its `[project]` has no `{key}` string"))
        };
        let name = PackageName::from_str(string("name")?)
            .map_err(|e| format!("its `[project] name` is not a package name: {e}"))?;
        let version = Version::from_str(string("version")?)
            .map_err(|e| format!("its `[project] version` is not a PEP 440 version: {e}"))?;
        let requires_python = match project.get("requires-python").and_then(toml::Value::as_str) {
            Some(text) => Some(text.parse().map_err(|e| {
                format!("its `[project] requires-python` `{text}` is not a version specifier: {e}")
            })?),
            None => None,
        };
        let mut requires_dist =
            requirement_list(project.get("dependencies"), "dependencies", None)?;
        let mut provides_extra = Vec::new();
        if let Some(extras) = project.get("optional-dependencies") {
            let extras = extras
                .as_table()
                .ok_or("its `[project] optional-dependencies` is not a table")?;
            for (extra, list) in extras {
                let extra_name = pep508_rs::ExtraName::from_str(extra)
                    .map_err(|e| format!("its extra `{extra}` is not an extra name: {e}"))?;
                let place = format!("optional-dependencies.{extra}");
                requires_dist.extend(requirement_list(Some(list), &place, Some(&extra_name))?);
                provides_extra.push(extra_name);
            }
        }
        Ok(StaticProject {
            metadata: Metadata {
                name,
                version,
                requires_dist,
                requires_python,
                provides_extra,
            },
            build_requires: build_system_requires(text)?,
        })
    }
}

/// The PEP 508 entries of a `[project]` list; those of an extra apply only with it.
fn requirement_list(
    value: Option<&toml::Value>,
    place: &str,
    extra: Option<&pep508_rs::ExtraName>,
) -> Result<Vec<Requirement>, String> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let list = value
        .as_array()
        .ok_or_else(|| format!("its `[project] {place}` is not a list"))?;
    list.iter()
        .map(|item| {
            let text = item
                .as_str()
                .ok_or_else(|| format!("its `[project] {place}` has a non-string entry"))?;
            let text = match (extra, text.split_once(';')) {
                (None, _) => text.to_string(),
                (Some(extra), Some((requirement, marker))) => {
                    format!("{requirement}; ({marker}) and extra == \"{extra}\"")
                }
                (Some(extra), None) => format!("{text}; extra == \"{extra}\""),
            };
            let requirement: Requirement = crate::names::parse_requirement(&text)
                .map_err(|e| format!("its `[project] {place}` entry `{text}` is not PEP 508: {e}"))?;
            if requirement.version_or_url.as_ref().is_some_and(|v| matches!(v, pep508_rs::VersionOrUrl::Url(_))) {
                return Err(format!("its `[project] {place}` entry `{}` names a URL; cudastack locks a git requirement's own dependencies from indexes", requirement.name));
            }
            Ok(requirement)
        })
        .collect()
}

/// The version of an sdist file name (`antlr4-python3-runtime-4.9.3.tar.gz` -> 4.9.3).
pub(crate) fn sdist_version(filename: &str) -> Option<Version> {
    let stem = [".tar.gz", ".zip", ".tar.bz2", ".tgz"]
        .iter()
        .find_map(|ext| filename.strip_suffix(ext))?;
    let (_, version) = stem.rsplit_once('-')?;
    version.parse().ok()
}

/// Find, fetch and read the sdist of each `build:` entry, in the sources' priority order.
pub async fn inspect_all(
    client: &HttpClient,
    sources: &[PackageSource],
    builds: &[SourceBuild],
) -> Result<Vec<SdistInfo>, LockError> {
    let mut found = Vec::new();
    for build in builds {
        found.push(inspect(client, sources, build).await?);
    }
    Ok(found)
}

async fn inspect(
    client: &HttpClient,
    sources: &[PackageSource],
    build: &SourceBuild,
) -> Result<SdistInfo, LockError> {
    let (source, file) = find(sources, build).await?;
    let sha256 = file.sha256.ok_or_else(|| LockError::NoHash {
        filename: file.filename.to_string(),
        url: file.url.to_string(),
    })?;
    let bytes = fetch(client, &sources[source], &file).await?;
    let found = Digest::of_bytes(&bytes);
    if found != sha256 {
        return Err(LockError::SdistHash {
            url: file.url.to_string(),
            expected: sha256,
            found,
        });
    }
    let content = |reason: String| LockError::SdistContent {
        filename: file.filename.to_string(),
        reason,
    };
    let members = read_members(&bytes).map_err(content)?;
    let pkg_info = members
        .pkg_info
        .ok_or_else(|| content("it has no `PKG-INFO` at its top".into()))?;
    let mut metadata = Metadata::parse(&pkg_info, &file.filename)
        .map_err(|e| content(format!("its PKG-INFO: {e}")))?;
    if metadata.name != build.package || metadata.version != build.version {
        return Err(LockError::MetadataDisagrees {
            url: file.url.to_string(),
            expected: format!("{} {}", build.package, build.version),
            found: format!("{} {}", metadata.name, metadata.version),
        });
    }
    metadata.requires_dist = run_requirements(build, &pkg_info)?;
    let build_requires = match members.pyproject {
        Some(text) => build_system_requires(&text).map_err(content)?,
        None => default_build_requires(),
    };
    Ok(SdistInfo {
        name: build.package.clone(),
        version: build.version.clone(),
        size: bytes.len() as u64,
        file,
        sha256,
        source,
        metadata,
        build_requires,
    })
}

/// The first source that lists `build`'s package, and its sdist of the exact version.
async fn find(
    sources: &[PackageSource],
    build: &SourceBuild,
) -> Result<(usize, DistFile), LockError> {
    let name = &build.package;
    for (index, source) in sources.iter().enumerate() {
        let page = source
            .project(name)
            .await
            .map_err(|error| LockError::Source {
                package: name.clone(),
                source_label: source.to_string(),
                error,
            })?;
        let Some(page) = page.filter(|page| !page.files.is_empty()) else {
            continue;
        };
        // PEP 625: an sdist is `.tar.gz`; older uploads used `.zip`, which is refused below.
        let mut matching: Vec<&DistFile> = page
            .files
            .iter()
            .filter(|f| f.wheel().is_none())
            .filter(|f| sdist_version(&f.filename).as_ref() == Some(&build.version))
            .collect();
        matching.sort_by_key(|f| !f.filename.ends_with(".tar.gz"));
        let Some(file) = matching.first() else {
            let mut listed: Vec<Version> = page
                .files
                .iter()
                .filter(|f| f.wheel().is_none())
                .filter_map(|f| sdist_version(&f.filename))
                .collect();
            listed.sort();
            listed.dedup();
            let newest: Vec<String> = listed
                .iter()
                .rev()
                .take(8)
                .map(ToString::to_string)
                .collect();
            return Err(LockError::SdistMissing {
                package: name.clone(),
                version: build.version.clone(),
                source_label: source.to_string(),
                listed: newest,
            });
        };
        if !file.filename.ends_with(".tar.gz") {
            return Err(LockError::SdistContent {
                filename: file.filename.to_string(),
                reason: "it is not a `.tar.gz` (PEP 625); cudastack reads and builds gzip tar sdists only".into(),
            });
        }
        return Ok((index, (*file).clone()));
    }
    Err(LockError::PackageNotFound {
        package: name.clone(),
        sources: sources
            .iter()
            .filter(|s| s.asks_for(name))
            .map(|s| s.to_string())
            .collect(),
    })
}

/// The sdist's bytes: over HTTP, or from the mirror directory a `file:` URL belongs to.
async fn fetch(
    client: &HttpClient,
    source: &PackageSource,
    file: &DistFile,
) -> Result<Vec<u8>, LockError> {
    if file.url.scheme() == "file" {
        if !is_mirror(source) {
            return Err(LockError::LocalFile {
                url: file.url.to_string(),
            });
        }
        let path = file.url.to_file_path().map_err(|()| LockError::LocalFile {
            url: file.url.to_string(),
        })?;
        let read = std::fs::File::open(&path).and_then(|f| {
            let mut bytes = Vec::new();
            f.take(MAX_SDIST_BYTES + 1).read_to_end(&mut bytes)?;
            Ok(bytes)
        });
        return read.map_err(|source| LockError::SdistRead { path, source });
    }
    let (_, bytes) = client
        .get_bytes_limited(&file.url, Default::default(), MAX_SDIST_BYTES)
        .await
        .map_err(|error| LockError::SdistFetch {
            url: file.url.to_string(),
            error,
        })?;
    Ok(bytes.to_vec())
}

/// Whether `source` is a mirror directory, the only place a `file:` URL may point into.
fn is_mirror(source: &PackageSource) -> bool {
    match source {
        PackageSource::Mirror(_) => true,
        PackageSource::Excluding { source, .. } | PackageSource::AsOf { source, .. } => {
            is_mirror(source)
        }
        // `wheels:` holds wheels only; an sdist never comes from it.
        PackageSource::Index { .. } | PackageSource::Local(_) => false,
    }
}

/// The two members of an sdist the lock reads.
#[derive(Debug, Default)]
struct Members {
    pkg_info: Option<String>,
    pyproject: Option<String>,
}

/// `TOP/PKG-INFO` and `TOP/pyproject.toml` of a gzip tar, each at most
/// [`MAX_METADATA_BYTES`]; nothing is written anywhere.
fn read_members(bytes: &[u8]) -> Result<Members, String> {
    let gzip = flate2::read::GzDecoder::new(bytes);
    // A gzip bomb costs time, never memory: entries are skipped, and this bounds the time.
    let mut archive = tar::Archive::new(gzip.take(8 * MAX_SDIST_BYTES));
    let mut members = Members::default();
    let entries = archive
        .entries()
        .map_err(|e| format!("it is not a gzip tar: {e}"))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("it is not a readable gzip tar: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("a member has an unreadable name: {e}"))?
            .into_owned();
        let parts: Vec<_> = path.components().collect();
        if parts.len() != 2 {
            continue;
        }
        let slot = match parts[1].as_os_str().to_str() {
            Some("PKG-INFO") => &mut members.pkg_info,
            Some("pyproject.toml") => &mut members.pyproject,
            _ => continue,
        };
        let mut text = String::new();
        entry
            .take(MAX_METADATA_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(|e| format!("`{}` is not UTF-8 text: {e}", path.display()))?;
        if text.len() as u64 > MAX_METADATA_BYTES {
            return Err(format!(
                "`{}` is larger than {MAX_METADATA_BYTES} bytes",
                path.display()
            ));
        }
        *slot = Some(text);
        if members.pkg_info.is_some() && members.pyproject.is_some() {
            break;
        }
    }
    Ok(members)
}

/// A header of a PKG-INFO (every occurrence), continuation lines ignored.
fn headers<'a>(pkg_info: &'a str, key: &str) -> Vec<&'a str> {
    pkg_info
        .lines()
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.split_once(':'))
        .filter(|(k, _)| k.trim().eq_ignore_ascii_case(key))
        .map(|(_, v)| v.trim())
        .collect()
}

/// Why an sdist's `Requires-Dist` cannot be trusted, or None when it is static: core
/// metadata 2.2 (PEP 643) made PKG-INFO fields binding unless listed in `Dynamic`.
pub(crate) fn dynamic_requires(pkg_info: &str) -> Option<String> {
    let version = headers(pkg_info, "metadata-version")
        .first()
        .map(|v| v.to_string())
        .unwrap_or_else(|| "none".into());
    let at_least_2_2 = Version::from_str(&version)
        .is_ok_and(|v| v >= Version::from_str("2.2").expect("a version"));
    if !at_least_2_2 {
        return Some(format!("its PKG-INFO is Metadata-Version {version}, older than 2.2 (PEP 643), so its `Requires-Dist` may differ from what the build produces"));
    }
    if headers(pkg_info, "dynamic")
        .iter()
        .any(|field| field.eq_ignore_ascii_case("requires-dist"))
    {
        return Some(
            "its PKG-INFO lists `Dynamic: Requires-Dist`: setup.py decides them when it runs"
                .into(),
        );
    }
    None
}

/// The run requirements: the recipe's `requires:` when given, else the static ones.
fn run_requirements(build: &SourceBuild, pkg_info: &str) -> Result<Vec<Requirement>, LockError> {
    if let Some(requires) = &build.requires {
        return Ok(requires.iter().map(|r| r.0.clone()).collect());
    }
    if let Some(why) = dynamic_requires(pkg_info) {
        return Err(LockError::SdistDynamic {
            package: build.package.clone(),
            version: build.version.clone(),
            why,
        });
    }
    Ok(Metadata::parse(pkg_info, "PKG-INFO")
        .map(|m| m.requires_dist)
        .unwrap_or_default())
}

/// `[build-system] requires` of a pyproject.toml; PEP 518's default when the table or
/// the key is absent.
fn build_system_requires(text: &str) -> Result<Vec<Requirement>, String> {
    let table: toml::Table =
        toml::from_str(text).map_err(|e| format!("its pyproject.toml is not TOML: {e}"))?;
    let Some(requires) = table.get("build-system").and_then(|b| b.get("requires")) else {
        return Ok(default_build_requires());
    };
    let list = requires
        .as_array()
        .ok_or("its pyproject.toml's `[build-system] requires` is not a list")?;
    list.iter()
        .map(|item| {
            let text = item
                .as_str()
                .ok_or("its pyproject.toml's `[build-system] requires` has a non-string entry")?;
            crate::names::parse_requirement(text).map_err(|e| {
                format!("its pyproject.toml's `[build-system] requires` entry `{text}` is not PEP 508: {e}")
            })
        })
        .collect()
}

/// PEP 518: a project without `[build-system]` is built with setuptools and wheel.
fn default_build_requires() -> Vec<Requirement> {
    ["setuptools>=40.8.0", "wheel"]
        .iter()
        .map(|text| crate::names::parse_requirement(text).expect("a valid requirement"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gzip tar of `members` (path, text).
    fn sdist(members: &[(&str, &str)]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
            Vec::new(),
            flate2::Compression::fast(),
        ));
        for (path, text) in members {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder
                .append_data(&mut header, path, text.as_bytes())
                .unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn reads_the_top_level_members_only() {
        let bytes = sdist(&[
            ("ext-1.0/src/PKG-INFO", "not this one"),
            (
                "ext-1.0/PKG-INFO",
                "Metadata-Version: 2.4\nName: ext\nVersion: 1.0\n",
            ),
            (
                "ext-1.0/pyproject.toml",
                "[build-system]\nrequires = [\"setuptools>=61\", \"torch\"]\n",
            ),
        ]);
        let members = read_members(&bytes).unwrap();
        assert!(members.pkg_info.unwrap().contains("Name: ext"));
        let requires = build_system_requires(&members.pyproject.unwrap()).unwrap();
        let names: Vec<String> = requires.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["setuptools>=61", "torch"]);
        assert!(read_members(b"not gzip").unwrap_err().contains("gzip tar"));
    }

    #[test]
    fn build_requires_default_to_pep_518() {
        for text in [
            "[project]\nname = \"x\"\n",
            "[build-system]\nbuild-backend = \"x\"\n",
        ] {
            let names: Vec<String> = build_system_requires(text)
                .unwrap()
                .iter()
                .map(ToString::to_string)
                .collect();
            assert_eq!(names, ["setuptools>=40.8.0", "wheel"]);
        }
        let error =
            build_system_requires("[build-system]\nrequires = [\"torch>=\"]\n").unwrap_err();
        assert!(error.contains("entry `torch>=` is not PEP 508"), "{error}");
        let error = build_system_requires("[build-system]\nrequires = \"torch\"\n").unwrap_err();
        assert!(error.contains("is not a list"), "{error}");
    }

    /// torchsort 0.1.10's PKG-INFO is 2.4 with static Requires-Dist; flash-attn 2.6.3's is
    /// 2.1, and one listing `Dynamic: Requires-Dist` is dynamic whatever its version.
    #[test]
    fn requires_dist_is_static_from_metadata_2_2_unless_dynamic() {
        let torchsort = "Metadata-Version: 2.4\nName: torchsort\nVersion: 0.1.10\nRequires-Dist: torch>=1.7.1\nDynamic: home-page\nDynamic: requires-python\n\nbody";
        assert_eq!(dynamic_requires(torchsort), None);
        let old = "Metadata-Version: 2.1\nName: flash_attn\nVersion: 2.6.3\nRequires-Dist: torch\n";
        assert!(dynamic_requires(old)
            .unwrap()
            .contains("Metadata-Version 2.1, older than 2.2"));
        let dynamic = "Metadata-Version: 2.2\nName: x\nVersion: 1\nDynamic: Requires-Dist\n";
        assert!(dynamic_requires(dynamic)
            .unwrap()
            .contains("Dynamic: Requires-Dist"));
        assert!(dynamic_requires("Name: x\n")
            .unwrap()
            .contains("Metadata-Version none"));
    }

    #[test]
    fn sdist_versions_come_from_their_file_names() {
        assert_eq!(
            sdist_version("antlr4-python3-runtime-4.9.3.tar.gz"),
            Some("4.9.3".parse().unwrap())
        );
        assert_eq!(
            sdist_version("six-1.16.0.zip"),
            Some("1.16.0".parse().unwrap())
        );
        assert_eq!(sdist_version("six-1.16.0-py3-none-any.whl"), None);
        assert_eq!(sdist_version("noversion.tar.gz"), None);
    }
}
