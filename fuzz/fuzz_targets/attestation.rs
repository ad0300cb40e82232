//! A referrer's blob as a sigstore bundle, DSSE envelope, in-toto statement and SPDX SBOM
//! (tests/parsers_fuzz/entries.rs, `attestation`).
#![no_main]
#[path = "../../tests/parsers_fuzz/entries.rs"]
mod entries;
libfuzzer_sys::fuzz_target!(|data: &[u8]| entries::attestation(data));
