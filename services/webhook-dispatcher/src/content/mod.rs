//! What a delivery carries: the event envelopes and their signatures (`payload`), a received
//! message's body rendered for an endpoint (`quotes`), after received HTML was bounded
//! (`bounded`).

pub mod bounded;
pub mod payload;
pub mod quotes;
