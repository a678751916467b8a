//! `--allow CIDR[,CIDR...]`: the addresses a receiver serves. Checked on the peer's
//! address before anything else happens for it (no handshake slot, no read, no buffer).

use std::net::IpAddr;

/// The one address a peer is known by, for the allow-list, admission's counts and the
/// key's nonces alike (an IPv4 peer on a dual-stack socket arrives as `::ffff:a.b.c.d`).
pub fn peer_key(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

/// One network: `addr/prefix`; a bare address is the one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, peer_key(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - self.prefix as u32).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - self.prefix as u32).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Cidr, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("`{text}` is not an address or network (e.g. 10.0.0.0/8)"))?;
        let addr = peer_key(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("`{text}`: the prefix length must be 0..={max}"))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

/// The networks a receiver serves; empty: every address (the default).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<Cidr>);

impl AllowList {
    /// Parse `CIDR[,CIDR...]` (for clap).
    pub fn parse(text: &str) -> Result<AllowList, String> {
        let nets = text
            .split(',')
            .map(str::parse)
            .collect::<Result<Vec<Cidr>, String>>()?;
        Ok(AllowList(nets))
    }

    pub fn permits(&self, ip: IpAddr) -> bool {
        self.0.is_empty() || self.0.iter().any(|net| net.contains(ip))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks_hosts_and_mapped_addresses() {
        let list = AllowList::parse("10.0.0.0/8, 192.0.2.7,fd00::/16").unwrap();
        assert!(list.permits(ip("10.200.3.4")));
        assert!(list.permits(ip("192.0.2.7")));
        assert!(
            list.permits(ip("::ffff:10.1.1.1")),
            "IPv4 on a dual-stack socket"
        );
        assert!(list.permits(ip("fd00::2")));
        assert!(!list.permits(ip("192.0.2.8")));
        assert!(!list.permits(ip("11.0.0.1")));
        assert!(!list.permits(ip("::1")));
        assert!(AllowList::parse("0.0.0.0/0")
            .unwrap()
            .permits(ip("8.8.8.8")));
        assert!(
            AllowList::default().permits(ip("8.8.8.8")),
            "no list: everyone"
        );
    }

    #[test]
    fn bad_networks_are_refused_with_the_reason() {
        assert!(AllowList::parse("10.0.0.0/33")
            .unwrap_err()
            .contains("0..=32"));
        assert!(AllowList::parse("example.com")
            .unwrap_err()
            .contains("not an address"));
        assert!(AllowList::parse("10.0.0.1,").is_err());
    }
}
