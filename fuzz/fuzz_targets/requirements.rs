//! The recipe's Python input `requirements`, read by `PythonInputs::load` from a real file
//! (tests/parsers_fuzz/entries.rs, `python_input`).
//! The bytes after the first NUL are `shared/base.txt`, which `-r` lines may include.
#![no_main]
#[path = "../../tests/parsers_fuzz/entries.rs"]
mod entries;
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (file, included) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b""[..]),
    };
    entries::python_input(entries::PythonInput::Requirements, file, included);
});
