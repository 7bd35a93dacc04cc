//! Who this process is in a job that a launcher started, and where the job's bootstrap root is,
//! read from the environment: this process's rank, the rank count, its local rank (when the
//! launcher says) and how the ranks meet (a unique id, an address rank 0 listens on, or a file
//! rank 0 writes its id to).
//!
//! Launchers, in order of precedence (the first whose rank or size variable is set is used):
//!
//! | launcher         | rank                   | size                   | local rank                    |
//! |------------------|------------------------|------------------------|-------------------------------|
//! | fabricoll's own  | `FABRICOLL_RANK`       | `FABRICOLL_NRANKS`     | -                             |
//! | torchrun         | `RANK`                 | `WORLD_SIZE`           | `LOCAL_RANK`                  |
//! | Open MPI mpirun  | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK`  |
//! | MPICH Hydra      | `PMI_RANK`             | `PMI_SIZE`             | `MPI_LOCALRANKID`             |
//! | Slurm srun       | `SLURM_PROCID`         | `SLURM_NTASKS`         | `SLURM_LOCALID`               |
//!
//! Launchers nest: mpirun, Hydra and torchrun run inside a Slurm allocation start their
//! daemons with srun, so their ranks also see `SLURM_*` variables that count daemons, not
//! ranks. The launcher that started this process is the innermost one, hence this order (Hydra
//! before Slurm for that reason; srun's own PMI variables agree with its `SLURM_*` ones).
//! Only fabricoll's own size is checked against the launcher below it: they must agree.
//!
//! How the ranks meet, first that is set: `FABRICOLL_UNIQUE_ID` (a root already serves it, e.g.
//! `fabricoll-info --unique-id`), `FABRICOLL_ROOT` (host:port: rank 0 listens on that port
//! on every interface, the others connect to the address), `FABRICOLL_ROOT_FILE` (rank 0 serves on this host's address and writes the
//! id to the file, atomically; the others wait for it), and for torchrun `MASTER_ADDR` with
//! `MASTER_PORT + 1` (torchrun's store has `MASTER_PORT`; same rule). Setting two of the first three is an
//! error. A job id (`FABRICOLL_JOB_ID`, else `TORCHELASTIC_RUN_ID`, Open MPI's job id,
//! `SLURM_JOB_ID` and `SLURM_STEP_ID`) becomes the root's nonce, so that ranks of two jobs
//! never join each other's root, and a file left by another job is not taken for this job's.
//! Without one, two jobs on one port are told apart only by what the root sees (a rank twice,
//! a second rank 0: it then fails every rank), so creation warns once and names the variable.
use super::bootstrap::{self, UniqueId};
use super::Comm;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::exec::MAX_RANKS;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Instant;

mod file;
#[cfg(test)]
mod tests;

pub use file::bind_ip;
use file::{await_file, publish, Published};

/// The launcher whose variables give this process's rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Fabricoll,
    Torchrun,
    OpenMpi,
    Hydra,
    Slurm,
}

/// A launcher's variables: rank, size, local rank, and the job id's (joined with '.').
struct Vars {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local: Option<&'static str>,
    job: &'static [&'static [&'static str]],
}

/// In order of precedence (the module's documentation says why).
const LAUNCHERS: [Vars; 5] = [
    Vars {
        launcher: Launcher::Fabricoll,
        rank: "FABRICOLL_RANK",
        size: "FABRICOLL_NRANKS",
        local: None,
        job: &[],
    },
    Vars {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: "WORLD_SIZE",
        local: Some("LOCAL_RANK"),
        job: &[&["TORCHELASTIC_RUN_ID"]],
    },
    Vars {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local: Some("OMPI_COMM_WORLD_LOCAL_RANK"),
        // Open MPI 4 names the job in an MCA variable; 5 only as the PMIx namespace.
        job: &[&["OMPI_MCA_ess_base_jobid"], &["PMIX_NAMESPACE"]],
    },
    Vars {
        launcher: Launcher::Hydra,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local: Some("MPI_LOCALRANKID"),
        job: &[],
    },
    Vars {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local: Some("SLURM_LOCALID"),
        // Two steps of one job are two jobs for the bootstrap.
        job: &[&["SLURM_JOB_ID", "SLURM_STEP_ID"], &["SLURM_JOB_ID"]],
    },
];

/// The variables that say how ranks meet, besides a launcher's own address.
pub const ROOT_VARS: [&str; 3] = [
    "FABRICOLL_UNIQUE_ID",
    "FABRICOLL_ROOT",
    "FABRICOLL_ROOT_FILE",
];

/// The nonce of a launcher route without a job id (the bytes "trch", as before).
const FIXED_NONCE: u64 = 0x7472_6368;

impl Launcher {
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Fabricoll => "fabricoll",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "Open MPI",
            Launcher::Hydra => "Hydra",
            Launcher::Slurm => "Slurm",
        }
    }

    fn vars(self) -> &'static Vars {
        LAUNCHERS
            .iter()
            .find(|v| v.launcher == self)
            .expect("every launcher has its variables")
    }
}

/// How the ranks meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendezvous {
    /// `FABRICOLL_UNIQUE_ID`: a root that someone else serves.
    Id(UniqueId),
    /// Rank 0 serves on `addr` with `nonce`; the others connect. `var` says where `addr` is
    /// from.
    Listen {
        addr: SocketAddr,
        nonce: u64,
        var: &'static str,
    },
    /// `FABRICOLL_ROOT_FILE`: rank 0 writes its unique id there; `nonce` is the job's, if any.
    File { path: PathBuf, nonce: Option<u64> },
}

/// This process's place in a launched job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    pub launcher: Launcher,
    pub rank: usize,
    pub nranks: usize,
    /// The rank on this host, as the launcher says (None: it does not). The device hint:
    /// local rank i uses device i mod n.
    pub local_rank: Option<usize>,
    pub rendezvous: Rendezvous,
    /// The job id's variable(s), when one made the nonce.
    pub job: Option<String>,
}

fn nonempty(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn number(name: &str, v: &str) -> Result<usize> {
    v.parse()
        .map_err(|_| Error::arg(name, format!("{v:?} is not a non-negative integer")))
}

/// Rank and size of `l`, if any of its two variables is set (both must be).
fn ranks_of(get: &dyn Fn(&str) -> Option<String>, l: &Vars) -> Result<Option<(usize, usize)>> {
    match (nonempty(get, l.rank), nonempty(get, l.size)) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(Error::arg(
            l.size,
            format!(
                "unset, but {} is set: {} sets both",
                l.rank,
                l.launcher.name()
            ),
        )),
        (None, Some(_)) => Err(Error::arg(
            l.rank,
            format!(
                "unset, but {} is set: {} sets both",
                l.size,
                l.launcher.name()
            ),
        )),
        (Some(r), Some(n)) => {
            let (r, n) = (number(l.rank, &r)?, number(l.size, &n)?);
            if n == 0 || n > MAX_RANKS {
                return Err(Error::arg(
                    l.size,
                    format!("{n} is outside 1..={MAX_RANKS}"),
                ));
            }
            if r >= n {
                return Err(Error::arg(
                    l.rank,
                    format!("{r} is not below {} ({n})", l.size),
                ));
            }
            Ok(Some((r, n)))
        }
    }
}

/// A 64-bit FNV-1a hash: the job id's nonce, the same in every rank.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The job id of `l` (its variables and their values) and the nonce made from it.
fn job_of(get: &dyn Fn(&str) -> Option<String>, l: &Vars) -> Option<(String, u64)> {
    l.job.iter().find_map(|names| {
        let vals: Option<Vec<String>> = names.iter().map(|n| nonempty(get, n)).collect();
        let key = format!("{}={}", names.join("."), vals?.join("."));
        Some((names.join("."), fnv(&key)))
    })
}

/// `host:port` (`var`'s value) as one address: the first IPv4 one it resolves to, else the first.
fn resolve(var: &str, hostport: &str) -> Result<SocketAddr> {
    let all: Vec<SocketAddr> = hostport
        .to_socket_addrs()
        .map_err(|e| Error::arg(var, format!("{hostport:?} does not resolve: {e}")))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| Error::arg(var, format!("{hostport:?} resolves to no address")))
}

/// The local rank the launcher in `get` gives, by the same precedence (None: none does, or
/// its value is not a number). For a device hint where no `Launch` was made.
pub fn local_rank_hint(get: &dyn Fn(&str) -> Option<String>) -> Option<usize> {
    LAUNCHERS
        .iter()
        .filter(|l| nonempty(get, l.rank).is_some() || nonempty(get, l.size).is_some())
        .find_map(|l| l.local)
        .and_then(|v| nonempty(get, v)?.parse().ok())
}

/// The launch that `get` (the environment) describes: None where no launcher variable and no
/// root variable is set; an error naming the variable where they are inconsistent.
pub fn detect(get: &dyn Fn(&str) -> Option<String>, cfg: &Config) -> Result<Option<Launch>> {
    let mut found = None;
    for l in &LAUNCHERS {
        if let Some(rn) = ranks_of(get, l)? {
            found = Some((l, rn));
            break;
        }
    }
    let id_var = nonempty(get, "FABRICOLL_UNIQUE_ID");
    let set: Vec<&str> = [
        (ROOT_VARS[0], id_var.is_some()),
        (ROOT_VARS[1], cfg.root.is_some()),
        (ROOT_VARS[2], cfg.root_file.is_some()),
    ]
    .into_iter()
    .filter_map(|(n, on)| on.then_some(n))
    .collect();
    let Some((l, (rank, nranks))) = found else {
        return match set.first() {
            None => Ok(None),
            Some(v) => Err(Error::arg(
                v,
                "set, but no launcher variable gives this process's rank: set FABRICOLL_RANK \
                 and FABRICOLL_NRANKS, or start it with torchrun, mpirun, mpiexec (Hydra) or srun",
            )),
        };
    };
    if set.len() > 1 {
        return Err(Error::arg(
            set[1],
            format!(
                "set together with {}: set one of {}",
                set[0],
                ROOT_VARS.join(", ")
            ),
        ));
    }
    if l.launcher == Launcher::Fabricoll {
        // The launcher below fabricoll's own variables must count the same ranks.
        for other in &LAUNCHERS[1..] {
            if let Ok(Some((_, n))) = ranks_of(get, other) {
                if n != nranks {
                    return Err(Error::arg(
                        l.size,
                        format!(
                            "{nranks}, but {} says {n} ({}): the sizes of two launchers disagree",
                            other.size,
                            other.launcher.name()
                        ),
                    ));
                }
                break;
            }
        }
    }
    let local_rank = match l.local.and_then(|v| Some((v, nonempty(get, v)?))) {
        None => None,
        Some((v, s)) => {
            let lr = number(v, &s)?;
            if lr >= nranks {
                return Err(Error::arg(
                    v,
                    format!("{lr} is not below {} ({nranks})", l.size),
                ));
            }
            Some(lr)
        }
    };
    // FABRICOLL_JOB_ID first: the user named the job, whatever the launcher says.
    let job = match &cfg.job_id {
        Some(j) => Some((
            "FABRICOLL_JOB_ID".to_string(),
            fnv(&format!("FABRICOLL_JOB_ID={j}")),
        )),
        None => job_of(get, l),
    };
    let nonce = job.as_ref().map(|j| j.1);
    let rendezvous = if let Some(hex) = id_var {
        Rendezvous::Id(UniqueId::from_hex(&hex, "FABRICOLL_UNIQUE_ID")?)
    } else if let Some(root) = &cfg.root {
        Rendezvous::Listen {
            addr: resolve("FABRICOLL_ROOT", root)?,
            nonce: nonce.unwrap_or(FIXED_NONCE),
            var: "FABRICOLL_ROOT",
        }
    } else if let Some(path) = &cfg.root_file {
        Rendezvous::File {
            path: path.clone(),
            nonce,
        }
    } else if l.launcher == Launcher::Torchrun {
        torchrun_root(get, nonce)?
    } else {
        let how = format!(
            "set one of {}: FABRICOLL_ROOT=host:port (rank 0 listens there), \
             FABRICOLL_ROOT_FILE=path on a file system every rank sees, or \
             FABRICOLL_UNIQUE_ID from `fabricoll-info --unique-id`",
            ROOT_VARS.join(", ")
        );
        return Err(if l.launcher == Launcher::Fabricoll {
            Error::arg(
                "FABRICOLL_UNIQUE_ID",
                format!("FABRICOLL_RANK and FABRICOLL_NRANKS need a way to meet: {how}"),
            )
        } else {
            Error::arg(
                "FABRICOLL_ROOT",
                format!("{} gives no address for rank 0: {how}", l.launcher.name()),
            )
        });
    };
    Ok(Some(Launch {
        launcher: l.launcher,
        rank,
        nranks,
        local_rank,
        rendezvous,
        job: job.map(|j| j.0),
    }))
}

/// torchrun's route: rank 0 listens on `MASTER_ADDR` at `MASTER_PORT + 1`.
fn torchrun_root(get: &dyn Fn(&str) -> Option<String>, nonce: Option<u64>) -> Result<Rendezvous> {
    let need = |v: &str| {
        nonempty(get, v).ok_or_else(|| {
            Error::arg(
                v,
                format!(
                    "unset: torchrun sets MASTER_ADDR and MASTER_PORT (or set one of {})",
                    ROOT_VARS.join(", ")
                ),
            )
        })
    };
    let (host, port) = (need("MASTER_ADDR")?, need("MASTER_PORT")?);
    let port: u16 = port.parse().ok().filter(|p| *p < u16::MAX).ok_or_else(|| {
        Error::arg(
            "MASTER_PORT",
            format!("{port:?} is not a port below 65535 (the root listens on MASTER_PORT + 1)"),
        )
    })?;
    let at = resolve("MASTER_ADDR", &format!("{host}:{port}"))
        .or_else(|_| resolve("MASTER_ADDR", &format!("[{host}]:{port}")))?;
    Ok(Rendezvous::Listen {
        addr: SocketAddr::new(at.ip(), port + 1),
        nonce: nonce.unwrap_or(FIXED_NONCE),
        var: "MASTER_ADDR, MASTER_PORT + 1",
    })
}

/// The launch this process's environment describes (`detect`).
pub fn from_env(cfg: &Config) -> Result<Option<Launch>> {
    detect(&|n| std::env::var(n).ok(), cfg)
}

/// A communicator from the environment: the launch `from_env` finds, joined. An error where
/// no launcher variable is set.
pub fn init_from_env(cfg: &Config) -> Result<Comm> {
    match from_env(cfg)? {
        Some(l) => l.init(cfg),
        None => Err(Error::InvalidUsage(format!(
            "no launcher variables: set FABRICOLL_RANK and FABRICOLL_NRANKS with one of {}, \
             or start this process with torchrun, mpirun, mpiexec (Hydra) or srun",
            ROOT_VARS.join(", ")
        ))),
    }
}

impl Launch {
    /// One line for a log or a header: the launcher, its variables, the local rank, the route.
    pub fn describe(&self) -> String {
        let v = self.launcher.vars();
        let local = match (self.local_rank, v.local) {
            (Some(l), Some(var)) => format!(", {var} {l}"),
            _ => String::new(),
        };
        let route = match &self.rendezvous {
            Rendezvous::Id(id) => format!("the root at {} (FABRICOLL_UNIQUE_ID)", id.addr),
            Rendezvous::Listen { addr, var, .. } => {
                format!(
                    "rank 0 listens on port {}, the others connect to {addr} ({var})",
                    addr.port()
                )
            }
            Rendezvous::File { path, .. } => {
                format!(
                    "rank 0 writes its id to {} (FABRICOLL_ROOT_FILE)",
                    path.display()
                )
            }
        };
        let job = self
            .job
            .as_ref()
            .map_or(String::new(), |j| format!(", job id from {j}"));
        format!(
            "{} ({} {} of {} {}{local}); {route}{job}",
            self.launcher.name(),
            v.rank,
            self.rank,
            v.size,
            self.nranks
        )
    }

    /// The unique id of this job's root: rank 0 starts the root where this process serves it.
    /// Every wait has the deadline `cfg.timeout`, whose source its error names.
    pub fn unique_id(&self, cfg: &Config) -> Result<UniqueId> {
        Ok(self.rendezvous(cfg)?.0)
    }

    /// `unique_id`, with rank 0's published file where the route has one.
    fn rendezvous(&self, cfg: &Config) -> Result<(UniqueId, Option<Published>)> {
        let timeout = cfg.timeout_setting();
        match &self.rendezvous {
            Rendezvous::Id(id) => Ok((*id, None)),
            Rendezvous::Listen { addr, nonce, var } => {
                let id = UniqueId {
                    addr: *addr,
                    nonce: *nonce,
                };
                if self.rank == 0 {
                    // Every interface: a host's own name may resolve to a loopback address
                    // there (Debian's /etc/hosts) while the other hosts reach another one.
                    let any = match addr {
                        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                    };
                    let at = SocketAddr::new(any, addr.port());
                    let served = if self.job.is_some() {
                        bootstrap::listen(at, Some(*nonce), Some(self.nranks), timeout)
                    } else {
                        bootstrap::listen_unnamed(at, *nonce, self.nranks, timeout)
                    };
                    served.map_err(|e| {
                        Error::arg(
                            var,
                            format!("rank 0 cannot serve the bootstrap on {at}: {e}"),
                        )
                    })?;
                }
                Ok((id, None))
            }
            Rendezvous::File { path, nonce } if self.rank == 0 => {
                let p = publish(path, *nonce, self.nranks, bind_ip(cfg), timeout)?;
                Ok((p.id, Some(p)))
            }
            Rendezvous::File { path, nonce } => {
                let id = await_file(path, *nonce, Instant::now() + timeout.limit, timeout)?;
                Ok((id, None))
            }
        }
    }

    /// Join this job's communicator. Rank 0 of the file route returns once its file is gone
    /// (every rank has joined), so that a process exiting right after leaves no stale id.
    pub fn init(&self, cfg: &Config) -> Result<Comm> {
        let (id, published) = self.rendezvous(cfg)?;
        let device = self.local_rank.unwrap_or(self.rank);
        let comm = Comm::init_rank_on(self.nranks, &id, self.rank, cfg, device)?;
        if let Some(p) = published {
            p.finish(cfg.timeout);
        }
        Ok(comm)
    }
}
