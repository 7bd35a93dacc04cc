//! How fabricoll-perf gets its ranks where no launcher started it (`coll::launch` reads a
//! launcher's environment): it forks them itself, bound to CPUs as `--bind` says, and runs
//! their bootstrap root.
use crate::args::{Args, Bind};
use nccl_net_fabricoll::coll::bootstrap;
use nccl_net_fabricoll::coll::placement::{allowed_cpus, bind_to};
use nccl_net_fabricoll::config::Config;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};
use std::time::Duration;

/// The CPU of each rank under `bind`, from the CPUs this process may run on.
pub fn bind_plan(bind: Bind, ranks: usize, cpus: &[usize]) -> Vec<Option<usize>> {
    match bind {
        Bind::Core if ranks <= cpus.len() => cpus[..ranks].iter().map(|c| Some(*c)).collect(),
        Bind::RoundRobin if !cpus.is_empty() => {
            (0..ranks).map(|r| Some(cpus[r % cpus.len()])).collect()
        }
        _ => vec![None; ranks],
    }
}

/// Forks `a.ranks` copies of this program with the same `argv`, each told its rank, and runs
/// the bootstrap root here; waits for them all, and stops the others when one fails.
pub fn fork_ranks(a: &Args, argv: &[String], cfg: &Config) -> ExitCode {
    let timeout = cfg.timeout_setting();
    let id = match bootstrap::new_unique_id(bootstrap::default_bind_ip(cfg), timeout) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("fabricoll-perf: {e}");
            return ExitCode::from(1);
        }
    };
    let exe = std::env::current_exe().expect("own path");
    let cpus = allowed_cpus();
    let plan = bind_plan(a.bind, a.ranks, &cpus);
    match (a.bind, plan.first().copied().flatten()) {
        (Bind::RoundRobin, Some(_)) => println!(
            "# binding: rank i on CPU i mod {} of CPUs {cpus:?} (--bind rr)",
            cpus.len()
        ),
        (_, Some(_)) => println!(
            "# binding: rank i on the i-th of CPUs {:?} (--bind core)",
            &cpus[..a.ranks]
        ),
        (Bind::None, None) => println!("# binding: none (--bind none)"),
        (_, None) => {
            println!("# binding: none ({} ranks, {} CPUs)", a.ranks, cpus.len())
        }
    }
    let mut kids = Vec::new();
    for (r, cpu) in plan.into_iter().enumerate() {
        let mut cmd = Command::new(&exe);
        cmd.args(argv)
            .env("FABRICOLL_RANK", r.to_string())
            .env("FABRICOLL_NRANKS", a.ranks.to_string())
            .env("FABRICOLL_UNIQUE_ID", id.to_hex())
            .env_remove("RANK");
        if let Some(cpu) = cpu {
            // SAFETY: the closure runs in the forked child before exec and makes only
            // async-signal-safe calls (`bind_to` allocates nothing; one system call).
            unsafe {
                cmd.pre_exec(move || bind_to(&[cpu]));
            }
        }
        match cmd.spawn() {
            Ok(k) => kids.push(k),
            Err(e) => {
                eprintln!("fabricoll-perf: cannot start rank {r}: {e}");
                for k in &mut kids {
                    let _ = k.kill();
                }
                return ExitCode::from(1);
            }
        }
    }
    // Wait for all ranks; the first that fails takes the others down with it, rather
    // than leaving them to wait for it until FABRICOLL_TIMEOUT_MS.
    let mut ok = true;
    let mut left: Vec<(usize, std::process::Child)> = kids.into_iter().enumerate().collect();
    while !left.is_empty() {
        let mut i = 0;
        while i < left.len() {
            match left[i].1.try_wait() {
                Ok(Some(s)) => {
                    let (r, _) = left.remove(i);
                    if !s.success() {
                        eprintln!(
                            "fabricoll-perf: rank {r} exited with {s}; stopping the other ranks"
                        );
                        ok = false;
                        for (_, k) in left.iter_mut() {
                            let _ = k.kill();
                        }
                    }
                }
                Ok(None) => i += 1,
                Err(e) => {
                    eprintln!("fabricoll-perf: rank {}: {e}", left[i].0);
                    ok = false;
                    left.remove(i);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_bind_one_per_cpu_only_when_every_rank_has_one() {
        let cpus = [2, 5, 7];
        assert_eq!(bind_plan(Bind::Core, 2, &cpus), vec![Some(2), Some(5)]);
        assert_eq!(
            bind_plan(Bind::Core, 3, &cpus),
            vec![Some(2), Some(5), Some(7)]
        );
        assert_eq!(bind_plan(Bind::Core, 4, &cpus), vec![None; 4]);
        assert_eq!(
            bind_plan(Bind::RoundRobin, 5, &cpus),
            vec![Some(2), Some(5), Some(7), Some(2), Some(5)]
        );
        assert_eq!(bind_plan(Bind::RoundRobin, 1, &[]), vec![None]);
        assert_eq!(bind_plan(Bind::None, 2, &cpus), vec![None; 2]);
        assert_eq!(bind_plan(Bind::Core, 1, &[]), vec![None]);
        let here = allowed_cpus();
        assert!(!here.is_empty(), "this process runs on some CPU");
        assert!(here.windows(2).all(|w| w[0] < w[1]));
    }
}
