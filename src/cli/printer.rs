//! The one printer of the binary. stdout carries data only (tables, the final reference,
//! or `--json`); progress and logs go to stderr, and none of it with `--quiet`.
//!
//! Every byte the binary prints goes through [`write_stdout`] / [`write_stderr`], never
//! std's `println!` family (which panics, exit 101, when the reader of a pipe has gone:
//! `cudastack solve ... | head`); `clippy::print_stdout` and `clippy::print_stderr` are
//! denied in `cli` to keep it so.
//!
//! Human output is made terminal-safe here, at the one boundary: an image's
//! labels, a registry's error body or a file name may hold escape sequences, carriage
//! returns or bidi controls, and none of them reaches the terminal as it is
//! ([`cudastack::printable::escape_keeping_lines`]). A field that must stay on its line
//! is escaped whole by the command with [`cudastack::printable::escape`]. JSON is written
//! as serde made it: its strings are escaped already, and it must stay exact.

use std::fmt::Display;
use std::io::Write;

use cudastack::verify::report::Report;

/// The exit status when stdout is a pipe whose reader has gone: 128 + SIGPIPE, what a
/// shell reports for a process the signal ended (`yes | head` under `set -o pipefail`).
/// Not 0, so that `cudastack check IMG | head -1` under pipefail never turns a cut-off
/// "no" into success; not 101, which is a panic.
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// Write to stdout. When the reader has closed the pipe (EPIPE) there is nobody left to
/// tell: exit at once, quietly, with [`EXIT_BROKEN_PIPE`]. Any other write error (a full
/// disk behind `> file`) is an error like any other: said on stderr, exit 2.
fn write_stdout(arguments: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    let result = stdout.write_fmt(arguments).and_then(|()| stdout.flush());
    match result {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(EXIT_BROKEN_PIPE.into())
        }
        Err(error) => {
            write_stderr(format_args!("error: failed to write to stdout: {error}\n"));
            std::process::exit(2)
        }
    }
}

/// Write to stderr, ignoring failure: with stderr gone there is nowhere to report it.
fn write_stderr(arguments: std::fmt::Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(arguments);
}

/// What every command gets: output format and verbosity, and the only way to print.
pub struct Printer {
    pub json: bool,
    pub quiet: bool,
}

impl Printer {
    /// A JSON document on stdout, its keys in the order of the type's fields.
    pub fn json<T: serde::Serialize>(&self, value: &T) {
        let text = serde_json::to_string_pretty(value).expect("output types serialise");
        write_stdout(format_args!("{text}\n"));
    }

    /// A JSON document on stdout with the keys of every object sorted. `build --json` has
    /// always been printed so (it was assembled as a `serde_json::Value`, whose objects
    /// are sorted maps), and its output stays byte for byte what it was.
    pub fn json_sorted<T: serde::Serialize>(&self, value: &T) {
        let value = serde_json::to_value(value).expect("output types serialise");
        self.json(&value);
    }

    /// One line of data on stdout.
    pub fn line(&self, line: impl Display) {
        write_stdout(format_args!("{}\n", terminal_safe(line)));
    }

    /// Data on stdout (a rendered block that ends its own lines).
    pub fn text(&self, text: impl Display) {
        write_stdout(format_args!("{}", terminal_safe(text)));
    }

    /// A progress or log line on stderr, unless `--quiet`.
    pub fn status(&self, line: impl AsRef<str>) {
        if !self.quiet {
            write_stderr(format_args!("{}\n", terminal_safe(line.as_ref())));
        }
    }

    /// A block on stderr, unless `--quiet`.
    pub fn status_text(&self, text: impl Display) {
        if !self.quiet {
            write_stderr(format_args!("{}", terminal_safe(text)));
        }
    }
}

/// The pipeline's status lines and the verification report of `build` go to stderr.
impl cudastack::pipeline::Progress for Printer {
    fn status(&self, line: &str) {
        Printer::status(self, line);
    }
    fn verification(&self, report: &Report) {
        self.status_text(report.render_compact());
        if let Some(note) = report.runner.as_ref().and_then(|r| r.note.as_ref()) {
            let note = format!("note: {note}");
            self.status_text(cudastack::verify::report::wrap_line(
                &note,
                cudastack::verify::report::RENDER_WIDTH,
            ));
        }
    }
}

/// Print an error with its cause chain, cargo/uv style (always, even with `--quiet`).
/// A cause may quote a registry's or a daemon's answer: it is made terminal-safe too.
pub fn report_error(error: &(dyn std::error::Error + 'static)) {
    write_stderr(format_args!("error: {}\n", terminal_safe(error)));
    let mut source = error.source();
    while let Some(cause) = source {
        write_stderr(format_args!("  Caused by: {}\n", terminal_safe(cause)));
        source = cause.source();
    }
}

/// `text` with every control character but newline and tab, and every bidi control,
/// written as an escape.
fn terminal_safe(text: impl Display) -> String {
    let text = text.to_string();
    match cudastack::printable::escape_keeping_lines(&text) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(escaped) => escaped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_printed_for_a_person_carries_escape_codes_or_bidi_controls() {
        let label = "12.4\u{1b}]0;pwned\u{7}\rok\u{202E}\nnext line\ttab";
        let shown = terminal_safe(label);
        assert!(
            !shown.contains(['\u{1b}', '\r', '\u{7}', '\u{202E}']),
            "{shown:?}"
        );
        assert!(shown.contains("\nnext line\ttab"), "{shown:?}");
    }
}
