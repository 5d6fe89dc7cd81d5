//! Shared subscriptions (`$share/<group>/<filter>`) in the embedded broker:
//! each message matching a group's filter goes to one of its members, in
//! turn, preferring members that are connected (a member whose session is
//! kept while it is away gets a message only when nobody in its group is
//! connected, as MQTT 5 allows, 4.8.2). rmqtt routes them; it asks this
//! for the choice (its own default supports none).

use std::sync::atomic::{AtomicUsize, Ordering};

use rmqtt::context::ServerContext;
use rmqtt::subscribe::SharedSubscription;
use rmqtt::types::{
    ClientId, Id, IsOnline, NodeId, SharedGroup, SubscriptionIdentifier, SubscriptionOptions,
    TopicName,
};

/// Round robin over a group's connected members.
#[derive(Debug, Default)]
pub(crate) struct RoundRobin {
    next: AtomicUsize,
}

/// A group member as rmqtt describes it.
type Member = (
    NodeId,
    ClientId,
    SubscriptionOptions,
    Option<Vec<SubscriptionIdentifier>>,
    Option<IsOnline>,
);

/// The member to give the next message to: the next connected one in
/// turn, or, if none is connected, the next one.
pub(crate) fn choose(turn: usize, members: &[Member]) -> Option<(usize, IsOnline)> {
    if members.is_empty() {
        return None;
    }
    let online: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].4.unwrap_or(true))
        .collect();
    if online.is_empty() {
        return Some((turn % members.len(), false));
    }
    Some((online[turn % online.len()], true))
}

#[async_trait::async_trait]
impl SharedSubscription for RoundRobin {
    fn is_supported(&self) -> bool {
        true
    }

    async fn choice(
        &self,
        _scx: &ServerContext,
        _group: &SharedGroup,
        _publisher_id: &Id,
        _topic: &TopicName,
        members: &[Member],
    ) -> Option<(usize, IsOnline)> {
        choose(self.next.fetch_add(1, Ordering::Relaxed), members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, online: bool) -> Member {
        (
            0,
            ClientId::from(id),
            SubscriptionOptions::default(),
            None,
            Some(online),
        )
    }

    #[test]
    fn connected_members_take_turns_and_the_away_wait() {
        let members = [member("a", true), member("b", false), member("c", true)];
        let picks: Vec<_> = (0..4).map(|t| choose(t, &members)).collect();
        assert_eq!(
            picks,
            [
                Some((0, true)),
                Some((2, true)),
                Some((0, true)),
                Some((2, true))
            ]
        );
        let away = [member("a", false), member("b", false)];
        assert_eq!(choose(1, &away), Some((1, false)));
        assert_eq!(choose(0, &[]), None);
    }
}
