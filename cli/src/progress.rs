//! Progress on stderr while the CLI waits: a spinner for a login, a bar for a send. Both are
//! drawn only when stderr is a terminal, so pipes and logs stay clean.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// How often a spinner turns.
const TICK: Duration = Duration::from_millis(120);

/// A hidden bar unless stderr is a terminal.
fn on_stderr(bar: ProgressBar) -> ProgressBar {
    if std::io::stderr().is_terminal() {
        bar
    } else {
        ProgressBar::hidden()
    }
}

/// A turning spinner showing `message`.
pub fn spinner(message: &str) -> ProgressBar {
    let bar = on_stderr(ProgressBar::new_spinner());
    bar.set_message(message.to_owned());
    bar.enable_steady_tick(TICK);
    bar
}

/// A bar of `total` steps showing `message`.
pub fn bar(total: u64, message: &str) -> ProgressBar {
    let bar = on_stderr(ProgressBar::new(total));
    // The template is a constant; if it ever failed to parse, the default style is fine.
    if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message.to_owned());
    bar
}
