//! Small inline SVG charts for the operator view: bars of one series, and per-minute time series
//! (counts, or levels with minutes of no data) as lines on labelled axes. No script, no style
//! attribute (the Content-Security-Policy allows neither), colours from presentation attributes.
//!
//! Invariants this module keeps:
//! - A chart is an `svg` with `role="img"`, an `aria-label` saying what it shows, and its figures
//!   in text: a `title` per bar with its minute's value, or a legend with each line's total and
//!   highest minute (a level's: its newest known value and highest), so they are readable
//!   without seeing it.
//! - A level's minute of no data is a gap in its line, never a zero.
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

/// What a time series' legend says of each line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Legend {
    /// Counts per minute: the hour's total and the highest minute.
    Totals,
    /// Levels (a percentile, a backlog): the newest known value and the highest.
    Levels,
}

/// A time series chart of `series` (each a name and one value per minute, oldest first, the
/// last this minute), labelled `label`, its values in `unit`: one line per series on axes
/// labelled in minutes before now and in `unit`, with a legend of each series' total and
/// highest minute.
pub(crate) fn lines(label: &str, series: &[(String, Vec<f64>)], unit: &str) -> Markup {
    let known: Vec<(String, Vec<Option<f64>>)> = series
        .iter()
        .map(|(name, values)| (name.clone(), values.iter().copied().map(Some).collect()))
        .collect();
    plot(label, &known, unit, Legend::Totals)
}

/// A time series chart of levels, as [`lines`] draws counts, but with minutes of unknown value
/// (`None`: no data) left out of the lines, and a legend of each series' newest known value and
/// highest one.
pub(crate) fn levels(label: &str, series: &[(String, Vec<Option<f64>>)], unit: &str) -> Markup {
    plot(label, series, unit, Legend::Levels)
}

/// A value for a label: whole above 10 or when whole, else to a tenth.
fn figure(value: f64) -> String {
    if value >= 10.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

/// The runs of known values of `values`, each as its points' indices and values.
fn runs(values: &[Option<f64>]) -> Vec<Vec<(usize, f64)>> {
    let mut runs: Vec<Vec<(usize, f64)>> = Vec::new();
    let mut current = Vec::new();
    for (i, value) in values.iter().enumerate() {
        match value {
            Some(v) => current.push((i, *v)),
            None if !current.is_empty() => runs.push(std::mem::take(&mut current)),
            None => {}
        }
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

/// What the legend says of one series, `values` in `unit`.
fn legend(kind: Legend, values: &[Option<f64>], unit: &str) -> String {
    let known: Vec<f64> = values.iter().flatten().copied().collect();
    let top = figure(known.iter().copied().fold(0.0_f64, f64::max));
    match (kind, known.last()) {
        (Legend::Totals, _) => {
            let total = figure(known.iter().sum::<f64>());
            format!("{total} in the hour, at most {top} {unit} a minute")
        }
        (Legend::Levels, Some(last)) => {
            format!("last {} {unit}, highest {top} {unit}", figure(*last))
        }
        (Legend::Levels, None) => "no data".to_owned(),
    }
}

/// Draws `series` as [`lines`] and [`levels`] do, with the legend `kind`.
fn plot(label: &str, series: &[(String, Vec<Option<f64>>)], unit: &str, kind: Legend) -> Markup {
    let top = series
        .iter()
        .flat_map(|(_, values)| values.iter().flatten().copied())
        .fold(0.0_f64, f64::max);
    let known = series.iter().any(|(_, v)| v.iter().any(Option::is_some));
    let n = series.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let (left, bottom) = MARGIN;
    let (plot_w, plot_h) = (WIDTH - left - 8.0, HEIGHT - bottom - 8.0);
    let x = |i: usize| left + plot_w * i as f64 / (n.max(2) - 1) as f64;
    let y = |v: f64| 8.0 + plot_h - if top > 0.0 { v / top * plot_h } else { 0.0 };
    let points = |run: &[(usize, f64)]| {
        run.iter()
            .map(|(i, v)| format!("{:.1},{:.1}", x(*i), y(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let drawn = match kind {
        Legend::Totals => top > 0.0,
        Legend::Levels => known,
    };
    let axis = "#4a5360";
    html! {
        figure {
            svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label=(label)
                viewBox={ "0 0 " (WIDTH) " " (HEIGHT) } width=(WIDTH) height=(HEIGHT) {
                line x1=(left) y1="8" x2=(left) y2=(8.0 + plot_h) stroke=(axis) {}
                line x1=(left) y1=(8.0 + plot_h) x2=(left + plot_w) y2=(8.0 + plot_h) stroke=(axis) {}
                text x=(left - 4.0) y="16" text-anchor="end" font-size="11" fill=(axis) { (figure(top)) }
                text x=(left - 4.0) y=(8.0 + plot_h) text-anchor="end" font-size="11" fill=(axis) { "0 " (unit) }
                text x=(left) y=(HEIGHT - 6.0) font-size="11" fill=(axis) { (minutes_ago(n, 0)) }
                text x=(left + plot_w / 2.0) y=(HEIGHT - 6.0) text-anchor="middle" font-size="11" fill=(axis) { (minutes_ago(n, n / 2)) }
                text x=(left + plot_w) y=(HEIGHT - 6.0) text-anchor="end" font-size="11" fill=(axis) { "now" }
                @if drawn {
                    @for (i, (_, values)) in series.iter().enumerate() {
                        @for run in runs(values) {
                            @if let [(at, value)] = run.as_slice() {
                                circle cx=(format!("{:.1}", x(*at))) cy=(format!("{:.1}", y(*value))) r="2"
                                       fill=(COLOURS[i % COLOURS.len()]) {}
                            } @else {
                                polyline points=(points(&run)) fill="none" stroke-width="2"
                                         stroke=(COLOURS[i % COLOURS.len()]) {}
                            }
                        }
                    }
                }
            }
            figcaption {
                (label) ": "
                @if drawn {
                    @for (i, (name, values)) in series.iter().enumerate() {
                        span class={ "series series-" (i % COLOURS.len()) } {
                            (name) " " (legend(kind, values, unit))
                        }
                        @if i + 1 < series.len() { "; " }
                    }
                } @else if known {
                    "nothing in this hour"
                } @else {
                    "no data in this hour"
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
    fn levels_leave_minutes_of_no_data_out_and_say_their_newest_value() {
        let series = [
            (
                "p50".to_owned(),
                vec![Some(1.0), Some(2.5), None, Some(0.5), None],
            ),
            ("p99".to_owned(), vec![None, None, None, Some(25.0), None]),
            ("p100".to_owned(), vec![None; 5]),
        ];
        let svg = super::levels("Pickup latency", &series, "ms").into_string();
        assert_eq!(svg.matches("<polyline").count(), 1, "the run of two");
        assert_eq!(svg.matches("<circle").count(), 2, "the single minutes");
        assert!(svg.contains("p50 last 0.5 ms, highest 2.5 ms"), "{svg}");
        assert!(svg.contains("p99 last 25 ms, highest 25 ms"));
        assert!(svg.contains("p100 no data"));
        assert!(svg.contains(">25</text>") && svg.contains(">0 ms</text>"));
        let none = super::levels("Backlog", &[("due".to_owned(), vec![None; 3])], "jobs");
        let none = none.into_string();
        assert!(none.contains("no data in this hour") && !none.contains("<polyline"));
        let idle = super::levels("Backlog", &[("due".to_owned(), vec![Some(0.0); 3])], "jobs");
        assert!(idle
            .into_string()
            .contains("due last 0 jobs, highest 0 jobs"));
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
