//! `cudastack promote REF --require-gpu CLASS`: give a verified image in a registry its
//! plain tag once it has passed on every GPU class asked for; refuse with what is missing
//! or failed otherwise. One library call: `pipeline::promote`.

use std::process::ExitCode;

use clap::Args;
use cudastack::pipeline::promote::{promote, ClassStatus, PromoteError, PromoteSettings};
use cudastack::registry::Reference;

use super::{Async, CommandResult, Printer};

#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// The verified image in a registry: `repo:TAG-verified`, or `repo:TAG` for its
    /// `-verified` copy.
    pub image: String,
    /// A GPU class that must have a passing verification (a name the matrix knows, such as
    /// h100 or "RTX 4090", or a compute capability such as 9.0); repeatable, or
    /// comma-separated.
    #[arg(
        long = "require-gpu",
        value_name = "CLASS",
        required = true,
        value_delimiter = ','
    )]
    pub require_gpu: Vec<String>,
    /// The tag to give the verified image (default: IMAGE's tag without `-verified`).
    #[arg(long, value_name = "TAG")]
    pub to: Option<String>,
    /// A verified image to read, when each GPU type's verification pushed its own
    /// (`repo:2.4.1-verified-gpu-a100`); repeatable. Several are merged into one verified
    /// image with every row, tagged TAG and TAG-verified. Default: IMAGE's `-verified` tag.
    #[arg(long = "verified", value_name = "REF")]
    pub verified: Vec<String>,
    /// Check the evidence and print what would be tagged; tag nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub registry: super::args::RegistryArgs,
}

pub fn run(args: PromoteArgs, runtime: &Async, printer: &Printer) -> CommandResult {
    let reference: Reference = args.image.parse()?;
    let client = args.registry.resolve()?.client_options(&reference)?;
    let settings = PromoteSettings {
        require: args.require_gpu.clone(),
        to: args.to.clone(),
        dry_run: args.dry_run,
        verified: args
            .verified
            .iter()
            .map(|r| r.parse())
            .collect::<Result<_, _>>()?,
    };
    let promotion = match runtime
        .runtime()?
        .block_on(promote(&reference, &settings, client, printer))
    {
        Ok(promotion) => promotion,
        // A refusal is a negative answer (exit 1), as `check: no` is; errors exit 2.
        Err(refused @ PromoteError::Refused { .. }) => {
            super::printer::report_error(&refused);
            return Ok(ExitCode::from(1));
        }
        Err(error) => return Err(error.into()),
    };
    if printer.json {
        printer.json(&promotion);
        return Ok(ExitCode::SUCCESS);
    }
    for check in &promotion.classes {
        if let ClassStatus::Passed { gpu, driver, date } = &check.status {
            printer.status(format!(
                "{}: passed on {gpu}, driver {driver}, {date}",
                check.class
            ));
        }
    }
    if promotion.tagged {
        printer.line(&promotion.to);
    } else {
        printer.line(format_args!(
            "dry run: would tag {} as {}",
            promotion.verified, promotion.to
        ));
    }
    Ok(ExitCode::SUCCESS)
}
