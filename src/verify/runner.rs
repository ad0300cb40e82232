//! Running the probe: in a container through the Docker Engine API (GPUs through
//! DeviceRequests and the `nvidia` runtime when the daemon has it), or natively with the
//! host's Python (a GPU machine without Docker).
//!
//! Every container verify starts first reaps the containers dead runs left
//! ([`Engine::reap_orphans`]); a report already in the verification cache for this image,
//! probe and host ([`super::cache`]) is recorded again without loading or running
//! anything. A GPU asked for as required is a claim about what the probe saw: a report
//! naming no GPU fails it, whichever runner produced it ([`require_gpu_seen`]).
//!
//! A container run is the host's testimony: the probe gets a
//! fresh nonce and exactly one report carrying it is accepted; a container given no GPU
//! (which then also gets `NVIDIA_VISIBLE_DEVICES=void`, so a daemon whose default runtime
//! is `nvidia` cannot hand it one behind the request's back) may claim no GPU result; and
//! the driver and GPUs a report names must be the ones this host reads for itself.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;

use super::cache::{CacheKey, HostFacts, VerifyCache};
use super::probe_command;
use super::record::{record_in_layout, RecordError, Recorded};
use super::report::{ImageFacts, Level, Report, ReportError, RunnerFacts, Status};
use super::witness::{self, HostGpu, HostView, Nonce, Witness, WitnessError, NONCE_ENV};
use crate::digest::Digest;
use crate::engine::load::layout_tags;
use crate::engine::run::{GpuRequest, Reaped, RunOutcome, RunSpec};
use crate::engine::{Engine, EngineError, LoadReport};
use crate::oci::layout::LayoutImage;
use crate::oci::StoredImage;
use crate::probe::PROBE_SOURCE;

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("reading the layers another tool added to `{image}`: {source}")]
    Derived {
        image: String,
        #[source]
        source: super::derived::DerivedError,
    },
    #[error("the probe in `{image}` produced no report (exit status {exit_code}): {source}")]
    NoReport {
        image: String,
        exit_code: i64,
        #[source]
        source: ReportError,
    },
    #[error("the report of the probe in `{image}` is not accepted as a verification: {source}")]
    Refused {
        image: String,
        #[source]
        source: WitnessError,
    },
    #[error("{0}")]
    Nonce(String),
    #[error("the probe in `{image}` ran past {seconds} s and was stopped")]
    TimedOut { image: String, seconds: u64 },
    #[error("verification needs a GPU (--require-gpu, or verify.gpu: required) but {reason}\n  hint: run on a host with an NVIDIA GPU, its driver and (for containers) the NVIDIA Container Toolkit; or accept the static level: drop --require-gpu, or set verify.gpu: auto")]
    NoGpu { reason: String },
    #[error("running `{command}` failed: {source}")]
    Native {
        command: String,
        #[source]
        source: std::io::Error,
    },
}

/// Which GPUs to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuChoice {
    /// All GPUs when the host and daemon can provide them, otherwise none (static level).
    Auto,
    /// Fail unless GPUs can be provided.
    Required(GpuRequest),
    /// Exactly this request (`--gpus`); `GpuRequest::None` runs the static level only.
    Exactly(GpuRequest),
}

#[derive(Debug, Clone)]
pub struct VerifySettings {
    pub gpus: GpuChoice,
    pub level: Level,
    pub timeout: Duration,
    /// The cache root whose `verify/` holds reports by image, probe and host; `None`
    /// always runs the probe.
    pub cache: Option<PathBuf>,
    /// Leave the image loaded after the run even when it has no tags, because a load of the
    /// verified image follows (`build --load`): its layers are then in the daemon already,
    /// and the caller removes this one ([`VerifyOutcome::left_loaded`]).
    pub keep_loaded: bool,
}

impl Default for VerifySettings {
    fn default() -> Self {
        Self {
            gpus: GpuChoice::Auto,
            level: Level::Train,
            timeout: Duration::from_secs(1800),
            cache: None,
            keep_loaded: false,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyOutcome {
    pub report: Report,
    pub recorded: Recorded,
    /// The load into the daemon; `None` when the report came from the cache.
    pub load: Option<LoadReport>,
    pub exit_code: i64,
    pub seconds: f64,
    /// The date of the cached report used instead of running the probe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached: Option<String>,
    /// Containers of dead runs removed before this one started.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reaped: Vec<Reaped>,
    /// The untagged image this run loaded and left in the daemon for the caller to remove
    /// ([`VerifySettings::keep_loaded`]).
    #[serde(skip)]
    pub left_loaded: Option<Digest>,
}

/// Fail unless the report saw a GPU: `--require-gpu` (or `verify.gpu: required`) asks
/// for a verification on a GPU, and a report without one proves only the static level,
/// whatever was requested of the daemon or found in /dev.
pub fn require_gpu_seen(report: &Report) -> Result<(), VerifyError> {
    if !report.gpus.is_empty() {
        return Ok(());
    }
    let why = report
        .checks
        .iter()
        .find(|c| c.status == Status::Skip && c.level.needs_gpu())
        .map(|c| format!(": {} skipped: {}", c.id, c.detail))
        .unwrap_or_default();
    Err(VerifyError::NoGpu {
        reason: format!("the probe saw no GPU{why}"),
    })
}

/// Whether this host looks able to give a container a GPU: the daemon has the nvidia
/// runtime or CDI specs, and the kernel driver is loaded.
fn gpu_visible(info: &crate::engine::EngineInfo) -> Result<(), String> {
    let driver =
        Path::new("/proc/driver/nvidia/version").exists() || Path::new("/dev/nvidiactl").exists();
    let runtime = info.nvidia_runtime || !info.cdi_spec_dirs.is_empty();
    match (driver, runtime) {
        (true, true) => Ok(()),
        (false, _) => Err("this host has no NVIDIA driver loaded (no /proc/driver/nvidia/version, no /dev/nvidiactl)".to_string()),
        (true, false) => Err(format!(
            "the Docker daemon at {} has no `nvidia` runtime and no CDI specs (NVIDIA Container Toolkit not configured)",
            info.host
        )),
    }
}

/// Verify the image `ref_name` of the layout `dir`, loaded under the tags the layout
/// records for it: [`verify_image`].
pub async fn verify_layout(
    engine: &Engine,
    dir: &Path,
    ref_name: &str,
    settings: &VerifySettings,
) -> Result<VerifyOutcome, VerifyError> {
    let image = LayoutImage::open(dir, ref_name)?;
    verify_image(engine, &image, &layout_tags(&image), settings).await
}

/// Verify `image`: load it under `tags` (skipped when present), run the probe, record the
/// report in its layout (and, only on a full pass, the verified image).
pub async fn verify_image(
    engine: &Engine,
    image: &LayoutImage,
    tags: &[String],
    settings: &VerifySettings,
) -> Result<VerifyOutcome, VerifyError> {
    let started = std::time::Instant::now();
    let info = engine.info().await?;
    let reaped = engine.reap_orphans().await?;
    let (gpus, note) = choose_gpus(&settings.gpus, &info)?;
    let (dir, ref_name) = (image.dir.as_path(), image.ref_name.as_str());
    let manifest_digest = image.image.manifest_digest();
    let location = image.location();
    let image_facts = ImageFacts {
        reference: location.clone(),
        manifest_digest: Some(manifest_digest.to_string()),
        config_digest: Some(image.image.config_digest().to_string()),
    };
    let cache = settings.cache.as_deref().map(|root| {
        (
            VerifyCache::new(root),
            CacheKey::new(
                &manifest_digest,
                settings.level,
                &describe(&gpus),
                HostFacts::read(&info),
            ),
        )
    });
    if let Some(mut report) = cache.as_ref().and_then(|(cache, key)| cache.get(key)) {
        // The same image may live in another layout now: the report names this one. The
        // testimony is taken again: the cache is a shortcut, never a witness.
        report.image = Some(image_facts);
        let witness = testify(&report, &gpus, &info, &location)?;
        if let Some(runner) = report.runner.as_mut() {
            runner.witness = Some(witness);
        }
        let recorded = record_in_layout(dir, ref_name, &report)?;
        if matches!(settings.gpus, GpuChoice::Required(_)) {
            require_gpu_seen(&report)?;
        }
        return Ok(VerifyOutcome {
            cached: Some(report.started.clone()),
            report,
            recorded,
            load: None,
            exit_code: 0,
            seconds: started.elapsed().as_secs_f64(),
            reaped,
            left_loaded: None,
        });
    }
    // The host reads what another tool's layers changed, before the image's own code runs.
    let examined = std::time::Instant::now();
    let derived = super::derived::examine(&image.image).map_err(|source| VerifyError::Derived {
        image: location.clone(),
        source,
    })?;
    let derived = derived.map(|changes| changes.check(examined.elapsed().as_secs_f64()));
    let probed = ProbeImage {
        image: &image.image,
        origin: dir.display().to_string(),
        tags,
    };
    let nonce = Nonce::generate().map_err(VerifyError::Nonce)?;
    let (load, outcome, left_loaded) = run_probe(engine, &probed, &gpus, settings, &nonce).await?;
    // What follows the run may still fail (no report, a check that failed): then the image
    // left for the caller goes too.
    let judged = (|| {
        if outcome.timed_out {
            return Err(VerifyError::TimedOut {
                image: location,
                seconds: settings.timeout.as_secs(),
            });
        }
        let mut report = accept_run(&outcome, &nonce, &location)?;
        if let Some(check) = derived {
            report.add_host_check(check);
        }
        let witness = testify(&report, &gpus, &info, &location)?;
        report.image = Some(image_facts);
        let mut runner = docker_runner_facts(&gpus, &info, note);
        runner.witness = Some(witness);
        report.runner = Some(runner);
        if let Some((cache, key)) = &cache {
            // A cache that cannot be written costs the next run time, not this one its result.
            if let Err(error) = cache.put(key, &report) {
                tracing::warn!("the verification cache was not written: {error}");
            }
        }
        let recorded = record_in_layout(dir, ref_name, &report)?;
        if matches!(settings.gpus, GpuChoice::Required(_)) {
            require_gpu_seen(&report)?;
        }
        Ok(VerifyOutcome {
            report,
            recorded,
            load: Some(load),
            exit_code: outcome.exit_code,
            seconds: started.elapsed().as_secs_f64(),
            cached: None,
            reaped,
            left_loaded,
        })
    })();
    if let (Err(_), Some(id)) = (&judged, left_loaded) {
        let _ = engine.remove_image(&id.to_string()).await;
    }
    judged
}

/// The one report of this run's probe in the container's output (rule 1 of
/// [`super::witness`]).
fn accept_run(outcome: &RunOutcome, nonce: &Nonce, location: &str) -> Result<Report, VerifyError> {
    witness::accept(&outcome.stdout, nonce, "the container's stdout").map_err(|error| match error {
        WitnessError::Report(source) => VerifyError::NoReport {
            image: location.to_string(),
            exit_code: outcome.exit_code,
            source: with_stderr(source, &outcome.stderr),
        },
        source => VerifyError::Refused {
            image: location.to_string(),
            source,
        },
    })
}

/// Rules 2 and 3 of [`super::witness`]: what the host vouches for, or the refusal.
fn testify(
    report: &Report,
    gpus: &GpuRequest,
    info: &crate::engine::EngineInfo,
    location: &str,
) -> Result<Witness, VerifyError> {
    // Reading the host's GPUs runs nvidia-smi: only worth it when the container had some.
    let view = if *gpus == GpuRequest::None {
        HostView::Unknown {
            reason: "no GPU given".to_string(),
        }
    } else {
        host_view(info)
    };
    witness::testify(report, gpus, &view).map_err(|source| VerifyError::Refused {
        image: location.to_string(),
        source,
    })
}

/// This host's driver and GPUs, when the daemon runs here (a unix socket); a daemon
/// elsewhere runs containers on a machine this host cannot read.
fn host_view(info: &crate::engine::EngineInfo) -> HostView {
    if !info.host.starts_with("unix://") {
        return HostView::Unknown {
            reason: format!(
                "the Docker daemon at {} is not on this host, so the host cannot read the GPUs and driver its containers get",
                info.host
            ),
        };
    }
    let report = crate::host::driver::detect(&crate::host::HostRoot::live());
    HostView::Local {
        driver: report.driver_version,
        gpus: report
            .gpus
            .iter()
            .map(|gpu| HostGpu::read(&gpu.name, gpu.cc))
            .collect(),
    }
}

/// The GPUs to ask for, and a note for the report when the choice fell back to none.
fn choose_gpus(
    choice: &GpuChoice,
    info: &crate::engine::EngineInfo,
) -> Result<(GpuRequest, Option<String>), VerifyError> {
    Ok(match choice {
        GpuChoice::Exactly(request) => (request.clone(), None),
        GpuChoice::Required(request) => {
            gpu_visible(info).map_err(|reason| VerifyError::NoGpu { reason })?;
            (request.clone(), None)
        }
        GpuChoice::Auto => match gpu_visible(info) {
            Ok(()) => (GpuRequest::All, None),
            Err(reason) => (
                GpuRequest::None,
                Some(format!("{reason}: static level only")),
            ),
        },
    })
}

/// The image the probe runs in.
struct ProbeImage<'a> {
    image: &'a StoredImage,
    /// Where it is stored, for messages.
    origin: String,
    /// The tags it is loaded under (none: removed again after the run if this run
    /// brought it).
    tags: &'a [String],
}

/// Load the image (skipped when present) and run the probe in a container of it. Also
/// returns the image's ID when it stays loaded only for the caller ([`VerifySettings::keep_loaded`]).
async fn run_probe(
    engine: &Engine,
    image: &ProbeImage<'_>,
    gpus: &GpuRequest,
    settings: &VerifySettings,
    nonce: &Nonce,
) -> Result<(LoadReport, RunOutcome, Option<Digest>), VerifyError> {
    // By config or manifest digest: the containerd image store names images by the latter.
    let manifest_digest = image.image.manifest_digest();
    let was_present = engine
        .has_image(&image.image.config_digest(), &manifest_digest)
        .await?;
    let load = engine
        .load_stored(image.image, image.tags, &image.origin)
        .await?;
    let image_id = load.image_id.to_string();
    let mut spec = RunSpec::new(image_id.clone(), probe_command(settings.level));
    spec.entrypoint = Some(Vec::new());
    spec.gpus = gpus.clone();
    spec.env
        .push((NONCE_ENV.to_string(), nonce.as_str().to_string()));
    if *gpus == GpuRequest::None {
        // "No GPU" must be true for rule 2 of the witness: a daemon whose default runtime
        // is `nvidia` would otherwise give every GPU to an image that asks in its env.
        spec.env
            .push(("NVIDIA_VISIBLE_DEVICES".to_string(), "void".to_string()));
    }
    spec.timeout = settings.timeout;
    spec.labels = vec![(
        "io.cudastack.verify".to_string(),
        manifest_digest.to_string(),
    )];
    // A tagged image stays loaded (like `docker build` leaves its result); one without tags
    // would only be an anonymous leftover, so it goes again if this run brought it, unless
    // the caller loads the verified image next (whose layers these are).
    let outcome = engine.run(&spec).await;
    let mut left_loaded = None;
    if image.tags.is_empty() && !was_present {
        if settings.keep_loaded && outcome.is_ok() {
            left_loaded = Some(load.image_id);
        } else {
            let _ = engine.remove_image(&image_id).await;
        }
    }
    Ok((load, outcome?, left_loaded))
}

/// How the probe was run, for the report.
fn docker_runner_facts(
    gpus: &GpuRequest,
    info: &crate::engine::EngineInfo,
    note: Option<String>,
) -> RunnerFacts {
    RunnerFacts {
        kind: "docker".to_string(),
        cudastack_version: env!("CARGO_PKG_VERSION").to_string(),
        gpus_requested: describe(gpus),
        engine: Some(format!(
            "Docker {} (API {})",
            info.server_version, info.api_version
        )),
        note,
        witness: None,
    }
}

fn with_stderr(error: ReportError, stderr: &str) -> ReportError {
    match error {
        ReportError::Missing { what, tail } if tail.trim().is_empty() => {
            let lines: Vec<&str> = stderr.lines().rev().take(15).collect();
            ReportError::Missing {
                what,
                tail: lines.into_iter().rev().collect::<Vec<_>>().join("\n"),
            }
        }
        other => other,
    }
}

pub fn describe(gpus: &GpuRequest) -> String {
    match gpus {
        GpuRequest::None => "none".to_string(),
        GpuRequest::All => "all".to_string(),
        GpuRequest::Count(n) => n.to_string(),
        GpuRequest::DeviceIds(ids) => ids.join(","),
    }
}

/// Run the probe with this host's `python3` (a GPU machine without Docker): proves the
/// host's PyTorch, driver and GPUs. Nothing is recorded on any image. With `require_gpu`
/// a report that saw no GPU is [`VerifyError::NoGpu`].
pub fn verify_native(
    python: &str,
    level: Level,
    expect: Option<&Path>,
    require_gpu: bool,
) -> Result<(Report, i32), VerifyError> {
    let dir = tempfile::tempdir().map_err(|source| VerifyError::Native {
        command: "mktemp".into(),
        source,
    })?;
    let probe = dir.path().join("probe.py");
    std::fs::write(&probe, PROBE_SOURCE).map_err(|source| VerifyError::Native {
        command: format!("write {}", probe.display()),
        source,
    })?;
    let empty = dir.path().join("expect.json");
    let expect = match expect {
        Some(path) => path.to_path_buf(),
        None => {
            std::fs::write(&empty, b"{}").map_err(|source| VerifyError::Native {
                command: format!("write {}", empty.display()),
                source,
            })?;
            empty
        }
    };
    let command = format!("{python} {} --level {}", probe.display(), level.as_str());
    let nonce = Nonce::generate().map_err(VerifyError::Nonce)?;
    let output = std::process::Command::new(python)
        .env(NONCE_ENV, nonce.as_str())
        .arg(&probe)
        .args(["--level", level.as_str(), "--expect"])
        .arg(&expect)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|source| VerifyError::Native {
            command: command.clone(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut report =
        witness::accept(&stdout, &nonce, "the probe's stdout").map_err(|error| match error {
            WitnessError::Report(source) => VerifyError::NoReport {
                image: "the host".into(),
                exit_code: i64::from(output.status.code().unwrap_or(-1)),
                source,
            },
            source => VerifyError::Refused {
                image: "the host".into(),
                source,
            },
        })?;
    report.runner = Some(RunnerFacts {
        kind: "native".to_string(),
        cudastack_version: env!("CARGO_PKG_VERSION").to_string(),
        gpus_requested: "all".to_string(),
        engine: None,
        note: Some(format!("{python} on the host, not an image")),
        witness: None,
    });
    if require_gpu {
        require_gpu_seen(&report)?;
    }
    Ok((report, output.status.code().unwrap_or(2)))
}
