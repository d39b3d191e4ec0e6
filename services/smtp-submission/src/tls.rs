//! TLS of STARTTLS and the implicit-TLS listener: rustls (ring, as the rest of the
//! workspace) over the PEM files of `SMTP_TLS_CERT` and `SMTP_TLS_KEY`.

use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::TlsFiles;

/// The acceptor of `files`' certificate chain and key.
pub fn acceptor(files: &TlsFiles) -> anyhow::Result<TlsAcceptor> {
    postmesh_shared::tls::install_provider();
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .with_context(|| format!("reading SMTP_TLS_CERT {}", files.cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing SMTP_TLS_CERT {}", files.cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!(
            "SMTP_TLS_CERT {} holds no certificate",
            files.cert.display()
        );
    }
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading SMTP_TLS_KEY {}", files.key.display()))?;
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .context("SMTP_TLS_CERT and SMTP_TLS_KEY do not make a TLS identity")?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
