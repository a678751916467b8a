//! The rail lines `host info` and `host doctor` print: one line per rail, only what was
//! read (the port's state and rate from sysfs, the distance class from the PCI paths).

use super::rank::RankedRail;
use super::sysfs::Rail;

/// "1. mlx5_1:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; PIX; default set": a rail in a
/// GPU's order (`n` counts from 1).
pub fn ranked_line(n: usize, r: &RankedRail) -> String {
    let distance = match &r.distance {
        Ok(d) => d.to_string(),
        Err(why) => format!("distance unknown ({why})"),
    };
    let tag = match (&r.unusable, r.in_default) {
        (Some(why), _) => format!("; not usable: {why}"),
        (None, true) => "; default set".to_string(),
        (None, false) => String::new(),
    };
    format!(
        "{n}. {}: {}; {distance}{tag}",
        r.rail.id(),
        r.rail.describe()
    )
}

/// A GPU's rails, numbered, in the order it takes them.
pub fn ranked_lines(order: &[RankedRail]) -> Vec<String> {
    if order.is_empty() {
        return vec!["none: sysfs lists no RDMA device port".into()];
    }
    order
        .iter()
        .enumerate()
        .map(|(i, r)| ranked_line(i + 1, r))
        .collect()
}

/// "mlx5_0:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; PCI 0000:14:00.0, NUMA node 0": a
/// rail with no GPU to rank it for.
pub fn rail_line(r: &Rail) -> String {
    let place = match r.location.function() {
        Some(f) => match f.numa_node {
            Some(n) => format!("PCI {}, NUMA node {n}", f.address),
            None => format!("PCI {}, NUMA node unknown", f.address),
        },
        None => r.location.describe(),
    };
    format!("{}: {}; {place}", r.id(), r.describe())
}

/// The heading of a GPU's ranking: how to read it.
pub const ORDER_HEADING: &str = "rails, best first (active before down, then distance class, then speed; GPUs with equal rails take turns at the head; --rails N takes the first N, a transfer uses the first unless striped):";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rails::rank::rank_for_gpu;
    use crate::rails::sysfs::gather;
    use crate::topology::fixture::Fixture;
    use crate::topology::gpu_function;

    #[test]
    fn one_line_per_rail_with_what_was_read() {
        let f = Fixture::new();
        let sw = "pci0000:00/0000:00:01.0/0000:01:00.0";
        f.pci_device(&format!("{sw}/0000:02:00.0/0000:03:00.0"), 0);
        f.pci_device(&format!("{sw}/0000:02:01.0/0000:04:00.0"), 0);
        f.mlx5_and_rxe("mlx5_0", &format!("{sw}/0000:02:01.0/0000:04:00.0"));
        let gpu = gpu_function(f.root(), "0000:03:00.0").unwrap();
        let rails = gather(f.root()).unwrap();
        assert_eq!(
            ranked_lines(&rank_for_gpu(&gpu, &rails)),
            [
                "1. mlx5_0:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; PIX; default set",
                "2. rxe0:1: ACTIVE, 2.5 Gb/s (1X SDR), Ethernet; distance unknown (software device, no PCI function)",
                "3. mlx5_0:2: DOWN, rate unknown, InfiniBand; PIX; not usable: the port is DOWN, not ACTIVE: it carries no traffic",
            ]
        );
        assert_eq!(
            rail_line(&rails[0]),
            "mlx5_0:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; PCI 0000:04:00.0, NUMA node 0"
        );
        assert_eq!(
            rail_line(&rails[2]),
            "rxe0:1: ACTIVE, 2.5 Gb/s (1X SDR), Ethernet; software device, no PCI function"
        );
        assert_eq!(ranked_lines(&[]), ["none: sysfs lists no RDMA device port"]);
    }
}
