//! The last step of a build: the assembled images written into the OCI layout, one image
//! under `latest` and the recipe's tags, or with several platforms each image under its
//! platform ref and an image index over them under `latest` and the tags.

use std::path::{Path, PathBuf};

use crate::oci::layout::LayoutImage;
use crate::oci::{self, Image, StoredImage};
use crate::recipe::{render_tag, Platform, Recipe};
use crate::stack::error::BuildError;
use crate::stack::image_config::StackFacts;
use crate::stack::prepare::host_platform;
use crate::stack::report::{AuditSummary, BuildReport, LayerReport, PlatformReport};
use crate::stack::settings::{BuildProgress, BuildSettings};

/// One platform's assembled image, before it is written.
pub(crate) struct Assembled {
    pub platform: Platform,
    pub image: Image,
    pub layers: Vec<LayerReport>,
    pub audit: AuditSummary,
    pub audit_cached: bool,
    pub facts: StackFacts,
    pub built_from: crate::stack::report::BuiltFrom,
}

/// Render the recipe's tag templates, each checked as an image reference
/// ([`Recipe::render_tags`]; a bad `--registry` is an error naming the tag).
pub fn render_tags(
    recipe_path: &Path,
    recipe: &Recipe,
    torch: Option<&str>,
    cudnn: Option<&str>,
    registry: &str,
) -> Result<Vec<String>, crate::recipe::RecipeError> {
    recipe
        .render_tags(&recipe.tag_values(registry, torch, cudnn))
        .map_err(|error| crate::recipe::RecipeError::Tag {
            path: recipe_path.to_path_buf(),
            error,
        })
}

/// The tag an image gets when neither the recipe nor the command line names one, so that
/// `--load` leaves a named image rather than an anonymous one.
pub const DEFAULT_TAG: &str = "{registry}/{name}:latest";

/// The image's tags: the recipe's rendered, then the command line's; when both are empty,
/// [`DEFAULT_TAG`] (unless the recipe's name cannot be one, which then leaves none). Each is
/// checked as an image reference; one given twice is written once.
pub fn image_tags(
    settings: &BuildSettings,
    recipe: &Recipe,
    torch: Option<&str>,
    cudnn: Option<&str>,
) -> Result<Vec<String>, crate::recipe::RecipeError> {
    Ok(tags_and_whether_default(settings, recipe, torch, cudnn)?.0)
}

/// [`image_tags`], and whether they are only the default name (nobody asked for one).
fn tags_and_whether_default(
    settings: &BuildSettings,
    recipe: &Recipe,
    torch: Option<&str>,
    cudnn: Option<&str>,
) -> Result<(Vec<String>, bool), crate::recipe::RecipeError> {
    let mut tags = render_tags(
        &settings.recipe_path,
        recipe,
        torch,
        cudnn,
        &settings.registry,
    )?;
    let values = recipe.tag_values(&settings.registry, torch, cudnn);
    for given in &settings.tags {
        let tag = render_tag(given, &values).map_err(|error| crate::recipe::RecipeError::Tag {
            path: settings.recipe_path.clone(),
            error,
        })?;
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    if !tags.is_empty() {
        return Ok((tags, false));
    }
    tags.extend(render_tag(DEFAULT_TAG, &values).ok());
    Ok((tags, true))
}

/// `latest` -> `latest-linux-arm64`: the ref of one platform's image beside the index.
pub fn platform_ref(ref_name: &str, platform: Platform) -> String {
    oci::layout::platform_ref_name(ref_name, platform.oci_architecture())
}

/// Write the assembled images into the OCI layout: one image under `latest` and the
/// recipe's tags, or with several platforms each image under its platform ref and an image
/// index over them under `latest` and the tags.
pub(crate) fn write_output(
    settings: &BuildSettings,
    recipe: &Recipe,
    assembled: Vec<Assembled>,
    progress: &dyn BuildProgress,
) -> Result<BuildReport, BuildError> {
    let first = assembled.first().expect("at least one platform");
    let (tags, named_by_default) = tags_and_whether_default(
        settings,
        recipe,
        first.facts.torch.as_deref(),
        first.facts.cudnn.as_deref(),
    )?;
    let layout = settings
        .layout_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("images").join(&recipe.name));
    progress.stage("output", &format!("OCI layout {}", layout.display()));
    let host = host_platform();
    let mut platforms = Vec::new();
    // The image of the host's platform, as written: what verification and load take.
    let mut host_image = None;
    let (manifest_digest, host_ref) = if assembled.len() == 1 {
        let stored = StoredImage::of(&first.image)?;
        let manifest_digest = oci::layout::write_stored(&stored, &layout, "latest")?;
        for tag in &tags {
            oci::layout::write_stored(&stored, &layout, tag)?;
        }
        if Some(first.platform) == host {
            host_image = Some(LayoutImage::written(&layout, "latest", &tags, stored));
        }
        (
            manifest_digest,
            (Some(first.platform) == host).then(|| "latest".to_string()),
        )
    } else {
        let mut children = Vec::new();
        for built in &assembled {
            let ref_name = platform_ref("latest", built.platform);
            let stored = StoredImage::of(&built.image)?;
            oci::layout::write_stored(&stored, &layout, &ref_name)?;
            children.push((stored.manifest_descriptor(), built.platform.to_oci()));
            if Some(built.platform) == host {
                host_image = Some(LayoutImage::written(&layout, &ref_name, &[], stored));
            }
        }
        let digest = oci::layout::write_index(&layout, &children, "latest")?;
        for tag in &tags {
            oci::layout::write_index(&layout, &children, tag)?;
        }
        let host_ref = host
            .filter(|h| assembled.iter().any(|a| a.platform == *h))
            .map(|h| platform_ref("latest", h));
        (digest, host_ref)
    };
    for built in &assembled {
        platforms.push(PlatformReport {
            platform: built.platform.as_str().to_string(),
            manifest_digest: built.image.digest()?,
            ref_name: if assembled.len() == 1 {
                "latest".to_string()
            } else {
                platform_ref("latest", built.platform)
            },
            size: built.layers.iter().map(|l| l.size).sum(),
            layers: built.layers.clone(),
            audit: built.audit.clone(),
            audit_cached: built.audit_cached,
            built_from: built.built_from.clone(),
        });
    }
    let first = &platforms[0];
    Ok(BuildReport {
        recipe: recipe.name.clone(),
        manifest_digest,
        layout,
        ref_name: "latest".into(),
        tags,
        host_ref,
        host_image,
        named_by_default,
        layers: first.layers.clone(),
        size: first.size,
        audit: first.audit.clone(),
        audit_cached: first.audit_cached,
        platforms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn settings(tags: &[&str]) -> BuildSettings {
        BuildSettings {
            recipe_path: PathBuf::from("team.yaml"),
            cache_root: PathBuf::from("/nonexistent"),
            layout_dir: None,
            compression: crate::layer::Compression::None,
            offline: false,
            mirrors: Vec::new(),
            registry: "localhost".into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            platforms: None,
            build_mode: None,
            apt_mirror: None,
            apt_keyring: None,
            apt_snapshot: None,
            source_build_timeout: None,
        }
    }

    fn recipe(tags: &str) -> Recipe {
        Recipe::parse(
            &format!("name: team-train\nbase: {{ debian: bookworm }}\npython: \"3.11\"\ndriver_floor: \"550.54.14\"\ncuda: {{ version: \"12.4\" }}\ntorch: {{ version: \"2.4.1\" }}\n{tags}"),
            Path::new("team.yaml"),
        )
        .unwrap()
    }

    /// Without tags in the recipe or on the command line, a loaded image still has a name.
    #[test]
    fn an_image_is_named_by_the_recipe_the_command_line_or_its_name() {
        let untagged = recipe("");
        assert_eq!(
            image_tags(&settings(&[]), &untagged, None, None).unwrap(),
            ["localhost/team-train:latest"]
        );
        let tagged = recipe("tags: [\"{registry}/team/train:{torch}\"]\n");
        assert_eq!(
            image_tags(&settings(&[]), &tagged, None, None).unwrap(),
            ["localhost/team/train:2.4.1"]
        );
        // The command line's come after the recipe's, placeholders rendered, each once.
        assert_eq!(
            image_tags(
                &settings(&["ghcr.io/acme/train:v3", "{registry}/team/train:{torch}"]),
                &tagged,
                None,
                None
            )
            .unwrap(),
            ["localhost/team/train:2.4.1", "ghcr.io/acme/train:v3"]
        );
        assert_eq!(
            image_tags(&settings(&["acme/train:v3"]), &untagged, None, None).unwrap(),
            ["acme/train:v3"]
        );
        // A tag Docker would refuse fails here, before any download.
        let error = image_tags(&settings(&["Acme/Train:v3"]), &untagged, None, None).unwrap_err();
        assert!(error.to_string().contains("Acme/Train:v3"), "{error}");
    }
}
