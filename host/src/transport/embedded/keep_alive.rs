//! Keep-alive as MQTT 5 says it (3.1.2.10): a client that sends nothing for
//! one and a half times its keep-alive is disconnected. rmqtt waits 1.5
//! times for a keep-alive of 6 s or more, but the keep-alive plus 3 s below
//! that (4 s for a keep-alive of 1 s); this fitter keeps every other rmqtt
//! negotiation and answers 1.5 times, rounded up to whole seconds, always.

use std::num::{NonZeroU16, NonZeroU32};
use std::sync::Arc;
use std::time::Duration;

use rmqtt::codec::types::Publish as CodecPublish;
use rmqtt::fitter::{DefaultFitter, Fitter, FitterManager};
use rmqtt::types::{ConnectInfo, Disconnect, FitterType, Id, ListenerConfig};

/// Makes [`OneAndAHalf`] fitters.
pub(crate) struct Manager;

impl FitterManager for Manager {
    fn create(&self, conn_info: Arc<ConnectInfo>, id: Id, cfg: ListenerConfig) -> FitterType {
        Arc::new(OneAndAHalf(DefaultFitter::new(conn_info, id, cfg)))
    }
}

/// rmqtt's fitter with the keep-alive wait of MQTT 5.
pub(crate) struct OneAndAHalf(DefaultFitter);

/// Seconds to wait for a client whose keep-alive is `keep_alive` seconds.
pub fn wait(keep_alive: u16) -> u16 {
    u16::try_from((u32::from(keep_alive) * 3).div_ceil(2)).unwrap_or(u16::MAX)
}

#[async_trait::async_trait]
impl Fitter for OneAndAHalf {
    fn keep_alive(&self, keep_alive: &mut u16) -> rmqtt::Result<u16> {
        let rmqtt = self.0.keep_alive(keep_alive)?;
        Ok(if rmqtt == 0 { 0 } else { wait(*keep_alive) })
    }

    fn max_mqueue_len(&self) -> usize {
        self.0.max_mqueue_len()
    }

    fn mqueue_rate_limit(&self) -> (NonZeroU32, Duration) {
        self.0.mqueue_rate_limit()
    }

    fn max_inflight(&self) -> NonZeroU16 {
        self.0.max_inflight()
    }

    fn session_expiry_interval(&self, d: Option<&Disconnect>) -> Duration {
        self.0.session_expiry_interval(d)
    }

    fn message_expiry_interval(&self, publish: &CodecPublish) -> Duration {
        self.0.message_expiry_interval(publish)
    }

    fn max_client_topic_aliases(&self) -> u16 {
        self.0.max_client_topic_aliases()
    }

    fn max_server_topic_aliases(&self) -> u16 {
        self.0.max_server_topic_aliases()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_and_a_half_times_rounded_up() {
        assert_eq!(super::wait(1), 2);
        assert_eq!(super::wait(2), 3);
        assert_eq!(super::wait(5), 8);
        assert_eq!(super::wait(60), 90);
        assert_eq!(super::wait(u16::MAX), u16::MAX);
    }
}
