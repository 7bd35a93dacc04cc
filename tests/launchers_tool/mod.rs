//! `fabricoll-info --unique-id` as a job's root: it serves until every rank joined, gives up
//! at its deadline, refuses a rank of another size and bad arguments, and lets a shell take
//! the id while it serves on.
use super::*;
use std::io::{BufRead, BufReader};

/// Start `fabricoll-info --unique-id` with `args`; returns it and the id it printed.
fn id_tool(args: &[&str], timeout_ms: &str) -> (Child, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fabricoll-info"));
    c.arg("--unique-id").args(args);
    for v in LAUNCHER_VARS {
        c.env_remove(v);
    }
    let mut tool = c
        .env("FABRICOLL_TIMEOUT_MS", timeout_ms)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(tool.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (tool, line.trim().to_string())
}

/// The tool's exit code and stderr, waiting at most `deadline`.
fn tool_end(mut tool: Child, deadline: Duration) -> (Option<i32>, String) {
    let end = Instant::now() + deadline;
    let code = loop {
        if let Ok(Some(s)) = tool.try_wait() {
            break s.code();
        }
        if Instant::now() > end {
            let _ = tool.kill();
            let _ = tool.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut e) = tool.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (code, err)
}

#[test]
fn a_unique_id_from_the_tool_serves_until_every_rank_joined() {
    let (tool, id) = id_tool(&["--ranks", "2", "--bind", "127.0.0.1"], "60000");
    assert!(
        id.len() > 16 && id.chars().all(|c| c.is_ascii_hexdigit()),
        "{id:?}"
    );
    let done = job_ok(
        "unique-id",
        2,
        |r| {
            env(&[
                ("SLURM_PROCID", &r.to_string()),
                ("SLURM_NTASKS", "2"),
                ("FABRICOLL_UNIQUE_ID", &id),
            ])
        },
        "Slurm (SLURM_PROCID 0 of SLURM_NTASKS 2)",
    );
    assert!(
        done[0].out.contains("(FABRICOLL_UNIQUE_ID)"),
        "{}",
        done[0].out
    );
    let (code, err) = tool_end(tool, FAST);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("every rank joined"), "{err}");
}

#[test]
fn the_tool_gives_up_at_its_deadline_and_refuses_a_wrong_size() {
    // Nobody comes: exit 1 at FABRICOLL_TIMEOUT_MS, saying so.
    let (tool, _) = id_tool(&["--ranks", "2", "--bind", "127.0.0.1:0"], "300");
    let (code, err) = tool_end(tool, FAST);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("FABRICOLL_TIMEOUT_MS"), "{err}");
    // A rank of another size is refused, naming the size.
    let (tool, id) = id_tool(&["--ranks", "3", "--bind", "127.0.0.1"], "5000");
    let (done, dir) = perf_job(
        "tool-size",
        1,
        |_| {
            env(&[
                ("FABRICOLL_RANK", "0"),
                ("FABRICOLL_NRANKS", "1"),
                ("FABRICOLL_UNIQUE_ID", &id),
            ])
        },
        FAST,
    );
    assert_eq!(done[0].code, Some(1), "{:?}", done[0]);
    assert!(
        done[0].err.contains("nranks") && done[0].err.contains("3 ranks"),
        "{}",
        done[0].err
    );
    tool_end(tool, FAST);
    std::fs::remove_dir_all(dir).unwrap();
    // Bad arguments.
    for (args, says) in [
        (&["--ranks", "x"][..], "--ranks"),
        (&["--ranks"][..], "needs a value"),
        (&["--bind", "not a host"][..], "--bind"),
        (&["--frob"][..], "unknown argument"),
        (&["--ranks", "0"][..], "nranks"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_fabricoll-info"))
            .arg("--unique-id")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_shell_gets_the_id_while_the_tool_serves_on() {
    // `ID=$(fabricoll-info --unique-id ... &)` returns as soon as the id is printed.
    let t0 = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ID=$({} --unique-id --ranks 1 --bind 127.0.0.1 2>/dev/null &); echo \"$ID\"",
            env!("CARGO_BIN_EXE_fabricoll-info")
        ))
        .env("FABRICOLL_TIMEOUT_MS", "20000")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        t0.elapsed() < FAST,
        "the shell waited for the root: {:?}",
        t0.elapsed()
    );
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(id.len() > 16, "{out:?}");
    // The tool still serves: one rank joins it, and it ends.
    job_ok(
        "shell-id",
        1,
        |_| {
            env(&[
                ("FABRICOLL_RANK", "0"),
                ("FABRICOLL_NRANKS", "1"),
                ("FABRICOLL_UNIQUE_ID", &id),
            ])
        },
        "fabricoll",
    );
}
