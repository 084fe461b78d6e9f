//! Small inline SVG charts for the operator view: bars of one series, and per-minute time series
//! as lines on labelled axes. No script, no style attribute (the Content-Security-Policy allows
//! neither), colours from presentation attributes.
//!
//! Invariants this module keeps:
//! - A chart is an `svg` with `role="img"`, an `aria-label` saying what it shows, and its figures
//!   in text: a `title` per bar with its minute's value, or a legend with each line's total and
//!   highest minute, so they are readable without seeing it.
//! - Bars and lines scale to the largest value shown; a chart of zeros draws nothing and says
//!   so. A time series' x axis is labelled in minutes before now, its y axis with 0 and its top.

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

/// The colours of a time series' lines, in order (each with a contrast of at least 3:1 on
/// white, as WCAG asks of graphics).
const COLOURS: [&str; 6] = [
    "#0a4fa8", "#a4161a", "#1a6b2f", "#8a4b00", "#5b2a86", "#00637a",
];

/// Room left of a time series' plot for its y labels, and below it for its x labels.
const MARGIN: (f64, f64) = (48.0, 22.0);

/// A time series chart of `series` (each a name and one value per minute, oldest first, the
/// last this minute), labelled `label`, its values in `unit`: one line per series on axes
/// labelled in minutes before now and in `unit`, with a legend of each series' total and
/// highest minute.
pub(crate) fn lines(label: &str, series: &[(String, Vec<f64>)], unit: &str) -> Markup {
    let top = series
        .iter()
        .flat_map(|(_, values)| values.iter().copied())
        .fold(0.0_f64, f64::max);
    let n = series.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let (left, bottom) = MARGIN;
    let (plot_w, plot_h) = (WIDTH - left - 8.0, HEIGHT - bottom - 8.0);
    let x = |i: usize| left + plot_w * i as f64 / (n.max(2) - 1) as f64;
    let y = |v: f64| 8.0 + plot_h - if top > 0.0 { v / top * plot_h } else { 0.0 };
    let points = |values: &[f64]| {
        values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let axis = "#4a5360";
    html! {
        figure {
            svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label=(label)
                viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } width=(WIDTH) height=(HEIGHT) {
                line x1=(left) y1="8" x2=(left) y2=(8.0 + plot_h) stroke=(axis) {}
                line x1=(left) y1=(8.0 + plot_h) x2=(left + plot_w) y2=(8.0 + plot_h) stroke=(axis) {}
                text x=(left - 4.0) y="16" text-anchor="end" font-size="11" fill=(axis) { (format!("{top:.0}")) }
                text x=(left - 4.0) y=(8.0 + plot_h) text-anchor="end" font-size="11" fill=(axis) { "0 " (unit) }
                text x=(left) y=(HEIGHT - 6.0) font-size="11" fill=(axis) { (minutes_ago(n, 0)) }
                text x=(left + plot_w / 2.0) y=(HEIGHT - 6.0) text-anchor="middle" font-size="11" fill=(axis) { (minutes_ago(n, n / 2)) }
                text x=(left + plot_w) y=(HEIGHT - 6.0) text-anchor="end" font-size="11" fill=(axis) { "now" }
                @if top > 0.0 {
                    @for (i, (_, values)) in series.iter().enumerate() {
                        polyline points=(points(values)) fill="none" stroke-width="2"
                                 stroke=(COLOURS[i % COLOURS.len()]) {}
                    }
                }
            }
            figcaption {
                (label) ": "
                @if top > 0.0 {
                    @for (i, (name, values)) in series.iter().enumerate() {
                        span class={ "series series-" (i % COLOURS.len()) } {
                            (name) " " (format!("{:.0}", values.iter().sum::<f64>())) " in the hour, at most "
                            (format!("{:.0}", values.iter().copied().fold(0.0_f64, f64::max))) " " (unit) " a minute"
                        }
                        @if i + 1 < series.len() { "; " }
                    }
                } @else {
                    "nothing in this hour"
                }
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
    fn lines_have_labelled_axes_one_line_per_series_and_a_legend() {
        let series = [
            ("finished".to_owned(), vec![0.0, 2.0, 4.0]),
            ("failed".to_owned(), vec![0.0, 1.0, 0.0]),
        ];
        let svg = super::lines("Jobs per minute", &series, "jobs").into_string();
        assert!(svg.contains("role=\"img\" aria-label=\"Jobs per minute\""));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains(">2 minutes ago</text>") && svg.contains(">now</text>"));
        assert!(svg.contains(">4</text>") && svg.contains(">0 jobs</text>"));
        assert!(svg.contains("finished 6 in the hour, at most 4 jobs a minute"));
        assert!(svg.contains("failed 1 in the hour, at most 1 jobs a minute"));
        let empty = super::lines("Failures", &[("x".to_owned(), vec![0.0; 3])], "jobs");
        let empty = empty.into_string();
        assert!(empty.contains("nothing in this hour") && !empty.contains("<polyline"));
    }

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
