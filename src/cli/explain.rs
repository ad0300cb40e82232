//! `cudastack explain "TEXT" | --file LOG | -` (stdin when no text is given)

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cudastack::doctor::explain::Knowledge;

use super::{CommandResult, Printer};

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The error message (quote it). Without it (or with `-`), the text is read from stdin.
    text: Option<String>,
    /// Read the text from a log file.
    #[arg(long, value_name = "LOG", conflicts_with = "text")]
    file: Option<PathBuf>,
}

pub fn run(args: ExplainArgs, printer: &Printer) -> CommandResult {
    let text = match (&args.text, &args.file) {
        (_, Some(file)) => fs_err::read(file).map(|b| String::from_utf8_lossy(&b).into_owned())?,
        (Some(text), None) if text != "-" => text.clone(),
        _ => {
            if std::io::stdin().is_terminal() {
                printer.status("reading the error text from stdin (end it with Ctrl-D)");
            }
            let mut bytes = Vec::new();
            std::io::stdin().read_to_end(&mut bytes)?;
            String::from_utf8_lossy(&bytes).into_owned()
        }
    };
    let loaded = super::matrix::load(printer)?;
    let report = Knowledge::embedded().explain(&text, loaded.matrix());
    let code = if report.recognised {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    };
    if printer.json {
        printer.json(&report);
        return Ok(code);
    }
    if !report.recognised {
        printer.line("not recognised.");
        if let Some(suggestion) = &report.suggestion {
            printer.line(suggestion);
        }
        return Ok(code);
    }
    for (index, explanation) in report.explanations.iter().enumerate() {
        if index > 0 {
            printer.line("");
        }
        printer.line(format_args!("{} ({})", explanation.title, explanation.id));
        printer.line(format_args!("  matched: {}", explanation.matched));
        printer.line(format_args!("  cause: {}", explanation.cause));
        if !explanation.matrix.is_empty() {
            printer.line("  matrix:");
            for note in &explanation.matrix {
                printer.line(format_args!("    - {note}"));
            }
        }
        printer.line("  confirm:");
        for step in &explanation.confirm {
            printer.line(format_args!("    - {step}"));
        }
        if !explanation.decision.is_empty() {
            printer.line("  decide:");
            for (n, step) in explanation.decision.iter().enumerate() {
                printer.line(format_args!(
                    "    {}. if {}: {}",
                    n + 1,
                    step.when,
                    step.then
                ));
            }
        }
        printer.line("  fix:");
        for step in &explanation.fix {
            printer.line(format_args!("    - {step}"));
        }
        // Where the cause and fix come from, so a user can read the primary document.
        printer.line("  sources:");
        for source in &explanation.sources {
            printer.line(format_args!("    - {source}"));
        }
    }
    Ok(code)
}
