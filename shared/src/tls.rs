//! TLS for outgoing HTTPS (Stripe, OTLP): rustls with the ring provider, as lettre uses, so
//! the workspace carries one crypto library.

/// Makes ring the process's rustls provider; call before building any HTTP client. Safe to
/// call again (a provider already installed is kept).
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
