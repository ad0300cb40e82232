//! The SBOM's content, independent of its format: the packages (the image, what it
//! contains, what it was made from) and the relationships between them, derived once from
//! an [`SbomInput`] and written by [`super::spdx`] and [`super::cyclonedx`].

use std::collections::BTreeSet;

use packageurl::PackageUrl;

use super::cuda::{self, CudaComponent};
use super::license::valid_expression;
use super::{BuiltWheel, SbomInput};
use crate::audit::kernels::CoverageGroup;
use crate::digest::Digest;
use crate::lock::lockfile::{Artifact, ArtifactKind};
use crate::names::normalize_name;

/// The prefix of every cudastack fact in an SBOM (SPDX annotation comments, CycloneDX
/// property names).
pub const FACT_PREFIX: &str = "cudastack:";

/// What a package is to the image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The image itself: the root.
    Image,
    Deb,
    Wheel,
    /// A CUDA component placed in `/usr/local/cuda`, expanded from a wheel or redist archive.
    CudaComponent,
    /// An NVIDIA redist archive a CUDA component is expanded from (not in the image itself).
    RedistArchive,
    /// A `build:` sdist (not in the image).
    Sdist,
    /// The wheel compiled from an sdist.
    BuiltWheel,
    /// A wheel of the source builds' builder only.
    BuildWheel,
    /// A Debian package of the source builds' builder only.
    BuildDeb,
}

impl Role {
    /// The word the package's id starts with (SPDX ids allow letters, digits, `.` and `-`).
    pub fn id_word(self) -> &'static str {
        match self {
            Role::Image => "Image",
            Role::Deb => "Deb",
            Role::Wheel => "Wheel",
            Role::CudaComponent => "CUDA",
            Role::RedistArchive => "Redist",
            Role::Sdist => "Sdist",
            Role::BuiltWheel => "Built",
            Role::BuildWheel => "BuildWheel",
            Role::BuildDeb => "BuildDeb",
        }
    }

    /// Whether the image holds the package (the image CONTAINS it).
    pub fn in_image(self) -> bool {
        matches!(
            self,
            Role::Deb | Role::Wheel | Role::CudaComponent | Role::BuiltWheel
        )
    }
}

/// A cudastack fact about a package: `cudastack:<key>` = `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fact {
    pub key: &'static str,
    pub value: String,
}

/// One package of the SBOM.
#[derive(Debug, Clone)]
pub struct Package {
    /// Unique in the document: letters, digits, `.` and `-` only.
    pub id: String,
    pub role: Role,
    pub name: String,
    pub version: Option<String>,
    /// Of the file the lock pins; for a CUDA component, of the archive it was expanded from.
    pub sha256: Option<Digest>,
    /// The lock's URL; None for what was made here (the image, a built wheel).
    pub download: Option<String>,
    pub purl: Option<String>,
    /// A valid SPDX expression of license-list ids; None is NOASSERTION.
    pub license: Option<String>,
    /// `Organization: NVIDIA Corporation`.
    pub supplier: Option<String>,
    pub summary: Option<String>,
    pub facts: Vec<Fact>,
}

/// How two packages relate, in SPDX 2.3's words (`from` RELATION `to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Relation {
    /// The image holds the package.
    Contains,
    /// A CUDA component's files were taken from the wheel or archive.
    ExpandedFromArchive,
    /// A built wheel was compiled from the sdist.
    GeneratedFrom,
    /// A builder package was used to compile the built wheel.
    BuildDependencyOf,
}

impl Relation {
    pub fn spdx(self) -> &'static str {
        match self {
            Relation::Contains => "CONTAINS",
            Relation::ExpandedFromArchive => "EXPANDED_FROM_ARCHIVE",
            Relation::GeneratedFrom => "GENERATED_FROM",
            Relation::BuildDependencyOf => "BUILD_DEPENDENCY_OF",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub from: String,
    pub relation: Relation,
    pub to: String,
}

/// Everything the SBOM says. `packages[0]` is the image.
#[derive(Debug, Clone)]
pub struct Inventory {
    pub name: String,
    pub created: u64,
    pub packages: Vec<Package>,
    pub edges: Vec<Edge>,
}

const NVIDIA: &str = "Organization: NVIDIA Corporation";

impl Inventory {
    pub fn of(input: &SbomInput) -> Inventory {
        let mut lock = input.lock.clone();
        lock.canonicalize();
        let mut builder = Builder::default();
        builder.add(image_package(input));
        for artifact in &lock.artifacts {
            builder.add_artifact(input, artifact);
        }
        builder.add_builds(input, &lock.artifacts);
        builder.add_device_code(&input.claims.kernels);
        let Builder {
            packages,
            mut edges,
            ..
        } = builder;
        edges.sort();
        edges.dedup();
        Inventory {
            name: input.name.to_string(),
            created: input.created,
            packages,
            edges,
        }
    }

    pub fn image(&self) -> &Package {
        &self.packages[0]
    }
}

#[derive(Default)]
struct Builder {
    packages: Vec<Package>,
    edges: Vec<Edge>,
    ids: BTreeSet<String>,
}

impl Builder {
    /// Add `package` with an id unique in the document; the image contains what it holds.
    fn add(&mut self, mut package: Package) -> String {
        let base = package.id.clone();
        let mut n = 1;
        while !self.ids.insert(package.id.clone()) {
            n += 1;
            package.id = format!("{base}-{n}");
        }
        let id = package.id.clone();
        if package.role.in_image() {
            self.edge(
                &self
                    .packages
                    .first()
                    .map_or(String::new(), |p| p.id.clone()),
                Relation::Contains,
                &id,
            );
        }
        self.packages.push(package);
        id
    }

    fn edge(&mut self, from: &str, relation: Relation, to: &str) {
        self.edges.push(Edge {
            from: from.to_string(),
            relation,
            to: to.to_string(),
        });
    }

    fn add_artifact(&mut self, input: &SbomInput, artifact: &Artifact) {
        let role = match artifact.kind {
            ArtifactKind::Deb => Role::Deb,
            ArtifactKind::BuildDeb => Role::BuildDeb,
            ArtifactKind::Wheel => Role::Wheel,
            ArtifactKind::BuildWheel => Role::BuildWheel,
            ArtifactKind::RedistArchive => Role::RedistArchive,
            // Added with the wheel built from it (`add_builds`).
            ArtifactKind::Sdist => return,
        };
        let package = artifact_package(input, artifact, role);
        let id = self.add(package);
        let component = match artifact.kind {
            ArtifactKind::Wheel => cuda::wheel_stem(&artifact.name)
                .map(|stem| (stem.to_string(), cuda::by_wheel_stem(stem))),
            ArtifactKind::RedistArchive => {
                Some((artifact.name.clone(), cuda::by_redist(&artifact.name)))
            }
            _ => None,
        };
        if let Some((fallback, known)) = component {
            let package = component_package(artifact, &fallback, known);
            let component = self.add(package);
            self.edge(&component, Relation::ExpandedFromArchive, &id);
        }
    }

    /// Each sdist with the wheel built from it, and the builder's packages as build
    /// dependencies of every built wheel (one builder serves all of them).
    fn add_builds(&mut self, input: &SbomInput, artifacts: &[Artifact]) {
        let builder_ids: Vec<String> = self
            .packages
            .iter()
            .filter(|p| matches!(p.role, Role::BuildWheel | Role::BuildDeb))
            .map(|p| p.id.clone())
            .collect();
        let sdists: Vec<&Artifact> = artifacts
            .iter()
            .filter(|a| a.kind == ArtifactKind::Sdist)
            .collect();
        let mut built: Vec<(Option<&BuiltWheel>, Option<&Artifact>)> = sdists
            .iter()
            .map(|sdist| {
                let wheel = input.built.iter().find(|b| b.name == sdist.name);
                (wheel, Some(*sdist))
            })
            .collect();
        built.extend(
            input
                .built
                .iter()
                .filter(|b| !sdists.iter().any(|s| s.name == b.name))
                .map(|b| (Some(b), None)),
        );
        for (wheel, sdist) in built {
            let sdist_id = sdist.map(|s| self.add(artifact_package(input, s, Role::Sdist)));
            let license = sdist
                .and_then(|s| (input.licenses)(s))
                .and_then(|l| valid_expression(&l));
            let built_id = self.add(built_package(wheel, sdist, license));
            if let Some(sdist_id) = sdist_id {
                self.edge(&built_id, Relation::GeneratedFrom, &sdist_id);
                for dependency in &builder_ids {
                    self.edge(dependency, Relation::BuildDependencyOf, &built_id);
                }
            }
        }
    }

    /// Each library with device code, as a fact of the package it belongs to (the image
    /// when none is found).
    fn add_device_code(&mut self, groups: &[CoverageGroup]) {
        for group in groups {
            for library in &group.libraries {
                let path = library.to_string_lossy();
                let owner = self.owner_of(&path);
                self.packages[owner].facts.push(Fact {
                    key: "device-code",
                    value: format!(
                        "{path}: SASS {}; PTX {}",
                        group.sass_text(),
                        group.ptx_text()
                    ),
                });
            }
        }
    }

    /// The package a library of the image belongs to: the CUDA component its file name
    /// names, else the wheel or built wheel of its `site-packages/<top>/` directory, else
    /// the image (index 0).
    fn owner_of(&self, path: &str) -> usize {
        let file_name = path.rsplit('/').next().unwrap_or(path);
        if let Some(component) = cuda::by_library(file_name) {
            let found = self
                .packages
                .iter()
                .position(|p| p.role == Role::CudaComponent && p.name == component.name);
            if let Some(index) = found {
                return index;
            }
        }
        let top = ["/site-packages/", "/dist-packages/"]
            .iter()
            .find_map(|marker| path.split_once(marker))
            .and_then(|(_, rest)| rest.split('/').next())
            .map(normalize_name);
        top.and_then(|top| {
            self.packages.iter().position(|p| {
                matches!(p.role, Role::Wheel | Role::BuiltWheel) && normalize_name(&p.name) == top
            })
        })
        .unwrap_or(0)
    }
}

/// `text` with every character SPDX ids do not allow replaced by `-`.
fn id_part(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn package_id(role: Role, name: &str, version: Option<&str>) -> String {
    match version {
        Some(version) => format!("{}-{}-{}", role.id_word(), id_part(name), id_part(version)),
        None => format!("{}-{}", role.id_word(), id_part(name)),
    }
}

/// The root package: the image, with the GPU facts of its config.
fn image_package(input: &SbomInput) -> Package {
    let claims = input.claims;
    let mut facts = Vec::new();
    let mut fact = |key: &'static str, value: Option<String>| {
        if let Some(value) = value.filter(|v| !v.is_empty()) {
            facts.push(Fact { key, value });
        }
    };
    let sm_list = |list: &[crate::version::ComputeCapability]| {
        Some(list.iter().map(|cc| cc.sm()).collect::<Vec<_>>().join(" "))
    };
    fact("recipe", claims.recipe.clone());
    fact(
        "platform",
        Some(format!(
            "linux/{}",
            input.lock.target.arch.oci_architecture()
        )),
    );
    fact("python", Some(input.lock.target.python.to_string()));
    fact(
        "driver-floor",
        claims.driver_floor.as_ref().map(ToString::to_string),
    );
    fact("cuda", claims.cuda.clone());
    fact(
        "require-cuda",
        claims.require_cuda.as_ref().map(ToString::to_string),
    );
    fact("cudnn", claims.cudnn.clone());
    fact("torch", claims.torch.clone());
    for target in input.targets {
        fact("target-gpu", Some(target.label()));
    }
    fact("torch-sm", sm_list(&claims.sm));
    fact("covered-sm", sm_list(&claims.covered_sm));
    fact("kernels-unreadable", claims.kernels_unreadable.clone());
    Package {
        id: "Image".to_string(),
        role: Role::Image,
        name: input.name.to_string(),
        version: None,
        sha256: input.image,
        download: None,
        purl: input
            .image
            .as_ref()
            .and_then(|digest| oci_purl(input.name, digest)),
        license: None,
        supplier: None,
        summary: Some("Container image built by cudastack".to_string()),
        facts,
    }
}

/// `pkg:oci/<name>@sha256:...?tag=<tag>` (purl-spec `oci`: the last path segment of the
/// repository, lowercased).
fn oci_purl(reference: &str, digest: &Digest) -> Option<String> {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    let (name, tag) = match last.split_once(':') {
        Some((name, tag)) => (name, Some(tag)),
        None => (last, None),
    };
    let mut purl = PackageUrl::new("oci", name.to_ascii_lowercase()).ok()?;
    purl.with_version(digest.to_string()).ok()?;
    if let Some(tag) = tag.filter(|t| !t.is_empty()) {
        purl.add_qualifier("tag", tag.to_string()).ok()?;
    }
    Some(purl.to_string())
}

/// A package URL for a lock artifact: `pkg:deb/debian/NAME@VERSION?arch=...&distro=...`
/// or `pkg:pypi/NAME@VERSION`; None for an NVIDIA redist archive (purl has no type for it).
fn artifact_purl(artifact: &Artifact) -> Option<String> {
    let purl = match artifact.kind {
        ArtifactKind::Deb | ArtifactKind::BuildDeb => {
            let mut purl = PackageUrl::new("deb", artifact.name.clone()).ok()?;
            purl.with_namespace(deb_vendor(artifact)).ok()?;
            purl.with_version(artifact.version.clone()).ok()?;
            if let Some(arch) = &artifact.platform {
                purl.add_qualifier("arch", arch.clone()).ok()?;
            }
            if let Some(suite) = &artifact.suite {
                let codename = suite.split('-').next().unwrap_or(suite);
                purl.add_qualifier("distro", codename.to_string()).ok()?;
            }
            purl
        }
        // Not on PyPI: a `pkg:pypi` of its name would match an unrelated project there.
        // A git requirement names its repository and commit; a local project, nothing.
        ArtifactKind::Sdist if artifact.is_project() => return None,
        ArtifactKind::Sdist if artifact.is_git() => {
            let mut purl = PackageUrl::new("generic", normalize_name(&artifact.name)).ok()?;
            purl.with_version(artifact.version.clone()).ok()?;
            let url = artifact.url.to_string();
            purl.add_qualifier("vcs_url", url).ok()?;
            purl
        }
        ArtifactKind::Wheel | ArtifactKind::BuildWheel | ArtifactKind::Sdist => {
            let mut purl = PackageUrl::new("pypi", normalize_name(&artifact.name)).ok()?;
            purl.with_version(artifact.version.clone()).ok()?;
            purl.add_qualifier("file_name", artifact.filename.to_string())
                .ok()?;
            purl
        }
        ArtifactKind::RedistArchive => return None,
    };
    Some(purl.to_string())
}

/// `ubuntu` for a deb from an Ubuntu archive, else `debian` (the lock's `source` is the
/// archive's URL).
fn deb_vendor(artifact: &Artifact) -> &'static str {
    if artifact.source.contains("ubuntu") {
        "ubuntu"
    } else {
        "debian"
    }
}

fn artifact_package(input: &SbomInput, artifact: &Artifact, role: Role) -> Package {
    let supplier = match artifact.kind {
        ArtifactKind::Deb | ArtifactKind::BuildDeb => Some(match deb_vendor(artifact) {
            "ubuntu" => "Organization: Ubuntu".to_string(),
            _ => "Organization: Debian".to_string(),
        }),
        ArtifactKind::RedistArchive => Some(NVIDIA.to_string()),
        _ if artifact.name.starts_with("nvidia-") => Some(NVIDIA.to_string()),
        _ => None,
    };
    let mut facts = Vec::new();
    if let Some(layer) = artifact.layer {
        let layer = match layer {
            crate::lock::lockfile::DebLayer::Base => "base",
            crate::lock::lockfile::DebLayer::Apt => "apt",
        };
        facts.push(Fact {
            key: "layer",
            value: layer.to_string(),
        });
    }
    Package {
        id: package_id(role, &artifact.name, Some(&artifact.version)),
        role,
        name: artifact.name.clone(),
        version: Some(artifact.version.clone()),
        sha256: Some(artifact.sha256),
        download: Some(artifact.url.to_string()),
        purl: artifact_purl(artifact),
        license: (input.licenses)(artifact).and_then(|l| valid_expression(&l)),
        supplier,
        summary: None,
        facts,
    }
}

/// The CUDA component expanded from `artifact` (an nvidia-* wheel or a redist archive):
/// its version and sha256 are the artifact's.
fn component_package(
    artifact: &Artifact,
    fallback: &str,
    known: Option<&CudaComponent>,
) -> Package {
    let name = known.map_or(fallback, |c| c.name);
    let mut facts = vec![Fact {
        key: "cuda-component",
        value: known.map_or(fallback, |c| c.redist).to_string(),
    }];
    facts.push(Fact {
        key: "expanded-from",
        value: artifact.filename.to_string(),
    });
    Package {
        id: package_id(Role::CudaComponent, name, Some(&artifact.version)),
        role: Role::CudaComponent,
        name: name.to_string(),
        version: Some(artifact.version.clone()),
        sha256: Some(artifact.sha256),
        download: Some(artifact.url.to_string()),
        purl: None,
        license: None,
        supplier: Some(NVIDIA.to_string()),
        summary: Some(format!(
            "CUDA component placed in /usr/local/cuda from {}",
            &*artifact.filename
        )),
        facts,
    }
}

/// The wheel compiled from `sdist` (and recorded as `wheel` by the image's labels).
fn built_package(
    wheel: Option<&BuiltWheel>,
    sdist: Option<&Artifact>,
    license: Option<String>,
) -> Package {
    let name = wheel
        .map(|w| w.name.clone())
        .or_else(|| sdist.map(|s| s.name.clone()))
        .unwrap_or_default();
    let version = wheel
        .map(|w| w.version.clone())
        .or_else(|| sdist.map(|s| s.version.clone()));
    let purl = version.as_ref().and_then(|version| {
        let mut purl = PackageUrl::new("pypi", normalize_name(&name)).ok()?;
        purl.with_version(version.clone()).ok()?;
        if let Some(wheel) = wheel {
            purl.add_qualifier("file_name", wheel.filename.clone())
                .ok()?;
        }
        Some(purl.to_string())
    });
    let mut facts = Vec::new();
    if let Some(wheel) = wheel {
        facts.push(Fact {
            key: "built-wheel",
            value: wheel.filename.clone(),
        });
    }
    Package {
        id: package_id(Role::BuiltWheel, &name, version.as_deref()),
        role: Role::BuiltWheel,
        summary: Some(match sdist {
            Some(sdist) => format!("Wheel compiled by cudastack from {}", &*sdist.filename),
            None => "Wheel compiled by cudastack".to_string(),
        }),
        name,
        version,
        sha256: wheel.map(|w| w.sha256),
        download: None,
        purl,
        license,
        supplier: None,
        facts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::target::Target;
    use crate::platform::Platform;
    use crate::verify::check::ImageClaims;

    fn redist(name: &str, version: &str) -> Artifact {
        Artifact {
            kind: ArtifactKind::RedistArchive,
            name: name.into(),
            version: version.into(),
            filename: "archive.tar.xz".parse().unwrap(),
            url: "https://developer.download.nvidia.com/compute/cuda/redist/x.tar.xz"
                .parse()
                .unwrap(),
            sha256: Digest::of_bytes(name.as_bytes()),
            size: 1,
            source:
                "https://developer.download.nvidia.com/compute/cuda/redist/redistrib_12.1.1.json"
                    .into(),
            platform: Some("linux-x86_64".into()),
            variant: None,
            requires: vec![],
            required_by: vec![],
            suite: None,
            component: None,
            fallback_url: None,
            layer: None,
        }
    }

    /// Redist names are not checked by the lock: ids stay in SPDX's alphabet and unique
    /// whatever they are, and a known archive becomes its component.
    #[test]
    fn ids_are_unique_and_in_the_spdx_alphabet_whatever_the_names() {
        let lock = crate::lock::lockfile::Lockfile {
            as_of: None,
            lock_format: crate::lock::lockfile::LOCK_FORMAT_VERSION,
            recipe_digest: Digest::of_bytes(b"recipe"),
            target: Target::new(
                "3.11".parse().unwrap(),
                Platform::LinuxAmd64,
                "2.36".parse().unwrap(),
            )
            .unwrap(),
            requirements: vec![],
            artifacts: vec![
                redist("a b", "1:2"),
                redist("a-b", "1-2"),
                redist("ünï/../cödé", "1"),
                redist("cudnn", "9.1.0.70"),
            ],
        };
        let claims = ImageClaims::default();
        let input = SbomInput {
            name: "",
            image: None,
            lock: &lock,
            claims: &claims,
            built: &[],
            targets: &[],
            created: 0,
            licenses: &|_| Some("not an expression".into()),
        };
        let inventory = Inventory::of(&input);
        let ids: BTreeSet<&str> = inventory.packages.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids.len(), inventory.packages.len(), "{ids:?}");
        for id in &ids {
            assert!(
                id.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-.".contains(c)),
                "{id}"
            );
        }
        assert!(inventory.packages.iter().all(|p| p.license.is_none()));
        let cudnn = inventory
            .packages
            .iter()
            .find(|p| p.role == Role::CudaComponent && p.name == "cuDNN")
            .unwrap();
        assert!(inventory.edges.contains(&Edge {
            from: cudnn.id.clone(),
            relation: Relation::ExpandedFromArchive,
            to: "Redist-cudnn-9.1.0.70".into(),
        }));
        // The archives are not in the image; their components are.
        let contained: Vec<&str> = inventory
            .edges
            .iter()
            .filter(|e| e.relation == Relation::Contains)
            .map(|e| e.to.as_str())
            .collect();
        assert_eq!(contained.len(), 4);
        assert!(contained.iter().all(|id| id.starts_with("CUDA-")));
        // An empty image name is still a document the summary reads back.
        let summary = super::super::Summary::of_spdx(&super::super::spdx_json(&input)).unwrap();
        assert_eq!(summary.cuda.len(), 4);
    }
}
