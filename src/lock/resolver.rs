//! Python dependency resolution with PubGrub over PEP 440 versions.
//!
//! Packages are `Dist(name)` plus one virtual package per requested extra,
//! `Extra(name, extra)`, which depends on `Dist(name)` at exactly the same version and on
//! the requirements that the extra switches on (the way uv models extras). Markers are
//! evaluated for the [`Target`]; only wheels with a tag the target accepts and a
//! `Requires-Python` it satisfies are candidates; the newest candidate in range wins, final
//! releases before pre-releases, yanked files only for exact pins (pip's rules).
//!
//! PubGrub is synchronous; the network calls run on the tokio runtime through
//! [`tokio::runtime::Handle::block_on`] from the blocking thread the solver runs on, with
//! each new package's listing (and its likely metadata) prefetched concurrently.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use futures_util::future::join_all;
use pep440_rs::{Version, VersionSpecifiers};
use pep508_rs::{ExtraName, MarkerEnvironment, PackageName, Requirement, VersionOrUrl};
use pubgrub::{
    DefaultStringReporter, Dependencies, DependencyConstraints, DependencyProvider,
    PackageResolutionStatistics, PubGrubError, Ranges, Reporter,
};

use crate::fetch::index::DistFile;
use crate::fetch::metadata::Metadata;
use crate::fetch::source::PackageSource;
use crate::lock::target::{TagPriorities, Target};
use crate::lock::LockError;
use crate::names::WheelFilename;

/// A PubGrub package.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pkg {
    Root,
    Dist(PackageName),
    Extra(PackageName, ExtraName),
}

impl fmt::Display for Pkg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pkg::Root => f.write_str("<root>"),
            Pkg::Dist(name) => write!(f, "{name}"),
            Pkg::Extra(name, extra) => write!(f, "{name}[{extra}]"),
        }
    }
}

/// The wheel chosen for one version of a package.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub wheel: WheelFilename,
    pub file: DistFile,
    pub source: usize,
}

/// What one source offers for one package, reduced to the best wheel per version.
#[derive(Debug)]
struct Project {
    source: usize,
    versions: BTreeMap<Version, Candidate>,
    /// Versions listed but without a usable wheel, with the reason (for error messages).
    rejected: BTreeMap<Version, String>,
}

/// A resolved distribution with the requirement edges that brought it in.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub name: PackageName,
    pub version: Version,
    pub candidate: Candidate,
    /// `name[extras] specifier` of each requirement this package declares that applied.
    pub requires: BTreeSet<String>,
    /// Who required it: `parent` or `parent[extra]`, or `<root>` for a root requirement.
    pub required_by: BTreeSet<String>,
}

pub(crate) struct Provider {
    handle: tokio::runtime::Handle,
    sources: Vec<PackageSource>,
    target: Target,
    env: MarkerEnvironment,
    tags_pypi: TagPriorities,
    tags_linux: TagPriorities,
    root: Vec<Requirement>,
    projects: Mutex<HashMap<PackageName, Arc<Project>>>,
    metadata: Mutex<HashMap<(PackageName, Version), Arc<Metadata>>>,
    /// The requirements that applied to each (package, version) we asked about.
    edges: Mutex<HashMap<(Pkg, Version), Vec<Requirement>>>,
    /// Ranges for which no version was usable although the source listed some in range.
    unusable: Mutex<Vec<(PackageName, Ranges<Version>)>>,
}

fn range_of(requirement: &Requirement) -> Result<Ranges<Version>, LockError> {
    match &requirement.version_or_url {
        None => Ok(Ranges::full()),
        Some(VersionOrUrl::VersionSpecifier(specifiers)) => Ok(Ranges::from(specifiers.clone())),
        Some(VersionOrUrl::Url(_)) => Err(LockError::UrlRequirement {
            requirement: requirement.to_string(),
        }),
    }
}

/// `name[extras] specifier` without the marker, for lock edges.
fn requirement_label(requirement: &Requirement) -> String {
    let mut out = requirement.name.to_string();
    if !requirement.extras.is_empty() {
        let extras: Vec<String> = requirement.extras.iter().map(|e| e.to_string()).collect();
        out.push_str(&format!("[{}]", extras.join(",")));
    }
    if let Some(VersionOrUrl::VersionSpecifier(specifiers)) = &requirement.version_or_url {
        if !specifiers.is_empty() {
            out.push_str(&specifiers.to_string());
        }
    }
    out
}

fn python_ok(target: &Target, specifiers: Option<&VersionSpecifiers>) -> bool {
    specifiers.is_none_or(|s| s.contains(&target.python.full()))
}

impl Provider {
    pub(crate) fn new(
        handle: tokio::runtime::Handle,
        sources: Vec<PackageSource>,
        target: Target,
        root: Vec<Requirement>,
    ) -> Self {
        Provider {
            handle,
            env: target.marker_environment(),
            tags_pypi: target.tag_priorities(false),
            tags_linux: target.tag_priorities(true),
            target,
            sources,
            root,
            projects: Mutex::new(HashMap::new()),
            metadata: Mutex::new(HashMap::new()),
            edges: Mutex::new(HashMap::new()),
            unusable: Mutex::new(Vec::new()),
        }
    }

    /// Fetch (once) what the first source that has `name` offers.
    async fn load_project(&self, name: &PackageName) -> Result<Arc<Project>, LockError> {
        if let Some(project) = self.projects.lock().unwrap().get(name) {
            return Ok(project.clone());
        }
        for (index, source) in self.sources.iter().enumerate() {
            let Some(page) = source
                .project(name)
                .await
                .map_err(|error| LockError::Source {
                    package: name.clone(),
                    source_label: source.to_string(),
                    error,
                })?
            else {
                continue;
            };
            if page.files.is_empty() {
                continue;
            }
            let tags = if source.accepts_plain_linux() {
                &self.tags_linux
            } else {
                &self.tags_pypi
            };
            let project = Arc::new(self.reduce(index, tags, &page.files));
            self.projects
                .lock()
                .unwrap()
                .insert(name.clone(), project.clone());
            return Ok(project);
        }
        // Only the sources that were asked: a package pinned to one index is looked up there.
        Err(LockError::PackageNotFound {
            package: name.clone(),
            sources: self
                .sources
                .iter()
                .filter(|s| s.asks_for(name))
                .map(|s| s.to_string())
                .collect(),
        })
    }

    /// Keep the best installable wheel per version; note why the others were rejected.
    fn reduce(&self, source: usize, tags: &TagPriorities, files: &[DistFile]) -> Project {
        let mut best: BTreeMap<Version, (bool, usize, Option<u64>, Candidate)> = BTreeMap::new();
        let mut seen_tags: BTreeMap<Version, BTreeSet<String>> = BTreeMap::new();
        let mut python_rejected: BTreeMap<Version, String> = BTreeMap::new();
        for file in files {
            let Some(wheel) = file.wheel() else {
                continue;
            };
            seen_tags
                .entry(wheel.version.clone())
                .or_default()
                .insert(wheel.tag_string());
            let Some(rank) = tags.best(&wheel) else {
                continue;
            };
            if !python_ok(&self.target, file.requires_python.as_ref()) {
                python_rejected.insert(
                    wheel.version.clone(),
                    format!(
                        "requires Python {}",
                        file.requires_python
                            .as_ref()
                            .map(|s| s.to_string())
                            .unwrap_or_default()
                    ),
                );
                continue;
            }
            // Order: not yanked, best tag, highest build number.
            let key = (
                file.yanked,
                rank,
                wheel.build.as_ref().map(|b| u64::MAX - b.number),
            );
            let candidate = Candidate {
                wheel: wheel.clone(),
                file: file.clone(),
                source,
            };
            match best.get(&wheel.version) {
                Some((yanked, rank, build, _)) if (*yanked, *rank, *build) <= key => {}
                _ => {
                    best.insert(wheel.version.clone(), (key.0, key.1, key.2, candidate));
                }
            }
        }
        let mut rejected = BTreeMap::new();
        for (version, tag_set) in seen_tags {
            if best.contains_key(&version) {
                continue;
            }
            let reason = python_rejected.remove(&version).unwrap_or_else(|| {
                format!(
                    "only {}",
                    tag_set.into_iter().collect::<Vec<_>>().join(", ")
                )
            });
            rejected.insert(version, reason);
        }
        Project {
            source,
            versions: best.into_iter().map(|(v, (_, _, _, c))| (v, c)).collect(),
            rejected,
        }
    }

    async fn load_metadata(
        &self,
        name: &PackageName,
        version: &Version,
    ) -> Result<Arc<Metadata>, LockError> {
        let key = (name.clone(), version.clone());
        if let Some(metadata) = self.metadata.lock().unwrap().get(&key) {
            return Ok(metadata.clone());
        }
        let project = self.load_project(name).await?;
        let candidate = project
            .versions
            .get(version)
            .ok_or_else(|| LockError::Internal(format!("no candidate for {name} {version}")))?;
        let text = self.sources[project.source]
            .metadata(&candidate.file)
            .await
            .map_err(|error| LockError::Metadata {
                package: name.clone(),
                version: version.clone(),
                url: candidate.file.url.to_string(),
                error,
            })?;
        let metadata = Metadata::parse(&text, candidate.file.url.as_str()).map_err(|error| {
            LockError::Metadata {
                package: name.clone(),
                version: version.clone(),
                url: candidate.file.url.to_string(),
                error,
            }
        })?;
        if &metadata.name != name || &metadata.version != version {
            return Err(LockError::MetadataDisagrees {
                url: candidate.file.url.to_string(),
                expected: format!("{name} {version}"),
                found: format!("{} {}", metadata.name, metadata.version),
            });
        }
        let metadata = Arc::new(metadata);
        self.metadata.lock().unwrap().insert(key, metadata.clone());
        Ok(metadata)
    }

    /// The version pip would pick from `range`, if any.
    fn pick(project: &Project, range: &Ranges<Version>) -> Option<Version> {
        let exact = range.as_singleton();
        let usable = |(version, candidate): &(&Version, &Candidate)| {
            range.contains(version) && (!candidate.file.yanked || exact == Some(*version))
        };
        let mut in_range = project.versions.iter().rev().filter(usable);
        let first_final = project
            .versions
            .iter()
            .rev()
            .filter(usable)
            .find(|(v, _)| !v.any_prerelease());
        first_final
            .or_else(|| in_range.next())
            .map(|(v, _)| v.clone())
    }

    /// Prefetch listings of `names` and the metadata of their likely versions, concurrently.
    async fn prefetch(&self, wanted: Vec<(PackageName, Ranges<Version>)>) {
        let tasks = wanted.into_iter().map(|(name, range)| async move {
            if let Ok(project) = self.load_project(&name).await {
                if let Some(version) = Self::pick(&project, &range) {
                    let _ = self.load_metadata(&name, &version).await;
                }
            }
        });
        join_all(tasks).await;
    }

    fn add(
        constraints: &mut DependencyConstraints<Pkg, Ranges<Version>>,
        package: Pkg,
        range: Ranges<Version>,
    ) {
        let entry = constraints.entry(package).or_insert_with(Ranges::full);
        *entry = entry.intersection(&range);
    }

    fn requirement_constraints(
        &self,
        requirements: &[Requirement],
        constraints: &mut DependencyConstraints<Pkg, Ranges<Version>>,
    ) -> Result<(), LockError> {
        for requirement in requirements {
            let range = range_of(requirement)?;
            Self::add(
                constraints,
                Pkg::Dist(requirement.name.clone()),
                range.clone(),
            );
            for extra in &requirement.extras {
                Self::add(
                    constraints,
                    Pkg::Extra(requirement.name.clone(), extra.clone()),
                    range.clone(),
                );
            }
        }
        Ok(())
    }

    fn dependencies(
        &self,
        package: &Pkg,
        version: &Version,
    ) -> Result<Dependencies<Pkg, Ranges<Version>, String>, LockError> {
        let applied: Vec<Requirement> = match package {
            Pkg::Root => self.root.clone(),
            Pkg::Dist(name) | Pkg::Extra(name, _) => {
                let metadata = self.handle.block_on(self.load_metadata(name, version))?;
                if !python_ok(&self.target, metadata.requires_python.as_ref()) {
                    return Ok(Dependencies::Unavailable(format!(
                        "{name} {version} requires Python {}",
                        metadata
                            .requires_python
                            .as_ref()
                            .map(|s| s.to_string())
                            .unwrap_or_default()
                    )));
                }
                match package {
                    Pkg::Extra(_, extra) => metadata
                        .requires_dist
                        .iter()
                        .filter(|r| {
                            r.evaluate_markers(&self.env, std::slice::from_ref(extra))
                                && !r.evaluate_markers(&self.env, &[])
                        })
                        .cloned()
                        .collect(),
                    _ => metadata
                        .requires_dist
                        .iter()
                        .filter(|r| r.evaluate_markers(&self.env, &[]))
                        .cloned()
                        .collect(),
                }
            }
        };
        let mut constraints = DependencyConstraints::default();
        if let Pkg::Extra(name, _) = package {
            Self::add(
                &mut constraints,
                Pkg::Dist(name.clone()),
                Ranges::singleton(version.clone()),
            );
        }
        self.requirement_constraints(&applied, &mut constraints)?;
        let wanted: Vec<(PackageName, Ranges<Version>)> = constraints
            .iter()
            .filter_map(|(p, r)| match p {
                Pkg::Dist(name) => Some((name.clone(), r.clone())),
                _ => None,
            })
            .collect();
        self.handle.block_on(self.prefetch(wanted));
        self.edges
            .lock()
            .unwrap()
            .insert((package.clone(), version.clone()), applied);
        Ok(Dependencies::Available(constraints))
    }

    pub(crate) fn candidate(&self, name: &PackageName, version: &Version) -> Option<Candidate> {
        let projects = self.projects.lock().unwrap();
        projects.get(name)?.versions.get(version).cloned()
    }

    /// Why the listed versions of `package` in `range` were unusable, newest first.
    fn rejections(&self, package: &PackageName, range: &Ranges<Version>) -> Vec<String> {
        let projects = self.projects.lock().unwrap();
        let Some(project) = projects.get(package) else {
            return Vec::new();
        };
        project
            .rejected
            .iter()
            .rev()
            .filter(|(version, _)| range.contains(version))
            .take(8)
            .map(|(version, reason)| format!("{version}: {reason}"))
            .collect()
    }
}

impl DependencyProvider for Provider {
    type P = Pkg;
    type V = Version;
    type VS = Ranges<Version>;
    type M = String;
    type Priority = (u8, u32);
    type Err = LockError;

    fn prioritize(
        &self,
        package: &Pkg,
        range: &Ranges<Version>,
        statistics: &PackageResolutionStatistics,
    ) -> Self::Priority {
        // Exact pins first (they cannot branch), then the most conflicted packages.
        let pinned = match package {
            Pkg::Root => 3,
            _ if range.as_singleton().is_some() => 2,
            _ => 1,
        };
        (pinned, statistics.conflict_count())
    }

    fn choose_version(
        &self,
        package: &Pkg,
        range: &Ranges<Version>,
    ) -> Result<Option<Version>, LockError> {
        match package {
            Pkg::Root => Ok(Some(Version::new([0u64]))),
            Pkg::Dist(name) | Pkg::Extra(name, _) => {
                let project = self.handle.block_on(self.load_project(name))?;
                let picked = Self::pick(&project, range);
                if picked.is_none() && project.rejected.keys().any(|v| range.contains(v)) {
                    self.unusable
                        .lock()
                        .unwrap()
                        .push((name.clone(), range.clone()));
                }
                Ok(picked)
            }
        }
    }

    fn get_dependencies(
        &self,
        package: &Pkg,
        version: &Version,
    ) -> Result<Dependencies<Pkg, Ranges<Version>, String>, LockError> {
        self.dependencies(package, version)
    }
}

/// Run PubGrub. Must be called on a blocking thread of a tokio runtime.
pub(crate) fn solve(provider: &Provider) -> Result<Vec<Resolved>, LockError> {
    let root_version = Version::new([0u64]);
    let selection = match pubgrub::resolve(provider, Pkg::Root, root_version) {
        Ok(selection) => selection,
        Err(PubGrubError::NoSolution(mut tree)) => {
            tree.collapse_no_versions();
            let report = DefaultStringReporter::report(&tree);
            // A range whose listed versions had no usable wheel is the likeliest culprit.
            let in_tree = tree.packages();
            let unusable = provider.unusable.lock().unwrap().clone();
            for (package, range) in unusable {
                if !in_tree.contains(&Pkg::Dist(package.clone())) {
                    continue;
                }
                let rejected = provider.rejections(&package, &range);
                if !rejected.is_empty() {
                    return Err(LockError::NoCompatibleWheel {
                        package,
                        target: provider.target.describe(),
                        rejected,
                        report,
                    });
                }
            }
            return Err(LockError::NoSolution { report });
        }
        Err(PubGrubError::ErrorChoosingVersion { source, .. })
        | Err(PubGrubError::ErrorRetrievingDependencies { source, .. })
        | Err(PubGrubError::ErrorInShouldCancel(source)) => return Err(source),
    };

    let edges = provider.edges.lock().unwrap();
    let mut resolved: BTreeMap<PackageName, Resolved> = BTreeMap::new();
    for (package, version) in &selection {
        if let Pkg::Dist(name) = package {
            let candidate = provider.candidate(name, version).ok_or_else(|| {
                LockError::Internal(format!("selected {name} {version} has no candidate"))
            })?;
            resolved.insert(
                name.clone(),
                Resolved {
                    name: name.clone(),
                    version: version.clone(),
                    candidate,
                    requires: BTreeSet::new(),
                    required_by: BTreeSet::new(),
                },
            );
        }
    }
    for (package, version) in &selection {
        let Some(applied) = edges.get(&(package.clone(), version.clone())) else {
            continue;
        };
        let parent_label = match package {
            Pkg::Root => "<root>".to_string(),
            other => other.to_string(),
        };
        let owner = match package {
            Pkg::Dist(name) | Pkg::Extra(name, _) => Some(name.clone()),
            Pkg::Root => None,
        };
        for requirement in applied {
            if let Some(child) = resolved.get_mut(&requirement.name) {
                child.required_by.insert(parent_label.clone());
            }
            if let Some(owner) = &owner {
                if let Some(parent) = resolved.get_mut(owner) {
                    parent.requires.insert(requirement_label(requirement));
                }
            }
        }
    }
    Ok(resolved.into_values().collect())
}
