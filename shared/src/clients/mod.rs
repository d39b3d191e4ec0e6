//! Clients of the systems a service talks to. Each is a struct owning its retry policy,
//! with a trait only where tests need a fake, and tests of its own.

pub mod billing;
