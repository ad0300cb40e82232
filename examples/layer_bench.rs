//! Drive one layer build for scripts/bench-layers.sh:
//! `layer_bench DIR STORE gzip:6|zstd:3|none [THREADS]`.
//! Walks DIR, writes the layer into the BlobStore at STORE, prints one JSON line.

use std::time::Instant;

use cudastack::cas::BlobStore;
use cudastack::layer::{self, BuildOptions, Compression, DirOptions, LayerContents};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 4 {
        eprintln!("usage: layer_bench DIR STORE gzip:LEVEL|zstd:LEVEL|none [THREADS]");
        std::process::exit(2);
    }
    let compression = match args[3].split_once(':') {
        Some(("gzip", level)) => Compression::Gzip {
            level: level.parse()?,
        },
        Some(("zstd", level)) => Compression::Zstd {
            level: level.parse()?,
        },
        _ if args[3] == "none" => Compression::None,
        _ => return Err(format!("unknown compression `{}`", args[3]).into()),
    };
    let mut options = BuildOptions::new(1_714_521_600, compression);
    if let Some(threads) = args.get(4) {
        options.threads = threads.parse()?;
    }
    let started = Instant::now();
    let store = BlobStore::open(&args[2])?;
    let contents = LayerContents::from_dir(std::path::Path::new(&args[1]), &DirOptions::default())?;
    let layer = layer::build(&store, &contents, &options)?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{{\"seconds\":{seconds:.3},\"tar_bytes\":{},\"blob_bytes\":{},\"digest\":\"{}\",\"diff_id\":\"{}\"}}",
        layer.uncompressed_size.unwrap_or(0),
        layer.size,
        layer.digest,
        layer.diff_id
    );
    Ok(())
}
