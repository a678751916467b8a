//! The device's asynchronous events (`ibv_get_async_event`): a port going down, the
//! device failing. Port and device events reach every context of a device, so each
//! connection opens a context of its own just to hear them ([`DeviceEvents`]) and watches
//! its descriptor beside its completions: nothing is shared between connections' threads,
//! and a transfer the event touches ends at once with the event in words instead of
//! after its retries run out. (Events about one queue pair go to the RDMA CM's context,
//! which this program does not read; such a queue pair's work requests fail anyway.)

use super::context::Context;
use super::{set_nonblocking, RdmaError};
use rdma_sys::*;
use std::os::fd::RawFd;

/// `enum ibv_event_type` values, read as numbers: a newer kernel may report one the
/// bindings' Rust enum does not list.
const IBV_EVENT_DEVICE_FATAL: u32 = 8;
const IBV_EVENT_PORT_ACTIVE: u32 = 9;
const IBV_EVENT_PORT_ERR: u32 = 10;

/// A device context of our own, read for its asynchronous events.
pub struct DeviceEvents {
    ctx: Context,
    device: String,
    port: u8,
}

impl DeviceEvents {
    /// Listen to device `device`'s events, as they concern port `port`.
    pub fn open(device: &str, port: u8) -> Result<DeviceEvents, RdmaError> {
        let ctx = Context::open_named(device)?;
        let events = DeviceEvents {
            ctx,
            device: device.to_string(),
            port,
        };
        set_nonblocking(events.fd(), "asynchronous event descriptor")?;
        Ok(events)
    }

    /// Readable when an event is there.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the context is open while self lives; async_fd is a plain field.
        unsafe { (*self.ctx.as_ptr()).async_fd }
    }

    /// Take every event that is there (acknowledging each); the last one that ends
    /// transfers on our port, in words, unless the port came back after it.
    pub fn take_fault(&self) -> Result<Option<String>, RdmaError> {
        let mut fault = None;
        loop {
            // SAFETY: ibv_async_event is plain data; all-zero is a valid value.
            let mut event: ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: open context and a valid out-pointer; the descriptor is non-blocking,
            // so the call returns -1 with EAGAIN instead of waiting.
            if unsafe { ibv_get_async_event(self.ctx.as_ptr(), &mut event) } != 0 {
                let errno = super::last_errno();
                if errno == libc::EAGAIN || errno == libc::EINTR {
                    return Ok(fault);
                }
                return Err(RdmaError::verb("ibv_get_async_event", &*self.device, errno));
            }
            // SAFETY: the field is a C enum, an int: read as the number it is.
            let kind = unsafe { *(&event.event_type as *const _ as *const u32) };
            // SAFETY: for port events the union holds the port number (ints throughout).
            let port = unsafe { event.element.port_num };
            // SAFETY: the event was returned by ibv_get_async_event and is acked once.
            unsafe { ibv_ack_async_event(&mut event) };
            match classify(kind, port, self.port) {
                Some(Fault::Down) => {
                    fault = Some(format!(
                        "port {port} of RDMA device {} went down (IBV_EVENT_PORT_ERR)",
                        self.device
                    ))
                }
                Some(Fault::Fatal) => {
                    fault = Some(format!(
                        "RDMA device {} failed (IBV_EVENT_DEVICE_FATAL)",
                        self.device
                    ))
                }
                Some(Fault::Back) => fault = None,
                None => {}
            }
        }
    }
}

/// What an event means for a transfer on `our_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Down,
    Fatal,
    /// The port is active again (an earlier `Down` in the same batch no longer holds).
    Back,
}

fn classify(kind: u32, port: i32, our_port: u8) -> Option<Fault> {
    let ours = port == i32::from(our_port);
    match kind {
        IBV_EVENT_DEVICE_FATAL => Some(Fault::Fatal),
        IBV_EVENT_PORT_ERR if ours => Some(Fault::Down),
        IBV_EVENT_PORT_ACTIVE if ours => Some(Fault::Back),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_ports_events_and_device_failures_count() {
        assert_eq!(classify(IBV_EVENT_PORT_ERR, 1, 1), Some(Fault::Down));
        assert_eq!(classify(IBV_EVENT_PORT_ERR, 2, 1), None);
        assert_eq!(classify(IBV_EVENT_PORT_ACTIVE, 1, 1), Some(Fault::Back));
        assert_eq!(classify(IBV_EVENT_DEVICE_FATAL, 0, 1), Some(Fault::Fatal));
        // Events about objects (QP, CQ), LID/GID changes, and numbers from the future.
        for kind in [0, 1, 4, 11, 18, 19, 99] {
            assert_eq!(classify(kind, 1, 1), None, "{kind}");
        }
    }
}
