//! The operator's side of the cluster: `statestore cluster status`, `add`,
//! `remove`, `rejoin` and `certs`, which talk to the replicas over their
//! raft ports (with the operator's credentials, see [`ClusterFile::operator_credentials`]).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::file::ClusterFile;
use super::net::{self, Credentials};
use super::operator::{ChangeAnswer, ChangeRequest, ReplicaStatus};

pub(super) fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Asks every replica of `file`, and every member they name that the file
/// does not, for its status.
pub(super) async fn statuses(
    file: &ClusterFile,
    who: &Credentials,
) -> Vec<(u64, SocketAddr, Result<ReplicaStatus>)> {
    async fn ask(addr: SocketAddr, id: u64, who: &Credentials) -> Result<ReplicaStatus> {
        let text = tokio::time::timeout(Duration::from_secs(3), net::status(addr, id, who))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within 3 s")))?;
        ReplicaStatus::decode(&text)
    }
    let mut out = Vec::new();
    for r in &file.replicas {
        out.push((r.id, r.raft, ask(r.raft, r.id, who).await));
    }
    // Members added while running that this file does not list.
    let mut more: Vec<(u64, SocketAddr)> = Vec::new();
    for (_, _, a) in &out {
        let Ok(m) = a else { continue };
        for &(id, addr) in &m.peers {
            if !out.iter().any(|(known, _, _)| *known == id)
                && !more.iter().any(|(known, _)| *known == id)
            {
                more.push((id, addr));
            }
        }
    }
    for (id, addr) in more {
        out.push((id, addr, ask(addr, id, who).await));
    }
    out.sort_by_key(|(id, _, _)| *id);
    out
}

/// One replica, as `cluster status` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct ReplicaReport {
    /// Its id.
    pub id: u64,
    /// Whether it is a member (as the membership below has it).
    pub member: bool,
    /// Why it did not answer, if it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<String>,
    /// `leader`, `follower`, `candidate`...; absent if it did not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Its term.
    pub term: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// Its commit index.
    pub commit: u64,
    /// Its applied index.
    pub applied: u64,
    /// Entries behind the leader's applied index, when a leader is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// Where its embedded broker listens for clients.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub mqtt: String,
    /// With partitions: the partitions it leads (the columns above are
    /// partition 0's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub leads: Vec<u32>,
    /// With the groups placed on some replicas: the groups it holds (the
    /// columns above are the first's).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<u32>,
    /// With tenants: the tenants it serves, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// With the groups placed: the version of the groups' moves it knows
    /// of (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub moves: u64,
    /// The move under way it knows of: `<group> from <id> to <id>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moving: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What `cluster status` found.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct StatusReport {
    /// Every replica asked: the file's, and members they named.
    pub replicas: Vec<ReplicaReport>,
    /// The leader, if one answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<u64>,
    /// The members: the leader's, else the last known (the replica that
    /// answered with the highest term and applied index), else the file's.
    pub members: Vec<u64>,
    /// Where `members` comes from: `leader`, `replica <id>` or `file`.
    pub members_from: String,
    /// Members that answered.
    pub members_up: usize,
    /// How many members make a majority.
    pub majority: usize,
    /// How many partitions (Raft groups) the store has.
    pub partitions: u32,
    /// A leader is known and a majority answered: the cluster takes writes.
    pub healthy: bool,
}

/// Asks every replica and puts their answers together.
fn report(
    answers: &[(u64, SocketAddr, Result<ReplicaStatus>)],
    file: &ClusterFile,
) -> StatusReport {
    let answered = || {
        answers
            .iter()
            .filter_map(|(id, _, a)| Some((*id, a.as_ref().ok()?)))
    };
    let leader = answered()
        .filter(|(_, m)| m.leads())
        .max_by_key(|(_, m)| m.term);
    let last_known = answered()
        .filter(|(_, m)| !m.voters.is_empty())
        .max_by_key(|(_, m)| (m.term, m.applied));
    let (members, members_from) = match (leader, last_known) {
        (Some((_, m)), _) => (m.voters.clone(), "leader".to_string()),
        (None, Some((id, m))) => (m.voters.clone(), format!("replica {id}")),
        (None, None) => (
            file.replicas.iter().map(|r| r.id).collect(),
            "file".to_string(),
        ),
    };
    let leader_applied = leader.map(|(_, m)| m.applied);
    let replicas: Vec<ReplicaReport> = answers
        .iter()
        .map(|(id, _, a)| {
            let member = members.contains(id);
            match a {
                Ok(m) => ReplicaReport {
                    id: *id,
                    member,
                    unreachable: None,
                    role: Some(m.role.clone()),
                    term: m.term,
                    leader: m.leader,
                    commit: m.commit,
                    applied: m.applied,
                    // Placed, each row is of another group: no lag to say.
                    lag: leader_applied
                        .filter(|_| m.holds.is_empty())
                        .map(|l| l.saturating_sub(m.applied)),
                    mqtt: m.mqtt.map_or(String::new(), |a| a.to_string()),
                    leads: if m.partitions > 1 {
                        m.leads.clone()
                    } else {
                        Vec::new()
                    },
                    holds: m.holds.clone(),
                    tenants: m.tenants.clone(),
                    moves: m.moves,
                    moving: m.moving.map(|(g, f, t)| format!("{g} from {f} to {t}")),
                },
                Err(e) => ReplicaReport {
                    id: *id,
                    member,
                    unreachable: Some(format!("{e:#}")),
                    role: None,
                    term: 0,
                    leader: 0,
                    commit: 0,
                    applied: 0,
                    lag: None,
                    mqtt: String::new(),
                    leads: Vec::new(),
                    holds: Vec::new(),
                    tenants: Vec::new(),
                    moves: 0,
                    moving: None,
                },
            }
        })
        .collect();
    let members_up = replicas
        .iter()
        .filter(|r| r.member && r.unreachable.is_none())
        .count();
    let majority = members.len() / 2 + 1;
    let partitions = answered()
        .map(|(_, m)| m.partitions)
        .max()
        .unwrap_or(1)
        .max(1);
    StatusReport {
        partitions,
        leader: leader.map(|(id, _)| id),
        healthy: leader.is_some() && members_up >= majority,
        replicas,
        members,
        members_from,
        members_up,
        majority,
    }
}

/// With tenants: those the leader serves (else the most any replica
/// does), in the cluster's order, and the replicas that serve others (not
/// yet caught up with an addition or removal, or whose `--config` lacks a
/// tenant).
fn print_tenants(replicas: &[ReplicaReport], leader: Option<u64>) {
    let by_leader = replicas
        .iter()
        .find(|x| Some(x.id) == leader && x.unreachable.is_none());
    let Some(tenants) = by_leader
        .map(|x| &x.tenants)
        .or_else(|| replicas.iter().map(|x| &x.tenants).max_by_key(|t| t.len()))
    else {
        return;
    };
    if tenants.is_empty() {
        return;
    }
    println!("tenants: {}", tenants.join(", "));
    let others = replicas
        .iter()
        .filter(|x| x.unreachable.is_none() && x.tenants != *tenants);
    for x in others {
        println!("replica {} serves: {}", x.id, x.tenants.join(", "));
    }
}

/// Group numbers as a short list: runs of 3 or more as `first-last`
/// (`0,2-5,9`), so a replica of 1,000 groups takes one line.
fn ranges(groups: &[u32]) -> String {
    let mut sorted = groups.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        if j - i >= 2 {
            out.push(format!("{}-{}", sorted[i], sorted[j]));
        } else {
            out.extend(sorted[i..=j].iter().map(u32::to_string));
        }
        i = j + 1;
    }
    out.join(",")
}

/// `cluster status`: prints each replica's state (a table, or JSON with
/// `json`); whether a leader is known and a majority answered.
pub fn status(path: &Path, json: bool) -> Result<bool> {
    let file = ClusterFile::load(path)?;
    let who = file.operator_credentials()?;
    let answers = runtime()?.block_on(statuses(&file, &who));
    let r = report(&answers, &file);
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(r.healthy);
    }
    println!(
        "{:<8} {:<14} {:>6} {:>8} {:>10} {:>10} {:>8}  mqtt",
        "replica", "role", "term", "leader", "commit", "applied", "lag"
    );
    for x in &r.replicas {
        match (&x.unreachable, &x.role) {
            (Some(_), _) if !x.member => println!("{:<8} not a member", x.id),
            (Some(e), _) => println!("{:<8} unreachable: {e}", x.id),
            (None, role) => {
                let role = role.as_deref().unwrap_or("?");
                let role = if x.member {
                    role.to_string()
                } else {
                    format!("{role}*")
                };
                let lag = x.lag.map_or("?".to_string(), |l| l.to_string());
                println!(
                    "{:<8} {:<14} {:>6} {:>8} {:>10} {:>10} {:>8}  {}",
                    x.id, role, x.term, x.leader, x.commit, x.applied, lag, x.mqtt
                );
            }
        }
    }
    if r.replicas
        .iter()
        .any(|x| x.unreachable.is_none() && !x.member)
    {
        println!("* not a member (joining, or removed)");
    }
    let list = r
        .members
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    match r.members_from.as_str() {
        "leader" => println!("members: {list}"),
        "file" => println!("members: {list} (as the cluster file lists them: no replica answered)"),
        from => println!("members: {list} (last known, from {from}: no leader answered)"),
    }
    print_tenants(&r.replicas, r.leader);
    if r.partitions > 1 {
        // The table is partition 0's group; each partition has its own leader.
        let leads: Vec<String> = r
            .replicas
            .iter()
            .filter(|x| !x.leads.is_empty())
            .map(|x| format!("replica {} leads {}", x.id, ranges(&x.leads)))
            .collect();
        let led: usize = r.replicas.iter().map(|x| x.leads.len()).sum();
        let placed = r.replicas.iter().any(|x| !x.holds.is_empty());
        if placed {
            let holds: Vec<String> = r
                .replicas
                .iter()
                .filter(|x| !x.holds.is_empty())
                .map(|x| format!("replica {} holds {}", x.id, ranges(&x.holds)))
                .collect();
            println!(
                "groups placed (`copies = {}`): {}",
                file.copies.unwrap_or(file.replicas.len()),
                holds.join("; ")
            );
            // The newest moves any replica knows of.
            if let Some(x) = r
                .replicas
                .iter()
                .filter(|x| x.moves > 0)
                .max_by_key(|x| x.moves)
            {
                match &x.moving {
                    Some(m) => println!("moves: {} agreed; moving group {m}", x.moves),
                    None => println!("moves: {} agreed; none under way", x.moves),
                }
            }
        }
        println!(
            "partitions: {} (the table shows {}); {}{}",
            r.partitions,
            if placed {
                "the first group each replica holds"
            } else {
                "partition 0"
            },
            if leads.is_empty() {
                "none led".to_string()
            } else {
                leads.join("; ")
            },
            if led < r.partitions as usize {
                format!("; {} without a leader", r.partitions as usize - led)
            } else {
                String::new()
            }
        );
    }
    if r.healthy {
        println!(
            "leader: replica {}; {} of {} members answer",
            r.leader.unwrap_or(0),
            r.members_up,
            r.members.len()
        );
    } else if r.members_up < r.majority {
        println!(
            "a majority is missing: {} of {} members answer and {} are needed; the cluster takes no writes until enough of them are back",
            r.members_up,
            r.members.len(),
            r.majority
        );
    } else {
        println!(
            "no leader: {} of {} members answer (a majority); an election should end within seconds",
            r.members_up,
            r.members.len()
        );
    }
    Ok(r.healthy)
}

/// `cluster add` / `cluster remove`: sends `request` to the leader (found
/// through the replicas' status, followed when a replica names another),
/// then waits until the leader has applied it (replica `id` is, or is no
/// longer, a member).
fn change(path: &Path, request: ChangeRequest) -> Result<()> {
    let (id, add) = (request.id(), matches!(request, ChangeRequest::Add { .. }));
    let file = ClusterFile::load(path)?;
    let who = file.operator_credentials()?;
    runtime()?.block_on(async {
        let started = tokio::time::Instant::now();
        let mut deadline = started + Duration::from_secs(30);
        // When it was last proposed: again after 5 s (a leader that lost
        // it, a new leader).
        let mut proposed: Option<tokio::time::Instant> = None;
        let mut said_waiting = None;
        let mut said_holds = None;
        loop {
            let answers = statuses(&file, &who).await;
            // Placed, a replica removed gives its groups away first: one
            // move after another.
            let placed = answers
                .iter()
                .any(|(_, _, a)| a.as_ref().is_ok_and(|s| !s.holds.is_empty()));
            if placed && !add {
                deadline = started + Duration::from_secs(600);
                let holds = answers
                    .iter()
                    .find(|(r, _, _)| *r == id)
                    .and_then(|(_, _, a)| a.as_ref().ok())
                    .map(|s| s.holds.len());
                if proposed.is_some() && holds.is_some() && holds != said_holds {
                    eprintln!("replica {id} holds {} groups; they move away one at a time", holds.unwrap_or(0));
                    said_holds = holds;
                }
            }
            let up = answers.iter().filter(|(_, _, a)| a.is_ok()).count();
            let leader = settled_leader(&answers);
            if let Some((leader, addr, m)) = leader {
                let voters = &m.voters;
                // With several groups, every one must have it.
                let done = voters.contains(&id) == add && m.behind == 0;
                if done && proposed.is_none() {
                    let list = voters.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
                    if add {
                        println!("replica {id} is already a member; members: {list}");
                        until_applied_everywhere(&file, &who, id, add, SPREAD_WAIT).await;
                        return Ok(());
                    }
                    anyhow::bail!("replica {id} is not a member; members: {list}");
                }
                if done {
                    println!(
                        "replica {id} {}; members: {}",
                        if add { "added" } else { "removed" },
                        voters.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
                    );
                    until_applied_everywhere(&file, &who, id, add, SPREAD_WAIT).await;
                    return Ok(());
                }
                if proposed.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
                    let answer = net::change(addr, leader, &who, &request.encode()).await?;
                    match ChangeAnswer::decode(&answer) {
                        ChangeAnswer::Proposed(text) => {
                            eprintln!("{text}");
                            proposed = Some(tokio::time::Instant::now());
                        }
                        // The leader is the one to remove: it hands the
                        // leadership over first; the next leader is asked.
                        ChangeAnswer::Moving(text) => eprintln!("{text}"),
                        // Not (or no longer) the leader, or busy with a
                        // change: ask again.
                        ChangeAnswer::AskAgain(text) => tracing::debug!(text, "asking again"),
                        ChangeAnswer::Refused(text) => anyhow::bail!("{text}"),
                    }
                }
            }
            if leader.is_none() && said_waiting != Some(up) {
                eprintln!(
                    "waiting for a leader: {up} of {} replicas answer (up to 30 s)",
                    answers.len()
                );
                said_waiting = Some(up);
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "replica {id} is {} a member after {} s (no leader, or the change was lost: see `statestore cluster status`, then run this again)",
                    if add { "not yet" } else { "still" },
                    started.elapsed().as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// The replica that leads group 0 (with several groups, each has a
/// leader) among those that answered, if it is settled: a leader just
/// elected may not have applied a change its predecessor committed, and
/// its members would mislead.
fn settled_leader(
    answers: &[(u64, SocketAddr, Result<ReplicaStatus>)],
) -> Option<(u64, SocketAddr, &ReplicaStatus)> {
    answers
        .iter()
        .filter_map(|(id, addr, a)| a.as_ref().ok().map(|m| (*id, *addr, m)))
        .filter(|(_, _, m)| m.leads() && m.settled)
        .max_by_key(|(_, _, m)| (m.leads.contains(&0), m.term))
}

/// How long `cluster add` / `cluster remove` wait, once the leader has
/// applied the change, for the other members to apply it too.
const SPREAD_WAIT: Duration = Duration::from_secs(60);

/// How far a change the leader applied has reached the other members, as
/// their statuses say.
#[derive(Debug, PartialEq, Eq)]
enum Spread {
    /// The groups are placed (`copies`): each replica's status is of another
    /// group, nothing to compare.
    Placed,
    /// No replica that answers leads (settled).
    NoLeader,
    /// These members answer and have not applied it.
    Pending(Vec<u64>),
    /// Every member that answers has; `missing`: the replica added does not
    /// answer.
    Applied { missing: bool },
}

/// Where the addition (`add`) or removal of replica `id` stands among the
/// members the leader counts.
fn spread(answers: &[(u64, SocketAddr, Result<ReplicaStatus>)], id: u64, add: bool) -> Spread {
    let answered = || {
        answers
            .iter()
            .filter_map(|(r, _, a)| Some((*r, a.as_ref().ok()?)))
    };
    if answered().any(|(_, s)| !s.holds.is_empty()) {
        return Spread::Placed;
    }
    let Some((_, _, leader)) = settled_leader(answers) else {
        return Spread::NoLeader;
    };
    // With several groups, every one of the member's.
    let applied = |s: &ReplicaStatus| s.voters.contains(&id) == add && s.behind == 0;
    let pending: Vec<u64> = answered()
        .filter(|(r, s)| leader.voters.contains(r) && !applied(s))
        .map(|(r, _)| r)
        .collect();
    if !pending.is_empty() {
        return Spread::Pending(pending);
    }
    Spread::Applied {
        missing: add && !answered().any(|(r, _)| r == id),
    }
}

/// After the leader applied the addition (`add`) or removal of replica
/// `id`: waits, at most `wait`, until every member that answers has
/// applied it too (a replica added: once it has the leader's snapshot).
/// Until then only the leader counts the new membership, and a leader lost
/// in that window can leave a member counting the old one, short of a
/// majority. Says which members have not, if the wait ends first (the
/// change itself is done: this is not an error). Members that do not
/// answer are not waited for; a replica added that does not answer yet is
/// named.
async fn until_applied_everywhere(
    file: &ClusterFile,
    who: &Credentials,
    id: u64,
    add: bool,
    wait: Duration,
) {
    let deadline = tokio::time::Instant::now() + wait;
    let mut said = None;
    loop {
        let pending = match spread(&statuses(file, who).await, id, add) {
            // Nothing to compare with (`cluster status` says more).
            Spread::Placed | Spread::NoLeader => return,
            Spread::Applied { missing: true } => {
                println!(
                    "replica {id} does not answer yet: once it runs, it catches up from the leader's snapshot (`statestore cluster status` shows its lag)"
                );
                return;
            }
            Spread::Applied { missing: false } => {
                println!("every member that answers has applied it");
                return;
            }
            Spread::Pending(pending) => pending,
        };
        let list = pending
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if tokio::time::Instant::now() >= deadline {
            eprintln!(
                "replica(s) {list} have not applied it after {} s (catching up?): before the next change or restart, check that `statestore cluster status` shows every member's lag near 0",
                wait.as_secs()
            );
            return;
        }
        if said.as_ref() != Some(&list) {
            eprintln!(
                "waiting for replica(s) {list} to apply it (up to {} s)",
                wait.as_secs()
            );
            said = Some(list);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `cluster rejoin`: the replica's data directory joins again (keeping its
/// term and vote), then the leader removes it and adds it back.
pub fn rejoin(path: &Path) -> Result<()> {
    let file = ClusterFile::load(path)?;
    if file.replicas.len() < 2 {
        anyhow::bail!(
            "a cluster of one cannot rejoin: no other replica has its log (restore its data directory from a backup)"
        );
    }
    if !file.placement().everywhere() {
        anyhow::bail!(
            "the cluster file places the groups (`copies`): a replica is not rejoined there, it is replaced: `statestore cluster remove --id {}` (its groups move to the others, even while it is down), then add a new replica with another id and `added = true`",
            file.id
        );
    }
    let now = crate::store::clock::now_ms();
    for said in rejoin_data_dir(&file, now)? {
        println!("{said}");
    }
    let me = file.me();
    remove(path, file.id)
        .context("the data directory is ready; the leader did not remove it (run `statestore cluster remove`, then `cluster add`, yourself)")?;
    add(path, file.id, me.raft, me.mqtt)
        .context("removed, but not added back (run `statestore cluster add` yourself)")?;
    println!(
        "replica {} rejoins: start it as before; it catches up from the leader's snapshot. Remove the discarded-* files in {} once it serves.",
        file.id,
        file.data_dir.display()
    );
    Ok(())
}

/// The data directory's part of `cluster rejoin` for replica `file`: every
/// group's log set aside, each keeping its term and vote (with several
/// groups, the newest of its files' and the round journal's; the journal
/// then set aside too). What was done, a line a group.
fn rejoin_data_dir(file: &ClusterFile, now_ms: u64) -> Result<Vec<String>> {
    use crate::store::storage::{DirStorage, Storage as _};
    let root = DirStorage::open(&file.data_dir)
        .with_context(|| format!("cannot open {}", file.data_dir.display()))?;
    let tenants = super::node::recorded_tenants(&root)?;
    let dirs = super::node::group_dirs(&file.data_dir, tenants.as_deref(), file.partitions);
    if let [None] = &dirs[..] {
        return Ok(vec![super::log::rejoin(&root, now_ms, &[])?]);
    }
    // Several groups: the journal holds each one's newest rounds.
    let found = super::log::journal::read(&root).with_context(|| {
        format!(
            "the round journal in {} cannot be read, and it may hold the newest term and vote of every group: the replica cannot rejoin under its id safely (it could vote twice in one term); replace it instead: `statestore cluster remove --id {}`, then add a new replica under a new id",
            file.data_dir.display(),
            file.id
        )
    })?;
    let mut said = Vec::with_capacity(dirs.len());
    for (g, dir) in dirs.iter().enumerate() {
        let dir = dir.as_deref().unwrap_or(&file.data_dir);
        let disk =
            DirStorage::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
        let parts = super::log::journal::parts_of(found.as_deref(), g as u32).unwrap_or_default();
        said.push(super::log::rejoin(&disk, now_ms, &parts)?);
    }
    if found.is_some() {
        let to = format!("discarded-{now_ms}.{}", super::log::journal::JOURNAL);
        root.rename(super::log::journal::JOURNAL, &to)
            .context("moving the round journal aside")?;
        root.sync_dir().context("syncing the data directory")?;
        said.push(format!(
            "{}: the round journal moved aside: {to}",
            file.data_dir.display()
        ));
    }
    Ok(said)
}

/// `cluster add`: replica `id`, listening for replicas on `raft` (and for
/// clients on `mqtt`), becomes a member.
pub fn add(path: &Path, id: u64, raft: SocketAddr, mqtt: Option<SocketAddr>) -> Result<()> {
    change(path, ChangeRequest::Add { id, raft, mqtt })
}

/// `cluster remove`: replica `id` is no longer a member.
pub fn remove(path: &Path, id: u64) -> Result<()> {
    change(path, ChangeRequest::Remove { id })
}

/// `cluster certs`: makes what is missing of the cluster's certificates in
/// the file's `tls_dir`, for its replicas and `more` (replicas to add).
pub fn certs(path: &Path, more: &[u64]) -> Result<()> {
    let file = ClusterFile::load(path)?;
    let Some(dir) = &file.tls_dir else {
        anyhow::bail!(
            "{} has no `tls_dir`: add `tls_dir = \"tls\"` (a directory beside it) to every replica's cluster file, then run this again",
            path.display()
        );
    };
    let mut ids: Vec<u64> = file.replicas.iter().map(|r| r.id).collect();
    for &id in more {
        if id == 0 {
            anyhow::bail!("replica id 0 is reserved");
        }
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    let written = super::pki::make(dir, &ids)?;
    if written.is_empty() {
        println!("{}: every certificate is there already", dir.display());
    }
    for f in &written {
        println!("wrote {}", f.display());
    }
    println!(
        "each replica needs ca.pem and its own replica-<id>.pem and .key from {}; the operator's tools use operator.pem and .key; keep ca.key where no replica is (it issues more)",
        dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{ReplicaStatus, Spread, spread};

    /// A change is over only once every member that answers has applied
    /// it: a member still counting the old membership, or with a group
    /// behind, is waited for; one that does not answer is not.
    #[test]
    fn a_change_is_over_once_every_member_that_answers_has_applied_it() {
        let at = "127.0.0.1:1".parse().expect("addr");
        let status = |id: u64, role: &str, voters: &[u64]| ReplicaStatus {
            id,
            role: role.into(),
            term: 3,
            voters: voters.to_vec(),
            settled: true,
            ..ReplicaStatus::default()
        };
        let answers = |list: Vec<(u64, Option<ReplicaStatus>)>| {
            list.into_iter()
                .map(|(id, s)| (id, at, s.ok_or_else(|| anyhow::anyhow!("no answer"))))
                .collect::<Vec<_>>()
        };
        let all = [1, 2, 4];
        // Replica 4 added: the leader applied it, replica 2 not yet (it
        // counts 1, 2, 3), and 4 is still waiting for its snapshot.
        let a = answers(vec![
            (1, Some(status(1, "leader", &all))),
            (2, Some(status(2, "follower", &[1, 2, 3]))),
            (3, None),
            (4, Some(status(4, "follower", &[]))),
        ]);
        assert_eq!(spread(&a, 4, true), Spread::Pending(vec![2, 4]));
        // Everyone has it; 3 (removed, down) is not waited for.
        let a = answers(vec![
            (1, Some(status(1, "leader", &all))),
            (2, Some(status(2, "follower", &all))),
            (3, None),
            (4, Some(status(4, "follower", &all))),
        ]);
        assert_eq!(spread(&a, 4, true), Spread::Applied { missing: false });
        // With several groups, one of replica 2's groups behind.
        let mut behind = status(2, "follower", &all);
        behind.behind = 1;
        let a = answers(vec![
            (1, Some(status(1, "leader", &all))),
            (2, Some(behind)),
            (4, Some(status(4, "follower", &all))),
        ]);
        assert_eq!(spread(&a, 4, true), Spread::Pending(vec![2]));
        // The replica added does not answer (not started yet, or stopped
        // for `rejoin`): the others are all there is to wait for.
        let a = answers(vec![
            (1, Some(status(1, "leader", &all))),
            (2, Some(status(2, "follower", &all))),
            (4, None),
        ]);
        assert_eq!(spread(&a, 4, true), Spread::Applied { missing: true });
        // A removal: a member still counting the removed one is waited for.
        let a = answers(vec![
            (1, Some(status(1, "leader", &[1, 2]))),
            (2, Some(status(2, "follower", &[1, 2, 3]))),
            (3, Some(status(3, "follower", &[1, 2, 3]))),
        ]);
        assert_eq!(spread(&a, 3, false), Spread::Pending(vec![2]));
        // No leader now, or one not settled (its members may be its
        // predecessor's); placed groups.
        let a = answers(vec![(2, Some(status(2, "candidate", &all)))]);
        assert_eq!(spread(&a, 4, true), Spread::NoLeader);
        let mut fresh = status(1, "leader", &[1, 2, 3]);
        fresh.settled = false;
        let a = answers(vec![
            (1, Some(fresh)),
            (2, Some(status(2, "follower", &[1, 2, 3]))),
        ]);
        assert_eq!(spread(&a, 4, true), Spread::NoLeader);
        let mut placed = status(1, "leader", &all);
        placed.holds = vec![0, 2];
        assert_eq!(
            spread(&answers(vec![(1, Some(placed))]), 4, true),
            Spread::Placed
        );
    }

    #[test]
    fn group_lists_run_together() {
        assert_eq!(super::ranges(&[]), "");
        assert_eq!(super::ranges(&[0, 3]), "0,3");
        assert_eq!(super::ranges(&[3, 2, 0]), "0,2,3");
        assert_eq!(super::ranges(&[0, 1, 2]), "0-2");
        assert_eq!(
            super::ranges(&[9, 0, 2, 3, 4, 5, 7, 8]),
            "0,2-5,7,8,9".replace("7,8,9", "7-9")
        );
        let all: Vec<u32> = (0..1000).collect();
        assert_eq!(super::ranges(&all), "0-999");
    }
}
