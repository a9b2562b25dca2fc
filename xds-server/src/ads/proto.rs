//! Protobuf wire-format helpers for the few fields the engine writes by hand: the xDS
//! responses are assembled from pre-encoded pieces (shared resource bytes, a per-stream
//! nonce), so their fields are written here rather than through generated structs.
//! A message's fields may come in any order, which is what lets a stream append its own
//! fields after bytes shared with other streams.

use bytes::BufMut;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

/// Encoded length of a length-delimited field `tag` carrying `len` bytes.
pub fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// Writes the key and length of a length-delimited field; its `len` bytes follow.
pub fn put_delimited_header(tag: u32, len: usize, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// Writes a whole length-delimited field (string, bytes or an encoded message).
pub fn put_delimited(tag: u32, value: &[u8], buf: &mut impl BufMut) {
    put_delimited_header(tag, value.len(), buf);
    buf.put_slice(value);
}

/// Encoded length of `google.protobuf.Any { type_url = 1; value = 2 }`.
pub fn any_len(any: &prost_types::Any) -> usize {
    delimited_len(1, any.type_url.len()) + delimited_len(2, any.value.len())
}

/// Writes the fields of a `google.protobuf.Any` (the message body, without its own key).
pub fn put_any(any: &prost_types::Any, buf: &mut impl BufMut) {
    put_delimited(1, any.type_url.as_bytes(), buf);
    put_delimited(2, &any.value, buf);
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn hand_written_any_matches_prost() {
        let any = prost_types::Any {
            type_url: "type.googleapis.com/x".into(),
            value: vec![7u8; 300],
        };
        let mut ours = Vec::new();
        put_any(&any, &mut ours);
        assert_eq!(ours, any.encode_to_vec());
        assert_eq!(any_len(&any), ours.len());
        let mut field = Vec::new();
        put_delimited(2, &ours, &mut field);
        assert_eq!(field.len(), delimited_len(2, ours.len()));
    }
}
