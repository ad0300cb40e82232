//! Helpers for tests that need real peers (skopeo, umoci, docker, gcc).
//! A missing tool makes the test print why it is skipped and return; CI installs them.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Run a command; panic with its output if it fails.
pub fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

static DOCKER: Mutex<Option<Result<(), String>>> = Mutex::new(None);

fn docker_info_ok() -> bool {
    Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Make sure a Docker daemon answers: use a running one, or start `dockerd` if it is
/// installed. `Err` says why Docker tests must be skipped.
pub fn docker() -> Result<(), String> {
    let mut state = DOCKER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(result) = state.as_ref() {
        return result.clone();
    }
    let result = (|| {
        if !have("docker") {
            return Err("the docker CLI is not installed".to_string());
        }
        if docker_info_ok() {
            return Ok(());
        }
        if !have("dockerd") {
            return Err("no Docker daemon is running and dockerd is not installed".to_string());
        }
        let log = std::fs::File::create("/tmp/dockerd-cudastack-tests.log")
            .map_err(|e| format!("cannot create the dockerd log: {e}"))?;
        Command::new("dockerd")
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start dockerd: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if docker_info_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err("dockerd did not answer within 60 s (see /tmp/dockerd-cudastack-tests.log)".to_string())
    })();
    *state = Some(result.clone());
    result
}

/// Build a statically linked program that prints the files named on its command line
/// (or says which one it cannot open). Returns its path inside `dir`.
pub fn static_show_binary(dir: &Path) -> Result<PathBuf, String> {
    if !have("gcc") {
        return Err("gcc is not installed".to_string());
    }
    let source = dir.join("show.c");
    std::fs::write(
        &source,
        r#"#include <stdio.h>
int main(int argc, char **argv) {
    int status = 0;
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "r");
        if (!f) { printf("missing %s\n", argv[i]); status = 1; continue; }
        char buf[4096]; size_t n;
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
        fclose(f);
    }
    return status;
}
"#,
    )
    .unwrap();
    let binary = dir.join("show");
    let output = Command::new("gcc")
        .args(["-static", "-O2", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .map_err(|e| format!("gcc: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "gcc -static failed (is libc6-dev installed?): {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    Ok(binary)
}

/// Removes docker images when dropped, even when the test fails.
pub struct DockerCleanup(pub Vec<String>);

impl Drop for DockerCleanup {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = Command::new("docker")
                .args(["rmi", "-f", image])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
