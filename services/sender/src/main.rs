//! The sender service binary.
postmesh_shared::service_main!(sender);
