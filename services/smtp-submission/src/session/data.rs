//! A message being read after `DATA`: smtp-proto's receiver (the line `.` ends it, stuffed
//! dots are removed), at most `max` bytes kept, and no more than the replica's [`Budget`]
//! has left; past either the rest is read and dropped, up to twice `max` in all
//! ([`DataIn::hopeless`]).

use std::sync::Arc;

use smtp_proto::request::receiver::{DataReceiver, DummyDataReceiver};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::reply::Reply;

/// The budget's unit.
const MIB: usize = 1024 * 1024;
/// Bytes of budget a byte of a message holds: its buffer (up to twice its length as it
/// grows), then its base64 and the JSON request carrying that, while it is sent.
const COST: usize = 5;

/// The memory the messages in hand may hold, all connections together, in MiB.
#[derive(Clone)]
pub struct Budget(Arc<Semaphore>);

impl Budget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        let mib = (bytes / MIB).clamp(1, Semaphore::MAX_PERMITS);
        Self(Arc::new(Semaphore::new(mib)))
    }
}

/// Why a message is not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dropped {
    /// It is larger than `max`.
    TooLarge,
    /// The budget had nothing left for it.
    NoMemory,
}

/// A message being read.
pub struct DataIn {
    receiver: DataReceiver,
    discard: Option<(DummyDataReceiver, Dropped)>,
    /// Bytes read and dropped, once past the limit.
    dropped: usize,
    bytes: Vec<u8>,
    max: usize,
    budget: Budget,
    /// What the message holds of the budget, and how many MiB that is.
    held: Option<OwnedSemaphorePermit>,
    held_mib: usize,
}

impl DataIn {
    /// A message of at most `max` bytes, held within `budget`.
    pub fn new(max: usize, budget: Budget) -> Self {
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
            budget,
            held: None,
            held_mib: 0,
        }
    }

    /// Reads from `bytes`; true once the message's last line is in (what follows it is
    /// left in `bytes`).
    pub fn ingest(&mut self, bytes: &mut std::slice::Iter<'_, u8>) -> bool {
        if let Some((discard, _)) = &mut self.discard {
            let before = bytes.len();
            let done = discard.ingest(bytes);
            self.dropped += before - bytes.len();
            return done;
        }
        let done = self.receiver.ingest(bytes, &mut self.bytes);
        let why = if self.bytes.len() > self.max {
            Some(Dropped::TooLarge)
        } else {
            (!self.reserve()).then_some(Dropped::NoMemory)
        };
        if let Some(why) = why {
            self.discard = Some((DummyDataReceiver::new_data(&self.receiver), why));
            self.dropped = self.bytes.len();
            self.bytes = Vec::new();
            (self.held, self.held_mib) = (None, 0);
        }
        done
    }

    /// Takes what the message now needs of the budget; false when it has not that much left.
    fn reserve(&mut self) -> bool {
        let need = (self.bytes.len() * COST).div_ceil(MIB);
        if need <= self.held_mib {
            return true;
        }
        let more = u32::try_from(need - self.held_mib).unwrap_or(u32::MAX);
        match self.budget.0.clone().try_acquire_many_owned(more) {
            Ok(permit) => {
                match &mut self.held {
                    Some(held) => held.merge(permit),
                    None => self.held = Some(permit),
                }
                self.held_mib = need;
                true
            }
            Err(_) => false,
        }
    }

    /// The reply to a message that was not kept: 552 for one over `max`, 452 when memory
    /// ran short (the client sends it again later).
    pub fn refusal(&self) -> Option<Reply> {
        match self.discard.as_ref().map(|(_, why)| *why) {
            Some(Dropped::TooLarge) => Some(Reply::new(
                552,
                "5.3.4",
                format!("the message is larger than the {} bytes allowed", self.max),
            )),
            Some(Dropped::NoMemory) => Some(Reply::new(
                452,
                "4.3.1",
                "insufficient system storage; try again later",
            )),
            None => None,
        }
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
        let mut data = DataIn::new(1024, Budget::new(MIB));
        assert!(read_all(&mut data, b"..first\r\nsecond\r\n.\r\n"));
        assert_eq!(data.bytes(), b".first\r\nsecond\r\n");
        let mut empty = DataIn::new(1024, Budget::new(MIB));
        assert!(read_all(&mut empty, b".\r\n"));
        assert!(empty.bytes().is_empty());
        // Split anywhere, the same.
        let mut split = DataIn::new(1024, Budget::new(MIB));
        assert!(!read_all(&mut split, b"a\r\n."));
        assert!(read_all(&mut split, b"\r\n"));
        assert_eq!(split.bytes(), b"a\r\n");
    }

    #[test]
    fn a_message_over_the_limit_is_read_to_its_end_and_dropped() {
        let mut data = DataIn::new(10, Budget::new(MIB));
        assert!(!read_all(&mut data, &[b'x'; 100]));
        assert!(data.refusal().is_some_and(|r| r.code == 552) && data.bytes().is_empty());
        assert!(!read_all(&mut data, b"\r\nmore\r\n"));
        let mut rest = b".\r\nNOOP\r\n".iter();
        assert!(data.ingest(&mut rest) && data.refusal().is_some_and(|r| r.code == 552));
        assert_eq!(rest.as_slice(), b"NOOP\r\n");
    }

    #[test]
    fn a_stream_twice_the_limit_with_no_end_is_hopeless() {
        let mut data = DataIn::new(10, Budget::new(MIB));
        assert!(!read_all(&mut data, &[b'x'; 15]));
        assert!(data.refusal().is_some() && !data.hopeless());
        assert!(!read_all(&mut data, &[b'x'; 10]));
        assert!(data.hopeless());
    }

    #[test]
    fn messages_are_held_within_the_budget_and_one_that_finds_none_left_is_told_to_wait() {
        let message =
            |byte: u8, kib: usize| [vec![byte; kib * 1024], b"\r\n.\r\n".to_vec()].concat();
        // 2 MiB of budget: about 400 KiB of messages at five times their size.
        let budget = Budget::new(2 * MIB);
        let mut first = DataIn::new(MIB, budget.clone());
        assert!(read_all(&mut first, &message(b'x', 300)));
        assert!(first.refusal().is_none());
        let mut second = DataIn::new(MIB, budget.clone());
        assert!(read_all(&mut second, &message(b'y', 200)));
        let refused = second.refusal().expect("no memory left");
        assert_eq!((refused.code, refused.status), (452, "4.3.1"));
        assert!(second.bytes().is_empty());
        // Sent and gone: its memory is the next message's.
        drop(first);
        let mut third = DataIn::new(MIB, budget);
        assert!(read_all(&mut third, &message(b'z', 300)));
        assert!(third.refusal().is_none());
    }
}
