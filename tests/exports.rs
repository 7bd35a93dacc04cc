//! The library exports exactly the versioned NCCL tables and `fabricoll_*` functions.
use std::path::PathBuf;
use std::process::Command;

/// The cdylib that this test run's build made. Cargo writes it to `target/<profile>/deps/`
/// beside this test; only `cargo build` also copies it up to `target/<profile>/`, so a plain
/// `cargo test` finds it in `deps/` alone. `deps/` first: the copy above may be stale.
fn library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let name = "libnccl_net_fabricoll.so";
    [deps.join(name), deps.parent().unwrap().join(name)]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| deps.join(name))
}

#[test]
fn exports_only_plugin_tables_and_c_api() {
    let lib = library();
    assert!(lib.exists(), "{} not built", lib.display());
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&lib)
        .output()
        .expect("nm (binutils) is needed");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let syms: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    let allowed = |s: &str| {
        let table = |prefix: &str| {
            s.strip_prefix(prefix)
                .is_some_and(|v| v.parse::<u32>().is_ok())
        };
        table("ncclNetPlugin_v")
            || table("ncclCollNetPlugin_v")
            || table("ncclTunerPlugin_v")
            || s.starts_with("fabricoll_")
    };
    let extra: Vec<&&str> = syms.iter().filter(|s| !allowed(s)).collect();
    assert!(extra.is_empty(), "unexpected exports: {extra:?}");
    for v in 6..=12 {
        let name = format!("ncclNetPlugin_v{v}");
        assert!(syms.contains(&name.as_str()), "{name} not exported");
    }
    // The tables are data symbols, as NCCL's dlsym expects.
    for l in text.lines().filter(|l| l.contains("ncclNetPlugin_v")) {
        let kind = l.split_whitespace().nth(1).unwrap();
        assert!(kind == "D" || kind == "R", "{l}: not a data symbol");
    }
    let dynamic = Command::new("readelf")
        .arg("-d")
        .arg(&lib)
        .output()
        .expect("readelf");
    let dynamic = String::from_utf8_lossy(&dynamic.stdout);
    assert!(dynamic.contains("NODELETE"), "not linked with -z nodelete");
    assert!(dynamic.contains("libnccl-net-fabricoll.so"), "soname");
}
