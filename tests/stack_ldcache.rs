//! cudastack's own loader cache (`base_root::ldcache`, used for images the host's ldconfig
//! cannot read) says what glibc's `ldconfig` says: for an x86_64 root, where the host's
//! ldconfig works, both caches hold the same entries in the same order. The root has
//! gcc-built libraries in the multiarch directory and an ld.so.conf.d directory, SONAMEs
//! that sort numerically (`.so.9` < `.so.10`), a development link, a library whose file
//! name is not its SONAME, a linker script and a non-library file.

use crate::e2e_support;

use std::path::Path;
use std::process::Command;

use cudastack::audit::DirFs;
use cudastack::base_root::ldcache;
use cudastack::elf::Machine;
use cudastack::host::stack::parse_ld_so_cache;

fn gcc_lib(path: &Path, soname: &str) {
    let source = path.with_extension("c");
    std::fs::write(&source, "int f(void) { return 1; }\n").unwrap();
    let status = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(path)
        .arg(&source)
        .arg(format!("-Wl,-soname,{soname}"))
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::remove_file(source).unwrap();
}

#[test]
fn the_cache_cudastack_writes_equals_ldconfigs() {
    if let Some(reason) = e2e_support::skip_reason(&[("gcc", &["--version"][..])]) {
        // ldconfig -r chroots: root is needed (the reason says so).
        reason.report();
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let root = work.path();
    let multiarch = root.join("usr/lib/x86_64-linux-gnu");
    let cuda = root.join("usr/local/cuda-12.4/targets/x86_64-linux/lib");
    for dir in [&multiarch, &cuda, &root.join("etc/ld.so.conf.d")] {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf.d/000-cuda.conf"),
        "/usr/local/cuda-12.4/targets/x86_64-linux/lib\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/ld.so.conf.d/x86_64-linux-gnu.conf"),
        "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n",
    )
    .unwrap();
    for (dir, file, soname) in [
        (&multiarch, "libz.so.1.2.13", "libz.so.1"),
        (&multiarch, "libfoo.so.9", "libfoo.so.9"),
        (&multiarch, "libfoo.so.10", "libfoo.so.10"),
        (&multiarch, "libabc.so.2.0", "libabc.so.2"),
        (&cuda, "libcudart.so.12.4.127", "libcudart.so.12"),
        (&cuda, "libcublas.so.12.4.5.8", "libcublas.so.12"),
        // Also in the multiarch directory: the earlier (ld.so.conf) directory wins.
        (&multiarch, "libcublas.so.12.0.0", "libcublas.so.12"),
    ] {
        gcc_lib(&dir.join(file), soname);
    }
    for (dir, link, target) in [
        (&multiarch, "libz.so.1", "libz.so.1.2.13"),
        (&multiarch, "libz.so", "libz.so.1"),
        (&cuda, "libcudart.so.12", "libcudart.so.12.4.127"),
        (&cuda, "libcublas.so.12", "libcublas.so.12.4.5.8"),
        (&multiarch, "libcublas.so.12", "libcublas.so.12.0.0"),
        // A -dev link straight to the file (cached under its own name), an alias and a
        // compat link to the SONAME link (neither is a library of its own).
        (&multiarch, "libabc.so", "libabc.so.2.0"),
        (&multiarch, "libalias.so.7", "libz.so.1"),
        (&multiarch, "libz-compat.so", "libz.so.1"),
    ] {
        std::os::unix::fs::symlink(target, dir.join(link)).unwrap();
    }
    std::fs::write(
        multiarch.join("libc.so"),
        "GROUP ( /lib/x86_64-linux-gnu/libc.so.6 )\n",
    )
    .unwrap();
    std::fs::write(multiarch.join("libnotes.so.txt"), "not an ELF file\n").unwrap();

    let ours = ldcache::cache_entries(&DirFs::new(root), Machine::X86_64).unwrap();
    // -X: do not create links, so both read the same tree.
    let status = Command::new("ldconfig")
        .arg("-X")
        .arg("-r")
        .arg(root)
        .status()
        .unwrap();
    assert!(status.success());
    let theirs = parse_ld_so_cache(&std::fs::read(root.join("etc/ld.so.cache")).unwrap()).unwrap();
    let ours_pairs: Vec<(String, String)> = ours
        .iter()
        .map(|e| (e.soname.clone(), e.path.clone()))
        .collect();
    let theirs_pairs: Vec<(String, String)> =
        theirs.into_iter().map(|e| (e.name, e.path)).collect();
    assert_eq!(ours_pairs, theirs_pairs);
    // And it serialises into a cache the parser (and so the loader's format) reads back.
    let bytes = ldcache::serialize(&ours, None);
    let parsed: Vec<(String, String)> = parse_ld_so_cache(&bytes)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.path))
        .collect();
    assert_eq!(parsed, theirs_pairs);

    // Byte for byte: with the root's own ldconfig (here the host's, copied in), the cache
    // cudastack writes is the one that ldconfig writes, string table and generator
    // extension included, so an image's cache does not depend on the build host.
    let ldconfig = ["/usr/sbin/ldconfig", "/sbin/ldconfig"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.exists())
        .expect("ldconfig");
    std::fs::create_dir_all(root.join("usr/sbin")).unwrap();
    std::fs::copy(ldconfig, root.join("usr/sbin/ldconfig")).unwrap();
    let generator = ldcache::image_generator(&DirFs::new(root)).expect("ldconfig names itself");
    assert!(generator.starts_with(b"ldconfig ("), "{generator:?}");
    assert_eq!(
        ldcache::ld_so_cache(&DirFs::new(root), Machine::X86_64).unwrap(),
        std::fs::read(root.join("etc/ld.so.cache")).unwrap(),
        "cudastack's cache differs from ldconfig's bytes"
    );
}
