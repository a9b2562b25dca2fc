//! Faked controllers: the status that real controllers would eventually write, written
//! at once after each write of the object, so `kubectl wait` and `helm --wait` see
//! CRDs `Established`, workloads rolled out (kstatus' readiness rules), Jobs complete
//! and LoadBalancer Services with an address. Pure: each function returns the new
//! status, or `None` when the object is already reconciled.

use serde_json::{Value, json};

use super::registry::ResourceType;

fn int_at(object: &Value, pointer: &str) -> Option<i64> {
    object.pointer(pointer).and_then(Value::as_i64)
}

fn condition(kind: &str, reason: &str, message: &str, now: &str, old: &Value) -> Value {
    // Keep the transition time of a condition that was already true.
    let previous = old
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| {
            c.iter()
                .find(|c| c["type"] == kind && c["status"] == "True")
        });
    let since = previous
        .and_then(|c| c.get("lastTransitionTime"))
        .cloned()
        .unwrap_or_else(|| json!(now));
    json!({
        "type": kind, "status": "True", "reason": reason, "message": message,
        "lastTransitionTime": since,
    })
}

/// New status for `object` (stored form) if a faked controller reconciles its kind.
pub fn reconcile(rt: &ResourceType, object: &Value, now: &str) -> Option<Value> {
    let status = match (rt.group.as_str(), rt.kind.as_str()) {
        ("apiextensions.k8s.io", "CustomResourceDefinition") => crd_status(object, now),
        ("apps", "Deployment") => deployment_status(object, now),
        ("apps", "StatefulSet") => stateful_set_status(object),
        ("apps", "ReplicaSet") => replica_set_status(object),
        ("apps", "DaemonSet") => daemon_set_status(object),
        ("batch", "Job") => job_status(object, now)?,
        ("", "Service") => service_status(object)?,
        _ => return None,
    };
    (object.get("status") != Some(&status)).then_some(status)
}

fn crd_status(crd: &Value, now: &str) -> Value {
    let mut stored_versions: Vec<Value> = crd
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|v| v.iter().find(|v| v["storage"] == true))
        .and_then(|v| v.get("name"))
        .cloned();
    if let Some(storage) = storage
        && !stored_versions.contains(&storage)
    {
        stored_versions.push(storage);
    }
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or_else(|| json!({})),
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found", now, crd),
            condition("Established", "InitialNamesAccepted", "the initial names have been accepted", now, crd),
        ],
        "storedVersions": stored_versions,
    })
}

fn replicas(object: &Value) -> i64 {
    int_at(object, "/spec/replicas").unwrap_or(1)
}

fn generation(object: &Value) -> i64 {
    int_at(object, "/metadata/generation").unwrap_or(1)
}

fn deployment_status(deployment: &Value, now: &str) -> Value {
    let n = replicas(deployment);
    let name = deployment
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    json!({
        "observedGeneration": generation(deployment),
        "replicas": n, "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n,
        "conditions": [
            condition("Available", "MinimumReplicasAvailable", "Deployment has minimum availability.", now, deployment),
            condition("Progressing", "NewReplicaSetAvailable",
                &format!("ReplicaSet \"{name}\" has successfully progressed."), now, deployment),
        ],
    })
}

fn stateful_set_status(set: &Value) -> Value {
    let n = replicas(set);
    let name = set
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let revision = format!("{name}-{}", generation(set));
    json!({
        "observedGeneration": generation(set),
        "replicas": n, "readyReplicas": n, "currentReplicas": n, "updatedReplicas": n,
        "availableReplicas": n, "currentRevision": revision, "updateRevision": revision,
        "collisionCount": 0,
    })
}

fn replica_set_status(set: &Value) -> Value {
    let n = replicas(set);
    json!({
        "observedGeneration": generation(set),
        "replicas": n, "fullyLabeledReplicas": n, "readyReplicas": n, "availableReplicas": n,
    })
}

/// One imaginary node runs one pod of every DaemonSet.
fn daemon_set_status(set: &Value) -> Value {
    json!({
        "observedGeneration": generation(set),
        "currentNumberScheduled": 1, "desiredNumberScheduled": 1, "numberMisscheduled": 0,
        "numberReady": 1, "numberAvailable": 1, "updatedNumberScheduled": 1,
    })
}

/// Every Job succeeds at once (helm waits for hook Jobs to complete).
fn job_status(job: &Value, now: &str) -> Option<Value> {
    if job.pointer("/spec/suspend") == Some(&Value::Bool(true)) {
        return None;
    }
    // Once complete, a Job stays as it is.
    if job.pointer("/status/completionTime").is_some() {
        return job.get("status").cloned();
    }
    let completions = int_at(job, "/spec/completions").unwrap_or(1);
    Some(json!({
        "startTime": now, "completionTime": now, "succeeded": completions, "ready": 0,
        "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods",
             "lastProbeTime": now, "lastTransitionTime": now},
            {"type": "Complete", "status": "True", "reason": "CompletionsReached",
             "message": "Reached expected number of succeeded pods",
             "lastProbeTime": now, "lastTransitionTime": now},
        ],
    }))
}

/// A LoadBalancer Service gets a loopback ingress address, as a cloud controller would
/// give it a real one.
fn service_status(service: &Value) -> Option<Value> {
    if service.pointer("/spec/type").and_then(Value::as_str) != Some("LoadBalancer") {
        return None;
    }
    Some(json!({"loadBalancer": {"ingress": [{"ip": "127.0.0.1", "ipMode": "VIP"}]}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;

    #[test]
    fn deployment_is_reported_rolled_out_once() {
        let registry = Registry::default();
        let rt = registry.lookup("apps", "v1", "deployments").unwrap();
        let mut deployment =
            json!({"metadata": {"name": "web", "generation": 3}, "spec": {"replicas": 2}});
        let status = reconcile(&rt, &deployment, "2024-01-01T00:00:00Z").expect("status");
        assert_eq!(status["observedGeneration"], 3);
        assert_eq!(status["availableReplicas"], 2);
        assert_eq!(status["conditions"][0]["type"], "Available");
        deployment["status"] = status;
        assert!(reconcile(&rt, &deployment, "2024-01-01T00:00:09Z").is_none());
    }

    #[test]
    fn jobs_complete_and_load_balancers_get_an_address() {
        let registry = Registry::default();
        let jobs = registry.lookup("batch", "v1", "jobs").unwrap();
        let mut job = json!({"metadata": {"name": "hook"}, "spec": {"completions": 2}});
        let status = reconcile(&jobs, &job, "2024-01-01T00:00:00Z").expect("status");
        assert_eq!(status["succeeded"], 2);
        assert_eq!(status["conditions"][1]["type"], "Complete");
        job["status"] = status;
        assert!(reconcile(&jobs, &job, "2024-01-01T00:01:00Z").is_none());

        let services = registry.lookup("", "v1", "services").unwrap();
        let cluster_ip = json!({"spec": {"type": "ClusterIP"}, "status": {"loadBalancer": {}}});
        assert!(reconcile(&services, &cluster_ip, "now").is_none());
        let lb = json!({"spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {}}});
        let status = reconcile(&services, &lb, "now").expect("status");
        assert_eq!(status["loadBalancer"]["ingress"][0]["ip"], "127.0.0.1");
    }

    #[test]
    fn crd_is_established_with_its_storage_version() {
        let registry = Registry::default();
        let rt = registry
            .lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .unwrap();
        let crd = json!({"spec": {"names": {"plural": "widgets", "kind": "Widget"},
                                  "versions": [{"name": "v1", "storage": true}]}});
        let status = reconcile(&rt, &crd, "2024-01-01T00:00:00Z").expect("status");
        assert_eq!(status["storedVersions"], json!(["v1"]));
        let types: Vec<&Value> = status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["type"])
            .collect();
        assert_eq!(types, vec!["NamesAccepted", "Established"]);
        assert_eq!(status["acceptedNames"]["kind"], "Widget");
    }
}
