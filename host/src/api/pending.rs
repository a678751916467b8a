//! Transfers that run while the caller goes on: [`Endpoint::start_send`] and
//! [`Listener::start_receive_into`] return a [`Pending`] at once, which the caller polls
//! ([`Pending::is_done`]) or waits for ([`Pending::wait_timeout`], [`Pending::wait`]).
//! The memory moves with the transfer (a `Vec<u8>` the caller gets back), so nothing the
//! caller holds is touched after the call returns. [`Pending::cancel`] stops it.

use super::error::{Error, ErrorKind};
use super::receive::Listener;
use super::send::Endpoint;
use super::Cancel;
use crate::transfer::{RecvReport, SendReport};
use std::sync::mpsc;
use std::time::Duration;

/// A send started by [`Endpoint::start_send`]: its result, and the bytes back.
pub type PendingSend = Pending<(Result<SendReport, Error>, Vec<u8>)>;
/// A receive started by [`Listener::start_receive_into`]: its result, and the buffer
/// back (filled, if the result is Ok).
pub type PendingReceive = Pending<(Result<RecvReport, Error>, Vec<u8>)>;

/// A transfer running on a thread of its own; its result once it is done. Dropped
/// before it has ended (its result unseen), it cancels the transfer: nobody can learn
/// the outcome, and a receive with no wait would hold its thread and listener for ever.
pub struct Pending<T> {
    rx: mpsc::Receiver<T>,
    result: Option<T>,
    cancel: Cancel,
}

impl<T: Send + 'static> Pending<T> {
    fn spawn(
        name: &str,
        cancel: Cancel,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Pending<T>, Error> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = tx.send(work());
            })
            .map_err(|e| Error::new(ErrorKind::Other, format!("cannot start a thread: {e}")))?;
        Ok(Pending {
            rx,
            result: None,
            cancel,
        })
    }

    /// Stop the transfer: it ends within a moment (the connection broken off, the
    /// result [`ErrorKind::Cancelled`]) unless it ended already; wait for it as before.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Whether the transfer has ended (its result is then ready): never waits.
    pub fn is_done(&mut self) -> bool {
        if self.result.is_none() {
            self.result = self.rx.try_recv().ok();
        }
        self.result.is_some()
    }

    /// Wait up to `timeout` for the transfer to end; its result, if it has.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<&T> {
        if self.result.is_none() {
            self.result = self.rx.recv_timeout(timeout).ok();
        }
        self.result.as_ref()
    }

    /// Wait for the transfer to end (a send is bounded by its options' `timeout`; a
    /// receive by the listener's `wait`, and with none it waits for a sender).
    ///
    /// # Panics
    /// If the transfer's thread panicked (a bug: every error is a value).
    pub fn wait(mut self) -> T {
        match self.result.take() {
            Some(r) => r,
            None => self
                .rx
                .recv()
                .expect("a transfer thread ended without a result"),
        }
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if self.result.is_none() {
            self.cancel.cancel();
        }
    }
}

impl Endpoint {
    /// Start sending `data` (moved in; it comes back with the result) and return at once.
    ///
    /// # Errors
    /// No thread could be started. The transfer's own errors are in the result.
    pub fn start_send(&self, data: Vec<u8>, name: Option<String>) -> Result<PendingSend, Error> {
        let cancel = Cancel::new();
        let endpoint = self.with_cancel(&cancel);
        Pending::spawn("api-send", cancel, move || {
            let result = endpoint.send(&data, name.as_deref());
            (result, data)
        })
    }
}

impl Listener {
    /// Start receiving one transfer into `buf` (moved in; it comes back, filled, with the
    /// result) and return at once. As [`Listener::receive_into`] otherwise.
    ///
    /// # Errors
    /// The listener could not be duplicated for the thread, or no thread started.
    pub fn start_receive_into(&self, mut buf: Vec<u8>) -> Result<PendingReceive, Error> {
        let cancel = Cancel::new();
        let mut opts = self.options().clone();
        opts.cancel = Some(cancel.clone());
        let listener = self.try_clone()?.with_options(&opts);
        Pending::spawn("api-receive", cancel, move || {
            let result = listener.receive_into(&mut buf);
            (result, buf)
        })
    }
}
