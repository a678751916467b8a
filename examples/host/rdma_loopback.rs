//! Tutorial example 3 (docs/tutorial.md, steps 7 and 8): the verbs wrappers of
//! `host::rdma` in one process, in the manner of rdma-core's rdma_server + rdma_client
//! and rust-ibverbs' loopback.rs. A listener and a client on the same RDMA device
//! connect; the client SENDs one registered buffer; the server's posted receive gets it
//! and is checked element by element.
//!
//! ```sh
//! cargo run -p host-examples --bin rdma-loopback -- ADDRESS [PORT]
//! ```
//!
//! ADDRESS is an IP address of an RDMA device's interface (in the Soft-RoCE guest:
//! 192.0.2.1, rxe0's). Each wrapper owns one C object and holds an `Rc` of what it was
//! made from, so it cannot outlive its parent; every wait has a deadline.

use anyhow::{bail, Context as _, Result};
use host::memory::host_buffer::{leading_values, verify_bytes};
use host::memory::HostBuffer;
use host::rdma::CmEventKind::{self, AddrResolved, Disconnected, Established, RouteResolved};
use host::rdma::{
    CmId, Completion, CompletionQueue, ConnParams, Deadline, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, SendOp, SendWr,
};
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

/// The message: 16 KiB, 4096 elements of the pattern.
const BYTES: usize = 16 * 1024;
/// Every wait ends, one way or another.
const TIMEOUT: Duration = Duration::from_secs(10);
/// One SEND and one receive in flight at most; nothing inline (the NIC reads the region).
const CAPS: QpCaps = QpCaps {
    max_send_wr: 1,
    max_recv_wr: 1,
    max_inline_data: 0,
};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}"); // one line; without a device, where to look
            ExitCode::FAILURE
        }
    }
}

/// Wait for the next connection-manager event on `channel`; it must be `want`.
fn expect(channel: &EventChannel, want: CmEventKind, what: &str) -> Result<()> {
    let event = channel.get_event(&Deadline::after(TIMEOUT), what)?;
    if event.kind() != want {
        bail!(
            "waiting for {what}: got {} (status {})",
            event.name(),
            event.status()
        );
    }
    Ok(()) // dropping the event acknowledges it (rdma_ack_cm_event)
}

/// Wait for one work completion on `cq` and check its status.
fn completion(cq: &CompletionQueue, what: &str) -> Result<Completion> {
    let mut done = Vec::new();
    cq.wait(&mut done, &Deadline::after(TIMEOUT), &[], what)?;
    let c = *done
        .first()
        .with_context(|| format!("no completion for {what}"))?;
    c.check(|| what.to_string())?;
    Ok(c)
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (ip, port) = match args.as_slice() {
        [ip] => (ip, "7479"),
        [ip, port] => (ip, port.as_str()),
        _ => bail!("usage: rdma-loopback ADDRESS [PORT] (ADDRESS: an IP of an RDMA device)"),
    };
    let ip: IpAddr = ip
        .parse()
        .with_context(|| format!("`{ip}` is not an IP address"))?;
    let port: u16 = port
        .parse()
        .with_context(|| format!("`{port}` is not a port"))?;
    let addr = SocketAddr::new(ip, port);

    // 1. The server listens. An event channel is where the RDMA connection manager (CM)
    //    reports; binding to the address picks the RDMA device that carries it.
    let listen_channel = EventChannel::new()?; // no RDMA device: the error says so, here
    let listener = CmId::new(&listen_channel)?;
    listener.bind(addr)?;
    listener.listen(1)?;

    // 2. The client resolves the address to a device and port, then a route, as a TCP
    //    client would before connecting; both finish as events on its own channel.
    let client_channel = EventChannel::new()?;
    let client = CmId::new(&client_channel)?;
    client.resolve_addr(addr, TIMEOUT)?;
    expect(&client_channel, AddrResolved, "resolving the address")?;
    client.resolve_route(TIMEOUT)?;
    expect(&client_channel, RouteResolved, "resolving the route")?;
    println!(
        "client: {addr} resolved on device {}",
        client.device_name().unwrap_or_default()
    );

    // 3. The client's verbs objects. The message is registered before the queue pair is
    //    made: a queue pair takes only regions that outlive it, so declaring them in
    //    this order is what lets it compile, and it tears down in the reverse order.
    let message = HostBuffer::with_pattern(BYTES)?; // data[i] = 2 * i
    let client_pd = ProtectionDomain::new(&client)?;
    let send_region = MemoryRegion::register(&client_pd, &message)?; // pins it, gives keys
    let client_cq = CompletionQueue::new(&client, 4, None)?; // polled, no event channel
    let client_qp = QueuePair::new(&client, &client_pd, &client_cq, &client_cq, CAPS)?;
    client.connect(&ConnParams::with_private_data(&[]))?;

    // 4. The server takes the request: a new CM id for this connection, on its own
    //    channel. Its receive buffer is registered and a receive posted *before* it
    //    accepts, so the SEND can never find the queue empty.
    let request = listen_channel
        .get_event(&Deadline::after(TIMEOUT), "the connect request")?
        .into_connect_request(&listen_channel)?;
    let server = request.id;
    let inbox = HostBuffer::poisoned(BYTES)?; // nothing in it verifies until data lands
    let server_pd = ProtectionDomain::new(&server)?;
    let recv_region = MemoryRegion::register(&server_pd, &inbox)?;
    let server_cq = CompletionQueue::new(&server, 4, None)?;
    let server_qp = QueuePair::new(&server, &server_pd, &server_cq, &server_cq, CAPS)?;
    // SAFETY: nothing reads or writes `inbox` until this receive's completion is polled
    // below (or the queue pair is destroyed): the NIC writes it when the SEND arrives.
    unsafe { server_qp.post_recv(1, Some(recv_region.sge(0..BYTES)?))? };
    server.accept(&ConnParams::with_private_data(&[]))?;
    expect(&client_channel, Established, "client: established")?;
    expect(server.channel(), Established, "server: established")?;

    // 5. One SEND of the whole registered buffer, signaled so that it reports back.
    let send = SendWr {
        wr_id: 2,
        sge: send_region.sge(0..BYTES)?,
        op: SendOp::Send,
        signaled: true,
        inline: false,
        solicited: false,
    };
    // SAFETY: `message` is not written again (it is never written after this point),
    // so it is untouched until the completion polled just below.
    unsafe { client_qp.post_send(&send)? };
    completion(&client_cq, "the SEND")?;
    let received = completion(&server_cq, "the receive")?;

    // 6. The receive is complete, so the NIC is done with `inbox`: check every element.
    let data = inbox.read_prefix(received.byte_len as usize);
    let check = verify_bytes(&data);
    let first = leading_values(&data, 5);
    println!(
        "server: received {} bytes, first values {first:?}",
        data.len()
    );
    if data.len() != BYTES || !check.ok() {
        let (n, wrong) = (data.len(), check.mismatches);
        bail!(
            "{n} bytes received of {BYTES}, {wrong} of {} elements wrong",
            check.elements
        );
    }
    println!(
        "server: verified: all {} elements match the pattern",
        check.elements
    );

    // 7. Disconnect: the client asks (a DREQ), the server sees DISCONNECTED and answers
    //    with its own disconnect (the DREP), which the client then sees. Then everything
    //    is dropped in reverse order of creation: queue pairs, completion queues,
    //    regions, PDs, ids, channels.
    client.disconnect()?;
    expect(server.channel(), Disconnected, "server: disconnected")?;
    server.disconnect()?;
    expect(&client_channel, Disconnected, "client: disconnected")?;
    Ok(())
}
