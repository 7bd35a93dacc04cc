//! Build script: libfabric bindings (bindgen + cc for the static inline functions) and the
//! link arguments NCCL needs from the plugin library.
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

    generate_c_collectives(&out);
    generate_c_varied(&out);
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

/// include/fabricoll.h from the `fabricoll_*` functions (src/ffi/api/), written to OUT_DIR;
/// tests compare it with the committed header.
/// The C API's 16 send, receive and collective exports, blocking and non-blocking, and their 8
/// stream-ordered twins, generated from one table into OUT_DIR (`include!`d by src/ffi/api/collectives.rs) so that they are
/// not copied by hand. A macro would do the same for Rust, but cbindgen, which writes the
/// header, does not expand macros on stable Rust; it reads this file instead.
fn generate_c_collectives(out: &std::path::Path) {
    /// An export's arguments after the buffers: (name, Rust type).
    type Params = &'static [(&'static str, &'static str)];
    // (name, doc, the arguments after the buffers, how they build the call's `Args`)
    const COLLS: &[(&str, &str, Params, &str)] = &[
        (
            "allreduce",
            "recvbuf = the reduction of every rank's sendbuf (count elements each; in place when the buffers are equal).",
            &[("count", "usize"), ("datatype", "c_int"), ("op", "c_int")],
            "Args::coll(AllReduce, sendbuf, recvbuf, count, datatype).op(op)",
        ),
        (
            "allgather",
            "recvbuf (nranks x sendcount) = every rank's sendbuf, in rank order.",
            &[("sendcount", "usize"), ("datatype", "c_int")],
            "Args::coll(AllGather, sendbuf, recvbuf, sendcount, datatype)",
        ),
        (
            "reducescatter",
            "recvbuf (recvcount) = block `rank` of the reduction of every rank's sendbuf (nranks x recvcount).",
            &[("recvcount", "usize"), ("datatype", "c_int"), ("op", "c_int")],
            "Args::coll(ReduceScatter, sendbuf, recvbuf, recvcount, datatype).op(op)",
        ),
        (
            "broadcast",
            "recvbuf = the root's sendbuf on every rank (sendbuf is read on the root only and may be NULL elsewhere).",
            &[("count", "usize"), ("datatype", "c_int"), ("root", "c_int")],
            "Args::coll(Broadcast, sendbuf, recvbuf, count, datatype).root(root)",
        ),
        (
            "reduce",
            "The root's recvbuf = the reduction of every rank's sendbuf (recvbuf is written on the root only and may be NULL elsewhere).",
            &[("count", "usize"), ("datatype", "c_int"), ("op", "c_int"), ("root", "c_int")],
            "Args::coll(Reduce, sendbuf, recvbuf, count, datatype).op(op).root(root)",
        ),
        (
            "alltoall",
            "Block j (count elements) of rank i's sendbuf lands as block i of rank j's recvbuf.",
            &[("count", "usize"), ("datatype", "c_int")],
            "Args::coll(AllToAll, sendbuf, recvbuf, count, datatype)",
        ),
    ];
    // (name, doc, buffer argument, its type, whether it sends)
    const P2P: &[(&str, &str, &str, bool)] = &[
        (
            "send",
            "Send count elements to `peer` (matched in order with its fabricoll_recv from this rank).",
            "*const c_void",
            true,
        ),
        ("recv", "Receive count elements from `peer`.", "*mut c_void", false),
    ];
    let mut src = String::from(
        "// Generated by build.rs (generate_c_collectives): the C API's send, receive and\n\
         // collective exports. Edit the table there, not this file.\n",
    );
    for (name, doc, rest, args) in COLLS {
        let params: String = [("sendbuf", "*const c_void"), ("recvbuf", "*mut c_void")]
            .iter()
            .chain(rest.iter())
            .map(|(n, t)| format!("    {n}: {t},\n"))
            .collect();
        src += &export_pair(name, doc, &nb_doc(name), &params, args);
        src += &export_stream(name, &params, args);
    }
    for (name, doc, buf_ty, sends) in P2P {
        let params = format!(
            "    buf: {buf_ty},\n    count: usize,\n    datatype: c_int,\n    peer: c_int,\n"
        );
        let args = format!("Args::p2p({sends}, buf as *mut c_void, count, datatype, peer)");
        src += &export_pair(
            name,
            doc,
            &format!("Non-blocking fabricoll_{name}."),
            &params,
            &args,
        );
        src += &export_stream(name, &params, &args);
    }
    std::fs::write(out.join("c_api_collectives.rs"), src).expect("write c_api_collectives.rs");
}

/// The C API's gather, scatter, barrier, uneven-count and tagged exports, blocking and
/// non-blocking, from one table into OUT_DIR (`include!`d by src/ffi/api/varied.rs), as
/// `generate_c_collectives` does for the others.
fn generate_c_varied(out: &std::path::Path) {
    type Params = &'static [(&'static str, &'static str)];
    const SEND: (&str, &str) = ("sendbuf", "*const c_void");
    const RECV: (&str, &str) = ("recvbuf", "*mut c_void");
    const DT: (&str, &str) = ("datatype", "c_int");
    // (name, doc, every argument before `comm`, how they build the call's arguments)
    const CALLS: &[(&str, &str, Params, &str)] = &[
        (
            "gather",
            "Every rank's sendbuf (sendcount elements) lands in rank order in the root's recvbuf (nranks x sendcount; written on the root only, may be NULL elsewhere).",
            &[SEND, RECV, ("sendcount", "usize"), DT, ("root", "c_int")],
            "VArgs::rooted(false, sendbuf, recvbuf, sendcount, datatype, root)",
        ),
        (
            "scatter",
            "Block i (recvcount elements) of the root's sendbuf (nranks x recvcount; read on the root only, may be NULL elsewhere) lands in rank i's recvbuf.",
            &[SEND, RECV, ("recvcount", "usize"), DT, ("root", "c_int")],
            "VArgs::rooted(true, sendbuf, recvbuf, recvcount, datatype, root)",
        ),
        (
            "barrier",
            "Completes once every rank has called it.",
            &[],
            "VArgs::new(Varied::Barrier, std::ptr::null(), std::ptr::null_mut(), 0)",
        ),
        (
            "allgatherv",
            "recvbuf + displs[i] (recvcounts[i] elements) = rank i's sendbuf; sendcount must equal recvcounts[rank]. recvcounts (nranks values, the same on every rank) must not be NULL; displs NULL packs the blocks in rank order. The arrays are read before the call returns.",
            &[SEND, ("sendcount", "usize"), RECV, ("recvcounts", "*const usize"), ("displs", "*const usize"), DT],
            "VArgs::allgatherv(sendbuf, sendcount, recvbuf, recvcounts, displs, datatype)",
        ),
        (
            "reducescatterv",
            "recvbuf (recvcounts[rank] elements) = block `rank` of the reduction of every rank's sendbuf, whose blocks are recvcounts[0..nranks] packed. recvcounts (the same on every rank) must not be NULL; it is read before the call returns.",
            &[SEND, RECV, ("recvcounts", "*const usize"), DT, ("op", "c_int")],
            "VArgs::reducescatterv(sendbuf, recvbuf, recvcounts, datatype, op)",
        ),
        (
            "alltoallv",
            "sendbuf + sdispls[j] (sendcounts[j] elements) goes to rank j, landing at its recvbuf + rdispls[i] (recvcounts[i]) for this rank i. The counts arrays must not be NULL; a NULL displacements array packs its blocks in rank order. The arrays are read before the call returns.",
            &[SEND, ("sendcounts", "*const usize"), ("sdispls", "*const usize"), RECV, ("recvcounts", "*const usize"), ("rdispls", "*const usize"), DT],
            "VArgs::alltoallv([sendcounts, sdispls, recvcounts, rdispls], sendbuf, recvbuf, datatype)",
        ),
        (
            "send_tagged",
            "Send count elements to `peer` with `tag` (0 ..= FABRICOLL_MAX_TAG), matched in order with its receives of that tag from this rank (fabricoll_send is tag 0).",
            &[("buf", "*const c_void"), ("count", "usize"), DT, ("peer", "c_int"), ("tag", "c_int")],
            "Tagged { send: true, buf: buf as *mut c_void, count, datatype, peer, tag }",
        ),
        (
            "recv_tagged",
            "Receive count elements from `peer` with `tag` (fabricoll_recv is tag 0).",
            &[("buf", "*mut c_void"), ("count", "usize"), DT, ("peer", "c_int"), ("tag", "c_int")],
            "Tagged { send: false, buf, count, datatype, peer, tag }",
        ),
    ];
    let mut src = String::from(
        "// Generated by build.rs (generate_c_varied): the C API's gather, scatter, barrier,\n\
         // uneven-count and tagged exports. Edit the table there, not this file.\n",
    );
    for (name, doc, params, args) in CALLS {
        let params: String = params
            .iter()
            .map(|(n, t)| format!("    {n}: {t},\n"))
            .collect();
        src += &export_pair(name, doc, &nb_doc(name), &params, args);
    }
    std::fs::write(out.join("c_api_varied.rs"), src).expect("write c_api_varied.rs");
}

/// The doc of a non-blocking export.
fn nb_doc(name: &str) -> String {
    format!(
        "Non-blocking fabricoll_{name}: `*request` completes through fabricoll_test / fabricoll_wait."
    )
}

/// The export `fabricoll_{name}` and its non-blocking twin `fabricoll_i{name}`: `params` are
/// the arguments before `comm` (one a line), `args` makes the call's arguments `a` from them.
fn export_pair(name: &str, doc: &str, nb_doc: &str, params: &str, args: &str) -> String {
    let mut src = String::new();
    for nb in [false, true] {
        let (export, doc, tail, call) = if nb {
            (
                format!("fabricoll_i{name}"),
                nb_doc,
                "    request: *mut *mut fabricoll_request,\n",
                format!("nonblocking(\"fabricoll_i{name}\", comm, a, request)"),
            )
        } else {
            (
                format!("fabricoll_{name}"),
                doc,
                "",
                format!("blocking(\"fabricoll_{name}\", comm, a)"),
            )
        };
        src += &format!(
            "\n/// {doc}\n#[no_mangle]\npub extern \"C\" fn {export}(\n{params}    comm: *mut fabricoll_comm,\n{tail}) -> fabricoll_status {{\n    let a = {args};\n    {call}\n}}\n"
        );
    }
    src
}

/// The stream-ordered export `fabricoll_{name}_stream`: the arguments of `fabricoll_{name}`,
/// then the caller's CUDA stream.
fn export_stream(name: &str, params: &str, args: &str) -> String {
    format!(
        "\n/// Stream-ordered fabricoll_{name}: returns at once; runs after the work already on `stream` \
         (a CUstream; never the legacy NULL stream), and later work on `stream` waits for it. The \
         buffers may be device memory or page-locked host memory and must stay valid until the \
         stream has passed the call. A failure after the return releases the stream and is \
         reported by fabricoll_comm_get_async_error.\n#[no_mangle]\npub extern \"C\" fn fabricoll_{name}_stream(\n{params}    comm: *mut fabricoll_comm,\n    stream: *mut c_void,\n) -> fabricoll_status {{\n    let a = {args};\n    stream_ordered(\"fabricoll_{name}_stream\", comm, a, stream)\n}}\n"
    )
}

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
        .with_src(out.join("c_api_collectives.rs"))
        .with_src(out.join("c_api_varied.rs"))
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
