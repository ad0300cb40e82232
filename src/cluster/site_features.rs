//! A Slurm site's feature map, and what it admits of a verified image's [`Placement`].
//!
//! Slurm knows nodes by the features its admin gave them (`Feature=h100,driver-550` in
//! slurm.conf), not by the GPU product NVML reports or the driver installed. The map is the
//! admin's one-time translation, a small YAML file: which node feature (and, optionally,
//! which GRES type of gres.conf) means which GPU product, and which node feature says which
//! driver version is installed. From it and a placement, [`SlurmPlacement::admit`] writes
//! the job's `--constraint` and GPU request.
//!
//! Only what was proven is admitted: a verified product the map does not name is left out
//! (with a note), a product the map names but the image was not verified on is never
//! asked for, and the driver part of the constraint lists only driver features whose
//! version is at least the image's floor. A node without a listed driver feature matches
//! nothing, so a node whose driver is unknown never runs the job. This module reads one
//! file and computes strings; it never talks to Slurm.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::placement::Placement;
use super::ClusterError;
use crate::version::DriverVersion;

/// What is wrong with a site feature map, naming the file and the field.
#[derive(Debug, thiserror::Error)]
pub enum SiteFeaturesError {
    #[error("failed to read the site feature map `{}`", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the site feature map `{}` is larger than 1 MiB: a map lists a few dozen lines, so this is not one", path.display())]
    TooLarge { path: PathBuf },
    #[error("{}:{line}:{column}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: invalid {field} `{value}`: {rule}", path.display())]
    Invalid {
        path: PathBuf,
        /// Where in the file: `gpus[1].feature`.
        field: String,
        value: String,
        rule: String,
    },
}

/// One GPU product as the site's nodes advertise it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuFeature {
    /// The name NVML reports (`nvidia-smi --query-gpu=name --format=csv,noheader`), as the
    /// verified matrix records it: `NVIDIA H100 80GB HBM3`.
    pub product: String,
    /// The node feature of the nodes with this GPU: `h100`.
    pub feature: String,
    /// The GRES type of this GPU in gres.conf (`Name=gpu Type=h100`), if the site types
    /// its GPUs.
    #[serde(default)]
    pub gres: Option<String>,
}

/// One driver installation as the site's nodes advertise it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverFeature {
    /// The node feature of the nodes with this driver: `driver-550`.
    pub feature: String,
    /// The driver version installed on those nodes (`550.54.15`): the whole version, since
    /// an image's floor may lie inside a branch.
    pub version: DriverVersion,
}

/// A site's feature map, as read from its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SiteFeatures {
    /// The file it was read from, for messages.
    pub path: PathBuf,
    pub gpus: Vec<GpuFeature>,
    pub drivers: Vec<DriverFeature>,
}

/// The file's shape: both lists may be absent, and admission says what is missing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SiteFeaturesFile {
    #[serde(default)]
    gpus: Vec<GpuFeature>,
    #[serde(default)]
    drivers: Vec<DriverFeature>,
}

/// Largest map read (its error says 1 MiB): a site lists a few dozen lines; anything
/// bigger is the wrong file, and reading it whole could exhaust memory (`/dev/zero`).
const MAX_MAP_BYTES: u64 = 1 << 20;

impl SiteFeatures {
    /// Read and check the map at `path`.
    pub fn load(path: &Path) -> Result<SiteFeatures, SiteFeaturesError> {
        use std::io::Read;
        let read_error = |source| SiteFeaturesError::Read {
            path: path.to_path_buf(),
            source,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .map_err(read_error)?
            .take(MAX_MAP_BYTES + 1)
            .read_to_string(&mut text)
            .map_err(read_error)?;
        if text.len() as u64 > MAX_MAP_BYTES {
            return Err(SiteFeaturesError::TooLarge {
                path: path.to_path_buf(),
            });
        }
        SiteFeatures::parse(&text, path)
    }

    /// Parse and check map text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<SiteFeatures, SiteFeaturesError> {
        let file: SiteFeaturesFile = serde_saphyr::from_str(text).map_err(|error| {
            let (line, column) = error
                .location()
                .map_or((0, 0), |l| (l.line() as usize, l.column() as usize));
            use serde_saphyr::MessageFormatter;
            SiteFeaturesError::Syntax {
                path: path.to_path_buf(),
                line,
                column,
                message: serde_saphyr::UserMessageFormatter
                    .format_message(innermost(&error))
                    .into_owned(),
            }
        })?;
        let site = SiteFeatures {
            path: path.to_path_buf(),
            gpus: file
                .gpus
                .into_iter()
                .map(|gpu| GpuFeature {
                    product: normalize_product(&gpu.product),
                    ..gpu
                })
                .collect(),
            drivers: file.drivers,
        };
        site.check()?;
        Ok(site)
    }

    /// Every feature and GRES type is a plain word (it goes into a constraint expression,
    /// where `&`, `|`, `[`, `(` and `*` are operators), every feature and product is listed
    /// once.
    fn check(&self) -> Result<(), SiteFeaturesError> {
        let mut features = BTreeSet::new();
        let mut products = BTreeSet::new();
        for (i, gpu) in self.gpus.iter().enumerate() {
            let field = |name: &str| format!("gpus[{i}].{name}");
            if gpu.product.is_empty() {
                return Err(self.invalid(field("product"), "", "the NVML name of a GPU, e.g. `NVIDIA H100 80GB HBM3` (`nvidia-smi --query-gpu=name --format=csv,noheader` prints it)"));
            }
            if !products.insert(gpu.product.as_str()) {
                return Err(self.invalid(
                    field("product"),
                    &gpu.product,
                    "listed twice: one node feature per GPU product",
                ));
            }
            self.check_feature(field("feature"), &gpu.feature, &mut features)?;
            if let Some(gres) = &gpu.gres {
                if !is_feature_word(gres) {
                    return Err(self.invalid(field("gres"), gres, WORD_RULE));
                }
            }
        }
        for (i, driver) in self.drivers.iter().enumerate() {
            self.check_feature(
                format!("drivers[{i}].feature"),
                &driver.feature,
                &mut features,
            )?;
        }
        Ok(())
    }

    fn check_feature<'a>(
        &self,
        field: String,
        feature: &'a str,
        seen: &mut BTreeSet<&'a str>,
    ) -> Result<(), SiteFeaturesError> {
        if !is_feature_word(feature) {
            return Err(self.invalid(field, feature, WORD_RULE));
        }
        if !seen.insert(feature) {
            return Err(self.invalid(
                field,
                feature,
                "listed twice: a node feature means one GPU product or one driver version",
            ));
        }
        Ok(())
    }

    fn invalid(&self, field: String, value: &str, rule: &str) -> SiteFeaturesError {
        SiteFeaturesError::Invalid {
            path: self.path.clone(),
            field,
            value: value.to_string(),
            rule: rule.to_string(),
        }
    }

    fn gpu(&self, product: &str) -> Option<&GpuFeature> {
        self.gpus.iter().find(|gpu| gpu.product == product)
    }
}

const WORD_RULE: &str = "letters, digits, `-`, `_` or `.`, at most 128 (constraint operators such as `&`, `|`, `[`, `(`, `*`, `,` would change the expression)";

fn is_feature_word(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Runs of whitespace as one space, as [`Placement`] records product names.
fn normalize_product(name: &str) -> String {
    name.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The error serde-saphyr wraps in snippets and alias context: its message alone, since
/// the file, line and column go in front.
fn innermost(mut error: &serde_saphyr::Error) -> &serde_saphyr::Error {
    loop {
        match error {
            serde_saphyr::Error::WithSnippet { error: inner, .. }
            | serde_saphyr::Error::AliasError { error: inner, .. } => error = inner,
            other => return other,
        }
    }
}

/// Where on a Slurm site an image may run: the job's `--constraint`, its GPU request, and
/// the notes the caller should print (verified products the map leaves out, driver
/// features below the floor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmPlacement {
    /// The `--constraint` expression: `[a100|h100]&(driver-550|driver-560)`.
    pub constraint: String,
    /// The GRES type to ask for when exactly one product is admitted and the map types it
    /// (`--gres=gpu:TYPE:N`); otherwise GPUs are asked for untyped (`--gpus-per-node=N`),
    /// and the constraint alone picks the product.
    pub gres_type: Option<String>,
    /// The verified products admitted, by NVML name, in the placement's order.
    pub products: Vec<String>,
    /// The driver features admitted, oldest driver first.
    pub driver_features: Vec<String>,
    /// Lines for stderr: what was left out and why.
    pub notes: Vec<String>,
}

impl SlurmPlacement {
    /// What `site` admits of `placement`: refused when no verified product has a node
    /// feature, when the map lists no driver features, or when none is at the floor.
    pub fn admit(
        placement: &Placement,
        site: &SiteFeatures,
    ) -> Result<SlurmPlacement, ClusterError> {
        let file = site.path.display();
        let mut notes = Vec::new();
        let mut gpus = Vec::new();
        for product in &placement.products {
            match site.gpu(&product.name) {
                Some(gpu) => gpus.push(gpu),
                None => notes.push(format!(
                    "{} was verified, but the site feature map {file} names no node feature for it: its nodes are left out (add it under `gpus:` to admit them)",
                    product.name
                )),
            }
        }
        if gpus.is_empty() {
            return Err(no_mapped_product(placement, site));
        }
        let drivers = admitted_drivers(placement, site, &mut notes)?;
        let gres_type = match gpus.as_slice() {
            [only] => only.gres.clone(),
            _ => None,
        };
        let gpu_features: Vec<&str> = gpus.iter().map(|gpu| gpu.feature.as_str()).collect();
        let driver_features: Vec<String> = drivers.iter().map(|d| d.feature.clone()).collect();
        Ok(SlurmPlacement {
            constraint: constraint(&gpu_features, &driver_features),
            gres_type,
            products: gpus.iter().map(|gpu| gpu.product.clone()).collect(),
            driver_features,
            notes,
        })
    }

    /// The `#SBATCH` option asking for `per_node` GPUs on each node.
    pub fn gpu_request(&self, per_node: u32) -> String {
        match &self.gres_type {
            Some(gres) => format!("--gres=gpu:{gres}:{per_node}"),
            None => format!("--gpus-per-node={per_node}"),
        }
    }
}

impl fmt::Display for SlurmPlacement {
    /// One line for humans: `NVIDIA H100 80GB HBM3 on driver-550, driver-560`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {}",
            self.products.join(", "),
            self.driver_features.join(", ")
        )
    }
}

/// The map's driver features at or above the floor, oldest first; the ones below become
/// notes. No driver features, or none new enough, is a refusal: admitting a node whose
/// driver is unknown or too old is exactly what the floor exists to prevent.
fn admitted_drivers<'a>(
    placement: &Placement,
    site: &'a SiteFeatures,
    notes: &mut Vec<String>,
) -> Result<Vec<&'a DriverFeature>, ClusterError> {
    let file = site.path.display();
    let floor = &placement.driver_floor;
    if site.drivers.is_empty() {
        return Err(ClusterError::Unplaceable {
            why: format!("the site feature map {file} lists no driver features, so no node's driver is known, and a node whose driver is unknown is never admitted (the image needs driver >= {floor})"),
            hint: format!("tag each GPU node with a feature naming its driver (slurm.conf `Feature=...,driver-550`) and list it under `drivers:` in {file} with the version installed (`feature: driver-550`, `version: 550.54.15`)"),
        });
    }
    let mut drivers: Vec<&DriverFeature> = site.drivers.iter().collect();
    drivers.sort_by(|a, b| a.version.cmp(&b.version).then(a.feature.cmp(&b.feature)));
    let (admitted, below): (Vec<_>, Vec<_>) =
        drivers.into_iter().partition(|d| d.version >= *floor);
    if admitted.is_empty() {
        let newest = below.last().expect("the map lists driver features");
        return Err(ClusterError::Unplaceable {
            why: format!("the image needs driver >= {floor}, and no driver feature in the site feature map {file} is that new (the newest is {} = {})", newest.feature, newest.version),
            hint: format!("upgrade the driver on some GPU nodes and list their feature in {file}, or build the image with an older `driver_floor` (at most {})", newest.version),
        });
    }
    for driver in below {
        notes.push(format!(
            "driver feature {} ({}) is older than the image's floor {floor}: its nodes are left out",
            driver.feature, driver.version
        ));
    }
    Ok(admitted)
}

fn no_mapped_product(placement: &Placement, site: &SiteFeatures) -> ClusterError {
    let verified: Vec<&str> = placement.products.iter().map(|p| p.name.as_str()).collect();
    let mapped: Vec<&str> = site.gpus.iter().map(|g| g.product.as_str()).collect();
    let mapped = if mapped.is_empty() {
        "none".to_string()
    } else {
        mapped.join(", ")
    };
    ClusterError::Unplaceable {
        why: format!(
            "none of the GPUs the image was verified on ({}) has a node feature in the site feature map {} (it maps: {mapped}), and a GPU that was not verified is never admitted",
            verified.join(", "),
            site.path.display()
        ),
        hint: "add the verified GPUs under `gpus:` in the map (`product:` is the NVML name, as `nvidia-smi --query-gpu=name --format=csv,noheader` prints it), or verify the image on a GPU the site has (`cudastack verify IMAGE --emit sbatch`)".to_string(),
    }
}

/// The constraint expression. Slurm's grammar (sbatch(1), `--constraint`): `[a|b]` is a
/// "matching OR", where all nodes of the job share one of the alternatives, so a
/// multi-node job gets one GPU product throughout; only one bracketed set is allowed per
/// job, so the driver alternatives go in parentheses, a plain OR that lets each node have
/// any admitted driver; `&` joins the two, and the parentheses keep Slurm's strict
/// left-to-right reading from regrouping them (`[a100|h100]&(driver-550|driver-560)`). A
/// single alternative needs no brackets or parentheses (`h100&driver-550`).
fn constraint(gpu_features: &[&str], driver_features: &[String]) -> String {
    let gpus = match gpu_features {
        [only] => only.to_string(),
        many => format!("[{}]", many.join("|")),
    };
    let drivers = match driver_features {
        [only] => only.clone(),
        many => format!("({})", many.join("|")),
    };
    format!("{gpus}&{drivers}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::placement::tests::{claims, row};
    use crate::verify::check::Lineage;

    const MAP: &str = "
gpus:
  - product: NVIDIA H100 80GB HBM3
    feature: h100
    gres: h100
  - product: NVIDIA  A100-SXM4-80GB
    feature: a100
drivers:
  - feature: driver-560
    version: 560.35.03
  - feature: driver-535
    version: 535.104.05
";

    fn placement(floor: &str, gpus: &[&str]) -> Placement {
        let rows: Vec<_> = gpus.iter().map(|gpu| row(gpu, "9.0")).collect();
        Placement::new(&claims(Some(floor), Lineage::Unrecorded), &rows).unwrap()
    }

    fn site(text: &str) -> SiteFeatures {
        SiteFeatures::parse(text, Path::new("site.yaml")).unwrap()
    }

    #[test]
    fn a_map_parses_with_normalized_product_names() {
        let site = site(MAP);
        assert_eq!(site.gpus[1].product, "NVIDIA A100-SXM4-80GB");
        assert_eq!(site.gpus[0].gres.as_deref(), Some("h100"));
        assert_eq!(site.drivers[1].version, "535.104.5".parse().unwrap());
        // A two-part version reads as a version, not as a YAML float.
        let short = site_result("drivers: [{feature: d, version: 570.80}]").unwrap();
        assert_eq!(short.drivers[0].version.to_string(), "570.80");
    }

    fn site_result(text: &str) -> Result<SiteFeatures, SiteFeaturesError> {
        SiteFeatures::parse(text, Path::new("/etc/cudastack/site.yaml"))
    }

    #[test]
    fn load_reads_a_file_and_refuses_one_too_large() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("site.yaml");
        std::fs::write(&path, MAP).unwrap();
        assert_eq!(SiteFeatures::load(&path).unwrap().gpus.len(), 2);
        let padding = "x".repeat(MAX_MAP_BYTES as usize);
        std::fs::write(&path, format!("{MAP}# {padding}\n")).unwrap();
        let error = SiteFeatures::load(&path).unwrap_err();
        assert!(
            matches!(error, SiteFeaturesError::TooLarge { .. }),
            "{error:?}"
        );
        let missing = SiteFeatures::load(&dir.path().join("none.yaml")).unwrap_err();
        assert!(missing.to_string().contains("none.yaml"), "{missing}");
    }

    #[test]
    fn bad_maps_name_the_file_and_the_field() {
        for (text, says) in [
            ("gpu: []", "unknown field `gpu`"),
            (
                "gpus: [{product: X, feature: x, type: a}]",
                "unknown field `type`",
            ),
            (
                "drivers: [{feature: d, version: latest}]",
                "NVIDIA driver version",
            ),
            (
                "gpus: [{product: X, feature: 'a|b'}]",
                "invalid gpus[0].feature `a|b`",
            ),
            (
                "gpus: [{product: X, feature: a, gres: 'a:1'}]",
                "invalid gpus[0].gres `a:1`",
            ),
            (
                "gpus: [{product: X, feature: a}, {product: X, feature: b}]",
                "invalid gpus[1].product `X`: listed twice",
            ),
            (
                "gpus: [{product: X, feature: a}]\ndrivers: [{feature: a, version: 550.1}]",
                "invalid drivers[0].feature `a`: listed twice",
            ),
            (
                "gpus: [{product: ' ', feature: a}]",
                "invalid gpus[0].product",
            ),
        ] {
            let error = site_result(text).unwrap_err().to_string();
            assert!(error.starts_with("/etc/cudastack/site.yaml"), "{error}");
            assert!(error.contains(says), "{text}: {error}");
        }
        let syntax = site_result("gpus:\n  - product: X\n    feture: x\n").unwrap_err();
        assert!(
            matches!(syntax, SiteFeaturesError::Syntax { line: 3, .. }),
            "{syntax:?}"
        );
    }

    #[test]
    fn two_mapped_products_share_one_product_per_job_and_the_drivers_at_the_floor() {
        let admitted = SlurmPlacement::admit(
            &placement(
                "550.54.15",
                &["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"],
            ),
            &site(MAP),
        )
        .unwrap();
        assert_eq!(admitted.constraint, "[a100|h100]&driver-560");
        assert_eq!(admitted.gres_type, None);
        assert_eq!(admitted.gpu_request(8), "--gpus-per-node=8");
        assert_eq!(admitted.notes.len(), 1, "{:?}", admitted.notes);
        assert!(admitted.notes[0].contains("driver-535 (535.104.05) is older"));
        assert_eq!(
            admitted.to_string(),
            "NVIDIA A100-SXM4-80GB, NVIDIA H100 80GB HBM3 on driver-560"
        );
    }

    #[test]
    fn one_mapped_product_with_a_gres_type_asks_for_typed_gpus() {
        let admitted = SlurmPlacement::admit(
            &placement("535.104.05", &["NVIDIA H100 80GB HBM3"]),
            &site(MAP),
        )
        .unwrap();
        assert_eq!(admitted.constraint, "h100&(driver-535|driver-560)");
        assert_eq!(admitted.gpu_request(4), "--gres=gpu:h100:4");
        assert!(admitted.notes.is_empty());
    }

    #[test]
    fn refusals_say_what_why_and_what_to_do() {
        let h100 = placement("550.54.15", &["NVIDIA H100 80GB HBM3"]);
        let no_drivers = site("gpus: [{product: NVIDIA H100 80GB HBM3, feature: h100}]");
        let error = SlurmPlacement::admit(&h100, &no_drivers)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("lists no driver features") && error.contains("hint:"),
            "{error}"
        );
        let l40 = placement("550.54.15", &["NVIDIA L40S"]);
        let error = SlurmPlacement::admit(&l40, &site(MAP))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("(NVIDIA L40S)")
                && error.contains("it maps: NVIDIA H100 80GB HBM3, NVIDIA A100-SXM4-80GB"),
            "{error}"
        );
        let future = placement("570.86.10", &["NVIDIA H100 80GB HBM3"]);
        let error = SlurmPlacement::admit(&future, &site(MAP))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("driver >= 570.86.10") && error.contains("driver-560 = 560.35.03"),
            "{error}"
        );
    }
}
