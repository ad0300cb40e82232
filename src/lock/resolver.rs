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
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use futures_util::future::join_all;
use pep440_rs::{Operator, Version, VersionSpecifier, VersionSpecifiers};
use pep508_rs::{ExtraName, MarkerEnvironment, PackageName, Requirement, VersionOrUrl};
use pubgrub::{
    DefaultStringReporter, Dependencies, DependencyConstraints, DependencyProvider,
    PackageResolutionStatistics, PubGrubError, Ranges, Reporter,
};

use crate::digest::Digest;
use crate::fetch::file_name::FileName;
use crate::fetch::index::DistFile;
use crate::fetch::metadata::Metadata;
use crate::fetch::source::PackageSource;
use crate::lock::python_inputs::{Constraints, HashPin};
use crate::lock::sdist::{sdist_version, SdistInfo};
use crate::lock::target::{TagPriorities, Target};
use crate::lock::LockError;

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

/// The file chosen for one version of a package: its best wheel, or the sdist the
/// recipe's `build:` compiles.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub file: DistFile,
    pub source: usize,
    /// The file is an sdist of `build:` (src/lock/sdist.rs), not a wheel.
    pub source_build: bool,
}

/// What one source offers for one package, reduced to the best wheel per version.
#[derive(Debug)]
struct Project {
    source: usize,
    versions: BTreeMap<Version, Candidate>,
    /// Versions listed but without a usable wheel, with the reason (for error messages).
    rejected: BTreeMap<Version, String>,
    /// Versions whose fitting wheels all have a sha256 the inputs do not list: the wheel
    /// the target would take, with its sha256 (None when the index gives none).
    hash_rejected: BTreeMap<Version, (FileName, Option<Digest>)>,
    /// Versions published as a source distribution and no wheel at all.
    sdist_only: BTreeMap<Version, FileName>,
    /// Every version's source distribution, for the hint of a version without a wheel
    /// that fits: `build:` can compile it.
    sdists: BTreeMap<Version, FileName>,
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
    /// Version constraints (`-c`), intersected into every requirement on the package.
    constraints: HashMap<PackageName, Ranges<Version>>,
    /// The only sha256 a package's file may have (`--hash`, an imported lock).
    hashes: BTreeMap<PackageName, HashPin>,
    /// Ranges that had versions only refused by their hashes, or only as sdists.
    hash_misses: Mutex<Vec<(PackageName, Ranges<Version>)>>,
    sdist_misses: Mutex<Vec<(PackageName, Ranges<Version>)>>,
}

fn range_of(requirement: &Requirement) -> Result<Ranges<Version>, LockError> {
    match &requirement.version_or_url {
        None => Ok(Ranges::full()),
        Some(VersionOrUrl::VersionSpecifier(specifiers)) => Ok(pep440_ranges(specifiers)),
        Some(VersionOrUrl::Url(_)) => Err(LockError::UrlRequirement {
            requirement: requirement.to_string(),
        }),
    }
}

/// The versions `specifiers` admit, by PEP 440: pep440_rs 0.7 makes `==V` the single
/// version V, but "if the specified version identifier is a public version identifier (no
/// local version label), then the local version label of any candidate versions MUST be
/// ignored", so `torch==2.5.1` must admit `2.5.1+cu118`; the same holds for `!=V` and `<=V`.
pub(crate) fn pep440_ranges(specifiers: &VersionSpecifiers) -> Ranges<Version> {
    specifiers.iter().fold(Ranges::full(), |range, specifier| {
        range.intersection(&specifier_range(specifier))
    })
}

fn specifier_range(specifier: &VersionSpecifier) -> Ranges<Version> {
    let version = specifier.version();
    let with_locals = || {
        local_bound(version).map_or_else(
            || Ranges::singleton(version.clone()),
            |bound| Ranges::from_range_bounds(version.clone()..bound),
        )
    };
    match specifier.operator() {
        Operator::Equal if !version.is_local() => with_locals(),
        Operator::NotEqual if !version.is_local() => with_locals().complement(),
        Operator::LessThanEqual if !version.is_local() => {
            Ranges::strictly_lower_than(version.clone()).union(&with_locals())
        }
        _ => Ranges::from(specifier.clone()),
    }
}

/// `report` with each `>=V, <B` that is `==V` ([`pep440_ranges`]: V and its local versions)
/// written `V`, as PubGrub writes a single version.
fn exact_pins_by_name(report: &str) -> String {
    static PAIR: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r">=([^\s,|]+), <([^\s,|]+)").expect("a valid regex")
    });
    PAIR.replace_all(report, |captures: &regex::Captures| {
        let (low, high) = (&captures[1], &captures[2]);
        // A sentence may end right after the bound.
        let (high, stop) = match high.strip_suffix('.') {
            Some(high) => (high, "."),
            None => (high, ""),
        };
        match (low.parse::<Version>(), high.parse::<Version>()) {
            (Ok(v), Ok(bound)) if local_bound(&v).as_ref() == Some(&bound) => {
                format!("{low}{stop}")
            }
            _ => captures[0].to_string(),
        }
    })
    .into_owned()
}

/// The V of a range that is an exact pin: `==V+local` (V alone) or `==V` (V and its locals),
/// where pip takes a yanked file.
fn exact_pin(range: &Ranges<Version>) -> Option<&Version> {
    if let Some(version) = range.as_singleton() {
        return Some(version);
    }
    let mut segments = range.iter();
    match (segments.next(), segments.next()) {
        (Some((Bound::Included(low), Bound::Excluded(high))), None)
            if local_bound(low).as_ref() == Some(high) =>
        {
            Some(low)
        }
        _ => None,
    }
}

/// The least version above `version` and all its local versions (`V+anything`): the next
/// dev number, else the `.dev0` of the next post release (pep440_rs orders a version's
/// locals right after it, before any other version).
fn local_bound(version: &Version) -> Option<Version> {
    if let Some(dev) = version.dev() {
        return Some(version.clone().with_dev(Some(dev.checked_add(1)?)));
    }
    let post = match version.post() {
        Some(post) => post.checked_add(1)?,
        None => 0,
    };
    Some(version.clone().with_post(Some(post)).with_dev(Some(0)))
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
        constraints: &Constraints,
    ) -> Self {
        let env = target.marker_environment();
        let mut ranges: HashMap<PackageName, Ranges<Version>> = HashMap::new();
        for sourced in &constraints.versions {
            let requirement = &sourced.requirement;
            if !requirement.evaluate_markers(&env, &[]) {
                continue;
            }
            if let Some(VersionOrUrl::VersionSpecifier(specifiers)) = &requirement.version_or_url {
                let entry = ranges
                    .entry(requirement.name.clone())
                    .or_insert_with(Ranges::full);
                *entry = entry.intersection(&pep440_ranges(specifiers));
            }
        }
        Provider {
            handle,
            env,
            constraints: ranges,
            hashes: constraints.hashes.clone(),
            hash_misses: Mutex::new(Vec::new()),
            sdist_misses: Mutex::new(Vec::new()),
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
            let project = Arc::new(self.reduce(name, index, tags, &page.files));
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
    fn reduce(
        &self,
        name: &PackageName,
        source: usize,
        tags: &TagPriorities,
        files: &[DistFile],
    ) -> Project {
        let mut best: BTreeMap<Version, (bool, usize, Option<u64>, Candidate)> = BTreeMap::new();
        let mut seen_tags: BTreeMap<Version, BTreeSet<String>> = BTreeMap::new();
        let mut python_rejected: BTreeMap<Version, String> = BTreeMap::new();
        let mut hash_rejected = BTreeMap::new();
        let mut sdists = BTreeMap::new();
        let allowed = self.hashes.get(name);
        for file in files {
            let Some(wheel) = file.wheel() else {
                if let Some(version) = sdist_version(&file.filename) {
                    sdists.insert(version, file.filename.clone());
                }
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
            if let Some(pin) = allowed {
                if !file
                    .sha256
                    .is_some_and(|sha256| pin.sha256.contains(&sha256))
                {
                    hash_rejected
                        .entry(wheel.version.clone())
                        .or_insert((file.filename.clone(), file.sha256));
                    continue;
                }
            }
            // Order: not yanked, best tag, highest build number.
            let key = (
                file.yanked,
                rank,
                wheel.build.as_ref().map(|b| u64::MAX - b.number),
            );
            let candidate = Candidate {
                file: file.clone(),
                source,
                source_build: false,
            };
            match best.get(&wheel.version) {
                Some((yanked, rank, build, _)) if (*yanked, *rank, *build) <= key => {}
                _ => {
                    best.insert(wheel.version.clone(), (key.0, key.1, key.2, candidate));
                }
            }
        }
        let mut rejected = BTreeMap::new();
        hash_rejected.retain(|version, _| !best.contains_key(version));
        let sdist_only = sdists
            .iter()
            .filter(|(version, _)| !seen_tags.contains_key(*version))
            .map(|(version, file)| (version.clone(), file.clone()))
            .collect();
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
            hash_rejected,
            sdist_only,
            sdists,
        }
    }

    /// This provider with the sdists of the recipe's `build:` as the only version of their
    /// packages, with the run requirements the lock read for them (src/lock/sdist.rs).
    pub(crate) fn with_source_builds(self, builds: &[SdistInfo]) -> Self {
        {
            let mut projects = self.projects.lock().unwrap();
            let mut metadata = self.metadata.lock().unwrap();
            for build in builds {
                let candidate = Candidate {
                    file: build.file.clone(),
                    source: build.source,
                    source_build: true,
                };
                let project = Project {
                    source: build.source,
                    versions: BTreeMap::from([(build.version.clone(), candidate)]),
                    rejected: BTreeMap::new(),
                    hash_rejected: BTreeMap::new(),
                    sdist_only: BTreeMap::new(),
                    sdists: BTreeMap::new(),
                };
                projects.insert(build.name.clone(), Arc::new(project));
                metadata.insert(
                    (build.name.clone(), build.version.clone()),
                    Arc::new(build.metadata.clone()),
                );
            }
        }
        self
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
        let exact = exact_pin(range);
        let usable = |(version, candidate): &(&Version, &Candidate)| {
            range.contains(version)
                && (!candidate.file.yanked
                    || exact
                        .is_some_and(|e| e == *version || *e == (*version).clone().without_local()))
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
            let mut range = range_of(requirement)?;
            if let Some(constraint) = self.constraints.get(&requirement.name) {
                range = range.intersection(constraint);
            }
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

    /// The hint of a package whose versions in `range` have no wheel for the target but
    /// an sdist: the `build:` entry that compiles the newest; empty otherwise.
    fn build_hint(&self, package: &PackageName, range: &Ranges<Version>) -> String {
        let projects = self.projects.lock().unwrap();
        let Some((version, file)) = projects.get(package).and_then(|project| {
            project.sdists.iter().rev().find(|(version, _)| {
                range.contains(version) && project.rejected.contains_key(*version)
            })
        }) else {
            return String::new();
        };
        format!("\n  hint: `{package}` {version} also has a source distribution (`{file}`): add `build: [{{package: {package}, version: \"{version}\"}}]` to the recipe to compile it for {} and the recipe's `gpus:` (docs/source-builds.md)", self.target.describe())
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
                if picked.is_none() {
                    let miss = (name.clone(), range.clone());
                    if project.rejected.keys().any(|v| range.contains(v)) {
                        self.unusable.lock().unwrap().push(miss.clone());
                    }
                    if project.hash_rejected.keys().any(|v| range.contains(v)) {
                        self.hash_misses.lock().unwrap().push(miss.clone());
                    }
                    if project.sdist_only.keys().any(|v| range.contains(v)) {
                        self.sdist_misses.lock().unwrap().push(miss);
                    }
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
            let report = readable(&DefaultStringReporter::report(&tree));
            let in_tree = tree.packages();
            let named = |name: &PackageName| in_tree.contains(&Pkg::Dist(name.clone()));
            if let Some(error) = provider.explain_miss(&named, &report) {
                return Err(error);
            }
            // A range whose listed versions had no usable wheel is the likeliest culprit.
            let unusable = provider.unusable.lock().unwrap().clone();
            for (package, range) in unusable {
                if !in_tree.contains(&Pkg::Dist(package.clone())) {
                    continue;
                }
                let rejected = provider.rejections(&package, &range);
                if !rejected.is_empty() {
                    let hint = provider.build_hint(&package, &range);
                    return Err(LockError::NoCompatibleWheel {
                        package,
                        target: provider.target.describe(),
                        rejected,
                        hint,
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

impl Provider {
    /// A failed resolution that an input's hashes or an sdist-only release explain better
    /// than PubGrub's derivation: the newest such version in a range the tree names.
    fn explain_miss(
        &self,
        in_tree: &dyn Fn(&PackageName) -> bool,
        report: &str,
    ) -> Option<LockError> {
        let projects = self.projects.lock().unwrap();
        let newest = |misses: &Mutex<Vec<(PackageName, Ranges<Version>)>>, hash: bool| {
            misses.lock().unwrap().iter().find_map(|(name, range)| {
                if !in_tree(name) {
                    return None;
                }
                let project = projects.get(name)?;
                if hash {
                    let (version, found) = project
                        .hash_rejected
                        .iter()
                        .rev()
                        .find(|(v, _)| range.contains(v))?;
                    Some((name.clone(), version.clone(), found.0.clone(), found.1))
                } else {
                    let (version, file) = project
                        .sdist_only
                        .iter()
                        .rev()
                        .find(|(v, _)| range.contains(v))?;
                    Some((name.clone(), version.clone(), file.clone(), None))
                }
            })
        };
        if let Some((package, version, filename, found)) = newest(&self.hash_misses, true) {
            let pin = self.hashes.get(&package)?;
            return Some(LockError::HashMismatch {
                origin: pin.origin.to_string(),
                package,
                version,
                expected: pin.sha256.iter().map(ToString::to_string).collect(),
                found: format!(
                    "{} ({filename})",
                    found.map_or("no sha256 on the index".to_string(), |d| d.to_string())
                ),
            });
        }
        let (package, version, filename, _) = newest(&self.sdist_misses, false)?;
        Some(LockError::SdistOnly {
            package,
            version,
            filename: filename.to_string(),
            report: report.to_string(),
        })
    }
}

/// PubGrub's report with its root package named as the user knows it: `<root> 0` is the
/// recipe (its `packages:`, its input files and the stack's own requirements).
fn readable(report: &str) -> String {
    exact_pins_by_name(report)
        .replace("<root> 0 is forbidden", "the recipe cannot be locked")
        .replace("<root> 0, ", "the recipe and ")
        .replace("<root> 0 depends on", "the recipe asks for")
        .replace("<root> 0", "the recipe")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_name_the_recipe() {
        let pubgrub = "Because torchvision 0.20.1 depends on torch 2.5.1 and <root> 0 depends on torch 2.4.1, <root> 0, torchvision 0.20.1 are incompatible.\nAnd because <root> 0 depends on torchvision 0.20.1, <root> 0 is forbidden.";
        assert_eq!(
            readable(pubgrub),
            "Because torchvision 0.20.1 depends on torch 2.5.1 and the recipe asks for torch 2.4.1, the recipe and torchvision 0.20.1 are incompatible.\nAnd because the recipe asks for torchvision 0.20.1, the recipe cannot be locked."
        );
    }

    /// PEP 440: `==V` and `<=V` admit V's local versions, `!=V` refuses them; a pin with a
    /// local label, `<V` and `>V` do not admit them.
    #[test]
    fn exact_pins_admit_local_versions() {
        let admits = |spec: &str, version: &str| {
            pep440_ranges(&spec.parse().unwrap()).contains(&version.parse::<Version>().unwrap())
        };
        for version in [
            "2.5.1",
            "2.5.1+cu118",
            "2.5.1+cu118.1",
            "2.5.1+zzz",
            "2.5.1+999999999",
        ] {
            assert!(admits("==2.5.1", version), "==2.5.1 {version}");
            assert!(admits("<=2.5.1", version), "<=2.5.1 {version}");
            assert!(admits(">=2.0,==2.5.1", version), "{version}");
            assert!(!admits("!=2.5.1", version), "!=2.5.1 {version}");
            assert!(!admits(">2.5.1", version), ">2.5.1 {version}");
            assert!(!admits("<2.5.1", version), "<2.5.1 {version}");
        }
        for version in [
            "2.5.1.post0.dev0",
            "2.5.1.post0",
            "2.5.1.post1+cu118",
            "2.5.2",
            "2.5.1rc1",
            "2.5.1.dev0",
            "2.5.0+cu118",
            "1!2.5.1",
        ] {
            assert!(!admits("==2.5.1", version), "==2.5.1 {version}");
            assert!(admits("!=2.5.1", version), "!=2.5.1 {version}");
        }
        assert!(admits("==2.5.1+cu118", "2.5.1+cu118"));
        assert!(!admits("==2.5.1+cu118", "2.5.1+cu121"));
        assert!(!admits("==2.5.1+cu118", "2.5.1"));
        // Pre, post and dev releases keep their own locals, and only theirs.
        assert!(admits("==2.0rc1", "2.0rc1+local"));
        assert!(!admits("==2.0rc1", "2.0rc1.post0.dev0"));
        assert!(admits("==1.0.post2", "1.0.post2+local"));
        assert!(!admits("==1.0.post2", "1.0.post3.dev0"));
        assert!(admits("==1.0.dev3", "1.0.dev3+local"));
        assert!(!admits("==1.0.dev3", "1.0.dev4"));
        assert!(admits("==1!2.5.1", "1!2.5.1+cu118"));
        assert!(!admits("==1!2.5.1", "2.5.1+cu118"));
    }

    #[test]
    fn exact_pins_are_recognised_for_yanked_files() {
        let pin = |spec: &str| pep440_ranges(&spec.parse().unwrap());
        let v = |text: &str| text.parse::<Version>().unwrap();
        assert_eq!(exact_pin(&pin("==2.5.1")), Some(&v("2.5.1")));
        assert_eq!(exact_pin(&pin("==2.5.1+cu118")), Some(&v("2.5.1+cu118")));
        assert_eq!(exact_pin(&pin(">=2.0,==2.5.1")), Some(&v("2.5.1")));
        assert_eq!(exact_pin(&pin(">=2.5.1,<2.5.2")), None);
        assert_eq!(exact_pin(&pin("<=2.5.1")), None);
    }

    #[test]
    fn reports_write_exact_pins_as_versions() {
        let pubgrub = "Because torchvision >=0.20.1, <0.20.1.post0.dev0 depends on torch >=2.5.1, <2.5.1.post0.dev0 and <root> 0 depends on torch >=2.4.1, <2.4.1.post0.dev0.\nAnd x >=1.0, <2.0 | >=3.0.dev2, <3.0.dev3, y >=1.0rc1, <1.0rc1.post0.dev0";
        assert_eq!(
            readable(pubgrub),
            "Because torchvision 0.20.1 depends on torch 2.5.1 and the recipe asks for torch 2.4.1.\nAnd x >=1.0, <2.0 | 3.0.dev2, y 1.0rc1"
        );
    }
}
