//! The calls: a batch of inputs in, the list of their outputs back
//! (`handle_wire`, `handle_wire_owned`, the read-only `query_wire`), and
//! `step`, the same on typed inputs. Each input is handled by
//! `StateMachine::request` and the like (`mod.rs`).

use super::*;

/// Values at least this long are journaled by reference to the batch they
/// arrived in, and lent to the table when they are most of it.
pub const LARGE_VALUE: usize = 64 << 10;

/// Where the batch of the call in progress lies in memory, as addresses:
/// whether a slice is part of it, and where.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    start: usize,
    len: usize,
    /// The batch's buffer is the store's to keep (`handle_wire_owned`).
    lend: bool,
}

impl Batch {
    fn of(batch: &[u8], lend: bool) -> Batch {
        Batch {
            start: batch.as_ptr() as usize,
            len: batch.len(),
            lend,
        }
    }

    /// Where `value` lies in the batch, if it is a large value of it.
    pub(super) fn find(&self, value: &[u8]) -> Option<core::ops::Range<usize>> {
        let at = (value.as_ptr() as usize).checked_sub(self.start)?;
        let end = at.checked_add(value.len())?;
        (value.len() >= LARGE_VALUE && end <= self.len).then_some(at..end)
    }

    /// Where `value` lies in the batch, if the table should keep it there:
    /// large, and at least half the batch (so that what is left of the
    /// batch, handed in again, is never more than what was taken).
    pub(super) fn lend(&self, value: &[u8]) -> Option<core::ops::Range<usize>> {
        self.find(value)
            .filter(|_| self.lend && value.len() >= self.len / 2)
    }
}

impl StateMachine {
    /// Handles a batch of inputs in the [`crate::wire`] encoding at `now`,
    /// in order, and returns the outputs they caused, in that encoding. A
    /// batch that does not decode is an error and nothing of it is handled.
    ///
    /// A call is bounded: it takes no further input once its outputs hold
    /// [`OUTPUT_BUDGET`] bytes (the first input is always handled), and it
    /// expires at most [`EXPIRY_BUDGET`] keys and forgets as many dedup
    /// entries. Where it stopped early, the last output is
    /// [`Output::More`]: the number of inputs handled, or (for a call with
    /// no inputs) 0 to say more is due now.
    pub fn handle_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<u8>, Error> {
        self.batch = Some(Batch::of(batch, false));
        let out = self.handle_batch(batch, now);
        self.batch = None;
        out
    }

    /// [`StateMachine::handle_wire`] of a batch the store may keep: a SET
    /// whose value is most of the batch keeps the value where it is, the
    /// batch's buffer becoming its key's (`table/lent.rs`), and the call
    /// ends after that input (a last [`Output::More`] if inputs are left).
    /// The store's memory then holds such a value once, never beside a
    /// copy. What a component's `handle-wire` calls.
    pub fn handle_wire_owned(&mut self, batch: Vec<u8>, now: u64) -> Result<Vec<u8>, Error> {
        self.batch = Some(Batch::of(&batch, true));
        let out = self.handle_batch(&batch, now);
        self.batch = None;
        self.table.put_lent(batch);
        out
    }

    fn handle_batch(&mut self, batch: &[u8], now: u64) -> Result<Vec<u8>, Error> {
        self.table.drop_lent();
        let inputs = wire::decode_batch(batch)?;
        // A query that stopped half-way (a trap) left nothing behind.
        self.read_only = false;
        // A reply is about as long as its request (up to a point: a large
        // SET's reply is short); the list grows if not.
        let capacity = (batch.len() + batch.len() / 2 + 64).min(1 << 20);
        self.out = OutputWriter::new(capacity);
        self.expiry_budget = if inputs.is_empty() {
            EXPIRY_BUDGET
        } else {
            REQUEST_EXPIRY_BUDGET
        };
        if inputs.is_empty() {
            self.begin_input(now);
            if self.next_deadline().is_some_and(|d| d <= now) {
                self.out.more(0);
            }
        }
        for (i, input) in inputs.iter().enumerate() {
            if i > 0 && self.out.len() >= OUTPUT_BUDGET {
                self.out.more(u32::try_from(i).unwrap_or(u32::MAX));
                break;
            }
            self.begin_input(now);
            match input {
                InputRef::Message(m) => self.request(m, now),
                InputRef::Disconnected(id) => {
                    self.registry.drop_client(id);
                }
                InputRef::DisconnectedVia(id, via) => {
                    self.registry.drop_via(id, *via);
                }
                InputRef::ReplicaStarted(via) => {
                    self.registry.drop_replica(*via);
                }
            }
            if self.table.lent().is_some() {
                // The batch becomes the lent value's: nothing after this
                // input may read the key before it is put.
                if i + 1 < inputs.len() {
                    self.out.more(u32::try_from(i + 1).unwrap_or(u32::MAX));
                }
                break;
            }
        }
        Ok(std::mem::take(&mut self.out).finish())
    }

    /// The positions of the inputs of `batch` that are reads
    /// [`StateMachine::query_wire`] answers: messages on the request topic
    /// at QoS 1 whose payload is a GET or a SCAN.
    pub fn reads(batch: &[u8]) -> Result<Vec<u32>, Error> {
        let inputs = wire::decode_batch(batch)?;
        Ok(inputs
            .iter()
            .enumerate()
            .filter(|(_, input)| matches!(input, InputRef::Message(m) if is_read(m)))
            .map(|(i, _)| u32::try_from(i).unwrap_or(u32::MAX))
            .collect())
    }

    /// Answers the reads of `batch` ([`StateMachine::reads`]) as
    /// [`StateMachine::handle_wire`] would at `now`, without changing the
    /// store: no key expires (one due at `now` is dead to a read anyway), no
    /// reply is cached, and a request's `__ts` neither moves the clock nor
    /// is checked against `now` (a replica answers at the time of the last
    /// entry it applied, which may be long past). Other inputs get no
    /// outputs. Bounded like `handle_wire` (a last [`Output::More`]).
    ///
    /// What a replicated store serves reads with once it knows its state
    /// is at least as new as the log was when they arrived (a read index):
    /// no log entry, the same replies.
    pub fn query_wire(&mut self, batch: &[u8], now: u64) -> Result<Vec<u8>, Error> {
        let inputs = wire::decode_batch(batch)?;
        self.out = OutputWriter::new((batch.len() * 2 + 64).min(1 << 20));
        self.read_only = true;
        for (i, input) in inputs.iter().enumerate() {
            if i > 0 && self.out.len() >= OUTPUT_BUDGET {
                self.out.more(u32::try_from(i).unwrap_or(u32::MAX));
                break;
            }
            self.out.begin_input();
            if let InputRef::Message(m) = input
                && is_read(m)
            {
                self.request(m, now);
            }
        }
        self.read_only = false;
        Ok(std::mem::take(&mut self.out).finish())
    }

    /// [`StateMachine::handle_wire`] for inputs that are not encoded yet,
    /// with the outputs decoded: the same path, for native hosts and tests.
    /// Every input is handled (a call that stops early is followed by one
    /// with the rest); after a call with no inputs, a last
    /// [`Output::More`] says more is due now.
    pub fn step(&mut self, inputs: &[Input<'_>], now: u64) -> Vec<Output> {
        let mut all = Vec::new();
        let mut rest = inputs;
        loop {
            let batch = wire::encode_batch(rest);
            let outputs = self
                .handle_wire(&batch, now)
                .expect("a batch this crate encoded decodes");
            let mut outputs = wire::decode_outputs(&outputs, &batch)
                .expect("an output list this crate wrote decodes");
            let handled = wire::handled(&mut outputs, rest.len());
            all.extend(outputs);
            rest = &rest[handled..];
            if rest.is_empty() {
                return all;
            }
        }
    }

    /// One message at `now`: [`StateMachine::step`].
    pub fn handle(&mut self, msg: &InboundMessage, now: u64) -> Vec<Output> {
        self.step(&[Input::Message(msg)], now)
    }

    /// A client went away: its KEYNOTIFY registrations are dropped.
    pub fn client_disconnected(&mut self, client_id: &str, now: u64) -> Vec<Output> {
        self.step(&[Input::Disconnected(client_id)], now)
    }

    /// The deadline has passed: expire keys and forget old dedup entries
    /// (a call with no inputs).
    pub fn timeout(&mut self, now: u64) -> Vec<Output> {
        self.step(&[], now)
    }
}

/// Whether `m` is a request [`StateMachine::query_wire`] answers: a GET or
/// a SCAN on the request topic, at QoS 1.
fn is_read(m: &MessageRef<'_>) -> bool {
    m.topic == rpc::REQUEST_TOPIC
        && m.qos == 1
        && matches!(
            command::parse(m.payload),
            Ok(Command::Get { .. } | Command::Scan { .. })
        )
}
