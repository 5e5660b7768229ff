//! `tracepass launch`: one process per rank on this machine, with the torchrun environment, so
//! `tracepass launch --nproc-per-node 8 -- train --device cuda` needs no torchrun.

use std::process::{Child, Command};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("--nproc-per-node must be at least 1")]
    NoProcs,
    #[error("could not start rank {rank}: {error}")]
    Spawn { rank: usize, error: std::io::Error },
    #[error("rank {rank} exited with {status}; the other ranks were stopped")]
    RankFailed { rank: usize, status: String },
    #[error("could not pick a free port on {addr}: {error}")]
    Port { addr: String, error: std::io::Error },
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
    for rank in 0..nproc {
        let child = Command::new(&exe)
            .args(args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("WORLD_SIZE", nproc.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("MASTER_ADDR", master_addr)
            .env("MASTER_PORT", port.to_string())
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(error) => {
                kill_all(&mut children);
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
                    kill_all(&mut children);
                    return Err(LaunchError::RankFailed {
                        rank,
                        status: status.to_string(),
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    kill_all(&mut children);
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
