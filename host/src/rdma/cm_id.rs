//! `rdma_cm_id`: one end of a connection (or a listener), managed by the RDMA CM.

use super::{c_str, EventChannel, RdmaError};
use rdma_sys::*;
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr::NonNull;
use std::rc::Rc;
use std::time::Duration;

/// Most private data an RC connect request can carry (IB CM REQ minus the CMA header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept (REP) can carry.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data a reject (REJ) can carry.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// `link_layer` values of `ibv_port_attr` (an anonymous enum in verbs.h).
const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// An RDMA CM identifier. Owns the id; keeps its event channel alive.
pub struct CmId {
    raw: NonNull<rdma_cm_id>,
    channel: Rc<EventChannel>,
    has_qp: Cell<bool>,
}

/// Connection parameters for connect and accept.
#[derive(Debug, Clone)]
pub struct ConnParams<'a> {
    pub private_data: &'a [u8],
    /// RDMA reads/atomics this side accepts in flight (we use none, 1 is the minimum sane).
    pub responder_resources: u8,
    /// RDMA reads/atomics this side issues in flight.
    pub initiator_depth: u8,
    /// Transport retries on a lost packet (max 7).
    pub retry_count: u8,
    /// Retries on "receiver not ready"; 7 means forever.
    pub rnr_retry_count: u8,
}

impl<'a> ConnParams<'a> {
    pub fn with_private_data(private_data: &'a [u8]) -> Self {
        ConnParams {
            private_data,
            responder_resources: 1,
            initiator_depth: 1,
            // 7 would mean "retry forever" to Soft-RoCE (rxe_comp.c), so a vanished peer
            // would never surface as an error; 6 is finite on every device.
            retry_count: 6,
            rnr_retry_count: 7,
        }
    }

    fn to_raw(&self, max: usize, verb: &'static str) -> Result<rdma_conn_param, RdmaError> {
        if self.private_data.len() > max {
            return Err(RdmaError::InvalidArgument(format!(
                "{verb}: {} bytes of private data, at most {max} fit",
                self.private_data.len()
            )));
        }
        Ok(rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: 1,
            retry_count: self.retry_count.min(7),
            rnr_retry_count: self.rnr_retry_count.min(7),
            srq: 0,
            qp_num: 0,
        })
    }
}

/// What the port an id is bound to can do.
#[derive(Debug, Clone, Copy)]
pub struct PortInfo {
    pub port_num: u8,
    /// Largest message (one work request) the port carries.
    pub max_msg_sz: u32,
    /// Active path MTU in bytes.
    pub active_mtu: u32,
    pub link_layer: &'static str,
}

impl CmId {
    /// A new id for a reliable connection (RDMA_PS_TCP) reporting on `channel`.
    pub fn new(channel: &Rc<EventChannel>) -> Result<Rc<Self>, RdmaError> {
        let mut raw: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: valid channel and out-pointer; no context pointer is used.
        let ret = unsafe {
            rdma_create_id(
                channel.as_ptr(),
                &mut raw,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 {
            let errno = super::last_errno();
            if errno == libc::ENODEV {
                return Err(RdmaError::NoDevice);
            }
            return Err(RdmaError::verb("rdma_create_id", "", errno));
        }
        match NonNull::new(raw) {
            // SAFETY: a fresh id created on `channel`.
            Some(raw) => Ok(unsafe { Self::from_raw(raw, channel.clone()) }),
            None => Err(RdmaError::verb("rdma_create_id", "returned no id", 0)),
        }
    }

    /// Take ownership of an id.
    ///
    /// # Safety
    /// `raw` must be a valid id that nobody else destroys, reporting on `channel`, with
    /// all its events acknowledged.
    pub(crate) unsafe fn from_raw(raw: NonNull<rdma_cm_id>, channel: Rc<EventChannel>) -> Rc<Self> {
        Rc::new(CmId {
            raw,
            channel,
            has_qp: Cell::new(false),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut rdma_cm_id {
        self.raw.as_ptr()
    }

    pub fn channel(&self) -> &Rc<EventChannel> {
        &self.channel
    }

    /// The verbs context of the device the id is bound to (after address resolution, or
    /// for an id from a connect request).
    pub(crate) fn verbs(&self) -> Result<NonNull<ibv_context>, RdmaError> {
        // SAFETY: the id is valid; `verbs` is a plain field set by the CM.
        let verbs = unsafe { (*self.raw.as_ptr()).verbs };
        NonNull::new(verbs).ok_or_else(|| {
            RdmaError::InvalidArgument("the RDMA CM id is not bound to a device yet".into())
        })
    }

    pub(crate) fn claim_qp(&self) -> bool {
        !self.has_qp.replace(true)
    }

    pub(crate) fn release_qp(&self) {
        self.has_qp.set(false);
    }

    /// The name of the device the id is bound to ("rxe0", "mlx5_0").
    pub fn device_name(&self) -> Option<String> {
        let verbs = self.verbs().ok()?;
        // SAFETY: a bound id's context and its device are valid while the id lives;
        // ibv_get_device_name returns a string owned by the device.
        let name = unsafe { ibv_get_device_name((*verbs.as_ptr()).device) };
        Some(c_str(name, "?"))
    }

    pub fn bind(&self, addr: SocketAddr) -> Result<(), RdmaError> {
        let mut storage = to_sockaddr(addr);
        // SAFETY: valid id; storage holds a sockaddr of addr's family, read during the call.
        let ret = unsafe {
            rdma_bind_addr(
                self.as_ptr(),
                (&mut storage as *mut libc::sockaddr_storage).cast(),
            )
        };
        if ret != 0 {
            let errno = super::last_errno();
            return Err(match errno {
                libc::ENODEV => RdmaError::NoDevice,
                libc::EADDRINUSE | libc::EADDRNOTAVAIL => RdmaError::AddressUnavailable {
                    addr: addr.to_string(),
                    errno,
                },
                _ => RdmaError::verb("rdma_bind_addr", addr.to_string(), errno),
            });
        }
        Ok(())
    }

    pub fn listen(&self, backlog: i32) -> Result<(), RdmaError> {
        // SAFETY: valid, bound id.
        if unsafe { rdma_listen(self.as_ptr(), backlog) } != 0 {
            return Err(RdmaError::last("rdma_listen", || {
                self.local_addr().map(|a| a.to_string()).unwrap_or_default()
            }));
        }
        Ok(())
    }

    /// Start resolving `dst` to a device and port; completes with ADDR_RESOLVED/ADDR_ERROR.
    pub fn resolve_addr(&self, dst: SocketAddr, timeout: Duration) -> Result<(), RdmaError> {
        let mut storage = to_sockaddr(dst);
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: valid id; storage holds a sockaddr of dst's family; no source address.
        let ret = unsafe {
            rdma_resolve_addr(
                self.as_ptr(),
                std::ptr::null_mut(),
                (&mut storage as *mut libc::sockaddr_storage).cast(),
                ms,
            )
        };
        if ret != 0 {
            let errno = super::last_errno();
            if errno == libc::ENODEV {
                return Err(RdmaError::NoDevice);
            }
            return Err(RdmaError::verb("rdma_resolve_addr", dst.to_string(), errno));
        }
        Ok(())
    }

    /// Start resolving the route; completes with ROUTE_RESOLVED/ROUTE_ERROR.
    pub fn resolve_route(&self, timeout: Duration) -> Result<(), RdmaError> {
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: valid id with a resolved address.
        if unsafe { rdma_resolve_route(self.as_ptr(), ms) } != 0 {
            return Err(RdmaError::last("rdma_resolve_route", || self.peer_label()));
        }
        Ok(())
    }

    /// Send the connect request (the QP must exist); completes with ESTABLISHED, REJECTED,
    /// UNREACHABLE or CONNECT_ERROR.
    pub fn connect(&self, params: &ConnParams) -> Result<(), RdmaError> {
        let mut raw = params.to_raw(MAX_CONNECT_PRIVATE_DATA, "rdma_connect")?;
        // SAFETY: valid id; raw points to private data that lives across the call (the CM
        // copies it into the request).
        if unsafe { rdma_connect(self.as_ptr(), &mut raw) } != 0 {
            return Err(RdmaError::last("rdma_connect", || self.peer_label()));
        }
        Ok(())
    }

    /// Accept a connect request (the QP must exist and have its receives posted).
    pub fn accept(&self, params: &ConnParams) -> Result<(), RdmaError> {
        let mut raw = params.to_raw(MAX_ACCEPT_PRIVATE_DATA, "rdma_accept")?;
        // SAFETY: valid id from a connect request; private data copied during the call.
        if unsafe { rdma_accept(self.as_ptr(), &mut raw) } != 0 {
            return Err(RdmaError::last("rdma_accept", || self.peer_label()));
        }
        Ok(())
    }

    /// Reject a connect request, with `private_data` telling the peer why.
    pub fn reject(&self, private_data: &[u8]) -> Result<(), RdmaError> {
        if private_data.len() > MAX_REJECT_PRIVATE_DATA {
            return Err(RdmaError::InvalidArgument(format!(
                "rdma_reject: {} bytes of private data, at most {MAX_REJECT_PRIVATE_DATA} fit",
                private_data.len()
            )));
        }
        let ptr = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: valid id from a connect request; the data is copied during the call.
        if unsafe { rdma_reject(self.as_ptr(), ptr, private_data.len() as u8) } != 0 {
            return Err(RdmaError::last("rdma_reject", || self.peer_label()));
        }
        Ok(())
    }

    /// Start a disconnect; the peer (and this side) see DISCONNECTED.
    pub fn disconnect(&self) -> Result<(), RdmaError> {
        // SAFETY: valid id.
        if unsafe { rdma_disconnect(self.as_ptr()) } != 0 {
            return Err(RdmaError::last("rdma_disconnect", || self.peer_label()));
        }
        Ok(())
    }

    /// The port the id is bound to: its largest message, MTU and link layer.
    pub fn port_info(&self) -> Result<PortInfo, RdmaError> {
        let verbs = self.verbs()?;
        // SAFETY: valid id; port_num is a plain field.
        let port_num = unsafe { (*self.raw.as_ptr()).port_num };
        // SAFETY: ibv_port_attr is plain data; all-zero is a valid value to be overwritten.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context of a bound id and an out-pointer to a full ibv_port_attr
        // (this is what the ibv_query_port macro of verbs.h expands to).
        let ret = unsafe { ___ibv_query_port(verbs.as_ptr(), port_num, &mut attr) };
        if ret != 0 {
            return Err(RdmaError::verb(
                "ibv_query_port",
                format!("port {port_num}"),
                ret,
            ));
        }
        Ok(PortInfo {
            port_num,
            max_msg_sz: attr.max_msg_sz,
            active_mtu: mtu_bytes(attr.active_mtu),
            link_layer: link_layer_name(attr.link_layer),
        })
    }

    /// The peer's address (after resolution, or of a connect request).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: valid id; the route's destination address is plain data in the id,
        // read as a sockaddr whose family field says which variant is valid.
        unsafe { from_sockaddr(rdma_get_peer_addr(&*self.raw.as_ptr())) }.map(canonical)
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in peer_addr.
        unsafe { from_sockaddr(rdma_get_local_addr(&*self.raw.as_ptr())) }.map(canonical)
    }

    fn peer_label(&self) -> String {
        self.peer_addr().map(|a| a.to_string()).unwrap_or_default()
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP (which holds an Rc to this id) is gone, so is every PD/CQ made
        // on the id's context; all events of the id were acked by their guards.
        unsafe { rdma_destroy_id(self.raw.as_ptr()) };
    }
}

pub(crate) fn mtu_bytes(mtu: ibv_mtu::Type) -> u32 {
    match mtu {
        ibv_mtu::IBV_MTU_256 => 256,
        ibv_mtu::IBV_MTU_512 => 512,
        ibv_mtu::IBV_MTU_1024 => 1024,
        ibv_mtu::IBV_MTU_2048 => 2048,
        ibv_mtu::IBV_MTU_4096 => 4096,
        _ => 0,
    }
}

pub(crate) fn link_layer_name(link_layer: u8) -> &'static str {
    match link_layer {
        IBV_LINK_LAYER_INFINIBAND => "InfiniBand",
        IBV_LINK_LAYER_ETHERNET => "Ethernet",
        _ => "unspecified",
    }
}

/// A socket address as the C `sockaddr_storage` the CM takes.
pub(crate) fn to_sockaddr(addr: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut storage as *mut libc::sockaddr_storage).cast(), sin6) };
        }
    }
    storage
}

/// A socket address from a C sockaddr, if it is IPv4 or IPv6 (and not unspecified-family).
///
/// # Safety
/// `sa` must point to storage large enough for the address its family field announces.
pub(crate) unsafe fn from_sockaddr(sa: &libc::sockaddr) -> Option<SocketAddr> {
    match sa.sa_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in (caller's promise).
            let sin = unsafe { &*(sa as *const libc::sockaddr).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6 (caller's promise).
            let sin6 = unsafe { &*(sa as *const libc::sockaddr).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Show IPv4-mapped IPv6 addresses (what the CM reports for IPv4 peers on an IPv6
/// listener) as plain IPv4.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    if let SocketAddr::V6(a) = addr {
        if let Some(v4) = a.ip().to_ipv4_mapped() {
            return SocketAddr::new(IpAddr::V4(v4), a.port());
        }
    }
    addr
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip_through_sockaddr() {
        for text in [
            "192.0.2.1:7471",
            "[fe80::1]:7471",
            "0.0.0.0:0",
            "[::]:65535",
        ] {
            let addr: SocketAddr = text.parse().unwrap();
            let storage = to_sockaddr(addr);
            // SAFETY: storage is a full sockaddr_storage.
            let back =
                unsafe { from_sockaddr(&*(&storage as *const libc::sockaddr_storage).cast()) };
            assert_eq!(back, Some(addr), "{text}");
        }
    }

    #[test]
    fn port_is_in_network_order() {
        let storage = to_sockaddr("192.0.2.1:7471".parse().unwrap());
        // SAFETY: storage holds a sockaddr_in.
        let sin =
            unsafe { &*(&storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
        assert_eq!(sin.sin_port, 7471u16.to_be());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [192, 0, 2, 1]);
    }

    #[test]
    fn mapped_addresses_are_shown_as_ipv4() {
        let a: SocketAddr = "[::ffff:192.0.2.1]:5000".parse().unwrap();
        assert_eq!(canonical(a).to_string(), "192.0.2.1:5000");
    }

    #[test]
    fn private_data_limits_are_enforced_before_the_call() {
        let data = [0u8; 57];
        let p = ConnParams::with_private_data(&data);
        assert!(p.to_raw(MAX_CONNECT_PRIVATE_DATA, "rdma_connect").is_err());
        assert!(p.to_raw(MAX_ACCEPT_PRIVATE_DATA, "rdma_accept").is_ok());
    }
}
