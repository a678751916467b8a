//! Offers that come on kept connections, held between a library's receive calls or
//! told to the serving loop that runs now ([`KeptOffers`]), and the listener and the kept
//! connections paused and resumed together (`AndKept`).

use super::serve_offer::Pausable;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Offers held at once for a library's next receive, besides kept connections' (each a
/// socket or a connection request; the listen queue holds the senders behind them).
pub(super) const MAX_HELD: usize = 64;

/// Offers that came on kept connections ([`HINT_SESSION`](crate::wire::HINT_SESSION)),
/// told to the serving loop running now, or held while none runs (a library's listener
/// between calls) or while it takes no offers (a call's one transfer running). Held
/// offers older than the connection's idle time are dropped (closed): their senders
/// stopped waiting for an answer.
pub struct KeptOffers<O> {
    inner: Mutex<KeptInner<O>>,
}

struct KeptInner<O> {
    tell: Option<Box<dyn Fn(O) + Send>>,
    paused: bool,
    held: std::collections::VecDeque<(Instant, O)>,
    idle: Duration,
}

impl<O: Send + 'static> KeptOffers<O> {
    /// Paused, telling no loop yet.
    pub fn new() -> Arc<KeptOffers<O>> {
        Arc::new(KeptOffers {
            inner: Mutex::new(KeptInner {
                tell: None,
                paused: true,
                held: Default::default(),
                idle: Duration::from_secs(30),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptInner<O>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Tell this loop (`tell`) from now on, holding offers up to `idle` old.
    pub(super) fn retell(&self, tell: Box<dyn Fn(O) + Send>, idle: Duration) {
        let mut inner = self.lock();
        inner.idle = idle;
        inner.tell = Some(tell);
    }

    /// Hold a new connection's offer that came while a library call's one transfer
    /// runs (both senders were heard before the listener paused): for the next call, or
    /// this one where its transfer fails and it goes on. The offer back when
    /// [`MAX_HELD`] wait already (then refused as busy: the serving loop's `refuse_busy`).
    pub(super) fn hold(&self, offer: O) -> Result<(), O> {
        Self::hold_in(&mut self.lock(), offer, MAX_HELD)
    }

    /// An offer heard after its call's loop had ended: to the loop running now where
    /// one takes offers (a next call started meanwhile), else held as [`hold`] holds.
    ///
    /// [`hold`]: Self::hold
    pub(super) fn pass_on(&self, offer: O) -> Result<(), O> {
        self.tell_or_hold(offer, MAX_HELD)
    }

    /// The next offer of a kept connection: told or held without a cap of its own (the
    /// kept connections are capped by admission, [`Admission::keep`]).
    pub(super) fn offer(&self, offer: O) {
        // Nothing comes back with no cap.
        let _ = self.tell_or_hold(offer, usize::MAX);
    }

    /// To the loop running now where one takes offers, else held (at most `cap`).
    fn tell_or_hold(&self, offer: O, cap: usize) -> Result<(), O> {
        let mut inner = self.lock();
        match (&inner.tell, inner.paused) {
            (Some(tell), false) => {
                tell(offer);
                Ok(())
            }
            _ => Self::hold_in(&mut inner, offer, cap),
        }
    }

    /// Hold `offer` unless `cap` wait already (those older than the idle time dropped
    /// first: their senders stopped waiting).
    fn hold_in(inner: &mut KeptInner<O>, offer: O, cap: usize) -> Result<(), O> {
        let idle = inner.idle;
        inner.held.retain(|(at, _)| at.elapsed() < idle);
        if inner.held.len() >= cap {
            return Err(offer);
        }
        inner.held.push_back((Instant::now(), offer));
        Ok(())
    }
}

impl<O: Send + 'static> Pausable for KeptOffers<O> {
    fn pause(&self) {
        self.lock().paused = true;
    }
    fn resume(&self) {
        let mut inner = self.lock();
        inner.paused = false;
        let idle = inner.idle;
        let held = std::mem::take(&mut inner.held);
        if let Some(tell) = &inner.tell {
            for (at, offer) in held {
                if at.elapsed() < idle {
                    tell(offer);
                }
            }
        }
    }
}

/// Pauses the kept offers when dropped.
pub(super) struct PauseOnDrop<O: Send + 'static>(pub(super) Arc<KeptOffers<O>>);

impl<O: Send + 'static> Drop for PauseOnDrop<O> {
    fn drop(&mut self) {
        self.0.pause();
    }
}

/// A listener and the kept connections, paused and resumed together.
pub(super) struct AndKept<L, O> {
    pub(super) listen: Arc<L>,
    pub(super) kept: Arc<KeptOffers<O>>,
}

impl<L: Pausable, O: Send + 'static> Pausable for AndKept<L, O> {
    fn pause(&self) {
        self.listen.pause();
        self.kept.pause();
    }
    fn resume(&self) {
        self.listen.resume();
        self.kept.resume();
    }
}
