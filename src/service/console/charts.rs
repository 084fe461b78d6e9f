//! Small inline SVG bar charts for the operator view: no script, no style attribute (the
//! Content-Security-Policy allows neither), colours from presentation attributes.
//!
//! Invariants this module keeps:
//! - A chart is an `svg` with `role="img"`, an `aria-label` saying what it shows, and a `title`
//!   per bar with its minute's value, so its figures are readable without seeing it.
//! - Bars scale to the largest value shown; a chart of zeros draws no bar and says so.

use maud::{html, Markup};

/// Drawing width, in SVG units.
const WIDTH: f64 = 600.0;

/// Drawing height, in SVG units.
const HEIGHT: f64 = 120.0;

/// A bar chart of `values`, one bar per minute (oldest first), labelled `label`, each bar's value
/// shown with `unit`.
pub(crate) fn bars(label: &str, values: &[f64], unit: &str) -> Markup {
    let top = values.iter().copied().fold(0.0_f64, f64::max);
    let step = WIDTH / values.len().max(1) as f64;
    html! {
        figure {
            svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label=(label)
                viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } width=(WIDTH) height=(HEIGHT) {
                rect x="0" y="0" width=(WIDTH) height=(HEIGHT) fill="#f3f5f7" {}
                @for (i, value) in values.iter().enumerate() {
                    @if *value > 0.0 {
                        @let height = (value / top * (HEIGHT - 4.0)).max(1.0);
                        rect x=(format!("{:.1}", i as f64 * step + 1.0)) y=(format!("{:.1}", HEIGHT - height))
                             width=(format!("{:.1}", (step - 2.0).max(1.0))) height=(format!("{:.1}", height))
                             fill="#0a4fa8" {
                            title { (minutes_ago(values.len(), i)) ": " (format!("{value:.1}")) " " (unit) }
                        }
                    }
                }
            }
            figcaption {
                (label) ": "
                @if top > 0.0 { "highest " (format!("{top:.1}")) " " (unit) } @else { "nothing in this hour" }
            }
        }
    }
}

/// How long ago bar `i` of `n` (the last is this minute) was, in words.
fn minutes_ago(n: usize, i: usize) -> String {
    match n.saturating_sub(i + 1) {
        0 => "this minute".to_owned(),
        1 => "1 minute ago".to_owned(),
        m => format!("{m} minutes ago"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bars_scale_to_the_largest_value_and_say_what_they_show() {
        let svg = super::bars("Jobs per minute", &[0.0, 5.0, 10.0], "jobs").into_string();
        assert!(svg.contains("role=\"img\" aria-label=\"Jobs per minute\""));
        assert_eq!(
            svg.matches("fill=\"#0a4fa8\"").count(),
            2,
            "no bar for zero"
        );
        assert!(
            svg.contains("height=\"116.0\""),
            "the largest fills the chart"
        );
        assert!(svg.contains("<title>this minute: 10.0 jobs</title>"));
        assert!(svg.contains("<title>1 minute ago: 5.0 jobs</title>"));
        assert!(svg.contains("highest 10.0 jobs"));
        let empty = super::bars("Recoveries", &[0.0; 3], "jobs").into_string();
        assert!(empty.contains("nothing in this hour"));
        assert_eq!(super::minutes_ago(5, 0), "4 minutes ago");
    }
}
