//! raft-rs's log, into ours.

/// raft-rs's log (slog) into ours (tracing, target `raft`): its errors
/// and warnings as such, its info (elections, votes, membership) at debug
/// (`RUST_LOG=raft=debug`), its debug at trace.
pub(super) struct RaftLog;

impl slog::Drain for RaftLog {
    type Ok = ();
    type Err = slog::Never;

    fn log(
        &self,
        record: &slog::Record<'_>,
        values: &slog::OwnedKVList,
    ) -> std::result::Result<(), slog::Never> {
        struct Fields(String);
        impl slog::Serializer for Fields {
            fn emit_arguments(
                &mut self,
                key: slog::Key,
                val: &std::fmt::Arguments<'_>,
            ) -> slog::Result {
                use std::fmt::Write as _;
                let _ = write!(self.0, " {key}={val}");
                Ok(())
            }
        }
        let level = match record.level() {
            slog::Level::Critical | slog::Level::Error => tracing::Level::ERROR,
            slog::Level::Warning => tracing::Level::WARN,
            slog::Level::Info => tracing::Level::DEBUG,
            slog::Level::Debug | slog::Level::Trace => tracing::Level::TRACE,
        };
        let enabled = match level {
            tracing::Level::ERROR => tracing::enabled!(target: "raft", tracing::Level::ERROR),
            tracing::Level::WARN => tracing::enabled!(target: "raft", tracing::Level::WARN),
            tracing::Level::DEBUG => tracing::enabled!(target: "raft", tracing::Level::DEBUG),
            _ => tracing::enabled!(target: "raft", tracing::Level::TRACE),
        };
        if !enabled {
            return Ok(());
        }
        let mut fields = Fields(String::new());
        let _ = slog::KV::serialize(&record.kv(), record, &mut fields);
        let _ = slog::KV::serialize(values, record, &mut fields);
        let text = format!("{}{}", record.msg(), fields.0);
        match level {
            tracing::Level::ERROR => tracing::error!(target: "raft", "{text}"),
            tracing::Level::WARN => tracing::warn!(target: "raft", "{text}"),
            tracing::Level::DEBUG => tracing::debug!(target: "raft", "{text}"),
            _ => tracing::trace!(target: "raft", "{text}"),
        }
        Ok(())
    }
}
