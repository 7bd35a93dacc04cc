//! The library exports exactly the versioned NCCL tables and `fabricoll_*` functions; the
//! Neuron flavour (`libnccom-net.so`) exactly Neuron's three tables, with their sizes.
use nccl_net_fabricoll::testing::skip;
use std::path::{Path, PathBuf};
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

/// `nm -D -S --defined-only` of `lib`: (name, kind, size) of each defined dynamic symbol.
fn dynamic_symbols(lib: &Path) -> Vec<(String, String, u64)> {
    let out = Command::new("nm")
        .args(["-D", "-S", "--defined-only"])
        .arg(lib)
        .output()
        .expect("nm (binutils) is needed");
    assert!(out.status.success(), "nm {}", lib.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [_, size, kind, name] => Some((
                    name.to_string(),
                    kind.to_string(),
                    u64::from_str_radix(size, 16).unwrap_or(0),
                )),
                [_, kind, name] => Some((name.to_string(), kind.to_string(), 0)),
                _ => None,
            }
        })
        .collect()
}

fn dynamic_section(lib: &Path) -> String {
    let out = Command::new("readelf")
        .arg("-d")
        .arg(lib)
        .output()
        .expect("readelf");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn exports_only_plugin_tables_and_c_api() {
    let lib = library();
    assert!(lib.exists(), "{} not built", lib.display());
    let all = dynamic_symbols(&lib);
    let syms: Vec<&str> = all.iter().map(|(n, _, _)| n.as_str()).collect();
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
    // The tuner tables, which NCCL looks for in the net plugin's library (data symbols too).
    for v in 2..=6 {
        let name = format!("ncclTunerPlugin_v{v}");
        let sym = all.iter().find(|(n, _, _)| *n == name);
        assert!(
            sym.is_some_and(|(_, k, _)| k == "D" || k == "R"),
            "{name} not exported as data"
        );
        // name, init, getCollInfo, destroy/finalize; v6 adds getChunkSize.
        let want = if v == 6 { 40 } else { 32 };
        assert_eq!(sym.map(|s| s.2), Some(want), "{name}: size");
    }
    // The tables are data symbols, as NCCL's dlsym expects; v6 has NVIDIA's 17 slots, not
    // Neuron's 22, and Neuron's v4 and v5 are not here.
    for (name, kind, size) in all.iter().filter(|(n, _, _)| n.contains("ncclNetPlugin_v")) {
        assert!(kind == "D" || kind == "R", "{name}: not a data symbol");
        if name == "ncclNetPlugin_v6" {
            assert_eq!(*size, 17 * 8, "{name}: not NVIDIA's layout");
        }
    }
    assert!(!syms.contains(&"ncclNetPlugin_v4") && !syms.contains(&"ncclNetPlugin_v5"));
    let dynamic = dynamic_section(&lib);
    assert!(dynamic.contains("NODELETE"), "not linked with -z nodelete");
    assert!(dynamic.contains("libnccl-net-fabricoll.so"), "soname");
}

/// `target/<profile>/libnccom-net.so`, made by scripts/build.sh (not by cargo test).
#[test]
fn neuron_library_exports_only_neuron_tables() {
    let exe = std::env::current_exe().unwrap();
    let lib = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("libnccom-net.so");
    if !lib.exists() {
        skip(
            "neuron_library_exports_only_neuron_tables",
            &format!("{} not built (scripts/build.sh builds it)", lib.display()),
        );
        return;
    }
    let all = dynamic_symbols(&lib);
    let mut names: Vec<&str> = all.iter().map(|(n, _, _)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["ncclNetPlugin_v4", "ncclNetPlugin_v5", "ncclNetPlugin_v6"],
        "{} must export Neuron's three tables and nothing else",
        lib.display()
    );
    // Neuron's layouts: 16, 21 and 22 slots.
    for (name, kind, size) in &all {
        assert!(kind == "D" || kind == "R", "{name}: not a data symbol");
        let want = match name.as_str() {
            "ncclNetPlugin_v4" => 128,
            "ncclNetPlugin_v5" => 168,
            _ => 176,
        };
        assert_eq!(*size, want, "{name}: size");
    }
    let dynamic = dynamic_section(&lib);
    assert!(dynamic.contains("NODELETE"), "not linked with -z nodelete");
    assert!(dynamic.contains("[libnccom-net.so]"), "soname");
}
