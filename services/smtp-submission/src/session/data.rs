//! A message being read after `DATA`: smtp-proto's receiver (the line `.` ends it, stuffed
//! dots are removed), at most `max` bytes kept; past that the rest is read and dropped, up
//! to twice `max` in all ([`DataIn::hopeless`]).

use smtp_proto::request::receiver::{DataReceiver, DummyDataReceiver};

/// A message being read.
pub struct DataIn {
    receiver: DataReceiver,
    discard: Option<DummyDataReceiver>,
    /// Bytes read and dropped, once past the limit.
    dropped: usize,
    bytes: Vec<u8>,
    max: usize,
}

impl DataIn {
    /// A message of at most `max` bytes.
    pub fn new(max: usize) -> Self {
        let mut receiver = DataReceiver::new();
        // The receiver finds `.` only after a line end: as if one came before the message,
        // so a message whose first line is stuffed (or empty) is read right.
        receiver.ingest(&mut b"\r\n".iter(), &mut Vec::new());
        Self {
            receiver,
            discard: None,
            dropped: 0,
            bytes: Vec::new(),
            max,
        }
    }

    /// Reads from `bytes`; true once the message's last line is in (what follows it is
    /// left in `bytes`).
    pub fn ingest(&mut self, bytes: &mut std::slice::Iter<'_, u8>) -> bool {
        if let Some(discard) = &mut self.discard {
            let before = bytes.len();
            let done = discard.ingest(bytes);
            self.dropped += before - bytes.len();
            return done;
        }
        let done = self.receiver.ingest(bytes, &mut self.bytes);
        if !done && self.bytes.len() > self.max {
            self.discard = Some(DummyDataReceiver::new_data(&self.receiver));
            self.dropped = self.bytes.len();
            self.bytes = Vec::new();
        }
        done
    }

    /// Whether it was larger than `max`.
    pub fn too_large(&self) -> bool {
        self.discard.is_some() || self.bytes.len() > self.max
    }

    /// Whether twice the bytes a message may hold were read with no end in sight: the
    /// client is streaming, not sending a message, and is let go.
    pub fn hopeless(&self) -> bool {
        self.dropped > self.max.saturating_mul(2)
    }

    /// The message as read.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(data: &mut DataIn, input: &[u8]) -> bool {
        let mut bytes = input.iter();
        let done = data.ingest(&mut bytes);
        assert!(bytes.as_slice().is_empty() || done);
        done
    }

    #[test]
    fn a_message_ends_at_a_lone_dot_and_is_unstuffed_from_its_first_line() {
        let mut data = DataIn::new(1024);
        assert!(read_all(&mut data, b"..first\r\nsecond\r\n.\r\n"));
        assert_eq!(data.bytes(), b".first\r\nsecond\r\n");
        let mut empty = DataIn::new(1024);
        assert!(read_all(&mut empty, b".\r\n"));
        assert!(empty.bytes().is_empty());
        // Split anywhere, the same.
        let mut split = DataIn::new(1024);
        assert!(!read_all(&mut split, b"a\r\n."));
        assert!(read_all(&mut split, b"\r\n"));
        assert_eq!(split.bytes(), b"a\r\n");
    }

    #[test]
    fn a_message_over_the_limit_is_read_to_its_end_and_dropped() {
        let mut data = DataIn::new(10);
        assert!(!read_all(&mut data, &[b'x'; 100]));
        assert!(data.too_large() && data.bytes().is_empty());
        assert!(!read_all(&mut data, b"\r\nmore\r\n"));
        let mut rest = b".\r\nNOOP\r\n".iter();
        assert!(data.ingest(&mut rest) && data.too_large());
        assert_eq!(rest.as_slice(), b"NOOP\r\n");
    }

    #[test]
    fn a_stream_twice_the_limit_with_no_end_is_hopeless() {
        let mut data = DataIn::new(10);
        assert!(!read_all(&mut data, &[b'x'; 15]));
        assert!(data.too_large() && !data.hopeless());
        assert!(!read_all(&mut data, &[b'x'; 10]));
        assert!(data.hopeless());
    }
}
