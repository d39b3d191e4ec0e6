//! Stage 2, build: the MIME message of a job — plain text, HTML, or both as alternatives.

use lettre::message::{Mailbox, MultiPart, SinglePart};
use lettre::Message;

use super::Job;

/// The job's message; the error says why it can never be built.
pub(super) fn build(job: &Job) -> Result<Message, String> {
    let send = &job.send;
    let from: Mailbox = if send.from_name.is_empty() {
        send.from_email.parse()
    } else {
        format!("{} <{}>", send.from_name, send.from_email).parse()
    }
    .map_err(|e| format!("invalid from address: {e}"))?;
    let mut builder = Message::builder()
        .message_id(Some(format!("<{}@postmesh>", job.id)))
        .from(from)
        .subject(send.subject.as_str());
    if send.to.is_empty() {
        return Err("no recipients".into());
    }
    for to in &send.to {
        builder = builder.to(to
            .parse()
            .map_err(|e| format!("invalid recipient {to:?}: {e}"))?);
    }
    let built = match (send.text.is_empty(), send.html.is_empty()) {
        (_, true) => builder.singlepart(SinglePart::plain(send.text.clone())),
        (true, false) => builder.singlepart(SinglePart::html(send.html.clone())),
        (false, false) => builder.multipart(MultiPart::alternative_plain_html(
            send.text.clone(),
            send.html.clone(),
        )),
    };
    built.map_err(|e| format!("could not build the message: {e}"))
}
