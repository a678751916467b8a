//! How many sockets a TCP connection gets when the user does not say (`--streams auto`,
//! the default), as NCCL picks its sockets per connection from the machine rather than
//! asking: one socket moved 4.4 GB/s GPU to GPU on the H200's loopback, four 15, eight 24
//! (`docs/measurements.md`), so a user who never heard of `--streams` should not be left
//! at one.
//!
//! The rule, a pure function of facts read once ([`StreamFacts::here`]):
//! - each stream costs a writer thread on the sender and a reader on the receiver, so at
//!   most half the cores (at least one stream);
//! - the link decides how many are worth having: one per 25 Gbit/s of the interface the
//!   route to the receiver leaves by (a socket carries about that on real NICs), all 8
//!   to the same machine (loopback: memory copies, no wire), 4 where the speed is not
//!   known (a virtual interface says none);
//! - never more than 8 (no gain measured beyond).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::Path;

/// The most streams `--streams auto` picks.
pub const AUTO_MAX_STREAMS: u16 = 8;
/// What one socket is taken to carry on a real link, in Mbit/s.
pub const MBPS_PER_STREAM: u64 = 25_000;
/// Streams for a link whose speed is not known.
const UNKNOWN_LINK_STREAMS: u16 = 4;

/// Where the route to the receiver leaves this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// The receiver is this machine.
    Loopback,
    /// An interface, with its speed in Mbit/s where it reports one.
    Link {
        interface: String,
        mbps: Option<u64>,
    },
    /// Not found; why.
    Unknown(String),
}

/// What the choice is made from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFacts {
    pub cores: usize,
    pub route: Route,
}

/// The streams chosen, and the reason in words (for the note the sender prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamChoice {
    pub streams: u16,
    pub why: String,
}

impl StreamFacts {
    /// This machine's cores and the route to `peer` (a connected UDP socket names the
    /// local address the kernel would send from; nothing is sent).
    pub fn here(peer: SocketAddr) -> StreamFacts {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        StreamFacts {
            cores,
            route: route_to(peer, Path::new("/proc/net"), Path::new("/sys/class/net")),
        }
    }
}

/// `--streams auto`: see the module's rule.
pub fn choose_streams(facts: &StreamFacts) -> StreamChoice {
    let by_cores = u16::try_from(facts.cores / 2)
        .unwrap_or(u16::MAX)
        .clamp(1, AUTO_MAX_STREAMS);
    let (by_link, link) = match &facts.route {
        Route::Loopback => (AUTO_MAX_STREAMS, "the receiver is this machine".to_string()),
        Route::Link {
            interface,
            mbps: Some(mbps),
        } => (
            u16::try_from(mbps.div_ceil(MBPS_PER_STREAM))
                .unwrap_or(u16::MAX)
                .clamp(1, AUTO_MAX_STREAMS),
            format!("{interface} at {}", format_mbps(*mbps)),
        ),
        Route::Link {
            interface,
            mbps: None,
        } => (
            UNKNOWN_LINK_STREAMS,
            format!("{interface}, whose speed is not known"),
        ),
        Route::Unknown(why) => (
            UNKNOWN_LINK_STREAMS,
            format!("the link is not known: {why}"),
        ),
    };
    let streams = by_cores.min(by_link);
    let plural = |n: u16| if n == 1 { "" } else { "s" };
    StreamChoice {
        streams,
        why: format!(
            "{streams} TCP stream{} (--streams auto: {} core{} allow {by_cores}, {link}: {by_link}; --streams N to choose)",
            plural(streams),
            facts.cores,
            if facts.cores == 1 { "" } else { "s" },
        ),
    }
}

fn format_mbps(mbps: u64) -> String {
    if mbps >= 1000 && mbps.is_multiple_of(1000) {
        format!("{} Gbit/s", mbps / 1000)
    } else {
        format!("{mbps} Mbit/s")
    }
}

/// The route to `peer`: loopback when the kernel would send from `peer`'s own address or
/// a loopback one; else the interface of the longest matching prefix in the kernel's
/// routing table (`proc`/route, `proc`/ipv6_route) and its speed (`sys`/IF/speed).
fn route_to(peer: SocketAddr, proc: &Path, sys: &Path) -> Route {
    let bind: SocketAddr = match peer {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("an address"),
        SocketAddr::V6(_) => "[::]:0".parse().expect("an address"),
    };
    let local = UdpSocket::bind(bind)
        .and_then(|s| s.connect(peer).map(|()| s))
        .and_then(|s| s.local_addr());
    match local {
        Ok(local) if local.ip().is_loopback() || local.ip() == peer.ip() => Route::Loopback,
        Ok(_) => match interface_for(peer.ip(), proc) {
            Some(interface) => Route::Link {
                mbps: link_speed(sys, &interface),
                interface,
            },
            None => Route::Unknown(format!("no route to {} in the routing table", peer.ip())),
        },
        Err(e) => Route::Unknown(format!("no route to {}: {e}", peer.ip())),
    }
}

/// The interface of the most specific route to `ip` in the kernel's tables.
fn interface_for(ip: IpAddr, proc: &Path) -> Option<String> {
    match ip {
        IpAddr::V4(ip) => {
            let text = std::fs::read_to_string(proc.join("route")).ok()?;
            best_v4_route(&text, u32::from(ip))
        }
        IpAddr::V6(ip) => {
            let text = std::fs::read_to_string(proc.join("ipv6_route")).ok()?;
            best_v6_route(&text, u128::from(ip))
        }
    }
}

/// `/proc/net/route`: a header line, then `Iface Destination Gateway Flags RefCnt Use
/// Metric Mask ...`, addresses in hex as the kernel stores them (little-endian on x86).
fn best_v4_route(text: &str, ip: u32) -> Option<String> {
    let mut best: Option<(u32, String)> = None;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(iface), Some(dest), Some(mask)) = (f.first(), f.get(1), f.get(7)) else {
            continue;
        };
        // The kernel prints the address's four bytes in memory (network) order as one
        // native-endian word: from_be turns it into the address's number.
        let parse = |h: &str| u32::from_str_radix(h, 16).ok().map(u32::from_be);
        let (Some(dest), Some(mask)) = (parse(dest), parse(mask)) else {
            continue;
        };
        if ip & mask == dest & mask
            && best
                .as_ref()
                .is_none_or(|(m, _)| mask.count_ones() > m.count_ones())
        {
            best = Some((mask, iface.to_string()));
        }
    }
    best.map(|(_, iface)| iface)
}

/// `/proc/net/ipv6_route`: `dest prefixlen src srclen nexthop metric refcnt use flags
/// iface`, addresses as 32 hex digits.
fn best_v6_route(text: &str, ip: u128) -> Option<String> {
    let mut best: Option<(u32, String)> = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(dest), Some(len), Some(iface)) = (f.first(), f.get(1), f.get(9)) else {
            continue;
        };
        let (Ok(dest), Ok(len)) = (u128::from_str_radix(dest, 16), u32::from_str_radix(len, 16))
        else {
            continue;
        };
        if len > 128 || *iface == "lo" {
            continue;
        }
        let mask = if len == 0 {
            0
        } else {
            u128::MAX << (128 - len)
        };
        if ip & mask == dest & mask && best.as_ref().is_none_or(|(l, _)| len > *l) {
            best = Some((len, iface.to_string()));
        }
    }
    best.map(|(_, iface)| iface)
}

/// `sys`/IF/speed in Mbit/s; none for interfaces that report none (virtual ones say -1
/// or refuse the read).
fn link_speed(sys: &Path, interface: &str) -> Option<u64> {
    let text = std::fs::read_to_string(sys.join(interface).join("speed")).ok()?;
    text.trim()
        .parse::<i64>()
        .ok()
        .filter(|&s| s > 0)
        .map(|s| s as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(cores: usize, route: Route) -> StreamFacts {
        StreamFacts { cores, route }
    }

    fn link(mbps: Option<u64>) -> Route {
        Route::Link {
            interface: "eth0".into(),
            mbps,
        }
    }

    #[test]
    fn cores_and_the_link_each_bound_the_streams() {
        let n = |f: StreamFacts| choose_streams(&f).streams;
        // The H200 host: 16 cores, loopback: 8 (24 GB/s measured there).
        assert_eq!(n(facts(16, Route::Loopback)), 8);
        // This project's 2-core build machine: one stream whatever the link.
        assert_eq!(n(facts(2, Route::Loopback)), 1);
        assert_eq!(n(facts(1, Route::Loopback)), 1);
        assert_eq!(n(facts(2, link(Some(400_000)))), 1);
        // 10 and 25 GbE: one; 100 Gbit/s: 4; 200 and 400: 8 (the cap).
        assert_eq!(n(facts(64, link(Some(10_000)))), 1);
        assert_eq!(n(facts(64, link(Some(25_000)))), 1);
        assert_eq!(n(facts(64, link(Some(100_000)))), 4);
        assert_eq!(n(facts(64, link(Some(200_000)))), 8);
        assert_eq!(n(facts(64, link(Some(400_000)))), 8);
        assert_eq!(n(facts(64, link(Some(1)))), 1);
        // Unknown speed: 4, within the cores.
        assert_eq!(n(facts(64, link(None))), 4);
        assert_eq!(n(facts(6, Route::Unknown("x".into()))), 3);
        assert_eq!(n(facts(usize::MAX, link(Some(u64::MAX)))), 8);
    }

    #[test]
    fn the_reason_names_both_bounds() {
        let c = choose_streams(&facts(16, link(Some(100_000))));
        assert_eq!(
            c.why,
            "4 TCP streams (--streams auto: 16 cores allow 8, eth0 at 100 Gbit/s: 4; --streams N to choose)"
        );
        let c = choose_streams(&facts(2, Route::Loopback));
        assert_eq!(
            c.why,
            "1 TCP stream (--streams auto: 2 cores allow 1, the receiver is this machine: 8; --streams N to choose)"
        );
    }

    #[test]
    fn the_most_specific_route_names_the_interface() {
        // A default route via eth0, 10.1.0.0/16 on ib0, 10.1.2.0/24 on ens1 (bytes as
        // the kernel writes them on a little-endian machine).
        let table =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
            eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
            ib0\t0000010A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
            ens1\t0002010A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let v4 = |s: &str| u32::from(s.parse::<std::net::Ipv4Addr>().unwrap());
        if cfg!(target_endian = "little") {
            assert_eq!(
                best_v4_route(table, v4("10.1.2.7")).as_deref(),
                Some("ens1")
            );
            assert_eq!(best_v4_route(table, v4("10.1.9.7")).as_deref(), Some("ib0"));
            assert_eq!(best_v4_route(table, v4("8.8.8.8")).as_deref(), Some("eth0"));
        }
        assert_eq!(best_v4_route("Iface\n", v4("8.8.8.8")), None);
        let v6 = "fd000000000000000000000000000000 08 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth1\n\
            fd000000000000010000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     ib1\n\
            00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000001 00000000 00200001       lo\n";
        let ip6 = |s: &str| u128::from(s.parse::<std::net::Ipv6Addr>().unwrap());
        assert_eq!(
            best_v6_route(v6, ip6("fd00:0:0:1::5")).as_deref(),
            Some("ib1")
        );
        assert_eq!(best_v6_route(v6, ip6("fd00:9::5")).as_deref(), Some("eth1"));
        assert_eq!(best_v6_route(v6, ip6("2001:db8::1")), None);
    }

    #[test]
    fn a_link_speed_is_read_only_where_the_interface_reports_one() {
        let dir = std::env::temp_dir().join(format!("streams-sysfs-{}", std::process::id()));
        for (iface, speed) in [("eth0", "100000\n"), ("veth0", "-1\n"), ("bad", "x")] {
            std::fs::create_dir_all(dir.join(iface)).unwrap();
            std::fs::write(dir.join(iface).join("speed"), speed).unwrap();
        }
        assert_eq!(link_speed(&dir, "eth0"), Some(100_000));
        assert_eq!(link_speed(&dir, "veth0"), None);
        assert_eq!(link_speed(&dir, "bad"), None);
        assert_eq!(link_speed(&dir, "missing"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_receiver_on_this_machine_is_loopback() {
        let none = Path::new("/nonexistent");
        assert_eq!(
            route_to("127.0.0.1:7471".parse().unwrap(), none, none),
            Route::Loopback
        );
    }
}
