//! Which rails a GPU should use, best first: pure functions of the gathered facts.
//!
//! For one GPU each rail is ranked by
//! 1. whether it can carry traffic at all (an active port); the others come last, each
//!    with its reason;
//! 2. its PCIe distance to the GPU, in the classes of `nvidia-smi topo -m` (PIX, PXB,
//!    PHB, NODE, SYS; a rail whose distance cannot be told, a software device say,
//!    after SYS): the class decides whether the NIC reads GPU memory through a switch
//!    or through the CPU;
//! 3. its speed, faster first;
//! 4. the machine's order of names (`mlx5_2` before `mlx5_10`), so equal rails always
//!    come out the same way.
//!
//! The *default set* of a GPU is every usable rail at its best class. Several GPUs
//! often share one set (two GPUs and two NICs under one PCIe switch; two GPUs and two
//! NICs on one Grace socket), and ranking each GPU alone would give them all the same
//! first rail: half the NICs idle, the other half shared. So [`order_for_gpus`] spreads
//! them: among the GPUs whose leading rails (usable, best class, top speed) are the same
//! set, the j-th GPU (in the order given) starts at the j-th of those rails, wrapping
//! round.

use super::sysfs::{natural_cmp, Rail, RailId};
use crate::topology::{distance, PciDistance, PciFunction};
use serde::Serialize;
use std::cmp::Ordering;

/// One rail as seen from one GPU.
#[derive(Debug, Clone, Serialize)]
pub struct RankedRail {
    pub rail: Rail,
    /// The PCIe distance to the GPU, or why it cannot be told.
    pub distance: Result<PciDistance, String>,
    /// Why the rail cannot carry traffic; none when it can.
    pub unusable: Option<String>,
    /// Whether the rail is in the GPU's default set (usable, at the best class).
    pub in_default: bool,
}

impl RankedRail {
    pub fn usable(&self) -> bool {
        self.unusable.is_none()
    }

    /// The distance class for ordering: unknown after SYS.
    fn class(&self) -> Option<PciDistance> {
        self.distance.as_ref().ok().copied()
    }

    /// Speed in tenths of Gb/s, for comparing (the kernel's own unit); unknown is 0.
    fn deci_gbit(&self) -> u64 {
        self.rail
            .gbit_per_s
            .map_or(0, |g| (g * 10.0).round() as u64)
    }

    /// Same class and same speed: interchangeable for the GPU.
    fn ties_with(&self, other: &RankedRail) -> bool {
        self.usable() == other.usable()
            && self.class() == other.class()
            && self.deci_gbit() == other.deci_gbit()
    }
}

/// Unknown classes after every known one.
fn class_cmp(a: Option<PciDistance>, b: Option<PciDistance>) -> Ordering {
    match (a, b) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

fn rank_cmp(a: &RankedRail, b: &RankedRail) -> Ordering {
    b.usable()
        .cmp(&a.usable())
        .then(class_cmp(a.class(), b.class()))
        .then(b.deci_gbit().cmp(&a.deci_gbit()))
        .then(natural_cmp(&a.rail.device, &b.rail.device))
        .then(a.rail.port.cmp(&b.rail.port))
}

/// Every rail ranked for a GPU at `gpu` (or, as `Err`, why its place is unknown: then
/// every distance is unknown and speed decides), best first, the default set marked.
pub fn rank(gpu: Result<&PciFunction, &str>, rails: &[Rail]) -> Vec<RankedRail> {
    let mut ranked: Vec<RankedRail> = rails
        .iter()
        .map(|rail| {
            let distance = match (gpu, rail.location.function()) {
                (Err(why), _) => Err(why.to_string()),
                (Ok(g), Some(nic)) => Ok(distance(g, nic)),
                (Ok(_), None) => Err(rail.location.describe()),
            };
            RankedRail {
                unusable: (!rail.state.is_up()).then(|| {
                    format!(
                        "the port is {}, not ACTIVE: it carries no traffic",
                        rail.state.name()
                    )
                }),
                rail: rail.clone(),
                distance,
                in_default: false,
            }
        })
        .collect();
    ranked.sort_by(rank_cmp);
    let best = ranked.iter().find(|r| r.usable()).map(|r| r.class());
    for r in &mut ranked {
        r.in_default = r.usable() && Some(r.class()) == best;
    }
    ranked
}

/// [`rank`] for a GPU whose PCI function is known.
pub fn rank_for_gpu(gpu: &PciFunction, rails: &[Rail]) -> Vec<RankedRail> {
    rank(Ok(gpu), rails)
}

/// The default set: every usable rail at the best class, in ranked order.
pub fn default_rails(ranked: &[RankedRail]) -> Vec<RailId> {
    ranked
        .iter()
        .filter(|r| r.in_default)
        .map(|r| r.rail.id())
        .collect()
}

/// How many of the first rails are usable and interchangeable (same class, same speed).
fn leading_tier(ranked: &[RankedRail]) -> usize {
    match ranked.first() {
        Some(first) if first.usable() => ranked.iter().take_while(|r| r.ties_with(first)).count(),
        _ => 0,
    }
}

/// Each GPU's rails in the order it takes them (the first carries its transfers,
/// `--rails N` takes the first N), the machine's GPUs spread over their shared rails as
/// the module says. `gpus` in the order the GPUs are numbered.
pub fn order_for_gpus(gpus: &[Result<&PciFunction, &str>], rails: &[Rail]) -> Vec<Vec<RankedRail>> {
    let mut seen: Vec<(Vec<RailId>, usize)> = Vec::new();
    gpus.iter()
        .map(|gpu| {
            let mut ranked = rank(*gpu, rails);
            let tier = leading_tier(&ranked);
            if tier > 1 {
                let mut key: Vec<RailId> = ranked[..tier].iter().map(|r| r.rail.id()).collect();
                key.sort_by(|a, b| a.machine_order(b));
                let j = match seen.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, count)) => {
                        *count += 1;
                        *count - 1
                    }
                    None => {
                        seen.push((key, 1));
                        0
                    }
                };
                ranked[..tier].rotate_left(j % tier);
            }
            ranked
        })
        .collect()
}

/// The first rail a GPU's order gives, the one its transfers use.
pub fn chosen(order: &[RankedRail]) -> Option<RailId> {
    order.first().filter(|r| r.usable()).map(|r| r.rail.id())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rails::sysfs::{gather, PortState};
    use crate::rdma::NicLocation;
    use crate::topology::fixture::Fixture;
    use crate::topology::gpu_function;

    fn ids(ranked: &[RankedRail]) -> Vec<String> {
        ranked.iter().map(|r| r.rail.id().to_string()).collect()
    }

    const SWITCH: &str = "pci0000:00/0000:00:01.0/0000:01:00.0";

    /// A GPU behind a switch, and NICs: (name, chain, state, rate).
    fn machine(nics: &[(&str, &str, &str, Option<&str>)]) -> (Fixture, PciFunction, Vec<Rail>) {
        let f = Fixture::new();
        let gpu = format!("{SWITCH}/0000:02:00.0/0000:03:00.0");
        f.pci_device(&gpu, 0);
        for (name, chain, state, rate) in nics {
            f.pci_device(chain, 0);
            f.nic(name, Some(chain));
            f.ib_port(name, 1, state, *rate, "InfiniBand");
        }
        let g = gpu_function(f.root(), "0000:03:00.0").unwrap();
        let rails = gather(f.root()).unwrap();
        (f, g, rails)
    }

    #[test]
    fn distance_first_then_speed_then_name() {
        let near = |bus: &str| format!("{SWITCH}/0000:02:0{bus}.0/0000:0{bus}:00.0");
        let (_f, gpu, rails) = machine(&[
            (
                "mlx5_0",
                "pci0000:00/0000:00:02.0/0000:10:00.0",
                "4: ACTIVE",
                Some("400 Gb/sec (4X NDR)"),
            ),
            (
                "mlx5_1",
                &near("4"),
                "4: ACTIVE",
                Some("200 Gb/sec (4X HDR)"),
            ),
            (
                "mlx5_3",
                &near("5"),
                "4: ACTIVE",
                Some("400 Gb/sec (4X NDR)"),
            ),
            (
                "mlx5_2",
                &near("6"),
                "4: ACTIVE",
                Some("400 Gb/sec (4X NDR)"),
            ),
        ]);
        let ranked = rank_for_gpu(&gpu, &rails);
        // PIX: the two 400G ones by name, then the 200G one; PHB last.
        assert_eq!(
            ids(&ranked),
            ["mlx5_2:1", "mlx5_3:1", "mlx5_1:1", "mlx5_0:1"]
        );
        assert_eq!(ranked[0].distance, Ok(PciDistance::Pix));
        assert_eq!(ranked[3].distance, Ok(PciDistance::Phb));
        // The default set is the whole best class, slower rails of it included.
        assert_eq!(
            default_rails(&ranked)
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>(),
            ["mlx5_2:1", "mlx5_3:1", "mlx5_1:1"]
        );
    }

    #[test]
    fn a_down_port_comes_last_with_its_reason() {
        let (_f, gpu, rails) = machine(&[
            (
                "mlx5_0",
                &format!("{SWITCH}/0000:02:04.0/0000:04:00.0"),
                "1: DOWN",
                Some("400 Gb/sec (4X NDR)"),
            ),
            (
                "mlx5_1",
                "pci0000:80/0000:80:01.0/0000:81:00.0",
                "4: ACTIVE",
                Some("100 Gb/sec (4X EDR)"),
            ),
        ]);
        let ranked = rank_for_gpu(&gpu, &rails);
        assert_eq!(ids(&ranked), ["mlx5_1:1", "mlx5_0:1"]);
        assert_eq!(
            ranked[1].unusable.as_deref(),
            Some("the port is DOWN, not ACTIVE: it carries no traffic")
        );
        // The nearest NIC is down: the best usable class is the far one's.
        assert_eq!(ranked[0].distance, Ok(PciDistance::Node));
        assert!(ranked[0].in_default && !ranked[1].in_default);
        assert_eq!(chosen(&ranked).unwrap().to_string(), "mlx5_1:1");
        // Every port down: nothing is chosen, nothing is default.
        let (_f, gpu, rails) = machine(&[(
            "mlx5_0",
            &format!("{SWITCH}/0000:02:04.0/0000:04:00.0"),
            "2: INIT",
            None,
        )]);
        let ranked = rank_for_gpu(&gpu, &rails);
        assert_eq!(chosen(&ranked), None);
        assert!(default_rails(&ranked).is_empty());
    }

    #[test]
    fn no_nic_no_rails() {
        let (_f, gpu, rails) = machine(&[]);
        assert!(rails.is_empty());
        assert!(rank_for_gpu(&gpu, &rails).is_empty());
        assert!(order_for_gpus(&[Ok(&gpu)], &rails)[0].is_empty());
    }

    #[test]
    fn unknown_distances_after_known_ones_and_without_a_gpu_speed_decides() {
        let (_f, gpu, mut rails) = machine(&[(
            "mlx5_0",
            "pci0000:80/0000:80:01.0/0000:81:00.0",
            "4: ACTIVE",
            Some("100 Gb/sec (4X EDR)"),
        )]);
        rails.push(Rail {
            device: "rxe0".into(),
            port: 1,
            state: PortState::Active,
            rate: Some("400 Gb/sec (4X NDR)".into()),
            gbit_per_s: Some(400.0),
            link_layer: Some("Ethernet".into()),
            location: NicLocation::Software,
        });
        let ranked = rank_for_gpu(&gpu, &rails);
        assert_eq!(ids(&ranked), ["mlx5_0:1", "rxe0:1"]);
        assert_eq!(
            ranked[1].distance,
            Err("software device, no PCI function".to_string())
        );
        assert!(!ranked[1].in_default);
        let ranked = rank(Err("no GPU"), &rails);
        assert_eq!(ids(&ranked), ["rxe0:1", "mlx5_0:1"]);
        assert!(ranked.iter().all(|r| r.in_default));
        assert_eq!(ranked[0].distance, Err("no GPU".to_string()));
    }

    #[test]
    fn equal_rails_are_spread_over_the_gpus_that_share_them() {
        let f = Fixture::new();
        for (i, gpu) in ["0000:03:00.0", "0000:04:00.0", "0000:05:00.0"]
            .iter()
            .enumerate()
        {
            f.pci_device(&format!("{SWITCH}/0000:02:0{i}.0/{gpu}"), 0);
        }
        for (i, nic) in ["mlx5_0", "mlx5_1"].iter().enumerate() {
            let chain = format!("{SWITCH}/0000:02:1{i}.0/0000:1{i}:00.0");
            f.pci_device(&chain, 0);
            f.nic(nic, Some(&chain));
            f.ib_port(
                nic,
                1,
                "4: ACTIVE",
                Some("400 Gb/sec (4X NDR)"),
                "InfiniBand",
            );
        }
        let gpus: Vec<PciFunction> = ["0000:03:00.0", "0000:04:00.0", "0000:05:00.0"]
            .iter()
            .map(|b| gpu_function(f.root(), b).unwrap())
            .collect();
        let rails = gather(f.root()).unwrap();
        let places: Vec<Result<&PciFunction, &str>> = gpus.iter().map(Ok).collect();
        let orders = order_for_gpus(&places, &rails);
        let first: Vec<String> = orders
            .iter()
            .map(|o| chosen(o).unwrap().to_string())
            .collect();
        // Three GPUs on two equal rails: round robin.
        assert_eq!(first, ["mlx5_0:1", "mlx5_1:1", "mlx5_0:1"]);
        assert_eq!(ids(&orders[1]), ["mlx5_1:1", "mlx5_0:1"]);
        // Alone, each GPU would take the first by name.
        assert!(gpus
            .iter()
            .all(|g| chosen(&rank_for_gpu(g, &rails)).unwrap().device == "mlx5_0"));
    }
}
