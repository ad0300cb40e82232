//! `cudastack inspect IMAGE`: the declared and the verified matrix of an image, from its
//! config alone.

use std::process::ExitCode;

use clap::Args;
use cudastack::attest::describe::ReferrerSummary;
use cudastack::audit::kernels::render_groups;
use cudastack::pipeline::inspect::{inspect, Inspection};
use cudastack::printable::escape;
use cudastack::verify::check::{ImageClaims, Lineage};

use super::args::ImageArgs;
use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub image: ImageArgs,
    /// Check the signatures of the image's signed statements with this public key
    /// (cosign's PEM format).
    #[arg(long, value_name = "KEY.pub")]
    pub key: Option<std::ffi::OsString>,
}

pub fn run(args: InspectArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let image = args.image.resolve()?;
    let key = args
        .key
        .as_deref()
        .map(|key| {
            cudastack::sign::key::PublicKey::load(&cudastack::sign::key::KeySource::parse(key))
        })
        .transpose()?;
    let inspection = runtime.block_on(inspect(&image.source()?, image.platform, key.as_ref()))?;
    if let Some(line) = &inspection.over_budget {
        printer.status(format!("warning: {line}"));
    }
    if printer.json {
        printer.json(&inspection);
        return Ok(ExitCode::SUCCESS);
    }
    print_human(&inspection, printer);
    printer.status(format!(
        "read {} bytes of manifest and config, and the referrers' documents",
        inspection.documents.bytes_read
    ));
    Ok(ExitCode::SUCCESS)
}

/// The human output: where the image is, its digests, what it declares (recipe, versions,
/// driver floor, kernels), where it was verified, and the report stored beside it.
fn print_human(inspection: &Inspection, printer: &Printer) {
    let documents = &inspection.documents;
    let claims = &inspection.declared;
    // Label values are the image author's text: each stays on its line.
    let or_none = |v: &Option<String>| v.as_deref().map_or("-".into(), |v| escape(v).into_owned());
    printer.line(escape(&documents.location));
    match &documents.manifest_digest {
        Some(digest) => printer.line(format_args!("  manifest      {digest}")),
        None => printer.line("  manifest      - (the Docker daemon keeps none for this image)"),
    }
    match &documents.config_digest {
        Some(digest) => printer.line(format_args!("  config        {digest}")),
        None => {
            printer.line("  config        - (the Docker daemon names this image by its manifest)")
        }
    }
    if let Some(layers) = describe_lineage(claims.lineage) {
        printer.line(format_args!("  layers        {layers}"));
    }
    printer.line(format_args!("  recipe        {}", or_none(&claims.recipe)));
    printer.line(format_args!("  torch         {}", or_none(&claims.torch)));
    printer.line(format_args!("  CUDA          {}", or_none(&claims.cuda)));
    printer.line(format_args!("  cuDNN         {}", or_none(&claims.cudnn)));
    printer.line(format_args!(
        "  driver floor  {}",
        claims
            .driver_floor
            .as_ref()
            .map(|d| d.to_string())
            .unwrap_or_else(|| "-".into())
    ));
    printer.line(format_args!(
        "  requires      {}",
        inspection
            .env
            .get("NVIDIA_REQUIRE_CUDA")
            .map_or("-".into(), |v| escape(v).into_owned())
    ));
    printer.line(format_args!(
        "  torch sm      {}",
        if claims.sm.is_empty() {
            "-".to_string()
        } else {
            claims
                .sm
                .iter()
                .map(|c| c.sm())
                .collect::<Vec<_>>()
                .join(" ")
        }
    ));
    print_kernels(claims, printer);
    if claims.verified.is_empty() {
        printer.line("  verified      no (no io.cudastack.verified label)");
    } else {
        printer.line("  verified on:");
        for row in &claims.verified {
            printer.line(format_args!(
                "    {} x{} (compute capability {}), driver {} (CUDA {}), {} checks passed, {} by cudastack {}",
                escape(&row.gpu),
                row.count,
                escape(&row.compute_capability),
                escape(&row.driver),
                escape(row.cuda_driver.as_deref().unwrap_or("?")),
                row.checks.len(),
                escape(&row.date),
                escape(&row.cudastack)
            ));
        }
    }
    if let Some(report) = &inspection.report_ref {
        printer.line(format_args!(
            "  report        {} (in the layout)",
            escape(report)
        ));
    }
    print_referrers(&inspection.referrers, printer);
    print_unread(inspection, printer);
}

/// Which of the image's layers its claims describe; None when the image does not say.
fn describe_lineage(lineage: Lineage) -> Option<String> {
    match lineage {
        Lineage::Unrecorded => None,
        Lineage::Built { layers } => Some(format!("{layers}, as cudastack built them")),
        Lineage::Derived { base, added } => Some(format!(
            "{}: a cudastack image's {base} and {added} added by another tool; what it declares below is that image's, not the added layers'",
            base + added
        )),
        Lineage::Mismatched => Some(format!(
            "not those its io.cudastack labels were written for ({} names other layers: squashed, or rebuilt with the labels copied); what it declares below does not describe it",
            cudastack::labels::LAYERS
        )),
    }
}

/// How many referrers were not read, and why the first was not: what `inspect`
/// lists is what it read, and it says what it left.
fn print_unread(inspection: &Inspection, printer: &Printer) {
    if let Some(first) = inspection.referrers_skipped.first() {
        printer.line(format_args!(
            "  not read      {} referrer(s); the first, {}: {}",
            inspection.referrers_skipped.len(),
            escape(&first.digest),
            escape(&first.why)
        ));
    }
    if inspection.referrers_of_other_types > 0 {
        printer.line(format_args!(
            "  other types   {} referrer(s) of types cudastack does not read (not fetched)",
            inspection.referrers_of_other_types
        ));
    }
}

/// Each referrer: its kind and type, who signed it, then what it says.
fn print_referrers(referrers: &[ReferrerSummary], printer: &Printer) {
    if referrers.is_empty() {
        printer.line(
            "  referrers     none (no SBOM, provenance or signed statement stored with the image)",
        );
        return;
    }
    printer.line("  referrers:");
    for referrer in referrers {
        let what = referrer
            .predicate_type
            .clone()
            .unwrap_or_else(|| referrer.artifact_type.clone());
        printer.line(format_args!(
            "    {}  {what}",
            referrer.kind.as_deref().unwrap_or("-")
        ));
        let short = |id: &str| id.chars().take(12).collect::<String>();
        match &referrer.signature {
            Some(signature) => match &signature.key_id {
                Some(id) => printer.line(format_args!(
                    "      signed by key {}: {}",
                    short(id),
                    signature.status
                )),
                None => printer.line(format_args!(
                    "      says it is signed by key {}: {}",
                    signature
                        .claimed_key_id
                        .as_deref()
                        .map(short)
                        .unwrap_or_else(|| "(unnamed)".into()),
                    signature.status
                )),
            },
            None if referrer.predicate_type.is_some() => printer.line("      unsigned"),
            None => {}
        }
        if !referrer.subjects.is_empty() {
            printer.line(format_args!("      about {}", referrer.subjects.join(", ")));
        }
        for line in &referrer.detail {
            printer.line(format_args!("      {line}"));
        }
    }
}

/// The kernel-coverage table (`io.cudastack.kernels`): each group of libraries with the
/// same GPU code, its SASS and PTX targets, then its libraries.
fn print_kernels(claims: &ImageClaims, printer: &Printer) {
    if let Some(error) = &claims.kernels_unreadable {
        printer.line(format_args!(
            "  GPU code      unreadable: the io.cudastack.kernels label does not parse ({})",
            escape(error)
        ));
        return;
    }
    if claims.kernels.is_empty() {
        printer.line("  GPU code      - (no io.cudastack.kernels label: built before the kernel audit, or no library has GPU code)");
        return;
    }
    let libraries: usize = claims.kernels.iter().map(|g| g.libraries.len()).sum();
    printer.line(format_args!(
        "  GPU code      {libraries} libraries; every one covers {}",
        if claims.covered_sm.is_empty() {
            "-".to_string()
        } else {
            claims
                .covered_sm
                .iter()
                .map(|c| c.sm())
                .collect::<Vec<_>>()
                .join(" ")
        }
    ));
    for line in render_groups(&claims.kernels).lines() {
        printer.line(format_args!("    {line}"));
    }
}
