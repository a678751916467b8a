//! The sender's TCP rails: one local address each (`--bind-interfaces`), the receiver's
//! address for each (the k-th of a comma list, else the one), sockets bound to the local
//! address before they connect, and the process-wide cooldown of rails that failed.
//!
//! A rail that failed (a write error, or no chunk written within `--rail-timeout` while
//! it had some in flight) rests: it is left out of the transfers that start within its
//! cooldown, 1 s after its first failure, doubling with each failure in a row up to
//! 60 s; once the cooldown is over it is tried again, and a transfer it carries to the
//! end clears its record.

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One rail: where its sockets start and where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rail {
    /// The local source address (`None`: the route's).
    pub local: Option<IpAddr>,
    pub remote: SocketAddr,
}

impl Rail {
    /// The name the reports give it: its local address, else the receiver's.
    pub fn label(&self) -> String {
        match self.local {
            Some(ip) => ip.to_string(),
            None => self.remote.ip().to_string(),
        }
    }
}

/// The rails of a sender: rail k is local address k with receiver address k (or the only
/// one). No local addresses: one rail per receiver address, from the route's source.
pub fn rails_of(remotes: &[SocketAddr], locals: &[IpAddr]) -> Result<Vec<Rail>, String> {
    if remotes.is_empty() {
        return Err("no receiver address".into());
    }
    let n = locals.len().max(remotes.len());
    if remotes.len() > 1 && !locals.is_empty() && locals.len() != remotes.len() {
        return Err(format!(
            "{} receiver addresses and {} --bind-interfaces: give one receiver address, or one per interface",
            remotes.len(),
            locals.len()
        ));
    }
    if n > super::frames::MAX_RAILS {
        return Err(format!(
            "{n} rails: at most {} over TCP",
            super::frames::MAX_RAILS
        ));
    }
    Ok((0..n)
        .map(|k| Rail {
            local: locals.get(k).copied(),
            remote: remotes[k.min(remotes.len() - 1)],
        })
        .collect())
}

/// Connect one socket of `rail` within `timeout`, bound to its local address first.
pub fn connect(rail: &Rail, timeout: Duration) -> io::Result<TcpStream> {
    let Some(local) = rail.local else {
        return super::socket::connect(rail.remote, timeout);
    };
    let socket = Socket::new(
        Domain::for_address(rail.remote),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket
        .bind(&SockAddr::from(SocketAddr::new(local, 0)))
        .map_err(|e| io::Error::new(e.kind(), format!("binding to {local}: {e}")))?;
    socket.connect_timeout(&SockAddr::from(rail.remote), timeout)?;
    let stream: TcpStream = socket.into();
    super::socket::prepare(&stream, timeout)?;
    Ok(stream)
}

/// Connect `per_rail` sockets on each of `rails` at once (a rail that does not answer
/// costs its timeout once, not once per rail): each rail's sockets, or why not.
pub fn connect_all(
    rails: &[Rail],
    per_rail: u16,
    timeout: Duration,
) -> Vec<Result<Vec<TcpStream>, String>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = rails
            .iter()
            .map(|rail| {
                scope.spawn(move || {
                    (0..per_rail)
                        .map(|_| connect(rail, timeout))
                        .collect::<io::Result<Vec<_>>>()
                        .map_err(|e| connect_words(&e, timeout))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("its connecting thread panicked".into()))
            })
            .collect()
    })
}

/// Why a connection did not open, in words.
pub fn connect_words(e: &io::Error, timeout: Duration) -> String {
    match e.kind() {
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
            "no connection within {}",
            crate::rdma::format_duration(timeout)
        ),
        _ => format!("cannot connect: {e}"),
    }
}

/// A rail's record of failures in a row.
#[derive(Debug, Clone, Copy)]
struct Record {
    failures: u32,
    until: Instant,
}

/// The first cooldown, and the longest.
const FIRST_COOLDOWN: Duration = Duration::from_secs(1);
const MAX_COOLDOWN: Duration = Duration::from_secs(60);

/// The cooldown after `failures` failures in a row: 1 s, 2 s, 4 s, ... at most 60 s.
pub fn cooldown(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(6);
    (FIRST_COOLDOWN * (1u32 << doublings)).min(MAX_COOLDOWN)
}

/// Failures in a row per rail (by its label), for this process.
#[derive(Default)]
pub struct Cooldowns(Mutex<HashMap<String, Record>>);

impl Cooldowns {
    /// The one of this process.
    pub fn global() -> &'static Cooldowns {
        static GLOBAL: std::sync::OnceLock<Cooldowns> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(Cooldowns::default)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Record>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What is left of `label`'s cooldown at `now` (`None`: it may carry chunks).
    pub fn resting(&self, label: &str, now: Instant) -> Option<Duration> {
        let left = self.map().get(label)?.until.checked_duration_since(now)?;
        (!left.is_zero()).then_some(left)
    }

    /// `label` failed at `now`: its cooldown, doubled from the last one.
    pub fn failed(&self, label: &str, now: Instant) -> Duration {
        let mut map = self.map();
        let failures = map.get(label).map_or(0, |r| r.failures) + 1;
        let rest = cooldown(failures);
        map.insert(
            label.to_string(),
            Record {
                failures,
                until: now + rest,
            },
        );
        rest
    }

    /// `label` carried a transfer to its end: its record is cleared.
    pub fn worked(&self, label: &str) {
        self.map().remove(label);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rails_pair_local_and_receiver_addresses() {
        let a: SocketAddr = "10.71.1.2:7471".parse().unwrap();
        let b: SocketAddr = "10.71.2.2:7471".parse().unwrap();
        let l1: IpAddr = "10.71.1.1".parse().unwrap();
        let l2: IpAddr = "10.71.2.1".parse().unwrap();
        let both = rails_of(&[a, b], &[l1, l2]).unwrap();
        assert_eq!(
            both[1],
            Rail {
                local: Some(l2),
                remote: b
            }
        );
        let one_remote = rails_of(&[a], &[l1, l2]).unwrap();
        assert_eq!(one_remote[1].remote, a);
        let no_locals = rails_of(&[a, b], &[]).unwrap();
        assert_eq!((no_locals.len(), no_locals[1].local), (2, None));
        assert_eq!(no_locals[1].label(), "10.71.2.2");
        assert!(rails_of(&[a, b], &[l1, l2, l1]).is_err());
        assert!(rails_of(&[], &[l1]).is_err());
    }

    #[test]
    fn a_failed_rail_rests_longer_each_time_and_a_good_transfer_clears_it() {
        assert_eq!(cooldown(1), Duration::from_secs(1));
        assert_eq!(cooldown(3), Duration::from_secs(4));
        assert_eq!(cooldown(40), Duration::from_secs(60));
        let c = Cooldowns::default();
        let t0 = Instant::now();
        assert_eq!(c.resting("10.0.0.1", t0), None);
        assert_eq!(c.failed("10.0.0.1", t0), Duration::from_secs(1));
        assert!(c.resting("10.0.0.1", t0).is_some());
        assert_eq!(c.resting("10.0.0.1", t0 + Duration::from_secs(1)), None);
        assert_eq!(c.failed("10.0.0.1", t0), Duration::from_secs(2));
        assert_eq!(c.resting("10.0.0.2", t0), None, "per rail");
        c.worked("10.0.0.1");
        assert_eq!(c.resting("10.0.0.1", t0), None);
        assert_eq!(c.failed("10.0.0.1", t0), Duration::from_secs(1));
    }
}
