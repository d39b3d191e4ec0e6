//! The usage page's chart of mail per day, drawn on the server as SVG (no script): one line
//! per series over the days `/email-stats` answers, each line carrying its numbers in
//! `data-values`, with a legend and the open and click rates.

use maud::{html, Markup};
use serde_json::Value;

/// The series drawn: the answer's field, its label and its colour.
const SERIES: [(&str, &str, &str); 6] = [
    ("sent", "Sent", "#1f77b4"),
    ("delivered", "Delivered", "#2ca02c"),
    ("bounced", "Bounced", "#d62728"),
    ("complained", "Complaints", "#9467bd"),
    ("opened", "Opens", "#ff7f0e"),
    ("clicked", "Clicks", "#8c564b"),
];
/// The drawing's width, height and margin in its own units.
const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 200.0;
const PAD: f64 = 20.0;

/// `rate` as a percentage, or a dash without one.
fn percent(rate: &Value) -> String {
    rate.as_f64()
        .map_or_else(|| "–".into(), |r| format!("{:.1}%", r * 100.0))
}

/// `v` as text: a string as it is, null as nothing, anything else as JSON.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The chart of `stats` (the answer of `/email-stats`).
pub fn mail(stats: &Value) -> Markup {
    let days = stats["days"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let value = |day: &Value, field: &str| day[field].as_i64().unwrap_or(0);
    let top = days
        .iter()
        .flat_map(|d| SERIES.iter().map(move |(f, _, _)| value(d, f)))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let step = (WIDTH - 2.0 * PAD) / (days.len().max(2) - 1) as f64;
    let point = |i: usize, n: i64| {
        let x = PAD + step * i as f64;
        let y = HEIGHT - PAD - (HEIGHT - 2.0 * PAD) * n as f64 / top;
        format!("{x:.1},{y:.1}")
    };
    let first = days.first().map(|d| text(&d["date"]));
    let last = days.last().map(|d| text(&d["date"]));
    html! {
        svg.chart #mail-chart xmlns="http://www.w3.org/2000/svg" role="img"
            viewBox=(format!("0 0 {WIDTH} {HEIGHT}"))
            aria-label="Mail per day: sent, delivered, bounced, complaints, opens and clicks" {
            line x1=(PAD) y1=(HEIGHT - PAD) x2=(WIDTH - PAD) y2=(HEIGHT - PAD) stroke="#999" {}
            text x=(PAD) y=(PAD - 6.0) font-size="10" { "max " (top) }
            @if let (Some(first), Some(last)) = (&first, &last) {
                text x=(PAD) y=(HEIGHT - 4.0) font-size="10" { (first) }
                text x=(WIDTH - PAD) y=(HEIGHT - 4.0) font-size="10" text-anchor="end" { (last) }
            }
            @for (field, label, colour) in SERIES {
                @let values: Vec<i64> = days.iter().map(|d| value(d, field)).collect();
                polyline fill="none" stroke=(colour) stroke-width="2"
                    data-series=(field)
                    data-values=(values.iter().map(i64::to_string).collect::<Vec<_>>().join(","))
                    points=(values.iter().enumerate().map(|(i, n)| point(i, *n)).collect::<Vec<_>>().join(" ")) {
                    title { (label) }
                }
            }
        }
        p.legend {
            @for (field, label, colour) in SERIES {
                @let total: i64 = days.iter().map(|d| value(d, field)).sum();
                span { span style=(format!("color:{colour}")) { "■ " } (label) ": " (total) }
            }
        }
        p {
            "Open rate " strong #open-rate { (percent(&stats["openRate"])) }
            ", click rate " strong #click-rate { (percent(&stats["clickRate"])) }
            " (people only; proxies and link scanners left out)"
        }
    }
}
