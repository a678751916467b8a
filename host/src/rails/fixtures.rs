//! The rail chosen for every GPU of two whole machines, read from fixture sysfs trees
//! (`topology::fixture::Machine`): a DGX-like one and a GB200-like one.

use super::pairing::{peer_rails, Reachability};
use super::rank::{chosen, default_rails, order_for_gpus, rank_for_gpu};
use super::select::take_rails;
use super::sysfs::{gather, Rail, RailId};
use super::words::ranked_lines;
use crate::topology::fixture::Machine;
use crate::topology::{gpu_function, PciDistance, PciFunction};

/// The GPUs' functions and the rails of a machine, as a real run would read them.
fn read(m: &Machine) -> (Vec<PciFunction>, Vec<Rail>) {
    let gpus = m
        .gpus
        .iter()
        .map(|b| gpu_function(m.fixture.root(), b).unwrap())
        .collect();
    (gpus, gather(m.fixture.root()).unwrap())
}

/// The rail each GPU takes, GPU 0 first.
fn chosen_rails(gpus: &[PciFunction], rails: &[Rail]) -> Vec<String> {
    let places: Vec<Result<&PciFunction, &str>> = gpus.iter().map(Ok).collect();
    order_for_gpus(&places, rails)
        .iter()
        .map(|order| chosen(order).expect("a rail").to_string())
        .collect()
}

fn names(ids: &[RailId]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}

#[test]
fn dgx_like_every_gpu_takes_its_own_nic_on_its_switch() {
    let m = Machine::dgx_like();
    let (gpus, rails) = read(&m);
    assert_eq!((gpus.len(), rails.len()), (8, 8));
    assert_eq!(
        chosen_rails(&gpus, &rails),
        [
            "mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1", "mlx5_4:1", "mlx5_5:1", "mlx5_6:1",
            "mlx5_7:1"
        ]
    );
    // GPU 1's view: its switch's two NICs (PIX), the socket's other switch (NODE), the
    // other socket (SYS).
    let ranked = rank_for_gpu(&gpus[1], &rails);
    let classes: Vec<(String, PciDistance)> = ranked
        .iter()
        .map(|r| (r.rail.id().to_string(), r.distance.clone().unwrap()))
        .collect();
    assert_eq!(classes[0], ("mlx5_0:1".to_string(), PciDistance::Pix));
    assert_eq!(classes[1], ("mlx5_1:1".to_string(), PciDistance::Pix));
    assert_eq!(classes[2].1, PciDistance::Node);
    assert_eq!(classes[3].1, PciDistance::Node);
    assert!(classes[4..].iter().all(|(_, d)| *d == PciDistance::Sys));
    assert_eq!(names(&default_rails(&ranked)), ["mlx5_0:1", "mlx5_1:1"]);
    // Alone, GPU 1 would rank mlx5_0 first (equal class and speed, by name); beside
    // GPU 0 it starts at mlx5_1, and --rails 2 takes both NICs of its switch.
    let places: Vec<Result<&PciFunction, &str>> = gpus.iter().map(Ok).collect();
    let orders = order_for_gpus(&places, &rails);
    assert_eq!(
        names(&take_rails(&orders[1], None).unwrap()),
        ["mlx5_1:1", "mlx5_0:1"]
    );
    assert_eq!(
        names(&take_rails(&orders[1], Some(3)).unwrap()),
        ["mlx5_1:1", "mlx5_0:1", "mlx5_2:1"]
    );
    // What `host info` prints for GPU 1 (docs/hardware.md quotes it).
    assert_eq!(
        ranked_lines(&orders[1])[..4],
        [
            "1. mlx5_1:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; PIX; default set",
            "2. mlx5_0:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; PIX; default set",
            "3. mlx5_2:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; NODE",
            "4. mlx5_3:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; NODE",
        ]
    );
    assert_eq!(
        ranked_lines(&orders[1])[7],
        "8. mlx5_7:1: ACTIVE, 400 Gb/s (4X NDR), InfiniBand; SYS"
    );
    // Two DGX-like nodes on a rail-only fabric: GPU 5's rail, mlx5_5, reaches mlx5_5.
    let (_, receiver) = read(&Machine::dgx_like());
    let mine = chosen(&orders[5]).unwrap();
    assert_eq!(
        names(&peer_rails(&mine, &rails, &receiver, Reachability::RailOnly).unwrap()),
        ["mlx5_5:1"]
    );
    assert_eq!(
        peer_rails(&mine, &rails, &receiver, Reachability::AnyToAny)
            .unwrap()
            .len(),
        8
    );
}

#[test]
fn gb200_like_every_gpu_takes_a_nic_of_its_own_grace() {
    let m = Machine::gb200_like();
    let (gpus, rails) = read(&m);
    assert_eq!((gpus.len(), rails.len()), (4, 4));
    // No NIC shares a PCIe switch with any GPU: a shared-switch rule finds nothing.
    for gpu in &gpus {
        for r in rank_for_gpu(gpu, &rails) {
            assert!(
                r.distance.clone().unwrap() >= PciDistance::Node,
                "{} to {}: {:?}",
                gpu.address,
                r.rail.id(),
                r.distance
            );
        }
    }
    // The NUMA node does: each GPU takes a NIC of its own Grace, and the two GPUs of
    // one Grace take different ones.
    assert_eq!(
        chosen_rails(&gpus, &rails),
        ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    );
    let ranked = rank_for_gpu(&gpus[2], &rails);
    assert_eq!(names(&default_rails(&ranked)), ["mlx5_2:1", "mlx5_3:1"]);
    assert_eq!(ranked[0].distance, Ok(PciDistance::Node));
    assert_eq!(ranked[3].distance, Ok(PciDistance::Sys));
    assert_eq!(ranked[0].rail.numa_node(), Some(1));
}

#[test]
fn gb200_like_a_down_nic_moves_its_gpu_to_the_other_nic_of_its_grace() {
    let m = Machine::gb200_like();
    m.fixture.ib_port(
        "mlx5_1",
        1,
        "1: DOWN",
        Some("400 Gb/sec (4X NDR)"),
        "InfiniBand",
    );
    let (gpus, rails) = read(&m);
    // GPU 1 shares mlx5_0 with GPU 0 rather than crossing to the other Grace.
    assert_eq!(
        chosen_rails(&gpus, &rails),
        ["mlx5_0:1", "mlx5_0:1", "mlx5_2:1", "mlx5_3:1"]
    );
}
