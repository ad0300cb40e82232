//! `cudastack matrix refresh`: derive the torch rows of the matrix from PyPI itself.
//!
//! For every torch release since 2.0.0 it reads the PEP 691 file list, picks the linux
//! x86_64 wheels (their Python tags and manylinux level), reads one wheel's METADATA
//! (PEP 658 or a range read of the wheel) for the exact `==` pins (nvidia-cudnn-cu12,
//! nvidia-cuda-runtime-cu12, cuda-toolkit[...] from 2.11 on, nccl, triton), resolves the
//! cuda-toolkit metapackage's runtime pin, and scans `torch/lib/libtorch_python.so` in the
//! wheel for the compiled arch list (the string `torch.cuda.get_arch_list()` returns),
//! streaming the member through a range read instead of downloading the whole wheel.
//! A row whose wheel digest is unchanged keeps its scanned arch list, so a refresh only
//! reads what is new. The result is written with sorted keys, so reruns of a day are
//! byte-stable. Where it is written is the CLI's choice: the cache for users (see
//! [`super::source`]), data/torch-pypi.json for contributors.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use pep440_rs::{Operator, Version};
use pep508_rs::{ExtraName, MarkerEnvironment, Requirement, VersionOrUrl};
use regex::bytes::Regex;

use super::source::Date;
use super::{Status, TorchBuild, TorchPypiData};
use crate::fetch::index::{DistFile, SimpleIndex};
use crate::fetch::metadata::wheel_metadata;
use crate::fetch::remote_zip::RemoteZip;
use crate::names::{PackageName, WheelFilename};
use crate::version::{ComputeCapability, CudaVersion, CudnnVersion, PythonVersion};

/// The member of a torch wheel whose read-only data holds the CUDA arch list.
pub const ARCH_MEMBER: &str = "torch/lib/libtorch_python.so";

#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("failed to read the torch index `{url}`")]
    Index {
        url: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("failed to read the METADATA of `{filename}`")]
    Metadata {
        filename: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("failed to scan `{member}` in `{filename}` for its CUDA arch list")]
    ArchScan {
        filename: String,
        member: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("torch {version}: {message}")]
    Derive { version: String, message: String },
}

/// What refresh needs from a package index. Implemented over the PyPI client in
/// `fetch::pypi`; tests implement it over a local fixture index.
#[allow(async_fn_in_trait)]
pub trait TorchSource {
    /// Every file of `project` (PEP 691 `files`).
    async fn files(&self, project: &str) -> Result<Vec<DistFile>, RefreshError>;
    /// The wheel's METADATA text.
    async fn metadata(&self, file: &DistFile) -> Result<String, RefreshError>;
    /// Feed the bytes of one member of a remote wheel to `scanner` (streaming).
    async fn scan_member(
        &self,
        file: &DistFile,
        member: &str,
        scanner: &mut ArchScanner,
    ) -> Result<(), RefreshError>;
}

/// [`TorchSource`] over a simple index (PyPI by default) through `fetch`.
pub struct IndexTorchSource {
    pub index: SimpleIndex,
}

fn boxed(
    error: impl std::error::Error + Send + Sync + 'static,
) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(error)
}

impl TorchSource for IndexTorchSource {
    async fn files(&self, project: &str) -> Result<Vec<DistFile>, RefreshError> {
        let url = self.index.base().to_string();
        let name = PackageName::from_str(project).map_err(|e| RefreshError::Index {
            url: url.clone(),
            source: boxed(e),
        })?;
        let page = self
            .index
            .project(&name)
            .await
            .map_err(|e| RefreshError::Index {
                url,
                source: boxed(e),
            })?;
        Ok(page.files)
    }

    async fn metadata(&self, file: &DistFile) -> Result<String, RefreshError> {
        wheel_metadata(self.index.client(), file)
            .await
            .map_err(|e| RefreshError::Metadata {
                filename: file.filename.to_string(),
                source: boxed(e),
            })
    }

    async fn scan_member(
        &self,
        file: &DistFile,
        member: &str,
        scanner: &mut ArchScanner,
    ) -> Result<(), RefreshError> {
        let fail = |source: Box<dyn std::error::Error + Send + Sync>| RefreshError::ArchScan {
            filename: file.filename.to_string(),
            member: member.to_string(),
            source,
        };
        let zip = RemoteZip::open(self.index.client(), file.url.clone())
            .await
            .map_err(|e| fail(boxed(e)))?;
        let mut reader = zip.entry_reader(member).await.map_err(|e| fail(boxed(e)))?;
        // The entry reader is blocking (it bridges the HTTP body); scan it off the runtime.
        let mut owned = std::mem::take(scanner);
        let (returned, result) = tokio::task::spawn_blocking(move || {
            let mut buffer = vec![0u8; 1 << 20];
            let result = loop {
                match std::io::Read::read(&mut reader, &mut buffer) {
                    Ok(0) => break Ok(()),
                    Ok(read) => owned.feed(&buffer[..read]),
                    Err(error) => break Err(error),
                }
            };
            (owned, result)
        })
        .await
        .map_err(|e| fail(boxed(e)))?;
        *scanner = returned;
        result.map_err(|e| fail(boxed(e)))
    }
}

/// The lowest glibc any of a wheel's linux x86_64 platform tags needs
/// (`manylinux_2_28_x86_64` -> 2.28); `None` for wheels of other platforms.
pub fn x86_64_glibc(wheel: &WheelFilename) -> Option<(u32, u32)> {
    wheel
        .platform_tags
        .iter()
        .filter_map(|tag| crate::names::manylinux_glibc(tag))
        .filter(|(_, arch)| *arch == "x86_64")
        .map(|(glibc, _)| (glibc.major, glibc.minor))
        .min()
}

/// The marker environment pins are read for: CPython on linux x86_64.
pub fn linux_x86_64_environment(python: PythonVersion) -> MarkerEnvironment {
    crate::names::linux_marker_environment(&format!("{python}.0"), "x86_64")
}

/// The `Requires-Dist` entries of a METADATA file that apply to `environment` with `extras`.
pub fn requires_dist(
    metadata: &str,
    environment: &MarkerEnvironment,
    extras: &[&str],
) -> Vec<Requirement> {
    let extras: Vec<ExtraName> = extras
        .iter()
        .filter_map(|e| ExtraName::from_str(e).ok())
        .collect();
    metadata
        .lines()
        .take_while(|line| !line.is_empty()) // headers end at the first blank line; the body is the README
        .filter_map(|line| line.strip_prefix("Requires-Dist:"))
        .filter_map(|text| crate::names::parse_requirement(text.trim()).ok())
        .filter(|req| req.evaluate_markers(environment, &extras))
        .collect()
}

/// `name -> exact version` for requirements pinned with a single `==` (`==13.0.96.*` keeps the star).
pub fn exact_pins(requirements: &[Requirement]) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    for req in requirements {
        if let Some(VersionOrUrl::VersionSpecifier(specifiers)) = &req.version_or_url {
            let specs: Vec<_> = specifiers.iter().collect();
            if let [spec] = specs.as_slice() {
                let version = spec.version().to_string();
                let text = match spec.operator() {
                    Operator::Equal | Operator::ExactEqual => Some(version),
                    Operator::EqualStar => Some(format!("{version}.*")),
                    _ => None,
                };
                if let Some(text) = text {
                    let name = if req.extras.is_empty() {
                        req.name.to_string()
                    } else {
                        format!(
                            "{}[{}]",
                            req.name,
                            req.extras
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join(",")
                        )
                    };
                    pins.insert(name, text);
                }
            }
        }
    }
    pins
}

/// Finds the CUDA arch list string (`sm_50 sm_60 ... sm_90`, `compute_XX` for PTX) in a
/// stream of bytes, chunk by chunk, keeping a small overlap so a match across chunk
/// boundaries is not lost. Memory stays at one chunk plus the overlap.
pub struct ArchScanner {
    pattern: Regex,
    carry: Vec<u8>,
    best: Option<String>,
}

const ARCH_SCAN_OVERLAP: usize = 512;

impl Default for ArchScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl ArchScanner {
    pub fn new() -> Self {
        Self {
            pattern: Regex::new(r"(?:sm|compute)_[0-9]{2,3}a?(?: (?:sm|compute)_[0-9]{2,3}a?){2,}")
                .expect("static regex"),
            carry: Vec::new(),
            best: None,
        }
    }

    pub fn feed(&mut self, chunk: &[u8]) {
        let mut window = std::mem::take(&mut self.carry);
        window.extend_from_slice(chunk);
        for found in self.pattern.find_iter(&window) {
            let text = String::from_utf8_lossy(found.as_bytes()).into_owned();
            if self
                .best
                .as_ref()
                .is_none_or(|best| text.len() > best.len())
            {
                self.best = Some(text);
            }
        }
        let keep = window.len().min(ARCH_SCAN_OVERLAP);
        self.carry = window[window.len() - keep..].to_vec();
    }

    /// The arch list found: SASS capabilities and whether PTX (`compute_XX`) is included.
    pub fn finish(&self) -> Option<(Vec<ComputeCapability>, bool)> {
        let text = self.best.as_ref()?;
        let mut sass = BTreeSet::new();
        let mut ptx = false;
        for word in text.split(' ') {
            if word.starts_with("compute_") {
                ptx = true;
            } else if let Ok(cc) = ComputeCapability::from_str(word) {
                sass.insert(cc);
            }
        }
        Some((sass.into_iter().collect(), ptx))
    }
}

/// Which torch file to read for a release: the cp311 linux x86_64 wheel when there is one
/// (the Python most recipes use), else the newest CPython's.
fn representative<'a>(wheels: &[(&'a DistFile, WheelFilename)]) -> Option<&'a DistFile> {
    let score = |tags: &WheelFilename| -> (bool, u32) {
        let cp = tags
            .python_tags
            .iter()
            .filter_map(|t| PythonVersion::from_cp_tag(t))
            .max();
        (
            cp == Some(PythonVersion::new(3, 11)),
            cp.map(|p| p.minor).unwrap_or(0),
        )
    };
    wheels
        .iter()
        .filter(|(_, tags)| !tags.abi_tags.iter().any(|a| a.ends_with('t')))
        .max_by_key(|(_, tags)| score(tags))
        .map(|(file, _)| *file)
}

/// Build one matrix row from what the index says about a release.
pub fn derive_build(
    version: &Version,
    wheels: &[(&DistFile, WheelFilename)],
    metadata: &str,
    toolkit_metadata: Option<&str>,
    arch: Option<(Vec<ComputeCapability>, bool)>,
    file: &DistFile,
) -> Result<TorchBuild, RefreshError> {
    let fail = |message: String| RefreshError::Derive {
        version: version.to_string(),
        message,
    };
    let environment = linux_x86_64_environment(PythonVersion::new(3, 11));
    let pins = exact_pins(&requires_dist(metadata, &environment, &[]));

    let runtime_pin = pins
        .iter()
        .find(|(name, _)| name.starts_with("nvidia-cuda-runtime"))
        .map(|(_, v)| v.clone());
    let toolkit_pin = pins
        .iter()
        .find(|(name, _)| name.starts_with("cuda-toolkit"))
        .map(|(_, v)| v.clone());
    let cuda_source = runtime_pin.clone().or(toolkit_pin.clone()).ok_or_else(|| {
        fail("no nvidia-cuda-runtime or cuda-toolkit pin in Requires-Dist: not a CUDA build".into())
    })?;
    let mut numbers = cuda_source.split('.');
    let cuda = match (
        numbers.next().and_then(|n| n.parse().ok()),
        numbers.next().and_then(|n| n.parse().ok()),
    ) {
        (Some(major), Some(minor)) => CudaVersion::new(major, minor, None),
        _ => {
            return Err(fail(format!(
                "cannot read a CUDA version from pin `{cuda_source}`"
            )))
        }
    };
    // From 2.11 the runtime comes through `cuda-toolkit[cudart]==13.0.2`, whose own
    // METADATA pins `nvidia-cuda-runtime==13.0.96.*` under the `cudart` extra.
    let cuda_runtime = match (&runtime_pin, toolkit_metadata) {
        (Some(pin), _) => Some(pin.clone()),
        (None, Some(text)) => exact_pins(&requires_dist(text, &environment, &["cudart"]))
            .into_iter()
            .find(|(name, _)| name.starts_with("nvidia-cuda-runtime"))
            .map(|(_, v)| v.trim_end_matches(".*").to_string()),
        (None, None) => None,
    };
    let cudnn = pins
        .iter()
        .find(|(name, _)| name.starts_with("nvidia-cudnn"))
        .map(|(_, v)| CudnnVersion::from_str(v))
        .transpose()
        .map_err(|e| fail(e.to_string()))?;

    let python: BTreeSet<PythonVersion> = wheels
        .iter()
        .flat_map(|(_, tags)| {
            tags.python_tags
                .iter()
                .filter_map(|t| PythonVersion::from_cp_tag(t))
        })
        .collect();
    let glibc = wheels
        .iter()
        .filter_map(|(_, tags)| x86_64_glibc(tags))
        .min()
        .map(|(major, minor)| format!("{major}.{minor}"));
    let (arch_list, ptx) = arch.unwrap_or_default();
    let digest = file
        .sha256
        .map(|d| d.to_string())
        .unwrap_or_else(|| "unknown".into());
    let arch_note = if arch_list.is_empty() {
        "sm list not scanned"
    } else {
        "sm list from torch/lib/libtorch_python.so"
    };
    Ok(TorchBuild {
        torch: version.clone(),
        variant: cuda.variant_name(),
        cuda,
        cuda_runtime,
        cudnn,
        arch_list,
        ptx,
        python: python.into_iter().collect(),
        pypi_default: true,
        glibc,
        pins,
        source: format!(
            "{} ({digest}): METADATA Requires-Dist; {arch_note}",
            file.url
        ),
        status: Status::Derived,
    })
}

/// Progress reporting for a refresh (the CLI prints it on stderr).
pub trait RefreshReporter {
    fn release(&self, version: &Version, what: &str);
}

/// What one refresh reads and how.
pub struct RefreshOptions<'a> {
    /// The index URL, recorded in the data.
    pub index_url: &'a str,
    /// Oldest torch release to include.
    pub since: &'a Version,
    /// Data from an earlier refresh (or the embedded data): unchanged wheels keep its
    /// scanned arch lists.
    pub previous: Option<&'a TorchPypiData>,
    /// False skips arch scans for rows that `previous` cannot fill.
    pub scan_arch: bool,
    /// The day recorded as `generated` (today, UTC, for the CLI).
    pub generated: Date,
}

/// Regenerate the torch data.
pub async fn refresh(
    source: &impl TorchSource,
    options: RefreshOptions<'_>,
    reporter: &impl RefreshReporter,
) -> Result<TorchPypiData, RefreshError> {
    let RefreshOptions {
        index_url,
        since,
        previous,
        scan_arch,
        generated,
    } = options;
    let files = source.files("torch").await?;
    let mut by_version: BTreeMap<Version, Vec<(&DistFile, WheelFilename)>> = BTreeMap::new();
    for file in &files {
        let Some(tags) = WheelFilename::from_str(&file.filename).ok() else {
            continue;
        };
        if file.yanked
            || tags.version < *since
            || tags.version.any_prerelease()
            || tags.version.is_local()
            || x86_64_glibc(&tags).is_none()
        {
            continue;
        }
        by_version
            .entry(tags.version.clone())
            .or_default()
            .push((file, tags));
    }

    let mut releases = Vec::new();
    let mut toolkit_files: Option<Vec<DistFile>> = None;
    for (version, wheels) in &by_version {
        let Some(file) = representative(wheels) else {
            continue;
        };
        reporter.release(version, "reading METADATA");
        let metadata = source.metadata(file).await?;
        let pins = exact_pins(&requires_dist(
            &metadata,
            &linux_x86_64_environment(PythonVersion::new(3, 11)),
            &[],
        ));
        let toolkit_metadata = match pins
            .iter()
            .find(|(name, _)| name.starts_with("cuda-toolkit"))
        {
            Some((_, toolkit_version)) => {
                if toolkit_files.is_none() {
                    toolkit_files = Some(source.files("cuda-toolkit").await?);
                }
                let wanted =
                    Version::from_str(toolkit_version).map_err(|e| RefreshError::Derive {
                        version: version.to_string(),
                        message: format!("cuda-toolkit pin `{toolkit_version}`: {e}"),
                    })?;
                let toolkit_file = toolkit_files.as_ref().into_iter().flatten().find(|f| {
                    WheelFilename::from_str(&f.filename)
                        .ok()
                        .is_some_and(|t| t.version == wanted)
                });
                match toolkit_file {
                    Some(toolkit_file) => Some(source.metadata(toolkit_file).await?),
                    None => None,
                }
            }
            None => None,
        };
        let reused = previous.and_then(|p| {
            p.releases.iter().find(|row| {
                row.torch == *version
                    && !row.arch_list.is_empty()
                    && file
                        .sha256
                        .is_some_and(|d| row.source.contains(&d.to_string()))
            })
        });
        let arch = match reused {
            Some(row) => Some((row.arch_list.clone(), row.ptx)),
            None if scan_arch => {
                reporter.release(version, "scanning libtorch_python.so for the arch list");
                let mut scanner = ArchScanner::new();
                source.scan_member(file, ARCH_MEMBER, &mut scanner).await?;
                scanner.finish()
            }
            None => None,
        };
        match derive_build(
            version,
            wheels,
            &metadata,
            toolkit_metadata.as_deref(),
            arch,
            file,
        ) {
            Ok(build) => releases.push(build),
            // A CPU-only or otherwise non-CUDA release is not a row of a CUDA matrix.
            Err(RefreshError::Derive { message, .. }) if message.contains("not a CUDA build") => {
                reporter.release(version, "skipped: no CUDA pins")
            }
            Err(error) => return Err(error),
        }
    }
    releases.sort_by(|a, b| b.torch.cmp(&a.torch));
    Ok(TorchPypiData {
        generated: Some(generated),
        generated_by: "cudastack matrix refresh".into(),
        index: index_url.into(),
        releases,
    })
}

/// Serialise the data file canonically (sorted keys, two-space indent, final newline).
pub fn to_canonical_json(data: &TorchPypiData) -> String {
    let value = serde_json::to_value(data).expect("matrix data serialises");
    let mut text = serde_json::to_string_pretty(&value).expect("JSON value serialises");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const TORCH_241_METADATA: &str = "Metadata-Version: 2.1\nName: torch\nVersion: 2.4.1\nRequires-Python: >=3.8.0\nRequires-Dist: filelock\nRequires-Dist: typing-extensions>=4.8.0\nRequires-Dist: sympy\nRequires-Dist: nvidia-cuda-runtime-cu12==12.1.105; platform_system == \"Linux\" and platform_machine == \"x86_64\"\nRequires-Dist: nvidia-cudnn-cu12==9.1.0.70; platform_system == \"Linux\" and platform_machine == \"x86_64\"\nRequires-Dist: nvidia-cublas-cu12==12.1.3.1; platform_system == \"Linux\" and platform_machine == \"x86_64\"\nRequires-Dist: triton==3.0.0; platform_system == \"Linux\" and platform_machine == \"x86_64\" and python_version < \"3.13\"\nRequires-Dist: opt-einsum>=3.3; extra == \"opt-einsum\"\n\nRequires-Dist: this-is-readme-text==1\n";

    #[test]
    fn pins_follow_markers_and_skip_the_body() {
        let env = linux_x86_64_environment(PythonVersion::new(3, 11));
        let pins = exact_pins(&requires_dist(TORCH_241_METADATA, &env, &[]));
        assert_eq!(
            pins.get("nvidia-cudnn-cu12").map(String::as_str),
            Some("9.1.0.70")
        );
        assert_eq!(pins.get("triton").map(String::as_str), Some("3.0.0"));
        assert!(!pins.contains_key("opt-einsum"));
        assert!(!pins.contains_key("this-is-readme-text"));
        let env313 = linux_x86_64_environment(PythonVersion::new(3, 13));
        assert!(
            !exact_pins(&requires_dist(TORCH_241_METADATA, &env313, &[])).contains_key("triton")
        );
    }

    fn wheel(name: &str) -> WheelFilename {
        WheelFilename::from_str(name).unwrap()
    }

    fn dist_file(filename: &str) -> DistFile {
        DistFile {
            filename: filename.parse().unwrap(),
            url: format!("https://files.example/{filename}").parse().unwrap(),
            sha256: Some(crate::digest::Digest::of_bytes(filename.as_bytes())),
            size: None,
            requires_python: None,
            yanked: false,
            yanked_reason: None,
            upload_time: None,
            core_metadata: Default::default(),
        }
    }

    #[test]
    fn manylinux_levels() {
        assert_eq!(
            x86_64_glibc(&wheel("torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl")),
            Some((2, 5))
        );
        assert_eq!(
            x86_64_glibc(&wheel("torch-2.9.0-cp313-cp313t-manylinux_2_28_x86_64.whl")),
            Some((2, 28))
        );
        assert_eq!(
            x86_64_glibc(&wheel("torch-2.4.1-cp311-cp311-manylinux2014_aarch64.whl")),
            None
        );
    }

    #[test]
    fn arch_scanner_finds_lists_across_chunks() {
        let blob =
            b"\x00\x01junk sm_35 \x00CUDA_ARCH sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90\x00more";
        for split in [1, 20, 30, 45, blob.len() - 1] {
            let mut scanner = ArchScanner::new();
            scanner.feed(&blob[..split]);
            scanner.feed(&blob[split..]);
            let (archs, ptx) = scanner.finish().unwrap();
            assert_eq!(archs.len(), 7, "split at {split}");
            assert_eq!(archs[0], ComputeCapability::new(5, 0));
            assert!(!ptx);
        }
        let mut scanner = ArchScanner::new();
        scanner.feed(b"sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120");
        let (archs, ptx) = scanner.finish().unwrap();
        assert_eq!(archs.last(), Some(&ComputeCapability::new(12, 0)));
        assert!(ptx);
    }

    #[test]
    fn derives_a_row_from_metadata() {
        let file = dist_file("torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl");
        let other = dist_file("torch-2.4.1-cp312-cp312-manylinux1_x86_64.whl");
        let wheels = vec![
            (&file, wheel(&file.filename)),
            (&other, wheel(&other.filename)),
        ];
        let version = Version::from_str("2.4.1").unwrap();
        let build = derive_build(
            &version,
            &wheels,
            TORCH_241_METADATA,
            None,
            Some((vec![ComputeCapability::new(8, 0)], false)),
            &file,
        )
        .unwrap();
        assert_eq!(build.cuda.to_string(), "12.1");
        assert_eq!(build.variant, "cu121");
        assert_eq!(build.cuda_runtime.as_deref(), Some("12.1.105"));
        assert_eq!(build.cudnn.unwrap().to_string(), "9.1.0.70");
        assert_eq!(build.python.len(), 2);
        assert_eq!(build.glibc.as_deref(), Some("2.5"));
    }

    #[test]
    fn toolkit_metapackage_gives_the_runtime() {
        let torch = "Name: torch\nRequires-Dist: cuda-toolkit[cublas,cudart,cufft]==13.0.2; platform_system == \"Linux\"\nRequires-Dist: nvidia-cudnn-cu13==9.19.0.56; platform_system == \"Linux\"\n";
        let toolkit = "Name: cuda-toolkit\nRequires-Dist: nvidia-cuda-runtime==13.0.96.*; extra == \"cudart\"\nRequires-Dist: nvidia-cublas==13.1.0.3.*; extra == \"cublas\"\n";
        let file = dist_file("torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl");
        let wheels = vec![(&file, wheel(&file.filename))];
        let build = derive_build(
            &Version::from_str("2.11.0").unwrap(),
            &wheels,
            torch,
            Some(toolkit),
            None,
            &file,
        )
        .unwrap();
        assert_eq!(build.cuda.to_string(), "13.0");
        assert_eq!(build.cuda_runtime.as_deref(), Some("13.0.96"));
        assert_eq!(
            build
                .pins
                .get("cuda-toolkit[cublas,cudart,cufft]")
                .map(String::as_str),
            Some("13.0.2")
        );
        assert_eq!(build.glibc.as_deref(), Some("2.28"));
    }
}
