//! The one gate every test goes through when it cannot run here (issue 17).
//!
//! A test that returns early because a component is missing must not count as a pass in
//! CI. The detection helpers (`e2e_support::skip_reason`, `oci_support::docker`,
//! `registry_support::skip_reason`, `elf_support::gcc_available`, ...) decide whether a
//! component is present; what happens when it is not is decided here, and only here:
//!
//! - With `CUDASTACK_REQUIRE=1` (scripts/test.sh sets it when `CI` is set) a missing
//!   component, or a developer switch such as `CUDASTACK_SKIP_E2E`, panics: the test fails
//!   and says what is missing.
//! - Otherwise the test prints `SKIP: reason` to stderr and appends one line
//!   (`test<TAB>component<TAB>reason`) to the skip log, which scripts/test.sh prints at the
//!   end of the run: `$CUDASTACK_SKIP_LOG`, or `target/test-skips.log`.
//!
//! Conditions of the host that CI meets too (root reads mode 0000 files, /dev/shm is not a
//! separate filesystem, the daemon has the nvidia runtime) are not missing components:
//! [`not_applicable`] logs them under the component `host` and never panics.
//!
//! Declared once in tests/suite.rs; test files and the `*_support` modules `use crate::gate`.
#![allow(dead_code)]

use std::fmt;
use std::io::Write;
use std::path::PathBuf;

/// The name libtest gives the test `name` of the test module whose `module_path!()` is
/// `module` (the path less the crate's name), for a test that runs another test of this
/// binary in a child process with `--exact`.
pub fn test_path(module: &str, name: &str) -> String {
    let module = module.split_once("::").map_or("", |(_crate, rest)| rest);
    if module.is_empty() {
        name.to_string()
    } else {
        format!("{module}::{name}")
    }
}

/// The environment variable that turns every skip of a missing component into a failure.
pub const REQUIRE: &str = "CUDASTACK_REQUIRE";
/// Where the skip log goes when set (scripts/test.sh sets it); else `target/test-skips.log`.
pub const SKIP_LOG: &str = "CUDASTACK_SKIP_LOG";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A program, service, privilege or network the test needs and CI provides.
    Missing,
    /// A developer switch (`CUDASTACK_SKIP_E2E`, `CUDASTACK_OFFLINE_TESTS`) that skips.
    Switch,
    /// A condition of this host, not a component: never fails a run.
    Host,
}

/// Why a test does not run (or runs only in part) here. Built by the detection helpers;
/// [`Skip::report`] is the one place that decides between failing and skipping.
#[derive(Debug, Clone)]
#[must_use = "a skip must be reported with .report()"]
pub struct Skip {
    kind: Kind,
    component: String,
    reason: String,
}

impl Skip {
    /// `component` (e.g. `docker`, `skopeo`, `network`, `root`) is missing: `reason` says
    /// what was found and how to provide it.
    pub fn missing(component: &str, reason: impl fmt::Display) -> Self {
        Self {
            kind: Kind::Missing,
            component: component.to_string(),
            reason: reason.to_string(),
        }
    }

    /// The developer switch `variable` is set and asks to skip; `what` says what it
    /// switches off (e.g. "this test needs https://pypi.org").
    pub fn switch(variable: &str, what: impl fmt::Display) -> Self {
        Self {
            kind: Kind::Switch,
            component: variable.to_string(),
            reason: format!("{variable} is set ({what})"),
        }
    }

    /// A condition of the host that makes the test (or part) meaningless here.
    pub fn host(reason: impl fmt::Display) -> Self {
        Self {
            kind: Kind::Host,
            component: "host".to_string(),
            reason: reason.to_string(),
        }
    }

    /// Fail under `CUDASTACK_REQUIRE` (unless this is a host condition); otherwise print
    /// `SKIP: reason` and log the skip. The caller returns (or leaves out the part) after.
    pub fn report(self) {
        if self.kind != Kind::Host && required() {
            match self.kind {
                Kind::Switch => panic!(
                    "{}, which skips this test, but {REQUIRE}=1 forbids skipping\n\
                     hint: unset {} (or {REQUIRE})",
                    self.reason, self.component
                ),
                _ => panic!(
                    "required component missing: {}: {}\n\
                     hint: install or start it (scripts/setup.sh, scripts/test.sh), or unset \
                     {REQUIRE} to let the test skip",
                    self.component, self.reason
                ),
            }
        }
        eprintln!("SKIP: {}", self.reason);
        log(&self.component, &self.reason);
    }
}

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// `component` is missing: fail under `CUDASTACK_REQUIRE`, else print and log the skip.
/// The caller returns (or leaves out the part that needs it).
pub fn skip(component: &str, reason: impl fmt::Display) {
    Skip::missing(component, reason).report()
}

/// A condition of this host, not a missing component: printed and logged, never a failure.
pub fn not_applicable(reason: impl fmt::Display) {
    Skip::host(reason).report()
}

/// True (after reporting the skip) when the developer switch `variable` is set to a value
/// `active` accepts; under `CUDASTACK_REQUIRE` a set switch fails the test instead.
pub fn switch(variable: &str, active: impl Fn(&std::ffi::OsStr) -> bool, reason: &str) -> bool {
    match std::env::var_os(variable) {
        Some(value) if active(&value) => {
            Skip::switch(variable, reason).report();
            true
        }
        _ => false,
    }
}

/// Whether `CUDASTACK_REQUIRE` asks for every component (set, and not empty or `0`).
pub fn required() -> bool {
    std::env::var_os(REQUIRE).is_some_and(|value| !value.is_empty() && value != "0")
}

/// The skip log: `$CUDASTACK_SKIP_LOG`, or `test-skips.log` in the target directory.
pub fn log_path() -> PathBuf {
    match std::env::var_os(SKIP_LOG) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => {
            let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
            tmp.parent().unwrap_or(tmp).join("test-skips.log")
        }
    }
}

/// Append one line: one buffer written to a file opened with O_APPEND, so lines of
/// tests running at the same time (threads and test binaries) do not interleave.
fn log(component: &str, reason: &str) {
    let thread = std::thread::current();
    let test = match thread.name() {
        // libtest names the thread after the test: `<file>::<test>` in the one suite binary.
        Some(name) if name != "main" => name.to_string(),
        _ => env!("CARGO_CRATE_NAME").to_string(),
    };
    let clean = |text: &str| text.replace(['\n', '\r', '\t'], " ");
    let line = format!("{test}\t{}\t{}\n", clean(component), clean(reason));
    let path = log_path();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(error) = written {
        eprintln!(
            "note: could not append to the skip log {}: {error}",
            path.display()
        );
    }
}
