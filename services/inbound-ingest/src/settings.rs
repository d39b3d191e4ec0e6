//! Inbound-ingest's settings (its rows of `docs/configuration.md`).

use postmesh_shared::settings;

settings! {
    INBOUND_DOMAIN = "inbound.postmesh.localhost", "inbound-ingest: the platform inbound domain, on which any workspace may create addresses";
    INBOUND_RETENTION_DAYS = "30", "inbound-ingest: how long a deleted address's messages are kept before the hourly sweep removes them (`?purge=1` removes at once)";
    INBOUND_WORKSPACE_BYTES_PER_SEC = "2097152" | INBOUND_WORKSPACE_BURST_BYTES = "33554432",
        "inbound-ingest: bytes of mail a workspace may receive, every inbox and replica together (GCRA on the database's clock; a message to several workspaces spends in each, all or none; one larger than the burst costs the burst); beyond, the MTA's ingest is answered 429 with `Retry-After` and the MTA keeps the message for later; `0` turns it off";
}
