//! What the status writer writes, decided without I/O: the `Reconciled` condition of
//! VirtualServices, DestinationRules, ServiceEntries, PeerAuthentications, Sidecars and AuthorizationPolicies,
//! and the Events that go with it.
//!
//! - [`desired`] turns the builder's findings about one object into the condition it
//!   should carry;
//! - [`plan`] compares that with the object's current status and returns the status to
//!   write, or `None` when it is already there (a write that changes nothing would come
//!   back as a watch event: writing only differences is what prevents echo loops);
//! - [`newly_invalid`] says whether a write reports a new problem, and [`invalid_event`]
//!   is the `Warning` Event (reason `InvalidConfig`) that reports it. "Newly" is read
//!   from the object's own status: an object whose condition already says `False` for its
//!   current generation has been reported, by us or by a previous leader, so a restart or
//!   a failover does not repeat every Event;
//! - [`StatusJob::from_build`] pairs the last full build ([`BuildReport`]) with the stores.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use pilotfish_mesh::api::{IstioCondition, IstioStatus};
use pilotfish_mesh::config::{ConfigError, ConfigKey, ConfigKind};
use pilotfish_mesh::push_context::BuildInputs;

use crate::k8s::decode::DecodeFailure;
use crate::k8s::store::ConfigObject;

/// The condition type Pilotfish writes.
pub const CONDITION_TYPE: &str = "Reconciled";
/// Reason of a rejected object (status `False`) and of its Event.
pub const REASON_INVALID: &str = "InvalidConfig";
/// Reason of an accepted object.
pub const REASON_ACCEPTED: &str = "Accepted";
/// Reason of an accepted object with warnings.
pub const REASON_WARNINGS: &str = "AcceptedWithWarnings";
/// Condition messages are cut to this many bytes (a status is not a log).
pub const MAX_MESSAGE_BYTES: usize = 4096;
/// Event notes are limited to 1 kB by the API.
pub const MAX_NOTE_BYTES: usize = 1024;

/// The condition one object should carry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Desired {
    pub valid: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Desired {
    fn status(&self) -> &'static str {
        if self.valid { "True" } else { "False" }
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The condition for an object from the findings about it. `kept_previous`: its last
/// accepted version is still served. `decode_failure`: its newest version could not be
/// read at all (`has_typed`: an older readable version is still served).
pub fn desired(
    findings: &[&ConfigError],
    kept_previous: bool,
    decode_failure: Option<(&DecodeFailure, bool)>,
) -> Desired {
    const STILL_SERVED: &str = "; the last accepted version is still served";
    if let Some((failure, has_typed)) = decode_failure {
        let mut message = format!("cannot read the object: {failure}");
        if has_typed {
            message.push_str(STILL_SERVED);
        }
        return Desired {
            valid: false,
            reason: REASON_INVALID,
            message: truncate(&message, MAX_MESSAGE_BYTES),
        };
    }
    let errors: Vec<String> = findings
        .iter()
        .filter(|f| f.is_error())
        .map(|f| f.field_message())
        .collect();
    let warnings: Vec<String> = findings
        .iter()
        .filter(|f| !f.is_error())
        .map(|f| f.field_message())
        .collect();
    if !errors.is_empty() {
        let mut message = errors.join("; ");
        if kept_previous {
            message.push_str(STILL_SERVED);
        }
        return Desired {
            valid: false,
            reason: REASON_INVALID,
            message: truncate(&message, MAX_MESSAGE_BYTES),
        };
    }
    if !warnings.is_empty() {
        return Desired {
            valid: true,
            reason: REASON_WARNINGS,
            message: truncate(
                &format!("accepted with warnings: {}", warnings.join("; ")),
                MAX_MESSAGE_BYTES,
            ),
        };
    }
    Desired {
        valid: true,
        reason: REASON_ACCEPTED,
        message: "accepted and in use".to_string(),
    }
}

/// The current `Reconciled` condition of a status, if any.
pub fn current_condition(status: Option<&IstioStatus>) -> Option<&IstioCondition> {
    status?
        .conditions
        .iter()
        .find(|c| c.r#type == CONDITION_TYPE)
}

/// The status to write for `desired` at `generation`, or `None` when `current` already
/// says exactly that. `lastTransitionTime` moves only when the condition's status flips;
/// other conditions and fields of the status are kept.
pub fn plan(
    current: Option<&IstioStatus>,
    desired: &Desired,
    generation: i64,
    now: Timestamp,
) -> Option<IstioStatus> {
    let existing = current_condition(current);
    let up_to_date = existing.is_some_and(|c| {
        c.status == desired.status()
            && c.reason.as_deref() == Some(desired.reason)
            && c.message.as_deref() == Some(desired.message.as_str())
            && c.observed_generation == Some(generation)
    }) && current.and_then(|s| s.observed_generation) == Some(generation);
    if up_to_date {
        return None;
    }
    let last_transition_time = match existing {
        Some(c) if c.status == desired.status() && c.last_transition_time.is_some() => {
            c.last_transition_time.clone()
        }
        _ => Some(Time(now)),
    };
    let condition = IstioCondition {
        r#type: CONDITION_TYPE.to_string(),
        status: desired.status().to_string(),
        last_probe_time: None,
        last_transition_time,
        reason: Some(desired.reason.to_string()),
        message: Some(desired.message.clone()),
        observed_generation: Some(generation),
    };
    let mut status = current.cloned().unwrap_or_default();
    match status
        .conditions
        .iter_mut()
        .find(|c| c.r#type == CONDITION_TYPE)
    {
        Some(c) => *c = condition,
        None => status.conditions.push(condition),
    }
    status.observed_generation = Some(generation);
    Some(status)
}

/// What the last full build said, kept by the mode for status jobs.
#[derive(Clone, Debug, Default)]
pub struct BuildReport {
    findings: BTreeMap<ConfigKey, Vec<ConfigError>>,
    kept_previous: BTreeSet<ConfigKey>,
    /// Generation of each Istio object the build read: a status is written only for
    /// the generation its findings are about.
    generations: BTreeMap<ConfigKey, i64>,
}

impl BuildReport {
    /// Generations of the Istio objects in `inputs` (call before building from them).
    pub fn generations(inputs: &BuildInputs) -> BTreeMap<ConfigKey, i64> {
        let mut out = BTreeMap::new();
        let mut add = |kind, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            out.insert(
                ConfigKey::new(
                    kind,
                    pilotfish_mesh::model::kube::namespace_of(meta),
                    meta.name.clone().unwrap_or_default(),
                ),
                meta.generation.unwrap_or(0),
            );
        };
        for vs in &inputs.virtual_services {
            add(ConfigKind::VirtualService, &vs.metadata);
        }
        for dr in &inputs.destination_rules {
            add(ConfigKind::DestinationRule, &dr.metadata);
        }
        for se in &inputs.service_entries {
            add(ConfigKind::ServiceEntry, &se.metadata);
        }
        for pa in &inputs.peer_authentications {
            add(ConfigKind::PeerAuthentication, &pa.metadata);
        }
        for ra in &inputs.request_authentications {
            add(ConfigKind::RequestAuthentication, &ra.metadata);
        }
        for sc in &inputs.sidecars {
            add(ConfigKind::Sidecar, &sc.metadata);
        }
        for ap in &inputs.authorization_policies {
            add(ConfigKind::AuthorizationPolicy, &ap.metadata);
        }
        out
    }

    pub fn new(
        findings: &[ConfigError],
        kept_previous: &[ConfigKey],
        generations: BTreeMap<ConfigKey, i64>,
    ) -> Self {
        let mut by_key: BTreeMap<ConfigKey, Vec<ConfigError>> = BTreeMap::new();
        for f in findings {
            by_key.entry(f.key.clone()).or_default().push(f.clone());
        }
        BuildReport {
            findings: by_key,
            kept_previous: kept_previous.iter().cloned().collect(),
            generations,
        }
    }
}

/// One object's status work.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusItem {
    pub object: ConfigObject,
    pub desired: Desired,
}

/// Status work after a build (or after statuses changed under us).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StatusJob {
    pub items: Vec<StatusItem>,
}

impl StatusJob {
    /// Pairs the stored Istio objects with the last full build's findings. Objects whose
    /// generation the build has not seen yet are left for the next build's job.
    pub fn from_build(objects: Vec<ConfigObject>, report: &BuildReport) -> StatusJob {
        let mut items = Vec::new();
        for object in objects {
            let desired = match &object.decode_failure {
                Some(failure) => desired(&[], false, Some((failure, object.has_typed))),
                None => {
                    if report.generations.get(&object.key) != Some(&object.generation) {
                        continue;
                    }
                    let findings: Vec<&ConfigError> = report
                        .findings
                        .get(&object.key)
                        .map(|v| v.iter().collect())
                        .unwrap_or_default();
                    desired(&findings, report.kept_previous.contains(&object.key), None)
                }
            };
            items.push(StatusItem { object, desired });
        }
        StatusJob { items }
    }
}

/// Whether writing `desired` at `generation` over `current` reports a new problem.
pub fn newly_invalid(current: Option<&IstioStatus>, desired: &Desired, generation: i64) -> bool {
    if desired.valid {
        return false;
    }
    !current_condition(current)
        .is_some_and(|c| c.status == "False" && c.observed_generation == Some(generation))
}

/// The API group of an Istio kind.
fn api_group(kind: ConfigKind) -> &'static str {
    match kind {
        ConfigKind::PeerAuthentication
        | ConfigKind::RequestAuthentication
        | ConfigKind::AuthorizationPolicy => pilotfish_mesh::api::SECURITY_GROUP,
        _ => pilotfish_mesh::api::GROUP,
    }
}

/// The Event reporting that `item`'s object was rejected, and the object it is about.
pub fn invalid_event(item: &StatusItem) -> (Event, ObjectReference) {
    let key = &item.object.key;
    let reference = ObjectReference {
        api_version: Some(format!("{}/v1", api_group(key.kind))),
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
    (event, reference)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::config::Severity;
    use serde_json::json;

    fn key() -> ConfigKey {
        ConfigKey::new(ConfigKind::VirtualService, "default", "reviews")
    }

    fn err(path: &str, message: &str) -> ConfigError {
        ConfigError::error(&key(), path, message)
    }

    fn warn(path: &str, message: &str) -> ConfigError {
        ConfigError::warning(&key(), path, message)
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn errors_make_the_condition_false_naming_every_field() {
        let a = err(
            "spec.http[0].route[1].weight",
            "must not be negative (got -10)",
        );
        let b = err(
            "spec.http[0].route[0].destination.subset",
            "unknown subset \"v9\"",
        );
        let d = desired(&[&a, &b], false, None);
        assert!(!d.valid);
        assert_eq!(d.reason, "InvalidConfig");
        assert_eq!(
            d.message,
            "spec.http[0].route[1].weight: must not be negative (got -10); spec.http[0].route[0].destination.subset: unknown subset \"v9\""
        );
        let kept = desired(&[&a], true, None);
        assert!(
            kept.message
                .ends_with("the last accepted version is still served"),
            "{}",
            kept.message
        );
    }

    #[test]
    fn warnings_only_keep_the_condition_true() {
        let w = warn("spec.hosts[0]", "also routed by an older VirtualService");
        let d = desired(&[&w], false, None);
        assert!(d.valid);
        assert_eq!(d.reason, REASON_WARNINGS);
        assert!(
            d.message.contains("spec.hosts[0]: also routed"),
            "{}",
            d.message
        );
        assert_eq!(w.severity, Severity::Warning);
        let clean = desired(&[], false, None);
        assert_eq!((clean.valid, clean.reason), (true, REASON_ACCEPTED));
    }

    #[test]
    fn a_decode_failure_is_reported_with_its_path() {
        let failure = DecodeFailure {
            path: "spec.http[0].timeout".into(),
            message: "invalid duration \"soon\"".into(),
        };
        let d = desired(&[], false, Some((&failure, true)));
        assert!(!d.valid);
        assert_eq!(
            d.message,
            "cannot read the object: spec.http[0].timeout: invalid duration \"soon\"; the last accepted version is still served"
        );
    }

    #[test]
    fn plan_writes_only_differences() {
        let d = desired(&[&err("spec.http", "bad")], false, None);
        let first = plan(None, &d, 3, t(100)).expect("nothing written yet");
        assert_eq!(first.observed_generation, Some(3));
        let c = current_condition(Some(&first)).unwrap();
        assert_eq!(c.status, "False");
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(c.last_transition_time, Some(Time(t(100))));
        // The echo of our own write: nothing to do.
        assert_eq!(plan(Some(&first), &d, 3, t(200)), None);
        // Same status, new message: rewritten, transition time kept.
        let d2 = desired(&[&err("spec.http", "worse")], false, None);
        let second = plan(Some(&first), &d2, 3, t(200)).unwrap();
        assert_eq!(
            current_condition(Some(&second))
                .unwrap()
                .last_transition_time,
            Some(Time(t(100)))
        );
        // A new generation with the same verdict is rewritten (observedGeneration).
        assert!(plan(Some(&second), &d2, 4, t(300)).is_some());
        // Fixed: status flips, transition time moves.
        let ok = desired(&[], false, None);
        let third = plan(Some(&second), &ok, 5, t(400)).unwrap();
        let c = current_condition(Some(&third)).unwrap();
        assert_eq!(
            (c.status.as_str(), c.last_transition_time.clone()),
            ("True", Some(Time(t(400))))
        );
    }

    #[test]
    fn plan_keeps_other_conditions_and_fields() {
        let current = IstioStatus {
            conditions: vec![IstioCondition {
                r#type: "Other".into(),
                status: "True".into(),
                ..Default::default()
            }],
            validation_messages: vec![json!({"level": "WARNING"})],
            observed_generation: Some(1),
        };
        let next = plan(Some(&current), &desired(&[], false, None), 1, t(1)).unwrap();
        assert_eq!(next.conditions.len(), 2);
        assert_eq!(next.conditions[0].r#type, "Other");
        assert_eq!(next.validation_messages.len(), 1);
    }

    #[test]
    fn a_status_written_by_someone_else_without_our_condition_is_completed() {
        let current = IstioStatus {
            observed_generation: Some(2),
            ..Default::default()
        };
        assert!(plan(Some(&current), &desired(&[], false, None), 2, t(1)).is_some());
    }

    fn mk_object(generation: i64, failure: Option<DecodeFailure>) -> ConfigObject {
        ConfigObject {
            key: key(),
            uid: Some("u".into()),
            generation,
            resource_version: Some("10".into()),
            status: None,
            decode_failure: failure,
            has_typed: true,
        }
    }

    #[test]
    fn a_job_skips_objects_whose_spec_moved_past_the_build() {
        let report = BuildReport::new(
            &[err("spec.http[0]", "bad")],
            &[],
            BTreeMap::from([(key(), 2)]),
        );
        let job = StatusJob::from_build(vec![mk_object(2, None)], &report);
        assert_eq!(job.items.len(), 1);
        assert!(!job.items[0].desired.valid);
        let job = StatusJob::from_build(vec![mk_object(3, None)], &report);
        assert!(job.items.is_empty(), "generation 3 awaits its own build");
        // A decode failure needs no build: it is reported for the current generation.
        let failure = DecodeFailure {
            path: "spec".into(),
            message: "x".into(),
        };
        let job = StatusJob::from_build(vec![mk_object(3, Some(failure))], &report);
        assert_eq!(job.items.len(), 1);
        assert!(
            job.items[0]
                .desired
                .message
                .starts_with("cannot read the object")
        );
    }

    #[test]
    fn truncation_respects_character_boundaries() {
        let long = "é".repeat(10);
        let cut = truncate(&long, 7);
        assert!(cut.len() <= 7 && cut.ends_with('…'), "{cut}");
        assert_eq!(truncate("short", 10), "short");
    }

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

    #[test]
    fn the_invalid_event_names_the_object_and_cuts_its_note() {
        let item = StatusItem {
            object: mk_object(2, None),
            desired: invalid(&"x".repeat(5000)),
        };
        let (event, reference) = invalid_event(&item);
        assert_eq!(event.type_, EventType::Warning);
        assert_eq!(event.reason, "InvalidConfig");
        let note = event.note.unwrap();
        assert!(
            note.len() <= MAX_NOTE_BYTES && note.ends_with('…'),
            "{}",
            note.len()
        );
        assert_eq!(
            reference.api_version.as_deref(),
            Some("networking.istio.io/v1")
        );
        assert_eq!(reference.kind.as_deref(), Some("VirtualService"));
        assert_eq!(
            (
                reference.namespace.as_deref(),
                reference.name.as_deref(),
                reference.uid.as_deref()
            ),
            (Some("default"), Some("reviews"), Some("u"))
        );
    }
}
