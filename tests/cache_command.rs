//! `cudastack cache` and `cudastack cache prune` on a real cache (issue 21: the cache keeps
//! what rebuilds need and no more). Two stand-in images (the gcc-made nvidia-* wheels of
//! `tests/stack_concurrent_builds.rs`, on the e2e cache's staged Debian base) share every
//! layer but the config; after the first is built, time passes (every last-use stamp is
//! set 30 days back), the second is built, and a prune of what is older than a day must
//! remove exactly the first image's own parts (its config tree, layer entry and blob, and
//! the bases nobody used) while keeping what the second used and a tree a build holds.
//! Both images then rebuild, the second entirely from the cache, the first to the same
//! digest as before.
//!
//! Needs root, mmdebstrap and gcc (as the other real builds); the e2e cache is only read
//! (hard links into a fresh cache), never pruned.

use crate::e2e_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use e2e_support::stand_in::{cuda_12_4_wheels, lock, Target};

fn cudastack(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudastack"))
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
}

fn build(recipe: &Path, mirror: &Path, layout: &Path, cache: &Path) -> serde_json::Value {
    let output = cudastack(
        &[
            "--json",
            "build",
            "--no-verify",
            "--mirror",
            mirror.to_str().unwrap(),
            "--layout",
            layout.to_str().unwrap(),
            recipe.to_str().unwrap(),
        ],
        cache,
    );
    assert!(
        output.status.success(),
        "{}",
        e2e_support::output_text(&output)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn recipe(dir: &Path, mirror: &Path, name: &str) -> PathBuf {
    let recipe = dir.join(format!("{name}.yaml"));
    std::fs::write(&recipe, format!("name: {name}\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ncudnn: {{ version: \"9.1.0.70\" }}\nsource_date_epoch: 1700000000\n")).unwrap();
    lock(&recipe, mirror);
    recipe
}

/// A fresh cache holding hard links to the e2e cache's blobs of `lock_file` and its
/// staged Debian bases (what scripts/bench.sh seeds), so no base is built again.
fn seed(cache: &Path, lock_file: &Path) {
    let shared = e2e_support::cache_dir();
    let blobs = cache.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::create_dir_all(cache.join("staging")).unwrap();
    let lock: serde_json::Value =
        serde_json::from_slice(&std::fs::read(lock_file).unwrap()).unwrap();
    for artifact in lock["artifacts"].as_array().unwrap() {
        let hex = artifact["sha256"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:");
        let from = shared.join("blobs/sha256").join(hex);
        if from.exists() {
            std::fs::hard_link(&from, blobs.join(hex)).unwrap();
        }
    }
    // A shared cache without staged bases: the first build makes the base itself.
    for entry in std::fs::read_dir(shared.join("staging"))
        .into_iter()
        .flatten()
    {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let Some(hex) = name.strip_suffix(".facts.json") else {
            continue;
        };
        let copied = Command::new("cp")
            .arg("-al")
            .arg(shared.join("staging").join(hex))
            .arg(cache.join("staging"))
            .status()
            .unwrap();
        assert!(copied.success());
        for record in [".complete", ".facts.json", ".owners.json"] {
            let from = shared.join("staging").join(format!("{hex}{record}"));
            if from.exists() {
                std::fs::copy(&from, cache.join("staging").join(format!("{hex}{record}"))).unwrap();
            }
        }
    }
}

/// Every last-use stamp of the cache, `age` back in time.
fn age_everything(cache: &Path, age: Duration) {
    let then = SystemTime::now() - age;
    for (dir, suffix) in [
        ("staging", ".complete"),
        ("layers", ".json"),
        ("verified/sha256", ""),
    ] {
        for entry in std::fs::read_dir(cache.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.to_string_lossy().ends_with(suffix) && path.is_file() {
                let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                file.set_modified(then).unwrap();
            }
        }
    }
}

/// The hex keys of the complete trees whose last use is before `cutoff`.
fn trees_unused_since(cache: &Path, cutoff: SystemTime) -> Vec<String> {
    let mut trees: Vec<String> = std::fs::read_dir(cache.join("staging"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".complete"))
        .filter(|p| std::fs::metadata(p).unwrap().modified().unwrap() < cutoff)
        .map(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .replace(".complete", "")
        })
        .collect();
    trees.sort();
    trees
}

fn layer_digests(report: &serde_json::Value) -> Vec<String> {
    report["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

fn blob_exists(cache: &Path, digest: &str) -> bool {
    cache
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"))
        .exists()
}

#[test]
fn prune_removes_exactly_what_no_build_used_and_rebuilds_still_work() {
    if let Some(skip) = e2e_support::skip_reason(&[("gcc", &["--version"])]) {
        skip.report();
        return;
    }
    let work = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (libs, mirror, cache) = (
        work.path().join("libs"),
        work.path().join("mirror"),
        work.path().join("cache"),
    );
    std::fs::create_dir_all(&libs).unwrap();
    std::fs::create_dir_all(&mirror).unwrap();
    cuda_12_4_wheels(Target::X86_64, &libs, &mirror);
    let one = recipe(work.path(), &mirror, "prune-one");
    let two = recipe(work.path(), &mirror, "prune-two");
    seed(&cache, &one.with_extension("lock"));

    let first = build(&one, &mirror, &work.path().join("one"), &cache);
    age_everything(&cache, Duration::from_secs(30 * 86_400));
    let second = build(&two, &mirror, &work.path().join("two"), &cache);
    let (first_layers, second_layers) = (layer_digests(&first), layer_digests(&second));
    let only_first: Vec<&String> = first_layers
        .iter()
        .filter(|d| !second_layers.contains(d))
        .collect();
    assert_eq!(
        only_first.len(),
        1,
        "the images should differ in their config layer"
    );

    // Unused for a day: the first image's config tree and every seeded base but the one
    // in use. A build holds one of them: it stays.
    let day_ago = SystemTime::now() - Duration::from_secs(86_400);
    let unused = trees_unused_since(&cache, day_ago);
    assert!(!unused.is_empty());
    let held_hex = &unused[0];
    let held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join("staging").join(format!("{held_hex}.use")))
        .unwrap();
    held.lock_shared().unwrap();
    let before = cudastack(&["--json", "cache"], &cache);
    assert!(
        before.status.success(),
        "{}",
        e2e_support::output_text(&before)
    );
    let before: serde_json::Value = serde_json::from_slice(&before.stdout).unwrap();
    let prune = || {
        let pruned = cudastack(&["--json", "cache", "prune", "--older-than", "1"], &cache);
        assert!(
            pruned.status.success(),
            "{}",
            e2e_support::output_text(&pruned)
        );
        serde_json::from_slice::<serde_json::Value>(&pruned.stdout).unwrap()
    };
    // While a build runs (it holds builds.lock shared from its first lookup), only old trees
    // go: the layer entries and blobs it looked up must still be there when it reads them.
    let building = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join("builds.lock"))
        .unwrap();
    building.lock_shared().unwrap();
    let during = prune();
    drop(building);
    assert_eq!(during["builds_running"], true, "{during}");
    assert_eq!(during["kept_in_use"], 1, "{during}");
    assert_eq!(
        // An empty kind is left out of the report: none removed is a count of 0.
        during["removed"]["staged-trees"]["count"]
            .as_u64()
            .unwrap_or(0),
        unused.len() as u64 - 1,
        "{during}"
    );
    assert!(during["removed"].get("records").is_none(), "{during}");
    assert!(blob_exists(&cache, only_first[0]), "{during}");
    let pruned = prune();
    drop(held);
    assert_eq!(pruned["builds_running"], false, "{pruned}");
    assert_eq!(pruned["kept_in_use"], 1, "{pruned}");
    assert!(
        cache.join("staging").join(held_hex).is_dir(),
        "the held tree was removed"
    );
    assert_eq!(
        trees_unused_since(&cache, day_ago),
        std::slice::from_ref(held_hex)
    );
    // The first image's own layer is gone (entry and blob); the shared ones stay.
    assert!(!blob_exists(&cache, only_first[0]), "{pruned}");
    for digest in &second_layers {
        assert!(
            blob_exists(&cache, digest),
            "a layer in use was pruned: {digest}"
        );
    }
    assert_eq!(pruned["removed"]["records"]["count"], 1, "{pruned}");
    let after: serde_json::Value =
        serde_json::from_slice(&cudastack(&["--json", "cache"], &cache).stdout).unwrap();
    assert!(
        after["total_bytes"].as_u64() < before["total_bytes"].as_u64(),
        "{before}\n{after}"
    );
    assert_eq!(
        after["kinds"]["layer-blobs"]["count"].as_u64(),
        Some(second_layers.len() as u64),
        "{after}"
    );

    // The second image is still entirely cached; the first rebuilds to the same image.
    let again = build(&two, &mirror, &work.path().join("two"), &cache);
    let layers = again["layers"].as_array().unwrap();
    assert!(layers.iter().all(|l| l["cached"] == true), "{again}");
    let rebuilt = build(&one, &mirror, &work.path().join("one-again"), &cache);
    assert_eq!(layer_digests(&rebuilt), first_layers);
}

/// Without a subcommand it lists every kind, human-readable and as JSON, on an empty cache
/// too (no build needed).
#[test]
fn cache_lists_every_kind_of_an_empty_cache() {
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let shown = cudastack(&["cache"], &cache);
    assert!(
        shown.status.success(),
        "{}",
        e2e_support::output_text(&shown)
    );
    let text = String::from_utf8_lossy(&shown.stdout);
    for kind in [
        "downloads",
        "layer blobs",
        "staged trees",
        "records",
        "total",
    ] {
        assert!(text.contains(kind), "{text}");
    }
    let json = cudastack(&["--json", "cache"], &cache);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["kinds"]["layer-blobs"]["count"], 0, "{json}");
    let pruned = cudastack(&["cache", "prune", "--older-than", "0"], &cache);
    assert!(
        pruned.status.success(),
        "{}",
        e2e_support::output_text(&pruned)
    );
    assert!(String::from_utf8_lossy(&pruned.stdout).contains("nothing unused"));
}

/// Built wheels (`source-builds/<key>/`, docs/source-builds.md) are listed as their own kind
/// and pruned like the rest: an entry no build used since the cutoff goes (its `complete`
/// record first), one whose key lock a build holds stays, a fresh one stays, and a builder
/// root a killed build left goes.
#[test]
fn built_wheels_are_listed_and_pruned_when_unused_and_unheld() {
    use cudastack::source_build::{entry_dir, store_fetched_wheel, BuildKey};
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("cache");
    let dist = work.path().join("dist");
    std::fs::create_dir_all(&dist).unwrap();
    let files = [("cuda_ext/__init__.py", b"X = 1\n".to_vec())];
    let wheel =
        e2e_support::stand_in::write_wheel(&dist, Target::X86_64, "cuda-ext", "0.1.0", &files);
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let key = |arch_list: &str| BuildKey {
        builder: "source-build-test",
        package: "cuda-ext".into(),
        version: "0.1.0".into(),
        sdist_sha256: cudastack::digest::Digest::of_bytes(b"sdist"),
        builder_digest: cudastack::digest::Digest::of_bytes(b"builder"),
        arch_list: arch_list.into(),
        env: Default::default(),
        source_date_epoch: 0,
    };
    let (old, held, fresh) = (key("8.0+PTX"), key("8.9+PTX"), key("9.0+PTX"));
    for built in [&old, &held, &fresh] {
        store_fetched_wheel(&cache, built, &name, &wheel, b"log\n", "built in 1.0 s").unwrap();
    }
    let builder = cache.join("source-builds/builder-killed");
    std::fs::create_dir_all(builder.join("root/usr/bin")).unwrap();
    std::fs::write(builder.join("root/usr/bin/tool"), b"left behind").unwrap();

    let shown = cudastack(&["--json", "cache"], &cache);
    assert!(
        shown.status.success(),
        "{}",
        e2e_support::output_text(&shown)
    );
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["kinds"]["built-wheels"]["count"], 3, "{shown}");
    assert!(
        shown["kinds"]["built-wheels"]["bytes"].as_u64().unwrap() > 0,
        "{shown}"
    );
    assert_eq!(shown["kinds"]["temporary"]["count"], 1, "{shown}");
    let text = cudastack(&["cache"], &cache);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("source-built wheels"),
        "{}",
        e2e_support::output_text(&text)
    );

    let month_ago = SystemTime::now() - Duration::from_secs(30 * 86_400);
    for built in [&old, &held] {
        let record = entry_dir(&cache, built).join("complete");
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(record)
            .unwrap();
        file.set_modified(month_ago).unwrap();
    }
    let lock = entry_dir(&cache, &held).with_extension("lock");
    let _building = cudastack::atomic_file::lock(&lock).unwrap();
    let pruned = cudastack(&["--json", "cache", "prune", "--older-than", "7"], &cache);
    assert!(
        pruned.status.success(),
        "{}",
        e2e_support::output_text(&pruned)
    );
    let pruned: serde_json::Value = serde_json::from_slice(&pruned.stdout).unwrap();
    assert_eq!(pruned["removed"]["built-wheels"]["count"], 1, "{pruned}");
    assert_eq!(pruned["removed"]["temporary"]["count"], 1, "{pruned}");
    assert_eq!(pruned["kept_in_use"], 1, "{pruned}");
    assert!(!entry_dir(&cache, &old).exists());
    assert!(entry_dir(&cache, &held).join("complete").exists());
    assert!(entry_dir(&cache, &fresh).join("complete").exists());
    assert!(!builder.exists());
}
