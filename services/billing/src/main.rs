//! The billing service binary.
postmesh_shared::service_main!(billing);
