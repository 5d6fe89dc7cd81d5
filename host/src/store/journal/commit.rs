//! A batch's journal records made durable before its replies go out
//! ([`commit`]), and the 500 replies of a batch whose records could not be.

use anyhow::Result;

use statestore_guest::rpc::{Reply, Status};

use super::Journal;
use crate::{OutboundMessage, Output, PublishKind, WasmStore};

/// The journal records among `outputs`, and the rest, each in order. The
/// guest writes an input's records ahead of its other outputs, so making
/// these durable first keeps that rule for the whole batch.
pub(super) fn split_records(outputs: Vec<Output>) -> (Vec<Vec<u8>>, Vec<Output>) {
    let mut records = Vec::new();
    let mut rest = Vec::with_capacity(outputs.len());
    for o in outputs {
        match o {
            Output::Journal(r) => records.push(r),
            o => rest.push(o),
        }
    }
    (records, rest)
}

/// Makes the journal records among `outputs` durable (per the fsync
/// policy) and returns the rest, to publish. If the records cannot be
/// written (a full disk), nothing of the batch stays applied: the store is
/// reloaded from disk and every reply of the batch becomes a 500.
pub fn commit(
    store: &mut WasmStore,
    journal: Option<&mut Journal>,
    outputs: Vec<Output>,
) -> Result<Vec<Output>> {
    let (records, publishes) = split_records(outputs);
    let Some(journal) = journal else {
        return Ok(publishes);
    };
    match journal.append(&records) {
        Ok(()) => {
            if journal.snapshot_due()
                && let Err(e) = journal.snapshot(store)
            {
                // The log keeps everything; a later batch tries again, after
                // a pause that doubles with every failure.
                tracing::warn!(error = %format!("{e:#}"), "cannot take a snapshot");
                journal.snapshot_failed();
            }
            Ok(publishes)
        }
        Err(e) => {
            tracing::error!(error = %e, dir = %journal.describe(), "cannot write the journal: answering the batch with errors");
            *store = journal.reload()?;
            Ok(publishes
                .into_iter()
                .filter_map(|o| match o {
                    Output::Publish(m) if m.kind == PublishKind::Response => {
                        Some(Output::Publish(failed(&m, &e)))
                    }
                    _ => None, // notifications of changes that did not happen
                })
                .collect())
        }
    }
}

/// A 500 reply in place of `reply` (spec §4.3), built as every reply is.
fn failed(reply: &OutboundMessage, e: &std::io::Error) -> OutboundMessage {
    Reply::replace(
        reply,
        Status::InternalError,
        format!("the state store could not make the change durable: {e}"),
    )
}
