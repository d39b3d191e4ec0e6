//! The webhook-dispatcher service binary.
postmesh_shared::service_main!(webhook_dispatcher);
