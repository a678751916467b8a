//! The rail set a transfer asks for: `--nic a,b,...` names it, `--rails N` takes the
//! first N of the GPU's order, neither takes the default set. Parsing is separate from
//! checking against the machine, so clap can refuse a malformed list before anything is
//! read from sysfs.

use super::rank::RankedRail;
use super::sysfs::{natural_cmp, Rail, RailId};
use std::fmt;

/// One entry of `--nic`: a device (`mlx5_0`: its active ports) or one port (`mlx5_0:1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicSpec {
    pub device: String,
    pub port: Option<u8>,
}

impl fmt::Display for NicSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(p) => write!(f, "{}:{p}", self.device),
            None => f.write_str(&self.device),
        }
    }
}

/// `--nic`'s value: one or more entries, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicList(pub Vec<NicSpec>);

impl NicList {
    /// The first entry's device: the one a transfer goes through today.
    pub fn first_device(&self) -> &str {
        &self.0[0].device
    }
}

impl fmt::Display for NicList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// Parse `mlx5_0`, `mlx5_0:1`, `mlx5_0,mlx5_3:2`: names as sysfs spells them (no
/// spaces, no `/`), ports 1-255, nothing named twice.
pub fn parse_nic_list(text: &str) -> Result<NicList, String> {
    let mut specs: Vec<NicSpec> = Vec::new();
    for entry in text.split(',') {
        let entry = entry.trim();
        let (device, port) = match entry.split_once(':') {
            Some((d, p)) => {
                let port = p.parse::<u8>().ok().filter(|&p| p > 0).ok_or_else(|| {
                    format!("`{entry}`: the port after `:` is a number from 1 to 255")
                })?;
                (d, Some(port))
            }
            None => (entry, None),
        };
        if device.is_empty() {
            return Err(format!(
                "`{text}`: an empty device name (write NAME or NAME:PORT, comma-separated)"
            ));
        }
        if device.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(format!("`{device}` is no RDMA device name"));
        }
        let spec = NicSpec {
            device: device.to_string(),
            port,
        };
        if specs.iter().any(|s| {
            s.device == spec.device
                && (s.port.is_none() || spec.port.is_none() || s.port == spec.port)
        }) {
            return Err(format!("`{entry}` is named twice in `{text}`"));
        }
        specs.push(spec);
    }
    Ok(NicList(specs))
}

/// The known device names, for messages: "mlx5_0, mlx5_1" or "none".
fn known_devices(rails: &[Rail]) -> String {
    let mut names: Vec<&str> = rails.iter().map(|r| r.device.as_str()).collect();
    names.sort_by(|a, b| natural_cmp(a, b));
    names.dedup();
    if names.is_empty() {
        "none: sysfs lists no RDMA device".into()
    } else {
        names.join(", ")
    }
}

/// The rails `--nic` names, checked against the machine: every name known, every rail
/// named able to carry traffic (a device stands for its active ports, in port order).
pub fn resolve_nic_list(list: &NicList, rails: &[Rail]) -> Result<Vec<RailId>, String> {
    let mut out = Vec::new();
    for spec in &list.0 {
        let ports: Vec<&Rail> = rails.iter().filter(|r| r.device == spec.device).collect();
        if ports.is_empty() {
            return Err(format!(
                "--nic {spec}: no RDMA device {} (known: {})",
                spec.device,
                known_devices(rails)
            ));
        }
        match spec.port {
            Some(port) => {
                let rail = ports.iter().find(|r| r.port == port).ok_or_else(|| {
                    let have: Vec<String> = ports.iter().map(|r| r.port.to_string()).collect();
                    format!(
                        "--nic {spec}: {} has no port {port} (its ports: {})",
                        spec.device,
                        have.join(", ")
                    )
                })?;
                if !rail.state.is_up() {
                    return Err(format!(
                        "--nic {spec}: the port is {}, not ACTIVE, so it carries no traffic (`host info` says why)",
                        rail.state.name()
                    ));
                }
                out.push(rail.id());
            }
            None => {
                let up: Vec<RailId> = ports
                    .iter()
                    .filter(|r| r.state.is_up())
                    .map(|r| r.id())
                    .collect();
                if up.is_empty() {
                    let states: Vec<String> = ports
                        .iter()
                        .map(|r| format!("port {} {}", r.port, r.state.name()))
                        .collect();
                    return Err(format!(
                        "--nic {spec}: no port of it is ACTIVE ({}), so it carries no traffic (`host info` says why)",
                        states.join(", ")
                    ));
                }
                out.extend(up);
            }
        }
    }
    Ok(out)
}

/// The rail set without `--nic`: the first `n` usable rails of the GPU's order with
/// `--rails N`, else its default set.
pub fn take_rails(order: &[RankedRail], n: Option<u32>) -> Result<Vec<RailId>, String> {
    let usable: Vec<&RankedRail> = order.iter().filter(|r| r.usable()).collect();
    if usable.is_empty() {
        return Err(if order.is_empty() {
            "no rail: sysfs lists no RDMA device port".into()
        } else {
            let all: Vec<String> = order
                .iter()
                .map(|r| format!("{} {}", r.rail.id(), r.rail.state.name()))
                .collect();
            format!("no rail is ACTIVE ({})", all.join(", "))
        });
    }
    match n {
        None => Ok(order
            .iter()
            .filter(|r| r.in_default)
            .map(|r| r.rail.id())
            .collect()),
        Some(n) if n as usize > usable.len() => {
            let names: Vec<String> = usable.iter().map(|r| r.rail.id().to_string()).collect();
            Err(format!(
                "--rails {n}: only {} rail{} can carry traffic here ({})",
                usable.len(),
                if usable.len() == 1 { "" } else { "s" },
                names.join(", ")
            ))
        }
        Some(n) => Ok(usable
            .iter()
            .take(n as usize)
            .map(|r| r.rail.id())
            .collect()),
    }
}

/// The one-line note for a set of more than one rail (none for one) when the transfer
/// cannot be striped over them: only the first carries it.
pub fn several_rails_note(set: &[RailId]) -> Option<String> {
    let (first, _) = set.split_first()?;
    (set.len() > 1).then(|| {
        let names: Vec<String> = set.iter().map(ToString::to_string).collect();
        format!(
            "{} rails selected ({}); striping over them needs --op write and one receiver address per rail (<IP> a comma list): this transfer uses {first}",
            set.len(),
            names.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rails::rank::rank;
    use crate::rails::sysfs::PortState;
    use crate::rdma::NicLocation;

    fn rail(device: &str, port: u8, state: PortState, gbit: f64) -> Rail {
        Rail {
            device: device.into(),
            port,
            state,
            rate: Some(format!("{gbit} Gb/sec (4X NDR)")),
            gbit_per_s: Some(gbit),
            link_layer: Some("InfiniBand".into()),
            location: NicLocation::Software,
        }
    }

    fn machine() -> Vec<Rail> {
        vec![
            rail("mlx5_0", 1, PortState::Active, 400.0),
            rail("mlx5_1", 1, PortState::Active, 400.0),
            rail("mlx5_1", 2, PortState::Down, 400.0),
            rail("mlx5_2", 1, PortState::Init, 400.0),
            rail("mlx5_3", 1, PortState::Active, 200.0),
        ]
    }

    fn names(set: &[RailId]) -> Vec<String> {
        set.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn nic_lists_parse() {
        let list = parse_nic_list("mlx5_0").unwrap();
        assert_eq!(
            list.0,
            [NicSpec {
                device: "mlx5_0".into(),
                port: None
            }]
        );
        assert_eq!(list.first_device(), "mlx5_0");
        let list = parse_nic_list("mlx5_3:2, mlx5_0").unwrap();
        assert_eq!(list.to_string(), "mlx5_3:2,mlx5_0");
        assert_eq!(list.first_device(), "mlx5_3");
        assert!(
            parse_nic_list("mlx5_0:1,mlx5_0:2").is_ok(),
            "two ports of one device"
        );
        for (bad, why) in [
            ("", "an empty device name"),
            ("mlx5_0,", "an empty device name"),
            (":1", "an empty device name"),
            ("mlx5_0:0", "a number from 1 to 255"),
            ("mlx5_0:x", "a number from 1 to 255"),
            ("mlx5_0:256", "a number from 1 to 255"),
            ("mlx5 0", "is no RDMA device name"),
            ("mlx5_0,mlx5_0", "named twice"),
            ("mlx5_0,mlx5_0:1", "named twice"),
        ] {
            let e = parse_nic_list(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }

    #[test]
    fn nic_lists_resolve_against_the_machine() {
        let rails = machine();
        let resolve = |t: &str| resolve_nic_list(&parse_nic_list(t).unwrap(), &rails);
        assert_eq!(
            names(&resolve("mlx5_1").unwrap()),
            ["mlx5_1:1"],
            "a device: its active ports"
        );
        assert_eq!(
            names(&resolve("mlx5_3,mlx5_0:1").unwrap()),
            ["mlx5_3:1", "mlx5_0:1"]
        );
        assert_eq!(
            resolve("mlx5_9").unwrap_err(),
            "--nic mlx5_9: no RDMA device mlx5_9 (known: mlx5_0, mlx5_1, mlx5_2, mlx5_3)"
        );
        assert_eq!(
            resolve("mlx5_0:3").unwrap_err(),
            "--nic mlx5_0:3: mlx5_0 has no port 3 (its ports: 1)"
        );
        assert!(resolve("mlx5_1:2")
            .unwrap_err()
            .contains("the port is DOWN, not ACTIVE"));
        assert_eq!(
            resolve("mlx5_2").unwrap_err(),
            "--nic mlx5_2: no port of it is ACTIVE (port 1 INIT), so it carries no traffic (`host info` says why)"
        );
        assert_eq!(
            resolve_nic_list(&parse_nic_list("mlx5_0").unwrap(), &[]).unwrap_err(),
            "--nic mlx5_0: no RDMA device mlx5_0 (known: none: sysfs lists no RDMA device)"
        );
    }

    #[test]
    fn rails_n_takes_the_first_usable_ones() {
        let order = rank(Err("no GPU"), &machine());
        assert_eq!(
            names(&take_rails(&order, None).unwrap()),
            ["mlx5_0:1", "mlx5_1:1", "mlx5_3:1"]
        );
        assert_eq!(
            names(&take_rails(&order, Some(2)).unwrap()),
            ["mlx5_0:1", "mlx5_1:1"]
        );
        assert_eq!(
            take_rails(&order, Some(4)).unwrap_err(),
            "--rails 4: only 3 rails can carry traffic here (mlx5_0:1, mlx5_1:1, mlx5_3:1)"
        );
        assert_eq!(
            take_rails(&[], None).unwrap_err(),
            "no rail: sysfs lists no RDMA device port"
        );
        let down = rank(Err("no GPU"), &[rail("mlx5_0", 1, PortState::Down, 400.0)]);
        assert_eq!(
            take_rails(&down, Some(1)).unwrap_err(),
            "no rail is ACTIVE (mlx5_0:1 DOWN)"
        );
    }

    #[test]
    fn a_note_only_for_several_rails() {
        let order = rank(Err("no GPU"), &machine());
        let one = take_rails(&order, Some(1)).unwrap();
        assert_eq!(several_rails_note(&one), None);
        assert_eq!(several_rails_note(&[]), None);
        assert_eq!(
            several_rails_note(&take_rails(&order, Some(2)).unwrap()).unwrap(),
            "2 rails selected (mlx5_0:1, mlx5_1:1); striping over them needs --op write and one receiver address per rail (<IP> a comma list): this transfer uses mlx5_0:1"
        );
    }
}
