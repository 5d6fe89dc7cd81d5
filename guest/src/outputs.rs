//! Where the state machine's outputs go: a queue of values that a native
//! host polls, or, while the machine handles a [`crate::wire`] batch,
//! straight into the encoded output list that crosses the component
//! boundary (no message is built as a value only to be encoded and freed).
//!
//! Either way the journal records of an input come ahead of its other
//! outputs, each group in the order it was written: a host makes the
//! records durable before it publishes anything of the same input.

use std::collections::VecDeque;

use crate::types::Output;
use crate::wire::OutputWriter;

/// The pending outputs of a state machine.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outputs {
    queue: VecDeque<Output>,
    /// Where the current input's next journal record goes in `queue`.
    records_at: usize,
    /// Set while a wire batch is handled.
    wire: Option<OutputWriter>,
}

impl Outputs {
    /// The next outputs belong to a new input.
    pub(crate) fn begin_input(&mut self) {
        match &mut self.wire {
            Some(w) => w.begin_input(),
            None => self.records_at = self.queue.len(),
        }
    }

    /// An output of the current input.
    pub(crate) fn push(&mut self, o: Output) {
        match (&mut self.wire, o) {
            (_, Output::Journal(record)) => self.journal(record),
            (Some(w), o) => w.output(&o),
            (None, o) => self.queue.push_back(o),
        }
    }

    /// A journal record of the current input: after its earlier records,
    /// before its other outputs.
    pub(crate) fn journal(&mut self, record: Vec<u8>) {
        match &mut self.wire {
            Some(w) => w.journal(&record),
            None => {
                self.queue.insert(self.records_at, Output::Journal(record));
                self.records_at += 1;
            }
        }
    }

    /// The writer, while a wire batch is handled: a reply or a
    /// notification goes into it in parts, without a message being built.
    pub(crate) fn writer(&mut self) -> Option<&mut OutputWriter> {
        self.wire.as_mut()
    }

    /// From now on outputs are encoded into a list of about `capacity`
    /// bytes, after those already pending.
    pub(crate) fn start_wire(&mut self, capacity: usize) {
        let mut w = OutputWriter::new(capacity);
        for o in self.queue.drain(..) {
            w.append(&o);
        }
        self.records_at = 0;
        self.wire = Some(w);
    }

    /// Ends [`Outputs::start_wire`]: every pending output, encoded.
    pub(crate) fn finish_wire(&mut self) -> Vec<u8> {
        match self.wire.take() {
            Some(w) => w.finish(),
            None => OutputWriter::new(0).finish(),
        }
    }

    /// The oldest pending output.
    pub(crate) fn pop(&mut self) -> Option<Output> {
        let o = self.queue.pop_front()?;
        self.records_at = self.records_at.saturating_sub(1);
        Some(o)
    }

    /// Every pending output, oldest first.
    pub(crate) fn take(&mut self) -> Vec<Output> {
        self.records_at = 0;
        self.queue.drain(..).collect()
    }
}
