//! `bench offered-load --rate R,R… --report DIR`: besides each rate's own page
//! (`DIR/rate-R/index.html`, see `html`), one page across the sweep (`DIR/index.html`): a table
//! with a row per rate and five SVG plots against the asked rate (achieved rate; ack → handler
//! start p50/p99/p99.9; server and replica CPU per job; round trips, claims, empty claims and
//! commits per job; WAL per job), drawn with `html`'s helpers.
//!
//! Invariants this module keeps:
//! - The page is well-formed XML and self-contained but for its links to the rates' own pages,
//!   like every page of the report.
//! - Every rate is one point of each line, in the order of the sweep, at evenly spaced x
//!   positions labelled with the asked rate; a figure a run did not measure (no handler starts
//!   recorded) is left out of its line, never drawn as zero.
//! - A rate that missed (`rate_missed`) is loud: its warning above the table, its row marked
//!   MISSED, and a red dashed line labelled MISSED through it in every plot.

use super::html::{coords, escape, head, plot, warning, COLOURS, HEIGHT, MARGIN, WIDTH};
use super::Report;
use std::fmt::Write as _;
use std::path::Path;

/// The directory, under the report's, of the page of the run at `rate` of a sweep.
pub(crate) fn rate_dir(rate: f64) -> String {
    format!("rate-{rate}")
}

/// Writes the sweep's page of `reports` (one per rate, in order) to `dir/index.html`, creating
/// `dir` if needed.
///
/// # Errors
/// The I/O error of creating the directory or writing the file.
pub(crate) fn write(dir: &Path, reports: &[Report]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("index.html"), render(reports))
}

/// One line of a plot: its name and one value per rate (`None`: not measured).
struct Series {
    /// What it shows.
    name: &'static str,
    /// One value per rate.
    values: Vec<Option<f64>>,
}

impl Series {
    /// The line `name` of `figure` of each report.
    fn of(name: &'static str, reports: &[Report], figure: impl Fn(&Report) -> Option<f64>) -> Self {
        Series {
            name,
            values: reports.iter().map(figure).collect(),
        }
    }
}

/// The page of the sweep of `reports`.
fn render(reports: &[Report]) -> String {
    let rates: Vec<f64> = reports.iter().map(asked).collect();
    let missed: Vec<bool> = reports
        .iter()
        .map(|r| r.offered.as_ref().is_some_and(|o| o.rate_missed))
        .collect();
    let mut page = head();
    let listed: Vec<String> = rates.iter().map(|r| format!("{r}")).collect();
    let _ = writeln!(
        page,
        "<h1>durable-etl bench: offered-load sweep over {} jobs/s</h1>",
        escape(&listed.join(", "))
    );
    if let Some(first) = reports.first() {
        let _ = writeln!(
            page,
            "<p>{}; each rate on a fresh database.</p>",
            escape(&first.config.describe_replicas())
        );
    }
    for (report, rate) in reports.iter().zip(&rates) {
        if let Some(text) = report.warning() {
            page.push_str(&warning(&format!("At {rate} jobs/s asked: {text}")));
        }
    }
    page.push_str(&table(reports));
    let ack = |pick: fn(&super::Percentiles) -> f64| {
        move |r: &Report| r.ack_to_start_ms.as_ref().map(pick)
    };
    let plots = [
        (
            "Achieved rate against the asked rate",
            "jobs/s",
            vec![
                Series::of("asked", reports, |r| Some(asked(r))),
                Series::of("achieved", reports, |r| {
                    r.offered.as_ref().map(|o| o.achieved_rate)
                }),
            ],
        ),
        (
            "ack->start latency against the asked rate",
            "ms",
            vec![
                Series::of("p50", reports, ack(|p| p.p50)),
                Series::of("p99", reports, ack(|p| p.p99)),
                Series::of("p99.9", reports, ack(|p| p.p999)),
            ],
        ),
        (
            "CPU per job against the asked rate",
            "us per job",
            vec![
                Series::of("server", reports, |r| {
                    Some(r.server_cpu.server_cpu_us_per_job)
                }),
                Series::of("server: replicas", reports, |r| {
                    Some(r.server_cpu.server_cpu_replicas_us_per_job)
                }),
                Series::of("server: producers", reports, |r| {
                    Some(r.server_cpu.server_cpu_producers_us_per_job)
                }),
                Series::of("server: aux", reports, |r| {
                    Some(r.server_cpu.server_cpu_aux_us_per_job)
                }),
                Series::of("replica processes", reports, |r| {
                    Some(r.replica_cpu_us_per_job)
                }),
            ],
        ),
        (
            "Round trips, claims and commits per job against the asked rate",
            "per job",
            vec![
                Series::of("round trips", reports, |r| Some(r.round_trips_per_job)),
                Series::of("claims", reports, |r| Some(r.claims_per_job)),
                Series::of("empty claims", reports, |r| Some(r.empty_claims_per_job)),
                Series::of("commits", reports, |r| Some(r.commits_per_job)),
            ],
        ),
        (
            "WAL per job against the asked rate",
            "bytes per job",
            vec![Series::of("WAL", reports, |r| Some(r.wal_bytes_per_job))],
        ),
    ];
    for (title, unit, series) in &plots {
        let _ = writeln!(page, "<h2>{}</h2>", escape(title));
        page.push_str(&sweep_plot(&rates, series, &missed, unit));
    }
    page.push_str("</body>\n</html>\n");
    page
}

/// The rate `report` asked for (0 for a run that is not an offered load).
fn asked(report: &Report) -> f64 {
    report.offered.as_ref().map_or(0.0, |o| o.asked_rate)
}

/// The table of the sweep: one row per rate, a missed rate marked, each linking to its page.
fn table(reports: &[Report]) -> String {
    let mut out = String::from(
        "<table>\n<tr><th>asked (jobs/s)</th><th>achieved (jobs/s)</th>\
         <th>ack-&gt;start p50 / p95 / p99 / p99.9 / max (ms)</th>\
         <th>server CPU / job (us): replicas + producers + aux</th>\
         <th>of which replicas / producers / aux (us)</th><th>replica CPU / job (us)</th>\
         <th>round trips / job (producers' excluded)</th><th>claims / job</th>\
         <th>empty claims / job</th><th>commits / job</th><th>WAL / job (bytes)</th>\
         <th>page</th></tr>\n",
    );
    for r in reports {
        let rate = asked(r);
        let (achieved, missed) = r
            .offered
            .as_ref()
            .map_or((0.0, false), |o| (o.achieved_rate, o.rate_missed));
        let achieved = if missed {
            format!("<td class=\"missed\">{achieved:.0} MISSED</td>")
        } else {
            format!("<td>{achieved:.0}</td>")
        };
        let ack = r.ack_to_start_ms.as_ref().map_or_else(
            || "not recorded".to_owned(),
            |p| {
                format!(
                    "{:.3} / {:.3} / {:.3} / {:.3} / {:.3}",
                    p.p50, p.p95, p.p99, p.p999, p.max
                )
            },
        );
        let _ = writeln!(
            out,
            "<tr><td>{rate}</td>{achieved}<td>{}</td><td>{:.1}</td>\
             <td>{:.1} / {:.1} / {:.1}</td><td>{:.1}</td>\
             <td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.0}</td>\
             <td><a href=\"{}/index.html\">rate {rate}</a></td></tr>",
            escape(&ack),
            r.server_cpu.server_cpu_us_per_job,
            r.server_cpu.server_cpu_replicas_us_per_job,
            r.server_cpu.server_cpu_producers_us_per_job,
            r.server_cpu.server_cpu_aux_us_per_job,
            r.replica_cpu_us_per_job,
            r.round_trips_per_job,
            r.claims_per_job,
            r.empty_claims_per_job,
            r.commits_per_job,
            r.wal_bytes_per_job,
            rate_dir(rate),
        );
    }
    out.push_str("</table>\n");
    out
}

/// A plot of `series` (in `unit`) against the sweep's `rates`, one point per measured rate, a
/// red dashed line through each rate that `missed`.
fn sweep_plot(rates: &[f64], series: &[Series], missed: &[bool], unit: &str) -> String {
    let top = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .copied()
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top } else { 1.0 };
    let xs = coords(&vec![0.0; rates.len()], top);
    let mut body = String::new();
    for ((&(x, _), rate), &missed) in xs.iter().zip(rates).zip(missed) {
        let _ = writeln!(
            body,
            "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{rate}</text>",
            MARGIN + HEIGHT + 16.0
        );
        if missed {
            let _ = writeln!(
                body,
                "<line x1=\"{x:.1}\" y1=\"{MARGIN}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#d62728\" \
                 stroke-width=\"2\" stroke-dasharray=\"6 4\"/>\n\
                 <text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"#d62728\" \
                 text-anchor=\"middle\" font-weight=\"bold\">MISSED</text>",
                MARGIN + HEIGHT,
                MARGIN - 2.0
            );
        }
    }
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let measured: Vec<usize> = (0..s.values.len())
            .filter(|&k| s.values[k].is_some())
            .collect();
        let at = coords(
            &s.values
                .iter()
                .map(|v| v.unwrap_or(0.0))
                .collect::<Vec<_>>(),
            top,
        );
        let line: Vec<String> = measured
            .iter()
            .map(|&k| format!("{:.1},{:.1}", at[k].0, at[k].1))
            .collect();
        let _ = writeln!(
            body,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            line.join(" ")
        );
        for &k in &measured {
            let _ = writeln!(
                body,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                at[k].0, at[k].1
            );
        }
        let _ = writeln!(
            body,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"{colour}\" \
             text-anchor=\"end\">{}</text>",
            MARGIN + WIDTH - 100.0 * i as f64,
            MARGIN - 28.0,
            escape(s.name)
        );
    }
    plot(
        &body,
        ("", ""),
        &format!("{top:.3} {unit} at most; against the asked rate (jobs/s)"),
    )
}
