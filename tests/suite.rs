//! The integration tests, as one test binary (issue 17): one link of the crate and its
//! dependencies instead of one per file, which halved the test build's time and took its
//! disk from 12 GB to a few hundred MB. Each file under tests/ is a module here, so a test
//! is named `<file>::<test>`: `cargo test --test suite build_e2e::` runs one file's tests.
//!
//! The shared helpers are declared once, here; test files `use crate::<helper>`.

mod gate;

mod apt_support;
mod cel_support;
mod e2e_support;
mod elf_support;
mod fetch_support;
mod install_support;
mod oci_support;
mod registry_support;

mod apt_archive;
mod attestations;
mod audit_loader;
mod audit_static;
mod build_audit;
mod build_deb_trust;
mod build_debs;
mod build_e2e;
mod build_multiarch;
mod build_publish;
mod build_rootless;
mod cache_command;
mod cache_concurrency;
mod cli_doctor_build_host;
mod cli_help;
mod cli_matrix;
mod cli_place;
mod cli_promote;
mod cli_snapshots;
mod cli_trust;
mod cli_verify_registry;
mod cluster_image;
mod cluster_k8s;
mod cluster_placement;
mod cluster_slurm;
mod cluster_workflows;
mod contained_file;
mod doctor_host;
mod elf_read;
mod engine_docker;
mod explain_messages;
mod fetch_download;
mod fetch_hostile;
mod fetch_memory;
mod fetch_pypi;
mod fetch_remote_zip;
mod guard_start;
mod gzip_bytes;
mod image_config;
mod index_credentials;
mod install_properties;
mod install_real_wheel;
mod install_wheel;
mod kernel_audit;
mod layer_build;
mod layer_cache_integrity;
mod lock_as_of;
mod lock_debs;
mod lock_fixtures;
mod lock_pypi;
mod lock_python_inputs;
mod matrix_refresh;
mod module_graph;
mod net_transport;
mod oci_layout;
mod oci_layout_atomic;
mod oci_peers;
mod oci_pull_integrity;
mod parsers_fuzz;
mod recipe_properties;
mod recipe_validate;
mod recipes_all;
mod registry_auth;
mod registry_hostile_auth;
mod registry_push;
mod registry_referrers_budget;
mod registry_trust;
mod release_binary;
mod sbom;
mod sign_keys;
mod skip_gate;
mod source_build;
mod stack_archive_props;
mod stack_concurrent_builds;
mod stack_ldcache;
mod terminal_escapes;
mod training_image;
mod verify_docker;
mod verify_native;
mod verify_record;
