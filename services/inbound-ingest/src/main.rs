//! The inbound-ingest service binary. It keeps glibc malloc, not the kit's
//! `fast_allocator`: messages of up to 10 MiB grow their buffers by realloc, which glibc does
//! in place (mremap) and mimalloc by copying (peak RSS 5.2× a 10 MiB message against 2.9×).
#[tokio::main]
async fn main() -> anyhow::Result<()> {
    inbound_ingest::start(inbound_ingest::Config::from_env()?)
        .await?
        .until_signal()
        .await
}
