//! Where a verified image may run, and the team's job there: `cudastack place IMAGE`
//! (node affinity, a DRA claim template, Slurm lines), `cudastack job IMAGE` (a Kubernetes
//! Job or an sbatch script running the image's entrypoint on those nodes) and
//! `cudastack admission IMAGE...` (a ValidatingAdmissionPolicy that refuses GPU pods
//! running images not verified for their GPU). Each reads the image's documents from its
//! registry once (`cluster::placed`), then one generator of `cudastack::cluster`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use cudastack::cluster::admission::{admission_manifests, AdmissionOptions};
use cudastack::cluster::dra::{self, KubernetesVersion, ResourceApi};
use cudastack::cluster::job::TrainingJob;
use cudastack::cluster::placed::{placed_image, PlacedImage};
use cudastack::cluster::site_features::{SiteFeatures, SlurmPlacement};
use cudastack::cluster::slurm::{training_script, Runtime};
use cudastack::cluster::training::{training_manifests, GpuRequest, KubernetesOptions};
use cudastack::sign::key::{KeySource, PublicKey};
use cudastack::verify::source::ImageLocation;

use super::args::RegistryArgs;
use super::{Async, CommandResult, Printer};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// What every command here reads an image with.
#[derive(Debug, Args)]
pub struct SourceArgs {
    #[arg(
        long,
        help = super::image_source::platform_help(
            "Of a multi-platform image, the platform whose image the nodes run (`linux/arm64` for GH200 nodes)"
        )
    )]
    pub platform: Option<cudastack::recipe::Platform>,
    /// Admit only the GPU products of verifications signed by this public key (cosign's
    /// PEM format), not the products the image's own labels name.
    #[arg(long, value_name = "KEY.pub")]
    pub require_signed_by: Option<std::ffi::OsString>,
    #[command(flatten)]
    pub registry: RegistryArgs,
}

/// The image `text` placed: pinned, with its verified products, floor and entrypoint.
fn place_image(
    text: &str,
    args: &SourceArgs,
    runtime: &Async,
    printer: &Printer,
) -> Result<PlacedImage, Error> {
    let registry = args.registry.resolve()?;
    let location = ImageLocation::parse(text, None)?;
    let key = match &args.require_signed_by {
        Some(path) => Some(PublicKey::load(&KeySource::parse(path))?),
        None => None,
    };
    let signed = match &key {
        Some(key) => Some((registry.source(&location)?, key)),
        None => None,
    };
    let placed = runtime.block_on(placed_image(
        text,
        registry.source(&location)?,
        args.platform,
        signed,
    ))?;
    printer.status(format!(
        "{}: {}",
        placed.image.by_digest(),
        placed.placement.summary()
    ));
    Ok(placed)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PlaceTarget {
    /// Node affinity over GPU feature discovery's labels, for a pod spec.
    K8s,
    /// A DRA ResourceClaimTemplate for NVIDIA's DRA driver.
    Dra,
    /// #SBATCH lines from a site feature map (--site-features).
    Slurm,
}

#[derive(Debug, Args)]
pub struct PlaceArgs {
    /// The verified image in a registry: `host/repo:tag` or `host/repo@sha256:…`.
    pub image: String,
    /// What to write.
    #[arg(long = "for", value_enum, default_value = "k8s")]
    pub target: PlaceTarget,
    /// The cluster's Kubernetes version, which decides the DRA API version (1.32:
    /// v1beta1, 1.33: v1beta2, 1.34 and newer: v1).
    #[arg(long, default_value = "1.34")]
    pub kube_version: KubernetesVersion,
    /// With --for dra: the namespace of the ResourceClaimTemplate.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// With --for dra: GPUs per claim; with --for slurm: GPUs per node.
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// With --for slurm: the site's feature map (docs/cluster.md).
    #[arg(long, value_name = "FILE")]
    pub site_features: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
}

pub fn place(args: PlaceArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let placed = place_image(&args.image, &args.source, runtime, printer)?;
    let text = match args.target {
        PlaceTarget::K8s => cudastack::cluster::k8s::affinity_yaml(&placed.placement)?,
        PlaceTarget::Dra => dra::claim_template(
            &format!("{}-gpus", TrainingJob::default_name(&placed.image)),
            &args.namespace,
            args.gpus,
            &placed.placement,
            ResourceApi::for_kubernetes(args.kube_version.minor)?,
        )?,
        PlaceTarget::Slurm => {
            let site = site_features(args.site_features.as_deref())?;
            slurm_placement_lines(&placed, &site, args.gpus, printer)?
        }
    };
    printer.text(text);
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum JobTarget {
    /// A Kubernetes Job (an Indexed Job and a headless Service for several nodes).
    K8s,
    /// A Slurm sbatch script running the image with pyxis/enroot.
    Sbatch,
    /// A Slurm sbatch script running the image with Apptainer.
    SbatchApptainer,
}

#[derive(Debug, Args)]
pub struct JobArgs {
    /// The verified image in a registry: `host/repo:tag` or `host/repo@sha256:…`.
    pub image: String,
    /// What to write.
    #[arg(long = "for", value_enum, default_value = "k8s")]
    pub target: JobTarget,
    /// Nodes the job spans.
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// GPUs per node; with more than one GPU in all, a Python entrypoint starts through
    /// torchrun, one process per GPU.
    #[arg(long, default_value_t = 1)]
    pub gpus_per_node: u32,
    /// The job's name (default: the repository's name and the digest's first 8 digits).
    #[arg(long)]
    pub name: Option<String>,
    /// Kubernetes: the namespace.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Kubernetes: ask for the GPUs with a DRA claim (NVIDIA's DRA driver) instead of the
    /// device plugin's nvidia.com/gpu on nodes chosen by affinity.
    #[arg(long)]
    pub dra: bool,
    /// Kubernetes: the cluster's version, which decides the DRA API version.
    #[arg(long, default_value = "1.34")]
    pub kube_version: KubernetesVersion,
    /// Kubernetes: a Secret the kubelet pulls the image with; repeatable.
    #[arg(long, value_name = "NAME")]
    pub image_pull_secret: Vec<String>,
    /// Slurm: the site's feature map (docs/cluster.md).
    #[arg(long, value_name = "FILE")]
    pub site_features: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
    /// The command to run instead of the image's entrypoint and command.
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub fn job(args: JobArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let placed = place_image(&args.image, &args.source, runtime, printer)?;
    let job = TrainingJob {
        name: args
            .name
            .clone()
            .unwrap_or_else(|| TrainingJob::default_name(&placed.image)),
        image: placed.image.clone(),
        command: if args.command.is_empty() {
            placed.command.clone()
        } else {
            args.command.clone()
        },
        working_dir: placed.working_dir.clone(),
        start_guard: placed.start_guard.clone(),
        nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        needs: placed.needs.clone(),
        placement: placed.placement.clone(),
    };
    let text = match args.target {
        JobTarget::K8s => training_manifests(
            &job,
            &KubernetesOptions {
                namespace: args.namespace.clone(),
                image_pull_secrets: args.image_pull_secret.clone(),
                gpus: if args.dra {
                    GpuRequest::Dra(ResourceApi::for_kubernetes(args.kube_version.minor)?)
                } else {
                    GpuRequest::DevicePlugin
                },
            },
        )?,
        JobTarget::Sbatch | JobTarget::SbatchApptainer => {
            let site = site_features(args.site_features.as_deref())?;
            slurm_training_script(&job, args.target, &site, printer)?
        }
    };
    printer.text(text);
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct AdmissionArgs {
    /// The verified images the policy admits, in their registry; each pod's GPU containers
    /// must run one of them, by digest, verified for the GPU product the pod names.
    #[arg(required = true)]
    pub images: Vec<String>,
    /// The namespace of the parameters (a ConfigMap of verified digests per GPU product).
    #[arg(long, default_value = "cudastack-system")]
    pub params_namespace: String,
    #[command(flatten)]
    pub source: SourceArgs,
}

pub fn admission(args: AdmissionArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let mut images = Vec::new();
    for text in &args.images {
        let placed = place_image(text, &args.source, runtime, printer)?;
        images.push((placed.image, placed.placement));
    }
    let text = admission_manifests(
        &images,
        &AdmissionOptions {
            params_namespace: args.params_namespace.clone(),
        },
    )?;
    printer.text(text);
    Ok(ExitCode::SUCCESS)
}

/// The site's feature map, which every Slurm output needs.
fn site_features(path: Option<&std::path::Path>) -> Result<SiteFeatures, Error> {
    let path = path.ok_or(
        "Slurm places jobs by node features, which only the site knows: give --site-features FILE (docs/cluster.md, \"Slurm\")",
    )?;
    Ok(SiteFeatures::load(path)?)
}

/// What was left out of a Slurm placement, on stderr.
fn print_notes(placement: &SlurmPlacement, printer: &Printer) {
    for note in &placement.notes {
        printer.status(format!("note: {note}"));
    }
}

/// `#SBATCH` lines admitting the image's nodes on the site, `gpus` per node.
fn slurm_placement_lines(
    placed: &PlacedImage,
    site: &SiteFeatures,
    gpus: u32,
    printer: &Printer,
) -> Result<String, Error> {
    let placement = SlurmPlacement::admit(&placed.placement, site)?;
    print_notes(&placement, printer);
    Ok(format!(
        "# Slurm placement generated by cudastack for {}: {placement}\n#SBATCH --constraint=\"{}\"\n#SBATCH {}\n",
        placed.image.by_digest(),
        placement.constraint,
        placement.gpu_request(gpus)
    ))
}

/// The training job as an sbatch script for `target`'s runtime.
fn slurm_training_script(
    job: &TrainingJob,
    target: JobTarget,
    site: &SiteFeatures,
    printer: &Printer,
) -> Result<String, Error> {
    let runtime = match target {
        JobTarget::SbatchApptainer => Runtime::Apptainer,
        _ => Runtime::Pyxis,
    };
    let sbatch = training_script(job, runtime, site)?;
    print_notes(&sbatch.placement, printer);
    Ok(sbatch.script)
}
