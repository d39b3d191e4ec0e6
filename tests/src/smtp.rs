//! The SMTP submission service beside a test stack ([`SmtpServer`]), with its TLS pair, and
//! a client that speaks SMTP a line at a time ([`SmtpConn`]) for what real clients never
//! send.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf,
    WriteHalf,
};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use postmesh_shared::Running;
use smtp_submission::{Config, TlsFiles};

use crate::Stack;

/// The SMTP submission service of a test.
pub struct SmtpServer {
    running: Option<Running>,
    /// The submission listener (STARTTLS).
    pub addr: SocketAddr,
    /// The implicit-TLS listener.
    pub tls_addr: SocketAddr,
    /// Its certificate (PEM), self-signed for `localhost` and `127.0.0.1`.
    pub cert: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmtpServer {
    /// Starts the service for `stack`'s gateway with a fresh TLS pair, both listeners and the
    /// defaults; `adjust` changes what a test needs.
    pub async fn start(stack: &Stack, adjust: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let made = crate::cluster::deploy_script("smtp-cert.sh", &[&dir.path().to_string_lossy()])
            .status()
            .await
            .expect("deploy/smtp-cert.sh runs");
        assert!(made.success(), "deploy/smtp-cert.sh failed");
        let tls = TlsFiles {
            cert: dir.path().join("cert.pem"),
            key: dir.path().join("key.pem"),
        };
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut config = Config {
            common: stack.common.clone(),
            listen: any,
            tls_listen: Some(any),
            tls: Some(tls.clone()),
            allow_plaintext_auth: false,
            max_message_bytes: smtp_submission::settings::SMTP_MAX_MESSAGE_BYTES.default_of(),
            api_url: stack.base.clone(),
            hostname: "smtp.postmesh.test".into(),
            max_connections_per_ip: 20,
            max_connections: 1000,
            idle_timeout: Duration::from_secs(30),
            max_commands: 10_000,
            auth_failures: 10,
            auth_failure_window: Duration::from_secs(600),
            message_memory: smtp_submission::settings::SMTP_MESSAGE_MEMORY_BYTES.default_of(),
        };
        adjust(&mut config);
        let (running, listening) = smtp_submission::serve(config)
            .await
            .expect("smtp-submission starts");
        Self {
            running: Some(running),
            addr: listening.smtp,
            tls_addr: listening.smtps.expect("the implicit-TLS listener"),
            cert: tls.cert,
            _dir: dir,
        }
    }

    /// A plaintext connection, greeted.
    pub async fn connect(&self) -> SmtpConn {
        let (conn, greeting) = SmtpConn::connect(self.addr).await;
        assert_eq!(greeting.0, 220, "{greeting:?}");
        conn
    }

    /// Stops the service, draining its connections.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            running.stop().await;
        }
    }
}

/// An SMTP client writing what it is told and reading replies whole (multi-line joined),
/// over TCP or, after [`SmtpConn::starttls`], TLS.
pub struct SmtpConn<S = TcpStream> {
    reader: BufReader<ReadHalf<S>>,
    writer: WriteHalf<S>,
}

/// A reply: its code and its lines' texts (after the code), joined by `\n`.
pub type SmtpReply = (u16, String);

impl SmtpConn {
    /// Connects to `addr`; the connection and the server's first reply.
    pub async fn connect(addr: SocketAddr) -> (Self, SmtpReply) {
        let stream = TcpStream::connect(addr).await.expect("connects");
        let mut conn = Self::over(stream);
        let greeting = conn.reply().await;
        (conn, greeting)
    }

    /// Connects to `addr` from the loopback address `local` (any of 127.0.0.0/8): a
    /// client at another address; the connection and the server's first reply.
    pub async fn connect_from(addr: SocketAddr, local: std::net::Ipv4Addr) -> (Self, SmtpReply) {
        let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
        socket
            .bind(SocketAddr::from((local, 0)))
            .expect("binds a loopback address");
        let stream = socket.connect(addr).await.expect("connects");
        let mut conn = Self::over(stream);
        let greeting = conn.reply().await;
        (conn, greeting)
    }

    /// `STARTTLS`, then the handshake for `localhost` trusting the certificate `cert`
    /// (PEM): the connection over TLS, not greeted again.
    pub async fn starttls(mut self, cert: &Path) -> SmtpConn<TlsStream<TcpStream>> {
        self.expect("STARTTLS", 220).await;
        let stream = self.reader.into_inner().unsplit(self.writer);
        postmesh_shared::tls::install_provider();
        let mut roots = rustls::RootCertStore::empty();
        for der in CertificateDer::pem_file_iter(cert).expect("the certificate") {
            roots.add(der.expect("a PEM certificate")).expect("a root");
        }
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from("localhost").expect("a name");
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name, stream)
            .await
            .expect("the TLS handshake");
        SmtpConn::over(tls)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> SmtpConn<S> {
    fn over(stream: S) -> Self {
        let (read, writer) = tokio::io::split(stream);
        Self {
            reader: BufReader::new(read),
            writer,
        }
    }

    /// Writes `bytes` as they are.
    pub async fn write(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.expect("writes");
    }

    /// Sends `line` with its line end; the reply.
    pub async fn send(&mut self, line: &str) -> SmtpReply {
        self.write(format!("{line}\r\n").as_bytes()).await;
        self.reply().await
    }

    /// Sends `line`; fails the test unless the reply's code is `code`. The reply.
    pub async fn expect(&mut self, line: &str, code: u16) -> SmtpReply {
        let reply = self.send(line).await;
        assert_eq!(reply.0, code, "{line}: {reply:?}");
        reply
    }

    /// The next reply (fails the test when the server closes first or takes over 30 s).
    pub async fn reply(&mut self) -> SmtpReply {
        let mut text = Vec::new();
        loop {
            let mut line = String::new();
            let read =
                tokio::time::timeout(Duration::from_secs(30), self.reader.read_line(&mut line))
                    .await
                    .expect("a reply within 30 s")
                    .expect("reads");
            assert!(
                read > 0,
                "the server closed the connection instead of replying"
            );
            let line = line.trim_end();
            let code: u16 = line
                .get(..3)
                .and_then(|c| c.parse().ok())
                .unwrap_or_else(|| panic!("not a reply line: {line:?}"));
            text.push(line.get(4..).unwrap_or_default().to_owned());
            if line.as_bytes().get(3) != Some(&b'-') {
                return (code, text.join("\n"));
            }
        }
    }

    /// `EHLO` and `AUTH PLAIN` as `username` with `key`; fails the test unless accepted.
    pub async fn login(&mut self, username: &str, key: &str) {
        let ehlo = self.send("EHLO client.test").await;
        assert_eq!(ehlo.0, 250, "{ehlo:?}");
        let reply = self
            .send(&format!("AUTH PLAIN {}", plain(username, key)))
            .await;
        assert_eq!(reply.0, 235, "{reply:?}");
    }

    /// Whether the server ended the connection, closing or resetting it (within 10 s).
    pub async fn ended(&mut self) -> bool {
        let mut rest = Vec::new();
        let read = self.reader.read_to_end(&mut rest);
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .is_ok()
    }

    /// Whether the server closed the connection (within 10 s).
    pub async fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        matches!(
            tokio::time::timeout(Duration::from_secs(10), self.reader.read_to_end(&mut rest)).await,
            Ok(Ok(_))
        )
    }
}

/// `AUTH PLAIN`'s response for `username` and `key`.
pub fn plain(username: &str, key: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("\0{username}\0{key}"))
}
