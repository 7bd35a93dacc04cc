//! fabricoll-codec: the compression codec's speed on one core.
//!
//! `fabricoll-codec [--count N] [--block K] [--secs S]` prints, per wire format, the GB/s of f32
//! input (4 bytes per element) through quantize, dequantize, and dequantize-and-accumulate, and
//! of the pipeline a compressed reduction runs per element: quantize + accumulate (the
//! "quantize + dequantize + reduce" figure). Each figure is the best of repeated rounds of about
//! S/10 seconds each, timed in this thread's CPU time (`/proc/thread-self/schedstat`), so that
//! other processes sharing the core do not lower it; wall time where that file is missing.
use nccl_net_fabricoll::compress::{Codec, Format, DEFAULT_BLOCK};
use std::time::{Duration, Instant};

/// This thread's CPU time in seconds (the first field of its schedstat), if the kernel has it.
fn cpu_secs() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 * 1e-9)
}

/// Seconds per element of `f`, best of rounds within `secs` (of CPU time where known).
fn time(secs: f64, n: usize, mut f: impl FnMut()) -> f64 {
    let now = || cpu_secs().unwrap_or_else(|| WALL.with(|w| w.elapsed().as_secs_f64()));
    let end = Instant::now() + Duration::from_secs_f64(secs * 20.0);
    let (start, mut best) = (now(), f64::INFINITY);
    while (now() - start < secs && Instant::now() < end) || best.is_infinite() {
        let t = now();
        let mut reps = 0;
        while now() - t < secs / 10.0 || reps == 0 {
            f();
            reps += 1;
        }
        best = best.min((now() - t) / reps as f64 / n as f64);
    }
    best
}

thread_local! {
    static WALL: Instant = Instant::now();
}

fn main() -> std::process::ExitCode {
    let mut count = 1usize << 18;
    let mut block = DEFAULT_BLOCK;
    let mut secs = 1.0;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it.next();
        let parsed = v.as_deref().and_then(|v| v.parse::<f64>().ok());
        match (a.as_str(), parsed) {
            ("--count", Some(x)) if x >= 1.0 => count = x as usize,
            ("--block", Some(x)) if x >= 1.0 => block = x as usize,
            ("--secs", Some(x)) if x > 0.0 => secs = x,
            _ => {
                eprintln!(
                    "usage: fabricoll-codec [--count N>=1] [--block K>=1] [--secs S>0] (got '{a}')"
                );
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let x: Vec<f32> = (0..count)
        .map(|i| ((i as f32) * 0.618_034).sin() * (1.0 + (i % 97) as f32))
        .collect();
    println!(
        "# fabricoll-codec: {count} f32 elements ({} KiB), block {block}, one core ({}); GB/s of f32 input",
        count * 4 / 1024,
        if cpu_secs().is_some() { "thread CPU time" } else { "wall time" }
    );
    println!(
        "{:>8} {:>6} {:>9} {:>10} {:>11} {:>16}",
        "format", "ratio", "quantize", "dequantize", "accumulate", "quant+acc"
    );
    for f in Format::ALL.into_iter().filter(|f| *f != Format::Off) {
        let c = match Codec::new(f, block) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let mut wire = vec![0u8; c.wire_len(count)];
        let mut out = vec![0f32; count];
        let q = time(secs, count, || c.quantize(&x, &mut wire).expect("lengths"));
        let d = time(secs, count, || {
            c.dequantize(&wire, &mut out).expect("lengths")
        });
        let a = time(secs, count, || {
            c.accumulate(&wire, &mut out).expect("lengths")
        });
        let gbs = |s: f64| 4.0 / s / 1e9;
        println!(
            "{:>8} {:>6.2} {:>9.2} {:>10.2} {:>11.2} {:>16.2}",
            f.name(),
            (count * 4) as f64 / wire.len() as f64,
            gbs(q),
            gbs(d),
            gbs(a),
            gbs(q + a)
        );
    }
    std::process::ExitCode::SUCCESS
}
