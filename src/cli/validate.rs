//! `cudastack validate RECIPE...`

use std::path::PathBuf;
use std::process::ExitCode;

use cudastack::matrix::validate::{Severity, Validation};
use cudastack::matrix::{ResolveError, ResolvedRecipe};
use serde::Serialize;

use super::{CommandResult, Printer};

#[derive(Serialize)]
struct FileResult {
    path: String,
    valid: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    parse_error: Option<String>,
    /// The causes under `parse_error`, outermost first ("Permission denied (os error 13)",
    /// "invalid utf-8 sequence of 1 bytes from index 3").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    caused_by: Vec<String>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    validation: Option<Validation>,
}

pub fn run(paths: &[PathBuf], printer: &Printer) -> CommandResult {
    let loaded = super::matrix::load(printer)?;
    let matrix = loaded.matrix();
    let mut results = Vec::new();
    for path in paths {
        let checked = |validation: Validation| FileResult {
            path: path.display().to_string(),
            valid: validation.is_valid(),
            parse_error: None,
            caused_by: Vec::new(),
            validation: Some(validation),
        };
        // The same resolution `lock` and `build` start from: what is printed here is what
        // they decide.
        let result = match ResolvedRecipe::load(path, matrix) {
            Ok(resolved) => checked(resolved.validation().clone()),
            Err(ResolveError::Invalid(invalid)) => checked(invalid.validation),
            Err(ResolveError::Recipe(error)) => FileResult {
                path: path.display().to_string(),
                valid: false,
                parse_error: Some(error.to_string()),
                caused_by: causes(&error),
                validation: None,
            },
        };
        results.push(result);
    }
    let all_valid = results.iter().all(|r| r.valid);
    if printer.json {
        printer.json(&results);
    } else {
        for result in &results {
            print_human(result, printer);
        }
    }
    Ok(if all_valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The source chain of `error`, outermost first.
fn causes(error: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut causes = Vec::new();
    let mut source = error.source();
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    causes
}

fn print_human(result: &FileResult, printer: &Printer) {
    if let Some(error) = &result.parse_error {
        printer.line(format_args!("{}: invalid\n  error: {error}", result.path));
        for cause in &result.caused_by {
            printer.line(format_args!("  Caused by: {cause}"));
        }
        return;
    }
    let Some(validation) = &result.validation else {
        return;
    };
    let errors = validation.errors().count();
    if errors == 0 {
        let mut facts = Vec::new();
        if let Some(build) = &validation.torch_build {
            facts.push(format!("torch {build}"));
        }
        if let Some(require) = &validation.nvidia_require_cuda {
            facts.push(format!("NVIDIA_REQUIRE_CUDA={require}"));
        }
        printer.line(format_args!(
            "{}: valid ({})",
            result.path,
            facts.join(", ")
        ));
    } else {
        printer.line(format_args!(
            "{}: invalid, {errors} error{}",
            result.path,
            if errors == 1 { "" } else { "s" }
        ));
    }
    for problem in &validation.problems {
        let label = match problem.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        };
        printer.line(format_args!(
            "  {label}[{}]: {}",
            problem.code, problem.what
        ));
        printer.line(format_args!("    why:  {}", problem.why));
        printer.line(format_args!("    hint: {}", problem.hint));
    }
}
