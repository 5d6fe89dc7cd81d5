//! What the operator's tools (`statestore cluster ...`) and a replica say
//! to each other, as types, encoded and decoded here alone: a replica's
//! [`ReplicaStatus`], a [`ChangeRequest`] and its [`ChangeAnswer`]. The
//! text on the wire is what it has always been (`key=value` lines; `add
//! <id> raft=<addr> [mqtt=<addr>]`; `ok ...` / `moving ...` / `error: ...`),
//! so tools and replicas of different builds understand each other.

use std::net::SocketAddr;

use anyhow::{Context, Result, bail};

/// A replica's state, as `cluster status` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReplicaStatus {
    /// Its id.
    pub id: u64,
    /// `leader`, `follower`, `candidate` or `pre-candidate`.
    pub role: String,
    /// Its term.
    pub term: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// Its commit and applied index, its last index and its snapshot's.
    pub commit: u64,
    /// See `commit`.
    pub applied: u64,
    /// See `commit`.
    pub last_index: u64,
    /// See `commit`.
    pub snapshot: u64,
    /// As leader: each replica's match index.
    pub matched: Vec<(u64, u64)>,
    /// Where its embedded broker listens for clients, if known.
    pub mqtt: Option<SocketAddr>,
    /// The members it counts.
    pub voters: Vec<u64>,
    /// Every replica it knows and where it reaches it.
    pub peers: Vec<(u64, SocketAddr)>,
    /// Whether its membership is settled (as leader: it has applied every
    /// change its predecessors committed).
    pub settled: bool,
    /// How many partitions (Raft groups) the store has (0 from an older
    /// build: one).
    pub partitions: u32,
    /// The partitions it leads.
    pub leads: Vec<u32>,
    /// With several groups: how many have other members than group 0 (a
    /// membership change under way).
    pub behind: u32,
    /// With the groups placed on some replicas (`copies`): the groups it
    /// holds (the columns above are the first's); empty: every group.
    pub holds: Vec<u32>,
    /// The tenants it serves, in order (empty: one store without tenants).
    pub tenants: Vec<String>,
    /// The version of the groups' moves it knows of (0: none).
    pub moves: u64,
    /// The move under way it knows of: group, from, to.
    pub moving: Option<(u32, u64, u64)>,
}

impl ReplicaStatus {
    /// The `key=value` lines.
    pub fn encode(&self) -> String {
        let list = |v: Vec<String>| v.join(",");
        format!(
            "id={}\nrole={}\nterm={}\nleader={}\ncommit={}\napplied={}\nlast_index={}\nsnapshot={}\nmatched={}\nmqtt={}\nvoters={}\npeers={}\nsettled={}\npartitions={}\nleads={}\nbehind={}\nholds={}\ntenants={}\nmoves={}\nmoving={}\n",
            self.id,
            self.role,
            self.term,
            self.leader,
            self.commit,
            self.applied,
            self.last_index,
            self.snapshot,
            list(
                self.matched
                    .iter()
                    .map(|(id, m)| format!("{id}:{m}"))
                    .collect()
            ),
            self.mqtt.map_or(String::new(), |a| a.to_string()),
            list(self.voters.iter().map(u64::to_string).collect()),
            list(
                self.peers
                    .iter()
                    .map(|(id, a)| format!("{id}@{a}"))
                    .collect()
            ),
            u8::from(self.settled),
            self.partitions,
            list(self.leads.iter().map(u32::to_string).collect()),
            self.behind,
            list(self.holds.iter().map(u32::to_string).collect()),
            self.tenants.join(","),
            self.moves,
            self.moving
                .map_or(String::new(), |(g, f, t)| format!("{g}:{f}:{t}")),
        )
    }

    /// Reads `key=value` lines; unknown keys are skipped (a newer replica's),
    /// missing ones are empty (an older one's).
    pub fn decode(text: &str) -> Result<ReplicaStatus> {
        // A replica that does not say (an older build) is taken as settled.
        let mut s = ReplicaStatus {
            settled: true,
            ..ReplicaStatus::default()
        };
        let num = |v: &str, k: &str| -> Result<u64> {
            v.parse()
                .with_context(|| format!("{k}={v:?} in a replica's status"))
        };
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            match k {
                "id" => s.id = num(v, k)?,
                "role" => s.role = v.to_string(),
                "term" => s.term = num(v, k)?,
                "leader" => s.leader = num(v, k)?,
                "commit" => s.commit = num(v, k)?,
                "applied" => s.applied = num(v, k)?,
                "last_index" => s.last_index = num(v, k)?,
                "snapshot" => s.snapshot = num(v, k)?,
                "matched" => {
                    for pair in v.split(',').filter(|p| !p.is_empty()) {
                        let (id, m) = pair.split_once(':').context("matched=<id>:<index>")?;
                        s.matched.push((num(id, k)?, num(m, k)?));
                    }
                }
                "mqtt" if v.is_empty() => {}
                "mqtt" => s.mqtt = Some(v.parse().with_context(|| format!("mqtt={v:?}"))?),
                "voters" => {
                    for id in v.split(',').filter(|p| !p.is_empty()) {
                        s.voters.push(num(id, k)?);
                    }
                }
                "peers" => {
                    for peer in v.split(',').filter(|p| !p.is_empty()) {
                        let (id, at) = peer.split_once('@').context("peers=<id>@<addr>")?;
                        let at = at.parse().with_context(|| format!("peers={peer:?}"))?;
                        s.peers.push((num(id, k)?, at));
                    }
                }
                "settled" => s.settled = v == "1",
                "partitions" => {
                    s.partitions = v.parse().with_context(|| format!("partitions={v:?}"))?;
                }
                "behind" => {
                    s.behind = v.parse().with_context(|| format!("behind={v:?}"))?;
                }
                "leads" => {
                    for p in v.split(',').filter(|p| !p.is_empty()) {
                        s.leads
                            .push(p.parse().with_context(|| format!("leads={v:?}"))?);
                    }
                }
                "tenants" => {
                    s.tenants = v
                        .split(',')
                        .filter(|t| !t.is_empty())
                        .map(str::to_string)
                        .collect();
                }
                "moves" => s.moves = num(v, k)?,
                "moving" if v.is_empty() => {}
                "moving" => {
                    let n: Vec<u64> = v.split(':').filter_map(|w| w.parse().ok()).collect();
                    let [g, f, t] = n[..] else {
                        bail!("moving={v:?} in a replica's status");
                    };
                    s.moving = Some((u32::try_from(g)?, f, t));
                }
                "holds" => {
                    for p in v.split(',').filter(|p| !p.is_empty()) {
                        s.holds
                            .push(p.parse().with_context(|| format!("holds={v:?}"))?);
                    }
                }
                _ => {}
            }
        }
        Ok(s)
    }

    /// Whether it leads.
    pub fn leads(&self) -> bool {
        self.role == "leader"
    }
}

/// A membership change an operator asks the leader for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChangeRequest {
    /// Replica `id` becomes a member, reached at `raft` (its clients at `mqtt`).
    Add {
        /// Its id.
        id: u64,
        /// Where the other replicas reach it.
        raft: SocketAddr,
        /// Where its embedded broker listens, for `cluster status`.
        mqtt: Option<SocketAddr>,
    },
    /// Replica `id` is a member no more.
    Remove {
        /// Its id.
        id: u64,
    },
}

impl ChangeRequest {
    /// `add <id> raft=<addr> [mqtt=<addr>]` or `remove <id>`.
    pub fn encode(&self) -> String {
        match self {
            ChangeRequest::Add { id, .. } => {
                format!("add {id} {}", self.record().unwrap_or_default())
            }
            ChangeRequest::Remove { id } => format!("remove {id}"),
        }
    }

    /// Reads what [`ChangeRequest::encode`] writes.
    pub fn decode(text: &str) -> Result<ChangeRequest> {
        let mut words = text.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let id: u64 = words
            .next()
            .and_then(|w| w.parse().ok())
            .context("a replica id")?;
        match verb {
            "add" => {
                let (mut raft, mut mqtt) = (None, None);
                for word in words {
                    match word.split_once('=') {
                        Some(("raft", a)) => {
                            raft = Some(a.parse().with_context(|| format!("raft={a}"))?);
                        }
                        Some(("mqtt", a)) => {
                            mqtt = Some(a.parse().with_context(|| format!("mqtt={a}"))?);
                        }
                        _ => bail!("{word:?} in an address record (raft=<addr> [mqtt=<addr>])"),
                    }
                }
                let raft = raft.context("an address record without raft=<addr>")?;
                Ok(ChangeRequest::Add { id, raft, mqtt })
            }
            "remove" => Ok(ChangeRequest::Remove { id }),
            v => bail!("unknown change {v:?} (add, remove)"),
        }
    }

    /// The replica it is about.
    pub fn id(&self) -> u64 {
        match self {
            ChangeRequest::Add { id, .. } | ChangeRequest::Remove { id } => *id,
        }
    }

    /// For an addition, the address record the log keeps
    /// (`raft=<addr> [mqtt=<addr>]`).
    pub fn record(&self) -> Option<String> {
        match self {
            ChangeRequest::Add { raft, mqtt, .. } => Some(match mqtt {
                Some(m) => format!("raft={raft} mqtt={m}"),
                None => format!("raft={raft}"),
            }),
            ChangeRequest::Remove { .. } => None,
        }
    }
}

/// What a replica answers a [`ChangeRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChangeAnswer {
    /// Proposed to the cluster (applied once committed).
    Proposed(String),
    /// Not yet: this leader is the replica to remove, and hands the
    /// leadership over first; ask the next leader.
    Moving(String),
    /// This replica does not lead (or a change is in progress): ask again,
    /// of the leader it names if it names one.
    AskAgain(String),
    /// Refused, with why.
    Refused(String),
}

impl ChangeAnswer {
    /// `ok ...`, `moving ...` or `error: ...`.
    pub fn encode(&self) -> String {
        match self {
            ChangeAnswer::Proposed(t) => format!("ok {t}"),
            ChangeAnswer::Moving(t) => format!("moving {t}"),
            ChangeAnswer::AskAgain(t) | ChangeAnswer::Refused(t) => format!("error: {t}"),
        }
    }

    /// Reads what [`ChangeAnswer::encode`] writes (an error that names a
    /// leader, or a change in progress, is [`ChangeAnswer::AskAgain`]).
    pub fn decode(text: &str) -> ChangeAnswer {
        if let Some(t) = text.strip_prefix("ok ") {
            return ChangeAnswer::Proposed(t.to_string());
        }
        if let Some(t) = text.strip_prefix("moving ") {
            return ChangeAnswer::Moving(t.to_string());
        }
        let t = text.strip_prefix("error: ").unwrap_or(text).to_string();
        if t.contains("leader=") || t.contains("in progress") {
            ChangeAnswer::AskAgain(t)
        } else {
            ChangeAnswer::Refused(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_changes_read_back_as_written() {
        let s = ReplicaStatus {
            id: 2,
            role: "leader".into(),
            term: 7,
            leader: 2,
            commit: 40,
            applied: 39,
            last_index: 41,
            snapshot: 10,
            matched: vec![(1, 40), (3, 12)],
            mqtt: Some("127.0.0.1:1884".parse().expect("addr")),
            voters: vec![1, 2, 3],
            peers: vec![(1, "127.0.0.1:7101".parse().expect("addr"))],
            settled: true,
            partitions: 4,
            leads: vec![0, 3],
            behind: 1,
            holds: vec![0, 2, 3],
            tenants: vec!["plant".into(), "lab".into()],
            moves: 3,
            moving: Some((2, 1, 4)),
        };
        assert_eq!(ReplicaStatus::decode(&s.encode()).expect("decode"), s);
        assert!(ReplicaStatus::decode("moving=1:2\n").is_err());
        // An older replica's (fewer keys) and a newer one's (more) read.
        let old = ReplicaStatus::decode("id=1\nrole=follower\nterm=3\nnew_key=x\n").expect("old");
        assert_eq!(
            (old.id, old.term, old.voters.len(), old.settled),
            (1, 3, 0, true)
        );
        assert!(ReplicaStatus::decode("term=lots\n").is_err());
        for c in [
            ChangeRequest::Add {
                id: 4,
                raft: "127.0.0.1:7104".parse().expect("addr"),
                mqtt: Some("127.0.0.1:1887".parse().expect("addr")),
            },
            ChangeRequest::Add {
                id: 5,
                raft: "127.0.0.1:7105".parse().expect("addr"),
                mqtt: None,
            },
            ChangeRequest::Remove { id: 3 },
        ] {
            assert_eq!(ChangeRequest::decode(&c.encode()).expect("decode"), c);
        }
        assert!(ChangeRequest::decode("add 4").is_err());
        assert!(ChangeRequest::decode("rename 4").is_err());
        for a in [
            ChangeAnswer::Proposed("proposed: remove 3".into()),
            ChangeAnswer::Moving("the leadership moves to replica 2 first; leader=2".into()),
            ChangeAnswer::AskAgain("not the leader; leader=2".into()),
            ChangeAnswer::Refused("replica 0 is reserved".into()),
        ] {
            assert_eq!(ChangeAnswer::decode(&a.encode()), a);
        }
    }
}
