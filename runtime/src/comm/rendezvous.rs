//! The torchrun-style environment of one process rank, and the TCP rendezvous that hands rank
//! 0's NCCL unique id to every other rank (on MASTER_ADDR:MASTER_PORT).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`.
#[derive(Clone, Debug, PartialEq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("environment variable {name}={value:?}: {reason}")]
    Env {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("rendezvous on {addr}: {message}")]
    Net { addr: String, message: String },
    #[error("rendezvous on {addr}: rank(s) {missing:?} did not arrive within {secs:.1} s")]
    Missing {
        addr: String,
        missing: Vec<usize>,
        secs: f64,
    },
    #[error(
        "rendezvous on {addr}: rank {rank} could not reach rank 0 within {secs:.1} s ({last})"
    )]
    Unreachable {
        addr: String,
        rank: usize,
        secs: f64,
        last: String,
    },
}

const HELLO: &[u8; 6] = b"TPRV1 ";

impl DistEnv {
    /// Reads the torchrun variables; without `WORLD_SIZE` the process is a single rank 0.
    pub fn from_env() -> Result<DistEnv, RendezvousError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like `from_env`, reading variables through `get` (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<DistEnv, RendezvousError> {
        fn num<T: std::str::FromStr>(
            name: &'static str,
            v: Option<String>,
            default: T,
        ) -> Result<T, RendezvousError> {
            match v {
                None => Ok(default),
                Some(s) => s.trim().parse().map_err(|_| RendezvousError::Env {
                    name,
                    value: s.clone(),
                    reason: "not a number".into(),
                }),
            }
        }
        let world_size: usize = num("WORLD_SIZE", get("WORLD_SIZE"), 1)?;
        let rank: usize = num("RANK", get("RANK"), 0)?;
        let local_rank: usize = num("LOCAL_RANK", get("LOCAL_RANK"), rank)?;
        let master_port: u16 = num("MASTER_PORT", get("MASTER_PORT"), 29500)?;
        let master_addr = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        if world_size == 0 {
            return Err(RendezvousError::Env {
                name: "WORLD_SIZE",
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        if rank >= world_size {
            return Err(RendezvousError::Env {
                name: "RANK",
                value: rank.to_string(),
                reason: format!("must be below WORLD_SIZE={world_size}"),
            });
        }
        Ok(DistEnv {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
        })
    }

    fn addr(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

fn net(addr: &str) -> impl Fn(std::io::Error) -> RendezvousError + '_ {
    move |e| RendezvousError::Net {
        addr: addr.to_string(),
        message: e.to_string(),
    }
}

/// Rank 0 sends `payload` (its NCCL unique id) to every other rank; every rank returns it.
/// Ranks that never arrive (or a rank 0 that never listens) are an error after `timeout`.
pub fn exchange(
    env: &DistEnv,
    payload: Option<&[u8]>,
    timeout: Duration,
) -> Result<Vec<u8>, RendezvousError> {
    let addr = env.addr();
    let now = Instant::now();
    // a timeout too long for an Instant waits as long as one can
    let deadline = now
        .checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now);
    if env.rank == 0 {
        let payload = payload.ok_or_else(|| RendezvousError::Net {
            addr: addr.clone(),
            message: "rank 0 has no id to hand out".into(),
        })?;
        if env.world_size == 1 {
            return Ok(payload.to_vec());
        }
        let listener = TcpListener::bind(&addr).map_err(net(&addr))?;
        listener.set_nonblocking(true).map_err(net(&addr))?;
        let mut arrived = vec![false; env.world_size];
        arrived[0] = true;
        while arrived.iter().any(|a| !a) {
            if Instant::now() >= deadline {
                return Err(RendezvousError::Missing {
                    addr,
                    missing: (0..env.world_size).filter(|r| !arrived[*r]).collect(),
                    secs: timeout.as_secs_f64(),
                });
            }
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).map_err(net(&addr))?;
                    s.set_read_timeout(Some(Duration::from_secs(5)))
                        .map_err(net(&addr))?;
                    let mut hello = [0u8; 14];
                    if s.read_exact(&mut hello).is_err() || &hello[..6] != HELLO {
                        continue; // not one of ours
                    }
                    let r =
                        u64::from_le_bytes(hello[6..14].try_into().unwrap_or([0xff; 8])) as usize;
                    if r == 0 || r >= env.world_size || arrived[r] {
                        return Err(RendezvousError::Net {
                            addr,
                            message: format!(
                                "a peer announced rank {r}, which is invalid or taken"
                            ),
                        });
                    }
                    let mut msg = (payload.len() as u64).to_le_bytes().to_vec();
                    msg.extend_from_slice(payload);
                    s.write_all(&msg).map_err(net(&addr))?;
                    arrived[r] = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Err(e) => return Err(net(&addr)(e)),
            }
        }
        return Ok(payload.to_vec());
    }
    let target: Vec<SocketAddr> = addr.to_socket_addrs().map_err(net(&addr))?.collect();
    let mut last = String::from("no attempt");
    loop {
        if Instant::now() >= deadline {
            return Err(RendezvousError::Unreachable {
                addr,
                rank: env.rank,
                secs: timeout.as_secs_f64(),
                last,
            });
        }
        let attempt = (|| -> std::io::Result<Vec<u8>> {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            let sock = target
                .first()
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))?;
            let mut s = TcpStream::connect_timeout(sock, left.min(Duration::from_secs(2)))?;
            s.set_read_timeout(Some(left))?;
            let mut hello = HELLO.to_vec();
            hello.extend_from_slice(&(env.rank as u64).to_le_bytes());
            s.write_all(&hello)?;
            let mut len = [0u8; 8];
            s.read_exact(&mut len)?;
            let n = u64::from_le_bytes(len) as usize;
            if n > 1 << 20 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "id larger than 1 MiB",
                ));
            }
            let mut buf = vec![0u8; n];
            s.read_exact(&mut buf)?;
            Ok(buf)
        })();
        match attempt {
            Ok(b) => return Ok(b),
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(rank: usize, world: usize, port: u16) -> DistEnv {
        DistEnv {
            rank,
            world_size: world,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            master_port: port,
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(29599)
    }

    #[test]
    fn env_is_read_and_checked() {
        let e = DistEnv::from_lookup(|k| match k {
            "RANK" => Some("2".into()),
            "WORLD_SIZE" => Some("4".into()),
            "MASTER_PORT" => Some("1234".into()),
            _ => None,
        })
        .expect("valid");
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.master_port),
            (2, 4, 2, 1234)
        );
        let bad = DistEnv::from_lookup(|k| {
            (k == "RANK")
                .then(|| "4".into())
                .or((k == "WORLD_SIZE").then(|| "4".into()))
        });
        assert!(bad
            .expect_err("rank too big")
            .to_string()
            .contains("RANK=\"4\": must be below WORLD_SIZE=4"));
        let bad = DistEnv::from_lookup(|k| (k == "MASTER_PORT").then(|| "http".into()));
        assert!(bad
            .expect_err("not a number")
            .to_string()
            .contains("MASTER_PORT"));
    }

    #[test]
    fn a_rank_that_never_comes_is_named() {
        let port = free_port();
        let t = Instant::now();
        let e = exchange(&env(0, 3, port), Some(b"id"), Duration::from_millis(300))
            .expect_err("ranks missing");
        assert!(t.elapsed() < Duration::from_secs(5));
        assert!(
            e.to_string().contains("rank(s) [1, 2] did not arrive"),
            "{e}"
        );
        let e = exchange(&env(1, 2, free_port()), None, Duration::from_millis(200))
            .expect_err("no root");
        assert!(
            e.to_string().contains("rank 1 could not reach rank 0"),
            "{e}"
        );
    }
}
