//! Lock: resolve everything a recipe needs to exact artifacts (URL + sha256 + size).
//!
//! Input is a [`LockRequest`] (target, root PEP 508 requirements, package sources in
//! priority order, NVIDIA redist components, and the recipe's digest); output is a
//! [`Lockfile`]. Python packages are resolved by PubGrub ([`resolver`]) over PEP 440
//! versions with markers evaluated for the [`Target`]; redist components are looked up in
//! their manifests. Nothing is downloaded here except index pages, manifests and wheel
//! metadata; [`crate::fetch::download`] fetches what the lock names.

#![allow(clippy::result_large_err)] // see crate::fetch: errors name their URLs

pub mod changes;
pub mod inputs;
pub mod lockfile;
pub mod pylock;
pub mod pyproject;
pub mod python_inputs;
pub mod requirements_txt;
pub mod resolver;
pub mod sdist;
pub mod system;
pub mod target;
pub mod uv_lock;

use std::sync::Arc;

use pep440_rs::Version;
use pep508_rs::{PackageName, Requirement};

use crate::digest::Digest;
use crate::fetch::file_name::FileNameError;
use crate::fetch::http::{HttpClient, HttpError};
use crate::fetch::metadata::MetadataError;
use crate::fetch::redist::{resolve_request, RedistError, RedistRequest};
use crate::fetch::source::{PackageSource, SourceError};
pub use lockfile::{
    Artifact, ArtifactError, ArtifactKind, Location, Lockfile, LockfileError, LOCK_FORMAT_VERSION,
};
pub use target::{GlibcVersion, PythonVersion, Target};

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("Failed to list `{package}` on `{source_label}`")]
    Source {
        package: PackageName,
        source_label: String,
        #[source]
        error: SourceError,
    },
    #[error("Package `{package}` was not found on any source: {}", sources.join(", "))]
    PackageNotFound {
        package: PackageName,
        sources: Vec<String>,
    },
    #[error("No wheel of `{package}` fits {target}; the newest listed versions offer:\n  {}{hint}\n{report}", rejected.join("\n  "))]
    NoCompatibleWheel {
        package: PackageName,
        target: String,
        rejected: Vec<String>,
        /// Empty, or a line pointing at the recipe's `build:` when the version has an sdist.
        hint: String,
        report: String,
    },
    #[error("Requirement `{requirement}` does not apply to {target}: its marker is false there, so it would install nothing")]
    MarkerExcludes { requirement: String, target: String },
    #[error("Requirement `{requirement}` points at a URL; cudastack locks only index and mirror packages")]
    UrlRequirement { requirement: String },
    #[error("Failed to read the metadata of `{package}` {version} from `{url}`")]
    Metadata {
        package: PackageName,
        version: Version,
        url: String,
        #[source]
        error: MetadataError,
    },
    #[error("Metadata at `{url}` describes a different distribution\n  Expected: {expected}\n  Found:    {found}")]
    MetadataDisagrees {
        url: String,
        expected: String,
        found: String,
    },
    #[error("{origin}: no wheel of `{package}` {version} has a sha256 listed there\n  Expected: one of {}\n  Found:    {found}\n  hint: the file on the index is not the one the hash was taken from; take the hashes again (`pip hash`, `uv pip compile --generate-hashes`) or check that the index serves what you expect", expected.join(", "))]
    HashMismatch {
        origin: String,
        package: PackageName,
        version: Version,
        expected: Vec<String>,
        found: String,
    },
    #[error("`{package}` {version} is published only as a source distribution (`{filename}`), and cudastack installs wheels only, unless the recipe's `build:` names the package\n  hint: add `build: [{{package: {package}, version: \"{version}\"}}]` to the recipe to compile it with the stack's devel toolchain for the recipe's `gpus:` (docs/source-builds.md)\n  hint: require a version of `{package}` that has a wheel instead, drop what requires it, or serve a wheel of it from an index in the recipe's `indexes:`\n{report}")]
    SdistOnly {
        package: PackageName,
        version: Version,
        filename: String,
        report: String,
    },
    #[error("`build` package `{package}`: {source_label} has no source distribution of {version}; its sdists: {}\n  hint: give `version:` one of the listed releases, or serve the sdist from an index in the recipe's `indexes:`", if listed.is_empty() { "none".to_string() } else { listed.join(", ") })]
    SdistMissing {
        package: PackageName,
        version: Version,
        source_label: String,
        listed: Vec<String>,
    },
    #[error("Failed to fetch the sdist `{url}`")]
    SdistFetch {
        url: String,
        #[source]
        error: HttpError,
    },
    #[error("Failed to read the sdist `{}`", path.display())]
    SdistRead {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("The sdist `{url}` does not have the sha256 its index lists\n  Expected: {expected}\n  Found:    {found}")]
    SdistHash {
        url: String,
        expected: Digest,
        found: Digest,
    },
    #[error("`{filename}` cannot be built: {reason}")]
    SdistContent { filename: String, reason: String },
    #[error("`build` package `{package}` {version}: the lock cannot tell what it needs at run time: {why}\n  hint: list its run requirements in the entry, e.g. `{{package: {package}, version: \"{version}\", requires: [\"torch\", \"einops\"]}}` (from its setup.py's `install_requires`); `requires: []` when it needs nothing")]
    SdistDynamic {
        package: PackageName,
        version: Version,
        why: String,
    },
    #[error(transparent)]
    Git(#[from] crate::fetch::git::GitError),
    #[error("`{package}` @ {url}: {why}\n  hint: {hint}")]
    ProjectSource {
        package: PackageName,
        url: String,
        why: String,
        hint: String,
    },
    #[error("No set of versions satisfies the requirements:\n{report}")]
    NoSolution { report: String },
    #[error("Index lists `{filename}` without a sha256; cudastack locks only hash-pinned files (`{url}`)")]
    NoHash { filename: String, url: String },
    #[error("Failed to learn the size of `{url}`")]
    Size {
        url: String,
        #[source]
        error: HttpError,
    },
    #[error(transparent)]
    Redist(#[from] RedistError),
    #[error("The file name of `{url}` cannot be used as a file name")]
    BadFileName {
        url: String,
        #[source]
        source: FileNameError,
    },
    #[error("Refusing to lock: {0}")]
    Artifact(#[from] ArtifactError),
    #[error(
        "Index file `{url}` is a local file; only a `--mirror` directory may provide local files"
    )]
    LocalFile { url: String },
    #[error(transparent)]
    System(#[from] system::SystemError),
    #[error("The resolver task failed")]
    Join(#[from] tokio::task::JoinError),
    #[error("internal resolver error: {0}")]
    Internal(String),
}

/// Everything needed to make a lock.
#[derive(Debug, Clone)]
pub struct LockRequest {
    pub target: Target,
    /// Root requirements (`torch==2.4.1`, `numpy==1.26.4`).
    pub requirements: Vec<Requirement>,
    /// Version constraints and accepted hashes from the recipe's Python input files
    /// ([`python_inputs`]); empty for a recipe of `packages:` only.
    pub constraints: python_inputs::Constraints,
    /// Package sources in priority order; each package comes from the first that has it.
    pub sources: Vec<PackageSource>,
    pub redist: Vec<RedistRequest>,
    /// The Debian or Ubuntu base's packages and the recipe's `apt:` list; None for a
    /// lock of wheels only.
    pub system: Option<system::SystemRequest>,
    /// The recipe's digest, recorded so a changed recipe makes the lock stale.
    pub recipe_digest: Digest,
    /// The digest a lock recorded before it followed what the Python input files mean
    /// ([`python_inputs::PythonInputs::byte_digest`]): a previous lock that recorded this
    /// for the same bytes keeps its digest when locked again.
    pub byte_digest: Option<Digest>,
    /// The moment the resolution stands for, recorded in the lock; set by
    /// [`LockRequest::as_of`] to read the sources as they were then.
    pub as_of: Option<jiff::Timestamp>,
}

impl LockRequest {
    /// Resolve as the sources were at `at`: index files uploaded later are
    /// not candidates (uv's `--exclude-newer`), and the Debian/Ubuntu archive is read from
    /// its snapshot at `at` (`snapshot_service` stands in for the public snapshot
    /// services, or gives a mirror's). The lock records `at`.
    pub fn as_of(
        &mut self,
        at: jiff::Timestamp,
        snapshot_service: Option<&reqwest::Url>,
    ) -> Result<(), crate::apt::AptError> {
        if let Some(system) = self.system.as_mut() {
            system.sources = system.sources.clone().at_snapshot(at, snapshot_service)?;
        }
        self.sources = std::mem::take(&mut self.sources)
            .into_iter()
            .map(|source| source.as_of(at))
            .collect();
        self.as_of = Some(at);
        Ok(())
    }
}

/// Resolve a [`LockRequest`] into a [`Lockfile`].
pub async fn resolve(client: &HttpClient, request: &LockRequest) -> Result<Lockfile, LockError> {
    resolve_with_builds(client, request, &sdist::BuildRequest::default()).await
}

/// Resolve a [`LockRequest`] whose recipe has a `build:` list: each entry's
/// sdist is locked in place of a wheel (kind `sdist`, with the run requirements it
/// declares), and what the builds need, resolved against the image's own versions, is
/// locked as `build-wheel` artifacts that never enter the image.
pub async fn resolve_with_builds(
    client: &HttpClient,
    request: &LockRequest,
    builds: &sdist::BuildRequest,
) -> Result<Lockfile, LockError> {
    let env = request.target.marker_environment();
    for requirement in &request.requirements {
        if !requirement.evaluate_markers(&env, &[]) {
            return Err(LockError::MarkerExcludes {
                requirement: requirement.to_string(),
                target: request.target.describe(),
            });
        }
    }
    let mut sdists = sdist::inspect_all(client, &request.sources, &builds.builds).await?;
    let git = git_requirements(&request.requirements)?;
    for (name, source) in &git {
        if builds.builds.iter().any(|b| b.package == *name) {
            return Err(LockError::ProjectSource {
                package: name.clone(),
                url: source.to_string(),
                why: "the recipe's `build:` names the package too".into(),
                hint: "keep one of the two: the git requirement or the `build:` entry".into(),
            });
        }
        let locked = builds.git_commits.get(&source.to_string()).cloned();
        let (name, source) = (name.clone(), source.clone());
        let found = tokio::task::spawn_blocking(move || {
            sdist::inspect_git(&name, &source, locked.as_ref())
        })
        .await??;
        sdists.push(found);
    }
    for project in &builds.projects {
        let (dir, project) = (builds.recipe_dir.clone(), project.clone());
        let found =
            tokio::task::spawn_blocking(move || sdist::inspect_project(&dir, &project)).await??;
        sdists.push(found);
    }
    let mut artifacts = if request.requirements.is_empty() {
        Vec::new()
    } else {
        // The resolver takes a git requirement's package by name: its only version is the
        // one the commit's tree declares.
        let roots = request
            .requirements
            .iter()
            .cloned()
            .map(|mut requirement| {
                if git.iter().any(|(name, _)| *name == requirement.name) {
                    requirement.version_or_url = None;
                }
                requirement
            })
            .collect();
        resolve_python(client, request, roots, &request.constraints, &sdists).await?
    };
    for artifact in &mut artifacts {
        if let Some((_, source)) = git.iter().find(|(name, _)| name.as_ref() == artifact.name) {
            artifact.source = source.to_string();
        }
        // A local project is named by its directory, relative to the recipe's.
        if let Some(project) = builds
            .projects
            .iter()
            .find(|p| p.name.as_ref() == artifact.name)
        {
            artifact.url = Location::Recipe(project.path.clone());
            artifact.source = project.path.clone();
        }
    }
    if !sdists.is_empty() {
        let builder = resolve_build_wheels(client, request, builds, &sdists, &artifacts).await?;
        artifacts.extend(builder);
    }

    for redist in &request.redist {
        for artifact in resolve_request(client, redist).await? {
            artifacts.push(Artifact {
                kind: ArtifactKind::RedistArchive,
                name: artifact.component.clone(),
                version: artifact.version.clone(),
                filename: artifact
                    .filename()
                    .map_err(|source| LockError::BadFileName {
                        url: artifact.url.to_string(),
                        source,
                    })?,
                url: artifact.url.clone().into(),
                sha256: artifact.sha256,
                size: artifact.size,
                source: artifact.manifest_url.to_string(),
                platform: Some(artifact.platform.clone()),
                variant: artifact.variant.clone(),
                requires: Vec::new(),
                required_by: Vec::new(),
                suite: None,
                component: None,
                fallback_url: None,
                layer: None,
            });
        }
    }

    if let Some(system) = request.system.clone() {
        let target = request.target.clone();
        let cufile = artifacts
            .iter()
            .any(|a| a.name.starts_with("nvidia-cufile"));
        let builder = (!sdists.is_empty()).then(|| system::SystemRequest {
            apt: system
                .apt
                .iter()
                .cloned()
                .chain(sdist::BUILD_DEBS.iter().map(|d| d.to_string()))
                .collect(),
            ..system.clone()
        });
        let (debs, builder_debs) = tokio::task::spawn_blocking(move || {
            let debs = system::resolve_system(&system, &target, cufile)?;
            let builder_debs = builder
                .map(|builder| system::resolve_system(&builder, &target, cufile))
                .transpose()?;
            Ok::<_, system::SystemError>((debs, builder_debs))
        })
        .await??;
        // What the builder's apt layer adds to the image's packages.
        let in_image: std::collections::BTreeSet<String> =
            debs.iter().map(|d| d.name.clone()).collect();
        let extra = builder_debs
            .into_iter()
            .flatten()
            .filter(|d| !in_image.contains(&d.name))
            .map(|mut d| {
                d.kind = ArtifactKind::BuildDeb;
                d.layer = Some(lockfile::DebLayer::Apt);
                d
            });
        artifacts.extend(debs);
        artifacts.extend(extra);
    }

    // The same checks a lock read from disk passes: what `lock` writes, `build` accepts.
    for artifact in &artifacts {
        artifact.check()?;
    }
    let mut lock = Lockfile {
        lock_format: LOCK_FORMAT_VERSION,
        recipe_digest: request.recipe_digest,
        as_of: request.as_of,
        target: request.target.clone(),
        requirements: request.requirements.iter().map(|r| r.to_string()).collect(),
        artifacts,
    };
    lock.canonicalize();
    Ok(lock)
}

/// The git requirements among `requirements` (`name @ git+URL`), parsed.
fn git_requirements(
    requirements: &[Requirement],
) -> Result<Vec<(PackageName, crate::fetch::git::GitSource)>, LockError> {
    let mut found = Vec::new();
    for requirement in requirements {
        let Some(pep508_rs::VersionOrUrl::Url(url)) = &requirement.version_or_url else {
            continue;
        };
        if let Some(text) = python_inputs::git_url_text(url) {
            let source = crate::fetch::git::GitSource::parse(&text)?;
            found.push((requirement.name.clone(), source));
        }
    }
    Ok(found)
}

/// PubGrub over `roots`: one artifact per resolved distribution, a wheel or (for a
/// package of `build:`) its sdist.
async fn resolve_python(
    client: &HttpClient,
    request: &LockRequest,
    roots: Vec<Requirement>,
    constraints: &python_inputs::Constraints,
    sdists: &[sdist::SdistInfo],
) -> Result<Vec<Artifact>, LockError> {
    let provider = Arc::new(
        resolver::Provider::new(
            tokio::runtime::Handle::current(),
            request.sources.clone(),
            request.target.clone(),
            roots,
            constraints,
        )
        .with_source_builds(sdists),
    );
    let solver = provider.clone();
    let resolved = tokio::task::spawn_blocking(move || resolver::solve(&solver)).await??;
    let sizes = futures_util::future::join_all(resolved.iter().map(|r| async {
        match r.candidate.file.size {
            Some(size) => Ok(size),
            None => match sdists.iter().find(|s| s.name == r.name) {
                Some(sdist) => Ok(sdist.size),
                None => remote_size(client, &r.candidate.file.url).await,
            },
        }
    }))
    .await;
    let mut artifacts = Vec::new();
    for (resolved, size) in resolved.into_iter().zip(sizes) {
        let file = &resolved.candidate.file;
        let sha256 = file.sha256.ok_or_else(|| LockError::NoHash {
            filename: file.filename.to_string(),
            url: file.url.to_string(),
        })?;
        let kind = if resolved.candidate.source_build {
            ArtifactKind::Sdist
        } else {
            ArtifactKind::Wheel
        };
        // (A git requirement or local project has no source of the request's; the caller
        // records where it is from.)
        let source = request.sources.get(resolved.candidate.source);
        // A wheel of `wheels:` is named relative to the recipe's directory, not where this
        // checkout happens to be.
        let url = match source {
            Some(PackageSource::Local(local)) if !resolved.candidate.source_build => {
                match local.by_url(&file.url) {
                    Some(wheel) => Location::Recipe(wheel.path.clone()),
                    None => {
                        return Err(LockError::Internal(format!(
                            "`{}` is not a wheel of `wheels:`",
                            file.url
                        )))
                    }
                }
            }
            _ => Location::Url(file.url.clone()),
        };
        artifacts.push(Artifact {
            kind,
            name: resolved.name.to_string(),
            version: resolved.version.to_string(),
            filename: file.filename.clone(),
            url,
            sha256,
            size: size?,
            source: source.map(ToString::to_string).unwrap_or_default(),
            platform: None,
            variant: None,
            requires: resolved.requires.into_iter().collect(),
            required_by: resolved.required_by.into_iter().collect(),
            suite: None,
            component: None,
            fallback_url: None,
            layer: None,
        });
    }
    Ok(artifacts)
}

/// Who requires a build dependency that the builder itself asks for.
pub const BUILD_ROOT: &str = "<build>";

/// The wheels the builds of `sdists` need and the image does not have: the toolchain and
/// each sdist's `[build-system] requires`, resolved with every package the image has
/// pinned to the image's version (`--no-build-isolation` builds against the image's torch,
/// not another one), as `build-wheel` artifacts.
async fn resolve_build_wheels(
    client: &HttpClient,
    request: &LockRequest,
    builds: &sdist::BuildRequest,
    sdists: &[sdist::SdistInfo],
    image: &[Artifact],
) -> Result<Vec<Artifact>, LockError> {
    let mut roots: Vec<Requirement> = Vec::new();
    let built: Vec<&PackageName> = sdists.iter().map(|s| &s.name).collect();
    // Each build runs against the image's own packages (no build isolation), not against
    // another build's wheel: a build need on a package the recipe also builds would be
    // missing in the builder, so it is refused here rather than at compile time.
    for sdist in sdists {
        if let Some(other) = sdist
            .build_requires
            .iter()
            .find(|r| r.name != sdist.name && built.contains(&&r.name))
        {
            return Err(LockError::SdistContent {
                filename: sdist.file.filename.to_string(),
                reason: format!(
                    "its build needs `{}`, which the recipe's `build:` also compiles, and each build runs against the image's own packages, not another build's wheel\n  hint: build `{}` first and serve its wheel from an index in `indexes:`, then drop it from `build:`",
                    other.name, other.name
                ),
            });
        }
    }
    let wanted = builds
        .toolchain
        .iter()
        .chain(sdists.iter().flat_map(|s| &s.build_requires));
    for requirement in wanted {
        let applies = requirement.evaluate_markers(&request.target.marker_environment(), &[]);
        if applies && !built.contains(&&requirement.name) && !roots.contains(requirement) {
            roots.push(requirement.clone());
        }
    }
    let mut constraints = request.constraints.clone();
    for artifact in image.iter().filter(|a| a.kind == ArtifactKind::Wheel) {
        let text = format!("{}=={}", artifact.name, artifact.version);
        let requirement = crate::names::parse_requirement(&text)
            .map_err(|e| LockError::Internal(format!("`{text}`: {e}")))?;
        constraints.versions.push(python_inputs::Sourced {
            requirement,
            origin: python_inputs::Origin {
                file: "the image's lock".into(),
                line: None,
                place: None,
            },
        });
    }
    let resolved = resolve_python(client, request, roots, &constraints, &[]).await?;
    let in_image: std::collections::BTreeSet<&str> =
        image.iter().map(|a| a.name.as_str()).collect();
    Ok(resolved
        .into_iter()
        .filter(|a| !in_image.contains(a.name.as_str()))
        .map(|mut a| {
            a.kind = ArtifactKind::BuildWheel;
            for parent in &mut a.required_by {
                if parent == "<root>" {
                    *parent = BUILD_ROOT.to_string();
                }
            }
            a
        })
        .collect())
}

/// The size of a remote file from a one-byte range request (PEP 503 pages carry no sizes).
async fn remote_size(client: &HttpClient, url: &reqwest::Url) -> Result<u64, LockError> {
    // Mirror files carry their size; a `file:` URL here came from an index page, and
    // reading it would tell the index about this machine's files.
    if url.scheme() == "file" {
        return Err(LockError::LocalFile {
            url: url.to_string(),
        });
    }
    let answer = client
        .get_range(
            url,
            crate::fetch::http::ByteRange::Inclusive { start: 0, end: 0 },
        )
        .await
        .map_err(|error| LockError::Size {
            url: url.to_string(),
            error,
        })?;
    answer
        .range
        .total
        .ok_or_else(|| LockError::Internal(format!("`{url}` reported no total size")))
}
