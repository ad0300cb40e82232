//! The GitHub Actions workflows that publish the recipe matrix, generated from recipes/ so
//! they cannot drift from it: `cudastack ci emit` writes them, and a test fails when the
//! committed files differ from what the generator makes of the committed recipes.
//!
//! `publish.yml` builds every recipe in its own job (the blob cache restored with
//! actions/cache, keyed by the recipe's lock file, so an unchanged lock downloads nothing),
//! pushes each image by digest, then runs one verification job per recipe and GPU type on
//! self-hosted runners labelled `gpu-<type>` (see [`runner_label`]) which pull that digest,
//! run `cudastack verify` through the NVIDIA runtime and push the verified config with its
//! report; a last job per recipe promotes the image to its plain matrix tag when every GPU
//! type passed (`cudastack promote`). `relock.yml` re-locks every recipe on a schedule and
//! opens a pull request when upstream moved.
//!
//! Every job installs a released cudastack: the static binary of a pinned
//! version, downloaded from the project's releases (or a mirror) and checked against the
//! release's SHA256SUMS, whose own digest a team may pin. Nothing compiles cudastack or
//! checks out its source, so the files work in any team's repository.
//!
//! The files are text templates, not serialised structs, so they can carry comments that
//! say why each step is there; every value that comes from a recipe is inserted as a
//! JSON string, which is a valid YAML scalar whatever it contains. Nothing here depends on
//! the clock or the machine: the same recipes and options give the same bytes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::lock::inputs::lock_path;
use crate::recipe::Recipe;

use super::{slug, ClusterError};

/// Where the generated files live, relative to the repository root.
pub const PUBLISH_PATH: &str = ".github/workflows/publish.yml";
pub const RELOCK_PATH: &str = ".github/workflows/relock.yml";
/// actionlint's configuration: the self-hosted runner labels the verify jobs use.
pub const ACTIONLINT_CONFIG_PATH: &str = ".github/actionlint.yaml";

/// Action versions: major tags (as GitHub recommends for these actions), the first of each
/// on the node24 runtime (actionlint flags node20 actions, removed from runners in 2026).
const CHECKOUT: &str = "actions/checkout@v5";
const CACHE: &str = "actions/cache@v5";
const UPLOAD: &str = "actions/upload-artifact@v6";
const DOWNLOAD: &str = "actions/download-artifact@v7";
const CREATE_PR: &str = "peter-evans/create-pull-request@v8";

/// One recipe as the workflows see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowRecipe {
    pub name: String,
    /// `recipes/NAME.yaml`, relative to the repository root, `/`-separated.
    pub file: String,
    /// `recipes/NAME.lock`.
    pub lock: String,
    /// The recipe's target GPUs (`gpus:`), each verified on its own runner label.
    pub gpus: Vec<String>,
}

/// Where released cudastack archives are downloaded from: `URL/vVERSION/FILE`, GitHub's
/// release download layout (.github/workflows/release.yml uploads them there).
pub const RELEASE_URL: &str = "https://github.com/cudastack/cudastack/releases/download";

/// Generator options, recorded in each file's first line so a check can regenerate the
/// same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowOptions {
    /// Registry and namespace images are pushed to (`ghcr.io/acme`); None: GHCR under the
    /// repository owner, with the workflow's GITHUB_TOKEN.
    pub registry: Option<String>,
    /// The cudastack release the jobs install (default: the version that emits the files).
    pub cudastack_version: String,
    /// Where releases are downloaded from, for a mirror; None: [`RELEASE_URL`].
    pub release_url: Option<String>,
    /// The sha256 of the release's SHA256SUMS file, when a team pins it; None: the
    /// SHA256SUMS published with the release is trusted (over HTTPS).
    pub sha256sums: Option<String>,
}

impl Default for WorkflowOptions {
    fn default() -> Self {
        WorkflowOptions {
            registry: None,
            cudastack_version: env!("CARGO_PKG_VERSION").to_string(),
            release_url: None,
            sha256sums: None,
        }
    }
}

impl WorkflowOptions {
    /// The command line that regenerates the files.
    pub fn command(&self) -> String {
        let mut command = "cudastack ci emit".to_string();
        if let Some(registry) = &self.registry {
            let _ = write!(command, " --registry {registry}");
        }
        let _ = write!(command, " --cudastack-version {}", self.cudastack_version);
        if let Some(url) = &self.release_url {
            let _ = write!(command, " --release-url {url}");
        }
        if let Some(sums) = &self.sha256sums {
            let _ = write!(command, " --release-sha256sums {sums}");
        }
        command
    }

    /// The options a generated file was made with, read from its first line; None when
    /// the file was not generated by cudastack.
    pub fn from_header(text: &str) -> Option<WorkflowOptions> {
        let first = text.lines().next()?;
        let command = first
            .strip_prefix("# Generated by `")?
            .split('`')
            .next()?
            .strip_prefix("cudastack ci emit")?;
        let mut words = command.split_whitespace();
        let mut options = WorkflowOptions::default();
        while let Some(word) = words.next() {
            let value = words.next()?.to_string();
            match word {
                "--registry" => options.registry = Some(value),
                "--cudastack-version" => options.cudastack_version = value,
                "--release-url" => options.release_url = Some(value),
                "--release-sha256sums" => options.sha256sums = Some(value),
                _ => return None,
            }
        }
        Some(options)
    }

    fn release_url(&self) -> &str {
        self.release_url.as_deref().unwrap_or(RELEASE_URL)
    }

    /// Refuse values that would not make a working download (or a parseable header).
    fn check(&self) -> Result<(), ClusterError> {
        let invalid = |field, value: &str, rule| {
            Err(ClusterError::Invalid {
                field,
                value: value.to_string(),
                rule,
            })
        };
        if let Some(registry) = &self.registry {
            let valid = !registry.is_empty()
                && !registry.ends_with('/')
                && registry
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-_/:".contains(&b));
            if !valid {
                return invalid("registry", registry, "a lowercase registry host and namespace such as ghcr.io/acme or registry.example.com:5000/ml");
            }
        }
        let version = &self.cudastack_version;
        let valid = version.starts_with(|c: char| c.is_ascii_digit())
            && version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".+-".contains(&b));
        if !valid {
            return invalid(
                "cudastack version",
                version,
                "a released cudastack version such as 0.1.0 (the release tag without its `v`)",
            );
        }
        if let Some(url) = &self.release_url {
            let valid = url::Url::parse(url)
                .is_ok_and(|u| matches!(u.scheme(), "https" | "http") && u.host().is_some())
                && !url.ends_with('/')
                && !url.contains(|c: char| c.is_whitespace() || "\"'`$\\".contains(c));
            if !valid {
                return invalid("release URL", url, "an http(s) URL without a trailing slash under which vVERSION/cudastack-VERSION-TARGET.tar.gz and vVERSION/SHA256SUMS are served, such as https://github.com/cudastack/cudastack/releases/download");
            }
        }
        if let Some(sums) = &self.sha256sums {
            if sums.len() != 64 || !sums.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return invalid("release SHA256SUMS digest", sums, "the sha256 of the release's SHA256SUMS file: 64 lowercase hex digits (sha256sum SHA256SUMS)");
            }
        }
        Ok(())
    }
}

/// One file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    /// Relative to the repository root.
    pub path: PathBuf,
    pub contents: String,
}

/// The runner label a GPU type's verification jobs ask for: `gpu-` + the name in lowercase
/// with runs of other characters as `-` (`RTX 4090` -> `gpu-rtx-4090`). Register each
/// self-hosted GPU runner with the label of the GPU it has.
pub fn runner_label(gpu: &str) -> String {
    format!("gpu-{}", slug(gpu, 40))
}

/// Every `*.yaml` recipe in `root/recipes`, sorted by file name.
pub fn recipes_in(root: &Path) -> Result<Vec<WorkflowRecipe>, ClusterError> {
    let dir = root.join("recipes");
    let read_error = |source| ClusterError::ReadDir {
        path: dir.clone(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    files
        .iter()
        .map(|path| {
            let recipe = Recipe::load(path)?;
            let relative = |p: &Path| {
                let p = p.strip_prefix(root).unwrap_or(p);
                p.components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join("/")
            };
            Ok(WorkflowRecipe {
                name: recipe.name.clone(),
                file: relative(path),
                lock: relative(&lock_path(path)),
                gpus: recipe.gpus.clone(),
            })
        })
        .collect()
}

/// All generated files for the recipes in `root/recipes`.
pub fn generate(
    root: &Path,
    options: &WorkflowOptions,
) -> Result<Vec<GeneratedFile>, ClusterError> {
    let recipes = recipes_in(root)?;
    generate_for(&recipes, options)
}

/// All generated files for `recipes`.
pub fn generate_for(
    recipes: &[WorkflowRecipe],
    options: &WorkflowOptions,
) -> Result<Vec<GeneratedFile>, ClusterError> {
    if recipes.is_empty() {
        return Err(ClusterError::Invalid {
            field: "recipe directory",
            value: "recipes/".into(),
            rule: "the publish workflow needs at least one recipe (recipes/*.yaml)",
        });
    }
    options.check()?;
    Ok(vec![
        GeneratedFile {
            path: PUBLISH_PATH.into(),
            contents: publish_workflow(recipes, options),
        },
        GeneratedFile {
            path: RELOCK_PATH.into(),
            contents: relock_workflow(recipes, options),
        },
        GeneratedFile {
            path: ACTIONLINT_CONFIG_PATH.into(),
            contents: actionlint_config(recipes, options),
        },
    ])
}

/// A YAML scalar for any string: JSON's double-quoted form is valid YAML.
fn q(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialise")
}

fn header(out: &mut String, options: &WorkflowOptions, what: &str) {
    let _ = writeln!(
        out,
        "# Generated by `{}` from recipes/: edit the recipes (or src/cluster/workflows.rs)\n\
         # and run the command again instead of editing this file; a test fails when the two differ.\n\
         #\n{what}",
        options.command()
    );
}

/// (recipe, gpu, runner label) for every verification job.
fn verify_legs(recipes: &[WorkflowRecipe]) -> Vec<(&WorkflowRecipe, &str, String)> {
    let mut legs = Vec::new();
    for recipe in recipes {
        let mut seen = Vec::new();
        for gpu in &recipe.gpus {
            let label = runner_label(gpu);
            if !seen.contains(&label) {
                seen.push(label.clone());
                legs.push((recipe, gpu.as_str(), label));
            }
        }
    }
    legs
}

/// Whether `gpu` sits only next to an Arm host (GH200, GB10: `host: linux/arm64` in the
/// matrix), so its verify job needs an arm64 runner and an aarch64 cudastack.
fn arm64_gpu(gpu: &str) -> bool {
    crate::matrix::Matrix::embedded()
        .gpu(gpu)
        .and_then(|g| g.host)
        == Some(crate::recipe::Platform::LinuxArm64)
}

/// The step that sets REGISTRY: the dispatch input, else the generator's registry, else
/// GHCR under the repository owner (lowercased: GHCR repository names must be).
fn registry_step(out: &mut String, options: &WorkflowOptions) {
    let default = options
        .registry
        .clone()
        .unwrap_or_else(|| "ghcr.io/${GITHUB_REPOSITORY_OWNER}".to_string());
    let _ = write!(
        out,
        r#"      - name: Registry
        env:
          INPUT_REGISTRY: ${{{{ inputs.registry }}}}
        run: |
          registry="${{INPUT_REGISTRY:-{default}}}"
          echo "REGISTRY=${{registry,,}}" >> "$GITHUB_ENV"
"#
    );
}

/// The credentials `cudastack pull/push` read: a registry's own secrets when set, else
/// the workflow token, which GHCR accepts for packages of this repository.
const CREDENTIALS_ENV: &str = r#"      CUDASTACK_REGISTRY_USERNAME: ${{ secrets.REGISTRY_USERNAME || github.actor }}
      CUDASTACK_REGISTRY_PASSWORD: ${{ secrets.REGISTRY_PASSWORD || secrets.GITHUB_TOKEN }}
      # The cosign key (`cudastack key generate`) that signs the SBOM, the provenance and the
      # verification statements; nothing is signed while the secret is unset.
      COSIGN_PRIVATE_KEY: ${{ secrets.COSIGN_PRIVATE_KEY }}
      COSIGN_PASSWORD: ${{ secrets.COSIGN_PASSWORD }}
"#;

/// The shell lines that set `sign` to the `--sign-key` option, reading the key from its
/// secret's variable (never written to disk); empty when the secret is unset.
const SIGN_KEY_LINES: &str = r#"          sign=()
          if [ -n "$COSIGN_PRIVATE_KEY" ]; then sign=(--sign-key env://COSIGN_PRIVATE_KEY); fi
"#;

/// The workflow-level environment the install step reads: which release, from where, and
/// (when pinned) the digest of its SHA256SUMS.
fn release_env(out: &mut String, options: &WorkflowOptions) {
    let _ = write!(
        out,
        r#"env:
  # The cudastack every job installs: a released static binary, checked against the
  # release's SHA256SUMS. `cudastack ci emit --cudastack-version` pins another release,
  # `--release-url` a mirror, `--release-sha256sums` the sha256 of SHA256SUMS itself (else
  # the SHA256SUMS published with the release, fetched over HTTPS, is trusted).
  CUDASTACK_VERSION: {version}
  CUDASTACK_RELEASE_URL: {url}
  CUDASTACK_SHA256SUMS: {sums}
"#,
        version = q(&options.cudastack_version),
        url = q(options.release_url()),
        sums = q(options.sha256sums.as_deref().unwrap_or("")),
    );
}

/// Download the released cudastack for this runner's machine, check it against the
/// release's SHA256SUMS, and put it on PATH. The archive's probe/ (the native probes) lies
/// beside its bin/, where `cudastack build` looks for them.
pub const INSTALL_STEP_NAME: &str = "Install cudastack";
const INSTALL_STEP: &str = r#"      - name: Install cudastack
        run: |
          case "$(uname -m)" in
            x86_64) target=x86_64-unknown-linux-musl ;;
            aarch64 | arm64) target=aarch64-unknown-linux-musl ;;
            *) echo "::error::no cudastack release is built for $(uname -m)"; exit 1 ;;
          esac
          archive="cudastack-$CUDASTACK_VERSION-$target.tar.gz"
          release="$CUDASTACK_RELEASE_URL/v$CUDASTACK_VERSION"
          dir="$RUNNER_TEMP/cudastack-release"
          rm -rf "$dir"
          mkdir -p "$dir"
          cd "$dir"
          curl -fsSL --retry 5 -o SHA256SUMS "$release/SHA256SUMS"
          if [ -n "$CUDASTACK_SHA256SUMS" ]; then
            echo "$CUDASTACK_SHA256SUMS  SHA256SUMS" | sha256sum --check --strict - \
              || { echo "::error::$release/SHA256SUMS is not the file pinned by CUDASTACK_SHA256SUMS"; exit 1; }
          fi
          awk -v name="$archive" '$2 == name' SHA256SUMS > expected
          [ -s expected ] || { echo "::error::$archive is not listed in $release/SHA256SUMS"; exit 1; }
          curl -fsSL --retry 5 -o "$archive" "$release/$archive"
          sha256sum --check --strict expected \
            || { echo "::error::$archive does not match its sum in $release/SHA256SUMS"; exit 1; }
          tar -xzf "$archive"
          echo "$dir/cudastack-$CUDASTACK_VERSION-$target/bin" >> "$GITHUB_PATH"
          "$dir/cudastack-$CUDASTACK_VERSION-$target/bin/cudastack" --version
"#;

/// `publish.yml`: one build job per recipe, one verify job per recipe and GPU type, then
/// one promote job per recipe with GPUs.
pub fn publish_workflow(recipes: &[WorkflowRecipe], options: &WorkflowOptions) -> String {
    let mut out = String::new();
    header(
        &mut out,
        options,
        "# Publish every recipe: one build job per recipe, pushed by digest, then one verification\n\
         # job per recipe and GPU type on a self-hosted runner labelled gpu-<type> (docs/cluster.md),\n\
         # then the image is promoted to its matrix tag when every GPU type of its recipe passed.",
    );
    publish_triggers(&mut out, options);
    build_job(&mut out, recipes, options);
    verify_job(&mut out, recipes);
    promote_job(&mut out, recipes);
    out
}

/// The triggers, permissions, defaults and release environment of `publish.yml`.
fn publish_triggers(out: &mut String, options: &WorkflowOptions) {
    let registry_default = options.registry.as_deref().unwrap_or("");
    let _ = write!(
        out,
        r#"name: publish

on:
  push:
    branches: [main]
    paths:
      - "recipes/**"
  workflow_dispatch:
    inputs:
      registry:
        description: "Registry and namespace to push to (empty: {registry_help})"
        type: string
        default: {registry_default}
      verify:
        description: "Run the GPU verification jobs on the self-hosted runners"
        type: boolean
        default: true

permissions:
  contents: read
  packages: write

concurrency:
  group: publish-${{{{ github.ref }}}}
  cancel-in-progress: false

defaults:
  run:
    # Named explicitly so GitHub runs scripts with `-eo pipefail`.
    shell: bash

"#,
        registry_help = match &options.registry {
            Some(registry) => registry.clone(),
            None => "ghcr.io/<owner>".to_string(),
        },
        registry_default = q(registry_default),
    );
    release_env(out, options);
    out.push_str("\njobs:\n");
}

/// The build job: one matrix leg per recipe; builds, pushes by digest, uploads the pin.
fn build_job(out: &mut String, recipes: &[WorkflowRecipe], options: &WorkflowOptions) {
    let _ = write!(
        out,
        r#"  build:
    name: build ${{{{ matrix.recipe }}}}
    runs-on: ubuntu-24.04
    timeout-minutes: 120
    strategy:
      fail-fast: false
      matrix:
        include:
"#
    );
    for recipe in recipes {
        let _ = writeln!(
            out,
            "          - {{ recipe: {}, file: {}, lock: {} }}",
            q(&recipe.name),
            q(&recipe.file),
            q(&recipe.lock)
        );
    }
    build_steps(out, options);
}

/// The build job's environment and steps, up to the upload of the pinned digest.
fn build_steps(out: &mut String, options: &WorkflowOptions) {
    let _ = write!(
        out,
        r#"    env:
      RECIPE: ${{{{ matrix.recipe }}}}
      RECIPE_FILE: ${{{{ matrix.file }}}}
      CUDASTACK_CACHE_DIR: ${{{{ github.workspace }}}}/.cudastack-cache
{CREDENTIALS_ENV}    steps:
      - uses: {CHECKOUT}
{INSTALL_STEP}"#,
    );
    registry_step(out, options);
    build_and_push_steps(out);
}

/// Free disk, restore the blob cache, lock if needed, build, push by digest, upload the pin.
fn build_and_push_steps(out: &mut String) {
    let _ = write!(
        out,
        r#"      # A torch stack needs about 15 GB (downloads, staged tree, layout); hosted runners
      # start with less free, most of it taken by toolchains this job does not use.
      - name: Free disk space
        run: sudo rm -rf /usr/share/dotnet /usr/local/lib/android /opt/ghc /opt/hostedtoolcache/CodeQL
      - name: Install the base builder
        run: |
          sudo apt-get update -qq
          sudo apt-get install -y -qq mmdebstrap
      # Every download is content-addressed: a cache keyed by the lock file holds exactly the
      # blobs this recipe needs; an older cache of the same recipe still saves most of them.
      # The layer index rides along (a hit whose blob is gone is a miss); the staged trees
      # do not (several GB each, rebuilt from the blobs).
      - name: Restore the blob cache
        uses: {CACHE}
        with:
          path: |
            .cudastack-cache/blobs
            .cudastack-cache/layers
          key: cudastack-blobs-${{{{ matrix.recipe }}}}-${{{{ hashFiles(matrix.lock) }}}}
          restore-keys: |
            cudastack-blobs-${{{{ matrix.recipe }}}}-
      - name: Lock (only when no lock is committed)
        if: hashFiles(matrix.lock) == ''
        run: cudastack lock "$RECIPE_FILE"
      # mmdebstrap --mode=root and ldconfig -r need root; the cache is handed back to the
      # runner user so actions/cache can save it.
      - name: Build
        run: |
{SIGN_KEY_LINES}          # shellcheck disable=SC2024 # build.json is meant to be written by the runner user
          sudo --preserve-env=CUDASTACK_CACHE_DIR,COSIGN_PRIVATE_KEY,COSIGN_PASSWORD "$(command -v cudastack)" build "$RECIPE_FILE" --registry "$REGISTRY" "${{sign[@]}}" --json > build.json
          sudo chown -R "$(id -u):$(id -g)" "$CUDASTACK_CACHE_DIR" "$(jq -r .layout build.json)"
      # Pushed under a per-commit tag: the recipe's matrix tags are only earned by the
      # verification below. The digest is what every later job uses.
      - name: Push by digest
        run: |
          layout="$(jq -r .layout build.json)"
          tag="$(jq -r '.tags[0] // empty' build.json)"
          [ -n "$tag" ] || tag="$REGISTRY/$RECIPE:latest"
          case "${{tag##*/}}" in *:*) ;; *) tag="$tag:latest" ;; esac
          repository="${{tag%:*}}"
          matrix_tag="${{tag##*:}}"
          cudastack push "$layout" "$repository:$matrix_tag-build-${{GITHUB_SHA::12}}" --json > push.json
          digest="$(jq -r .manifest_digest push.json)"
          mkdir -p pinned
          {{
            echo "IMAGE_REPOSITORY=$repository"
            echo "IMAGE_TAG=$matrix_tag"
            echo "IMAGE_DIGEST=$digest"
          }} > pinned/image.env
          echo "pushed \`$repository@$digest\` for $RECIPE" >> "$GITHUB_STEP_SUMMARY"
      - uses: {UPLOAD}
        with:
          name: pinned-${{{{ matrix.recipe }}}}
          path: pinned/image.env
          retention-days: 30
"#
    );
}

/// The verify job: one matrix leg per recipe and GPU type, on self-hosted GPU runners
/// (x64, or arm64 for Grace GPUs). Nothing when no recipe names a GPU.
fn verify_job(out: &mut String, recipes: &[WorkflowRecipe]) {
    let legs = verify_legs(recipes);
    if legs.is_empty() {
        return;
    }
    let _ = write!(
        out,
        r#"
  verify:
    name: verify ${{{{ matrix.recipe }}}} on ${{{{ matrix.gpu }}}}
    needs: build
    # A recipe whose build failed fails its own verify jobs (no pinned image); the others run.
    if: ${{{{ !cancelled() && (github.event_name != 'workflow_dispatch' || inputs.verify) }}}}
    # Self-hosted runners with an NVIDIA GPU, Docker and the NVIDIA container toolkit, one
    # label per GPU type (docs/cluster.md), x64 or arm64 (Grace) hosts, each installing the
    # cudastack release for its machine; `cudastack pull` takes the runner's platform from a
    # multi-platform image. A job waits until a runner with its labels is free.
    runs-on: [self-hosted, linux, "${{{{ matrix.arch }}}}", "${{{{ matrix.runner }}}}"]
    timeout-minutes: 60
    strategy:
      fail-fast: false
      matrix:
        include:
"#,
    );
    for (recipe, gpu, label) in &legs {
        let arch = if arm64_gpu(gpu) { "arm64" } else { "x64" };
        let _ = writeln!(
            out,
            "          - {{ recipe: {}, gpu: {}, runner: {}, arch: {} }}",
            q(&recipe.name),
            q(gpu),
            q(label),
            q(arch),
        );
    }
    verify_steps(out);
}

/// The verify job's environment and steps: pull by digest, verify, push the verified config.
fn verify_steps(out: &mut String) {
    let _ = write!(
        out,
        r#"    env:
      RECIPE: ${{{{ matrix.recipe }}}}
      RUNNER_LABEL: ${{{{ matrix.runner }}}}
{CREDENTIALS_ENV}    steps:
{INSTALL_STEP}      - uses: {DOWNLOAD}
        with:
          name: pinned-${{{{ matrix.recipe }}}}
          path: pinned
      - name: Pull by digest
        run: |
          cat pinned/image.env >> "$GITHUB_ENV"
          . pinned/image.env
          # Self-hosted workspaces persist between runs: never verify a stale layout.
          rm -rf "images/$RECIPE"
          cudastack pull "$IMAGE_REPOSITORY@$IMAGE_DIGEST" --layout "images/$RECIPE"
      # Exits non-zero unless every check ran on the GPU and passed; then nothing is pushed.
      - name: Verify on ${{{{ matrix.gpu }}}}
        run: |
{SIGN_KEY_LINES}          cudastack verify "images/$RECIPE" --gpus all "${{sign[@]}}" --json > report.json
      - name: Push the verified config and its report
        run: |
          cudastack push "images/$RECIPE" "$IMAGE_REPOSITORY:$IMAGE_TAG-verified-$RUNNER_LABEL" --json > push.json
          echo "verified \`$IMAGE_REPOSITORY@$IMAGE_DIGEST\` on $RUNNER_LABEL: \`$IMAGE_REPOSITORY@$(jq -r .manifest_digest push.json)\`" >> "$GITHUB_STEP_SUMMARY"
      - uses: {UPLOAD}
        if: ${{{{ always() }}}}
        with:
          name: report-${{{{ matrix.recipe }}}}-${{{{ matrix.runner }}}}
          path: report.json
          if-no-files-found: ignore
"#,
    );
}

/// The GPU types a recipe's image must have passed on to be promoted, with the runner label
/// of each one's verify leg (whose job pushed `TAG-verified-LABEL`), as the recipe names them.
fn promote_gpus(recipes: &[WorkflowRecipe]) -> Vec<(&WorkflowRecipe, Vec<(&str, String)>)> {
    let mut promoted: Vec<(&WorkflowRecipe, Vec<(&str, String)>)> = Vec::new();
    for (recipe, gpu, label) in verify_legs(recipes) {
        match promoted.last_mut() {
            Some((last, gpus)) if last.name == recipe.name => gpus.push((gpu, label)),
            _ => promoted.push((recipe, vec![(gpu, label)])),
        }
    }
    promoted
}

/// The promote job: one leg per recipe with GPUs, after every verify leg ran.
/// `cudastack promote` refuses unless the pinned image has a passing verification for each
/// GPU type given, so it only tags what every GPU type of the recipe passed on, and one
/// recipe's failure does not hold back another's promotion.
fn promote_job(out: &mut String, recipes: &[WorkflowRecipe]) {
    let promoted = promote_gpus(recipes);
    if promoted.is_empty() {
        return;
    }
    let _ = write!(
        out,
        r#"
  promote:
    name: promote ${{{{ matrix.recipe }}}}
    needs: [build, verify]
    if: ${{{{ !cancelled() && (github.event_name != 'workflow_dispatch' || inputs.verify) }}}}
    runs-on: ubuntu-24.04
    timeout-minutes: 15
    strategy:
      fail-fast: false
      matrix:
        include:
"#,
    );
    for (recipe, gpus) in &promoted {
        let names: Vec<&str> = gpus.iter().map(|(gpu, _)| *gpu).collect();
        let labels: Vec<&str> = gpus.iter().map(|(_, label)| label.as_str()).collect();
        let _ = writeln!(
            out,
            "          - {{ recipe: {}, gpus: {}, runners: {} }}",
            q(&recipe.name),
            q(&names.join("\n")),
            q(&labels.join("\n")),
        );
    }
    let _ = write!(
        out,
        r#"    env:
      RECIPE: ${{{{ matrix.recipe }}}}
      # One GPU type per line: each needs a passing verification of the pinned image.
      REQUIRE_GPUS: ${{{{ matrix.gpus }}}}
      # The runner label of each verify leg: its job pushed TAG-verified-LABEL.
      VERIFY_RUNNERS: ${{{{ matrix.runners }}}}
{CREDENTIALS_ENV}    steps:
{INSTALL_STEP}      - uses: {DOWNLOAD}
        with:
          name: pinned-${{{{ matrix.recipe }}}}
          path: pinned
      - name: Promote to the matrix tag
        run: |
          . pinned/image.env
          args=()
          while IFS= read -r gpu; do
            if [ -n "$gpu" ]; then
              args+=(--require-gpu "$gpu")
            fi
          done <<< "$REQUIRE_GPUS"
          # Each GPU type's verify job pushed its own verified copy; promote merges them.
          while IFS= read -r runner; do
            if [ -n "$runner" ]; then
              args+=(--verified "$IMAGE_REPOSITORY:$IMAGE_TAG-verified-$runner")
            fi
          done <<< "$VERIFY_RUNNERS"
          cudastack promote "$IMAGE_REPOSITORY@$IMAGE_DIGEST" --to "$IMAGE_TAG" "${{args[@]}}"
          echo "promoted \`$IMAGE_REPOSITORY@$IMAGE_DIGEST\` to \`$IMAGE_REPOSITORY:$IMAGE_TAG\`" >> "$GITHUB_STEP_SUMMARY"
"#,
    );
}

pub fn relock_workflow(recipes: &[WorkflowRecipe], options: &WorkflowOptions) -> String {
    let mut out = String::new();
    header(
        &mut out,
        options,
        "# Re-lock every recipe weekly: when upstream moved (a new wheel build, a yanked file, a\n\
         # Debian security update), the changed locks come back as a pull request listing the\n\
         # package changes, so the change is reviewed and CI-tested.",
    );
    // One recipe per line, so a new recipe is a one-line change in review.
    let files: Vec<String> = recipes
        .iter()
        .map(|r| format!(" \\\n              {}", q(&r.file)))
        .collect();
    let _ = write!(
        out,
        r#"name: relock

on:
  schedule:
    - cron: "23 4 * * 1"
  workflow_dispatch:

permissions:
  contents: write
  pull-requests: write

concurrency:
  group: relock
  cancel-in-progress: true

defaults:
  run:
    shell: bash

{env}
jobs:
  relock:
    runs-on: ubuntu-24.04
    timeout-minutes: 60
    steps:
      - uses: {CHECKOUT}
{INSTALL_STEP}      # One recipe failing (an index unreachable) must not hide the others' changes: all are
      # tried, the pull request carries what changed, and the job fails afterwards.
      # `--upgrade`: Debian/Ubuntu packages move to the archive's current versions (security
      # updates) and wheels to what the indexes publish today: this is where upstream's
      # drift is found (the landing tests relock as of each lock's own `as_of`).
      # Each lock's changes (package, old -> new) go into the pull request.
      - name: Re-lock every recipe
        id: lock
        run: |
          failed=""
          {{
            echo "\`cudastack lock --upgrade\` on every recipe gave different lock files. Review the"
            echo "changed URLs and hashes; the publish workflow rebuilds and re-verifies the affected"
            echo "images once this is merged."
            echo
          }} > relock-body.md
          for recipe in{files}; do
            if cudastack lock --upgrade --json "$recipe" > relock.json; then
              jq -r '.[] | select((.deb_changes + (.wheel_changes // [])) | length > 0)
                | "**\(.lock)**\n" + ([(.deb_changes + (.wheel_changes // []))[] | "- `\(.name)` \(.old // "(new)") -> \(.new // "(removed)")"] | join("\n")) + "\n"' \
                relock.json >> relock-body.md
            else
              failed="$failed $recipe"
            fi
          done
          echo "failed=${{failed# }}" >> "$GITHUB_OUTPUT"
          git status --short recipes/ >> "$GITHUB_STEP_SUMMARY"
          cat relock-body.md >> "$GITHUB_STEP_SUMMARY"
      # A pull request opened with the workflow token does not start other workflows: set
      # the RELOCK_TOKEN secret (a token that may open pull requests) to have CI test it.
      - name: Open a pull request when a lock changed
        uses: {CREATE_PR}
        with:
          token: ${{{{ secrets.RELOCK_TOKEN || github.token }}}}
          branch: cudastack/relock
          delete-branch: true
          add-paths: recipes/*.lock,recipes/pylock.*.toml
          commit-message: "recipes: re-lock against the current indexes and archives"
          title: "recipes: re-lock (upstream artifacts or Debian/Ubuntu packages moved)"
          body-path: relock-body.md
      - name: Fail when a recipe could not be locked
        if: steps.lock.outputs.failed != ''
        env:
          FAILED: ${{{{ steps.lock.outputs.failed }}}}
        run: |
          echo "::error::could not re-lock: $FAILED"
          exit 1
"#,
        files = files.concat(),
        env = {
            let mut env = String::new();
            release_env(&mut env, options);
            env
        },
    );
    out
}

pub fn actionlint_config(recipes: &[WorkflowRecipe], options: &WorkflowOptions) -> String {
    let mut out = String::new();
    header(
        &mut out,
        options,
        "# actionlint: the self-hosted runner labels publish.yml's verify jobs ask for.",
    );
    let mut labels: Vec<String> = verify_legs(recipes)
        .into_iter()
        .map(|(_, _, label)| label)
        .collect();
    labels.sort();
    labels.dedup();
    if labels.is_empty() {
        out.push_str("self-hosted-runner:\n  labels: []\n");
        return out;
    }
    out.push_str("self-hosted-runner:\n  labels:\n");
    for label in labels {
        let _ = writeln!(out, "    - {}", q(&label));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipes() -> Vec<WorkflowRecipe> {
        vec![
            WorkflowRecipe {
                name: "torch2.4.1-cu121-py3.11".into(),
                file: "recipes/torch2.4.1-cu121-py3.11.yaml".into(),
                lock: "recipes/torch2.4.1-cu121-py3.11.lock".into(),
                gpus: vec!["A100".into(), "RTX 4090".into(), "rtx-4090".into()],
            },
            WorkflowRecipe {
                name: "cuda-only".into(),
                file: "recipes/cuda-only.yaml".into(),
                lock: "recipes/cuda-only.lock".into(),
                gpus: vec![],
            },
        ]
    }

    #[test]
    fn one_build_per_recipe_one_verify_per_gpu_label() {
        let text = publish_workflow(&recipes(), &WorkflowOptions::default());
        // Builds 2, verify legs 2, promote legs 1.
        assert_eq!(text.matches("{ recipe: ").count(), 2 + 2 + 1, "{text}");
        assert!(text.contains(
            r#"- { recipe: "torch2.4.1-cu121-py3.11", gpu: "RTX 4090", runner: "gpu-rtx-4090", arch: "x64" }"#
        ));
        // "RTX 4090" and "rtx-4090" are one runner label: one job, not two.
        assert_eq!(text.matches(r#"runner: "gpu-rtx-4090""#).count(), 1);
        assert!(text.contains("ghcr.io/${GITHUB_REPOSITORY_OWNER}"));
        assert!(text.contains("hashFiles(matrix.lock)"));
    }

    /// The jobs install a released cudastack (checked against the release's
    /// SHA256SUMS) instead of compiling it, so nothing needs cudastack's source.
    #[test]
    fn jobs_install_a_released_cudastack_and_never_compile_it() {
        for text in [
            publish_workflow(&recipes(), &WorkflowOptions::default()),
            relock_workflow(&recipes(), &WorkflowOptions::default()),
        ] {
            for compiled in [
                "cargo ",
                "rust-toolchain",
                "rust-cache",
                "scripts/",
                "target/release",
                "target/probe",
            ] {
                assert!(!text.contains(compiled), "`{compiled}` in\n{text}");
            }
            let version = format!("  CUDASTACK_VERSION: \"{}\"\n", env!("CARGO_PKG_VERSION"));
            assert!(text.contains(&version), "{text}");
            assert!(text.contains(&format!("  CUDASTACK_RELEASE_URL: \"{RELEASE_URL}\"\n")));
            assert!(text.contains("  CUDASTACK_SHA256SUMS: \"\"\n"), "{text}");
        }
        let publish = publish_workflow(&recipes(), &WorkflowOptions::default());
        // Every job installs it: build, verify, promote.
        assert_eq!(publish.matches("- name: Install cudastack\n").count(), 3);
        assert!(!publish.contains("needs: [tool"), "{publish}");

        let pinned = WorkflowOptions {
            cudastack_version: "1.2.3".into(),
            release_url: Some("https://mirror.example.com/cudastack".into()),
            sha256sums: Some("ab".repeat(32)),
            ..WorkflowOptions::default()
        };
        let text = publish_workflow(&recipes(), &pinned);
        assert!(text.contains("  CUDASTACK_VERSION: \"1.2.3\"\n"), "{text}");
        assert!(
            text.contains("  CUDASTACK_RELEASE_URL: \"https://mirror.example.com/cudastack\"\n")
        );
        assert!(text.contains(&format!(
            "  CUDASTACK_SHA256SUMS: \"{}\"\n",
            "ab".repeat(32)
        )));
    }

    /// After the verify legs, each recipe with GPUs is promoted to its matrix tag
    /// by `cudastack promote REF --require-gpu CLASS...`, one flag per verified GPU type.
    #[test]
    fn each_recipe_with_gpus_is_promoted_after_its_verification() {
        let text = publish_workflow(&recipes(), &WorkflowOptions::default());
        let promote = &text[text.find("\n  promote:\n").expect("a promote job")..];
        assert!(promote.contains("needs: [build, verify]"), "{promote}");
        assert!(
            promote.contains(r#"- { recipe: "torch2.4.1-cu121-py3.11", gpus: "A100\nRTX 4090", runners: "gpu-a100\ngpu-rtx-4090" }"#),
            "{promote}"
        );
        assert!(!promote.contains("cuda-only"), "{promote}");
        assert!(promote.contains(
            r#"cudastack promote "$IMAGE_REPOSITORY@$IMAGE_DIGEST" --to "$IMAGE_TAG" "${args[@]}""#
        ));
        assert!(promote.contains(r#"args+=(--require-gpu "$gpu")"#));
        // The verified copies the verify legs pushed, by the tag their push step names.
        assert!(promote
            .contains(r#"args+=(--verified "$IMAGE_REPOSITORY:$IMAGE_TAG-verified-$runner")"#));
        assert!(text.contains(r#""$IMAGE_REPOSITORY:$IMAGE_TAG-verified-$RUNNER_LABEL""#));
    }

    /// A GH200 (Grace: an Arm host) is verified on an arm64 runner, which installs the
    /// aarch64 release; the x64 legs run on x64 runners.
    #[test]
    fn grace_gpus_are_verified_on_arm64_runners() {
        let mut with_grace = recipes();
        with_grace[0].gpus.push("GH200".into());
        let text = publish_workflow(&with_grace, &WorkflowOptions::default());
        assert!(text.contains("needs: build\n"), "{text}");
        assert!(text.contains(r#"gpu: "GH200", runner: "gpu-gh200", arch: "arm64" }"#));
        assert!(text.contains(r#"gpu: "A100", runner: "gpu-a100", arch: "x64" }"#));
        assert!(text.contains("aarch64 | arm64) target=aarch64-unknown-linux-musl"));
    }

    #[test]
    fn no_gpus_means_no_verify_job() {
        let mut only = recipes();
        only.remove(0);
        let text = publish_workflow(&only, &WorkflowOptions::default());
        assert!(!text.contains("\n  verify:\n"), "{text}");
        let config = actionlint_config(&only, &WorkflowOptions::default());
        assert!(config.ends_with("labels: []\n"), "{config}");
    }

    #[test]
    fn options_round_trip_through_the_header() {
        for options in [
            WorkflowOptions::default(),
            WorkflowOptions {
                registry: Some("registry.example.com:5000/ml".into()),
                ..WorkflowOptions::default()
            },
            WorkflowOptions {
                registry: None,
                cudastack_version: "0.2.0-rc.1".into(),
                release_url: Some("https://mirror.example.com/cudastack".into()),
                sha256sums: Some("0f".repeat(32)),
            },
        ] {
            for file in generate_for(&recipes(), &options).unwrap() {
                assert_eq!(
                    WorkflowOptions::from_header(&file.contents),
                    Some(options.clone()),
                    "{}",
                    file.path.display()
                );
            }
        }
        assert_eq!(WorkflowOptions::from_header("name: ci\n"), None);
    }

    #[test]
    fn bad_registries_and_empty_recipe_sets_are_refused() {
        let options = WorkflowOptions {
            registry: Some("GHCR.io/Acme".into()),
            ..WorkflowOptions::default()
        };
        let error = generate_for(&recipes(), &options).unwrap_err().to_string();
        assert!(error.contains("GHCR.io/Acme"), "{error}");
        for bad in [
            WorkflowOptions {
                cudastack_version: "latest; rm -rf /".into(),
                ..WorkflowOptions::default()
            },
            WorkflowOptions {
                release_url: Some("ftp://mirror.example.com".into()),
                ..WorkflowOptions::default()
            },
            WorkflowOptions {
                release_url: Some("https://mirror.example.com/".into()),
                ..WorkflowOptions::default()
            },
            WorkflowOptions {
                sha256sums: Some("ABC".into()),
                ..WorkflowOptions::default()
            },
        ] {
            let error = generate_for(&recipes(), &bad).unwrap_err().to_string();
            assert!(
                error.contains("such as") || error.contains("hex"),
                "{error}"
            );
        }
        assert!(generate_for(&[], &WorkflowOptions::default()).is_err());
    }

    #[test]
    fn runner_labels() {
        assert_eq!(runner_label("A100"), "gpu-a100");
        assert_eq!(runner_label("RTX 4090"), "gpu-rtx-4090");
        assert_eq!(runner_label("H100 SXM"), "gpu-h100-sxm");
    }
}
