//! `bench`'s text output: the figures of one run as a few aligned lines, the offered load's
//! rate warning or the depth target's depth warning (if any) right under the run's description
//! ([`BenchConfig::describe`], also the pages' heading).
//!
//! A schedules run and a dead-letters run print their own figures (`schedules`, `dead_letters`)
//! under the description instead.
//!
//! Invariant: every line prints a figure of the [`Report`], never one computed here.

use super::{BenchConfig, Mode, Percentiles, Report};

impl Report {
    /// The report as a few aligned lines.
    pub(crate) fn to_text(&self) -> String {
        let p = |p: &Percentiles| {
            format!(
                "p50 {:.3}  p95 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3} ms",
                p.p50, p.p95, p.p99, p.p999, p.max
            )
        };
        if let Some(schedules) = &self.schedules {
            return format!("{}\n{}", self.config.describe(), schedules.to_text());
        }
        if let Some(letters) = &self.dead_letters {
            return format!("{}\n{}", self.config.describe(), letters.to_text());
        }
        let mut out = format!(
            "{}\n{}{}\
             succeeded            {} (not succeeded: {})\n\
             throughput           {:.0} jobs/s over {:.3} s\n\
             enqueue->start       {}\n",
            self.config.describe(),
            self.offered
                .as_ref()
                .map_or_else(String::new, |o| o.to_text()),
            self.depth
                .as_ref()
                .map_or_else(String::new, |d| d.to_text()),
            self.succeeded,
            self.not_succeeded,
            self.jobs_per_s,
            self.elapsed_s,
            p(&self.enqueue_to_start_ms),
        );
        if let Some(ack) = &self.ack_to_start_ms {
            out.push_str(&format!(
                "ack->start           {} ({} of {} jobs)\n",
                p(ack),
                ack.samples,
                self.per_job_ms.as_ref().map_or(0, Vec::len)
            ));
        }
        if let Some(ack) = &self.ack_to_done_ms {
            out.push_str(&format!("ack->done            {}\n", p(ack)));
        }
        if let Some(recovery) = &self.recovery_effects_ms {
            out.push_str(&format!(
                "kill->reclaimed      {} (in its effects)\n",
                p(recovery)
            ));
        }
        if let Some(recovery) = &self.recovery_compute_ms {
            out.push_str(&format!(
                "kill->reclaimed      {} (computing)\n",
                p(recovery)
            ));
        }
        out.push_str(&format!(
            "round trips per job  {:.3} (the replicas'; producers' excluded)\n\
             claims per job       {:.3} ({} claims), empty {:.3} ({})\n\
             commits per job      {:.3} ({} group commits)\n\
             WAL per job          {:.0} bytes\n\
             replica CPU per job  {:.1} us\n\
             {}\
             replica peak RSS     {:.1} MiB\n",
            self.round_trips_per_job,
            self.claims_per_job,
            self.claims,
            self.empty_claims_per_job,
            self.empty_claims,
            self.commits_per_job,
            self.commit_batches,
            self.wal_bytes_per_job,
            self.replica_cpu_us_per_job,
            self.server_cpu.to_text(),
            self.replica_peak_rss_mib,
        ));
        if let Some(queues) = &self.queues {
            out.push_str(&queues.to_text(p));
        }
        out
    }
}

impl BenchConfig {
    /// The run's load and shape, in words.
    pub(crate) fn describe(&self) -> String {
        let load = match self.mode {
            Mode::BurnDown { jobs } => format!("burn-down of {jobs} jobs"),
            Mode::OfferedLoad {
                rate,
                duration_s,
                producers,
                batch,
            } => format!(
                "offered load of {rate} jobs/s for {duration_s} s \
                 ({producers} producer(s), {batch} job(s) per statement)"
            ),
            Mode::DepthTarget {
                depth,
                duration_s,
                producers,
                batch,
            } => format!(
                "depth target of {depth} due jobs for {duration_s} s \
                 ({producers} producer(s), at most {batch} job(s) per statement)"
            ),
            Mode::Recovery { trials } => {
                format!("recovery from {trials} SIGKILLs per phase (effects, computing)")
            }
            Mode::Saturated {
                backlog,
                duration_s,
            } => format!("saturated for {duration_s} s (backlog {backlog} per queue)"),
            Mode::Schedules {
                schedules,
                duration_s,
                idle_schedules,
                idle_s,
            } => format!(
                "{schedules} schedules firing every second for {duration_s} s \
                 ({idle_schedules} idle schedules and a baseline, {idle_s} s each)"
            ),
            Mode::DeadLetters {
                letters,
                history,
                pages,
                page_size,
                connections,
            } => format!(
                "dead letters: {letters} replayed from retained payloads and {letters} with \
                 their bodies ({connections} connection(s)), {pages} pages of {page_size} listed \
                 per filter over {history} ended jobs"
            ),
        };
        format!("{load}, {}", self.describe_replicas())
    }

    /// The run's replicas and shape, in words (its description without the load).
    pub(crate) fn describe_replicas(&self) -> String {
        let mut text = format!(
            "{} replica(s) x {} slots (prefetch {}), handler {:?}",
            self.replicas, self.slots, self.prefetch, self.handler
        );
        if self.claim_cooldown_us > 0 {
            let ms = self.claim_cooldown_us as f64 / 1_000.0;
            text.push_str(&format!(", claim cooldown {ms} ms"));
        }
        text.push_str(&self.shape.describe());
        text
    }
}
