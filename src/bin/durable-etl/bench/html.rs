//! `bench --report DIR`: one self-contained HTML page (`DIR/index.html`) that a performance
//! engineer can open and share, with the run's settings, its figures and three SVG plots: the
//! latency distribution, jobs/s over time per replica, and the backlog over time.
//!
//! Invariants this module keeps:
//! - The page is self-contained: inline CSS and inline SVG, no script, no external reference.
//! - The page is well-formed XML (every element closed, every attribute quoted, text escaped),
//!   so any XML parser reads it; a test checks it.
//! - A run that missed its asked rate, or did not hold its depth, says so in a warning above its
//!   figures; the sweep's page (`sweep`) says so for each rate that missed.
//! - Plots are drawn from what the run measured, never interpolated: an empty series draws an
//!   empty plot with its axes, not a made-up line.

use super::report::{Report, Timeline};
use std::fmt::Write as _;
use std::path::Path;

/// Width of a plot's drawing area, in SVG units.
pub(super) const WIDTH: f64 = 640.0;
/// Height of a plot's drawing area.
pub(super) const HEIGHT: f64 = 200.0;
/// Margin around the drawing area, for the axis labels.
pub(super) const MARGIN: f64 = 48.0;
/// Bars of the latency histogram.
const LATENCY_BINS: usize = 40;
/// Points of the time plots.
const TIME_BINS: usize = 60;
/// Line colours for replicas (and a sweep's series), in turn.
pub(super) const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
];

/// Writes the report page of `report` to `dir/index.html`, creating `dir` if needed.
///
/// # Errors
/// The I/O error of creating the directory or writing the file.
pub(crate) fn write(dir: &Path, report: &Report) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("index.html"), render(report))
}

/// The start of a page, up to its open `body`: the document type, the title and the style.
pub(super) fn head() -> String {
    String::from(
        "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\">\n<head>\n\
         <meta charset=\"utf-8\"/>\n<title>durable-etl bench</title>\n<style>\n\
         body { font-family: sans-serif; margin: 2em; color: #111; }\n\
         table { border-collapse: collapse; }\n\
         td, th { border: 1px solid #999; padding: 0.2em 0.6em; text-align: right; }\n\
         th { text-align: left; }\n\
         svg { display: block; margin: 0.5em 0 1.5em; }\n\
         .warning { background: #fde0dc; border: 2px solid #d62728; padding: 0.6em; }\n\
         .missed { color: #d62728; font-weight: bold; }\n\
         </style>\n</head>\n<body>\n",
    )
}

/// The loud paragraph of `warning`.
pub(super) fn warning(warning: &str) -> String {
    format!(
        "<p class=\"warning\"><strong>{}</strong></p>\n",
        escape(warning)
    )
}

/// The page of `report`.
pub(crate) fn render(report: &Report) -> String {
    let t = &report.timeline;
    let mut page = head();
    let _ = writeln!(
        page,
        "<h1>durable-etl bench: {}</h1>",
        escape(&report.config.describe())
    );
    if let Some(text) = report.warning() {
        page.push_str(&warning(&text));
    }
    // A schedules or dead-letters run has its own figures and no job to plot.
    let own = (report.schedules.as_ref().map(|s| s.to_text()))
        .or_else(|| report.dead_letters.as_ref().map(|d| d.to_text()));
    if let Some(text) = own {
        let _ = write!(
            page,
            "<table>\n{}</table>\n</body>\n</html>\n",
            figure_rows(&text)
        );
        return page;
    }
    page.push_str(&figures(report));
    let _ = writeln!(
        page,
        "<h2>Latency distribution ({})</h2>",
        escape(t.latency_label)
    );
    page.push_str(&latency_plot(&t.latencies_ms));
    page.push_str("<h2>Jobs per second over time, per replica (handler starts)</h2>\n");
    page.push_str(&throughput_plot(t));
    page.push_str("<h2>Backlog over time (accepted, not yet finished)</h2>\n");
    page.push_str(&backlog_plot(t));
    page.push_str("</body>\n</html>\n");
    page
}

/// The table of the run's headline figures.
fn figures(report: &Report) -> String {
    let p = |p: &super::Percentiles| {
        format!(
            "{:.3} / {:.3} / {:.3} / {:.3} / {:.3}",
            p.p50, p.p95, p.p99, p.p999, p.max
        )
    };
    let rows = [
        ("succeeded", format!("{}", report.succeeded)),
        ("not succeeded", format!("{}", report.not_succeeded)),
        ("jobs/s", format!("{:.0}", report.jobs_per_s)),
        ("elapsed (s)", format!("{:.3}", report.elapsed_s)),
        (
            "enqueue->start p50 / p95 / p99 / p99.9 / max (ms)",
            p(&report.enqueue_to_start_ms),
        ),
        (
            "replica CPU per job (us)",
            format!("{:.1}", report.replica_cpu_us_per_job),
        ),
        (
            "server CPU per job (us): replicas + producers + aux",
            format!("{:.1}", report.server_cpu.server_cpu_us_per_job),
        ),
        (
            "server CPU per job (us): replicas / producers / aux / other databases (not counted)",
            format!(
                "{:.1} / {:.1} / {:.1} / {:.1}",
                report.server_cpu.server_cpu_replicas_us_per_job,
                report.server_cpu.server_cpu_producers_us_per_job,
                report.server_cpu.server_cpu_aux_us_per_job,
                report.server_cpu.server_cpu_other_us_per_job
            ),
        ),
        (
            "WAL per job (bytes)",
            format!("{:.0}", report.wal_bytes_per_job),
        ),
        (
            "round trips per job (producers' excluded)",
            format!("{:.3}", report.round_trips_per_job),
        ),
        (
            "claims / empty claims / commits per job",
            format!(
                "{:.3} / {:.3} / {:.3}",
                report.claims_per_job, report.empty_claims_per_job, report.commits_per_job
            ),
        ),
    ];
    let mut out = String::from("<table>\n");
    for (name, value) in rows {
        let _ = writeln!(
            out,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(name),
            escape(&value)
        );
    }
    if let Some(o) = &report.offered {
        let _ = writeln!(
            out,
            "<tr><th>offered of asked (jobs/s)</th><td>{:.0} of {:.0}</td></tr>\n\
             <tr><th>enqueue lag p50 / p99 / max (ms)</th><td>{:.3} / {:.3} / {:.3}</td></tr>",
            o.achieved_rate, o.asked_rate, o.lag_ms.p50, o.lag_ms.p99, o.lag_ms.max
        );
    }
    if let Some(d) = &report.depth {
        let h = &d.depth_held;
        let _ = writeln!(
            out,
            "<tr><th>depth held min / median / max of asked</th>\
             <td>{} / {} / {} of {}</td></tr>\n\
             <tr><th>window throughput (jobs/s)</th><td>{:.0}</td></tr>",
            h.min, h.median, h.max, d.depth, d.window_jobs_per_s
        );
    }
    if let Some(ack) = &report.ack_to_start_ms {
        let _ = writeln!(
            out,
            "<tr><th>ack-&gt;start p50 / p95 / p99 / p99.9 / max (ms)</th><td>{}</td></tr>",
            p(ack)
        );
    }
    out.push_str("</table>\n");
    out
}

/// The histogram of `latencies` (ms), from 0 to their 99th percentile (slower ones in the last
/// bar).
fn latency_plot(latencies: &[f64]) -> String {
    let mut sorted = latencies.to_vec();
    sorted.sort_by(f64::total_cmp);
    let top = sorted
        .get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(1.0)
        .max(f64::EPSILON);
    let mut counts = vec![0usize; LATENCY_BINS];
    for &v in &sorted {
        let bin = ((v / top) * LATENCY_BINS as f64) as usize;
        counts[bin.min(LATENCY_BINS - 1)] += 1;
    }
    let most = counts.iter().copied().max().unwrap_or(0).max(1) as f64;
    let bar = WIDTH / LATENCY_BINS as f64;
    let mut body = String::new();
    for (i, &n) in counts.iter().enumerate() {
        let h = HEIGHT * n as f64 / most;
        let _ = writeln!(
            body,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"#1f77b4\"/>",
            MARGIN + i as f64 * bar,
            MARGIN + HEIGHT - h,
            bar - 1.0
        );
    }
    plot(
        &body,
        ("0 ms", &format!("{top:.2} ms (p99)")),
        &format!("{} jobs per bar at most", most as usize),
    )
}

/// Jobs/s over time of each replica, from its handler starts, in [`TIME_BINS`] bins over the run.
fn throughput_plot(t: &Timeline) -> String {
    let all: Vec<f64> = t.starts_by_replica.iter().flatten().copied().collect();
    let Some((from, to)) = span(&all) else {
        return plot("", ("", ""), "no handler starts were recorded");
    };
    let width_s = ((to - from) / TIME_BINS as f64).max(1e-3);
    let series: Vec<Vec<f64>> = t
        .starts_by_replica
        .iter()
        .map(|starts| {
            binned(starts, from, width_s)
                .into_iter()
                .map(|n| n as f64 / width_s)
                .collect()
        })
        .collect();
    let top = series.iter().flatten().copied().fold(1.0, f64::max);
    let mut body = String::new();
    for (i, rates) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            body,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            points(rates, top)
        );
        // The legend: one label per replica, in its line's colour, right to left above the
        // caption.
        let _ = writeln!(
            body,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"{colour}\" \
             text-anchor=\"end\">replica {i}</text>",
            MARGIN + WIDTH - 80.0 * i as f64,
            MARGIN - 28.0
        );
    }
    plot(
        &body,
        ("0 s", &format!("{:.2} s", to - from)),
        &format!("{top:.0} jobs/s at most; one line per replica"),
    )
}

/// The number of jobs accepted and not yet finished, sampled at [`TIME_BINS`] points from the
/// first acceptance to the last finish.
fn backlog_plot(t: &Timeline) -> String {
    let ends: Vec<f64> = t.created.iter().chain(&t.finished).copied().collect();
    let Some((from, to)) = span(&ends) else {
        return plot("", ("", ""), "no jobs");
    };
    let (mut created, mut finished) = (t.created.clone(), t.finished.clone());
    created.sort_by(f64::total_cmp);
    finished.sort_by(f64::total_cmp);
    let backlog: Vec<f64> = (0..=TIME_BINS)
        .map(|i| {
            let at = from + (to - from) * i as f64 / TIME_BINS as f64;
            let accepted = created.partition_point(|&c| c <= at);
            let done = finished.partition_point(|&f| f <= at);
            accepted.saturating_sub(done) as f64
        })
        .collect();
    let top = backlog.iter().copied().fold(1.0, f64::max);
    let body = format!(
        "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\"{}\"/>\n",
        points(&backlog, top)
    );
    plot(
        &body,
        ("0 s", &format!("{:.2} s", to - from)),
        &format!("{top:.0} jobs at most"),
    )
}

/// The first and last of `values`, if any.
fn span(values: &[f64]) -> Option<(f64, f64)> {
    let from = values.iter().copied().reduce(f64::min)?;
    let to = values.iter().copied().reduce(f64::max)?;
    Some((from, to))
}

/// How many of `times` fall in each of [`TIME_BINS`] bins of `width_s` from `from` (the last
/// bin also takes the end of the run).
fn binned(times: &[f64], from: f64, width_s: f64) -> Vec<usize> {
    let mut counts = vec![0usize; TIME_BINS];
    for &at in times {
        let bin = ((at - from) / width_s) as usize;
        counts[bin.min(TIME_BINS - 1)] += 1;
    }
    counts
}

/// Where `values` go: spread evenly over the width, scaled so that `top` is the full height.
pub(super) fn coords(values: &[f64], top: f64) -> Vec<(f64, f64)> {
    let step = WIDTH / (values.len().max(2) - 1) as f64;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| (MARGIN + i as f64 * step, MARGIN + HEIGHT - HEIGHT * v / top))
        .collect()
}

/// The SVG points of `values` spread over the width, scaled so that `top` is the full height.
fn points(values: &[f64], top: f64) -> String {
    coords(values, top)
        .iter()
        .map(|(x, y)| format!("{x:.1},{y:.1}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An SVG plot around `body`, with axes, the x axis's two end labels and a caption.
pub(super) fn plot(body: &str, (x_from, x_to): (&str, &str), caption: &str) -> String {
    let (w, h) = (WIDTH + 2.0 * MARGIN, HEIGHT + 2.0 * MARGIN);
    let (left, bottom, right) = (MARGIN, MARGIN + HEIGHT, MARGIN + WIDTH);
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\">\n\
         <title>{caption}</title>\n{body}\
         <line x1=\"{left}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\" stroke=\"#111\"/>\n\
         <line x1=\"{left}\" y1=\"{MARGIN}\" x2=\"{left}\" y2=\"{bottom}\" stroke=\"#111\"/>\n\
         <text x=\"{left}\" y=\"{}\" font-size=\"12\">{}</text>\n\
         <text x=\"{right}\" y=\"{}\" font-size=\"12\" text-anchor=\"end\">{}</text>\n\
         <text x=\"{left}\" y=\"{}\" font-size=\"12\">{}</text>\n\
         </svg>\n",
        bottom + 16.0,
        escape(x_from),
        bottom + 16.0,
        escape(x_to),
        MARGIN - 12.0,
        escape(caption),
        caption = escape(caption),
    )
}

/// `text` with the five XML special characters escaped.
pub(super) fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

/// A schedules or dead-letters run's figures (`text`, aligned lines: a 21-character name, then
/// the value) as the rows of an HTML table.
fn figure_rows(text: &str) -> String {
    text.lines()
        .filter_map(|line| {
            let (name, value) = line.split_at_checked(21)?;
            Some(format!(
                "<tr><th>{}</th><td>{}</td></tr>\n",
                escape(name.trim()),
                escape(value.trim())
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_and_bins_hold_every_value() {
        assert_eq!(escape("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&apos;");
        let counts = binned(&[0.0, 0.5, 59.9, 61.0], 0.0, 1.0);
        assert_eq!(counts.iter().sum::<usize>(), 4);
        assert_eq!((counts[0], counts[TIME_BINS - 1]), (2, 2));
        assert_eq!(span(&[]), None);
        assert_eq!(span(&[3.0, 1.0, 2.0]), Some((1.0, 3.0)));
    }

    #[test]
    fn empty_series_draw_their_axes_and_say_so() {
        let t = Timeline::default();
        assert!(throughput_plot(&t).contains("no handler starts were recorded"));
        assert!(backlog_plot(&t).contains("no jobs"));
        assert!(latency_plot(&[]).contains("<svg"));
    }
}
