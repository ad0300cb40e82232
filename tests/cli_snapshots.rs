//! What a user sees on the terminal, for every command (`--help` is tests/cli_help.rs):
//! insta snapshots of the exit status, stdout and stderr of each command and of each
//! subcommand or outcome that prints differently. A change of wording or layout fails here
//! and shows up in review as a snapshot diff.
//!
//! Only what legitimately varies between runs is replaced: temporary paths, 127.0.0.1
//! ports, durations and speeds, dates, sizes on disk, and the digests of what a build makes
//! from Debian's current packages (each digest becomes a name kept for the whole test, so a
//! snapshot still shows which image an output names). Everything else is checked as printed.
//!
//! Inputs are cheap: the matrix built in, planted hosts and local fixtures for the commands
//! that need no component; for the image commands, one stand-in build (the small gcc-made
//! CUDA wheels of e2e_support on a real Debian base: root and mmdebstrap) feeds inspect,
//! check, sign, push, pull, verify, promote, load and cache, against Debian's real
//! docker-registry on 127.0.0.1 and the real Docker daemon. Each component a part needs
//! goes through the gate when it is missing.
//!
//! Not here, because what they print is this host's: `doctor` on the live machine (and
//! `--build-host`), `check --detect`, `verify --native` and `verify` running the probe in a
//! container (tests/doctor_host.rs, tests/cli_doctor_build_host.rs, tests/verify_docker.rs,
//! tests/verify_native.rs check them by content).

use crate::cli_verify_registry::{gpu_report, job_log};
use crate::e2e_support;
use crate::gate;
use crate::registry_support::{self, Registry};

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

/// A throwaway P-256 key (PKCS#8, unencrypted) made for these tests: a fixed key gives a
/// fixed key id and public key, so the snapshots show them as printed.
const TEST_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgUUDPFPncw1imOuac
Ue0YH4SF+zd5osokDMpAivS151uhRANCAAR4XEb8WlOpbRRDM1NkDXbvQwtOEtW1
O6SMb9zV89QvCLzLQZlbEEn9/S6YGezdLcKZ/RZypP1w4ceXTG9HZWcR
-----END PRIVATE KEY-----
";
/// The id of [`TEST_KEY`] (the sha256 of its public key), as `key public` prints it.
const TEST_KEY_ID: &str = "8508ab8406c92b592647ce7627b30447e5df1a32d7660b97123c3994fb445560";

/// One run of the binary.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Ran {
    /// The terminal as the user sees it: the exit status, stdout, then stderr.
    fn screen(&self) -> String {
        let mut text = format!(
            "exit: {}\n",
            self.code.map_or("signal".to_string(), |c| c.to_string())
        );
        for (name, stream) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !stream.is_empty() {
                text.push_str(&format!("--- {name}\n{stream}"));
                if !stream.ends_with('\n') {
                    text.push_str("[no newline at the end]\n");
                }
            }
        }
        text
    }
}

/// The binary, run from the checkout with an empty cache of its own, no Docker credentials
/// and no colour, as a user without configuration would.
fn cudastack(cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cudastack"));
    command
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CUDASTACK_CACHE_DIR", cache)
        .env("NO_COLOR", "1")
        .env("DOCKER_CONFIG", "/nonexistent-cudastack-test")
        .env_remove("CUDASTACK_LOG")
        .env_remove("CUDASTACK_SIGN_KEY")
        .env_remove("CUDASTACK_APT_MIRROR")
        .env_remove("CUDASTACK_REGISTRY_USERNAME")
        .env_remove("CUDASTACK_REGISTRY_PASSWORD")
        .stdin(Stdio::null());
    command
}

fn run(command: &mut Command) -> Ran {
    let output = command.output().unwrap();
    Ran {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// What varies between runs, replaced by stable names before a snapshot is taken.
struct Scrub {
    /// Literal text (temporary paths, the registry's address) and its name, longest first.
    literals: Vec<(String, String)>,
    /// Whether digests are named at all: a build's digests vary (Debian's packages move
    /// on), the digests of the fixtures of the offline commands do not.
    name_digests: bool,
    /// Digests seen so far, each with its name: a given one, or `digest-N` in the order
    /// first seen, for the whole test.
    digests: RefCell<BTreeMap<String, String>>,
    /// Hex that is not a digest's (a layout's ref names of pulled referrers): `hex-N`.
    hex: RefCell<BTreeMap<String, String>>,
    /// Hex that stays as printed: it does not vary (the test key's id).
    keep: Vec<String>,
}

impl Scrub {
    fn new(name_digests: bool) -> Scrub {
        Scrub {
            literals: Vec::new(),
            name_digests,
            digests: RefCell::new(BTreeMap::new()),
            hex: RefCell::new(BTreeMap::new()),
            keep: Vec::new(),
        }
    }

    /// Show `text` (a path, an address) as `[name]`.
    fn literal(mut self, text: impl Into<String>, name: &str) -> Scrub {
        self.literals.push((text.into(), format!("[{name}]")));
        self.literals
            .sort_by_key(|(text, _)| std::cmp::Reverse(text.len()));
        self
    }

    /// Leave `hex` (or any hex it starts) as it is.
    fn keep(mut self, hex: &str) -> Scrub {
        self.keep.push(hex.to_string());
        self
    }

    /// Show `digest` (`sha256:HEX`) as `[name]`.
    fn name(&self, digest: &str, name: &str) {
        self.digests
            .borrow_mut()
            .insert(digest.to_string(), format!("[{name}]"));
    }

    fn apply(&self, text: &str) -> String {
        let mut text = text.to_string();
        for (literal, name) in &self.literals {
            text = text.replace(literal.as_str(), name);
        }
        if self.name_digests {
            text = self.name_digests(&text);
        }
        sizes(&text)
    }

    /// Every digest by its name, and the hex of a digest alone (a blob path, the 8 or 12
    /// digits of a short form) by its digest's name.
    fn name_digests(&self, text: &str) -> String {
        let digest = regex::Regex::new(r"sha256:[0-9a-f]{64}").unwrap();
        let mut names = self.digests.borrow_mut();
        for found in digest.find_iter(text) {
            let next = names.len() + 1;
            names
                .entry(found.as_str().to_string())
                .or_insert_with(|| format!("[digest-{next}]"));
        }
        let text = digest.replace_all(text, |c: &regex::Captures| names[&c[0]].clone());
        let mut others = self.hex.borrow_mut();
        let hex = regex::Regex::new(r"\b[0-9a-f]{8,64}\b").unwrap();
        hex.replace_all(&text, |c: &regex::Captures| {
            let found = &c[0];
            if let Some((_, name)) = names
                .iter()
                .find(|(digest, _)| digest["sha256:".len()..].starts_with(found))
            {
                return name.clone();
            }
            let kept = self.keep.iter().any(|keep| keep.starts_with(found));
            if kept || found.len() < 12 || !found.contains(|c: char| c.is_ascii_alphabetic()) {
                return found.to_string();
            }
            let next = others.len() + 1;
            others
                .entry(found.to_string())
                .or_insert_with(|| format!("[hex-{next}]"))
                .clone()
        })
        .into_owned()
    }
}

/// Sizes (`12.3 MiB`, `512 B`, `4.5 MB`) as `[SIZE]`: they vary with the filesystem and
/// with Debian's packages. In a table column (two spaces or more before it) the column
/// keeps its width, so the snapshot still shows the alignment.
fn sizes(text: &str) -> String {
    let size = regex::Regex::new(r"( *)\b(\d+\.\d+ (KiB|MiB|GiB|TiB|MB)|\d+ B)\b").unwrap();
    size.replace_all(text, |c: &regex::Captures| {
        let width = c[0].chars().count();
        if c[1].len() >= 2 && width >= "[SIZE]".len() {
            format!("{:>width$}", "[SIZE]")
        } else {
            format!("{}[SIZE]", &c[1])
        }
    })
    .into_owned()
}

/// The filters every snapshot gets: durations, dates and this binary's version, which vary
/// between runs and releases, not between layouts.
fn filters() -> Vec<(&'static str, &'static str)> {
    vec![
        // The build's stage lines: `[  0.4s] fetch ...`, right-aligned in six columns.
        (r"\[ *\d+\.\d+s\]", "[ [T]s]"),
        (r"\b\d+\.\d+s\b", "[T]s"),
        (r"\b20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ\b", "[TIME]"),
        (
            concat!(r"\b", env!("CARGO_PKG_VERSION"), r"\b"),
            "[VERSION]",
        ),
    ]
}

/// Snapshot `ran` as `name`, scrubbed, with `more` filters.
fn snapshot_with(name: &str, ran: &Ran, scrub: &Scrub, more: &[(&'static str, &'static str)]) {
    let text = scrub.apply(&ran.screen());
    let mut filters = filters();
    filters.extend_from_slice(more);
    insta::with_settings!({ filters => filters, omit_expression => true }, {
        insta::assert_snapshot!(name, text);
    });
}

/// Snapshot `ran` as `name`, scrubbed.
fn snapshot(name: &str, ran: &Ran, scrub: &Scrub) {
    snapshot_with(name, ran, scrub, &[]);
}

/// The commands that need no component: validate, matrix (its tables and `refresh`
/// against a local index), solve, explain, doctor on a planted host, ci, key, cache.
#[test]
fn commands_that_need_nothing_but_the_binary() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let scrub = Scrub::new(false).literal(work.path().display().to_string(), "WORK");
    let cli = |args: &[&str]| run(cudastack(&cache).args(args));

    snapshot(
        "validate_valid_and_unparsable",
        &cli(&[
            "validate",
            "recipes/torch2.4.1-cu121-py3.11.yaml",
            "tests/fixtures/recipes/invalid/unknown-key.yaml",
        ]),
        &scrub,
    );
    snapshot(
        "matrix_cuda",
        &cli(&["matrix", "--table", "cuda", "--cuda", "12.4"]),
        &scrub,
    );
    snapshot(
        "matrix_cudnn",
        &cli(&["matrix", "--table", "cudnn"]),
        &scrub,
    );
    snapshot("matrix_gpus", &cli(&["matrix", "--table", "gpus"]), &scrub);
    snapshot(
        "solve_nothing_fits",
        &cli(&["solve", "--driver", "550.54.15", "--gpu", "B200"]),
        &scrub,
    );
    // A GPU that runs next to an Arm host only, on R550: what rules builds out is partly
    // cudastack's own limit, said apart from compatibility, and the answer ends with the
    // smallest changes that make a build fit.
    snapshot(
        "solve_cudastack_limit",
        &cli(&[
            "solve",
            "--driver",
            "550.54.15",
            "--gpu",
            "GH200",
            "--top",
            "2",
        ]),
        &scrub,
    );
    let recipe = work.path().join("my-stack.yaml");
    snapshot(
        "solve_write",
        &cli(&[
            "solve",
            "--driver",
            "550.54.15",
            "--gpu",
            "H100",
            "--torch",
            "2.4",
            "--top",
            "1",
            "--write",
            recipe.to_str().unwrap(),
        ]),
        &scrub,
    );
    // A new project for H100 nodes on driver 535: the recipe, the files it names, the
    // stack solve ranks first (PyPI's, which locks where only PyPI is reachable).
    let project = work.path().join("acme-train");
    snapshot(
        "init",
        &cli(&[
            "init",
            project.to_str().unwrap(),
            "--driver",
            "535.104.05",
            "--gpu",
            "H100",
        ]),
        &scrub,
    );
    insta::assert_snapshot!(
        "init_recipe",
        std::fs::read_to_string(project.join("cudastack.yaml")).unwrap()
    );
    snapshot(
        "explain_recognised",
        &cli(&[
            "explain",
            "RuntimeError: CUDA error: no kernel image is available for execution on the device",
        ]),
        &scrub,
    );
    snapshot(
        "explain_not_recognised",
        &cli(&["explain", "the printer is on fire"]),
        &scrub,
    );

    // doctor on an empty planted host: no driver, so it stops at the first layer. The
    // loader path it searches is this process's, which cargo sets: a user's has none.
    let host = work.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    snapshot(
        "doctor_planted_host_without_a_driver",
        &run(cudastack(&cache)
            .env_remove("LD_LIBRARY_PATH")
            .args(["doctor", "--root"])
            .arg(&host)),
        &scrub,
    );

    // ci emit in a repository of one recipe: written, then checked, then found stale.
    let root = work.path().join("repo");
    std::fs::create_dir_all(root.join("recipes")).unwrap();
    for file in [
        "torch2.4.1-cu121-py3.11.yaml",
        "torch2.4.1-cu121-py3.11.lock",
    ] {
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("recipes")
                .join(file),
            root.join("recipes").join(file),
        )
        .unwrap();
    }
    let root_arg = root.to_str().unwrap();
    snapshot("ci_emit", &cli(&["ci", "emit", "--root", root_arg]), &scrub);
    let publish = root.join(".github/workflows/publish.yml");
    let text = std::fs::read_to_string(&publish).unwrap();
    std::fs::write(&publish, text.replace("jobs:", "# edited by hand\njobs:")).unwrap();
    snapshot(
        "ci_emit_check_stale",
        &cli(&["ci", "emit", "--root", root_arg, "--check"]),
        &scrub,
    );

    // key: a generated pair (its key id is new each time) and the public half of the
    // fixed test key.
    let key_scrub = Scrub::new(false).literal(work.path().display().to_string(), "WORK");
    let generated = run(cudastack(&cache)
        .env("COSIGN_PASSWORD", "snapshot")
        .args(["key", "generate", "--output-prefix"])
        .arg(work.path().join("generated")));
    let key_id = generated.stdout.trim().to_string();
    snapshot(
        "key_generate",
        &generated,
        &key_scrub.literal(key_id, "KEY ID"),
    );
    let key = work.path().join("test.key");
    std::fs::write(&key, TEST_KEY).unwrap();
    snapshot(
        "key_public",
        &run(cudastack(&cache).args(["key", "public"]).arg(&key)),
        &scrub,
    );

    // cache on a cache nothing used yet.
    let cache_scrub = Scrub::new(false).literal(cache.display().to_string(), "CACHE");
    snapshot(
        "cache_empty",
        &run(cudastack(&cache).arg("cache")),
        &cache_scrub,
    );
    snapshot(
        "cache_prune_nothing",
        &run(cudastack(&cache).args(["cache", "prune"])),
        &cache_scrub,
    );

    // matrix refresh from a local index with one torch release the embedded data lacks.
    let index = crate::matrix_refresh::index_with_torch_2_99();
    let refreshed =
        run(cudastack(&cache).args(["matrix", "refresh", "--index", &index.url("/simple/")]));
    let refresh_scrub = cache_scrub.literal(index.base.trim_start_matches("http://"), "INDEX");
    snapshot_with(
        "matrix_refresh",
        &refreshed,
        &refresh_scrub,
        &[(r"\(generated \d{4}-\d\d-\d\d\)", "(generated [TODAY])")],
    );
}

/// The image commands, on one stand-in build: lock and build, then inspect, check, sign,
/// push, pull, verify (`--emit`, `--from-log` on a registry image and on a layout),
/// promote and cache, and, when a Docker daemon answers, load. They run in the work
/// directory with relative paths, as a user types them.
#[test]
fn image_commands_on_one_stand_in_build() {
    if let Some(skip) =
        e2e_support::skip_reason(&[("gcc", &["--version"]), ("umoci", &["--version"])])
    {
        skip.report();
        return;
    }
    if let Some(skip) = registry_support::skip_reason() {
        skip.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start(None);
    let shared_cache = e2e_support::cache_dir();
    let scrub = Scrub::new(true)
        .literal(work.path().display().to_string(), "WORK")
        .literal(shared_cache.display().to_string(), "CACHE")
        .literal(registry.host(), "REGISTRY")
        .keep(TEST_KEY_ID);
    // What Debian's archive decides: how many packages the base has, their files, and the
    // sizes of the documents that list them. Their wording stays checked.
    let debian: &[(&str, &str)] = &[
        (r"\(\d+ artifacts\)", "([N] artifacts)"),
        (r"\b\d+ Debian packages", "[N] Debian packages"),
        (r"\b\d+ resolved dependencies", "[N] resolved dependencies"),
        (
            r"\b\d+ ELF files, \d+ NEEDED entries",
            "[N] ELF files, [N] NEEDED entries",
        ),
        (
            r"CycloneDX 1\.6: \d+ components",
            "CycloneDX 1.6: [N] components",
        ),
        (r"\bread \d+ bytes", "read [N] bytes"),
    ];
    let cache = work.path().join("cache");
    let in_work = |cache: &Path| {
        let mut command = cudastack(cache);
        command.current_dir(work.path());
        command
    };
    let cli = |args: &[&str]| run(in_work(&cache).args(args));

    // lock: the stand-in wheels from a local mirror, the Debian base from its archive.
    e2e_support::stand_in::cuda_12_4_wheels(
        e2e_support::stand_in::Target::X86_64,
        &work.path().join("libs"),
        &work.path().join("mirror"),
    );
    std::fs::write(work.path().join("snap.yaml"), format!("name: snap\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: 1700000000\ntags: [\"{LOAD_TAG}\"]\n")).unwrap();
    let locked = cli(&["lock", "--mirror", "mirror", "snap.yaml"]);
    assert_eq!(locked.code, Some(0), "{}", locked.screen());
    snapshot_with("lock", &locked, &scrub, debian);

    // build: once to fill the shared cache (other tests may have), then the build shown,
    // all from the cache, so that it prints the same every time. A stand-in native probe
    // (the image has no torch): whether scripts/setup.sh built the real one must not
    // change what is shown.
    let probe = work.path().join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    std::fs::write(probe.join("probe.c"), "int main(void) { return 0; }\n").unwrap();
    let compiled = Command::new("gcc")
        .arg("-o")
        .arg(probe.join("cudastack-probe-cuda12-x86_64"))
        .arg(probe.join("probe.c"))
        .status()
        .unwrap();
    assert!(compiled.success());
    let build = |layout: &str, args: &[&str]| {
        run(in_work(&shared_cache)
            .env("CUDASTACK_PROBE_DIR", &probe)
            .args([
                "build",
                "--no-verify",
                "--mirror",
                "mirror",
                "--layout",
                layout,
            ])
            .args(args)
            .arg("snap.yaml"))
    };
    let first = build("first", &["--json"]);
    assert_eq!(first.code, Some(0), "{}", first.screen());
    let report: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    let manifest = report["manifest_digest"].as_str().unwrap().to_string();
    scrub.name(&manifest, "manifest");
    snapshot_with("build", &build("layout", &[]), &scrub, debian);

    let image = "oci:layout";
    snapshot_with("inspect_layout", &cli(&["inspect", image]), &scrub, debian);
    snapshot(
        "check_yes",
        &cli(&["check", image, "--driver", "550.54.15", "--gpu", "H100"]),
        &scrub,
    );
    snapshot(
        "check_no",
        &cli(&["check", image, "--driver", "535.104.05", "--gpu", "H100"]),
        &scrub,
    );
    snapshot("check_unknown", &cli(&["check", image]), &scrub);

    // An image another tool built FROM it (umoci adds a layer, as a Dockerfile's COPY
    // would): the labels stay, and inspect and check say whose they are (issue 34).
    let derived = work.path().join("derived");
    let copied = Command::new("cp")
        .args(["-a", "layout"])
        .arg(&derived)
        .current_dir(work.path())
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::write(work.path().join("extra.txt"), "added by another tool\n").unwrap();
    let inserted = Command::new("umoci")
        .args([
            "insert",
            "--image",
            "derived:latest",
            "extra.txt",
            "/opt/team/extra.txt",
        ])
        .current_dir(work.path())
        .output()
        .unwrap();
    assert!(
        inserted.status.success(),
        "umoci insert: {}",
        String::from_utf8_lossy(&inserted.stderr)
    );
    snapshot_with(
        "inspect_derived",
        &cli(&["inspect", "oci:derived"]),
        &scrub,
        debian,
    );
    snapshot(
        "check_derived",
        &cli(&[
            "check",
            "oci:derived",
            "--driver",
            "550.54.15",
            "--gpu",
            "H100",
        ]),
        &scrub,
    );

    // sign with the test key, then inspect with its public half; a second sign has nothing
    // left to sign.
    std::fs::write(work.path().join("test.key"), TEST_KEY).unwrap();
    let public = cli(&["key", "public", "test.key"]);
    std::fs::write(work.path().join("test.pub"), &public.stdout).unwrap();
    snapshot("sign", &cli(&["sign", image, "--key", "test.key"]), &scrub);
    snapshot(
        "sign_nothing_left",
        &cli(&["sign", image, "--key", "test.key"]),
        &scrub,
    );
    snapshot_with(
        "inspect_layout_signed",
        &cli(&["inspect", image, "--key", "test.pub"]),
        &scrub,
        debian,
    );

    // push, then pull into a new layout through a new cache.
    let reference = format!("{}/team/snap:1", registry.host());
    snapshot("push", &cli(&["push", "layout", &reference]), &scrub);
    let pull_cache = work.path().join("pull-cache");
    snapshot(
        "pull",
        &run(in_work(&pull_cache).args(["pull", &reference, "--layout", "pulled"])),
        &scrub,
    );
    snapshot_with(
        "inspect_registry",
        &cli(&["inspect", &reference]),
        &scrub,
        debian,
    );

    // The cluster route: the job's text, then its log recorded on the registry image.
    snapshot(
        "verify_emit_k8s_job",
        &cli(&[
            "verify",
            &reference,
            "--emit",
            "k8s-job",
            "--gpu-type",
            "NVIDIA-H100-80GB-HBM3",
        ]),
        &scrub,
    );
    snapshot(
        "verify_emit_sbatch",
        &cli(&[
            "verify",
            &reference,
            "--emit",
            "sbatch",
            "--gpu-type",
            "h100",
        ]),
        &scrub,
    );
    let by_digest = format!("{}/team/snap@{manifest}", registry.host());
    std::fs::write(
        work.path().join("h100.log"),
        job_log(
            &format!("cudastack-image-v1 {by_digest}"),
            &gpu_report("NVIDIA H100 80GB HBM3", "9.0", None),
        ),
    )
    .unwrap();
    snapshot(
        "verify_from_log_registry",
        &cli(&["verify", &reference, "--from-log", "h100.log"]),
        &scrub,
    );
    snapshot(
        "promote_refused",
        &cli(&["promote", &reference, "--require-gpu", "h100,b200"]),
        &scrub,
    );
    snapshot(
        "promote_dry_run",
        &cli(&["promote", &reference, "--require-gpu", "h100", "--dry-run"]),
        &scrub,
    );
    snapshot(
        "promote",
        &cli(&["promote", &reference, "--require-gpu", "h100"]),
        &scrub,
    );

    // Where the verified image may run: node affinity, Slurm's constraints, the job on two
    // nodes (a command given, the stand-in has no entrypoint), and the admission policy.
    let verified = format!("{}/team/snap:1-verified", registry.host());
    std::fs::copy(
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/slurm/site-features.yaml"
        ),
        work.path().join("site-features.yaml"),
    )
    .unwrap();
    let site = "site-features.yaml";
    // The registry serves the verified copy under a digest of its own.
    let digests = &[(r"sha256:[0-9a-f]{64}", "sha256:[DIGEST]")];
    let v = verified.as_str();
    let cluster: [(&str, &[&str]); 5] = [
        ("place", &["place", v]),
        (
            "place_slurm",
            &[
                "place",
                v,
                "--for",
                "slurm",
                "--site-features",
                site,
                "--gpus",
                "8",
            ],
        ),
        (
            "job",
            &[
                "job",
                v,
                "--nodes",
                "2",
                "--gpus-per-node",
                "8",
                "--namespace",
                "ml",
                "--",
                "python3",
                "train.py",
            ],
        ),
        (
            "job_sbatch",
            &[
                "job",
                v,
                "--for",
                "sbatch",
                "--site-features",
                site,
                "--nodes",
                "2",
                "--",
                "python3",
                "train.py",
            ],
        ),
        ("admission", &["admission", v]),
    ];
    for (name, args) in cluster {
        snapshot_with(name, &cli(args), &scrub, digests);
    }

    // The same log recorded in the layout: a verified copy, which inspect then reads.
    snapshot(
        "verify_from_log_layout",
        &cli(&["verify", image, "--from-log", "h100.log"]),
        &scrub,
    );
    snapshot_with(
        "inspect_layout_verified",
        &cli(&["inspect", image]),
        &scrub,
        debian,
    );
    // A build that pushes too: its reference is the last line.
    let pushed = format!("{}/team/snap:2", registry.host());
    snapshot_with(
        "build_push",
        &build("layout-pushed", &["--push", &pushed]),
        &scrub,
        debian,
    );

    // cache: what the pull left in its cache, then all of it pruned.
    let cache_scrub = Scrub::new(true).literal(pull_cache.display().to_string(), "CACHE");
    snapshot(
        "cache",
        &run(in_work(&pull_cache).arg("cache")),
        &cache_scrub,
    );
    snapshot(
        "cache_prune",
        &run(in_work(&pull_cache).args(["cache", "prune", "--older-than", "0"])),
        &cache_scrub,
    );

    // load needs a Docker daemon.
    if let Err(reason) = crate::oci_support::docker() {
        gate::skip("docker", reason);
        return;
    }
    // Left by an earlier run that was killed, the image would make `load` skip it.
    let loaded = RemoveImages(&[LOAD_TAG, LOAD_TAG_VERIFIED]);
    loaded.remove();
    // The daemon's address is the environment's (DOCKER_HOST, or the default socket).
    snapshot_with(
        "load",
        &cli(&["load", "layout"]),
        &scrub,
        &[(r"Docker daemon at \S+", "Docker daemon at [DOCKER_HOST]")],
    );
}

/// The tag the stand-in build's recipe gives its image, loaded into Docker by `load`
/// with the tag its verification added.
const LOAD_TAG: &str = "localhost/cudastack-test-snapshots:1";
const LOAD_TAG_VERIFIED: &str = "localhost/cudastack-test-snapshots:1-verified";

/// Removes images from Docker when the test ends, passed or not.
struct RemoveImages(&'static [&'static str]);

impl RemoveImages {
    fn remove(&self) {
        for tag in self.0 {
            let _ = Command::new("docker").args(["rmi", "-f", tag]).output();
        }
    }
}

impl Drop for RemoveImages {
    fn drop(&mut self) {
        self.remove();
    }
}
