//! The SMTP submission service's settings (its rows of `docs/configuration.md`).

use postmesh_shared::settings;

settings! {
    SMTP_LISTEN = "127.0.0.1:2587", "smtp-submission: the submission listener (STARTTLS; 587 on Kubernetes)";
    SMTP_TLS_LISTEN = "" shown "none", "smtp-submission: a listener with implicit TLS (465 on Kubernetes), when set";
    SMTP_TLS_CERT / SMTP_TLS_KEY = "" shown "none (`make run` makes a self-signed pair under `var/`)",
        "smtp-submission: the certificate chain and private key (PEM) of STARTTLS and the implicit-TLS listener; without them neither is offered";
    SMTP_ALLOW_PLAINTEXT_AUTH = "0", "smtp-submission: `1` lets clients sign in without TLS (tests, a private network); else `AUTH` before `STARTTLS` is answered 530";
    SMTP_MAX_MESSAGE_BYTES = "26214400", "smtp-submission: the largest message (advertised as `SIZE`; larger ones get 552 5.3.4), at most 29360128";
    SMTP_API_URL = "http://127.0.0.1:8080", "smtp-submission: the gateway's HTTP API, through which logins are checked and messages sent";
    SMTP_HOSTNAME = "localhost", "smtp-submission: the name the server greets with";
    SMTP_MAX_CONNECTIONS_PER_IP = "20", "smtp-submission: connections one client (an address; for IPv6, its /64) may hold at once (per replica); beyond, 421";
    SMTP_MAX_CONNECTIONS = "1000", "smtp-submission: connections open at once, all clients together (per replica); beyond, 421";
    SMTP_IDLE_TIMEOUT_SECS = "300", "smtp-submission: how long a command may take to arrive whole after the last reply, however its bytes trickle in (within a message: between reads), before 421 and close; and how long a reply may wait to be taken before the connection is closed";
    SMTP_MESSAGE_MEMORY_BYTES = "536870912" shown "`536870912` (512 MiB)", "smtp-submission: memory the messages being read and sent may hold at once, all connections together (per replica; a message's byte counts five times: its growing buffer, its base64, the request); a message that finds none left is read to its end and answered 452 4.3.1, to be sent again later";
    SMTP_MAX_COMMANDS = "10000", "smtp-submission: commands one connection may send; beyond, 421 and close";
    SMTP_AUTH_FAILURES = "10" | SMTP_AUTH_FAILURE_WINDOW_SECS = "600",
        "smtp-submission: failed logins from one client address, all replicas together, after which its connections get 421 until the window has passed";
}
