//! An OCI layout and its referrers (tests/parsers_fuzz/entries.rs, `layout`). The input is
//! NUL-separated: `index.json`, then each blob (JSON has no raw NUL, so nothing is lost);
//! each blob is stored under its own digest. Seed it with real layouts (docs/fuzzing.md).
#![no_main]
#[path = "../../tests/parsers_fuzz/entries.rs"]
mod entries;
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|&b| b == 0);
    let index = parts.next().unwrap_or_default();
    let blobs: Vec<&[u8]> = parts.take(16).collect();
    entries::layout(index, &blobs);
});
