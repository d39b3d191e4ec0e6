//! Delivery: the INBOUND and DELIVERY fan-outs (`fanout`, `events`) and their first tries
//! (`direct`) over the WEBHOOK queue's worker (`worker`: stages, signed POSTs, per-target
//! slots, outcomes).

pub mod direct;
pub mod events;
pub mod fanout;
pub mod worker;
