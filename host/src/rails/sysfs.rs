//! Every port of every RDMA device, as sysfs shows it: the rails a transfer could take.
//!
//! A rail is one port (`mlx5_0` port 1), not one device: a dual-port NIC is two rails.
//! The facts come from `sys/class/infiniband/<dev>/ports/<n>/` under a root directory
//! (`/` on a real machine, a fixture tree in tests), in the kernel's own formats:
//! `state` is "4: ACTIVE", `rate` is "400 Gb/sec (4X NDR)" (the active width times the
//! active speed), `link_layer` is "InfiniBand" or "Ethernet". Nothing is asked of
//! libibverbs, so the listing works where this process cannot open the devices.

use crate::rdma::NicLocation;
use serde::Serialize;
use std::cmp::Ordering;
use std::fmt;
use std::path::Path;

/// One rail's name: device and port, written `mlx5_0:1` (the form NCCL_IB_HCA and
/// UCX_NET_DEVICES take, and `--nic` too).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct RailId {
    pub device: String,
    pub port: u8,
}

impl fmt::Display for RailId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.device, self.port)
    }
}

impl RailId {
    /// The machine's order: device names with their numbers compared as numbers
    /// (`mlx5_2` before `mlx5_10`), then the port. Rail k of a machine is the k-th in
    /// this order.
    pub fn machine_order(&self, other: &RailId) -> Ordering {
        natural_cmp(&self.device, &other.device).then(self.port.cmp(&other.port))
    }
}

/// `a` against `b` with a trailing number compared as a number, so `mlx5_10` comes
/// after `mlx5_9` as `ibv_devices` users expect.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    fn split(s: &str) -> (&str, Option<u64>) {
        let digits = s.len() - s.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (stem, number) = s.split_at(s.len() - digits);
        (stem, number.parse().ok())
    }
    let (sa, na) = split(a);
    let (sb, nb) = split(b);
    sa.cmp(sb).then(na.cmp(&nb)).then(a.cmp(b))
}

/// A port's logical state (the `state` file: DOWN, INIT, ARMED, ACTIVE or ACTIVE_DEFER).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PortState {
    Down,
    Init,
    Armed,
    Active,
    ActiveDefer,
    /// Text the kernel did not give in its usual form, or why the file could not be read.
    Unknown(String),
}

impl PortState {
    /// Parse the `state` file ("4: ACTIVE"); the name decides, the number is the
    /// kernel's enum and says the same.
    pub fn parse(text: &str) -> PortState {
        let name = text.trim().rsplit(':').next().unwrap_or("").trim();
        match name {
            "DOWN" => PortState::Down,
            "INIT" => PortState::Init,
            "ARMED" => PortState::Armed,
            "ACTIVE" => PortState::Active,
            "ACTIVE_DEFER" => PortState::ActiveDefer,
            _ => PortState::Unknown(text.trim().to_string()),
        }
    }

    /// Only an active port carries data: INIT waits for a subnet manager, ARMED for
    /// the last step of it.
    pub fn is_up(&self) -> bool {
        *self == PortState::Active
    }

    pub fn name(&self) -> String {
        match self {
            PortState::Down => "DOWN".into(),
            PortState::Init => "INIT".into(),
            PortState::Armed => "ARMED".into(),
            PortState::Active => "ACTIVE".into(),
            PortState::ActiveDefer => "ACTIVE_DEFER".into(),
            PortState::Unknown(text) => format!("unknown ({text})"),
        }
    }
}

/// The data rate in Gb/s from the `rate` file ("400 Gb/sec (4X NDR)", "2.5 Gb/sec (1X
/// SDR)"); none for anything else.
pub fn parse_rate(text: &str) -> Option<f64> {
    let mut words = text.split_whitespace();
    let number: f64 = words.next()?.parse().ok()?;
    (words.next()? == "Gb/sec" && number.is_finite() && number >= 0.0).then_some(number)
}

/// One rail and what sysfs says of it.
#[derive(Debug, Clone, Serialize)]
pub struct Rail {
    pub device: String,
    pub port: u8,
    pub state: PortState,
    /// The `rate` file as the kernel wrote it; none where it could not be read (the
    /// kernel refuses to state a rate it cannot compute).
    pub rate: Option<String>,
    /// The rate in Gb/s, from `rate`.
    pub gbit_per_s: Option<f64>,
    /// "InfiniBand" or "Ethernet" (RoCE).
    pub link_layer: Option<String>,
    /// The device's PCI function, or why there is none (rxe, siw: software devices).
    pub location: NicLocation,
}

impl Rail {
    pub fn id(&self) -> RailId {
        RailId {
            device: self.device.clone(),
            port: self.port,
        }
    }

    /// The NUMA node of the device's PCI function, where sysfs states one.
    pub fn numa_node(&self) -> Option<u32> {
        self.location.function().and_then(|f| f.numa_node)
    }

    /// "ACTIVE, 400 Gb/s (4X NDR), InfiniBand": what sysfs said, nothing more.
    pub fn describe(&self) -> String {
        let mut words = vec![self.state.name()];
        match (self.gbit_per_s, &self.rate) {
            (Some(g), Some(text)) => {
                let detail = text.split_once('(').map(|(_, d)| d.trim_end_matches(')'));
                words.push(match detail {
                    Some(d) => format!("{g} Gb/s ({d})"),
                    None => format!("{g} Gb/s"),
                })
            }
            (None, Some(text)) => words.push(format!("rate `{text}`")),
            _ => words.push("rate unknown".into()),
        }
        words.extend(self.link_layer.clone());
        words.join(", ")
    }
}

fn read_trimmed(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_string())
        .map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Every rail under `root`, in the machine's order ([`RailId::machine_order`]). No
/// `sys/class/infiniband` at all means no rails; a directory that cannot be read is an
/// error.
pub fn gather(root: &Path) -> Result<Vec<Rail>, String> {
    let class = root.join("sys/class/infiniband");
    let entries = match std::fs::read_dir(&class) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot list {}: {e}", class.display())),
    };
    let mut rails = Vec::new();
    for entry in entries.flatten() {
        let device = entry.file_name().to_string_lossy().into_owned();
        let ports_dir = class.join(&device).join("ports");
        // A device without a ports directory has nothing to carry traffic on.
        let Ok(ports) = std::fs::read_dir(&ports_dir) else {
            continue;
        };
        let location = NicLocation::of(root, &device);
        for port in ports.flatten() {
            let Ok(number) = port.file_name().to_string_lossy().parse::<u8>() else {
                continue;
            };
            let dir = ports_dir.join(number.to_string());
            let rate = read_trimmed(&dir.join("rate")).ok();
            rails.push(Rail {
                device: device.clone(),
                port: number,
                state: match read_trimmed(&dir.join("state")) {
                    Ok(text) => PortState::parse(&text),
                    Err(why) => PortState::Unknown(why),
                },
                gbit_per_s: rate.as_deref().and_then(parse_rate),
                rate,
                link_layer: read_trimmed(&dir.join("link_layer")).ok(),
                location: location.clone(),
            });
        }
    }
    rails.sort_by(|a, b| a.id().machine_order(&b.id()));
    Ok(rails)
}

/// This machine's rails.
pub fn here() -> Result<Vec<Rail>, String> {
    gather(Path::new("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fixture::Fixture;

    #[test]
    fn states_in_the_kernels_words() {
        assert_eq!(PortState::parse("4: ACTIVE\n"), PortState::Active);
        assert_eq!(PortState::parse("1: DOWN"), PortState::Down);
        assert_eq!(PortState::parse("2: INIT"), PortState::Init);
        assert_eq!(PortState::parse("3: ARMED"), PortState::Armed);
        assert_eq!(PortState::parse("5: ACTIVE_DEFER"), PortState::ActiveDefer);
        assert_eq!(
            PortState::parse("7: SOMETHING"),
            PortState::Unknown("7: SOMETHING".into())
        );
        assert!(PortState::Active.is_up());
        assert!(!PortState::Init.is_up() && !PortState::ActiveDefer.is_up());
        assert_eq!(PortState::Unknown("x".into()).name(), "unknown (x)");
    }

    #[test]
    fn rates_in_the_kernels_words() {
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)\n"), Some(400.0));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)"), Some(2.5));
        assert_eq!(parse_rate("100 Gb/sec (2X HDR)"), Some(100.0));
        assert_eq!(parse_rate("fast"), None);
        assert_eq!(parse_rate("400 Mb/sec"), None);
        assert_eq!(parse_rate(""), None);
        assert_eq!(parse_rate("NaN Gb/sec"), None);
    }

    #[test]
    fn names_in_the_machines_order() {
        let mut names = vec!["mlx5_10", "mlx5_2", "rxe0", "mlx5_1", "ib0", "mlx5_bond_0"];
        names.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            names,
            ["ib0", "mlx5_1", "mlx5_2", "mlx5_10", "mlx5_bond_0", "rxe0"]
        );
        let id = |d: &str, p| RailId {
            device: d.into(),
            port: p,
        };
        assert_eq!(id("mlx5_0", 2).to_string(), "mlx5_0:2");
        assert_eq!(
            id("mlx5_0", 2).machine_order(&id("mlx5_0", 1)),
            Ordering::Greater
        );
    }

    #[test]
    fn gathered_from_a_fixture_tree() {
        let f = Fixture::new();
        assert!(
            gather(f.root()).unwrap().is_empty(),
            "no class dir: no rails"
        );
        f.pci_device("pci0000:00/0000:00:02.0/0000:02:00.0", 0);
        f.mlx5_and_rxe("mlx5_10", "pci0000:00/0000:00:02.0/0000:02:00.0");
        f.nic("mlx5_9", None); // no ports directory: no rails
        let rails = gather(f.root()).unwrap();
        let ids: Vec<String> = rails.iter().map(|r| r.id().to_string()).collect();
        assert_eq!(ids, ["mlx5_10:1", "mlx5_10:2", "rxe0:1"]);
        assert_eq!(rails[0].state, PortState::Active);
        assert_eq!(rails[0].gbit_per_s, Some(400.0));
        assert_eq!(rails[0].numa_node(), Some(0));
        assert_eq!(rails[0].describe(), "ACTIVE, 400 Gb/s (4X NDR), InfiniBand");
        assert_eq!(rails[1].describe(), "DOWN, rate unknown, InfiniBand");
        assert!(matches!(rails[2].location, NicLocation::Software));
        assert_eq!(rails[2].numa_node(), None);
        assert_eq!(rails[2].describe(), "ACTIVE, 2.5 Gb/s (1X SDR), Ethernet");
    }

    /// This machine's own sysfs reads without error (most build machines have no
    /// RDMA device: then the list is empty).
    #[test]
    fn the_real_sysfs_reads_too() {
        for rail in here().unwrap() {
            assert!(!rail.device.is_empty());
        }
    }
}
