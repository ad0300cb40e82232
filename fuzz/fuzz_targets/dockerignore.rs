//! `.dockerignore`, loaded from a real build context (tests/parsers_fuzz/entries.rs,
//! `dockerignore`).
#![no_main]
#[path = "../../tests/parsers_fuzz/entries.rs"]
mod entries;
libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::dockerignore(data));
