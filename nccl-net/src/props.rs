//! The devices this plugin offers NCCL: network interfaces with an address, chosen by
//! `NCCL_SOCKET_IFNAME` like NCCL's own socket transport, else the first one that is up
//! and not loopback (else `lo`), with the facts `getProperties` reports from sysfs, and
//! the RDMA device behind each interface where the comms go over verbs.

use crate::config::Transport;
use crate::error::{NetError, Result};
use host::net::tcp::streams::{choose_streams, Route, StreamFacts};
use std::ffi::CString;
use std::net::IpAddr;
use std::path::Path;

/// The port speed reported when sysfs has none (many virtual NICs): 10 Gbit/s, NCCL's
/// own socket transport's default.
pub const DEFAULT_SPEED_MBPS: i32 = 10_000;
/// The speed reported for the loopback interface (sysfs has none): 400 Gbit/s. Loopback
/// has no line rate; its bytes move at memory speed, past what NCCL's channels draw from
/// it (this project's 8 streams moved 21-24 GB/s one way over `lo` on the H200). Told
/// Socket's 10 Gbit/s, NCCL's search takes 2 channels for collectives; told 400 Gbit/s,
/// 4 (NCCL 2.28.9 on an H100, two ranks on one GPU: `2 coll channels` up to 200 Gbit/s,
/// `4 coll channels` from 400; all_reduce 1.85 → 3.7 GB/s, all_gather 3.7 → 7.4;
/// `docs/measurements/h100/2026-12-07-thirteenth-session/`).
pub const LOOPBACK_SPEED_MBPS: i32 = 400_000;
/// NCCL_SOCKET_IFNAME may select up to this many interfaces (NCCL's `MAX_IFS`).
pub const MAX_DEVICES: usize = 16;

/// An interface as `getifaddrs` lists it (one entry per address).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub up: bool,
    pub loopback: bool,
    pub addr: IpAddr,
}

/// A device: the interface, the address to listen on, and what sysfs says.
#[derive(Debug)]
pub struct Device {
    pub name: CString,
    pub addr: IpAddr,
    /// `realpath /sys/class/net/IF/device`: the PCI function, or none (`lo`, bridges).
    pub pci_path: Option<CString>,
    pub speed_mbps: i32,
    /// Where `speed_mbps` comes from.
    pub speed_from: SpeedFrom,
    /// The RDMA device the interface belongs to, where the comms go over verbs
    /// (`NCCL_GRDMA_TRANSPORT`); none: TCP.
    pub rdma: Option<CString>,
}

/// Where a device's speed comes from: sysfs, or [`unknown_speed`]'s rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpeedFrom {
    Sysfs,
    /// `NCCL_GRDMA_SPEED`.
    Variable,
    /// [`LOOPBACK_SPEED_MBPS`].
    LoopbackDefault,
    /// [`DEFAULT_SPEED_MBPS`].
    Default,
}

impl SpeedFrom {
    /// For the init line of NCCL's log (`... Mbit/s from <this>`).
    pub fn words(self) -> &'static str {
        match self {
            SpeedFrom::Sysfs => "sysfs",
            SpeedFrom::Variable => "NCCL_GRDMA_SPEED",
            SpeedFrom::LoopbackDefault => "loopback's default",
            SpeedFrom::Default => "the default where sysfs has none",
        }
    }
}

impl Device {
    /// Whether the link's speed is known (sysfs gave it), not a default or a setting.
    pub fn speed_known(&self) -> bool {
        self.speed_from == SpeedFrom::Sysfs
    }
}

/// The data sockets of a comm listening on `device` when `NCCL_GRDMA_STREAMS` is unset,
/// and why in words: the host crate's `--streams auto` rule (one per two cores, one per
/// 25 Gbit/s of the link, 8 at most; 8 on loopback, 4 where the link's speed is not
/// known), so the command line and the plugin choose alike.
pub fn streams_for(device: &Device, cores: usize) -> (usize, String) {
    let route = if device.addr.is_loopback() {
        Route::Loopback
    } else {
        Route::Link {
            interface: device.name.to_string_lossy().into_owned(),
            mbps: device.speed_known().then_some(device.speed_mbps as u64),
        }
    };
    let choice = choose_streams(&StreamFacts { cores, route });
    (usize::from(choice.streams), choice.why)
}

/// The RDMA device whose port has `ip` (an RDMA CM id bound to it), if any.
pub fn rdma_device_of(ip: IpAddr) -> Option<String> {
    let channel = host::rdma::EventChannel::new().ok()?;
    let id = host::rdma::CmId::new(&channel).ok()?;
    id.bind(std::net::SocketAddr::new(ip, 0)).ok()?;
    id.device_name()
}

/// Which interfaces to use, from `getifaddrs`' entries and `NCCL_SOCKET_IFNAME`:
/// `eth,ib` (names starting so), `=eth0` (exact names), `^docker,lo` (all but those).
/// Each interface once, with its first IPv4 address (else its first IPv6 address that
/// is not link-local, which would need a scope), in the order listed. Without a spec:
/// the first interface that is up and neither loopback nor `docker*`, else loopback.
pub fn select(ifaces: &[Iface], spec: Option<&str>) -> Vec<Iface> {
    let mut names: Vec<&str> = Vec::new();
    for i in ifaces {
        if !names.contains(&i.name.as_str()) {
            names.push(&i.name);
        }
    }
    let addr_of = |name: &str| -> Option<&Iface> {
        let usable = |i: &&Iface| i.name == name && i.up;
        ifaces
            .iter()
            .filter(usable)
            .find(|i| i.addr.is_ipv4())
            .or_else(|| {
                ifaces.iter().filter(usable).find(|i| match i.addr {
                    IpAddr::V6(a) => (a.segments()[0] & 0xffc0) != 0xfe80,
                    IpAddr::V4(_) => false,
                })
            })
    };
    let usable: Vec<&Iface> = names.iter().filter_map(|n| addr_of(n)).collect();
    let chosen: Vec<&Iface> = match spec.map(str::trim).filter(|s| !s.is_empty()) {
        Some(spec) => {
            let (exclude, rest) = match spec.strip_prefix('^') {
                Some(r) => (true, r),
                None => (false, spec),
            };
            let (exact, rest) = match rest.strip_prefix('=') {
                Some(r) => (true, r),
                None => (false, rest),
            };
            let pats: Vec<&str> = rest
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .collect();
            let matches = |name: &str| {
                pats.iter().any(|p| {
                    if exact {
                        name == *p
                    } else {
                        name.starts_with(p)
                    }
                })
            };
            usable
                .into_iter()
                .filter(|i| matches(&i.name) != exclude)
                .collect()
        }
        None => {
            let first = usable
                .iter()
                .find(|i| !i.loopback && !i.name.starts_with("docker"))
                .or_else(|| usable.iter().find(|i| i.loopback));
            first.into_iter().copied().collect()
        }
    };
    chosen.into_iter().take(MAX_DEVICES).cloned().collect()
}

/// The port speed from `SYS/class/net/IF/speed` (Mbit/s), if there is a positive one.
pub fn sysfs_speed(sys: &Path, ifname: &str) -> Option<i32> {
    let s = std::fs::read_to_string(sys.join("class/net").join(ifname).join("speed")).ok()?;
    s.trim().parse::<i32>().ok().filter(|v| *v > 0)
}

/// `realpath SYS/class/net/IF/device`: the device's PCI path, none for virtual ones.
pub fn sysfs_pci_path(sys: &Path, ifname: &str) -> Option<String> {
    let p = std::fs::canonicalize(sys.join("class/net").join(ifname).join("device")).ok()?;
    p.to_str().map(str::to_owned)
}

/// Every interface with an address, from `getifaddrs(3)`.
pub fn list_interfaces() -> Result<Vec<Iface>> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(NetError::system(format!(
            "getifaddrs: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until
        // freeifaddrs; its name is a NUL-terminated string and its address, when not
        // null, a sockaddr of the family it names (sockaddr_in / sockaddr_in6).
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() && !ifa.ifa_name.is_null() {
                let family = (*ifa.ifa_addr).sa_family as i32;
                let addr = match family {
                    libc::AF_INET => {
                        let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        Some(IpAddr::from(
                            u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                        ))
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        Some(IpAddr::from(sin6.sin6_addr.s6_addr))
                    }
                    _ => None,
                };
                if let Some(addr) = addr {
                    let flags = ifa.ifa_flags;
                    out.push(Iface {
                        name: std::ffi::CStr::from_ptr(ifa.ifa_name)
                            .to_string_lossy()
                            .into_owned(),
                        up: flags & libc::IFF_UP as u32 != 0,
                        loopback: flags & libc::IFF_LOOPBACK as u32 != 0,
                        addr,
                    });
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `head` came from getifaddrs and is freed once, after the last use.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The speed told NCCL for an interface whose sysfs gives none, and where it comes from:
/// `NCCL_GRDMA_SPEED` (Mbit/s) where set, else [`LOOPBACK_SPEED_MBPS`] for loopback and
/// [`DEFAULT_SPEED_MBPS`] for the rest. A speed sysfs gives is never overridden. `get`
/// looks the variable up (the tests feed their own).
pub fn unknown_speed(
    loopback: bool,
    get: impl Fn(&str) -> Option<String>,
) -> Result<(i32, SpeedFrom)> {
    match get("NCCL_GRDMA_SPEED") {
        None if loopback => Ok((LOOPBACK_SPEED_MBPS, SpeedFrom::LoopbackDefault)),
        None => Ok((DEFAULT_SPEED_MBPS, SpeedFrom::Default)),
        Some(v) => match v.trim().parse::<i32>() {
            Ok(n) if n > 0 => Ok((n, SpeedFrom::Variable)),
            _ => Err(NetError::invalid(format!(
                "NCCL_GRDMA_SPEED={v:?}: expected Mbit/s (a positive whole number) for interfaces whose speed sysfs does not give"
            ))),
        },
    }
}

/// The devices of this machine under `NCCL_SOCKET_IFNAME` (`spec`), with sysfs facts.
pub fn discover(spec: Option<&str>, transport: Transport) -> Result<Vec<Device>> {
    let ifaces = list_interfaces()?;
    let chosen = select(&ifaces, spec);
    if chosen.is_empty() {
        return Err(NetError::system(match spec {
            Some(s) => {
                format!("no interface that is up and has an address matches NCCL_SOCKET_IFNAME={s}")
            }
            None => "no interface that is up and has an address".to_string(),
        }));
    }
    let sys = Path::new("/sys");
    chosen
        .into_iter()
        .map(|i| {
            let speed = sysfs_speed(sys, &i.name);
            let rdma = match transport {
                Transport::Tcp => None,
                _ => rdma_device_of(i.addr),
            };
            if transport == Transport::Verbs && rdma.is_none() {
                return Err(NetError::system(format!(
                    "NCCL_GRDMA_TRANSPORT=verbs: interface {} ({}) belongs to no RDMA device",
                    i.name, i.addr
                )));
            }
            let (speed_mbps, speed_from) = match speed {
                Some(mbps) => (mbps, SpeedFrom::Sysfs),
                None => unknown_speed(i.loopback, |k| std::env::var(k).ok())?,
            };
            Ok(Device {
                pci_path: sysfs_pci_path(sys, &i.name).and_then(|p| CString::new(p).ok()),
                speed_mbps,
                speed_from,
                addr: i.addr,
                name: CString::new(i.name).unwrap_or_default(),
                rdma: rdma.and_then(|r| CString::new(r).ok()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_follow_the_hosts_auto_rule() {
        let dev = |name: &str, addr: &str, mbps: Option<i32>| Device {
            name: std::ffi::CString::new(name).unwrap(),
            addr: addr.parse().unwrap(),
            pci_path: None,
            speed_mbps: mbps.unwrap_or(DEFAULT_SPEED_MBPS),
            speed_from: match mbps {
                Some(_) => SpeedFrom::Sysfs,
                None => SpeedFrom::Default,
            },
            rdma: None,
        };
        // The host's --streams auto rule: loopback 8, 25 Gbit/s a stream, cores / 2.
        assert_eq!(streams_for(&dev("lo", "127.0.0.1", None), 16).0, 8);
        assert_eq!(streams_for(&dev("lo", "127.0.0.1", None), 4).0, 2);
        assert_eq!(
            streams_for(&dev("eth0", "10.0.0.5", Some(100_000)), 64).0,
            4
        );
        assert_eq!(streams_for(&dev("eth0", "10.0.0.5", Some(10_000)), 64).0, 1);
        let (n, why) = streams_for(&dev("eth0", "10.0.0.5", None), 64);
        assert_eq!(n, 4, "{why}");
        assert!(why.contains("eth0, whose speed is not known"), "{why}");
    }

    fn ifc(name: &str, up: bool, addr: &str) -> Iface {
        Iface {
            name: name.into(),
            up,
            loopback: name == "lo",
            addr: addr.parse().unwrap(),
        }
    }

    fn names(v: &[Iface]) -> Vec<&str> {
        v.iter().map(|i| i.name.as_str()).collect()
    }

    fn machine() -> Vec<Iface> {
        vec![
            ifc("lo", true, "127.0.0.1"),
            ifc("lo", true, "::1"),
            ifc("docker0", true, "172.17.0.1"),
            ifc("eth0", false, "10.0.0.5"),
            ifc("eth1", true, "fe80::1"),
            ifc("eth1", true, "2001:db8::7"),
            ifc("ens5", true, "10.1.0.9"),
            ifc("ens5", true, "fe80::9"),
        ]
    }

    #[test]
    fn default_is_the_first_up_non_loopback_interface() {
        let got = select(&machine(), None);
        // eth0 is down; eth1 has only IPv6, link-local skipped for the global one.
        assert_eq!(names(&got), ["eth1"]);
        assert_eq!(got[0].addr, "2001:db8::7".parse::<IpAddr>().unwrap());
        let only_lo = vec![
            ifc("lo", true, "127.0.0.1"),
            ifc("docker0", true, "172.17.0.1"),
        ];
        assert_eq!(names(&select(&only_lo, None)), ["lo"]);
    }

    #[test]
    fn ifname_prefix_exact_and_exclude() {
        let m = machine();
        assert_eq!(names(&select(&m, Some("lo"))), ["lo"]);
        assert_eq!(
            select(&m, Some("lo"))[0].addr,
            "127.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(names(&select(&m, Some("e"))), ["eth1", "ens5"]);
        assert_eq!(names(&select(&m, Some("=ens"))), Vec::<&str>::new());
        assert_eq!(names(&select(&m, Some("=ens5,lo"))), ["lo", "ens5"]);
        assert_eq!(names(&select(&m, Some("^docker,lo"))), ["eth1", "ens5"]);
        assert_eq!(
            names(&select(&m, Some("^=eth1"))),
            ["lo", "docker0", "ens5"]
        );
    }

    #[test]
    fn an_interface_without_a_speed_gets_loopbacks_or_the_default_or_the_one_given() {
        let with = |lo: bool, v: Option<&str>| {
            unknown_speed(lo, |k| {
                assert_eq!(k, "NCCL_GRDMA_SPEED");
                v.map(str::to_string)
            })
        };
        assert_eq!(with(true, None).unwrap().0, LOOPBACK_SPEED_MBPS);
        assert_eq!(with(false, None).unwrap().0, DEFAULT_SPEED_MBPS);
        assert_eq!(
            with(true, Some("100000")).unwrap(),
            (100_000, SpeedFrom::Variable)
        );
        assert_eq!(with(false, Some(" 25000\n")).unwrap().0, 25_000);
        for bad in ["0", "-5", "fast", "1e5", "", "99999999999"] {
            let e = with(false, Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("NCCL_GRDMA_SPEED") && e.contains("Mbit/s"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn sysfs_speed_and_pci_path() {
        let dir = std::env::temp_dir().join(format!("grdma-sysfs-{}", std::process::id()));
        let net = dir.join("class/net");
        let pci = dir.join("devices/pci0000:00/0000:00:03.0");
        std::fs::create_dir_all(net.join("ens5")).unwrap();
        std::fs::create_dir_all(net.join("lo")).unwrap();
        std::fs::create_dir_all(&pci).unwrap();
        std::fs::write(net.join("ens5/speed"), "25000\n").unwrap();
        std::fs::write(net.join("lo/speed"), "-1\n").unwrap();
        std::os::unix::fs::symlink(&pci, net.join("ens5/device")).unwrap();
        assert_eq!(sysfs_speed(&dir, "ens5"), Some(25000));
        assert_eq!(
            sysfs_speed(&dir, "lo"),
            None,
            "a negative speed is no speed"
        );
        assert_eq!(sysfs_speed(&dir, "eth9"), None);
        assert_eq!(
            sysfs_pci_path(&dir, "ens5").unwrap(),
            std::fs::canonicalize(&pci).unwrap().to_str().unwrap()
        );
        assert_eq!(sysfs_pci_path(&dir, "lo"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn this_machine_has_loopback() {
        let all = list_interfaces().unwrap();
        let lo = select(&all, Some("lo"));
        assert_eq!(names(&lo), ["lo"], "{all:?}");
        assert!(lo[0].loopback && lo[0].up);
    }
}
