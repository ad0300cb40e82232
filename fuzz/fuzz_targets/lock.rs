//! The lock reader, and parse(write(x)) == x (tests/parsers_fuzz/entries.rs, `lock`).
#![no_main]
#[path = "../../tests/parsers_fuzz/entries.rs"]
mod entries;
libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::lock(data));
