//! The pipeline: what `cudastack build` does after parsing its arguments, as library
//! functions with typed settings and a typed report. Build the image ([`build`]: the
//! inputs, the source builds, the assembly in `stack`, the layout), then verify it (`verify::runner`, with the verification cache), then load it into the
//! Docker daemon (`engine`), then push it (`registry`) with its verification reports as
//! referrers. Each stage is also a function of its own, which the `verify`, `load` and
//! `push` commands call, and [`image_source`] reads an image's documents from a layout or
//! a registry for `inspect`, `check` and `verify --emit`.
//!
//! It sits at the top of the library: it composes the stages and decides their order (a
//! verified image is what gets loaded and published), and nothing below imports it. It
//! must not parse arguments or print: the binary turns the command line into
//! [`PipelineSettings`] and renders [`PipelineReport`]; what a person watching should read
//! goes through [`Progress`].

pub mod attest;
pub mod build;
pub mod early_load;
pub mod early_push;
pub mod image_source;
pub mod init;
pub mod inspect;
pub mod load;
pub mod lock;
pub mod promote;
pub mod push;
pub mod record;
pub mod sbom;
pub mod shared_wheels;
pub mod signed;
pub mod verify;

use std::path::PathBuf;

use serde::Serialize;

use early_load::EarlyLoads;
use early_push::{EarlyUploads, SentWhileBuilding};

use crate::engine::LoadReport;
use crate::matrix::{Matrix, ResolvedRecipe};
use crate::oci::layout::LayoutImage;
use crate::recipe::{GpuPolicy, Platform};
use crate::registry::{ClientOptions, PushReport, Reference};
use crate::stack::{BuildProgress, BuildReport, BuildSettings};
use crate::verify::report::Report;
use crate::verify::runner::VerifyOutcome;
use build::{build, resolve_for_build};

pub use push::PushSettings;

/// Everything that can stop the pipeline. The stages' own errors pass through unchanged
/// (`transparent`: the same message and `Caused by:` chain as when a command calls the
/// stage itself); boxed, so that a `Result` of the pipeline stays small.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Recipe(Box<crate::recipe::RecipeError>),
    #[error(transparent)]
    Build(Box<crate::stack::BuildError>),
    #[error(transparent)]
    SourceBuild(Box<crate::source_build::SourceBuildError>),
    #[error(transparent)]
    Verify(Box<crate::verify::runner::VerifyError>),
    #[error(transparent)]
    Engine(Box<crate::engine::EngineError>),
    #[error(transparent)]
    Registry(Box<crate::registry::RegistryError>),
    #[error(transparent)]
    Layout(Box<crate::oci::OciError>),
    #[error(transparent)]
    Source(Box<crate::verify::source::SourceError>),
    #[error(transparent)]
    Digest(#[from] crate::digest::DigestError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Attest(Box<crate::attest::AttestError>),
    #[error(transparent)]
    Report(Box<crate::verify::report::ReportError>),
    #[error(transparent)]
    Record(Box<crate::verify::record::RecordError>),
    #[error(transparent)]
    RemoteRecord(Box<record::RemoteRecordError>),
    /// `verify REF --from-log LOG --sign-key KEY` with a registry REF.
    #[error("--sign-key with a registry IMAGE: record the log in a layout (`cudastack pull`, `verify DIR --from-log LOG --sign-key KEY`) and push it, so what is signed is what was checked here")]
    SignRemoteLog,
    /// A descriptor of the layout's image index whose digest does not parse.
    #[error("{0}")]
    Descriptor(String),
    /// A check of the probe failed: the build fails, the report stays in the layout.
    #[error("verification failed: {} (report stored as {report_ref} in {})", checks.join(", "), layout.display())]
    VerificationFailed {
        checks: Vec<String>,
        report_ref: String,
        layout: PathBuf,
    },
    /// `build --push`: a layer's blob sent while the image was building could not be
    /// uploaded, so nothing more goes up (no manifest).
    #[error("Failed to upload layer `{layer}` while the image was building, so no manifest was pushed\n  hint: the registry's answer is below; once it accepts uploads again, run the same build (cached layers are not rebuilt) or `cudastack push` the layout")]
    EarlyUpload {
        layer: String,
        #[source]
        source: Box<crate::registry::RegistryError>,
    },
    /// The early-upload task itself ended without an answer (it panicked or was cancelled).
    #[error("the task uploading layers while the image was building stopped: {detail}")]
    EarlyUploadTask { detail: String },
    /// `cudastack sbom` of an image with no SBOM of that format stored beside it.
    #[error("{image} has no {format} SBOM stored beside it\n  hint: cudastack stores one when it builds an image (in the layout, and pushed with it); an image pulled with `cudastack pull` keeps its referrers, one pulled or built by another tool has none, and a Docker daemon keeps none beside any image: read it from the image's layout or registry")]
    NoSbom { image: String, format: &'static str },
    /// `--platform` names another platform than the daemon's image is of.
    #[error("`{image}` in the Docker daemon is a {holds} image, not {asked}; a daemon holds one platform's image per name\n  hint: read the {asked} image from its registry or OCI layout")]
    DaemonPlatform {
        image: String,
        asked: String,
        holds: String,
    },
    /// A report recorded on an image of the Docker daemon, which keeps nothing beside it.
    #[error("`{image}` is an image of the Docker daemon, which keeps no report or signature beside an image\n  hint: record the log on the image's OCI layout or on the image in its registry")]
    DaemonKeepsNoReferrers { image: String },
    /// `--load` of a build without an image of this host's platform.
    #[error("--load: this build has no image for this host's platform ({architecture}); Docker runs images of its own platform")]
    NoHostImageToLoad { architecture: &'static str },
}

/// `?` on a stage's error boxes it into its variant.
macro_rules! boxed_from {
    ($($variant:ident: $error:ty),* $(,)?) => {$(
        impl From<$error> for PipelineError {
            fn from(error: $error) -> Self {
                PipelineError::$variant(Box::new(error))
            }
        }
    )*};
}

boxed_from!(
    Recipe: crate::recipe::RecipeError,
    Build: crate::stack::BuildError,
    SourceBuild: crate::source_build::SourceBuildError,
    Verify: crate::verify::runner::VerifyError,
    Engine: crate::engine::EngineError,
    Registry: crate::registry::RegistryError,
    Layout: crate::oci::OciError,
    Source: crate::verify::source::SourceError,
    Attest: crate::attest::AttestError,
    Report: crate::verify::report::ReportError,
    Record: crate::verify::record::RecordError,
    RemoteRecord: record::RemoteRecordError,
);

/// What a person watching the pipeline reads (stderr in the binary, nothing with
/// `--quiet`). The build's own stages and downloads go through [`BuildProgress`].
pub trait Progress: Send + Sync {
    /// One line of status: a stage skipped, started or done.
    fn status(&self, line: &str);
    /// The verification report of the verify stage, as `verify` renders it.
    fn verification(&self, report: &Report);
}

/// A push destination, resolved before the build starts so that a typo in the reference
/// or missing credentials fail at once rather than after a long build.
pub struct PushTarget {
    pub reference: Reference,
    pub client: ClientOptions,
    pub settings: PushSettings,
}

/// What `cudastack build` does: the build's settings and which later stages run.
pub struct PipelineSettings {
    pub build: BuildSettings,
    /// Run the verification stage as the recipe's `verify.gpu` asks (`--no-verify`: false).
    pub verify: bool,
    /// Load the image into the Docker daemon, tagged with the recipe's tags.
    pub load: bool,
    pub push: Option<PushTarget>,
    /// Sign the image's statements (SBOM, provenance, verification) before loading and
    /// pushing (`--sign-key`).
    pub sign_key: Option<crate::sign::key::SigningKey>,
    /// Where the wheels of source builds are fetched from and shared to (`--wheel-cache`).
    pub wheel_cache: Option<shared_wheels::SharedWheels>,
}

/// What the pipeline did, stage by stage. Serialised as `build --json`: the build report's
/// keys, and `verify`, `load` and `push` for the stages that ran (the binary prints every
/// object's keys sorted, as `build --json` always was).
#[derive(Debug, Serialize)]
pub struct PipelineReport {
    #[serde(flatten)]
    pub build: BuildReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyOutcome>,
    /// The statements signed (`--sign-key`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub signed: Vec<crate::attest::store::Signed>,
    /// What went into Docker while the build ran, when a load followed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_load: Option<early_load::EarlyLoadReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub push: Option<PushReport>,
}

/// Build, verify, load, push: each stage runs on the image the one before produced, and
/// an error stops the pipeline there. Verification comes before loading and pushing, so a
/// verified image is what gets published; both verify and load run the image of this
/// host's platform, while an image index is pushed whole.
pub async fn build_verify_publish(
    settings: &PipelineSettings,
    matrix: &Matrix,
    build_progress: &dyn BuildProgress,
    progress: &dyn Progress,
) -> Result<PipelineReport, PipelineError> {
    // Loaded and checked once: the build and the verification policy read the same facts.
    let resolved = resolve_for_build(&settings.build.recipe_path, matrix)?;
    let mut early_loads = early_loads_for(settings, &resolved);
    let loads_progress = early_loads
        .as_ref()
        .map(|loads| loads.progress(build_progress));
    let build_progress: &dyn BuildProgress = match &loads_progress {
        Some(loads_progress) => loads_progress,
        None => build_progress,
    };
    let report = stages(
        settings,
        &resolved,
        matrix,
        build_progress,
        early_loads.as_mut(),
        progress,
    )
    .await;
    if let Some(loads) = early_loads.as_mut() {
        loads.remove_steps().await;
    }
    report
}

/// Whether the build loads its lower layers into Docker while it builds the upper ones:
/// when a load follows it (the verification's, unless the recipe skips it, or `--load`),
/// of its one image, built for this host (Docker runs images of its own platform).
fn early_loads_for(settings: &PipelineSettings, resolved: &ResolvedRecipe) -> Option<EarlyLoads> {
    let verifies = settings.verify && resolved.verify_policy() != GpuPolicy::Skip;
    let [platform] = resolved.platforms() else {
        return None;
    };
    ((verifies || settings.load) && Platform::host() == Some(*platform))
        .then(|| EarlyLoads::start(platform.to_oci_arch(), oci_spec::image::Os::Linux))
}

/// [`build_verify_publish`]'s stages, the early loads (if any) fed by `build_progress`.
async fn stages(
    settings: &PipelineSettings,
    resolved: &ResolvedRecipe,
    matrix: &Matrix,
    build_progress: &dyn BuildProgress,
    early_loads: Option<&mut EarlyLoads>,
    progress: &dyn Progress,
) -> Result<PipelineReport, PipelineError> {
    let policy = resolved.verify_policy();
    // `--push`: each layer goes up as soon as it is built; the manifest only after verifying.
    // A reference pinned to a digest uploads nothing before the push stage has checked the
    // built manifest against it.
    // Early uploads read cached blobs after the build has ended: keep `cache prune` off
    // them (it removes blobs only while no one holds this lock) until the push is done.
    let _cache_in_use = settings
        .push
        .as_ref()
        .and_then(|_| crate::cache::hold_builds_lock(&settings.build.cache_root));
    let early = match &settings.push {
        Some(target) if target.reference.digest().is_none() => Some(EarlyUploads::start(target)?),
        _ => None,
    };
    let built = match &early {
        Some(early) => {
            build(
                &settings.build,
                resolved,
                matrix,
                settings.wheel_cache.as_ref(),
                &early.progress(build_progress),
            )
            .await?
        }
        None => {
            let wheel_cache = settings.wheel_cache.as_ref();
            build(
                &settings.build,
                resolved,
                matrix,
                wheel_cache,
                build_progress,
            )
            .await?
        }
    };
    // The load after the build must find the early loads' layers, not race them.
    let mut early_loads = early_loads;
    let mut early_load = None;
    if let Some(loads) = early_loads.as_deref_mut() {
        loads.finish().await;
        let report = loads.report();
        if report.steps > 0 || report.stopped.is_some() {
            progress.status(&report.summary());
        }
        early_load = Some(report);
    }
    attest::after_build(&settings.build, &built, progress)?;
    // A failed upload fails the build now, before a verification that would be wasted.
    let mut early = early;
    let mut sent_early = None;
    if let Some(failed) = early.take_if(|early| early.failed()) {
        sent_early = Some(failed.finish().await?);
    }
    let verified = if settings.verify {
        let keep_loaded = settings.load;
        verify::after_build(
            &built,
            policy,
            &settings.build.cache_root,
            keep_loaded,
            progress,
        )
        .await?
    } else {
        None
    };
    let name = attest::image_name(&built);
    if let Some(outcome) = &verified {
        attest::after_verify(
            &built.layout,
            &outcome.report,
            &outcome.recorded,
            &name,
            settings.sign_key.as_ref(),
        )?;
    }
    let signed = match &settings.sign_key {
        Some(key) => attest::sign(&built.layout, &built.ref_name, &name, key, progress)?,
        None => Vec::new(),
    };
    let loaded = if settings.load {
        let verified_image = verified
            .as_ref()
            .and_then(|outcome| outcome.recorded.verified_image.as_ref());
        let loaded = load_built(&built, verified_image, progress).await;
        let left_loaded = verified.as_ref().and_then(|outcome| outcome.left_loaded);
        let loaded_id = loaded.as_ref().ok().map(|report| &report.image_id);
        verify::remove_left_loaded(left_loaded, loaded_id).await;
        Some(loaded?)
    } else {
        None
    };
    // The loads are done: the steps' layers are held by what was loaded, if anything.
    if let Some(loads) = early_loads {
        loads.remove_steps().await;
    }
    let pushed = match &settings.push {
        Some(target) => {
            let sent = match (sent_early, early) {
                (Some(sent), _) => sent,
                (None, Some(early)) => early.finish().await?,
                (None, None) => SentWhileBuilding::default(),
            };
            let destination = push::Destination {
                reference: &target.reference,
                settings: &target.settings,
                client_options: target.client.clone(),
            };
            Some(
                push::push_after(&built.layout, &built.ref_name, &destination, sent, progress)
                    .await?,
            )
        }
        None => None,
    };
    Ok(PipelineReport {
        build: built,
        verify: verified,
        signed,
        early_load,
        load: loaded,
        push: pushed,
    })
}

/// `build --load`: the image of this host's platform (its verified copy when the
/// verification made one), tagged with the build's tags (with several platforms they name
/// the image index, and the host's image gets them in Docker).
async fn load_built(
    built: &BuildReport,
    verified: Option<&LayoutImage>,
    progress: &dyn Progress,
) -> Result<LoadReport, PipelineError> {
    let Some(host_image) = verified.or(built.host_image.as_ref()) else {
        return Err(PipelineError::NoHostImageToLoad {
            architecture: crate::platform::host_cpu(),
        });
    };
    load::load(host_image, &built.tags, progress).await
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Mutex;

    use super::*;
    use crate::digest::Digest;
    use crate::stack::{AuditSummary, PlatformReport};

    /// Collects the status lines a stage says.
    #[derive(Default)]
    struct Lines(Mutex<Vec<String>>);

    impl Progress for Lines {
        fn status(&self, line: &str) {
            self.0.lock().unwrap().push(line.to_string());
        }
        fn verification(&self, _: &Report) {
            self.0.lock().unwrap().push("<report>".to_string());
        }
    }

    /// A built arm64-only image on a host of another platform (`host_ref` None), or an
    /// image of this host's platform.
    fn built(host_ref: Option<&str>) -> BuildReport {
        let audit = AuditSummary {
            elf_files: 0,
            needed_checked: 0,
            symlinks: 0,
            distributions: 0,
            kernels: None,
        };
        let digest = Digest::of_bytes(b"manifest");
        BuildReport {
            recipe: "r".into(),
            manifest_digest: digest,
            layout: "images/r".into(),
            ref_name: "latest".into(),
            tags: vec!["localhost/r:1".into()],
            host_ref: host_ref.map(str::to_string),
            named_by_default: false,
            host_image: host_ref.map(|name| {
                let image = crate::oci::StoredImage::of(&crate::oci::Image::new(0)).unwrap();
                crate::oci::layout::LayoutImage::written(Path::new("images/r"), name, &[], image)
            }),
            layers: Vec::new(),
            size: 0,
            audit: audit.clone(),
            audit_cached: false,
            platforms: vec![PlatformReport {
                platform: "linux/riscv64".into(),
                manifest_digest: digest,
                ref_name: "latest".into(),
                layers: Vec::new(),
                size: 0,
                audit,
                audit_cached: false,
                built_from: Default::default(),
            }],
        }
    }

    #[tokio::test]
    async fn verify_says_why_it_skips_a_build_without_a_host_image() {
        let lines = Lines::default();
        let outcome = verify::after_build(
            &built(None),
            crate::recipe::GpuPolicy::Required,
            Path::new("/nonexistent"),
            false,
            &lines,
        )
        .await
        .unwrap();
        assert!(outcome.is_none());
        assert_eq!(
            lines.0.into_inner().unwrap(),
            [format!(
                "verify  skipped: this build has no image for this host ({}); verify it on a linux/riscv64 machine",
                std::env::consts::ARCH
            )]
        );
    }

    #[tokio::test]
    async fn verify_runs_nothing_when_the_recipe_says_skip() {
        let lines = Lines::default();
        let outcome = verify::after_build(
            &built(Some("latest")),
            crate::recipe::GpuPolicy::Skip,
            Path::new("/nonexistent"),
            false,
            &lines,
        )
        .await
        .unwrap();
        assert!(outcome.is_none());
        assert_eq!(
            lines.0.into_inner().unwrap(),
            ["verify  skipped: the recipe says verify.gpu: skip"]
        );
    }

    #[tokio::test]
    async fn load_refuses_a_build_without_a_host_image_before_any_daemon() {
        let lines = Lines::default();
        let error = load_built(&built(None), None, &lines).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "--load: this build has no image for this host's platform ({}); Docker runs images of its own platform",
                std::env::consts::ARCH
            )
        );
        assert!(lines.0.into_inner().unwrap().is_empty());
    }

    #[test]
    fn the_report_serialises_as_the_build_report_plus_the_stages_that_ran() {
        let report = PipelineReport {
            build: built(Some("latest")),
            verify: None,
            signed: Vec::new(),
            early_load: None,
            load: None,
            push: None,
        };
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(value, serde_json::to_value(&report.build).unwrap());
    }

    /// `build --json` was the build report as a `serde_json::Value` with a key patched in
    /// per stage; the typed report must give the same document.
    #[test]
    fn the_report_is_the_document_build_json_always_printed() {
        let load = LoadReport {
            image_id: Digest::of_bytes(b"config"),
            skipped: true,
            bytes: 0,
            seconds: 0.5,
            layers_present: 2,
            layers: 2,
            requests: 0,
            tags: vec!["localhost/r:1".into()],
        };
        let report = PipelineReport {
            build: built(Some("latest")),
            verify: None,
            signed: Vec::new(),
            early_load: None,
            load: Some(load.clone()),
            push: None,
        };
        let mut patched = serde_json::to_value(&report.build).unwrap();
        patched["load"] = serde_json::to_value(&load).unwrap();
        assert_eq!(
            serde_json::to_string_pretty(&serde_json::to_value(&report).unwrap()).unwrap(),
            serde_json::to_string_pretty(&patched).unwrap()
        );
    }
}
