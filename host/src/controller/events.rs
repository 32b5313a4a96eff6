//! Publishing Kubernetes Events with a bounded memory.
//!
//! kube's [`Recorder`] keeps every Event it published in the last six minutes, so that a
//! repeat becomes a count on the first one (an Event series) instead of a new object. That
//! cache has no size bound: when thousands of Proxies change at once (a start, a provider
//! outage that makes every Proxy unhealthy), it holds thousands of full Event objects, about
//! 12 MiB at 10,000 events for the table alone. [`Events`] hands out one `Recorder` for at
//! most [`ROTATE_AFTER`] publishes and then starts a fresh one, dropping the old cache. A
//! repeat that falls across a rotation is published as a new Event rather than counted on
//! the old one: a second object, nothing lost.

use kube::runtime::events::{Event, Recorder, Reporter};
use std::sync::Mutex;

/// Publishes per `Recorder`: bounds its cache to this many Events.
pub const ROTATE_AFTER: usize = 1024;

/// The operator's Event publisher (see the module doc).
pub struct Events {
    client: kube::Client,
    reporter: Reporter,
    current: Mutex<(Recorder, usize)>,
}

impl Events {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        let recorder = Recorder::new(client.clone(), reporter.clone());
        Events {
            client,
            reporter,
            current: Mutex::new((recorder, 0)),
        }
    }

    /// The recorder for the next publish, counted; a fresh one every [`ROTATE_AFTER`].
    fn recorder(&self) -> Recorder {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.1 >= ROTATE_AFTER {
            *current = (Recorder::new(self.client.clone(), self.reporter.clone()), 0);
        }
        current.1 += 1;
        current.0.clone()
    }

    pub async fn publish(
        &self,
        event: &Event,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
    ) -> Result<(), kube::Error> {
        self.recorder().publish(event, regarding).await
    }

    /// Publishes counted on the recorder in use now.
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::EventType;

    fn event(reason: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(format!("note of {reason}")),
            action: reason.into(),
            secondary: None,
        }
    }

    fn regarding(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("egress.proxy-operator.dev/v1alpha1".into()),
            kind: Some("Proxy".into()),
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_repeat_is_counted_and_the_cache_is_bounded() {
        let api = fake_kube::FakeApi::new();
        let events = Events::new(
            api.client(),
            Reporter {
                controller: "proxy-operator".into(),
                instance: None,
            },
        );
        let list = || api.objects_of::<K8sEvent>();
        events
            .publish(&event("Created"), &regarding("p"))
            .await
            .unwrap();
        events
            .publish(&event("Created"), &regarding("p"))
            .await
            .unwrap();
        let items = list();
        assert_eq!(items.len(), 1, "a repeat is a series, not a new Event");
        assert_eq!(items[0].series.as_ref().map(|s| s.count), Some(2));

        for i in 0..ROTATE_AFTER {
            events
                .publish(&event("Running"), &regarding(&format!("q{i}")))
                .await
                .unwrap();
            assert!(events.in_use() <= ROTATE_AFTER, "bounded at {i}");
        }
        assert!(events.in_use() < ROTATE_AFTER, "rotated");
        assert_eq!(list().len(), 1 + ROTATE_AFTER, "nothing lost");
    }
}
