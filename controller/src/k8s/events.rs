//! Kubernetes Events about configuration objects: one `Warning` Event, reason
//! `InvalidConfig`, for each *newly* invalid object. "Newly" is read from the object's own
//! status ([`newly_invalid`]): an object whose `Reconciled` condition already says
//! `False` for its current generation has been reported, by us or by a previous leader,
//! so a restart or a failover does not repeat every Event.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use pilotfish_mesh::api::IstioStatus;

use super::status::{Desired, REASON_INVALID, StatusItem, current_condition, truncate};
use crate::metrics;

/// Event notes are limited to 1 kB by the API.
const MAX_NOTE_BYTES: usize = 1024;

/// Whether writing `desired` at `generation` over `current` reports a new problem.
pub fn newly_invalid(current: Option<&IstioStatus>, desired: &Desired, generation: i64) -> bool {
    if desired.valid {
        return false;
    }
    !current_condition(current)
        .is_some_and(|c| c.status == "False" && c.observed_generation == Some(generation))
}

/// Emits Events through kube-runtime's recorder (events.k8s.io/v1, which `kubectl get
/// events` shows as core v1 Events).
#[derive(Clone)]
pub struct EventSink {
    recorder: Recorder,
}

impl EventSink {
    pub fn new(client: Client, instance: &str) -> Self {
        EventSink {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "pilotfish-controller".into(),
                    instance: Some(instance.to_string()),
                },
            ),
        }
    }

    /// Reports that `item`'s object was rejected. Failures are logged and counted: an
    /// Event is a courtesy, the status condition is the record.
    pub async fn invalid(&self, item: &StatusItem) {
        let key = &item.object.key;
        let reference = ObjectReference {
            api_version: Some(format!("{}/v1", pilotfish_mesh::api::GROUP)),
            kind: Some(key.kind.as_str().to_string()),
            name: Some(key.name.clone()),
            namespace: Some(key.namespace.clone()),
            uid: item.object.uid.clone(),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: REASON_INVALID.to_string(),
            note: Some(truncate(&item.desired.message, MAX_NOTE_BYTES)),
            action: "Validate".to_string(),
            secondary: None,
        };
        match self.recorder.publish(&event, &reference).await {
            Ok(()) => {
                metrics::EVENTS_EMITTED
                    .with_label_values(&[REASON_INVALID, "emitted"])
                    .inc();
            }
            Err(e) => {
                metrics::EVENTS_EMITTED
                    .with_label_values(&[REASON_INVALID, "error"])
                    .inc();
                tracing::warn!(object = %key, error = %e, "cannot emit the InvalidConfig Event");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::api::IstioCondition;

    fn invalid(message: &str) -> Desired {
        Desired {
            valid: false,
            reason: REASON_INVALID,
            message: message.into(),
        }
    }

    fn status(cond_status: &str, generation: i64) -> IstioStatus {
        IstioStatus {
            conditions: vec![IstioCondition {
                r#type: "Reconciled".into(),
                status: cond_status.into(),
                observed_generation: Some(generation),
                ..Default::default()
            }],
            observed_generation: Some(generation),
            ..Default::default()
        }
    }

    #[test]
    fn an_object_turning_invalid_is_new() {
        assert!(newly_invalid(None, &invalid("x"), 1));
        assert!(newly_invalid(Some(&status("True", 1)), &invalid("x"), 1));
        // A new invalid generation is a new problem.
        assert!(newly_invalid(Some(&status("False", 1)), &invalid("x"), 2));
    }

    #[test]
    fn an_already_reported_generation_is_not_new() {
        assert!(!newly_invalid(
            Some(&status("False", 2)),
            &invalid("other message"),
            2
        ));
        let valid = Desired {
            valid: true,
            reason: "Accepted",
            message: String::new(),
        };
        assert!(!newly_invalid(None, &valid, 1));
    }
}
