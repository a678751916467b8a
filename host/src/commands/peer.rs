//! The receiver's address as the command line gives it: an IP or a host name, or a
//! comma list of them (one per TCP rail), with the port.

use anyhow::{Context, Result};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// The receiver's address; of a comma list (one per TCP rail), the first.
pub fn resolve_peer(host: &str, port: u16) -> Result<SocketAddr> {
    resolve_one(host.split(',').next().unwrap_or(host), port)
}

/// Every address of `<IP>` (a comma list over TCP rails).
pub fn resolve_all(host: &str, port: u16) -> Result<Vec<SocketAddr>> {
    host.split(',')
        .map(|h| resolve_one(h.trim(), port))
        .collect()
}

fn resolve_one(host: &str, port: u16) -> Result<SocketAddr> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve host name `{host}`"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .with_context(|| format!("host name `{host}` has no address"))
}
