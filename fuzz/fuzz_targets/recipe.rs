//! The recipe parser (tests/parsers_fuzz/entries.rs, `recipe`).
#![no_main]
#[path = "../../tests/parsers_fuzz/entries.rs"]
mod entries;
libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::recipe(data));
