//! `statestore cluster tenant add`: the cluster agrees to serve one more
//! tenant (see [`crate::cluster::node`]'s tenants added while running).

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use super::admin::{runtime, statuses};
use super::file::ClusterFile;
use super::net;
use super::operator::ChangeAnswer;

/// How long `tenant add` waits for the cluster.
const WAIT: Duration = Duration::from_secs(30);

/// How long it waits, once the leader serves the tenant, for the other
/// replicas that answer to serve it too.
const WAIT_OTHERS: Duration = Duration::from_secs(10);

/// Asks group 0's leader to add tenant `name` (which every replica's
/// `--config` must name), then waits until the leader serves it, and says
/// which replicas serve it.
pub fn add(path: &Path, name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        anyhow::bail!("tenant name {name:?}: use 1 to 64 letters, digits, '-' or '_'");
    }
    let file = ClusterFile::load(path)?;
    let who = file.operator_credentials()?;
    runtime()?.block_on(async {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut proposed: Option<tokio::time::Instant> = None;
        let mut leader_serves: Option<tokio::time::Instant> = None;
        loop {
            let answers = statuses(&file, &who).await;
            let leader = answers
                .iter()
                .filter_map(|(id, addr, a)| a.as_ref().ok().map(|m| (*id, *addr, m)))
                .filter(|(_, _, m)| m.leads() && m.settled)
                .max_by_key(|(_, _, m)| m.term);
            if let Some((leader, addr, m)) = leader {
                if m.tenants.iter().any(|t| t == name) {
                    let serving: Vec<String> = answers
                        .iter()
                        .filter_map(|(id, _, a)| a.as_ref().ok().map(|s| (id, s)))
                        .filter(|(_, s)| s.tenants.iter().any(|t| t == name))
                        .map(|(id, _)| id.to_string())
                        .collect();
                    let missing: Vec<String> = answers
                        .iter()
                        .filter(|(_, _, a)| a.as_ref().is_ok_and(|s| !s.tenants.iter().any(|t| t == name)))
                        .map(|(id, _, _)| id.to_string())
                        .collect();
                    let since = *leader_serves.get_or_insert_with(tokio::time::Instant::now);
                    if !missing.is_empty() && since.elapsed() < WAIT_OTHERS {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        continue;
                    }
                    let what = if proposed.is_some() { "added" } else { "is the cluster's already" };
                    println!("tenant {name} {what}; served by replicas {}", serving.join(", "));
                    if !missing.is_empty() {
                        eprintln!(
                            "not yet served by replicas {} (their --config must name it: their logs say; they try again every 10 s)",
                            missing.join(", ")
                        );
                    }
                    return Ok(());
                }
                if proposed.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
                    let answer = net::change(addr, leader, &who, &format!("tenant add {name}")).await?;
                    match ChangeAnswer::decode(&answer) {
                        ChangeAnswer::Proposed(text) => {
                            eprintln!("{text}");
                            proposed = Some(tokio::time::Instant::now());
                        }
                        ChangeAnswer::Moving(text) | ChangeAnswer::AskAgain(text) => {
                            tracing::debug!(text, "asking again");
                        }
                        ChangeAnswer::Refused(text) => anyhow::bail!("{text}"),
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "tenant {name} is not served after {} s (no leader, or the leader cannot open it: see `statestore cluster status` and the leader's log, then run this again)",
                    WAIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}
