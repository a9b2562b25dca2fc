//! Strict parsing of user input: [`parse_strict`] (JSON values), [`parse_strict_yaml`] and
//! [`yaml_documents`] (YAML text, with line/column in every error).
//!
//! The API types themselves deserialize leniently (unknown fields are ignored) so that stored
//! snapshots stay readable across versions. User input goes through this module instead,
//! which — like `kubectl apply --validate=strict` — rejects every unknown field with its path,
//! and reports a type error with its path. All unknown fields are reported, not just the
//! first; deserialization stops at the first type error, so one error of that kind at most.
//!
//! Two exemptions apply at the root of a document: `apiVersion` and `kind` (they identify the
//! object; [`super::IstioResource`] checks them), and anything under `status` (Istio's CRDs
//! keep unknown status fields).

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// A line and column (both 1-based) in YAML input.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SourceLocation {
    /// 1-based line.
    pub line: u64,
    /// 1-based column.
    pub column: u64,
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)
    }
}

/// One problem in the input: where (`path`, e.g. `spec.http[0].route[0].destinaton`; empty
/// for the whole document) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path with `[index]` for list items; keys that are not plain words are quoted
    /// (`metadata.labels["app.kubernetes.io/name"]`).
    pub path: String,
    /// What is wrong (`unknown field`, `invalid type: …`, `invalid duration …`).
    pub reason: String,
    /// Where in the YAML text, when the input was YAML.
    pub location: Option<SourceLocation>,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.reason)?;
        } else {
            write!(f, "{}: {}", self.path, self.reason)?;
        }
        if let Some(location) = self.location {
            write!(f, " (at {location})")?;
        }
        Ok(())
    }
}

/// Input rejected by the strict parser: every problem found, in input order where known.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ApiParseError {
    /// The problems; never empty.
    pub errors: Vec<FieldError>,
}

impl ApiParseError {
    fn single(path: String, reason: impl Into<String>, location: Option<SourceLocation>) -> Self {
        ApiParseError {
            errors: vec![FieldError {
                path,
                reason: reason.into(),
                location,
            }],
        }
    }
}

impl fmt::Display for ApiParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// One step of a path into a document.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Segment {
    Key(String),
    Index(usize),
}

fn format_path(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
            Segment::Key(key) => {
                let plain = !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if plain {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                } else {
                    out.push_str(&format!("[{key:?}]"));
                }
            }
        }
    }
    out
}

fn ignored_path_segments(path: &serde_ignored::Path<'_>, out: &mut Vec<Segment>) {
    use serde_ignored::Path;
    match path {
        Path::Root => {}
        Path::Seq { parent, index } => {
            ignored_path_segments(parent, out);
            out.push(Segment::Index(*index));
        }
        Path::Map { parent, key } => {
            ignored_path_segments(parent, out);
            out.push(Segment::Key(key.clone()));
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => ignored_path_segments(parent, out),
    }
}

fn error_path_segments(path: &serde_path_to_error::Path) -> Vec<Segment> {
    use serde_path_to_error::Segment as S;
    path.iter()
        .filter_map(|segment| match segment {
            S::Seq { index } => Some(Segment::Index(*index)),
            S::Map { key } => Some(Segment::Key(key.clone())),
            S::Enum { .. } | S::Unknown => None,
        })
        .collect()
}

/// Unknown keys that are nevertheless fine (see the module documentation).
fn is_exempt(segments: &[Segment]) -> bool {
    match segments {
        [Segment::Key(k), rest @ ..] => {
            k == "status" || (rest.is_empty() && (k == "apiVersion" || k == "kind"))
        }
        _ => false,
    }
}

/// Deserializes `value` into `T`, rejecting unknown fields and reporting every problem with
/// its path (e.g. `spec.http[0].route[0].destinaton: unknown field`).
pub fn parse_strict<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, ApiParseError> {
    parse_strict_located(value, &Locations::default())
}

/// An object read from user input, with the fields its type does not know set aside.
#[derive(Clone, Debug, PartialEq)]
pub struct Parsed<T> {
    pub object: T,
    /// Fields the type does not know (reason `unknown field`), in input order. A newer
    /// Istio may define them, or they are typos: callers report them as warnings.
    pub unknown_fields: Vec<FieldError>,
}

/// Deserializes `value` into `T` like [`parse_strict`], except that unknown fields are
/// returned beside the object instead of failing it. Type errors still fail.
pub fn parse_reporting_unknown<T: DeserializeOwned>(
    value: &serde_json::Value,
) -> Result<Parsed<T>, ApiParseError> {
    parse_located(value, &Locations::default())
}

fn parse_strict_located<T: DeserializeOwned>(
    value: &serde_json::Value,
    locations: &Locations,
) -> Result<T, ApiParseError> {
    let parsed = parse_located::<T>(value, locations)?;
    if parsed.unknown_fields.is_empty() {
        Ok(parsed.object)
    } else {
        Err(ApiParseError {
            errors: parsed.unknown_fields,
        })
    }
}

/// Deserializes, collecting unknown fields. On a type error, the unknown fields found
/// before it come first, then the error (deserialization stops there).
fn parse_located<T: DeserializeOwned>(
    value: &serde_json::Value,
    locations: &Locations,
) -> Result<Parsed<T>, ApiParseError> {
    let mut unknown: Vec<Vec<Segment>> = Vec::new();
    let result = {
        let mut on_ignored = |path: serde_ignored::Path<'_>| {
            let mut segments = Vec::new();
            ignored_path_segments(&path, &mut segments);
            unknown.push(segments);
        };
        let deserializer = serde_ignored::Deserializer::new(value, &mut on_ignored);
        serde_path_to_error::deserialize::<_, T>(deserializer)
    };
    let unknown_fields: Vec<FieldError> = unknown
        .into_iter()
        .filter(|segments| !is_exempt(segments))
        .map(|segments| FieldError {
            path: format_path(&segments),
            reason: "unknown field".to_owned(),
            location: locations.find(&segments),
        })
        .collect();
    match result {
        Ok(object) => Ok(Parsed {
            object,
            unknown_fields,
        }),
        Err(error) => {
            let segments = error_path_segments(error.path());
            let mut errors = unknown_fields;
            errors.push(FieldError {
                path: format_path(&segments),
                reason: error.inner().to_string(),
                location: locations.find(&segments),
            });
            Err(ApiParseError { errors })
        }
    }
}

/// Where each node of a YAML document starts (for mapping entries: where the key starts).
#[derive(Clone, Debug, Default)]
struct Locations(HashMap<Vec<Segment>, SourceLocation>);

impl Locations {
    /// The location of the deepest node on `segments` that exists in the document.
    fn find(&self, segments: &[Segment]) -> Option<SourceLocation> {
        (0..=segments.len())
            .rev()
            .find_map(|len| self.0.get(&segments[..len]).copied())
    }
}

/// One document of a YAML stream, converted to JSON the way `kubectl` does, with the source
/// location of every node kept for error messages.
#[derive(Clone, Debug)]
pub struct YamlDocument {
    /// 0-based position of the document in the stream (empty documents are skipped).
    pub index: usize,
    /// The document as a JSON value.
    pub value: serde_json::Value,
    locations: Locations,
}

impl YamlDocument {
    /// Strictly parses this document into `T`; errors carry line and column.
    pub fn parse_strict<T: DeserializeOwned>(&self) -> Result<T, ApiParseError> {
        parse_strict_located(&self.value, &self.locations)
    }

    /// Parses this document into `T`, setting unknown fields aside (with line and
    /// column) instead of failing; see [`parse_reporting_unknown`].
    pub fn parse_reporting_unknown<T: DeserializeOwned>(&self) -> Result<Parsed<T>, ApiParseError> {
        parse_located(&self.value, &self.locations)
    }

    /// Where the document's root node starts (to point at the object in later errors).
    pub fn location_of_root(&self) -> Option<SourceLocation> {
        self.locations.0.get(&Vec::new()).copied()
    }

    /// Where the top-level field `key` starts, or else the document.
    pub fn location_of_field(&self, key: &str) -> Option<SourceLocation> {
        self.locations.find(&[Segment::Key(key.to_owned())])
    }
}

/// Reads every non-empty document of a YAML stream. A YAML syntax error fails the whole
/// stream, with its line and column.
pub fn yaml_documents(input: &str) -> Result<Vec<YamlDocument>, ApiParseError> {
    let nodes: Vec<Spanned<Node>> = serde_saphyr::from_multiple(input).map_err(yaml_error)?;
    nodes
        .into_iter()
        .enumerate()
        .map(|(index, node)| {
            let mut locations = Locations::default();
            let mut path = Vec::new();
            let value = node_to_json(node, None, &mut path, &mut locations)?;
            Ok(YamlDocument {
                index,
                value,
                locations,
            })
        })
        .collect()
}

/// Strictly parses a single YAML document into `T`. A stream with zero or several
/// documents is an error.
pub fn parse_strict_yaml<T: DeserializeOwned>(input: &str) -> Result<T, ApiParseError> {
    let mut documents = yaml_documents(input)?;
    match documents.len() {
        1 => documents.remove(0).parse_strict(),
        0 => Err(ApiParseError::single(
            String::new(),
            "no YAML document found",
            None,
        )),
        n => Err(ApiParseError::single(
            String::new(),
            format!("expected one YAML document, found {n}"),
            None,
        )),
    }
}

fn yaml_error(error: serde_saphyr::Error) -> ApiParseError {
    let location = error
        .location()
        .filter(|l| l.line() > 0)
        .map(|l| SourceLocation {
            line: l.line(),
            column: l.column(),
        });
    // The location goes into its own field: keep the message to its first line (the library
    // may append a source snippet), without the library's own position prefix or its hint
    // about parser options, which the user cannot set.
    let message = error.to_string();
    let mut first_line = message.lines().next().unwrap_or("invalid YAML");
    if let Some(rest) = first_line.strip_prefix("error: ")
        && let Some((position, text)) = rest.split_once(": ")
        && position.starts_with("line ")
    {
        first_line = text;
    }
    let first_line = first_line
        .trim_end_matches(", set DuplicateKeyPolicy in Options if acceptable")
        .to_owned();
    ApiParseError::single(
        String::new(),
        format!("invalid YAML: {first_line}"),
        location,
    )
}

/// A YAML node as read, before conversion to JSON.
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    String(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(Spanned<KeyString>, Spanned<Node>)>),
}

/// A mapping key. JSON keys are strings, so scalar keys (`80:`, `true:`) become their text,
/// as in Kubernetes' YAML-to-JSON conversion.
struct KeyString(String);

fn location_of<T>(spanned: &Spanned<T>) -> Option<SourceLocation> {
    let line = spanned.referenced.line();
    (line > 0).then(|| SourceLocation {
        line,
        column: spanned.referenced.column(),
    })
}

fn node_to_json(
    node: Spanned<Node>,
    key_location: Option<SourceLocation>,
    path: &mut Vec<Segment>,
    locations: &mut Locations,
) -> Result<serde_json::Value, ApiParseError> {
    if let Some(location) = key_location.or_else(|| location_of(&node)) {
        locations.0.insert(path.clone(), location);
    }
    let located = location_of(&node);
    Ok(match node.value {
        Node::Null => serde_json::Value::Null,
        Node::Bool(b) => serde_json::Value::Bool(b),
        Node::Int(i) => serde_json::Value::from(i),
        Node::UInt(u) => serde_json::Value::from(u),
        Node::Float(f) => match serde_json::Number::from_f64(f) {
            Some(n) => serde_json::Value::Number(n),
            None => {
                return Err(ApiParseError::single(
                    format_path(path),
                    format!("number {f} cannot be represented in JSON"),
                    located,
                ));
            }
        },
        Node::String(s) => serde_json::Value::String(s),
        Node::Seq(items) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                path.push(Segment::Index(i));
                out.push(node_to_json(item, None, path, locations)?);
                path.pop();
            }
            serde_json::Value::Array(out)
        }
        Node::Map(entries) => {
            let mut out = serde_json::Map::new();
            for (key, value) in entries {
                let key_location = location_of(&key);
                let key = key.value.0;
                path.push(Segment::Key(key.clone()));
                if out.contains_key(&key) {
                    return Err(ApiParseError::single(
                        format_path(path),
                        "duplicate key",
                        key_location,
                    ));
                }
                let converted = node_to_json(value, key_location, path, locations)?;
                path.pop();
                out.insert(key, converted);
            }
            serde_json::Value::Object(out)
        }
    })
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_none<E>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
                Node::deserialize(d)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Int(v))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
                Ok(Node::UInt(v))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Node, E> {
                Ok(Node::String(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Node, E> {
                Ok(Node::String(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Node::Map(entries))
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}

impl<'de> Deserialize<'de> for KeyString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyString;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar mapping key")
            }
            fn visit_str<E>(self, v: &str) -> Result<KeyString, E> {
                Ok(KeyString(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<KeyString, E> {
                Ok(KeyString(v))
            }
            fn visit_bool<E>(self, v: bool) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_i64<E>(self, v: i64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_unit<E>(self) -> Result<KeyString, E> {
                Ok(KeyString("null".to_owned()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, Debug)]
    #[serde(rename_all = "camelCase")]
    #[allow(dead_code)] // Fields exist to be parsed, not read.
    struct Outer {
        items: Vec<Inner>,
        #[serde(default)]
        name: Option<String>,
    }

    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct Inner {
        port: u32,
    }

    #[test]
    fn reports_every_unknown_field_with_its_path() {
        let err = parse_strict::<Outer>(&json!({
            "items": [{"port": 1, "prot": 2}, {"port": 2, "x.y": {"deep": 1}}],
            "nmae": "a",
            "apiVersion": "v1",
            "status": {"anything": true}
        }))
        .unwrap_err();
        let paths: Vec<_> = err.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["items[0].prot", "items[1][\"x.y\"]", "nmae"]);
        assert!(err.errors.iter().all(|e| e.reason == "unknown field"));
    }

    #[test]
    fn reports_a_type_error_with_its_path_after_unknown_fields() {
        // Keys are visited in sorted order: `additional` before `items`, `nmae` after.
        let err =
            parse_strict::<Outer>(&json!({"additional": 1, "items": [{"port": -1}], "nmae": 1}))
                .unwrap_err();
        assert_eq!(err.errors.len(), 2, "{err}");
        assert_eq!(err.errors[0].path, "additional");
        assert_eq!(err.errors[1].path, "items[0].port");
        assert!(
            err.errors[1].reason.contains("invalid value: integer `-1`"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "additional: unknown field; items[0].port: {}",
                err.errors[1].reason
            )
        );
    }

    #[test]
    fn yaml_errors_carry_line_and_column() {
        let err = parse_strict_yaml::<Outer>("items:\n  - port: 1\n    prot: 2\n").unwrap_err();
        assert_eq!(err.errors[0].path, "items[0].prot");
        assert_eq!(
            err.errors[0].location,
            Some(SourceLocation { line: 3, column: 5 })
        );

        let err = parse_strict_yaml::<Outer>("items:\n  - port: nope\n").unwrap_err();
        assert_eq!(err.errors[0].path, "items[0].port");
        assert_eq!(err.errors[0].location.map(|l| l.line), Some(2));
        assert!(err.to_string().contains("(at line 2, column"), "{err}");

        let err = parse_strict_yaml::<Outer>("items: [\n").unwrap_err();
        assert!(err.errors[0].reason.starts_with("invalid YAML"), "{err}");
        assert!(err.errors[0].location.is_some(), "{err}");
    }

    #[test]
    fn yaml_duplicate_keys_and_document_counts_are_errors() {
        let err = parse_strict_yaml::<Outer>("items: []\nitems: []\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid YAML: duplicate mapping key: items (at line 2, column 1)"
        );
        let err = parse_strict_yaml::<Outer>("items: []\n---\nitems: []\n").unwrap_err();
        assert!(err.to_string().contains("found 2"), "{err}");
        let err = parse_strict_yaml::<Outer>("# nothing\n").unwrap_err();
        assert!(err.to_string().contains("no YAML document"), "{err}");
    }

    #[test]
    fn yaml_converts_like_kubectl() {
        let docs =
            yaml_documents("a: 1\nb: 1.5\nc: true\nd: ~\n80: x\ne: \"2\"\n---\n---\nf: [1]\n")
                .unwrap();
        assert_eq!(docs.len(), 2);
        assert_eq!(
            docs[0].value,
            json!({"a": 1, "b": 1.5, "c": true, "d": null, "80": "x", "e": "2"})
        );
        assert_eq!(docs[1].value, json!({"f": [1]}));
        assert_eq!(docs[1].location_of_root().map(|l| l.line), Some(9));
    }

    #[test]
    fn paths_quote_keys_that_are_not_plain_words() {
        let path = [
            Segment::Key("metadata".into()),
            Segment::Key("labels".into()),
            Segment::Key("app.kubernetes.io/name".into()),
            Segment::Index(3),
        ];
        assert_eq!(
            format_path(&path),
            "metadata.labels[\"app.kubernetes.io/name\"][3]"
        );
    }
}
