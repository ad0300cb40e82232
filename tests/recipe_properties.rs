//! Property tests of the recipe parser (issue 16): arbitrary bytes and arbitrary YAML-shaped
//! documents never panic, and a valid recipe's fields survive parsing and the canonical
//! JSON round trip (what lock files hash). Bounded: a few hundred cases each, no
//! regression files written.

use std::path::Path;

use cudastack::recipe::{Base, Recipe, RecipeError, SystemPackage, MAX_SOURCE_DATE_EPOCH};
use proptest::prelude::*;
use proptest::test_runner::Config;

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// A YAML node, rendered block or flow style.
#[derive(Debug, Clone)]
enum Node {
    Scalar(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

/// The recipe's keys and the words of its values, so documents reach deep into the
/// deserializer rather than failing at the first key.
const KEYS: &[&str] = &[
    "name",
    "base",
    "python",
    "driver_floor",
    "minor_version_compat",
    "cuda",
    "version",
    "flavor",
    "cudnn",
    "torch",
    "index",
    "packages",
    "gpus",
    "verify",
    "gpu",
    "tags",
    "source_date_epoch",
    "platforms",
    "apt",
    "debian",
    "ubuntu",
    "image",
    "oci",
    "<<",
];

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "bookworm",
            "noble",
            "3.11",
            "\"3.11\"",
            "550.54.14",
            "12.4",
            "12.4.1",
            "9.1.0.70",
            "2.4.1",
            "cu121",
            "pypi",
            "runtime",
            "devel",
            "auto",
            "skip",
            "true",
            "false",
            "~",
            "null",
            "",
            "''",
            "\"\"",
            "-1",
            "0",
            "253402300799",
            "253402300800",
            "18446744073709551616",
            "1e400",
            ".nan",
            ".inf",
            "0x10",
            "&a x",
            "*a",
            "*b",
            "!!binary AAAA",
            "!!str 3",
            "\"{registry}/torch:{torch}\"",
            "\"{\"",
            "\"{x}\"",
            "\"a\\nb\"",
            "\"\\u0000\"",
            "linux/amd64",
            "linux/s390x",
            "git",
            "libcudnn8",
            "\"git=1:2.39.5-0+deb12u2\"",
            "git=1:2",
            "libc6:amd64",
            "g++",
            "\"numpy==1.26.4\"",
            "\"numpy===\"",
            "A100",
            "\"RTX 4090\"",
            "'ünïcödé'",
            "|",
            ">",
            "- x",
            ": x",
            "? x",
            "[",
            "]",
            "{",
            "}",
            "#",
            "%YAML 1.2",
            "---",
            "...",
        ])
        .prop_map(str::to_string),
        "[ -~]{0,12}",
        "\\PC{0,6}",
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => "[a-z_]{1,8}",
        1 => scalar(),
    ]
}

fn node() -> impl Strategy<Value = Node> {
    scalar()
        .prop_map(Node::Scalar)
        .prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Node::Seq),
                prop::collection::vec((key(), inner), 0..7).prop_map(Node::Map),
            ]
        })
}

fn flow(node: &Node) -> String {
    match node {
        Node::Scalar(text) => text.clone(),
        Node::Seq(items) => format!(
            "[{}]",
            items.iter().map(flow).collect::<Vec<_>>().join(", ")
        ),
        Node::Map(entries) => format!(
            "{{ {} }}",
            entries
                .iter()
                .map(|(k, v)| format!("{k}: {}", flow(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn block(node: &Node, indent: usize, out: &mut String, flow_depth: usize) {
    let pad = " ".repeat(indent);
    match node {
        Node::Map(entries) if flow_depth > 0 => {
            for (k, v) in entries {
                match v {
                    Node::Scalar(_) => out.push_str(&format!("{pad}{k}: {}\n", flow(v))),
                    _ if flow_depth == 1 => out.push_str(&format!("{pad}{k}: {}\n", flow(v))),
                    _ => {
                        out.push_str(&format!("{pad}{k}:\n"));
                        block(v, indent + 2, out, flow_depth - 1);
                    }
                }
            }
        }
        Node::Seq(items) if flow_depth > 0 => {
            for item in items {
                out.push_str(&format!("{pad}- {}\n", flow(item)));
            }
        }
        other => out.push_str(&format!("{pad}{}\n", flow(other))),
    }
}

/// A document: mostly a mapping of recipe keys, sometimes anything.
fn document() -> impl Strategy<Value = String> {
    (
        prop::collection::vec((key(), node()), 0..12).prop_map(Node::Map),
        node(),
        0usize..4,
        any::<bool>(),
    )
        .prop_map(|(map, other, flow_depth, top_is_map)| {
            let mut out = String::new();
            block(
                if top_is_map { &map } else { &other },
                0,
                &mut out,
                flow_depth,
            );
            out
        })
}

/// A valid recipe with a few of its lines changed: a value replaced by any node, a line
/// repeated (duplicate keys), dropped, or a key added; reaches the checks behind the
/// syntax (versions, tags, bases, epochs).
fn mutated_recipe() -> impl Strategy<Value = String> {
    (
        fields(),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, key(), node()), 1..4),
    )
        .prop_map(|(fields, mutations)| {
            let mut lines: Vec<String> = render(&fields).lines().map(str::to_string).collect();
            for (index, kind, key, node) in mutations {
                let at = index
                    .index(lines.len().max(1))
                    .min(lines.len().saturating_sub(1));
                match kind {
                    0 if !lines.is_empty() => {
                        let line = &lines[at];
                        let head = line
                            .split_once(": ")
                            .map(|(k, _)| k.to_string())
                            .unwrap_or_else(|| line.clone());
                        lines[at] = format!("{head}: {}", flow(&node));
                    }
                    1 if !lines.is_empty() => lines.insert(at, lines[at].clone()),
                    2 if !lines.is_empty() => {
                        lines.remove(at);
                    }
                    _ => lines.insert(at, format!("{key}: {}", flow(&node))),
                }
            }
            lines.join("\n") + "\n"
        })
}

/// The pieces of a valid tag: placeholders and text the grammar allows after the `:`.
fn tag_template() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            "{torch}",
            "{cuda}",
            "{cuda_mm}",
            "{cudnn}",
            "{cudnn_major}",
            "{python}",
            "{name}",
        ])
        .prop_map(str::to_string),
        "[a-z0-9]{1,5}",
        prop::sample::select(vec!["-", "_", "."]).prop_map(str::to_string),
    ];
    (
        prop::sample::select(vec!["{registry}/", "ghcr.io/org/", "127.0.0.1:5000/", ""]),
        "[a-z0-9]{1,6}(/[a-z0-9]{1,6}){0,2}",
        prop::option::of((
            prop_oneof![
                "[a-z0-9]{1,4}".prop_map(|s| s),
                Just("{python}".to_string())
            ],
            prop::collection::vec(piece, 0..5),
        )),
    )
        .prop_map(|(registry, path, tag)| {
            let mut text = format!("{registry}{path}");
            if let Some((first, rest)) = tag {
                text.push(':');
                text.push_str(&first);
                text.push_str(&rest.concat());
            }
            text
        })
}

#[derive(Debug, Clone)]
struct Fields {
    name: String,
    base: (&'static str, &'static str),
    python: u32,
    driver: String,
    cuda: &'static str,
    cudnn: Option<&'static str>,
    torch: Option<(String, &'static str)>,
    packages: Vec<&'static str>,
    tags: Vec<String>,
    epoch: Option<u64>,
    platforms: Vec<&'static str>,
    apt: Vec<&'static str>,
}

fn fields() -> impl Strategy<Value = Fields> {
    (
        "[a-z0-9][a-z0-9._-]{0,20}",
        prop::sample::select(vec![
            ("debian", "bookworm"),
            ("ubuntu", "noble"),
            ("ubuntu", "jammy"),
        ]),
        8u32..14,
        (400u32..999, 0u32..200, prop::option::of(0u32..100)).prop_map(|(a, b, c)| match c {
            Some(c) => format!("{a}.{b}.{c:02}"),
            None => format!("{a}.{b:02}"),
        }),
        prop::sample::select(vec!["11.8", "12.1", "12.4", "12.4.1", "13.0"]),
        prop::option::of(prop::sample::select(vec!["9.1.0.70", "8.9", "9"])),
        prop::option::of((
            (2u32..3, 0u32..16, 0u32..4).prop_map(|(a, b, c)| format!("{a}.{b}.{c}")),
            prop::sample::select(vec!["pypi", "cu121", "cu118"]),
        )),
        prop::sample::subsequence(vec!["numpy==1.26.4", "pillow>=10", "requests"], 0..3),
        prop::collection::vec(tag_template(), 0..3),
        prop::option::of(0..=MAX_SOURCE_DATE_EPOCH),
        prop::sample::subsequence(vec!["linux/amd64", "linux/arm64"], 0..=2),
        prop::sample::subsequence(
            vec![
                "openssh-client",
                "git=1:2.39.5-0+deb12u2",
                "libgl1",
                "g++",
                "libstdc++6=12.2.0-14",
            ],
            0..=5,
        )
        .prop_shuffle(),
    )
        .prop_map(
            |(
                name,
                base,
                python,
                driver,
                cuda,
                cudnn,
                torch,
                packages,
                tags,
                epoch,
                platforms,
                apt,
            )| {
                Fields {
                    name,
                    base,
                    python,
                    driver,
                    cuda,
                    cudnn,
                    torch,
                    packages,
                    tags,
                    epoch,
                    platforms,
                    apt,
                }
            },
        )
}

fn quoted(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

fn render(f: &Fields) -> String {
    let mut out = format!(
        "name: {}\nbase: {{ {}: {} }}\npython: \"3.{}\"\ndriver_floor: {}\ncuda: {{ version: {} }}\n",
        quoted(&f.name),
        f.base.0,
        f.base.1,
        f.python,
        quoted(&f.driver),
        quoted(f.cuda)
    );
    if let Some(cudnn) = f.cudnn {
        out.push_str(&format!("cudnn: {{ version: {} }}\n", quoted(cudnn)));
    }
    if let Some((version, index)) = &f.torch {
        out.push_str(&format!(
            "torch:\n  version: {}\n  index: {index}\n",
            quoted(version)
        ));
    }
    let list = |items: Vec<String>| format!("[{}]", items.join(", "));
    if !f.packages.is_empty() {
        out.push_str(&format!(
            "packages: {}\n",
            list(f.packages.iter().map(|p| quoted(p)).collect())
        ));
    }
    if !f.tags.is_empty() {
        out.push_str("tags:\n");
        for tag in &f.tags {
            out.push_str(&format!("  - {}\n", quoted(tag)));
        }
    }
    if let Some(epoch) = f.epoch {
        out.push_str(&format!("source_date_epoch: {epoch}\n"));
    }
    if !f.platforms.is_empty() {
        out.push_str(&format!(
            "platforms: {}\n",
            list(f.platforms.iter().map(|p| p.to_string()).collect())
        ));
    }
    if !f.apt.is_empty() {
        out.push_str("apt:\n");
        for package in &f.apt {
            out.push_str(&format!("  - {}\n", quoted(package)));
        }
    }
    out
}

/// A Debian package name and an optional version in the syntax policy allows.
fn system_package() -> impl Strategy<Value = String> {
    (
        "[a-z0-9][a-z0-9+.-]{1,20}",
        prop::option::of((
            prop::option::of(0u32..100),
            "[0-9][A-Za-z0-9.+~]{0,10}",
            prop::option::of("[A-Za-z0-9.+~]{1,8}"),
        )),
    )
        .prop_filter("apt-get reads a trailing `-` as remove", |(name, _)| {
            !name.ends_with('-')
        })
        .prop_map(|(name, version)| match version {
            None => name,
            Some((epoch, upstream, revision)) => {
                let epoch = epoch.map(|e| format!("{e}:")).unwrap_or_default();
                let revision = revision.map(|r| format!("-{r}")).unwrap_or_default();
                format!("{name}={epoch}{upstream}{revision}")
            }
        })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..600),
        "(?s).{0,300}".prop_map(String::into_bytes),
    ]) {
        let _ = Recipe::parse_bytes(&bytes, Path::new("fuzz.yaml"));
    }

    #[test]
    fn yaml_shaped_documents_never_panic(text in prop_oneof![document(), mutated_recipe()]) {
        if let Err(error) = Recipe::parse(&text, Path::new("fuzz.yaml")) {
            // Every error renders, and none addresses the programmer.
            let message = error.to_string();
            prop_assert!(!message.contains("DuplicateKeyPolicy"), "{}", message);
        }
    }

    #[test]
    fn valid_recipes_keep_their_fields(f in fields()) {
        let text = render(&f);
        // A PyTorch index build is versioned `2.4.1+cu121`, which no tag may carry.
        let torch_has_local_version = f.torch.as_ref().is_some_and(|(_, index)| *index != "pypi");
        let expect_tag_error = torch_has_local_version && f.tags.iter().any(|t| t.contains("{torch}"));
        let recipe = match Recipe::parse(&text, Path::new("r.yaml")) {
            Ok(recipe) => recipe,
            Err(RecipeError::Tag { .. }) if expect_tag_error => return Ok(()),
            Err(error) => return Err(TestCaseError::fail(format!("{error}\n{text}"))),
        };
        prop_assert!(!expect_tag_error, "{}", text);
        prop_assert_eq!(&recipe.name, &f.name);
        let base = match &recipe.base {
            Base::Debian(release) => ("debian", release.as_str()),
            Base::Ubuntu(release) => ("ubuntu", release.as_str()),
            other => return Err(TestCaseError::fail(format!("{other}"))),
        };
        prop_assert_eq!(base, (f.base.0, f.base.1));
        prop_assert_eq!(recipe.python.to_string(), format!("3.{}", f.python));
        prop_assert_eq!(recipe.driver_floor.to_string(), f.driver.clone());
        prop_assert_eq!(recipe.cuda.version.to_string(), f.cuda);
        prop_assert_eq!(recipe.cudnn.as_ref().map(|c| c.version.to_string()), f.cudnn.map(str::to_string));
        prop_assert_eq!(
            recipe.torch.as_ref().map(|t| (t.version.to_string(), t.index.to_string())),
            f.torch.as_ref().map(|(v, i)| (v.clone(), i.to_string()))
        );
        prop_assert_eq!(recipe.packages.iter().map(|p| p.to_string()).collect::<Vec<_>>(), f.packages.iter().map(|p| p.to_string()).collect::<Vec<_>>());
        prop_assert_eq!(&recipe.tags, &f.tags);
        prop_assert_eq!(recipe.source_date_epoch, f.epoch);
        prop_assert_eq!(recipe.platforms.iter().map(|p| p.as_str()).collect::<Vec<_>>(), f.platforms.clone());
        // `apt:` is a set, kept sorted by name.
        let mut apt = f.apt.clone();
        apt.sort_by_key(|entry| entry.split('=').next().unwrap().to_string());
        prop_assert_eq!(recipe.apt.iter().map(ToString::to_string).collect::<Vec<_>>(), apt);
        // The canonical JSON (what the digest hashes) reads back to the same recipe.
        let again: Recipe = serde_json::from_str(&recipe.canonical_json()).unwrap();
        prop_assert_eq!(&again, &recipe);
        prop_assert_eq!(again.digest(), recipe.digest());
        // Every tag renders for a build with the lock's values.
        let values = recipe.tag_values("localhost:5000", None, None);
        prop_assert_eq!(recipe.render_tags(&values).map(|tags| tags.len()), Ok(f.tags.len()));
    }
}

proptest! {
    #![proptest_config(config(2048))]

    /// Issue 18: no `apt:` entry panics the parser, and every error names the entry.
    #[test]
    fn arbitrary_apt_entries_never_panic(text in prop_oneof![
        "(?s).{0,40}",
        "[a-zA-Z0-9+.:=~*<>/ _-]{0,30}",
        "[a-z0-9+.-]{0,12}=[0-9a-zA-Z.+~:-]{0,16}",
    ]) {
        match text.parse::<SystemPackage>() {
            // What parses prints back as written, the argument apt-get takes.
            Ok(package) => prop_assert_eq!(package.to_string(), text),
            Err(error) => prop_assert!(error.starts_with("apt package `"), "{}", error),
        }
    }

    /// Names and versions in policy's syntax parse and print back unchanged.
    #[test]
    fn policy_syntax_entries_round_trip(text in system_package()) {
        let package: SystemPackage = text.parse().map_err(TestCaseError::fail)?;
        prop_assert_eq!(package.to_string(), text);
    }
}
