//! The verification cache: a probe's report is a function of the image, the probe and the
//! host, so verifying an identical image with the identical probe on an identical host
//! again is a lookup, not an 87 s container run (every no-op rebuild with a
//! Docker daemon re-ran the probe).
//!
//! The key ([`CacheKey`]) is the image's manifest digest, the probe (the digest of the
//! probe's source, the level, the GPUs asked for, the cudastack version) and the host's
//! GPU facts ([`HostFacts`]: the kernel driver's version line, every GPU's model, UUID
//! and bus, the daemon's version and its GPU runtimes). Anything that could change the
//! report changes the key; a new driver or another GPU re-runs the probe.
//!
//! Entries are the cache directory's verify records (`CACHE/verify/<sha256 of the
//! key>.json`, written whole: [`crate::cache::Records`]), and repeat their key, which a lookup compares field by
//! field: a truncated, foreign or colliding file is a miss, never a wrong answer. A
//! failed report is never stored, so a failure is always re-run (a flaky GPU gets its
//! second chance). The cache is as trusted as the rest of the cache directory: whoever
//! can write it can also replace cached layers, so it must be the user's own.
//!
//! What this module must not do: run anything, or decide a verdict.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::report::{Report, Verdict};
use crate::cache::{CacheDir, CacheError, Records};
use crate::digest::Digest;
use crate::probe::PROBE_SOURCE;

/// Where the GPU facts of this host are read.
const NVIDIA_VERSION: &str = "/proc/driver/nvidia/version";
const NVIDIA_GPUS: &str = "/proc/driver/nvidia/gpus";

/// What the host contributes to a report: the driver, the GPUs, and how the daemon gives
/// containers GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// The first line of /proc/driver/nvidia/version, or `None` without a driver.
    pub driver: Option<String>,
    /// Each GPU's /proc/driver/nvidia/gpus/BUS/information, whitespace-normalised,
    /// sorted by bus.
    pub gpus: Vec<String>,
    /// The daemon's version and API version (e.g. `Docker 20.10.24 (API 1.41)`).
    pub engine: String,
    /// Registered runtimes and CDI spec directories (the NVIDIA Container Toolkit).
    pub runtimes: Vec<String>,
    pub cdi_spec_dirs: Vec<String>,
}

impl HostFacts {
    /// Read the GPU facts from /proc (`root` replaces `/` in tests) and take the daemon's
    /// from `info`.
    pub fn read(info: &crate::engine::EngineInfo) -> Self {
        Self::read_under(Path::new("/"), info)
    }

    fn read_under(root: &Path, info: &crate::engine::EngineInfo) -> Self {
        let under = |path: &str| root.join(path.trim_start_matches('/'));
        let driver = std::fs::read_to_string(under(NVIDIA_VERSION))
            .ok()
            .and_then(|text| text.lines().next().map(normalise));
        let mut gpus: Vec<(String, String)> = std::fs::read_dir(under(NVIDIA_GPUS))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .map(|entry| {
                        let information = std::fs::read_to_string(entry.path().join("information"))
                            .unwrap_or_default();
                        (
                            entry.file_name().to_string_lossy().into_owned(),
                            normalise(&information),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        gpus.sort();
        Self {
            driver,
            gpus: gpus
                .into_iter()
                .map(|(bus, information)| format!("{bus}: {information}"))
                .collect(),
            engine: format!("Docker {} (API {})", info.server_version, info.api_version),
            runtimes: info.runtimes.clone(),
            cdi_spec_dirs: info.cdi_spec_dirs.clone(),
        }
    }
}

fn normalise(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Everything a report depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKey {
    pub manifest_digest: String,
    /// sha256 of the probe's source: any change to the probe is another probe.
    pub probe: String,
    pub cudastack: String,
    pub level: String,
    /// The GPUs asked of the daemon (`none`, `all`, a count, ids).
    pub gpus: String,
    pub host: HostFacts,
}

impl CacheKey {
    pub fn new(
        manifest_digest: &Digest,
        level: super::report::Level,
        gpus: &str,
        host: HostFacts,
    ) -> Self {
        Self {
            manifest_digest: manifest_digest.to_string(),
            probe: Digest::of_bytes(PROBE_SOURCE.as_bytes()).to_string(),
            cudastack: env!("CARGO_PKG_VERSION").to_string(),
            level: level.as_str().to_string(),
            gpus: gpus.to_string(),
            host,
        }
    }

    /// The entry's key among the records: the digest of the key's canonical JSON.
    fn record_key(&self) -> Digest {
        let json = crate::oci::canonical::to_canonical_json(self).expect("a key serialises");
        Digest::of_bytes(&json)
    }
}

#[derive(Serialize, Deserialize)]
struct Entry {
    key: CacheKey,
    report: Report,
}

/// The cache of one cache directory.
#[derive(Debug, Clone)]
pub struct VerifyCache {
    records: Records,
}

impl VerifyCache {
    /// The cache under `cache_root` (the build cache's root: `CACHE/verify`).
    pub fn new(cache_root: &Path) -> Self {
        Self {
            records: Records::verify(&CacheDir::new(cache_root)),
        }
    }

    /// The report stored under `key`, if one is and its stored key is exactly `key`.
    pub fn get(&self, key: &CacheKey) -> Option<Report> {
        let bytes = self.records.read(&key.record_key()).ok()??;
        let entry: Entry = serde_json::from_slice(&bytes).ok()?;
        // A failed report is never stored; one found is not trusted to skip anything.
        (entry.key == *key && !matches!(entry.report.verdict(), Verdict::Failed { .. }))
            .then_some(entry.report)
    }

    /// Store `report` under `key`; a failed report is not stored. Returns whether it was.
    pub fn put(&self, key: &CacheKey, report: &Report) -> Result<bool, CacheError> {
        if matches!(report.verdict(), Verdict::Failed { .. }) {
            return Ok(false);
        }
        let entry = Entry {
            key: key.clone(),
            report: report.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&entry).expect("a report serialises");
        self.records.write(&key.record_key(), &bytes)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::report::Level;

    fn info() -> crate::engine::EngineInfo {
        crate::engine::EngineInfo {
            host: "unix:///var/run/docker.sock".into(),
            server_version: "20.10.24".into(),
            server_api_version: "1.41".into(),
            api_version: "1.41".into(),
            operating_system: None,
            architecture: None,
            runtimes: vec!["runc".into()],
            default_runtime: Some("runc".into()),
            nvidia_runtime: false,
            cdi_spec_dirs: Vec::new(),
            containerd_image_store: false,
        }
    }

    fn report(status: &str) -> Report {
        let value = serde_json::json!({
            "schema": crate::verify::report::REPORT_SCHEMA, "probe_version": "1",
            "started": "2026-11-29T23:00:00Z", "seconds": 1.0, "hostname": "h",
            "levels": ["static"], "expect": {}, "driver": null, "gpus": [],
            "checks": [{"id": "static.files", "level": "static", "status": status,
                        "seconds": 0.1, "detail": "d"}],
            "counts": {"pass": 1, "fail": 0, "skip": 0},
        });
        Report::from_json(value.to_string().as_bytes()).unwrap()
    }

    fn fake_proc(root: &Path, driver: &str, gpus: &[(&str, &str)]) {
        let nvidia = root.join("proc/driver/nvidia");
        std::fs::create_dir_all(nvidia.join("gpus")).unwrap();
        std::fs::write(nvidia.join("version"), driver).unwrap();
        for (bus, information) in gpus {
            std::fs::create_dir_all(nvidia.join("gpus").join(bus)).unwrap();
            std::fs::write(
                nvidia.join("gpus").join(bus).join("information"),
                information,
            )
            .unwrap();
        }
    }

    #[test]
    fn a_stored_report_is_found_only_under_its_exact_key() {
        let dir = tempfile::tempdir().unwrap();
        let cache = VerifyCache::new(dir.path());
        let digest = Digest::of_bytes(b"manifest");
        let host = HostFacts::read_under(&dir.path().join("no-gpu"), &info());
        assert_eq!(host.driver, None);
        assert!(host.gpus.is_empty());
        let key = CacheKey::new(&digest, Level::Train, "none", host.clone());
        assert!(cache.get(&key).is_none());
        assert!(cache.put(&key, &report("pass")).unwrap());
        assert_eq!(cache.get(&key).unwrap().started, "2026-11-29T23:00:00Z");

        // Another level, GPU request, image, daemon or probe: a miss.
        let other_level = CacheKey::new(&digest, Level::Static, "none", host.clone());
        assert!(cache.get(&other_level).is_none());
        assert!(cache
            .get(&CacheKey::new(&digest, Level::Train, "all", host.clone()))
            .is_none());
        assert!(cache
            .get(&CacheKey::new(
                &Digest::of_bytes(b"other"),
                Level::Train,
                "none",
                host.clone()
            ))
            .is_none());
        let mut newer_daemon = info();
        newer_daemon.server_version = "24.0.7".into();
        assert!(cache
            .get(&CacheKey::new(
                &digest,
                Level::Train,
                "none",
                HostFacts::read_under(&dir.path().join("no-gpu"), &newer_daemon)
            ))
            .is_none());
        let mut other_probe = key.clone();
        other_probe.probe = Digest::of_bytes(b"probe v2").to_string();
        assert!(cache.get(&other_probe).is_none());
    }

    #[test]
    fn a_new_driver_or_another_gpu_is_another_host() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a");
        let h200 = "Model: NVIDIA H200\nGPU UUID: GPU-1\nBus Location: 0000:01:00.0\n";
        fake_proc(
            &root,
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\nGCC version\n",
            &[("0000:01:00.0", h200)],
        );
        let before = HostFacts::read_under(&root, &info());
        assert_eq!(
            before.driver.as_deref(),
            Some("NVRM version: NVIDIA UNIX x86_64 Kernel Module 550.54.15")
        );
        assert_eq!(before.gpus.len(), 1);
        let cache = VerifyCache::new(&dir.path().join("cache"));
        let digest = Digest::of_bytes(b"manifest");
        let key = CacheKey::new(&digest, Level::Train, "all", before);
        cache.put(&key, &report("pass")).unwrap();

        fake_proc(
            &root,
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03\n",
            &[("0000:01:00.0", h200)],
        );
        let new_driver = HostFacts::read_under(&root, &info());
        assert!(cache
            .get(&CacheKey::new(&digest, Level::Train, "all", new_driver))
            .is_none());
        fake_proc(
            &root,
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\nGCC version\n",
            &[
                ("0000:01:00.0", h200),
                ("0000:02:00.0", "Model: NVIDIA A100\n"),
            ],
        );
        let two_gpus = HostFacts::read_under(&root, &info());
        assert!(cache
            .get(&CacheKey::new(&digest, Level::Train, "all", two_gpus))
            .is_none());
    }

    #[test]
    fn failed_reports_and_damaged_entries_never_skip_a_run() {
        let dir = tempfile::tempdir().unwrap();
        let cache = VerifyCache::new(dir.path());
        let host = HostFacts::read_under(&dir.path().join("none"), &info());
        let key = CacheKey::new(&Digest::of_bytes(b"m"), Level::Train, "none", host);
        assert!(!cache.put(&key, &report("fail")).unwrap());
        assert!(cache.get(&key).is_none());

        cache.put(&key, &report("pass")).unwrap();
        let path = dir
            .path()
            .join("verify")
            .join(format!("{}.json", key.record_key().hex()));
        let text = std::fs::read_to_string(&path).unwrap();
        // Truncated.
        std::fs::write(&path, &text[..text.len() / 2]).unwrap();
        assert!(cache.get(&key).is_none());
        // Another key's entry under this key's name (a collision, or a copied file).
        let mut other = key.clone();
        other.level = "static".into();
        let forged = text.replace("\"train\"", "\"static\"");
        assert_ne!(forged, text);
        std::fs::write(&path, forged).unwrap();
        assert!(cache.get(&key).is_none());
        let _ = other;
        // A failed report written by hand.
        std::fs::write(&path, text.replace("\"pass\"", "\"fail\"")).unwrap();
        assert!(cache.get(&key).is_none());
    }
}
