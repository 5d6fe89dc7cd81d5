//! `statestore cluster tenant add` and `remove`: the cluster agrees to
//! serve one more tenant, or one fewer (see the tenants added while running
//! in [`crate::cluster::node`]); and `statestore cluster move`: a group's
//! copy moves from one replica to another.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;

use super::admin::{runtime, statuses};
use super::file::ClusterFile;
use super::net;
use super::operator::ChangeAnswer;

/// How long a tenant change waits for the cluster.
const WAIT: Duration = Duration::from_secs(30);

/// How long it waits, once the leader has made the change, for the other
/// replicas that answer to make it too.
const WAIT_OTHERS: Duration = Duration::from_secs(10);

/// Asks group 0's leader to add tenant `name` (which every replica's
/// `--config` must name), then waits until the leader serves it, and says
/// which replicas serve it.
pub fn add(path: &Path, name: &str) -> Result<()> {
    change(path, name, true)
}

/// Asks group 0's leader to remove tenant `name` (not the first), then
/// waits until the leader no longer serves it, and says which replicas
/// still do. Its data stays in each replica's `tenant-<name>` directory;
/// its name is not used again.
pub fn remove(path: &Path, name: &str) -> Result<()> {
    change(path, name, false)
}

fn change(path: &Path, name: &str, add: bool) -> Result<()> {
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
    let verb = if add { "add" } else { "remove" };
    runtime()?.block_on(async {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut proposed: Option<tokio::time::Instant> = None;
        let mut leader_done: Option<tokio::time::Instant> = None;
        loop {
            let answers = statuses(&file, &who).await;
            let serves = |s: &super::operator::ReplicaStatus| s.tenants.iter().any(|t| t == name);
            let leader = answers
                .iter()
                .filter_map(|(id, addr, a)| a.as_ref().ok().map(|m| (*id, *addr, m)))
                .filter(|(_, _, m)| m.leads() && m.settled)
                // Group 0's (with several groups, each has a leader).
                .max_by_key(|(_, _, m)| (m.leads.contains(&0), m.term));
            if let Some((leader, addr, m)) = leader {
                if serves(m) == add {
                    // The replicas that answer and have not made it yet.
                    let behind: Vec<String> = answers
                        .iter()
                        .filter(|(_, _, a)| a.as_ref().is_ok_and(|s| serves(s) != add))
                        .map(|(id, _, _)| id.to_string())
                        .collect();
                    let since = *leader_done.get_or_insert_with(tokio::time::Instant::now);
                    if !behind.is_empty() && since.elapsed() < WAIT_OTHERS {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        continue;
                    }
                    let serving: Vec<String> = answers
                        .iter()
                        .filter(|(_, _, a)| a.as_ref().is_ok_and(serves))
                        .map(|(id, _, _)| id.to_string())
                        .collect();
                    match (add, proposed.is_some()) {
                        (true, true) => println!("tenant {name} added; served by replicas {}", serving.join(", ")),
                        (true, false) => println!("tenant {name} is the cluster's already; served by replicas {}", serving.join(", ")),
                        (false, true) => println!("tenant {name} removed"),
                        (false, false) => println!("tenant {name} is not the cluster's"),
                    }
                    if !behind.is_empty() {
                        eprintln!(
                            "not yet {} by replicas {} (their logs say why; they try again every 10 s)",
                            if add { "served" } else { "closed" },
                            behind.join(", ")
                        );
                    }
                    return Ok(());
                }
                if proposed.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
                    let request = format!("tenant {verb} {name}");
                    let answer = net::change(addr, leader, &who, &request).await?;
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
                    "tenant {name} is {} after {} s (no leader, or the leader cannot make the change: see `statestore cluster status` and the leader's log, then run this again)",
                    if add { "not served" } else { "still served" },
                    WAIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// Asks group 0's leader to move group `m.group`'s copy from replica
/// `m.from` to `m.to`, then waits (at most `wait`) until the move is
/// settled: the new replica holds the group and the old one does not.
pub fn move_group(path: &Path, m: super::placement::Move, wait: Duration) -> Result<()> {
    let file = ClusterFile::load(path)?;
    let who = file.operator_credentials()?;
    let ours = Some((m.group, m.from, m.to));
    runtime()?.block_on(async {
        let deadline = tokio::time::Instant::now() + wait;
        let mut asked: Option<(tokio::time::Instant, u64)> = None;
        // Whether the leader was seen moving it: not asked again then.
        let mut seen = false;
        let mut said = String::new();
        loop {
            let answers = statuses(&file, &who).await;
            let ok: Vec<(u64, std::net::SocketAddr, &super::operator::ReplicaStatus)> = answers
                .iter()
                .filter_map(|(id, addr, a)| a.as_ref().ok().map(|s| (*id, *addr, s)))
                .collect();
            let holds = |id: u64| {
                ok.iter()
                    .find(|(r, _, _)| *r == id)
                    .map(|(_, _, s)| s.holds.contains(&m.group))
            };
            let leader = ok
                .iter()
                .filter(|(_, _, s)| s.leads() && s.settled && s.leads.contains(&0))
                .max_by_key(|(_, _, s)| s.term);
            if let Some(&(leader, addr, s)) = leader {
                // Asked (and so it could be made), then settled: the new
                // replica holds it, the old one no longer.
                let done = asked.is_some_and(|(_, v)| s.moves > v)
                    && s.moving.is_none()
                    && holds(m.to) == Some(true)
                    && holds(m.from) != Some(true);
                if done {
                    println!("group {} moved from replica {} to {}", m.group, m.from, m.to);
                    return Ok(());
                }
                seen |= s.moving == ours;
                let now = if s.moving == ours {
                    format!("moving: replica {} catching up, then voting in place of {}", m.to, m.from)
                } else if let Some((g, f, t)) = s.moving {
                    format!("waiting for the move under way (group {g} from {f} to {t})")
                } else {
                    String::new()
                };
                if !now.is_empty() && now != said {
                    eprintln!("{now}");
                    said = now;
                }
                // Asked again after 5 s: a proposal lost with a leader, or
                // skipped because the placement changed meanwhile.
                let again =
                    !seen && asked.is_none_or(|(at, _)| at.elapsed() >= Duration::from_secs(5));
                // None under way, or this one sends the one under way
                // elsewhere.
                let free = s.moving.is_none_or(|(g, _, to)| g == m.group && to == m.from);
                if free && s.moving != ours && again {
                    let request = format!("move {} {} {}", m.group, m.from, m.to);
                    let answer = net::change(addr, leader, &who, &request).await?;
                    match ChangeAnswer::decode(&answer) {
                        ChangeAnswer::Proposed(text) => {
                            eprintln!("{text}");
                            asked = Some((tokio::time::Instant::now(), s.moves));
                        }
                        ChangeAnswer::Moving(text) | ChangeAnswer::AskAgain(text) => {
                            tracing::debug!(text, "asking again");
                        }
                        // Made and settled between two looks: the old
                        // replica no longer holds it.
                        ChangeAnswer::Refused(_) if asked.is_some() && holds(m.to) == Some(true) => {
                            seen = true;
                        }
                        ChangeAnswer::Refused(text) => anyhow::bail!("{text}"),
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "group {} has not moved from replica {} to {} after {} s (it goes on if it was proposed: `statestore cluster status` shows it, and the group's leader's log says why it waits)",
                    m.group,
                    m.from,
                    m.to,
                    wait.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}
