//! The recipe's Python input `uv_lock`, read by `PythonInputs::load` from a real file
//! (tests/parsers_fuzz/entries.rs, `python_input`).
#![no_main]
#[path = "../../tests/parsers_fuzz/entries.rs"]
mod entries;
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    entries::python_input(entries::PythonInput::UvLock, data, b"");
});
