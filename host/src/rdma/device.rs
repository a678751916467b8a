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
    pub gids: Vec<GidInfo>,
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
