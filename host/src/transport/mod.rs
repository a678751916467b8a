//! Which transport a run takes (`--transport`: verbs, TCP, or `auto`), and why, for the
//! faces (the command line, the library). What carries the bytes is
//! [`crate::net`] (the links: [`crate::net::tcp`], [`crate::net::verbs`]); what runs
//! over them is [`crate::engine`]; the messages both ends exchange are [`crate::wire`]'s.

/// `--transport`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// Verbs through librdmacm (needs an RDMA device).
    Rdma,
    /// TCP sockets (any machine).
    Tcp,
    /// rdma when this machine has an RDMA device, else tcp.
    Auto,
}

/// The transport a run uses, and why, for a `note:` line when it was chosen for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    pub kind: TransportKind,
    pub note: Option<String>,
    /// The RDMA device the route to the peer leaves through, where the RDMA CM resolved
    /// it (a sender under `rdma` or `auto`).
    pub route_device: Option<String>,
}

/// Resolve `auto` from whether RDMA can be used (`rdma` is the answer: an RDMA device
/// exists and, for a sender, the CM resolves the peer's address to it; or why not),
/// passed in so that the decision can be tested.
pub fn choose(asked: TransportKind, rdma: Result<Option<String>, String>) -> Chosen {
    match (asked, rdma) {
        (TransportKind::Auto, Ok(route_device)) => Chosen {
            kind: TransportKind::Rdma,
            note: Some(match &route_device {
                Some(dev) => {
                    format!("--transport auto: the RDMA CM found a route through {dev}, using rdma")
                }
                None => "--transport auto: an RDMA device is present, using rdma".into(),
            }),
            route_device,
        },
        (TransportKind::Auto, Err(why)) => Chosen {
            kind: TransportKind::Tcp,
            note: Some(format!("--transport auto: {why}, using tcp")),
            route_device: None,
        },
        (kind, rdma) => Chosen {
            kind,
            note: None,
            route_device: rdma.ok().flatten().filter(|_| kind == TransportKind::Rdma),
        },
    }
}

/// [`choose`] with this machine's answer: is there an RDMA device, and (with `peer`, for
/// a sender) does the RDMA CM find a route to the peer through one, within `timeout`?
pub fn choose_here(
    asked: TransportKind,
    peer: Option<std::net::SocketAddr>,
    timeout: std::time::Duration,
) -> Chosen {
    if asked != TransportKind::Auto {
        return Chosen {
            kind: asked,
            note: None,
            route_device: None,
        };
    }
    let rdma = crate::rdma::ensure_device()
        .map_err(|e| match e {
            // The advice on how to look is `host doctor`'s; a note says what happened.
            crate::rdma::RdmaError::NoDevice => "no RDMA device found".to_string(),
            e => format!("no RDMA device ({e})"),
        })
        .and_then(|()| match peer {
            Some(peer) => crate::net::verbs::open::reachable(peer, timeout)
                .map_err(|e| format!("{peer} is not reachable over RDMA ({e})")),
            None => Ok(None),
        });
    choose(asked, rdma)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_rdma_only_with_a_device_and_says_so() {
        let c = choose(TransportKind::Auto, Ok(None));
        assert_eq!(c.kind, TransportKind::Rdma);
        assert!(c.note.unwrap().contains("using rdma"));
        let c = choose(TransportKind::Auto, Ok(Some("mlx5_1".into())));
        assert_eq!(
            c.note.as_deref(),
            Some("--transport auto: the RDMA CM found a route through mlx5_1, using rdma")
        );
        assert_eq!(c.route_device.as_deref(), Some("mlx5_1"));
        // The route's device is kept under an explicit rdma, never under tcp.
        let c = choose(TransportKind::Rdma, Ok(Some("mlx5_1".into())));
        assert_eq!(c.route_device.as_deref(), Some("mlx5_1"));
        let c = choose(TransportKind::Tcp, Ok(Some("mlx5_1".into())));
        assert_eq!(c.route_device, None);
        let c = choose(
            TransportKind::Auto,
            Err("no RDMA device (no RDMA device found)".into()),
        );
        assert_eq!(c.kind, TransportKind::Tcp);
        assert_eq!(
            c.note.as_deref(),
            Some("--transport auto: no RDMA device (no RDMA device found), using tcp")
        );
        let c = choose(
            TransportKind::Auto,
            Err("192.0.2.9:7471 is not reachable over RDMA (no route)".into()),
        );
        assert_eq!(c.kind, TransportKind::Tcp);
        assert!(c.note.unwrap().contains("not reachable over RDMA"));
        for kind in [TransportKind::Rdma, TransportKind::Tcp] {
            assert_eq!(
                choose(kind, Err("x".into())),
                Chosen {
                    kind,
                    note: None,
                    route_device: None
                }
            );
        }
    }
}
