//! A local SMTP relay for tests: speaks enough RFC 5321 for lettre (EHLO, MAIL, RCPT, DATA,
//! RSET, NOOP, QUIT), records every accepted message, and can be told to stall before
//! accepting a message (dropping it if the client hangs up meanwhile), to refuse recipients
//! with a given reply code, or to never answer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// How the relay behaves.
#[derive(Clone, Copy, Debug)]
pub enum Behaviour {
    /// Answers promptly, after `accept_delay` before the final reply to DATA.
    Accept { accept_delay: Duration },
    /// Accepts the TCP connection and never says a word (a hung relay).
    Silent,
    /// Refuses every recipient with this reply code (4xx: try later, 5xx: never).
    Refuse { code: u16 },
}

/// One message the relay accepted.
#[derive(Clone, Debug)]
pub struct Received {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

/// A running fake relay.
pub struct FakeSmtp {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    refused: Arc<Mutex<usize>>,
}

impl FakeSmtp {
    /// Starts the relay on a free local port.
    pub async fn start(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(Mutex::new(0));
        let (store, refusals) = (received.clone(), refused.clone());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (store, refusals) = (store.clone(), refusals.clone());
                tokio::spawn(async move {
                    match behaviour {
                        Behaviour::Silent => {
                            // Hold the connection open without answering.
                            let _keep = socket;
                            std::future::pending::<()>().await;
                        }
                        Behaviour::Accept { accept_delay } => {
                            let _ = session(socket, accept_delay, None, store).await;
                        }
                        Behaviour::Refuse { code } => {
                            let refuse = Some((code, refusals));
                            let _ = session(socket, Duration::ZERO, refuse, store).await;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            received,
            refused,
        }
    }

    /// `smtp://` URL for lettre (plain, no TLS).
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    /// Messages accepted so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().expect("lock").clone()
    }

    /// How many messages were accepted so far (without copying them, for polling).
    pub fn received_count(&self) -> usize {
        self.received.lock().expect("lock").len()
    }

    /// Recipients refused so far.
    pub fn refused(&self) -> usize {
        *self.refused.lock().expect("lock")
    }
}

/// Refusals: the reply code for every RCPT, and the count of refusals made.
type Refusal = (u16, Arc<Mutex<usize>>);

async fn session(
    socket: TcpStream, accept_delay: Duration, refuse: Option<Refusal>,
    store: Arc<Mutex<Vec<Received>>>,
) -> std::io::Result<()> {
    let (read, mut write) = socket.into_split();
    let mut lines = BufReader::new(read);
    write.write_all(b"220 fake.smtp ESMTP ready\r\n").await?;
    let (mut from, mut to) = (String::new(), Vec::new());
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let upper = line.trim_end().to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("EHLO") {
            b"250-fake.smtp\r\n250 8BITMIME\r\n"
        } else if upper.starts_with("HELO") {
            b"250 fake.smtp\r\n"
        } else if upper.starts_with("MAIL FROM:") {
            from = line.trim_end()[10..].trim().to_owned();
            b"250 ok\r\n"
        } else if let (true, Some((code, count))) = (upper.starts_with("RCPT TO:"), &refuse) {
            *count.lock().expect("lock") += 1;
            let reply = format!("{code} recipient refused\r\n");
            write.write_all(reply.as_bytes()).await?;
            continue;
        } else if upper.starts_with("RCPT TO:") {
            to.push(line.trim_end()[8..].trim().to_owned());
            b"250 ok\r\n"
        } else if upper == "DATA" {
            write.write_all(b"354 go ahead\r\n").await?;
            let mut data = String::new();
            loop {
                line.clear();
                if lines.read_line(&mut line).await? == 0 {
                    return Ok(());
                }
                if line == ".\r\n" || line == ".\n" {
                    break;
                }
                data.push_str(&line);
            }
            // A client that hangs up before the final reply never learnt the message was
            // taken, so, as real servers do, it is not kept (RFC 1047).
            let mut probe = String::new();
            tokio::select! {
                _ = tokio::time::sleep(accept_delay) => {}
                read = lines.read_line(&mut probe) => {
                    if matches!(read, Ok(0) | Err(_)) {
                        return Ok(());
                    }
                }
            }
            store.lock().expect("lock").push(Received {
                from: std::mem::take(&mut from),
                to: std::mem::take(&mut to),
                data,
            });
            b"250 queued\r\n"
        } else if upper == "RSET" {
            from.clear();
            to.clear();
            b"250 ok\r\n"
        } else if upper == "NOOP" {
            b"250 ok\r\n"
        } else if upper == "QUIT" {
            write.write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else {
            b"502 not implemented\r\n"
        };
        write.write_all(reply).await?;
    }
}
