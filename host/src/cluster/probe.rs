//! A replica that believes it is a member but has heard from no leader for
//! a while asks the others who the members are. One removed while it was
//! down learns it here: the others no longer send it anything, so its own
//! log never says so, and it would otherwise wait as a candidate for ever.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

/// How long without a leader before the others are asked.
const LEADERLESS: Duration = Duration::from_secs(5);

/// How long one peer may take to answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// The peers' answers: each peer's id and its status text.
type Answers = Vec<(u64, String)>;

/// Asks the peers, now and then, while no leader is known.
pub(crate) struct Probe {
    who: super::net::Credentials,
    leaderless_since: Option<Instant>,
    asked_at: Option<Instant>,
    tx: mpsc::Sender<Answers>,
    rx: mpsc::Receiver<Answers>,
}

impl Probe {
    /// A probe that asks as `who` (the replica).
    pub fn new(who: super::net::Credentials) -> Probe {
        let (tx, rx) = mpsc::channel(1);
        Probe {
            who,
            leaderless_since: None,
            asked_at: None,
            tx,
            rx,
        }
    }

    /// Called on every tick: once a member has known no leader for 5 s,
    /// asks `peers` for their status (again every 5 s while it lasts).
    pub fn tick(&mut self, leader: u64, member: bool, peers: Vec<(u64, SocketAddr)>) {
        if leader != 0 || !member {
            self.leaderless_since = None;
            return;
        }
        let since = *self.leaderless_since.get_or_insert_with(Instant::now);
        let due = self.asked_at.is_none_or(|t| t.elapsed() >= LEADERLESS);
        if since.elapsed() < LEADERLESS || !due {
            return;
        }
        self.asked_at = Some(Instant::now());
        let (who, tx) = (self.who.clone(), self.tx.clone());
        tokio::spawn(async move {
            let mut answers = Vec::new();
            for (id, addr) in peers {
                let asked = tokio::time::timeout(ANSWER_WITHIN, super::net::status(addr, id, &who));
                if let Ok(Ok(text)) = asked.await {
                    answers.push((id, text));
                }
            }
            let _ = tx.try_send(answers);
        });
    }

    /// The next answers (cancel-safe: for a `select!`).
    pub async fn answers(&mut self) -> Answers {
        self.rx.recv().await.unwrap_or_default()
    }
}

/// Why replica `me`, which has applied up to `applied`, is no member: a
/// leader among the `answers`, having applied at least as much, counts
/// members without it. `None` when no answer says so.
pub fn removed(me: u64, applied: u64, answers: &[(u64, String)]) -> Option<String> {
    answers.iter().find_map(|(peer, text)| {
        let s = super::operator::ReplicaStatus::decode(text).ok()?;
        let voters = s.voters.clone();
        (s.leads() && s.applied >= applied && !voters.is_empty() && !voters.contains(&me)).then(
            || {
                format!(
                    "replica {me} is not a member of the cluster: its leader, replica {peer}, counts the members {voters:?} (it was removed, probably while it was down). It stops; to serve again it must be added back (`statestore cluster add`) with an empty data directory and `join = true`"
                )
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::removed;

    fn status(role: &str, applied: u64, voters: &str) -> String {
        format!(
            "id=1\nrole={role}\nterm=3\nleader=1\ncommit={applied}\napplied={applied}\nvoters={voters}\n"
        )
    }

    #[test]
    fn only_a_leader_at_least_as_far_along_says_removed() {
        let answers = |role, applied, voters| vec![(1, status(role, applied, voters))];
        let why = removed(3, 10, &answers("leader", 12, "1,2")).expect("removed");
        assert!(why.contains("replica 3 is not a member"), "{why}");
        assert!(why.contains("[1, 2]"), "{why}");
        // A follower's or a lagging leader's view could be old.
        assert!(removed(3, 10, &answers("follower", 12, "1,2")).is_none());
        assert!(removed(3, 10, &answers("leader", 9, "1,2")).is_none());
        // Still a member, or a leader with no membership yet.
        assert!(removed(3, 10, &answers("leader", 12, "1,2,3")).is_none());
        assert!(removed(3, 10, &answers("leader", 12, "")).is_none());
        assert!(removed(3, 10, &[]).is_none());
    }
}
