//! What the CLI prints: plain tables, answers on stdout (a closed pipe is not an error), and
//! the one `error: ...` line on stderr.

use std::io::{self, Write};

/// Writes `text` to stdout, ending it with a newline, its control characters made
/// [`printable`]; a reader that went away (`| head`) is not an error.
pub fn print(text: &str) -> anyhow::Result<()> {
    let text = printable(text);
    let mut out = io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| {
            if text.ends_with('\n') {
                Ok(())
            } else {
                out.write_all(b"\n")
            }
        })
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Writes `text` to stderr as a line (a message for the person, not the answer), its control
/// characters made [`printable`].
pub fn note(text: &str) {
    // Nothing better to do when stderr itself is gone.
    let _ = writeln!(io::stderr().lock(), "{}", printable(text));
}

/// `text` with each control character but a newline or a tab shown as U+FFFD: what a server
/// sent (an email, a key's name, an error) cannot move the cursor, retitle the terminal or
/// write to the clipboard with escape sequences.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c,
            c if c.is_control() => '\u{fffd}',
            c => c,
        })
        .collect()
}

/// The line an error is reported with: `error: ` and its causes, on one line.
pub fn error_line(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    format!("error: {}", one_line(&text))
}

/// `text` with each control character (a newline, a tab) as a space.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `text` cut to `max` characters, an ellipsis marking the cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// A table: a header row, then one row per entry, columns padded to their widest cell and
/// two spaces apart; no trailing spaces.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let cells: Vec<Vec<String>> = std::iter::once(headers.iter().map(|h| h.to_string()).collect())
        .chain(
            rows.iter()
                .map(|row| row.iter().map(|c| one_line(c)).collect()),
        )
        .collect();
    let mut widths = vec![0; headers.len()];
    for row in &cells {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            let pad = width - cell.chars().count();
            line.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `n credit(s)`.
pub fn credits(n: i64) -> String {
    if n == 1 {
        "1 credit".to_owned()
    } else {
        format!("{n} credits")
    }
}

/// An optional value as a table cell: `-` when absent or empty.
pub fn or_dash(value: Option<&str>) -> String {
    match value {
        Some(v) if !v.is_empty() => v.to_owned(),
        _ => "-".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ApiError;
    use reqwest::StatusCode;

    #[test]
    fn escape_sequences_from_a_server_are_shown_not_obeyed() {
        // OSC 52 (write the clipboard), a CSI cursor move, a C1 CSI and DEL.
        let hostile = "ann\x1b]52;c;cm0gLXJmIC8=\x07@example.com\x1b[2J\u{9b}31m\x7f\r";
        let shown = printable(&format!("{hostile}\n\tkey"));
        assert_eq!(
            shown,
            "ann\u{fffd}]52;c;cm0gLXJmIC8=\u{fffd}@example.com\u{fffd}[2J\u{fffd}31m\u{fffd}\u{fffd}\n\tkey"
        );
        assert!(!one_line(hostile).chars().any(char::is_control));
    }

    #[test]
    fn tables_align_columns_without_trailing_spaces() {
        let rows = vec![
            vec!["a".to_owned(), "long value".to_owned(), "x".to_owned()],
            vec!["bbb".to_owned(), "v\nw".to_owned(), String::new()],
        ];
        assert_eq!(
            table(&["K", "VALUE", "LAST"], &rows),
            "K    VALUE       LAST\na    long value  x\nbbb  v w\n"
        );
    }

    #[test]
    fn errors_are_one_line_prefixed_with_error() {
        let err = anyhow::Error::new(ApiError::Status {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "boom\nsecond line".into(),
        });
        assert_eq!(
            error_line(&err),
            "error: 500 Internal Server Error: boom second line"
        );
        let refused = anyhow::Error::new(ApiError::KeyRefused {
            message: "invalid API key".into(),
        });
        assert_eq!(
            error_line(&refused),
            "error: the API key was refused (401): invalid API key; run postmesh login"
        );
        let unreachable = anyhow::Error::new(ApiError::Unreachable {
            url: "http://127.0.0.1:8080".into(),
            reason: "Connection refused (os error 111)".into(),
        });
        assert_eq!(
            error_line(&unreachable),
            "error: cannot reach the Postmesh API at http://127.0.0.1:8080: Connection refused (os error 111)"
        );
        let with_context = anyhow::anyhow!("disk full").context("cannot write /x/credentials.json");
        assert_eq!(
            error_line(&with_context),
            "error: cannot write /x/credentials.json: disk full"
        );
    }

    #[test]
    fn clipping_marks_the_cut() {
        assert_eq!(clip("hello", 5), "hello");
        assert_eq!(clip("hello world", 5), "hell…");
    }
}
