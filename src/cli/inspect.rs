//! `cudastack inspect IMAGE`: the declared and the verified matrix of an image, from its
//! config alone.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;
use cudastack::verify::check::ImageClaims;
use cudastack::verify::record::report_ref;
use cudastack::verify::source::{ImageDocuments, ImageLocation};
use serde::Serialize;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// `images/NAME`, `oci:DIR[:REF]`, or a registry reference `host/repo:tag`.
    pub image: String,
    /// The ref name inside an OCI layout.
    #[arg(long = "ref", default_value = "latest")]
    pub ref_name: String,
    /// Of a multi-platform image, the platform's image to read (`linux/amd64`,
    /// `linux/arm64`; default: this machine's).
    #[arg(long)]
    pub platform: Option<cudastack::recipe::Platform>,
    #[command(flatten)]
    pub registry: super::image_source::RegistryArgs,
}

#[derive(Serialize)]
struct Inspection<'a> {
    #[serde(flatten)]
    documents: &'a ImageDocuments,
    declared: &'a ImageClaims,
    env: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    report_ref: Option<String>,
}

pub fn run(args: InspectArgs, printer: &Printer) -> CommandResult {
    let location = ImageLocation::parse(&args.image, Some(&args.ref_name))?;
    let documents = super::image_source::read_documents(&location, &args.registry, args.platform)?;
    let config = documents.config.config().clone().unwrap_or_default();
    let (labels, env) = cudastack::verify::check::labels_and_env(&config);
    let claims = ImageClaims::from_labels_and_env(&labels, &env);
    let report = match &location {
        ImageLocation::Layout { dir, ref_name } => {
            let name = report_ref(&cudastack::verify::record::image_ref(dir, ref_name)?);
            cudastack::oci::layout::list_refs(dir)?
                .contains(&name)
                .then_some(name)
        }
        ImageLocation::Registry(_) => None,
    };
    let inspection = Inspection {
        documents: &documents,
        declared: &claims,
        env,
        labels,
        report_ref: report,
    };
    if printer.json {
        printer.json(&inspection);
        return Ok(ExitCode::SUCCESS);
    }
    let or_none = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".to_string());
    println!("{}", documents.location);
    println!("  manifest      {}", documents.manifest_digest);
    println!("  config        {}", documents.config_digest);
    println!("  recipe        {}", or_none(&claims.recipe));
    println!("  torch         {}", or_none(&claims.torch));
    println!("  CUDA          {}", or_none(&claims.cuda));
    println!("  cuDNN         {}", or_none(&claims.cudnn));
    println!(
        "  driver floor  {}",
        claims
            .driver_floor
            .as_ref()
            .map(|d| d.to_string())
            .unwrap_or_else(|| "-".into())
    );
    println!(
        "  requires      {}",
        inspection
            .env
            .get("NVIDIA_REQUIRE_CUDA")
            .cloned()
            .unwrap_or_else(|| "-".into())
    );
    println!(
        "  kernels       {}",
        claims
            .sm
            .iter()
            .map(|c| c.sm())
            .collect::<Vec<_>>()
            .join(" ")
    );
    if claims.verified.is_empty() {
        println!("  verified      no (no io.cudastack.verified label)");
    } else {
        println!("  verified on:");
        for row in &claims.verified {
            println!(
                "    {} x{} (compute capability {}), driver {} (CUDA {}), {} checks passed, {} by cudastack {}",
                row.gpu,
                row.count,
                row.compute_capability,
                row.driver,
                row.cuda_driver.as_deref().unwrap_or("?"),
                row.checks.len(),
                row.date,
                row.cudastack
            );
        }
    }
    if let Some(report) = &inspection.report_ref {
        println!("  report        {report} (in the layout)");
    }
    printer.status(format!(
        "read {} bytes (manifest and config only)",
        documents.bytes_read
    ));
    Ok(ExitCode::SUCCESS)
}
