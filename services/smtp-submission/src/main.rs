//! The smtp-submission service binary.
postmesh_shared::service_main!(smtp_submission);
