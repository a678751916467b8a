//! Joining a transfer's extra streams (sockets 1..N, each opened with a [`Hello`] carrying
//! the connection's token) to the transfer that offered them.
//!
//! A stream joins only an open route: one whose offer came from the same address, that
//! still waits for this stream index, and whose count the hello repeats. The route is
//! dropped as soon as the last stream is in (or when its transfer ends), so a known token
//! cannot be used to pile sockets up on the receiver.

use super::frames::Hello;
use crate::server::allow::peer_key;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard};

/// The streams handed over to a transfer: (stream index, its rail, socket).
pub type Joined = mpsc::Receiver<(u16, u16, TcpStream)>;

/// A transfer still gathering its streams.
struct Route {
    /// The offering peer's address: streams from any other are refused.
    peer: IpAddr,
    count: u16,
    /// A striped transfer's streams come from the sender's other interfaces: any
    /// address may join it (that passed `--allow`), with the token.
    striped: bool,
    /// Stream indices handed over so far (bit i: stream i; stream 0 is the offer's).
    seen: u64,
    /// Tells this route from a later one with the same token.
    serial: u64,
    to: mpsc::Sender<(u16, u16, TcpStream)>,
}

impl Route {
    fn all_seen(&self) -> bool {
        self.seen.count_ones() == self.count as u32
    }
}

/// The open routes, by token.
#[derive(Default)]
pub struct Routes {
    map: Mutex<HashMap<u64, Route>>,
    serial: AtomicU64,
}

impl Routes {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Route>> {
        // Each operation leaves the map consistent: a panic elsewhere cannot tear it.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open a route for a transfer of `count` streams offered by `peer` under `token`:
    /// its streams arrive on the receiver, and the route closes when the guard is
    /// dropped. `None` if another transfer uses the token now.
    pub fn open(
        &self,
        token: u64,
        peer: IpAddr,
        count: u16,
        striped: bool,
    ) -> Option<(RouteGuard<'_>, Joined)> {
        let (to, joined) = mpsc::channel();
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let guard = RouteGuard {
            routes: self,
            token,
            serial,
        };
        if count > 1 {
            let mut map = self.lock();
            if map.contains_key(&token) {
                return None;
            }
            let route = Route {
                peer: peer_key(peer),
                striped,
                count,
                seen: 1,
                serial,
                to,
            };
            map.insert(token, route);
        }
        Some((guard, joined))
    }

    /// Give an extra stream to the transfer whose token it carries; else the socket
    /// back, with why not.
    pub fn hand_over(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        hello: Hello,
    ) -> Result<(), (TcpStream, &'static str)> {
        let mut map = self.lock();
        let why = match map.get_mut(&hello.token) {
            None => {
                "a stream of a connection this receiver does not serve (or that has all its streams)"
            }
            Some(route) if !route.striped && route.peer != peer_key(peer.ip()) => {
                "a stream from another address than its connection's offer"
            }
            Some(route) if route.count != hello.count => {
                "a stream whose count differs from its offer's"
            }
            Some(route) if route.seen & (1 << hello.index) != 0 => "a stream index that repeats",
            Some(route) => {
                route.seen |= 1 << hello.index;
                let delivered = route.to.send((hello.index, hello.rail, stream)).is_ok();
                if route.all_seen() || !delivered {
                    // Gathered (or the transfer is gone): nothing more may join it.
                    map.remove(&hello.token);
                }
                return Ok(());
            }
        };
        Err((stream, why))
    }
}

/// Closes a transfer's route when it ends, however it ends (unless a later transfer with
/// the same token has one by then).
pub struct RouteGuard<'a> {
    routes: &'a Routes,
    token: u64,
    serial: u64,
}

impl Drop for RouteGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.routes.lock();
        if map
            .get(&self.token)
            .is_some_and(|r| r.serial == self.serial)
        {
            map.remove(&self.token);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A connected socket (its peer end is dropped: only the descriptor matters here).
    fn socket(listener: &TcpListener) -> TcpStream {
        TcpStream::connect(listener.local_addr().unwrap()).unwrap()
    }

    #[test]
    fn streams_join_only_from_the_offering_address_once_each_until_gathered() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let routes = Routes::default();
        let me: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let other: SocketAddr = "127.0.0.2:5000".parse().unwrap();
        let hello = |index| Hello {
            index,
            count: 3,
            rail: 0,
            token: 9,
        };
        let (guard, joined) = routes.open(9, me.ip(), 3, false).unwrap();
        assert!(
            routes.open(9, me.ip(), 3, false).is_none(),
            "the token is in use"
        );
        let why = |r: Result<(), (TcpStream, &'static str)>| r.unwrap_err().1;
        assert!(
            why(routes.hand_over(socket(&listener), other, hello(1))).contains("another address")
        );
        assert!(why(routes.hand_over(socket(&listener), me, hello(0))).contains("repeats"));
        let wrong_count = Hello {
            count: 4,
            ..hello(1)
        };
        assert!(why(routes.hand_over(socket(&listener), me, wrong_count)).contains("count differs"));
        routes.hand_over(socket(&listener), me, hello(1)).unwrap();
        assert!(why(routes.hand_over(socket(&listener), me, hello(1))).contains("repeats"));
        routes.hand_over(socket(&listener), me, hello(2)).unwrap();
        assert_eq!(
            joined.try_iter().map(|(i, _, _)| i).collect::<Vec<_>>(),
            [1, 2]
        );
        assert!(
            routes.lock().is_empty(),
            "dropped as soon as all streams are in"
        );
        assert!(why(routes.hand_over(socket(&listener), me, hello(2))).contains("does not serve"));
        drop(guard);
        let (_again, _) = routes
            .open(9, me.ip(), 3, false)
            .expect("the token is free again");
    }

    #[test]
    fn a_striped_transfers_streams_may_come_from_the_senders_other_addresses() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let routes = Routes::default();
        let me: SocketAddr = "10.71.1.1:5000".parse().unwrap();
        let other_rail: SocketAddr = "10.71.2.1:5000".parse().unwrap();
        let (_guard, joined) = routes.open(5, me.ip(), 2, true).unwrap();
        let hello = Hello {
            index: 1,
            count: 2,
            rail: 1,
            token: 5,
        };
        routes
            .hand_over(socket(&listener), other_rail, hello)
            .unwrap();
        assert_eq!(
            joined
                .try_iter()
                .map(|(i, r, _)| (i, r))
                .collect::<Vec<_>>(),
            [(1, 1)]
        );
    }

    #[test]
    fn a_route_closes_with_its_transfer_but_not_a_later_ones() {
        let routes = Routes::default();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let (first, _) = routes.open(1, ip, 2, false).unwrap();
        drop(first);
        assert!(routes.lock().is_empty());
        let (single, _) = routes.open(2, ip, 1, false).unwrap();
        assert!(routes.lock().is_empty(), "one stream: nothing to route");
        drop(single);
    }
}
