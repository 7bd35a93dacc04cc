//! The CUDA probe on whatever this machine is: without libcuda it reports why and makes no
//! cudarc call (one would panic); with a driver it lists the devices. The plugin's ptrSupport
//! follows from it.
use nccl_net_fabricoll::config::Config;
use nccl_net_fabricoll::cuda::{self, caps, Cuda};
use nccl_net_fabricoll::plugin::Plugin;

fn libcuda_present() -> bool {
    ["libcuda.so", "libcuda.so.1"].iter().any(|name| {
        let c = std::ffi::CString::new(*name).expect("no NUL");
        // SAFETY: dlopen of a NUL-terminated name; the handle is closed at once.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if !h.is_null() {
            // SAFETY: `h` is the live handle dlopen just returned.
            unsafe { libc::dlclose(h) };
        }
        !h.is_null()
    })
}

#[test]
fn probe_says_what_it_found() {
    let p = cuda::probe();
    // The same object on every call: the probe runs once.
    assert!(std::ptr::eq(p, cuda::probe()));
    if !libcuda_present() {
        match p {
            Cuda::Absent { why } => assert!(why.contains("libcuda.so"), "{why}"),
            other => panic!("no libcuda here, yet the probe says {other:?}"),
        }
        return;
    }
    match p {
        Cuda::Absent { why } => panic!("libcuda opens here, yet the probe says absent: {why}"),
        Cuda::Unusable { why } => eprintln!("CUDA unusable here: {why}"),
        Cuda::Up(d) => {
            assert!(!d.devices.is_empty());
            assert!(d.version >= 11000, "driver {}", d.version);
            for (i, dev) in d.devices.iter().enumerate() {
                assert_eq!(dev.ordinal, i as i32);
                assert!(!dev.name.is_empty());
                assert!(dev.compute.0 >= 3, "{dev:?}");
            }
        }
    }
}

#[test]
fn plugin_advertises_device_memory_only_where_registered() {
    // tcp offers no FI_HMEM (libfabric 1.17 and 2.1 alike), so no device buffer is registered
    // and every device stays host-only, with a reason; tests/plugin_gpu.rs checks shm.
    let mut cfg = Config::from_env().expect("config");
    cfg.provider = Some("tcp".into());
    cfg.domains = Some(vec!["lo".into()]);
    let plugin = match Plugin::discover(&cfg) {
        Ok(p) => p,
        Err(e) => {
            nccl_net_fabricoll::testing::skip("plugin_advertises_device_memory", &e.to_string());
            return;
        }
    };
    let mut i = 0;
    while let Ok(dev) = plugin.device(i) {
        assert_eq!(dev.props.ptr_support, caps::PTR_HOST);
        i += 1;
    }
    assert!(i > 0, "discovery found no device");
}
