//! `tracepass launch`: one process per rank on this machine, with the torchrun environment, so
//! `tracepass launch --nproc-per-node 8 -- train --device cuda` needs no torchrun.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("--nproc-per-node must be at least 1")]
    NoProcs,
    #[error("could not start rank {rank}: {error}")]
    Spawn { rank: usize, error: std::io::Error },
    #[error("rank {rank} exited with {status} (its messages are above, marked [rank {rank}]); the other ranks were stopped")]
    RankFailed { rank: usize, status: String },
    #[error("{0}")]
    NotDistributed(String),
    #[error("could not pick a free port on {addr}: {error}")]
    Port { addr: String, error: std::io::Error },
}

/// Refuses what would run as unsynchronized copies: only `train --device cuda` (one process per
/// GPU, NCCL between them) is a distributed run; CPU ranks are threads of one process.
pub fn check_args(args: &[String], nproc: usize) -> Result<(), LaunchError> {
    let sub = args.first().map(String::as_str).unwrap_or("");
    match sub {
        "rendezvous-check" => Ok(()),
        "train" => {
            let mut device = "cpu";
            for (i, a) in args.iter().enumerate() {
                if a == "--device" {
                    device = args.get(i + 1).map_or("", String::as_str);
                } else if let Some(d) = a.strip_prefix("--device=") {
                    device = d;
                }
            }
            if device == "cuda" {
                return Ok(());
            }
            // the same run as threads: the processes' count becomes the world size, unless
            // the command line gives one already
            let has_world_size = args
                .iter()
                .any(|a| a == "--world-size" || a.starts_with("--world-size="));
            let mut suggested = vec!["tracepass".to_string(), "train".to_string()];
            if !has_world_size {
                suggested.extend(["--world-size".to_string(), nproc.to_string()]);
            }
            suggested.extend(args[1..].iter().cloned());
            Err(LaunchError::NotDistributed(format!(
                "launch starts one process per GPU (`train --device cuda`); `train --device {device}` runs its ranks as threads of one process, so launched copies would each train alone: run `{}` instead",
                suggested.join(" ")
            )))
        }
        other => Err(LaunchError::NotDistributed(format!(
            "launch runs `train --device cuda` (one process per GPU); `{other}` is not a distributed command: run `tracepass {}` directly",
            args.join(" ")
        ))),
    }
}

/// Runs `args` (a tracepass subcommand line) as `nproc` processes with RANK, LOCAL_RANK,
/// WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; when one fails, the others are killed.
pub fn launch(
    nproc: usize,
    master_addr: &str,
    master_port: Option<u16>,
    args: &[String],
) -> Result<(), LaunchError> {
    if nproc == 0 {
        return Err(LaunchError::NoProcs);
    }
    let port = match master_port {
        Some(p) => p,
        None => std::net::TcpListener::bind((master_addr, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|error| LaunchError::Port {
                addr: master_addr.to_string(),
                error,
            })?,
    };
    let exe = std::env::current_exe().map_err(|error| LaunchError::Spawn { rank: 0, error })?;
    let mut children: Vec<Child> = Vec::with_capacity(nproc);
    let mut forwarders = Vec::with_capacity(nproc);
    let result = run_children(
        nproc,
        args,
        &exe,
        master_addr,
        port,
        &mut children,
        &mut forwarders,
    );
    for f in forwarders {
        let _ = f.join();
    }
    result
}

fn run_children(
    nproc: usize,
    args: &[String],
    exe: &std::path::Path,
    master_addr: &str,
    port: u16,
    children: &mut Vec<Child>,
    forwarders: &mut Vec<std::thread::JoinHandle<()>>,
) -> Result<(), LaunchError> {
    for rank in 0..nproc {
        let child = Command::new(exe)
            .args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", master_addr)
            .env("MASTER_PORT", port.to_string())
            .stderr(Stdio::piped())
            .spawn();
        match child {
            Ok(mut c) => {
                // each line of a rank's stderr marked with its rank, whole lines at a time
                if let Some(err) = c.stderr.take() {
                    forwarders.push(std::thread::spawn(move || {
                        for line in BufReader::new(err).lines().map_while(Result::ok) {
                            let _ = writeln!(std::io::stderr().lock(), "[rank {rank}] {line}");
                        }
                    }));
                }
                children.push(c)
            }
            Err(error) => {
                kill_all(children);
                return Err(LaunchError::Spawn { rank, error });
            }
        }
    }
    let mut done = vec![false; nproc];
    while done.iter().any(|d| !d) {
        for rank in 0..nproc {
            if done[rank] {
                continue;
            }
            match children[rank].try_wait() {
                Ok(Some(status)) if status.success() => done[rank] = true,
                Ok(Some(status)) => {
                    kill_all(children);
                    return Err(LaunchError::RankFailed {
                        rank,
                        status: status.to_string(),
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    kill_all(children);
                    return Err(LaunchError::RankFailed {
                        rank,
                        status: format!("an unknown state ({e})"),
                    });
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
    }
    for c in children.iter_mut() {
        let _ = c.wait();
    }
}
