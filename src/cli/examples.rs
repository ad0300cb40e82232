//! The "Examples:" section of every command's `--help`: one or two real
//! commands, each after a `#` line that says what it does. They run as written from a
//! checkout of the repository (its recipes/), given what the command itself needs (a
//! registry you may push to, a GPU, Docker); `ghcr.io/acme/torch` stands for your image.
//! Every line fits 80 columns, so that clap never wraps an example in a terminal.
//!
//! Tested twice: every example parses with the real clap definitions (the unit test
//! below), and tests/cli_help.rs reads each command's `--help`, checks the section is there
//! and runs the examples that need nothing but the repository.

pub const TOP: &str = "\
Examples:
  # A first image: check the recipe, lock its artifacts, build it
  cudastack validate recipes/torch2.4.1-cu121-py3.11.yaml
  cudastack lock recipes/torch2.4.1-cu121-py3.11.yaml
  cudastack build recipes/torch2.4.1-cu121-py3.11.yaml

Exit status: 0 success (check: yes); 1 a negative answer (validate: invalid, check: no, \
doctor: a broken layer); 2 error; 3 unknown (check); 141 stdout closed early (a pipe into \
`head`).";

pub const VALIDATE: &str = "\
Examples:
  # Check one recipe: what is wrong, why, and what to do about it
  cudastack validate recipes/torch2.4.1-cu121-py3.11.yaml
  # Check every recipe of the repository (exit 1 if any is invalid)
  cudastack validate recipes/*.yaml";

pub const BUILD: &str = "\
Examples:
  # Build the locked recipe as an OCI layout in images/torch2.4.1-cu121-py3.11
  cudastack build recipes/torch2.4.1-cu121-py3.11.yaml
  # Build it and load the image into Docker under the recipe's tags
  cudastack build recipes/torch2.4.1-cu121-py3.11.yaml --load
  # Build without root, e.g. in a CI container (docs/rootless.md)
  cudastack build recipes/torch2.4.1-cu121-py3.11.yaml --build-mode fakechroot
  # Sign the SBOM, provenance and verification with a key held in a CI secret
  cudastack build recipes/torch2.4.1-cu121-py3.11.yaml --sign-key env://CI_KEY";

pub const CACHE: &str = "\
Examples:
  # What the cache holds: downloads, layer blobs, staged trees, records
  cudastack cache
  # Remove what no build used in the last 30 days
  cudastack cache prune --older-than 30";

pub const CACHE_PRUNE: &str = "\
Examples:
  # Remove what no build used in the last 30 days
  cudastack cache prune --older-than 30
  # Everything no running build holds (layers and blobs only when none runs)
  cudastack cache prune --older-than 0";

pub const LOCK: &str = "\
Examples:
  # Resolve every artifact to a URL and sha256 (writes the .lock beside it)
  cudastack lock recipes/torch2.4.1-cu121-py3.11.yaml
  # An air-gapped site: wheels from a local directory first
  cudastack lock --mirror /srv/wheels recipes/torch2.4.1-cu121-py3.11.yaml
  # Move the Debian packages to today's archive (security updates); prints
  # each change
  cudastack lock --upgrade recipes/torch2.4.1-cu121-py3.11.yaml
  # One package only
  cudastack lock --upgrade-package tzdata recipes/torch2.4.1-cu121-py3.11.yaml";

pub const MATRIX: &str = "\
Examples:
  # Torch builds with CUDA 12.4 that carry native kernels for an RTX 4090
  cudastack matrix --cuda 12.4 --gpu \"RTX 4090\"
  # GPUs and their compute capabilities
  cudastack matrix --table gpus";

pub const REFRESH: &str = "\
Examples:
  # Read the torch releases since 2.0.0 from PyPI into the cache; every command
  # then uses them (delete ~/.cache/cudastack/matrix/torch-pypi.json to go back
  # to the matrix built into cudastack)
  cudastack matrix refresh
  # Contributors: regenerate the data compiled into cudastack, in a checkout
  cudastack matrix refresh --output data/torch-pypi.json";

pub const CI: &str = "\
Examples:
  # Write the publish and relock workflows under .github/workflows
  cudastack ci emit --registry ghcr.io/acme
  # In CI: fail when the committed workflows are not what the recipes give
  cudastack ci emit --registry ghcr.io/acme --check
  # Jobs install cudastack 0.1.0 from a mirror of the project's releases
  cudastack ci emit --cudastack-version 0.1.0 --release-url https://m.acme.dev";

pub const CI_EMIT: &str = CI;

pub const INIT: &str = "\
Examples:
  # A project for H100 nodes on driver 550: cudastack.yaml and what it names
  cudastack init acme-train --driver 550.54.15 --gpu H100
  # On one of the nodes: its driver and GPUs, read from this machine
  cudastack init --detect";

pub const SOLVE: &str = "\
Examples:
  # What runs on a node with driver 535 and RTX 3090s
  cudastack solve --driver 535.104.05 --gpu \"RTX 3090\"
  # The newest torch 2.4 build for an H100, as a recipe file to lock and build
  cudastack solve --driver 550.54.15 --gpu H100 --torch 2.4 --write h100.yaml
  # Where download.pytorch.org is reachable: PyTorch's indexes rank as PyPI does
  cudastack solve --driver 535.104.05 --gpu H100 --index pytorch";

pub const INSPECT: &str = "\
Examples:
  # The declared and verified matrix of a built image
  cudastack inspect images/torch2.4.1-cu121-py3.11
  # The arm64 image of a registry's multi-platform image (config only)
  cudastack inspect ghcr.io/acme/torch:2.4.1 --platform linux/arm64";

pub const SBOM: &str = "\
Examples:
  # The SPDX document stored beside a built image, for a scanner
  cudastack sbom images/torch2.4.1-cu121-py3.11 -o torch.spdx.json
  # The CycloneDX one of an image in a registry
  cudastack sbom ghcr.io/acme/torch:2.4.1 --format cyclonedx -o torch.cdx.json";

pub const CHECK: &str = "\
Examples:
  # Will it run on this machine? (its driver and GPUs are read here)
  cudastack check ghcr.io/acme/torch:2.4.1 --detect
  # From a login node, for a compute node with driver 535 and H100s
  cudastack check ghcr.io/acme/torch:2.4.1 --driver 535.104.05 --gpu H100
  # Yes only if the CI key signed a run on this GPU class
  cudastack check ghcr.io/acme/torch:2.4.1 --detect --require-signed-by ci.pub

Exit status: 0 yes, 1 no, 2 error, 3 unknown.";

pub const LOAD: &str = "\
Examples:
  # Load a built image into Docker under the recipe's tags
  cudastack load images/torch2.4.1-cu121-py3.11
  # Under a tag of your own
  cudastack load images/torch2.4.1-cu121-py3.11 --tag torch:dev";

pub const VERIFY: &str = "\
Examples:
  # Run the probe on this machine's GPUs, record the report, sign the statement
  cudastack verify images/torch2.4.1-cu121-py3.11 --sign-key ci.key
  # Print a Slurm batch script that runs the probe on an h100 (its GRES type)
  cudastack verify ghcr.io/acme/torch:2.4.1 --emit sbatch --gpu-type h100
  # A Kubernetes Job for a private image, pulled with the Secret named ghcr
  cudastack verify ghcr.io/acme/torch:2.4.1 --emit k8s --image-pull-secret ghcr
  # Record the Job's log on the image in the registry (tags 2.4.1-verified)
  cudastack verify ghcr.io/acme/torch:2.4.1 --from-log verify.log";

pub const PROMOTE: &str = "\
Examples:
  # Tag 2.4.1-verified as 2.4.1 once it passed on an H100 and an A100
  cudastack promote ghcr.io/acme/torch:2.4.1-verified --require-gpu h100,a100
  # Say what would be tagged, and what is missing, without tagging
  cudastack promote ghcr.io/acme/torch:2.4.1 --require-gpu h100 --dry-run";

pub const PUSH: &str = "\
Examples:
  # Push a built image (credentials: the Docker config's, else anonymous)
  cudastack push images/torch2.4.1-cu121-py3.11 ghcr.io/acme/torch:2.4.1
  # Copy the image `cudastack pull` wrote to images/torch (named by its tag)
  cudastack push images/torch registry.example.com/torch:2.4.1 --ref 2.4.1";

pub const SIGN: &str = "\
Examples:
  # Sign what `build` stored beside the image (password from COSIGN_PASSWORD)
  cudastack sign images/torch2.4.1-cu121-py3.11 --key cosign.key
  # With the key in a variable, as CI secrets are; `cudastack push` then sends
  # the signed statements as referrers of the image
  cudastack sign images/torch2.4.1-cu121-py3.11 --key env://CI_KEY";

pub const PULL: &str = "\
Examples:
  # Pull an image into the OCI layout images/torch, every digest verified
  cudastack pull ghcr.io/acme/torch:2.4.1 --layout images/torch
  # The arm64 image of a multi-platform image (tag latest)
  cudastack pull ghcr.io/acme/torch --platform linux/arm64 --layout images/torch";

pub const DOCTOR: &str = "\
Examples:
  # Diagnose this host from the driver up; stops at the first broken layer
  cudastack doctor
  # Every layer, and a GPU container started from a local image
  cudastack doctor --keep-going --gpu-image nvidia/cuda:12.4.1-base-ubuntu22.04
  # Can this machine (a CI runner, no GPU) build images, as root or not?
  cudastack doctor --build-host";

pub const EXPLAIN: &str = "\
Examples:
  # Explain an error message: cause, checks, fix
  cudastack explain \"CUDA error: no kernel image is available for execution\"
  # The known errors found in a log
  cudastack explain --file train.log";

pub const PLACE: &str = "\
Examples:
  # Node affinity admitting the GPUs and drivers the image was verified on
  cudastack place ghcr.io/acme/torch:2.4.1-verified
  # The same as a DRA claim template for NVIDIA's DRA driver (Kubernetes 1.34)
  cudastack place ghcr.io/acme/torch:2.4.1-verified --for dra
  # #SBATCH lines from the site's map of Slurm features
  cudastack place ghcr.io/acme/torch:2.4.1 --for slurm --site-features site.yaml";

pub const JOB: &str = "\
Examples:
  # The image's entrypoint as a Kubernetes Job on 2 nodes x 8 verified GPUs
  cudastack job ghcr.io/acme/torch:2.4.1-verified --nodes 2 --gpus-per-node 8
  # The same with Slurm and pyxis, placed by the site's features
  cudastack job ghcr.io/acme/torch:2.4.1 --for sbatch --site-features site.yaml";

pub const ADMISSION: &str = "\
Examples:
  # Let GPU pods run only these images, each on the GPUs it was verified on
  cudastack admission ghcr.io/acme/torch:2.4.1 ghcr.io/acme/jax:0.4";

/// The command lines of the "Examples:" section of `help` (not the `#` lines).
#[cfg(test)]
pub fn command_lines(help: &str) -> Vec<&str> {
    let Some((_, section)) = help.split_once("Examples:\n") else {
        return Vec::new();
    };
    section
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .filter(|line| !line.starts_with('#'))
        .collect()
}

/// `line` split into words as a POSIX shell would for these examples: at spaces, with
/// "..." and '...' quoting (no escapes, no expansion: `recipes/*.yaml` stays as written).
#[cfg(test)]
pub fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(open), c) if c == open => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, ' ') => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(quote.is_none(), "unclosed quote in `{line}`");
    words.extend(word);
    words
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// Every example parses with the real definitions (a renamed option or a value the
    /// parser rejects fails here), and runs the command whose help shows it.
    #[test]
    fn every_example_parses_as_the_command_it_documents() {
        fn visit(command: &clap::Command, path: Vec<String>, seen: &mut usize) {
            let help = command
                .get_after_help()
                .map(|help| help.to_string())
                .unwrap_or_default();
            let lines = command_lines(&help);
            assert!(!lines.is_empty(), "`{}` has no examples", path.join(" "));
            let section = help
                .split_once("Examples:\n")
                .map_or("", |(_, section)| section);
            for line in section.lines().take_while(|line| !line.trim().is_empty()) {
                assert!(line.chars().count() <= 80, "over 80 columns: `{line}`");
            }
            for line in lines {
                let words = shell_words(line);
                let parsed = super::super::Cli::try_parse_from(&words);
                assert!(parsed.is_ok(), "`{line}`: {}", parsed.unwrap_err());
                let subcommands: Vec<&String> =
                    words[1..].iter().filter(|w| !w.starts_with('-')).collect();
                for (depth, name) in path.iter().enumerate().skip(1) {
                    assert_eq!(subcommands.get(depth - 1), Some(&name), "`{line}`");
                }
                *seen += 1;
            }
            for sub in command
                .get_subcommands()
                .filter(|sub| sub.get_name() != "help")
            {
                let mut path = path.clone();
                path.push(sub.get_name().to_string());
                visit(sub, path, seen);
            }
        }
        let mut seen = 0;
        let command = super::super::Cli::command();
        visit(&command, vec!["cudastack".to_string()], &mut seen);
        assert!(seen > 20, "{seen} examples");
    }

    #[test]
    fn shell_words_keeps_quoted_spaces() {
        assert_eq!(
            shell_words(r#"cudastack solve --gpu "RTX 3090" --torch '==2.4.*'"#),
            [
                "cudastack",
                "solve",
                "--gpu",
                "RTX 3090",
                "--torch",
                "==2.4.*"
            ]
        );
    }
}
