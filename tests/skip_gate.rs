//! The gate itself (tests/gate, issue 17): without `CUDASTACK_REQUIRE` a missing component
//! skips, says why and is logged; with it, the test fails; a host condition never fails.
//! Each case re-runs this test binary on one `#[ignore]`d probe test with a chosen
//! environment, so the outcome is that of a real test run.

use crate::gate;

use std::path::Path;
use std::process::{Command, Output};

/// Run the probe test `name` of this binary with `CUDASTACK_REQUIRE` set or not, logging to `log`.
fn probe(name: &str, require: bool, log: &Path) -> Output {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--ignored",
            "--exact",
            &gate::test_path(module_path!(), name),
            "--test-threads=1",
            "--nocapture",
        ])
        .env(gate::SKIP_LOG, log)
        .env_remove("CUDASTACK_OFFLINE_TESTS");
    if require {
        command.env(gate::REQUIRE, "1");
    } else {
        command.env_remove(gate::REQUIRE);
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
#[ignore = "a probe the other tests run in a child process"]
fn probe_missing_component() {
    gate::skip("docker", "the docker CLI is not installed");
}

#[test]
#[ignore = "a probe the other tests run in a child process"]
fn probe_host_condition() {
    gate::not_applicable("/dev/shm is not a separate filesystem here");
}

#[test]
#[ignore = "a probe the other tests run in a child process"]
fn probe_switch() {
    std::env::set_var("CUDASTACK_OFFLINE_TESTS", "1");
    assert!(gate::switch(
        "CUDASTACK_OFFLINE_TESTS",
        |v| v == "1",
        "this test needs https://pypi.org"
    ));
}

#[test]
fn a_missing_component_skips_and_is_logged_without_require() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_missing_component", false, &log);
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("SKIP: the docker CLI is not installed"),
        "{}",
        text(&output)
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged,
        "skip_gate::probe_missing_component\tdocker\tthe docker CLI is not installed\n"
    );
}

#[test]
fn a_missing_component_fails_the_test_under_require() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_missing_component", true, &log);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        text(&output)
            .contains("required component missing: docker: the docker CLI is not installed"),
        "{}",
        text(&output)
    );
    assert!(!log.exists(), "a failure is not a skip");
}

#[test]
fn a_host_condition_skips_even_under_require_and_is_logged() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_host_condition", true, &log);
    assert!(output.status.success(), "{}", text(&output));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        logged,
        "skip_gate::probe_host_condition\thost\t/dev/shm is not a separate filesystem here\n"
    );
}

#[test]
fn a_developer_switch_skips_locally_and_fails_under_require() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let output = probe("probe_switch", false, &log);
    assert!(output.status.success(), "{}", text(&output));
    assert!(std::fs::read_to_string(&log)
        .unwrap()
        .contains("\tCUDASTACK_OFFLINE_TESTS\tCUDASTACK_OFFLINE_TESTS is set (this test needs https://pypi.org)\n"));
    let output = probe("probe_switch", true, &log);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("CUDASTACK_OFFLINE_TESTS is set (this test needs https://pypi.org), which skips this test, but CUDASTACK_REQUIRE=1 forbids skipping"),
        "{}",
        text(&output)
    );
}

/// Lines appended by many threads at once stay whole (O_APPEND, one buffer per line).
#[test]
fn concurrent_skips_append_whole_lines() {
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("skips.log");
    let children: Vec<_> = (0..8)
        .map(|_| {
            let mut command = Command::new(std::env::current_exe().unwrap());
            command
                .args(["--ignored", "--exact"])
                .arg(gate::test_path(module_path!(), "probe_missing_component"))
                .env(gate::SKIP_LOG, &log)
                .env_remove(gate::REQUIRE)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            command.spawn().unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let logged = std::fs::read_to_string(&log).unwrap();
    assert_eq!(logged.lines().count(), 8, "{logged}");
    assert!(logged.lines().all(|line| line
        == "skip_gate::probe_missing_component\tdocker\tthe docker CLI is not installed"));
}
