//! The inbound-ingest service binary. It keeps glibc malloc, not the kit's
postmesh_shared::service_main!(inbound_ingest);
