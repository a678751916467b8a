//! The rails as the commands use them: gathered from this machine's sysfs, ranked for
//! its GPUs, and the sender's `--nic`/`--rails` turned into the device the transfer goes
//! through. Thin on purpose: the ranking and the words are `host::rails`', tested there.

use super::facts::GpuFacts;
use anyhow::Result;
use host::cli::SendArgs;
use host::memory_factory::GpuSelection;
use host::rails::{self, Rail, RankedRail};
use host::topology::PciFunction;

/// Each GPU's rails in the order it takes them, the GPUs in the order given.
pub fn gpu_orders(gpus: &[GpuFacts], rails: &[Rail]) -> Vec<Vec<RankedRail>> {
    let places: Vec<Result<&PciFunction, &str>> = gpus
        .iter()
        .map(|g| g.function.as_ref().map_err(String::as_str))
        .collect();
    rails::order_for_gpus(&places, rails)
}

/// The order of GPU `selection` (ranked among all the machine's GPUs, so that GPUs with
/// equal rails take turns), or, without a GPU, the rails ranked by speed alone.
pub fn order_for(selection: GpuSelection, rails: &[Rail]) -> Vec<RankedRail> {
    let ordinal = match selection {
        GpuSelection::None => return rails::rank(Err("--gpu none: no GPU"), rails),
        GpuSelection::Index(ordinal) => ordinal,
    };
    match super::facts::gpus() {
        Ok(gpus) => match gpus.iter().position(|g| g.ordinal == ordinal) {
            Some(i) => gpu_orders(&gpus, rails).swap_remove(i),
            None => rails::rank(Err(&format!("no GPU {ordinal}")), rails),
        },
        Err(why) => rails::rank(Err(&why), rails),
    }
}

/// The rails a sender named (`--nic` or `--rails`), in order; none when it named neither
/// (then the route decides, as it always did) or when TCP carries the data. The caller
/// stripes over them or says in one line that only the first carries the transfer
/// ([`rails::several_rails_note`]).
pub fn sender_rails(args: &SendArgs, tcp: bool) -> Result<Vec<rails::RailId>> {
    if args.nic.is_none() && args.rails.is_none() {
        return Ok(Vec::new());
    }
    if tcp {
        eprintln!(
            "note: --nic and --rails choose RDMA rails; over TCP the data goes where the IP route goes"
        );
        return Ok(Vec::new());
    }
    let rails = rails::sysfs::here().map_err(anyhow::Error::msg)?;
    match &args.nic {
        Some(list) => rails::resolve_nic_list(list, &rails),
        None => rails::take_rails(&order_for(args.gpu, &rails), args.rails),
    }
    .map_err(anyhow::Error::msg)
}
