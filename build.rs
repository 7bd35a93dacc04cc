//! Build script: libfabric bindings (bindgen + cc for the static inline functions), the C API's
//! header (cbindgen), and the link arguments NCCL needs from the plugin library.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/fabric_wrapper.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let lib = match pkg_config_probe("libfabric") {
        Ok(l) => l,
        Err(e) => {
            // One line naming the package, as the README promises.
            println!(
                "cargo:warning=libfabric headers not found ({e}); install them: apt-get install libfabric-dev"
            );
            eprintln!("error: libfabric headers not found: install the package libfabric-dev (Debian/Ubuntu) or set PKG_CONFIG_PATH");
            std::process::exit(1);
        }
    };

    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let wrap_path = out.join("fabric_static_wrappers");
    let mut builder = bindgen::Builder::default()
        .header("src/fabric_wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*|FID_.*|FI_MAJOR_VERSION|FI_MINOR_VERSION")
        .derive_default(true)
        .layout_tests(false)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrap_path)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for inc in &lib.include_paths {
        builder = builder.clang_arg(format!("-I{}", inc.display()));
    }
    let bindings = match builder.generate() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: bindgen failed on the libfabric headers ({e}); install libclang-dev and libfabric-dev");
            std::process::exit(1);
        }
    };
    bindings
        .write_to_file(out.join("fabric_bindings.rs"))
        .expect("write bindings");

    let mut cc = cc::Build::new();
    cc.file(wrap_path.with_extension("c"))
        .include(env::current_dir().unwrap())
        .flag("-fvisibility=hidden")
        .warnings(false);
    for inc in &lib.include_paths {
        cc.include(inc);
    }
    cc.compile("fabricoll_fi_wrappers");

    for dir in &lib.link_paths {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=fabric");

    declare_exports(&out);
    generate_header(&out);

    // NCCL dlcloses and re-opens net plugins: keep our statics and threads alive (-z nodelete),
    // and give the library the soname NCCL opens it by.
    // The Neuron flavour is the library libnccom finds by that name on the loader's path.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    let soname = if env::var_os("CARGO_FEATURE_NEURON").is_some() {
        "libnccom-net.so"
    } else {
        "libnccl-net-fabricoll.so"
    };
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{soname}");
}

/// One export of src/ffi/api/export_table.rs, as cbindgen needs to see it.
struct Export {
    name: &'static str,
    docs: Vec<&'static str>,
    /// Every argument, `name: type`.
    params: Vec<&'static str>,
}

/// The exports of src/ffi/api/export_table.rs, read as the library's `c_exports!`
/// (src/ffi/api/exports.rs) reads it: the same names, docs and arguments, without the calls.
macro_rules! c_exports {
    (
        nonblocking_doc: $nb_pre:literal, $nb_post:literal;
        stream_doc: $st_pre:literal, $st_post:literal;
        $($entries:tt)*
    ) => {{
        let mut all = Vec::new();
        c_exports!(@each all [$nb_pre, $nb_post, $st_pre, $st_post] $($entries)*);
        all
    }};
    (@each $all:ident [$($docs:literal),*]) => {};
    (@each $all:ident [$nb_pre:literal, $nb_post:literal, $st_pre:literal, $st_post:literal]
        $(#[doc = $doc:literal])+
        $(#[nonblocking_doc = $nb_doc:literal])?
        fn $name:ident, $iname:ident $(, $sname:ident)? ($($arg:ident: $ty:ty),* $(,)?) => $args:expr;
        $($rest:tt)*
    ) => {
        let params = vec![$(stringify!($arg: $ty),)* "comm: *mut fabricoll_comm"];
        let with = |last: &'static str| params.iter().copied().chain([last]).collect();
        $all.push(Export { name: stringify!($name), docs: vec![$($doc),+], params: params.clone() });
        let nb_doc = [$($nb_doc)?].first().copied();
        $all.push(Export {
            name: stringify!($iname),
            docs: vec![nb_doc.unwrap_or(concat!($nb_pre, stringify!($name), $nb_post))],
            params: with("request: *mut *mut fabricoll_request"),
        });
        $($all.push(Export {
            name: stringify!($sname),
            docs: vec![concat!($st_pre, stringify!($name), $st_post)],
            params: with("stream: *mut c_void"),
        });)?
        c_exports!(@each $all [$nb_pre, $nb_post, $st_pre, $st_post] $($rest)*);
    };
}

/// The C API's send, receive and collective exports, which the library writes with a macro
/// from src/ffi/api/export_table.rs, declared for cbindgen (which does not expand macros) in
/// OUT_DIR/c_api_exports.rs: read by cbindgen only, never compiled.
fn declare_exports(out: &std::path::Path) {
    let exports: Vec<Export> = include!("src/ffi/api/export_table.rs");
    let mut src = String::from("// Declarations of src/ffi/api/export_table.rs for cbindgen.\n");
    for e in exports {
        for d in e.docs {
            src += &format!("\n#[doc = {d:?}]");
        }
        src += &format!(
            "\n#[no_mangle]\npub extern \"C\" fn {}({}) -> fabricoll_status {{}}\n",
            e.name,
            e.params.join(", ")
        );
    }
    std::fs::write(out.join("c_api_exports.rs"), src).expect("write c_api_exports.rs");
}

/// include/fabricoll.h from the `fabricoll_*` functions (src/ffi/api/), written to OUT_DIR;
/// tests compare it with the committed header.
fn generate_header(out: &std::path::Path) {
    println!("cargo:rerun-if-changed=src/ffi/api");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let crate_dir = env::var("CARGO_MANIFEST_DIR").unwrap();
    let config = cbindgen::Config::from_file(PathBuf::from(&crate_dir).join("cbindgen.toml"))
        .expect("cbindgen.toml");
    let mut config = config;
    // Only the C API module: the NCCL tables have their own declarations in NCCL.
    config.parse.include = None;
    match cbindgen::Builder::new()
        .with_config(config)
        .with_src(PathBuf::from(&crate_dir).join("src/ffi/api/mod.rs"))
        .with_src(out.join("c_api_exports.rs"))
        .generate()
    {
        Ok(b) => {
            b.write_to_file(out.join("fabricoll.h"));
        }
        Err(e) => panic!("cbindgen failed on src/ffi/api: {e}"),
    }
}

struct PkgLib {
    include_paths: Vec<PathBuf>,
    link_paths: Vec<PathBuf>,
}

/// Minimal pkg-config query (honours PKG_CONFIG_PATH), so that no extra build dependency is needed.
fn pkg_config_probe(name: &str) -> Result<PkgLib, String> {
    let run = |arg: &str| -> Result<String, String> {
        let o = std::process::Command::new("pkg-config")
            .args([arg, name])
            .output()
            .map_err(|e| format!("pkg-config not runnable: {e}"))?;
        if !o.status.success() {
            return Err(String::from_utf8_lossy(&o.stderr).trim().to_string());
        }
        Ok(String::from_utf8_lossy(&o.stdout).to_string())
    };
    let cflags = run("--cflags")?;
    let libs = run("--libs")?;
    let include_paths = cflags
        .split_whitespace()
        .filter_map(|f| f.strip_prefix("-I").map(PathBuf::from))
        .collect();
    let link_paths = libs
        .split_whitespace()
        .filter_map(|f| f.strip_prefix("-L").map(PathBuf::from))
        .collect();
    Ok(PkgLib {
        include_paths,
        link_paths,
    })
}
