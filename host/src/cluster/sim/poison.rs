//! The simulation's guest: the native store, made to fail the way a real
//! guest does on a poison request (`SET __poison ...`): the call fails, and
//! the instance is unusable after it (every later call fails too), until
//! the replica makes a new one.

use statestore_guest::wire;

use crate::{Backend, GuestError, Input, NativeStore, Output, SnapshotScope};

/// The key whose SET fails the guest.
pub(super) const POISON: &[u8] = b"__poison";

/// [`NativeStore`] that fails on [`POISON`], for good.
#[derive(Clone)]
pub(super) struct Poisonable {
    store: NativeStore,
    broken: bool,
}

impl Poisonable {
    pub(super) fn new(store: NativeStore) -> Poisonable {
        Poisonable {
            store,
            broken: false,
        }
    }

    fn check(&self) -> Result<(), GuestError> {
        if self.broken {
            return Err(GuestError::Failed(anyhow::anyhow!(
                "the instance failed before (poisoned)"
            )));
        }
        Ok(())
    }

    /// Fails (for good) if `batch` holds a poison request.
    fn taste(&mut self, batch: &[u8]) -> Result<(), GuestError> {
        self.check()?;
        let poisoned = wire::decode_batch(batch).is_ok_and(|inputs| {
            inputs.iter().any(|i| {
                matches!(i, wire::InputRef::Message(m)
                    if m.payload.windows(POISON.len()).any(|w| w == POISON))
            })
        });
        if poisoned {
            self.broken = true;
            return Err(GuestError::Failed(anyhow::anyhow!(
                "a poison request (simulated trap)"
            )));
        }
        Ok(())
    }
}

impl Backend for Poisonable {
    fn handle(&mut self, inputs: &[Input<'_>], now: u64) -> Result<Vec<Output>, GuestError> {
        self.taste(&wire::encode_batch(inputs))?;
        self.store.handle(inputs, now)
    }

    fn handle_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError> {
        self.taste(batch)?;
        self.store.handle_wire(batch, now)
    }

    fn reads(&mut self, batch: &[u8]) -> Result<Vec<u32>, GuestError> {
        self.check()?;
        self.store.reads(batch)
    }

    fn query_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<Output>, GuestError> {
        self.check()?;
        self.store.query_wire(batch, now)
    }

    fn next_deadline(&mut self) -> Result<Option<u64>, GuestError> {
        self.check()?;
        self.store.next_deadline()
    }

    fn snapshot_with(&mut self, scope: SnapshotScope) -> Result<Vec<u8>, GuestError> {
        self.check()?;
        self.store.snapshot_with(scope)
    }

    fn replay(&mut self, records: &[Vec<u8>]) -> Result<(), GuestError> {
        self.check()?;
        self.store.replay(records)
    }
}
