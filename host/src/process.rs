//! What the server sets up for its own process at start.

use tracing::{info, warn};

/// Raises the soft limit on open files to the hard limit: every client
/// connection, peer link and log file is one, and distributions' default
/// soft limit (1,024) is far below what the server's own bounds allow.
/// Returns the soft limit in force afterwards (`None`: unlimited).
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return limit.current;
    }
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => {
            info!(
                from = ?limit.current,
                to = ?limit.maximum,
                "raised the soft limit on open files to the hard limit"
            );
            limit.maximum
        }
        Err(e) => {
            warn!(error = %e, soft = ?limit.current, hard = ?limit.maximum, "could not raise the soft limit on open files");
            limit.current
        }
    }
}
