//! The `/scale` subresource: GET builds the `autoscaling/v1` Scale view of an object;
//! PUT or PATCH changes the Scale and writes its `spec.replicas` back into the object
//! (the view itself is the apiserver's `scale` module).

use serde_json::Value;

use super::{PatchKind, Store, WriteOptions, Written, meta_str};
use crate::apiserver::convert::to_served;
use crate::apiserver::error::{ApiError, Cause};
use crate::apiserver::patch::{json_patch, merge_patch};
use crate::apiserver::registry::ResourceType;
use crate::apiserver::scale::{scale_of, set_replicas};

impl Store {
    /// GET of `/scale`.
    pub fn get_scale(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let paths = rt.scale.as_ref().ok_or_else(ApiError::no_such_route)?;
        Ok(scale_of(paths, &self.get(rt, namespace, name)?))
    }

    /// PUT (`patch == None`) or PATCH of `/scale`: the Scale is changed, then its
    /// `spec.replicas` is written into the object.
    #[allow(clippy::too_many_arguments)] // one argument per part of the request
    pub fn write_scale(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        patch: Option<PatchKind>,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let paths = rt.scale.clone().ok_or_else(ApiError::no_such_route)?;
        let key = Self::key_for(rt, namespace, name);
        let old = self
            .stored(&rt.storage, &key)
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let current = to_served(&old, rt);
        let mut wanted = scale_of(&paths, &current);
        match patch {
            None => wanted = body,
            Some(PatchKind::Json) => json_patch(&mut wanted, &body).map_err(|e| ApiError {
                code: 422,
                reason: "Invalid",
                message: e,
                details: None,
            })?,
            // A Scale has no lists, so every other flavour merges like a merge patch.
            Some(_) => merge_patch(&mut wanted, &body),
        }
        let precondition = meta_str(&wanted, "resourceVersion");
        if !precondition.is_empty() && precondition != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let replicas = wanted.pointer("/spec/replicas").and_then(Value::as_i64);
        let replicas = match replicas {
            Some(r) if r >= 0 => r,
            _ => {
                return Err(ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    vec![Cause::new(
                        "FieldValueInvalid",
                        "spec.replicas",
                        format!(
                            "Invalid value: {}: must be greater than or equal to 0",
                            wanted.pointer("/spec/replicas").unwrap_or(&Value::Null)
                        ),
                    )],
                ));
            }
        };
        let mut updated = current;
        set_replicas(&paths, &mut updated, replicas);
        let written = self.finish_update(rt, &key, old, updated, false, options)?;
        Ok(Written {
            object: scale_of(&paths, &written.object),
            ..written
        })
    }
}
