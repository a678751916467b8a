//! The RDMA devices of this machine: whether there is one at all, and what `host info`
//! shows about each (ports, state, MTU, link layer, GIDs).

use super::cm_id::{link_layer_name, mtu_bytes};
use super::context::{Context, DeviceList};
use super::{c_str, RdmaError};
use rdma_sys::*;
use std::net::Ipv6Addr;

/// One device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    pub name: String,
    pub node_guid: String,
    pub firmware: String,
    pub max_qp_wr: i32,
    pub max_cqe: i32,
    pub max_mr_size: u64,
    pub ports: Vec<PortSummary>,
}

/// One port of a device.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PortSummary {
    pub port: u8,
    pub state: String,
    pub link_layer: &'static str,
    pub active_mtu: u32,
    pub max_mtu: u32,
    pub max_msg_sz: u32,
    /// The physical link state ("LinkUp", "Polling", "Disabled", ...).
    pub phys_state: &'static str,
    /// The link's width and speed and what they carry, from `ibv_query_port`.
    pub link: Option<LinkRate>,
    /// The kernel's own words for the rate (sysfs `ports/N/rate`, "100 Gb/sec (4X EDR)").
    pub sysfs_rate: Option<String>,
    /// InfiniBand: the port's LID and the subnet manager's (0 until a subnet manager
    /// has configured the port).
    pub lid: u16,
    pub sm_lid: u16,
    pub gids: Vec<GidInfo>,
}

/// A port's link: lanes times the data rate of each.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LinkRate {
    /// "4X"
    pub width: &'static str,
    /// "EDR"
    pub speed: &'static str,
    /// Data rate of the whole link in Gb/s (10^9 bits/s), after line encoding, the way
    /// `ibstat` and sysfs state it.
    pub gbit_per_s: f64,
}

impl LinkRate {
    /// Decode `ibv_port_attr`'s `active_width` and `active_speed` (the enums of
    /// `ibv_query_port(3)`); `None` for values it does not define.
    pub fn decode(active_width: u8, active_speed: u8) -> Option<LinkRate> {
        let (width, lanes) = match active_width {
            1 => ("1X", 1.0),
            2 => ("4X", 4.0),
            4 => ("8X", 8.0),
            8 => ("12X", 12.0),
            16 => ("2X", 2.0),
            _ => return None,
        };
        let (speed, per_lane) = match active_speed {
            1 => ("SDR", 2.5),
            2 => ("DDR", 5.0),
            4 => ("QDR", 10.0),
            8 => ("FDR10", 10.0),
            16 => ("FDR", 14.0),
            32 => ("EDR", 25.0),
            64 => ("HDR", 50.0),
            128 => ("NDR", 100.0),
            _ => return None,
        };
        Some(LinkRate {
            width,
            speed,
            gbit_per_s: lanes * per_lane,
        })
    }

    /// "4X EDR, 100 Gb/s"
    pub fn describe(&self) -> String {
        format!("{} {}, {} Gb/s", self.width, self.speed, self.gbit_per_s)
    }
}

/// `phys_state` of `ibv_port_attr` in the words of `ibstat`.
pub fn phys_state_name(phys_state: u8) -> &'static str {
    match phys_state {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "PhyTest",
        _ => "unknown",
    }
}

/// What a port that cannot carry traffic needs, from its state (`ibv_port_state_str`'s
/// words: "active", "init", "down", ...), physical state and link layer; `None` when it
/// is active.
pub fn port_advice(state: &str, phys_state: &str, link_layer: &str) -> Option<String> {
    if state == "active" {
        return None;
    }
    Some(match (phys_state, link_layer) {
        ("Disabled", _) => "the port is disabled: enable it (ibportstate, or the NIC's tools)".into(),
        ("Polling", "Ethernet") => "no link: check the cable and the switch port (ip link shows the interface)".into(),
        ("Polling", _) => "no link: check the cable and that the switch (or the other end) is up".into(),
        ("LinkUp", "InfiniBand") => "the link is up but no subnet manager has configured the port: run one (opensm on a node, or the switch's own)".into(),
        ("LinkUp", _) => "the link is up but the port is not active: is its network interface up (ip link set IFACE up)?".into(),
        _ => format!("the port is not active ({state}, physical state {phys_state})"),
    })
}

/// One non-zero entry of a port's GID table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GidInfo {
    pub index: i32,
    pub gid: String,
    /// "RoCE v2", "IB/RoCE v1" (from sysfs; absent where sysfs does not say).
    pub gid_type: Option<String>,
    /// The network interface the GID belongs to (RoCE).
    pub netdev: Option<String>,
}

/// `Err(RdmaError::NoDevice)` when this machine has no RDMA device at all.
pub fn ensure_device() -> Result<(), RdmaError> {
    if DeviceList::get()?.len() == 0 {
        return Err(RdmaError::NoDevice);
    }
    Ok(())
}

/// Every device with its ports and GIDs. Errors if there is none.
pub fn devices() -> Result<Vec<DeviceInfo>, RdmaError> {
    let list = DeviceList::get()?;
    if list.len() == 0 {
        return Err(RdmaError::NoDevice);
    }
    list.names()
        .into_iter()
        .map(|name| describe(list.open(&name)?, name))
        .collect()
}

fn describe(ctx: Context, name: String) -> Result<DeviceInfo, RdmaError> {
    // SAFETY: plain data, overwritten by the query.
    let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
    // SAFETY: valid context and out-pointer.
    let ret = unsafe { ibv_query_device(ctx.as_ptr(), &mut attr) };
    if ret != 0 {
        return Err(RdmaError::verb("ibv_query_device", name, ret));
    }
    let firmware = {
        let bytes: Vec<u8> = attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let mut ports = Vec::new();
    for port in 1..=attr.phys_port_cnt {
        // SAFETY: plain data, overwritten by the query.
        let mut pattr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context, a port number the device reported, full-size out-pointer.
        let ret = unsafe { ___ibv_query_port(ctx.as_ptr(), port, &mut pattr) };
        if ret != 0 {
            return Err(RdmaError::verb(
                "ibv_query_port",
                format!("{name} port {port}"),
                ret,
            ));
        }
        let mut gids = Vec::new();
        for index in 0..pattr.gid_tbl_len {
            // SAFETY: plain data, overwritten by the query.
            let mut gid: ibv_gid = unsafe { std::mem::zeroed() };
            // SAFETY: valid context, port and index below the table length.
            if unsafe { ibv_query_gid(ctx.as_ptr(), port, index, &mut gid) } != 0 {
                continue;
            }
            // SAFETY: every bit pattern of the union is a valid [u8; 16].
            let raw = unsafe { gid.raw };
            if raw == [0; 16] {
                continue;
            }
            let sysfs = format!("/sys/class/infiniband/{name}/ports/{port}/gid_attrs");
            gids.push(GidInfo {
                index,
                gid: Ipv6Addr::from(raw).to_string(),
                gid_type: read_trimmed(&format!("{sysfs}/types/{index}")),
                netdev: read_trimmed(&format!("{sysfs}/ndevs/{index}")),
            });
        }
        ports.push(PortSummary {
            port,
            // SAFETY: returns a static string for any value.
            state: c_str(unsafe { ibv_port_state_str(pattr.state) }, "?"),
            link_layer: link_layer_name(pattr.link_layer),
            active_mtu: mtu_bytes(pattr.active_mtu),
            max_mtu: mtu_bytes(pattr.max_mtu),
            max_msg_sz: pattr.max_msg_sz,
            phys_state: phys_state_name(pattr.phys_state),
            link: LinkRate::decode(pattr.active_width, pattr.active_speed),
            sysfs_rate: read_trimmed(&format!("/sys/class/infiniband/{name}/ports/{port}/rate")),
            lid: pattr.lid,
            sm_lid: pattr.sm_lid,
            gids,
        });
    }
    let guid = u64::from_be(attr.node_guid);
    Ok(DeviceInfo {
        name,
        node_guid: format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            guid >> 48,
            (guid >> 32) & 0xffff,
            (guid >> 16) & 0xffff,
            guid & 0xffff
        ),
        firmware,
        max_qp_wr: attr.max_qp_wr,
        max_cqe: attr.max_cqe,
        max_mr_size: attr.max_mr_size,
        ports,
    })
}

fn read_trimmed(path: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_rates_are_lanes_times_the_lane_rate() {
        assert_eq!(
            LinkRate::decode(2, 32).unwrap().describe(),
            "4X EDR, 100 Gb/s"
        );
        assert_eq!(
            LinkRate::decode(2, 64).unwrap().describe(),
            "4X HDR, 200 Gb/s"
        );
        assert_eq!(
            LinkRate::decode(2, 128).unwrap().describe(),
            "4X NDR, 400 Gb/s"
        );
        assert_eq!(
            LinkRate::decode(1, 4).unwrap().describe(),
            "1X QDR, 10 Gb/s"
        );
        assert_eq!(LinkRate::decode(16, 64).unwrap().gbit_per_s, 100.0);
        assert_eq!(
            LinkRate::decode(8, 1).unwrap().describe(),
            "12X SDR, 30 Gb/s"
        );
        assert_eq!(LinkRate::decode(0, 32), None);
        assert_eq!(LinkRate::decode(2, 0), None);
        assert_eq!(LinkRate::decode(3, 32), None);
    }

    #[test]
    fn a_port_that_is_not_active_says_what_it_needs() {
        assert_eq!(port_advice("active", "LinkUp", "InfiniBand"), None);
        assert!(port_advice("init", "LinkUp", "InfiniBand")
            .unwrap()
            .contains("no subnet manager"));
        assert!(port_advice("down", "Polling", "Ethernet")
            .unwrap()
            .starts_with("no link: check the cable"));
        assert!(port_advice("down", "Disabled", "InfiniBand")
            .unwrap()
            .starts_with("the port is disabled"));
        assert_eq!(phys_state_name(5), "LinkUp");
        assert_eq!(phys_state_name(2), "Polling");
        assert_eq!(phys_state_name(0), "unknown");
    }
}
