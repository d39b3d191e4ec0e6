//! The domain service binary.
postmesh_shared::service_main!(domain);
