//! HTTP front: parses the Kubernetes URL layout (`/api/v1/...`, `/apis/<g>/<v>/...`,
//! namespaced and cluster paths, `/status`, legacy `/watch/` prefix), query parameters
//! and body encodings (JSON, YAML for apply, protobuf), calls the store or the
//! discovery/OpenAPI builders, and renders JSON responses or `Status` errors.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::Shared;
use super::discovery;
use super::error::ApiError;
use super::openapi;
use super::proto;
use super::rbac;
use super::registry::ResourceType;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{FieldValidation, ListOptions, PatchKind, WriteOptions, Written};
use super::tokens;
use super::watch::{self, Start, WatchRequest};

/// Large enough for any CRD or helm release record.
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Query parameters in order of appearance.
struct Params(Vec<(String, String)>);

impl Params {
    fn from_uri(uri: &Uri) -> Result<Self, ApiError> {
        Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map(|Query(pairs)| Params(pairs))
            .map_err(|e| ApiError::bad_request(format!("invalid query string: {e}")))
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    fn write_options(&self) -> Result<WriteOptions, ApiError> {
        let field_validation = match self.get("fieldValidation") {
            None | Some("") | Some("Warn") => FieldValidation::Warn,
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "fieldValidation: Unsupported value: \"{other}\": supported values: \"Ignore\", \"Strict\", \"Warn\""
                )));
            }
        };
        Ok(WriteOptions {
            dry_run: self.get("dryRun") == Some("All"),
            field_manager: self.get("fieldManager").map(str::to_string),
            field_validation,
            force: self.flag("force"),
        })
    }

    fn list_options(&self) -> Result<ListOptions, ApiError> {
        Ok(ListOptions {
            labels: LabelSelector::parse(self.get("labelSelector").unwrap_or(""))?,
            fields: FieldSelector::parse(self.get("fieldSelector").unwrap_or(""))?,
            limit: match self.get("limit") {
                None | Some("") => None,
                Some(l) => Some(
                    l.parse()
                        .map_err(|_| ApiError::bad_request(format!("invalid limit \"{l}\"")))?,
                ),
            },
            continue_token: self
                .get("continue")
                .filter(|c| !c.is_empty())
                .map(str::to_string),
        })
    }
}

/// A request for a resource (rather than discovery).
#[derive(Debug, PartialEq)]
struct ResourcePath {
    group: String,
    version: String,
    watch: bool,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    subresource: Option<String>,
}

#[derive(Debug, PartialEq)]
enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    GroupVersion(String, String),
    OpenApiV2,
    OpenApiIndex,
    OpenApiDocument(String, String),
    Resource(ResourcePath),
    Unknown,
}

fn percent_decode(segment: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((high * 16 + low) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn route(path: &str) -> Route {
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    match s.as_slice() {
        ["version"] => Route::Version,
        ["healthz" | "readyz" | "livez"] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["api", version] => Route::GroupVersion(String::new(), version.to_string()),
        ["apis"] => Route::Groups,
        ["apis", group] => Route::Group(group.to_string()),
        ["apis", group, version] => Route::GroupVersion(group.to_string(), version.to_string()),
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiIndex,
        ["openapi", "v3", rest @ ..] => match openapi::parse_document_path(&rest.join("/")) {
            Some((group, version)) => Route::OpenApiDocument(group, version),
            None => Route::Unknown,
        },
        ["api", version, rest @ ..] => resource_route("", version, rest),
        ["apis", group, version, rest @ ..] => resource_route(group, version, rest),
        _ => Route::Unknown,
    }
}

fn resource_route(group: &str, version: &str, rest: &[&str]) -> Route {
    let (watch, rest) = match rest {
        ["watch", tail @ ..] => (true, tail),
        _ => (false, rest),
    };
    let owned = |s: &&str| s.to_string();
    let (namespace, plural, name, subresource) = match rest {
        ["namespaces", ns, plural, tail @ ..] if *plural != "status" && *plural != "finalize" => {
            match tail {
                [] => (Some(ns.to_string()), plural.to_string(), None, None),
                [name] => (
                    Some(ns.to_string()),
                    plural.to_string(),
                    Some(name.to_string()),
                    None,
                ),
                [name, sub] => (
                    Some(ns.to_string()),
                    plural.to_string(),
                    Some(name.to_string()),
                    Some(sub.to_string()),
                ),
                _ => return Route::Unknown,
            }
        }
        [plural] => (None, plural.to_string(), None, None),
        [plural, name] => (None, plural.to_string(), Some(owned(name)), None),
        [plural, name, sub] => (
            None,
            plural.to_string(),
            Some(owned(name)),
            Some(owned(sub)),
        ),
        _ => return Route::Unknown,
    };
    Route::Resource(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        watch,
        namespace,
        plural,
        name,
        subresource,
    })
}

fn json_response(status: StatusCode, body: &Value, warnings: &[String]) -> Response {
    let mut response = (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    for warning in warnings {
        let text = format!("299 - {}", serde_json::Value::String(warning.clone()));
        if let Ok(value) = text.parse() {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

fn error_response(error: &ApiError) -> Response {
    let status = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &error.to_status(), &[])
}

fn written_response(written: Written) -> Response {
    let status = if written.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json_response(status, &written.object, &written.warnings)
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("application/json")
        .trim()
        .to_ascii_lowercase()
}

fn patch_kind(content_type: &str) -> Result<PatchKind, ApiError> {
    match content_type {
        "application/merge-patch+json" => Ok(PatchKind::Merge),
        "application/json-patch+json" => Ok(PatchKind::Json),
        "application/strategic-merge-patch+json" => Ok(PatchKind::Strategic),
        "application/apply-patch+yaml" => Ok(PatchKind::Apply),
        other => Err(ApiError::unsupported_media_type(format!(
            "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
        ))),
    }
}

/// `/scale`: GET, PUT and PATCH of the Scale view.
fn scale(
    shared: &Arc<Shared>,
    method: &Method,
    headers: &HeaderMap,
    params: &Params,
    body: Bytes,
    rt: &ResourceType,
    path: &ResourcePath,
) -> Result<Response, ApiError> {
    let name = path.name.as_deref().ok_or_else(ApiError::no_such_route)?;
    let namespace = path.namespace.as_deref();
    let content_type = content_type(headers);
    let patch = match *method {
        Method::GET => {
            let scale = shared.lock().get_scale(rt, namespace, name)?;
            return Ok(json_response(StatusCode::OK, &scale, &[]));
        }
        Method::PUT => None,
        Method::PATCH => Some(patch_kind(&content_type)?),
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on /scale"
            )));
        }
    };
    let scale = decode_body(&content_type, &body)?;
    let options = params.write_options()?;
    let written = shared
        .lock()
        .write_scale(rt, namespace, name, patch, scale, &options)?;
    Ok(written_response(written))
}

fn decode_body(content_type: &str, body: &Bytes) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    if content_type == "application/vnd.kubernetes.protobuf" {
        return proto::decode(body);
    }
    if content_type.ends_with("yaml") {
        return serde_saphyr::from_slice::<Value>(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")));
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })
}

/// Entry point for every request.
pub async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let response = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => dispatch(&shared, &parts.method, &parts.uri, &parts.headers, body)
            .unwrap_or_else(|e| error_response(&e)),
        Err(e) => error_response(&ApiError::bad_request(format!("reading request body: {e}"))),
    };
    tracing::debug!(method = %parts.method, uri = %parts.uri, status = response.status().as_u16(), "request");
    response
}

fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let ok = |value: Option<Value>| match value {
        Some(value) => Ok(json_response(StatusCode::OK, &value, &[])),
        None => Err(ApiError::no_such_route()),
    };
    let route = route(uri.path());
    if !matches!(route, Route::Resource(_)) && method != Method::GET {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            uri.path()
        )));
    }
    match route {
        Route::Version => ok(Some(discovery::version())),
        Route::Health => Ok((StatusCode::OK, "ok").into_response()),
        Route::CoreVersions => ok(Some(discovery::api_versions(&shared.server_address))),
        Route::Groups => ok(Some(discovery::api_group_list(&shared.lock().registry))),
        Route::Group(group) => ok(discovery::api_group(&shared.lock().registry, &group)),
        Route::GroupVersion(group, version) => ok(discovery::api_resource_list(
            &shared.lock().registry,
            &group,
            &version,
        )),
        // An empty OpenAPI v2 document (the empty protobuf message): kubectl consults v2
        // only for kinds the v3 documents lack, and then reports the unknown kind itself
        // instead of failing to download OpenAPI.
        Route::OpenApiV2 => Ok((
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
            )],
            Vec::<u8>::new(),
        )
            .into_response()),
        Route::OpenApiIndex => ok(Some(openapi::index(&shared.lock().registry))),
        Route::OpenApiDocument(group, version) => {
            ok(openapi::document(&shared.lock().registry, &group, &version))
        }
        Route::Unknown => Err(ApiError::no_such_route()),
        Route::Resource(path) => resource(shared, method, uri, headers, body, path),
    }
}

fn resource(
    shared: &Arc<Shared>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
    path: ResourcePath,
) -> Result<Response, ApiError> {
    let params = Params::from_uri(uri)?;
    if path.group == "authentication.k8s.io"
        && path.version == "v1"
        && path.plural == "tokenreviews"
        && path.namespace.is_none()
        && path.name.is_none()
    {
        if method != Method::POST {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on tokenreviews: only create"
            )));
        }
        let body = decode_body(&content_type(headers), &body)?;
        let review = tokens::token_review(&shared.lock(), &shared.tokens, &body);
        return Ok(json_response(StatusCode::CREATED, &review, &[]));
    }
    if path.group == "authorization.k8s.io"
        && path.version == "v1"
        && matches!(
            path.plural.as_str(),
            "subjectaccessreviews" | "selfsubjectaccessreviews"
        )
        && path.namespace.is_none()
        && path.name.is_none()
    {
        if method != Method::POST {
            return Err(ApiError::method_not_allowed(format!(
                "{method} is not supported on {}: only create",
                path.plural
            )));
        }
        let body = decode_body(&content_type(headers), &body)?;
        let store = shared.lock();
        let review = if path.plural == "subjectaccessreviews" {
            rbac::subject_access_review(&store, &body)?
        } else {
            rbac::self_subject_access_review(&store, headers, &body)?
        };
        return Ok(json_response(StatusCode::CREATED, &review, &[]));
    }
    let rt = shared
        .lock()
        .registry
        .lookup(&path.group, &path.version, &path.plural)
        .ok_or_else(ApiError::no_such_route)?;
    if !rt.namespaced && path.namespace.is_some() {
        return Err(ApiError::no_such_route());
    }
    let status_only = match path.subresource.as_deref() {
        None => false,
        Some("status") if rt.status_subresource => true,
        Some("scale") if rt.scale.is_some() => {
            return scale(shared, method, headers, &params, body, &rt, &path);
        }
        Some("token") if rt.group.is_empty() && rt.plural == "serviceaccounts" => {
            if method != Method::POST {
                return Err(ApiError::method_not_allowed(format!(
                    "{method} is not supported on serviceaccounts/token: only create"
                )));
            }
            let (Some(namespace), Some(name)) = (path.namespace.as_deref(), path.name.as_deref())
            else {
                return Err(ApiError::no_such_route());
            };
            let body = decode_body(&content_type(headers), &body)?;
            let request =
                tokens::token_request(&shared.lock(), &shared.tokens, namespace, name, &body)?;
            return Ok(json_response(StatusCode::CREATED, &request, &[]));
        }
        Some(_) => return Err(ApiError::no_such_route()),
    };
    let namespace = path.namespace.as_deref();
    let watch = path.watch || params.flag("watch");
    let ok = |value: Value| Ok(json_response(StatusCode::OK, &value, &[]));

    match (method.clone(), path.name.as_deref()) {
        (Method::GET, name) if watch => {
            let mut list_options = params.list_options()?;
            if let Some(name) = name {
                let pinned = format!("metadata.name={name}");
                list_options.fields = FieldSelector::parse(&pinned)?;
            }
            let start = match params.get("resourceVersion") {
                None | Some("") | Some("0") => Start::Now,
                Some(rv) => Start::After(rv.parse().map_err(|_| {
                    ApiError::bad_request(format!("invalid resourceVersion \"{rv}\""))
                })?),
            };
            let timeout = params
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_secs);
            Ok(watch::respond(
                shared.clone(),
                WatchRequest {
                    rt,
                    namespace: path.namespace.clone(),
                    labels: list_options.labels,
                    fields: list_options.fields,
                    start,
                    send_initial_events: params.flag("sendInitialEvents"),
                    bookmarks: params.flag("allowWatchBookmarks"),
                    timeout,
                },
            ))
        }
        (Method::GET, None) => ok(shared
            .lock()
            .list(&rt, namespace, &params.list_options()?)?),
        (Method::GET, Some(name)) => ok(shared.lock().get(&rt, namespace, name)?),
        (Method::POST, None) => {
            if rt.namespaced && namespace.is_none() {
                return Err(ApiError::method_not_allowed(format!(
                    "{} are namespaced: POST to /namespaces/<namespace>/{}",
                    rt.plural, rt.plural
                )));
            }
            let object = decode_body(&content_type(headers), &body)?;
            let options = params.write_options()?;
            Ok(written_response(
                shared.lock().create(&rt, namespace, object, &options)?,
            ))
        }
        (Method::PUT, Some(name)) => {
            let object = decode_body(&content_type(headers), &body)?;
            let options = params.write_options()?;
            Ok(written_response(shared.lock().update(
                &rt,
                namespace,
                name,
                object,
                status_only,
                &options,
            )?))
        }
        (Method::PATCH, Some(name)) => {
            let content_type = content_type(headers);
            let kind = patch_kind(&content_type)?;
            let patch = decode_body(&content_type, &body)?;
            let options = params.write_options()?;
            Ok(written_response(shared.lock().patch(
                &rt,
                namespace,
                name,
                kind,
                patch,
                status_only,
                &options,
            )?))
        }
        (Method::DELETE, name) => {
            let delete_options = if body.is_empty() {
                Value::Object(Default::default())
            } else {
                decode_body(&content_type(headers), &body)?
            };
            let mut options = params.write_options()?;
            if delete_options
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|d| d.iter().any(|v| v == "All"))
            {
                options.dry_run = true;
            }
            let mut store = shared.lock();
            match name {
                Some(name) => ok(store.delete(&rt, namespace, name, &delete_options, &options)?),
                None => ok(store.delete_collection(
                    &rt,
                    namespace,
                    &params.list_options()?,
                    &delete_options,
                    &options,
                )?),
            }
        }
        (method, _) => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            uri.path()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(
        group: &str,
        namespace: Option<&str>,
        plural: &str,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> Route {
        Route::Resource(ResourcePath {
            group: group.into(),
            version: "v1".into(),
            watch: false,
            namespace: namespace.map(Into::into),
            plural: plural.into(),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        })
    }

    #[test]
    fn routes_kubernetes_paths() {
        assert_eq!(route("/version"), Route::Version);
        assert_eq!(route("/openapi/v2"), Route::OpenApiV2);
        assert_eq!(route("/api"), Route::CoreVersions);
        assert_eq!(
            route("/apis/apps/v1"),
            Route::GroupVersion("apps".into(), "v1".into())
        );
        assert_eq!(
            route("/openapi/v3/apis/apps/v1"),
            Route::OpenApiDocument("apps".into(), "v1".into())
        );
        assert_eq!(
            route("/api/v1/namespaces"),
            resource("", None, "namespaces", None, None)
        );
        assert_eq!(
            route("/api/v1/namespaces/foo"),
            resource("", None, "namespaces", Some("foo"), None)
        );
        assert_eq!(
            route("/api/v1/namespaces/foo/status"),
            resource("", None, "namespaces", Some("foo"), Some("status"))
        );
        assert_eq!(
            route("/api/v1/namespaces/foo/configmaps"),
            resource("", Some("foo"), "configmaps", None, None)
        );
        assert_eq!(
            route("/apis/apps/v1/namespaces/ns/deployments/web/status"),
            resource(
                "apps",
                Some("ns"),
                "deployments",
                Some("web"),
                Some("status")
            )
        );
        assert_eq!(
            route("/apis/rbac.authorization.k8s.io/v1/clusterroles/system%3Aview"),
            resource(
                "rbac.authorization.k8s.io",
                None,
                "clusterroles",
                Some("system:view"),
                None
            )
        );
        assert_eq!(route("/api/v1/a/b/c/d"), Route::Unknown);
        match route("/api/v1/watch/namespaces/ns/pods") {
            Route::Resource(p) => assert!(p.watch && p.plural == "pods"),
            other => panic!("{other:?}"),
        }
    }
}
